//! A subscription to one source's events (an engine's, or the pool's), kept in step: a thread
//! reads its PUB socket, checks every message's sequence number, and hands the events on in
//! order. What it missed it asks the source's replay socket for:
//!
//! - the first message it hears (the source ran before it came, or the PUB dropped what was
//!   sent before the subscription took): replay from 0, so a router that starts late (or
//!   restarts) starts from what the source holds, not from nothing;
//! - a gap (the PUB dropped messages for a slow subscriber): replay from the first missed;
//! - any message after the connection dropped (the source may have restarted, its new run
//!   already past the old sequence): its blocks are forgotten, then replay from 0 of the run
//!   it is in.
//!
//! At the start it does not wait for a message: it asks the replay socket for everything at
//! once, so a router that starts (or restarts) next to idle engines knows what they hold, and
//! says how long that took (`SourceStats::sync_ms`).
//!
//! When a replay cannot fill a gap (no replay socket, no answer within [`REPLAY_WAIT`], or the
//! buffer no longer reaches back), the source's blocks are forgotten and it is marked out of
//! step: it will be right again as it stores new blocks, and a policy can fall back for it.

use super::event::{DecodeError, KvEvent, KvEventBatch};
use super::index::SourceId;
use super::wire::{seq_bytes, Message};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest wait for a replay's answer.
pub const REPLAY_WAIT: Duration = Duration::from_secs(2);
/// How often the thread looks at its stop flag while nothing comes.
const POLL: Duration = Duration::from_millis(50);
/// Largest message taken from a source: a larger one closes the connection (libzmq's
/// `ZMQ_MAXMSGSIZE`) before it is read whole. An engine's step publishes far less (a block's
/// event is tens of bytes and its tokens); a source that sends more is broken or hostile.
pub const MAX_MESSAGE_BYTES: i64 = 8 << 20;
/// Most bytes one replay may bring in all: past it the replay fails (the gap is lost).
pub const MAX_REPLAY_BYTES: usize = 256 << 20;
/// A source's undecodable batches are logged once per this, with how many there were.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What a subscription hands on: a source's event, or that everything it held is gone.
pub type Sink = Arc<dyn Fn(SourceId, &KvEvent) + Send + Sync>;

/// Where a source publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub id: SourceId,
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub topic: String,
}

/// A subscription's account, for metrics and for policies deciding whether to trust it.
#[derive(Debug, Default)]
pub struct SourceStats {
    pub batches: AtomicU64,
    pub events: AtomicU64,
    /// Gaps seen (messages missed, a source's restart, a late start).
    pub gaps: AtomicU64,
    /// Gaps a replay filled.
    pub replayed: AtomicU64,
    /// Gaps no replay could fill: the source's blocks were forgotten.
    pub lost: AtomicU64,
    /// The last sequence applied, plus one (0: none yet).
    pub next_seq: AtomicU64,
    /// Whether every message since the last loss was applied.
    pub in_step: AtomicBool,
    /// Milliseconds since the subscription started when the last message came (0: none).
    pub last_heard_ms: AtomicU64,
    /// How long the catch-up from the replay buffer at the start took, in milliseconds.
    pub sync_ms: AtomicU64,
    /// The catch-up at the start is over (caught up, or there was nothing to catch up from).
    pub synced: AtomicBool,
    /// The connection dropped and no message came since.
    pub disconnected: AtomicBool,
}

/// A running subscription; dropping it stops the thread (within [`POLL`] or a replay's wait).
pub struct Subscription {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub stats: Arc<SourceStats>,
    pub source: Source,
}

impl Subscription {
    /// Starts following `source` into `sink`, its sockets in `ctx` (one context, with its one
    /// I/O thread, serves every subscription of a process).
    pub fn start(
        ctx: &zmq::Context,
        source: Source,
        sink: Sink,
    ) -> Result<Subscription, zmq::Error> {
        let ctx = ctx.clone();
        let sub = ctx.socket(zmq::SUB)?;
        sub.set_maxmsgsize(MAX_MESSAGE_BYTES)?;
        sub.set_subscribe(source.topic.as_bytes())?;
        let _ = sub.set_linger(0);
        // Told when the connection drops: the source may come back as a new run.
        static MONITORS: AtomicU64 = AtomicU64::new(0);
        let monitor = format!(
            "inproc://kv-sub-monitor-{}",
            MONITORS.fetch_add(1, Ordering::Relaxed)
        );
        sub.monitor(&monitor, zmq::SocketEvent::DISCONNECTED.to_raw() as i32)?;
        let mon = ctx.socket(zmq::PAIR)?;
        mon.connect(&monitor)?;
        sub.connect(&source.endpoint)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(SourceStats::default());
        let mut run = Follower {
            ctx,
            sub,
            mon,
            dropped: false,
            source: source.clone(),
            sink,
            stats: stats.clone(),
            next: None,
            started: Instant::now(),
            undecodable: crate::transfer::server::LogBudget::new(WARN_EVERY),
        };
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("kv-sub-{}", source.id))
            .spawn(move || run.follow(&flag))
            .expect("a thread for a KV event subscription");
        Ok(Subscription {
            stop,
            thread: Some(thread),
            stats,
            source,
        })
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Follower {
    ctx: zmq::Context,
    sub: zmq::Socket,
    /// The SUB socket's monitor: says when its connection dropped.
    mon: zmq::Socket,
    /// The connection dropped since the last message.
    dropped: bool,
    source: Source,
    sink: Sink,
    stats: Arc<SourceStats>,
    /// The sequence expected next; `None` before the first message.
    next: Option<u64>,
    started: Instant,
    /// Batches that did not decode, logged at most once per [`WARN_EVERY`].
    undecodable: crate::transfer::server::LogBudget,
}

impl Follower {
    /// Catches up from the replay buffer at once, without waiting for a live message.
    fn initial_sync(&mut self) {
        let started = Instant::now();
        let got = match self.fetch_replay(0) {
            None => return,
            Some(Ok(g)) => g,
            Some(Err(e)) => {
                tracing::warn!(source = self.source.id, error = %e, "no KV event replay at the start: following live only");
                return;
            }
        };
        // Whole when the buffer reaches back to the source's first batch.
        let whole = got.first().is_none_or(|m| m.seq == 0)
            && got.windows(2).all(|w| w[1].seq == w[0].seq + 1);
        for m in &got {
            self.apply(m);
        }
        self.stats.in_step.store(whole, Ordering::Relaxed);
        let took = started.elapsed();
        self.stats
            .sync_ms
            .store(took.as_millis() as u64, Ordering::Relaxed);
        tracing::info!(source = self.source.id, endpoint = %self.source.endpoint, batches = got.len(),
            whole, took_ms = took.as_millis() as u64, "KV events caught up from the replay buffer");
    }

    fn follow(&mut self, stop: &AtomicBool) {
        self.initial_sync();
        self.stats.synced.store(true, Ordering::Release);
        while !stop.load(Ordering::Relaxed) {
            let mut items = [
                self.sub.as_poll_item(zmq::POLLIN),
                self.mon.as_poll_item(zmq::POLLIN),
            ];
            if !zmq::poll(&mut items, POLL.as_millis() as i64).is_ok_and(|n| n > 0) {
                continue;
            }
            let (message, monitor) = (items[0].is_readable(), items[1].is_readable());
            // Only disconnections are monitored: the next message may be a new run's.
            if monitor && self.mon.recv_multipart(zmq::DONTWAIT).is_ok() {
                self.dropped = true;
                self.stats.disconnected.store(true, Ordering::Relaxed);
            }
            if !message {
                continue;
            }
            let Ok(frames) = self.sub.recv_multipart(zmq::DONTWAIT) else {
                continue;
            };
            let Ok(Some(m)) = Message::from_frames(&frames) else {
                tracing::debug!(
                    source = self.source.id,
                    frames = frames.len(),
                    "not a KV event message"
                );
                continue;
            };
            self.stats
                .last_heard_ms
                .store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
            self.stats.disconnected.store(false, Ordering::Relaxed);
            self.take(m);
        }
    }

    /// One live message, with whatever must be replayed before it. A batch that starts by
    /// clearing every block (a source's flush, the pool master's snapshot) carries the whole
    /// state from there on: what was missed before it does not matter, and the source is in
    /// step once it is applied.
    fn take(&mut self, m: Message) {
        let batch = KvEventBatch::decode(&m.payload);
        let resets =
            matches!(&batch, Ok(b) if matches!(b.events.first(), Some(KvEvent::AllBlocksCleared)));
        let from = match self.next {
            // After a dropped connection the source may be a new run whose sequence passed
            // the old one: start over from its beginning.
            Some(_) if std::mem::take(&mut self.dropped) => {
                self.stats.gaps.fetch_add(1, Ordering::Relaxed);
                self.forget();
                0
            }
            Some(next) if m.seq == next => {
                if resets {
                    self.stats.in_step.store(true, Ordering::Relaxed);
                }
                return self.apply_decoded(m.seq, batch);
            }
            // A gap: messages were dropped on the way.
            Some(next) if m.seq > next => next,
            // Already applied (from the replay at the start): a source that restarts drops
            // the connection first, which is seen above.
            Some(_) => return,
            // The first message: what the source published before it is replayed too.
            None => 0,
        };
        let whole = m.seq == from || resets || {
            self.stats.gaps.fetch_add(1, Ordering::Relaxed);
            let filled = self.replay(from, m.seq);
            if filled {
                self.stats.replayed.fetch_add(1, Ordering::Relaxed);
            } else {
                self.stats.lost.fetch_add(1, Ordering::Relaxed);
                self.forget();
            }
            filled
        };
        // Followed from the source's first message, or from a reset: in step (until a gap is
        // lost).
        if (from == 0 || resets) && whole {
            self.stats.in_step.store(true, Ordering::Relaxed);
        }
        self.apply_decoded(m.seq, batch);
    }

    fn apply(&mut self, m: &Message) {
        self.apply_decoded(m.seq, KvEventBatch::decode(&m.payload));
    }

    fn apply_decoded(&mut self, seq: u64, batch: Result<KvEventBatch, DecodeError>) {
        match batch {
            Ok(batch) => {
                for e in &batch.events {
                    (self.sink)(self.source.id, e);
                }
                self.stats.batches.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .events
                    .fetch_add(batch.events.len() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                if let Some(count) = self.undecodable.spend(Instant::now()) {
                    tracing::warn!(source = self.source.id, endpoint = %self.source.endpoint, seq,
                        error = %e, count, "KV event batches that do not decode (count: since the last such line)");
                }
            }
        }
        self.next = Some(seq + 1);
        self.stats.next_seq.store(seq + 1, Ordering::Relaxed);
    }

    /// Forgets everything the source held; it is out of step until it has been heard whole.
    fn forget(&mut self) {
        (self.sink)(self.source.id, &KvEvent::AllBlocksCleared);
        self.stats.in_step.store(false, Ordering::Relaxed);
        self.next = None;
    }

    /// Asks the replay socket for `from..until` and applies it; false when it could not.
    /// Every buffered message from `from` on, as the replay socket answers.
    fn fetch_replay(&self, from: u64) -> Option<Result<Vec<Message>, String>> {
        let endpoint = self.source.replay_endpoint.clone()?;
        Some((|| -> Result<Vec<Message>, String> {
            let dealer = self.ctx.socket(zmq::DEALER).map_err(|e| e.to_string())?;
            let _ = dealer.set_linger(0);
            dealer
                .set_maxmsgsize(MAX_MESSAGE_BYTES)
                .map_err(|e| e.to_string())?;
            dealer.connect(&endpoint).map_err(|e| e.to_string())?;
            dealer
                .send_multipart([&b""[..], &seq_bytes(from)], 0)
                .map_err(|e| e.to_string())?;
            let deadline = Instant::now() + REPLAY_WAIT;
            let (mut got, mut bytes) = (Vec::new(), 0usize);
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero()
                    || !dealer
                        .poll(zmq::POLLIN, left.as_millis() as i64)
                        .is_ok_and(|n| n > 0)
                {
                    return Err(format!("no end of replay within {REPLAY_WAIT:?}"));
                }
                let frames = dealer.recv_multipart(0).map_err(|e| e.to_string())?;
                bytes += frames.iter().map(Vec::len).sum::<usize>();
                if bytes > MAX_REPLAY_BYTES {
                    return Err(format!("a replay of more than {MAX_REPLAY_BYTES} bytes"));
                }
                match Message::from_frames(frames.get(1..).unwrap_or(&[])) {
                    Ok(Some(m)) => got.push(m),
                    Ok(None) => return Ok(got),
                    Err(e) => return Err(e.to_string()),
                }
            }
        })())
    }

    /// Replays `from..until` and applies it; false when it could not.
    fn replay(&mut self, from: u64, until: u64) -> bool {
        let got = match self.fetch_replay(from) {
            None => return false,
            Some(Ok(g)) => g,
            Some(Err(e)) => {
                tracing::warn!(source = self.source.id, error = %e, "KV event replay failed");
                return false;
            }
        };
        // The buffer must reach back to `from`, and the replay must be whole up to `until`.
        let wanted: Vec<&Message> = got
            .iter()
            .filter(|m| m.seq >= from && m.seq < until)
            .collect();
        let whole = wanted.len() as u64 == until - from
            && wanted.iter().zip(from..).all(|(m, s)| m.seq == s);
        if !whole {
            tracing::warn!(
                source = self.source.id,
                from,
                until,
                got = wanted.len(),
                "the replay buffer does not reach back over the gap"
            );
            return false;
        }
        for m in wanted {
            self.apply(m);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_events::index::Index;
    use crate::kv_events::{BlockStored, KvEventsConfig, Medium, Publisher};
    use parking_lot::Mutex;

    fn stored(hash: i64) -> KvEventBatch {
        KvEventBatch {
            ts: 0.0,
            events: vec![KvEvent::BlockStored(BlockStored::new(
                vec![hash],
                None,
                vec![],
                4,
                Medium::Gpu,
            ))],
            attn_dp_rank: Some(0),
        }
    }

    fn publisher(port: u16, replay: u16) -> Publisher {
        let cfg = KvEventsConfig::parse(&format!(
            r#"{{"publisher":"zmq","endpoint":"tcp://127.0.0.1:{port}","bind":true,
                 "replay_endpoint":"tcp://127.0.0.1:{replay}"}}"#
        ))
        .unwrap();
        Publisher::start(&cfg).unwrap()
    }

    fn port_of(endpoint: &str) -> u16 {
        endpoint.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// Waits (bounded) until `f` holds, publishing `probe` meanwhile so that a subscription
    /// that has not taken yet hears something.
    fn until_probing(
        p: &Publisher,
        mut probe: impl FnMut() -> KvEventBatch,
        f: impl Fn() -> bool,
    ) -> bool {
        for _ in 0..400 {
            if f() {
                return true;
            }
            p.publish(probe());
            std::thread::sleep(Duration::from_millis(25));
        }
        f()
    }

    /// `until_probing` with blocks stored as the probe, their hashes from `probes + 1` on.
    fn until(p: &Publisher, probes: i64, f: impl Fn() -> bool) -> bool {
        let mut n = probes;
        until_probing(
            p,
            || {
                n += 1;
                stored(n)
            },
            f,
        )
    }

    /// A subscriber that comes late catches up from the replay buffer at once, then follows
    /// live; a source that restarts is forgotten and followed anew; the index ends as the
    /// source is.
    #[test]
    fn a_late_subscriber_and_a_restarted_source_are_caught_up_by_replay() {
        let index = Arc::new(Mutex::new(Index::with_budget(1 << 20)));
        let p = publisher(0, 0);
        for h in 1..=5 {
            p.publish(stored(h));
        }
        // Sent, to nobody (a PUB drops what no subscriber is there for): only replay has them.
        let sent = crate::testkit::wait_until(Duration::from_secs(2), || {
            p.stats.batches.load(Ordering::Relaxed) == 5
        });
        assert!(sent, "the publisher did not send");
        let sink_index = index.clone();
        let sink: Sink = Arc::new(move |s, e| sink_index.lock().apply(s, e));
        let source = Source {
            id: 3,
            endpoint: p.endpoint.clone(),
            replay_endpoint: p.replay_endpoint.clone(),
            topic: String::new(),
        };
        let sub = Subscription::start(&zmq::Context::new(), source, sink).unwrap();
        // Caught up from the replay buffer at once: nothing new needs to be published.
        let synced = crate::testkit::wait_until(Duration::from_secs(2), || {
            sub.stats.batches.load(Ordering::Relaxed) == 5
        });
        assert!(
            synced,
            "the subscription did not catch up from the replay buffer"
        );
        for h in 1..=5 {
            assert!(
                !index.lock().tiers_of(3, h).is_empty(),
                "block {h} replayed"
            );
        }
        assert!(sub.stats.in_step.load(Ordering::Relaxed));
        let caught_up = until(&p, 100, || sub.stats.batches.load(Ordering::Relaxed) >= 6);
        assert!(caught_up, "the subscriber never heard the source live");
        assert_eq!(sub.stats.lost.load(Ordering::Relaxed), 0);
        // The source restarts on the same ports, holding other blocks now.
        let (port, replay) = (
            port_of(&p.endpoint),
            port_of(p.replay_endpoint.as_deref().unwrap()),
        );
        drop(p);
        let p = publisher(port, replay);
        p.publish(KvEventBatch {
            ts: 0.0,
            events: vec![KvEvent::AllBlocksCleared],
            attn_dp_rank: Some(0),
        });
        p.publish(stored(42));
        let resynced = until(&p, 1000, || !index.lock().tiers_of(3, 42).is_empty());
        assert!(resynced, "the restarted source was not followed");
        assert!(
            index.lock().tiers_of(3, 1).is_empty(),
            "the old run's blocks are gone"
        );
        assert!(sub.stats.gaps.load(Ordering::Relaxed) >= 2);
    }

    /// Without a replay buffer a late subscriber has lost what came before and is out of
    /// step; a batch that starts by clearing every block (a snapshot) brings it in step.
    #[test]
    fn a_batch_that_clears_everything_brings_a_late_subscriber_in_step() {
        let index = Arc::new(Mutex::new(Index::with_budget(1 << 20)));
        let cfg = KvEventsConfig::parse(
            r#"{"publisher":"zmq","endpoint":"tcp://127.0.0.1:0","bind":true}"#,
        )
        .unwrap();
        let p = Publisher::start(&cfg).unwrap();
        p.publish(stored(1));
        let sent = crate::testkit::wait_until(Duration::from_secs(2), || {
            p.stats.batches.load(Ordering::Relaxed) == 1
        });
        assert!(sent, "the publisher did not send");
        let sink_index = index.clone();
        let sink: Sink = Arc::new(move |s, e| sink_index.lock().apply(s, e));
        let source = Source {
            id: 4,
            endpoint: p.endpoint.clone(),
            replay_endpoint: None,
            topic: String::new(),
        };
        let sub = Subscription::start(&zmq::Context::new(), source, sink).unwrap();
        let heard = until(&p, 100, || sub.stats.lost.load(Ordering::Relaxed) >= 1);
        assert!(heard, "the late subscriber never heard the source");
        assert!(
            !sub.stats.in_step.load(Ordering::Relaxed),
            "batch 0 was missed"
        );
        let snapshot = || KvEventBatch {
            ts: 0.0,
            events: vec![
                KvEvent::AllBlocksCleared,
                KvEvent::BlockStored(BlockStored::new(vec![1], None, vec![], 4, Medium::Gpu)),
            ],
            attn_dp_rank: Some(0),
        };
        let in_step = until_probing(&p, snapshot, || sub.stats.in_step.load(Ordering::Relaxed));
        assert!(in_step, "the snapshot did not bring the subscriber in step");
        assert!(
            !index.lock().tiers_of(4, 1).is_empty(),
            "the snapshot's block"
        );
    }
}
