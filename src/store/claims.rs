//! Writes in version order: the bytes of a put are never overwritten by an older put's.
//!
//! The master gives space back the moment a put is revoked (its writer gave up on a store that
//! stopped answering: `SIGSTOP`, a long pause, a partition) and may give it to the next put at
//! once. The given-up put's bytes can still sit in the store's socket buffers and be written
//! when the store answers again, over the newer put that was acknowledged meanwhile. Versions
//! grow with every put the master starts (`write_floor` carries them across masters), so a
//! write is stale when a newer version holds, or is writing, any byte of its range.
//!
//! Each write claims its range while its bytes land: a claim overlapping a newer one, or a
//! newer record, is refused; one overlapping an older claim waits (bounded) for it, so two
//! writes never interleave their bytes in one range.

use parking_lot::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Why a write may not land.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// A newer put holds or is writing part of the range: this write's put was given up.
    #[error("version {newer} of another put holds this range now; this put was given up (start it again)")]
    Superseded { newer: u64 },
    /// An older put's bytes were still coming into the range past the wait.
    #[error("an earlier put (version {older}) is still writing this range; try again")]
    Busy { older: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Claim {
    start: u64,
    end: u64,
    version: u64,
}

impl Claim {
    fn overlaps(&self, other: &Claim) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// The ranges being written now. Each connection writes one request at a time, so there are
/// at most as many claims as connections: a list is the right size.
#[derive(Default)]
pub struct WriteClaims {
    held: Mutex<Vec<Claim>>,
    released: Condvar,
}

/// A held claim; dropping it lets waiting writes in.
#[must_use = "the claim ends when this is dropped"]
pub struct ClaimGuard<'a> {
    claims: &'a WriteClaims,
    claim: Claim,
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.claims.held.lock();
        if let Some(i) = held.iter().position(|c| *c == self.claim) {
            held.swap_remove(i);
        }
        drop(held);
        self.claims.released.notify_all();
    }
}

impl WriteClaims {
    /// Claims `[offset, offset + len)` for a write of `version`. `newest_recorded(offset, len)`
    /// is the newest version recorded over any byte of the range; it is asked once no claim
    /// overlaps, so no newer record can appear before this claim is held. Waits at most `wait`
    /// for older writes of the range to finish.
    pub fn claim(
        &self,
        offset: u64,
        len: u64,
        version: u64,
        newest_recorded: impl Fn(u64, u64) -> Option<u64>,
        wait: Duration,
    ) -> Result<ClaimGuard<'_>, ClaimError> {
        let claim = Claim {
            start: offset,
            end: offset.saturating_add(len.max(1)),
            version,
        };
        let deadline = Instant::now() + wait;
        let mut held = self.held.lock();
        loop {
            let blocking =
                held.iter()
                    .filter(|c| c.overlaps(&claim))
                    .fold(None::<(u64, u64)>, |acc, c| {
                        let (newest, oldest) = acc.unwrap_or((c.version, c.version));
                        Some((newest.max(c.version), oldest.min(c.version)))
                    });
            match blocking {
                Some((newest, _)) if newest > version => {
                    return Err(ClaimError::Superseded { newer: newest })
                }
                Some((_, older)) => {
                    if self.released.wait_until(&mut held, deadline).timed_out() {
                        return Err(ClaimError::Busy { older });
                    }
                }
                None => break,
            }
        }
        if let Some(newer) = newest_recorded(offset, len).filter(|&v| v > version) {
            return Err(ClaimError::Superseded { newer });
        }
        held.push(claim);
        Ok(ClaimGuard {
            claims: self,
            claim,
        })
    }

    /// Whether a write of `version` to the range came too late: a newer put holds or is
    /// writing part of it. For bytes that came in without the store (`SEAL`), checked before
    /// they are recorded.
    pub fn superseded(
        &self,
        offset: u64,
        len: u64,
        version: u64,
        newest_recorded: impl Fn(u64, u64) -> Option<u64>,
    ) -> Option<ClaimError> {
        let probe = Claim {
            start: offset,
            end: offset.saturating_add(len.max(1)),
            version,
        };
        let held = self.held.lock();
        let newer = held
            .iter()
            .filter(|c| c.overlaps(&probe) && c.version > version)
            .map(|c| c.version)
            .max()
            .or_else(|| newest_recorded(offset, len).filter(|&v| v > version));
        newer.map(|newer| ClaimError::Superseded { newer })
    }

    /// Claims held now (for tests and metrics).
    pub fn len(&self) -> usize {
        self.held.lock().len()
    }

    /// Whether no claim is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    const NONE: fn(u64, u64) -> Option<u64> = |_, _| None;
    const WAIT: Duration = Duration::from_secs(10);

    #[test]
    fn disjoint_ranges_are_written_at_once() {
        let claims = WriteClaims::default();
        let a = claims.claim(0, 4096, 5, NONE, WAIT).unwrap();
        let b = claims.claim(4096, 4096, 3, NONE, WAIT).unwrap();
        assert_eq!(claims.len(), 2);
        drop((a, b));
        assert!(claims.is_empty());
    }

    #[test]
    fn an_older_write_is_refused_while_a_newer_one_holds_any_byte_of_its_range() {
        let claims = WriteClaims::default();
        let _newer = claims.claim(4096, 4096, 9, NONE, WAIT).unwrap();
        assert_eq!(
            claims.claim(0, 4097, 7, NONE, WAIT).err(),
            Some(ClaimError::Superseded { newer: 9 })
        );
        assert_eq!(
            claims.superseded(8191, 1, 8, NONE),
            Some(ClaimError::Superseded { newer: 9 })
        );
        assert_eq!(claims.superseded(8192, 64, 8, NONE), None, "past its end");
    }

    #[test]
    fn an_older_write_is_refused_over_a_newer_record() {
        let claims = WriteClaims::default();
        let recorded = |offset: u64, len: u64| (offset < 128 && len > 0).then_some(12);
        assert_eq!(
            claims.claim(64, 64, 11, recorded, WAIT).err(),
            Some(ClaimError::Superseded { newer: 12 })
        );
        assert!(claims.is_empty(), "a refused claim holds nothing");
        let newer = claims.claim(64, 64, 13, recorded, WAIT).unwrap();
        drop(newer);
        assert_eq!(
            claims.superseded(0, 64, 11, recorded),
            Some(ClaimError::Superseded { newer: 12 })
        );
    }

    #[test]
    fn a_newer_write_waits_for_an_older_one_still_writing_its_range() {
        let claims = WriteClaims::default();
        let older = claims.claim(0, 4096, 3, NONE, WAIT).unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                tx.send("waiting").unwrap();
                let got = claims
                    .claim(2048, 4096, 4, NONE, WAIT)
                    .map(|g| g.claim.version);
                tx.send(if got == Ok(4) { "claimed" } else { "refused" })
                    .unwrap();
            });
            assert_eq!(rx.recv().unwrap(), "waiting");
            // Still held: the newer write has not got in (nothing but the release lets it).
            assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
            assert_eq!(claims.len(), 1);
            drop(older);
            assert_eq!(
                rx.recv_timeout(WAIT).unwrap(),
                "claimed",
                "the release let it in"
            );
        });
        assert!(claims.is_empty());
    }

    #[test]
    fn a_wait_past_its_bound_is_refused_as_busy() {
        let claims = WriteClaims::default();
        let _older = claims.claim(0, 64, 1, NONE, WAIT).unwrap();
        assert_eq!(
            claims
                .claim(0, 64, 2, NONE, Duration::from_millis(20))
                .err(),
            Some(ClaimError::Busy { older: 1 })
        );
        assert_eq!(claims.len(), 1);
    }
}
