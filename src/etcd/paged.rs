//! Reading a whole prefix in pages, all at one revision, so a prefix of
//! any size is read in replies of a bounded size, and the pages add up to
//! one consistent state: the first page fixes the revision, the later ones
//! read at it (etcd fails them if it was compacted meanwhile).
//!
//! The pages are Range calls over gRPC (`grpc.rs`), on one connection per
//! list. Few and large, bounded by bytes: etcd 3.4 walks every key from a
//! page's start to the prefix's end for each page (to count them), so a
//! list of n keys in k pages costs it about n·k/2 index visits beside
//! encoding the n keys (measured: 1,000,000 short keys cost etcd 1.7-1.9 s
//! of CPU in one call, 2.9-3.3 s in 9; docs/benchmarks.md, W14). A first
//! page of [`FIRST_PAGE`] keys gives the size of a key and the prefix's
//! count; the next asks for as many keys as fit [`PAGE_BYTES`] at the size
//! of the keys read so far, so 1,000,000 short keys come in one call after
//! the first, and large values in more.
//!
//! The pages are read one ahead of their reader, on a thread of their own
//! ([`read_ahead`]): etcd reads and sends a page while the reader takes in
//! the one before. A list of two pages (1,000,000 short keys) overlaps
//! little that way; a prefix of more than 64 MiB of reply overlaps all
//! but its last page.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use super::grpc::{Abandoned, Grpc, Unary};
use super::range_proto::{RangeRequest, RangeResponse};
use super::{EtcdClient, EtcdError, RawKeyValue, prefix_end};

/// etcd's Range method.
const RANGE: &str = "/etcdserverpb.KV/Range";

/// Keys of the first page at most, before the size of a key is known:
/// few, so even keys of etcd's largest values (1.5 MiB unless
/// `--max-request-bytes` says otherwise) fit one reply. A first page of
/// any size costs etcd the same walk over the prefix.
const FIRST_PAGE: usize = 10;

/// The size of a page's reply aimed at, at the size of the keys read so
/// far. A page is held whole, in etcd while it encodes it and in reconq
/// as the reply's bytes and then its keys, one page read ahead: 64 MiB
/// keeps that to a few hundred MiB at most, and still puts 1,000,000
/// short keys (40 bytes of protobuf each) in one call, where each page
/// more would cost etcd a walk over the rest of the prefix.
const PAGE_BYTES: usize = 64 << 20;

/// The largest reply read: keys later in the prefix may be larger than
/// those the page was sized by. A reply past it is dropped and its page
/// asked again with a [`SHRINK`]th of the keys.
const MAX_REPLY_BYTES: usize = 4 * PAGE_BYTES;

/// How much fewer keys a page too large for [`MAX_REPLY_BYTES`] is asked
/// again with.
const SHRINK: usize = 8;

/// Time any page may take: a first page of 10 keys still has etcd walk
/// every key of the prefix (to count them), and a list runs beside
/// whatever else loads the machine; nothing waits on it but the cache.
const PAGE_TIME: Duration = Duration::from_secs(5);

/// Time a page may take beyond [`PAGE_TIME`], per 10,000 keys asked for:
/// etcd reads and encodes a short key in about 2 µs, 50 times that is
/// left for a loaded machine and larger values. A connection that stops
/// forwarding anything (a frozen link) fails the page after that long.
const PAGE_TIME_PER_10K_KEYS: Duration = Duration::from_secs(1);

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
    /// The size of the reply (protobuf): what sizes the next page.
    bytes: usize,
}

impl EtcdClient {
    /// Every page of `prefix`, at the revision of the first, each of at
    /// most `page_size` keys, on one connection (one libcurl handle, made
    /// by the first page). Once `abandoned` says so, the page in flight
    /// fails within about a second and no other is asked for.
    pub(crate) fn pages<'a>(
        &'a self,
        prefix: &'a str,
        page_size: usize,
        abandoned: Abandoned,
    ) -> impl Iterator<Item = Result<Page, EtcdError>> + Send + 'a {
        let mut request =
            RangeRequest { key: prefix.as_bytes().to_vec(), range_end: prefix_end(prefix), limit: 0, revision: 0 };
        let mut limit = page_size.min(FIRST_PAGE);
        let (mut grpc, mut done) = (None, false);
        std::iter::from_fn(move || {
            if done {
                return None;
            }
            let page = self.next_page(&mut grpc, &abandoned, &mut request, &mut limit, page_size);
            done = !page.as_ref().is_ok_and(|page| page.more);
            Some(page)
        })
    }

    /// The page `request` starts at, of `limit` keys at most (fewer, if
    /// its reply passes [`MAX_REPLY_BYTES`]); then moves `request` and
    /// `limit` on to the page after it.
    fn next_page(
        &self,
        grpc: &mut Option<Grpc>,
        abandoned: &Abandoned,
        request: &mut RangeRequest,
        limit: &mut usize,
        page_size: usize,
    ) -> Result<Page, EtcdError> {
        let grpc = match grpc {
            Some(grpc) => grpc,
            None => grpc.insert(Grpc::new(MAX_REPLY_BYTES, Arc::clone(abandoned))?),
        };
        let page = fitting(limit, |limit| {
            request.limit = i64::try_from(limit).unwrap_or(i64::MAX);
            self.range_page(grpc, request, page_timeout(limit))
        })?;
        request.revision = page.revision;
        if let Some(last) = page.kvs.last() {
            request.key = key_after(&last.key);
        }
        *limit = next_page_size(&page, page_size);
        Ok(page)
    }

    /// One Range call for a page, on the first member that answers; `None`
    /// if the reply passed [`MAX_REPLY_BYTES`].
    fn range_page(
        &self,
        grpc: &mut Grpc,
        request: &RangeRequest,
        timeout: Duration,
    ) -> Result<Option<Page>, EtcdError> {
        self.on_endpoints(timeout, |endpoint, left, before| {
            let (reply, bytes) = match grpc.unary::<RangeResponse>(endpoint, RANGE, request, left) {
                Ok(Unary::Reply(reply, bytes)) => (reply, bytes),
                Ok(Unary::TooLarge) => return ControlFlow::Break(Ok(None)),
                // No other member is asked: the caller gave up.
                Err(e) if grpc.abandoned() => return ControlFlow::Break(Err(e)),
                Err(e) => return ControlFlow::Continue(e),
            };
            if let Err(e) = self.observe_grpc(before, reply.header) {
                return ControlFlow::Break(Err(e));
            }
            let header_revision = reply.header.map_or(0, |h| h.revision);
            ControlFlow::Break(Ok(Some(Page {
                kvs: reply.kvs,
                more: reply.more,
                revision: if request.revision > 0 { request.revision } else { header_revision },
                count: usize::try_from(reply.count).unwrap_or(0),
                bytes,
            })))
        })
    }
}

/// The page `fetch(limit)` reads, asked again with a [`SHRINK`]th of the
/// keys each time its reply passes [`MAX_REPLY_BYTES`] (`fetch` gives
/// `None`); `limit` is the number of keys it was read with.
fn fitting(
    limit: &mut usize,
    mut fetch: impl FnMut(usize) -> Result<Option<Page>, EtcdError>,
) -> Result<Page, EtcdError> {
    loop {
        if let Some(page) = fetch(*limit)? {
            return Ok(page);
        }
        if *limit == 1 {
            let max = MAX_REPLY_BYTES >> 20;
            return Err(EtcdError::new(format!("etcd: one key's reply is larger than {max} MiB")));
        }
        *limit = (*limit / SHRINK).max(1);
    }
}

/// How long a page of `limit` keys may take.
fn page_timeout(limit: usize) -> Duration {
    let tens_of_thousands = u32::try_from(limit.div_ceil(10_000)).unwrap_or(u32::MAX);
    PAGE_TIME.saturating_add(PAGE_TIME_PER_10K_KEYS.saturating_mul(tens_of_thousands))
}

/// The keys of the page after `page`: as many as fit [`PAGE_BYTES`] at the
/// size of `page`'s keys, at most those left and `page_size`, at least one.
fn next_page_size(page: &Page, page_size: usize) -> usize {
    let keys = page.kvs.len();
    let by_bytes = PAGE_BYTES.saturating_mul(keys) / page.bytes.max(1);
    let left = page.count.saturating_sub(keys);
    by_bytes.min(left).min(page_size).max(1)
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

#[cfg(test)]
#[path = "../../tests/common/etcd.rs"]
#[allow(dead_code)] // what these tests do not use of the tests' etcd
mod test_etcd;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::test_etcd::{Etcd, unreachable_endpoint};
    use super::*;
    use crate::etcd::raw_key_value;

    fn never() -> Abandoned {
        Arc::new(|| false)
    }

    /// A page of `keys` keys of `bytes` bytes of reply each, `count` keys
    /// from its start on.
    fn page(keys: usize, bytes: usize, count: usize) -> Page {
        let kv = RawKeyValue { key: b"k"[..].into(), ..RawKeyValue::default() };
        Page { kvs: vec![kv; keys], more: true, revision: 1, count, bytes: keys * bytes }
    }

    #[test]
    fn pages_after_the_first_hold_what_fits_sixty_four_mebibytes() {
        assert_eq!(next_page_size(&page(10, 40, 1_000_000), usize::MAX), 999_990, "every key left: one page");
        assert_eq!(next_page_size(&page(10, 40, 5_000_000), usize::MAX), 1_677_721, "64 MiB of 40-byte keys");
        assert_eq!(next_page_size(&page(10, 40, 1_000_000), 5), 5, "page_size at most");
        assert_eq!(next_page_size(&page(10, 1 << 20, 1_000_000), usize::MAX), 64, "keys of 1 MiB");
        assert_eq!(next_page_size(&page(1, 100 << 20, 1_000_000), usize::MAX), 1, "at least one");
        assert_eq!(next_page_size(&page(0, 0, 0), usize::MAX), 1, "an empty page (none is asked after it)");
    }

    #[test]
    fn a_page_may_take_longer_the_more_keys_it_asks_for() {
        assert_eq!(page_timeout(10), Duration::from_secs(6));
        assert_eq!(page_timeout(1_000_000), Duration::from_secs(105));
        assert!(page_timeout(usize::MAX) > Duration::from_secs(1 << 31), "saturates");
    }

    /// A page of `keys` short keys, the last of the prefix.
    fn sized(keys: usize) -> Option<Page> {
        Some(page(keys, 40, keys))
    }

    #[test]
    fn a_page_too_large_is_asked_again_with_an_eighth_of_the_keys_down_to_one() {
        let mut asked = Vec::new();
        let mut limit = 100_000;
        let page = fitting(&mut limit, |limit| {
            asked.push(limit);
            Ok(if limit > 2_000 { None } else { sized(limit) })
        });
        assert_eq!(page.map(|p| p.kvs.len()), Ok(1_562));
        assert_eq!((asked, limit), (vec![100_000, 12_500, 1_562], 1_562));
        let mut limit = 9;
        let e = fitting(&mut limit, |_| Ok(None)).unwrap_err();
        assert!(e.to_string().contains("one key's reply is larger than 256 MiB"), "{e}");
    }

    /// `prefix`'s keys as the gateway lists them, in one call.
    fn gateway_listing(client: &EtcdClient, prefix: &str) -> Vec<RawKeyValue> {
        use base64::Engine as _;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let body = json!({ "key": b64(prefix.as_bytes()), "range_end": b64(&prefix_end(prefix)) });
        let reply = client.call("kv/range", &body).unwrap();
        reply["kvs"].as_array().unwrap().iter().map(|kv| raw_key_value(kv).unwrap()).collect()
    }

    #[test]
    fn pages_over_grpc_hold_what_the_gateway_lists_at_one_revision() {
        let etcd = Etcd::start();
        for i in 0..23 {
            etcd.put(&format!("/p/k{i:02}"), &"v".repeat(i));
        }
        etcd.bump("/p/k05", 3);
        etcd.put("/p0", "after the prefix");
        etcd.put("/o", "before it");
        let client = EtcdClient::new(vec![etcd.endpoint.clone()]);
        let pages: Vec<Page> = client.pages("/p/", 4, never()).collect::<Result<_, _>>().unwrap();
        let sizes: Vec<usize> = pages.iter().map(|p| p.kvs.len()).collect();
        assert_eq!(sizes, [4, 4, 4, 4, 4, 3]);
        assert_eq!(pages[0].count, 23, "the first page counts the prefix");
        assert!(pages.iter().all(|p| p.revision == etcd.revision()), "one revision");
        let listed: Vec<RawKeyValue> = pages.into_iter().flat_map(|p| p.kvs).collect();
        let expected = gateway_listing(&client, "/p/");
        assert_eq!(listed, expected, "keys, values, create and mod revisions");
        assert_eq!(listed[0].value, &b""[..], "an empty value");
        assert_ne!(listed[5].create_revision, listed[5].mod_revision, "k05 changed since its creation");
        let whole: Vec<Page> = client.pages("/p/", usize::MAX, never()).collect::<Result<_, _>>().unwrap();
        let sizes: Vec<usize> = whole.iter().map(|p| p.kvs.len()).collect();
        assert_eq!(sizes, [10, 13], "the first page, then every key left: they fit 64 MiB");
    }

    /// What a page at `revision` of `/p/` on `etcd` gives.
    fn page_at(etcd: &Etcd, revision: i64) -> Result<Option<Page>, EtcdError> {
        let client = EtcdClient::new(vec![etcd.endpoint.clone()]);
        let request = RangeRequest { key: b"/p/".to_vec(), range_end: prefix_end("/p/"), limit: 10, revision };
        client.range_page(&mut Grpc::new(MAX_REPLY_BYTES, never()).unwrap(), &request, PAGE_TIME)
    }

    #[test]
    fn a_page_at_a_compacted_revision_expires_the_list_and_at_a_future_one_fails_plainly() {
        let etcd = Etcd::start();
        etcd.bump("/p/a", 5);
        let now = etcd.revision();
        assert_eq!(page_at(&etcd, now - 1).unwrap().map(|p| p.kvs.len()), Some(1));
        etcd.compact();
        let compacted = page_at(&etcd, now - 1).unwrap_err();
        assert_eq!(compacted.compacted(), Some(0), "{compacted}");
        assert!(compacted.to_string().contains("OUT_OF_RANGE"), "{compacted}");
        let future = page_at(&etcd, now + 100).unwrap_err();
        assert_eq!(future.compacted(), None, "{future}");
        assert!(future.to_string().contains("required revision is a future revision"), "{future}");
    }

    #[test]
    fn a_list_from_an_endpoint_where_no_etcd_is_fails_naming_it() {
        let endpoint = unreachable_endpoint();
        let client = EtcdClient::new(vec![endpoint.clone()]);
        let first = client.pages("/p/", usize::MAX, never()).next().unwrap().unwrap_err();
        assert!(first.to_string().contains(&endpoint), "{first}");
        assert_eq!(first.compacted(), None);
    }
}
