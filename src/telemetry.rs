//! Logging set-up, and the metrics every server role exposes (`metrics.rs`).

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

mod metrics;
mod op_stats;

pub use metrics::{sample, sum, Family, Histogram, Kind, PromText, LATENCY_BUCKETS_S};
pub use op_stats::{OpStats, Started};

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
}
