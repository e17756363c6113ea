//! What leader election and sharding share: checking their settings, the
//! default identity, and the timing rules that keep them safe.

use std::time::Duration;

use crate::error::InvalidArgument;
use crate::etcd::check_endpoint;

/// The etcd minimum lease.
pub(super) const MIN_TTL: Duration = Duration::from_secs(2);
/// The default lease TTL.
pub(super) const DEFAULT_TTL: Duration = Duration::from_secs(5);
/// The first wait before retrying after etcd failed.
pub(super) const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between retries while etcd is unreachable.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// etcd endpoints: one `http://host:port`, or a list of them (a slice, an
/// array or a `Vec` of strings), as leader election and sharding take them.
pub trait Endpoints {
    /// The endpoints, unchecked.
    fn endpoints(&self) -> Vec<&str>;
}

impl Endpoints for str {
    fn endpoints(&self) -> Vec<&str> {
        vec![self]
    }
}

impl Endpoints for String {
    fn endpoints(&self) -> Vec<&str> {
        vec![self]
    }
}

impl<S: AsRef<str>> Endpoints for [S] {
    fn endpoints(&self) -> Vec<&str> {
        self.iter().map(AsRef::as_ref).collect()
    }
}

impl<S: AsRef<str>, const N: usize> Endpoints for [S; N] {
    fn endpoints(&self) -> Vec<&str> {
        self.iter().map(AsRef::as_ref).collect()
    }
}

impl<S: AsRef<str>> Endpoints for Vec<S> {
    fn endpoints(&self) -> Vec<&str> {
        self.iter().map(AsRef::as_ref).collect()
    }
}

impl<E: Endpoints + ?Sized> Endpoints for &E {
    fn endpoints(&self) -> Vec<&str> {
        (**self).endpoints()
    }
}

/// Checks `endpoints`: `http://host:port`, at least one.
pub(crate) fn check_endpoints(
    endpoints: &(impl Endpoints + ?Sized),
    what: &str,
) -> Result<Vec<String>, InvalidArgument> {
    let endpoints = endpoints
        .endpoints()
        .into_iter()
        .map(check_endpoint)
        .collect::<Result<Vec<_>, _>>()
        .map_err(InvalidArgument::new)?;
    if endpoints.is_empty() {
        return Err(InvalidArgument::new(format!("{what} needs at least one etcd endpoint")));
    }
    Ok(endpoints)
}

/// Checks `endpoints` (`http://host:port`, at least one) and `name`.
pub(super) fn check_endpoints_and_name(
    endpoints: &(impl Endpoints + ?Sized),
    name: &str,
    what: &str,
) -> Result<Vec<String>, InvalidArgument> {
    let endpoints = check_endpoints(endpoints, what)?;
    if name.is_empty() || name.contains('\0') || name.contains('/') {
        return Err(InvalidArgument::new(format!("{what} name must be non-empty, without '/' or NUL")));
    }
    Ok(endpoints)
}

/// Checks a lease TTL against etcd's minimum.
pub(super) fn check_ttl(ttl: Duration) -> Result<Duration, InvalidArgument> {
    if ttl < MIN_TTL {
        return Err(InvalidArgument::new(format!("ttl must be at least 2 s (etcd's minimum lease), got {ttl:?}")));
    }
    Ok(ttl)
}

/// This process's default name among replicas: host name and process id.
pub(super) fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}-{}", host.trim(), std::process::id())
}

/// How long after its last successful renewal was *sent* a holder stops
/// acting on its lease: two thirds of the TTL, so at least a third of the
/// lease (0.67 s at the minimum TTL) separates it from the server expiring
/// the lease and someone else taking over.
pub(super) fn renew_deadline(ttl: Duration) -> Duration {
    ttl * 2 / 3
}

/// The next wait after a failure: doubled, at most [`MAX_BACKOFF`].
pub(super) fn next_backoff(backoff: Duration) -> Duration {
    (backoff * 2).min(MAX_BACKOFF)
}
