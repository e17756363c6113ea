//! The global status as JSON (`GET /status` with `Accept:
//! application/json` or `?format=json`): the fields and names of Python's
//! `reconq.status()` dicts, so a script reads either the same way. Times
//! are Unix timestamps in seconds, durations seconds; hanging keys are
//! their `Debug` text.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use super::status::{EntryKind, StatusEntry};

/// `entries` as a JSON array of objects, one per entry.
pub fn to_json(entries: &[StatusEntry]) -> String {
    Value::Array(entries.iter().map(entry).collect()).to_string()
}

fn timestamp(t: Option<SystemTime>) -> Value {
    t.map_or(Value::Null, |t| match t.duration_since(UNIX_EPOCH) {
        Ok(d) => json!(d.as_secs_f64()),
        Err(e) => json!(-e.duration().as_secs_f64()),
    })
}

fn secs(d: Option<Duration>) -> Value {
    d.map_or(Value::Null, |d| json!(d.as_secs_f64()))
}

fn entry(e: &StatusEntry) -> Value {
    let mut d = Map::new();
    d.insert("kind".into(), json!(e.kind.label()));
    d.insert("name".into(), json!(e.name));
    d.insert("state".into(), json!(e.state()));
    d.insert("successes".into(), json!(e.successes));
    d.insert("failures".into(), json!(e.failures));
    d.insert("consecutive_failures".into(), json!(e.consecutive_failures));
    d.insert("last_error".into(), json!(e.last_error));
    d.insert("last_error_time".into(), timestamp(e.last_error_time));
    d.insert("last_success_time".into(), timestamp(e.last_success_time));
    let leader = match &e.kind {
        EntryKind::Controller(c) => {
            d.insert("workers".into(), json!(c.workers));
            d.insert("reconciles".into(), json!(c.reconciles));
            d.insert("requeues".into(), json!(c.requeues));
            d.insert("panics".into(), json!(c.panics));
            d.insert("depth".into(), json!(c.depth));
            d.insert("processing".into(), json!(c.processing));
            d.insert("waiting".into(), json!(c.waiting));
            d.insert("parked".into(), json!(c.parked));
            d.insert("held".into(), json!(c.held));
            d.insert("superseded".into(), json!(c.superseded));
            d.insert("hanging_threshold".into(), secs(c.hanging_threshold));
            let hanging: Map<String, Value> =
                c.hanging.iter().map(|h| (h.key.clone(), json!(h.running.as_secs_f64()))).collect();
            d.insert("hanging".into(), Value::Object(hanging));
            if let Some(store) = &c.store {
                d.insert("store_pending".into(), json!(store.pending));
                d.insert("last_flush_time".into(), timestamp(store.last_flush_time));
                d.insert("store_error".into(), json!(store.error));
            }
            if let Some(shards) = &c.shards {
                d.insert("not_owned".into(), json!(c.not_owned));
                d.insert("owned_partitions".into(), json!(shards.owned.len()));
                d.insert("members".into(), json!(shards.members));
                d.insert("shard_error".into(), json!(shards.last_error));
            }
            c.leader.as_ref()
        }
        EntryKind::Periodic(p) => {
            d.insert("manager".into(), json!(p.manager));
            d.insert("running".into(), json!(p.running));
            d.insert("last_duration".into(), secs(p.last_duration));
            d.insert("next_run_in".into(), secs(p.next_run_in));
            p.leader.as_ref()
        }
        EntryKind::Cache(c) => {
            d.insert("synced".into(), json!(c.synced));
            d.insert("keys".into(), json!(c.keys));
            d.insert("position".into(), json!(c.position));
            d.insert("relists".into(), json!(c.relists));
            None
        }
    };
    if let Some(l) = leader {
        d.insert("is_leader".into(), json!(l.is_leader()));
        d.insert("leader".into(), json!(l.leader));
        d.insert("fencing_token".into(), json!(l.fencing_token));
        d.insert("leader_error".into(), json!(l.last_error));
    }
    Value::Object(d)
}
