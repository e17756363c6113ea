//! `reconq.FakeClock` (guarantees §7.1): the Rust [`FakeClock`] for Python tests,
//! so a reconcile's back-offs, `enqueue_after` delays, hang thresholds and
//! timeouts can be stepped through without sleeping. There is one
//! implementation: this class only converts seconds.

use std::time::Instant;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::convert::non_negative_from_py;
use crate::{clock::Clock, clock::FakeClock};

/// A clock that moves only when told to. Give it to `Controller(clock=...)`
/// or `WorkQueue(clock=...)`.
#[pyclass(name = "FakeClock", module = "reconq", frozen)]
pub(crate) struct PyFakeClock {
    clock: FakeClock,
    /// The instant `now()` counts from, so a new clock reads 0.0.
    origin: Instant,
}

#[pymethods]
impl PyFakeClock {
    #[new]
    fn new() -> Self {
        let clock = FakeClock::new();
        let origin = clock.now();
        Self { clock, origin }
    }

    /// Seconds since this clock was made (it starts at 0.0).
    fn now(&self) -> f64 {
        self.clock.now().duration_since(self.origin).as_secs_f64()
    }

    /// Moves the clock forward by `seconds` (negative or NaN: ValueError).
    /// Returns once every queue and controller on this clock has made what
    /// became due ready; the GIL is released meanwhile.
    fn advance(&self, py: Python<'_>, seconds: &Bound<'_, PyAny>) -> PyResult<()> {
        let by = non_negative_from_py(seconds, "seconds")?;
        let clock = &self.clock;
        py.detach(|| clock.advance(by));
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("<reconq.FakeClock now={}>", self.now())
    }
}

/// The Rust clock behind a `clock=` argument: None, or a `reconq.FakeClock`.
pub(crate) fn fake_clock_from_py(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<FakeClock>> {
    match obj {
        Some(obj) if !obj.is_none() => match obj.cast::<PyFakeClock>() {
            Ok(fake) => Ok(Some(fake.get().clock.clone())),
            Err(_) => Err(PyTypeError::new_err(format!(
                "clock must be a reconq.FakeClock or None, not {}",
                obj.get_type().name()?
            ))),
        },
        _ => Ok(None),
    }
}
