//! Watches: watchers, replay from the history, delivery of events (with label-selector
//! transitions), bookmarks, and the streamed body.

use super::*;

#[derive(Clone)]
pub(super) struct Event {
    pub(super) rv: u64,
    pub(super) resource: &'static str,
    pub(super) ns: String,
    pub(super) kind: &'static str,
    pub(super) old: Option<Value>,
    pub(super) obj: Value,
}

pub(super) struct Watcher {
    pub(super) resource: &'static str,
    pub(super) version: String,
    pub(super) ns: Option<String>,
    pub(super) selector: Selector,
    pub(super) name: Option<String>,
    pub(super) bookmarks: bool,
    pub(super) tx: mpsc::UnboundedSender<Bytes>,
}

/// A watch's response body: its events as they come, ending at the watch's timeout.
pub(super) fn events(rx: mpsc::UnboundedReceiver<Bytes>, timeout: Duration) -> Body {
    use futures_util::StreamExt;
    let lines = tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
        .take_until(tokio::time::sleep(timeout))
        .map(Ok::<Bytes, std::convert::Infallible>);
    Body::from_stream(lines)
}

impl Inner {
    pub(super) fn deliver(&mut self, r: &Resource, ev: &Event) {
        if self.watches_stalled {
            return;
        }
        let mut lines = Vec::new();
        for (i, w) in self.watchers.iter().enumerate() {
            if let Some(line) = filter_event(r, w, ev) {
                lines.push((i, line));
            }
        }
        let mut dead = HashSet::new();
        for (i, line) in lines {
            if self.watchers[i].tx.send(line).is_err() {
                dead.insert(i);
            }
        }
        if !dead.is_empty() {
            let mut i = 0;
            self.watchers.retain(|_| {
                i += 1;
                !dead.contains(&(i - 1))
            });
        }
    }

    pub(super) fn send_bookmarks(&mut self) {
        let rv = self.rv.to_string();
        self.watchers.retain(|w| {
            if !w.bookmarks {
                return !w.tx.is_closed();
            }
            let r = RESOURCES.iter().find(|r| r.name == w.resource);
            let (api, kind) = r
                .map(|r| (api_version(r, &w.version), r.kind))
                .unwrap_or_default();
            let ev = json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api,
                            "metadata": {"resourceVersion": rv}}});
            w.tx.send(Bytes::from(format!("{ev}\n"))).is_ok()
        });
    }
}

impl Inner {
    pub(super) fn watch(
        &mut self,
        t: &Target,
        q: &HashMap<String, String>,
    ) -> Result<(mpsc::UnboundedReceiver<Bytes>, Duration), ApiError> {
        let selector = Selector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))
            .map_err(|e| api_err(400, "BadRequest", e.to_string()))?;
        let name = field_name(q)?;
        let timeout = q
            .get("timeoutSeconds")
            .and_then(|s| s.parse().ok())
            .map(Duration::from_secs)
            .unwrap_or(Duration::from_secs(1800));
        let (tx, rx) = mpsc::unbounded_channel();
        let w = Watcher {
            resource: t.r.name,
            version: t.version.clone(),
            ns: t.ns.clone(),
            selector,
            name,
            bookmarks: q.get("allowWatchBookmarks").is_some_and(|v| v == "true"),
            tx,
        };
        let from = q.get("resourceVersion").cloned().unwrap_or_default();
        if from.is_empty() || from == "0" {
            // "Any version": the current state as ADDED events, then changes.
            for ((p, n, _), o) in &self.objects {
                let ev = Event {
                    rv: self.rv,
                    resource: p,
                    ns: n.clone(),
                    kind: "ADDED",
                    old: None,
                    obj: o.clone(),
                };
                if let Some(line) = filter_event(t.r, &w, &ev) {
                    let _ = w.tx.send(line);
                }
            }
        } else {
            let from: u64 = from
                .parse()
                .map_err(|_| api_err(400, "BadRequest", format!("bad resourceVersion {from:?}")))?;
            if from < self.compacted {
                let gone = api_err(
                    410,
                    "Expired",
                    format!("too old resource version: {from} ({})", self.compacted + 1),
                );
                let line = json!({"type": "ERROR", "object": gone.status()});
                let _ = w.tx.send(Bytes::from(format!("{line}\n")));
                return Ok((rx, timeout));
            }
            for ev in self.history.iter().filter(|e| e.rv > from) {
                if let Some(line) = filter_event(t.r, &w, ev) {
                    let _ = w.tx.send(line);
                }
            }
        }
        self.watchers.push(w);
        Ok((rx, timeout))
    }
}

/// The watch line an event makes for a watcher, if any.
pub(super) fn filter_event(r: &Resource, w: &Watcher, ev: &Event) -> Option<Bytes> {
    if ev.resource != w.resource || w.ns.as_ref().is_some_and(|n| *n != ev.ns) {
        return None;
    }
    let name_of = |o: &Value| {
        o.pointer("/metadata/name")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    if w.name.is_some() && name_of(&ev.obj) != w.name {
        return None;
    }
    let now = w.selector.matches(&ev.obj);
    let before = ev.old.as_ref().is_some_and(|o| w.selector.matches(o));
    let kind = match (ev.kind, before, now) {
        ("ADDED", _, true) => "ADDED",
        ("DELETED", true, _) => "DELETED",
        ("MODIFIED", true, true) => "MODIFIED",
        ("MODIFIED", false, true) => "ADDED",
        ("MODIFIED", true, false) => "DELETED",
        _ => return None,
    };
    let mut obj = ev.obj.clone();
    obj["apiVersion"] = json!(api_version(r, &w.version));
    Some(Bytes::from(format!(
        "{}\n",
        json!({"type": kind, "object": obj})
    )))
}
