//! Observability: every live queue, controller and manager registers here so
//! metrics exposition and the global status can find it without the user
//! passing objects around (as Cilium's global controller manager and
//! client-go's global metrics provider do).

pub(crate) mod fields;
pub(crate) mod metrics;
pub(crate) mod probes;
mod registry;
pub(crate) mod reports;
pub mod status;
mod status_json;

#[cfg(feature = "python")]
pub(crate) use registry::after_fork_in_child;
pub(crate) use registry::{Observed, Registration, register, visit};
