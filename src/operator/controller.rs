//! The controller: workers that take keys from the queues and reconcile them. A key's
//! reconcile is a free function of its kind (`group`, `adapter`, `groupset`) over the shared
//! [`Context`]; what it answers (`Requeue`) and how it failed decide when the key comes back.

use super::action::Requeue;
use super::context::{Context, Kind, ReconcileError};
use super::{adapter, group, groupset};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Workers for adapters and for sets each (their reconciles are small).
pub const SMALL_KIND_WORKERS: usize = 2;

/// One reconcile of `key` of `kind`.
pub async fn reconcile(ctx: &Context, kind: Kind, key: &str) -> Result<Requeue, ReconcileError> {
    match kind {
        Kind::Group => group::reconcile(ctx, key).await,
        Kind::Adapter => adapter::reconcile(ctx, key).await,
        Kind::Set => groupset::reconcile(ctx, key).await,
    }
}

/// One worker: takes keys of `kind` from its queue and reconciles them, forever.
pub async fn work(ctx: Arc<Context>, kind: Kind) {
    let queue = ctx.queues.of(kind).clone();
    loop {
        let key = queue.get().await;
        let t0 = std::time::Instant::now();
        let r = reconcile(&ctx, kind, &key).await;
        tracing::debug!(kind = kind.label(), key = %key, took = ?t0.elapsed(), ok = r.is_ok(), "reconciled");
        match r {
            Ok(next) => {
                queue.forget(&key);
                if let Requeue::After(d) = next {
                    queue.add_after(&key, d);
                }
            }
            Err(e) if e.is_conflict() => {
                let d = queue.retry(&key);
                tracing::info!(kind = kind.label(), key = %key, error = %e, retry_in = ?d,
                    "an object changed under this reconcile (resourceVersion conflict); reconciling again from the latest");
            }
            Err(e) => {
                ctx.metrics.errors.fetch_add(1, Ordering::Relaxed);
                let d = queue.retry(&key);
                tracing::warn!(kind = kind.label(), key = %key, error = %e, retry_in = ?d, "reconcile failed");
            }
        }
        queue.done(&key);
    }
}
