//! Where a client's time goes, by kind of work: master round trips, store transfers, memory
//! copies (the same-host path) and checksums. Always counted (two clock reads cost tens of
//! nanoseconds against operations of microseconds); read with [`Client::breakdown`]
//! (`rbgctl bench store --breakdown` prints it per operation).
//!
//! [`Client::breakdown`]: super::Client::breakdown

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A kind of work a client operation is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// A request to the master and its answer.
    Master,
    /// Bytes moved to or from a store over the network (a batch for one segment).
    Transfer,
    /// Bytes copied to or from a same-host segment.
    Copy,
    /// CRC-32C of a value.
    Checksum,
}

impl Work {
    const ALL: [Work; 4] = [Work::Master, Work::Transfer, Work::Copy, Work::Checksum];

    fn index(self) -> usize {
        self as usize
    }
}

/// The running totals (shared by the client's threads).
#[derive(Default)]
pub struct Meter {
    nanos: [AtomicU64; 4],
    calls: [AtomicU64; 4],
    copied_bytes: AtomicU64,
}

impl Meter {
    /// Runs `f`, counting its time as `work`.
    pub fn time<T>(&self, work: Work, f: impl FnOnce() -> T) -> T {
        let t0 = Instant::now();
        let out = f();
        let ns = t0.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.nanos[work.index()].fetch_add(ns, Ordering::Relaxed);
        self.calls[work.index()].fetch_add(1, Ordering::Relaxed);
        out
    }

    /// Counts `bytes` copied by the CPU.
    pub fn copied(&self, bytes: u64) {
        self.copied_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The figures so far, per kind of work.
    pub fn snapshot(&self) -> Breakdown {
        let mut b = Breakdown::default();
        for w in Work::ALL {
            let (ns, calls) = (
                self.nanos[w.index()].load(Ordering::Relaxed),
                self.calls[w.index()].load(Ordering::Relaxed),
            );
            *b.part_mut(w) = Part { ns, calls };
        }
        b.copied_bytes = self.copied_bytes.load(Ordering::Relaxed);
        b
    }
}

/// Time and calls of one kind of work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Part {
    pub ns: u64,
    pub calls: u64,
}

/// A client's totals since it connected; [`Breakdown::since`] gives those of an interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    pub master: Part,
    pub transfer: Part,
    pub copy: Part,
    pub checksum: Part,
    pub copied_bytes: u64,
}

impl Breakdown {
    /// The figures of one kind of work.
    pub fn part(&self, w: Work) -> Part {
        match w {
            Work::Master => self.master,
            Work::Transfer => self.transfer,
            Work::Copy => self.copy,
            Work::Checksum => self.checksum,
        }
    }

    fn part_mut(&mut self, w: Work) -> &mut Part {
        match w {
            Work::Master => &mut self.master,
            Work::Transfer => &mut self.transfer,
            Work::Copy => &mut self.copy,
            Work::Checksum => &mut self.checksum,
        }
    }

    /// What happened between `earlier` and this snapshot.
    pub fn since(&self, earlier: &Breakdown) -> Breakdown {
        let mut d = Breakdown {
            copied_bytes: self.copied_bytes.saturating_sub(earlier.copied_bytes),
            ..Default::default()
        };
        for w in Work::ALL {
            let (a, b) = (earlier.part(w), self.part(w));
            *d.part_mut(w) = Part {
                ns: b.ns.saturating_sub(a.ns),
                calls: b.calls.saturating_sub(a.calls),
            };
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_meter_counts_each_kind_of_work_apart_and_intervals_subtract() {
        let m = Meter::default();
        m.time(Work::Master, || {
            std::thread::sleep(std::time::Duration::from_millis(2))
        });
        let before = m.snapshot();
        m.time(Work::Checksum, || ());
        m.time(Work::Checksum, || ());
        m.copied(4096);
        let d = m.snapshot().since(&before);
        assert_eq!(d.master, Part::default(), "before the interval");
        assert_eq!(d.checksum.calls, 2);
        assert_eq!(d.copied_bytes, 4096);
        assert!(before.master.ns >= 2_000_000, "{before:?}");
        assert_eq!((d.transfer.calls, d.copy.calls), (0, 0));
    }
}
