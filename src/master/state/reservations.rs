//! Put reservations: space allocated and versions drawn for clients' next puts, not yet any
//! key's (see `MasterState::reserve`). Kept by object id, with each client's reserved bytes and
//! the reservations in the order they were made, so that granting, committing and expiring
//! never walk every reservation.

use super::objects::Pending;
use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

/// Space reserved for clients' next puts, by client, until used or expired.
#[derive(Debug, Default)]
pub struct Reservations {
    /// By object id: the reservation and the bytes charged to its client for it.
    by_id: HashMap<u64, (Pending, u64)>,
    /// Bytes each client holds in reservations (all replicas, as granted).
    charged: HashMap<u64, u64>,
    /// (made, object id), oldest first.
    by_age: BTreeSet<(Instant, u64)>,
}

impl Reservations {
    /// Reservations held.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether no reservation is held.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Bytes `client_id` holds in reservations.
    pub fn held_by(&self, client_id: u64) -> u64 {
        self.charged.get(&client_id).copied().unwrap_or(0)
    }

    /// Holds a put's reservation, charged to its client.
    pub fn insert(&mut self, p: Pending) {
        let charge = p.size * p.replicas.len() as u64;
        *self.charged.entry(p.client_id).or_default() += charge;
        self.by_age.insert((p.started, p.object_id));
        if let Some((old, old_charge)) = self.by_id.insert(p.object_id, (p, charge)) {
            // Object ids are unique; keep the books right regardless.
            self.uncharge(old.client_id, old_charge);
            self.by_age.remove(&(old.started, old.object_id));
        }
    }

    /// The reservation of `object_id`, if held.
    pub fn get(&self, object_id: u64) -> Option<&Pending> {
        self.by_id.get(&object_id).map(|(p, _)| p)
    }

    /// Lets the reservation of `object_id` go, and its client's charge with it.
    pub fn remove(&mut self, object_id: u64) -> Option<Pending> {
        let (p, charge) = self.by_id.remove(&object_id)?;
        self.uncharge(p.client_id, charge);
        self.by_age.remove(&(p.started, p.object_id));
        Some(p)
    }

    /// Object ids of the reservations made before `before`, oldest first.
    pub fn made_before(&self, before: Instant) -> Vec<u64> {
        self.by_age
            .iter()
            .take_while(|(made, _)| *made < before)
            .map(|(_, id)| *id)
            .collect()
    }

    /// Object ids of `client_id`'s reservations.
    pub fn of_client(&self, client_id: u64) -> Vec<u64> {
        if self.held_by(client_id) == 0 {
            return Vec::new();
        }
        self.by_id
            .values()
            .filter(|(p, _)| p.client_id == client_id)
            .map(|(p, _)| p.object_id)
            .collect()
    }

    /// Object ids of the reservations with a replica on `segment_id`.
    pub fn on_segment(&self, segment_id: u64) -> Vec<u64> {
        self.by_id
            .values()
            .filter(|(p, _)| p.replicas.iter().any(|r| r.segment_id == segment_id))
            .map(|(p, _)| p.object_id)
            .collect()
    }

    /// A segment went: its replicas leave every reservation (committing one left without
    /// replicas fails).
    pub fn drop_segment(&mut self, segment_id: u64) {
        for (p, _) in self.by_id.values_mut() {
            p.replicas.retain(|r| r.segment_id != segment_id);
        }
    }

    fn uncharge(&mut self, client_id: u64, charge: u64) {
        if let Some(c) = self.charged.get_mut(&client_id) {
            *c = c.saturating_sub(charge);
            if *c == 0 {
                self.charged.remove(&client_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::message::ReplicaLoc;
    use std::time::Duration;

    fn pending(id: u64, client_id: u64, size: u64, replicas: u64, started: Instant) -> Pending {
        Pending {
            object_id: id,
            client_id,
            size,
            replicas: (0..replicas)
                .map(|s| ReplicaLoc {
                    segment_id: s,
                    offset: id * 1000,
                })
                .collect(),
            started,
            soft_pin_ttl: None,
            hashed_early: None,
        }
    }

    #[test]
    fn books_are_kept_per_client_and_in_age_order() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut r = Reservations::default();
        r.insert(pending(1, 7, 100, 2, at(5)));
        r.insert(pending(2, 7, 50, 1, at(1)));
        r.insert(pending(3, 9, 10, 1, at(3)));
        assert_eq!((r.held_by(7), r.held_by(9), r.len()), (250, 10, 3));
        assert_eq!(r.made_before(at(4)), vec![2, 3]);
        let mut mine = r.of_client(7);
        mine.sort();
        assert_eq!(mine, vec![1, 2]);
        // Charged as granted, even after a segment took a replica away.
        r.drop_segment(1);
        assert_eq!(r.get(1).unwrap().replicas.len(), 1);
        assert_eq!(r.remove(1).unwrap().object_id, 1);
        assert_eq!(r.held_by(7), 50);
        assert!(r.remove(1).is_none());
        r.remove(2);
        assert_eq!(r.held_by(7), 0);
        assert!(r.of_client(7).is_empty());
        assert_eq!(r.made_before(at(100)), vec![3]);
    }
}
