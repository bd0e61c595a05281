//! Progress of a long benchmark: a bar with an ETA on a terminal, and otherwise a plain line
//! every few seconds (`multiturn: 120/400 (30 %), 12 s elapsed, about 28 s left`), so that a
//! run in CI or under `nohup` shows it is alive.

use indicatif::{ProgressBar, ProgressStyle};
use parking_lot::Mutex;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a plain progress line is printed.
const LINE_EVERY: Duration = Duration::from_secs(5);

/// One long job's progress: a bar on a terminal, else a line every few seconds.
pub struct Progress {
    label: String,
    bar: Option<ProgressBar>,
    total: AtomicU64,
    done: AtomicU64,
    start: Instant,
    last_line: Mutex<Instant>,
    quiet: bool,
}

impl Progress {
    /// Progress over `total` steps; `quiet` (e.g. with `--json`) prints nothing.
    pub fn new(label: &str, total: u64, quiet: bool) -> Progress {
        let terminal = std::io::stderr().is_terminal();
        let bar = (terminal && !quiet).then(|| {
            let bar = ProgressBar::new(total);
            let template = format!(
                "{label}: {{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}}, ETA {{eta}} {{msg}}"
            );
            bar.set_style(
                ProgressStyle::with_template(&template)
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar
        });
        Progress {
            label: label.to_string(),
            bar,
            total: AtomicU64::new(total),
            done: AtomicU64::new(0),
            start: Instant::now(),
            last_line: Mutex::new(Instant::now()),
            quiet,
        }
    }

    /// `n` more done: the bar moves, or (no terminal) a line at most every few seconds.
    pub fn inc(&self, n: u64) {
        let done = self.done.fetch_add(n, Ordering::Relaxed) + n;
        match &self.bar {
            Some(bar) => bar.inc(n),
            None if !self.quiet => {
                let mut last = self.last_line.lock();
                if last.elapsed() >= LINE_EVERY {
                    *last = Instant::now();
                    eprintln!("{}", self.line(done));
                }
            }
            None => {}
        }
    }

    /// How many there are to do, once known.
    pub fn set_total(&self, total: u64) {
        self.total.store(total, Ordering::Relaxed);
        if let Some(bar) = &self.bar {
            bar.set_length(total);
        }
    }

    /// What the bar says beside it.
    pub fn set_message(&self, msg: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(msg.to_string());
        }
    }

    /// Clears the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }

    /// The plain line: steps done, share, time so far and an estimate of the rest.
    fn line(&self, done: u64) -> String {
        let total = self.total.load(Ordering::Relaxed).max(1);
        let elapsed = self.start.elapsed().as_secs_f64();
        let left = if done > 0 {
            format!(
                ", about {:.0} s left",
                elapsed / done as f64 * total.saturating_sub(done) as f64
            )
        } else {
            String::new()
        };
        format!(
            "{}: {done}/{total} ({:.0} %), {elapsed:.0} s elapsed{left}",
            self.label,
            done as f64 * 100.0 / total as f64
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_line_says_how_far_and_how_long_is_left() {
        let p = Progress::new("multiturn", 400, true);
        let line = p.line(100);
        assert!(line.starts_with("multiturn: 100/400 (25 %), "), "{line}");
        assert!(
            line.contains("s elapsed") && line.contains("s left"),
            "{line}"
        );
    }
}
