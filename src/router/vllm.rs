//! vLLM's disaggregated prefill/decode contract over HTTP, as vLLM's own proxies and SMG speak
//! it (pure: request bodies and `kv_transfer_params`; `proxy.rs` sends them).
//!
//! - Prefill leg (every connector): the client's request with `max_tokens` = 1 (and
//!   `max_completion_tokens` = 1 when present), `stream` = false, `n` = 1, `stream_options`,
//!   `min_tokens` and `min_completion_tokens` removed, and the connector's
//!   `kv_transfer_params`. OpenAI routes only: vLLM serves no `/generate`.
//! - NIXL: prefill gets `{"do_remote_decode": true, "do_remote_prefill": false}`; decode goes
//!   after the prefill answer, with the answer's `kv_transfer_params` relayed verbatim.
//! - Mooncake: the prefill engine's id comes from its bootstrap server (`GET /query`, port
//!   8998 by default); prefill gets a fresh `transfer_id`, decode gets the same id with the
//!   engine id and the bootstrap address, and the two legs may run at once.
//!
//! Bodies are rewritten field by field: every field the contract does not name keeps its
//! place and its exact text.

use super::request::BadRequest;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// How prefill and decode engines move the KV cache (vLLM's `kv_connector`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Connector {
    /// `MooncakeConnector`: decode pulls from the prefill engine's bootstrap address.
    #[default]
    Mooncake,
    /// `NixlConnector`: decode needs the prefill answer's `kv_transfer_params`.
    Nixl,
}

impl Connector {
    /// A connector as workers are registered with it (`MooncakeConnector`, `mooncake`, ...);
    /// `Err` names what is served.
    pub fn parse(s: &str) -> Result<Connector, String> {
        match s.trim().to_ascii_lowercase().trim_end_matches("connector") {
            "mooncake" => Ok(Connector::Mooncake),
            "nixl" => Ok(Connector::Nixl),
            _ => Err(format!(
                "kv connector {s:?} is not served (MooncakeConnector or NixlConnector); requests \
                 to it would recompute the prompt on decode"
            )),
        }
    }

    /// The connector's name in vLLM's `kv_transfer_config`.
    pub fn name(self) -> &'static str {
        match self {
            Connector::Mooncake => "mooncake",
            Connector::Nixl => "nixl",
        }
    }
}

/// Whether a Mooncake request's two legs run at once (as vLLM's Mooncake proxy does: the
/// decode engine waits for the KV itself) or decode only after prefill answered (as SMG does).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Legs {
    #[default]
    Concurrent,
    Sequential,
}

type Fields = indexmap::IndexMap<String, Box<RawValue>>;

fn fields(body: &[u8]) -> Result<Fields, BadRequest> {
    serde_json::from_slice(body).map_err(|e| BadRequest::Json(e.to_string()))
}

fn raw(v: &Value) -> Result<Box<RawValue>, BadRequest> {
    serde_json::value::to_raw_value(v).map_err(|e| BadRequest::Json(e.to_string()))
}

fn encode(f: &Fields) -> Result<Vec<u8>, BadRequest> {
    serde_json::to_vec(f).map_err(|e| BadRequest::Json(e.to_string()))
}

/// `n` as the client asked (1 when absent).
pub fn choices(body: &[u8]) -> u64 {
    #[derive(Deserialize)]
    struct N {
        n: Option<u64>,
    }
    serde_json::from_slice::<N>(body)
        .ok()
        .and_then(|n| n.n)
        .unwrap_or(1)
}

/// The prefill leg's body.
pub fn prefill_body(body: &[u8], kv: &Value) -> Result<Vec<u8>, BadRequest> {
    let mut f = fields(body)?;
    let one = raw(&json!(1))?;
    f.insert("max_tokens".into(), one.clone());
    if f.contains_key("max_completion_tokens") {
        f.insert("max_completion_tokens".into(), one.clone());
    }
    f.insert("stream".into(), raw(&json!(false))?);
    f.insert("n".into(), one);
    for gone in ["stream_options", "min_tokens", "min_completion_tokens"] {
        f.shift_remove(gone);
    }
    f.insert("kv_transfer_params".into(), raw(kv)?);
    encode(&f)
}

/// The decode leg's body: the client's request with `kv_transfer_params`.
pub fn decode_body(body: &[u8], kv: &Value) -> Result<Vec<u8>, BadRequest> {
    let mut f = fields(body)?;
    f.insert("kv_transfer_params".into(), raw(kv)?);
    encode(&f)
}

/// The `kv_transfer_params` a NIXL prefill request gets: prefill only, decode elsewhere.
pub fn nixl_prefill_params() -> Value {
    json!({"do_remote_decode": true, "do_remote_prefill": false})
}

/// What decode needs from a NIXL prefill answer: its `kv_transfer_params`, verbatim.
pub fn nixl_decode_params(prefill_answer: &[u8]) -> Option<Value> {
    #[derive(Deserialize)]
    struct Answer {
        kv_transfer_params: Option<Value>,
    }
    serde_json::from_slice::<Answer>(prefill_answer)
        .ok()?
        .kv_transfer_params
        .filter(|v| !v.is_null())
}

/// A new Mooncake transfer id.
pub fn transfer_id() -> String {
    format!("xfer-{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

/// The `kv_transfer_params` a Mooncake-connector prefill request gets, under `transfer_id`.
pub fn mooncake_prefill_params(transfer_id: &str) -> Value {
    json!({"do_remote_decode": true, "do_remote_prefill": false, "transfer_id": transfer_id})
}

/// The `kv_transfer_params` the matching decode request gets: where to pull the KV cache
/// of `transfer_id` from (the prefill engine's id and bootstrap address).
pub fn mooncake_decode_params(transfer_id: &str, engine: &MooncakeEngine) -> Value {
    json!({"do_remote_decode": false, "do_remote_prefill": true, "transfer_id": transfer_id,
           "remote_engine_id": engine.engine_id, "remote_bootstrap_addr": engine.bootstrap_addr})
}

/// A prefill engine as its Mooncake bootstrap server describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MooncakeEngine {
    pub engine_id: String,
    /// `http://<prefill host>:<bootstrap port>`.
    pub bootstrap_addr: String,
    /// The data-parallel rank used (sent as `X-data-parallel-rank` when there are several).
    pub dp_rank: Option<u32>,
}

/// Reads `GET /query`'s answer (`{dp_rank: {"engine_id": …, "worker_addr": …}}`): the engine of
/// the lowest data-parallel rank.
pub fn mooncake_engine(answer: &Value, bootstrap_addr: &str) -> Option<MooncakeEngine> {
    let ranks = answer.as_object()?;
    let mut best: Option<(u32, &str)> = None;
    for (rank, v) in ranks {
        let Ok(r) = rank.parse::<u32>() else { continue };
        let Some(id) = v.get("engine_id").and_then(Value::as_str) else {
            continue;
        };
        if best.is_none_or(|(b, _)| r < b) {
            best = Some((r, id));
        }
    }
    let (rank, id) = best?;
    Some(MooncakeEngine {
        engine_id: id.to_string(),
        bootstrap_addr: bootstrap_addr.to_string(),
        dp_rank: (ranks.len() > 1).then_some(rank),
    })
}

/// `http://host:port` from a host as vLLM's proxy flags give it (`name` or `http://name`).
pub fn worker_url(host: &str, port: u16) -> String {
    let (scheme, rest) = match host.split_once("://") {
        Some((s, r)) => (s, r),
        None => ("http", host),
    };
    format!("{scheme}://{}:{port}", rest.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_leg_asks_one_token_unstreamed_and_keeps_the_rest_as_written() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.70,
            "max_tokens":64,"max_completion_tokens":64,"stream":true,"stream_options":{"include_usage":true},
            "min_tokens":4,"n":1}"#;
        let kv = mooncake_prefill_params("xfer-1");
        let out = prefill_body(body, &kv).unwrap();
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(text.starts_with(r#"{"model":"m","messages":"#), "{text}");
        assert!(
            text.contains(r#""temperature":0.70"#),
            "exact number text: {text}"
        );
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["max_tokens"], 1);
        assert_eq!(v["max_completion_tokens"], 1);
        assert_eq!(v["stream"], false);
        assert_eq!(v["n"], 1);
        for gone in ["stream_options", "min_tokens", "min_completion_tokens"] {
            assert!(v.get(gone).is_none(), "{gone}");
        }
        assert_eq!(v["kv_transfer_params"], kv);
        // Without max_completion_tokens none is added.
        let v: Value =
            serde_json::from_slice(&prefill_body(br#"{"prompt":"p"}"#, &kv).unwrap()).unwrap();
        assert!(v.get("max_completion_tokens").is_none());
    }

    #[test]
    fn decode_gets_the_request_as_sent_plus_the_transfer_parameters() {
        let engine = MooncakeEngine {
            engine_id: "e-1".into(),
            bootstrap_addr: "http://p:8998".into(),
            dp_rank: None,
        };
        let kv = mooncake_decode_params("xfer-9", &engine);
        let out = decode_body(br#"{"prompt":"p","stream":true,"max_tokens":8}"#, &kv).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["stream"], true);
        assert_eq!(v["max_tokens"], 8);
        assert_eq!(
            v["kv_transfer_params"],
            json!({"do_remote_decode": false, "do_remote_prefill": true, "transfer_id": "xfer-9",
                   "remote_engine_id": "e-1", "remote_bootstrap_addr": "http://p:8998"})
        );
        assert!(decode_body(b"[1]", &kv).is_err(), "not an object");
    }

    #[test]
    fn nixl_parameters_come_back_verbatim_from_the_prefill_answer() {
        let answer =
            br#"{"id":"c","kv_transfer_params":{"remote_engine_id":"x","remote_block_ids":[1,2]}}"#;
        assert_eq!(
            nixl_decode_params(answer),
            Some(json!({"remote_engine_id": "x", "remote_block_ids": [1, 2]}))
        );
        assert_eq!(nixl_decode_params(br#"{"id":"c"}"#), None);
    }

    #[test]
    fn the_bootstrap_answer_names_the_lowest_rank_engine() {
        let q = json!({"1": {"engine_id": "b"}, "0": {"engine_id": "a", "worker_addr": {}}});
        let e = mooncake_engine(&q, "http://p:8998").unwrap();
        assert_eq!((e.engine_id.as_str(), e.dp_rank), ("a", Some(0)));
        let one = mooncake_engine(&json!({"0": {"engine_id": "a"}}), "x").unwrap();
        assert_eq!(one.dp_rank, None, "one rank: no header");
        assert_eq!(mooncake_engine(&json!({}), "x"), None);
        assert_eq!(mooncake_engine(&json!([1]), "x"), None);
    }

    #[test]
    fn connectors_are_read_as_vllm_and_smg_spell_them() {
        assert_eq!(
            Connector::parse("MooncakeConnector"),
            Ok(Connector::Mooncake)
        );
        assert_eq!(Connector::parse("nixl"), Ok(Connector::Nixl));
        assert_eq!(Connector::parse("NixlConnector"), Ok(Connector::Nixl));
        let e = Connector::parse("LMCacheConnectorV1").unwrap_err();
        assert!(
            e.contains("LMCacheConnectorV1") && e.contains("recompute"),
            "{e}"
        );
    }

    #[test]
    fn hosts_are_accepted_with_or_without_a_scheme() {
        assert_eq!(worker_url("p-0.s-p", 8000), "http://p-0.s-p:8000");
        assert_eq!(worker_url("http://p-0.s-p", 8000), "http://p-0.s-p:8000");
        assert_eq!(worker_url("https://p/", 8443), "https://p:8443");
        assert!(transfer_id().starts_with("xfer-"));
        assert_eq!(choices(br#"{"n":3}"#), 3);
        assert_eq!(choices(br#"{}"#), 1);
    }
}
