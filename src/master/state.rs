//! The master's state machine: clients, segments, objects, leases, pins and eviction. Every
//! operation takes `now` so that tests drive time without clocks; the RPC layer holds the lock.
//!
//! Object life cycle: `put_start` allocates replicas and records a *pending* version that no
//! reader sees; `put_end` makes it the *current* version atomically. Putting an existing key
//! replaces its value: readers see the old value until the new one is complete, then the new one,
//! never a mix; the old replicas are freed when the last read lease on them ends.
//!
//! Persistent stores keep their objects across restarts. A segment is *live*, *recovering* (its
//! store is reporting what it kept: no allocations, no reads) or *away* (its store stopped or
//! stopped heartbeating: objects kept, unreadable, for the grace period). A store that comes back
//! with the same segment incarnation gets its objects back after confirming each of them; a
//! master that restarted adopts every reported object, the newest version of a key winning.
//! Versions are object ids drawn from a clock that is at least the wall clock in microseconds, so
//! that versions of a restarted master are newer than any from before. Whenever an object's
//! record must go (replaced, removed, evicted, revoked), a *forget* for its store goes into the
//! outbox, which the notifier delivers.
//!
//! Clients may cache an object's location and read it from its store directly; a store answers
//! such a read only while it still records that version and its read lease (renewed by the
//! notifier with its forgets) runs. So a remove or replace is acknowledged only once its
//! forgets are delivered (or the stores' leases ran out), and a put of a key whose earlier
//! value was evicted moments ago waits for that eviction's forgets too (`forget_wait`).

use super::allocator::Allocator;
use super::config::MasterConfig;
use super::eviction::{self, EvictionLog};
use super::indexes::Indexes;
pub use super::objects::{Entry, Pending, Version};
use super::objects::{ObjectTable, Verdict};
use super::placement::{self, Candidate};
use super::reservations::Reservations;
use super::tiering::{Move, Moves};
use crate::transfer::message::{
    ForgetItem, MoveItem, MoveKind, ObjectDesc, ReplicaLoc, ReplicateConfig, SegmentEntry,
    SegmentInfo, StoredObject, Tier, MAX_MOVE_BYTES,
};
use crate::transfer::Status;
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

/// Object slots looked at per step of a walk over every object (a few ms under the lock).
pub const WALK_STEP: usize = 16_384;

/// A walk over every object slot, done in steps (`walk_step`) so that the lock is let go
/// between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WalkKind {
    /// Drop the replicas of an unmounted segment.
    Drop,
    /// A rebound segment's report is complete: drop the replicas its store did not confirm,
    /// then make it live. The segment stays recovering (unreadable) until then.
    Confirm,
}

#[derive(Clone, Copy, Debug)]
struct Walk {
    kind: WalkKind,
    segment_id: u64,
    /// The slot to go on from.
    from: u32,
    /// Objects left without a replica so far.
    lost: u64,
}

/// Incarnations of given-up segments remembered, so that a store returning after its grace
/// period is told to start empty.
const LOST_SEGMENTS_REMEMBERED: usize = 4096;

pub type OpResult<T> = Result<T, (Status, String)>;

/// The object table has no room for another key: the put is refused, nothing changed.
fn table_full(e: super::objects::TableFull) -> (Status, String) {
    (
        Status::NoSpace,
        format!("the master cannot hold another object: {e}"),
    )
}

/// What an eviction walk may do with the objects it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Eviction {
    /// Demote where the object's store has a disk tier, else drop (the watermark).
    DemoteOrDrop,
    /// Demote only; leave what cannot be (room for a put that can wait).
    DemoteOnly,
    /// Drop (a put needs the memory now).
    Drop,
}

/// What memory eviction does with an object whose store may have a disk tier.
enum Demotion {
    /// A copy to disk is queued; the memory (bytes) is freed when it is confirmed.
    Started(u64),
    /// It already had a disk replica: its memory (bytes) is freed now.
    Done(u64),
    /// Its store's demotion queue is full: leave it for now.
    Wait,
    /// No disk tier (or no room there, or too large): drop it.
    Drop,
}

fn fail<T>(status: Status, msg: impl Into<String>) -> OpResult<T> {
    Err((status, msg.into()))
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SegState {
    Live,
    /// Its store is reporting the objects it kept. `rebind`: the master knew the segment and
    /// only confirms its own records; otherwise it adopts what is reported. `confirmed` holds
    /// the offsets confirmed so far.
    Recovering {
        rebind: bool,
        confirmed: HashSet<u64>,
    },
    /// Its store went away; objects are kept, unreadable, until `until`.
    Away {
        until: Instant,
    },
}

impl SegState {
    pub fn name(&self) -> &'static str {
        match self {
            SegState::Live => "live",
            SegState::Recovering { .. } => "recovering",
            SegState::Away { .. } => "away",
        }
    }
}

#[derive(Debug)]
pub struct Segment {
    pub id: u64,
    pub info: SegmentInfo,
    pub client_id: u64,
    pub alloc: Allocator,
    pub state: SegState,
    /// The outbox sequence number of the last forget queued for this segment: its store is
    /// granted a read lease only once it has taken every forget up to this one.
    pub owed_seq: u64,
}

impl Segment {
    pub fn is_live(&self) -> bool {
        self.state == SegState::Live
    }

    /// A live memory segment: where new puts go and what the memory watermark counts.
    fn is_live_memory(&self) -> bool {
        self.is_live() && self.info.tier == Tier::Memory
    }
}

#[derive(Debug)]
struct Client {
    last_seen: Instant,
    segments: Vec<u64>,
}

/// Space that is no longer any object's but may still be read (a lease runs) or written (a
/// preempted writer), released at `until`.
#[derive(Debug)]
struct Deferred {
    until: Instant,
    segment_id: u64,
    offset: u64,
    size: u64,
}

/// Counters the master reports; plain integers because they change under the state lock.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Counters {
    pub evicted_objects: u64,
    pub evicted_bytes: u64,
    pub eviction_runs: u64,
    pub expired_clients: u64,
    pub dropped_objects: u64,
    pub reclaimed_puts: u64,
    pub alloc_failures: u64,
    pub partial_allocations: u64,
    /// Objects adopted or confirmed from stores' reports.
    pub recovered_objects: u64,
    /// Objects a returning store no longer had (dropped).
    pub lost_objects: u64,
    /// Reported records the master did not take (stale, removed, invalid).
    pub rejected_records: u64,
    /// Replicas dropped because a reader found their bytes failing the checksum.
    pub corrupt_replicas: u64,
    /// Away segments given up after the grace period.
    pub segments_given_up: u64,
    /// Puts committed into a reservation (one master round trip).
    pub reserved_puts: u64,
    /// Reservations dropped unused after twice their TTL (their clients stopped or paused).
    pub expired_reservations: u64,
    /// Objects memory gave up to a disk tier (copies confirmed by their stores).
    pub demoted_objects: u64,
    pub demoted_bytes: u64,
    /// Objects a hit brought back from a disk tier to memory.
    pub promoted_objects: u64,
    pub promoted_bytes: u64,
    /// Moves between tiers that failed (the object stayed where it was).
    pub move_failures: u64,
    /// Objects dropped from a disk tier by its own eviction.
    pub disk_evicted_objects: u64,
    pub disk_evicted_bytes: u64,
    /// Objects memory eviction dropped although their store has a disk tier: it had no room,
    /// or the object was too large to move.
    pub disk_full_drops: u64,
    /// Reads answered with a disk tier replica.
    pub disk_hits: u64,
}

/// A summary for logs, metrics and the admin API.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Summary {
    /// Memory segments only (the eviction watermark's figures).
    pub used_bytes: u64,
    pub capacity_bytes: u64,
    /// Disk-tier segments.
    pub disk_used_bytes: u64,
    pub disk_capacity_bytes: u64,
    pub keys: u64,
    pub soft_pinned_keys: u64,
    pub pending_puts: u64,
    /// Put reservations held by clients.
    pub reservations: u64,
    /// Keys whose value lives only in a disk tier.
    pub disk_keys: u64,
    /// Copies between tiers under way, and the memory the demotions among them will free.
    pub moves_in_flight: u64,
    pub demoting_bytes: u64,
    pub clients: u64,
    pub segments: u64,
    pub away_segments: u64,
    pub recovering_segments: u64,
    pub deferred_bytes: u64,
}

pub struct MasterState {
    cfg: MasterConfig,
    /// Until when a master that took office learns the pool's objects from its stores (see
    /// `learn_for`): a key it does not know may be on a store that has not mounted yet.
    learning_until: Option<Instant>,
    /// Whether a segment may be recovering: set when one starts, cleared by the next look that
    /// finds none, so that a miss costs a walk over the segments only while one might be.
    maybe_recovering: bool,
    clients: HashMap<u64, Client>,
    segments: HashMap<u64, Segment>,
    segment_by_name: HashMap<String, u64>,
    objects: ObjectTable,
    /// Put reservations by object id: allocated, versioned, not yet any key's.
    reservations: Reservations,
    /// Counts, soft pins by expiry and unfinished puts by age, kept as objects change.
    indexes: Indexes,
    deferred: Vec<Deferred>,
    next_object_id: u64,
    rng: fastrand::Rng,
    pub counters: Counters,
    force_eviction: bool,
    /// Forgets waiting for delivery to stores: (segment id, record).
    outbox: Vec<(u64, ForgetItem)>,
    /// Incremented with every batch of forgets put in the outbox.
    pub outbox_seq: u64,
    /// The highest outbox sequence number the notifier has delivered.
    forgets_delivered: u64,
    /// Keys evicted or removed within the last store read lease, with their forgets' outbox
    /// sequence number: a new value for one is acknowledged only once no store can serve the
    /// old one.
    recently_retired: HashMap<String, (u64, Instant)>,
    /// The same keys in the order they were retired, with when (a key retired again is here
    /// twice; `forgets_delivered` prunes both maps from the front).
    retired_order: VecDeque<(Instant, String)>,
    /// Every eviction, with the wall-clock time, for readers that tell evictions from losses.
    pub evictions: EvictionLog,
    /// The outbox sequence number the current operation must see delivered before it answers.
    forget_wait: u64,
    /// The segments the current operation queued forgets for (of versions it replaced or
    /// removed).
    forget_targets: Vec<u64>,
    lost_segments: VecDeque<u64>,
    /// Walks over every object in progress, the first one going on at each step.
    walks: VecDeque<Walk>,
    /// The first version this state machine could issue (see `write_floor`).
    write_floor: u64,
    /// Copies between memory and disk tiers under way.
    moves: Moves,
    /// Disk segments mounted (live or not): with none, puts never wait for room.
    disk_segments: usize,
}

/// What an operation that replaced or removed values waits for before it is acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForgetWait {
    /// The outbox sequence number its forgets (and those of evictions it depends on) have.
    pub seq: u64,
    /// The endpoints of the stores that held the versions it replaced or removed: once each
    /// has taken its forgets, no master restart can bring those versions back.
    pub endpoints: Vec<String>,
}

/// What the notifier has to deliver.
#[derive(Debug, Default)]
pub struct Outbox {
    /// The outbox sequence number these forgets run up to.
    pub seq: u64,
    /// Forgets by store endpoint.
    pub forgets: HashMap<String, Vec<ForgetItem>>,
    /// Endpoints of live segments: their stores get their read lease renewed.
    pub live: Vec<String>,
    /// Endpoints of away segments, whose forgets could not be sent: their stores keep stale
    /// records until their read lease runs out.
    pub unreachable: Vec<String>,
}

fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl MasterState {
    pub fn new(cfg: MasterConfig) -> MasterState {
        let write_floor = unix_micros();
        MasterState {
            cfg,
            clients: HashMap::new(),
            segments: HashMap::new(),
            segment_by_name: HashMap::new(),
            objects: ObjectTable::default(),
            reservations: Reservations::default(),
            indexes: Indexes::default(),
            deferred: Vec::new(),
            next_object_id: write_floor,
            rng: fastrand::Rng::new(),
            counters: Counters::default(),
            force_eviction: false,
            outbox: Vec::new(),
            outbox_seq: 0,
            forgets_delivered: 0,
            recently_retired: HashMap::new(),
            retired_order: VecDeque::new(),
            evictions: EvictionLog::default(),
            forget_wait: 0,
            forget_targets: Vec::new(),
            lost_segments: VecDeque::new(),
            walks: VecDeque::new(),
            write_floor,
            moves: Moves::default(),
            disk_segments: 0,
            learning_until: None,
            maybe_recovering: false,
        }
    }

    /// A master that took office from another leader knows nothing until its stores mount and
    /// report what they hold. For `window` (the client TTL: by then every running store has
    /// found this master), a key it does not know is answered `OBJECT_UNAVAILABLE` rather
    /// than a miss, which would deny a value a client was told is stored.
    pub fn learn_for(&mut self, window: Duration, now: Instant) {
        self.learning_until = Some(now + window);
    }

    /// Why a key this master does not know might still exist, if it might.
    fn unsure_of_misses(&mut self, now: Instant) -> Option<&'static str> {
        if self.learning_until.is_some_and(|t| now < t) {
            return Some("this master took office moments ago and its stores are still mounting");
        }
        if !self.maybe_recovering {
            return None;
        }
        let recovering = self
            .segments
            .values()
            .any(|s| matches!(s.state, SegState::Recovering { .. }));
        self.maybe_recovering = recovering;
        recovering.then_some("a store is still reporting the objects it kept")
    }

    /// Forgets every segment, object and client, as a freshly started master knows nothing
    /// (a master elected leader, or deposed); the counters carry on.
    pub fn reset(&mut self) {
        let counters = std::mem::take(&mut self.counters);
        let evictions = std::mem::take(&mut self.evictions);
        *self = MasterState::new(self.cfg.clone());
        self.counters = counters;
        self.evictions = evictions;
    }

    /// A new version: above every version issued or reported, and at least the wall clock in
    /// microseconds (so a restarted master's versions beat the ones stores kept).
    /// The lowest version this state machine issues: the wall clock when it started. Stores
    /// refuse writes below it (`MountResp::write_floor`).
    pub fn write_floor(&self) -> u64 {
        self.write_floor
    }

    fn next_version(&mut self) -> u64 {
        self.next_object_id = self.next_object_id.max(unix_micros());
        let v = self.next_object_id;
        self.next_object_id += 1;
        v
    }

    /// Takes the forgets waiting for delivery, grouped by store endpoint. Forgets for segments
    /// that are away or gone are dropped: a returning store reports its records and the master
    /// rejects those it no longer has (a gone segment's store has stopped or lost its read
    /// lease: it was dropped after `client_ttl`, or it left and revoked the lease first).
    pub fn take_outbox(&mut self) -> Outbox {
        let mut out = Outbox {
            seq: self.outbox_seq,
            ..Outbox::default()
        };
        for (seg_id, item) in self.outbox.drain(..) {
            let Some(seg) = self.segments.get(&seg_id) else {
                continue;
            };
            if matches!(seg.state, SegState::Away { .. }) {
                out.unreachable.push(seg.info.endpoint.clone());
            } else {
                out.forgets
                    .entry(seg.info.endpoint.clone())
                    .or_default()
                    .push(item);
            }
        }
        out.unreachable.sort_unstable();
        out.unreachable.dedup();
        out.live = self
            .segments
            .values()
            .filter(|s| s.is_live())
            .map(|s| s.info.endpoint.clone())
            .collect();
        out
    }

    /// The notifier delivered the outbox up to `seq` (or kept what a store did not take).
    pub fn forgets_delivered(&mut self, seq: u64, now: Instant) {
        self.forgets_delivered = self.forgets_delivered.max(seq);
        let lease = self.cfg.store_read_lease();
        while let Some((at, _)) = self.retired_order.front() {
            if now.saturating_duration_since(*at) <= lease {
                break;
            }
            if let Some((at, key)) = self.retired_order.pop_front() {
                // Retired again since: that later entry prunes it.
                if self
                    .recently_retired
                    .get(&key)
                    .is_some_and(|(_, t)| *t <= at)
                {
                    self.recently_retired.remove(&key);
                }
            }
        }
    }

    /// What the last operation must see settled before it is acknowledged, if anything
    /// (taken: the next operation starts from none).
    pub fn take_forget_wait(&mut self) -> Option<ForgetWait> {
        let seq = std::mem::take(&mut self.forget_wait);
        let mut targets = std::mem::take(&mut self.forget_targets);
        targets.sort_unstable();
        targets.dedup();
        let endpoints = targets
            .iter()
            .filter_map(|id| self.segments.get(id))
            .map(|s| s.info.endpoint.clone())
            .collect();
        (seq > 0).then_some(ForgetWait { seq, endpoints })
    }

    fn remember_lost(&mut self, uuid: u64) {
        if uuid == 0 {
            return;
        }
        if self.lost_segments.len() >= LOST_SEGMENTS_REMEMBERED {
            self.lost_segments.pop_front();
        }
        self.lost_segments.push_back(uuid);
    }

    pub fn config(&self) -> &MasterConfig {
        &self.cfg
    }

    // ---- clients and segments ----

    /// A heartbeat. Returns true when the client is unknown (new, expired, or the master
    /// restarted) and must mount its segments again.
    pub fn ping(&mut self, client_id: u64, now: Instant) -> bool {
        match self.clients.get_mut(&client_id) {
            Some(c) => {
                c.last_seen = now;
                false
            }
            None => {
                self.clients.insert(
                    client_id,
                    Client {
                        last_seen: now,
                        segments: Vec::new(),
                    },
                );
                true
            }
        }
    }

    fn touch_client(&mut self, client_id: u64, now: Instant) -> &mut Client {
        let c = self.clients.entry(client_id).or_insert(Client {
            last_seen: now,
            segments: Vec::new(),
        });
        c.last_seen = now;
        c
    }

    /// Mounts a segment; returns its id and whether the store must discard the objects it
    /// kept. Mounting the same name again from the same client is a no-op that returns the same
    /// id. A new client mounting a name is a restarted store: when it brings back the same
    /// persistent segment (`recovering`, same incarnation and size) the segment is rebound and
    /// its objects wait for the store's report; otherwise the old mount is dropped.
    pub fn mount(
        &mut self,
        client_id: u64,
        info: SegmentInfo,
        recovering: bool,
        now: Instant,
    ) -> OpResult<(u64, bool)> {
        if info.name.is_empty() || info.endpoint.is_empty() {
            return fail(
                Status::InvalidParams,
                "segment name and endpoint are required",
            );
        }
        if info.size < super::allocator::ALIGN {
            return fail(
                Status::InvalidParams,
                format!("segment size {} is too small", info.size),
            );
        }
        let recovering = recovering && info.segment_uuid != 0;
        if let Some(&id) = self.segment_by_name.get(&info.name) {
            let seg = &self.segments[&id];
            if seg.client_id == client_id
                && seg.info.size == info.size
                && seg.info.segment_uuid == info.segment_uuid
                && !matches!(seg.state, SegState::Away { .. })
            {
                self.touch_client(client_id, now);
                return Ok((id, false));
            }
            if recovering
                && seg.info.segment_uuid == info.segment_uuid
                && seg.info.size == info.size
            {
                let old_client = seg.client_id;
                if let Some(c) = self.clients.get_mut(&old_client) {
                    c.segments.retain(|s| *s != id);
                }
                // A confirmation of its previous report stops: the new report confirms anew.
                self.walks
                    .retain(|w| !(w.kind == WalkKind::Confirm && w.segment_id == id));
                let seg = self.segments.get_mut(&id).expect("looked up above");
                tracing::info!(segment = %info.name, endpoint = %info.endpoint, was = seg.state.name(),
                    "store is back with its segment; waiting for its report");
                seg.client_id = client_id;
                seg.info = info;
                // Its store dropped its lease to mount; its report settles which records stay,
                // so forgets owed to it before are moot.
                seg.owed_seq = 0;
                seg.state = SegState::Recovering {
                    rebind: true,
                    confirmed: HashSet::new(),
                };
                self.maybe_recovering = true;
                self.touch_client(client_id, now).segments.push(id);
                return Ok((id, false));
            }
            // Another store under this name. While the holder heartbeats it keeps the name (and
            // its objects); a restart of the same store on the same files (whose lock proves
            // the old process gone) or a holder that stopped heartbeating gives it up.
            let holder_alive = !matches!(seg.state, SegState::Away { .. })
                && self.clients.get(&seg.client_id).is_some_and(|c| {
                    now.saturating_duration_since(c.last_seen) <= self.cfg.client_ttl_ms.0
                });
            let same_files = !info.shm_path.is_empty()
                && info.shm_path == seg.info.shm_path
                && info.host_id == seg.info.host_id;
            if holder_alive && !same_files {
                return fail(
                    Status::SegmentExists,
                    format!(
                        "segment name {:?} is held by a running store at {} (client {}); give \
                         this store another name, or stop that one first",
                        info.name, seg.info.endpoint, seg.client_id
                    ),
                );
            }
            let old_client = seg.client_id;
            tracing::warn!(segment = %info.name, old_client, new_client = client_id,
                "segment mounted again by a new store with other memory; dropping the old mount");
            self.unmount_segment(id);
            // The old holder, should it still run, learns at its next heartbeat that it is
            // unknown, and mounts again (or is refused and stops).
            if self
                .clients
                .get(&old_client)
                .is_some_and(|c| c.segments.is_empty())
            {
                self.clients.remove(&old_client);
            }
        }
        let discard = recovering && self.lost_segments.contains(&info.segment_uuid);
        // Never the id of a segment whose replicas are still being dropped.
        let mut id = self.rng.u64(1..);
        while self.segments.contains_key(&id) || self.walks.iter().any(|w| w.segment_id == id) {
            id = self.rng.u64(1..);
        }
        tracing::info!(segment = %info.name, endpoint = %info.endpoint, size = info.size, client_id,
            recovering, discard, "segment mounted");
        self.segment_by_name.insert(info.name.clone(), id);
        self.maybe_recovering |= recovering;
        let state = if recovering {
            SegState::Recovering {
                rebind: false,
                confirmed: HashSet::new(),
            }
        } else {
            SegState::Live
        };
        self.disk_segments += usize::from(info.tier == Tier::Disk);
        self.segments.insert(
            id,
            Segment {
                id,
                // Disk segments hand out whole blocks: the store reads and writes them with
                // direct I/O.
                alloc: match info.tier {
                    Tier::Memory => Allocator::new(info.size),
                    Tier::Disk => Allocator::with_align(info.size, super::allocator::DISK_ALIGN),
                },
                info,
                client_id,
                state,
                owed_seq: 0,
            },
        );
        self.touch_client(client_id, now).segments.push(id);
        Ok((id, discard))
    }

    /// Takes part of a recovering store's report; returns the records the master rejects.
    pub fn report(
        &mut self,
        client_id: u64,
        segment_id: u64,
        objects: Vec<StoredObject>,
        done: bool,
        now: Instant,
    ) -> OpResult<Vec<ForgetItem>> {
        let rebind = match self.segments.get(&segment_id) {
            None => {
                return fail(
                    Status::SegmentNotFound,
                    format!("segment {segment_id} is not mounted"),
                )
            }
            Some(s) if s.client_id != client_id => {
                return fail(
                    Status::IllegalClient,
                    format!("segment {segment_id} belongs to another client"),
                )
            }
            Some(Segment {
                state: SegState::Recovering { rebind, .. },
                ..
            }) => *rebind,
            Some(_) => {
                return fail(
                    Status::InvalidParams,
                    format!("segment {segment_id} is not recovering"),
                )
            }
        };
        self.touch_client(client_id, now);
        let mut rejected = Vec::new();
        for o in objects {
            let item = ForgetItem {
                offset: o.offset,
                version: o.version,
            };
            let taken = if rebind {
                self.confirm(segment_id, &o)
            } else {
                self.adopt(segment_id, o, now)
            };
            if !taken {
                rejected.push(item);
            }
        }
        self.counters.rejected_records += rejected.len() as u64;
        if done {
            self.finish_recovery(segment_id);
        }
        Ok(rejected)
    }

    /// Rebind: a reported record is kept only when it is exactly a replica the master has.
    fn confirm(&mut self, segment_id: u64, o: &StoredObject) -> bool {
        let Some(entry) = self.objects.get(&o.key) else {
            return false;
        };
        let here = |replicas: &[ReplicaLoc]| {
            replicas
                .iter()
                .any(|r| r.segment_id == segment_id && r.offset == o.offset)
        };
        let current = entry.current.as_ref().is_some_and(|v| {
            v.object_id == o.version
                && v.size == o.size
                && v.checksum == o.checksum
                && here(&v.replicas)
        });
        let pending = entry
            .pending
            .as_ref()
            .is_some_and(|p| p.object_id == o.version && here(&p.replicas));
        if current {
            if let Some(Segment {
                state: SegState::Recovering { confirmed, .. },
                ..
            }) = self.segments.get_mut(&segment_id)
            {
                confirmed.insert(o.offset);
            }
            self.counters.recovered_objects += 1;
        }
        current || pending
    }

    /// After a master restart: a reported record becomes (a replica of) the key's current
    /// version unless a newer version is known.
    fn adopt(&mut self, segment_id: u64, o: StoredObject, now: Instant) -> bool {
        if o.key.is_empty() || o.size == 0 || o.version == 0 {
            return false;
        }
        let Some(seg) = self.segments.get(&segment_id) else {
            return false;
        };
        if seg.info.size < o.offset.saturating_add(o.size) {
            return false;
        }
        let entry = self.objects.get(&o.key);
        let newest_known = entry
            .map(|e| {
                let c = e.current.as_ref().map_or(0, |v| v.object_id);
                let p = e.pending.as_ref().map_or(0, |p| p.object_id);
                c.max(p)
            })
            .unwrap_or(0);
        let mut same = false;
        if let Some(v) = entry.and_then(|e| e.current.as_ref()) {
            if v.object_id == o.version {
                if v.replicas
                    .iter()
                    .any(|r| r.segment_id == segment_id && r.offset == o.offset)
                {
                    return true; // reported again (a retried report)
                }
                if v.size != o.size
                    || v.checksum != o.checksum
                    || v.replicas.iter().any(|r| r.segment_id == segment_id)
                {
                    return false;
                }
                same = true;
            }
        }
        if !same && o.version <= newest_known {
            return false;
        }
        if self.objects.make_room().is_err() {
            return false;
        }
        let seg = self.segments.get_mut(&segment_id).expect("checked above");
        if !seg.alloc.reserve(o.offset, o.size) {
            return false;
        }
        self.next_object_id = self.next_object_id.max(o.version + 1);
        let loc = ReplicaLoc {
            segment_id,
            offset: o.offset,
        };
        let Ok(entry) = self.objects.get_or_insert(&o.key) else {
            return false;
        };
        if same {
            if let Some(v) = entry.current.as_mut() {
                v.replicas.push(loc);
            }
        } else {
            let old = entry.current.replace(Version {
                object_id: o.version,
                size: o.size,
                checksum: o.checksum,
                replicas: smallvec::smallvec![loc],
                last_access: now,
                lease_until: now,
                soft_pin_until: None,
                disk_hits: 0,
            });
            if let Some(old) = &old {
                self.indexes
                    .version_ended(old.object_id, old.soft_pin_until);
            }
            self.indexes.version_began(&o.key, o.version, None);
            if let Some(old) = old {
                self.release(&old.replicas, old.size, old.object_id, now, now);
            }
        }
        // An object only on disk segments belongs to the disk tier's eviction order.
        let only_disk = self
            .objects
            .get(&o.key)
            .and_then(|e| e.current.as_ref())
            .is_some_and(|v| v.replicas.iter().all(|r| self.is_disk(r)));
        if only_disk {
            self.objects.to_disk(&o.key);
        } else if self.objects.on_disk(&o.key) {
            self.objects.to_memory(&o.key);
        }
        self.counters.recovered_objects += 1;
        true
    }

    /// The report is complete: in a rebind, replicas the store did not confirm are gone.
    fn finish_recovery(&mut self, segment_id: u64) {
        let Some(seg) = self.segments.get_mut(&segment_id) else {
            return;
        };
        let SegState::Recovering { rebind, confirmed } = &seg.state else {
            return;
        };
        if !*rebind {
            tracing::info!(segment = %seg.info.name, adopted = confirmed.len(),
                "segment recovered and live");
            seg.state = SegState::Live;
            return;
        }
        self.start_walk(WalkKind::Confirm, segment_id);
    }

    /// What a read lease for segment `segment_id` of store `client_id` depends on: the
    /// segment's endpoint and the outbox sequence number its store must have taken every
    /// forget up to (`Notifier::grant`). Refused unless the segment is the store's and live.
    pub fn lease_terms(&self, client_id: u64, segment_id: u64) -> OpResult<(String, u64)> {
        match self.segments.get(&segment_id) {
            Some(s) if s.client_id != client_id => fail(
                Status::IllegalClient,
                format!("segment {segment_id} belongs to another client"),
            ),
            Some(s) if s.is_live() => Ok((s.info.endpoint.clone(), s.owed_seq)),
            // Its store missed that it was given up (a lost answer to a heartbeat): it must
            // mount again.
            Some(s) if matches!(s.state, SegState::Away { .. }) => fail(
                Status::SegmentNotFound,
                format!("segment {segment_id} is away here; mount it again"),
            ),
            Some(s) => fail(
                Status::ObjectUnavailable,
                format!("segment {segment_id} is {}", s.state.name()),
            ),
            None => fail(
                Status::SegmentNotFound,
                format!("segment {segment_id} is not mounted"),
            ),
        }
    }

    /// Unmounts a segment. With `keep` (a persistent store restarting), its objects are kept,
    /// unreadable, for the grace period.
    pub fn unmount(
        &mut self,
        client_id: u64,
        segment_id: u64,
        keep: bool,
        now: Instant,
    ) -> OpResult<()> {
        match self.segments.get(&segment_id) {
            None => fail(
                Status::SegmentNotFound,
                format!("segment {segment_id} is not mounted"),
            ),
            Some(s) if s.client_id != client_id => fail(
                Status::IllegalClient,
                format!("segment {segment_id} belongs to another client"),
            ),
            Some(_) => {
                if keep {
                    self.set_away(segment_id, now);
                } else {
                    self.unmount_segment(segment_id);
                }
                Ok(())
            }
        }
    }

    /// Marks a persistent segment away for the grace period (a non-persistent one, or with no
    /// grace period, is unmounted).
    fn set_away(&mut self, segment_id: u64, now: Instant) {
        let grace = self.cfg.store_grace_period_ms.0;
        let Some(seg) = self.segments.get_mut(&segment_id) else {
            return;
        };
        if seg.info.segment_uuid == 0 || grace.is_zero() {
            self.unmount_segment(segment_id);
            return;
        }
        let client = seg.client_id;
        seg.state = SegState::Away { until: now + grace };
        tracing::warn!(segment = %seg.info.name, grace_ms = grace.as_millis() as u64,
            "store away; keeping its objects (unreadable) for the grace period");
        if let Some(c) = self.clients.get_mut(&client) {
            c.segments.retain(|s| *s != segment_id);
        }
    }

    /// Removes a segment and every replica in it; objects left without replicas are dropped.
    fn unmount_segment(&mut self, segment_id: u64) {
        let Some(seg) = self.segments.remove(&segment_id) else {
            return;
        };
        self.disk_segments -= usize::from(seg.info.tier == Tier::Disk);
        self.remember_lost(seg.info.segment_uuid);
        self.segment_by_name.remove(&seg.info.name);
        if let Some(c) = self.clients.get_mut(&seg.client_id) {
            c.segments.retain(|s| *s != segment_id);
        }
        self.deferred.retain(|d| d.segment_id != segment_id);
        self.reservations.drop_segment(segment_id);
        tracing::info!(segment = %seg.info.name, "segment unmounted; dropping its replicas");
        // Its replicas are unreadable from now on (no segment backs them).
        self.start_walk(WalkKind::Drop, segment_id);
    }

    /// Queues a walk and takes its first step now (the whole walk, in a small pool).
    fn start_walk(&mut self, kind: WalkKind, segment_id: u64) {
        self.walks.push_back(Walk {
            kind,
            segment_id,
            from: 0,
            lost: 0,
        });
        self.walk_step(WALK_STEP);
    }

    /// Whether a walk over every object is in progress (`walk_step`).
    pub fn walking(&self) -> bool {
        !self.walks.is_empty()
    }

    /// Takes the next step, over at most `budget` object slots, of the first walk: dropping
    /// an unmounted segment's replicas, or a rebound segment's unconfirmed ones (objects left
    /// without a replica go). Returns whether more remains. The master's housekeeper calls it
    /// until done, letting other operations in between: a store leaving or coming back with
    /// millions of objects never holds the lock for long.
    pub fn walk_step(&mut self, budget: usize) -> bool {
        let Some(&walk) = self.walks.front() else {
            return false;
        };
        let segment_id = walk.segment_id;
        let (segments, indexes) = (&self.segments, &mut self.indexes);
        let confirmed = match (walk.kind, segments.get(&segment_id).map(|s| &s.state)) {
            (WalkKind::Drop, _) => None,
            (WalkKind::Confirm, Some(SegState::Recovering { confirmed, .. })) => Some(confirmed),
            // Gone or away meanwhile: its replicas wait (away) or are dropped (unmounted).
            (WalkKind::Confirm, _) => {
                self.walks.pop_front();
                return self.walking();
            }
        };
        let (mut lost, mut freed) = (0u64, Vec::new());
        let next = self.objects.retain_some(walk.from, budget, |_, e| {
            let goes = |r: &ReplicaLoc| {
                r.segment_id == segment_id && confirmed.is_none_or(|c| !c.contains(&r.offset))
            };
            if let Some(v) = &mut e.current {
                let before = v.replicas.len();
                let size = v.size;
                v.replicas.retain(|r| {
                    let gone = goes(r);
                    if gone {
                        freed.push((r.offset, size));
                    }
                    !gone
                });
                if v.replicas.len() < before && v.replicas.is_empty() {
                    indexes.version_ended(v.object_id, v.soft_pin_until);
                    e.current = None;
                    lost += 1;
                }
            }
            // An unfinished put keeps its replicas on a rebound segment (its put end decides).
            if let (Some(p), None) = (&mut e.pending, confirmed) {
                p.replicas.retain(|r| r.segment_id != segment_id);
            }
            e.current.is_some() || e.pending.is_some()
        });
        if let Some(seg) = self.segments.get_mut(&segment_id) {
            for (offset, size) in freed {
                seg.alloc.release(offset, size);
            }
        }
        // Counted as they go: a walk cut short (its segment mounted again) keeps its count.
        match walk.kind {
            WalkKind::Drop => self.counters.dropped_objects += lost,
            WalkKind::Confirm => self.counters.lost_objects += lost,
        }
        let lost = walk.lost + lost;
        if let Some(at) = next {
            if let Some(front) = self.walks.front_mut() {
                front.from = at;
                front.lost = lost;
            }
            return true;
        }
        self.walks.pop_front();
        match walk.kind {
            WalkKind::Drop => {
                tracing::info!(
                    segment_id,
                    dropped_objects = lost,
                    "unmounted segment's replicas dropped"
                );
            }
            WalkKind::Confirm => {
                if let Some(seg) = self.segments.get_mut(&segment_id) {
                    let confirmed = match &seg.state {
                        SegState::Recovering { confirmed, .. } => confirmed.len(),
                        _ => 0,
                    };
                    seg.state = SegState::Live;
                    tracing::info!(segment = %seg.info.name, rebind = true, confirmed, lost,
                        "segment recovered and live");
                }
            }
        }
        self.walking()
    }

    /// The live segments, for clients.
    pub fn list_segments(&self) -> Vec<SegmentEntry> {
        let mut v: Vec<SegmentEntry> = self
            .segments
            .values()
            .filter(|s| s.is_live())
            .map(|s| SegmentEntry {
                id: s.id,
                info: s.info.clone(),
                used: s.alloc.used(),
            })
            .collect();
        v.sort_by(|a, b| a.info.name.cmp(&b.info.name));
        v
    }

    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.segments.values()
    }

    /// Drops clients whose heartbeats stopped more than `client_ttl` ago, with their segments
    /// and unfinished puts. Returns how many expired.
    pub fn expire_clients(&mut self, now: Instant) -> usize {
        let ttl = self.cfg.client_ttl_ms.0;
        let expired: Vec<u64> = self
            .clients
            .iter()
            .filter(|(_, c)| now.saturating_duration_since(c.last_seen) > ttl)
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            self.drop_client(*id, now, "client expired");
        }
        self.counters.expired_clients += expired.len() as u64;
        expired.len()
    }

    /// A client leaving cleanly (`LEAVE`): dropped at once, as if it had expired.
    pub fn leave(&mut self, client_id: u64, now: Instant) {
        self.drop_client(client_id, now, "client left");
    }

    /// Drops a client with its segments (away, for a persistent store) and its unfinished
    /// puts. Only a client that held segments is news worth a warning.
    fn drop_client(&mut self, id: u64, now: Instant, what: &str) {
        let Some(client) = self.clients.remove(&id) else {
            return;
        };
        if client.segments.is_empty() {
            tracing::debug!(client_id = id, "{what}");
        } else {
            tracing::warn!(client_id = id, segments = client.segments.len(), "{what}");
        }
        for seg in client.segments {
            self.set_away(seg, now);
        }
        let objects = &self.objects;
        let keys: Vec<String> = self
            .indexes
            .pending_keys()
            .filter(|k| {
                objects
                    .get(k)
                    .and_then(|e| e.pending.as_ref())
                    .is_some_and(|p| p.client_id == id)
            })
            .map(str::to_owned)
            .collect();
        for k in keys {
            self.drop_pending(&k, now, false);
            self.counters.reclaimed_puts += 1;
        }
        for object_id in self.reservations.of_client(id) {
            if let Some(r) = self.reservations.remove(object_id) {
                self.release(&r.replicas, r.size, r.object_id, now, now);
            }
        }
    }

    // ---- objects ----

    fn check_key(key: &str) -> OpResult<()> {
        if key.is_empty() {
            return fail(Status::InvalidParams, "empty key");
        }
        Ok(())
    }

    /// Starts a put: allocates `replica_num` replicas on distinct segments (fewer when fewer
    /// segments have room, at least one) and records a pending version.
    pub fn put_start(
        &mut self,
        client_id: u64,
        key: &str,
        size: u64,
        config: &ReplicateConfig,
        now: Instant,
    ) -> OpResult<(u64, Vec<ReplicaLoc>)> {
        Self::check_key(key)?;
        self.preempt_pending(key, now)?;
        self.objects.make_room().map_err(table_full)?;
        let p = self.start_version(client_id, size, config, true, now)?;
        let answer = (p.object_id, p.replicas.clone());
        self.indexes.pending_began(key, p.started, p.object_id);
        self.objects.get_or_insert(key).map_err(table_full)?.pending = Some(Box::new(p));
        Ok(answer)
    }

    /// Fails when a put of `key` is in progress; drops one abandoned longer than the discard
    /// timeout (its space waits for the release timeout: its writer may still be writing).
    fn preempt_pending(&mut self, key: &str, now: Instant) -> OpResult<()> {
        if let Some(p) = self.objects.get(key).and_then(|e| e.pending.as_ref()) {
            let age = now.saturating_duration_since(p.started);
            if age < self.cfg.put_start_discard_timeout_ms.0 {
                return fail(
                    Status::PutInProgress,
                    format!(
                        "a put of {key:?} started {} ms ago is not finished",
                        age.as_millis()
                    ),
                );
            }
            self.drop_pending(key, now, true);
            self.counters.reclaimed_puts += 1;
        }
        Ok(())
    }

    /// Allocates the replicas of a new version of `size` bytes (evicting when the pool is
    /// full, if `may_evict`) and draws its version; the caller records it as a pending put or a
    /// reservation.
    fn start_version(
        &mut self,
        client_id: u64,
        size: u64,
        config: &ReplicateConfig,
        may_evict: bool,
        now: Instant,
    ) -> OpResult<Pending> {
        if size == 0 {
            return fail(Status::InvalidParams, "empty value");
        }
        // replica_num 0 is the default: one replica.
        let config = &ReplicateConfig {
            replica_num: config.replica_num.max(1),
            ..config.clone()
        };
        let largest = self
            .segments
            .values()
            .filter(|s| s.is_live_memory())
            .map(|s| s.alloc.capacity())
            .max()
            .unwrap_or(0);
        if largest == 0 {
            return fail(Status::NoSpace, "no segment is mounted");
        }
        if size > largest {
            return fail(
                Status::ValueTooLarge,
                format!(
                    "value of {size} bytes is larger than the largest segment ({largest} bytes)"
                ),
            );
        }
        let soft_pin_ttl = if config.soft_pin {
            let ttl = if config.soft_pin_ttl_ms == 0 {
                self.cfg.default_kv_soft_pin_ttl_ms.0
            } else {
                Duration::from_millis(config.soft_pin_ttl_ms)
            };
            Some(ttl.min(self.cfg.max_kv_soft_pin_ttl_ms.0))
        } else {
            None
        };
        self.touch_client(client_id, now);
        let mut replicas = self.allocate(size, config);
        if replicas.is_empty() && !may_evict {
            return fail(Status::NoSpace, format!("no segment has {size} free bytes"));
        }
        if replicas.is_empty() {
            self.counters.alloc_failures += 1;
            let need = size * config.replica_num as u64;
            self.evict(now, need);
            replicas = self.allocate(size, config);
        }
        if replicas.is_empty() {
            self.force_eviction = true;
            return fail(
                Status::NoSpace,
                format!("no segment has {size} free bytes, even after eviction"),
            );
        }
        if replicas.len() < config.replica_num as usize {
            self.counters.partial_allocations += 1;
        }
        // Keep usage under the watermark at every step, not only at the next housekeeping tick.
        let (used, capacity) = self.used_and_capacity();
        if used as f64 > self.cfg.eviction_high_watermark_ratio * capacity as f64 {
            self.evict(now, 0);
        }
        Ok(Pending {
            object_id: self.next_version(),
            client_id,
            size,
            replicas,
            started: now,
            soft_pin_ttl,
        })
    }

    /// Reserves space for a client's next puts, one per size: allocated and versioned now,
    /// given a key by the put's commit (`put_end` with the reservation's object id). A client
    /// holds at most `put_reservation_max_bytes`; reservations are off with a zero TTL.
    pub fn reserve(
        &mut self,
        client_id: u64,
        sizes: &[u64],
        config: &ReplicateConfig,
        now: Instant,
    ) -> Vec<OpResult<(u64, Vec<ReplicaLoc>)>> {
        let ttl = self.cfg.put_reservation_ttl_ms.0;
        let cap = self.cfg.put_reservation_max_bytes.0;
        sizes
            .iter()
            .map(|&size| {
                if ttl.is_zero() {
                    return fail(Status::InvalidParams, "put reservations are off");
                }
                let copies = u64::from(config.replica_num.max(1));
                let held = self.reservations.held_by(client_id);
                if held.saturating_add(size.saturating_mul(copies)) > cap {
                    return fail(
                        Status::NoSpace,
                        format!("this client holds {held} bytes of reservations (most {cap})"),
                    );
                }
                // Nothing is evicted for space that may go unused: the put that needs it will.
                let p = self.start_version(client_id, size, config, false, now)?;
                let answer = (p.object_id, p.replicas.clone());
                self.reservations.insert(p);
                Ok(answer)
            })
            .collect()
    }

    fn allocate(&mut self, size: u64, config: &ReplicateConfig) -> Vec<ReplicaLoc> {
        let candidates: Vec<Candidate<'_>> = self
            .segments
            .values()
            .filter(|s| s.is_live_memory() && s.alloc.largest_free() >= size)
            .map(|s| Candidate {
                id: s.id,
                name: &s.info.name,
                capacity: s.alloc.capacity(),
                free: s.alloc.free(),
            })
            .collect();
        let order = placement::order(
            &candidates,
            &config.preferred_segment,
            self.cfg.allocation_strategy,
            &mut self.rng,
        );
        let mut replicas = Vec::with_capacity(config.replica_num as usize);
        for id in order {
            if replicas.len() == config.replica_num as usize {
                break;
            }
            let seg = self.segments.get_mut(&id).expect("candidate is mounted");
            if let Some(offset) = seg.alloc.alloc(size) {
                replicas.push(ReplicaLoc {
                    segment_id: id,
                    offset,
                });
            }
        }
        replicas
    }

    /// Frees an object version's replicas (at `until`, when a reader may still be reading) and
    /// queues forgets of its records for the stores.
    fn release(
        &mut self,
        replicas: &[ReplicaLoc],
        size: u64,
        version: u64,
        until: Instant,
        now: Instant,
    ) {
        if !replicas.is_empty() {
            self.outbox_seq += 1;
            self.forget_wait = self.outbox_seq;
        }
        for r in replicas {
            if let Some(seg) = self.segments.get_mut(&r.segment_id) {
                seg.owed_seq = self.outbox_seq;
            }
            self.forget_targets.push(r.segment_id);
            self.outbox.push((
                r.segment_id,
                ForgetItem {
                    offset: r.offset,
                    version,
                },
            ));
            if until > now {
                self.deferred.push(Deferred {
                    until,
                    segment_id: r.segment_id,
                    offset: r.offset,
                    size,
                });
            } else if let Some(seg) = self.segments.get_mut(&r.segment_id) {
                seg.alloc.release(r.offset, size);
            }
        }
    }

    /// Removes the pending version of `key`; `zombie` keeps its space until the release timeout
    /// (its writer may still be writing).
    fn drop_pending(&mut self, key: &str, now: Instant, zombie: bool) {
        let Some(entry) = self.objects.get_mut(key) else {
            return;
        };
        let Some(p) = entry.pending.take() else {
            return;
        };
        self.indexes.pending_ended(p.started, p.object_id);
        if entry.current.is_none() {
            self.objects.remove(key);
        }
        let until = if zombie {
            p.started + self.cfg.put_start_release_timeout_ms.0
        } else {
            now
        };
        self.release(&p.replicas, p.size, p.object_id, until, now);
    }

    /// Finishes a put: the pending version becomes current. Idempotent for the same object id.
    pub fn put_end(
        &mut self,
        client_id: u64,
        key: &str,
        object_id: u64,
        checksum: u32,
        now: Instant,
    ) -> OpResult<()> {
        let pending_here = self
            .objects
            .get(key)
            .and_then(|e| e.pending.as_ref())
            .is_some_and(|p| p.object_id == object_id);
        if !pending_here && self.reservations.get(object_id).is_some() {
            return self.commit_reservation(client_id, key, object_id, checksum, now);
        }
        let entry = match self.objects.get_mut(key) {
            Some(e) => e,
            None => {
                return fail(
                    Status::ObjectNotFound,
                    format!("no put of {key:?} in progress"),
                )
            }
        };
        match &entry.pending {
            Some(p) if p.object_id == object_id => {
                if p.client_id != client_id {
                    return fail(
                        Status::IllegalClient,
                        "only the client that started a put may end it",
                    );
                }
                if p.replicas.is_empty() {
                    self.indexes.pending_ended(p.started, p.object_id);
                    entry.pending = None;
                    if entry.current.is_none() {
                        self.objects.remove(key);
                    }
                    return fail(
                        Status::ReplicaNotReady,
                        "every replica's segment went away during the put",
                    );
                }
            }
            _ => {
                if entry
                    .current
                    .as_ref()
                    .is_some_and(|c| c.object_id == object_id)
                {
                    return Ok(());
                }
                return fail(
                    Status::WriteSuperseded,
                    format!("put {object_id} of {key:?} was reclaimed or replaced"),
                );
            }
        }
        let p = entry.pending.take().expect("matched above");
        self.indexes.pending_ended(p.started, p.object_id);
        self.install(key, *p, checksum, now)
    }

    /// A written put becomes the key's current version; the one it replaces is released when
    /// its read leases end.
    fn install(&mut self, key: &str, p: Pending, checksum: u32, now: Instant) -> OpResult<()> {
        // A new key needs room in the object table, found before anything changes: a put
        // refused here frees its space at once.
        if self.objects.get(key).is_none() {
            if let Err(e) = self.objects.make_room() {
                self.release(&p.replicas, p.size, p.object_id, now, now);
                return Err(table_full(e));
            }
        }
        let new = Version {
            object_id: p.object_id,
            size: p.size,
            checksum,
            replicas: p.replicas.into_iter().collect(),
            last_access: now,
            lease_until: now,
            soft_pin_until: p.soft_pin_ttl.map(|ttl| now + ttl),
            disk_hits: 0,
        };
        self.indexes
            .version_began(key, new.object_id, new.soft_pin_until);
        let entry = self.objects.touch_or_insert(key).map_err(table_full)?;
        if let Some(old) = entry.current.replace(new) {
            self.indexes
                .version_ended(old.object_id, old.soft_pin_until);
            let until = old.lease_until;
            self.release(&old.replicas, old.size, old.object_id, until, now);
        }
        if let Some(&(seq, _)) = self.recently_retired.get(key) {
            self.forget_wait = self.forget_wait.max(seq);
        }
        Ok(())
    }

    /// Commits a put written into a reservation: it becomes `key`'s value unless a put of the
    /// key is in progress or a newer version of it was committed meanwhile (the reservation's
    /// version was drawn before that one's: a restarted master would let the newer win). Either
    /// way the reservation is used up; the client puts again without one.
    fn commit_reservation(
        &mut self,
        client_id: u64,
        key: &str,
        object_id: u64,
        checksum: u32,
        now: Instant,
    ) -> OpResult<()> {
        match self.reservations.get(object_id) {
            Some(r) if r.client_id != client_id => {
                return fail(
                    Status::IllegalClient,
                    "only the client that holds a reservation may commit it",
                )
            }
            Some(_) => {}
            None => {
                return fail(
                    Status::ObjectNotFound,
                    format!("reservation {object_id} expired or is unknown"),
                )
            }
        }
        let r = self.reservations.remove(object_id).expect("checked above");
        let newer = self
            .objects
            .get(key)
            .and_then(|e| e.current.as_ref())
            .map_or(0, |c| c.object_id)
            .max(object_id);
        let refusal = if let Err(e) = Self::check_key(key) {
            Some(e)
        } else if r.replicas.is_empty() {
            Some((
                Status::ReplicaNotReady,
                "every replica's segment went away during the put".to_owned(),
            ))
        } else if let Err(e) = self.preempt_pending(key, now) {
            Some(e)
        } else if newer > object_id {
            Some((
                Status::WriteSuperseded,
                format!(
                    "{key:?} got version {newer} after reservation {object_id} was made; put again"
                ),
            ))
        } else {
            None
        };
        if let Some(e) = refusal {
            // The client wrote and finished writing: the space is free at once.
            self.release(&r.replicas, r.size, r.object_id, now, now);
            return Err(e);
        }
        self.install(key, r, checksum, now)?;
        self.counters.reserved_puts += 1;
        Ok(())
    }

    pub fn put_revoke(
        &mut self,
        client_id: u64,
        key: &str,
        object_id: u64,
        now: Instant,
    ) -> OpResult<()> {
        if let Some(r) = self.reservations.get(object_id) {
            if r.client_id != client_id {
                return fail(
                    Status::IllegalClient,
                    "only the client that holds a reservation may revoke it",
                );
            }
            let r = self.reservations.remove(object_id).expect("checked above");
            self.release(&r.replicas, r.size, r.object_id, now, now);
            return Ok(());
        }
        let pending = self.objects.get(key).and_then(|e| e.pending.as_ref());
        match pending {
            Some(p) if p.object_id == object_id && p.client_id == client_id => {
                self.drop_pending(key, now, false);
                Ok(())
            }
            Some(p) if p.object_id == object_id => fail(
                Status::IllegalClient,
                "only the client that started a put may revoke it",
            ),
            _ => fail(
                Status::ObjectNotFound,
                format!("no put {object_id} of {key:?} in progress"),
            ),
        }
    }

    /// Where to read `key`; grants a read lease of `default_kv_lease_ttl` and counts as an access.
    /// A read of an object that lives only on disk may promote it (`promotion_on_hit`).
    pub fn get_replicas(&mut self, key: &str, now: Instant) -> OpResult<ObjectDesc> {
        let lease = self.cfg.default_kv_lease_ttl_ms.0;
        let unsure = self.unsure_of_misses(now);
        let segments = &self.segments;
        let (desc, on_disk) = match self.objects.touch_tiered(key) {
            Some((
                Entry {
                    current: Some(v), ..
                },
                on_disk,
            )) => {
                let replicas: Vec<ReplicaLoc> = v
                    .replicas
                    .iter()
                    .filter(|r| segments.get(&r.segment_id).is_some_and(|s| s.is_live()))
                    .cloned()
                    .collect();
                if replicas.is_empty() {
                    // Every replica's store left for good: gone, even if its record is still
                    // being dropped.
                    if !v
                        .replicas
                        .iter()
                        .any(|r| segments.contains_key(&r.segment_id))
                    {
                        return fail(Status::ObjectNotFound, format!("{key:?} not found"));
                    }
                    return fail(
                        Status::ObjectUnavailable,
                        format!("{key:?} is on a store that is restarting"),
                    );
                }
                v.last_access = now;
                v.lease_until = v.lease_until.max(now + lease);
                if on_disk {
                    v.disk_hits = v.disk_hits.saturating_add(1);
                }
                let desc = ObjectDesc {
                    size: v.size,
                    checksum: v.checksum,
                    lease_ttl_ms: lease.as_millis() as u64,
                    version: v.object_id,
                    replicas,
                };
                (desc, on_disk)
            }
            Some((
                Entry {
                    current: None,
                    pending: Some(_),
                },
                _,
            )) => {
                return fail(
                    Status::ReplicaNotReady,
                    format!("{key:?} is still being written"),
                )
            }
            _ => {
                return match unsure {
                    Some(why) => fail(
                        Status::ObjectUnavailable,
                        format!("{key:?} is not known yet: {why}"),
                    ),
                    None => fail(Status::ObjectNotFound, format!("{key:?} not found")),
                }
            }
        };
        if on_disk {
            self.counters.disk_hits += 1;
            self.maybe_promote(key, &desc.replicas);
        }
        Ok(desc)
    }

    /// A read of disk-only `key` (its live replicas `replicas`): promote it once it has been
    /// read `promotion_admission_threshold` times.
    fn maybe_promote(&mut self, key: &str, replicas: &[ReplicaLoc]) {
        if !self.cfg.promotion_on_hit {
            return;
        }
        let hits = self
            .objects
            .get(key)
            .and_then(|e| e.current.as_ref())
            .map_or(0, |v| u32::from(v.disk_hits));
        if hits < self.cfg.promotion_admission_threshold {
            return;
        }
        if let Some(from) = replicas.iter().find(|r| self.is_disk(r)) {
            self.promote(key, from.clone());
        }
    }

    /// Whether `key` has a readable value (a replica on a live segment); counts as an access.
    pub fn exists(&mut self, key: &str, now: Instant) -> bool {
        let segments = &self.segments;
        match self.objects.touch(key).and_then(|e| e.current.as_mut()) {
            Some(v)
                if v.replicas
                    .iter()
                    .any(|r| segments.get(&r.segment_id).is_some_and(|s| s.is_live())) =>
            {
                v.last_access = now;
                true
            }
            _ => false,
        }
    }

    /// A reader found the replica of `key` (version `version`) on `segment_id` corrupt: the
    /// replica is dropped (the object too when it was the last one).
    pub fn report_corrupt(&mut self, key: &str, version: u64, segment_id: u64, now: Instant) {
        let Some(entry) = self.objects.get_mut(key) else {
            return;
        };
        let Some(v) = entry.current.as_mut() else {
            return;
        };
        if v.object_id != version {
            return;
        }
        let Some(pos) = v.replicas.iter().position(|r| r.segment_id == segment_id) else {
            return;
        };
        let r = v.replicas.remove(pos);
        let size = v.size;
        if v.replicas.is_empty() {
            self.indexes.version_ended(v.object_id, v.soft_pin_until);
            entry.current = None;
            if entry.pending.is_none() {
                self.objects.remove(key);
            }
        }
        self.counters.corrupt_replicas += 1;
        tracing::warn!(
            key,
            segment_id,
            offset = r.offset,
            "replica failed its checksum; dropped"
        );
        self.release(&[r], size, version, now, now);
    }

    /// Removes `key`. Refused while a read lease runs unless `force`, which frees the space at
    /// once. A key with only an unfinished put is refused unless
    /// `force`, which revokes the put.
    pub fn remove(&mut self, key: &str, force: bool, now: Instant) -> OpResult<()> {
        let Some(entry) = self.objects.get_mut(key) else {
            return fail(Status::ObjectNotFound, format!("{key:?} not found"));
        };
        match &entry.current {
            Some(v) if v.lease_until > now && !force => {
                let left = v.lease_until.saturating_duration_since(now).as_millis();
                fail(
                    Status::ObjectHasLease,
                    format!("{key:?} has a read lease for {left} more ms"),
                )
            }
            Some(_) => {
                let v = entry.current.take().expect("matched");
                self.indexes.version_ended(v.object_id, v.soft_pin_until);
                if entry.pending.is_none() {
                    self.objects.remove(key);
                }
                // Forced or not, the space is free now: a reader still under the lease fails the
                // checksum and sees a miss, never another object's bytes.
                self.release(&v.replicas, v.size, v.object_id, now, now);
                // A put of the key that ends while these forgets are under way must wait for
                // them too, or a reader of a cached location could see this value after it.
                self.remember_retired(key, now);
                Ok(())
            }
            None if force => {
                self.drop_pending(key, now, true);
                Ok(())
            }
            None => fail(
                Status::ReplicaNotReady,
                format!("{key:?} is still being written"),
            ),
        }
    }

    /// Removes every readable object (leased ones only with `force`); returns how many.
    pub fn remove_all(&mut self, force: bool, now: Instant) -> u64 {
        let keys: Vec<String> = self
            .objects
            .iter()
            .filter(|(_, e)| {
                e.current
                    .as_ref()
                    .is_some_and(|v| force || v.lease_until <= now)
            })
            .map(|(k, _)| k.to_owned())
            .collect();
        let mut n = 0;
        for k in keys {
            if self.remove(&k, force, now).is_ok() {
                n += 1;
            }
        }
        n
    }

    // ---- eviction and housekeeping ----

    pub fn summary(&self, now: Instant) -> Summary {
        let mut s = Summary {
            clients: self.clients.len() as u64,
            segments: self.segments.len() as u64,
            deferred_bytes: self
                .deferred
                .iter()
                .map(|d| super::allocator::aligned(d.size))
                .sum(),
            ..Summary::default()
        };
        for seg in self.segments.values() {
            match seg.state {
                SegState::Live if seg.info.tier == Tier::Disk => {
                    s.disk_used_bytes += seg.alloc.used();
                    s.disk_capacity_bytes += seg.alloc.capacity();
                }
                SegState::Live => {
                    s.used_bytes += seg.alloc.used();
                    s.capacity_bytes += seg.alloc.capacity();
                }
                SegState::Away { .. } => s.away_segments += 1,
                SegState::Recovering { .. } => s.recovering_segments += 1,
            }
        }
        // Kept as objects change: a summary (every metrics scrape) never walks the objects. A
        // soft pin that ran out since the last housekeeping tick is not counted.
        s.keys = self.indexes.keys();
        s.soft_pinned_keys = self.indexes.soft_pinned();
        s.pending_puts = self.indexes.pending();
        s.reservations = self.reservations.len() as u64;
        s.disk_keys = self.objects.disk_len() as u64;
        s.moves_in_flight = self.moves.len() as u64;
        s.demoting_bytes = self.moves.demoting_total();
        let _ = now;
        s
    }

    /// The summary's object counts, recounted by walking every object (tests check the kept
    /// counts against it).
    #[cfg(test)]
    fn recount(&self, now: Instant) -> (u64, u64, u64) {
        let (mut keys, mut pinned, mut pending) = (0, 0, 0);
        for e in self.objects.values() {
            if let Some(v) = &e.current {
                keys += 1;
                pinned += u64::from(v.soft_pin_until.is_some_and(|t| t > now));
            }
            pending += u64::from(e.pending.is_some());
        }
        (keys, pinned, pending)
    }

    /// Of the memory tier: eviction keeps it under the watermark.
    fn used_and_capacity(&self) -> (u64, u64) {
        self.segments
            .values()
            .filter(|s| s.is_live_memory())
            .fold((0, 0), |(u, c), s| {
                (u + s.alloc.used(), c + s.alloc.capacity())
            })
    }

    /// Evicts least-recently-used objects, if usage is over the high watermark (or an allocation
    /// failed since the last run), down to `(watermark − ratio) × capacity`, and at least
    /// `at_least` bytes. Returns the bytes freed or being freed.
    ///
    /// An object on a store with a disk tier is demoted rather than dropped (`demote`): its
    /// memory is freed once the copy is confirmed, so the watermark counts the demotions under
    /// way as freed. With `at_least` (a put needs the memory now) objects are dropped.
    pub fn evict(&mut self, now: Instant, at_least: u64) -> u64 {
        let (used, capacity) = self.used_and_capacity();
        let used = used.saturating_sub(self.moves.demoting_total());
        let forced = std::mem::take(&mut self.force_eviction) || at_least > 0;
        let need = eviction::bytes_to_free(
            used,
            capacity,
            self.cfg.eviction_high_watermark_ratio,
            self.cfg.eviction_ratio,
            forced,
        )
        .max(at_least);
        if need == 0 || self.cfg.eviction_ratio == 0.0 {
            return 0;
        }
        let mode = if at_least == 0 {
            Eviction::DemoteOrDrop
        } else {
            Eviction::Drop
        };
        self.evict_walk(now, need, mode)
    }

    /// Makes room for a put of `bytes` in all, the largest value `largest` bytes, without
    /// dropping anything: when memory has less free (or no free extent that large), objects
    /// are demoted to their stores' disk tiers. Returns whether the put should wait for
    /// demotions under way (none are, or no more can be started: it should not).
    pub fn make_room(&mut self, bytes: u64, largest: u64, now: Instant) -> bool {
        if self.disk_segments == 0 {
            return false;
        }
        let (used, capacity) = self.used_and_capacity();
        let free = capacity.saturating_sub(used);
        let extent = self
            .segments
            .values()
            .filter(|s| s.is_live_memory())
            .map(|s| s.alloc.largest_free())
            .max()
            .unwrap_or(0);
        if (free >= bytes && extent >= largest) || self.cfg.eviction_ratio == 0.0 {
            return false;
        }
        // Freed space is contiguous only by chance: a value larger than every free extent asks
        // for at least its own size again.
        let need = bytes
            .saturating_sub(free)
            .max(if extent < largest { largest } else { 0 });
        let coming = self.moves.demoting_total();
        if coming < need {
            self.evict_walk(now, need - coming, Eviction::DemoteOnly);
        }
        self.moves.demoting_total() > 0
    }

    /// One eviction walk over memory's least recently used objects, for `need` bytes.
    fn evict_walk(&mut self, now: Instant, need: u64, mode: Eviction) -> u64 {
        let (segments, moves) = (&self.segments, &self.moves);
        let victims = self
            .objects
            .eviction_walk(need, |_, entry, set_aside_pass| {
                let Some(v) = &entry.current else {
                    return Verdict::PassOver; // only a put in progress
                };
                if moves.contains(v.object_id) {
                    return Verdict::Skip; // already leaving memory (or coming in)
                }
                // Memory is what is short: an object only on disk frees none of it.
                let on_live_segment = v.replicas.iter().any(|r| {
                    segments
                        .get(&r.segment_id)
                        .is_some_and(|s| s.is_live_memory())
                });
                eviction::verdict(v, on_live_segment, set_aside_pass, now)
            });
        let (mut freed, mut dropped, mut demoting) = (0, 0u64, 0u64);
        for k in &victims {
            if mode != Eviction::Drop {
                match self.demote(k, now) {
                    Demotion::Started(bytes) | Demotion::Done(bytes) => {
                        freed += bytes;
                        demoting += 1;
                        continue;
                    }
                    // Its store's queue is full: the object stays until the copies drain, or
                    // until a put needs its memory at once.
                    Demotion::Wait => continue,
                    Demotion::Drop if mode == Eviction::DemoteOnly => continue,
                    Demotion::Drop => {}
                }
            }
            if let Some(bytes) = self.drop_evicted(k, Tier::Memory, now) {
                freed += bytes;
                dropped += 1;
                self.counters.evicted_bytes += bytes;
            }
        }
        self.counters.eviction_runs += 1;
        self.counters.evicted_objects += dropped;
        if dropped > 0 || demoting > 0 {
            tracing::info!(
                dropped,
                demoting,
                bytes = freed,
                "evicted least recently used objects"
            );
        }
        freed
    }

    /// Drops the current version of `key` as eviction of `tier` does, and logs it; returns
    /// the bytes it held.
    fn drop_evicted(&mut self, k: &str, tier: Tier, now: Instant) -> Option<u64> {
        let entry = self.objects.get_mut(k)?;
        let v = entry.current.take()?;
        self.evictions.push(k, unix_micros(), tier);
        self.indexes.version_ended(v.object_id, v.soft_pin_until);
        if entry.pending.is_none() {
            self.objects.remove(k);
        }
        let freed: u64 = v
            .replicas
            .iter()
            .filter_map(|r| self.segments.get(&r.segment_id))
            .map(|s| s.alloc.footprint(v.size))
            .sum();
        self.release(&v.replicas, v.size, v.object_id, now, now);
        self.remember_retired(k, now);
        Some(freed)
    }

    /// Remembers that `key`'s value was just evicted or removed, with the forgets that retire
    /// it: the next value of the key is acknowledged only once no store can serve the old one
    /// from a cached location (`install` waits for those forgets).
    fn remember_retired(&mut self, key: &str, now: Instant) {
        if self.cfg.store_read_lease().is_zero() {
            return;
        }
        self.recently_retired
            .insert(key.to_string(), (self.outbox_seq, now));
        self.retired_order.push_back((now, key.to_string()));
    }

    /// The live segment of tier `tier` of the store (client) that holds segment `id`: its
    /// disk tier for a memory segment, and the other way round.
    fn sibling(&self, id: u64, tier: Tier) -> Option<u64> {
        let client = self.segments.get(&id)?.client_id;
        let mine = &self.clients.get(&client)?.segments;
        mine.iter().copied().find(|s| {
            self.segments
                .get(s)
                .is_some_and(|s| s.is_live() && s.info.tier == tier)
        })
    }

    fn is_disk(&self, r: &ReplicaLoc) -> bool {
        self.segments
            .get(&r.segment_id)
            .is_some_and(|s| s.info.tier == Tier::Disk)
    }

    /// Memory gives `key` up: to its store's disk tier when it has one with room.
    fn demote(&mut self, key: &str, now: Instant) -> Demotion {
        let Some(v) = self.objects.get(key).and_then(|e| e.current.as_ref()) else {
            return Demotion::Drop;
        };
        let (version, size, checksum) = (v.object_id, v.size, v.checksum);
        let memory: Vec<ReplicaLoc> = v
            .replicas
            .iter()
            .filter(|r| !self.is_disk(r))
            .cloned()
            .collect();
        let memory_bytes: u64 = memory
            .iter()
            .filter_map(|r| self.segments.get(&r.segment_id))
            .map(|s| s.alloc.footprint(size))
            .sum();
        if v.replicas.iter().any(|r| self.is_disk(r)) {
            // Already on disk (reported by a store that died mid-demotion): memory just goes.
            self.leave_memory(key, &memory, now);
            return Demotion::Done(memory_bytes);
        }
        let Some((from, via)) = memory.iter().find_map(|r| {
            self.sibling(r.segment_id, Tier::Disk)
                .map(|d| (r.clone(), d))
        }) else {
            return Demotion::Drop;
        };
        if size > MAX_MOVE_BYTES {
            self.counters.disk_full_drops += 1;
            return Demotion::Drop;
        }
        if self.moves.demoting(via) + size > self.cfg.disk_tier_queue_bytes.0 {
            return Demotion::Wait;
        }
        let Some(offset) = self.alloc_on_disk(via, size, now) else {
            self.counters.disk_full_drops += 1;
            return Demotion::Drop;
        };
        let to = ReplicaLoc {
            segment_id: via,
            offset,
        };
        self.moves.start(Move {
            kind: MoveKind::Demote,
            key: key.into(),
            version,
            size,
            checksum,
            from,
            to,
            via,
        });
        Demotion::Started(memory_bytes)
    }

    /// Space for `size` bytes on disk segment `id`, its own eviction making room first when
    /// it is over its watermark or full.
    fn alloc_on_disk(&mut self, id: u64, size: u64, now: Instant) -> Option<u64> {
        let (used, capacity, footprint) = {
            let seg = self.segments.get(&id)?;
            (
                seg.alloc.used(),
                seg.alloc.capacity(),
                seg.alloc.footprint(size),
            )
        };
        let over = eviction::bytes_to_free(
            used + footprint,
            capacity,
            self.cfg.disk_eviction_high_watermark_ratio,
            self.cfg.disk_eviction_ratio,
            false,
        );
        if over > 0 {
            self.evict_disk(id, over, now);
        }
        if let Some(offset) = self.segments.get_mut(&id)?.alloc.alloc(size) {
            return Some(offset);
        }
        self.evict_disk(id, footprint, now);
        self.segments.get_mut(&id)?.alloc.alloc(size)
    }

    /// Drops objects that live only on disk segment `id`, least recently used first, until
    /// `need` bytes are free (leased and moving objects stay).
    fn evict_disk(&mut self, id: u64, need: u64, now: Instant) -> u64 {
        let Some(seg) = self.segments.get(&id) else {
            return 0;
        };
        let block = seg.alloc.footprint(1);
        let moves = &self.moves;
        let victims = self.objects.disk_eviction_walk(need, |_, entry, _| {
            let Some(v) = &entry.current else {
                return Verdict::Skip;
            };
            if moves.contains(v.object_id) || !v.replicas.iter().any(|r| r.segment_id == id) {
                return Verdict::Skip;
            }
            if v.lease_until > now {
                return Verdict::PassOver;
            }
            Verdict::Evict(v.size.div_ceil(block) * block)
        });
        let mut freed = 0;
        for k in &victims {
            if let Some(bytes) = self.drop_evicted(k, Tier::Disk, now) {
                freed += bytes;
                self.counters.disk_evicted_objects += 1;
                self.counters.disk_evicted_bytes += bytes;
            }
        }
        if !victims.is_empty() {
            tracing::info!(
                segment_id = id,
                objects = victims.len(),
                bytes = freed,
                "disk tier evicted least recently used objects"
            );
        }
        freed
    }

    /// `key`'s memory replicas go (readers under a lease keep theirs until it ends) and it
    /// lives on in the disk tier.
    fn leave_memory(&mut self, key: &str, memory: &[ReplicaLoc], now: Instant) {
        let Some(v) = self.objects.get_mut(key).and_then(|e| e.current.as_mut()) else {
            return;
        };
        v.replicas.retain(|r| !memory.contains(r));
        v.disk_hits = 0;
        let (size, version, until) = (v.size, v.object_id, v.lease_until);
        self.objects.to_disk(key);
        self.release(memory, size, version, until, now);
    }

    /// The store of disk replica `from` copies `key` back to its memory segment, if that has
    /// room (promotion never evicts: the next eviction makes room again).
    fn promote(&mut self, key: &str, from: ReplicaLoc) {
        let Some(v) = self.objects.get(key).and_then(|e| e.current.as_ref()) else {
            return;
        };
        let (version, size, checksum) = (v.object_id, v.size, v.checksum);
        if self.moves.contains(version) || size > MAX_MOVE_BYTES {
            return;
        }
        let Some(memory) = self.sibling(from.segment_id, Tier::Memory) else {
            return;
        };
        let Some(seg) = self.segments.get_mut(&memory) else {
            return;
        };
        let Some(offset) = seg.alloc.alloc(size) else {
            return;
        };
        self.moves.start(Move {
            kind: MoveKind::Promote,
            key: key.into(),
            version,
            size,
            checksum,
            via: from.segment_id,
            from,
            to: ReplicaLoc {
                segment_id: memory,
                offset,
            },
        });
    }

    /// The queued moves, grouped by the endpoint of the store that does them.
    pub fn take_moves(&mut self) -> Vec<(String, Vec<MoveItem>)> {
        let mut by_endpoint: HashMap<&str, Vec<MoveItem>> = HashMap::new();
        let mut orphans = Vec::new();
        for m in self.moves.take_queued() {
            match self.segments.get(&m.via).filter(|s| s.is_live()) {
                Some(seg) => by_endpoint
                    .entry(seg.info.endpoint.as_str())
                    .or_default()
                    .push(m.item()),
                None => orphans.push(m.version),
            }
        }
        let jobs = by_endpoint
            .into_iter()
            .map(|(e, items)| (e.to_owned(), items))
            .collect();
        // Their store went away before the move was sent: the moves fail.
        let failed: Vec<(u64, crate::transfer::Status)> = orphans
            .into_iter()
            .map(|v| (v, crate::transfer::Status::SegmentNotFound))
            .collect();
        if !failed.is_empty() {
            self.moved(&failed, Instant::now());
        }
        jobs
    }

    /// The outcome of moves, by object version, as their stores answered (a store that did
    /// not answer counts as a failure). A copy that landed replaces the source replica; one
    /// whose source failed its checksum drops that replica; any other failure leaves the
    /// object where it was. The destination's space goes back whenever the object did not
    /// move.
    pub fn moved(&mut self, results: &[(u64, crate::transfer::Status)], now: Instant) {
        use crate::transfer::Status;
        for &(version, status) in results {
            let Some(m) = self.moves.finish(version) else {
                continue;
            };
            let landed = status == Status::Ok
                && self
                    .segments
                    .get(&m.to.segment_id)
                    .is_some_and(|s| s.is_live());
            let here = self
                .objects
                .get(&m.key)
                .and_then(|e| e.current.as_ref())
                .is_some_and(|v| v.object_id == m.version && v.replicas.contains(&m.from));
            if landed && here {
                self.moved_in(&m, now);
                continue;
            }
            self.release(std::slice::from_ref(&m.to), m.size, m.version, now, now);
            if status == Status::ChecksumMismatch && here {
                self.report_corrupt(&m.key, m.version, m.from.segment_id, now);
            } else if status != Status::Ok {
                self.counters.move_failures += 1;
                tracing::warn!(key = %m.key, kind = ?m.kind, status = status.name(),
                    "copy between tiers failed; the object stays where it was");
            }
        }
        // Nothing waits on these forgets: no client operation is answered by a move.
        self.take_forget_wait();
    }

    /// A confirmed move: the copy at `m.to` replaces the replicas of the tier it left.
    fn moved_in(&mut self, m: &Move, now: Instant) {
        match m.kind {
            MoveKind::Demote => {
                let memory: Vec<ReplicaLoc> = self
                    .objects
                    .get(&m.key)
                    .and_then(|e| e.current.as_ref())
                    .map(|v| {
                        v.replicas
                            .iter()
                            .filter(|r| !self.is_disk(r))
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                if let Some(v) = self
                    .objects
                    .get_mut(&m.key)
                    .and_then(|e| e.current.as_mut())
                {
                    v.replicas.push(m.to.clone());
                }
                self.leave_memory(&m.key, &memory, now);
                self.counters.demoted_objects += 1;
                self.counters.demoted_bytes += m.size;
            }
            MoveKind::Promote => {
                let Some(v) = self
                    .objects
                    .get_mut(&m.key)
                    .and_then(|e| e.current.as_mut())
                else {
                    return;
                };
                let disk: Vec<ReplicaLoc> = std::mem::take(&mut v.replicas).into_iter().collect();
                v.replicas.push(m.to.clone());
                v.disk_hits = 0;
                let (size, version, until) = (v.size, v.object_id, v.lease_until);
                self.objects.to_memory(&m.key);
                self.release(&disk, size, version, until, now);
                self.counters.promoted_objects += 1;
                self.counters.promoted_bytes += m.size;
            }
        }
    }

    /// Periodic work: expire clients, release deferred space, reclaim abandoned puts, evict.
    pub fn housekeeping(&mut self, now: Instant) {
        self.expire_clients(now);
        let given_up: Vec<u64> = self
            .segments
            .values()
            .filter(|s| matches!(s.state, SegState::Away { until } if until <= now))
            .map(|s| s.id)
            .collect();
        for id in given_up {
            if let Some(s) = self.segments.get(&id) {
                tracing::warn!(segment = %s.info.name, "store did not come back within the grace period; dropping its objects");
            }
            self.unmount_segment(id);
            self.counters.segments_given_up += 1;
        }
        let mut i = 0;
        while i < self.deferred.len() {
            if self.deferred[i].until <= now {
                let d = self.deferred.swap_remove(i);
                if let Some(seg) = self.segments.get_mut(&d.segment_id) {
                    seg.alloc.release(d.offset, d.size);
                }
            } else {
                i += 1;
            }
        }
        let release = self.cfg.put_start_release_timeout_ms.0;
        let stale = match now.checked_sub(release) {
            Some(before) => self.indexes.pending_started_before(before),
            None => Vec::new(),
        };
        for k in stale {
            self.drop_pending(&k, now, false);
            self.counters.reclaimed_puts += 1;
        }
        self.expire_reservations(now);
        self.expire_soft_pins(now);
        self.evict(now, 0);
    }

    /// Soft pins that ran out are cleared, so the kept count of pinned objects stays exact.
    fn expire_soft_pins(&mut self, now: Instant) {
        for (key, version) in self.indexes.pins_expired(now) {
            if let Some(v) = self
                .objects
                .get_mut(&key)
                .and_then(|e| e.current.as_mut())
                .filter(|v| v.object_id == version)
            {
                v.soft_pin_until = None;
                self.objects.unpinned(&key);
            }
        }
    }

    /// Reservations unused for twice their TTL are dropped. Their client may have started a
    /// write just in time and be slow finishing it, so the space waits for the release timeout,
    /// as an abandoned put's does. (A live client revokes the reservations it let expire.)
    fn expire_reservations(&mut self, now: Instant) {
        let limit = self.cfg.put_reservation_ttl_ms.0 * 2;
        let expired = match now.checked_sub(limit) {
            Some(before) => self.reservations.made_before(before),
            None => Vec::new(),
        };
        for object_id in expired {
            if let Some(r) = self.reservations.remove(object_id) {
                let until = r.started + self.cfg.put_start_release_timeout_ms.0;
                self.release(&r.replicas, r.size, r.object_id, until, now);
                self.counters.expired_reservations += 1;
            }
        }
    }

    /// Up to `limit` readable keys starting with `prefix`, sorted, and whether more match.
    /// Stops as soon as it has `limit + 1`, so a small limit is cheap on a large pool.
    pub fn keys_with_prefix(&self, prefix: &str, limit: usize) -> (Vec<String>, bool) {
        let mut keys: Vec<String> = self
            .objects
            .iter()
            .filter(|(k, e)| e.current.is_some() && k.starts_with(prefix))
            .map(|(k, _)| k.to_owned())
            .take(limit.saturating_add(1))
            .collect();
        let truncated = keys.len() > limit;
        keys.truncate(limit);
        keys.sort();
        (keys, truncated)
    }

    /// Warms the cache for a batch operation on `keys` (see `ObjectTable::prefetch`).
    pub fn prefetch<K: AsRef<str>>(&self, keys: &[K]) {
        self.objects.prefetch(keys);
    }

    /// An object's details for the admin API.
    /// Whether moves wait for the mover.
    pub fn has_queued_moves(&self) -> bool {
        self.moves.has_queued()
    }

    /// Whether `key`'s value lives only in a disk tier.
    pub fn on_disk_only(&self, key: &str) -> bool {
        self.objects.on_disk(key)
    }

    /// Whether version `object_id` is being copied between tiers.
    pub fn moving(&self, object_id: u64) -> bool {
        self.moves.contains(object_id)
    }

    pub fn lookup(&self, key: &str) -> Option<&Entry> {
        self.objects.get(key)
    }

    pub fn segment(&self, id: u64) -> Option<&Segment> {
        self.segments.get(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ByteSize, Millis};

    fn seg(name: &str, size: u64) -> SegmentInfo {
        SegmentInfo {
            name: name.into(),
            endpoint: format!("{name}:1"),
            size,
            ..Default::default()
        }
    }

    fn state() -> (MasterState, Instant) {
        let mut st = MasterState::new(MasterConfig::default());
        let t0 = Instant::now();
        st.mount(1, seg("a", 1 << 20), false, t0).unwrap();
        (st, t0)
    }

    const ONE: ReplicateConfig = ReplicateConfig {
        replica_num: 1,
        soft_pin: false,
        soft_pin_ttl_ms: 0,
        preferred_segment: String::new(),
    };

    #[test]
    fn a_new_leader_does_not_deny_keys_its_stores_have_not_reported_yet() {
        let mut st = MasterState::new(MasterConfig::default());
        let t0 = Instant::now();
        st.learn_for(Duration::from_secs(10), t0);
        let e = st.get_replicas("k", t0).unwrap_err();
        assert_eq!(e.0, Status::ObjectUnavailable, "{}", e.1);
        assert!(e.1.contains("took office"), "{}", e.1);
        // A persistent store reporting what it kept: still unsure after the window.
        let later = t0 + Duration::from_secs(11);
        let mut kept = seg("a", 1 << 20);
        kept.segment_uuid = 42;
        st.mount(1, kept, true, later).unwrap();
        let e = st.get_replicas("k", later).unwrap_err();
        assert_eq!(e.0, Status::ObjectUnavailable, "{}", e.1);
        assert!(e.1.contains("still reporting"), "{}", e.1);
        // Without either, an unknown key is a miss.
        let (mut fresh, t0) = state();
        assert_eq!(
            fresh.get_replicas("k", t0).unwrap_err().0,
            Status::ObjectNotFound
        );
    }

    #[test]
    fn a_name_held_by_a_live_store_is_refused_and_its_objects_kept() {
        let (mut st, t0) = state();
        let (id, _) = st.put_start(7, "k", 100, &ONE, t0).unwrap();
        st.put_end(7, "k", id, 11, t0).unwrap();
        // Another store (other files) under the same name while store 1 heartbeats: refused.
        let other = SegmentInfo {
            shm_path: "/dev/shm/elsewhere/a.seg".into(),
            ..seg("a", 1 << 20)
        };
        let e = st.mount(2, other.clone(), false, t0).unwrap_err();
        assert_eq!(e.0, Status::SegmentExists);
        assert!(e.1.contains("held by a running store at a:1"), "{}", e.1);
        assert_eq!(
            st.get_replicas("k", t0).unwrap().checksum,
            11,
            "objects kept"
        );
        assert!(!st.ping(1, t0), "the holder is still known");
        // Once the holder has stopped heartbeating for longer than the client TTL, the name
        // goes to the newcomer, and the old holder, if it still ran, is told to mount again.
        let later = t0 + Duration::from_secs(11);
        st.mount(2, other, false, later).unwrap();
        assert!(
            st.get_replicas("k", later).is_err(),
            "its objects went with its memory"
        );
        assert!(st.ping(1, later), "the old holder must mount again");
    }

    #[test]
    fn the_same_store_restarting_on_its_own_files_takes_its_name_back_at_once() {
        let mut st = MasterState::new(MasterConfig::default());
        let t0 = Instant::now();
        let files = SegmentInfo {
            shm_path: "/dev/shm/rbgctl/a.seg".into(),
            host_id: "boot-1".into(),
            ..seg("a", 1 << 20)
        };
        st.mount(1, files.clone(), false, t0).unwrap();
        // kill -9 and restart: a new client id, the same files (the lock proved the old one gone).
        st.mount(2, files, false, t0).unwrap();
        assert!(st.ping(1, t0), "the dead holder is forgotten");
    }

    #[test]
    fn a_put_is_invisible_until_it_ends_and_replaces_atomically() {
        let (mut st, t0) = state();
        let (id1, _) = st.put_start(7, "k", 100, &ONE, t0).unwrap();
        assert_eq!(
            st.get_replicas("k", t0).unwrap_err().0,
            Status::ReplicaNotReady
        );
        assert!(!st.exists("k", t0));
        st.put_end(7, "k", id1, 11, t0).unwrap();
        assert_eq!(st.get_replicas("k", t0).unwrap().checksum, 11);
        // A second put: readers keep seeing the first value until it ends.
        let (id2, _) = st.put_start(7, "k", 200, &ONE, t0).unwrap();
        assert_eq!(st.get_replicas("k", t0).unwrap().size, 100);
        assert_eq!(
            st.put_end(8, "k", id2, 22, t0).unwrap_err().0,
            Status::IllegalClient
        );
        st.put_end(7, "k", id2, 22, t0).unwrap();
        let d = st.get_replicas("k", t0).unwrap();
        assert_eq!((d.size, d.checksum), (200, 22));
        st.put_end(7, "k", id2, 22, t0).unwrap(); // idempotent
    }

    #[test]
    fn a_reservation_becomes_the_value_of_the_key_its_commit_names() {
        let (mut st, t0) = state();
        let used = |st: &MasterState| st.segments().map(|s| s.alloc.used()).sum::<u64>();
        let r = st.reserve(7, &[128, 128], &ONE, t0);
        let (id, replicas) = r[0].clone().unwrap();
        assert_eq!(used(&st), 256, "reserved space is allocated");
        assert_eq!(st.summary(t0).reservations, 2);
        assert!(!st.exists("k", t0), "a reservation is no key's");
        assert_eq!(
            st.put_end(8, "k", id, 5, t0).unwrap_err().0,
            Status::IllegalClient,
            "only its holder commits it"
        );
        st.put_end(7, "k", id, 5, t0).unwrap();
        let d = st.get_replicas("k", t0).unwrap();
        assert_eq!((d.version, d.checksum, d.replicas), (id, 5, replicas));
        st.put_end(7, "k", id, 5, t0).unwrap(); // a retried commit is idempotent
        assert_eq!(st.counters.reserved_puts, 1);
        // The other one is handed back: its space is free at once.
        let (other, _) = r[1].clone().unwrap();
        st.put_revoke(7, "", other, t0).unwrap();
        assert_eq!(used(&st), 128);
        assert_eq!(st.summary(t0).reservations, 0);
    }

    #[test]
    fn a_full_pool_evicts_for_a_put_but_not_for_a_reservation() {
        let mut st = MasterState::new(MasterConfig {
            eviction_high_watermark_ratio: 1.0,
            ..MasterConfig::default()
        });
        let t0 = Instant::now();
        st.mount(1, seg("a", 1 << 20), false, t0).unwrap();
        for i in 0..16 {
            put(&mut st, &format!("k{i}"), 64 << 10, 1, t0);
        }
        let later = t0 + Duration::from_secs(60); // read leases over
        let r = st.reserve(7, &[64 << 10], &ONE, later);
        assert_eq!(r[0].clone().unwrap_err().0, Status::NoSpace);
        assert_eq!(
            st.summary(later).keys,
            16,
            "nothing evicted for a reservation"
        );
        st.put_start(7, "new", 64 << 10, &ONE, later).unwrap();
        assert!(st.summary(later).keys < 16, "a put evicts");
    }

    #[test]
    fn a_reservation_older_than_the_keys_newest_value_cannot_replace_it() {
        let (mut st, t0) = state();
        let (old, _) = st.reserve(7, &[128], &ONE, t0)[0].clone().unwrap();
        let newer = put(&mut st, "k", 100, 1, t0);
        assert!(newer.version > old);
        assert_eq!(
            st.put_end(7, "k", old, 2, t0).unwrap_err().0,
            Status::WriteSuperseded
        );
        assert_eq!(
            st.get_replicas("k", t0).unwrap().checksum,
            1,
            "newer value kept"
        );
        assert_eq!(st.summary(t0).reservations, 0, "the reservation is used up");
        assert_eq!(
            st.put_end(7, "other", old, 2, t0).unwrap_err().0,
            Status::ObjectNotFound,
            "and cannot be committed again"
        );
    }

    #[test]
    fn reservations_are_bounded_expire_and_go_with_their_client_or_segment() {
        let cfg = MasterConfig {
            put_reservation_max_bytes: crate::config::ByteSize(300),
            ..MasterConfig::default()
        };
        let mut st = MasterState::new(cfg);
        let t0 = Instant::now();
        st.mount(1, seg("a", 1 << 20), false, t0).unwrap();
        let r = st.reserve(7, &[128, 128, 128], &ONE, t0);
        assert!(r[0].is_ok() && r[1].is_ok());
        assert_eq!(
            r[2].clone().unwrap_err().0,
            Status::NoSpace,
            "past the limit"
        );
        // Unused for twice the TTL: dropped; the space waits for the release timeout.
        let ttl = st.config().put_reservation_ttl_ms.0;
        st.housekeeping(t0 + ttl * 2 + Duration::from_millis(1));
        assert_eq!(st.summary(t0).reservations, 0);
        assert_eq!(st.counters.expired_reservations, 2);
        assert_eq!(st.summary(t0).deferred_bytes, 256);
        // A client that leaves takes its reservations with it.
        st.reserve(9, &[128], &ONE, t0)[0].clone().unwrap();
        st.leave(9, t0);
        assert_eq!(st.summary(t0).reservations, 0);
        // A segment that goes takes its replicas out of reservations: committing fails.
        let (id, _) = st.reserve(7, &[128], &ONE, t0)[0].clone().unwrap();
        let seg_id = st.segments().next().unwrap().id;
        st.unmount(1, seg_id, false, t0).unwrap();
        assert_eq!(
            st.put_end(7, "k", id, 1, t0).unwrap_err().0,
            Status::ReplicaNotReady
        );
        let off = MasterState::new(MasterConfig {
            put_reservation_ttl_ms: Millis(Duration::ZERO),
            ..MasterConfig::default()
        })
        .reserve(7, &[128], &ONE, t0);
        assert_eq!(off[0].clone().unwrap_err().0, Status::InvalidParams, "off");
    }

    #[test]
    fn abandoned_puts_are_preempted_then_reclaimed() {
        let (mut st, t0) = state();
        let (id, _) = st.put_start(7, "k", 1000, &ONE, t0).unwrap();
        assert_eq!(
            st.put_start(8, "k", 1000, &ONE, t0).unwrap_err().0,
            Status::PutInProgress
        );
        let later = t0 + Duration::from_secs(31);
        let (id2, _) = st.put_start(8, "k", 1000, &ONE, later).unwrap();
        assert_eq!(
            st.put_end(7, "k", id, 1, later).unwrap_err().0,
            Status::WriteSuperseded
        );
        st.put_end(8, "k", id2, 1, later).unwrap();
        // The zombie's space is held until the release timeout, then freed.
        assert_eq!(st.summary(later).deferred_bytes, 1024);
        let t = t0 + Duration::from_secs(601);
        st.ping(1, t); // the store stays alive
        st.housekeeping(t);
        assert_eq!(st.summary(t).deferred_bytes, 0);
        // A writer that stops heartbeating loses its unfinished put at expiry.
        st.ping(9, t);
        st.put_start(9, "z", 10, &ONE, t).unwrap();
        st.ping(1, t + Duration::from_secs(11));
        st.expire_clients(t + Duration::from_secs(11));
        assert!(st.lookup("z").is_none());
    }

    #[test]
    fn leases_and_removal() {
        let (mut st, t0) = state();
        let (id, _) = st.put_start(7, "k", 10, &ONE, t0).unwrap();
        st.put_end(7, "k", id, 0, t0).unwrap();
        st.get_replicas("k", t0).unwrap();
        assert_eq!(
            st.remove("k", false, t0).unwrap_err().0,
            Status::ObjectHasLease
        );
        assert_eq!(st.remove_all(false, t0), 0);
        assert_eq!(
            st.remove_all(false, t0 + Duration::from_secs(11)),
            1,
            "lease over"
        );
        assert_eq!(
            st.remove("k", false, t0).unwrap_err().0,
            Status::ObjectNotFound
        );
        assert_eq!(st.summary(t0).used_bytes, 0);
    }

    #[test]
    fn full_pool_evicts_for_a_new_put_but_never_leased_objects() {
        // Watermark 1.0: only a failed allocation triggers eviction here.
        let cfg = MasterConfig {
            eviction_high_watermark_ratio: 1.0,
            ..MasterConfig::default()
        };
        let mut st = MasterState::new(cfg);
        let t0 = Instant::now();
        st.mount(1, seg("a", 1 << 20), false, t0).unwrap();
        for i in 0..16 {
            let key = format!("k{i}");
            let (id, _) = st.put_start(7, &key, 64 << 10, &ONE, t0).unwrap();
            st.put_end(7, &key, id, 0, t0).unwrap();
        }
        // Everything is leased: no room, no eviction.
        for i in 0..16 {
            st.get_replicas(&format!("k{i}"), t0).unwrap();
        }
        assert_eq!(
            st.put_start(7, "new", 64 << 10, &ONE, t0).unwrap_err().0,
            Status::NoSpace
        );
        let later = t0 + Duration::from_secs(11);
        st.put_start(7, "new", 64 << 10, &ONE, later).unwrap();
        assert!(st.counters.evicted_objects >= 1);
    }

    #[test]
    fn eviction_takes_the_least_recently_used_as_kept_through_touches_and_removals() {
        let cfg = MasterConfig {
            eviction_high_watermark_ratio: 1.0,
            default_kv_lease_ttl_ms: Millis(Duration::from_millis(10)),
            ..MasterConfig::default()
        };
        let mut st = MasterState::new(cfg);
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        st.mount(1, seg("a", 1 << 20), false, t0).unwrap();
        // Sixteen objects of 64 KiB fill the segment.
        for i in 0..16 {
            put(&mut st, &format!("k{i}"), 64 << 10, 0, at(i));
        }
        st.exists("k0", at(20));
        st.get_replicas("k1", at(21)).unwrap();
        // Replacing k2 (full pool) evicts the oldest: k2's old value.
        put(&mut st, "k2", 64 << 10, 0, at(22));
        assert_eq!(st.counters.evicted_objects, 1);
        assert!(st.lookup("k2").is_some() && st.lookup("k3").is_some());
        assert!(st.remove("k4", false, at(23)).is_ok());
        let kept = |st: &MasterState| -> Vec<String> {
            (0..16)
                .map(|i| format!("k{i}"))
                .filter(|k| st.lookup(k).is_some())
                .collect()
        };
        // Room for one: nothing evicted. Then each put evicts the oldest untouched.
        put(&mut st, "n0", 64 << 10, 0, at(40));
        assert_eq!(st.counters.evicted_objects, 1);
        put(&mut st, "n1", 64 << 10, 0, at(41));
        put(&mut st, "n2", 64 << 10, 0, at(42));
        assert!(st.lookup("k3").is_none() && st.lookup("k5").is_none());
        for i in 6..16 {
            put(&mut st, &format!("m{i}"), 64 << 10, 0, at(50 + i));
        }
        // Left, oldest first: what was touched, in the order it was.
        assert_eq!(kept(&st), ["k0", "k1", "k2"]);
        put(&mut st, "m16", 64 << 10, 0, at(70));
        assert_eq!(kept(&st), ["k1", "k2"]);
        st.objects.order();
    }

    #[test]
    fn a_large_segment_unmounted_is_dropped_in_steps_and_its_objects_are_gone_at_once() {
        let mut st = MasterState::new(MasterConfig::default());
        let t0 = Instant::now();
        let (a, _) = st.mount(1, seg("a", 4 << 20), false, t0).unwrap();
        st.mount(2, seg("b", 4 << 20), false, t0).unwrap();
        let n = WALK_STEP + WALK_STEP / 2;
        let on_a = ReplicateConfig {
            preferred_segment: "a".into(),
            ..ONE
        };
        for i in 0..n {
            let key = format!("k{i}");
            let (id, replicas) = st.put_start(7, &key, 64, &on_a, t0).unwrap();
            assert_eq!(replicas[0].segment_id, a);
            st.put_end(7, &key, id, 0, t0).unwrap();
        }
        let on_b = ReplicateConfig {
            preferred_segment: "b".into(),
            ..ONE
        };
        let (id, _) = st.put_start(7, "elsewhere", 64, &on_b, t0).unwrap();
        st.put_end(7, "elsewhere", id, 0, t0).unwrap();
        st.unmount(1, a, false, t0).unwrap();
        // One step done; the rest waits, but nothing of the store is readable meanwhile.
        assert!(st.walking());
        let last = format!("k{}", n - 1);
        assert!(st.lookup(&last).is_some(), "not yet walked");
        assert!(!st.exists(&last, t0));
        assert_eq!(
            st.get_replicas(&last, t0).unwrap_err().0,
            Status::ObjectNotFound
        );
        // A new segment never takes the id of one being dropped, and a put of a key still
        // being dropped replaces it.
        put(&mut st, &last, 64, 0, t0);
        assert!(st.exists(&last, t0));
        while st.walk_step(WALK_STEP) {}
        assert!(st.lookup("k0").is_none());
        assert_eq!(st.counters.dropped_objects, n as u64 - 1);
        assert_eq!(st.summary(t0).keys, 2);
        assert_eq!(
            (
                st.summary(t0).keys,
                st.summary(t0).soft_pinned_keys,
                st.summary(t0).pending_puts
            ),
            st.recount(t0)
        );
        st.objects.order();
    }

    fn pseg(name: &str, uuid: u64) -> SegmentInfo {
        SegmentInfo {
            segment_uuid: uuid,
            ..seg(name, 1 << 20)
        }
    }

    #[test]
    fn kept_counts_equal_a_recount_after_a_random_workload() {
        let (mut evicted, mut pinned) = (0, 0);
        for seed in 0..20u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let cfg = MasterConfig {
                default_kv_lease_ttl_ms: Millis(Duration::from_millis(5)),
                put_start_release_timeout_ms: Millis(Duration::from_millis(50)),
                ..MasterConfig::default()
            };
            let mut st = MasterState::new(cfg);
            let mut now = Instant::now();
            // Small segments: puts evict.
            st.mount(1, seg("a", 64 << 10), false, now).unwrap();
            st.mount(2, seg("b", 64 << 10), false, now).unwrap();
            let mut started: Vec<(String, u64)> = Vec::new();
            for _ in 0..400 {
                now += Duration::from_millis(rng.u64(0..4));
                let key = format!("k{}", rng.u8(0..30));
                match rng.u8(0..10) {
                    0..=2 => {
                        let pin = ReplicateConfig {
                            replica_num: rng.u8(1..3),
                            soft_pin: rng.bool(),
                            soft_pin_ttl_ms: rng.u64(1..40),
                            preferred_segment: String::new(),
                        };
                        if let Ok((id, _)) = st.put_start(7, &key, rng.u64(1..9000), &pin, now) {
                            started.push((key, id));
                        }
                    }
                    3..=4 if !started.is_empty() => {
                        let (k, id) = started.swap_remove(rng.usize(..started.len()));
                        let _ = st.put_end(7, &k, id, 1, now);
                    }
                    5 => {
                        let _ = st.remove(&key, rng.bool(), now);
                    }
                    6 => {
                        if let Ok(d) = st.get_replicas(&key, now) {
                            if let Some(r) = d.replicas.first() {
                                st.report_corrupt(&key, d.version, r.segment_id, now);
                            }
                        }
                    }
                    7 => {
                        let sizes = [rng.u64(1..4000)];
                        if let Ok((id, _)) = st.reserve(7, &sizes, &ONE, now)[0].clone() {
                            let _ = st.put_end(7, &key, id, 1, now);
                        }
                    }
                    8 => st.housekeeping(now),
                    _ => {
                        let _ = st.exists(&key, now);
                    }
                }
                st.housekeeping(now);
                st.objects.order(); // every object on a list, links intact
                let s = st.summary(now);
                pinned += s.soft_pinned_keys;
                assert_eq!(
                    (s.keys, s.soft_pinned_keys, s.pending_puts),
                    st.recount(now),
                    "seed {seed}"
                );
            }
            let (client, id) = st.segments().map(|s| (s.client_id, s.id)).next().unwrap();
            st.unmount(client, id, false, now).unwrap();
            let s = st.summary(now);
            assert_eq!(
                (s.keys, s.soft_pinned_keys, s.pending_puts),
                st.recount(now)
            );
            evicted += st.counters.evicted_objects;
        }
        assert!(evicted > 0 && pinned > 0, "the workload evicts and pins");
    }

    #[test]
    fn tiers_stay_consistent_through_a_random_workload_with_moves_failing_and_hanging() {
        let (mut demoted, mut promoted, mut failed) = (0, 0, 0);
        for seed in 0..20u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let cfg = MasterConfig {
                default_kv_lease_ttl_ms: Millis(Duration::from_millis(5)),
                disk_tier_queue_bytes: ByteSize(32 << 10),
                ..MasterConfig::default()
            };
            let mut st = MasterState::new(cfg);
            let mut now = Instant::now();
            for (client, name) in [(1, "a"), (2, "b")] {
                st.mount(client, seg(name, 64 << 10), false, now).unwrap();
                let disk = SegmentInfo {
                    tier: Tier::Disk,
                    ..seg(&format!("{name}/disk"), 128 << 10)
                };
                st.mount(client, disk, false, now).unwrap();
            }
            let mut sent: Vec<u64> = Vec::new();
            for _ in 0..600 {
                now += Duration::from_millis(rng.u64(0..4));
                let key = format!("k{}", rng.u8(0..40));
                match rng.u8(0..10) {
                    0..=3 => {
                        let size = rng.u64(1..9000);
                        if !st.make_room(size, size, now) {
                            if let Ok((id, _)) = st.put_start(7, &key, size, &ONE, now) {
                                let _ = st.put_end(7, &key, id, 1, now);
                            }
                        }
                    }
                    4 => {
                        let _ = st.remove(&key, rng.bool(), now);
                    }
                    5..=6 => {
                        let _ = st.get_replicas(&key, now);
                    }
                    7 => {
                        sent.extend(
                            st.take_moves()
                                .into_iter()
                                .flat_map(|(_, i)| i)
                                .map(|m| m.version),
                        );
                    }
                    _ if !sent.is_empty() => {
                        // Answered in any order, some failing; some never (they hang).
                        let v = sent.swap_remove(rng.usize(..sent.len()));
                        let status = match rng.u8(0..10) {
                            0 => Status::Internal,
                            1 => Status::ChecksumMismatch,
                            _ => Status::Ok,
                        };
                        st.moved(&[(v, status)], now);
                    }
                    _ => st.housekeeping(now),
                }
                st.objects.order(); // every object on a list, links and lengths intact
                let s = st.summary(now);
                assert_eq!(
                    (s.keys, s.soft_pinned_keys, s.pending_puts),
                    st.recount(now)
                );
                let mut disk_only = 0;
                for (k, e) in st.objects.iter() {
                    let Some(v) = &e.current else { continue };
                    let on_disk = v.replicas.iter().all(|r| st.is_disk(r));
                    assert!(!v.replicas.is_empty(), "seed {seed}: {k} has no replica");
                    assert_eq!(
                        st.objects.on_disk(k),
                        on_disk,
                        "seed {seed}: {k} on the wrong list"
                    );
                    disk_only += u64::from(on_disk);
                }
                assert_eq!(s.disk_keys, disk_only, "seed {seed}");
                for seg in st.segments() {
                    assert!(seg.alloc.used() <= seg.alloc.capacity());
                }
            }
            demoted += st.counters.demoted_objects;
            promoted += st.counters.promoted_objects;
            failed += st.counters.move_failures;
            // A disk segment leaving drops what only it held.
            let (client, id) = st
                .segments()
                .find(|s| s.info.tier == Tier::Disk)
                .map(|s| (s.client_id, s.id))
                .unwrap();
            st.unmount(client, id, false, now).unwrap();
            while st.walk_step(WALK_STEP) {}
            let s = st.summary(now);
            assert_eq!(
                (s.keys, s.soft_pinned_keys, s.pending_puts),
                st.recount(now)
            );
        }
        assert!(
            demoted > 0 && promoted > 0 && failed > 0,
            "{demoted} {promoted} {failed}"
        );
    }

    fn put(st: &mut MasterState, key: &str, size: u64, crc: u32, now: Instant) -> ObjectDesc {
        let (id, _) = st.put_start(7, key, size, &ONE, now).unwrap();
        st.put_end(7, key, id, crc, now).unwrap();
        st.get_replicas(key, now).unwrap()
    }

    fn stored(key: &str, d: &ObjectDesc) -> StoredObject {
        StoredObject {
            key: key.into(),
            version: d.version,
            offset: d.replicas[0].offset,
            size: d.size,
            checksum: d.checksum,
        }
    }

    #[test]
    fn a_put_after_a_removal_waits_for_the_removals_forgets() {
        let (mut st, t0) = state();
        put(&mut st, "k", 100, 1, t0);
        st.take_forget_wait();
        st.remove("k", true, t0).unwrap();
        let removal = st.take_forget_wait().expect("the removal waits").seq;
        // The next value ends while the removal's forgets may still be on their way: a reader
        // of a cached location could see the removed value after it, so it waits for them.
        let (id, _) = st.put_start(7, "k", 10, &ONE, t0).unwrap();
        st.put_end(7, "k", id, 0, t0).unwrap();
        let wait = st.take_forget_wait().expect("the put waits");
        assert!(wait.seq >= removal, "{wait:?} before {removal}");
        assert!(
            wait.endpoints.is_empty(),
            "not its own forgets: its durability is not theirs"
        );
        // Once a lease has passed, a store cannot serve it any more: nothing to wait for.
        let later = t0 + Duration::from_secs(30);
        st.forgets_delivered(st.outbox_seq, later);
        st.remove("k", true, later).unwrap();
        st.take_forget_wait();
        st.forgets_delivered(st.outbox_seq, later + Duration::from_secs(30));
        let (id, _) = st.put_start(7, "k", 10, &ONE, later).unwrap();
        st.put_end(7, "k", id, 0, later).unwrap();
        assert_eq!(st.take_forget_wait(), None);
    }

    #[test]
    fn a_segment_owes_the_forgets_of_what_left_it_until_it_mounts_again() {
        let mut st = MasterState::new(MasterConfig::default());
        let t0 = Instant::now();
        let (id, _) = st.mount(1, pseg("a", 42), true, t0).unwrap();
        assert_eq!(
            st.lease_terms(1, id).unwrap_err().0,
            Status::ObjectUnavailable,
            "no lease while it reports"
        );
        st.report(1, id, vec![], true, t0).unwrap();
        assert_eq!(st.lease_terms(1, id).unwrap(), ("a:1".to_string(), 0));
        assert_eq!(st.lease_terms(2, id).unwrap_err().0, Status::IllegalClient);
        put(&mut st, "k", 100, 1, t0);
        st.remove("k", true, t0).unwrap();
        let (_, owed) = st.lease_terms(1, id).unwrap();
        assert_eq!(owed, st.outbox_seq, "owes the removal's forget");
        assert_eq!(st.take_outbox().seq, owed);
        // Back after a restart: its report settles its records; nothing older is owed.
        st.unmount(1, id, true, t0).unwrap();
        assert_eq!(
            st.lease_terms(1, id).unwrap_err().0,
            Status::SegmentNotFound,
            "away: its store must mount again"
        );
        st.mount(2, pseg("a", 42), true, t0).unwrap();
        st.report(2, id, vec![], true, t0).unwrap();
        assert_eq!(st.lease_terms(2, id).unwrap().1, 0);
    }

    #[test]
    fn an_away_store_keeps_its_objects_and_gets_back_only_what_it_confirms() {
        let mut st = MasterState::new(MasterConfig::default());
        let t0 = Instant::now();
        let (id, discard) = st.mount(1, pseg("a", 42), true, t0).unwrap();
        assert!(!discard);
        assert!(st.report(1, id, vec![], true, t0).unwrap().is_empty());
        let a = put(&mut st, "a", 100, 1, t0);
        let b = put(&mut st, "b", 100, 2, t0);
        // SIGTERM with keep: unreadable, not gone.
        st.unmount(1, id, true, t0).unwrap();
        assert_eq!(
            st.get_replicas("a", t0).unwrap_err().0,
            Status::ObjectUnavailable
        );
        assert!(!st.exists("a", t0));
        assert_eq!(
            st.put_start(7, "c", 10, &ONE, t0).unwrap_err().0,
            Status::NoSpace,
            "no allocation on an away segment"
        );
        // Back with the same incarnation: it reports a (intact), not b (lost), and a record
        // the master never had.
        let (id2, discard) = st.mount(2, pseg("a", 42), true, t0).unwrap();
        assert_eq!((id2, discard), (id, false));
        let stray = StoredObject {
            key: "stray".into(),
            version: 1,
            offset: 4096,
            size: 10,
            checksum: 0,
        };
        let rejected = st
            .report(2, id, vec![stored("a", &a), stray], true, t0)
            .unwrap();
        assert_eq!(rejected.len(), 1, "the stray record is rejected");
        assert_eq!(st.get_replicas("a", t0).unwrap().version, a.version);
        assert_eq!(
            st.get_replicas("b", t0).unwrap_err().0,
            Status::ObjectNotFound
        );
        assert_eq!(st.counters.lost_objects, 1);
        let _ = b;
    }

    /// A store with 1 MiB of memory and a disk tier of `disk` bytes (client 1), and a client 7.
    fn tiered(cfg: MasterConfig, disk: u64) -> (MasterState, Instant, u64, u64) {
        let mut st = MasterState::new(cfg);
        let t0 = Instant::now();
        let (mem, _) = st.mount(1, seg("mem", 1 << 20), false, t0).unwrap();
        let info = SegmentInfo {
            tier: Tier::Disk,
            ..seg("mem/disk", disk)
        };
        let (disk_id, _) = st.mount(1, info, false, t0).unwrap();
        st.ping(7, t0);
        (st, t0, mem, disk_id)
    }

    const KB64: u64 = 64 << 10;

    /// Puts `key` (64 KiB) without reading it; its checksum is its number.
    fn put_quiet(st: &mut MasterState, i: u64, now: Instant) -> u64 {
        let key = format!("k{i}");
        let (id, replicas) = st.put_start(7, &key, KB64, &ONE, now).unwrap();
        assert_eq!(replicas.len(), 1);
        st.put_end(7, &key, id, i as u32, now).unwrap();
        id
    }

    /// The queued moves, answered with `status` each; returns the items.
    fn answer_moves(st: &mut MasterState, status: Status, now: Instant) -> Vec<MoveItem> {
        let jobs = st.take_moves();
        let items: Vec<MoveItem> = jobs.into_iter().flat_map(|(_, items)| items).collect();
        let results: Vec<(u64, Status)> = items.iter().map(|m| (m.version, status)).collect();
        st.moved(&results, now);
        items
    }

    fn replica_segment(st: &mut MasterState, key: &str, now: Instant) -> u64 {
        st.get_replicas(key, now).unwrap().replicas[0].segment_id
    }

    #[test]
    fn puts_land_in_memory_and_eviction_demotes_to_the_stores_disk_tier() {
        let (mut st, t0, mem, disk) = tiered(MasterConfig::default(), 1 << 30);
        // Fill memory past the watermark (16 objects fill it): every object lands in memory;
        // the oldest are queued to go to disk, and stay readable from memory until their
        // copies are confirmed.
        for i in 0..15 {
            put_quiet(&mut st, i, t0);
        }
        let s = st.summary(t0);
        assert_eq!(s.capacity_bytes, 1 << 20, "memory only");
        assert_eq!(s.disk_capacity_bytes, 1 << 30);
        assert!(s.moves_in_flight > 0, "{s:?}");
        assert_eq!(s.demoting_bytes, s.moves_in_flight * KB64);
        assert_eq!(
            replica_segment(&mut st, "k0", t0),
            mem,
            "readable while it moves"
        );
        let jobs = st.take_moves();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].0, "mem/disk:1", "sent to the disk tier's endpoint");
        let items = jobs.into_iter().next().unwrap().1;
        assert!(items.iter().all(|m| m.kind == MoveKind::Demote));
        assert_eq!(items[0].key, "k0", "least recently used first");
        assert_eq!(items[0].checksum, 0);
        assert_eq!(items[0].to % 4096, 0, "whole disk blocks");
        let results: Vec<(u64, Status)> = items.iter().map(|m| (m.version, Status::Ok)).collect();
        st.take_outbox();
        st.moved(&results, t0);
        // The memory records go to the store as forgets.
        let out = st.take_outbox();
        assert_eq!(out.forgets["mem:1"].len(), items.len());
        let d = st.get_replicas("k1", t0).unwrap();
        assert_eq!((d.replicas[0].segment_id, d.checksum), (disk, 1));
        // A stream of puts goes on with the copies confirmed as they come: nothing is dropped.
        for i in 15..60 {
            put_quiet(&mut st, i, t0);
            answer_moves(&mut st, Status::Ok, t0);
        }
        let s = st.summary(t0);
        assert_eq!(st.counters.evicted_objects, 0, "nothing dropped");
        assert_eq!(st.counters.alloc_failures, 0);
        assert_eq!(s.keys, 60);
        // k1 was read from disk above: promoted back on that first hit.
        assert_eq!(st.counters.promoted_objects, 1);
        assert_eq!(s.disk_keys, st.counters.demoted_objects - 1);
        // k1's disk copy is freed when the read lease granted on it ends.
        assert_eq!(s.disk_used_bytes, (s.disk_keys + 1) * KB64);
        assert!(
            s.used_bytes as f64 <= 0.9 * s.capacity_bytes as f64,
            "{s:?}"
        );
        assert_eq!((s.moves_in_flight, s.demoting_bytes), (0, 0));
        assert_eq!(replica_segment(&mut st, "k59", t0), mem);
        st.objects.order(); // every list's links and lengths check out
    }

    #[test]
    fn a_hit_promotes_after_the_admission_count_and_a_failed_move_leaves_the_object() {
        let cfg = MasterConfig {
            promotion_admission_threshold: 2,
            ..MasterConfig::default()
        };
        let (mut st, t0, mem, disk) = tiered(cfg, 1 << 30);
        let mut demoted = Vec::new();
        for i in 0..20 {
            put_quiet(&mut st, i, t0);
            demoted.extend(answer_moves(&mut st, Status::Ok, t0));
        }
        assert!(demoted.len() >= 3, "{}", demoted.len());
        // Room in memory again for promotions.
        for m in &demoted[..3] {
            assert_eq!(
                replica_segment(&mut st, &m.key, t0),
                disk,
                "first hit: stays"
            );
        }
        assert!(st.take_moves().is_empty(), "not admitted yet");
        assert_eq!(replica_segment(&mut st, "k0", t0), disk, "second hit");
        let items = st.take_moves().into_iter().next().unwrap().1;
        assert_eq!(items.len(), 1);
        assert_eq!(
            (items[0].kind, items[0].key.as_str()),
            (MoveKind::Promote, "k0")
        );
        assert_eq!(
            items[0].from, demoted[0].to,
            "from the disk replica to new memory"
        );
        assert_eq!(
            replica_segment(&mut st, "k0", t0),
            disk,
            "served from disk meanwhile"
        );
        st.take_outbox();
        st.moved(&[(items[0].version, Status::Ok)], t0);
        assert_eq!(replica_segment(&mut st, "k0", t0), mem, "promoted");
        assert_eq!(st.counters.promoted_objects, 1);
        assert_eq!(
            st.take_outbox().forgets["mem/disk:1"].len(),
            1,
            "disk record forgotten"
        );
        // A promotion that fails leaves the object on disk and gives the memory back.
        let used = st.summary(t0).used_bytes;
        assert_eq!(replica_segment(&mut st, "k1", t0), disk);
        assert_eq!(
            st.summary(t0).used_bytes,
            used + KB64,
            "allocated for the copy"
        );
        answer_moves(&mut st, Status::Internal, t0);
        assert_eq!(st.counters.move_failures, 1);
        assert_eq!(st.summary(t0).used_bytes, used);
        assert_eq!(replica_segment(&mut st, "k1", t0), disk, "tried again");
        assert_eq!(answer_moves(&mut st, Status::Internal, t0).len(), 1);
        // A promotion whose disk bytes fail their checksum drops that replica (its only one).
        assert_eq!(replica_segment(&mut st, "k2", t0), disk);
        let items = answer_moves(&mut st, Status::ChecksumMismatch, t0);
        assert_eq!(items[0].key, "k2");
        assert_eq!(
            st.get_replicas("k2", t0).unwrap_err().0,
            Status::ObjectNotFound
        );
        assert_eq!(st.counters.corrupt_replicas, 1);
        st.objects.order();
    }

    #[test]
    fn the_disk_tier_drops_its_least_recently_used_and_a_full_one_degrades_to_dropping() {
        // Room on disk for 8 objects of 64 KiB: its watermark (95 %) keeps 7.
        let (mut st, t0, _, disk) = tiered(MasterConfig::default(), 8 * KB64);
        for i in 0..200 {
            put_quiet(&mut st, i, t0);
            answer_moves(&mut st, Status::Ok, t0);
        }
        let s = st.summary(t0);
        assert!(
            s.disk_used_bytes <= (0.95 * (8 * KB64) as f64) as u64,
            "{s:?}"
        );
        assert!(st.counters.disk_evicted_objects > 0);
        assert_eq!(st.counters.alloc_failures, 0, "puts never failed for room");
        // The disk holds the most recently demoted; the first ones are gone.
        assert_eq!(
            st.get_replicas("k0", t0).unwrap_err().0,
            Status::ObjectNotFound
        );
        let on_disk: Vec<u64> = (0..200)
            .filter(|i| {
                st.get_replicas(&format!("k{i}"), t0)
                    .is_ok_and(|d| d.replicas[0].segment_id == disk)
            })
            .collect();
        assert!(!on_disk.is_empty());
        let newest_gone = (0..200)
            .filter(|i| st.lookup(&format!("k{i}")).is_none())
            .max()
            .unwrap();
        assert!(
            on_disk.iter().all(|i| *i > newest_gone),
            "disk eviction took the oldest first: {on_disk:?}, {newest_gone}"
        );
        st.objects.order();

        // A disk tier that cannot take an object at all (everything on it leased): the object
        // is dropped, counted; the put goes through.
        let (mut st, t0, _, _) = tiered(MasterConfig::default(), KB64);
        for i in 0..40 {
            put_quiet(&mut st, i, t0);
            for m in answer_moves(&mut st, Status::Ok, t0) {
                st.get_replicas(&m.key, t0).unwrap(); // leased: disk eviction passes it over
            }
        }
        assert!(st.counters.disk_full_drops > 0);
        assert!(st.counters.evicted_objects > 0);
        assert_eq!(st.counters.alloc_failures, 0);
    }

    #[test]
    fn disk_segments_are_allocated_in_whole_blocks_whatever_the_value_size() {
        let (mut st, t0, _, disk) = tiered(MasterConfig::default(), 1 << 30);
        let cfg = ReplicateConfig::default();
        for i in 0..400u64 {
            let key = format!("odd{i}");
            let (id, _) = st.put_start(7, &key, 5000 + i, &cfg, t0).unwrap();
            st.put_end(7, &key, id, 0, t0).unwrap();
            for m in answer_moves(&mut st, Status::Ok, t0) {
                assert_eq!(m.to % 4096, 0, "{m:?}");
            }
        }
        let seg = st.segment(disk).unwrap();
        assert!(seg.alloc.used() > 0);
        assert_eq!(seg.alloc.used() % 4096, 0, "whole blocks");
    }

    #[test]
    fn a_batch_larger_than_free_memory_waits_for_demotions_instead_of_dropping() {
        let (mut st, t0, _, _) = tiered(MasterConfig::default(), 1 << 30);
        for i in 0..14 {
            put_quiet(&mut st, i, t0);
        }
        assert!(!st.make_room(KB64, KB64, t0), "room enough: no wait");
        // A batch of 8 objects needs 512 KiB; 128 KiB are free.
        assert!(
            st.make_room(8 * KB64, KB64, t0),
            "demotions started: wait for them"
        );
        let s = st.summary(t0);
        assert!(s.demoting_bytes >= 6 * KB64, "{s:?}");
        assert!(
            !st.make_room(8 * KB64, KB64, t0) || st.summary(t0).demoting_bytes == s.demoting_bytes,
            "asking again starts no more than needed"
        );
        answer_moves(&mut st, Status::Ok, t0);
        assert!(!st.make_room(8 * KB64, KB64, t0), "the copies landed: room");
        for i in 14..22 {
            put_quiet(&mut st, i, t0);
        }
        assert_eq!(st.counters.evicted_objects, 0);
        // Without a disk tier there is nothing to wait for.
        let (mut plain, t0) = state();
        for i in 0..15 {
            put_quiet(&mut plain, i, t0);
        }
        assert!(!plain.make_room(8 * KB64, KB64, t0));
    }

    #[test]
    fn demotions_in_flight_are_bounded_and_a_put_short_of_memory_drops_instead() {
        let cfg = MasterConfig {
            disk_tier_queue_bytes: ByteSize(2 * KB64),
            ..MasterConfig::default()
        };
        let (mut st, t0, _, _) = tiered(cfg, 1 << 30);
        // Nobody answers the moves: at most two are in flight, and once memory is full the
        // puts go on by dropping the least recently used objects that are not moving.
        for i in 0..60 {
            put_quiet(&mut st, i, t0);
            let s = st.summary(t0);
            assert!(s.demoting_bytes <= 2 * KB64, "{s:?}");
        }
        assert_eq!(st.summary(t0).moves_in_flight, 2);
        assert!(
            st.counters.evicted_objects > 0,
            "dropped while the copies hang"
        );
        assert!(
            st.exists("k0", t0) && st.exists("k1", t0),
            "moving objects stay"
        );
        // The copies land late: both objects end on disk.
        let items = answer_moves(&mut st, Status::Ok, t0);
        assert_eq!(items.len(), 2);
        assert_eq!(st.summary(t0).disk_keys, 2);
    }

    #[test]
    fn a_large_rebound_segment_is_confirmed_in_steps_and_readable_only_once_done() {
        let mut st = MasterState::new(MasterConfig::default());
        let t0 = Instant::now();
        let big = SegmentInfo {
            segment_uuid: 42,
            ..seg("a", 4 << 20)
        };
        let (id, _) = st.mount(1, big.clone(), true, t0).unwrap();
        st.report(1, id, vec![], true, t0).unwrap();
        let n = WALK_STEP + WALK_STEP / 2;
        let records: Vec<StoredObject> = (0..n)
            .map(|i| {
                let key = format!("k{i}");
                let d = put(&mut st, &key, 64, i as u32, t0);
                stored(&key, &d)
            })
            .collect();
        st.unmount(1, id, true, t0).unwrap();
        // Back, twice: the first report's confirmation is cut short by the second mount, and
        // must not drop what the second report confirms. k0 and the last key are lost.
        let kept = &records[1..n - 1];
        for client in [2, 3] {
            assert_eq!(
                st.mount(client, big.clone(), true, t0).unwrap(),
                (id, false)
            );
            for chunk in kept.chunks(4096) {
                st.report(client, id, chunk.to_vec(), false, t0).unwrap();
            }
            st.report(client, id, vec![], true, t0).unwrap();
            assert!(st.walking(), "more objects than one step");
            assert_eq!(
                st.get_replicas("k1", t0).unwrap_err().0,
                Status::ObjectUnavailable,
                "unreadable until confirmed"
            );
        }
        while st.walk_step(WALK_STEP) {}
        assert!(st.segment(id).is_some_and(|s| s.is_live()));
        assert_eq!(st.counters.lost_objects, 2);
        assert!(st.lookup("k0").is_none() && st.lookup(&format!("k{}", n - 1)).is_none());
        for r in kept.iter().step_by(1000) {
            assert_eq!(st.get_replicas(&r.key, t0).unwrap().version, r.version);
        }
        let s = st.summary(t0);
        assert_eq!(s.keys, n as u64 - 2);
        assert_eq!((s.keys, s.soft_pinned_keys, s.pending_puts), st.recount(t0));
    }

    #[test]
    fn a_store_away_past_the_grace_period_is_given_up_and_told_to_discard() {
        let cfg = MasterConfig {
            store_grace_period_ms: crate::config::Millis(Duration::from_secs(5)),
            ..MasterConfig::default()
        };
        let mut st = MasterState::new(cfg);
        let t0 = Instant::now();
        let (id, _) = st.mount(1, pseg("a", 42), true, t0).unwrap();
        st.report(1, id, vec![], true, t0).unwrap();
        put(&mut st, "a", 100, 1, t0);
        // Heartbeats stop: after the TTL the segment is away, after the grace it is gone.
        st.housekeeping(t0 + Duration::from_secs(11));
        assert_eq!(st.summary(t0).away_segments, 1);
        st.housekeeping(t0 + Duration::from_secs(17));
        assert!(st.lookup("a").is_none());
        let (_, discard) = st
            .mount(2, pseg("a", 42), true, t0 + Duration::from_secs(18))
            .unwrap();
        assert!(
            discard,
            "its objects were given up; the store must not bring them back"
        );
    }

    #[test]
    fn a_restarted_master_adopts_reports_and_the_newest_version_wins() {
        let mut old = MasterState::new(MasterConfig::default());
        let t0 = Instant::now();
        let (ia, _) = old.mount(1, pseg("a", 1), true, t0).unwrap();
        old.report(1, ia, vec![], true, t0).unwrap();
        let (ib, _) = old.mount(2, pseg("b", 2), true, t0).unwrap();
        old.report(2, ib, vec![], true, t0).unwrap();
        let pref = |s: &str| ReplicateConfig {
            preferred_segment: s.into(),
            ..ONE
        };
        let (v1, r1) = old.put_start(7, "k", 100, &pref("a"), t0).unwrap();
        old.put_end(7, "k", v1, 1, t0).unwrap();
        let (v2, r2) = old.put_start(7, "k", 200, &pref("b"), t0).unwrap();
        old.put_end(7, "k", v2, 2, t0).unwrap();
        assert!(v2 > v1);
        let rec = |v, off, size, crc| StoredObject {
            key: "k".into(),
            version: v,
            offset: off,
            size,
            checksum: crc,
        };
        // A new master; store b reports first, then a with the older version (its forget was
        // lost in the crash).
        let mut st = MasterState::new(MasterConfig::default());
        let (nb, _) = st.mount(3, pseg("b", 2), true, t0).unwrap();
        assert!(st
            .report(3, nb, vec![rec(v2, r2[0].offset, 200, 2)], true, t0)
            .unwrap()
            .is_empty());
        let (na, _) = st.mount(4, pseg("a", 1), true, t0).unwrap();
        let rejected = st
            .report(4, na, vec![rec(v1, r1[0].offset, 100, 1)], true, t0)
            .unwrap();
        assert_eq!(rejected.len(), 1, "the stale version is rejected");
        let d = st.get_replicas("k", t0).unwrap();
        assert_eq!((d.version, d.size), (v2, 200));
        // New versions beat everything reported.
        let (v3, _) = st.put_start(7, "k", 10, &ONE, t0).unwrap();
        assert!(v3 > v2);
        // The other order: the newer report replaces the adopted older one and queues its forget.
        let mut st = MasterState::new(MasterConfig::default());
        let (na, _) = st.mount(4, pseg("a", 1), true, t0).unwrap();
        st.report(4, na, vec![rec(v1, r1[0].offset, 100, 1)], true, t0)
            .unwrap();
        let (nb, _) = st.mount(3, pseg("b", 2), true, t0).unwrap();
        st.report(3, nb, vec![rec(v2, r2[0].offset, 200, 2)], true, t0)
            .unwrap();
        assert_eq!(st.get_replicas("k", t0).unwrap().version, v2);
        let out = st.take_outbox();
        assert_eq!(out.forgets.len(), 1);
        assert_eq!(out.forgets.values().next().unwrap()[0].version, v1);
    }

    #[test]
    fn removals_and_replacements_queue_forgets_and_corrupt_replicas_are_dropped() {
        let mut st = MasterState::new(MasterConfig::default());
        let t0 = Instant::now();
        let (id, _) = st.mount(1, pseg("a", 9), true, t0).unwrap();
        st.report(1, id, vec![], true, t0).unwrap();
        let a = put(&mut st, "a", 100, 1, t0);
        let later = t0 + Duration::from_secs(11);
        st.remove("a", false, later).unwrap();
        let out = st.take_outbox();
        assert_eq!(out.forgets.values().next().unwrap()[0].version, a.version);
        let b = put(&mut st, "b", 100, 1, later);
        st.report_corrupt("b", b.version + 1, id, later);
        assert!(st.exists("b", later), "another version's report is ignored");
        st.report_corrupt("b", b.version, id, later);
        assert!(st.lookup("b").is_none());
        assert_eq!(st.counters.corrupt_replicas, 1);
    }
}
