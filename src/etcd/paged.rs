//! Reading a whole prefix in pages, all at one revision, so a prefix of
//! any size is read in calls that each fit the call timeout, and the pages
//! add up to one consistent state: the first page fixes the revision, the
//! later ones read at it (etcd fails them if it was compacted meanwhile).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use super::{EtcdClient, EtcdError, RawKeyValue, int_field, prefix_end, raw_key_value};

/// One page of a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Page {
    pub(crate) kvs: Vec<RawKeyValue>,
    /// Whether keys are left after this page.
    pub(crate) more: bool,
    /// The revision the page was read at.
    pub(crate) revision: i64,
}

impl EtcdClient {
    /// At most `limit` keys under `prefix` from `from` on (inclusive; the
    /// prefix itself for the first page), at `revision` (0: now).
    pub(crate) fn range_page(&self, prefix: &str, from: &[u8], revision: i64, limit: usize) -> Result<Page, EtcdError> {
        let body = json!({
            "key": BASE64.encode(from),
            "range_end": BASE64.encode(prefix_end(prefix)),
            "revision": revision.to_string(),
            "limit": limit.to_string(),
        });
        let reply = self.call("kv/range", &body)?;
        let header_revision = int_field(reply.get("header").unwrap_or(&Value::Null), "revision")?;
        let kvs = reply.get("kvs").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        Ok(Page {
            kvs: kvs.iter().map(raw_key_value).collect::<Result<_, _>>()?,
            more: reply.get("more").and_then(Value::as_bool) == Some(true),
            revision: if revision > 0 { revision } else { header_revision },
        })
    }
}

/// The first key after `key` in etcd's byte order.
pub(crate) fn key_after(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}
