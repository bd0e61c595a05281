//! A cache of one resource type kept current by list + watch: watch from the list's
//! resourceVersion with bookmarks, resume from the last seen version when a watch ends,
//! list again on 410 Gone, back off on errors. Every change names the group it belongs to,
//! which the controller queues.

use crate::backoff::Backoff;
use crate::kube::object::ObjectMeta;
use crate::kube::{Kube, KubeError};
use parking_lot::RwLock;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Objects by `namespace/name`, as the watch last delivered them, plus the answers of our own
/// writes where the watch has not caught up yet.
///
/// A write's answer may reach us after the watch has already delivered a newer version of the
/// same object (someone else wrote meanwhile). Putting the answer then would take the cache
/// back in time, and if no further event comes it stays there: the controller would reconcile
/// a stale spec forever. So every watch change is numbered, a writer takes a [`Store::mark`]
/// before it sends, and its answer is recorded only when the watch has changed nothing about
/// that object since the mark. Otherwise the watch, which always delivers our write's own event
/// too, is left in charge. No resourceVersions are compared: they are opaque to clients.
#[derive(Clone, Default)]
pub struct Store {
    inner: Arc<RwLock<Entries>>,
    synced: Arc<AtomicBool>,
}

#[derive(Default)]
struct Entries {
    map: BTreeMap<String, Value>,
    /// Number of the watch change that last touched each key (kept for deleted keys too).
    changed: HashMap<String, u64>,
    /// Number of the last watch change or list.
    seq: u64,
    /// Number of the last list: it touches every key.
    listed: u64,
}

impl Entries {
    fn untouched_since(&self, key: &str, mark: u64) -> bool {
        self.listed <= mark && self.changed.get(key).copied().unwrap_or(0) <= mark
    }

    fn touch(&mut self, key: &str) {
        self.seq += 1;
        let seq = self.seq;
        self.changed.insert(key.to_string(), seq);
    }
}

/// An object's key in the caches and queues: `namespace/name`.
pub fn key_of(obj: &Value) -> String {
    ObjectMeta::of(obj).key()
}

impl Store {
    /// The object with key `key` (`namespace/name`), as last seen.
    pub fn get(&self, key: &str) -> Option<Value> {
        self.inner.read().map.get(key).cloned()
    }

    /// Objects matching a filter.
    pub fn select(&self, f: impl Fn(&Value) -> bool) -> Vec<Value> {
        self.inner
            .read()
            .map
            .values()
            .filter(|v| f(v))
            .cloned()
            .collect()
    }

    /// The keys of every object held.
    pub fn keys(&self) -> Vec<String> {
        self.inner.read().map.keys().cloned().collect()
    }

    /// Objects held.
    pub fn len(&self) -> usize {
        self.inner.read().map.len()
    }

    /// Whether no object is held.
    pub fn is_empty(&self) -> bool {
        self.inner.read().map.is_empty()
    }

    /// The point in the watch's history to pass to [`Store::put_written`] or
    /// [`Store::remove_written`]; take it before sending the write.
    pub fn mark(&self) -> u64 {
        self.inner.read().seq
    }

    /// Records the answer of our own write (sent after `mark`), so that the next reconcile
    /// sees it before the watch delivers it, unless the watch has news of the object since.
    pub fn put_written(&self, obj: Value, mark: u64) {
        let key = key_of(&obj);
        let mut e = self.inner.write();
        if e.untouched_since(&key, mark) {
            e.map.insert(key, obj);
        }
    }

    /// Forgets an object we deleted (the delete sent after `mark`), unless the watch has news
    /// of it since.
    pub fn remove_written(&self, key: &str, mark: u64) {
        let mut e = self.inner.write();
        if e.untouched_since(key, mark) {
            e.map.remove(key);
        }
    }

    /// Whether the first list has been read (until then the store may miss objects).
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// A watch event: the object as it now is.
    fn apply(&self, obj: Value) {
        let key = key_of(&obj);
        let mut e = self.inner.write();
        e.touch(&key);
        e.map.insert(key, obj);
    }

    /// A watch event: the object is gone.
    fn apply_delete(&self, key: &str) {
        let mut e = self.inner.write();
        e.touch(key);
        e.map.remove(key);
        // Keys of deleted objects are remembered only so long: past that, forget them and
        // treat every write in flight as overtaken (its answer is skipped; the watch brings it).
        if e.changed.len() > e.map.len() + 4096 {
            let Entries { map, changed, .. } = &mut *e;
            changed.retain(|k, _| map.contains_key(k));
            e.listed = e.seq;
        }
    }

    /// A list: the whole state.
    fn replace(&self, items: Vec<Value>) {
        let map: BTreeMap<String, Value> = items.into_iter().map(|o| (key_of(&o), o)).collect();
        let mut e = self.inner.write();
        e.seq += 1;
        e.listed = e.seq;
        e.changed.clear();
        e.map = map;
        drop(e);
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
    /// A resource the cluster may not serve yet (a CRD added by a newer release): while it
    /// answers 404, the cache counts as synced and empty, and the list is tried again
    /// every `OPTIONAL_RETRY`.
    pub optional: bool,
}

/// How often an optional resource that is not served is looked for again.
const OPTIONAL_RETRY: Duration = Duration::from_secs(60);

/// Runs forever: list, watch, repeat. `notify` gets every changed object (and, after a list,
/// every object) so the controller can queue its group.
pub async fn run(
    kube: Kube,
    src: Source,
    store: Store,
    notify: Arc<dyn Fn(&Value) + Send + Sync>,
    watch_timeout: Duration,
) {
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
    loop {
        let listed = kube.list_all(&src.path, &src.query).await;
        let (items, mut rv) = match listed {
            Ok(x) => x,
            Err(e) if src.optional && e.code() == Some(404) => {
                if !store.synced() {
                    tracing::warn!(resource = src.name, retry_in = ?OPTIONAL_RETRY,
                        "not served by the API server (is its CRD installed? see manifests/crds); \
                         working without it");
                    store.replace(Vec::new());
                }
                tokio::time::sleep(OPTIONAL_RETRY).await;
                continue;
            }
            Err(e) => {
                let wait = backoff.next_delay();
                tracing::warn!(resource = src.name, error = %e, retry_in = ?wait, "list failed");
                tokio::time::sleep(wait).await;
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
                Ok(()) => backoff.reset(),
                Err(e) if e.code() == Some(410) => {
                    tracing::info!(
                        resource = src.name,
                        "watch expired (410 Gone); listing again"
                    );
                    break;
                }
                Err(e) => {
                    let wait = backoff.next_delay();
                    tracing::warn!(resource = src.name, error = %e, retry_in = ?wait, "watch failed; resuming");
                    tokio::time::sleep(wait).await;
                    if backoff.at_max() {
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
        let meta = ObjectMeta::of(&ev.object);
        if !meta.resource_version.is_empty() {
            *rv = meta.resource_version.to_string();
        }
        tracing::debug!(resource = src.name, kind = %ev.kind, key = %key_of(&ev.object), rv = %rv, "watch event");
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
                store.apply_delete(&key_of(&ev.object));
                notify(&ev.object);
            }
            _ => {
                store.apply(ev.object.clone());
                notify(&ev.object);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(rv: &str, replicas: u32) -> Value {
        json!({"metadata": {"namespace": "ns", "name": "g", "resourceVersion": rv},
               "spec": {"replicas": replicas}})
    }

    #[test]
    fn a_late_write_answer_never_takes_the_cache_back_in_time() {
        let s = Store::default();
        s.replace(vec![obj("10", 2)]);
        // Our status write is sent; meanwhile the user's spec change and our own write's
        // event are delivered by the watch; then the write's answer (older) arrives.
        let mark = s.mark();
        s.apply(obj("11", 2));
        s.apply(obj("12", 3));
        s.put_written(obj("11", 2), mark);
        assert_eq!(s.get("ns/g").unwrap()["spec"]["replicas"], 3);
        // With no watch news since the mark, the answer is recorded at once.
        let mark = s.mark();
        s.put_written(obj("13", 4), mark);
        assert_eq!(s.get("ns/g").unwrap()["spec"]["replicas"], 4);
        // A delete's answer loses against a watch event after the mark, wins otherwise.
        let mark = s.mark();
        s.apply(obj("14", 5));
        s.remove_written("ns/g", mark);
        assert!(s.get("ns/g").is_some());
        let mark = s.mark();
        s.remove_written("ns/g", mark);
        assert!(s.get("ns/g").is_none());
        // A create's answer after the watch delivered the object's deletion stays out.
        let mark = s.mark();
        s.apply(obj("15", 1));
        s.apply_delete("ns/g");
        s.put_written(obj("15", 1), mark);
        assert!(s.get("ns/g").is_none(), "no ghost of a deleted object");
        // A list in between overtakes every write in flight.
        let mark = s.mark();
        s.replace(vec![obj("20", 7)]);
        s.put_written(obj("16", 6), mark);
        assert_eq!(s.get("ns/g").unwrap()["spec"]["replicas"], 7);
    }

    #[test]
    fn deleted_keys_are_forgotten_past_a_bound_without_letting_ghosts_in() {
        let s = Store::default();
        s.replace(vec![]);
        let mark = s.mark();
        for i in 0..5000 {
            let mut o = obj("1", 1);
            o["metadata"]["name"] = json!(format!("p{i}"));
            s.apply(o);
            s.apply_delete(&format!("ns/p{i}"));
        }
        assert!(s.inner.read().changed.len() <= 4097);
        let mut late = obj("1", 1);
        late["metadata"]["name"] = json!("p0");
        s.put_written(late, mark);
        assert!(s.get("ns/p0").is_none());
    }
}
