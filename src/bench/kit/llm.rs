//! One streamed inference request, measured the way SGLang's benchmark kits measure it: time to
//! the first token chunk, the gaps between token chunks, the time to the last one, and the
//! prompt and cached token counts the server reports (`meta_info.cached_tokens` of the first
//! token chunk for `/generate`; `usage.prompt_tokens_details.cached_tokens` of the final usage
//! chunk for the OpenAI API).

use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Which API a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ApiFormat {
    /// `POST /generate` with `input_ids`.
    Sglang,
    /// `POST /v1/chat/completions` with messages.
    Openai,
    /// `POST /v1/completions` with the prompt as token ids.
    Completions,
}

impl ApiFormat {
    /// The path requests of this format go to.
    pub fn path(self) -> &'static str {
        match self {
            ApiFormat::Sglang => "/generate",
            ApiFormat::Openai => "/v1/chat/completions",
            ApiFormat::Completions => "/v1/completions",
        }
    }
}

/// What one request measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub ok: bool,
    pub error: String,
    /// Seconds to the first token chunk.
    pub ttft: f64,
    /// Seconds between token chunks.
    pub itl: Vec<f64>,
    /// Seconds to the last chunk.
    pub latency: f64,
    /// Prompt tokens as the server counted them (0 if it did not say).
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    /// Generated length (chunks for `/generate`, `usage.completion_tokens` for OpenAI).
    pub generated_len: usize,
    /// Output token ids (`/generate`) and text (OpenAI), for the next turn's history.
    pub output_ids: Vec<u32>,
    pub output_text: String,
}

/// The JSON body of a request, in SGLang's benchmark kit's shape.
pub fn payload(
    api: ApiFormat,
    model: &str,
    input_ids: &[u32],
    messages: &[Value],
    max_new: usize,
    lora: &str,
    ignore_eos: bool,
) -> Value {
    match api {
        ApiFormat::Sglang => {
            let mut p = json!({"input_ids": input_ids,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": ignore_eos},
                "stream": true, "stream_options": {"include_usage": true},
                "return_logprob": false, "logprob_start_len": -1});
            if !lora.is_empty() {
                p["lora_path"] = json!(lora);
            }
            p
        }
        ApiFormat::Openai => json!({"model": model, "messages": messages, "max_tokens": max_new,
            "temperature": 0.0, "stream": true, "stream_options": {"include_usage": true},
            "ignore_eos": ignore_eos}),
        ApiFormat::Completions => {
            json!({"model": model, "prompt": input_ids, "max_tokens": max_new,
            "temperature": 0.0, "stream": true, "stream_options": {"include_usage": true},
            "ignore_eos": ignore_eos})
        }
    }
}

/// Streams one request and measures it. Never fails: errors are in the outcome.
pub async fn send(
    http: &reqwest::Client,
    url: &str,
    api: ApiFormat,
    body: &Value,
    timeout: Duration,
) -> Outcome {
    let start = Instant::now();
    let mut o = Outcome::default();
    let resp = match http.post(url).json(body).timeout(timeout).send().await {
        Ok(r) => r,
        Err(e) => {
            o.error = format!("{url}: {e}");
            return o;
        }
    };
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        o.error = format!(
            "{url}: {status}: {}",
            text.chars().take(300).collect::<String>()
        );
        return o;
    }
    let mut resp = resp;
    let mut buf: Vec<u8> = Vec::new();
    let mut p = Parser::new(api);
    let mut last_token = start;
    loop {
        match resp.chunk().await {
            Ok(Some(bytes)) => {
                buf.extend_from_slice(&bytes);
                while let Some(end) = buf.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=end).collect();
                    let line = String::from_utf8_lossy(&line);
                    let Some(data) = line.trim().strip_prefix("data:") else {
                        continue;
                    };
                    let now = Instant::now();
                    match p.event(data.trim(), &mut o) {
                        Event::Token => {
                            if o.ttft == 0.0 {
                                o.ttft = (now - start).as_secs_f64();
                            } else {
                                o.itl.push((now - last_token).as_secs_f64());
                            }
                            last_token = now;
                            o.latency = (now - start).as_secs_f64();
                        }
                        Event::Other => o.latency = (now - start).as_secs_f64(),
                        Event::Done => {}
                        Event::Error(e) => {
                            o.error = e;
                            return o;
                        }
                    }
                }
            }
            Ok(None) => break,
            Err(e) => {
                o.error = format!("{url}: stream cut: {e}");
                return o;
            }
        }
    }
    if o.ttft == 0.0 {
        o.error = format!("{url}: the stream ended without a token");
        return o;
    }
    if api == ApiFormat::Sglang || o.generated_len == 0 {
        o.generated_len = o.itl.len() + 1;
    }
    o.ok = true;
    o
}

#[derive(Debug, PartialEq)]
enum Event {
    Token,
    Other,
    Done,
    Error(String),
}

/// Reads SSE `data:` payloads into an outcome.
struct Parser {
    api: ApiFormat,
    first_token_seen: bool,
}

impl Parser {
    fn new(api: ApiFormat) -> Parser {
        Parser {
            api,
            first_token_seen: false,
        }
    }

    fn event(&mut self, data: &str, o: &mut Outcome) -> Event {
        if data == "[DONE]" {
            return Event::Done;
        }
        let v: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => return Event::Error(format!("a stream event is not JSON: {e}")),
        };
        if let Some(err) = v.get("error") {
            return Event::Error(format!("server error: {err}"));
        }
        match self.api {
            ApiFormat::Sglang => {
                let ids: Vec<u32> = v
                    .get("output_ids")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_u64().map(|n| n as u32))
                            .collect()
                    })
                    .unwrap_or_default();
                if let Some(t) = v
                    .pointer("/meta_info/prompt_tokens")
                    .and_then(Value::as_u64)
                {
                    o.prompt_tokens = t as usize;
                }
                if ids.is_empty() {
                    return Event::Other;
                }
                if !self.first_token_seen {
                    self.first_token_seen = true;
                    o.cached_tokens = v
                        .pointer("/meta_info/cached_tokens")
                        .and_then(Value::as_u64)
                        .unwrap_or(0) as usize;
                }
                // SGLang streams cumulative ids by default, incremental ones with
                // --incremental-streaming-output: take both.
                if ids.len() >= o.output_ids.len() && ids.starts_with(&o.output_ids) {
                    o.output_ids = ids;
                } else {
                    o.output_ids.extend(ids);
                }
                Event::Token
            }
            ApiFormat::Openai | ApiFormat::Completions => {
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    o.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0) as usize;
                    o.generated_len = u["completion_tokens"].as_u64().unwrap_or(0) as usize;
                    o.cached_tokens = u
                        .pointer("/prompt_tokens_details/cached_tokens")
                        .and_then(Value::as_u64)
                        .unwrap_or(0) as usize;
                }
                let piece = v
                    .pointer("/choices/0/delta/content")
                    .or_else(|| v.pointer("/choices/0/text"))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if piece.is_empty() {
                    return Event::Other;
                }
                o.output_text.push_str(piece);
                Event::Token
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sglang_chunks_give_tokens_cached_counts_and_ids() {
        let mut o = Outcome::default();
        let mut p = Parser::new(ApiFormat::Sglang);
        let c1 =
            r#"{"text":"a","output_ids":[5],"meta_info":{"prompt_tokens":100,"cached_tokens":64}}"#;
        let c2 = r#"{"text":"ab","output_ids":[5,6],"meta_info":{"prompt_tokens":100,"cached_tokens":99}}"#;
        assert_eq!(p.event(c1, &mut o), Event::Token);
        assert_eq!(p.event(c2, &mut o), Event::Token);
        assert_eq!(o.cached_tokens, 64, "from the first token chunk");
        assert_eq!(o.output_ids, vec![5, 6], "cumulative ids are not doubled");
        assert_eq!(p.event(r#"{"output_ids":[7]}"#, &mut o), Event::Token);
        assert_eq!(o.output_ids, vec![5, 6, 7], "incremental ids are appended");
        assert_eq!(p.event("[DONE]", &mut o), Event::Done);
        assert!(matches!(p.event("{nope", &mut o), Event::Error(_)));
        assert!(matches!(
            p.event(r#"{"error":{"message":"x"}}"#, &mut o),
            Event::Error(_)
        ));
    }

    #[test]
    fn openai_chunks_read_usage_at_the_end() {
        let mut o = Outcome::default();
        let mut p = Parser::new(ApiFormat::Openai);
        assert_eq!(
            p.event(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#, &mut o),
            Event::Other
        );
        assert_eq!(
            p.event(r#"{"choices":[{"delta":{"content":"hi "}}]}"#, &mut o),
            Event::Token
        );
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}"#;
        assert_eq!(p.event(usage, &mut o), Event::Other);
        assert_eq!(
            (o.prompt_tokens, o.cached_tokens, o.generated_len),
            (10, 4, 3)
        );
        assert_eq!(o.output_text, "hi ");
        // No details: 0 cached.
        let mut o = Outcome::default();
        p.event(
            r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3}}"#,
            &mut o,
        );
        assert_eq!(o.cached_tokens, 0);
    }
}
