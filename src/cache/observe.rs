//! A cache's stats, its entry in the global status and its metrics.

use std::sync::atomic::Ordering::Relaxed;

use super::{CacheStats, Inner};
use crate::observe::Observed;
use crate::observe::fields::Health;
use crate::observe::metrics::MetricFamilies;
use crate::observe::status::{CacheDetails, EntryKind, RunState, StatusEntry};
use crate::source::Source;

impl<S: Source> Inner<S> {
    pub(super) fn stats(&self) -> CacheStats<S::Position> {
        let (keys, position) = {
            let state = self.state.read();
            (state.contents.len(), state.position.clone())
        };
        let c = &self.counters;
        let (last_error, last_error_time) = c.last_error.lock().clone().unzip();
        CacheStats {
            name: self.name.clone(),
            synced: *self.synced.lock(),
            keys,
            position,
            relists: c.relists.load(Relaxed),
            resumed: c.resumed.load(Relaxed),
            events: c.puts.load(Relaxed) + c.deletes.load(Relaxed) + c.bookmarks.load(Relaxed),
            errors: c.errors.load(Relaxed),
            last_error,
            last_error_time,
        }
    }

    fn run_state(&self) -> RunState {
        let life = self.life.lock();
        match (&life.thread, life.stopped) {
            (_, true) => RunState::Stopped,
            (Some(_), false) => RunState::Running,
            (None, false) => RunState::NotStarted,
        }
    }
}

impl<S: Source> Observed for Inner<S> {
    fn collect_status(&self, out: &mut Vec<StatusEntry>) {
        let stats = self.stats();
        let kind = EntryKind::Cache(CacheDetails {
            state: self.run_state(),
            synced: stats.synced,
            keys: stats.keys,
            position: stats.position.map(|p| format!("{p:?}")),
            relists: stats.relists,
        });
        let health = Health {
            successes: stats.events,
            failures: stats.errors,
            consecutive_failures: self.counters.consecutive_failures.load(Relaxed),
            last_error: stats.last_error,
            last_error_time: stats.last_error_time,
            last_success_time: None,
        };
        out.push(StatusEntry::new(stats.name, kind, health));
    }

    fn collect_metrics(&self, out: &mut MetricFamilies) {
        let name = self.name.as_str();
        let c = &self.counters;
        for (kind, count) in [("put", &c.puts), ("delete", &c.deletes), ("bookmark", &c.bookmarks)] {
            out.counter(
                "reconq_cache_events_total",
                "Stream events the cache 'cache' applied, by kind.",
                &[("cache", name), ("kind", kind)],
                count.load(Relaxed) as f64,
            );
        }
        let counters = [
            (
                "reconq_cache_relists_total",
                "Lists after the first (the position expired, or no positions).",
                &c.relists,
            ),
            ("reconq_cache_errors_total", "Failures of the cache's source (each logged as a warning).", &c.errors),
        ];
        for (metric, help, count) in counters {
            out.counter(metric, help, &[("cache", name)], count.load(Relaxed) as f64);
        }
        let synced = f64::from(u8::from(*self.synced.lock()));
        out.gauge("reconq_cache_synced", "1 once the cache applied its first list.", &[("cache", name)], synced);
        let keys = self.state.read().contents.len() as f64;
        out.gauge("reconq_cache_keys", "Keys the cache holds.", &[("cache", name)], keys);
    }
}
