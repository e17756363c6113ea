//! The documented key encoding: stable across versions and identical for
//! Rust and Python keys of the same shape. The store writes keys in it (a
//! file written by one language reads in the other) and `partition_of`
//! hashes it (H1: the same partition in every process and language).
//!
//! Every value is one tag byte followed by its payload:
//!
//! | tag    | shape            | payload                                        |
//! |--------|------------------|------------------------------------------------|
//! | `0x01` | string           | u32 big-endian byte length, then UTF-8 bytes   |
//! | `0x02` | integer          | i64 big-endian (Rust's unsigned types too)     |
//! | `0x03` | bytes            | u32 big-endian length, then the bytes          |
//! | `0x04` | tuple            | u32 big-endian arity, then each element        |
//!
//! A Python `str`, `int`, `bytes` or `tuple` of these maps to the same tag
//! as Rust's `String`/`&str`, integer types, `Vec<u8>` and tuples. The
//! encoding is part of the file format (schema version 1): changing it means
//! a new schema version.

/// A key the store can keep: it encodes to, and decodes from, the documented
/// byte form (see the module docs).
pub trait StoreKey: Sized {
    /// Appends this key's encoding to `out`.
    fn encode(&self, out: &mut Vec<u8>);
    /// Reads one key from the front of `input`, advancing it; `None` if the
    /// bytes are not a key of this shape.
    fn decode(input: &mut &[u8]) -> Option<Self>;
}

/// A source's version or position as a cache with a store keeps it
/// (guarantees E9): its bytes in the key encoding, or `None` when it
/// cannot be kept (a key whose version is not kept counts as changed at a
/// restart). Every [`StoreKey`] is kept as its encoding.
pub trait Keepable {
    /// The bytes kept in the store, or `None` when this value cannot be
    /// kept.
    fn kept_bytes(&self) -> Option<Vec<u8>>;

    /// The value `kept_bytes` gave `bytes` for, read back at a restart
    /// that resumes from the kept position; `None` (the default): it
    /// cannot be read back, and the restart relists.
    fn from_kept_bytes(bytes: &[u8]) -> Option<Self>
    where
        Self: Sized,
    {
        let _ = bytes;
        None
    }
}

impl<T: StoreKey> Keepable for T {
    fn kept_bytes(&self) -> Option<Vec<u8>> {
        Some(encode_key(self))
    }

    fn from_kept_bytes(bytes: &[u8]) -> Option<Self> {
        decode_key(bytes)
    }
}

/// An object a cache with a store can keep whole
/// ([`CacheBuilder::keep_objects`](crate::CacheBuilder::keep_objects)), so
/// a restart loads it from the file and resumes the source's stream
/// instead of listing again: raw bytes and text, as an `EtcdSource`
/// without `decode` gives them.
pub trait KeptObject: Sized {
    /// The bytes kept, or `None` when this object cannot be kept (the
    /// cache then keeps no snapshot, and its next restart relists).
    fn kept_object(&self) -> Option<Vec<u8>>;
    /// The object read back from what [`kept_object`](Self::kept_object)
    /// gave.
    fn from_kept_object(bytes: &[u8]) -> Option<Self>;
}

impl KeptObject for Vec<u8> {
    fn kept_object(&self) -> Option<Vec<u8>> {
        Some(self.clone())
    }

    fn from_kept_object(bytes: &[u8]) -> Option<Self> {
        Some(bytes.to_vec())
    }
}

impl KeptObject for Box<[u8]> {
    fn kept_object(&self) -> Option<Vec<u8>> {
        Some(self.to_vec())
    }

    fn from_kept_object(bytes: &[u8]) -> Option<Self> {
        Some(bytes.into())
    }
}

impl KeptObject for String {
    fn kept_object(&self) -> Option<Vec<u8>> {
        Some(self.clone().into_bytes())
    }

    fn from_kept_object(bytes: &[u8]) -> Option<Self> {
        String::from_utf8(bytes.to_vec()).ok()
    }
}

/// No version (a [`PollingSource`](crate::PollingSource) of `(key,
/// object)` pairs): nothing to keep, so a stored cache of it keeps its
/// objects' digests if given one (`CacheBuilder::digest`).
impl Keepable for () {
    fn kept_bytes(&self) -> Option<Vec<u8>> {
        None
    }
}

pub(crate) const TAG_STR: u8 = 0x01;
pub(crate) const TAG_INT: u8 = 0x02;
pub(crate) const TAG_BYTES: u8 = 0x03;
const TAG_TUPLE: u8 = 0x04;

/// Encodes `key` into a fresh buffer.
pub fn encode_key<K: StoreKey>(key: &K) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    key.encode(&mut out);
    out
}

/// Decodes a whole buffer into a key; `None` on a shape mismatch or
/// trailing bytes.
pub fn decode_key<K: StoreKey>(mut bytes: &[u8]) -> Option<K> {
    let key = K::decode(&mut bytes)?;
    bytes.is_empty().then_some(key)
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if input.len() < n {
        return None;
    }
    let (head, tail) = input.split_at(n);
    *input = tail;
    Some(head)
}

pub(crate) fn expect_tag(input: &mut &[u8], tag: u8) -> Option<()> {
    (take(input, 1)?[0] == tag).then_some(())
}

pub(crate) fn encode_len_prefixed(tag: u8, bytes: &[u8], out: &mut Vec<u8>) {
    out.push(tag);
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

pub(crate) fn decode_len_prefixed<'a>(tag: u8, input: &mut &'a [u8]) -> Option<&'a [u8]> {
    expect_tag(input, tag)?;
    let len = u32::from_be_bytes(take(input, 4)?.try_into().ok()?) as usize;
    take(input, len)
}

pub(crate) fn encode_int(value: i64, out: &mut Vec<u8>) {
    out.push(TAG_INT);
    out.extend_from_slice(&value.to_be_bytes());
}

pub(crate) fn decode_int(input: &mut &[u8]) -> Option<i64> {
    expect_tag(input, TAG_INT)?;
    Some(i64::from_be_bytes(take(input, 8)?.try_into().ok()?))
}

impl StoreKey for String {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_len_prefixed(TAG_STR, self.as_bytes(), out);
    }
    fn decode(input: &mut &[u8]) -> Option<Self> {
        String::from_utf8(decode_len_prefixed(TAG_STR, input)?.to_vec()).ok()
    }
}

impl StoreKey for Vec<u8> {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_len_prefixed(TAG_BYTES, self, out);
    }
    fn decode(input: &mut &[u8]) -> Option<Self> {
        Some(decode_len_prefixed(TAG_BYTES, input)?.to_vec())
    }
}

macro_rules! int_key {
    ($($t:ty),*) => {$(
        impl StoreKey for $t {
            fn encode(&self, out: &mut Vec<u8>) {
                // Values past i64::MAX (u64/usize only) wrap, and wrap back
                // on decode: the round trip is exact for every value.
                encode_int(*self as i64, out);
            }
            fn decode(input: &mut &[u8]) -> Option<Self> {
                let value = decode_int(input)?;
                // A u64 written past i64::MAX comes back through the wrap.
                <$t>::try_from(value).ok().or_else(|| (<$t>::BITS == 64).then(|| value as $t))
            }
        }
    )*};
}
int_key!(i8, i16, i32, i64, u8, u16, u32, u64, isize, usize);

pub(crate) fn encode_tuple_header(arity: usize, out: &mut Vec<u8>) {
    out.push(TAG_TUPLE);
    out.extend_from_slice(&(arity as u32).to_be_bytes());
}

/// Reads a tuple's tag and arity.
pub(crate) fn decode_tuple_header(input: &mut &[u8]) -> Option<usize> {
    expect_tag(input, TAG_TUPLE)?;
    Some(u32::from_be_bytes(take(input, 4)?.try_into().ok()?) as usize)
}

macro_rules! tuple_key {
    ($n:expr; $($name:ident),+) => {
        impl<$($name: StoreKey),+> StoreKey for ($($name,)+) {
            #[allow(non_snake_case)]
            fn encode(&self, out: &mut Vec<u8>) {
                let ($($name,)+) = self;
                encode_tuple_header($n, out);
                $($name.encode(out);)+
            }
            fn decode(input: &mut &[u8]) -> Option<Self> {
                (decode_tuple_header(input)? == $n).then_some(())?;
                Some(($($name::decode(input)?,)+))
            }
        }
    };
}
tuple_key!(1; A);
tuple_key!(2; A, B);
tuple_key!(3; A, B, C);
tuple_key!(4; A, B, C, D);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_bytes() {
        assert_eq!(encode_key(&"ab".to_string()), [1, 0, 0, 0, 2, b'a', b'b']);
        assert_eq!(encode_key(&-2i32), [2, 255, 255, 255, 255, 255, 255, 255, 254]);
        assert_eq!(encode_key(&vec![7u8]), [3, 0, 0, 0, 1, 7]);
        assert_eq!(
            encode_key(&(1u8, "x".to_string())),
            [4, 0, 0, 0, 2, 2, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, b'x']
        );
    }

    #[test]
    fn round_trips_and_rejects_other_shapes() {
        let key = ("ns".to_string(), 42u64, vec![0u8, 255]);
        assert_eq!(decode_key::<(String, u64, Vec<u8>)>(&encode_key(&key)), Some(key));
        assert_eq!(decode_key::<u64>(&encode_key(&u64::MAX)), Some(u64::MAX));
        assert_eq!(decode_key::<u8>(&encode_key(&300i64)), None);
        assert_eq!(decode_key::<String>(&encode_key(&5i64)), None);
        let mut trailing = encode_key(&5i64);
        trailing.push(0);
        assert_eq!(decode_key::<i64>(&trailing), None);
    }
}
