//! Time passing: clients heard from or not, stores away past their grace period, space
//! whose leases ended, abandoned puts and reservations, soft pins that ran out, and the
//! eviction watermark.

use super::{Binding, MasterState, SegState};
use crate::master::state::eviction;
use std::time::Instant;

impl MasterState {
    /// A heartbeat. Returns true when the client is unknown (new, expired, or the master
    /// restarted) and must mount its segments again.
    pub fn ping(&mut self, client_id: u64, now: Instant) -> bool {
        self.clients.ping(client_id, now)
    }

    /// A heartbeat on a connection that holds `held`: whether the client was unknown, and the
    /// binding the connection is to hold from now on, if it needs a new one
    /// (`clients::ClientTable::ping_on`).
    pub fn ping_on(
        &mut self,
        client_id: u64,
        held: Option<Binding>,
        now: Instant,
    ) -> (bool, Option<Binding>) {
        self.clients.ping_on(client_id, held, now)
    }

    /// A connection bound to a client closed.
    pub fn unbind(&mut self, binding: Binding, now: Instant) {
        self.clients.unbind(binding, now);
    }

    /// Drops clients whose heartbeats stopped more than `client_ttl` ago, with their segments
    /// and unfinished puts. Returns how many expired.
    pub fn expire_clients(&mut self, now: Instant) -> usize {
        let ttl = self.cfg.client_ttl_ms.0;
        let expired = self.clients.expired(ttl, now);
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
        let Some(client) = self.clients.remove(id) else {
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

    /// Periodic work: expire clients, release deferred space, reclaim abandoned puts, evict.
    /// Whether nothing here waits on the clock more finely than a second: no unfinished put,
    /// reservation, extent waiting for its release, queued move, walk, forget or KV event, no
    /// store away, and memory under the eviction watermark. What is left to time (clients,
    /// soft pins) may run out a second late. The housekeeper then ticks once a second; an
    /// operation that changes anything wakes it.
    pub fn quiet(&self) -> bool {
        let (used, capacity) = self.segments.used_and_capacity();
        let evicting = eviction::bytes_to_free(
            used.saturating_sub(self.moves.demoting_total()),
            capacity,
            self.cfg.eviction_high_watermark_ratio,
            self.cfg.eviction_ratio,
            self.force_eviction,
        ) > 0;
        self.indexes.pending() == 0
            && self.reservations.is_empty()
            && self.deferred.is_empty()
            && !self.has_queued_moves()
            && !self.walking()
            && !self.forgets_pending()
            && !self.pool_events.queued()
            && !self.segments.iter().any(|s| s.state.is_away())
            && !evicting
    }

    /// The periodic work at `now`: clients whose leases ran out, segments not back within their
    /// grace, space held back for readers released, puts begun too long ago reclaimed,
    /// reservations and soft pins that ran out, eviction past the watermark.
    pub fn housekeeping(&mut self, now: Instant) {
        self.expire_clients(now);
        let given_up: Vec<u64> = self
            .segments
            .iter()
            .filter(|s| matches!(s.state, SegState::Away { until } if until <= now))
            .map(|s| s.id)
            .collect();
        for id in given_up {
            if let Some(s) = self.segments.get(id) {
                tracing::warn!(segment = %s.info.name, "store did not come back within the grace period; dropping its objects");
            }
            self.unmount_segment(id);
            self.counters.segments_given_up += 1;
        }
        let mut i = 0;
        while i < self.deferred.len() {
            if self.deferred[i].until <= now {
                let d = self.deferred.swap_remove(i);
                if let Some(seg) = self.segments.get_mut(d.segment_id) {
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
}
