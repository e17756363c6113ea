//! A small synchronous client for etcd's v3 API, spoken as JSON over HTTP
//! (etcd's gRPC gateway under `/v3/`, served by every etcd 3.4+ member on
//! its client port). Blocking calls with timeouts, on the caller's thread:
//! reconq runs them on its own threads, with no async runtime.
//!
//! Only what leader election and sharding need: leases (grant, keep-alive,
//! revoke), a put, a create-if-absent, a put-if-unchanged and a
//! delete-if-ours transaction, reads, and a watch (for a key's deletion, or
//! any change under a prefix). Keys and values are base64 in the gateway's
//! JSON and 64-bit integers are JSON strings; this module hides both.
//!
//! One call goes over gRPC instead (`grpc.rs`, on libcurl): the Range of
//! EtcdSource's list (`paged.rs`), a prefix of a million keys in one or a
//! few calls, which etcd serves over gRPC at a seventh to a ninth of the
//! CPU the gateway's JSON costs it. The rest stays on the gateway: small
//! calls, whose JSON costs little, and the watch, a stream.
//!
//! Every reply's header goes through the client's [`History`]: a reply
//! from a reset history fails the call with [`EtcdError::reset`] set, once,
//! so whoever acts on what etcd said can stop first (see `history.rs`).

mod catch_up;
mod fingerprint;
mod grpc;
mod history;
mod paged;
mod range_proto;
mod stream;

use std::fmt;
use std::io::{BufRead, BufReader};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

pub(crate) use self::catch_up::{CatchUp, CatchUpRead};
pub(crate) use self::fingerprint::Fingerprint;
pub(crate) use self::history::Reset;
use self::history::{Header, History, Seen};
pub(crate) use self::paged::read_ahead;
pub(crate) use self::range_proto::RawKeyValue;
use self::range_proto::ResponseHeader;
pub(crate) use self::stream::WatchItem;
use crate::sync::Mutex;

/// How long a unary call may take, connection included.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// How long [`EtcdClient::range_prefix`] may take: long enough for etcd to
/// send tens of thousands of keys while busy; only the thread reading
/// waits on it.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest reply read (ureq's default is 10 MB): a page of a list
/// may be larger before the source knows the size of its values.
const MAX_REPLY_BYTES: u64 = 64 << 20;

/// The most keys [`EtcdClient::create_if_absent`] creates in one
/// transaction: etcd refuses transactions of more than `--max-txn-ops`
/// operations per branch (128 by default); one is left for the read.
pub(crate) const MAX_TXN_OPS: usize = 127;

/// Why a call failed: etcd unreachable, an HTTP error, a reply that is
/// not what the gateway sends, or a reply from a reset history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdError {
    message: String,
    reset: Option<Reset>,
    /// The compaction revision, when the revision asked for was compacted.
    compacted: Option<i64>,
}

impl EtcdError {
    fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), reset: None, compacted: None }
    }

    /// etcd refused a call, saying `etcd_says` (its error's text, the same
    /// over gRPC and the gateway): an error `described` so, and whether
    /// it says the revision asked for was compacted.
    fn refused(described: String, etcd_says: &str) -> Self {
        let mut e = Self::new(described);
        if etcd_says.contains("required revision has been compacted") {
            e.compacted = Some(0);
        }
        e
    }

    /// The revision asked for (a read's or a watch's) was compacted: what
    /// is left starts after this revision (0: etcd did not say).
    pub(crate) fn compacted(&self) -> Option<i64> {
        self.compacted
    }

    /// What etcd holds is not what reconq put there.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(format!("etcd: {}", message.into()))
    }

    /// The reply came from a new history (etcd's data wiped, or restored
    /// from an older snapshot): what was seen of the old one. The call
    /// itself may have been carried out in the new history.
    pub(crate) fn reset(&self) -> Option<Reset> {
        self.reset
    }

    /// A reset found by comparing what etcd holds with what was seen
    /// before (`why`), not by a reply's header.
    fn history_differs(reset: Reset, why: &str) -> Self {
        let message = format!("etcd's history was reset (its data wiped, or restored from an older snapshot): {why}");
        Self { message, reset: Some(reset), compacted: None }
    }
}

impl From<Reset> for EtcdError {
    fn from(reset: Reset) -> Self {
        let message = format!(
            "etcd's history was reset: a reply at revision {} after revision {} was seen \
             (its data wiped, or restored from an older snapshot)",
            reset.revision, reset.highest_revision
        );
        Self { message, reset: Some(reset), compacted: None }
    }
}

impl fmt::Display for EtcdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for EtcdError {}

impl From<ureq::Error> for EtcdError {
    fn from(e: ureq::Error) -> Self {
        EtcdError::new(format!("etcd: {e}"))
    }
}

/// A key as it stands in etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyValue {
    pub(crate) key: String,
    pub(crate) value: Vec<u8>,
    /// The revision that created the key: unique per creation, increasing.
    pub(crate) create_revision: i64,
    /// The revision of its last change.
    pub(crate) mod_revision: i64,
    pub(crate) lease: i64,
}

/// What a create-if-absent transaction found, with the key it also read
/// (in the same transaction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Created {
    /// The keys were absent and are now ours, created at this revision.
    Created { revision: i64, read: Option<KeyValue> },
    /// Some are held (`holders`: those); `revision` is the store's
    /// revision when we looked.
    Taken { holders: Vec<KeyValue>, revision: i64, read: Option<KeyValue> },
}

/// What [`EtcdClient::range_prefix`] read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PrefixRead {
    /// Every key under the prefix, without its value.
    pub(crate) kvs: Vec<KeyValue>,
    /// The key read with them, if it exists.
    pub(crate) read: Option<KeyValue>,
    /// The store's revision at that read.
    pub(crate) revision: i64,
}

/// What a [`EtcdClient::watch`] waits for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Watch<'a> {
    /// The deletion of this key.
    Deletion(&'a str),
    /// Any change to a key under this prefix.
    Prefix(&'a str),
}

/// The end of the range of keys that start with `prefix` (etcd's
/// convention: the prefix with its last byte incremented).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

/// Which connection a call goes on.
#[derive(Debug, Clone, Copy)]
enum Connection {
    /// One kept from an earlier call, if any.
    Pooled,
    /// A new one.
    Fresh,
}

/// The endpoints of one etcd cluster. Calls go to the first member that
/// answers.
#[derive(Clone)]
pub(crate) struct EtcdClient {
    endpoints: Vec<String>,
    agent: ureq::Agent,
    /// Shared by clones: one view of etcd's history per client.
    history: Arc<Mutex<History>>,
}

impl fmt::Debug for EtcdClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdClient").field("endpoints", &self.endpoints).finish()
    }
}

/// Checks an endpoint: `http://host:port`, nothing after the port.
pub(crate) fn check_endpoint(endpoint: &str) -> Result<String, String> {
    let rest = endpoint.strip_prefix("http://").ok_or_else(|| {
        format!("etcd endpoint {endpoint:?} must start with http:// (TLS is not supported; use a local sidecar)")
    })?;
    let rest = rest.trim_end_matches('/');
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| format!("etcd endpoint {endpoint:?} has no port"))?;
    if !is_host(host) || port.parse::<u16>().is_err() {
        return Err(format!("etcd endpoint {endpoint:?} is not http://host:port"));
    }
    Ok(format!("http://{rest}"))
}

/// A name or IPv4 address, or an IPv6 address in brackets: what an
/// endpoint's host may be (`[::1` is none, nor anything with a space or a
/// path in it).
fn is_host(host: &str) -> bool {
    match host.strip_prefix('[') {
        Some(ipv6) => ipv6.strip_suffix(']').is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok()),
        None => !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')),
    }
}

impl EtcdClient {
    /// A client for `endpoints` (already checked with [`check_endpoint`]).
    pub(crate) fn new(endpoints: Vec<String>) -> Self {
        let agent =
            ureq::Agent::config_builder().timeout_global(Some(CALL_TIMEOUT)).http_status_as_error(true).build().into();
        Self { endpoints, agent, history: Arc::default() }
    }

    pub(crate) fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// POSTs `body` to `/v3/{path}` on the first member that answers and
    /// returns the reply's JSON.
    fn call(&self, path: &str, body: &Value) -> Result<Value, EtcdError> {
        self.call_within(path, body, CALL_TIMEOUT)
    }

    /// [`call`](Self::call), giving up after `timeout` in all (over every
    /// member tried).
    fn call_within(&self, path: &str, body: &Value, timeout: Duration) -> Result<Value, EtcdError> {
        self.call_on(path, body, timeout, Connection::Pooled)
    }

    /// [`call`](Self::call) on a new connection: after a break, a
    /// connection kept since before it may have broken the same way (a
    /// link that forwards nothing more would make the call wait out its
    /// timeout).
    fn call_fresh(&self, path: &str, body: &Value) -> Result<Value, EtcdError> {
        self.call_on(path, body, CALL_TIMEOUT, Connection::Fresh)
    }

    fn call_on(&self, path: &str, body: &Value, timeout: Duration, connection: Connection) -> Result<Value, EtcdError> {
        self.on_endpoints(timeout, |endpoint, left, before| {
            let url = format!("{endpoint}/v3/{path}");
            let config = self
                .agent
                .post(&url)
                .header("Content-Type", "application/json")
                .config()
                .timeout_global(Some(left))
                .http_status_as_error(false);
            let request = match connection {
                Connection::Pooled => config.build(),
                // Every pooled connection has been idle longer than this.
                Connection::Fresh => config.max_idle_age(Duration::ZERO).build(),
            };
            let mut response = match request.send(body.to_string()) {
                Ok(response) => response,
                Err(e) => return ControlFlow::Continue(EtcdError::new(format!("etcd at {endpoint}: {e}"))),
            };
            let status = response.status();
            let bytes = match response.body_mut().with_config().limit(MAX_REPLY_BYTES).read_to_vec() {
                Ok(bytes) => bytes,
                Err(e) => return ControlFlow::Break(Err(e.into())),
            };
            if !status.is_success() {
                return ControlFlow::Continue(refused(endpoint, status, &String::from_utf8_lossy(&bytes)));
            }
            let reply = serde_json::from_slice(&bytes).map_err(|e| {
                EtcdError::new(format!("etcd: bad reply to {path}: {e}: {}", String::from_utf8_lossy(&bytes)))
            });
            ControlFlow::Break(reply.and_then(|reply| self.observe(before, &reply).map(|()| reply)))
        })
    }

    /// Tries `attempt` on each endpoint in turn, within `timeout` in all
    /// (it is given the time left and what was seen of etcd's history
    /// before the first request), until one answers (`Break`: its result,
    /// returned as it is); an endpoint that fails (`Continue`: why)
    /// leaves the call to the next one, and the last failure is returned
    /// when none is left.
    fn on_endpoints<T>(
        &self,
        timeout: Duration,
        mut attempt: impl FnMut(&str, Duration, &Seen) -> ControlFlow<Result<T, EtcdError>, EtcdError>,
    ) -> Result<T, EtcdError> {
        let before = self.before_request()?;
        let deadline = Instant::now() + timeout;
        let mut last = EtcdError::new("etcd: no endpoint");
        for endpoint in &self.endpoints {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(EtcdError::new(format!("etcd: no answer within {timeout:?}")));
            }
            match attempt(endpoint, left, &before) {
                ControlFlow::Break(result) => return result,
                ControlFlow::Continue(failed) => last = failed,
            }
        }
        Err(last)
    }

    /// What has been seen of etcd's history before a request is sent: an
    /// error if a reset is pending.
    fn before_request(&self) -> Result<Seen, EtcdError> {
        Ok(self.history.lock().before_request()?)
    }

    /// Takes in the header of a reply to a request sent after `before`:
    /// an error if it comes from a reset history (or one is pending).
    fn observe(&self, before: &Seen, reply: &Value) -> Result<(), EtcdError> {
        Ok(self.history.lock().observe(before, Header::of(reply))?)
    }

    /// [`observe`](Self::observe) for a gRPC reply's header.
    fn observe_grpc(&self, before: &Seen, header: Option<ResponseHeader>) -> Result<(), EtcdError> {
        Ok(self.history.lock().observe(before, header.map(Header::from))?)
    }

    /// A reset of etcd's history seen and not yet
    /// [`accept`](Self::accept_reset)ed: every call fails with it, without
    /// reaching etcd.
    pub(crate) fn pending_reset(&self) -> Option<Reset> {
        self.history.lock().check().err()
    }

    /// A reset of etcd's history that a reply at `revision` gave away by
    /// its contents (`why`), not its header: pending from now on, as one
    /// a header shows.
    pub(crate) fn found_reset(&self, revision: i64, why: &str) -> EtcdError {
        let reset = self.history.lock().found(revision);
        EtcdError::history_differs(reset, why)
    }

    /// The caller stopped acting on what the old history said: calls go
    /// on, in the new one.
    pub(crate) fn accept_reset(&self) {
        self.history.lock().accept();
    }

    /// Grants a lease of `ttl` (whole seconds, at least 1); returns its id.
    pub(crate) fn grant(&self, ttl: Duration) -> Result<i64, EtcdError> {
        let reply = self.call("lease/grant", &json!({ "TTL": ttl.as_secs().max(1) }))?;
        int_field(&reply, "ID")
    }

    /// Renews lease `id`, waiting at most `timeout` for an answer; returns
    /// the TTL it has now, or `None` if it has expired (or was revoked).
    pub(crate) fn keep_alive(&self, id: i64, timeout: Duration) -> Result<Option<Duration>, EtcdError> {
        let reply = self.call_within("lease/keepalive", &json!({ "ID": id.to_string() }), timeout)?;
        let result = reply.get("result").unwrap_or(&reply);
        let ttl = int_field(result, "TTL").unwrap_or(0);
        Ok((ttl > 0).then(|| Duration::from_secs(ttl as u64)))
    }

    /// Revokes lease `id`, deleting every key attached to it.
    pub(crate) fn revoke(&self, id: i64) -> Result<(), EtcdError> {
        self.call("lease/revoke", &json!({ "ID": id.to_string() })).map(drop)
    }

    /// Creates every key of `keys` = `value`, attached to `lease`, if none
    /// of them exists, in one transaction (one revision), and reads `read`
    /// in the same transaction; otherwise reads who holds them. At most
    /// [`MAX_TXN_OPS`] keys.
    pub(crate) fn create_if_absent(
        &self,
        keys: &[String],
        value: &[u8],
        lease: i64,
        read: &str,
    ) -> Result<Created, EtcdError> {
        assert!(keys.len() <= MAX_TXN_OPS, "{} keys in one transaction", keys.len());
        let keys64: Vec<String> = keys.iter().map(|k| BASE64.encode(k)).collect();
        let read_op = json!({ "request_range": { "key": BASE64.encode(read) } });
        let compare: Vec<Value> = keys64
            .iter()
            .map(|k| json!({ "key": k, "target": "CREATE", "result": "EQUAL", "create_revision": "0" }))
            .collect();
        let value64 = BASE64.encode(value);
        let lease = lease.to_string();
        let mut success: Vec<Value> =
            keys64.iter().map(|k| json!({ "request_put": { "key": k, "value": value64, "lease": lease } })).collect();
        success.push(read_op.clone());
        let mut failure: Vec<Value> = keys64.iter().map(|k| json!({ "request_range": { "key": k } })).collect();
        failure.push(read_op);
        let reply = self.call("kv/txn", &json!({ "compare": compare, "success": success, "failure": failure }))?;
        let revision = int_field(reply.get("header").unwrap_or(&Value::Null), "revision")?;
        let responses = reply.get("responses").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        let mut ranges = responses.iter().map(|r| {
            let kvs = r.pointer("/response_range/kvs").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
            kvs.first().map(key_value).transpose()
        });
        if reply.get("succeeded").and_then(Value::as_bool) == Some(true) {
            let read = ranges.nth(keys.len()).transpose()?.flatten();
            return Ok(Created::Created { revision, read });
        }
        let found: Vec<Option<KeyValue>> = ranges.collect::<Result<_, _>>()?;
        let read = found.get(keys.len()).cloned().flatten();
        let holders = found.into_iter().take(keys.len()).flatten().collect();
        Ok(Created::Taken { holders, revision, read })
    }

    /// Puts `key` = `value` if the key's last change is still the one at
    /// `mod_revision` (0: if it is absent); returns whether it did.
    pub(crate) fn put_if_unchanged(&self, key: &str, value: &[u8], mod_revision: i64) -> Result<bool, EtcdError> {
        let key64 = BASE64.encode(key);
        let body = json!({
            "compare": [{ "key": key64, "target": "MOD", "result": "EQUAL", "mod_revision": mod_revision.to_string() }],
            "success": [{ "request_put": { "key": key64, "value": BASE64.encode(value) } }],
        });
        let reply = self.call("kv/txn", &body)?;
        Ok(reply.get("succeeded").and_then(Value::as_bool) == Some(true))
    }

    /// `key` as it stands, if it exists.
    pub(crate) fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        let reply = self.call("kv/range", &json!({ "key": BASE64.encode(key) }))?;
        let kvs = reply.get("kvs").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        kvs.first().map(key_value).transpose()
    }

    /// Puts `key` = `value`, attached to `lease`.
    pub(crate) fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<(), EtcdError> {
        let body = json!({ "key": BASE64.encode(key), "value": BASE64.encode(value), "lease": lease.to_string() });
        self.call("kv/put", &body).map(drop)
    }

    /// Deletes every key of `keys` if each is still the one created at its
    /// create revision (ours), and puts `puts` (with no lease), in one
    /// transaction; returns whether they were (if one was not, nothing is
    /// deleted or put). At most [`MAX_TXN_OPS`] operations.
    pub(crate) fn delete_if_created(
        &self,
        keys: &[(String, i64)],
        puts: &[(String, Vec<u8>)],
    ) -> Result<bool, EtcdError> {
        self.delete_if(keys, ("CREATE", "create_revision"), puts)
    }

    /// Deletes every key of `keys` if each is unchanged since its mod
    /// revision, in one transaction; returns whether they were.
    pub(crate) fn delete_if_unchanged(&self, keys: &[(String, i64)]) -> Result<bool, EtcdError> {
        self.delete_if(keys, ("MOD", "mod_revision"), &[])
    }

    /// `keys` deleted and `puts` put if each key's `target` revision is
    /// the one given.
    fn delete_if(
        &self,
        keys: &[(String, i64)],
        (target, field): (&str, &str),
        puts: &[(String, Vec<u8>)],
    ) -> Result<bool, EtcdError> {
        assert!(keys.len() + puts.len() <= MAX_TXN_OPS, "{} operations in one transaction", keys.len() + puts.len());
        let keys64: Vec<(String, String)> = keys.iter().map(|(k, r)| (BASE64.encode(k), r.to_string())).collect();
        let compare: Vec<Value> =
            keys64.iter().map(|(k, r)| json!({ "key": k, "target": target, "result": "EQUAL", field: r })).collect();
        let deletes = keys64.iter().map(|(k, _)| json!({ "request_delete_range": { "key": k } }));
        let puts =
            puts.iter().map(|(k, v)| json!({ "request_put": { "key": BASE64.encode(k), "value": BASE64.encode(v) } }));
        let success: Vec<Value> = deletes.chain(puts).collect();
        let reply = self.call("kv/txn", &json!({ "compare": compare, "success": success }))?;
        Ok(reply.get("succeeded").and_then(Value::as_bool) == Some(true))
    }

    /// Every key under `prefix`, with its value.
    pub(crate) fn range_values(&self, prefix: &str) -> Result<Vec<KeyValue>, EtcdError> {
        let body = json!({ "key": BASE64.encode(prefix), "range_end": BASE64.encode(prefix_end(prefix)) });
        let reply = self.call_within("kv/range", &body, READ_TIMEOUT)?;
        let kvs = reply.get("kvs").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        kvs.iter().map(key_value).collect()
    }

    /// Every key under `prefix` (without its value), `read` (with its
    /// value, in the same transaction), and the store's revision at that
    /// read. Waits up to [`READ_TIMEOUT`]: tens of thousands of keys may
    /// take etcd seconds to send.
    pub(crate) fn range_prefix(&self, prefix: &str, read: &str) -> Result<PrefixRead, EtcdError> {
        let body = json!({ "success": [
            { "request_range": { "key": BASE64.encode(prefix), "range_end": BASE64.encode(prefix_end(prefix)),
                                 "keys_only": true } },
            { "request_range": { "key": BASE64.encode(read) } },
        ]});
        let reply = self.call_within("kv/txn", &body, READ_TIMEOUT)?;
        let revision = int_field(reply.get("header").unwrap_or(&Value::Null), "revision")?;
        let kvs = |i: usize| -> Result<Vec<KeyValue>, EtcdError> {
            let kvs = reply.pointer(&format!("/responses/{i}/response_range/kvs")).and_then(Value::as_array);
            kvs.map_or(&[][..], Vec::as_slice).iter().map(key_value).collect()
        };
        Ok(PrefixRead { kvs: kvs(0)?, read: kvs(1)?.into_iter().next(), revision })
    }

    /// Blocks until what `watch` names happens at a revision after
    /// `after`, or `stopped()` turns true (checked at least every `poll`
    /// while the watch is quiet: a quiet stream times out). Returns
    /// `Ok(true)` when it happened, `Ok(false)` when stopped or quiet for
    /// `poll`.
    ///
    /// Sends `Grpc-Metadata-hasleader: true`, so a member cut off from its
    /// cluster's leader cancels the watch instead of leaving it silent.
    pub(crate) fn watch(
        &self,
        watch: Watch<'_>,
        after: i64,
        poll: Duration,
        stopped: impl Fn() -> bool,
    ) -> Result<bool, EtcdError> {
        let start_revision = (after + 1).to_string();
        let body = match watch {
            Watch::Deletion(key) => json!({ "create_request": {
                "key": BASE64.encode(key), "start_revision": start_revision, "filters": ["NOPUT"],
            }}),
            Watch::Prefix(prefix) => json!({ "create_request": {
                "key": BASE64.encode(prefix), "range_end": BASE64.encode(prefix_end(prefix)),
                "start_revision": start_revision,
            }}),
        };
        let before = self.before_request()?;
        let mut last = EtcdError::new("etcd: no endpoint");
        for endpoint in &self.endpoints {
            let url = format!("{endpoint}/v3/watch");
            let request = self
                .agent
                .post(&url)
                .header("Content-Type", "application/json")
                .header("Grpc-Metadata-hasleader", "true")
                .config()
                .timeout_global(None)
                .timeout_recv_body(Some(poll))
                .build();
            let response = match request.send(body.to_string()) {
                Ok(response) => response,
                Err(e) => {
                    last = EtcdError::new(format!("etcd at {endpoint}: {e}"));
                    continue;
                }
            };
            let reader = BufReader::new(response.into_body().into_reader());
            for line in reader.lines() {
                if stopped() {
                    return Ok(false);
                }
                let line = match line {
                    Ok(line) => line,
                    // A quiet stream timed out: the caller looks again.
                    Err(e) if is_timeout(&e) => return Ok(false),
                    Err(e) => return Err(EtcdError::new(format!("etcd watch: {e}"))),
                };
                let event: Value = serde_json::from_str(&line)
                    .map_err(|e| EtcdError::new(format!("etcd watch: bad event {line}: {e}")))?;
                self.observe(&before, &event)?;
                let result = event.get("result").unwrap_or(&event);
                if result.get("canceled").and_then(Value::as_bool) == Some(true) {
                    return Err(EtcdError::new(format!("etcd watch canceled: {result}")));
                }
                // Deletions carry `"type": "DELETE"`; with the NOPUT filter
                // they are the only events a deletion watch gets.
                if result.get("events").and_then(Value::as_array).is_some_and(|events| !events.is_empty()) {
                    return Ok(true);
                }
            }
            return Err(EtcdError::new("etcd watch ended"));
        }
        Err(last)
    }
}

/// An error reply of the gateway: etcd's own message (`{"error": ...}`).
fn refused(endpoint: &str, status: ureq::http::StatusCode, text: &str) -> EtcdError {
    let reply: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    let message = reply.get("error").and_then(Value::as_str).unwrap_or(text);
    EtcdError::refused(format!("etcd at {endpoint}: {status}: {message}"), message)
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock)
        || e.to_string().to_ascii_lowercase().contains("timeout")
}

/// A 64-bit integer field, which the gateway writes as a JSON string.
fn int_field(object: &Value, name: &str) -> Result<i64, EtcdError> {
    match object.get(name) {
        Some(Value::String(s)) => s.parse().map_err(|_| EtcdError::new(format!("etcd: bad {name} {s:?}"))),
        Some(Value::Number(n)) => n.as_i64().ok_or_else(|| EtcdError::new(format!("etcd: bad {name} {n}"))),
        // Zero values are left out of the gateway's JSON.
        None => Ok(0),
        Some(other) => Err(EtcdError::new(format!("etcd: bad {name} {other}"))),
    }
}

/// A base64 field as bytes (absent: empty, as the gateway leaves empty
/// values out).
fn bytes_field(kv: &Value, name: &str) -> Result<Vec<u8>, EtcdError> {
    match kv.get(name).and_then(Value::as_str) {
        Some(v) => BASE64.decode(v).map_err(|e| EtcdError::new(format!("etcd: bad {name}: {e}"))),
        None => Ok(Vec::new()),
    }
}

fn raw_key_value(kv: &Value) -> Result<RawKeyValue, EtcdError> {
    Ok(RawKeyValue {
        key: bytes_field(kv, "key")?.into(),
        value: bytes_field(kv, "value")?.into(),
        create_revision: int_field(kv, "create_revision")?,
        mod_revision: int_field(kv, "mod_revision")?,
    })
}

fn key_value(kv: &Value) -> Result<KeyValue, EtcdError> {
    Ok(KeyValue {
        key: String::from_utf8_lossy(&bytes_field(kv, "key")?).into_owned(),
        value: bytes_field(kv, "value")?,
        create_revision: int_field(kv, "create_revision")?,
        mod_revision: int_field(kv, "mod_revision")?,
        lease: int_field(kv, "lease")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked() {
        assert_eq!(check_endpoint("http://127.0.0.1:2379/").unwrap(), "http://127.0.0.1:2379");
        assert_eq!(check_endpoint("http://[::1]:2379").unwrap(), "http://[::1]:2379");
        let bad = ["127.0.0.1:2379", "https://a:1", "http://a", "http://a:x", "http://:1", "http://a/b:1"];
        let bad_hosts =
            ["http://[::1:2379", "http://[::1", "http://::1:2379", "http://[x]:1", "http://a b:1", "http://u@a:1"];
        for bad in bad.into_iter().chain(bad_hosts) {
            assert!(check_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_prefix_range_ends_after_its_last_key() {
        assert_eq!(prefix_end("/a/"), b"/a0");
        assert_eq!(prefix_end("/reconq/shard/s/"), b"/reconq/shard/s0");
    }

    #[test]
    fn integers_come_as_strings_and_zeros_are_left_out() {
        let v = json!({ "ID": "42", "n": 7, "bad": true });
        assert_eq!(int_field(&v, "ID"), Ok(42));
        assert_eq!(int_field(&v, "n"), Ok(7));
        assert_eq!(int_field(&v, "missing"), Ok(0));
        assert!(int_field(&v, "bad").is_err());
    }
}
