//! Rows of an encoded key and an optional encoded version, by the million,
//! in one buffer: what a restart reads back (a cache's snapshot, the rows
//! a controller kept of a cache) costs one allocation, not two per row.
//! Both tables keep their rows in key order (their primary key), so a
//! restart's difference of the two is a merge (see
//! `controller::watch::restart_set`).

/// Keys with their versions (`None`: none kept), in the order pushed.
#[derive(Debug, Default)]
pub(crate) struct KeyRows {
    bytes: Vec<u8>,
    /// Per row: where its key ends in `bytes`, and where its version ends
    /// (`None`: none kept). A row starts where the one before ended.
    ends: Vec<(usize, Option<usize>)>,
}

impl KeyRows {
    /// Room for `rows` rows of `bytes` bytes in all, so a million rows
    /// are not moved twenty times while they are read.
    #[cfg_attr(not(feature = "store"), allow(dead_code))] // read by the SQLite store
    pub(crate) fn with_capacity(rows: usize, bytes: usize) -> Self {
        Self { bytes: Vec::with_capacity(bytes), ends: Vec::with_capacity(rows) }
    }

    pub(crate) fn push(&mut self, key: &[u8], version: Option<&[u8]>) {
        self.bytes.extend_from_slice(key);
        let key_end = self.bytes.len();
        let version_end = version.map(|version| {
            self.bytes.extend_from_slice(version);
            self.bytes.len()
        });
        self.ends.push((key_end, version_end));
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Each row's key and version, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        let mut start = 0;
        self.ends.iter().map(move |&(key_end, version_end)| {
            let key = &self.bytes[start..key_end];
            let version = version_end.map(|end| &self.bytes[key_end..end]);
            start = version_end.unwrap_or(key_end);
            (key, version)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_read_back_as_pushed() {
        let mut rows = KeyRows::with_capacity(1, 1);
        rows.push(b"a", Some(b"1"));
        rows.push(b"bb", None);
        rows.push(b"", Some(b""));
        rows.push(b"c", Some(b"22"));
        let read: Vec<_> = rows.iter().collect();
        assert_eq!(
            read,
            [(&b"a"[..], Some(&b"1"[..])), (b"bb", None), (b"", Some(b"")), (b"c", Some(b"22"))],
            "keys and versions, empty ones too, in order"
        );
        assert_eq!(rows.len(), 4);
    }
}
