//! Prometheus metrics of named work queues and controllers, with client-go's
//! and controller-runtime's names.
//!
//! | metric | type | labels |
//! | --- | --- | --- |
//! | `workqueue_depth` | gauge | `name`, `controller`, `priority` |
//! | `workqueue_adds_total` | counter | `name`, `controller` |
//! | `workqueue_queue_duration_seconds` | histogram | `name`, `controller` |
//! | `workqueue_work_duration_seconds` | histogram | `name`, `controller` |
//! | `workqueue_unfinished_work_seconds` | gauge | `name`, `controller` |
//! | `workqueue_longest_running_processor_seconds` | gauge | `name`, `controller` |
//! | `workqueue_retries_total` | counter | `name`, `controller` |
//! | `controller_runtime_reconcile_total` | counter | `controller`, `result` = `success` \| `error` \| `requeue` \| `requeue_after` |
//! | `controller_runtime_reconcile_errors_total` | counter | `controller` |
//! | `controller_runtime_terminal_reconcile_errors_total` | counter | `controller` |
//! | `controller_runtime_reconcile_panics_total` | counter | `controller` |
//! | `controller_runtime_reconcile_time_seconds` | histogram | `controller` |
//! | `controller_runtime_active_workers` | gauge | `controller` |
//! | `controller_runtime_max_concurrent_reconciles` | gauge | `controller` |
//! | `controller_runtime_reconcile_timeouts_total` | counter | `controller` (with a reconcile timeout) |
//! | `reconq_held_keys` | gauge | `controller` |
//! | `reconq_superseded_reconciles_total` | counter | `controller` |
//! | `reconq_cache_events_total` | counter | `cache`, `kind` = `put` \| `delete` \| `bookmark` |
//! | `reconq_cache_relists_total`, `reconq_cache_errors_total` | counter | `cache` |
//! | `reconq_cache_synced`, `reconq_cache_keys` | gauge | `cache` |
//! | `leader_election_master_status` | gauge | `name` |
//! | `reconq_shard_owned_partitions` | gauge | `name` |
//!
//! The `workqueue_*` labels are controller-runtime's: `name` and
//! `controller` are both the queue's name, `priority` the priority keys
//! wait at (`"0"` always present; at most 25 series, past which one series
//! `"exceeded_cardinality_limit"` has the whole depth).
//!
//! Only *named* queues record (as in client-go, a queue without a name has
//! no metrics and does no timing): name one with
//! [`WorkQueueBuilder::name`](crate::WorkQueueBuilder::name). A
//! [`Controller`](crate::Controller)'s queue is named after the controller.
//! Objects with the same name add up into one series. `docs/metrics.md`
//! lists the semantics and where they differ from client-go.
//!
//! Three ways to read them, none of which costs anything until used:
//!
//! ```
//! use reconq::WorkQueue;
//!
//! let q = WorkQueue::<u32>::builder().name("doc-example").build();
//! q.add(1);
//! q.add(1); // deduplicated: not an add
//! let text = reconq::metrics::render(); // Prometheus text format 0.0.4
//! assert!(text.contains("workqueue_adds_total{name=\"doc-example\",controller=\"doc-example\"} 1\n"));
//! assert!(text.contains("workqueue_depth{name=\"doc-example\",controller=\"doc-example\",priority=\"0\"} 1\n"));
//!
//! let mut server = reconq::metrics::serve("127.0.0.1:0").unwrap(); // GET /metrics
//! println!("scrape http://{}/metrics", server.local_addr());
//! server.close();
//!
//! reconq::metrics::publish(); // into the `metrics` crate's recorder, if one is installed
//! ```

use std::io;
use std::net::ToSocketAddrs;

use crate::observe::metrics as imp;

pub use imp::MetricsServer;

/// The current metrics of every live named queue and controller, in the
/// Prometheus text exposition format 0.0.4 (`# HELP`, `# TYPE`, histograms
/// as cumulative `_bucket{le=...}`, `_sum` and `_count`).
pub fn render() -> String {
    imp::render()
}

/// Mirrors the current values into the [`metrics`](https://docs.rs/metrics)
/// facade, for programs that run their own recorder and exporter: counters
/// through `absolute`, gauges through `set`, and for each histogram the
/// observations since the previous `publish`, recorded per bucket at the
/// bucket's upper bound (an approximation: a recorder with the same buckets
/// gets the counts exactly, not the sums). Call it before each export, or
/// periodically.
pub fn publish() {
    imp::publish()
}

/// Serves `GET /metrics` ([`render`]'s text) on `addr`, from one thread
/// blocked in `accept` (no CPU while idle, no async runtime) that answers
/// each connection on a thread of its own (up to 32 at once, more are
/// closed; 5 s in all per connection, so a slow client delays no other),
/// and beside it:
///
/// - `/status`: [`status::format_table`](crate::status::format_table) of
///   the whole process, or [`status::to_json`](crate::status::to_json)
///   with `Accept: application/json` or `?format=json`;
/// - `/healthz` and `/readyz`, for Kubernetes liveness and readiness
///   probes: `200 ok`, or `503` with one line per problem
///   ([`status::liveness_problems`](crate::status::liveness_problems),
///   [`status::readiness_problems`](crate::status::readiness_problems)).
///
/// Other paths get 404. Port 0 picks a free port: see
/// [`MetricsServer::local_addr`]. The server stops when the returned value
/// is dropped or closed.
pub fn serve(addr: impl ToSocketAddrs) -> io::Result<MetricsServer> {
    imp::serve(addr)
}
