//! Idle-connection floods: what a hostile or broken client does to the pool's ports. Used by
//! `bench store --idle-flood N` (the put/get rate of a normal client while N idle connections
//! are held open) and by the tests.

use socket2::{Domain, Socket, Type};
use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

/// A TCP connection to `target` from the local address `source` (any port), so that a flood
/// can come from another loopback address than the client it disturbs.
pub fn connect_from(
    source: IpAddr,
    target: SocketAddr,
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    let socket = Socket::new(Domain::for_address(target), Type::STREAM, None)?;
    socket.bind(&SocketAddr::new(source, 0).into())?;
    socket.connect_timeout(&target.into(), timeout)?;
    Ok(socket.into())
}

/// Connections held open and idle.
pub struct Flood {
    conns: Vec<TcpStream>,
    /// Connections that could not be opened at all.
    pub failed: usize,
}

impl Flood {
    /// Opens `n` connections from `source`, spread over `targets`.
    pub fn open(source: IpAddr, targets: &[SocketAddr], n: usize) -> Flood {
        let mut conns = Vec::with_capacity(n);
        let mut failed = 0;
        for i in 0..n {
            let Some(target) = targets.get(i % targets.len().max(1)) else {
                break;
            };
            match connect_from(source, *target, Duration::from_secs(2)) {
                Ok(c) => conns.push(c),
                Err(_) => failed += 1,
            }
        }
        Flood { conns, failed }
    }

    /// Connections open.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Whether no connection is open.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// How many the servers have not closed (yet).
    pub fn still_open(&self) -> usize {
        self.conns
            .iter()
            .filter(|c| {
                let _ = c.set_nonblocking(true);
                let mut b = [0u8; 1];
                let open = matches!((&**c).read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
                let _ = c.set_nonblocking(false);
                open
            })
            .count()
    }
}
