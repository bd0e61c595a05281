//! The client's one error type. It is `Clone`: a batch repeats one shared failure (the master
//! unreachable, say) for each of its items, and each copy keeps its kind and its cause.

use crate::config::ConfigError;
use crate::transfer::tenant::Shown;
use crate::transfer::{Status, TransferError};
use std::sync::Arc;

/// Why a client call failed: what it says names the key, store or setting to look at.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ClientError {
    #[error("key {} not found", Shown(.0))]
    NotFound(String),
    #[error("master {addr}: {source}")]
    Master {
        addr: String,
        source: Arc<TransferError>,
    },
    #[error("store {endpoint}: {source}")]
    Store {
        endpoint: String,
        source: Arc<TransferError>,
    },
    #[error("{status}: {message}")]
    Rejected { status: Status, message: String },
    #[error("{}: checksum mismatch on every readable replica", Shown(.key))]
    Checksum { key: String },
    #[error("{}: buffer of {got} bytes is smaller than the value ({needed} bytes)", Shown(.key))]
    BufferTooSmall {
        key: String,
        needed: u64,
        got: usize,
    },
    #[error("{}: no replica could be read ({last})", Shown(.key))]
    Unreadable { key: String, last: String },
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error(transparent)]
    Config(Arc<ConfigError>),
    #[error("embedded store: {0}")]
    EmbeddedStore(Arc<crate::store::StoreError>),
}

impl ClientError {
    /// The protocol status behind the error, when the master or store answered with one.
    pub fn status(&self) -> Option<Status> {
        match self {
            ClientError::NotFound(_) => Some(Status::ObjectNotFound),
            ClientError::Rejected { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Names `key` in a not-found error (the master's answer carries a message, not the key).
    pub(crate) fn for_key(self, key: &str) -> ClientError {
        match self {
            ClientError::NotFound(_) => ClientError::NotFound(key.into()),
            other => other,
        }
    }

    /// A failure talking to the master; an error answer keeps its status.
    pub(crate) fn from_master(addr: &str, e: TransferError) -> ClientError {
        match e {
            TransferError::Remote {
                status: Status::ObjectNotFound,
                message,
            } => ClientError::NotFound(message),
            TransferError::Remote { status, message } => ClientError::Rejected { status, message },
            source => ClientError::Master {
                addr: addr.to_string(),
                source: Arc::new(source),
            },
        }
    }

    /// A failure moving bytes to or from a store; an error answer keeps its status.
    pub(crate) fn from_store(endpoint: &str, e: TransferError) -> ClientError {
        match e {
            TransferError::Remote { status, message } => ClientError::Rejected { status, message },
            source => ClientError::Store {
                endpoint: endpoint.to_string(),
                source: Arc::new(source),
            },
        }
    }

    /// The per-item answer `status` for `key` as a result.
    pub(crate) fn check_status(status: Status, key: &str) -> Result<(), ClientError> {
        match status {
            Status::Ok => Ok(()),
            Status::ObjectNotFound => Err(ClientError::NotFound(key.into())),
            s => Err(ClientError::Rejected {
                status: s,
                message: format!("{}: {}", Shown(key), s.describe()),
            }),
        }
    }
}

impl From<ConfigError> for ClientError {
    fn from(e: ConfigError) -> Self {
        ClientError::Config(Arc::new(e))
    }
}

impl From<crate::store::StoreError> for ClientError {
    fn from(e: crate::store::StoreError) -> Self {
        ClientError::EmbeddedStore(Arc::new(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_master_failure_keeps_its_kind_in_every_copy() {
        let e = ClientError::from_master(
            "10.0.0.1:50051",
            TransferError::Connect {
                addr: "10.0.0.1:50051".into(),
                source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
            },
        );
        let copies = vec![e.clone(), e];
        for c in &copies {
            assert!(
                matches!(c, ClientError::Master { addr, .. } if addr == "10.0.0.1:50051"),
                "{c:?}"
            );
            assert!(std::error::Error::source(c).is_some(), "the cause is kept");
        }
    }

    #[test]
    fn error_answers_keep_their_status() {
        let e = ClientError::from_master(
            "m:1",
            TransferError::Remote {
                status: Status::NoSpace,
                message: "full".into(),
            },
        );
        assert_eq!(e.status(), Some(Status::NoSpace));
        assert!(matches!(
            ClientError::check_status(Status::ObjectNotFound, "k"),
            Err(ClientError::NotFound(k)) if k == "k"
        ));
    }
}
