//! A TCP proxy on loopback that delays every chunk it forwards, in both directions: a slow
//! link between two roles, so that a test can hold a request in flight while something else
//! happens. It counts chunks in flight, so a test can wait until the link is quiet. It can also
//! cut the link (`partition`): bytes are read and dropped, as a network that loses every packet,
//! until `heal`.

use std::io::{Read, Write};
use std::net::{Shutdown as Direction, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Connections the proxy serves at once; more wait in the accept queue.
const MAX_CONNECTIONS: usize = 64;

/// A TCP proxy that delays what it passes on (a slow link for the tests).
pub struct DelayProxy {
    pub addr: SocketAddr,
    in_flight: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    cut: Arc<AtomicBool>,
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards to `target` with `delay` per chunk.
    pub fn start(target: SocketAddr, delay: Duration) -> std::io::Result<DelayProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let in_flight = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(AtomicBool::new(false));
        let (count, halt, cut_link) = (in_flight.clone(), stop.clone(), cut.clone());
        let open = Arc::new(AtomicUsize::new(0));
        std::thread::Builder::new()
            .name("delay-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if halt.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(client) = client else { continue };
                    if open.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                        continue;
                    }
                    let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(2))
                    else {
                        continue;
                    };
                    for (from, to) in [(&client, &server), (&server, &client)] {
                        let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
                            continue;
                        };
                        let (count, open, cut) = (count.clone(), open.clone(), cut_link.clone());
                        open.fetch_add(1, Ordering::SeqCst);
                        let _ = std::thread::Builder::new()
                            .name("delay-proxy-pump".into())
                            .spawn(move || {
                                pump(from, to, delay, &count, &cut);
                                open.fetch_sub(1, Ordering::SeqCst);
                            });
                    }
                }
            })?;
        Ok(DelayProxy {
            addr,
            in_flight,
            stop,
            cut,
        })
    }

    /// Cuts the link: from now on every byte either way is dropped.
    pub fn partition(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    /// Forwards again (bytes dropped meanwhile stay lost).
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// Chunks read but not yet forwarded.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Waits until nothing is in flight (true) or `timeout` passes (false).
    pub fn wait_quiet(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.in_flight() > 0 {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }
}

fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    delay: Duration,
    in_flight: &AtomicUsize,
    cut: &AtomicBool,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if cut.load(Ordering::SeqCst) {
            continue;
        }
        in_flight.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(delay);
        let sent = to.write_all(&buf[..n]);
        in_flight.fetch_sub(1, Ordering::SeqCst);
        if sent.is_err() {
            break;
        }
    }
    let _ = to.shutdown(Direction::Write);
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}
