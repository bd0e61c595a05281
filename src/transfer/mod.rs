//! The transfer core shared by master, store and client: a versioned binary protocol over TCP
//! (`docs/protocol.md`). Frames carry request ids, so several requests can be in flight on one
//! connection; payloads move between sockets and segment or caller memory without copies.

pub mod checked_copy;
pub mod codec;
pub mod frame;
pub mod grant;
pub mod hashing;
pub mod message;
pub mod pool;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod rpc;
pub mod server;
pub mod stamps;
pub mod stream;
pub mod tenant;

pub use frame::{Header, Opcode, Status};
pub use message::Wire;
pub use pool::{ConnOptions, Connection, Pool};
pub use server::Fence;
pub use stream::FramedStream;

/// Errors of the transfer core.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("peer closed the connection")]
    Closed,
    #[error("timed out")]
    Timeout,
    /// Server side: the peer sent nothing for the idle wait between frames.
    #[error("idle for too long")]
    Idle,
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("{status}: {message}")]
    Remote { status: Status, message: String },
    /// An answer from a master of an older leadership epoch than one already heard from.
    #[error(
        "answer from a deposed master (epoch {got}, the leader's is at least {known}); refused"
    )]
    StaleEpoch { got: u64, known: u64 },
    /// The handshake of the cluster secret failed on this side (`crate::auth`).
    #[error("authentication with {addr} failed: {reason}")]
    Auth { addr: String, reason: String },
}

/// A copy for each of several requests that one failure ended (a broken pipelined connection).
/// An `io::Error` is copied as its kind and message.
impl Clone for TransferError {
    fn clone(&self) -> Self {
        let io = |e: &std::io::Error| std::io::Error::new(e.kind(), e.to_string());
        match self {
            TransferError::Io(e) => TransferError::Io(io(e)),
            TransferError::Protocol(m) => TransferError::Protocol(m.clone()),
            TransferError::Closed => TransferError::Closed,
            TransferError::Timeout => TransferError::Timeout,
            TransferError::Idle => TransferError::Idle,
            TransferError::Connect { addr, source } => TransferError::Connect {
                addr: addr.clone(),
                source: io(source),
            },
            TransferError::Remote { status, message } => TransferError::Remote {
                status: *status,
                message: message.clone(),
            },
            TransferError::StaleEpoch { got, known } => TransferError::StaleEpoch {
                got: *got,
                known: *known,
            },
            TransferError::Auth { addr, reason } => TransferError::Auth {
                addr: addr.clone(),
                reason: reason.clone(),
            },
        }
    }
}

impl TransferError {
    /// The remote status, if the peer answered with an error.
    pub fn status(&self) -> Option<Status> {
        match self {
            TransferError::Remote { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// True when the connection can no longer be used (as opposed to an error answer).
    pub fn breaks_connection(&self) -> bool {
        !matches!(self, TransferError::Remote { .. })
    }

    /// True when the master answering may no longer be the leader: it could not be reached,
    /// said it is not the leader, or spoke for an older epoch. Worth finding the leader again.
    pub fn leader_may_have_moved(&self) -> bool {
        match self {
            TransferError::Remote { status, .. } => *status == Status::NotLeader,
            _ => true,
        }
    }

    /// True when the request surely did nothing at a leader (it never reached one, or a
    /// standby or fenced master refused it): safe to send again to the new leader.
    pub fn not_done_by_a_leader(&self) -> bool {
        matches!(
            self,
            TransferError::Connect { .. } | TransferError::StaleEpoch { .. }
        ) || self.status() == Some(Status::NotLeader)
    }
}

/// How payload bytes move between a client and a store. Same-host shared memory is not a
/// transport of its own: a client uses it for any replica on its host, whatever the transport.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Transport {
    #[default]
    Tcp,
    /// RDMA verbs (libibverbs, loaded at run time; the `rdma` cargo feature, on by default).
    /// A build without it refuses it where it is configured, never a silent TCP.
    Rdma,
}

impl Transport {
    /// The transport as flags and logs name it.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
        }
    }

    /// Refuses a transport this build does not carry, naming the setting to change.
    pub fn check_built(self, field: &str) -> Result<(), crate::config::ConfigError> {
        match self {
            Transport::Tcp => Ok(()),
            Transport::Rdma if cfg!(feature = "rdma") => Ok(()),
            Transport::Rdma => Err(crate::config::ConfigError::invalid(
                field,
                "rdma: this build of rbgctl was made without RDMA (cargo feature `rdma`, on by \
                 default: build with `cargo build --release`, not --no-default-features); or set \
                 it to tcp (MOONCAKE_PROTOCOL=tcp, --protocol tcp or protocol = \"tcp\")",
            )),
        }
    }
}

impl std::str::FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tcp" => Ok(Transport::Tcp),
            "rdma" => Ok(Transport::Rdma),
            other => Err(format!("expected tcp or rdma, got {other:?}")),
        }
    }
}

impl TryFrom<String> for Transport {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Transport> for String {
    fn from(t: Transport) -> String {
        t.name().to_string()
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Identifies this machine's kernel: processes with equal ids can share `/dev/shm` files (if
/// their mount namespaces allow, which the segment token then proves).
pub fn local_host_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// TCP keepalive on `stream`: the kernel probes it after `idle` without traffic, then every
/// fifth of that (at least a second), and ends it after five probes go unanswered, so a peer
/// that vanished (its host down, a partition) ends the connection within about twice `idle`
/// without either side sending anything.
pub fn keep_alive(stream: &std::net::TcpStream, idle: std::time::Duration) -> std::io::Result<()> {
    let every = (idle / 5).max(std::time::Duration::from_secs(1));
    let probes = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(every)
        .with_retries(5);
    socket2::SockRef::from(stream).set_tcp_keepalive(&probes)
}
