//! Reading a whole prefix in pages, all at one revision, so a prefix of
//! any size is read in calls that each fit their timeout, and the pages
//! add up to one consistent state: the first page fixes the revision, the
//! later ones read at it (etcd fails them if it was compacted meanwhile).
//!
//! The pages are read one ahead of their reader, on a thread of their own
//! ([`read_ahead`]): etcd builds the gateway's JSON of a page (most of a
//! list's cost, on its side) while the reader decodes the one before.

use std::ops::ControlFlow;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use super::range_reply::RangeReply;
use super::{Connection, EtcdClient, EtcdError, RawKeyValue, int_field, prefix_end};

/// Time any page may take: a first page of 10 keys still has etcd walk
/// every key of the prefix (to count them), and a list runs beside
/// whatever else loads the machine; nothing waits on it but the cache.
const PAGE_TIME: Duration = Duration::from_secs(5);

/// Time a page may take beyond [`PAGE_TIME`], per 10,000 keys asked
/// for: etcd builds the gateway's JSON at about 15 µs a key, many times
/// that on a loaded machine (W14 saw pages of 125,000 keys time out at
/// 1 s per 10,000 under a load of 19 on 2 cores).
const PAGE_TIME_PER_10K_KEYS: Duration = Duration::from_secs(2);

/// One page of a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Page {
    pub(crate) kvs: Vec<RawKeyValue>,
    /// Whether keys are left after this page.
    pub(crate) more: bool,
    /// The revision the page was read at.
    pub(crate) revision: i64,
    /// The keys from the page's start to the prefix's end (etcd's
    /// `count`; the first page's: every key of the prefix).
    pub(crate) count: usize,
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
        let reply: RangeReply = self.call_on("kv/range", &body, page_timeout(limit), Connection::Pooled)?;
        let header_revision = int_field(reply.headed.get("header").unwrap_or(&Value::Null), "revision")?;
        Ok(Page {
            kvs: reply.kvs,
            more: reply.more,
            revision: if revision > 0 { revision } else { header_revision },
            count: usize::try_from(reply.count).unwrap_or(0),
        })
    }

    /// Every page of `prefix`, at the revision of the first (`first`
    /// keys at most); each next page asks for `next_limit(page before,
    /// keys of the prefix)` keys.
    pub(crate) fn pages<'a>(
        &'a self,
        prefix: &'a str,
        first: usize,
        next_limit: impl Fn(&Page, usize) -> usize + 'a,
    ) -> impl Iterator<Item = Result<Page, EtcdError>> + 'a {
        let mut from = Some(prefix.as_bytes().to_vec());
        let (mut revision, mut limit, mut keys) = (0, first, None);
        std::iter::from_fn(move || {
            let page = self.range_page(prefix, &from.take()?, revision, limit);
            if let Ok(page) = &page {
                revision = page.revision;
                let keys = *keys.get_or_insert(page.count);
                limit = next_limit(page, keys);
                from = page.kvs.last().filter(|_| page.more).map(|last| key_after(&last.key));
            }
            Some(page)
        })
    }
}

/// How long a page of `limit` keys may take.
fn page_timeout(limit: usize) -> Duration {
    let tens_of_thousands = u32::try_from(limit.div_ceil(10_000)).unwrap_or(u32::MAX);
    PAGE_TIME.saturating_add(PAGE_TIME_PER_10K_KEYS.saturating_mul(tens_of_thousands))
}

/// Runs `pages` on a thread of its own, one page ahead of `read`, which
/// gets them in order on the caller's thread until it breaks. Returns
/// whether `read` had every page (`false`: it broke), or the first error
/// of `pages`; returns once the thread has ended (the page it was
/// reading, if any, done). A page read ahead and not wanted is dropped.
pub(crate) fn read_ahead(
    pages: impl Iterator<Item = Result<Page, EtcdError>> + Send,
    mut read: impl FnMut(Page) -> ControlFlow<()>,
) -> Result<bool, EtcdError> {
    std::thread::scope(|scope| {
        // One page in the channel, one being read from etcd: two ahead at most.
        let (tx, rx) = crossbeam_channel::bounded(1);
        std::thread::Builder::new()
            .name("reconq-etcd-pages".to_owned())
            .spawn_scoped(scope, move || {
                for page in pages {
                    let failed = page.is_err();
                    // The reader broke off: nothing more is wanted.
                    if tx.send(page).is_err() || failed {
                        return;
                    }
                }
            })
            .map_err(|e| EtcdError::new(format!("cannot start a thread to read etcd's pages: {e}")))?;
        for page in rx {
            if read(page?).is_break() {
                return Ok(false);
            }
        }
        Ok(true)
    })
}

/// The first key after `key` in etcd's byte order.
fn key_after(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}
