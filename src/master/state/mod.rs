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
//! value was evicted moments ago waits for that eviction's forgets too (`forget.rs`).

pub mod allocator;
mod clients;
mod evict;
pub mod eviction;
mod forget;
mod handover;
mod housekeeping;
pub mod indexes;
pub mod key_index;
pub mod objects;
pub mod placement;
pub mod pool_events;
mod puts;
mod reads;
mod recovery;
pub mod reservations;
mod segments;
#[cfg(test)]
mod tests;
pub mod tiering;

pub use evict::MoveJob;
pub use forget::{ForgetWait, Outbox};
use handover::HandOvers;
pub use handover::{DrainState, DrainStatus, HandOverJob};
pub use objects::{Entry, Pending, Version};
pub use recovery::WALK_STEP;
pub use segments::{SegState, Segment};

use super::config::MasterConfig;
use super::tenants::{self, Quotas, DEFAULT_TENANT};
use crate::transfer::message::{ReplicaLoc, Tier};
use crate::transfer::Status;
pub use clients::Binding;
use clients::ClientTable;
use eviction::EvictionLog;
use forget::ForgetLog;
use indexes::Indexes;
use objects::{ObjectTable, TableFull};
use pool_events::{PoolEvents, PoolMedium};
use recovery::Walk;
use reservations::Reservations;
use segments::SegmentTable;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiering::Moves;

/// What an operation on the state answers: its result, or the status and message of its
/// refusal.
pub type OpResult<T> = Result<T, (Status, String)>;

fn fail<T>(status: Status, msg: impl Into<String>) -> OpResult<T> {
    Err((status, msg.into()))
}

/// The object table has no room for another key: the put is refused, nothing changed.
fn table_full(e: TableFull) -> (Status, String) {
    (
        Status::NoSpace,
        format!("the master cannot hold another object: {e}"),
    )
}

/// The wall clock the state machine reads (all else it is told, as `now`): versions are at
/// least the wall clock in microseconds, so that a restarted master's versions are newer than
/// any from before, and evictions are logged with it.
pub trait WallClock: Send + Sync {
    fn unix_micros(&self) -> u64;
}

/// The system's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn unix_micros(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64)
    }
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
    /// Checksums stores sent after the put (`OBJECTS_HASHED`) for versions committed unhashed.
    pub hashed_later: u64,
    /// Replicas of one version that hashed differently (the version went back to unhashed).
    pub hash_mismatches: u64,
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
    /// Clients with a bound connection open (live without heartbeats, unless they hold
    /// segments).
    pub bound_clients: u64,
    pub segments: u64,
    pub away_segments: u64,
    pub recovering_segments: u64,
    pub deferred_bytes: u64,
}

/// The master's state: its tables (segments, objects, clients, reservations, moves, indexes)
/// and the operations on them, pure of I/O; `super::lock::StateLock` holds it.
pub struct MasterState {
    cfg: MasterConfig,
    clock: Arc<dyn WallClock>,
    /// Draws segment ids and breaks placement ties.
    rng: fastrand::Rng,
    /// Until when a master that took office learns the pool's objects from its stores (see
    /// `learn_for`): a key it does not know may be on a store that has not mounted yet.
    learning_until: Option<Instant>,
    clients: ClientTable,
    segments: SegmentTable,
    objects: ObjectTable,
    /// Put reservations by object id: allocated, versioned, not yet any key's.
    reservations: Reservations,
    /// Counts, soft pins by expiry and unfinished puts by age, kept as objects change.
    indexes: Indexes,
    deferred: Vec<Deferred>,
    /// The first version this state machine could issue (see `write_floor`).
    write_floor: u64,
    next_object_id: u64,
    pub counters: Counters,
    /// An allocation failed since the last eviction run: the next one runs whatever the
    /// watermark says.
    force_eviction: bool,
    forgets: ForgetLog,
    /// Every eviction, with the wall-clock time, for readers that tell evictions from losses.
    pub evictions: EvictionLog,
    /// Walks over every object in progress, the first one going on at each step.
    walks: VecDeque<Walk>,
    /// Copies between memory and disk tiers under way.
    moves: Moves,
    /// Segments being handed over to the others, and the copies under way.
    hand_overs: HandOvers,
    /// The pool's pages as KV events, for the publisher (`--kv-events-config`).
    pub pool_events: PoolEvents,
    /// The tenants served and their quotas (`--tenants-file`; the default tenant alone
    /// without one).
    tenants: Quotas,
    /// Puts refused at their tenant's quota, by tenant.
    quota_refusals: HashMap<Box<str>, u64>,
}

/// A tenant of the pool as the admin API and the metrics show it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TenantUsage {
    pub name: String,
    /// Whether the tenants file names it (a tenant it no longer names keeps its objects).
    pub registered: bool,
    /// Bytes of values held, puts in progress included.
    pub used_bytes: u64,
    pub quota_bytes: Option<u64>,
    /// The quota scaled to the pool's capacity now (`Quotas::effective`).
    pub quota_in_force_bytes: Option<u64>,
    pub refused_puts: u64,
}

impl MasterState {
    /// A master that knows nothing yet, reading `clock` for versions and drawing from `rng`.
    pub fn new(cfg: MasterConfig, clock: Arc<dyn WallClock>, rng: fastrand::Rng) -> MasterState {
        let write_floor = clock.unix_micros();
        let events_on = cfg
            .kv_events_config
            .as_deref()
            .and_then(|json| crate::kv_events::KvEventsConfig::parse(json).ok())
            .is_some_and(|c| c.enabled());
        let pool_events = PoolEvents::new(events_on);
        MasterState {
            forgets: ForgetLog::new(cfg.store_read_lease()),
            cfg,
            clock,
            rng,
            learning_until: None,
            clients: ClientTable::default(),
            segments: SegmentTable::default(),
            objects: ObjectTable::default(),
            reservations: Reservations::default(),
            indexes: Indexes::default(),
            deferred: Vec::new(),
            write_floor,
            next_object_id: write_floor,
            counters: Counters::default(),
            force_eviction: false,
            evictions: EvictionLog::default(),
            walks: VecDeque::new(),
            moves: Moves::default(),
            hand_overs: HandOvers::default(),
            pool_events,
            tenants: Quotas::default(),
            quota_refusals: HashMap::new(),
        }
    }

    /// A master on the system clock, drawing from a randomly seeded generator.
    pub fn with_system_clock(cfg: MasterConfig) -> MasterState {
        MasterState::new(cfg, Arc::new(SystemClock), fastrand::Rng::new())
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
        self.segments
            .any_recovering()
            .then_some("a store is still reporting the objects it kept")
    }

    /// Forgets every segment, object and client, as a freshly started master knows nothing
    /// (a master elected leader, or deposed); the counters carry on.
    pub fn reset(&mut self) {
        let fresh = MasterState::new(self.cfg.clone(), self.clock.clone(), self.rng.fork());
        let old = std::mem::replace(self, fresh);
        self.counters = old.counters;
        self.evictions = old.evictions;
        self.pool_events = old.pool_events;
        self.pool_events.clear();
        self.tenants = old.tenants;
        self.quota_refusals = old.quota_refusals;
    }

    /// Serves the tenants of a tenants file, with their quotas.
    pub fn set_tenants(&mut self, tenants: Quotas) {
        self.tenants = tenants;
        self.quota_refusals
            .retain(|t, _| self.tenants.serves(t).is_ok());
    }

    /// Bytes the pool's live segments hold, memory and disk tiers: what the quotas together
    /// may never exceed.
    pub(super) fn pool_capacity(&self) -> u64 {
        self.segments.live_capacity()
    }

    /// Whether a put of `size` bytes of the held key `key` may start: its tenant must be
    /// served and stay within its quota in force.
    fn admit_put(&mut self, key: &str, size: u64) -> OpResult<()> {
        if let Some(e) = self.unserved(key) {
            return Err(e);
        }
        let tenant = tenants::split(key).0;
        if tenant == DEFAULT_TENANT && self.tenants.asked(DEFAULT_TENANT).is_none() {
            return Ok(()); // the common case, at no cost
        }
        let quota = self.tenants.in_force(tenant, self.pool_capacity());
        let used = self.indexes.usage().of(tenant);
        tenants::admit(tenant, quota, used, size).map_err(|e| {
            *self.quota_refusals.entry(tenant.into()).or_insert(0) += 1;
            (Status::QuotaExceeded, e.to_string())
        })
    }

    /// Why a request for the held key `key` is refused for its tenant, if it is: a key of a
    /// tenant the tenants file does not name (as Mooncake answers, rather than a miss), or one
    /// that names no well-formed tenant. The default tenant's keys cost one byte's look.
    pub fn unserved(&self, key: &str) -> Option<(Status, String)> {
        match tenants::tenant_of(key) {
            Ok(DEFAULT_TENANT) => None,
            Ok(t) => self
                .tenants
                .serves(t)
                .err()
                .map(|e| (Status::TenantNotRegistered, e.to_string())),
            Err(e) => Some((Status::InvalidParams, e.to_string())),
        }
    }

    /// Whether `tenant` is served (a name that a request gives for a whole namespace).
    pub fn check_tenant(&self, tenant: &str) -> OpResult<()> {
        tenants::check_name(tenant).map_err(|e| (Status::InvalidParams, e.to_string()))?;
        self.tenants
            .serves(tenant)
            .map_err(|e| (Status::TenantNotRegistered, e.to_string()))
    }

    /// Every tenant served or holding bytes, by name.
    pub fn tenant_usage(&self) -> Vec<TenantUsage> {
        let capacity = self.pool_capacity();
        let usage = self.indexes.usage();
        let mut names: Vec<&str> = self.tenants.names();
        names.extend(usage.iter().map(|(t, _)| t));
        names.sort_unstable();
        names.dedup();
        names
            .into_iter()
            .map(|t| TenantUsage {
                name: t.to_owned(),
                registered: self.tenants.serves(t).is_ok(),
                used_bytes: usage.of(t),
                quota_bytes: self.tenants.asked(t),
                quota_in_force_bytes: self.tenants.in_force(t, capacity),
                refused_puts: self.quota_refusals.get(t).copied().unwrap_or(0),
            })
            .collect()
    }

    /// Where `key`'s object lives, as its KV events say (only looked up when they are on).
    fn medium_of(&self, key: &str) -> PoolMedium {
        match self.pool_events.enabled() && self.objects.on_disk(key) {
            true => PoolMedium::Disk,
            false => PoolMedium::Memory,
        }
    }

    /// The lowest version this state machine issues: the wall clock when it started. Stores
    /// refuse writes below it (`MountResp::write_floor`).
    pub fn write_floor(&self) -> u64 {
        self.write_floor
    }

    /// A new version: above every version issued or reported, and at least the wall clock in
    /// microseconds (so a restarted master's versions beat the ones stores kept).
    fn next_version(&mut self) -> u64 {
        self.next_object_id = self.next_object_id.max(self.clock.unix_micros());
        let v = self.next_object_id;
        self.next_object_id += 1;
        v
    }

    /// The settings the state runs by.
    pub fn config(&self) -> &MasterConfig {
        &self.cfg
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
        let seq = self.forgets.queue(replicas, version);
        for r in replicas {
            let Some(seg) = self.segments.get_mut(r.segment_id) else {
                continue;
            };
            seg.owed_seq = seq;
            if until > now {
                self.deferred.push(Deferred {
                    until,
                    segment_id: r.segment_id,
                    offset: r.offset,
                    size,
                });
            } else {
                seg.alloc.release(r.offset, size);
            }
        }
    }

    /// Whether forgets wait for the notifier (queued by an operation that did not wake it,
    /// such as an eviction).
    pub fn forgets_pending(&self) -> bool {
        self.forgets.pending()
    }

    /// Takes the forgets waiting for delivery, grouped by store endpoint (`ForgetLog::take`).
    pub fn take_outbox(&mut self) -> Outbox {
        self.forgets.take(&self.segments)
    }

    /// The notifier delivered the outbox it took (or kept what a store did not take).
    pub fn forgets_delivered(&mut self, now: Instant) {
        self.forgets.delivered(now);
    }

    /// What the last operation must see settled before it is acknowledged, if anything
    /// (taken: the next operation starts from none).
    pub fn take_forget_wait(&mut self) -> Option<ForgetWait> {
        self.forgets.take_wait(&self.segments)
    }

    /// The figures of the summary log line and the status page at `now`.
    pub fn summary(&self, now: Instant) -> Summary {
        let mut s = Summary {
            clients: self.clients.len() as u64,
            bound_clients: self.clients.bound() as u64,
            segments: self.segments.len() as u64,
            deferred_bytes: self
                .deferred
                .iter()
                .map(|d| allocator::aligned(d.size))
                .sum(),
            ..Summary::default()
        };
        for seg in self.segments.iter() {
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

    /// The bytes each tenant holds, recounted by walking every object (tests check the kept
    /// usage against it).
    #[cfg(test)]
    fn recount_usage(&self) -> tenants::Usage {
        let mut u = tenants::Usage::default();
        for (k, e) in self.objects.iter() {
            for size in [
                e.current.as_ref().map(|v| v.size),
                e.pending.as_ref().map(|p| p.size),
            ]
            .into_iter()
            .flatten()
            {
                u.add(k, size);
            }
        }
        u
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
}
