//! A small etcd v3 client over etcd's JSON gateway (`POST /v3/kv/range`, `/v3/kv/txn`,
//! `/v3/lease/*`, `/v3/watch`), which every etcd since 3.4 serves on its client port.
//!
//! Why the gateway and not gRPC (`etcd-client`): election needs six calls, all small; the
//! gateway speaks them as JSON over the HTTP client every role already has (reqwest), where
//! gRPC would add tonic, prost and a `protoc` at build time for the same six calls. The cost is
//! base64 keys and values and int64s as strings, handled here.
//!
//! Calls are blocking (they run on the election and leader-watch threads), each bounded by a
//! timeout. Endpoints are tried in turn: a connection failure moves to the next one, and the
//! one that answered is used first next time.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Why an etcd request failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("bad etcd endpoint list {list:?}: {why}")]
    BadEndpoints { list: String, why: String },
    #[error("no etcd endpoint answered ({endpoints}): {last}")]
    Unreachable { endpoints: String, last: String },
    #[error("etcd answered {what}: {message}")]
    Answer { what: String, message: String },
    #[error("cannot build an HTTP client for etcd: {0}")]
    Client(String),
}

/// A key's current value as etcd holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub value: Vec<u8>,
    /// The revision that created the key (it changes only when the key is deleted and made
    /// again): the leadership epoch.
    pub create_revision: i64,
    pub mod_revision: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
}

/// What one watch wait saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchOutcome {
    /// The key was deleted (or its lease expired) at this revision.
    Deleted { revision: i64 },
    /// The key was written at this revision.
    Put { revision: i64 },
    /// Nothing happened within the wait.
    Quiet,
}

/// The result of a campaign: the key was free and is now ours, or someone holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Campaign {
    Won { epoch: i64 },
    Held(KeyValue),
}

/// A client of etcd's JSON gateway on one or more members.
pub struct Etcd {
    endpoints: Vec<String>,
    http: reqwest::blocking::Client,
    /// Endpoints answering long watches: no overall timeout, one per wait instead.
    preferred: AtomicUsize,
}

/// Parses `h1:2379;h2:2379` (also comma-separated, with or without `http://`).
pub fn parse_endpoints(list: &str) -> Result<Vec<String>, EtcdError> {
    let bad = |why: String| EtcdError::BadEndpoints {
        list: list.to_string(),
        why,
    };
    let mut out = Vec::new();
    for part in list.split([';', ',']).map(str::trim) {
        if part.is_empty() {
            continue;
        }
        let bare = part
            .strip_prefix("http://")
            .unwrap_or(part)
            .trim_end_matches('/');
        if part.starts_with("https://") {
            return Err(bad(format!(
                "{part:?}: TLS to etcd is not supported; use http://"
            )));
        }
        let Some((host, port)) = bare.rsplit_once(':') else {
            return Err(bad(format!("{part:?} has no port (expected host:2379)")));
        };
        if host.is_empty() || host.contains('/') {
            return Err(bad(format!("{part:?}: expected host:port")));
        }
        if port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(bad(format!("{part:?}: {port:?} is not a port")));
        }
        out.push(format!("http://{bare}"));
    }
    if out.is_empty() {
        return Err(bad("no endpoint given (expected h1:2379;h2:2379)".into()));
    }
    Ok(out)
}

fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

/// An int64 as the gateway writes it: a string, or absent for zero.
fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn key_value(kv: &Value) -> Option<KeyValue> {
    let value = match kv.get("value").and_then(Value::as_str) {
        Some(s) => B64.decode(s).ok()?,
        None => Vec::new(),
    };
    Some(KeyValue {
        value,
        create_revision: int(&kv["create_revision"]),
        mod_revision: int(&kv["mod_revision"]),
        lease: int(&kv["lease"]),
    })
}

impl Etcd {
    /// A client of the cluster at `endpoints`; each call waits at most `timeout`.
    pub fn new(endpoints: Vec<String>, timeout: Duration) -> Result<Etcd, EtcdError> {
        let http = reqwest::blocking::Client::builder()
            .connect_timeout(timeout.min(Duration::from_secs(2)))
            .timeout(timeout)
            .build()
            .map_err(|e| EtcdError::Client(e.to_string()))?;
        Ok(Etcd {
            endpoints,
            http,
            preferred: AtomicUsize::new(0),
        })
    }

    /// The endpoints given.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// POSTs `body` to `path` on the first endpoint that answers; an answer with an error
    /// (etcd's `{"error": ...}` or a non-2xx status) is returned as `Answer`, not retried.
    fn post(&self, path: &str, body: &Value) -> Result<Value, EtcdError> {
        self.post_with(path, body, None).and_then(|r| {
            let status = r.status();
            let v: Value = r.json().map_err(|e| EtcdError::Answer {
                what: path.to_string(),
                message: format!("unreadable answer: {e}"),
            })?;
            if !status.is_success() || v.get("error").is_some() {
                return Err(EtcdError::Answer {
                    what: path.to_string(),
                    message: v
                        .get("message")
                        .or_else(|| v.get("error"))
                        .and_then(Value::as_str)
                        .unwrap_or("no message")
                        .to_string(),
                });
            }
            Ok(v)
        })
    }

    fn post_with(
        &self,
        path: &str,
        body: &Value,
        timeout: Option<Duration>,
    ) -> Result<reqwest::blocking::Response, EtcdError> {
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let mut last = String::new();
        for i in 0..n {
            let at = (first + i) % n;
            let mut req = self
                .http
                .post(format!("{}{path}", self.endpoints[at]))
                .json(body);
            if let Some(t) = timeout {
                req = req.timeout(t);
            }
            match req.send() {
                Ok(r) => {
                    self.preferred.store(at, Ordering::Relaxed);
                    return Ok(r);
                }
                Err(e) => last = format!("{}: {e}", self.endpoints[at]),
            }
        }
        Err(EtcdError::Unreachable {
            endpoints: self.endpoints.join(";"),
            last,
        })
    }

    /// Grants a lease of `ttl` (whole seconds, at least 1); answers its id.
    pub fn grant(&self, ttl: Duration) -> Result<i64, EtcdError> {
        let v = self.post(
            "/v3/lease/grant",
            &json!({"TTL": ttl.as_secs().max(1).to_string()}),
        )?;
        match int(&v["ID"]) {
            0 => Err(EtcdError::Answer {
                what: "lease grant".into(),
                message: "no lease id".into(),
            }),
            id => Ok(id),
        }
    }

    /// Renews a lease; answers its TTL from now, or `None` when the lease is gone.
    pub fn keep_alive(&self, lease: i64) -> Result<Option<Duration>, EtcdError> {
        let v = self.post("/v3/lease/keepalive", &json!({"ID": lease.to_string()}))?;
        let ttl = int(&v["result"]["TTL"]);
        Ok((ttl > 0).then(|| Duration::from_secs(ttl as u64)))
    }

    /// Revokes a lease, deleting the keys attached to it. A lease already gone is no error.
    pub fn revoke(&self, lease: i64) -> Result<(), EtcdError> {
        match self.post("/v3/lease/revoke", &json!({"ID": lease.to_string()})) {
            Err(EtcdError::Answer { message, .. }) if message.contains("lease not found") => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// The key's value, if it exists, and the store's revision when it was read (a watch
    /// from there sees every later change).
    pub fn get(&self, key: &str) -> Result<(Option<KeyValue>, i64), EtcdError> {
        let v = self.post("/v3/kv/range", &json!({"key": b64(key.as_bytes())}))?;
        Ok((
            v["kvs"].get(0).and_then(key_value),
            int(&v["header"]["revision"]),
        ))
    }

    /// The keys under `prefix` (at most `limit`), without their values.
    pub fn keys_with_prefix(&self, prefix: &str, limit: usize) -> Result<Vec<String>, EtcdError> {
        let mut end = prefix.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let v = self.post(
            "/v3/kv/range",
            &json!({"key": b64(prefix.as_bytes()), "range_end": b64(&end),
                "keys_only": true, "limit": limit}),
        )?;
        Ok(v["kvs"]
            .as_array()
            .map(|kvs| {
                kvs.iter()
                    .filter_map(|kv| kv["key"].as_str())
                    .filter_map(|k| B64.decode(k).ok())
                    .map(|k| String::from_utf8_lossy(&k).into_owned())
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Creates `key` with `value` attached to `lease` if no such key exists (its create
    /// revision is 0); otherwise answers who holds it.
    pub fn campaign(&self, key: &str, value: &[u8], lease: i64) -> Result<Campaign, EtcdError> {
        let k = b64(key.as_bytes());
        let v = self.post(
            "/v3/kv/txn",
            &json!({
                "compare": [{"key": k, "target": "CREATE", "create_revision": "0", "result": "EQUAL"}],
                "success": [{"request_put": {"key": k, "value": b64(value), "lease": lease.to_string()}}],
                "failure": [{"request_range": {"key": k}}],
            }),
        )?;
        if v["succeeded"].as_bool() == Some(true) {
            // The put is the transaction's only write: the header's revision created the key.
            return Ok(Campaign::Won {
                epoch: int(&v["header"]["revision"]),
            });
        }
        let held = v["responses"][0]["response_range"]["kvs"]
            .get(0)
            .and_then(key_value);
        match held {
            Some(kv) => Ok(Campaign::Held(kv)),
            // Deleted between compare and range cannot happen in one transaction; treat an
            // odd answer as "try again".
            None => Err(EtcdError::Answer {
                what: "campaign".into(),
                message: "the key is held but its value was not returned".into(),
            }),
        }
    }

    /// Puts `key` only while it is still the one created at `create_revision` (the leader
    /// updating its own view); answers false when it is not.
    pub fn put_if_created_at(
        &self,
        key: &str,
        value: &[u8],
        create_revision: i64,
        lease: i64,
    ) -> Result<bool, EtcdError> {
        let k = b64(key.as_bytes());
        let v = self.post(
            "/v3/kv/txn",
            &json!({
                "compare": [{"key": k, "target": "CREATE", "create_revision": create_revision.to_string(), "result": "EQUAL"}],
                "success": [{"request_put": {"key": k, "value": b64(value), "lease": lease.to_string()}}],
            }),
        )?;
        Ok(v["succeeded"].as_bool() == Some(true))
    }

    /// Waits up to `wait` for the first change of `key` after revision `after`.
    pub fn watch(&self, key: &str, after: i64, wait: Duration) -> Result<WatchOutcome, EtcdError> {
        let body = json!({"create_request": {
            "key": b64(key.as_bytes()),
            "start_revision": (after + 1).to_string(),
        }});
        let resp = self.post_with("/v3/watch", &body, Some(wait))?;
        if !resp.status().is_success() {
            return Err(EtcdError::Answer {
                what: "watch".into(),
                message: format!("HTTP {}", resp.status()),
            });
        }
        // One JSON object per line: first the "created" answer, then batches of events.
        for line in BufReader::new(resp).lines() {
            let Ok(line) = line else {
                // The wait's timeout ends the stream.
                return Ok(WatchOutcome::Quiet);
            };
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if let Some(e) = v.get("error") {
                return Err(EtcdError::Answer {
                    what: "watch".into(),
                    message: e.to_string(),
                });
            }
            let result = &v["result"];
            if result["canceled"].as_bool() == Some(true) {
                return Err(EtcdError::Answer {
                    what: "watch".into(),
                    message: result["cancel_reason"]
                        .as_str()
                        .unwrap_or("canceled (revision compacted?)")
                        .to_string(),
                });
            }
            if let Some(event) = result["events"].as_array().and_then(|e| e.first()) {
                let revision = int(&event["kv"]["mod_revision"]);
                return Ok(match event["type"].as_str() {
                    Some("DELETE") => WatchOutcome::Deleted { revision },
                    _ => WatchOutcome::Put { revision },
                });
            }
        }
        Ok(WatchOutcome::Quiet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_lists_parse_and_bad_ones_say_why() {
        assert_eq!(
            parse_endpoints("h1:2379;http://h2:2380/, 10.0.0.1:1").unwrap(),
            vec!["http://h1:2379", "http://h2:2380", "http://10.0.0.1:1"]
        );
        for (list, why) in [
            ("", "no endpoint"),
            ("h1", "no port"),
            ("h1:http", "not a port"),
            ("h1:0", "not a port"),
            ("https://h1:2379", "TLS"),
            (":2379", "host:port"),
        ] {
            let e = parse_endpoints(list).unwrap_err().to_string();
            assert!(e.contains(why), "{list:?}: {e}");
        }
    }

    #[test]
    fn gateway_values_decode() {
        let kv = json!({"key": "eA==", "create_revision": "7", "mod_revision": "9",
                        "value": b64(b"hello"), "lease": "123"});
        assert_eq!(
            key_value(&kv),
            Some(KeyValue {
                value: b"hello".to_vec(),
                create_revision: 7,
                mod_revision: 9,
                lease: 123
            })
        );
        assert_eq!(int(&json!(null)), 0);
        assert_eq!(int(&json!(5)), 5);
    }
}
