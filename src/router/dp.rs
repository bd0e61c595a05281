//! `--dp-aware` (sglang-router's): an SGLang server running `dp_size` data-parallel ranks
//! behind one address becomes `dp_size` workers `URL@0` … `URL@{n-1}`, each routed to by the
//! policies as its own worker; a request sent to `URL@r` goes to `URL` with
//! `"data_parallel_rank": r` in its body, so the server runs it on that rank.
//!
//! The rank count comes from the server's `/get_server_info` (`/server_info` on newer
//! releases); it is learnt once per address and remembered.

use crate::router::worker::{Source, Worker, WorkerSpec};
use crate::router::Router;
use http::Method;
use serde_json::Value;
use std::time::Duration;

/// How long one server-info question may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// The body field that selects the rank.
pub const RANK_FIELD: &str = "data_parallel_rank";

/// `dp_size` of a server-info answer.
pub fn dp_size(info: &Value) -> Result<usize, String> {
    let n = info
        .get("dp_size")
        .ok_or("its server info has no dp_size (is it an SGLang server?)")?;
    n.as_u64()
        .filter(|&n| (1..=4096).contains(&n))
        .map(|n| n as usize)
        .ok_or_else(|| format!("its server info has dp_size {n}, not a count of ranks"))
}

/// One spec per rank.
pub fn expand(spec: &WorkerSpec, ranks: usize) -> Vec<WorkerSpec> {
    (0..ranks)
        .map(|r| WorkerSpec {
            dp_rank: Some(r),
            ..spec.clone()
        })
        .collect()
}

/// The rank specs of `spec` (it unchanged without `--dp-aware`), asking the server its
/// `dp_size` unless it was learnt before.
pub async fn rank_specs(router: &Router, spec: &WorkerSpec) -> Result<Vec<WorkerSpec>, String> {
    if !router.cfg.server.dp_aware || spec.dp_rank.is_some() {
        return Ok(vec![spec.clone()]);
    }
    if let Some(&n) = router.workers.dp_sizes.lock().get(&spec.url) {
        return Ok(expand(spec, n));
    }
    let probe = Worker::new(spec.clone(), Source::Api);
    let mut why = String::new();
    for path in ["/get_server_info", "/server_info"] {
        match router.call(&probe, Method::GET, path, ASK_TIMEOUT).await {
            Ok((st, body)) if st.is_success() => {
                let info: Value = serde_json::from_slice(&body)
                    .map_err(|e| format!("{}{path}: not JSON: {e}", spec.url))?;
                let n = dp_size(&info).map_err(|e| format!("{}: {e}", spec.url))?;
                tracing::info!(worker = %spec.url, dp_size = n, "data-parallel ranks learnt");
                router.workers.dp_sizes.lock().insert(spec.url.clone(), n);
                return Ok(expand(spec, n));
            }
            Ok((st, _)) => why = format!("{}{path} answered {st}", spec.url),
            Err(e) => why = format!("{}{path}: {e}", spec.url),
        }
    }
    Err(format!("--dp-aware: cannot learn the ranks of {why}"))
}

/// [`rank_specs`] of every spec; those whose ranks cannot be learnt now are left out (and
/// logged), to be tried again at the next sync.
pub async fn rank_specs_all(router: &Router, specs: Vec<WorkerSpec>) -> Vec<WorkerSpec> {
    if !router.cfg.server.dp_aware {
        return specs;
    }
    let mut out = Vec::with_capacity(specs.len());
    for spec in &specs {
        match rank_specs(router, spec).await {
            Ok(ranks) => out.extend(ranks),
            Err(e) => tracing::warn!("{e}; left out until it answers"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ranks_come_from_dp_size_and_bad_answers_are_named() {
        assert_eq!(dp_size(&json!({"dp_size": 4, "tp_size": 2})), Ok(4));
        assert!(dp_size(&json!({"tp_size": 2}))
            .unwrap_err()
            .contains("no dp_size"));
        assert!(dp_size(&json!({"dp_size": 0}))
            .unwrap_err()
            .contains("dp_size 0"));
        assert!(dp_size(&json!({"dp_size": "2"})).is_err());
        let specs = expand(&WorkerSpec::regular("http://w:1"), 3);
        let ranks: Vec<_> = specs.iter().map(|s| s.dp_rank).collect();
        assert_eq!(ranks, [Some(0), Some(1), Some(2)]);
        let w = Worker::new(specs[2].clone(), Source::Flags);
        assert_eq!(&*w.url, "http://w:1@2");
        assert_eq!(&*w.base_url, "http://w:1");
    }
}
