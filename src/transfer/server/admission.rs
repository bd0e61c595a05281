//! Who gets in: the accept loop both servers share, with the limits on connections in all and
//! per peer, and the refusal that tells a peer over a limit why before its socket closes.

use super::{ConnCounters, LogBudget, ServerOptions};
use crate::transfer::frame::{Header, Status};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Open connections, in all and per peer address.
#[derive(Default)]
struct Occupancy {
    total: usize,
    by_peer: HashMap<IpAddr, usize>,
}

/// One admitted connection's place; given back when dropped.
pub(super) struct Slot {
    occupancy: Arc<Mutex<Occupancy>>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut o = self.occupancy.lock();
        o.total = o.total.saturating_sub(1);
        if let Some(n) = o.by_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                o.by_peer.remove(&self.peer);
            }
        }
    }
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
        let admitted = {
            let mut o = occupancy.lock();
            let mine = o.by_peer.get(&peer.ip()).copied().unwrap_or(0);
            if o.total >= opts.max_connections {
                Err(("connection limit reached", opts.max_connections))
            } else if mine >= opts.max_connections_per_peer {
                Err((
                    "per-peer connection limit reached",
                    opts.max_connections_per_peer,
                ))
            } else {
                o.total += 1;
                *o.by_peer.entry(peer.ip()).or_default() += 1;
                Ok(())
            }
        };
        if let Err((why, limit)) = admitted {
            ConnCounters::count(&counters.refused);
            if let Some(n) = refusals.spend(Instant::now()) {
                tracing::warn!(role = opts.role, %peer, limit, refused = n, "{why}; refusing connections");
            }
            let reason = format!(
                "the {} at {} refused this connection: {why} ({limit} connections from {}); \
                 close idle connections or raise the limit",
                opts.role,
                listener
                    .local_addr()
                    .map_or_else(|_| "?".into(), |a| a.to_string()),
                peer.ip()
            );
            refuser.refuse(stream, &reason);
            continue;
        }
        ConnCounters::count(&counters.accepted);
        if let Some(idle) = opts.keepalive {
            if let Err(e) = crate::transfer::keep_alive(&stream, idle) {
                tracing::debug!(role = opts.role, %peer, error = %e, "cannot set TCP keepalive");
            }
        }
        let slot = Slot {
            occupancy: occupancy.clone(),
            peer: peer.ip(),
        };
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
