//! The transfer core shared by master, store and client: a versioned binary protocol over TCP
//! (`docs/protocol.md`). Frames carry request ids, so several requests can be in flight on one
//! connection; payloads move between sockets and segment or caller memory without copies.

pub mod codec;
pub mod frame;
pub mod message;
pub mod pool;
pub mod server;
pub mod stream;

pub use frame::{Header, Opcode, Status};
pub use message::Wire;
pub use pool::{ConnOptions, Connection, Pool};
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
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("{status}: {message}")]
    Remote { status: Status, message: String },
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
}

/// Identifies this machine's kernel: processes with equal ids can share `/dev/shm` files (if
/// their mount namespaces allow, which the segment token then proves).
pub fn local_host_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
