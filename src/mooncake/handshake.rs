//! How Mooncake's clients find a store's Transfer Engine endpoint: the segment descriptor (the
//! JSON a client reads from the HTTP metadata server under `mooncake/ram/<name>`, with
//! `mooncake/rpc_meta/<name>` for clients older than `tcp_data_host`) and the P2P handshake,
//! in which a client connects to the port in the segment's name, sends its own descriptor and
//! reads the store's.
//!
//! A handshake frame is a u64 LE length (the type byte and the JSON), a type byte and the
//! JSON. The store answers a Metadata frame (1) with its own descriptor, a Connection (0) of
//! Mooncake's RDMA transport with the QPs it made for the peer (when it serves RDMA), a Probe
//! (3) or Notify (2) as Mooncake does, and closes.

use crate::transfer::server::{self, ConnCounters, ServerHandle, ServerOptions};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Largest handshake frame taken (Mooncake's own default limit, `MC_HANDSHAKE_MAX_LENGTH`).
pub const MAX_FRAME: u64 = 1 << 20;
/// The Metadata exchange's type byte.
pub const METADATA: u8 = 1;
/// Notify: a message for the engine's user (answered, not kept: nothing in rbgctl reads them).
pub const NOTIFY: u8 = 2;
/// Probe: whether the engine is there.
pub const PROBE: u8 = 3;
/// Handshakes served at once (per address: a quarter).
const MAX_AT_ONCE: usize = 64;
/// A handshake's bytes must all come within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A store's Transfer Engine endpoint, as Mooncake's clients see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TeEndpoint {
    /// The segment's name for Mooncake: `host:handshake_port`, which resolves both through a
    /// handshake and through the metadata server.
    pub name: String,
    /// The address of the transfer (data) port.
    pub data_host: String,
    pub data_port: u16,
    /// The segment's first address and its length.
    pub base: u64,
    pub len: u64,
    /// Served by Mooncake's RDMA transport (not TCP): its `rdma` descriptor.
    pub rdma: Option<super::rdma::Descriptor>,
}

impl TeEndpoint {
    /// The endpoint of a segment whose store serves the Transfer Engine, as it mounted it.
    pub fn of(seg: &crate::transfer::message::SegmentInfo) -> Option<TeEndpoint> {
        if seg.te_endpoint.is_empty() {
            return None;
        }
        let (host, _) = seg.te_endpoint.rsplit_once(':')?;
        Some(TeEndpoint {
            name: seg.te_endpoint.clone(),
            data_host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            data_port: u16::try_from(seg.te_data_port).ok()?,
            base: seg.te_base,
            len: seg.size,
            rdma: None,
        })
    }

    /// The segment descriptor, as Mooncake's `TransferMetadata` encodes one for `tcp` (or
    /// `rdma`).
    pub fn descriptor(&self) -> serde_json::Value {
        if let Some(rdma) = &self.rdma {
            return rdma.to_json();
        }
        serde_json::json!({
            "buffers": [{"addr": self.base, "length": self.len, "name": self.name}],
            "name": self.name,
            "protocol": "tcp",
            "rdma_server_name": "",
            "tcp_data_host": self.data_host,
            "tcp_data_port": self.data_port,
            "tcp_proto_version": 2,
            "timestamp": chrono::Utc::now().format("%Y-%m-%d %H:%M:%S%.6f").to_string(),
        })
    }

    /// `mooncake/rpc_meta/<name>`: where older clients look for the data host.
    pub fn rpc_meta(&self) -> serde_json::Value {
        let port = self
            .name
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .unwrap_or(0);
        serde_json::json!({"ip_or_host_name": self.data_host, "rpc_port": port})
    }

    /// The metadata server's keys and values for this endpoint.
    pub fn metadata_entries(&self) -> [(String, serde_json::Value); 2] {
        [
            (format!("mooncake/ram/{}", self.name), self.descriptor()),
            (format!("mooncake/rpc_meta/{}", self.name), self.rpc_meta()),
        ]
    }
}

/// A handshake frame of `kind` carrying `json`.
pub fn frame(kind: u8, json: &serde_json::Value) -> Vec<u8> {
    let mut text = json.to_string();
    // jsoncpp's FastWriter ends its output with a newline; Mooncake's peers send one.
    text.push('\n');
    let mut out = Vec::with_capacity(9 + text.len());
    out.extend_from_slice(&(1 + text.len() as u64).to_le_bytes());
    out.push(kind);
    out.extend_from_slice(text.as_bytes());
    out
}

/// Why a P2P handshake was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("handshake frame of {0} bytes (at most {MAX_FRAME}; 0 is not a frame)")]
    Length(u64),
    #[error("handshake type {0} not served (Metadata 1, Probe 3, Notify 2, and Connection 0 where RDMA is served)")]
    Kind(u8),
    #[error("handshake body is not JSON: {0}")]
    Json(String),
    #[error("Connection refused: {0}")]
    Refused(String),
    #[error("the peer's segment descriptor will not do: {0}")]
    Descriptor(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Reads one frame: its type and JSON.
pub fn read_frame(r: &mut impl Read) -> Result<(u8, serde_json::Value), HandshakeError> {
    let mut len = [0u8; 8];
    r.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len == 0 || len > MAX_FRAME {
        return Err(HandshakeError::Length(len));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    let json =
        serde_json::from_slice(&body[1..]).map_err(|e| HandshakeError::Json(e.to_string()))?;
    Ok((body[0], json))
}

/// What a peer's descriptor says of its Transfer Engine, as a client needs it: where its TCP
/// data port is, whether it answers status frames (protocol v2), and which address ranges it
/// serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerDescriptor {
    pub data_host: String,
    pub data_port: u16,
    pub v2: bool,
    /// Each buffer's first address and length.
    pub buffers: Vec<(u64, u64)>,
}

impl PeerDescriptor {
    /// Reads a `tcp` segment descriptor; `name` is the segment's name, whose host stands in
    /// for a missing `tcp_data_host` (in P2P mode the two are the same address).
    pub fn parse(name: &str, d: &serde_json::Value) -> Result<PeerDescriptor, HandshakeError> {
        let bad = |what: &str| HandshakeError::Descriptor(format!("{what} (from {name})"));
        if d["protocol"] != "tcp" {
            return Err(bad(&format!(
                "its protocol is {}, not tcp (a Mooncake segment served by RDMA is reached \
                 with the client's transport rdma: MOONCAKE_PROTOCOL=rdma and MOONCAKE_DEVICE)",
                d["protocol"]
            )));
        }
        let data_port = d["tcp_data_port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .filter(|&p| p != 0)
            .ok_or_else(|| bad("no tcp_data_port"))?;
        let data_host = match d["tcp_data_host"].as_str() {
            Some(h) if !h.is_empty() => h.to_string(),
            _ => name
                .rsplit_once(':')
                .map_or(name, |(h, _)| h)
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        };
        let buffers = d["buffers"]
            .as_array()
            .ok_or_else(|| bad("no buffers"))?
            .iter()
            .filter_map(|b| Some((b["addr"].as_u64()?, b["length"].as_u64()?)))
            .collect();
        Ok(PeerDescriptor {
            data_host,
            data_port,
            v2: d["tcp_proto_version"].as_u64().unwrap_or(1) >= 2,
            buffers,
        })
    }

    /// Whether one of its buffers holds all of `[addr, addr + len)`.
    pub fn covers(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.buffers
            .iter()
            .any(|&(a, l)| a <= addr && a.checked_add(l).is_some_and(|e| end <= e))
    }

    /// `host:port` of the data port.
    pub fn data_addr(&self) -> String {
        if self.data_host.contains(':') {
            format!("[{}]:{}", self.data_host, self.data_port)
        } else {
            format!("{}:{}", self.data_host, self.data_port)
        }
    }
}

/// A P2P handshake as a client: connects to the handshake port in `name` (`host:port`),
/// sends `own` (this side's descriptor) and reads the peer's, all within `timeout`.
pub fn exchange(
    name: &str,
    own: &serde_json::Value,
    timeout: Duration,
) -> Result<serde_json::Value, HandshakeError> {
    use std::net::ToSocketAddrs;
    let addr = name
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| HandshakeError::Descriptor(format!("{name} resolves to no address")))?;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(&frame(METADATA, own))?;
    let (kind, json) = read_frame(&mut stream)?;
    if kind != METADATA {
        return Err(HandshakeError::Kind(kind));
    }
    Ok(json)
}

/// Handshakes served and refused, for `/metrics` (their connections are counted by the
/// port's admission, `ConnCounters`).
#[derive(Debug, Default)]
pub struct HandshakeStats {
    pub served: AtomicU64,
    pub refused: AtomicU64,
}

/// The admission of a handshake port, over a store's `opts`: few at once (one exchange each,
/// then closed), each done within [`HANDSHAKE_TIMEOUT`].
pub fn port_options(opts: ServerOptions) -> ServerOptions {
    ServerOptions {
        max_connections: MAX_AT_ONCE,
        max_connections_per_peer: MAX_AT_ONCE / 4,
        idle_timeout: HANDSHAKE_TIMEOUT,
        request_timeout: HANDSHAKE_TIMEOUT,
        ..opts
    }
}

/// What answers Connection handshakes of Mooncake's RDMA transport.
pub trait Connections: Send + Sync {
    /// The reply to `req`, sent from `from`: the QPs made for it, or a `reply_msg` refusing it.
    fn connect(
        &self,
        req: &super::rdma::Connection,
        from: std::net::IpAddr,
    ) -> super::rdma::Connection;
}

/// Answers handshakes on `listener` with `endpoint`'s descriptor (and Connections with
/// `rdma`), under rbgctl's admission.
pub fn serve(
    listener: TcpListener,
    endpoint: TeEndpoint,
    (opts, counters): (ServerOptions, Arc<ConnCounters>),
    stats: Arc<HandshakeStats>,
    rdma: Option<Arc<dyn Connections>>,
) -> std::io::Result<ServerHandle> {
    let endpoint = Arc::new(endpoint);
    server::spawn_foreign(listener, opts, counters, move |mut stream, peer, _place| {
        match answer(&mut stream, &endpoint, rdma.as_deref(), peer.ip()) {
            Ok(()) => stats.served.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                tracing::warn!(%peer, error = %e, "Mooncake handshake refused");
                stats.refused.fetch_add(1, Ordering::Relaxed)
            }
        };
    })
}

fn answer(
    stream: &mut std::net::TcpStream,
    endpoint: &TeEndpoint,
    rdma: Option<&dyn Connections>,
    from: std::net::IpAddr,
) -> Result<(), HandshakeError> {
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let (kind, json) = read_frame(stream)?;
    let reply = match (kind, rdma) {
        // The peer's own descriptor is not needed: Mooncake ignores it too.
        (METADATA, _) => endpoint.descriptor(),
        (super::rdma::CONNECTION, rdma) => {
            let req = super::rdma::Connection::parse(&json);
            match (req, rdma) {
                (Ok(req), Some(rdma)) => rdma.connect(&req, from).to_json(),
                // Told why, as Mooncake tells its peers, before the refusal is counted.
                (req, _) => {
                    let why = match req {
                        Err(e) => e.to_string(),
                        Ok(_) => "this store serves Mooncake's TCP transport, not RDMA (start \
                                  it with protocol rdma)"
                            .into(),
                    };
                    let refusal = serde_json::json!({"qp_num": [], "reply_msg": why});
                    stream.write_all(&frame(kind, &refusal))?;
                    return Err(HandshakeError::Refused(why));
                }
            }
        }
        (PROBE, _) => serde_json::json!({"status": "success"}),
        (NOTIFY, _) => serde_json::json!({"name": "", "notify_msg": "success"}),
        _ => return Err(HandshakeError::Kind(kind)),
    };
    stream.write_all(&frame(kind, &reply))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint() -> TeEndpoint {
        TeEndpoint {
            name: "127.0.0.1:15001".into(),
            data_host: "127.0.0.1".into(),
            data_port: 15002,
            base: super::super::te_tcp::SEGMENT_BASE,
            len: 64 << 20,
            rdma: None,
        }
    }

    #[test]
    fn frames_read_back_and_bound_their_length() {
        let d = endpoint().descriptor();
        let f = frame(METADATA, &d);
        assert_eq!(
            u64::from_le_bytes(f[..8].try_into().unwrap()),
            f.len() as u64 - 8
        );
        assert_eq!(*f.last().unwrap(), b'\n');
        let (kind, back) = read_frame(&mut &f[..]).unwrap();
        assert_eq!((kind, back), (METADATA, d));
        let huge = (1u64 << 30).to_le_bytes();
        assert!(matches!(
            read_frame(&mut &huge[..]),
            Err(HandshakeError::Length(_))
        ));
    }

    #[test]
    fn a_peers_descriptor_gives_its_data_port_and_what_it_covers() {
        let e = endpoint();
        let p = PeerDescriptor::parse(&e.name, &e.descriptor()).unwrap();
        assert_eq!(p.data_addr(), "127.0.0.1:15002");
        assert!(p.v2);
        assert!(p.covers(e.base, e.len));
        assert!(p.covers(e.base + 4096, 4096));
        assert!(!p.covers(e.base + e.len - 1, 2));
        assert!(!p.covers(e.base - 1, 1));
        assert!(!p.covers(u64::MAX, 2));
        // An older peer: no data host (the name's stands in), protocol v1.
        let old = serde_json::json!({"protocol": "tcp", "tcp_data_port": 16001,
            "buffers": [{"addr": 4096, "length": 8192, "name": "h"}]});
        let p = PeerDescriptor::parse("[::1]:15001", &old).unwrap();
        assert_eq!(p.data_addr(), "[::1]:16001");
        assert!(!p.v2);
        for bad in [
            serde_json::json!({"protocol": "rdma", "tcp_data_port": 1, "buffers": []}),
            serde_json::json!({"protocol": "tcp", "buffers": []}),
            serde_json::json!({"protocol": "tcp", "tcp_data_port": 70000, "buffers": []}),
            serde_json::json!({"protocol": "tcp", "tcp_data_port": 1}),
        ] {
            let e = PeerDescriptor::parse("h:1", &bad).unwrap_err().to_string();
            assert!(e.contains("h:1"), "{e}");
        }
    }

    #[test]
    fn the_descriptor_has_what_mooncakes_decoder_needs() {
        let d = endpoint().descriptor();
        assert_eq!(d["protocol"], "tcp");
        assert_eq!(d["tcp_proto_version"], 2);
        assert_eq!(d["tcp_data_port"], 15002);
        assert_eq!(d["buffers"][0]["name"], "127.0.0.1:15001");
        assert!(d["buffers"][0]["addr"].as_u64().unwrap() > 0);
        assert_eq!(endpoint().rpc_meta()["rpc_port"], 15001);
    }
}
