//! Objects by key, one resourceVersion counter, the event history, and the write rules
//! (create, update, patch, delete with preconditions and finalizers, the status subresource).

use super::*;

pub(super) type Key = (&'static str, String, String); // resource name, namespace, name

pub(super) struct Inner {
    pub(super) rv: u64,
    pub(super) objects: BTreeMap<Key, Value>,
    pub(super) history: VecDeque<Event>,
    pub(super) history_limit: usize,
    /// Events at or below this version are gone (watching from there is 410 Gone).
    pub(super) compacted: u64,
    pub(super) watchers: Vec<Watcher>,
    /// Open watches receive nothing (a stalled connection) until they are broken.
    pub(super) watches_stalled: bool,
    pub(super) counts: Counts,
    /// Paths whose next write is preceded by a concurrent writer's update (a 409 test hook).
    pub(super) race_next_write: Vec<String>,
    /// Requests whose path contains one of these fail with 500 (a fault hook).
    pub(super) fail_paths: Vec<String>,
    /// Resources served as if their CRD were not installed (404 for every request).
    pub(super) uninstalled: Vec<&'static str>,
}

pub(super) fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

impl Inner {
    /// The stored object `ns/name` and its key, or 404 Not Found.
    fn existing(
        &self,
        r: &Resource,
        ns: &str,
        name: &str,
    ) -> Result<((&'static str, String, String), Value), ApiError> {
        let key = (r.name, ns.to_string(), name.to_string());
        match self.objects.get(&key) {
            Some(o) => Ok((key, o.clone())),
            None => Err(api_err(
                404,
                "NotFound",
                format!("{} {name:?} not found", r.plural),
            )),
        }
    }

    pub(super) fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// The object as served at a version (conversion strategy None: only apiVersion moves).
    pub(super) fn served(&self, r: &Resource, version: &str, o: &Value) -> Value {
        let mut o = o.clone();
        o["apiVersion"] = json!(api_version(r, version));
        o["kind"] = json!(r.kind);
        o
    }

    pub(super) fn record(
        &mut self,
        r: &'static Resource,
        ns: &str,
        kind: &'static str,
        old: Option<Value>,
        obj: Value,
    ) {
        let rv = self.rv;
        let ev = Event {
            rv,
            resource: r.name,
            ns: ns.to_string(),
            kind,
            old,
            obj,
        };
        self.deliver(r, &ev);
        self.history.push_back(ev);
        while self.history.len() > self.history_limit {
            if let Some(e) = self.history.pop_front() {
                self.compacted = e.rv;
            }
        }
    }
}

impl Inner {
    pub(super) fn touch(&mut self, r: &'static Resource, ns: &str, name: &str) {
        let key = (r.name, ns.to_string(), name.to_string());
        if let Some(old) = self.objects.get(&key).cloned() {
            let rv = self.next_rv();
            let mut o = old.clone();
            o["metadata"]["resourceVersion"] = json!(rv.to_string());
            o["metadata"]["annotations"]["standin.rbgctl/touched"] = json!(rv.to_string());
            self.objects.insert(key, o.clone());
            self.record(r, ns, "MODIFIED", Some(old), o);
        }
    }

    pub(super) fn list(&self, t: &Target, q: &HashMap<String, String>) -> Result<Value, ApiError> {
        let sel = Selector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))
            .map_err(|e| api_err(400, "BadRequest", e.to_string()))?;
        let name = field_name(q)?;
        let limit: usize = q
            .get("limit")
            .and_then(|l| l.parse().ok())
            .filter(|l| *l > 0)
            .unwrap_or(usize::MAX);
        let (skip, rv) = match q.get("continue").filter(|c| !c.is_empty()) {
            Some(c) => {
                let (s, rv) = c
                    .split_once(':')
                    .and_then(|(s, rv)| Some((s.parse::<usize>().ok()?, rv.to_string())))
                    .ok_or_else(|| api_err(400, "BadRequest", "bad continue token"))?;
                (s, rv)
            }
            None => (0, self.rv.to_string()),
        };
        let all: Vec<Value> = self
            .objects
            .iter()
            .filter(|((p, n, nm), o)| {
                *p == t.r.name
                    && t.ns.as_ref().is_none_or(|ns| ns == n)
                    && name.as_ref().is_none_or(|x| x == nm)
                    && sel.matches(o)
            })
            .map(|(_, o)| self.served(t.r, &t.version, o))
            .collect();
        let page: Vec<Value> = all.iter().skip(skip).take(limit).cloned().collect();
        let next = skip + page.len();
        let mut meta = json!({"resourceVersion": rv});
        if next < all.len() {
            meta["continue"] = json!(format!("{next}:{rv}"));
        }
        Ok(json!({"kind": format!("{}List", t.r.kind),
                  "apiVersion": api_version(t.r, &t.version),
                  "metadata": meta, "items": page}))
    }
}

impl Inner {
    pub(super) fn create(
        &mut self,
        r: &'static Resource,
        version: &str,
        ns: &str,
        mut obj: Value,
    ) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(api_err(400, "BadRequest", "body is not an object"));
        }
        let mut name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            let prefix = obj
                .pointer("/metadata/generateName")
                .and_then(Value::as_str)
                .unwrap_or("");
            if prefix.is_empty() {
                return Err(api_err(
                    422,
                    "Invalid",
                    "metadata.name or metadata.generateName: Required value",
                ));
            }
            name = format!("{prefix}{}", crate::kube::random_suffix(5));
        }
        obj["metadata"]["name"] = json!(name);
        obj["metadata"]["namespace"] = json!(ns);
        default_fields(r, &mut obj);
        validate(r, &obj)?;
        let key = (r.name, ns.to_string(), name.clone());
        if self.objects.contains_key(&key) {
            return Err(api_err(
                409,
                "AlreadyExists",
                format!("{} {name:?} already exists", r.plural),
            ));
        }
        let rv = self.next_rv();
        let m = &mut obj["metadata"];
        m["uid"] = json!(uuid());
        m["resourceVersion"] = json!(rv.to_string());
        m["creationTimestamp"] = json!(now_rfc3339());
        m["generation"] = json!(1);
        if let Some(o) = m.as_object_mut() {
            o.remove("deletionTimestamp");
        }
        if r.status {
            obj["status"] = if r.plural == "pods" {
                json!({"phase": "Pending"})
            } else {
                json!({})
            };
        }
        let stored = self.served(r, r.versions[0], &obj);
        self.objects.insert(key, stored.clone());
        self.record(r, ns, "ADDED", None, stored.clone());
        Ok(self.served(r, version, &stored))
    }

    /// The common path of PUT and PATCH once the new object is known.
    pub(super) fn write(
        &mut self,
        r: &'static Resource,
        version: &str,
        ns: &str,
        name: &str,
        status: bool,
        mut new: Value,
    ) -> Result<Value, ApiError> {
        let (key, old) = self.existing(r, ns, name)?;
        let given_rv = new
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let cur_rv = old
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !given_rv.is_empty() && given_rv != cur_rv {
            return Err(api_err(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
                    r.plural
                ),
            ));
        }
        if new.pointer("/metadata/name").and_then(Value::as_str) != Some(name) {
            return Err(api_err(
                400,
                "BadRequest",
                "metadata.name does not match the URL",
            ));
        }
        if status {
            // Only status moves through the subresource.
            let st = new.get("status").cloned().unwrap_or(json!({}));
            new = old.clone();
            new["status"] = st;
        } else {
            if r.status {
                new["status"] = old.get("status").cloned().unwrap_or(json!({}));
            }
            for f in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "generation",
                "namespace",
            ] {
                match old["metadata"].get(f) {
                    Some(v) => new["metadata"][f] = v.clone(),
                    None => {
                        if let Some(m) = new["metadata"].as_object_mut() {
                            m.remove(f);
                        }
                    }
                }
            }
            default_fields(r, &mut new);
            validate(r, &new)?;
            if r.plural == "pods"
                && pod_spec_sans_images(&old["spec"]) != pod_spec_sans_images(&new["spec"])
            {
                return Err(api_err(
                    422,
                    "Invalid",
                    format!("Pod {name:?} is invalid: spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations), `spec.terminationGracePeriodSeconds`"),
                ));
            }
            if spec_part(&old) != spec_part(&new) {
                let g = old["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
                new["metadata"]["generation"] = json!(g);
            }
        }
        let mut new = self.served(r, r.versions[0], &new);
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if new == old {
            // A no-op write does not move resourceVersion (as the real server).
            return Ok(self.served(r, version, &old));
        }
        let rv = self.next_rv();
        new["metadata"]["resourceVersion"] = json!(rv.to_string());
        let finalizers_gone = new
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(|f| f.is_empty());
        if new.pointer("/metadata/deletionTimestamp").is_some() && finalizers_gone {
            self.objects.remove(&key);
            self.record(r, ns, "DELETED", Some(old), new.clone());
        } else {
            self.objects.insert(key, new.clone());
            self.record(r, ns, "MODIFIED", Some(old), new.clone());
        }
        Ok(self.served(r, version, &new))
    }

    pub(super) fn update(
        &mut self,
        r: &'static Resource,
        version: &str,
        ns: &str,
        name: &str,
        status: bool,
        body: Value,
    ) -> Result<Value, ApiError> {
        if !body.is_object() {
            return Err(api_err(400, "BadRequest", "body is not an object"));
        }
        // Custom resources allow no unconditional update (their strategy's
        // AllowUnconditionalUpdate is false): a PUT must name the version it replaces.
        let rv = body
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        if r.group == "workloads.x-k8s.io" && rv.is_empty() {
            return Err(api_err(
                422,
                "Invalid",
                format!(
                    "{} {name:?} is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
                    r.kind
                ),
            ));
        }
        self.write(r, version, ns, name, status, body)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn patch(
        &mut self,
        r: &'static Resource,
        version: &str,
        ns: &str,
        name: &str,
        status: bool,
        ct: &str,
        body: &Value,
    ) -> Result<Value, ApiError> {
        let (_, old) = self.existing(r, ns, name)?;
        let mut new = self.served(r, version, &old);
        // A patch carries a resourceVersion precondition only if it names one.
        new["metadata"]["resourceVersion"] = json!("");
        match ct {
            "application/merge-patch+json" => patch::merge(&mut new, body),
            "application/strategic-merge-patch+json" if r.group != "workloads.x-k8s.io" => {
                patch::strategic_merge(&mut new, body)
            }
            "application/json-patch+json" => {
                new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
                patch::json_patch(&mut new, body)
                    .map_err(|e| patch_failed(e.to_string()))?;
                if new["metadata"]["resourceVersion"] == old["metadata"]["resourceVersion"] {
                    new["metadata"]["resourceVersion"] = json!("");
                }
            }
            other => {
                return Err(api_err(
                    415,
                    "UnsupportedMediaType",
                    format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (not {other:?} here)"),
                ))
            }
        }
        self.write(r, version, ns, name, status, new)
    }

    pub(super) fn delete(
        &mut self,
        r: &'static Resource,
        version: &str,
        ns: &str,
        name: &str,
        opts: &Value,
    ) -> Result<Value, ApiError> {
        let (key, old) = self.existing(r, ns, name)?;
        for (f, at) in [
            ("uid", "/metadata/uid"),
            ("resourceVersion", "/metadata/resourceVersion"),
        ] {
            if let Some(want) = opts
                .pointer(&format!("/preconditions/{f}"))
                .and_then(Value::as_str)
            {
                if old.pointer(at).and_then(Value::as_str) != Some(want) {
                    return Err(api_err(
                        409,
                        "Conflict",
                        format!("Precondition failed: {f} in precondition: {want}"),
                    ));
                }
            }
        }
        let has_finalizers = old
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        let graceful = r.plural == "pods"
            && old
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
        if has_finalizers || graceful {
            if old.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(self.served(r, version, &old));
            }
            let rv = self.next_rv();
            let mut new = old.clone();
            new["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
            new["metadata"]["resourceVersion"] = json!(rv.to_string());
            if graceful {
                new["metadata"]["deletionGracePeriodSeconds"] = json!(30);
            }
            self.objects.insert(key, new.clone());
            self.record(r, ns, "MODIFIED", Some(old), new.clone());
            return Ok(self.served(r, version, &new));
        }
        self.remove(r, ns, name)
            .map(|o| self.served(r, version, &o))
            .ok_or_else(|| api_err(404, "NotFound", name.to_string()))
    }

    pub(super) fn remove(&mut self, r: &'static Resource, ns: &str, name: &str) -> Option<Value> {
        let old = self
            .objects
            .remove(&(r.name, ns.to_string(), name.to_string()))?;
        let rv = self.next_rv();
        let mut gone = old.clone();
        gone["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.record(r, ns, "DELETED", Some(old), gone.clone());
        Some(gone)
    }
}

/// The `scale` subresource (autoscaling/v1 Scale), as the real server serves it for a CRD.
impl Inner {
    fn scale_paths<'a>(r: &'a Resource, name: &str) -> Result<&'a ScalePaths, ApiError> {
        r.scale.as_ref().ok_or_else(|| {
            api_err(
                404,
                "NotFound",
                format!(
                    "{} {name:?}: the server could not find the requested resource (scale)",
                    r.plural
                ),
            )
        })
    }

    /// The object's Scale: spec.replicas from the spec path (0 when absent), status from
    /// the status paths.
    fn scale_view(paths: &ScalePaths, o: &Value) -> Value {
        let m = &o["metadata"];
        let mut status = json!({"replicas": o.pointer(paths.status_replicas)
            .and_then(Value::as_i64).unwrap_or(0)});
        if let Some(sel) = paths
            .label_selector
            .and_then(|p| o.pointer(p))
            .and_then(Value::as_str)
        {
            status["selector"] = json!(sel);
        }
        json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
               "metadata": {"name": m["name"], "namespace": m["namespace"], "uid": m["uid"],
                            "resourceVersion": m["resourceVersion"],
                            "creationTimestamp": m["creationTimestamp"]},
               "spec": {"replicas": o.pointer(paths.spec_replicas).and_then(Value::as_i64).unwrap_or(0)},
               "status": status})
    }

    pub(super) fn get_scale(&self, r: &Resource, ns: &str, name: &str) -> Result<Value, ApiError> {
        let paths = Self::scale_paths(r, name)?;
        let (_, o) = self.existing(r, ns, name)?;
        Ok(Self::scale_view(paths, &o))
    }

    /// PUT or PATCH of the Scale: the new `spec.replicas` is written to the object's spec
    /// path (a spec change: generation moves), under the Scale's resourceVersion when it
    /// names one.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_scale(
        &mut self,
        r: &'static Resource,
        version: &str,
        ns: &str,
        name: &str,
        ct: Option<&str>,
        body: &Value,
    ) -> Result<Value, ApiError> {
        let paths = Self::scale_paths(r, name)?;
        let (_, old) = self.existing(r, ns, name)?;
        let scale =
            match ct {
                None => body.clone(),
                Some(ct) => {
                    let mut s = Self::scale_view(paths, &old);
                    s["metadata"]["resourceVersion"] = json!("");
                    match ct {
                        "application/merge-patch+json"
                        | "application/strategic-merge-patch+json" => patch::merge(&mut s, body),
                        "application/json-patch+json" => patch::json_patch(&mut s, body)
                            .map_err(|e| patch_failed(e.to_string()))?,
                        other => {
                            return Err(api_err(
                                415,
                                "UnsupportedMediaType",
                                format!("{other:?} is not a patch type served here"),
                            ))
                        }
                    }
                    s
                }
            };
        let replicas = scale
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .filter(|n| (0..=i32::MAX as i64).contains(n))
            .ok_or_else(|| {
                api_err(
                    422,
                    "Invalid",
                    format!(
                        "Scale {name:?} is invalid: spec.replicas: Invalid value: {}: must be greater than or equal to 0",
                        scale.pointer("/spec/replicas").unwrap_or(&Value::Null)
                    ),
                )
            })?;
        let mut new = old.clone();
        new["metadata"]["resourceVersion"] = scale
            .pointer("/metadata/resourceVersion")
            .cloned()
            .unwrap_or(json!(""));
        let mut at = paths
            .spec_replicas
            .trim_start_matches('/')
            .split('/')
            .peekable();
        let mut cur = &mut new;
        while let Some(k) = at.next() {
            if at.peek().is_none() {
                cur[k] = json!(replicas);
                break;
            }
            if !cur[k].is_object() {
                cur[k] = json!({});
            }
            cur = &mut cur[k];
        }
        let written = self.write(r, version, ns, name, false, new)?;
        Ok(Self::scale_view(paths, &written))
    }
}

pub(super) fn uuid() -> String {
    let a = fastrand::u128(..);
    let h = format!("{a:032x}");
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}
