//! Prometheus metrics with client-go's and controller-runtime's names: the
//! model and text exposition (`families`), histograms counted in clock ticks
//! (`histogram`, `ticks`), the `metrics`-facade bridge (`publish`) and the
//! scrape endpoint (`http`, its connections in `connections`). Queues and
//! controllers record into their own state (the queue under its existing
//! lock); nothing here runs until a scrape visits the registry.

mod connections;
mod families;
pub(crate) mod histogram;
mod http;
mod publish;
pub(crate) mod ticks;

use std::io;
use std::net::ToSocketAddrs;

pub(crate) use families::MetricFamilies;
pub use http::MetricsServer;

/// Every live named queue's and controller's current metrics.
fn collect() -> MetricFamilies {
    let mut out = MetricFamilies::new();
    super::visit(|object| object.collect_metrics(&mut out));
    out
}

pub(crate) fn render() -> String {
    collect().encode()
}

pub(crate) fn publish() {
    publish::publish(&collect());
}

pub(crate) fn serve(addr: impl ToSocketAddrs) -> io::Result<MetricsServer> {
    http::serve(addr)
}
