//! The endpoints a store keeps for Mooncake's RDMA clients: one set of QPs per peer nic path
//! and local device, made when the peer handshakes and kept until something says it is gone.
//!
//! Mooncake never tears an endpoint down on the wire, and a target of one-sided READs and
//! WRITEs sees no traffic to tell it a peer is still there. So the table keeps sets by what it
//! can know: a handshake from the same nic path replaces that path's set (the peer restarted or
//! rebuilt its QPs), a set not confirmed for `idle` is checked by asking whether the peer's
//! handshake listener still answers (dropped when it does not), and the QPs any one address
//! can hold, and all peers together, are bounded. Pure bookkeeping over any set type `S`: the
//! verbs are the caller's.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// How many QPs peers may make a store hold, and how long a set stands unconfirmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointLimits {
    /// QPs of all the sets made from one address (a process of Mooncake's default
    /// configuration makes 2 per NIC pair).
    pub per_address: usize,
    /// QPs of all sets together.
    pub total: usize,
    /// A set not confirmed for this long has its peer checked.
    pub idle: Duration,
}

impl Default for EndpointLimits {
    fn default() -> Self {
        EndpointLimits {
            per_address: 512,
            total: 4096,
            idle: Duration::from_secs(60),
        }
    }
}

/// A set's key: the local device's index and the sender's nic path.
pub type Key = (usize, String);

struct Entry<S> {
    set: S,
    /// The peer's QP numbers, by index: a repeated handshake with the same list is answered
    /// with the same set.
    peer_qps: Vec<u32>,
    from: IpAddr,
    /// When the peer last handshook, sent its ready-ACK or answered a check.
    confirmed: Instant,
    /// A check is under way (its answer is [`EndpointTable::checked`]).
    checking: bool,
}

/// What to do with a Connection request, once checked against the table.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// The same peer QPs as the set the table holds: answer with that set again.
    Same,
    /// Make a new set of this many QPs (the old one at the key, if any, is already dropped).
    Make(usize),
}

/// The sets, with their counts.
pub struct EndpointTable<S> {
    limits: EndpointLimits,
    sets: HashMap<Key, Entry<S>>,
    qps: usize,
}

impl<S> EndpointTable<S> {
    /// An empty table bounded by `limits`.
    pub fn new(limits: EndpointLimits) -> EndpointTable<S> {
        EndpointTable {
            limits,
            sets: HashMap::new(),
            qps: 0,
        }
    }

    /// How long a set stands unconfirmed before its peer is checked.
    pub fn idle(&self) -> Duration {
        self.limits.idle
    }

    /// QPs held in all.
    pub fn qps(&self) -> usize {
        self.qps
    }

    /// Sets held.
    pub fn len(&self) -> usize {
        self.sets.len()
    }

    /// Whether no endpoint is held.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    /// The set at `key`, if it is there.
    pub fn get(&self, key: &Key) -> Option<&S> {
        self.sets.get(key).map(|e| &e.set)
    }

    /// Sets held per local device index.
    pub fn qps_per_device(&self, devices: usize) -> Vec<usize> {
        let mut out = vec![0; devices];
        for ((device, _), e) in &self.sets {
            if let Some(n) = out.get_mut(*device) {
                *n += e.peer_qps.len();
            }
        }
        out
    }

    /// Checks a request for `peer_qps` at `key` from `from`: answered with the held set when
    /// the list is the same, or room made for a new set; the sets dropped to make room come
    /// back in `dropped`. Refused, with the text for the peer, when the request alone is over
    /// a bound, or every QP is held by other addresses.
    pub fn admit(
        &mut self,
        key: &Key,
        peer_qps: &[u32],
        from: IpAddr,
        now: Instant,
        dropped: &mut Vec<S>,
    ) -> Result<Admission, String> {
        if let Some(e) = self.sets.get_mut(key) {
            if e.peer_qps == peer_qps {
                e.confirmed = now;
                return Ok(Admission::Same);
            }
        }
        // Re-established by the peer: its old QPs are gone on its side.
        if let Some(old) = self.remove(key) {
            dropped.push(old);
        }
        let n = peer_qps.len();
        if n > self.limits.per_address || n > self.limits.total {
            return Err(format!(
                "{n} QPs asked: this store makes at most {} for one address",
                self.limits.per_address.min(self.limits.total)
            ));
        }
        // Over its address's share, the address's own least recently confirmed sets go.
        while self.held_by(from) + n > self.limits.per_address {
            let oldest = self
                .oldest(|e| e.from == from)
                .expect("the address holds some");
            dropped.extend(self.remove(&oldest));
        }
        if self.qps + n > self.limits.total {
            return Err(format!(
                "this store holds {} QPs for Mooncake peers, its limit: try again later",
                self.qps
            ));
        }
        Ok(Admission::Make(n))
    }

    /// Holds `set`, made for an admitted request.
    pub fn insert(&mut self, key: Key, set: S, peer_qps: Vec<u32>, from: IpAddr, now: Instant) {
        self.qps += peer_qps.len();
        let old = self.sets.insert(
            key,
            Entry {
                set,
                peer_qps,
                from,
                confirmed: now,
                checking: false,
            },
        );
        if let Some(old) = old {
            self.qps -= old.peer_qps.len();
        }
    }

    /// A ready-ACK for `key` (sent only by a peer told to: this side's replies do not ask for
    /// one): accepted when it names the QPs the set was made for, with Mooncake's own refusals
    /// otherwise.
    pub fn ready_ack(&mut self, key: &Key, peer_qps: &[u32], now: Instant) -> Result<(), String> {
        match self.sets.get_mut(key) {
            None => Err("Received RDMA ready ACK for unconnected endpoint".into()),
            Some(e) if e.peer_qps != peer_qps => {
                Err("Received stale RDMA ready ACK, peer QP list mismatch".into())
            }
            Some(e) => {
                e.confirmed = now;
                Ok(())
            }
        }
    }

    /// Sets whose peers are due a check (not confirmed within `idle`, none under way), with
    /// their nic paths' server parts; each is marked as being checked.
    pub fn due(&mut self, now: Instant) -> Vec<(Key, String)> {
        let idle = self.limits.idle;
        let mut out = Vec::new();
        for (key, e) in &mut self.sets {
            if !e.checking && now.saturating_duration_since(e.confirmed) >= idle {
                e.checking = true;
                let server = key.1.rsplit_once('@').map_or("", |(s, _)| s).to_string();
                out.push((key.clone(), server));
            }
        }
        out
    }

    /// The answer of a check of `key`'s peer: confirmed when it answered, else the set is
    /// dropped and handed back. A set replaced since the check began is left alone.
    pub fn checked(&mut self, key: &Key, alive: bool, now: Instant) -> Option<S> {
        let e = self.sets.get_mut(key)?;
        if !e.checking {
            return None;
        }
        e.checking = false;
        if alive {
            e.confirmed = now;
            None
        } else {
            self.remove(key)
        }
    }

    /// Every set, for a stop.
    pub fn drain(&mut self) -> Vec<S> {
        self.qps = 0;
        self.sets.drain().map(|(_, e)| e.set).collect()
    }

    fn remove(&mut self, key: &Key) -> Option<S> {
        let e = self.sets.remove(key)?;
        self.qps -= e.peer_qps.len();
        Some(e.set)
    }

    fn held_by(&self, from: IpAddr) -> usize {
        self.sets
            .values()
            .filter(|e| e.from == from)
            .map(|e| e.peer_qps.len())
            .sum()
    }

    fn oldest(&self, which: impl Fn(&Entry<S>) -> bool) -> Option<Key> {
        self.sets
            .iter()
            .filter(|(_, e)| which(e))
            .min_by_key(|(_, e)| e.confirmed)
            .map(|(k, _)| k.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    fn key(path: &str) -> Key {
        (0, format!("{path}@rxe0"))
    }

    fn table(per_address: usize, total: usize) -> EndpointTable<&'static str> {
        EndpointTable::new(EndpointLimits {
            per_address,
            total,
            idle: Duration::from_secs(10),
        })
    }

    /// Admits and inserts; answers what was dropped.
    fn handshake(
        t: &mut EndpointTable<&'static str>,
        k: &Key,
        qps: &[u32],
        from: IpAddr,
        set: &'static str,
        now: Instant,
    ) -> Result<(Admission, Vec<&'static str>), String> {
        let mut dropped = Vec::new();
        let a = t.admit(k, qps, from, now, &mut dropped)?;
        if a != Admission::Same {
            t.insert(k.clone(), set, qps.to_vec(), from, now);
        }
        Ok((a, dropped))
    }

    #[test]
    fn a_repeated_handshake_is_answered_with_the_same_set_and_a_new_one_replaces_it() {
        let now = Instant::now();
        let mut t = table(8, 16);
        let k = key("10.0.0.1:17002");
        assert_eq!(
            handshake(&mut t, &k, &[17, 18], A, "first", now),
            Ok((Admission::Make(2), vec![]))
        );
        assert_eq!(
            handshake(&mut t, &k, &[17, 18], A, "unused", now),
            Ok((Admission::Same, vec![]))
        );
        assert_eq!(t.get(&k), Some(&"first"));
        // The peer came back with new QPs: the old set goes, the new one takes its place.
        assert_eq!(
            handshake(&mut t, &k, &[30, 31, 32], A, "second", now),
            Ok((Admission::Make(3), vec!["first"]))
        );
        assert_eq!((t.len(), t.qps(), t.get(&k)), (1, 3, Some(&"second")));
        assert_eq!(t.qps_per_device(2), vec![3, 0]);
    }

    #[test]
    fn one_address_makes_way_among_its_own_sets_and_cannot_take_everyones_room() {
        let now = Instant::now();
        let mut t = table(4, 6);
        let at = |s| now + Duration::from_secs(s);
        handshake(&mut t, &key("a:1"), &[1, 2], A, "a1", at(0)).unwrap();
        handshake(&mut t, &key("a:2"), &[3, 4], A, "a2", at(1)).unwrap();
        // A third set from A: A's least recently confirmed set makes way.
        let (_, dropped) = handshake(&mut t, &key("a:3"), &[5, 6], A, "a3", at(2)).unwrap();
        assert_eq!(dropped, vec!["a1"]);
        assert_eq!(t.qps(), 4);
        handshake(&mut t, &key("b:1"), &[7, 8], B, "b1", at(3)).unwrap();
        // All six held: B's next set is refused, and A's sets stay.
        let e = handshake(&mut t, &key("b:2"), &[9, 10], B, "b2", at(4)).unwrap_err();
        assert!(e.contains("limit"), "{e}");
        assert_eq!(t.len(), 3);
        // A request over a bound by itself is refused with the bound.
        let e = handshake(&mut t, &key("c:1"), &[1, 2, 3, 4, 5], B, "c", at(5)).unwrap_err();
        assert!(e.contains("at most 4"), "{e}");
    }

    #[test]
    fn a_ready_ack_must_name_the_qps_the_set_was_made_for() {
        let now = Instant::now();
        let mut t = table(8, 8);
        let k = key("a:1");
        let mut dropped = Vec::new();
        t.admit(&k, &[1, 2], A, now, &mut dropped).unwrap();
        t.insert(k.clone(), "s", vec![1, 2], A, now);
        assert!(t
            .ready_ack(&key("a:2"), &[1, 2], now)
            .unwrap_err()
            .contains("unconnected"));
        assert!(t.ready_ack(&k, &[1, 3], now).unwrap_err().contains("stale"));
        assert_eq!(t.ready_ack(&k, &[1, 2], now), Ok(()));
    }

    #[test]
    fn an_unconfirmed_set_is_checked_once_and_dropped_only_when_its_peer_is_gone() {
        let now = Instant::now();
        let mut t = table(8, 8);
        let (k1, k2) = (key("10.0.0.1:1"), key("10.0.0.1:2"));
        handshake(&mut t, &k1, &[1], A, "one", now).unwrap();
        handshake(&mut t, &k2, &[2], A, "two", now + Duration::from_secs(5)).unwrap();
        assert!(t.due(now + Duration::from_secs(9)).is_empty());
        let later = now + Duration::from_secs(11);
        assert_eq!(t.due(later), vec![(k1.clone(), "10.0.0.1:1".to_string())]);
        // Under way: not handed out twice.
        assert!(t.due(later).is_empty());
        assert_eq!(t.checked(&k1, true, later), None);
        assert_eq!(t.len(), 2);
        // Confirmed at `later`: due again only an idle period after it.
        assert_eq!(t.due(later + Duration::from_secs(5)).len(), 1); // k2's turn
        assert_eq!(t.checked(&k2, false, later), Some("two"));
        assert_eq!((t.len(), t.qps()), (1, 1));
        // A check answered after the set was replaced leaves the new set alone.
        let again = later + Duration::from_secs(30);
        assert_eq!(t.due(again).len(), 1);
        handshake(&mut t, &k1, &[9], A, "new", again).unwrap();
        assert_eq!(t.checked(&k1, false, again), None);
        assert_eq!(t.get(&k1), Some(&"new"));
        assert_eq!(t.drain(), vec!["new"]);
        assert_eq!(t.qps(), 0);
    }
}
