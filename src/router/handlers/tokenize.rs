//! The routes answered from the router's tokenizer and global KV index: `/v1/tokenize`,
//! `/v1/detokenize`, Mooncake Conductor's `/query`, and routing by token.

use super::workers::bad;
use super::S;
use crate::router::policy::{PolicyKind, TextForm};
use crate::router::proxy::error_response;
use crate::router::request::RouteInfo;
use crate::router::tokenize::{parse_ids, token_text, TokenizeError, Tokenizer, INLINE_BYTES};
use crate::router::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::StatusCode;
use serde_json::{json, Value};
use std::sync::Arc;

/// With a local tokenizer and a cache-aware policy, the routing text becomes token ids (text
/// and `input_ids` requests then share prefixes). Long texts are tokenized off the async
/// threads.
pub(in crate::router) async fn by_token(
    s: &Arc<Router>,
    info: &mut RouteInfo,
) -> Result<(), TokenizeError> {
    let Some(t) = &s.routing.tokenizer else {
        return Ok(());
    };
    // The policies that match a prompt's tokens (bucket counts its characters).
    let by_tokens = [
        &s.routing.policy,
        &s.routing.prefill_policy,
        &s.routing.decode_policy,
    ]
    .iter()
    .any(|p| matches!(p.kind(), PolicyKind::CacheAware | PolicyKind::PrefixHash));
    if !by_tokens || info.text.is_empty() {
        return Ok(());
    }
    info.text = if info.form == TextForm::SpacedIds {
        token_text(&parse_ids(&info.text))
    } else if info.text.len() <= INLINE_BYTES {
        t.routing_text(&info.text)?
    } else {
        let (t, text) = (t.clone(), std::mem::take(&mut info.text));
        tokio::task::spawn_blocking(move || t.routing_text(&text))
            .await
            .map_err(|e| TokenizeError::Encode(e.to_string()))??
    };
    info.form = TextForm::TokenChars;
    Ok(())
}
/// `/v1/tokenize`: `prompt` (or `text`), a string or a list of them.
#[derive(serde::Deserialize)]
pub(in crate::router) struct TokenizeBody {
    #[serde(alias = "text")]
    prompt: Value,
    #[serde(default = "yes")]
    add_special_tokens: bool,
}
/// `/v1/detokenize`: `tokens`, a list of ids or a list of such lists.
#[derive(serde::Deserialize)]
pub(in crate::router) struct DetokenizeBody {
    tokens: Value,
    #[serde(default = "yes")]
    skip_special_tokens: bool,
}
pub(in crate::router) fn yes() -> bool {
    true
}
pub(in crate::router) fn no_tokenizer() -> Response {
    error_response(
        StatusCode::NOT_IMPLEMENTED,
        "invalid_request_error",
        "no local tokenizer: start the router with --tokenizer-path (a tokenizer.json)",
        "",
    )
}
/// The tokenizer and the request body, or the answer why not.
#[allow(clippy::result_large_err)]
pub(in crate::router) fn tokenizer_and<T: serde::de::DeserializeOwned>(
    s: &Router,
    body: &[u8],
) -> Result<(Arc<Tokenizer>, T), Response> {
    let t = s.routing.tokenizer.clone().ok_or_else(no_tokenizer)?;
    let req = serde_json::from_slice(body).map_err(|e| bad(&format!("request body: {e}")))?;
    Ok((t, req))
}
/// Mooncake Conductor's indexer API over the router's global KV index (`precise_prefix`):
/// `POST /query` (token ids) and `POST /query_by_hash` (SGLang's block hashes).
pub(in crate::router) async fn conductor_query(State(s): S, body: axum::body::Bytes) -> Response {
    let Some(index) = s.routing.kv_index.clone() else {
        return bad("no KV index: it is kept with --policy precise_prefix");
    };
    // Reading a long query and hashing its blocks is CPU work: off the runtime threads, one
    // query at a time per core at most, so that queries cannot stall the requests routed.
    let Ok(_turn) = s.limits.cpu_work.acquire().await else {
        return bad("the router is stopping");
    };
    let answered = tokio::task::spawn_blocking(move || {
        let q: crate::router::kv_index::ConductorQuery =
            serde_json::from_slice(&body).map_err(|e| format!("not a Conductor query: {e}"))?;
        drop(body);
        index.conductor(&q)
    });
    match answered.await {
        Ok(Ok(v)) => Json(v).into_response(),
        Ok(Err(e)) => bad(&e),
        Err(e) => bad(&format!("the query failed: {e}")),
    }
}
pub(in crate::router) async fn tokenize(State(s): S, body: axum::body::Bytes) -> Response {
    let (t, req): (_, TokenizeBody) = match tokenizer_and(&s, &body) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let encode = |text: &str| t.encode(text, req.add_special_tokens);
    let answer = match &req.prompt {
        Value::String(text) => encode(text).map(|ids| json!({"tokens": ids, "count": ids.len()})),
        Value::Array(items) if items.iter().all(Value::is_string) => items
            .iter()
            .filter_map(Value::as_str)
            .map(encode)
            .collect::<Result<Vec<_>, _>>()
            .map(|all| {
                let counts: Vec<usize> = all.iter().map(Vec::len).collect();
                json!({"tokens": all, "count": counts})
            }),
        _ => return bad("prompt: a string or a list of strings"),
    };
    match answer {
        Ok(v) => Json(v).into_response(),
        Err(e) => bad(&e.to_string()),
    }
}
pub(in crate::router) async fn detokenize(State(s): S, body: axum::body::Bytes) -> Response {
    let (t, req): (_, DetokenizeBody) = match tokenizer_and(&s, &body) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let ids = |v: &Value| -> Option<Vec<u32>> {
        v.as_array()?
            .iter()
            .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect()
    };
    let decode = |ids: &[u32]| t.decode(ids, req.skip_special_tokens);
    let answer = if let Some(one) = ids(&req.tokens) {
        decode(&one).map(|text| json!({"text": text}))
    } else if let Some(many) = req
        .tokens
        .as_array()
        .and_then(|l| l.iter().map(ids).collect::<Option<Vec<_>>>())
    {
        many.iter()
            .map(|x| decode(x))
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| json!({"text": texts}))
    } else {
        return bad("tokens: a list of token ids, or a list of such lists");
    };
    match answer {
        Ok(v) => Json(v).into_response(),
        Err(e) => bad(&e.to_string()),
    }
}
