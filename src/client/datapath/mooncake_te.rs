//! Bytes to and from a segment a Mooncake process mounted (a wheel process with a global
//! segment, Mooncake's store service), through that process's Transfer Engine TCP transport:
//! the same frames Mooncake's own clients send (`mooncake::te_tcp`), so a pool of rbgctl
//! stores and Mooncake processes is read and written by rbgctl's clients in both directions.
//!
//! The segment's Transfer Engine is found as Mooncake's clients find it: its descriptor comes
//! from a P2P handshake with the port in the segment's name, or, for a process that publishes
//! to an HTTP metadata server, from that server (the client's `mooncake_metadata_server`).
//! The descriptor gives the data port and the buffers it serves; every request is checked to
//! lie in one of them before it is sent. Connections are kept for the next batch (a few per
//! segment); one that fails is dropped, and the descriptor is looked up again on the next
//! connection, for a process that came back on other ports.
//!
//! Nothing on this path is authenticated or checksummed by the peer: a write's CRC-32C is taken
//! here from the caller's bytes, a read's from the bytes as they landed, and the reader checks
//! it against the master's as on every other path.

use super::{DataPath, PathKind, ReadOp, WriteOp};
use crate::mooncake::handshake::{self, PeerDescriptor};
use crate::mooncake::metadata::MetadataServer;
use crate::mooncake::te_tcp::{Op, SessionHeader, STATUS_OK, STATUS_REFUSED};
use crate::transfer::{ConnOptions, Status, TransferError};
use parking_lot::Mutex;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

/// Connections kept idle per segment for the next batch.
const KEEP_IDLE: usize = 4;

/// How a segment's Transfer Engine is found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Discovery {
    /// A P2P handshake with the segment's name (`host:handshake_port`).
    #[default]
    Handshake,
    /// `mooncake/ram/<name>` at this HTTP metadata server (`http://host:port/metadata`), then
    /// a handshake if it has no entry.
    Http(String),
}

impl Discovery {
    /// Mooncake's metadata setting: an `http://` URL, or `P2PHANDSHAKE` (or empty). The other
    /// stores Mooncake can use (etcd, redis) are not read by rbgctl's clients: with one of them
    /// set, segments are found by handshake, which is logged.
    pub fn parse(setting: &str) -> Discovery {
        match setting {
            "" | "P2PHANDSHAKE" => Discovery::Handshake,
            url if url.starts_with("http://") => Discovery::Http(url.to_string()),
            other => {
                tracing::warn!(
                    metadata_server = other,
                    "rbgctl's clients read only http:// metadata servers; segments that \
                     Mooncake's processes mounted are found by P2P handshake"
                );
                Discovery::Handshake
            }
        }
    }
}

impl std::str::FromStr for Discovery {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Discovery, Self::Err> {
        Ok(Discovery::parse(s))
    }
}

/// The data path to a Mooncake process's segment through its Transfer Engine TCP port.
pub struct MooncakeTe {
    /// The client's RDMA side, for a segment whose descriptor says `rdma`.
    nics: Option<super::NicsInner>,
    /// The RDMA path, once the descriptor said `rdma`.
    #[cfg(feature = "rdma")]
    rdma: std::sync::OnceLock<Arc<super::mooncake_rdma::MooncakeRdma>>,
    /// The segment's name for Mooncake (`te_endpoint`): what the descriptor is found by.
    name: String,
    /// The segment's first address in its process and its length.
    base: u64,
    len: u64,
    discovery: Discovery,
    conn: ConnOptions,
    peer: Mutex<Option<Arc<PeerDescriptor>>>,
    idle: Mutex<Vec<TcpStream>>,
    /// The metadata server's client, made at the first lookup there.
    metadata: std::sync::OnceLock<MetadataServer>,
}

fn remote(message: String) -> TransferError {
    TransferError::Remote {
        status: Status::InvalidParams,
        message,
    }
}

impl MooncakeTe {
    /// Transfers to the Mooncake store `info` describes, its endpoints found through
    /// `discovery`, over TCP (`conn`) or RDMA (`nics`).
    pub fn new(
        info: &crate::transfer::message::SegmentInfo,
        discovery: Discovery,
        conn: ConnOptions,
        nics: Option<super::NicsInner>,
    ) -> MooncakeTe {
        MooncakeTe {
            nics,
            #[cfg(feature = "rdma")]
            rdma: std::sync::OnceLock::new(),
            name: info.te_endpoint.clone(),
            base: info.te_base,
            len: info.size,
            discovery,
            conn,
            peer: Mutex::new(None),
            idle: Mutex::new(Vec::new()),
            metadata: std::sync::OnceLock::new(),
        }
    }

    /// The peer's descriptor: looked up once, again after a connection failed.
    fn peer(&self) -> Result<Arc<PeerDescriptor>, TransferError> {
        if let Some(p) = self.peer.lock().clone() {
            return Ok(p);
        }
        let json = self.descriptor()?;
        self.adopt(&json)
    }

    /// Takes `json` as the peer's (TCP) descriptor.
    fn adopt(&self, json: &serde_json::Value) -> Result<Arc<PeerDescriptor>, TransferError> {
        let peer = PeerDescriptor::parse(&self.name, json)
            .map_err(|e| TransferError::Protocol(e.to_string()))?;
        if !peer.covers(self.base, self.len) {
            return Err(TransferError::Protocol(format!(
                "{}'s Transfer Engine does not serve the segment the master describes \
                 ([{:#x}, +{}) is in none of its buffers): the process behind that name changed",
                self.name, self.base, self.len
            )));
        }
        let peer = Arc::new(peer);
        *self.peer.lock() = Some(peer.clone());
        Ok(peer)
    }

    fn descriptor(&self) -> Result<serde_json::Value, TransferError> {
        let own = serde_json::json!({"name": "rbgctl-client", "protocol": "tcp", "buffers": []});
        let by_handshake = || {
            handshake::exchange(&self.name, &own, self.conn.connect_timeout).map_err(|e| {
                TransferError::Connect {
                    addr: self.name.clone(),
                    source: std::io::Error::other(format!(
                        "Mooncake handshake for its segment descriptor: {e}"
                    )),
                }
            })
        };
        match &self.discovery {
            Discovery::Handshake => by_handshake(),
            Discovery::Http(url) => {
                let server = self.metadata_server(url)?;
                let key = format!("mooncake/ram/{}", self.name);
                match server.get(&key) {
                    Ok(Some(d)) => Ok(d),
                    Ok(None) => by_handshake(),
                    Err(e) => Err(TransferError::Protocol(e.to_string())),
                }
            }
        }
    }

    /// The metadata server's client, made at the first lookup there.
    fn metadata_server(&self, url: &str) -> Result<&MetadataServer, TransferError> {
        if let Some(server) = self.metadata.get() {
            return Ok(server);
        }
        let server = MetadataServer::new(url, &[], self.conn.io_timeout)
            .map_err(|e| TransferError::Protocol(e.to_string()))?;
        Ok(self.metadata.get_or_init(|| server))
    }

    /// The RDMA path when the segment's descriptor says `rdma` and this client has NICs; `None`:
    /// TCP (the descriptor, when looked up here, is taken as the TCP peer's).
    #[cfg(feature = "rdma")]
    fn rdma_path(&self) -> Result<Option<&super::mooncake_rdma::MooncakeRdma>, TransferError> {
        if let Some(path) = self.rdma.get() {
            return Ok(Some(path));
        }
        let Some(nics) = &self.nics else {
            return Ok(None);
        };
        if self.peer.lock().is_some() {
            return Ok(None);
        }
        let json = self.descriptor()?;
        if json["protocol"] != "rdma" {
            self.adopt(&json)?;
            return Ok(None);
        }
        let path = super::mooncake_rdma::MooncakeRdma::new(
            (self.name.clone(), self.base, self.len),
            nics.clone(),
            (self.conn.connect_timeout, self.conn.io_timeout),
        )?;
        Ok(Some(self.rdma.get_or_init(|| Arc::new(path))))
    }

    fn connect(&self, peer: &PeerDescriptor) -> Result<TcpStream, TransferError> {
        let s = crate::transfer::pool::connect_tcp(&peer.data_addr(), self.conn.connect_timeout)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(self.conn.io_timeout))?;
        s.set_write_timeout(Some(self.conn.io_timeout))?;
        Ok(s)
    }

    /// Runs a batch of `n` operations over one connection (kept for the next batch when the
    /// peer left it usable): `header(peer, j)` is operation `j`'s request, checked before
    /// anything is sent; `each(stream, header, j)` carries it out. A kept connection that fails
    /// is replaced once by a new one, the descriptor looked up again.
    fn batch<R>(
        &self,
        n: usize,
        header: impl Fn(&PeerDescriptor, usize) -> Result<SessionHeader, TransferError>,
        mut each: impl FnMut(&mut TcpStream, &SessionHeader, usize) -> Result<R, TransferError>,
    ) -> Vec<Result<R, TransferError>> {
        let mut out = Vec::with_capacity(n);
        if n == 0 {
            return out;
        }
        let mut peer = match self.peer() {
            Ok(p) => p,
            Err(e) => return (0..n).map(|_| Err(e.clone())).collect(),
        };
        let mut stream: Option<TcpStream> = None;
        let mut reused = false;
        let mut j = 0;
        while j < n {
            let h = match header(&peer, j) {
                Ok(h) => h,
                Err(e) => {
                    out.push(Err(e));
                    j += 1;
                    continue;
                }
            };
            let s = match stream.as_mut() {
                Some(s) => s,
                None => {
                    let kept = self.idle.lock().pop();
                    reused = kept.is_some();
                    match kept.map_or_else(|| self.connect(&peer), Ok) {
                        Ok(s) => stream.insert(s),
                        Err(e) => {
                            self.peer.lock().take();
                            out.extend((j..n).map(|_| Err(e.clone())));
                            return out;
                        }
                    }
                }
            };
            match each(s, &h, j) {
                Ok(r) => {
                    out.push(Ok(r));
                    reused = false;
                    j += 1;
                }
                // The peer refused the range and closes: the next request goes on another.
                Err(e @ TransferError::Remote { .. }) => {
                    out.push(Err(e));
                    stream = None;
                    j += 1;
                }
                Err(e) if reused => {
                    // A kept connection the peer closed meanwhile (it restarted?): again on a
                    // new one, the descriptor looked up again.
                    tracing::debug!(segment = %self.name, error = %e,
                        "kept Transfer Engine connection failed; reconnecting");
                    stream = None;
                    self.peer.lock().take();
                    self.idle.lock().clear();
                    match self.peer() {
                        Ok(p) => peer = p,
                        Err(e) => {
                            out.extend((j..n).map(|_| Err(e.clone())));
                            return out;
                        }
                    }
                }
                Err(e) => {
                    self.peer.lock().take();
                    out.extend((j..n).map(|_| Err(e.clone())));
                    return out;
                }
            }
        }
        if let Some(s) = stream {
            let mut idle = self.idle.lock();
            if idle.len() < KEEP_IDLE {
                idle.push(s);
            }
        }
        out
    }

    /// The request's header, once its range is checked against the segment and the peer.
    fn header(
        &self,
        peer: &PeerDescriptor,
        op: Op,
        offset: u64,
        size: u64,
    ) -> Result<SessionHeader, TransferError> {
        let inside = offset.checked_add(size).is_some_and(|end| end <= self.len);
        let addr = self.base.wrapping_add(offset);
        if !inside || !peer.covers(addr, size) {
            return Err(remote(format!(
                "range [{offset}, +{size}) is outside segment {} ({} bytes)",
                self.name, self.len
            )));
        }
        Ok(SessionHeader {
            size,
            addr,
            op,
            v2: peer.v2,
        })
    }
}

/// Reads a v2 status frame: OK, or the peer's refusal of the range.
fn status(stream: &mut TcpStream, h: &SessionHeader) -> Result<(), TransferError> {
    let mut frame = [0u8; 8];
    stream.read_exact(&mut frame).map_err(io_error)?;
    match u64::from_le_bytes(frame) {
        STATUS_OK => Ok(()),
        STATUS_REFUSED => Err(remote(format!(
            "the Transfer Engine refused range [{:#x}, +{})",
            h.addr, h.size
        ))),
        other => Err(TransferError::Protocol(format!(
            "Transfer Engine status frame {other:#018x} is neither OK nor a refusal"
        ))),
    }
}

fn io_error(e: std::io::Error) -> TransferError {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => TransferError::Closed,
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => TransferError::Timeout,
        _ => TransferError::Io(e),
    }
}

#[cfg(feature = "rdma")]
impl super::mooncake_rdma::Finder for MooncakeTe {
    fn descriptor(&self) -> Result<serde_json::Value, TransferError> {
        MooncakeTe::descriptor(self)
    }

    /// In P2P mode a server name is its listener's `host:port`; a metadata server says where
    /// (`mooncake/rpc_meta/<name>`), or the name does.
    fn handshake_addr(&self, server: &str) -> Result<String, TransferError> {
        if let Discovery::Http(url) = &self.discovery {
            let key = format!("mooncake/rpc_meta/{server}");
            if let Ok(Some(meta)) = self.metadata_server(url)?.get(&key) {
                if let (Some(host), Some(port)) =
                    (meta["ip_or_host_name"].as_str(), meta["rpc_port"].as_u64())
                {
                    return Ok(if host.contains(':') {
                        format!("[{host}]:{port}")
                    } else {
                        format!("{host}:{port}")
                    });
                }
            }
        }
        Ok(server.to_string())
    }
}

/// Every operation failed with `e`.
fn all_failed<T>(n: usize, e: &TransferError) -> Vec<Result<T, TransferError>> {
    (0..n).map(|_| Err(e.clone())).collect()
}

impl DataPath for MooncakeTe {
    fn kind(&self) -> PathKind {
        PathKind::Tcp
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> Vec<Result<u32, TransferError>> {
        #[cfg(feature = "rdma")]
        match self.rdma_path() {
            Ok(Some(rdma)) => return rdma.write(ops, self),
            Ok(None) => {}
            Err(e) => return all_failed(ops.len(), &e),
        }
        // An empty value moves nothing: done here (Mooncake's transport refuses size 0).
        let (empty, sent): (Vec<usize>, Vec<usize>) =
            (0..ops.len()).partition(|&j| ops[j].value.is_empty());
        let done = self.batch(
            sent.len(),
            |peer, k| {
                let op = &ops[sent[k]];
                self.header(peer, Op::Write, op.offset, op.value.len() as u64)
            },
            |stream, h, k| {
                let value = ops[sent[k]].value;
                let crc = crate::checksum::crc32c(value);
                stream.write_all(&h.encode()).map_err(io_error)?;
                stream.write_all(value).map_err(io_error)?;
                if h.v2 {
                    status(stream, h)?;
                }
                Ok(crc)
            },
        );
        let mut out: Vec<Option<Result<u32, TransferError>>> =
            (0..ops.len()).map(|_| None).collect();
        for j in empty {
            out[j] = Some(Ok(0));
        }
        for (j, r) in sent.into_iter().zip(done) {
            out[j] = Some(r);
        }
        out.into_iter()
            .map(|r| r.expect("every operation answered"))
            .collect()
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> Vec<Result<(), TransferError>> {
        #[cfg(feature = "rdma")]
        match self.rdma_path() {
            Ok(Some(rdma)) => return rdma.read(ops, self),
            Ok(None) => {}
            Err(e) => return all_failed(ops.len(), &e),
        }
        let sizes: Vec<(u64, u64)> = ops
            .iter()
            .map(|op| (op.offset, op.dst.len() as u64))
            .collect();
        self.batch(
            ops.len(),
            |peer, j| self.header(peer, Op::Read, sizes[j].0, sizes[j].1.max(1)),
            |stream, h, j| {
                let op = &mut ops[j];
                if !op.dst.is_empty() {
                    stream.write_all(&h.encode()).map_err(io_error)?;
                    if h.v2 {
                        status(stream, h)?;
                    }
                    stream.read_exact(op.dst).map_err(io_error)?;
                }
                op.crc = Some(crate::checksum::crc32c(op.dst));
                Ok(())
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mooncake::te_tcp::SEGMENT_BASE;
    use crate::transfer::message::SegmentInfo;
    use std::io::{Read, Write};

    fn path(len: u64) -> (MooncakeTe, Arc<PeerDescriptor>) {
        let info = SegmentInfo {
            te_endpoint: "127.0.0.1:1".into(),
            te_base: SEGMENT_BASE,
            size: len,
            ..Default::default()
        };
        let peer = Arc::new(PeerDescriptor {
            data_host: "127.0.0.1".into(),
            data_port: 2,
            v2: true,
            buffers: vec![(SEGMENT_BASE, len)],
        });
        (
            MooncakeTe::new(&info, Discovery::Handshake, ConnOptions::default(), None),
            peer,
        )
    }

    /// A data port on loopback standing for a Mooncake process: a segment of `len` bytes at
    /// `SEGMENT_BASE`, v2, refusing (then closing) a range outside it, as the wheel does; two
    /// connections in turn, each closed after `per_connection` requests.
    fn one_peer(len: usize, per_connection: usize) -> (u16, std::thread::JoinHandle<Vec<u8>>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let served = std::thread::spawn(move || {
            let mut memory = vec![0u8; len];
            // Two connections: the one a refusal closes, and the next.
            for _ in 0..2 {
                let (mut s, _) = listener.accept().unwrap();
                let mut head = [0u8; 24];
                for _ in 0..per_connection {
                    if s.read_exact(&mut head).is_err() {
                        break;
                    }
                    let h = SessionHeader::decode(&head).unwrap();
                    let off = (h.addr - SEGMENT_BASE) as usize;
                    if off + h.size as usize > len {
                        s.write_all(&STATUS_REFUSED.to_le_bytes()).unwrap();
                        break;
                    }
                    let range = off..off + h.size as usize;
                    if h.op == Op::Write {
                        s.read_exact(&mut memory[range]).unwrap();
                        s.write_all(&STATUS_OK.to_le_bytes()).unwrap();
                    } else {
                        s.write_all(&STATUS_OK.to_le_bytes()).unwrap();
                        s.write_all(&memory[range]).unwrap();
                    }
                }
            }
            memory
        });
        (port, served)
    }

    #[test]
    fn a_batch_goes_on_after_the_peer_refuses_one_range() {
        let (port, served) = one_peer(1 << 16, usize::MAX);
        // The master says the segment is larger than the peer serves (its process changed).
        let (te, _) = path(1 << 17);
        *te.peer.lock() = Some(Arc::new(PeerDescriptor {
            data_host: "127.0.0.1".into(),
            data_port: port,
            v2: true,
            buffers: vec![(SEGMENT_BASE, 1 << 17)],
        }));
        let (key, grant) = ("k", crate::transfer::grant::Grant::default());
        let write = |offset, value| WriteOp {
            offset,
            value,
            key,
            version: 1,
            grant,
        };
        let out = te.write(&[
            write(0, b"first"),
            write(1 << 16, b"refused"),
            write(8, b""),
        ]);
        assert_eq!(out[0].as_ref().unwrap(), &crc32c::crc32c(b"first"));
        assert!(
            matches!(out[1], Err(TransferError::Remote { .. })),
            "{:?}",
            out[1]
        );
        assert_eq!(out[2].as_ref().unwrap(), &0);
        let mut back = [0u8; 5];
        let mut ops = [ReadOp::new(0, &mut back)];
        assert!(te.read(&mut ops)[0].is_ok());
        assert_eq!(ops[0].crc, Some(crc32c::crc32c(b"first")));
        assert_eq!(&back, b"first");
        drop(te);
        assert_eq!(&served.join().unwrap()[..5], b"first");
    }

    #[test]
    fn a_kept_connection_the_peer_closed_is_replaced_once_by_handshake() {
        use crate::mooncake::handshake::{serve, HandshakeStats, TeEndpoint};
        use crate::transfer::server::ServerOptions;
        let (port, served) = one_peer(1 << 16, 1);
        // The peer's handshake port, answering its descriptor as a wheel process does.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let name = listener.local_addr().unwrap().to_string();
        let endpoint = TeEndpoint {
            name: name.clone(),
            data_host: "127.0.0.1".into(),
            data_port: port,
            base: SEGMENT_BASE,
            len: 1 << 16,
            rdma: None,
        };
        let opts = ServerOptions {
            max_connections: 8,
            max_connections_per_peer: 8,
            idle_timeout: std::time::Duration::from_secs(5),
            request_timeout: std::time::Duration::from_secs(5),
            spin: std::time::Duration::ZERO,
            role: "test",
            auth: None,
            keepalive: None,
        };
        let stats = Arc::new(HandshakeStats::default());
        let mut handshakes = serve(
            listener,
            endpoint,
            (opts, Default::default()),
            stats.clone(),
            None,
        )
        .unwrap();
        let info = SegmentInfo {
            te_endpoint: name,
            te_base: SEGMENT_BASE,
            size: 1 << 16,
            ..Default::default()
        };
        let te = MooncakeTe::new(&info, Discovery::Handshake, ConnOptions::default(), None);
        let op = WriteOp {
            offset: 0,
            value: b"kept",
            key: "k",
            version: 1,
            grant: crate::transfer::grant::Grant::default(),
        };
        assert!(te.write(&[op])[0].is_ok());
        assert_eq!(te.idle.lock().len(), 1, "the connection is kept");
        // The peer closed it after that request: the read goes on a new connection, the
        // descriptor asked for again.
        let mut back = [0u8; 4];
        let mut ops = [ReadOp::new(0, &mut back)];
        let read = te.read(&mut ops);
        assert!(read[0].is_ok(), "{:?}", read[0]);
        assert_eq!(&back, b"kept");
        assert_eq!(stats.served.load(std::sync::atomic::Ordering::Relaxed), 2);
        drop(te);
        served.join().unwrap();
        handshakes.stop();
    }

    #[test]
    fn a_request_is_checked_against_the_segment_and_the_peers_buffers() {
        let (te, peer) = path(1 << 20);
        let h = te.header(&peer, Op::Write, 4096, 512).unwrap();
        assert_eq!((h.addr, h.size, h.v2), (SEGMENT_BASE + 4096, 512, true));
        assert!(te.header(&peer, Op::Read, (1 << 20) - 1, 2).is_err());
        assert!(te.header(&peer, Op::Read, u64::MAX, 2).is_err());
        // The peer serves less than the master says the segment is: refused before sending.
        let small = PeerDescriptor {
            buffers: vec![(SEGMENT_BASE, 4096)],
            ..(*peer).clone()
        };
        assert!(te.header(&small, Op::Read, 4096, 1).is_err());
    }
}
