//! Bytes over TCP: a batch is pipelined on a pooled connection to the store, in windows of
//! [`WINDOW`] requests, payloads sent straight from the caller's buffers (vectored writes) and
//! received straight into them, checksummed as they go (`WRITE_CHECKED`: the CRC-32C follows
//! the bytes, and the store checks it) and as they arrive.
//!
//! A batch of several megabytes goes over several connections at once ([`lanes`]): one stream
//! is bound by the one core that copies it on each side (the kernel's copy into and out of the
//! socket, the checksum), and the store serves each connection on a thread of its own, so a
//! batch of KV-cache pages spread over a few lanes moves at a multiple of one stream's speed.

use super::{DataPath, PathKind, ReadOp, WriteOp};
use crate::transfer::message::{ReadReq, ReadVersionReq, WriteReq};
use crate::transfer::{Connection, Opcode, Pool, Status, TransferError, Wire};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Most requests in flight on one connection.
pub const WINDOW: usize = 128;

/// Fewest bytes of a batch that are worth a lane of their own: below this, starting a thread
/// and a second stream costs more than it saves.
const LANE_BYTES: u64 = 2 << 20;
/// Most connections one batch uses at once.
const MAX_LANES: usize = 4;

/// Splits a batch (the sizes of its operations, in order) into contiguous runs, one per lane:
/// as many lanes as there are [`LANE_BYTES`] in it, at most [`MAX_LANES`] and at most one per
/// operation, each run closing once it holds its share of the bytes.
fn lanes(sizes: &[u64]) -> Vec<std::ops::Range<usize>> {
    let total: u64 = sizes.iter().sum();
    let count = ((total / LANE_BYTES) as usize).clamp(1, MAX_LANES.min(sizes.len().max(1)));
    let share = total.div_ceil(count as u64);
    let mut runs = Vec::with_capacity(count);
    let (mut start, mut bytes) = (0, 0u64);
    for (j, size) in sizes.iter().enumerate() {
        bytes += size;
        let ops_left = sizes.len() - j - 1;
        let lanes_left = count - runs.len() - 1;
        if (bytes >= share || ops_left == lanes_left) && lanes_left > 0 {
            runs.push(start..j + 1);
            (start, bytes) = (j + 1, 0);
        }
    }
    runs.push(start..sizes.len());
    runs
}

/// Runs `lane` on each of `parts` at once, the first on this thread and the others on scoped
/// threads, and answers their results in order. A lane no thread can be started for runs on
/// this thread too, after the first.
fn in_lanes<P: Send, R: Send>(mut parts: Vec<P>, lane: impl Fn(P) -> Vec<R> + Sync) -> Vec<R> {
    // One lane (every small batch): on this thread, with no scope or slots to set up.
    if parts.len() <= 1 {
        return parts.pop().map(lane).unwrap_or_default();
    }
    let slots: Vec<parking_lot::Mutex<Option<P>>> = parts
        .into_iter()
        .map(|p| parking_lot::Mutex::new(Some(p)))
        .collect();
    let run = |i: usize| slots[i].lock().take().map(&lane).unwrap_or_default();
    let run = &run;
    std::thread::scope(|scope| {
        let others: Vec<_> = (1..slots.len())
            .map(|i| {
                std::thread::Builder::new()
                    .name("tcp-lane".into())
                    .spawn_scoped(scope, move || run(i))
            })
            .collect();
        let mut out = run(0);
        for (i, spawned) in (1..).zip(others) {
            out.extend(match spawned {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot start a TCP lane's thread; running it here");
                    run(i)
                }
            });
        }
        out
    })
}

/// The TCP data path to a store: pipelined requests on pooled connections.
pub struct Tcp {
    pool: Arc<Pool>,
    /// The store answered `UNKNOWN_OPCODE` to a checked write (it predates them): plain
    /// writes, checksummed before they are sent.
    plain_writes: AtomicBool,
    /// The store answered `UNKNOWN_OPCODE` to a version-checked read: no cached locations.
    no_version_reads: AtomicBool,
}

impl Tcp {
    /// TCP transfers through `pool`'s connections.
    pub fn new(pool: Arc<Pool>) -> Tcp {
        Tcp {
            pool,
            plain_writes: AtomicBool::new(false),
            no_version_reads: AtomicBool::new(false),
        }
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

    /// A batch's writes pipelined on one connection.
    fn write_lane(&self, ops: &[WriteOp<'_>]) -> Vec<Result<u32, TransferError>> {
        let req = |op: &WriteOp<'_>, checksum: u32| WriteReq {
            offset: op.offset,
            key: op.key.to_string(),
            version: op.version,
            checksum,
            grant: op.grant,
        };
        if !self.plain_writes.load(Ordering::Relaxed) {
            let mut crcs = vec![0u32; ops.len()];
            let out = self.pipeline(
                ops.len(),
                |conn, j| {
                    let meta = req(&ops[j], 0).to_meta();
                    let (id, crc) = conn.send_checked(Opcode::WriteChecked, &meta, ops[j].value)?;
                    crcs[j] = crc;
                    Ok(id)
                },
                |conn, _, id| conn.recv(id).map(|_| ()),
            );
            let unknown = out.iter().any(|r| {
                matches!(r, Err(TransferError::Remote { status, .. }) if *status == Status::UnknownOpcode)
            });
            if !unknown {
                return out
                    .into_iter()
                    .zip(crcs)
                    .map(|(r, c)| r.map(|()| c))
                    .collect();
            }
            // A store from before checked writes: checksum first, then plain writes.
            tracing::info!(
                store = %self.pool.addr(),
                "the store does not know WRITE_CHECKED; writing to it with WRITE"
            );
            self.plain_writes.store(true, Ordering::Relaxed);
        }
        let crcs: Vec<u32> = ops
            .iter()
            .map(|op| crate::checksum::crc32c(op.value))
            .collect();
        let out = self.pipeline(
            ops.len(),
            |conn, j| {
                let meta = req(&ops[j], crcs[j]).to_meta();
                conn.send(Opcode::Write, &meta, &[ops[j].value])
            },
            |conn, _, id| conn.recv(id).map(|_| ()),
        );
        out.into_iter()
            .zip(crcs)
            .map(|(r, c)| r.map(|()| c))
            .collect()
    }

    /// A batch's reads pipelined on one connection.
    fn read_lane(&self, ops: &mut [ReadOp<'_>]) -> Vec<Result<(), TransferError>> {
        let reqs: Vec<(Opcode, Vec<u8>)> = ops
            .iter()
            .map(|op| {
                let (offset, length) = (op.offset, op.dst.len() as u64);
                match op.version {
                    Some(version) => (
                        Opcode::ReadVersion,
                        ReadVersionReq {
                            offset,
                            length,
                            version,
                        }
                        .to_meta(),
                    ),
                    None => (Opcode::Read, ReadReq { offset, length }.to_meta()),
                }
            })
            .collect();
        let out = self.pipeline(
            ops.len(),
            |conn, j| conn.send(reqs[j].0, &reqs[j].1, &[]),
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
        );
        if out.iter().any(|r| {
            matches!(r, Err(TransferError::Remote { status, .. }) if *status == Status::UnknownOpcode)
        }) && ops.iter().any(|op| op.version.is_some())
        {
            tracing::info!(store = %self.pool.addr(),
                "the store does not know READ_VERSION; reading it through the master");
            self.no_version_reads.store(true, Ordering::Relaxed);
        }
        out
    }
}

impl DataPath for Tcp {
    fn kind(&self) -> PathKind {
        PathKind::Tcp
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> Vec<Result<u32, TransferError>> {
        let sizes: Vec<u64> = ops.iter().map(|op| op.value.len() as u64).collect();
        let parts: Vec<&[WriteOp<'_>]> = lanes(&sizes).into_iter().map(|r| &ops[r]).collect();
        in_lanes(parts, |part| self.write_lane(part))
    }

    fn checks_versions(&self) -> bool {
        !self.no_version_reads.load(Ordering::Relaxed)
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> Vec<Result<(), TransferError>> {
        let sizes: Vec<u64> = ops.iter().map(|op| op.dst.len() as u64).collect();
        let mut parts = Vec::new();
        let mut rest = ops;
        for run in lanes(&sizes) {
            let (part, tail) = rest.split_at_mut(run.len());
            parts.push(part);
            rest = tail;
        }
        in_lanes(parts, |part| self.read_lane(part))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::server::{
        self, ConnCounters, Handled, Handling, ServerIo, ServerOptions, Service,
    };
    use crate::transfer::ConnOptions;
    use parking_lot::Mutex;
    use std::time::Duration;

    /// A batch is split into at most four contiguous lanes of about equal bytes, one per 2 MiB,
    /// never an empty one; a small batch stays on one connection.
    #[test]
    fn a_batch_is_split_into_lanes_of_about_equal_bytes() {
        const K: u64 = 1024;
        assert_eq!(lanes(&[]), vec![0..0]);
        assert_eq!(lanes(&[4 * K]), vec![0..1]);
        assert_eq!(lanes(&[64 << 20]), vec![0..1], "one value, one lane");
        assert_eq!(lanes(&[1 << 20; 3]), vec![0..3], "3 MiB: one lane");
        assert_eq!(lanes(&[1 << 20; 4]), vec![0..2, 2..4]);
        assert_eq!(
            lanes(&[256 * K; 32]),
            vec![0..8, 8..16, 16..24, 24..32],
            "32 x 256 KiB: four lanes of 2 MiB"
        );
        assert_eq!(lanes(&[1 << 20; 40]).len(), 4, "at most four");
        let uneven = lanes(&[6 << 20, 1, 1, 1]);
        assert_eq!(uneven, vec![0..1, 1..3, 3..4], "the big value alone");
        for sizes in [vec![3 << 20, 100, 5 << 20, 7], vec![512 * K; 17]] {
            let runs = lanes(&sizes);
            assert_eq!(runs.first().unwrap().start, 0);
            assert_eq!(runs.last().unwrap().end, sizes.len());
            assert!(runs
                .windows(2)
                .all(|w| w[0].end == w[1].start && !w[0].is_empty()));
        }
    }

    /// Lanes run at once and their results come back in the order of their parts.
    #[test]
    fn lanes_answer_in_order() {
        let parts: Vec<Vec<u32>> = vec![vec![1, 2], vec![3], vec![], vec![4, 5, 6]];
        let threads = parking_lot::Mutex::new(std::collections::HashSet::new());
        let out = in_lanes(parts, |part| {
            threads.lock().insert(std::thread::current().id());
            part.into_iter().map(|x| x * 10).collect()
        });
        assert_eq!(out, vec![10, 20, 30, 40, 50, 60]);
        assert_eq!(threads.lock().len(), 4, "each lane on a thread of its own");
    }

    /// A store from before checked writes: WRITE only, remembering what it was sent.
    #[derive(Default)]
    struct OldStore {
        written: Mutex<Vec<(u64, u32, Vec<u8>)>>,
        conns: ConnCounters,
    }

    impl Service for OldStore {
        fn handle(&self, op: Opcode, meta: &[u8], io: &mut ServerIo<'_>) -> Handling {
            if op != Opcode::Write {
                io.discard_data()?;
                io.error(Status::UnknownOpcode, "not known here")?;
                return Ok(Handled::Answered);
            }
            let r = WriteReq::from_meta(meta)?;
            let mut bytes = vec![0; io.data_len() as usize];
            io.read_data_into(&mut bytes)?;
            self.written.lock().push((r.offset, r.checksum, bytes));
            io.reply(Status::Ok, &[], &[])?;
            Ok(Handled::Answered)
        }
        fn max_data_len(&self) -> u64 {
            1 << 20
        }
        fn connections(&self) -> &ConnCounters {
            &self.conns
        }
    }

    #[test]
    fn a_store_without_checked_writes_gets_plain_ones_with_the_checksum_first() {
        let old = Arc::new(OldStore::default());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let opts = ServerOptions {
            max_connections: 8,
            max_connections_per_peer: 8,
            idle_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            spin: Duration::ZERO,
            role: "old-store",
            auth: None,
            keepalive: None,
        };
        let server = server::spawn(listener, old.clone(), opts).unwrap();
        let pool = Arc::new(Pool::new(server.addr.to_string(), ConnOptions::default()));
        let tcp = Tcp::new(pool);
        let value = b"a value for a store from before checked writes".to_vec();
        let op = |offset| WriteOp {
            offset,
            value: &value,
            key: "k",
            version: 1,
            grant: Default::default(),
        };
        for offset in [0, 4096] {
            let crc = tcp.write(&[op(offset)]).pop().unwrap().unwrap();
            assert_eq!(crc, crc32c::crc32c(&value));
        }
        assert!(tcp.plain_writes.load(Ordering::Relaxed));
        let written = old.written.lock();
        assert_eq!(written.len(), 2, "each write arrived once, as WRITE");
        for (offset, (at, checksum, bytes)) in [0, 4096].into_iter().zip(written.iter()) {
            assert_eq!(
                (*at, *checksum, bytes),
                (offset, crc32c::crc32c(&value), &value)
            );
        }
    }
}
