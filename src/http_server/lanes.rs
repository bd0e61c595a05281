//! Thread-per-core serving over one listener: the thread that accepts hands each connection to
//! a lane (a thread with a single-threaded runtime of its own, which serves the connection from
//! then on, so its requests never cross a thread).
//!
//! One listener, not one `SO_REUSEPORT` listener per thread: a port shared that way would let
//! a second server started by the same user join it silently and take part of the traffic,
//! where it must fail with "address in use". Handing a connection over costs its accepting
//! thread a channel send and the lane a wake-up, once per connection, not per request.

use super::gate::{Gate, Pass};
use super::OpenConnection;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, Semaphore};

/// An accepted connection with what it holds while open: its place at the port (with its
/// slot) and its place in its lane's count. On its way to a lane it is a std stream; served, a
/// tokio one.
pub(super) struct Accepted<S> {
    pub stream: S,
    pub peer: SocketAddr,
    pub counted: OpenConnection,
    pub pass: Pass,
}

/// The accepting side: where each lane's connections go and how many each has open.
pub struct Handoff {
    /// Lane 0 is the accepting thread's own (it serves what it keeps); the others are senders.
    senders: Vec<mpsc::UnboundedSender<Accepted<std::net::TcpStream>>>,
    open: Vec<Arc<AtomicUsize>>,
    /// Where the next search for the least loaded lane starts (spreads ties).
    next: usize,
    /// The connection slots every lane's connections hold (one limit for the port), and how
    /// many there are.
    pub(super) slots: Arc<Semaphore>,
    pub(super) max_connections: usize,
    /// Who gets the port's places, and who gives way when it is full.
    pub(super) gate: Arc<Gate>,
}

/// The receiving side of one lane (not the accepting thread's).
pub struct Lane {
    pub(super) handed: mpsc::UnboundedReceiver<Accepted<std::net::TcpStream>>,
    pub(super) slots: Arc<Semaphore>,
    pub(super) max_connections: usize,
}

/// `n` lanes (at least one) sharing `max_connections` places, `per_peer` of them for one
/// address at most: the accepting side, and the receiving side of lanes 1.. (lane 0 is the
/// accepting thread; with `n` = 1 it serves every connection, as a port without
/// thread-per-core does).
pub fn lanes(n: usize, max_connections: usize, per_peer: usize) -> (Handoff, Vec<Lane>) {
    let gate = Gate::new(max_connections, per_peer);
    let slots = gate.slots.clone();
    let open: Vec<_> = (0..n.max(1)).map(|_| Arc::default()).collect();
    let mut senders = Vec::with_capacity(open.len());
    let mut receivers = Vec::with_capacity(open.len() - 1);
    for _ in 1..open.len() {
        let (tx, rx) = mpsc::unbounded_channel();
        senders.push(tx);
        receivers.push(Lane {
            handed: rx,
            slots: slots.clone(),
            max_connections,
        });
    }
    let handoff = Handoff {
        senders,
        open,
        next: 0,
        slots,
        max_connections,
        gate,
    };
    (handoff, receivers)
}

/// Where a connection goes: of `n` lanes with `open(i)` connections each, the one with the
/// fewest, the search starting at `start` (one past the last choice) so that equal lanes take
/// turns.
fn least_loaded(n: usize, start: usize, open: impl Fn(usize) -> usize) -> usize {
    (0..n)
        .map(|i| (start + i) % n)
        .min_by_key(|&i| open(i))
        .unwrap_or(0)
}

impl Handoff {
    /// Chooses the lane for a connection and sends it there, or gives it back to be served on
    /// the accepting thread: when that thread's lane is chosen, or the chosen lane's thread has
    /// ended.
    pub(super) fn place(
        &mut self,
        stream: tokio::net::TcpStream,
        peer: SocketAddr,
        pass: Pass,
    ) -> Option<Accepted<tokio::net::TcpStream>> {
        let lane = least_loaded(self.open.len(), self.next, |i| {
            self.open[i].load(Ordering::Relaxed)
        });
        self.next = (lane + 1) % self.open.len();
        // Counted from now, so that the next choice already sees it.
        let counted = OpenConnection::new(self.open[lane].clone());
        if lane == 0 {
            return Some(Accepted {
                stream,
                peer,
                counted,
                pass,
            });
        }
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "cannot hand a connection to a lane");
                return None;
            }
        };
        let handed = Accepted {
            stream,
            peer,
            counted,
            pass,
        };
        match self.senders[lane - 1].send(handed) {
            Ok(()) => None,
            Err(mpsc::error::SendError(back)) => Some(Accepted {
                counted: OpenConnection::new(self.open[0].clone()),
                ..back.served()?
            }),
        }
    }

    /// Lanes, the accepting thread's included.
    pub fn lanes(&self) -> usize {
        self.open.len()
    }
}

impl Accepted<std::net::TcpStream> {
    /// The connection on this thread's runtime, to be served here (`None`: it cannot be, and
    /// is closed).
    pub(super) fn served(self) -> Option<Accepted<tokio::net::TcpStream>> {
        let Accepted {
            stream,
            peer,
            counted,
            pass,
        } = self;
        match tokio::net::TcpStream::from_std(stream) {
            Ok(stream) => Some(Accepted {
                stream,
                peer,
                counted,
                pass,
            }),
            Err(e) => {
                tracing::debug!(%peer, error = %e, "cannot serve a handed connection");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_loaded_lane_takes_a_connection_and_equal_ones_take_turns() {
        let of = |counts: &'static [usize]| move |i: usize| counts[i];
        assert_eq!(least_loaded(3, 0, of(&[3, 1, 2])), 1);
        assert_eq!(least_loaded(3, 0, of(&[3, 1, 1])), 1);
        assert_eq!(least_loaded(3, 2, of(&[3, 1, 1])), 2);
        // Four equal lanes, each choice starting one past the last: every lane in turn.
        let mut start = 0;
        let picks: Vec<usize> = (0..8)
            .map(|_| {
                let lane = least_loaded(4, start, |_| 0);
                start = (lane + 1) % 4;
                lane
            })
            .collect();
        assert_eq!(picks, [0, 1, 2, 3, 0, 1, 2, 3]);
        assert_eq!(least_loaded(1, 0, |_| 7), 0);
    }

    #[tokio::test]
    async fn connections_spread_over_lanes_and_a_lane_that_ended_is_served_here() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (mut handoff, mut receivers) = lanes(3, 16, 16);
        let pass = |peer: SocketAddr, gate: &Arc<Gate>| gate.admit(peer.ip()).unwrap();
        assert_eq!(handoff.lanes(), 3);
        let mut clients = Vec::new();
        let mut accept = async || {
            clients.push(tokio::net::TcpStream::connect(addr).await.unwrap());
            let (stream, peer) = listener.accept().await.unwrap();
            (stream, peer)
        };
        let mut kept = Vec::new();
        for _ in 0..6 {
            let (stream, peer) = accept().await;
            let p = pass(peer, &handoff.gate);
            kept.extend(handoff.place(stream, peer, p));
        }
        // Equal lanes take turns: two connections each, two kept here.
        let mut handed: Vec<Vec<Accepted<_>>> = receivers
            .iter_mut()
            .map(|l| std::iter::from_fn(|| l.handed.try_recv().ok()).collect())
            .collect();
        assert_eq!(kept.len(), 2);
        assert!(handed.iter().all(|h| h.len() == 2));
        assert_eq!(
            handoff.slots.available_permits(),
            handoff.max_connections - 6
        );
        // Lane 1's connections close: it is the least loaded, and takes the next one.
        handed[0].clear();
        assert_eq!(handoff.open[1].load(Ordering::Relaxed), 0);
        let (stream, peer) = accept().await;
        let p = pass(peer, &handoff.gate);
        assert!(handoff.place(stream, peer, p).is_none());
        assert_eq!(
            receivers[0]
                .handed
                .try_recv()
                .unwrap()
                .counted
                .0
                .load(Ordering::Relaxed),
            1
        );
        // A lane whose thread has gone: its connection comes back to be served here.
        drop(receivers);
        let (stream, peer) = accept().await;
        let p = pass(peer, &handoff.gate);
        let back = handoff.place(stream, peer, p).expect("served here");
        assert_eq!(handoff.open[0].load(Ordering::Relaxed), 3);
        drop((back, kept));
        assert_eq!(handoff.open[0].load(Ordering::Relaxed), 0);
    }
}
