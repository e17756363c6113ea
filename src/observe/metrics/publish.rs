//! Mirroring reconq's metrics into the `metrics` facade crate, for programs
//! that run their own recorder and exporter.
//!
//! Counters are set with `absolute`, gauges with `set`. The facade has no
//! way to hand over a whole histogram, so each publish records, per bucket,
//! the observations added since the last publish, every one at the bucket's
//! upper bound (the `+Inf` bucket just above the largest bound): a recorder
//! with the same buckets reproduces the counts exactly, while its sums and
//! quantiles are approximations built from bucket bounds.

use std::collections::{BTreeMap, BTreeSet};

use parking_lot::Mutex;

use super::families::{Kind, Labels, MetricFamilies, Value};

/// Bucket counts already recorded, per histogram series.
type Published = BTreeMap<(&'static str, Labels), Vec<u64>>;

static PUBLISHED: Mutex<Published> = Mutex::new(BTreeMap::new());

pub(crate) fn publish(families: &MetricFamilies) {
    // One publish at a time, so two threads cannot both record the same
    // histogram delta.
    let mut published = PUBLISHED.lock();
    let mut seen = BTreeSet::new();
    for (&name, family) in &families.families {
        // Described every time: the recorder may have changed since.
        match family.kind {
            Kind::Counter => metrics::describe_counter!(name, family.help),
            Kind::Gauge => metrics::describe_gauge!(name, family.help),
            Kind::Histogram => metrics::describe_histogram!(name, metrics::Unit::Seconds, family.help),
        }
        for (labels, value) in &family.series {
            let facade_labels: Vec<metrics::Label> =
                labels.iter().map(|(k, v)| metrics::Label::new(*k, v.clone())).collect();
            match (family.kind, value) {
                (Kind::Counter, Value::Number(v)) => metrics::counter!(name, facade_labels).absolute(*v as u64),
                (Kind::Gauge, Value::Number(v)) => metrics::gauge!(name, facade_labels).set(*v),
                (Kind::Histogram, Value::Histogram(h)) => {
                    let key = (name, labels.clone());
                    let before = published.entry(key.clone()).or_insert_with(|| vec![0; h.counts.len()]);
                    let histogram = metrics::histogram!(name, facade_labels);
                    for (i, (&now, was)) in h.counts.iter().zip(before.iter_mut()).enumerate() {
                        // A series whose contributors went away can shrink:
                        // take the new count as the base, record nothing.
                        if now > *was {
                            let at = match h.bounds.get(i) {
                                Some(&bound) => bound,
                                None => h.bounds.last().map_or(f64::MAX, |b| b.next_up()),
                            };
                            histogram.record_many(at, (now - *was) as usize);
                        }
                        *was = now;
                    }
                    seen.insert(key);
                }
                _ => debug_assert!(false, "{name}: value does not match its kind"),
            }
        }
    }
    // Forget series that are gone, so churn cannot grow this map.
    published.retain(|key, _| seen.contains(key));
}
