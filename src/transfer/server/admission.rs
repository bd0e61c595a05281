//! Who gets in: the accept loop both servers share, with the limits on connections in all and
//! per peer, and the refusal that tells a peer over a limit why before its socket closes.
//!
//! A connection over a limit is not simply refused: a place is made for it when one can be
//! given up without harm. Connections that have not proven the cluster secret hold at most a
//! quarter of the places ([`UNPROVEN_SHARE`]) and give way first, the oldest first; then the
//! connection idle longest, if it has been idle [`IDLE_YIELD`] (one with a request in hand
//! never). So neither connections that never authenticate nor connections kept open with a
//! ping and nothing else can lock clients out; a client that was made to give way connects
//! again when it next needs to. The one cut is shut down through a duplicate of its socket,
//! and its own server sees the end and closes it.

use super::{ConnCounters, LogBudget, ServerOptions};
use crate::transfer::frame::{Header, Status};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Of the places, at most this share is held by connections that have not proven the cluster
/// secret (with one configured): the rest are always for clients that have.
pub const UNPROVEN_SHARE: usize = 4;
/// A connection idle this long gives its place to a new one when a limit is reached.
pub const IDLE_YIELD: Duration = Duration::from_secs(1);
/// A connection that has not proven the secret gives way once it is this old.
const UNPROVEN_YIELD: Duration = Duration::from_millis(20);

/// What the accept loop knows of an open connection: kept up to date by its server.
pub(super) struct Presence {
    epoch: Instant,
    opened_ms: u64,
    /// When a request last came or an answer left (ms from `epoch`); `u64::MAX` while a
    /// request is in hand.
    active_ms: AtomicU64,
    proven: AtomicBool,
    /// A duplicate of the socket, to shut it down when it is made to give way.
    socket: Option<OwnedFd>,
}

impl Presence {
    fn ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// The connection was last active at `at` (`busy`: a request is in hand).
    pub(super) fn active(&self, at: Instant, busy: bool) {
        let ms = if busy { u64::MAX } else { self.ms(at) };
        self.active_ms.store(ms, Ordering::Relaxed);
    }

    fn idle_ms(&self, now_ms: u64) -> Option<u64> {
        let a = self.active_ms.load(Ordering::Relaxed);
        (a != u64::MAX).then(|| now_ms.saturating_sub(a))
    }
}

/// Open connections, in all and per peer address, and each one's presence.
#[derive(Default)]
struct Occupancy {
    total: usize,
    by_peer: HashMap<IpAddr, usize>,
    conns: HashMap<u64, (IpAddr, Arc<Presence>)>,
    unproven: usize,
    next_id: u64,
}

impl Occupancy {
    fn remove(&mut self, id: u64) -> Option<(IpAddr, Arc<Presence>)> {
        let (peer, p) = self.conns.remove(&id)?;
        self.total = self.total.saturating_sub(1);
        if !p.proven.load(Ordering::Relaxed) {
            self.unproven = self.unproven.saturating_sub(1);
        }
        if let Some(n) = self.by_peer.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                self.by_peer.remove(&peer);
            }
        }
        Some((peer, p))
    }

    /// The connection to give way (of `peer` alone, when given): an unproven one old enough,
    /// the oldest first; else (unless `unproven_only`) the one idle longest, idle long enough.
    fn victim(&self, peer: Option<IpAddr>, now_ms: u64, unproven_only: bool) -> Option<u64> {
        let of_peer = |p: &IpAddr| peer.is_none_or(|x| x == *p);
        let unproven = (self.conns.iter())
            .filter(|(_, (p, c))| of_peer(p) && !c.proven.load(Ordering::Relaxed))
            .filter(|(_, (_, c))| {
                now_ms.saturating_sub(c.opened_ms) >= UNPROVEN_YIELD.as_millis() as u64
            })
            .min_by_key(|(id, (_, c))| (c.opened_ms, **id))
            .map(|(id, _)| *id);
        if unproven.is_some() || unproven_only {
            return unproven;
        }
        (self.conns.iter())
            .filter(|(_, (p, _))| of_peer(p))
            .filter_map(|(id, (_, c))| Some((*id, c.idle_ms(now_ms)?)))
            .filter(|(_, idle)| *idle >= IDLE_YIELD.as_millis() as u64)
            .max_by_key(|(id, idle)| (*idle, std::cmp::Reverse(*id)))
            .map(|(id, _)| id)
    }
}

/// One admitted connection's place; given back when dropped (unless it was made to give way,
/// when a new connection took it already).
pub(super) struct Slot {
    occupancy: Arc<Mutex<Occupancy>>,
    id: u64,
    presence: Arc<Presence>,
}

impl Slot {
    /// The connection was last active at `at` (`busy`: a request is in hand).
    pub(super) fn active(&self, at: Instant, busy: bool) {
        self.presence.active(at, busy);
    }

    /// The connection proved the cluster secret: it no longer counts in the unproven share.
    pub(super) fn proven(&self) {
        if !self.presence.proven.load(Ordering::Relaxed)
            && !self.presence.proven.swap(true, Ordering::Relaxed)
        {
            let mut o = self.occupancy.lock();
            if o.conns.contains_key(&self.id) {
                o.unproven = o.unproven.saturating_sub(1);
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.occupancy.lock().remove(self.id);
    }
}

/// Whether a limit is reached for a connection from `peer`, and which connection gives way.
fn make_room(
    o: &mut Occupancy,
    opts: &ServerOptions,
    peer: IpAddr,
    now_ms: u64,
) -> Result<Option<u64>, (&'static str, usize)> {
    let mine = o.by_peer.get(&peer).copied().unwrap_or(0);
    if mine >= opts.max_connections_per_peer {
        return o.victim(Some(peer), now_ms, false).map(Some).ok_or((
            "per-peer connection limit reached",
            opts.max_connections_per_peer,
        ));
    }
    if o.total >= opts.max_connections {
        return o
            .victim(None, now_ms, false)
            .map(Some)
            .ok_or(("connection limit reached", opts.max_connections));
    }
    let share = (opts.max_connections / UNPROVEN_SHARE).max(1);
    if opts.auth.is_some() && o.unproven >= share {
        return o.victim(None, now_ms, true).map(Some).ok_or((
            "limit of connections yet to prove the cluster secret reached",
            share,
        ));
    }
    Ok(None)
}

/// Accepts connections until `shutdown`: each one the limits of `opts` admit goes to `serve`
/// with its place (given back when dropped); a refused one is told why and closed.
pub(super) fn accept_loop(
    listener: TcpListener,
    counters: &ConnCounters,
    opts: &ServerOptions,
    shutdown: &AtomicBool,
    mut serve: impl FnMut(TcpStream, SocketAddr, Slot),
) {
    let occupancy = Arc::new(Mutex::new(Occupancy::default()));
    let epoch = Instant::now();
    let refusals = LogBudget::new(Duration::from_secs(10));
    let refuser = Refuser::spawn(opts.role);
    loop {
        let (stream, peer) = match listener.accept() {
            Ok(x) => x,
            Err(e) => {
                if shutdown.load(Ordering::SeqCst) {
                    return;
                }
                tracing::warn!(role = opts.role, error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if shutdown.load(Ordering::SeqCst) {
            return;
        }
        let now_ms = epoch.elapsed().as_millis() as u64;
        let admitted = {
            let mut o = occupancy.lock();
            make_room(&mut o, opts, peer.ip(), now_ms).map(|victim| {
                let gone = victim.and_then(|id| o.remove(id));
                let id = o.next_id;
                o.next_id += 1;
                let presence = Arc::new(Presence {
                    epoch,
                    opened_ms: now_ms,
                    active_ms: AtomicU64::new(now_ms),
                    proven: AtomicBool::new(opts.auth.is_none()),
                    socket: stream.as_fd().try_clone_to_owned().ok(),
                });
                o.total += 1;
                if opts.auth.is_some() {
                    o.unproven += 1;
                }
                *o.by_peer.entry(peer.ip()).or_default() += 1;
                o.conns.insert(id, (peer.ip(), presence.clone()));
                (
                    gone,
                    Slot {
                        occupancy: occupancy.clone(),
                        id,
                        presence,
                    },
                )
            })
        };
        let slot = match admitted {
            Ok((gone, slot)) => {
                if let Some((from, p)) = gone {
                    ConnCounters::count(&counters.made_way);
                    tracing::debug!(role = opts.role, %from, proven = p.proven.load(Ordering::Relaxed),
                        "a connection gives its place to a new one");
                    if let Some(s) = &p.socket {
                        let _ = nix::sys::socket::shutdown(
                            std::os::fd::AsRawFd::as_raw_fd(s),
                            nix::sys::socket::Shutdown::Both,
                        );
                    }
                }
                slot
            }
            Err((why, limit)) => {
                ConnCounters::count(&counters.refused);
                if let Some(n) = refusals.spend(Instant::now()) {
                    tracing::warn!(role = opts.role, %peer, limit, refused = n, "{why}; refusing connections");
                }
                let whose = if why.starts_with("per-peer") {
                    format!("{limit} connections from {}", peer.ip())
                } else {
                    format!("{limit} connections, none of them able to make way")
                };
                let reason = format!(
                    "the {} at {} refused this connection: {why} ({whose}); close idle \
                     connections or raise the limit",
                    opts.role,
                    listener
                        .local_addr()
                        .map_or_else(|_| "?".into(), |a| a.to_string()),
                );
                refuser.refuse(stream, &reason);
                continue;
            }
        };
        ConnCounters::count(&counters.accepted);
        if let Some(idle) = opts.keepalive {
            if let Err(e) = crate::transfer::keep_alive(&stream, idle) {
                tracing::debug!(role = opts.role, %peer, error = %e, "cannot set TCP keepalive");
            }
        }
        serve(stream, peer, slot);
    }
}

/// Tells a refused connection why before closing it: a `CONNECTION_REFUSED` answer to no
/// request ([`REFUSAL_ID`](crate::transfer::frame::REFUSAL_ID)), written without blocking the accept
/// loop. One thread then reads what the peer sent for a moment before the socket closes, so
/// that the close is not a reset that could discard the answer on the peer's side. Bounded:
/// past `REFUSALS_QUEUED` waiting sockets, one closes at once.
struct Refuser {
    queue: Option<std::sync::mpsc::SyncSender<TcpStream>>,
}

const REFUSALS_QUEUED: usize = 64;

impl Refuser {
    fn spawn(role: &'static str) -> Refuser {
        let (tx, rx) = std::sync::mpsc::sync_channel::<TcpStream>(REFUSALS_QUEUED);
        let spawned = std::thread::Builder::new()
            .name(format!("{role}-refuse"))
            .stack_size(64 * 1024)
            .spawn(move || {
                let mut scratch = [0u8; 4096];
                for mut stream in rx {
                    let until = Instant::now() + Duration::from_millis(100);
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(Duration::from_millis(20)));
                    while Instant::now() < until {
                        match std::io::Read::read(&mut stream, &mut scratch) {
                            Ok(0) => break,
                            Ok(_) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                            Err(_) => break,
                        }
                    }
                }
            });
        Refuser {
            queue: spawned.ok().map(|_| tx),
        }
    }

    fn refuse(&self, stream: TcpStream, reason: &str) {
        let header = Header {
            opcode: 0,
            flags: crate::transfer::frame::FLAG_RESPONSE,
            request_id: crate::transfer::frame::REFUSAL_ID,
            status: Status::ConnectionRefused as u16,
            meta_len: reason.len() as u32,
            data_len: 0,
        };
        let mut frame = header.encode().to_vec();
        frame.extend_from_slice(reason.as_bytes());
        // A fresh socket's send buffer takes the few hundred bytes at once.
        if stream.set_nonblocking(true).is_ok() {
            let _ = std::io::Write::write(&mut &stream, &frame);
        }
        let _ = stream.shutdown(std::net::Shutdown::Write);
        if let Some(q) = &self.queue {
            let _ = q.try_send(stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(max: usize, per_peer: usize, secret_given: bool) -> ServerOptions {
        let secret = || {
            let text = b"a-cluster-secret-long-enough-0123456789";
            Arc::new(crate::auth::Secret::new(text, std::path::Path::new("test")).unwrap())
        };
        ServerOptions {
            max_connections: max,
            max_connections_per_peer: per_peer,
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(10),
            spin: Duration::ZERO,
            role: "test",
            auth: secret_given.then(secret),
            keepalive: None,
        }
    }

    /// Admits a connection from `peer` at `now_ms` as the accept loop does; its id, and the
    /// id of the one that gave way.
    fn admit(
        o: &mut Occupancy,
        opts: &ServerOptions,
        peer: u8,
        now_ms: u64,
    ) -> Result<(u64, Option<u64>), (&'static str, usize)> {
        let peer = IpAddr::from([10, 0, 0, peer]);
        let victim = make_room(o, opts, peer, now_ms)?;
        if let Some(v) = victim {
            o.remove(v);
        }
        let id = o.next_id;
        o.next_id += 1;
        let presence = Arc::new(Presence {
            epoch: Instant::now(),
            opened_ms: now_ms,
            active_ms: AtomicU64::new(now_ms),
            proven: AtomicBool::new(opts.auth.is_none()),
            socket: None,
        });
        o.total += 1;
        if opts.auth.is_some() {
            o.unproven += 1;
        }
        *o.by_peer.entry(peer).or_default() += 1;
        o.conns.insert(id, (peer, presence));
        Ok((id, victim))
    }

    #[test]
    fn at_a_limit_the_connection_idle_longest_makes_way_never_a_busy_or_fresh_one() {
        let o = &mut Occupancy::default();
        let opts = opts(3, 3, false);
        let (a, _) = admit(o, &opts, 1, 0).unwrap();
        let (b, _) = admit(o, &opts, 2, 0).unwrap();
        let (c, _) = admit(o, &opts, 3, 1_500).unwrap();
        // a has a request in hand; b is idle longest.
        o.conns[&a].1.active_ms.store(u64::MAX, Ordering::Relaxed);
        assert_eq!(admit(o, &opts, 4, 2_000).unwrap().1, Some(b));
        // Everyone else is busy or idle less than IDLE_YIELD: refused.
        let fresh = admit(o, &opts, 5, 2_100).unwrap_err();
        assert_eq!(fresh, ("connection limit reached", 3));
        assert_eq!(admit(o, &opts, 5, 3_000).unwrap().1, Some(c));
        assert_eq!(o.total, 3);
    }

    #[test]
    fn past_its_share_an_address_makes_way_for_itself_and_unproven_connections_for_anyone() {
        let o = &mut Occupancy::default();
        let opts = opts(8, 2, true);
        // The unproven share is 2 of 8: a third unproven connection makes the oldest give way.
        let (a, _) = admit(o, &opts, 1, 0).unwrap();
        let (b, _) = admit(o, &opts, 2, 10).unwrap();
        assert_eq!(
            admit(o, &opts, 3, 15).unwrap_err().0,
            "limit of connections yet to prove the cluster secret reached"
        );
        let (c, gone) = admit(o, &opts, 3, 100).unwrap();
        assert_eq!(gone, Some(a));
        assert_eq!(o.unproven, 2);
        // Proven connections are not in the share.
        for id in [b, c] {
            o.conns[&id].1.proven.store(true, Ordering::Relaxed);
            o.unproven -= 1;
        }
        let (d, _) = admit(o, &opts, 4, 200).unwrap();
        // Address 4 past its two: one of its own makes way (the unproven d first).
        let (_, _) = admit(o, &opts, 4, 300).unwrap();
        assert_eq!(admit(o, &opts, 4, 400).unwrap().1, Some(d));
    }
}
