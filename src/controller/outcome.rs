//! What a reconcile returns: [`Action`], [`ReconcileError`], the
//! [`Reconciler`] trait, and the classification the worker acts on (guarantees §4's
//! result table).

use std::error::Error;
use std::fmt;
use std::time::Duration;

use crate::context::Context;
use crate::panics;

/// What to do with a key after a successful reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// The key is in its desired state: forget its retry history.
    Done,
    /// Run the key again after its rate limiter's wait (counted as a requeue,
    /// not a failure; the limiter's count for the key grows).
    Requeue,
    /// Forget the key's retry history and run it again after this delay
    /// (periodic resyncs, polling an external system).
    RequeueAfter(Duration),
}

/// A boxed error, the payload of a [`ReconcileError`].
pub type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// How a failed reconcile is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryPolicy {
    /// Retry after the controller's rate limiter's wait (the default).
    RateLimited,
    /// Retry after exactly this delay (plus jitter if configured), without
    /// asking the limiter and without forgetting the key's history.
    After(Duration),
    /// Do not retry: forget the key's history and park it (see
    /// [`ControllerHandle::parked`](super::ControllerHandle::parked)).
    Never,
}

impl From<RetryPolicy> for crate::logs::NextTry {
    fn from(retry: RetryPolicy) -> Self {
        match retry {
            RetryPolicy::RateLimited => Self::Backoff,
            RetryPolicy::After(delay) => Self::After(delay),
            RetryPolicy::Never => Self::Parked,
        }
    }
}

/// A failed reconcile: an error plus how to retry it.
///
/// `?` on any error type (anything `Into<Box<dyn Error + Send + Sync>>`,
/// including `&str` and `String`) gives a plain rate-limited retry. Like
/// `anyhow::Error`, this type deliberately does not implement
/// [`std::error::Error`] itself, which is what makes that blanket conversion
/// possible; use [`inner`](Self::inner) or [`into_inner`](Self::into_inner)
/// to get at the error.
///
/// ```
/// use reconq::{Action, Context, ReconcileError};
/// use std::time::Duration;
///
/// fn reconcile(key: &String, _ctx: &Context) -> Result<Action, ReconcileError> {
///     let n: u32 = key.parse()?; // a parse error: retried with backoff
///     if n == 0 {
///         return Err(ReconcileError::permanent("zero is not a valid id"));
///     }
///     if n > 100 {
///         return Err(ReconcileError::retry_after(Duration::from_secs(5), "busy"));
///     }
///     Ok(Action::Done)
/// }
/// assert!(reconcile(&"x".into(), &Context::detached(0)).is_err());
/// ```
pub struct ReconcileError {
    retry: RetryPolicy,
    error: BoxError,
}

impl ReconcileError {
    /// A failure retried after the rate limiter's wait.
    pub fn new(error: impl Into<BoxError>) -> Self {
        Self { retry: RetryPolicy::RateLimited, error: error.into() }
    }

    /// A failure that is not retried: the key is forgotten and parked.
    pub fn permanent(error: impl Into<BoxError>) -> Self {
        Self { retry: RetryPolicy::Never, error: error.into() }
    }

    /// A failure retried after `delay` (the limiter is not asked and the
    /// key's history is kept).
    pub fn retry_after(delay: Duration, error: impl Into<BoxError>) -> Self {
        Self { retry: RetryPolicy::After(delay), error: error.into() }
    }

    /// How this failure is retried.
    pub fn retry_policy(&self) -> RetryPolicy {
        self.retry
    }

    /// Whether this failure is not retried.
    pub fn is_permanent(&self) -> bool {
        self.retry == RetryPolicy::Never
    }

    /// The delay given to [`retry_after`](Self::retry_after), if any.
    pub fn retry_delay(&self) -> Option<Duration> {
        match self.retry {
            RetryPolicy::After(d) => Some(d),
            _ => None,
        }
    }

    /// The underlying error.
    pub fn inner(&self) -> &(dyn Error + Send + Sync + 'static) {
        &*self.error
    }

    /// The underlying error, owned.
    pub fn into_inner(self) -> BoxError {
        self.error
    }
}

impl<E: Into<BoxError>> From<E> for ReconcileError {
    fn from(error: E) -> Self {
        Self::new(error)
    }
}

impl fmt::Display for ReconcileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl fmt::Debug for ReconcileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReconcileError").field("retry", &self.retry).field("error", &self.error).finish()
    }
}

/// Brings a key to its desired state. Called on a worker thread, never
/// concurrently for the same key (G2).
///
/// Closures `Fn(&K, &Context) -> Result<Action, E>` with
/// `E: Into<ReconcileError>` implement this too; annotate the closure's
/// argument types (`|key: &String, ctx: &Context| ...`) and, if it only
/// returns `Ok`, its error type.
pub trait Reconciler<K>: Send + Sync + 'static {
    /// Reconciles `key` once. `Ok` says what to do next with the key; an
    /// `Err` is retried as its [`RetryPolicy`] says. `ctx` tells the
    /// attempt, the priority and whether this run was cancelled.
    fn reconcile(&self, key: &K, ctx: &Context) -> Result<Action, ReconcileError>;
}

impl<K, F, E> Reconciler<K> for F
where
    F: Fn(&K, &Context) -> Result<Action, E> + Send + Sync + 'static,
    E: Into<ReconcileError>,
{
    fn reconcile(&self, key: &K, ctx: &Context) -> Result<Action, ReconcileError> {
        self(key, ctx).map_err(Into::into)
    }
}

/// What the worker does with a finished reconcile.
pub(crate) enum Outcome {
    /// `Ok(Done)`: forget, success.
    Success,
    /// `Ok(Requeue)`: rate-limited re-add, requeue.
    Requeue,
    /// `Ok(RequeueAfter(d))`: forget, add after `d`, requeue.
    RequeueAfter(Duration),
    /// An error or a panic: a failure retried per `retry`.
    Failure { retry: RetryPolicy, message: String, panicked: bool },
}

impl Outcome {
    pub(crate) fn classify(result: std::thread::Result<Result<Action, ReconcileError>>) -> Self {
        match result {
            Ok(Ok(Action::Done)) => Outcome::Success,
            Ok(Ok(Action::Requeue)) => Outcome::Requeue,
            Ok(Ok(Action::RequeueAfter(d))) => Outcome::RequeueAfter(d),
            Ok(Err(e)) => Outcome::Failure { retry: e.retry, message: e.to_string(), panicked: false },
            Err(payload) => Outcome::Failure {
                retry: RetryPolicy::RateLimited,
                message: panics::message(&*payload),
                panicked: true,
            },
        }
    }

    /// A reconcile cancelled at its timeout, whatever it returned: a failure
    /// retried with the rate limiter (guarantees §7).
    pub(crate) fn timed_out(timeout: Duration) -> Self {
        let message = format!("TimeoutError: reconcile timed out after {} s", timeout.as_secs_f64());
        Outcome::Failure { retry: RetryPolicy::RateLimited, message, panicked: false }
    }
}
