//! What a named controller runs and how often: [`ControllerParams`] and the
//! error type its `do` function returns, [`DoError`].

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::context::Context;

/// The `do` function of a named controller, given the run's [`Context`].
pub(crate) type DoFn = Arc<dyn Fn(&Context) -> Result<(), DoError> + Send + Sync>;
/// The `stop` function of a named controller; it runs at most once.
pub(crate) type StopFn = Box<dyn FnOnce() + Send>;

/// The default [`ControllerParams::error_retry_base`]: one second, as Cilium.
pub const DEFAULT_ERROR_RETRY_BASE: Duration = Duration::from_secs(1);

/// Why a run of a controller's `do` function did not succeed.
///
/// Either an ordinary error, which makes the controller retry with linear
/// backoff, or an **exit reason** ([`DoError::exit`]), which parks the
/// controller until its next [`update`](super::Manager::update) or
/// [`trigger`](super::Manager::trigger). As in Cilium, an exit counts as a
/// success and its reason is shown as the status's `last_error`.
///
/// Like `anyhow::Error`, `DoError` converts from any error (anything that is
/// `Into<Box<dyn Error + Send + Sync>>`, which includes `String` and `&str`),
/// so `?` works in a `do` function, and for that reason it does not itself
/// implement [`std::error::Error`].
///
/// ```
/// use reconq::DoError;
///
/// fn sync_routes() -> Result<(), DoError> {
///     let n: u32 = "42".parse()?; // any std error converts
///     if n == 0 {
///         return Err(DoError::exit("nothing left to sync"));
///     }
///     Err("route table busy".into())
/// }
/// assert_eq!(sync_routes().unwrap_err().to_string(), "route table busy");
/// ```
pub struct DoError {
    kind: Kind,
}

enum Kind {
    Error(Box<dyn Error + Send + Sync>),
    Exit(String),
}

impl DoError {
    /// An ordinary failure: the controller retries after its backoff.
    pub fn new(error: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        Self { kind: Kind::Error(error.into()) }
    }

    /// An exit: the controller stops running `do` until the next update or
    /// trigger. Counted as a success; `reason` becomes `last_error`.
    pub fn exit(reason: impl Into<String>) -> Self {
        Self { kind: Kind::Exit(reason.into()) }
    }

    /// Whether this is an exit reason rather than an error.
    pub fn is_exit(&self) -> bool {
        matches!(self.kind, Kind::Exit(_))
    }

    /// The exit reason, if this is one.
    pub fn exit_reason(&self) -> Option<&str> {
        match &self.kind {
            Kind::Exit(reason) => Some(reason),
            Kind::Error(_) => None,
        }
    }

    /// The underlying error, if this is an ordinary failure.
    pub fn as_error(&self) -> Option<&(dyn Error + Send + Sync + 'static)> {
        match &self.kind {
            Kind::Error(error) => Some(&**error),
            Kind::Exit(_) => None,
        }
    }

    /// The underlying error, if this is an ordinary failure.
    pub fn into_error(self) -> Option<Box<dyn Error + Send + Sync>> {
        match self.kind {
            Kind::Error(error) => Some(error),
            Kind::Exit(_) => None,
        }
    }
}

impl<E: Into<Box<dyn Error + Send + Sync>>> From<E> for DoError {
    fn from(error: E) -> Self {
        Self::new(error)
    }
}

impl fmt::Display for DoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Error(error) => fmt::Display::fmt(error, f),
            Kind::Exit(reason) => f.write_str(reason),
        }
    }
}

impl fmt::Debug for DoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Error(error) => f.debug_tuple("DoError::Error").field(error).finish(),
            Kind::Exit(reason) => f.debug_tuple("DoError::Exit").field(reason).finish(),
        }
    }
}

/// The parameters of a named controller, given to
/// [`Manager::update`](super::Manager::update).
///
/// As in Cilium, a zero duration means "not set": `run_interval(ZERO)` is no
/// interval, `error_retry_base(ZERO)` is the default (1 s) and
/// `max_retry_interval(ZERO)` is no cap. This keeps a zero from turning a
/// failing controller into a busy loop.
///
/// ```
/// use reconq::{ControllerParams, DoError};
/// use std::time::Duration;
///
/// let params = ControllerParams::new(|| -> Result<(), DoError> { Ok(()) })
///     .run_interval(Duration::from_secs(30))
///     .error_retry_base(Duration::from_millis(500))
///     .max_retry_interval(Duration::from_secs(10))
///     .stop(|| println!("cleaned up"));
/// assert_eq!(params.get_run_interval(), Some(Duration::from_secs(30)));
/// ```
#[must_use = "parameters do nothing until given to `Manager::update`"]
pub struct ControllerParams {
    pub(crate) do_fn: DoFn,
    pub(crate) stop_fn: Option<StopFn>,
    pub(crate) run_interval: Option<Duration>,
    pub(crate) error_retry_base: Duration,
    pub(crate) max_retry_interval: Option<Duration>,
    pub(crate) no_error_retry: bool,
}

impl ControllerParams {
    /// Parameters running `do_fn` until it succeeds, then only again on
    /// update or trigger; retries after `n * 1 s` after the n-th consecutive
    /// failure; no `stop` function.
    pub fn new(do_fn: impl Fn() -> Result<(), DoError> + Send + Sync + 'static) -> Self {
        Self::with_context(move |_: &Context| do_fn())
    }

    /// [`new`](Self::new) with a `do` that sees its run's [`Context`]:
    /// `attempt()` is the number of consecutive failures before this run,
    /// and it is cancelled when the controller is removed, replaced by an
    /// update, or its manager dropped (as Cilium cancels a running
    /// `DoFunc`'s context). Cancellation is cooperative: a long `do` should
    /// check [`Context::is_cancelled`] or sleep with
    /// [`Context::wait_cancelled`].
    ///
    /// ```
    /// use reconq::{ControllerParams, DoError};
    /// use std::time::Duration;
    ///
    /// let params = ControllerParams::with_context(|ctx| -> Result<(), DoError> {
    ///     for _ in 0..10 {
    ///         if ctx.wait_cancelled(Duration::from_millis(10)) {
    ///             return Err(DoError::exit("cancelled"));
    ///         }
    ///     }
    ///     Ok(())
    /// });
    /// # drop(params);
    /// ```
    pub fn with_context(do_fn: impl Fn(&Context) -> Result<(), DoError> + Send + Sync + 'static) -> Self {
        Self {
            do_fn: Arc::new(do_fn),
            stop_fn: None,
            run_interval: None,
            error_retry_base: DEFAULT_ERROR_RETRY_BASE,
            max_retry_interval: None,
            no_error_retry: false,
        }
    }

    /// Runs `stop_fn` once when the controller is removed, after `do` ran at
    /// least once. A later update's `stop` replaces this one (only the latest
    /// runs).
    pub fn stop(mut self, stop_fn: impl FnOnce() + Send + 'static) -> Self {
        self.stop_fn = Some(Box::new(stop_fn));
        self
    }

    /// Runs `do` again `interval` after each success (measured from the end
    /// of the run). Zero means no interval: after a success `do` runs again
    /// only on update or trigger.
    pub fn run_interval(mut self, interval: impl Into<Option<Duration>>) -> Self {
        self.run_interval = interval.into().filter(|d| !d.is_zero());
        self
    }

    /// After the n-th consecutive failure, waits `n * base` before the retry.
    /// Zero means the default, 1 s.
    pub fn error_retry_base(mut self, base: Duration) -> Self {
        self.error_retry_base = if base.is_zero() { DEFAULT_ERROR_RETRY_BASE } else { base };
        self
    }

    /// Caps the wait before a retry. Zero (or `None`) means no cap.
    pub fn max_retry_interval(mut self, max: impl Into<Option<Duration>>) -> Self {
        self.max_retry_interval = max.into().filter(|d| !d.is_zero());
        self
    }

    /// With `true`, a failure is not retried with backoff: the controller
    /// waits its `run_interval` as after a success (and with no interval,
    /// waits for an update or trigger).
    pub fn no_error_retry(mut self, no_error_retry: bool) -> Self {
        self.no_error_retry = no_error_retry;
        self
    }

    /// What [`run_interval`](Self::run_interval) set (`None`: no interval).
    pub fn get_run_interval(&self) -> Option<Duration> {
        self.run_interval
    }

    /// What [`error_retry_base`](Self::error_retry_base) set (1 s unless set).
    pub fn get_error_retry_base(&self) -> Duration {
        self.error_retry_base
    }

    /// What [`max_retry_interval`](Self::max_retry_interval) set (`None`: no
    /// cap).
    pub fn get_max_retry_interval(&self) -> Option<Duration> {
        self.max_retry_interval
    }

    /// What [`no_error_retry`](Self::no_error_retry) set.
    pub fn get_no_error_retry(&self) -> bool {
        self.no_error_retry
    }

    /// How long to wait after the `consecutive_failures`-th failure in a row
    /// (at least 1), or `None` to wait for an update or trigger.
    pub(crate) fn retry_delay(&self, consecutive_failures: u64) -> Option<Duration> {
        if self.no_error_retry {
            return self.run_interval;
        }
        let n = u32::try_from(consecutive_failures).unwrap_or(u32::MAX);
        let delay = self.error_retry_base.checked_mul(n).unwrap_or(Duration::MAX);
        Some(match self.max_retry_interval {
            Some(max) => delay.min(max),
            None => delay,
        })
    }
}

impl fmt::Debug for ControllerParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerParams")
            .field("has_stop", &self.stop_fn.is_some())
            .field("run_interval", &self.run_interval)
            .field("error_retry_base", &self.error_retry_base)
            .field("max_retry_interval", &self.max_retry_interval)
            .field("no_error_retry", &self.no_error_retry)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> Result<(), DoError> {
        Ok(())
    }

    #[test]
    fn retry_delay_is_linear_and_capped() {
        let p = ControllerParams::new(ok).error_retry_base(Duration::from_millis(100));
        assert_eq!(p.retry_delay(1), Some(Duration::from_millis(100)));
        assert_eq!(p.retry_delay(3), Some(Duration::from_millis(300)));
        // The failure count saturates instead of overflowing.
        assert_eq!(p.retry_delay(u64::MAX), Some(Duration::from_millis(100) * u32::MAX));
        let huge = ControllerParams::new(ok).error_retry_base(Duration::MAX);
        assert_eq!(huge.retry_delay(2), Some(Duration::MAX));
        let p = p.max_retry_interval(Duration::from_millis(250));
        assert_eq!(p.retry_delay(3), Some(Duration::from_millis(250)));
    }

    #[test]
    fn zero_means_unset() {
        let p = ControllerParams::new(ok)
            .run_interval(Duration::ZERO)
            .error_retry_base(Duration::ZERO)
            .max_retry_interval(Duration::ZERO);
        assert_eq!(p.get_run_interval(), None);
        assert_eq!(p.get_error_retry_base(), DEFAULT_ERROR_RETRY_BASE);
        assert_eq!(p.get_max_retry_interval(), None);
    }

    #[test]
    fn no_error_retry_waits_the_interval() {
        let p = ControllerParams::new(ok).no_error_retry(true);
        assert_eq!(p.retry_delay(5), None);
        let p = p.run_interval(Duration::from_secs(7));
        assert_eq!(p.retry_delay(5), Some(Duration::from_secs(7)));
    }

    #[test]
    fn do_error_conversions() {
        fn parse() -> Result<(), DoError> {
            let _: u8 = "300".parse()?;
            Ok(())
        }
        let e = parse().unwrap_err();
        assert!(!e.is_exit());
        assert!(e.as_error().is_some());
        let e: DoError = "plain".into();
        assert_eq!(e.to_string(), "plain");
        let e: DoError = String::from("owned").into();
        assert_eq!(e.to_string(), "owned");
        let e = DoError::exit("done");
        assert!(e.is_exit());
        assert_eq!(e.exit_reason(), Some("done"));
        assert_eq!(e.to_string(), "done");
    }
}
