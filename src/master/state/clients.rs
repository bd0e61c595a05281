//! The clients the master knows (stores and readers alike), when each was last heard from and
//! which segments it mounted.

use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Client {
    pub last_seen: Instant,
    pub segments: Vec<u64>,
}

#[derive(Debug, Default)]
pub struct ClientTable {
    by_id: HashMap<u64, Client>,
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
        let c = self.by_id.entry(id).or_insert(Client {
            last_seen: now,
            segments: Vec::new(),
        });
        c.last_seen = now;
        c
    }

    pub fn get(&self, id: u64) -> Option<&Client> {
        self.by_id.get(&id)
    }

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

    /// Whether client `id` was heard from within `ttl`.
    pub fn alive(&self, id: u64, ttl: Duration, now: Instant) -> bool {
        self.get(id)
            .is_some_and(|c| now.saturating_duration_since(c.last_seen) <= ttl)
    }

    /// The clients not heard from for longer than `ttl`.
    pub fn expired(&self, ttl: Duration, now: Instant) -> Vec<u64> {
        self.by_id
            .iter()
            .filter(|(_, c)| now.saturating_duration_since(c.last_seen) > ttl)
            .map(|(id, _)| *id)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }
}
