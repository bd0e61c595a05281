//! Logging set-up and the Prometheus text format shared by every server role.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line of text per event; colours only when stderr is a terminal and `NO_COLOR` is
    /// not set.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields`, `span`, `spans`), for log
    /// collectors.
    Json,
}

impl LogFormat {
    /// The value of `--log-format` that selects this format.
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// The format this process logs in (text until [`init_tracing`] chose one): roles it starts
/// log the same way.
pub fn log_format() -> LogFormat {
    FILE_LOG
        .get()
        .map_or(LogFormat::Text, |(format, _)| *format)
}

/// The logging flags every role takes.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogArgs {
    /// Log lines as `text` or `json` (one object per line). Default: text.
    #[arg(
        long,
        value_enum,
        env = "RBGCTL_LOG_FORMAT",
        default_value_t,
        global = true
    )]
    pub log_format: LogFormat,
    /// Log level (trace, debug, info, warn, error) or a filter such as
    /// `info,rbgctl::router=debug`. `RBGCTL_LOG` overrides it; without either, `RUST_LOG`.
    /// Default: info.
    #[arg(long, global = true)]
    pub log_level: Option<String>,
}

impl LogArgs {
    /// The filter in force, from this process's environment.
    fn filter(&self) -> Result<tracing_subscriber::EnvFilter, String> {
        let env = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        self.filter_from(env("RBGCTL_LOG"), env("RUST_LOG"))
    }

    /// The filter in force: `RBGCTL_LOG`, else `--log-level`, else `RUST_LOG`, else `info`.
    fn filter_from(
        &self,
        rbgctl_log: Option<String>,
        rust_log: Option<String>,
    ) -> Result<tracing_subscriber::EnvFilter, String> {
        let (source, text) = match (rbgctl_log, &self.log_level, rust_log) {
            (Some(v), _, _) => ("RBGCTL_LOG", v),
            (None, Some(v), _) => ("--log-level", v.clone()),
            (None, None, Some(v)) => ("RUST_LOG", v),
            (None, None, None) => ("default", "info".to_string()),
        };
        // A bare word is a level; a typo (`inf`, `verbose`) would otherwise become a filter
        // for a target of that name, and silence every line.
        const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
        let word = text.trim();
        if !word.contains(['=', ',', '[', ':'])
            && !LEVELS.contains(&word.to_ascii_lowercase().as_str())
        {
            return Err(format!(
                "{source} {text:?} is not a log level ({}) or a filter such as \
                 info,rbgctl::router=debug",
                LEVELS.join(", ")
            ));
        }
        tracing_subscriber::EnvFilter::try_new(&text).map_err(|e| {
            format!(
                "{source} {text:?} is not a log level or filter \
                 (info, debug, warn,rbgctl=debug, ...): {e}"
            )
        })
    }
}

/// A layer over the registry, boxed so that text and JSON share one type.
type BoxedLayer = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;

/// The format chosen at start-up and the slot for the log files of [`log_to_dir`].
static FILE_LOG: std::sync::OnceLock<(
    LogFormat,
    tracing_subscriber::reload::Handle<Option<BoxedLayer>, tracing_subscriber::Registry>,
)> = std::sync::OnceLock::new();

/// Logs to stderr in the chosen format, filtered as [`LogArgs::filter`] says. A second call
/// in one process leaves the first set-up in place.
pub fn init_tracing(args: &LogArgs) -> Result<(), String> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = args.filter()?;
    // Colours only on a terminal, and not when NO_COLOR is set: log files and pipes (a role
    // started by `up` or the launcher) get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let (files, handle) = tracing_subscriber::reload::Layer::new(None::<BoxedLayer>);
    let stderr = match args.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .with_target(false)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_target(false)
            .boxed(),
    };
    let ok = tracing_subscriber::registry()
        .with(files)
        .with(stderr)
        .with(filter)
        .try_init()
        .is_ok();
    if ok {
        let _ = FILE_LOG.set((args.log_format, handle));
    }
    Ok(())
}

/// Also writes the log, in the stderr log's format without colours, to daily files
/// `<dir>/<prefix>.YYYY-MM-DD` (as sglang-router's `--log-dir`). The folder is created; an error names it.
pub fn log_to_dir(dir: &std::path::Path, prefix: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| std::io::Error::new(e.kind(), format!("log dir {}: {e}", dir.display())))?;
    let appender = tracing_appender::rolling::Builder::new()
        .rotation(tracing_appender::rolling::Rotation::DAILY)
        .filename_prefix(prefix)
        .build(dir)
        .map_err(|e| std::io::Error::other(format!("log dir {}: {e}", dir.display())))?;
    let Some((format, handle)) = FILE_LOG.get() else {
        return Err(std::io::Error::other(
            "log dir: logging was not set up by this process",
        ));
    };
    let layer: BoxedLayer = match format {
        LogFormat::Text => Box::new(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_target(false)
                .with_writer(appender),
        ),
        LogFormat::Json => Box::new(
            tracing_subscriber::fmt::layer()
                .json()
                .with_target(false)
                .with_writer(appender),
        ),
    };
    handle
        .reload(Some(layer))
        .map_err(|e| std::io::Error::other(format!("log dir: {e}")))
}

/// The value of the first sample of metric `name` in Prometheus text, if any.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Builds a Prometheus text exposition.
#[derive(Default)]
pub struct PromText {
    out: String,
}

impl PromText {
    pub fn new() -> PromText {
        PromText::default()
    }

    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
        self
    }

    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let escaped = v
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                let _ = write!(self.out, "{k}=\"{escaped}\"");
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
        self
    }

    /// A single unlabelled gauge or counter.
    pub fn single(&mut self, name: &str, kind: &str, help: &str, value: f64) -> &mut Self {
        self.family(name, kind, help).sample(name, &[], value)
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// Upper bounds, in seconds, of the buckets of [`Histogram`]: SGLang's for request latencies
/// (1 ms to 400 s), so that dashboards built for SGLang read ours.
pub const LATENCY_BUCKETS_S: [f64; 27] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0, 80.0, 100.0, 200.0, 400.0,
];

/// A Prometheus histogram of durations over [`LATENCY_BUCKETS_S`], lock-free.
pub struct Histogram {
    counts: [AtomicU64; LATENCY_BUCKETS_S.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(b) = LATENCY_BUCKETS_S.iter().position(|&ub| s <= ub) {
            self.counts[b].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Writes the family `name` (buckets, sum, count) with `labels` on every sample.
    pub fn render(&self, p: &mut PromText, name: &str, help: &str, labels: &[(&str, &str)]) {
        p.family(name, "histogram", help);
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0;
        for (ub, n) in LATENCY_BUCKETS_S.iter().zip(&self.counts) {
            cumulative += n.load(Ordering::Relaxed);
            let le = ub.to_string();
            let mut l = labels.to_vec();
            l.push(("le", &le));
            p.sample(&bucket, &l, cumulative as f64);
        }
        let count = self.count.load(Ordering::Relaxed) as f64;
        let mut l = labels.to_vec();
        l.push(("le", "+Inf"));
        p.sample(&bucket, &l, count);
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        p.sample(&format!("{name}_sum"), labels, sum);
        p.sample(&format!("{name}_count"), labels, count);
    }
}

/// Upper bounds of the latency histogram buckets, in microseconds.
const BUCKETS_US: [u64; 12] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 10_000, 50_000, 250_000, 1_000_000,
];

/// Request counters and latency histograms per operation code (indexed by the opcode byte).
pub struct OpStats {
    requests: Vec<AtomicU64>,
    failures: Vec<AtomicU64>,
    latency_sum_us: Vec<AtomicU64>,
    buckets: Vec<[AtomicU64; BUCKETS_US.len()]>,
}

impl Default for OpStats {
    fn default() -> Self {
        OpStats {
            requests: (0..256).map(|_| AtomicU64::new(0)).collect(),
            failures: (0..256).map(|_| AtomicU64::new(0)).collect(),
            latency_sum_us: (0..256).map(|_| AtomicU64::new(0)).collect(),
            buckets: (0..256)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
        }
    }
}

impl OpStats {
    pub fn record(&self, opcode: u8, ok: bool, elapsed: Duration) {
        let i = opcode as usize;
        self.requests[i].fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.failures[i].fetch_add(1, Ordering::Relaxed);
        }
        let us = elapsed.as_micros() as u64;
        self.latency_sum_us[i].fetch_add(us, Ordering::Relaxed);
        if let Some(b) = BUCKETS_US.iter().position(|&ub| us <= ub) {
            self.buckets[i][b].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Runs one request's handler (`Ok(true)`: it succeeded) and records it under `opcode`.
    pub fn timed<E>(&self, opcode: u8, handle: impl FnOnce() -> Result<bool, E>) -> Result<(), E> {
        let t0 = std::time::Instant::now();
        let result = handle();
        self.record(opcode, matches!(result, Ok(true)), t0.elapsed());
        result.map(|_| ())
    }

    pub fn requests(&self, opcode: u8) -> u64 {
        self.requests[opcode as usize].load(Ordering::Relaxed)
    }

    /// Writes `<prefix>_requests_total`, `<prefix>_failures_total` and
    /// `<prefix>_request_duration_seconds` for every operation seen.
    pub fn render(
        &self,
        prom: &mut PromText,
        prefix: &str,
        name_of: impl Fn(u8) -> Option<&'static str>,
    ) {
        let seen: Vec<(u8, &'static str)> = (0..=255u8)
            .filter(|&op| self.requests(op) > 0)
            .filter_map(|op| name_of(op).map(|n| (op, n)))
            .collect();
        let req = format!("{prefix}_requests_total");
        prom.family(&req, "counter", "Requests handled, by operation.");
        for (op, name) in &seen {
            prom.sample(&req, &[("op", name)], self.requests(*op) as f64);
        }
        let fail = format!("{prefix}_failures_total");
        prom.family(
            &fail,
            "counter",
            "Requests answered with an error, by operation.",
        );
        for (op, name) in &seen {
            prom.sample(
                &fail,
                &[("op", name)],
                self.failures[*op as usize].load(Ordering::Relaxed) as f64,
            );
        }
        let hist = format!("{prefix}_request_duration_seconds");
        prom.family(
            &hist,
            "histogram",
            "Time to handle a request, by operation.",
        );
        let bucket = format!("{hist}_bucket");
        for (op, name) in &seen {
            let i = *op as usize;
            let mut cumulative = 0u64;
            for (b, ub) in BUCKETS_US.iter().enumerate() {
                cumulative += self.buckets[i][b].load(Ordering::Relaxed);
                let le = format!("{}", *ub as f64 / 1e6);
                prom.sample(&bucket, &[("op", name), ("le", &le)], cumulative as f64);
            }
            let total = self.requests(*op);
            prom.sample(&bucket, &[("op", name), ("le", "+Inf")], total as f64);
            prom.sample(
                &format!("{hist}_sum"),
                &[("op", name)],
                self.latency_sum_us[i].load(Ordering::Relaxed) as f64 / 1e6,
            );
            prom.sample(&format!("{hist}_count"), &[("op", name)], total as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_filter_comes_from_rbgctl_log_then_the_flag_then_rust_log() {
        let args = |level: Option<&str>| LogArgs {
            log_level: level.map(String::from),
            ..LogArgs::default()
        };
        let f = |a: &LogArgs, ours: Option<&str>, rust: Option<&str>| {
            a.filter_from(ours.map(String::from), rust.map(String::from))
                .map(|f| f.to_string())
        };
        assert_eq!(f(&args(None), None, None).unwrap(), "info");
        assert_eq!(f(&args(None), None, Some("warn")).unwrap(), "warn");
        assert_eq!(
            f(&args(Some("debug")), None, Some("warn")).unwrap(),
            "debug"
        );
        assert_eq!(
            f(&args(Some("debug")), Some("error"), Some("warn")).unwrap(),
            "error"
        );
        let e = f(&args(None), None, Some("info,=[")).unwrap_err();
        assert!(e.starts_with("RUST_LOG \"info,=[\""), "{e}");
        let e = f(&args(Some("loud")), None, None).unwrap_err();
        assert!(
            e.starts_with("--log-level \"loud\" is not a log level (trace,"),
            "{e}"
        );
        assert_eq!(f(&args(Some("WARN")), None, None).unwrap(), "warn");
        assert!(f(&args(Some("rbgctl::router=debug")), None, None).is_ok());
    }

    #[test]
    fn a_histogram_counts_cumulatively_with_its_labels() {
        let h = Histogram::default();
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_millis(30));
        h.observe(Duration::from_secs(1000));
        let mut p = PromText::new();
        h.render(&mut p, "x_seconds", "help", &[("model_name", "m")]);
        let text = p.finish();
        assert!(
            text.contains("x_seconds_bucket{model_name=\"m\",le=\"0.001\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_bucket{model_name=\"m\",le=\"0.005\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_bucket{model_name=\"m\",le=\"0.04\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_bucket{model_name=\"m\",le=\"400\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_count{model_name=\"m\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_sum{model_name=\"m\"} 1000.033\n"),
            "{text}"
        );
    }

    #[test]
    fn exposition_format() {
        let stats = OpStats::default();
        stats.record(1, true, Duration::from_micros(30));
        stats.record(1, false, Duration::from_micros(3000));
        let mut p = PromText::new();
        p.single("x_total", "counter", "An x.", 3.0);
        stats.render(&mut p, "rbgctl_test", |op| (op == 1).then_some("ping"));
        let text = p.finish();
        assert!(text.contains("# TYPE x_total counter\nx_total 3\n"));
        assert!(text.contains("rbgctl_test_requests_total{op=\"ping\"} 2"));
        assert!(text.contains("rbgctl_test_failures_total{op=\"ping\"} 1"));
        assert!(text
            .contains("rbgctl_test_request_duration_seconds_bucket{op=\"ping\",le=\"0.00005\"} 1"));
        assert!(
            text.contains("rbgctl_test_request_duration_seconds_bucket{op=\"ping\",le=\"+Inf\"} 2")
        );
    }
}
