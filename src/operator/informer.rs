//! A cache of one resource type kept current by list + watch: watch from the list's
//! resourceVersion with bookmarks, resume from the last seen version when a watch ends,
//! list again on 410 Gone, back off on errors. Every change names the group it belongs to,
//! which the controller queues.

use crate::kube::{Kube, KubeError};
use parking_lot::RwLock;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Objects by `namespace/name`.
#[derive(Clone, Default)]
pub struct Store {
    map: Arc<RwLock<BTreeMap<String, Value>>>,
    synced: Arc<AtomicBool>,
}

pub fn key_of(obj: &Value) -> String {
    format!(
        "{}/{}",
        obj.pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or(""),
        obj.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
    )
}

impl Store {
    pub fn get(&self, key: &str) -> Option<Value> {
        self.map.read().get(key).cloned()
    }

    /// Objects matching a filter.
    pub fn select(&self, f: impl Fn(&Value) -> bool) -> Vec<Value> {
        self.map.read().values().filter(|v| f(v)).cloned().collect()
    }

    pub fn keys(&self) -> Vec<String> {
        self.map.read().keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.map.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.read().is_empty()
    }

    /// Records the answer of our own write, so that the next reconcile sees it even before
    /// the watch delivers it.
    pub fn put(&self, obj: Value) {
        self.map.write().insert(key_of(&obj), obj);
    }

    pub fn remove(&self, key: &str) {
        self.map.write().remove(key);
    }

    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    fn replace(&self, items: Vec<Value>) {
        let m: BTreeMap<String, Value> = items.into_iter().map(|o| (key_of(&o), o)).collect();
        *self.map.write() = m;
        self.synced.store(true, Ordering::Release);
    }
}

/// What the informer watches.
pub struct Source {
    pub name: &'static str,
    /// Collection path (`/api/v1/pods` or a namespaced one).
    pub path: String,
    /// `&labelSelector=...` or empty.
    pub query: String,
}

/// Runs forever: list, watch, repeat. `notify` gets every changed object (and, after a list,
/// every object) so the controller can queue its group.
pub async fn run(
    kube: Kube,
    src: Source,
    store: Store,
    notify: Arc<dyn Fn(&Value) + Send + Sync>,
    watch_timeout: Duration,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let listed = kube.list_all(&src.path, &src.query).await;
        let (items, mut rv) = match listed {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(resource = src.name, error = %e, retry_in = ?backoff, "list failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        let old = store.select(|_| true);
        store.replace(items.clone());
        for o in old.iter().chain(items.iter()) {
            notify(o);
        }
        tracing::debug!(resource = src.name, objects = items.len(), rv = %rv, "listed");
        // Watch until the history is gone (410) or a list is needed.
        loop {
            match watch_once(&kube, &src, &store, &notify, &mut rv, watch_timeout).await {
                Ok(()) => {
                    backoff = Duration::from_millis(200);
                }
                Err(e) if e.code() == Some(410) => {
                    tracing::info!(
                        resource = src.name,
                        "watch expired (410 Gone); listing again"
                    );
                    break;
                }
                Err(e) => {
                    tracing::warn!(resource = src.name, error = %e, retry_in = ?backoff, "watch failed; resuming");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    if backoff >= Duration::from_secs(30) {
                        break;
                    }
                }
            }
        }
    }
}

async fn watch_once(
    kube: &Kube,
    src: &Source,
    store: &Store,
    notify: &Arc<dyn Fn(&Value) + Send + Sync>,
    rv: &mut String,
    timeout: Duration,
) -> Result<(), KubeError> {
    let path = format!(
        "{}?watch=1&allowWatchBookmarks=true&timeoutSeconds={}&resourceVersion={}{}",
        src.path,
        timeout.as_secs().max(1),
        crate::kube::encode(rv),
        src.query
    );
    let mut stream = kube.watch(&path).await?;
    while let Some(ev) = stream.next(timeout + Duration::from_secs(30)).await? {
        if let Some(v) = ev
            .object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
        {
            *rv = v.to_string();
        }
        match ev.kind.as_str() {
            "ERROR" => {
                let code = ev.object.get("code").and_then(Value::as_u64).unwrap_or(500) as u16;
                let message = ev
                    .object
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                return Err(KubeError::Status {
                    path,
                    code,
                    message,
                });
            }
            "BOOKMARK" => {}
            "DELETED" => {
                store.remove(&key_of(&ev.object));
                notify(&ev.object);
            }
            _ => {
                store.put(ev.object.clone());
                notify(&ev.object);
            }
        }
    }
    Ok(())
}
