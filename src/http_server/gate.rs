//! Who holds an HTTP port's connections, and who gives way when it is full.
//!
//! A port admits `max_connections` in all and `max_connections_per_peer` from one address.
//! Each open connection says whether it is waiting for its client (for a request's headers,
//! between requests, or for a body still to come) and since when, or busy (its request being
//! answered). When a new connection would pass a limit, the connection that has waited for its
//! client longest gives way, if it has waited at least [`YIELD_AFTER`]: it is cut, and the new
//! one takes its place (past the address's limit, one of that address's own). So connections
//! that hold a place without sending (slow headers, trickling bodies, idle keep-alives) can
//! never keep a client that sends whole requests out; only requests being answered are never
//! cut. Pure bookkeeping, tested without sockets.

use futures_util::task::AtomicWaker;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A connection that has waited this long for its client gives its place to a new one when
/// the port is full.
pub const YIELD_AFTER: Duration = Duration::from_millis(20);

/// Bytes per second a request body must come at not to count as waiting for its client.
pub const BODY_RATE: u64 = 64 << 10;

/// `Watch::since_ms` of a connection whose request is being answered.
const BUSY: u64 = u64::MAX;

/// One open connection as the gate sees it: waiting for its client (since when) or busy, and
/// whether it was told to give way.
#[derive(Debug)]
pub struct Watch {
    /// Milliseconds from the gate's start when the connection began to wait for its client,
    /// or [`BUSY`].
    since_ms: AtomicU64,
    cut: AtomicBool,
    waker: AtomicWaker,
    started: Instant,
}

impl Watch {
    fn new(started: Instant) -> Watch {
        Watch {
            since_ms: AtomicU64::new(started.elapsed().as_millis() as u64),
            cut: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            started,
        }
    }

    /// A watch that no gate keeps (a connection served outside a port's limits).
    pub fn unwatched() -> Arc<Watch> {
        Arc::new(Watch::new(Instant::now()))
    }

    /// The connection waits for its client from now (unless it was already waiting).
    pub fn waiting(&self) {
        if self.since_ms.load(Ordering::Relaxed) == BUSY {
            let now = self.started.elapsed().as_millis() as u64;
            self.since_ms.store(now, Ordering::Relaxed);
        }
    }

    /// Its request is being answered: it is not cut meanwhile.
    pub fn busy(&self) {
        self.since_ms.store(BUSY, Ordering::Relaxed);
    }

    /// Milliseconds since the gate's start, as the watch counts them.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// A body begun at `start_ms` of which `bytes` have come: it counts as waiting since its
    /// start plus the time those bytes take at [`BODY_RATE`], so that a body that trickles has
    /// waited long and one that streams has not.
    pub fn body_progress(&self, start_ms: u64, bytes: u64) {
        let credited = start_ms.saturating_add(bytes.saturating_mul(1000) / BODY_RATE);
        self.since_ms
            .store(credited.min(self.now_ms()).min(BUSY - 1), Ordering::Relaxed);
    }

    /// Whether the connection has been told to give way.
    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::Acquire)
    }

    /// Ready once the connection is told to give way.
    pub fn cut(&self) -> Cut<'_> {
        Cut(self)
    }

    /// Polls for the cut, registering `cx` to be woken by it.
    pub fn poll_cut(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.is_cut() {
            return Poll::Ready(());
        }
        self.waker.register(cx.waker());
        if self.is_cut() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    fn give_way(&self) {
        self.cut.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// How long it has waited for its client at `now_ms`, if it is waiting.
    fn waited(&self, now_ms: u64) -> Option<u64> {
        let since = self.since_ms.load(Ordering::Relaxed);
        (since != BUSY).then(|| now_ms.saturating_sub(since))
    }
}

/// The future of [`Watch::cut`].
pub struct Cut<'a>(&'a Watch);

impl Future for Cut<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.poll_cut(cx)
    }
}

/// Why a connection was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The port is full, and no connection has waited for its client long enough to give way.
    Full { limit: usize },
    /// The address has its share, none of it waiting long enough to give way.
    PeerFull { limit: usize },
}

impl Refused {
    /// The sentence a refused client reads.
    pub fn message(&self, peer: IpAddr) -> String {
        match self {
            Refused::Full { limit } => {
                format!("this port has its {limit} connections open, every one in use; retry later")
            }
            Refused::PeerFull { limit } => format!(
                "{peer} has this port's {limit} connections per address open, every one in \
                 use; close idle connections or retry later"
            ),
        }
    }
}

struct Entry {
    peer: IpAddr,
    watch: Arc<Watch>,
    /// The port's slot this place holds (a connection cut to make way hands it on).
    slot: OwnedSemaphorePermit,
}

#[derive(Default)]
struct Places {
    entries: HashMap<u64, Entry>,
    by_peer: HashMap<IpAddr, usize>,
    next_id: u64,
}

impl Places {
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = self.entries.remove(&id)?;
        if let Some(n) = self.by_peer.get_mut(&e.peer) {
            *n -= 1;
            if *n == 0 {
                self.by_peer.remove(&e.peer);
            }
        }
        Some(e)
    }

    /// The connection (of `peer` alone, when given) that has waited for its client longest,
    /// at least `min_ms`.
    fn longest_waiting(&self, peer: Option<IpAddr>, now_ms: u64, min_ms: u64) -> Option<u64> {
        self.entries
            .iter()
            .filter(|(_, e)| peer.is_none_or(|p| e.peer == p))
            .filter_map(|(id, e)| Some((*id, e.watch.waited(now_ms)?)))
            .filter(|(_, waited)| *waited >= min_ms)
            .max_by_key(|(id, waited)| (*waited, std::cmp::Reverse(*id)))
            .map(|(id, _)| id)
    }
}

/// One port's places.
pub struct Gate {
    /// A slot per place: every open connection holds one (through its place) until it closes,
    /// so that a stopping port can wait for them all.
    pub(super) slots: Arc<Semaphore>,
    max: usize,
    per_peer: usize,
    places: Mutex<Places>,
    started: Instant,
    /// Connections cut to make room, for metrics.
    pub cut: AtomicU64,
}

/// An admitted connection's place, given back when dropped (unless it was cut, whose place a
/// new connection took already).
pub struct Pass {
    gate: Arc<Gate>,
    id: u64,
    watch: Arc<Watch>,
}

impl Pass {
    /// What tells this connection to give way.
    pub fn watch(&self) -> Arc<Watch> {
        self.watch.clone()
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.gate.places.lock().remove(self.id);
    }
}

impl Gate {
    /// A gate for `max` connections at once, at most `per_peer` of them from one address.
    pub fn new(max: usize, per_peer: usize) -> Arc<Gate> {
        Arc::new(Gate {
            slots: Arc::new(Semaphore::new(max.max(1))),
            max: max.max(1),
            per_peer: per_peer.max(1),
            places: Mutex::new(Places::default()),
            started: Instant::now(),
            cut: AtomicU64::new(0),
        })
    }

    /// Open connections (those cut excepted).
    pub fn open(&self) -> usize {
        self.places.lock().entries.len()
    }

    /// Places in all.
    pub fn max(&self) -> usize {
        self.max
    }

    /// A place for a connection from `peer`: free, or the place of the connection that has
    /// waited for its client longest (of `peer`'s own past its share), which is cut.
    pub fn admit(self: &Arc<Gate>, peer: IpAddr) -> Result<Pass, Refused> {
        self.admit_at(peer, self.started.elapsed())
    }

    fn admit_at(self: &Arc<Gate>, peer: IpAddr, now: Duration) -> Result<Pass, Refused> {
        let now_ms = now.as_millis() as u64;
        let min_ms = YIELD_AFTER.as_millis() as u64;
        let mut p = self.places.lock();
        let mine = p.by_peer.get(&peer).copied().unwrap_or(0);
        let victim = if mine >= self.per_peer {
            Some(
                p.longest_waiting(Some(peer), now_ms, min_ms)
                    .ok_or(Refused::PeerFull {
                        limit: self.per_peer,
                    })?,
            )
        } else if p.entries.len() >= self.max {
            Some(
                p.longest_waiting(None, now_ms, min_ms)
                    .ok_or(Refused::Full { limit: self.max })?,
            )
        } else {
            None
        };
        let slot = match victim.and_then(|id| p.remove(id)) {
            Some(e) => {
                e.watch.give_way();
                self.cut.fetch_add(1, Ordering::Relaxed);
                e.slot
            }
            None => self
                .slots
                .clone()
                .try_acquire_owned()
                .map_err(|_| Refused::Full { limit: self.max })?,
        };
        let id = p.next_id;
        p.next_id += 1;
        let watch = Arc::new(Watch::new(self.started));
        watch
            .since_ms
            .store(now_ms.min(BUSY - 1), Ordering::Relaxed);
        p.entries.insert(
            id,
            Entry {
                peer,
                watch: watch.clone(),
                slot,
            },
        );
        *p.by_peer.entry(peer).or_default() += 1;
        Ok(Pass {
            gate: self.clone(),
            id,
            watch,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    #[test]
    fn a_full_port_cuts_the_connection_waiting_longest_for_its_client_never_a_busy_one() {
        let gate = Gate::new(3, 3);
        let s = Duration::from_secs;
        let a = gate.admit_at(ip(1), s(0)).unwrap();
        let b = gate.admit_at(ip(2), s(1)).unwrap();
        let c = gate.admit_at(ip(3), s(2)).unwrap();
        a.watch.busy();
        // Full: b has waited longest of those waiting (a is busy), and long enough.
        let d = gate.admit_at(ip(4), s(3)).unwrap();
        assert!(b.watch.is_cut() && !a.watch.is_cut() && !c.watch.is_cut());
        assert_eq!(gate.open(), 3);
        assert_eq!(gate.cut.load(Ordering::Relaxed), 1);
        // A cut connection's drop gives nothing back twice.
        drop(b);
        assert_eq!(gate.open(), 3);
        // Nobody waiting has waited long enough yet: refused.
        c.watch.busy();
        assert_eq!(
            gate.admit_at(ip(5), s(3)).err(),
            Some(Refused::Full { limit: 3 })
        );
        // One that waits again from its next request on is cut once it has waited long enough.
        c.watch.waiting();
        let c_since = c.watch.since_ms.load(Ordering::Relaxed);
        let e = gate
            .admit_at(ip(5), Duration::from_millis(c_since) + YIELD_AFTER)
            .unwrap();
        assert!(c.watch.is_cut() || d.watch.is_cut());
        drop((a, c, d, e));
        assert_eq!(gate.open(), 0);
        assert_eq!(
            gate.slots.available_permits(),
            3,
            "every slot given back once"
        );
    }

    #[test]
    fn past_its_share_an_address_gives_way_to_itself_and_others_still_get_in() {
        let gate = Gate::new(10, 2);
        let s = Duration::from_secs;
        let a = gate.admit_at(ip(1), s(0)).unwrap();
        let b = gate.admit_at(ip(1), s(0)).unwrap();
        // Another address is not held back by ip(1)'s share.
        let other = gate.admit_at(ip(2), s(0)).unwrap();
        // ip(1) again, at once: nobody of its own has waited long enough.
        let full = gate.admit_at(ip(1), s(0)).err().unwrap();
        assert_eq!(full, Refused::PeerFull { limit: 2 });
        assert!(full.message(ip(1)).contains("10.0.0.1"));
        assert!(!Refused::Full { limit: 9 }
            .message(ip(1))
            .contains("10.0.0.1"));
        // Later: its own longest-waiting connection gives way, not another address's.
        let c = gate.admit_at(ip(1), s(5)).unwrap();
        assert!(a.watch.is_cut() && !b.watch.is_cut() && !other.watch.is_cut());
        drop((a, b, c, other));
        assert_eq!(gate.open(), 0);
    }

    #[tokio::test]
    async fn a_cut_wakes_the_connection_that_waits_on_it() {
        let gate = Gate::new(1, 1);
        let a = gate.admit_at(ip(1), Duration::ZERO).unwrap();
        let watch = a.watch();
        let waiter = tokio::spawn(async move { watch.cut().await });
        tokio::task::yield_now().await;
        let _b = gate.admit_at(ip(2), YIELD_AFTER * 2).unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap();
    }
}
