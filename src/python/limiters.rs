//! Rate limiters (guarantees §2) as Python classes.
//!
//! Every class derives from `reconq.RateLimiter`, which holds the shared Rust
//! limiter; one limiter object may serve several queues and `MaxOf` /
//! `WithMaxWait` wrappers at once (they all share its memory of keys).

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::convert::{non_negative_from_py, to_secs, type_name};
use super::key::PyKey;
use crate::rate_limit::{self, RateLimiter as _};

pub(crate) type SharedLimiter = Arc<dyn crate::rate_limit::RateLimiter<PyKey>>;

/// Base class of the rate limiters; not constructible itself.
#[pyclass(name = "RateLimiter", module = "reconq", subclass, frozen)]
pub(crate) struct PyRateLimiter {
    inner: SharedLimiter,
    repr: String,
}

impl PyRateLimiter {
    fn init(inner: SharedLimiter, repr: String) -> PyClassInitializer<Self> {
        PyClassInitializer::from(Self { inner, repr })
    }

    pub(crate) fn shared(&self) -> SharedLimiter {
        Arc::clone(&self.inner)
    }
}

#[pymethods]
impl PyRateLimiter {
    /// How long `key` should wait now, in seconds. Each call counts as one
    /// more requeue of `key`.
    fn when(&self, key: &Bound<'_, PyAny>) -> PyResult<f64> {
        let key = PyKey::from_py(key)?;
        Ok(to_secs(self.inner.when(&key)))
    }

    /// Forgets `key`'s history.
    fn forget(&self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        let key = PyKey::from_py(key)?;
        self.inner.forget(&key);
        Ok(())
    }

    /// How many times `when(key)` was asked since `key` was last forgotten.
    fn num_requeues(&self, key: &Bound<'_, PyAny>) -> PyResult<u32> {
        let key = PyKey::from_py(key)?;
        Ok(self.inner.num_requeues(&key))
    }

    fn __repr__(&self) -> String {
        self.repr.clone()
    }
}

/// The shared limiter behind a Python limiter object, `TypeError` otherwise.
pub(crate) fn limiter_from_py(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<SharedLimiter> {
    match obj.cast::<PyRateLimiter>() {
        Ok(l) => Ok(l.get().shared()),
        Err(_) => {
            let type_name = type_name(obj);
            Err(PyTypeError::new_err(format!("{what} must be a reconq rate limiter, not {type_name}")))
        }
    }
}

/// `None` means [`default_rate_limiter`](crate::default_rate_limiter).
pub(crate) fn optional_limiter_from_py(obj: Option<&Bound<'_, PyAny>>) -> PyResult<SharedLimiter> {
    match obj {
        Some(obj) if !obj.is_none() => limiter_from_py(obj, "rate_limiter"),
        _ => Ok(Arc::new(rate_limit::default_rate_limiter::<PyKey>())),
    }
}

fn secs_repr(d: f64) -> String {
    format!("{d:?}")
}

fn duration_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<(Duration, f64)> {
    let d = non_negative_from_py(obj, what)?;
    Ok((d, d.as_secs_f64()))
}

/// `base * 2**n` seconds capped at `max`, n = the key's failures so far.
#[pyclass(module = "reconq", extends = PyRateLimiter, frozen)]
pub(crate) struct ExponentialBackoff;

#[pymethods]
impl ExponentialBackoff {
    #[new]
    fn new(base: &Bound<'_, PyAny>, max: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        let (base, base_s) = duration_arg(base, "base")?;
        let (max, max_s) = duration_arg(max, "max")?;
        let repr = format!("ExponentialBackoff(base={}, max={})", secs_repr(base_s), secs_repr(max_s));
        Ok(PyRateLimiter::init(Arc::new(rate_limit::ExponentialBackoff::new(base, max)), repr).add_subclass(Self))
    }
}

/// `fast` seconds for a key's first `max_fast_attempts` tries, then `slow`.
#[pyclass(module = "reconq", extends = PyRateLimiter, frozen)]
pub(crate) struct FastSlow;

#[pymethods]
impl FastSlow {
    #[new]
    fn new(
        fast: &Bound<'_, PyAny>,
        slow: &Bound<'_, PyAny>,
        max_fast_attempts: &Bound<'_, PyAny>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (fast, fast_s) = duration_arg(fast, "fast")?;
        let (slow, slow_s) = duration_arg(slow, "slow")?;
        let attempts: i64 =
            max_fast_attempts.extract().map_err(|_| PyTypeError::new_err("max_fast_attempts must be an int"))?;
        if attempts < 0 {
            return Err(PyValueError::new_err(format!("max_fast_attempts must not be negative, got {attempts}")));
        }
        let attempts =
            u32::try_from(attempts).map_err(|_| PyOverflowError::new_err("max_fast_attempts is out of range"))?;
        let repr =
            format!("FastSlow(fast={}, slow={}, max_fast_attempts={attempts})", secs_repr(fast_s), secs_repr(slow_s));
        Ok(PyRateLimiter::init(Arc::new(rate_limit::FastSlow::new(fast, slow, attempts)), repr).add_subclass(Self))
    }
}

/// One token bucket for all keys: `qps` tokens a second, at most `burst`
/// saved. `num_requeues` is always 0.
#[pyclass(module = "reconq", extends = PyRateLimiter, frozen)]
pub(crate) struct TokenBucket;

#[pymethods]
impl TokenBucket {
    #[new]
    fn new(qps: &Bound<'_, PyAny>, burst: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        let qps: f64 = qps.extract().map_err(|e: PyErr| {
            if e.is_instance_of::<PyOverflowError>(qps.py()) { e } else { PyTypeError::new_err("qps must be a number") }
        })?;
        if !(qps.is_finite() && qps > 0.0) {
            return Err(PyValueError::new_err(format!("qps must be a positive finite number, got {qps}")));
        }
        let burst: i64 = burst.extract().map_err(|e: PyErr| {
            if e.is_instance_of::<PyOverflowError>(burst.py()) {
                e
            } else {
                PyTypeError::new_err("burst must be an int")
            }
        })?;
        if burst < 1 {
            return Err(PyValueError::new_err(format!("burst must be at least 1, got {burst}")));
        }
        let burst = u32::try_from(burst).map_err(|_| PyOverflowError::new_err("burst is out of range"))?;
        let bucket = rate_limit::TokenBucket::try_new(qps, burst).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let repr = format!("TokenBucket(qps={qps:?}, burst={burst})");
        Ok(PyRateLimiter::init(Arc::new(bucket), repr).add_subclass(Self))
    }
}

/// The longest wait of its members; `forget` goes to all of them and
/// `num_requeues` is their maximum. `MaxOf(a, b)` or `MaxOf([a, b])`.
#[pyclass(module = "reconq", extends = PyRateLimiter, frozen)]
pub(crate) struct MaxOf;

#[pymethods]
impl MaxOf {
    #[new]
    #[pyo3(signature = (*limiters))]
    fn new(limiters: &Bound<'_, PyTuple>) -> PyResult<PyClassInitializer<Self>> {
        // One list or tuple argument is the member list itself.
        let members: Vec<Bound<'_, PyAny>> = if limiters.len() == 1
            && (limiters.get_item(0)?.cast::<PyList>().is_ok() || limiters.get_item(0)?.cast::<PyTuple>().is_ok())
        {
            limiters.get_item(0)?.try_iter()?.collect::<PyResult<_>>()?
        } else {
            limiters.iter().collect()
        };
        if members.is_empty() {
            return Err(PyValueError::new_err("MaxOf needs at least one limiter"));
        }
        let mut boxed: Vec<Box<dyn crate::rate_limit::RateLimiter<PyKey>>> = Vec::with_capacity(members.len());
        let mut reprs = Vec::with_capacity(members.len());
        for m in &members {
            let shared = limiter_from_py(m, "every MaxOf member")?;
            boxed.push(Box::new(shared));
            reprs.push(m.cast::<PyRateLimiter>()?.get().repr.clone());
        }
        let repr = format!("MaxOf({})", reprs.join(", "));
        Ok(PyRateLimiter::init(Arc::new(rate_limit::MaxOf::new(boxed)), repr).add_subclass(Self))
    }
}

/// Another limiter's wait, capped at `max` seconds.
#[pyclass(module = "reconq", extends = PyRateLimiter, frozen)]
pub(crate) struct WithMaxWait;

#[pymethods]
impl WithMaxWait {
    #[new]
    fn new(limiter: &Bound<'_, PyAny>, max: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        let shared = limiter_from_py(limiter, "limiter")?;
        let (max, max_s) = duration_arg(max, "max")?;
        let inner_repr = limiter.cast::<PyRateLimiter>()?.get().repr.clone();
        let repr = format!("WithMaxWait({inner_repr}, max={})", secs_repr(max_s));
        Ok(PyRateLimiter::init(Arc::new(rate_limit::WithMaxWait::new(shared, max)), repr).add_subclass(Self))
    }
}

/// client-go's default controller limiter:
/// `MaxOf(ExponentialBackoff(0.005, 1000.0), TokenBucket(10.0, 100))`.
#[pyfunction]
pub(crate) fn default_rate_limiter(py: Python<'_>) -> PyResult<Bound<'_, MaxOf>> {
    let repr = "MaxOf(ExponentialBackoff(base=0.005, max=1000.0), TokenBucket(qps=10.0, burst=100))".to_string();
    let init = PyRateLimiter::init(Arc::new(rate_limit::default_rate_limiter::<PyKey>()), repr).add_subclass(MaxOf);
    Bound::new(py, init)
}
