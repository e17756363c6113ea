//! With no `tracing` subscriber anywhere in the process (this test binary
//! never sets one), the engine's events reach a `log` logger (`tracing`'s
//! `log` feature; the Python bindings forward these records to `logging`).
//! Each record's message carries the context itself, since `log` records
//! have no spans, and reconciles produce no span records at all.

mod common;

use std::sync::Arc;

use log::{Level, LevelFilter, Log, Metadata, Record};
use parking_lot::Mutex;
use reconq::{Action, Context, Controller, ExponentialBackoff, ReconcileError};

use common::{PATIENCE, ms};

#[derive(Debug, Clone, PartialEq)]
struct Line {
    level: Level,
    target: String,
    message: String,
}

struct Capture(Arc<Mutex<Vec<Line>>>);

impl Log for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &Record<'_>) {
        let line =
            Line { level: record.level(), target: record.target().to_owned(), message: record.args().to_string() };
        self.0.lock().push(line);
    }
    fn flush(&self) {}
}

#[test]
fn engine_events_become_log_records_with_their_context_and_spans_stay_silent() {
    let lines = Arc::new(Mutex::new(Vec::new()));
    log::set_logger(Box::leak(Box::new(Capture(Arc::clone(&lines))))).unwrap();
    // Everything, so span lifecycle records (TRACE) would show if made.
    log::set_max_level(LevelFilter::Trace);
    assert!(!tracing::dispatcher::has_been_set());

    let h = Controller::new("compat", |key: &String, ctx: &Context| -> Result<Action, ReconcileError> {
        match (key.as_str(), ctx.attempt()) {
            ("flaky", 0) => Err(ReconcileError::new("connection refused")),
            ("crash", 0) => panic!("boom"),
            _ => Ok(Action::Done),
        }
    })
    .rate_limiter(ExponentialBackoff::new(ms(1), ms(1)))
    .start();
    for key in ["ok-1", "flaky", "ok-2"] {
        h.enqueue(key.to_string());
    }
    assert!(h.wait_idle(PATIENCE));
    h.enqueue("crash".to_string());
    assert!(h.wait_idle(PATIENCE));
    assert!(h.stop_with_drain(PATIENCE));
    assert_eq!(h.stats().reconciles, 6);

    assert_eq!(
        *lines.lock(),
        [
            Line {
                level: Level::Error,
                target: "reconq::controller".into(),
                message: r#"reconcile failed; retrying with backoff controller=compat key="flaky" attempt=0 error="connection refused""#
                    .into(),
            },
            Line {
                level: Level::Error,
                target: "reconq::controller".into(),
                message: r#"reconcile panicked; retrying with backoff controller=compat key="crash" attempt=0 error="boom""#
                    .into(),
            },
        ]
    );
}
