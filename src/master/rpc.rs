//! The master's RPC service: decodes each request, applies it to the state under one lock, and
//! answers. Batch requests take the lock once for the whole batch. `dispatch` is a table from
//! opcode to handler; each handler, named as its opcode, decodes and answers through the
//! opcode's declaration (`transfer::rpc`) and says how it served the request (`Served`).

use super::lock::{StateGuard, StateLock};
use super::notifier::Notifier;
use super::state::{Binding, MasterState, OpResult};
use crate::telemetry::OpStats;
use crate::transfer::grant::GrantKey;
use crate::transfer::message::*;
use crate::transfer::rpc::{self, Rpc};
use crate::transfer::server::{HandOn, Handled, Handling, ServerIo, Service};
use crate::transfer::{Opcode, Status, TransferError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a remove or replacing put waits for its forgets to reach the stores.
const REMOVE_DURABILITY_WAIT: Duration = Duration::from_secs(1);

/// The master's binary-protocol service, shared by its event loops and blocking threads.
pub struct MasterService {
    pub state: Arc<StateLock>,
    pub notifier: Arc<Notifier>,
    pub stats: Arc<OpStats>,
    pub connections: crate::transfer::server::ConnCounters,
    /// No space is allocated before this: one put reservation TTL after the master started
    /// (or was elected), so that no client still writes into a reservation of a master that
    /// ran before.
    pub allocations_from: parking_lot::Mutex<Instant>,
    /// Whether this master may answer (always, without HA).
    pub leadership: Arc<crate::ha::lease::Leadership>,
    /// Carries out moves between tiers; puts wait for it when memory is short.
    pub mover: Arc<super::mover::Mover>,
    /// Carries out stores' hand-overs.
    pub copier: Arc<super::handover::Copier>,
    /// Poked after every operation that may change the state.
    pub housekeeper: Arc<super::housekeeper::Housekeeper>,
    /// Mooncake's master RPC on this port, told apart by its first byte (`None`: refused).
    pub mooncake: Option<Arc<crate::mooncake::master::MooncakeMaster>>,
}

/// Whether an operation may leave the housekeeper work to do (anything but a read, a ping, a
/// lease or the handshake).
fn changes_state(op: Opcode) -> bool {
    !matches!(
        op,
        Opcode::Ping
            | Opcode::ListSegments
            | Opcode::Lease
            | Opcode::AuthHello
            | Opcode::AuthProof
            | Opcode::GetReplicas
            | Opcode::Exists
            | Opcode::BatchGetReplicas
            | Opcode::BatchExists
            | Opcode::ListKeys
    )
}

/// Longest a put waits for demotions under way to free the memory it needs, before eviction
/// drops objects instead.
const ROOM_WAIT: Duration = Duration::from_secs(2);

/// A client bound to a connection by a ping on it, for as long as the connection is open: the
/// server drops what a connection keeps when it ends, which starts the client's TTL.
struct BoundClient {
    state: Arc<StateLock>,
    binding: Binding,
}

impl Drop for BoundClient {
    fn drop(&mut self) {
        self.state.lock().unbind(self.binding, Instant::now());
    }
}

/// What a handler returns: how it served its request.
type Outcome = Result<Served, TransferError>;

/// How the master served a request.
enum Served {
    /// Answered with its reply.
    Answered,
    /// Answered with a refusal.
    Refused,
    /// Handed to a thread that may block, which answers it and records its figures.
    HandedOn(HandOn),
}

/// Answers `R`'s request with its reply or the refusal.
fn answer<R: Rpc>(io: &mut ServerIo<'_>, r: OpResult<R::Reply>) -> Result<Served, TransferError> {
    match r {
        Ok(v) => io.answer::<R>(&v).map(|_| Served::Answered),
        Err((status, msg)) => io.error(status, &msg).map(|_| Served::Refused),
    }
}

/// A `LIST_KEYS` pattern, compiled with bounds on what it may cost (linear-time matching, a
/// capped program), or `INVALID_PARAMS` saying what is wrong with it.
fn key_pattern(pattern: &str) -> OpResult<regex::Regex> {
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .dfa_size_limit(1 << 20)
        .build()
        .map_err(|e| {
            (
                Status::InvalidParams,
                format!("key pattern {pattern:?} is not a regular expression rbgctl takes: {e}"),
            )
        })
}

fn item<T>(r: OpResult<T>) -> Result<T, Status> {
    r.map_err(|(s, _)| s)
}

impl MasterService {
    /// Serves one request that arrived at `now`.
    fn dispatch(
        &self,
        op: Opcode,
        meta: &[u8],
        io: &mut ServerIo<'_>,
        now: Instant,
    ) -> Result<Served, TransferError> {
        match op {
            Opcode::Ping => self.ping(meta, io, now),
            Opcode::Lease => self.lease(meta, io, now),
            Opcode::Leave => self.leave(meta, io, now),
            Opcode::MountSegment => self.mount_segment(meta, io, now),
            Opcode::UnmountSegment => self.unmount_segment(meta, io, now),
            Opcode::ReportObjects => self.report_objects(meta, io, now),
            Opcode::HandOver => self.hand_over(meta, io, now),
            Opcode::ObjectsHashed => self.objects_hashed(meta, io, now),
            Opcode::ReportCorrupt => self.report_corrupt(meta, io, now),
            Opcode::ListKeys => self.list_keys(meta, io, now),
            Opcode::ListSegments => self.list_segments(meta, io, now),
            Opcode::PutStart => self.put_start(meta, io, now),
            Opcode::PutEnd => self.put_end(meta, io, now),
            Opcode::PutRevoke => self.put_revoke(meta, io, now),
            Opcode::GetReplicas => self.get_replicas(meta, io, now),
            Opcode::Exists => self.exists(meta, io, now),
            Opcode::Remove => self.remove(meta, io, now),
            Opcode::RemoveAll => self.remove_all(meta, io, now),
            Opcode::BatchPutStart => self.batch_put_start(meta, io, now),
            Opcode::BatchPutEnd => self.batch_put_end(meta, io, now),
            Opcode::BatchPutCommit => self.batch_put_commit(meta, io, now),
            Opcode::BatchPutRevoke => self.batch_put_revoke(meta, io, now),
            Opcode::BatchGetReplicas => self.batch_get_replicas(meta, io, now),
            Opcode::BatchExists => self.batch_exists(meta, io, now),
            Opcode::BatchRemove => self.batch_remove(meta, io, now),
            Opcode::AuthHello
            | Opcode::AuthProof
            | Opcode::Write
            | Opcode::WriteChecked
            | Opcode::ReadVersion
            | Opcode::ForgetLease
            | Opcode::Move
            | Opcode::RdmaConnect
            | Opcode::SealChecked
            | Opcode::SealDeferred
            | Opcode::CheckVersion
            | Opcode::Read
            | Opcode::StoreInfo
            | Opcode::Seal
            | Opcode::Forget => {
                io.error(
                    Status::UnknownOpcode,
                    &format!("{} is a store operation, not a master one", op.name()),
                )?;
                Ok(Served::Refused)
            }
        }
    }
}

/// One handler per opcode, each named as its opcode.
impl MasterService {
    /// A client's heartbeat: binds it to this connection, and says whether it must mount again.
    fn ping(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::Ping::request(meta)?;
        let held = io.attached::<BoundClient>().map(|b| b.binding);
        let (need_remount, bind) = self.state.lock().ping_on(r.client_id, held, now);
        if let Some(binding) = bind {
            let bound = BoundClient {
                state: self.state.clone(),
                binding,
            };
            // What the connection held before releases its binding once the state
            // lock is free again.
            drop(io.replace_attached(Box::new(bound)));
        }
        answer::<rpc::Ping>(io, Ok(PingResp { need_remount }))
    }

    /// A store asks for its read lease on a segment.
    fn lease(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::Lease::request(meta)?;
        let lease = {
            // Under the state lock: no forget for the segment is queued meanwhile.
            let st = self.state.lock();
            st.lease_terms(r.client_id, r.segment_id)
                .map(|(endpoint, owed)| self.notifier.grant(&endpoint, owed, now))
        };
        answer::<rpc::Lease>(
            io,
            lease.map(|l| LeaseResp {
                lease_ms: l.as_millis() as u64,
            }),
        )
    }

    /// A client leaves cleanly.
    fn leave(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::Leave::request(meta)?;
        self.state.lock().leave(r.client_id, now);
        answer::<rpc::Leave>(io, Ok(()))
    }

    /// A store mounts its segment (or mounts it again after a restart).
    fn mount_segment(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::MountSegment::request(meta)?;
        let grant_key = match GrantKey::from_bytes(&r.grant_key) {
            Ok(key) => key,
            Err(e) => {
                io.error(Status::InvalidParams, &e.to_string())?;
                return Ok(Served::Refused);
            }
        };
        let (res, write_floor) = {
            let mut st = self.state.lock();
            let res = st.mount(r.client_id, r.segment, grant_key, r.recovering, now);
            (res, st.write_floor())
        };
        answer::<rpc::MountSegment>(
            io,
            res.map(|(segment_id, discard)| MountResp {
                segment_id,
                discard,
                write_floor,
            }),
        )
    }

    /// A store takes its segment away, keeping its objects or not.
    fn unmount_segment(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::UnmountSegment::request(meta)?;
        let res = self
            .state
            .lock()
            .unmount(r.client_id, r.segment_id, r.keep, now);
        answer::<rpc::UnmountSegment>(io, res)
    }

    /// A persistent store reports the objects its segment holds, after a master start.
    fn report_objects(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::ReportObjects::request(meta)?;
        let res = self
            .state
            .lock()
            .report(r.client_id, r.segment_id, r.objects, r.done, now);
        answer::<rpc::ReportObjects>(io, res.map(|forget| ReportResp { forget }))
    }

    /// A store about to go asks for its objects to be moved to the others, or how far that is.
    fn hand_over(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::HandOver::request(meta)?;
        let deadline = Duration::from_millis(r.deadline_ms);
        let res = self
            .state
            .lock()
            .hand_over(r.client_id, r.segment_id, deadline, now);
        self.copier.wake();
        answer::<rpc::HandOver>(io, res.map(|s| HandOverResp::from(&s)))
    }

    /// A store sends the checksums of objects it recorded unhashed.
    fn objects_hashed(&self, meta: &[u8], io: &mut ServerIo<'_>, _now: Instant) -> Outcome {
        let r = rpc::ObjectsHashed::request(meta)?;
        let res = self
            .state
            .lock()
            .objects_hashed(r.client_id, r.segment_id, r.objects);
        answer::<rpc::ObjectsHashed>(io, res)
    }

    /// A reader found a replica whose bytes do not match its checksum.
    fn report_corrupt(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::ReportCorrupt::request(meta)?;
        self.state
            .lock()
            .report_corrupt(&r.key, r.version, r.segment_id, now);
        self.notifier.wake();
        answer::<rpc::ReportCorrupt>(io, Ok(()))
    }

    /// The readable keys a pattern matches.
    fn list_keys(&self, meta: &[u8], io: &mut ServerIo<'_>, _now: Instant) -> Outcome {
        let r = rpc::ListKeys::request(meta)?;
        let re = match key_pattern(&r.pattern) {
            Ok(re) => re,
            Err(e) => return answer::<rpc::ListKeys>(io, Err(e)),
        };
        let limit = (r.limit as usize).min(crate::transfer::codec::MAX_LIST_LEN);
        let listed = {
            let st = self.state.lock();
            st.check_tenant(&r.tenant)
                .map(|()| st.keys_matching(&r.tenant, &re, limit))
        };
        answer::<rpc::ListKeys>(
            io,
            listed.map(|(keys, truncated)| ListKeysResp { keys, truncated }),
        )
    }

    /// The live segments.
    fn list_segments(&self, meta: &[u8], io: &mut ServerIo<'_>, _now: Instant) -> Outcome {
        rpc::ListSegments::request(meta)?;
        let segments = self.state.lock().list_segments();
        answer::<rpc::ListSegments>(io, Ok(ListSegmentsResp { segments }))
    }

    /// A put begins: its replicas placed, with their grants.
    fn put_start(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::PutStart::request(meta)?;
        let Some(now) = self.wait_for_allocations(now, io)? else {
            return Ok(Served::HandedOn(HandOn::Rerun));
        };
        let bytes = r.size * u64::from(r.config.replica_num.max(1));
        let Some((mut st, now)) = self.lock_with_room((bytes, r.size), now, io)? else {
            return Ok(Served::HandedOn(HandOn::Rerun));
        };
        let res = st
            .put_start(r.client_id, &r.key, r.size, &r.config, now)
            .map(|started| st.granted(r.size, started));
        self.send_moves(st);
        answer::<rpc::PutStart>(io, res)
    }

    /// A put is written: its version becomes the key's (once the old one's forgets are out).
    fn put_end(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::PutEnd::request(meta)?;
        self.durably::<rpc::PutEnd, _>(
            io,
            now,
            |st| {
                st.put_end(
                    r.client_id,
                    &r.key,
                    r.object_id,
                    (!r.unhashed).then_some(r.checksum),
                    now,
                )
            },
            not_durable,
        )
    }

    /// A put given up: its space goes back.
    fn put_revoke(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::PutRevoke::request(meta)?;
        let res = self
            .state
            .lock()
            .put_revoke(r.client_id, &r.key, r.object_id, now);
        answer::<rpc::PutRevoke>(io, res)
    }

    /// Where a key's current version is, under a read lease.
    fn get_replicas(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let key = KeyReq::key_of(meta)?;
        let mut st = self.state.lock();
        let res = st.get_replicas(key, now);
        self.send_moves(st);
        answer::<rpc::GetReplicas>(io, res)
    }

    /// Whether a key is readable.
    fn exists(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let key = KeyReq::key_of(meta)?;
        let mut st = self.state.lock();
        if let Some(e) = st.unserved(key) {
            return answer::<rpc::Exists>(io, Err(e));
        }
        let exists = st.exists(key, now);
        drop(st);
        answer::<rpc::Exists>(io, Ok(exists))
    }

    /// A key removed (once its stores were told).
    fn remove(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::Remove::request(meta)?;
        self.durably::<rpc::Remove, _>(io, now, |st| st.remove(&r.key, r.force, now), not_durable)
    }

    /// A tenant's keys removed.
    fn remove_all(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::RemoveAll::request(meta)?;
        if let Err(e) = self.state.lock().check_tenant(&r.tenant) {
            return answer::<rpc::RemoveAll>(io, Err(e));
        }
        self.durably::<rpc::RemoveAll, _>(
            io,
            now,
            |st| st.remove_all(&r.tenant, r.force, now),
            |removed, durable| not_durable(Ok(RemoveAllResp { removed }), durable),
        )
    }

    /// `PUT_START` for many keys, under one lock.
    fn batch_put_start(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::BatchPutStart::request(meta)?;
        let Some(now) = self.wait_for_allocations(now, io)? else {
            return Ok(Served::HandedOn(HandOn::Rerun));
        };
        let copies = u64::from(r.config.replica_num.max(1));
        let bytes = r.items.iter().map(|it| it.size * copies).sum();
        let largest = r.items.iter().map(|it| it.size).max().unwrap_or(0);
        let keys: Vec<&str> = r.items.iter().map(|it| it.key.as_str()).collect();
        let Some((mut st, now)) = self.lock_with_room((bytes, largest), now, io)? else {
            return Ok(Served::HandedOn(HandOn::Rerun));
        };
        st.prefetch(&keys);
        let items = r
            .items
            .iter()
            .map(|it| {
                item(st.put_start(r.client_id, &it.key, it.size, &r.config, now))
                    .map(|started| st.granted(it.size, started))
            })
            .collect();
        self.send_moves(st);
        answer::<rpc::BatchPutStart>(io, Ok(BatchPutStartResp { items }))
    }

    /// `PUT_END` for many keys, under one lock.
    fn batch_put_end(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::BatchPutEnd::request(meta)?;
        self.durably::<rpc::BatchPutEnd, _>(
            io,
            now,
            |st| end_puts(st, r.client_id, &r.items, now),
            |items, durable| {
                let items = mark_not_durable(items, durable);
                Ok(BatchStatusResp { items })
            },
        )
    }

    /// `BATCH_PUT_END`, and space reserved for the next puts.
    fn batch_put_commit(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::BatchPutCommit::request(meta)?;
        let now = if r.reserve.is_empty() {
            now
        } else {
            let Some(now) = self.wait_for_allocations(now, io)? else {
                return Ok(Served::HandedOn(HandOn::Rerun));
            };
            let copies = u64::from(r.config.replica_num.max(1));
            let bytes = r.reserve.iter().sum::<u64>() * copies;
            let largest = r.reserve.iter().copied().max().unwrap_or(0);
            let Some((st, now)) = self.lock_with_room((bytes, largest), now, io)? else {
                return Ok(Served::HandedOn(HandOn::Rerun));
            };
            drop(st);
            now
        };
        let commit = |st: &mut MasterState| {
            let items = end_puts(st, r.client_id, &r.items, now);
            let reserved = st
                .reserve(r.client_id, &r.reserve, &r.config, now)
                .into_iter()
                .zip(&r.reserve)
                .map(|(res, &size)| item(res).map(|started| st.granted(size, started)))
                .collect();
            (items, reserved, st.config().put_reservation_ttl_ms.0)
        };
        self.durably::<rpc::BatchPutCommit, _>(
            io,
            now,
            commit,
            |(items, reserved, ttl), durable| {
                Ok(BatchPutCommitResp {
                    items: mark_not_durable(items, durable),
                    reserved,
                    ttl_ms: ttl.as_millis() as u64,
                })
            },
        )
    }

    /// `PUT_REVOKE` for many keys.
    fn batch_put_revoke(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::BatchPutRevoke::request(meta)?;
        let mut st = self.state.lock();
        let items = r
            .items
            .iter()
            .map(|it| status_of(st.put_revoke(r.client_id, &it.key, it.object_id, now)))
            .collect();
        drop(st);
        answer::<rpc::BatchPutRevoke>(io, Ok(BatchStatusResp { items }))
    }

    /// `GET_REPLICAS` for many keys, under one lock.
    fn batch_get_replicas(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::BatchGetReplicas::request(meta)?;
        let mut st = self.state.lock();
        st.prefetch(&r.keys);
        let items = r
            .keys
            .iter()
            .map(|k| item(st.get_replicas(k, now)))
            .collect();
        self.send_moves(st);
        answer::<rpc::BatchGetReplicas>(io, Ok(BatchGetReplicasResp { items }))
    }

    /// `EXISTS` for many keys, under one lock.
    fn batch_exists(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::BatchExists::request(meta)?;
        let mut st = self.state.lock();
        if let Some(e) = r.keys.iter().find_map(|k| st.unserved(k)) {
            return answer::<rpc::BatchExists>(io, Err(e));
        }
        st.prefetch(&r.keys);
        let items = r.keys.iter().map(|k| st.exists(k, now)).collect();
        drop(st);
        answer::<rpc::BatchExists>(io, Ok(BatchExistsResp { items }))
    }

    /// `REMOVE` for many keys.
    fn batch_remove(&self, meta: &[u8], io: &mut ServerIo<'_>, now: Instant) -> Outcome {
        let r = rpc::BatchRemove::request(meta)?;
        let remove = |st: &mut MasterState| {
            st.prefetch(&r.keys);
            r.keys
                .iter()
                .map(|k| status_of(st.remove(k, r.force, now)))
                .collect::<Vec<_>>()
        };
        self.durably::<rpc::BatchRemove, _>(io, now, remove, |items, durable| {
            let items = mark_not_durable(items, durable);
            Ok(BatchStatusResp { items })
        })
    }
}

impl MasterService {
    /// Holds an allocating request that arrived at `now` until `allocations_from` (only just
    /// after a start); answers the time it goes on at.
    /// The state, locked once memory has room for a put of `bytes` (the disk tier's
    /// backpressure): while it has less free, objects are demoted and the put waits for them
    /// (at most `ROOM_WAIT`), so that a put stream runs at the speed memory is copied to disk
    /// instead of having eviction drop objects. Without a disk tier, one lock and no wait.
    /// `None` where `io` may not block and the put would wait: it is then served again where
    /// it may (nothing was done but queueing demotions, which the second try queues again).
    fn lock_with_room(
        &self,
        (bytes, largest): (u64, u64),
        now: Instant,
        io: &mut ServerIo<'_>,
    ) -> Result<Option<(StateGuard<'_>, Instant)>, TransferError> {
        let mut st = self.state.lock();
        if !st.make_room(bytes, largest, now) {
            return Ok(Some((st, now)));
        }
        if !io.may_block() {
            drop(st);
            self.mover.wake();
            return Ok(None);
        }
        let deadline = Instant::now() + ROOM_WAIT;
        loop {
            drop(st);
            self.mover.wake();
            let reported = self.mover.wait_reported(deadline);
            st = self.state.lock();
            if !reported || !st.make_room(bytes, largest, Instant::now()) {
                return Ok(Some((st, Instant::now())));
            }
        }
    }

    /// Sends the moves an operation queued (after letting the state go).
    fn send_moves(&self, st: StateGuard<'_>) {
        let queued = st.has_queued_moves();
        drop(st);
        if queued {
            self.mover.wake();
        }
    }

    /// `None` where `io` may not block: the request is then served again where it may.
    fn wait_for_allocations(
        &self,
        now: Instant,
        io: &mut ServerIo<'_>,
    ) -> Result<Option<Instant>, TransferError> {
        let from = *self.allocations_from.lock();
        let left = from.saturating_duration_since(now);
        if left.is_zero() {
            return Ok(Some(now));
        }
        if !io.may_block() {
            return Ok(None);
        }
        std::thread::sleep(left);
        Ok(Some(Instant::now()))
    }

    /// Runs an operation that may drop object versions (a remove, or a put that replaces a
    /// value), then waits (bounded) until the stores dropped the records of those versions, so
    /// that a master restarted right after it brings back neither a removed object nor an old
    /// value, and no client reading a cached location gets the old value once this is answered.
    /// `answer_with` makes the answer from what `f` did and whether the stores took the forgets:
    /// when one could not be told in time, the operation is done here but not durable, and is
    /// answered `NOT_DURABLE`. Where `io` may not block and there is something to wait for,
    /// the wait and the answer (and the operation's figures) go on to a thread that may.
    fn durably<R: Rpc, T>(
        &self,
        io: &mut ServerIo<'_>,
        started: Instant,
        f: impl FnOnce(&mut MasterState) -> T,
        answer_with: impl FnOnce(T, bool) -> OpResult<R::Reply> + Send + 'static,
    ) -> Result<Served, TransferError>
    where
        T: Send + 'static,
    {
        let op = R::OPCODE;
        let (out, wait) = {
            let mut st = self.state.lock();
            st.take_forget_wait();
            let out = f(&mut st);
            (out, st.take_forget_wait())
        };
        let Some(wait) = wait else {
            return answer::<R>(io, answer_with(out, true));
        };
        self.notifier.wake();
        let notifier = self.notifier.clone();
        let finish = move |io: &mut ServerIo<'_>| {
            notifier.settle(wait.seq, REMOVE_DURABILITY_WAIT);
            let durable = notifier.taken_by_all(&wait.endpoints, wait.seq);
            if !durable {
                tracing::debug!(stores = ?wait.endpoints, "a store holding a replaced or removed version could not be told in time");
            }
            answer::<R>(io, answer_with(out, durable))
        };
        if io.may_block() {
            return finish(io);
        }
        let stats = self.stats.clone();
        Ok(Served::HandedOn(HandOn::Finish(Box::new(move |io| {
            let served = finish(io)?;
            let answered = matches!(served, Served::Answered);
            stats.record(op as u8, answered, started.elapsed());
            Ok(())
        }))))
    }
}

/// The answer to an operation that is done but, as far as the master can tell, not durable.
fn not_durable<T>(r: OpResult<T>, durable: bool) -> OpResult<T> {
    match r {
        Ok(_) if !durable => fail_not_durable(),
        other => other,
    }
}

fn fail_not_durable<T>() -> OpResult<T> {
    Err((
        Status::NotDurable,
        "done, but a store that held the old value could not be told yet: it may come back if \
         the master restarts before that store does"
            .to_owned(),
    ))
}

/// Per-item statuses of a batch that is done but not durable: its successes become
/// `NOT_DURABLE`.
fn mark_not_durable(items: Vec<Status>, durable: bool) -> Vec<Status> {
    if durable {
        return items;
    }
    items
        .into_iter()
        .map(|s| match s {
            Status::Ok => Status::NotDurable,
            other => other,
        })
        .collect()
}

/// Ends each put (or reservation) of a batch; one status per item.
fn end_puts(st: &mut MasterState, client_id: u64, items: &[EndItem], now: Instant) -> Vec<Status> {
    let keys: Vec<&str> = items.iter().map(|it| it.key.as_str()).collect();
    st.prefetch(&keys);
    items
        .iter()
        .map(|it| {
            status_of(st.put_end(
                client_id,
                &it.key,
                it.object_id,
                (!it.unhashed).then_some(it.checksum),
                now,
            ))
        })
        .collect()
}

fn status_of(r: OpResult<()>) -> Status {
    match r {
        Ok(()) => Status::Ok,
        Err((s, _)) => s,
    }
}

impl Service for MasterService {
    fn handle(&self, op: Opcode, meta: &[u8], io: &mut ServerIo<'_>) -> Handling {
        let started = self.stats.start();
        let t0 = io.arrived();
        match self.leadership.check(t0) {
            Ok(Some(fence)) => io.fence(fence),
            Ok(None) => {}
            Err(not_leader) => {
                self.stats.record_since(op as u8, false, started);
                io.error(Status::NotLeader, &not_leader.to_string())?;
                return Ok(Handled::Answered);
            }
        }
        let result = self.dispatch(op, meta, io, t0);
        // A request handed on has its figures recorded where it is answered.
        match &result {
            Ok(Served::HandedOn(_)) => {}
            Ok(served) => {
                let answered = matches!(served, Served::Answered);
                self.stats.record_since(op as u8, answered, started)
            }
            Err(_) => self.stats.record_since(op as u8, false, started),
        }
        if changes_state(op) {
            self.housekeeper.poke();
        }
        result.map(|served| match served {
            Served::HandedOn(on) => Handled::HandedOn(on),
            Served::Answered | Served::Refused => Handled::Answered,
        })
    }

    fn max_data_len(&self) -> u64 {
        0
    }

    fn connections(&self) -> &crate::transfer::server::ConnCounters {
        &self.connections
    }

    fn guest(&self) -> Option<Arc<dyn crate::transfer::server::Guest>> {
        self.mooncake
            .clone()
            .map(|m| m as Arc<dyn crate::transfer::server::Guest>)
    }
}
