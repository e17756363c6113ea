//! Liveness and readiness, as Kubernetes probes ask them (`/healthz` and
//! `/readyz` on the metrics server, after controller-runtime's and kopf's
//! endpoints).
//!
//! Both ask every registered object (see [`Observed::check_live`] and
//! [`Observed::check_ready`]) and gather what each reports against; nothing
//! reported means live, or ready. This is the one place a new kind of
//! component joins the probes: a cache registers like a controller and
//! its status row says when it is not ready (not started, syncing,
//! stopped).
//!
//! [`Observed::check_live`]: super::Observed::check_live
//! [`Observed::check_ready`]: super::Observed::check_ready

use super::visit;

/// Why the process is not live: one line per engine thread that died
/// while its controller runs (a restart would help). Empty when every
/// engine thread of every running controller is alive.
///
/// Hanging reconciles and failures do not count: they show in the status,
/// and a restart would only cut them short.
pub fn liveness_problems() -> Vec<String> {
    let mut problems = Vec::new();
    visit(|object| object.check_live(&mut problems));
    problems
}

/// Why the process is not ready: one line per component that is not (a
/// controller not started yet, or stopping; an election or sharding that
/// has not learnt who leads or who the members are; a cache not synced
/// yet). Empty when every controller runs and knows its leadership and
/// every cache runs and has synced.
pub fn readiness_problems() -> Vec<String> {
    let mut problems = Vec::new();
    visit(|object| object.check_ready(&mut problems));
    problems
}
