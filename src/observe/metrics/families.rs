//! The collected metrics, and their Prometheus text exposition (format
//! 0.0.4).
//!
//! Every observed object adds its samples to one [`MetricFamilies`]; a
//! sample whose name and labels are already there is added to the existing
//! one (two controllers with the same name give one series with the sum),
//! so the exposition never repeats a series.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::histogram::HistogramSnapshot;

/// A metric's type, as `# TYPE` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Label names and values of one series, in the order given.
pub(crate) type Labels = Vec<(&'static str, String)>;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// A counter's or a gauge's value.
    Number(f64),
    Histogram(HistogramSnapshot),
}

#[derive(Debug)]
pub(crate) struct Family {
    pub(crate) help: &'static str,
    pub(crate) kind: Kind,
    pub(crate) series: BTreeMap<Labels, Value>,
}

/// Metric families by name, each with its series.
#[derive(Debug, Default)]
pub(crate) struct MetricFamilies {
    pub(crate) families: BTreeMap<&'static str, Family>,
}

impl MetricFamilies {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn series(
        &mut self,
        name: &'static str,
        help: &'static str,
        kind: Kind,
        labels: &[(&'static str, &str)],
    ) -> SeriesSlot<'_> {
        let family = self.families.entry(name).or_insert_with(|| Family { help, kind, series: BTreeMap::new() });
        debug_assert_eq!(family.kind, kind, "metric {name} registered with two types");
        let labels: Labels = labels.iter().map(|&(k, v)| (k, v.to_owned())).collect();
        SeriesSlot { series: &mut family.series, labels }
    }

    /// Adds `value` to the counter `name{labels}`.
    pub(crate) fn counter(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
        value: f64,
    ) {
        self.series(name, help, Kind::Counter, labels).add_number(value);
    }

    /// Adds `value` to the gauge `name{labels}` (same-named objects sum).
    pub(crate) fn gauge(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
        value: f64,
    ) {
        self.series(name, help, Kind::Gauge, labels).add_number(value);
    }

    /// Sets the gauge `name{labels}` to `value` or keeps a larger value
    /// already there (for maxima such as the longest running processor).
    pub(crate) fn gauge_max(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
        value: f64,
    ) {
        match self.series(name, help, Kind::Gauge, labels).get() {
            Value::Number(v) => *v = v.max(value),
            Value::Histogram(_) => debug_assert!(false, "a histogram series given a number"),
        }
    }

    /// Merges `value` into the histogram `name{labels}`.
    pub(crate) fn histogram(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &str)],
        value: HistogramSnapshot,
    ) {
        let slot = self.series(name, help, Kind::Histogram, labels);
        match slot.series.get_mut(&slot.labels) {
            Some(Value::Histogram(existing)) => existing.merge(&value),
            Some(Value::Number(_)) => debug_assert!(false, "{name} is a histogram"),
            None => {
                slot.series.insert(slot.labels, Value::Histogram(value));
            }
        }
    }

    /// The Prometheus text exposition (format 0.0.4), families sorted by
    /// name, series by labels.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::with_capacity(256 * self.families.len());
        for (name, family) in &self.families {
            let _ = writeln!(out, "# HELP {name} {}", escape_help(family.help));
            let _ = writeln!(out, "# TYPE {name} {}", family.kind.name());
            for (labels, value) in &family.series {
                match value {
                    Value::Number(v) => sample(&mut out, name, "", labels, None, *v),
                    Value::Histogram(h) => {
                        let mut cumulative = 0;
                        for (i, count) in h.counts.iter().enumerate() {
                            cumulative += count;
                            let le = h.bounds.get(i).copied().unwrap_or(f64::INFINITY);
                            sample(&mut out, name, "_bucket", labels, Some(le), cumulative as f64);
                        }
                        sample(&mut out, name, "_sum", labels, None, h.sum);
                        sample(&mut out, name, "_count", labels, None, cumulative as f64);
                    }
                }
            }
        }
        out
    }
}

struct SeriesSlot<'a> {
    series: &'a mut BTreeMap<Labels, Value>,
    labels: Labels,
}

impl<'a> SeriesSlot<'a> {
    fn get(self) -> &'a mut Value {
        self.series.entry(self.labels).or_insert(Value::Number(0.0))
    }

    fn add_number(self, value: f64) {
        match self.get() {
            Value::Number(v) => *v += value,
            Value::Histogram(_) => debug_assert!(false, "a histogram series given a number"),
        }
    }
}

/// One sample line: `name_suffix{labels,le="x"} value`.
fn sample(out: &mut String, name: &str, suffix: &str, labels: &Labels, le: Option<f64>, value: f64) {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() || le.is_some() {
        out.push('{');
        let mut first = true;
        for (label, v) in labels {
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(label);
            out.push_str("=\"");
            escape_label_value(out, v);
            out.push('"');
        }
        if let Some(le) = le {
            if !first {
                out.push(',');
            }
            out.push_str("le=\"");
            out.push_str(&go_float(le));
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(&go_float(value));
    out.push('\n');
}

/// Label values escape `\`, `"` and newlines.
fn escape_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// `# HELP` text escapes `\` and newlines.
fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A float as Prometheus' Go client writes it (`strconv.FormatFloat(f,
/// 'g', -1, 64)`): shortest round-trip digits, exponent form below 1e-4 and
/// from 1e6 up (`1e-08`, `1e+06`), `+Inf`/`-Inf`/`NaN`.
pub(crate) fn go_float(value: f64) -> String {
    if value.is_nan() {
        return "NaN".into();
    }
    if value.is_infinite() {
        return if value > 0.0 { "+Inf".into() } else { "-Inf".into() };
    }
    if value == 0.0 {
        return "0".into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "1.2345e-7".
    let sci = format!("{value:e}");
    let (mantissa, exponent) = sci.split_once('e').expect("{:e} has an exponent");
    let exponent: i32 = exponent.parse().expect("{:e} exponent is an integer");
    if (-4..6).contains(&exponent) {
        // Plain notation with the same digits (Display never uses an exponent).
        format!("{value}")
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_go_prints_them() {
        let cases = [
            (1e-8, "1e-08"),
            (9.999999999999999e-6, "9.999999999999999e-06"),
            (0.0001, "0.0001"),
            (0.005, "0.005"),
            (1.0, "1"),
            (10.0, "10"),
            (60.0, "60"),
            (123456.5, "123456.5"),
            (1e6, "1e+06"),
            (1234567.0, "1.234567e+06"),
            (-2.5, "-2.5"),
            (1e21, "1e+21"),
            (1.5e-300, "1.5e-300"),
            (f64::INFINITY, "+Inf"),
            (0.0, "0"),
        ];
        for (value, want) in cases {
            assert_eq!(go_float(value), want, "{value:?}");
            assert_eq!(go_float(value).replace("+Inf", "inf").parse::<f64>().unwrap(), value);
        }
    }

    #[test]
    fn same_series_are_summed_and_labels_escaped() {
        let mut m = MetricFamilies::new();
        m.counter("c_total", "A counter.\nSecond line \\", &[("name", "a\"b\\c\nd")], 2.0);
        m.counter("c_total", "A counter.\nSecond line \\", &[("name", "a\"b\\c\nd")], 3.0);
        m.gauge("g", "A gauge.", &[], 1.5);
        m.gauge_max("m", "A maximum.", &[], 2.0);
        m.gauge_max("m", "A maximum.", &[], 1.0);
        let text = m.encode();
        assert_eq!(
            text,
            "# HELP c_total A counter.\\nSecond line \\\\\n# TYPE c_total counter\nc_total{name=\"a\\\"b\\\\c\\nd\"} 5\n\
             # HELP g A gauge.\n# TYPE g gauge\ng 1.5\n# HELP m A maximum.\n# TYPE m gauge\nm 2\n"
        );
    }

    #[test]
    fn histograms_are_cumulative() {
        static BOUNDS: [f64; 2] = [0.1, 1.0];
        let mut m = MetricFamilies::new();
        let h = HistogramSnapshot { bounds: &BOUNDS, counts: vec![1, 0, 2], sum: 4.5 };
        m.histogram("h_seconds", "H.", &[("name", "q")], h.clone());
        m.histogram("h_seconds", "H.", &[("name", "q")], h);
        assert_eq!(
            m.encode(),
            "# HELP h_seconds H.\n# TYPE h_seconds histogram\n\
             h_seconds_bucket{name=\"q\",le=\"0.1\"} 2\n\
             h_seconds_bucket{name=\"q\",le=\"1\"} 2\n\
             h_seconds_bucket{name=\"q\",le=\"+Inf\"} 6\n\
             h_seconds_sum{name=\"q\"} 9\n\
             h_seconds_count{name=\"q\"} 6\n"
        );
    }
}
