//! What the router reads from a request, without changing it: the routing text, whether it
//! streams, the batch size; the request id; and, for disaggregated serving, the bootstrap fields
//! added to the body. The body is forwarded byte for byte; the only edit ever made is appending
//! the bootstrap fields before the final `}`. Pure functions, tested without sockets.

mod fields;

use crate::router::policy::TextForm;
use fields::{Ids, Input, Messages, Named, Stream, Text, Texts};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;

/// The inference endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Generate,
    Chat,
    Completions,
    Embeddings,
    Rerank,
    Score,
    /// OpenAI's Responses API, passed through (the router stores no history).
    Responses,
}

impl Endpoint {
    pub const ALL: [Endpoint; 7] = [
        Endpoint::Generate,
        Endpoint::Chat,
        Endpoint::Completions,
        Endpoint::Embeddings,
        Endpoint::Rerank,
        Endpoint::Score,
        Endpoint::Responses,
    ];

    /// The endpoint served at `path`, if any.
    pub fn of_path(path: &str) -> Option<Endpoint> {
        Endpoint::ALL.into_iter().find(|e| e.path() == path)
    }

    /// The endpoint's path.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Generate => "/generate",
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::Rerank => "/v1/rerank",
            Endpoint::Score => "/v1/score",
            Endpoint::Responses => "/v1/responses",
        }
    }
    /// The endpoint's name in metrics.
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Generate => "generate",
            Endpoint::Chat => "chat",
            Endpoint::Completions => "completions",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Rerank => "rerank",
            Endpoint::Score => "score",
            Endpoint::Responses => "responses",
        }
    }
    /// Generates tokens: the routes prefill/decode disaggregation serves.
    pub fn generates(self) -> bool {
        matches!(
            self,
            Endpoint::Generate | Endpoint::Chat | Endpoint::Completions
        )
    }
    /// The endpoint's place in `Endpoint::ALL`, for tables indexed by endpoint.
    pub fn index(self) -> usize {
        self as usize
    }
    /// Prefix of generated request ids (as sglang-router).
    fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Generate => "gnt-",
            Endpoint::Chat => "chatcmpl-",
            Endpoint::Completions => "cmpl-",
            Endpoint::Embeddings => "embd-",
            Endpoint::Rerank | Endpoint::Score => "req-",
            Endpoint::Responses => "resp_",
        }
    }
}

/// A request body the router cannot route.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadRequest {
    #[error("request body is not valid JSON: {0}")]
    Json(String),
    #[error("request body must be a JSON object")]
    NotObject,
    #[error("{field}: {reason}")]
    Field { field: &'static str, reason: String },
}

/// The fields the router reads, in the shapes it reads them (`fields`); every other field is
/// skipped unbuilt.
#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(default)]
    stream: Stream,
    #[serde(borrow, default)]
    text: Texts<'a>,
    #[serde(default)]
    input_ids: Ids,
    /// Chat: the messages' text, read without building them.
    #[serde(borrow, default)]
    messages: Messages<'a>,
    #[serde(borrow, default)]
    prompt: Texts<'a>,
    #[serde(borrow, default)]
    model: Text<'a>,
    /// Embeddings and Responses: a string or a list (of strings, or of messages).
    #[serde(borrow, default)]
    input: Input<'a>,
    /// Rerank and Score.
    #[serde(borrow, default)]
    query: Text<'a>,
    /// SGLang's cache namespaces: a LoRA adapter, an extra key, a cache salt.
    #[serde(borrow, default)]
    lora_path: Named<'a>,
    #[serde(borrow, default)]
    extra_key: Named<'a>,
    #[serde(borrow, default)]
    cache_salt: Named<'a>,
}

/// What routing needs to know about a request.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RouteInfo {
    pub stream: bool,
    /// Text for cache-aware matching.
    pub text: String,
    /// `Some(n)` for a batched `/generate` (a list of texts or of id lists).
    pub batch: Option<usize>,
    /// The request's `model`, when it names one.
    pub model: Option<String>,
    /// What `text` holds: the prompt, or token ids (`input_ids`, not to be tokenized).
    pub form: TextForm,
    /// The request names a cache namespace of its own (`lora_path`, `extra_key` or
    /// `cache_salt`): SGLang keeps its pages apart from the base model's and publishes their
    /// KV events under hashes seeded by the engine's own adapter ids, which the router cannot
    /// compute from the request.
    pub namespaced: bool,
    /// The LoRA adapter named (`lora_path`, one string), when it is the only namespace: its
    /// blocks are found by the adapter's name (SGLang's events carry it as `lora_name`).
    pub adapter: Option<String>,
    /// Its priority band: the rank of its tenant's class when the class gives engines a
    /// priority (set after admission; `None` without tenants).
    pub band: Option<u8>,
}

fn push_text(out: &mut String, s: &str) {
    if !out.is_empty() {
        out.push(' ');
    }
    out.push_str(s);
}

/// What routing reads of a request body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reads {
    /// `stream` and `model` only, the rest skipped unbuilt: enough for every policy but
    /// those that look at the text.
    Flags,
    /// Also the text (cache-aware and bucket policies) and a batch's size (prefill/decode
    /// disaggregation gives each item a bootstrap room).
    Text,
}

/// `stream` and `model` of a body, nothing else built.
#[derive(serde::Deserialize)]
struct PeekFlags<'a> {
    #[serde(default)]
    stream: Stream,
    #[serde(borrow, default)]
    model: Text<'a>,
}

/// Reads a request body. Invalid JSON, a non-object body or a wrongly typed `stream` is a
/// `BadRequest` with a message a person can act on.
pub fn inspect(endpoint: Endpoint, body: &[u8]) -> Result<RouteInfo, BadRequest> {
    inspect_for(endpoint, body, Reads::Text)
}

/// [`inspect`], reading what `reads` says: the body is checked the same either way.
pub fn inspect_for(endpoint: Endpoint, body: &[u8], reads: Reads) -> Result<RouteInfo, BadRequest> {
    let trimmed = body.trim_ascii_start();
    if trimmed.first() != Some(&b'{') {
        if trimmed.is_empty() {
            return Err(BadRequest::Json("the body is empty".into()));
        }
        return match serde_json::from_slice::<Value>(body) {
            Err(e) => Err(BadRequest::Json(e.to_string())),
            Ok(_) => Err(BadRequest::NotObject),
        };
    }
    let json = |e: serde_json::Error| BadRequest::Json(e.to_string());
    if reads == Reads::Flags {
        let peek: PeekFlags = serde_json::from_slice(body).map_err(json)?;
        return flags(peek.stream, peek.model);
    }
    let peek: Peek = serde_json::from_slice(body).map_err(json)?;
    let mut info = flags(peek.stream, peek.model)?;
    info.namespaced = peek.lora_path.named() || peek.extra_key.named() || peek.cache_salt.named();
    if !peek.extra_key.named() && !peek.cache_salt.named() {
        if let Named::Str(name) = peek.lora_path {
            info.adapter = Some(name.into_owned());
        }
    }
    match endpoint {
        Endpoint::Generate => match (peek.text, peek.input_ids) {
            (Texts::One(s), _) => info.text = s.into_owned(),
            (Texts::Many { items, text }, _) => {
                info.batch = Some(items);
                info.text = text;
            }
            (Texts::None, ids) if ids.present => {
                info.form = TextForm::SpacedIds;
                info.batch = ids.batch;
                info.text = ids.text;
            }
            _ => {}
        },
        Endpoint::Chat => {
            for piece in &peek.messages.0 {
                push_text(&mut info.text, piece);
            }
        }
        Endpoint::Embeddings | Endpoint::Responses => {
            for piece in &peek.input.0 {
                push_text(&mut info.text, piece);
            }
        }
        Endpoint::Rerank | Endpoint::Score => {
            if let Some(q) = peek.query.0 {
                info.text = q.into_owned();
            }
        }
        Endpoint::Completions => match peek.prompt {
            Texts::One(s) => info.text = s.into_owned(),
            Texts::Many { text, .. } => info.text = text,
            Texts::None => {}
        },
    }
    Ok(info)
}

/// `stream` (true, false or absent) and `model` (a non-empty string) of a body.
fn flags(stream: Stream, model: Text) -> Result<RouteInfo, BadRequest> {
    let stream = match stream {
        Stream::Unset => false,
        Stream::Is(b) => b,
        Stream::Wrong(other) => {
            return Err(BadRequest::Field {
                field: "stream",
                reason: format!("must be true or false, got {other}"),
            })
        }
    };
    Ok(RouteInfo {
        stream,
        model: model.0.filter(|m| !m.is_empty()).map(Cow::into_owned),
        ..RouteInfo::default()
    })
}

/// A random `bootstrap_room` in [0, 2^63 − 1].
pub fn random_room() -> u64 {
    fastrand::u64(..) & (i64::MAX as u64)
}

/// The body with `bootstrap_host`, `bootstrap_port` and `bootstrap_room` set (arrays of
/// `rooms.len()` for a batch). Everything else is kept byte for byte: the fields are appended
/// before the closing brace. A body that already has some of them is rewritten field by field:
/// those are replaced where they stand, new ones appended, and every other field keeps its
/// place and its exact text (`0.70` stays `0.70`); only whitespace between fields is dropped.
pub fn inject_bootstrap(
    body: &[u8],
    info: &RouteInfo,
    host: &str,
    port: Option<u16>,
    rooms: &[u64],
) -> Result<Vec<u8>, BadRequest> {
    let port_json = match port {
        Some(p) => Value::from(p),
        None => Value::Null,
    };
    let (host_v, port_v, room_v) = match info.batch {
        Some(n) => (
            Value::Array(vec![Value::from(host); n]),
            Value::Array(vec![port_json; n]),
            Value::Array(rooms.iter().map(|r| Value::from(*r)).collect()),
        ),
        None => (
            Value::from(host),
            port_json,
            Value::from(rooms.first().copied().unwrap_or_else(random_room)),
        ),
    };
    set_fields(
        body,
        &[
            ("bootstrap_host", host_v),
            ("bootstrap_port", port_v),
            ("bootstrap_room", room_v),
        ],
    )
}

/// The body (a JSON object) with `fields` set. Everything else is kept byte for byte: when
/// none of the names occurs in the body the fields are appended before the closing brace;
/// otherwise the object is rewritten field by field, those named replaced where they stand and
/// every other field keeping its place and its exact text (`0.70` stays `0.70`); only
/// whitespace between fields is dropped.
pub fn set_fields(body: &[u8], fields: &[(&str, Value)]) -> Result<Vec<u8>, BadRequest> {
    let named = |n: &str| {
        let quoted = format!("\"{n}\"");
        body.windows(quoted.len()).any(|w| w == quoted.as_bytes())
    };
    if fields.iter().any(|(n, _)| named(n)) {
        type Fields = indexmap::IndexMap<String, Box<RawValue>>;
        let json = |e: serde_json::Error| BadRequest::Json(e.to_string());
        let mut all: Fields = serde_json::from_slice(body).map_err(json)?;
        for (name, value) in fields {
            all.insert(
                (*name).into(),
                serde_json::value::to_raw_value(value).map_err(json)?,
            );
        }
        return serde_json::to_vec(&all).map_err(json);
    }
    let end = body
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .filter(|&i| body[i] == b'}')
        .ok_or(BadRequest::NotObject)?;
    let head = &body[..end];
    let mut out = Vec::with_capacity(body.len() + 96);
    out.extend_from_slice(head);
    let mut empty = head.trim_ascii_end().ends_with(b"{");
    for (name, value) in fields {
        if !empty {
            out.push(b',');
        }
        empty = false;
        out.extend_from_slice(format!("\"{name}\":{value}").as_bytes());
    }
    out.extend_from_slice(&body[end..]);
    Ok(out)
}

/// The request id: the first configured header present, else a new id (`gnt-…`, `chatcmpl-…`,
/// `cmpl-…`, `req-…` followed by 24 random letters and digits).
pub fn request_id<'a>(
    configured: &[String],
    lookup: impl Fn(&str) -> Option<&'a str>,
    endpoint: Option<Endpoint>,
) -> String {
    for h in configured {
        if let Some(v) = lookup(h).map(str::trim).filter(|v| !v.is_empty()) {
            return v.to_string();
        }
    }
    const ALPHANUMERIC: &[u8; 62] =
        b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let prefix = endpoint.map(Endpoint::id_prefix).unwrap_or("req-");
    let mut id = String::with_capacity(prefix.len() + 24);
    id.push_str(prefix);
    // 24 characters, 8 from each random word (62^8 < 2^48: the digits are as good as uniform).
    for _ in 0..3 {
        let mut word = fastrand::u64(..);
        for _ in 0..8 {
            id.push(ALPHANUMERIC[(word % 62) as usize] as char);
            word /= 62;
        }
    }
    id
}

/// Statuses after which a request is tried again on a worker chosen anew.
pub fn retryable(status: u16) -> bool {
    matches!(status, 408 | 429 | 500 | 502 | 503 | 504)
}

/// A JSON error body in OpenAI's shape: `{"error": {"message", "type", "code"}}`.
pub fn error_body(status: u16, kind: &str, message: &str) -> String {
    serde_json::json!({"error": {"message": message, "type": kind, "code": status}}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn set_fields_appends_or_replaces_in_place_keeping_the_rest_byte_for_byte() {
        let rank = [("data_parallel_rank", Value::from(1))];
        // Appended before the brace, the rest untouched (0.70 stays 0.70).
        let out = set_fields(br#"{"temperature": 0.70 }"#, &rank).unwrap();
        assert_eq!(out, br#"{"temperature": 0.70 ,"data_parallel_rank":1}"#);
        assert_eq!(
            set_fields(b"{}", &rank).unwrap(),
            br#"{"data_parallel_rank":1}"#
        );
        // Present: replaced where it stands.
        let out = set_fields(br#"{"data_parallel_rank":7,"t":0.70}"#, &rank).unwrap();
        assert_eq!(out, br#"{"data_parallel_rank":1,"t":0.70}"#);
        assert!(matches!(
            set_fields(b"[1]", &rank),
            Err(BadRequest::NotObject)
        ));
    }

    #[test]
    fn reading_only_the_flags_checks_the_body_the_same_and_builds_no_text() {
        let body = br#"{"text":"hello","stream":true,"model":"m","sampling_params":{"n":1}}"#;
        let i = inspect_for(Endpoint::Generate, body, Reads::Flags).unwrap();
        assert!(i.stream && i.text.is_empty() && i.batch.is_none());
        assert_eq!(i.model.as_deref(), Some("m"));
        for bad in [
            &br#"{"stream":"yes"}"#[..],
            b"[1]",
            b"",
            br#"{"text": "x",}"#,
        ] {
            assert_eq!(
                inspect_for(Endpoint::Chat, bad, Reads::Flags)
                    .unwrap_err()
                    .to_string(),
                inspect(Endpoint::Chat, bad).unwrap_err().to_string()
            );
        }
    }

    #[test]
    fn a_lora_adapter_an_extra_key_or_a_cache_salt_makes_a_request_namespaced() {
        for (endpoint, body) in [
            (
                Endpoint::Generate,
                &br#"{"text":"a","lora_path":"sql-adapter"}"#[..],
            ),
            (
                Endpoint::Generate,
                br#"{"input_ids":[1],"extra_key":"tenant-7"}"#,
            ),
            (
                Endpoint::Chat,
                br#"{"messages":[{"role":"user","content":"a"}],"cache_salt":"s"}"#,
            ),
            (
                Endpoint::Generate,
                br#"{"text":["a","b"],"lora_path":["x",null]}"#,
            ),
        ] {
            assert!(inspect(endpoint, body).unwrap().namespaced, "{body:?}");
        }
        // An adapter alone is found by its name; with another namespace, not at all.
        let i = inspect(Endpoint::Generate, br#"{"text":"a","lora_path":"sql"}"#).unwrap();
        assert_eq!(i.adapter.as_deref(), Some("sql"));
        let i = inspect(
            Endpoint::Generate,
            br#"{"text":"a","lora_path":"sql","cache_salt":"s"}"#,
        )
        .unwrap();
        assert_eq!((i.namespaced, i.adapter), (true, None));
        for body in [
            &br#"{"text":"a"}"#[..],
            br#"{"text":"a","lora_path":null,"cache_salt":null}"#,
        ] {
            assert!(
                !inspect(Endpoint::Generate, body).unwrap().namespaced,
                "{body:?}"
            );
        }
    }

    #[test]
    fn routing_text_follows_sglang_router_rules() {
        let i = inspect(
            Endpoint::Generate,
            br#"{"text":"hello world","stream":true,"foo_unknown":1}"#,
        )
        .unwrap();
        assert_eq!(
            (i.text.as_str(), i.stream, i.batch),
            ("hello world", true, None)
        );
        let i = inspect(Endpoint::Generate, br#"{"input_ids":[1,22,333]}"#).unwrap();
        assert_eq!(i.text, "1 22 333");
        let i = inspect(Endpoint::Generate, br#"{"input_ids":[[1,2],[3]]}"#).unwrap();
        assert_eq!((i.text.as_str(), i.batch), ("1 2", Some(2)));
        let i = inspect(Endpoint::Generate, br#"{"text":["a","b","c"]}"#).unwrap();
        assert_eq!((i.text.as_str(), i.batch), ("a b c", Some(3)));
        let i = inspect(
            Endpoint::Chat,
            br#"{"model":"m","messages":[{"role":"system","content":"sys"},
                {"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"x"}}]},
                {"role":"assistant","content":"ok","reasoning_content":"think"}]}"#,
        )
        .unwrap();
        assert_eq!(i.text, "sys look ok think");
        let i = inspect(Endpoint::Completions, br#"{"prompt":["p1","p2"]}"#).unwrap();
        assert_eq!((i.text.as_str(), i.batch), ("p1 p2", None));
        assert!(!inspect(Endpoint::Generate, b"{}").unwrap().stream);
    }

    #[test]
    fn bad_bodies_get_clear_errors() {
        let e = inspect(Endpoint::Generate, br#"{"text": "x",}"#).unwrap_err();
        assert!(
            matches!(&e, BadRequest::Json(m) if m.contains("line 1")),
            "{e}"
        );
        assert_eq!(
            inspect(Endpoint::Generate, b"[1,2]").unwrap_err(),
            BadRequest::NotObject
        );
        assert!(matches!(
            inspect(Endpoint::Generate, b"").unwrap_err(),
            BadRequest::Json(m) if m.contains("empty")
        ));
        assert!(matches!(
            inspect(Endpoint::Chat, br#"{"stream":"yes"}"#).unwrap_err(),
            BadRequest::Field {
                field: "stream",
                ..
            }
        ));
        assert!(inspect(Endpoint::Generate, b"not json")
            .unwrap_err()
            .to_string()
            .starts_with("request body is not valid JSON"));
    }

    #[test]
    fn bootstrap_fields_are_appended_without_touching_the_rest() {
        let body = br#"{"text":"hi","sampling_params":{"temperature":0.70},"x":1e5}  "#;
        let info = inspect(Endpoint::Generate, body).unwrap();
        let out = inject_bootstrap(body, &info, "10.0.0.1", Some(8998), &[42]).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"text":"hi","sampling_params":{"temperature":0.70},"x":1e5,"bootstrap_host":"10.0.0.1","bootstrap_port":8998,"bootstrap_room":42}  "#
        );
        let out = inject_bootstrap(b"{ }", &RouteInfo::default(), "h", None, &[7]).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["bootstrap_port"], Value::Null);
        assert_eq!(v["bootstrap_room"], 7);
        // Batches get arrays, one room per item.
        let body = br#"{"text":["a","b"]}"#;
        let info = inspect(Endpoint::Generate, body).unwrap();
        let out = inject_bootstrap(body, &info, "h", Some(1), &[1, 2]).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["bootstrap_host"], serde_json::json!(["h", "h"]));
        assert_eq!(v["bootstrap_room"], serde_json::json!([1, 2]));
        // Existing fields are replaced where they stand; the others keep order and text.
        let body =
            br#"{"bootstrap_room":1, "text":"t","sampling_params":{"z":0.70,"a":1},"n":1e5}"#;
        let info = inspect(Endpoint::Generate, body).unwrap();
        let out = inject_bootstrap(body, &info, "h", Some(5), &[9]).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"bootstrap_room":9,"text":"t","sampling_params":{"z":0.70,"a":1},"n":1e5,"bootstrap_host":"h","bootstrap_port":5}"#
        );
        for _ in 0..1000 {
            assert!(random_room() <= i64::MAX as u64);
        }
    }

    #[test]
    fn request_ids_come_from_headers_or_are_generated() {
        let headers = ["x-request-id".to_string(), "x-trace-id".to_string()];
        let id = request_id(&headers, |h| (h == "x-trace-id").then_some("abc"), None);
        assert_eq!(id, "abc");
        let id = request_id(&headers, |_| None, Some(Endpoint::Chat));
        assert!(id.starts_with("chatcmpl-") && id.len() == 9 + 24, "{id}");
        assert!(id[9..].chars().all(|c| c.is_ascii_alphanumeric()));
    }

    #[test]
    fn backoff_grows_caps_and_jitters() {
        let cfg = crate::router::config::RetryConfig {
            max_backoff: crate::config::Millis(Duration::from_millis(100)),
            ..Default::default()
        };
        let b = cfg.backoff();
        assert_eq!(b.nth_jittered(1, 0.5), Duration::from_millis(50));
        assert_eq!(b.nth_jittered(2, 0.5), Duration::from_millis(75));
        assert_eq!(b.nth_jittered(6, 0.5), Duration::from_millis(100));
        assert_eq!(b.nth_jittered(1, 0.0), Duration::from_millis(40));
        assert!(b.nth_jittered(1, 0.999_999) < Duration::from_millis(60));
        assert!(retryable(503) && retryable(408) && !retryable(400) && !retryable(404));
    }
}
