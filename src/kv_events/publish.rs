//! The ZMQ publisher, as SGLang's `ZmqEventPublisher`: a thread owns a PUB socket (and, with a
//! replay endpoint, a ROUTER socket); batches are queued to it (bounded: past
//! `max_queue_size` a batch is dropped and counted, never blocking the engine), numbered from
//! 0, sent as `[topic, sequence, payload]`, and the last `buffer_steps` of them kept to answer
//! replay requests. libzmq (through the `zmq` crate) is the same library SGLang's pyzmq and
//! vLLM use, so the wire is theirs.

use super::config::KvEventsConfig;
use super::event::KvEventBatch;
use super::wire::{replay_start, seq_bytes, END_SEQ};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the publisher has done, for `/metrics`.
#[derive(Debug, Default)]
pub struct PublisherStats {
    pub batches: AtomicU64,
    pub events: AtomicU64,
    /// Batches dropped because the queue was full.
    pub dropped: AtomicU64,
    pub replay_requests: AtomicU64,
    /// Replay requests turned away: as many replays as allowed were under way.
    pub replays_refused: AtomicU64,
    /// Replays given up: their requester stopped reading (or went away) before the end.
    pub replays_abandoned: AtomicU64,
}

impl PublisherStats {
    /// The counters as `<prefix>_kv_event_batches_total` and the like.
    pub fn render(&self, prefix: &str, p: &mut crate::telemetry::PromText) {
        p.counters(
            prefix,
            &[
                (
                    "kv_event_batches_total",
                    "KV event batches published.",
                    &self.batches,
                ),
                ("kv_events_total", "KV events published.", &self.events),
                (
                    "kv_event_batches_dropped_total",
                    "KV event batches dropped: the publisher's queue was full.",
                    &self.dropped,
                ),
                (
                    "kv_event_replay_requests_total",
                    "Replay requests answered.",
                    &self.replay_requests,
                ),
                (
                    "kv_event_replays_refused_total",
                    "Replay requests turned away: the most replays at once were under way.",
                    &self.replays_refused,
                ),
                (
                    "kv_event_replays_abandoned_total",
                    "Replays given up: the requester stopped reading or went away.",
                    &self.replays_abandoned,
                ),
            ],
        );
    }
}

/// Why the KV-event publisher could not open or bind its sockets.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("KV events: cannot {what} {endpoint}: {source}")]
    Socket {
        what: &'static str,
        endpoint: String,
        source: zmq::Error,
    },
}

/// A running publisher; dropping it sends what is queued and stops the thread.
pub struct Publisher {
    queue: Option<std::sync::mpsc::SyncSender<KvEventBatch>>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub stats: Arc<PublisherStats>,
    /// The PUB endpoint as bound (its port resolved) or connected.
    pub endpoint: String,
    /// The replay endpoint as bound.
    pub replay_endpoint: Option<String>,
}

/// libzmq takes `*` for "any free port"; port 0 is read the same way here.
fn ephemeral(endpoint: &str) -> String {
    match endpoint.strip_suffix(":0") {
        Some(head) if endpoint.starts_with("tcp://") => format!("{head}:*"),
        _ => endpoint.to_string(),
    }
}

fn socket_error(what: &'static str, endpoint: &str) -> impl FnOnce(zmq::Error) -> PublishError {
    let endpoint = endpoint.to_string();
    move |source| PublishError::Socket {
        what,
        endpoint,
        source,
    }
}

impl Publisher {
    /// Opens the sockets and starts the thread.
    pub fn start(cfg: &KvEventsConfig) -> Result<Publisher, PublishError> {
        let ctx = zmq::Context::new();
        let pub_socket = ctx
            .socket(zmq::PUB)
            .map_err(socket_error("open a PUB socket for", &cfg.endpoint))?;
        pub_socket
            .set_sndhwm(cfg.hwm)
            .map_err(socket_error("set the high-water mark of", &cfg.endpoint))?;
        let _ = pub_socket.set_linger(0);
        let endpoint = ephemeral(&cfg.endpoint);
        let endpoint = if cfg.binds() {
            pub_socket
                .bind(&endpoint)
                .map_err(socket_error("bind", &cfg.endpoint))?;
            last_endpoint(&pub_socket).unwrap_or(endpoint)
        } else {
            pub_socket
                .connect(&endpoint)
                .map_err(socket_error("connect to", &cfg.endpoint))?;
            endpoint
        };
        let (replay, replay_endpoint) = match &cfg.replay_endpoint {
            None => (None, None),
            Some(r) => {
                let s = ctx
                    .socket(zmq::ROUTER)
                    .map_err(socket_error("open a ROUTER socket for", r))?;
                bound_replay_socket(&s).map_err(socket_error("bound the ROUTER socket of", r))?;
                let e = ephemeral(r);
                s.bind(&e).map_err(socket_error("bind", r))?;
                let bound = last_endpoint(&s).unwrap_or(e);
                (Some(s), Some(bound))
            }
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(cfg.max_queue_size);
        let stats = Arc::new(PublisherStats::default());
        let mut run = Run {
            pub_socket,
            replay,
            topic: cfg.topic.as_bytes().to_vec(),
            buffer: VecDeque::with_capacity(cfg.buffer_steps.min(1024)),
            buffer_steps: cfg.buffer_steps,
            replays: Vec::new(),
            next_seq: 0,
            stats: stats.clone(),
            _ctx: ctx,
        };
        let thread = std::thread::Builder::new()
            .name("kv-events".into())
            .spawn(move || run.serve(rx))
            .expect("a thread for the KV event publisher");
        tracing::info!(%endpoint, replay = ?replay_endpoint, topic = %cfg.topic, "publishing KV events");
        Ok(Publisher {
            queue: Some(tx),
            thread: Some(thread),
            stats,
            endpoint,
            replay_endpoint,
        })
    }

    /// Queues a batch; a full queue drops it (counted), as a slow subscriber would miss it.
    pub fn publish(&self, batch: KvEventBatch) {
        let Some(q) = &self.queue else { return };
        if q.try_send(batch).is_err() {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Messages queued to one requester of a replay at most: a requester that does not read holds
/// no more than this of the publisher's memory (the rest of its replay waits in its cursor).
pub const REPLAY_HWM: i32 = 16;
/// Replays under way at once. A request beyond takes the place of one whose requester has
/// not read for [`REPLAY_YIELD`], else it is turned away (counted), and its requester times
/// out and finds the gap lost, as when the batches have left the buffer.
pub const MAX_REPLAYS: usize = 16;
/// A replay blocked this long (its requester not reading) gives its place to a new request.
pub const REPLAY_YIELD: Duration = Duration::from_secs(1);
/// A replay that makes no progress for this long is given up.
pub const REPLAY_STALL: Duration = Duration::from_secs(5);
/// Largest replay request taken: a start sequence, 8 bytes, and its frames.
const REPLAY_REQUEST_BYTES: i64 = 256;

/// What a replay socket facing anyone may cost: a few messages queued per requester, sends
/// that say when a requester's queue is full (instead of queueing past it or dropping
/// silently), requests no larger than a request, and requesters that stop answering
/// heartbeats (a full TCP window does that) disconnected, their queues freed.
fn bound_replay_socket(s: &zmq::Socket) -> Result<(), zmq::Error> {
    let _ = s.set_linger(0);
    s.set_sndhwm(REPLAY_HWM)?;
    s.set_rcvhwm(REPLAY_HWM)?;
    s.set_router_mandatory(true)?;
    s.set_maxmsgsize(REPLAY_REQUEST_BYTES)?;
    s.set_heartbeat_ivl(1_000)?;
    s.set_heartbeat_timeout(5_000)?;
    s.set_heartbeat_ttl(10_000)?;
    Ok(())
}

/// A replay under way: who asked, the next sequence to send, and when it last moved.
struct Replay {
    identity: Vec<u8>,
    next: u64,
    /// The end marker is all that is left.
    ended: bool,
    /// When it last sent something (or began).
    moved: std::time::Instant,
    /// Its requester's queue was full at the last try.
    blocked: bool,
}

fn last_endpoint(s: &zmq::Socket) -> Option<String> {
    s.get_last_endpoint().ok()?.ok()
}

/// The publisher thread's state.
struct Run {
    pub_socket: zmq::Socket,
    replay: Option<zmq::Socket>,
    topic: Vec<u8>,
    buffer: VecDeque<(u64, Vec<u8>)>,
    buffer_steps: usize,
    /// Replays under way (at most [`MAX_REPLAYS`]).
    replays: Vec<Replay>,
    next_seq: u64,
    stats: Arc<PublisherStats>,
    // Dropped last: the sockets first.
    _ctx: zmq::Context,
}

/// How long the thread waits for a batch before it looks at the replay socket again.
const REPLAY_POLL: Duration = Duration::from_millis(20);

/// While replays are under way, how often their requesters' queues are looked at again.
const REPLAY_STEP: Duration = Duration::from_millis(1);

impl Run {
    fn serve(&mut self, rx: std::sync::mpsc::Receiver<KvEventBatch>) {
        loop {
            self.take_replay_requests();
            self.advance_replays();
            let wait = if self.replays.is_empty() {
                REPLAY_POLL
            } else {
                REPLAY_STEP
            };
            match rx.recv_timeout(wait) {
                Ok(batch) => self.send(&batch),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
    }

    fn send(&mut self, batch: &KvEventBatch) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let payload = batch.encode();
        let frames: [&[u8]; 3] = [&self.topic, &seq_bytes(seq), &payload];
        if let Err(e) = self.pub_socket.send_multipart(frames, 0) {
            tracing::warn!(error = %e, seq, "cannot publish a KV event batch");
        }
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats
            .events
            .fetch_add(batch.events.len() as u64, Ordering::Relaxed);
        if self.buffer.len() == self.buffer_steps {
            self.buffer.pop_front();
        }
        self.buffer.push_back((seq, payload));
    }

    /// Takes every waiting replay request, `[identity, "", start]`: each becomes a replay of
    /// the buffered batches from `start` on, then the end marker; a requester asking again
    /// starts over; beyond [`MAX_REPLAYS`] under way, a request is turned away.
    fn take_replay_requests(&mut self) {
        let Some(replay) = &self.replay else { return };
        while replay.poll(zmq::POLLIN, 0).is_ok_and(|n| n > 0) {
            let Ok(frames) = replay.recv_multipart(zmq::DONTWAIT) else {
                return;
            };
            let (Some(identity), Some(Ok(start))) =
                (frames.first(), frames.last().map(|f| replay_start(f)))
            else {
                tracing::debug!(frames = frames.len(), "a malformed KV event replay request");
                continue;
            };
            self.replays.retain(|r| r.identity != *identity);
            if self.replays.len() >= MAX_REPLAYS {
                // The place of the replay whose requester has read least lately, if it is
                // blocked long enough; else none.
                let now = std::time::Instant::now();
                let yielding = (self.replays.iter().enumerate())
                    .filter(|(_, r)| r.blocked && now.duration_since(r.moved) >= REPLAY_YIELD)
                    .min_by_key(|(_, r)| r.moved)
                    .map(|(i, _)| i);
                match yielding {
                    Some(i) => {
                        self.replays.swap_remove(i);
                        self.stats.replays_abandoned.fetch_add(1, Ordering::Relaxed);
                    }
                    None => {
                        self.stats.replays_refused.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                }
            }
            self.stats.replay_requests.fetch_add(1, Ordering::Relaxed);
            self.replays.push(Replay {
                identity: identity.clone(),
                next: start,
                ended: false,
                moved: std::time::Instant::now(),
                blocked: false,
            });
        }
    }

    /// Sends each replay on until its requester's queue is full; a replay that has sent its
    /// end marker is done, one whose requester is gone or has not read for [`REPLAY_STALL`]
    /// is given up. Only what the buffer still holds is sent.
    fn advance_replays(&mut self) {
        let Some(socket) = &self.replay else { return };
        let (buffer, topic, stats) = (&self.buffer, &self.topic, &self.stats);
        let now = std::time::Instant::now();
        self.replays.retain_mut(|r| {
            let outcome = send_replay(socket, buffer, topic, r);
            match outcome {
                Ok(true) => false,
                Ok(false) if now.duration_since(r.moved) < REPLAY_STALL => true,
                Ok(false) | Err(_) => {
                    stats.replays_abandoned.fetch_add(1, Ordering::Relaxed);
                    false
                }
            }
        });
    }
}

/// Sends what `r` has left until the requester's queue is full: `Ok(true)` once the end marker
/// is sent, `Ok(false)` while its queue is full, an error when the requester is gone.
fn send_replay(
    socket: &zmq::Socket,
    buffer: &VecDeque<(u64, Vec<u8>)>,
    topic: &[u8],
    r: &mut Replay,
) -> Result<bool, zmq::Error> {
    // Sent, or not for a full queue (the requester not reading), or the requester is gone.
    fn sent(res: Result<(), zmq::Error>, blocked: &mut bool) -> Result<bool, zmq::Error> {
        match res {
            Ok(()) => Ok(true),
            Err(zmq::Error::EAGAIN) => {
                *blocked = true;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
    r.blocked = false;
    if !r.ended {
        // The buffer's sequences are consecutive: the first to send is found by arithmetic.
        let first = buffer.front().map_or(0, |(s, _)| *s);
        let skip = r.next.saturating_sub(first) as usize;
        for (seq, payload) in buffer.iter().skip(skip) {
            let frames: [&[u8]; 5] = [&r.identity, b"", topic, &seq_bytes(*seq), payload];
            if !sent(socket.send_multipart(frames, zmq::DONTWAIT), &mut r.blocked)? {
                return Ok(false);
            }
            r.next = seq + 1;
            r.moved = std::time::Instant::now();
        }
        r.ended = true;
    }
    let end: [&[u8]; 5] = [&r.identity, b"", b"", &END_SEQ, b""];
    sent(socket.send_multipart(end, zmq::DONTWAIT), &mut r.blocked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_events::{KvEvent, Message};

    fn batch(n: usize) -> KvEventBatch {
        KvEventBatch {
            ts: n as f64,
            events: vec![KvEvent::AllBlocksCleared; n],
            attn_dp_rank: Some(0),
        }
    }

    /// A subscriber gets the batches in order; a replay from a sequence gets the rest and the
    /// end marker.
    #[test]
    fn batches_are_published_and_replayed() {
        let cfg = KvEventsConfig::parse(
            r#"{"publisher":"zmq","endpoint":"tcp://127.0.0.1:0","bind":true,
                "replay_endpoint":"tcp://127.0.0.1:0","topic":"kv","buffer_steps":3}"#,
        )
        .unwrap();
        let p = Publisher::start(&cfg).unwrap();
        assert!(p.endpoint.starts_with("tcp://127.0.0.1:"), "{}", p.endpoint);
        let ctx = zmq::Context::new();
        let sub = ctx.socket(zmq::SUB).unwrap();
        sub.set_subscribe(b"kv").unwrap();
        sub.set_rcvtimeo(10_000).unwrap();
        sub.connect(&p.endpoint).unwrap();
        // A PUB drops what it sends before a subscription arrives: publish until one lands.
        let mut first = None;
        for _ in 0..500 {
            p.publish(batch(1));
            if sub.poll(zmq::POLLIN, 20).unwrap() > 0 {
                first = Some(sub.recv_multipart(0).unwrap());
                break;
            }
        }
        let first = Message::from_frames(&first.expect("a subscriber hears the publisher"))
            .unwrap()
            .unwrap();
        assert_eq!(first.topic, b"kv");
        for n in 2..=4 {
            p.publish(batch(n));
        }
        // More of the probing batches may still come; then 2, 3 and 4, numbered on.
        let (mut seqs, mut sizes) = (vec![first.seq], vec![1]);
        while sizes.last() != Some(&4) && seqs.len() < 600 {
            let m = Message::from_frames(&sub.recv_multipart(0).unwrap())
                .unwrap()
                .unwrap();
            seqs.push(m.seq);
            sizes.push(KvEventBatch::decode(&m.payload).unwrap().events.len());
        }
        assert_eq!(sizes[sizes.len() - 3..], [2, 3, 4]);
        assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
        let last = *seqs.last().unwrap();
        // Replay from the last two: the buffer (3 deep) still has them.
        let dealer = ctx.socket(zmq::DEALER).unwrap();
        dealer.set_rcvtimeo(10_000).unwrap();
        dealer
            .connect(p.replay_endpoint.as_deref().unwrap())
            .unwrap();
        dealer
            .send_multipart([&b""[..], &seq_bytes(last - 1)], 0)
            .unwrap();
        let mut got = Vec::new();
        loop {
            let frames = dealer.recv_multipart(0).unwrap();
            assert_eq!(frames[0], b"", "the delimiter");
            match Message::from_frames(&frames[1..]).unwrap() {
                Some(m) => got.push(m.seq),
                None => break,
            }
        }
        assert_eq!(got, vec![last - 1, last]);
        assert_eq!(p.stats.replay_requests.load(Ordering::Relaxed), 1);
    }
}
