//! A small synchronous client for etcd's v3 API, spoken as JSON over HTTP
//! (etcd's gRPC gateway under `/v3/`, served by every etcd 3.4+ member on
//! its client port). Blocking calls with timeouts, on the caller's thread:
//! reconq runs them on its own threads, with no async runtime.
//!
//! Only what leader election and sharding need: leases (grant, keep-alive,
//! revoke), a put, a create-if-absent and a delete-if-ours transaction, a
//! prefix read, and a watch (for a key's deletion, or any change under a
//! prefix). Keys and values are base64 in the gateway's JSON and 64-bit
//! integers are JSON strings; this module hides both.

use std::fmt;
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

/// How long a unary call may take, connection included.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a call failed: etcd unreachable, an HTTP error, or a reply that is
/// not what the gateway sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdError(String);

impl fmt::Display for EtcdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EtcdError {}

impl From<ureq::Error> for EtcdError {
    fn from(e: ureq::Error) -> Self {
        EtcdError(format!("etcd: {e}"))
    }
}

/// A key as it stands in etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyValue {
    pub(crate) key: String,
    pub(crate) value: Vec<u8>,
    /// The revision that created the key: unique per creation, increasing.
    pub(crate) create_revision: i64,
    pub(crate) lease: i64,
}

/// What a create-if-absent transaction found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Created {
    /// The key was absent and is now ours, created at this revision.
    Created { revision: i64 },
    /// Someone holds it; `revision` is the store's revision when we looked.
    Taken { holder: KeyValue, revision: i64 },
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

/// The endpoints of one etcd cluster. Calls go to the first member that
/// answers.
#[derive(Clone)]
pub(crate) struct EtcdClient {
    endpoints: Vec<String>,
    agent: ureq::Agent,
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
    if host.is_empty() || host.contains('/') || port.parse::<u16>().is_err() {
        return Err(format!("etcd endpoint {endpoint:?} is not http://host:port"));
    }
    Ok(format!("http://{rest}"))
}

impl EtcdClient {
    /// A client for `endpoints` (already checked with [`check_endpoint`]).
    pub(crate) fn new(endpoints: Vec<String>) -> Self {
        let agent =
            ureq::Agent::config_builder().timeout_global(Some(CALL_TIMEOUT)).http_status_as_error(true).build().into();
        Self { endpoints, agent }
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
        let deadline = Instant::now() + timeout;
        let mut last = EtcdError("etcd: no endpoint".into());
        for endpoint in &self.endpoints {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(EtcdError(format!("etcd: no answer within {timeout:?}")));
            }
            let url = format!("{endpoint}/v3/{path}");
            let request = self
                .agent
                .post(&url)
                .header("Content-Type", "application/json")
                .config()
                .timeout_global(Some(left))
                .build();
            match request.send(body.to_string()) {
                Ok(mut response) => {
                    let text = response.body_mut().read_to_string()?;
                    return serde_json::from_str(&text)
                        .map_err(|e| EtcdError(format!("etcd: bad reply to {path}: {e}: {text}")));
                }
                Err(e) => last = EtcdError(format!("etcd at {endpoint}: {e}")),
            }
        }
        Err(last)
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

    /// Creates `key` = `value` attached to `lease` if `key` does not exist,
    /// in one transaction; otherwise reads who holds it.
    pub(crate) fn create_if_absent(&self, key: &str, value: &[u8], lease: i64) -> Result<Created, EtcdError> {
        let key64 = BASE64.encode(key);
        let body = json!({
            "compare": [{ "key": key64, "target": "CREATE", "result": "EQUAL", "create_revision": "0" }],
            "success": [{ "request_put": { "key": key64, "value": BASE64.encode(value), "lease": lease.to_string() } }],
            "failure": [{ "request_range": { "key": key64 } }],
        });
        let reply = self.call("kv/txn", &body)?;
        let revision = int_field(reply.get("header").unwrap_or(&Value::Null), "revision")?;
        if reply.get("succeeded").and_then(Value::as_bool) == Some(true) {
            return Ok(Created::Created { revision });
        }
        let kvs = reply.pointer("/responses/0/response_range/kvs").and_then(Value::as_array);
        match kvs.and_then(|kvs| kvs.first()) {
            Some(kv) => Ok(Created::Taken { holder: key_value(kv)?, revision }),
            // Deleted between the compare and the range: try again.
            None => Err(EtcdError(format!("etcd: {key} vanished during the transaction"))),
        }
    }

    /// Puts `key` = `value`, attached to `lease`.
    pub(crate) fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<(), EtcdError> {
        let body = json!({ "key": BASE64.encode(key), "value": BASE64.encode(value), "lease": lease.to_string() });
        self.call("kv/put", &body).map(drop)
    }

    /// Deletes `key` if it is still the one created at `create_revision`
    /// (ours), in one transaction; returns whether it was.
    pub(crate) fn delete_if_created(&self, key: &str, create_revision: i64) -> Result<bool, EtcdError> {
        let key64 = BASE64.encode(key);
        let body = json!({
            "compare": [{ "key": key64, "target": "CREATE", "result": "EQUAL",
                          "create_revision": create_revision.to_string() }],
            "success": [{ "request_delete_range": { "key": key64 } }],
        });
        let reply = self.call("kv/txn", &body)?;
        Ok(reply.get("succeeded").and_then(Value::as_bool) == Some(true))
    }

    /// Every key under `prefix`, and the store's revision at that read.
    pub(crate) fn range_prefix(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64), EtcdError> {
        let body = json!({ "key": BASE64.encode(prefix), "range_end": BASE64.encode(prefix_end(prefix)) });
        let reply = self.call("kv/range", &body)?;
        let revision = int_field(reply.get("header").unwrap_or(&Value::Null), "revision")?;
        let kvs = reply.get("kvs").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        Ok((kvs.iter().map(key_value).collect::<Result<_, _>>()?, revision))
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
        let mut last = EtcdError("etcd: no endpoint".into());
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
                    last = EtcdError(format!("etcd at {endpoint}: {e}"));
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
                    Err(e) => return Err(EtcdError(format!("etcd watch: {e}"))),
                };
                let event: Value =
                    serde_json::from_str(&line).map_err(|e| EtcdError(format!("etcd watch: bad event {line}: {e}")))?;
                let result = event.get("result").unwrap_or(&event);
                if result.get("canceled").and_then(Value::as_bool) == Some(true) {
                    return Err(EtcdError(format!("etcd watch canceled: {result}")));
                }
                // Deletions carry `"type": "DELETE"`; with the NOPUT filter
                // they are the only events a deletion watch gets.
                if result.get("events").and_then(Value::as_array).is_some_and(|events| !events.is_empty()) {
                    return Ok(true);
                }
            }
            return Err(EtcdError("etcd watch ended".into()));
        }
        Err(last)
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock)
        || e.to_string().to_ascii_lowercase().contains("timeout")
}

/// A 64-bit integer field, which the gateway writes as a JSON string.
fn int_field(object: &Value, name: &str) -> Result<i64, EtcdError> {
    match object.get(name) {
        Some(Value::String(s)) => s.parse().map_err(|_| EtcdError(format!("etcd: bad {name} {s:?}"))),
        Some(Value::Number(n)) => n.as_i64().ok_or_else(|| EtcdError(format!("etcd: bad {name} {n}"))),
        // Zero values are left out of the gateway's JSON.
        None => Ok(0),
        Some(other) => Err(EtcdError(format!("etcd: bad {name} {other}"))),
    }
}

fn key_value(kv: &Value) -> Result<KeyValue, EtcdError> {
    let value = match kv.get("value").and_then(Value::as_str) {
        Some(v) => BASE64.decode(v).map_err(|e| EtcdError(format!("etcd: bad value: {e}")))?,
        None => Vec::new(),
    };
    let key = match kv.get("key").and_then(Value::as_str) {
        Some(k) => String::from_utf8_lossy(&BASE64.decode(k).map_err(|e| EtcdError(format!("etcd: bad key: {e}")))?)
            .into_owned(),
        None => String::new(),
    };
    Ok(KeyValue { key, value, create_revision: int_field(kv, "create_revision")?, lease: int_field(kv, "lease")? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked() {
        assert_eq!(check_endpoint("http://127.0.0.1:2379/").unwrap(), "http://127.0.0.1:2379");
        for bad in ["127.0.0.1:2379", "https://a:1", "http://a", "http://a:x", "http://:1", "http://a/b:1"] {
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
