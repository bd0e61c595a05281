//! sglang-router's `manual` policy: a routing key (`X-SMG-Routing-Key`) keeps the worker it
//! was first given while that worker is a candidate; a new key (or one whose worker went) is
//! given one by `assignment_mode`; keys idle for `max_idle` are forgotten. Without a key: any
//! candidate.

use super::tree::Tenant;
use super::{least_loaded, Candidate, LoadBalancingPolicy, PolicyKind, RouteInput};
use crate::config::Secs;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Instant;

/// How a new routing key gets its worker (sglang-router's `--assignment-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum AssignmentMode {
    /// Any candidate.
    #[default]
    Random,
    /// The one with the fewest requests in flight.
    MinLoad,
    /// The one holding the fewest routing keys.
    MinGroup,
}

crate::config::settings::settings! {
    /// The `manual` policy's settings (sglang-router's names and defaults).
    #[derive(Clone, Copy, Debug, Deserialize, Serialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct ManualConfig;

    /// The `manual` policy's flags.
    #[serde_with::skip_serializing_none]
    #[derive(Clone, Debug, Default, clap::Args, Serialize)]
    #[command(next_help_heading = "Policies")]
    pub struct ManualArgs {}

    settings {
        /// `manual` policy: how a new routing key gets its worker (`random`, `min_load`,
        /// `min_group`).
        #[arg(long)]
        assignment_mode: AssignmentMode = AssignmentMode::Random;
        /// `manual` policy: a routing key idle this long is forgotten (its next request is
        /// assigned anew).
        #[arg(id = "max_idle_secs", long = "max-idle-secs")]
        #[serde(rename = "max_idle_secs")]
        max_idle: Secs = Secs::from_secs(14_400);
    }
}

crate::config::settings::named_setting!(AssignmentMode);

/// A routing key's worker, and when the key was last used.
struct Assignment {
    url: Tenant,
    used: Instant,
}

/// The `manual` policy: a routing key keeps the worker it was first sent to.
pub struct Manual {
    cfg: ManualConfig,
    keys: Mutex<HashMap<String, Assignment>>,
}

impl Manual {
    /// The policy by `cfg`, no key routed yet.
    pub fn new(cfg: ManualConfig) -> Manual {
        Manual {
            cfg,
            keys: Mutex::new(HashMap::new()),
        }
    }

    /// Routing keys held.
    pub fn routing_keys(&self) -> usize {
        self.keys.lock().len()
    }
}

impl LoadBalancingPolicy for Manual {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Manual
    }

    fn select(&self, c: &[Candidate], request: &RouteInput, now: Instant) -> Option<usize> {
        let Some(key) = request.routing_key else {
            return Some(fastrand::usize(..c.len()));
        };
        let mut keys = self.keys.lock();
        if let Some(a) = keys.get_mut(key) {
            if let Some(i) = c.iter().position(|x| x.url == a.url) {
                a.used = now;
                return Some(i);
            }
        }
        let i = match self.cfg.assignment_mode {
            AssignmentMode::Random => fastrand::usize(..c.len()),
            AssignmentMode::MinLoad => least_loaded(c).unwrap_or(0),
            AssignmentMode::MinGroup => (0..c.len())
                .min_by_key(|&i| (keys.values().filter(|a| a.url == c[i].url).count(), i))
                .unwrap_or(0),
        };
        keys.insert(
            key.to_string(),
            Assignment {
                url: c[i].url.clone(),
                used: now,
            },
        );
        Some(i)
    }

    fn on_worker_removed(&self, url: &str) {
        self.keys.lock().retain(|_, a| *a.url != *url);
    }

    /// Forgets keys idle for longer than `max_idle`.
    fn evict(&self, now: Instant) {
        let idle = self.cfg.max_idle.0;
        self.keys
            .lock()
            .retain(|_, a| now.saturating_duration_since(a.used) < idle);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use std::time::Duration;

    #[test]
    fn manual_keeps_a_key_on_its_worker_and_assigns_new_ones_by_mode() {
        let now = Instant::now();
        let p = Manual::new(ManualConfig {
            assignment_mode: AssignmentMode::MinGroup,
            max_idle: Secs::from_secs(60),
        });
        let c = cands(&[0, 0, 0]);
        // min_group spreads new keys: a, b, c on three workers; a stays where it is.
        let a = p.select(&c, &key("a"), now).unwrap();
        let b = p.select(&c, &key("b"), now).unwrap();
        let cc = p.select(&c, &key("c"), now).unwrap();
        let mut all = vec![a, b, cc];
        all.sort_unstable();
        assert_eq!(all, [0, 1, 2]);
        assert!((0..10).all(|_| p.select(&c, &key("a"), now) == Some(a)));
        // Its worker gone: the key moves, once.
        let without: Vec<Candidate> = c
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != a)
            .map(|(_, x)| x.clone())
            .collect();
        let moved = p.select(&without, &key("a"), now).unwrap();
        assert_eq!(p.select(&without, &key("a"), now), Some(moved));
        // Idle keys are forgotten.
        assert_eq!(p.routing_keys(), 3);
        p.evict(now + Duration::from_secs(61));
        assert_eq!(p.routing_keys(), 0);
        // min_load: a new key goes to the least loaded worker.
        let q = Manual::new(ManualConfig {
            assignment_mode: AssignmentMode::MinLoad,
            ..ManualConfig::default()
        });
        assert_eq!(q.select(&cands(&[5, 1, 3]), &key("k"), now), Some(1));
        // A removed worker's keys are forgotten.
        q.on_worker_removed("http://w1:1");
        assert_eq!(q.routing_keys(), 0);
    }
}
