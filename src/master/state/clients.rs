//! The clients the master knows (stores and readers alike), when each was last heard from,
//! which segments it mounted, and how many of its connections are bound to it.
//!
//! A client is live while it was heard from within the TTL, or while it holds no segment and
//! a connection bound to it (by a ping on it) is open: a reader or writer that keeps its
//! connection need not heartbeat, and its TTL starts when its last bound connection closes.
//! A client with segments must keep heartbeating, so that a paused store still expires and
//! its segments go away.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One client the master knows: when it was last heard from, and on which connection.
#[derive(Debug)]
pub struct Client {
    pub last_seen: Instant,
    pub segments: Vec<u64>,
    /// Open connections bound to this client.
    bound: u32,
    /// Tells this entry from an earlier one under the same id: a binding made for an earlier
    /// one binds nothing here.
    incarnation: u64,
}

impl Client {
    fn live(&self, ttl: Duration, now: Instant) -> bool {
        (self.bound > 0 && self.segments.is_empty())
            || now.saturating_duration_since(self.last_seen) <= ttl
    }
}

/// A connection's binding to a client: the client's id and the entry it was made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    pub client_id: u64,
    incarnation: u64,
}

/// The clients the master knows, and which of them have run out their TTL.
#[derive(Debug, Default)]
pub struct ClientTable {
    by_id: HashMap<u64, Client>,
    incarnations: u64,
}

impl ClientTable {
    /// A heartbeat from `id`. Returns true when the client was unknown (new, expired, or the
    /// master restarted).
    pub fn ping(&mut self, id: u64, now: Instant) -> bool {
        match self.by_id.get_mut(&id) {
            Some(c) => {
                c.last_seen = now;
                false
            }
            None => {
                self.touch(id, now);
                true
            }
        }
    }

    /// Client `id`, known from now on if it was not, seen at `now`.
    pub fn touch(&mut self, id: u64, now: Instant) -> &mut Client {
        let incarnations = &mut self.incarnations;
        let c = self.by_id.entry(id).or_insert_with(|| {
            *incarnations += 1;
            Client {
                last_seen: now,
                segments: Vec::new(),
                bound: 0,
                incarnation: *incarnations,
            }
        });
        c.last_seen = now;
        c
    }

    /// A ping from `id` on a connection that holds `held`: answers whether the client was
    /// unknown, and the binding the connection is to hold from now on if it needs a new one
    /// (it held none, one for another client, or one for an entry gone since).
    pub fn ping_on(
        &mut self,
        id: u64,
        held: Option<Binding>,
        now: Instant,
    ) -> (bool, Option<Binding>) {
        let unknown = !self.by_id.contains_key(&id);
        let c = self.touch(id, now);
        let current = Binding {
            client_id: id,
            incarnation: c.incarnation,
        };
        if held == Some(current) {
            return (unknown, None);
        }
        c.bound += 1;
        (unknown, Some(current))
    }

    /// A bound connection closed: when it was the last of a client without segments, its TTL
    /// runs from `now`.
    pub fn unbind(&mut self, b: Binding, now: Instant) {
        if let Some(c) = self.by_id.get_mut(&b.client_id) {
            if c.incarnation == b.incarnation {
                c.bound = c.bound.saturating_sub(1);
                // A store's TTL keeps running from its last heartbeat.
                if c.bound == 0 && c.segments.is_empty() {
                    c.last_seen = now;
                }
            }
        }
    }

    /// Client `id`, if known.
    pub fn get(&self, id: u64) -> Option<&Client> {
        self.by_id.get(&id)
    }

    /// Forgets client `id`.
    pub fn remove(&mut self, id: u64) -> Option<Client> {
        self.by_id.remove(&id)
    }

    /// Removes client `id` if it holds no segment.
    pub fn remove_if_idle(&mut self, id: u64) {
        if self.get(id).is_some_and(|c| c.segments.is_empty()) {
            self.by_id.remove(&id);
        }
    }

    /// Segment `segment_id` is no longer client `id`'s.
    pub fn detach(&mut self, id: u64, segment_id: u64) {
        if let Some(c) = self.by_id.get_mut(&id) {
            c.segments.retain(|s| *s != segment_id);
        }
    }

    /// Whether client `id` is live: heard from within `ttl`, or holding no segment and a
    /// bound connection.
    pub fn alive(&self, id: u64, ttl: Duration, now: Instant) -> bool {
        self.get(id).is_some_and(|c| c.live(ttl, now))
    }

    /// The clients no longer live.
    pub fn expired(&self, ttl: Duration, now: Instant) -> Vec<u64> {
        self.by_id
            .iter()
            .filter(|(_, c)| !c.live(ttl, now))
            .map(|(id, _)| *id)
            .collect()
    }

    /// How many clients have a bound connection open.
    pub fn bound(&self) -> usize {
        self.by_id.values().filter(|c| c.bound > 0).count()
    }

    /// Clients known.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }
}
