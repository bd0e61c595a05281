//! The client side of a connection: numbered requests with their replies, and a pool of idle
//! connections per peer so that connections are reused.

use super::frame::{Header, Opcode, Status, FLAG_EPOCH};
use super::message::{AuthChallengeResp, AuthHelloReq, AuthProofReq, Wire};
use super::rpc::{self, Rpc};
use super::stream::FramedStream;
use super::TransferError;
use parking_lot::Mutex;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Connection settings of a client.
#[derive(Clone, Debug)]
pub struct ConnOptions {
    /// How long to wait for a TCP connection.
    pub connect_timeout: Duration,
    /// Longest wait for any read or write on an established connection.
    pub io_timeout: Duration,
    /// Spin-poll window before blocking for a reply (see `stream`).
    pub spin: Duration,
    /// The cluster secret: each new connection proves it holds it, and checks that the
    /// server does (`crate::auth`). `None`: no handshake.
    pub auth: Option<Arc<crate::auth::Secret>>,
}

impl Default for ConnOptions {
    fn default() -> Self {
        ConnOptions {
            connect_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(10),
            spin: Duration::from_micros(50),
            auth: None,
        }
    }
}

/// One connection to a server of the binary protocol, with its requests in flight.
pub struct Connection {
    pub io: FramedStream,
    next_id: u64,
    pub peer: String,
    /// The highest leadership epoch heard from the elected masters this connection's pool
    /// follows: an answer of an older epoch is refused.
    fence: Option<Arc<AtomicU64>>,
    /// Where the pool that made it can cut it off (an elected master's pool, when the leader
    /// moves); removed from there when the connection goes.
    live: Option<(Arc<LiveSet>, u64)>,
    /// The count of its pool's connections opened and closed, counted up when it goes.
    changes: Option<Arc<AtomicU64>>,
}

/// The open connections of a pool that follows a leader, by a handle on each socket: when the
/// leader moves, calls still waiting on the old one (paused, partitioned) fail at once instead
/// of at their I/O timeout.
#[derive(Default)]
pub struct LiveSet {
    sockets: Mutex<std::collections::HashMap<u64, TcpStream>>,
    next: AtomicU64,
}

impl LiveSet {
    fn add(self: &Arc<Self>, conn: &mut Connection) {
        if let Ok(handle) = conn.io.socket_handle() {
            let id = self.next.fetch_add(1, Ordering::Relaxed);
            self.sockets.lock().insert(id, handle);
            conn.live = Some((self.clone(), id));
        }
    }

    /// Shuts every open connection down; their pending calls fail with a closed connection.
    fn cut_all(&self) -> usize {
        let sockets = self.sockets.lock();
        for s in sockets.values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        sockets.len()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some((set, id)) = self.live.take() {
            set.sockets.lock().remove(&id);
        }
        if let Some(changes) = &self.changes {
            changes.fetch_add(1, Ordering::Release);
        }
    }
}

/// A TCP connection to `addr` (`host:port`, its first address), made within `timeout`; a
/// failure names the address.
pub fn connect_tcp(addr: &str, timeout: Duration) -> Result<TcpStream, TransferError> {
    let connect_err = |source| TransferError::Connect {
        addr: addr.to_string(),
        source,
    };
    let sockaddr = addr
        .to_socket_addrs()
        .map_err(connect_err)?
        .next()
        .ok_or_else(|| {
            connect_err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "address resolved to nothing",
            ))
        })?;
    TcpStream::connect_timeout(&sockaddr, timeout).map_err(connect_err)
}

impl Connection {
    /// Connects to `addr` (`host:port`) within `opts.connect_timeout`, each read and write then
    /// waiting at most `opts.io_timeout`.
    pub fn connect(addr: &str, opts: &ConnOptions) -> Result<Connection, TransferError> {
        let stream = connect_tcp(addr, opts.connect_timeout)?;
        let io = FramedStream::new(stream, opts.spin)?;
        io.set_timeout(Some(opts.io_timeout))?;
        let mut conn = Connection {
            io,
            next_id: 1,
            peer: addr.to_string(),
            fence: None,
            live: None,
            changes: None,
        };
        if let Some(secret) = &opts.auth {
            conn.authenticate(secret)?;
        }
        Ok(conn)
    }

    /// Proves this side holds the cluster secret, and checks that the server does.
    fn authenticate(&mut self, secret: &crate::auth::Secret) -> Result<(), TransferError> {
        use crate::auth::{nonce, Side};
        let peer = self.peer.clone();
        let failed = |reason: &str| TransferError::Auth {
            addr: peer.clone(),
            reason: reason.to_string(),
        };
        let mine = nonce().map_err(|e| failed(&e.to_string()))?;
        let hello = AuthHelloReq {
            nonce: mine.to_vec(),
        };
        let challenge: AuthChallengeResp = match self.call::<rpc::AuthHello>(&hello) {
            Ok(c) => c,
            Err(e) if e.status() == Some(Status::UnknownOpcode) => {
                return Err(failed(
                    "the server does not know authentication (an older version)",
                ))
            }
            Err(e) => return Err(e),
        };
        if challenge.proof.is_empty() {
            return Err(failed(
                "the server holds no cluster secret; give it the same --auth-token-file",
            ));
        }
        if !secret.verify(Side::Server, &mine, &challenge.nonce, &challenge.proof) {
            return Err(failed(
                "the server did not prove it holds this cluster secret",
            ));
        }
        let proof = AuthProofReq {
            proof: secret.prove(Side::Client, &mine, &challenge.nonce),
        };
        self.call::<rpc::AuthProof>(&proof)
    }

    /// Sends a request and returns its id; the payload goes out straight from `data`.
    pub fn send(&mut self, op: Opcode, meta: &[u8], data: &[&[u8]]) -> Result<u64, TransferError> {
        let id = self.next_id;
        self.next_id += 1;
        let data_len = data.iter().map(|d| d.len() as u64).sum();
        let header = Header::request(op, id, meta.len(), data_len);
        self.io.write_frame(&header, meta, data)?;
        Ok(id)
    }

    /// Sends a request whose payload is `value` followed by its CRC-32C, computed as it is
    /// sent (`WRITE_CHECKED`); answers its id and the CRC.
    pub fn send_checked(
        &mut self,
        op: Opcode,
        meta: &[u8],
        value: &[u8],
    ) -> Result<(u64, u32), TransferError> {
        let id = self.next_id;
        self.next_id += 1;
        let header = Header::request(op, id, meta.len(), value.len() as u64 + 4);
        let crc = self.io.write_frame_checked(&header, meta, value)?;
        Ok((id, crc))
    }

    /// Reads the reply to request `id` (replies come in request order). An error answer becomes
    /// `TransferError::Remote`; its payload, if any, is skipped.
    pub fn recv(&mut self, id: u64) -> Result<(Header, Vec<u8>), TransferError> {
        let (header, mut meta) = self.io.read_frame(true)?;
        if header.is_response() && header.request_id == super::frame::REFUSAL_ID {
            return Err(TransferError::Remote {
                status: Status::from_u16(header.status),
                message: String::from_utf8_lossy(&meta).into_owned(),
            });
        }
        if !header.is_response() || header.request_id != id {
            return Err(TransferError::Protocol(format!(
                "expected the reply to request {id}, got frame {} (response: {})",
                header.request_id,
                header.is_response()
            )));
        }
        let mut epoch = 0;
        if header.flags & FLAG_EPOCH != 0 {
            let Some(e) = meta.get(..8) else {
                return Err(TransferError::Protocol(
                    "an epoch-stamped answer shorter than its epoch".into(),
                ));
            };
            epoch = u64::from_le_bytes(e.try_into().expect("8 bytes"));
            meta.drain(..8);
        }
        // A standby's refusal carries no epoch and is no answer to fence: it says where to go.
        let refused = header.status == Status::NotLeader as u16;
        if let (Some(fence), false) = (&self.fence, refused) {
            let known = fence.fetch_max(epoch, Ordering::AcqRel);
            if epoch < known {
                self.io.discard_data()?;
                return Err(TransferError::StaleEpoch { got: epoch, known });
            }
        }
        let status = Status::from_u16(header.status);
        if status != Status::Ok {
            self.io.discard_data()?;
            return Err(TransferError::Remote {
                status,
                message: String::from_utf8_lossy(&meta).into_owned(),
            });
        }
        Ok((header, meta))
    }

    /// One request without payload, one decoded reply without payload.
    pub fn call<R: Rpc>(&mut self, req: &R::Request) -> Result<R::Reply, TransferError> {
        self.call_meta(R::OPCODE, &req.to_meta())
    }

    /// A master's order to a store (`FORGET`, `MOVE`): `req` tagged with the store's grant
    /// key, so that the store knows it from its master.
    pub fn order<R: Rpc>(
        &mut self,
        key: &super::grant::GrantKey,
        req: &R::Request,
    ) -> Result<R::Reply, TransferError> {
        self.call_meta(R::OPCODE, &key.order(R::OPCODE, req.to_meta()))
    }

    /// One request of an encoded meta without payload, one decoded reply without payload.
    fn call_meta<Resp: Wire>(&mut self, op: Opcode, meta: &[u8]) -> Result<Resp, TransferError> {
        let id = self.send(op, meta, &[])?;
        let (header, meta) = self.recv(id)?;
        if header.data_len != 0 {
            return Err(TransferError::Protocol(format!(
                "unexpected {}-byte payload in the reply to {}",
                header.data_len,
                op.name()
            )));
        }
        Resp::from_meta(&meta)
    }
}

/// Idle connections to one peer. `get` hands out a connection that goes back to the pool when
/// dropped, unless an error made it unusable.
pub struct Pool {
    /// The peer; an elected master's link moves it when the leader changes.
    addr: parking_lot::RwLock<Arc<str>>,
    opts: ConnOptions,
    idle: Mutex<Vec<Connection>>,
    fence: Option<Arc<AtomicU64>>,
    live: Option<Arc<LiveSet>>,
    /// Connections opened and closed so far: a client tells from it whether the connection
    /// that bound it to the master may have gone.
    changes: Arc<AtomicU64>,
    /// TCP keepalive on its connections (`crate::transfer::keep_alive`).
    keepalive: Option<Duration>,
}

/// Most idle connections kept per peer.
const MAX_IDLE: usize = 64;

impl Pool {
    /// A pool of connections to `addr`, opened when first needed and kept idle (at most
    /// `MAX_IDLE`) between calls.
    pub fn new(addr: impl Into<String>, opts: ConnOptions) -> Pool {
        Pool {
            addr: parking_lot::RwLock::new(Arc::from(addr.into())),
            opts,
            idle: Mutex::new(Vec::new()),
            fence: None,
            live: None,
            changes: Arc::default(),
            keepalive: None,
        }
    }

    /// Keeps its connections alive with TCP keepalive probes after `idle` (an idle connection
    /// whose peer vanished then ends, and [`Pool::prune_closed`] drops it).
    pub fn with_keepalive(mut self, idle: Duration) -> Pool {
        self.keepalive = Some(idle);
        self
    }

    /// How many connections this pool has opened and closed: unchanged while the same ones
    /// stay open.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Drops the idle connections whose peer has closed them (or whose keepalive gave up),
    /// found without blocking: one `recv` peek each.
    pub fn prune_closed(&self) {
        // Taken out to look at, so that no call waits on the idle list meanwhile.
        let idle = std::mem::take(&mut *self.idle.lock());
        for c in idle.into_iter().filter(|c| c.io.peer_open()) {
            self.put_back(c);
        }
    }

    /// Follows elected masters: refuses answers of an epoch below the highest seen in
    /// `fence`, and keeps a handle on every connection so that a move cuts them off.
    pub fn with_fence(mut self, fence: Arc<AtomicU64>) -> Pool {
        self.fence = Some(fence);
        self.live = Some(Arc::default());
        self
    }

    /// The peer the pool connects to now.
    pub fn addr(&self) -> Arc<str> {
        self.addr.read().clone()
    }

    /// The options every connection of the pool is opened with.
    pub fn options(&self) -> &ConnOptions {
        &self.opts
    }

    /// Points the pool at another peer (the new leader); connections to the old one go, and
    /// calls waiting on them fail at once.
    pub fn set_addr(&self, addr: &str) {
        *self.addr.write() = Arc::from(addr);
        self.idle.lock().clear();
        if let Some(live) = &self.live {
            live.cut_all();
        }
    }

    fn connect(&self) -> Result<Connection, TransferError> {
        let addr = self.addr();
        let mut conn = Connection::connect(&addr, &self.opts)?;
        if let Some(idle) = self.keepalive {
            super::keep_alive(conn.io.stream(), idle).map_err(TransferError::Io)?;
        }
        conn.fence = self.fence.clone();
        conn.changes = Some(self.changes.clone());
        self.changes.fetch_add(1, Ordering::Release);
        if let Some(live) = &self.live {
            live.add(&mut conn);
        }
        Ok(conn)
    }

    /// An idle connection, or a new one. [`PooledConnection::release`] gives it back once a
    /// call left it clean; dropped without that, it closes.
    pub fn get(&self) -> Result<PooledConnection<'_>, TransferError> {
        let idle = self.idle.lock().pop();
        let reused = idle.is_some();
        let conn = match idle {
            Some(c) => c,
            None => self.connect()?,
        };
        Ok(PooledConnection {
            pool: self,
            conn: Some(conn),
            reused,
        })
    }

    /// A freshly connected connection, never an idle one.
    pub fn get_fresh(&self) -> Result<PooledConnection<'_>, TransferError> {
        Ok(PooledConnection {
            pool: self,
            conn: Some(self.connect()?),
            reused: false,
        })
    }

    /// Runs `f` on a pooled connection. A reused connection that turns out to be closed (the
    /// peer restarted) is replaced by a fresh one and `f` tried once more; a fresh connection's
    /// failure is returned as is.
    pub fn with<T>(
        &self,
        mut f: impl FnMut(&mut Connection) -> Result<T, TransferError>,
    ) -> Result<T, TransferError> {
        let reused = self.idle.lock().pop();
        if let Some(mut conn) = reused {
            match f(&mut conn) {
                Ok(v) => {
                    self.put_back(conn);
                    return Ok(v);
                }
                Err(TransferError::Closed) | Err(TransferError::Io(_)) => {
                    // Stale connection: fall through to a fresh one.
                }
                Err(e) => {
                    if !e.breaks_connection() {
                        self.put_back(conn);
                    }
                    return Err(e);
                }
            }
        }
        let mut conn = self.connect()?;
        let result = f(&mut conn);
        match &result {
            Ok(_) => self.put_back(conn),
            Err(e) if !e.breaks_connection() => self.put_back(conn),
            Err(_) => {}
        }
        result
    }

    fn put_back(&self, conn: Connection) {
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE && *conn.peer == *self.addr.read().as_ref() {
            idle.push(conn);
        }
    }

    /// Drops every idle connection (after the peer is known to have gone).
    pub fn clear(&self) {
        self.idle.lock().clear();
    }
}

/// A connection out of a pool: back to it by [`PooledConnection::release`] once a call left
/// it clean; dropped without that (an error may have left it mid-frame), it closes.
pub struct PooledConnection<'a> {
    pool: &'a Pool,
    conn: Option<Connection>,
    reused: bool,
}

impl PooledConnection<'_> {
    /// True when the connection came from the idle list: the peer may have closed it since, so
    /// a failure before any reply is worth one retry on a fresh connection.
    pub fn is_reused(&self) -> bool {
        self.reused
    }

    /// Returns the connection to the pool; call only when it is in a clean state.
    pub fn release(mut self) {
        if let Some(c) = self.conn.take() {
            self.pool.put_back(c);
        }
    }
}

impl std::ops::Deref for PooledConnection<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn.as_ref().expect("connection present until drop")
    }
}

impl std::ops::DerefMut for PooledConnection<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        self.conn.as_mut().expect("connection present until drop")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every connection opened and closed moves the count; an idle connection its peer closed
    /// is found and dropped without a call, one still open is kept.
    #[test]
    fn idle_connections_the_peer_closed_are_pruned_and_counted() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let pool = Pool::new(
            listener.local_addr().unwrap().to_string(),
            ConnOptions::default(),
        )
        .with_keepalive(Duration::from_secs(10));
        let (a, b) = (pool.get_fresh().unwrap(), pool.get_fresh().unwrap());
        let (held_a, _) = listener.accept().unwrap();
        let (_held_b, _) = listener.accept().unwrap();
        a.release();
        b.release();
        assert_eq!(pool.changes(), 2, "two opened");
        pool.prune_closed();
        assert_eq!(
            (pool.changes(), pool.idle.lock().len()),
            (2, 2),
            "both open"
        );
        // The peer closes one: the next prune drops it (its end of stream may take a moment
        // to arrive, hence the bounded wait).
        drop(held_a);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while pool.idle.lock().len() == 2 && std::time::Instant::now() < deadline {
            pool.prune_closed();
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            (pool.changes(), pool.idle.lock().len()),
            (3, 1),
            "one closed"
        );
    }
}
