//! Noticing a reset of etcd's history that the revisions do not give away
//! (guarantees §13 E1): etcd wiped (or restored from an older snapshot),
//! then written past a revision a reader had reached, before the reader
//! looks again. A single member wiped and restarted with the same
//! configuration keeps its cluster and member ids and starts again at raft
//! term 2, so `history.rs` sees nothing go back: a watch resumed at the old
//! revision would follow the new history from there, on top of what the
//! old one held, and never hear of the keys it missed.
//!
//! etcd has no id of a history to compare. What a resume needs, though, is
//! only that the prefix held at the revision it resumes from what the
//! reader holds: then the changes after it bring the reader to the new
//! state, whichever history they come from. So the reader keeps a
//! [`Fingerprint`] of the prefix at its revision, and before it resumes
//! [`EtcdClient::check_prefix`] reads the prefix at that revision, in one
//! transaction: how many keys it held (a count, no keys sent) and the few
//! keys changed last (create and mod revision, and the value). Cheap (one
//! request per resume, never while a watch runs: an idle reader still only
//! blocks on its stream) and, unlike a marker key, it needs no write
//! access. Unlike `HashKV` it costs no walk over the whole keyspace, and
//! needs no hash taken before the reset (nor a revision that compaction
//! keeps).
//!
//! What it misses: a new history that at that revision has the same
//! number of keys under the prefix and the same revisions and values for
//! the last [`WITNESSES`] keys changed, which takes replaying the same
//! writes. A revision the new history has not reached (etcd: "a future
//! revision") is a reset too; a compacted one expires the position as any
//! compaction does.
//!
//! A resume in a later process ([`Source::restore`]) checks the same way:
//! the fingerprint is kept beside the position ([`Fingerprint::kept`]) in
//! a format that reads the same in every process and release (the values'
//! hashes are XXH3, fixed by its specification, not std's hasher).
//!
//! [`Source::restore`]: crate::Source::restore

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use super::{EtcdClient, EtcdError, RawKeyValue, int_field, prefix_end, raw_key_value};
use crate::key_encoding::{
    TAG_BYTES, decode_int, decode_len_prefixed, decode_tuple_header, encode_int, encode_len_prefixed,
    encode_tuple_header,
};

/// Keys whose state a fingerprint keeps: those changed last, the ones a
/// new history is least likely to have written the same way.
const WITNESSES: usize = 4;

/// The format of [`Fingerprint::kept`]'s bytes; bytes of any other are
/// not read (the cache relists).
const KEPT_FORMAT: i64 = 1;

/// One key's state at a revision, with its value as a hash (XXH3-64: the
/// same in every process, so a kept state compares in the next one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KeyState {
    create_revision: i64,
    mod_revision: i64,
    value: u64,
}

impl KeyState {
    fn of(kv: &RawKeyValue) -> Self {
        let value = xxhash_rust::xxh3::xxh3_64(&kv.value);
        Self { create_revision: kv.create_revision, mod_revision: kv.mod_revision, value }
    }
}

/// What a prefix held at a revision, in brief: how many keys, and the
/// state (or absence) of the last few changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    /// The revision it describes; `None` while part of a revision's
    /// changes is taken in (then it describes no revision).
    revision: Option<i64>,
    count: u64,
    /// At most [`WITNESSES`] keys, each once, the one changed last last.
    witnesses: Vec<(Vec<u8>, Option<KeyState>)>,
}

impl Fingerprint {
    /// The revision it describes, if any.
    pub(crate) fn revision(&self) -> Option<i64> {
        self.revision
    }

    /// How many keys the prefix held.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// Takes in one key of a list (at a revision [`listed_at`](Self::listed_at) gives).
    pub(crate) fn listed(&mut self, kv: &RawKeyValue) {
        self.revision = None;
        self.count += 1;
        let full = self.witnesses.len() == WITNESSES;
        let oldest = self.witnesses.first().and_then(|(_, state)| state.map(|s| s.mod_revision));
        if full && oldest.is_some_and(|oldest| oldest >= kv.mod_revision) {
            return;
        }
        if full {
            self.witnesses.remove(0);
        }
        let at = self.witnesses.partition_point(|(_, s)| s.is_some_and(|s| s.mod_revision < kv.mod_revision));
        self.witnesses.insert(at, (kv.key.to_vec(), Some(KeyState::of(kv))));
    }

    /// Every key of the list is taken in: it was read at `revision`.
    pub(crate) fn listed_at(&mut self, revision: i64) {
        self.revision = Some(revision);
    }

    /// Takes in a watched change (`deleted`: a delete); `last`: the last
    /// change of its revision, which then is the one described.
    pub(crate) fn changed(&mut self, deleted: bool, kv: &RawKeyValue, last: bool) {
        if deleted {
            self.count = self.count.saturating_sub(1);
        } else if kv.create_revision == kv.mod_revision {
            self.count += 1;
        }
        self.witnesses.retain(|(key, _)| *key != kv.key);
        if self.witnesses.len() == WITNESSES {
            self.witnesses.remove(0);
        }
        self.witnesses.push((kv.key.to_vec(), (!deleted).then(|| KeyState::of(kv))));
        self.revision = last.then_some(kv.mod_revision);
    }

    /// Nothing changed up to `revision` (a progress notification).
    pub(crate) fn moved_to(&mut self, revision: i64) {
        if self.revision.is_some() {
            self.revision = Some(revision);
        }
    }

    /// This fingerprint as bytes to keep beside its revision, for
    /// [`from_kept`](Self::from_kept) in a later process: in the crate's
    /// key encoding (src/key_encoding.rs), a tuple of [`KEPT_FORMAT`], the
    /// revision (0: none), the count, and a tuple of the witnesses, each a
    /// tuple of the key's bytes and, if the key was present, its create
    /// and mod revisions and its value's hash.
    pub(crate) fn kept(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        encode_tuple_header(4, &mut out);
        encode_int(KEPT_FORMAT, &mut out);
        encode_int(self.revision.unwrap_or(0), &mut out);
        encode_int(i64::try_from(self.count).unwrap_or(i64::MAX), &mut out);
        encode_tuple_header(self.witnesses.len(), &mut out);
        for (key, state) in &self.witnesses {
            encode_tuple_header(if state.is_some() { 4 } else { 1 }, &mut out);
            encode_len_prefixed(TAG_BYTES, key, &mut out);
            if let Some(s) = state {
                encode_int(s.create_revision, &mut out);
                encode_int(s.mod_revision, &mut out);
                // Wraps, and wraps back in `from_kept`.
                encode_int(s.value as i64, &mut out);
            }
        }
        out
    }

    /// The fingerprint [`kept`](Self::kept) at `revision`; `None` for
    /// bytes of another format, of another revision, or not a fingerprint.
    pub(crate) fn from_kept(revision: i64, mut bytes: &[u8]) -> Option<Self> {
        let input = &mut bytes;
        // etcd's revisions start at 1; 0 is kept for none.
        (revision > 0).then_some(())?;
        (decode_tuple_header(input)? == 4).then_some(())?;
        (decode_int(input)? == KEPT_FORMAT).then_some(())?;
        (decode_int(input)? == revision).then_some(())?;
        let count = u64::try_from(decode_int(input)?).ok()?;
        let witnesses = decode_tuple_header(input)?;
        if witnesses > WITNESSES {
            return None;
        }
        let witnesses = (0..witnesses).map(|_| kept_witness(input)).collect::<Option<_>>()?;
        input.is_empty().then_some(Self { revision: Some(revision), count, witnesses })
    }

    /// How `prefix` at this revision, as etcd `replied`, differs from
    /// this (`None`: it does not).
    fn differs(&self, replied: &Value) -> Result<Option<String>, EtcdError> {
        let response = |i: usize| replied.pointer(&format!("/responses/{i}/response_range")).unwrap_or(&Value::Null);
        let count = int_field(response(0), "count")?;
        if u64::try_from(count).ok() != Some(self.count) {
            return Ok(Some(format!("it holds {count} keys under the prefix where {} were seen", self.count)));
        }
        for (i, (key, seen)) in self.witnesses.iter().enumerate() {
            let kvs = response(i + 1).get("kvs").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
            let now = kvs.first().map(raw_key_value).transpose()?.map(|kv| KeyState::of(&kv));
            if now != *seen {
                let key = String::from_utf8_lossy(key);
                return Ok(Some(format!("key {key:?} is {}, where {} was seen", describe(now), describe(*seen))));
            }
        }
        Ok(None)
    }
}

/// One witness of a kept fingerprint, read from the front of `input`.
fn kept_witness(input: &mut &[u8]) -> Option<(Vec<u8>, Option<KeyState>)> {
    let arity = decode_tuple_header(input)?;
    let key = decode_len_prefixed(TAG_BYTES, input)?.to_vec();
    let state = match arity {
        1 => None,
        4 => Some(KeyState {
            create_revision: decode_int(input)?,
            mod_revision: decode_int(input)?,
            value: decode_int(input)? as u64,
        }),
        _ => return None,
    };
    Some((key, state))
}

fn describe(state: Option<KeyState>) -> String {
    match state {
        None => "absent".to_owned(),
        Some(s) => format!("created at {} and changed at {}", s.create_revision, s.mod_revision),
    }
}

impl EtcdClient {
    /// Checks that `prefix` holds at the fingerprint's revision what the
    /// fingerprint says (a fingerprint of no revision passes: there is
    /// nothing to compare). If it does not, or etcd has not reached that
    /// revision, etcd's history was reset: the error says so
    /// ([`EtcdError::reset`]) and the reset is pending, as one a reply's
    /// header gives away.
    pub(crate) fn check_prefix(&self, prefix: &str, fingerprint: &Fingerprint) -> Result<(), EtcdError> {
        let Some(revision) = fingerprint.revision else { return Ok(()) };
        let at = revision.to_string();
        let mut reads = vec![json!({ "request_range": {
            "key": BASE64.encode(prefix), "range_end": BASE64.encode(prefix_end(prefix)),
            "revision": at, "count_only": true,
        }})];
        reads.extend(
            fingerprint
                .witnesses
                .iter()
                .map(|(key, _)| json!({ "request_range": { "key": BASE64.encode(key), "revision": at } })),
        );
        // On a new connection: this follows a break.
        let why = match self.call_fresh("kv/txn", &json!({ "success": reads })) {
            Ok(reply) => fingerprint.differs(&reply)?,
            Err(e) if e.message.contains("required revision is a future revision") => {
                Some("etcd has not reached that revision".to_owned())
            }
            Err(e) => return Err(e),
        };
        let Some(why) = why else { return Ok(()) };
        Err(self.found_reset(revision, &format!("at revision {revision}, {why}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str, create_revision: i64, mod_revision: i64) -> RawKeyValue {
        RawKeyValue { key: key.to_owned().into(), value: value.to_owned().into(), create_revision, mod_revision }
    }

    fn keys(f: &Fingerprint) -> Vec<&[u8]> {
        f.witnesses.iter().map(|(k, _)| k.as_slice()).collect()
    }

    #[test]
    fn a_list_keeps_the_keys_changed_last_and_the_count() {
        let mut f = Fingerprint::default();
        for (i, mod_revision) in [5, 9, 2, 7, 8, 3].into_iter().enumerate() {
            f.listed(&kv(&format!("k{i}"), "v", 2, mod_revision));
        }
        assert_eq!(f.revision(), None, "not before the list is whole");
        f.listed_at(9);
        assert_eq!((f.revision(), f.count), (Some(9), 6));
        assert_eq!(keys(&f), [&b"k0"[..], b"k3", b"k4", b"k1"], "oldest first");
    }

    #[test]
    fn changes_count_creates_and_deletes_and_a_revision_is_described_after_its_last_change() {
        let mut f = Fingerprint::default();
        f.listed(&kv("a", "1", 2, 2));
        f.listed_at(2);
        f.changed(false, &kv("b", "2", 3, 3), false);
        assert_eq!(f.revision(), None, "half a transaction describes no revision");
        f.changed(false, &kv("a", "3", 2, 3), true);
        assert_eq!((f.revision(), f.count), (Some(3), 2), "b created, a changed");
        f.moved_to(10);
        f.changed(
            true,
            &RawKeyValue { key: "b".into(), value: Default::default(), create_revision: 0, mod_revision: 11 },
            true,
        );
        assert_eq!((f.revision(), f.count), (Some(11), 1));
        assert_eq!(f.witnesses.last(), Some(&(b"b".to_vec(), None)), "a delete witnesses an absence");
        for i in 0..5 {
            f.changed(false, &kv(&format!("c{i}"), "x", 12 + i, 12 + i), true);
        }
        assert_eq!(keys(&f), [&b"c1"[..], b"c2", b"c3", b"c4"]);
    }

    #[test]
    fn a_different_count_or_witness_differs() {
        let mut f = Fingerprint::default();
        f.listed(&kv("a", "1", 2, 4));
        f.listed_at(5);
        let reply = |count: &str, kvs: Value| {
            json!({ "responses": [
                { "response_range": { "count": count } },
                { "response_range": { "kvs": kvs } },
            ]})
        };
        let a = |value: &str, create: &str| {
            json!([{ "key": BASE64.encode("a"), "value": BASE64.encode(value),
                     "create_revision": create, "mod_revision": "4" }])
        };
        assert_eq!(f.differs(&reply("1", a("1", "2"))), Ok(None));
        assert!(f.differs(&reply("2", a("1", "2"))).unwrap().unwrap().contains("2 keys"));
        assert!(f.differs(&reply("1", a("other", "2"))).unwrap().is_some(), "another value");
        assert!(f.differs(&reply("1", a("1", "3"))).unwrap().unwrap().contains("created at 3"));
        assert!(f.differs(&reply("1", json!([]))).unwrap().unwrap().contains("absent"));
    }

    #[test]
    fn a_kept_fingerprint_reads_back_at_its_revision_only() {
        let mut f = Fingerprint::default();
        f.listed(&kv("a", "1", 2, 4));
        f.listed(&kv("b", "2", 3, 3));
        f.listed_at(5);
        f.changed(
            true,
            &RawKeyValue { key: "b".into(), value: Default::default(), create_revision: 0, mod_revision: 6 },
            true,
        );
        let kept = f.kept();
        assert_eq!(Fingerprint::from_kept(6, &kept), Some(f.clone()));
        assert_eq!(Fingerprint::from_kept(5, &kept), None, "another revision");
        let mut trailing = kept.clone();
        trailing.push(0);
        for garbage in [&b""[..], b"garbage", &kept[..kept.len() - 1], &trailing] {
            assert_eq!(Fingerprint::from_kept(6, garbage), None, "{garbage:?}");
        }
        let mut other_format = kept.clone();
        other_format[5 + 8] = 2; // the format's last byte (after the tuple's header and the int's tag)
        assert_eq!(Fingerprint::from_kept(6, &other_format), None, "another format");
        let mut none = Fingerprint::default();
        none.listed(&kv("a", "1", 2, 4));
        assert_eq!(Fingerprint::from_kept(0, &none.kept()), None, "no revision");
    }

    /// A kept fingerprint is compared in a later process, maybe built by
    /// another Rust release: a value's hash is XXH3-64, fixed by its
    /// specification (std's `DefaultHasher` promises no such thing).
    #[test]
    fn a_value_hashes_the_same_in_every_process() {
        assert_eq!(KeyState::of(&kv("a", "value", 1, 1)).value, 0x87d57e269b9df0f0);
    }
}
