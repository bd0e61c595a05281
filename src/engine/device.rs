//! The SIMULATED engine's device: prefills run one chunk at a time (SGLang's
//! `--chunked-prefill-size`), and at each chunk's end the device goes to the request waiting
//! with the highest priority, then the one that came first (a prefill in progress keeps the
//! device unless one that goes before it waits). Without `--enable-priority-scheduling`
//! every request has the same priority: first come, first served, chunk by chunk.

use parking_lot::Mutex;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;
use tokio::sync::oneshot;

/// A request's place in line: higher `priority` first, then lower `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Place {
    pub priority: i64,
    pub seq: Reverse<u64>,
}

struct Waiting {
    place: Place,
    tx: oneshot::Sender<()>,
}

impl PartialEq for Waiting {
    fn eq(&self, o: &Self) -> bool {
        self.place == o.place
    }
}
impl Eq for Waiting {}
impl PartialOrd for Waiting {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Waiting {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.place.cmp(&o.place)
    }
}

#[derive(Default)]
struct Line {
    busy: bool,
    waiting: BinaryHeap<Waiting>,
    next_seq: u64,
}

/// One device, shared by every prefill of the engine.
#[derive(Default)]
pub struct Device {
    line: Mutex<Line>,
}

/// The device held for one chunk; the next in line gets it when this drops.
pub struct Turn<'a>(&'a Device);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut line = self.0.line.lock();
        while let Some(w) = line.waiting.pop() {
            if w.tx.send(()).is_ok() {
                return;
            }
        }
        line.busy = false;
    }
}

impl Device {
    /// A place for a request of `priority` arriving now.
    pub fn place(&self, priority: i64) -> Place {
        let mut line = self.line.lock();
        line.next_seq += 1;
        Place {
            priority,
            seq: Reverse(line.next_seq),
        }
    }

    /// Waits for the device, in line at `place`.
    pub async fn turn(&self, place: Place) -> Turn<'_> {
        let rx = {
            let mut line = self.line.lock();
            if !line.busy {
                line.busy = true;
                return Turn(self);
            }
            let (tx, rx) = oneshot::channel();
            line.waiting.push(Waiting { place, tx });
            rx
        };
        // The sender goes only with a turn handed over (or the device dropped).
        let _ = rx.await;
        Turn(self)
    }

    /// Requests waiting for the device.
    pub fn waiting(&self) -> usize {
        self.line.lock().waiting.len()
    }

    /// The device time of one chunk of a prefill that computes `tokens` in `total`, chunks
    /// being `chunk_tokens` long (not positive: the whole prefill is one chunk, `ZERO`).
    pub fn chunk_time(total: Duration, tokens: usize, chunk_tokens: i64) -> Duration {
        match chunk_tokens {
            n if n > 0 => total.mul_f64((n as f64 / tokens.max(1) as f64).min(1.0)),
            _ => Duration::ZERO,
        }
    }

    /// Whether a request waiting now goes before `place`.
    fn outranked(&self, place: Place) -> bool {
        self.line
            .lock()
            .waiting
            .peek()
            .is_some_and(|w| w.place > place)
    }

    /// Runs a prefill of `total` device time in chunks of at most `chunk` (zero: at once),
    /// keeping the device between chunks unless a request that goes first is waiting.
    pub async fn prefill(&self, place: Place, total: Duration, chunk: Duration) {
        let mut left = total;
        let mut turn = self.turn(place).await;
        loop {
            let step = if chunk.is_zero() {
                left
            } else {
                left.min(chunk)
            };
            tokio::time::sleep(step).await;
            left -= step;
            if left.is_zero() {
                return;
            }
            if self.outranked(place) {
                drop(turn);
                turn = self.turn(place).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::time::Instant;

    #[tokio::test(start_paused = true)]
    async fn a_higher_priority_prefill_goes_at_the_next_chunk() {
        let d = Arc::new(Device::default());
        let t0 = Instant::now();
        let chunk = Duration::from_millis(10);
        // A long low-priority prefill (100 ms) starts first.
        let long = {
            let d = d.clone();
            let p = d.place(0);
            tokio::spawn(async move {
                d.prefill(p, Duration::from_millis(100), chunk).await;
                t0.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_millis(15)).await;
        // A high-priority one (20 ms) arrives mid-chunk: it waits only for that chunk's end.
        let p = d.place(10);
        d.prefill(p, Duration::from_millis(20), chunk).await;
        assert_eq!(t0.elapsed(), Duration::from_millis(40));
        assert_eq!(long.await.unwrap(), Duration::from_millis(120));
        // Equal priorities: first come, first served, chunk by chunk.
        let t1 = Instant::now();
        let first = {
            let d = d.clone();
            let p = d.place(0);
            tokio::spawn(async move {
                d.prefill(p, Duration::from_millis(30), chunk).await;
                t1.elapsed()
            })
        };
        tokio::task::yield_now().await;
        let p = d.place(0);
        d.prefill(p, Duration::from_millis(10), chunk).await;
        assert_eq!(
            t1.elapsed(),
            Duration::from_millis(40),
            "after the whole first one"
        );
        assert_eq!(first.await.unwrap(), Duration::from_millis(30));
        // Unchunked: the whole prefill at once.
        let t2 = Instant::now();
        d.prefill(d.place(0), Duration::from_millis(50), Duration::ZERO)
            .await;
        assert_eq!(t2.elapsed(), Duration::from_millis(50));
        assert_eq!(d.waiting(), 0);
    }

    #[test]
    fn a_chunk_is_its_share_of_the_prefill() {
        let total = Duration::from_millis(100);
        assert_eq!(
            Device::chunk_time(total, 1000, 250),
            Duration::from_millis(25)
        );
        assert_eq!(
            Device::chunk_time(total, 100, 250),
            total,
            "one chunk at most the whole"
        );
        assert_eq!(
            Device::chunk_time(total, 1000, -1),
            Duration::ZERO,
            "unchunked"
        );
    }
}
