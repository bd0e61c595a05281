//! Bytes over TCP: each batch is pipelined on one pooled connection to the store, in windows of
//! [`WINDOW`] requests, payloads sent straight from the caller's buffers (vectored writes) and
//! received straight into them, checksummed as they arrive.

use super::{DataPath, PathKind, ReadOp, WriteOp};
use crate::transfer::message::{ReadReq, WriteReq};
use crate::transfer::{Connection, Opcode, Pool, TransferError, Wire};
use std::sync::Arc;

/// Most requests in flight on one connection.
pub const WINDOW: usize = 128;

pub struct Tcp {
    pool: Arc<Pool>,
}

impl Tcp {
    pub fn new(pool: Arc<Pool>) -> Tcp {
        Tcp { pool }
    }

    /// Runs a batch: `send(conn, j)` sends operation `j` and returns its request id,
    /// `recv(conn, j, id)` takes its reply. A reused connection that fails before any reply
    /// (the store restarted since it was pooled) is replaced once by a fresh one.
    fn pipeline(
        &self,
        n: usize,
        mut send: impl FnMut(&mut Connection, usize) -> Result<u64, TransferError>,
        mut recv: impl FnMut(&mut Connection, usize, u64) -> Result<(), TransferError>,
    ) -> Vec<Result<(), TransferError>> {
        let mut out = Vec::with_capacity(n);
        if n == 0 {
            return out;
        }
        let mut conn = match self.pool.get() {
            Ok(c) => c,
            Err(e) => return vec![Err(e); n],
        };
        let mut retried = false;
        while out.len() < n {
            let start = out.len();
            let end = (start + WINDOW).min(n);
            let mut ids = Vec::with_capacity(end - start);
            let mut broken = None;
            for j in start..end {
                match send(&mut conn, j) {
                    Ok(id) => ids.push(id),
                    Err(e) => {
                        broken = Some(e);
                        break;
                    }
                }
            }
            if broken.is_none() {
                for (k, id) in ids.into_iter().enumerate() {
                    match recv(&mut conn, start + k, id) {
                        Err(e) if e.breaks_connection() => {
                            broken = Some(e);
                            break;
                        }
                        r => out.push(r),
                    }
                }
            }
            let Some(e) = broken else { continue };
            // A peer that closed a pooled connection answers at once (reset, EOF); a timeout
            // means it is unreachable, and a fresh connection would only wait again.
            let timed_out = matches!(&e, TransferError::Timeout | TransferError::Idle)
                || matches!(&e, TransferError::Io(io) if matches!(
                    io.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                ));
            let stale = start == 0 && out.is_empty() && conn.is_reused() && !retried && !timed_out;
            if stale {
                if let Ok(fresh) = self.pool.get_fresh() {
                    self.pool.clear();
                    conn = fresh;
                    retried = true;
                    continue;
                }
            }
            // The connection is unusable: whatever has no answer yet fails with its error.
            self.pool.clear();
            out.resize(n, Err(e));
            return out;
        }
        conn.release();
        out
    }
}

impl DataPath for Tcp {
    fn kind(&self) -> PathKind {
        PathKind::Tcp
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> Vec<Result<(), TransferError>> {
        self.pipeline(
            ops.len(),
            |conn, j| {
                let op = &ops[j];
                let req = WriteReq {
                    offset: op.offset,
                    key: op.key.to_string(),
                    version: op.version,
                    checksum: op.checksum,
                };
                conn.send(Opcode::Write, &req.to_meta(), &[op.value])
            },
            |conn, _, id| conn.recv(id).map(|_| ()),
        )
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> Vec<Result<(), TransferError>> {
        let reqs: Vec<ReadReq> = ops
            .iter()
            .map(|op| ReadReq {
                offset: op.offset,
                length: op.dst.len() as u64,
            })
            .collect();
        self.pipeline(
            ops.len(),
            |conn, j| conn.send(Opcode::Read, &reqs[j].to_meta(), &[]),
            |conn, j, id| {
                let op = &mut ops[j];
                let (header, _) = conn.recv(id)?;
                if header.data_len != op.dst.len() as u64 {
                    return Err(TransferError::Protocol(format!(
                        "store sent {} bytes, expected {}",
                        header.data_len,
                        op.dst.len()
                    )));
                }
                op.crc = Some(conn.io.read_data_into_crc(op.dst)?);
                Ok(())
            },
        )
    }
}
