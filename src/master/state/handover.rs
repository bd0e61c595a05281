//! A segment's hand-over ("drain"): before its store goes for good (a pod scaled away,
//! recreated elsewhere, evicted from a drained node), the master copies every object with a
//! replica on it onto other stores, so that nothing the pool held is lost with it.
//!
//! A draining segment takes no new puts. The keys on it are listed once when the drain starts
//! (nothing new can land there after); each is then handed over in turn: space on another
//! live memory segment (the one with the most free bytes that holds no replica of the object),
//! a grant for it, and a job for the copier (`master/handover.rs`), which reads the bytes from
//! the leaving store and writes them, with the key, version and checksum, to the new one. When
//! the copy lands and the object is still that version there, the new replica replaces the old
//! (whose space is freed, and its store told to forget it, once readers' leases end);
//! otherwise the new space goes back. Keys whose copy failed are tried again, up to
//! [`ATTEMPTS`] times. The drain ends when no object is left on the segment, or at its
//! deadline (what is left stays where it is).

use super::MasterState;
use crate::transfer::grant::Grant;
use crate::transfer::message::ReplicaLoc;
use crate::transfer::Status;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Copies of one key tried before it is given up.
pub const ATTEMPTS: u32 = 3;
/// Looks for keys that ended on a draining segment after it was listed.
const RESCANS: u32 = 8;
/// How long an ended drain is still told about.
const ENDED_KEPT: Duration = Duration::from_secs(3600);

/// One copy under way.
#[derive(Clone, Debug)]
struct HandOver {
    key: Box<str>,
    version: u64,
    size: u64,
    from: ReplicaLoc,
    to: ReplicaLoc,
}

/// One copy for the copier: read `size` bytes at `from_offset` of the store at
/// `from_endpoint`, write them at `to_offset` of the store at `to_endpoint` with `grant`.
#[derive(Clone, Debug, PartialEq)]
pub struct HandOverJob {
    pub key: String,
    pub version: u64,
    pub size: u64,
    pub checksum: u32,
    /// No CRC-32C was taken of the value: `checksum` means nothing.
    pub unhashed: bool,
    pub from_endpoint: String,
    pub from_offset: u64,
    pub to_endpoint: String,
    pub to_offset: u64,
    pub grant: Grant,
}

/// Where a drain stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DrainState {
    Draining,
    /// No object is left on the segment.
    Done,
    /// The deadline passed with objects left on it (or none could be placed elsewhere).
    Expired,
}

impl From<&DrainStatus> for crate::transfer::message::HandOverResp {
    fn from(s: &DrainStatus) -> Self {
        crate::transfer::message::HandOverResp {
            state: match s.state {
                DrainState::Draining => 0,
                DrainState::Done => 1,
                DrainState::Expired => 2,
            },
            objects: s.objects,
            moved_objects: s.moved_objects,
            moved_bytes: s.moved_bytes,
            failed: s.failed,
            no_room: s.no_room,
        }
    }
}

/// A drain as the admin API and the stores see it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DrainStatus {
    pub segment: String,
    pub state: DrainState,
    /// Keys listed on the segment when the drain started.
    pub objects: u64,
    pub moved_objects: u64,
    pub moved_bytes: u64,
    /// Copies that failed (each key is tried up to `ATTEMPTS` times).
    pub failed: u64,
    /// Keys not handed over because no other segment had room.
    pub no_room: u64,
    pub elapsed_ms: u64,
}

#[derive(Debug)]
pub(super) struct Drain {
    name: String,
    started: Instant,
    deadline: Instant,
    /// Keys still to look at.
    pub(super) queue: VecDeque<Box<str>>,
    attempts: HashMap<Box<str>, u32>,
    objects: u64,
    moved_objects: u64,
    moved_bytes: u64,
    failed: u64,
    no_room: u64,
    /// Looks for keys that landed there after the listing.
    rescans: u32,
    ended: Option<(DrainState, Instant)>,
}

/// The drains and the copies under way.
#[derive(Debug, Default)]
pub struct HandOvers {
    pub(super) drains: HashMap<u64, Drain>,
    copies: HashMap<u64, HandOver>,
}

impl HandOvers {
    /// Whether object version `version` is being copied.
    pub fn contains(&self, version: u64) -> bool {
        self.copies.contains_key(&version)
    }

    /// A segment mounted again starts a new life: a drain it ended is forgotten (a later
    /// hand-over of it is a new one).
    pub fn forget_ended(&mut self, segment_id: u64) {
        if self
            .drains
            .get(&segment_id)
            .is_some_and(|d| d.ended.is_some())
        {
            self.drains.remove(&segment_id);
        }
    }

    /// Whether segment `segment_id` is being drained.
    pub fn draining(&self, segment_id: u64) -> bool {
        self.drains
            .get(&segment_id)
            .is_some_and(|d| d.ended.is_none())
    }

    /// Whether a segment takes no new puts: it is being handed over or was (until its store
    /// mounts it again). On every put's placement: no lookup while nothing was ever drained.
    pub fn closed(&self, segment_id: u64) -> bool {
        !self.drains.is_empty() && self.drains.contains_key(&segment_id)
    }
}

impl MasterState {
    /// Starts handing the segment `name` over, with `deadline` to finish, and answers where
    /// it stands. Asked again while it drains, the same drain; once it ended, the ended one,
    /// unless `again` (the admin API's ask starts a new one).
    pub fn start_drain(
        &mut self,
        name: &str,
        deadline: Duration,
        again: bool,
        now: Instant,
    ) -> Result<DrainStatus, (Status, String)> {
        let id = self
            .segments
            .by_name(name)
            .ok_or_else(|| (Status::SegmentNotFound, format!("no segment {name:?}")))?;
        let live = self.segments.get(id).is_some_and(|s| s.is_live());
        let known = self.hand_overs.drains.contains_key(&id);
        if !self.hand_overs.draining(id) && (again || !known) {
            if !live {
                return Err((
                    Status::SegmentNotFound,
                    format!("segment {name:?} is not live: nothing to hand over"),
                ));
            }
            let queue: VecDeque<Box<str>> = self.keys_on(id).into();
            tracing::info!(
                segment = name,
                objects = queue.len(),
                deadline_s = deadline.as_secs(),
                "hand-over started"
            );
            let drain = Drain {
                name: name.to_string(),
                started: now,
                deadline: now + deadline,
                objects: queue.len() as u64,
                queue,
                attempts: HashMap::new(),
                moved_objects: 0,
                moved_bytes: 0,
                failed: 0,
                no_room: 0,
                rescans: 0,
                ended: None,
            };
            // Ended drains are kept a while for those who ask how they went.
            self.hand_overs.drains.retain(|_, d| {
                d.ended
                    .is_none_or(|(_, at)| now.duration_since(at) < ENDED_KEPT)
            });
            self.hand_overs.drains.insert(id, drain);
            // Space reserved there for clients' next puts goes back: their puts go elsewhere.
            for object_id in self.reservations.on_segment(id) {
                if let Some(r) = self.reservations.remove(object_id) {
                    let until = r.started + self.cfg.put_start_release_timeout_ms.0;
                    self.release(&r.replicas, r.size, r.object_id, until, now);
                }
            }
        }
        self.settle_drain(id, now);
        Ok(self.drain_status(id, now).expect("just inserted"))
    }

    /// The hand-over a store asks for its own segment (`client_id` must be the one that
    /// mounted it).
    pub fn hand_over(
        &mut self,
        client_id: u64,
        segment_id: u64,
        deadline: Duration,
        now: Instant,
    ) -> Result<DrainStatus, (Status, String)> {
        let seg = self
            .segments
            .get(segment_id)
            .ok_or_else(|| (Status::SegmentNotFound, format!("no segment {segment_id}")))?;
        if seg.client_id != client_id {
            return Err((
                Status::InvalidParams,
                format!(
                    "segment {} is not this client's to hand over",
                    seg.info.name
                ),
            ));
        }
        let name = seg.info.name.clone();
        self.start_drain(&name, deadline, false, now)
    }

    /// Where the drain of segment `id` stands, if it was asked for.
    pub fn drain_status(&self, id: u64, now: Instant) -> Option<DrainStatus> {
        let d = self.hand_overs.drains.get(&id)?;
        let (state, at) = d.ended.unwrap_or((DrainState::Draining, now));
        Some(DrainStatus {
            segment: d.name.clone(),
            state,
            objects: d.objects,
            moved_objects: d.moved_objects,
            moved_bytes: d.moved_bytes,
            failed: d.failed,
            no_room: d.no_room,
            elapsed_ms: at.duration_since(d.started).as_millis() as u64,
        })
    }

    /// Every drain asked for, by segment name.
    pub fn drains(&self, now: Instant) -> Vec<DrainStatus> {
        let mut out: Vec<DrainStatus> = self
            .hand_overs
            .drains
            .keys()
            .filter_map(|id| self.drain_status(*id, now))
            .collect();
        out.sort_by(|a, b| a.segment.cmp(&b.segment));
        out
    }

    /// Takes copies to make, at most `max_items` and about `max_bytes` of them.
    pub fn take_hand_overs(
        &mut self,
        max_items: usize,
        max_bytes: u64,
        now: Instant,
    ) -> Vec<HandOverJob> {
        let mut jobs = Vec::new();
        let mut bytes = 0;
        let ids: Vec<u64> = self
            .hand_overs
            .drains
            .iter()
            .filter(|(_, d)| d.ended.is_none())
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.settle_drain(id, now);
            // Each queued key looked at once a call: one put back (its object between tiers,
            // or its copy under way) waits for the next.
            let mut looks = self.hand_overs.drains.get(&id).map_or(0, |d| d.queue.len());
            while jobs.len() < max_items && bytes < max_bytes && looks > 0 {
                looks -= 1;
                let Some(key) = self
                    .hand_overs
                    .drains
                    .get_mut(&id)
                    .filter(|d| d.ended.is_none())
                    .and_then(|d| d.queue.pop_front())
                else {
                    break;
                };
                if let Some(job) = self.hand_over_one(id, &key) {
                    bytes += job.size;
                    jobs.push(job);
                }
            }
            self.settle_drain(id, now);
        }
        jobs
    }

    /// The copy of `key` off segment `id`, if it still has a replica there and another
    /// segment has room.
    fn hand_over_one(&mut self, id: u64, key: &str) -> Option<HandOverJob> {
        let v = self.objects.get(key)?.current.as_ref()?;
        let from = v.replicas.iter().find(|r| r.segment_id == id)?.clone();
        let (version, size, checksum, unhashed) = (v.object_id, v.size, v.checksum, v.unhashed);
        if self.hand_overs.contains(version) || self.moves.contains(version) {
            // Under way already, or between tiers: looked at again later.
            if let Some(d) = self.hand_overs.drains.get_mut(&id) {
                d.queue.push_back(key.into());
            }
            return None;
        }
        let holders: Vec<u64> = v.replicas.iter().map(|r| r.segment_id).collect();
        let target = self
            .segments
            .live_memory()
            .filter(|s| {
                s.id != id
                    && s.has_store()
                    && !holders.contains(&s.id)
                    && !self.hand_overs.closed(s.id)
                    && s.alloc.largest_free() >= size
            })
            .max_by_key(|s| (s.alloc.free(), std::cmp::Reverse(s.id)))
            .map(|s| s.id);
        let Some(target) = target else {
            // Looked at again (room may come: a store joining, an eviction), a few times.
            if let Some(d) = self.hand_overs.drains.get_mut(&id) {
                d.no_room += 1;
                *d.attempts.entry(key.into()).or_default() += 1;
            }
            tracing::warn!(key, size, "no other segment has room to take it over");
            return None;
        };
        let offset = self.segments.get_mut(target)?.alloc.alloc(size)?;
        let to = ReplicaLoc {
            segment_id: target,
            offset,
        };
        let grant = self
            .segments
            .grants(version, std::slice::from_ref(&to), size)
            .pop()
            .unwrap_or_default();
        let endpoint = |sid: u64| {
            self.segments
                .get(sid)
                .map(|s| s.info.endpoint.clone())
                .unwrap_or_default()
        };
        let job = HandOverJob {
            key: key.to_string(),
            version,
            size,
            checksum,
            unhashed,
            from_endpoint: endpoint(id),
            from_offset: from.offset,
            to_endpoint: endpoint(target),
            to_offset: offset,
            grant,
        };
        self.hand_overs.copies.insert(
            version,
            HandOver {
                key: key.into(),
                version,
                size,
                from,
                to,
            },
        );
        Some(job)
    }

    /// The copies' outcomes, by object version. A copy that landed replaces the replica on
    /// the leaving segment while the object is still that version there; otherwise the new
    /// space goes back (and its store forgets what it recorded).
    pub fn handed_over(&mut self, results: &[(u64, Status)], now: Instant) {
        for &(version, status) in results {
            let Some(c) = self.hand_overs.copies.remove(&version) else {
                continue;
            };
            let drain_id = c.from.segment_id;
            let landed = status == Status::Ok && self.segments.is_live(c.to.segment_id);
            let current = self
                .objects
                .get_mut(&c.key)
                .and_then(|e| e.current.as_mut())
                .filter(|v| v.object_id == c.version && v.replicas.contains(&c.from));
            match current {
                Some(v) if landed => {
                    for r in v.replicas.iter_mut() {
                        if *r == c.from {
                            *r = c.to.clone();
                        }
                    }
                    let until = v.lease_until;
                    self.release(std::slice::from_ref(&c.from), c.size, c.version, until, now);
                    if let Some(d) = self.hand_overs.drains.get_mut(&drain_id) {
                        d.moved_objects += 1;
                        d.moved_bytes += c.size;
                    }
                }
                still_there => {
                    let retry = still_there.is_some();
                    self.release(std::slice::from_ref(&c.to), c.size, c.version, now, now);
                    if status != Status::Ok {
                        tracing::warn!(key = %c.key, status = status.name(),
                            "hand-over copy failed");
                    }
                    if let Some(d) = self.hand_overs.drains.get_mut(&drain_id) {
                        if status != Status::Ok {
                            d.failed += 1;
                        }
                        let n = d.attempts.entry(c.key.clone()).or_default();
                        *n += 1;
                        if retry && *n < ATTEMPTS {
                            d.queue.push_back(c.key.clone());
                        }
                    }
                }
            }
            self.settle_drain(drain_id, now);
        }
        // Nothing waits on these forgets: no client operation is answered by a hand-over.
        self.take_forget_wait();
    }

    /// The keys whose current version has a replica on segment `id`.
    fn keys_on(&self, id: u64) -> Vec<Box<str>> {
        self.objects
            .iter()
            .filter(|(_, e)| {
                e.current
                    .as_ref()
                    .is_some_and(|v| v.replicas.iter().any(|r| r.segment_id == id))
            })
            .map(|(k, _)| k.into())
            .collect()
    }

    /// Ends the drain of `id` once nothing is left to do, or at its deadline.
    fn settle_drain(&mut self, id: u64, now: Instant) {
        let Some(d) = self.hand_overs.drains.get(&id) else {
            return;
        };
        let copying = self
            .hand_overs
            .copies
            .values()
            .any(|c| c.from.segment_id == id);
        let state = if d.ended.is_some() {
            return;
        } else if now >= d.deadline {
            DrainState::Expired
        } else if !d.queue.is_empty() || copying {
            return;
        } else {
            // Puts begun there before the drain are waited for (they end or are given up)...
            let writing = self.objects.iter().any(|(_, e)| {
                e.pending
                    .as_ref()
                    .is_some_and(|p| p.replicas.iter().any(|r| r.segment_id == id))
            });
            if writing {
                return;
            }
            // ...and those that ended there since the keys were listed are taken too (each
            // key as many times as `ATTEMPTS` allows).
            let left = self.keys_on(id);
            let d = self
                .hand_overs
                .drains
                .get_mut(&id)
                .expect("looked up above");
            let again: Vec<Box<str>> = left
                .iter()
                .filter(|k| d.attempts.get(*k).is_none_or(|n| *n < ATTEMPTS))
                .cloned()
                .collect();
            if d.rescans < RESCANS && !again.is_empty() {
                d.rescans += 1;
                d.objects += again.len() as u64;
                d.queue.extend(again);
                return;
            }
            if left.is_empty() {
                DrainState::Done
            } else {
                DrainState::Expired
            }
        };
        let d = self
            .hand_overs
            .drains
            .get_mut(&id)
            .expect("looked up above");
        d.ended = Some((state, now));
        tracing::info!(segment = %d.name, ?state, moved = d.moved_objects,
            bytes = d.moved_bytes, failed = d.failed, no_room = d.no_room, "hand-over ended");
    }
}
