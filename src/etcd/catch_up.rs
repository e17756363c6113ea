//! Knowing when a watch resumed after a restart has caught up: when the
//! reader holds what the prefix held at the revision etcd was at when it
//! resumed (docs/sources.md, "How EtcdSource resumes"). Only then may a
//! restarted cache call itself synced: `wait_synced(); wait_idle()` must
//! not return before the changes made while it was down are reconciled.
//!
//! Neither of etcd's own marks says so safely. A progress notification
//! asked for may come before the events it covers in etcd before 3.4.24
//! and 3.5.8 (etcd#15220; timed ones go to synced watches only, every 10
//! minutes by default), and the header of a watch response during a catch-up
//! carries the store's revision even when the batch was cut (1,000
//! revisions at a time), so neither is a position the stream reached.
//! So before the watch opens, one transaction reads the prefix at the
//! store's revision `R` ([`EtcdClient::catch_up`]): how many keys it
//! holds, and the highest mod revision among its keys changed after the
//! resume's position `from` (a range with `min_mod_revision`, sorted by mod
//! revision, one key, no values). Then the reader is caught up at the end
//! of a revision `p <= R` once (a) it holds as many keys as the prefix
//! held at `R` and (b) `p` is at least that highest mod revision, or at
//! once when a change after `R` arrives (every change up to `R` was sent).
//!
//! Why (a) and (b) prove that the reader holds the prefix at `R` (call a
//! prefix's state `S_t` at revision `t`; a reader at `p` holds `S_p`, the
//! state at `from` and every change after it up to `p`, as the watch sends
//! each change once, in revision order):
//! - A key of `S_R` last changed at `m > from` was changed at `m <= p`
//!   (b), and not after `m` up to `R`, so it holds at `p` what it holds at
//!   `R`.
//! - A key of `S_R` last changed at `m <= from` was not changed from `m`
//!   to `R`, so it holds the same at `from`, at `p` and at `R`.
//! - So `S_p` holds every key of `S_R`, as it is in `S_R`, and holds as
//!   many keys (a): it holds no other. `S_p = S_R`.
//!
//! Then the changes after `p` up to `R` net to nothing, and are not handed
//! out (so the position never goes back below `R`): a key changed after
//! `p` and present at `R` would have a mod revision above `p`, against
//! (b), and a key present at `p` is present at `R` (`S_p = S_R`). So each
//! key changed after `p` is absent at `p` and at `R`: created and deleted
//! again in between.
//!
//! (b) is "every key changed after `from` and present at `R` was sent at
//! its mod revision at `R`" told with one number: the watch sends every
//! change in revision order, so a reader at `p` has been sent each change
//! up to `p`. (a) is the fingerprint's count (`fingerprint.rs`), kept
//! with the position and moved by every create and delete since.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use serde_json::{Value, json};

use super::{EtcdClient, EtcdError, Fingerprint, READ_TIMEOUT, int_field, prefix_end, raw_key_value};

/// Where a resumed watch is caught up: the prefix at the revision etcd
/// was at when it resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CatchUp {
    /// `R`: the store's revision when the watch resumed.
    revision: i64,
    /// Keys under the prefix at `R`.
    count: u64,
    /// The highest mod revision of a key under the prefix at `R` changed
    /// after the resume's position (that position, if none was).
    last_changed: i64,
}

impl CatchUp {
    /// Where the stream is once caught up: `R`.
    pub(crate) fn revision(&self) -> i64 {
        self.revision
    }

    /// Whether a reader whose state `fingerprint` describes (at a revision
    /// up to `R`, or in the middle of one) holds the prefix at `R`, before
    /// it takes in the change of revision `next` (`None`: none read yet).
    /// The module's doc says why.
    pub(crate) fn reached(&self, fingerprint: &Fingerprint, next: Option<i64>) -> bool {
        let Some(at) = fingerprint.revision() else { return false };
        next.is_some_and(|next| next > self.revision) || (at >= self.last_changed && fingerprint.count() == self.count)
    }
}

impl EtcdClient {
    /// Where a watch of `prefix` resumed after revision `from` is caught
    /// up, read in one transaction at the store's revision now. Waits up
    /// to `READ_TIMEOUT`: etcd reads every key of the prefix to filter by
    /// mod revision (none of their values is sent).
    pub(crate) fn catch_up(&self, prefix: &str, from: i64) -> Result<CatchUp, EtcdError> {
        let (key, range_end) = (BASE64.encode(prefix), BASE64.encode(prefix_end(prefix)));
        let body = json!({ "success": [
            { "request_range": { "key": key, "range_end": range_end, "count_only": true } },
            { "request_range": { "key": key, "range_end": range_end, "keys_only": true, "limit": "1",
                                 "min_mod_revision": (from + 1).to_string(),
                                 "sort_target": "MOD", "sort_order": "DESCEND" } },
        ]});
        let reply = self.call_within("kv/txn", &body, READ_TIMEOUT)?;
        let response = |i: usize| reply.pointer(&format!("/responses/{i}/response_range")).unwrap_or(&Value::Null);
        let revision = int_field(reply.get("header").unwrap_or(&Value::Null), "revision")?;
        let count = int_field(response(0), "count")?;
        let changed = response(1).get("kvs").and_then(Value::as_array).and_then(|kvs| kvs.first());
        let last_changed = changed.map(raw_key_value).transpose()?.map_or(from, |kv| kv.mod_revision);
        Ok(CatchUp { revision, count: u64::try_from(count).unwrap_or(0), last_changed })
    }
}

/// How often a wait for a [`CatchUpRead`] looks at its stop.
const STOP_POLL: Duration = Duration::from_millis(50);

/// A catch-up read on a thread of its own, for two reasons:
/// - a restarted cache restores its source before it resumes, so a read
///   started then (a walk over the prefix, in etcd) overlaps what the
///   cache does until the watch opens (loading what it kept) and the
///   check of the kept revision;
/// - the read may take up to `READ_TIMEOUT` when etcd stalls, and a
///   stop must not wait for it: the waiter looks at its stop meanwhile,
///   and the thread ends on its own when the call does.
pub(crate) struct CatchUpRead(Receiver<Result<CatchUp, EtcdError>>);

impl CatchUpRead {
    /// Starts reading where a watch of `prefix` resumed after `from` is
    /// caught up; `None` if no thread could be started (the caller then
    /// reads it on its own thread).
    pub(crate) fn start(client: &EtcdClient, prefix: &str, from: i64) -> Option<Self> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let (client, prefix) = (client.clone(), prefix.to_owned());
        std::thread::Builder::new()
            .name("reconq-etcd-catch-up".to_owned())
            .spawn(move || drop(tx.send(client.catch_up(&prefix, from))))
            .ok()?;
        Some(Self(rx))
    }

    /// What it read, once read; `None` if `stopped()` turned true first
    /// (or its thread is gone).
    pub(crate) fn wait(self, stopped: impl Fn() -> bool) -> Option<Result<CatchUp, EtcdError>> {
        loop {
            match self.0.recv_timeout(STOP_POLL) {
                Ok(read) => return Some(read),
                Err(RecvTimeoutError::Timeout) if !stopped() => {}
                Err(_) => return None,
            }
        }
    }
}

#[cfg(test)]
impl CatchUp {
    /// A catch-up to `revision`, where the prefix holds `count` keys and
    /// the last changed since the resume was at `last_changed`.
    pub(crate) fn at(revision: i64, count: u64, last_changed: i64) -> Self {
        Self { revision, count, last_changed }
    }
}
