//! The HTTP side: request paths and queries parsed into targets, and the handler that runs a
//! request against the storage.

use super::*;

/// Where a request goes.
pub(super) struct Target {
    pub(super) r: &'static Resource,
    pub(super) version: String,
    pub(super) ns: Option<String>,
    pub(super) name: Option<String>,
    pub(super) status: bool,
    /// The `scale` subresource.
    pub(super) scale: bool,
}

pub(super) fn parse_path(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        rest => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(*s)),
        _ => return None,
    };
    let r = RESOURCES
        .iter()
        .find(|r| r.plural == plural && r.group == group && r.versions.contains(&version))?;
    let (status, scale) = match sub {
        None => (false, false),
        Some("status") if r.status => (true, false),
        Some("scale") if r.scale.is_some() => (false, true),
        Some(_) => return None,
    };
    Some(Target {
        r,
        version: version.to_string(),
        ns,
        name,
        status,
        scale,
    })
}

pub(super) fn query(uri: &Uri) -> HashMap<String, String> {
    uri.query()
        .map(|q| {
            q.split('&')
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    Some((decode(k)?, decode(v)?))
                })
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let h = std::str::from_utf8(&b[i + 1..i + 3]).ok()?;
                out.push(u8::from_str_radix(h, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

pub(super) fn reply(code: u16, v: Value) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(v)).into_response()
}

pub(super) async fn handle(
    State(api): State<ApiServer>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    if method == Method::GET {
        if let Some(d) = discovery(&path) {
            *api.inner
                .lock()
                .counts
                .by_verb
                .entry("discovery".into())
                .or_default() += 1;
            return reply(200, d);
        }
    }
    let Some(t) = parse_path(&path) else {
        return reply(
            404,
            api_err(404, "NotFound", format!("no route {path}")).status(),
        );
    };
    let q = query(&uri);
    let agent = headers
        .get("user-agent")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let ct = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    let mut inner = api.inner.lock();
    if inner.uninstalled.contains(&t.r.name) {
        return reply(
            404,
            api_err(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
            .status(),
        );
    }
    if let Some(p) = inner
        .fail_paths
        .iter()
        .find(|p| path.contains(p.as_str()))
        .cloned()
    {
        if method != Method::GET {
            *inner.counts.write_faults.entry(p).or_default() += 1;
        }
        return reply(
            500,
            api_err(500, "InternalError", "injected fault").status(),
        );
    }
    let watch = q.get("watch").is_some_and(|v| v == "1" || v == "true");
    let verb = match (&method, &t.name, watch) {
        (&Method::GET, _, true) => "watch",
        (&Method::GET, None, false) => "list",
        (&Method::GET, Some(_), false) => "get",
        (&Method::POST, _, _) => "create",
        (&Method::PUT, _, _) => "update",
        (&Method::PATCH, _, _) => "patch",
        (&Method::DELETE, _, _) => "delete",
        _ => "other",
    };
    *inner.counts.by_verb.entry(verb.to_string()).or_default() += 1;
    *inner
        .counts
        .requests_by_agent
        .entry(agent.clone())
        .or_default() += 1;
    if matches!(verb, "create" | "update" | "patch" | "delete") {
        if t.r.plural != "leases" {
            *inner.counts.writes_by_agent.entry(agent).or_default() += 1;
        }
        *inner
            .counts
            .writes_by_resource
            .entry(t.r.plural.to_string())
            .or_default() += 1;
        if let Some(i) = inner
            .race_next_write
            .iter()
            .position(|p| path.contains(p.as_str()))
        {
            inner.race_next_write.remove(i);
            if let (Some(ns), Some(name)) = (&t.ns, &t.name) {
                inner.touch(t.r, ns, name);
            }
        }
    }
    let parsed_body = || -> Result<Value, ApiError> {
        serde_json::from_slice(&body)
            .map_err(|e| api_err(400, "BadRequest", format!("body is not JSON: {e}")))
    };
    let ns = t.ns.clone().unwrap_or_default();
    let result =
        match (verb, &t.name) {
            ("watch", _) => {
                return match inner.watch(&t, &q) {
                    Ok((rx, timeout)) => Response::new(events(rx, timeout)),
                    Err(e) => reply(e.code, e.status()),
                };
            }
            ("get", Some(name)) if t.scale => inner.get_scale(t.r, &ns, name),
            ("update", Some(name)) if t.scale && t.ns.is_some() => {
                parsed_body().and_then(|b| inner.write_scale(t.r, &t.version, &ns, name, None, &b))
            }
            ("patch", Some(name)) if t.scale && t.ns.is_some() => parsed_body()
                .and_then(|b| inner.write_scale(t.r, &t.version, &ns, name, Some(&ct), &b)),
            (_, _) if t.scale => Err(api_err(
                405,
                "MethodNotAllowed",
                format!("{method} {path}: the scale subresource serves get, update and patch"),
            )),
            ("list", _) => inner.list(&t, &q),
            ("get", Some(name)) => inner
                .objects
                .get(&(t.r.name, ns.clone(), name.clone()))
                .map(|o| inner.served(t.r, &t.version, o))
                .ok_or_else(|| {
                    api_err(
                        404,
                        "NotFound",
                        format!("{} {name:?} not found", t.r.plural),
                    )
                }),
            ("create", None) if t.ns.is_some() && !t.status => {
                parsed_body().and_then(|b| inner.create(t.r, &t.version, &ns, b))
            }
            ("update", Some(name)) if t.ns.is_some() => {
                parsed_body().and_then(|b| inner.update(t.r, &t.version, &ns, name, t.status, b))
            }
            ("patch", Some(name)) if t.ns.is_some() => parsed_body()
                .and_then(|b| inner.patch(t.r, &t.version, &ns, name, t.status, &ct, &b)),
            ("delete", Some(name)) if t.ns.is_some() => {
                let opts = serde_json::from_slice(&body).unwrap_or(Value::Null);
                inner.delete(t.r, &t.version, &ns, name, &opts)
            }
            _ => Err(api_err(405, "MethodNotAllowed", format!("{method} {path}"))),
        };
    match result {
        Ok(v) => reply(if verb == "create" { 201 } else { 200 }, v),
        Err(e) => reply(e.code, e.status()),
    }
}

pub(super) fn field_name(q: &HashMap<String, String>) -> Result<Option<String>, ApiError> {
    match q.get("fieldSelector").filter(|f| !f.is_empty()) {
        None => Ok(None),
        Some(f) => f
            .strip_prefix("metadata.name=")
            .map(|n| Some(n.to_string()))
            .ok_or_else(|| {
                api_err(
                    400,
                    "BadRequest",
                    format!("field selector {f:?}: only metadata.name is served here"),
                )
            }),
    }
}

/// Discovery, as kubectl reads it to map `rbgsa/NAME` to a resource: `/api`, `/apis`, each
/// group version's resource list (with short names and subresources) and `/version`.
/// Served as the legacy (unaggregated) documents, which clients fall back to.
pub(super) fn discovery(path: &str) -> Option<Value> {
    let path = path.trim_end_matches('/');
    let versions = |group: &str| -> Vec<&'static str> {
        let mut v: Vec<&'static str> = Vec::new();
        for r in RESOURCES.iter().filter(|r| r.group == group) {
            for x in r.versions {
                if !v.contains(x) {
                    v.push(x);
                }
            }
        }
        v
    };
    match path {
        "/version" => Some(
            json!({"major": "1", "minor": "32", "gitVersion": "v1.32.0-rbgctl-standin",
                                 "platform": "linux/amd64"}),
        ),
        "/api" => Some(json!({"kind": "APIVersions", "versions": ["v1"]})),
        "/apis" => {
            let mut groups: Vec<&str> = Vec::new();
            for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
                if !groups.contains(&r.group) {
                    groups.push(r.group);
                }
            }
            let groups: Vec<Value> = groups
                .into_iter()
                .map(|g| {
                    let vs: Vec<Value> = versions(g)
                        .into_iter()
                        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                        .collect();
                    json!({"name": g, "versions": vs, "preferredVersion": vs[0]})
                })
                .collect();
            Some(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
        }
        _ => {
            let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
            let (group, version) = match parts.as_slice() {
                ["api", v] => ("", *v),
                ["apis", g, v] => (*g, *v),
                _ => return None,
            };
            if !versions(group).contains(&version) {
                return None;
            }
            let mut resources = Vec::new();
            for r in RESOURCES
                .iter()
                .filter(|r| r.group == group && r.versions.contains(&version))
            {
                resources.push(json!({"name": r.plural, "singularName": r.singular,
                    "namespaced": true, "kind": r.kind, "shortNames": r.short_names,
                    "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}));
                if r.status {
                    resources.push(json!({"name": format!("{}/status", r.plural),
                        "singularName": "", "namespaced": true, "kind": r.kind,
                        "verbs": ["get", "patch", "update"]}));
                }
                if r.scale.is_some() {
                    resources.push(json!({"name": format!("{}/scale", r.plural),
                        "singularName": "", "namespaced": true, "group": "autoscaling",
                        "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
                }
            }
            let gv = if group.is_empty() {
                version.to_string()
            } else {
                format!("{group}/{version}")
            };
            Some(
                json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                        "resources": resources}),
            )
        }
    }
}
