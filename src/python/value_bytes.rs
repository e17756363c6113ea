//! An etcd value's bytes as a Python cache keeps them (an `EtcdSource`
//! without `decode`: `PyObj::Bytes`): a short value inside the object
//! itself, a longer one in a box of its own.
//!
//! Why: a cache holds millions of values, and most are short. A boxed
//! value is a malloc chunk of its own, 32 bytes for any value of up to 24
//! bytes, on top of the `Arc` the cache puts around every object (16
//! bytes of counts and the 24-byte `PyObj`, a 48-byte chunk). Held inside
//! those 24 bytes instead, a value of up to [`INLINE`] bytes costs nothing
//! beyond the `Arc`: 32 bytes a key less (docs/sources.md, "What a key
//! costs").

use std::fmt;
use std::ops::Deref;

/// The longest value held inline: what is left of 24 bytes after the
/// enum's tag and the length, so `ValueBytes` (and `PyObj` around it) is
/// no bigger than the box it replaces.
pub(crate) const INLINE: usize = 22;

/// Bytes that read as one slice whichever way they are held. Invariant: a
/// value of up to [`INLINE`] bytes is always `Inline` (so the variant
/// depends only on the length), and `bytes[len..]` are zeros.
#[derive(Clone)]
pub(crate) enum ValueBytes {
    Inline { len: u8, bytes: [u8; INLINE] },
    Boxed(Box<[u8]>),
}

impl From<&[u8]> for ValueBytes {
    fn from(value: &[u8]) -> Self {
        if value.len() > INLINE {
            return Self::Boxed(value.into());
        }
        let mut bytes = [0; INLINE];
        bytes[..value.len()].copy_from_slice(value);
        // Cannot truncate: at most INLINE (22) bytes.
        Self::Inline { len: value.len() as u8, bytes }
    }
}

impl Deref for ValueBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Boxed(bytes) => bytes,
        }
    }
}

impl PartialEq for ValueBytes {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl fmt::Debug for ValueBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} bytes>", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_back_what_it_was_made_of_on_both_sides_of_the_inline_limit() {
        for len in [0, 1, INLINE - 1, INLINE, INLINE + 1, 1000] {
            let value: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let held = ValueBytes::from(&value[..]);
            assert_eq!(&*held, &value[..], "{len} bytes");
            assert_eq!(matches!(held, ValueBytes::Inline { .. }), len <= INLINE, "{len} bytes");
            assert!(held == ValueBytes::from(&value[..]));
            assert!(held != ValueBytes::from(&b"other"[..]));
        }
    }
}
