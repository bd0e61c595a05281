//! The closed-loop load every bench drives: `threads` threads, each with state of its own (a
//! connection, a buffer), call an operation back to back until the phase's budget of calls or
//! its time is spent, timing each call. One runner, so that every bench counts calls, errors
//! and elapsed time the same way.

use std::time::{Duration, Instant};

/// What one call came to.
#[derive(Debug)]
pub enum Outcome {
    /// Done: its latency counts.
    Ok,
    /// Not done, and not a failure either (a read of a value the pool had evicted: it may, it
    /// is a cache). Counted apart; no latency.
    Skipped,
    /// Failed, with why (the first reason is kept).
    Failed(String),
}

/// A phase's calls, from every thread.
#[derive(Debug, Default)]
pub struct Run {
    /// Latencies of the calls that succeeded, in no particular order.
    pub latencies: Vec<Duration>,
    pub errors: u64,
    pub skipped: u64,
    pub first_error: Option<String>,
    /// From the first thread's start to the last one's end.
    pub elapsed: Duration,
}

impl Run {
    fn add(&mut self, part: Run) {
        self.latencies.extend(part.latencies);
        self.errors += part.errors;
        self.skipped += part.skipped;
        if self.first_error.is_none() {
            self.first_error = part.first_error;
        }
    }
}

/// Runs `threads` threads, each making its state with `setup(thread)` (a thread whose setup
/// fails counts one error and does nothing) and then calling `op(state, thread, i)` for
/// `i` in `0..budget / threads` (rounded up) until `time` has passed since the start, or until
/// `op` answers `None` (that thread has nothing more to do).
pub fn closed_loop<S>(
    threads: usize,
    budget: u64,
    time: Duration,
    setup: impl Fn(usize) -> Result<S, String> + Sync,
    op: impl Fn(&mut S, usize, u64) -> Option<Outcome> + Sync,
) -> Run {
    let threads = threads.max(1);
    let per_thread = budget.div_ceil(threads as u64);
    let t0 = Instant::now();
    let parts: Vec<Run> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (setup, op) = (&setup, &op);
                s.spawn(move || {
                    let mut part = Run {
                        latencies: Vec::with_capacity(per_thread.min(1 << 20) as usize),
                        ..Run::default()
                    };
                    let mut state = match setup(t) {
                        Ok(state) => state,
                        Err(e) => {
                            part.errors += 1;
                            part.first_error = Some(e);
                            return part;
                        }
                    };
                    for i in 0..per_thread {
                        if t0.elapsed() > time {
                            break;
                        }
                        let start = Instant::now();
                        match op(&mut state, t, i) {
                            Some(Outcome::Ok) => part.latencies.push(start.elapsed()),
                            Some(Outcome::Skipped) => part.skipped += 1,
                            Some(Outcome::Failed(e)) => {
                                part.errors += 1;
                                part.first_error.get_or_insert(e);
                            }
                            None => break,
                        }
                    }
                    part
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| Run {
                    errors: 1,
                    first_error: Some("a load thread panicked".into()),
                    ..Run::default()
                })
            })
            .collect()
    });
    let mut run = Run::default();
    for part in parts {
        run.add(part);
    }
    run.elapsed = t0.elapsed();
    run
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn the_budget_is_shared_by_the_threads_and_every_outcome_counted() {
        let calls = AtomicU64::new(0);
        let run = closed_loop(4, 100, Duration::from_secs(60), Ok, |state, t, i| {
            assert_eq!(*state, t);
            calls.fetch_add(1, Ordering::Relaxed);
            Some(match i % 5 {
                0 => Outcome::Skipped,
                1 => Outcome::Failed(format!("call {i}")),
                _ => Outcome::Ok,
            })
        });
        assert_eq!(calls.load(Ordering::Relaxed), 100);
        assert_eq!((run.latencies.len(), run.skipped, run.errors), (60, 20, 20));
        assert_eq!(run.first_error.as_deref(), Some("call 1"));
    }

    #[test]
    fn a_thread_stops_when_told_or_when_its_setup_fails() {
        let run = closed_loop(
            3,
            30,
            Duration::from_secs(60),
            |t| {
                if t == 2 {
                    Err("no connection".into())
                } else {
                    Ok(())
                }
            },
            |_, t, i| (t == 0 || i < 4).then_some(Outcome::Ok),
        );
        // Thread 0 does its 10, thread 1 stops after 4, thread 2 never starts.
        assert_eq!(run.latencies.len(), 14);
        assert_eq!(run.errors, 1);
        assert_eq!(run.first_error.as_deref(), Some("no connection"));
    }

    #[test]
    fn time_ends_a_phase_whatever_its_budget() {
        let run = closed_loop(
            2,
            u64::MAX / 2,
            Duration::from_millis(30),
            |_| Ok(()),
            |_, _, _| {
                std::thread::sleep(Duration::from_millis(1));
                Some(Outcome::Ok)
            },
        );
        assert!(run.elapsed >= Duration::from_millis(30));
        assert!(run.elapsed < Duration::from_secs(30), "{:?}", run.elapsed);
        assert!(!run.latencies.is_empty());
    }
}
