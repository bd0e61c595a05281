//! What the queue does with a key after its reconcile (kube-rs's `Action`).

use std::time::Duration;

/// When a key comes back to the queue after its reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requeue {
    /// Done: look again on the next change (or resync).
    AwaitChange,
    /// Look again after this long even if nothing changes.
    After(Duration),
}

impl Requeue {
    /// Look again after the soonest of `delays`, or on the next change if there is none.
    pub fn soonest(delays: impl IntoIterator<Item = Option<Duration>>) -> Requeue {
        delays
            .into_iter()
            .flatten()
            .min()
            .map_or(Requeue::AwaitChange, Requeue::After)
    }
}

/// How soon to look again while the caches are still filling.
pub const CACHE_SYNC_WAIT: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soonest_delay_wins_and_none_awaits_a_change() {
        let s = Duration::from_secs;
        assert_eq!(
            Requeue::soonest([Some(s(5)), None, Some(s(1))]),
            Requeue::After(s(1))
        );
        assert_eq!(Requeue::soonest([None, None]), Requeue::AwaitChange);
    }
}
