//! Which objects to evict: a pure function of the candidates, least recently used first, with
//! soft-pinned objects taken only when nothing else is left. Leased objects and unfinished puts
//! never reach this function (the caller leaves them out).

use std::time::Instant;

#[derive(Clone, Debug)]
pub struct EvictionCandidate<'a> {
    pub key: &'a str,
    pub last_access: Instant,
    /// Bytes freed by evicting it (all replicas).
    pub bytes: u64,
    pub soft_pinned: bool,
}

/// Picks keys, oldest access first, until at least `need_bytes` would be freed: first among the
/// unpinned, then among the soft-pinned. Returns fewer when the candidates cannot cover it.
pub fn select<'a>(mut candidates: Vec<EvictionCandidate<'a>>, need_bytes: u64) -> Vec<&'a str> {
    candidates.sort_unstable_by_key(|c| (c.soft_pinned, c.last_access));
    let mut freed = 0u64;
    let mut out = Vec::new();
    for c in candidates {
        if freed >= need_bytes {
            break;
        }
        freed += c.bytes;
        out.push(c.key);
    }
    out
}

/// Bytes to free so that usage falls to `(high_watermark − ratio) × capacity`; 0 while usage is
/// at or under the watermark and nothing forces eviction.
pub fn bytes_to_free(
    used: u64,
    capacity: u64,
    high_watermark: f64,
    ratio: f64,
    forced: bool,
) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let hwm = (high_watermark * capacity as f64) as u64;
    if used <= hwm && !forced {
        return 0;
    }
    let target = ((high_watermark - ratio).max(0.0) * capacity as f64) as u64;
    used.saturating_sub(target)
        .max((ratio * capacity as f64) as u64 * forced as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn oldest_go_first_and_soft_pinned_last() {
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let cands = vec![
            EvictionCandidate {
                key: "new",
                last_access: at(30),
                bytes: 10,
                soft_pinned: false,
            },
            EvictionCandidate {
                key: "pinned-old",
                last_access: at(1),
                bytes: 10,
                soft_pinned: true,
            },
            EvictionCandidate {
                key: "old",
                last_access: at(5),
                bytes: 10,
                soft_pinned: false,
            },
            EvictionCandidate {
                key: "mid",
                last_access: at(10),
                bytes: 10,
                soft_pinned: false,
            },
        ];
        assert_eq!(select(cands.clone(), 15), vec!["old", "mid"]);
        assert_eq!(select(cands.clone(), 30), vec!["old", "mid", "new"]);
        assert_eq!(
            select(cands.clone(), 35),
            vec!["old", "mid", "new", "pinned-old"]
        );
        assert_eq!(select(cands, 0), Vec::<&str>::new());
    }

    #[test]
    fn watermark_arithmetic() {
        // Under the watermark: nothing.
        assert_eq!(bytes_to_free(80, 100, 0.9, 0.05, false), 0);
        // Over: down to 85 %.
        assert_eq!(bytes_to_free(95, 100, 0.9, 0.05, false), 10);
        // Forced (an allocation failed) under the watermark: at least ratio × capacity.
        assert_eq!(bytes_to_free(50, 1000, 0.9, 0.05, true), 50);
        assert_eq!(bytes_to_free(0, 0, 0.9, 0.05, true), 0);
    }
}
