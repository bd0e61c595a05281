//! Which segments get an object's replicas: a pure choice over the mounted segments, so it can be
//! tested without a cluster.

/// How the master orders candidate segments (`allocation_strategy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// A random starting segment, then the rest in order (Mooncake's default).
    Random,
    /// Segments with the largest share of free space first.
    FreeRatioFirst,
}

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "random" => Ok(Strategy::Random),
            "free_ratio_first" => Ok(Strategy::FreeRatioFirst),
            other => Err(format!(
                "unknown allocation strategy {other:?} (random, free_ratio_first)"
            )),
        }
    }
}

/// A segment as placement sees it.
#[derive(Clone, Debug)]
pub struct Candidate<'a> {
    pub id: u64,
    pub name: &'a str,
    pub capacity: u64,
    pub free: u64,
}

/// Orders the candidates to try for one object: the preferred segment first when it is mounted,
/// then the strategy's order. The caller allocates down the list until it has `replica_num`
/// replicas on distinct segments.
pub fn order(
    candidates: &[Candidate<'_>],
    preferred: &str,
    strategy: Strategy,
    rng: &mut fastrand::Rng,
) -> Vec<u64> {
    let mut rest: Vec<&Candidate<'_>> = candidates.iter().collect();
    match strategy {
        Strategy::Random => {
            if !rest.is_empty() {
                let start = rng.usize(..rest.len());
                rest.rotate_left(start);
            }
        }
        Strategy::FreeRatioFirst => rest.sort_by(|a, b| {
            let ra = a.free as f64 / a.capacity.max(1) as f64;
            let rb = b.free as f64 / b.capacity.max(1) as f64;
            rb.total_cmp(&ra)
        }),
    }
    let mut out = Vec::with_capacity(rest.len());
    if !preferred.is_empty() {
        if let Some(p) = rest.iter().position(|c| c.name == preferred) {
            out.push(rest.remove(p).id);
        }
    }
    out.extend(rest.iter().map(|c| c.id));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands() -> Vec<Candidate<'static>> {
        vec![
            Candidate {
                id: 1,
                name: "a",
                capacity: 100,
                free: 10,
            },
            Candidate {
                id: 2,
                name: "b",
                capacity: 100,
                free: 90,
            },
            Candidate {
                id: 3,
                name: "c",
                capacity: 100,
                free: 50,
            },
        ]
    }

    #[test]
    fn preferred_segment_comes_first() {
        let mut rng = fastrand::Rng::with_seed(1);
        for _ in 0..10 {
            let o = order(&cands(), "c", Strategy::Random, &mut rng);
            assert_eq!(o[0], 3);
            assert_eq!(o.len(), 3);
        }
    }

    #[test]
    fn unknown_preferred_segment_is_ignored() {
        let mut rng = fastrand::Rng::with_seed(1);
        let o = order(&cands(), "zzz", Strategy::FreeRatioFirst, &mut rng);
        assert_eq!(o, vec![2, 3, 1]);
    }

    #[test]
    fn random_strategy_spreads_first_choices() {
        let mut rng = fastrand::Rng::with_seed(3);
        let mut firsts = std::collections::HashSet::new();
        for _ in 0..50 {
            firsts.insert(order(&cands(), "", Strategy::Random, &mut rng)[0]);
        }
        assert_eq!(firsts.len(), 3);
    }
}
