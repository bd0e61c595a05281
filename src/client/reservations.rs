//! Space the master reserved for this client's next puts. A put's commit asks for one
//! reservation per value it carried (of the same size, placed the same way); the next put of
//! that size writes into a reservation and needs only its commit: one master round trip
//! instead of two (start, then end).
//!
//! A reservation may only be *started into* until its TTL (counted from when the commit that
//! asked for it was sent, so never later than the master counts); the master keeps unused ones
//! for twice that, and a restarted master allocates nothing for one TTL, so no write into a
//! reservation of an earlier master lands on a new object. Reservations this client let run out
//! are handed back by the heartbeat, so their space is free at once.
//!
//! Pure bookkeeping: no sockets, the clock is passed in.

use crate::transfer::message::{PutStartResp, ReplicateConfig};
use crate::transfer::Status;
use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// One reservation: where a value of `size` bytes placed by `config` goes, and its version.
#[derive(Clone, Debug)]
pub struct Reserved {
    pub config: ReplicateConfig,
    pub size: u64,
    pub start: PutStartResp,
    pub usable_until: Instant,
}

impl Reserved {
    fn bytes(&self) -> u64 {
        self.size * self.start.replicas.len() as u64
    }
}

/// Space the master reserved for this client's next puts, by size and placement.
pub struct Reservations {
    held: Mutex<Vec<Reserved>>,
    /// Most bytes (all replicas) held at once; 0 = never ask for reservations.
    max_bytes: u64,
    /// Only values up to this size are reserved for: for larger ones the saved round trip is
    /// small beside the transfer.
    max_value: u64,
}

impl Reservations {
    /// Reservations of at most `max_bytes` in all, and only for values of at most `max_value`
    /// bytes.
    pub fn new(max_bytes: u64, max_value: u64) -> Reservations {
        Reservations {
            held: Mutex::new(Vec::new()),
            max_bytes,
            max_value,
        }
    }

    /// Takes a reservation for a value of `size` placed by `config` that may still be started
    /// into at `now`.
    pub fn take(&self, size: u64, config: &ReplicateConfig, now: Instant) -> Option<Reserved> {
        let mut held = self.held.lock();
        let i = held
            .iter()
            .position(|r| r.size == size && r.config == *config && now < r.usable_until)?;
        Some(held.swap_remove(i))
    }

    /// Gives back a reservation taken and not written into.
    pub fn put_back(&self, r: Reserved) {
        self.held.lock().push(r);
    }

    /// Of these value sizes, the ones to ask reservations for: small enough, and while the
    /// bytes held and asked stay within the limit.
    pub fn wanted(
        &self,
        sizes: impl IntoIterator<Item = u64>,
        config: &ReplicateConfig,
    ) -> Vec<u64> {
        if self.max_bytes == 0 {
            return Vec::new();
        }
        let copies = u64::from(config.replica_num.max(1));
        let mut bytes: u64 = self.held.lock().iter().map(Reserved::bytes).sum();
        let mut want = Vec::new();
        for size in sizes {
            let more = size.saturating_mul(copies);
            if size == 0 || size > self.max_value || bytes.saturating_add(more) > self.max_bytes {
                continue;
            }
            bytes += more;
            want.push(size);
        }
        want
    }

    /// Keeps the master's answers to a request for reservations of `sizes`, sent at `asked`.
    pub fn add(
        &self,
        config: &ReplicateConfig,
        sizes: &[u64],
        answers: Vec<Result<PutStartResp, Status>>,
        asked: Instant,
        ttl: Duration,
    ) {
        let mut held = self.held.lock();
        for (&size, answer) in sizes.iter().zip(answers) {
            if let Ok(start) = answer {
                if !start.replicas.is_empty() {
                    held.push(Reserved {
                        config: config.clone(),
                        size,
                        start,
                        usable_until: asked + ttl,
                    });
                }
            }
        }
    }

    /// Takes the reservations that can no longer be started into at `now` (to hand back).
    pub fn take_expired(&self, now: Instant) -> Vec<Reserved> {
        let mut held = self.held.lock();
        let (expired, live) = std::mem::take(&mut *held)
            .into_iter()
            .partition(|r| now >= r.usable_until);
        *held = live;
        expired
    }

    /// Reservations held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.held.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::message::ReplicaLoc;

    fn start(id: u64, replicas: usize) -> PutStartResp {
        PutStartResp {
            object_id: id,
            replicas: (0..replicas as u64)
                .map(|s| ReplicaLoc {
                    segment_id: s,
                    offset: id * 4096,
                })
                .collect(),
            grants: vec![Default::default(); replicas],
        }
    }

    #[test]
    fn a_reservation_serves_only_its_size_and_placement_and_only_before_its_ttl() {
        let r = Reservations::new(1 << 20, 1 << 20);
        let t0 = Instant::now();
        let cfg = ReplicateConfig::default();
        let two = ReplicateConfig {
            replica_num: 2,
            ..ReplicateConfig::default()
        };
        r.add(
            &cfg,
            &[4096],
            vec![Ok(start(7, 1))],
            t0,
            Duration::from_millis(500),
        );
        assert!(r.take(8192, &cfg, t0).is_none(), "another size");
        assert!(r.take(4096, &two, t0).is_none(), "another placement");
        assert!(
            r.take(4096, &cfg, t0 + Duration::from_millis(500))
                .is_none(),
            "at its TTL it may no longer be started into"
        );
        let got = r.take(4096, &cfg, t0 + Duration::from_millis(499)).unwrap();
        assert_eq!(got.start.object_id, 7);
        assert_eq!(r.len(), 0, "taken means gone");
        r.put_back(got);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn asks_stay_within_the_byte_limit_counting_replicas_and_skip_large_values() {
        let r = Reservations::new(16 << 10, 8 << 10);
        let cfg = ReplicateConfig::default();
        assert_eq!(
            r.wanted([4096, 4096, 4096, 4096, 4096], &cfg),
            vec![4096; 4]
        );
        assert_eq!(
            r.wanted([1 << 20, 0, 4096], &cfg),
            vec![4096],
            "too large, empty"
        );
        let two = ReplicateConfig {
            replica_num: 2,
            ..ReplicateConfig::default()
        };
        assert_eq!(r.wanted([4096, 4096, 4096], &two), vec![4096; 2]);
        let t0 = Instant::now();
        r.add(
            &cfg,
            &[4096, 4096],
            vec![Ok(start(1, 2)), Err(Status::NoSpace)],
            t0,
            Duration::from_secs(1),
        );
        assert_eq!(r.len(), 1, "a refused ask holds nothing");
        assert_eq!(r.wanted([4096; 4], &cfg), vec![4096; 2], "8 KiB held of 16");
        assert!(
            Reservations::new(0, 1 << 20)
                .wanted([4096], &cfg)
                .is_empty(),
            "off"
        );
    }

    #[test]
    fn expired_reservations_are_taken_for_handing_back() {
        let r = Reservations::new(1 << 20, 1 << 20);
        let cfg = ReplicateConfig::default();
        let t0 = Instant::now();
        r.add(
            &cfg,
            &[4096],
            vec![Ok(start(1, 1))],
            t0,
            Duration::from_millis(100),
        );
        r.add(
            &cfg,
            &[4096],
            vec![Ok(start(2, 1))],
            t0,
            Duration::from_millis(900),
        );
        let gone = r.take_expired(t0 + Duration::from_millis(100));
        assert_eq!(
            gone.iter().map(|g| g.start.object_id).collect::<Vec<_>>(),
            vec![1]
        );
        assert_eq!(r.len(), 1);
    }
}
