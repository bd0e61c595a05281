//! Calls fanned out to every worker: `/flush_cache`, `/get_loads`, `/engine_metrics`.

use super::S;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{header, Method, StatusCode};
use serde_json::{json, Value};
use std::time::Duration;

/// `/engine_metrics`: every worker's `/metrics`, each sample labelled with its worker.
pub(in crate::router) async fn engine_metrics(State(s): S) -> Response {
    let workers = s.workers.registry.snapshot();
    let mut seen = std::collections::HashSet::new();
    let mut out = String::new();
    for w in workers.iter() {
        let Ok((st, body)) = s
            .call(w, Method::GET, "/metrics", Duration::from_secs(5))
            .await
        else {
            continue;
        };
        if !st.is_success() {
            continue;
        }
        out.push_str(&label_samples(
            &String::from_utf8_lossy(&body),
            &w.url,
            &mut seen,
        ));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}
/// Prometheus text with `worker="<url>"` added to every sample; `# HELP`/`# TYPE` lines
/// already written (in `seen`) are left out.
pub(in crate::router) fn label_samples(
    text: &str,
    worker: &str,
    seen: &mut std::collections::HashSet<String>,
) -> String {
    let esc = worker.replace('\\', "\\\\").replace('"', "\\\"");
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('#') {
            if seen.insert(line.to_string()) {
                out.push_str(line);
                out.push('\n');
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let (name, rest) = line.split_at(name_end);
        match rest.strip_prefix('{') {
            Some(labels) => out.push_str(&format!("{name}{{worker=\"{esc}\",{labels}")),
            None => out.push_str(&format!("{name}{{worker=\"{esc}\"}}{rest}")),
        }
        out.push('\n');
    }
    out
}
pub(in crate::router) async fn flush_cache(State(s): S) -> Response {
    let workers = s.workers.registry.snapshot();
    let mut set = tokio::task::JoinSet::new();
    for w in workers.iter().cloned() {
        let s = s.clone();
        set.spawn(async move {
            let r = s
                .call(&w, Method::POST, "/flush_cache", Duration::from_secs(30))
                .await;
            (w.url.to_string(), r)
        });
    }
    let mut results = Vec::new();
    let mut all_ok = true;
    while let Some(Ok((url, r))) = set.join_next().await {
        let (ok, detail) = match r {
            Ok((st, _)) if st.is_success() => (true, st.as_u16().to_string()),
            Ok((st, body)) => (false, format!("{st}: {}", String::from_utf8_lossy(&body))),
            Err(e) => (false, e),
        };
        all_ok &= ok;
        results.push(json!({"worker": url, "ok": ok, "detail": detail}));
    }
    let status = if all_ok {
        StatusCode::OK
    } else {
        StatusCode::BAD_GATEWAY
    };
    let message = if all_ok {
        "Cache flushed on all workers"
    } else {
        "Cache flush failed on some workers"
    };
    (
        status,
        Json(json!({"message": message, "workers": results})),
    )
        .into_response()
}
/// Tokens a worker's `/get_load` reports (an object, or a list of per-rank objects).
pub(in crate::router) fn tokens_of(v: &Value) -> Option<i64> {
    match v {
        Value::Array(items) => items.iter().map(tokens_of).sum(),
        Value::Object(o) => o.get("num_tokens").and_then(Value::as_i64),
        _ => None,
    }
}
pub(in crate::router) async fn get_loads(State(s): S) -> Json<Value> {
    let workers = s.workers.registry.snapshot();
    let mut set = tokio::task::JoinSet::new();
    for (i, w) in workers.iter().cloned().enumerate() {
        let s = s.clone();
        set.spawn(async move {
            let r = s
                .call(&w, Method::GET, "/get_load", Duration::from_secs(5))
                .await;
            let load = match r {
                Ok((st, body)) if st.is_success() => serde_json::from_slice::<Value>(&body)
                    .ok()
                    .as_ref()
                    .and_then(tokens_of)
                    .unwrap_or(-1),
                _ => -1,
            };
            (
                i,
                json!({"worker": &*w.url, "worker_type": w.worker_type, "load": load,
                "requests_in_flight": w.load()}),
            )
        });
    }
    let mut out: Vec<(usize, Value)> = Vec::new();
    while let Some(Ok(x)) = set.join_next().await {
        out.push(x);
    }
    out.sort_by_key(|(i, _)| *i);
    Json(json!({"workers": out.into_iter().map(|(_, v)| v).collect::<Vec<_>>()}))
}
