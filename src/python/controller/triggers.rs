//! Triggers from Python (guarantees §5): `add_trigger(key, fn)` over the
//! engine's own registry ([`ControllerHandle::add_trigger`]), which replaces,
//! removes and stops them and enqueues the key. The binding keeps nothing:
//! `fn` gets a `reconq.StopEvent` (`python/reconq/_triggers.py`), a
//! `threading.Event` whose flag is the trigger's own [`StopSignal`].

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::context::StopSignal;
use crate::controller::ControllerHandle;
use crate::python::attach::attach;
use crate::python::convert::{check_sync_callable, delay_from_py};
use crate::python::errors::describe;
use crate::python::key::PyKey;
use crate::python::logs::{Fields, log_about};
use crate::python::signals::wait_for_signal;

/// A trigger's [`StopSignal`], for `reconq.StopEvent` to read and set.
#[pyclass(name = "TriggerSignal", module = "reconq", frozen)]
pub(crate) struct PyTriggerSignal {
    signal: StopSignal,
}

#[pymethods]
impl PyTriggerSignal {
    fn is_set(&self) -> bool {
        self.signal.is_set()
    }

    fn set(&self) {
        self.signal.set();
    }

    /// As `threading.Event.clear()`: the engine reads the flag when the
    /// trigger returns.
    fn clear(&self) {
        self.signal.reset_to(false);
    }

    /// Blocks, with the GIL released, until set or `timeout` seconds passed
    /// (None: no limit; not positive: no wait, as `threading.Event`);
    /// returns whether it is set.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let timeout: Option<Duration> =
            timeout.filter(|t| !t.is_none()).map(|t| delay_from_py(t, "timeout")).transpose()?;
        wait_for_signal(py, &self.signal, timeout)
    }
}

/// `reconq._triggers.StopEvent`, looked up once.
static STOP_EVENT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// A `reconq.StopEvent` over `signal`.
fn stop_event<'py>(py: Python<'py>, signal: &StopSignal) -> PyResult<Bound<'py, PyAny>> {
    let class = STOP_EVENT
        .get_or_try_init(py, || Ok::<_, PyErr>(py.import("reconq._triggers")?.getattr("StopEvent")?.unbind()))?;
    class.bind(py).call1((PyTriggerSignal { signal: signal.clone() },))
}

/// Runs `trigger(stop_event)` on a thread of the engine's and lets the
/// engine enqueue `key` when it returns, unless it raised (logged) or its
/// stop event was set.
pub(super) fn add_trigger(
    py: Python<'_>,
    handle: &ControllerHandle<PyKey>,
    name: &Arc<str>,
    key: PyKey,
    trigger: &Bound<'_, PyAny>,
) -> PyResult<()> {
    check_sync_callable(trigger, "fn", 1)?;
    let trigger = trigger.clone().unbind();
    let name = Arc::clone(name);
    let trigger_key = key.clone();
    py.detach(move || {
        handle.add_trigger(key, move |signal: &StopSignal| -> bool {
            let returned = attach(|py| {
                let called = stop_event(py, signal).and_then(|event| trigger.bind(py).call1((event,)));
                match called {
                    Ok(_) => true,
                    Err(e) => {
                        let message = describe(py, &e);
                        let key_obj = trigger_key.to_py(py).ok();
                        let shown = key_obj.as_ref().map(|obj| trigger_key.log_repr(obj)).unwrap_or_default();
                        let args = ("controller %r: trigger for %s raised: %s", &*name, shown, message);
                        let fields = Fields { key: key_obj.as_ref(), ..Fields::controller(&name) };
                        log_about(py, "error", args, Some(&e), &fields);
                        false
                    }
                }
            });
            returned.unwrap_or(false)
        });
    });
    Ok(())
}
