//! Prometheus metrics on one library, TiKV's `prometheus` crate: its histograms count with
//! atomics (no lock on the request path; measured with callgrind: 75 instructions an
//! observation, where `prometheus-client` takes a write lock each time; the binary ports'
//! per-operation figures are sharded per thread instead, `super::op_stats`), and its text
//! encoder writes every role's exposition. Counters and gauges that change under a role's own lock or
//! are read from its state at scrape time are handed to [`PromText`] as values.

use prometheus::core::Collector;
use prometheus::proto::{self, MetricFamily, MetricType};
use std::collections::HashMap;
use std::time::Duration;

/// The value of the first sample of metric `name` in Prometheus text, if any.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The sum of every sample of metric `name` in Prometheus text, whatever their labels (0 when
/// there is none).
pub fn sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// What a family's samples are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn proto(self) -> MetricType {
        match self {
            Kind::Counter => MetricType::COUNTER,
            Kind::Gauge => MetricType::GAUGE,
            Kind::Histogram => MetricType::HISTOGRAM,
        }
    }
}

fn labels(pairs: &[(&str, &str)]) -> Vec<proto::LabelPair> {
    pairs
        .iter()
        .map(|(k, v)| {
            let mut l = proto::LabelPair::default();
            l.set_name((*k).to_owned());
            l.set_value((*v).to_owned());
            l
        })
        .collect()
}

/// A metric family as `/metrics` shows it: its name, kind and help. Each is declared once, a
/// `const` beside the code that writes its samples, and [`PromText`] writes samples only by
/// such a declaration, so a name, its kind and its help cannot drift apart between places.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family<'a> {
    pub name: &'a str,
    pub kind: Kind,
    pub help: &'a str,
}

impl<'a> Family<'a> {
    /// A counter: a count that only grows while the process lives.
    pub const fn counter(name: &'a str, help: &'a str) -> Family<'a> {
        Family {
            name,
            kind: Kind::Counter,
            help,
        }
    }

    /// A gauge: a value as it is now.
    pub const fn gauge(name: &'a str, help: &'a str) -> Family<'a> {
        Family {
            name,
            kind: Kind::Gauge,
            help,
        }
    }

    /// A histogram: counts of observations by bucket, their sum and count.
    pub const fn histogram(name: &'a str, help: &'a str) -> Family<'a> {
        Family {
            name,
            kind: Kind::Histogram,
            help,
        }
    }
}

/// A Prometheus text exposition, built family by family and written by the library's encoder.
/// A family written again gathers the samples that follow into the one family.
#[derive(Default)]
pub struct PromText {
    families: Vec<MetricFamily>,
    by_name: HashMap<String, usize>,
}

impl PromText {
    /// An empty exposition.
    pub fn new() -> PromText {
        PromText::default()
    }

    /// Places family `f` here (a family is listed where it first comes, even before its
    /// samples).
    pub fn family(&mut self, f: &Family) -> &mut Self {
        self.family_index(f);
        self
    }

    fn family_index(&mut self, f: &Family) -> usize {
        if let Some(&i) = self.by_name.get(f.name) {
            debug_assert_eq!(
                self.families[i].get_field_type(),
                f.kind.proto(),
                "{} written as two kinds",
                f.name
            );
            return i;
        }
        let mut m = MetricFamily::default();
        m.set_name(f.name.to_owned());
        m.set_help(f.help.to_owned());
        m.set_field_type(f.kind.proto());
        self.families.push(m);
        self.by_name
            .insert(f.name.to_owned(), self.families.len() - 1);
        self.families.len() - 1
    }

    /// A sample of counter or gauge family `f`.
    pub fn sample(&mut self, f: &Family, labels_: &[(&str, &str)], value: f64) -> &mut Self {
        let i = self.family_index(f);
        let mut m = proto::Metric::from_label(labels(labels_));
        match f.kind {
            Kind::Counter => {
                let mut c = proto::Counter::default();
                c.set_value(value);
                m.set_counter(c);
            }
            Kind::Gauge | Kind::Histogram => {
                debug_assert_eq!(f.kind, Kind::Gauge, "{}: a histogram's sample", f.name);
                let mut g = proto::Gauge::default();
                g.set_value(value);
                m.set_gauge(g);
            }
        }
        self.families[i].mut_metric().push(m);
        self
    }

    /// Unlabelled counters named `<prefix>_<suffix>` (a family each, generic over the role
    /// that shows them), read from their atomics: `(suffix, help, counter)` rows.
    pub fn counters(
        &mut self,
        prefix: &str,
        rows: &[(&str, &str, &std::sync::atomic::AtomicU64)],
    ) -> &mut Self {
        for (suffix, help, counter) in rows {
            let name = format!("{prefix}_{suffix}");
            let value = counter.load(std::sync::atomic::Ordering::Relaxed) as f64;
            self.single(&Family::counter(&name, help), value);
        }
        self
    }

    /// The one unlabelled sample of family `f`.
    pub fn single(&mut self, f: &Family, value: f64) -> &mut Self {
        self.sample(f, &[], value)
    }

    /// The one unlabelled sample of family `f`, read from its atomic.
    pub fn atomic(&mut self, f: &Family, value: &std::sync::atomic::AtomicU64) -> &mut Self {
        self.single(f, value.load(std::sync::atomic::Ordering::Relaxed) as f64)
    }

    /// Histogram `h` as a sample of family `f` with `labels_`.
    pub fn histogram(&mut self, f: &Family, labels_: &[(&str, &str)], h: &Histogram) -> &mut Self {
        self.histogram_counts(f, labels_, h.snapshot())
    }

    /// A histogram from its counts (`Histogram`s, and figures kept elsewhere).
    pub(super) fn histogram_counts(
        &mut self,
        f: &Family,
        labels_: &[(&str, &str)],
        counts: proto::Histogram,
    ) -> &mut Self {
        let i = self.family_index(f);
        let mut m = proto::Metric::from_label(labels(labels_));
        m.set_histogram(counts);
        self.families[i].mut_metric().push(m);
        self
    }

    /// The exposition text. Families with no sample are left out.
    pub fn finish(self) -> String {
        let families: Vec<MetricFamily> = self
            .families
            .into_iter()
            .filter(|f| !f.get_metric().is_empty())
            .collect();
        prometheus::TextEncoder::new()
            .encode_to_string(&families)
            .unwrap_or_else(|e| format!("# metrics could not be written: {e}\n"))
    }
}

/// Upper bounds, in seconds, of the buckets of [`Histogram::latency`]: SGLang's for request
/// latencies (1 ms to 400 s), so that dashboards built for SGLang read ours.
pub const LATENCY_BUCKETS_S: [f64; 27] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0, 80.0, 100.0, 200.0, 400.0,
];

/// A histogram of durations (the library's, lock-free); its name and labels are given when
/// it is written.
#[derive(Clone)]
pub struct Histogram(prometheus::Histogram);

impl Default for Histogram {
    fn default() -> Self {
        Histogram::latency()
    }
}

impl Histogram {
    /// Over [`LATENCY_BUCKETS_S`].
    pub fn latency() -> Histogram {
        Histogram::with_buckets(&LATENCY_BUCKETS_S)
    }

    /// Over these upper bounds in seconds; bounds that are not increasing or finite are
    /// left out (none left: the library's default buckets).
    pub fn with_buckets(bounds: &[f64]) -> Histogram {
        let mut kept: Vec<f64> = Vec::with_capacity(bounds.len());
        for &b in bounds {
            if b.is_finite() && kept.last().is_none_or(|&last| b > last) {
                kept.push(b);
            }
        }
        if kept.is_empty() {
            kept = prometheus::DEFAULT_BUCKETS.to_vec();
        }
        let opts = prometheus::HistogramOpts::new("histogram", "histogram").buckets(kept);
        Histogram(prometheus::Histogram::with_opts(opts).expect("a valid name and buckets"))
    }

    /// Observes a duration.
    pub fn observe(&self, d: Duration) {
        self.0.observe(d.as_secs_f64());
    }

    /// Durations observed.
    pub fn count(&self) -> u64 {
        self.0.get_sample_count()
    }

    fn snapshot(&self) -> proto::Histogram {
        self.0
            .collect()
            .first()
            .and_then(|f| f.get_metric().first())
            .map(|m| m.get_histogram().clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::OpStats;

    #[test]
    fn a_family_sums_over_its_labels_and_nothing_else() {
        let text = "# TYPE r_total counter\n\
                    r_total{model=\"a\",streaming=\"true\"} 3\n\
                    r_total{model=\"b\"} 4.5\n\
                    r_total_other 100\n\
                    r_totally{x=\"y\"} 100\n";
        assert_eq!(sum(text, "r_total"), 7.5);
        assert_eq!(sum("r_total 2\n", "r_total"), 2.0);
        assert_eq!(sum(text, "absent"), 0.0);
    }

    #[test]
    fn a_histogram_counts_cumulatively_with_its_labels() {
        let h = Histogram::default();
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_millis(30));
        h.observe(Duration::from_secs(1000));
        let mut p = PromText::new();
        p.histogram(
            &Family::histogram("x_seconds", "help"),
            &[("model_name", "m")],
            &h,
        );
        let text = p.finish();
        for line in [
            "# TYPE x_seconds histogram\n",
            "x_seconds_bucket{model_name=\"m\",le=\"0.001\"} 0\n",
            "x_seconds_bucket{model_name=\"m\",le=\"0.005\"} 1\n",
            "x_seconds_bucket{model_name=\"m\",le=\"0.04\"} 2\n",
            "x_seconds_bucket{model_name=\"m\",le=\"400\"} 2\n",
            "x_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 3\n",
            "x_seconds_count{model_name=\"m\"} 3\n",
        ] {
            assert!(text.contains(line), "{line:?} in\n{text}");
        }
        let sum = sample(&text, "x_seconds_sum{model_name=\"m\"}").unwrap();
        assert!((sum - 1000.033).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn exposition_format() {
        let stats = OpStats::default();
        stats.record(1, true, Duration::from_micros(30));
        stats.record(1, false, Duration::from_micros(3000));
        stats.record(2, true, Duration::from_micros(1));
        let mut p = PromText::new();
        const LABELLED: Family = Family::gauge("labelled", "A gauge \"quoted\".");
        p.single(&Family::counter("x_total", "An x."), 3.0);
        p.family(&Family::counter("empty_total", "Nothing yet."));
        p.family(&LABELLED);
        p.sample(&LABELLED, &[("name", "a\"b\\c\nd")], 1.5);
        stats.render(&mut p, "rbgctl_test", |op| (op == 1).then_some("ping"));
        let text = p.finish();
        assert!(
            text.contains("# HELP x_total An x.\n# TYPE x_total counter\nx_total 3\n"),
            "{text}"
        );
        assert!(
            !text.contains("empty_total"),
            "a family with no sample is left out"
        );
        assert!(
            text.contains("labelled{name=\"a\\\"b\\\\c\\nd\"} 1.5\n"),
            "{text}"
        );
        assert!(text.contains("rbgctl_test_requests_total{op=\"ping\"} 2\n"));
        assert!(text.contains("rbgctl_test_failures_total{op=\"ping\"} 1\n"));
        assert!(text.contains(
            "rbgctl_test_request_duration_seconds_bucket{op=\"ping\",le=\"0.00005\"} 1\n"
        ));
        assert!(text
            .contains("rbgctl_test_request_duration_seconds_bucket{op=\"ping\",le=\"+Inf\"} 2\n"));
        assert_eq!(
            text.matches("# TYPE rbgctl_test_request_duration_seconds histogram")
                .count(),
            1
        );
        assert!(
            !text.contains("op=\"\""),
            "an operation with no name is left out"
        );
    }

    #[test]
    fn buckets_that_do_not_increase_are_left_out() {
        let h = Histogram::with_buckets(&[0.5, 0.1, 1.0, f64::NAN, 2.0]);
        h.observe(Duration::from_millis(700));
        let mut p = PromText::new();
        p.histogram(&Family::histogram("h", ""), &[], &h);
        let text = p.finish();
        assert!(text.contains("h_bucket{le=\"0.5\"} 0\n"), "{text}");
        assert!(text.contains("h_bucket{le=\"1\"} 1\n"), "{text}");
        assert!(!text.contains("le=\"0.1\""), "{text}");
    }
}
