//! `--kv-events-config`: SGLang's JSON (`KVEventsConfig` in its `kv_events.py`), the same keys
//! and defaults, and the descriptor SGLang's `/server_info` shows under `kv_events` so a
//! router can subscribe without being told the ports.

use serde::Deserialize;
use serde_json::{json, Value};

/// Where and how a source publishes its events.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvEventsConfig {
    /// `zmq`, or `null` (publish nothing).
    pub publisher: String,
    /// The PUB socket: `tcp://*:5557` binds (as do `0.0.0.0`, `::`, `ipc://`), a concrete host
    /// connects, unless `bind` says otherwise. Port 0 (or `*`) binds a free port.
    pub endpoint: String,
    pub bind: Option<bool>,
    /// The ROUTER socket that replays past batches by sequence; none by default.
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    /// The PUB socket's high-water mark: messages a slow subscriber may fall behind by before
    /// it misses some (and asks for a replay).
    pub hwm: i32,
    /// Batches waiting to be sent; past it a batch is dropped and counted.
    pub max_queue_size: usize,
    /// The topic frame of every message.
    pub topic: String,
    /// `default` (SGLang's) or `dynamo` (namespaced hashes); only `default` is produced.
    pub format: String,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        KvEventsConfig {
            publisher: "null".into(),
            endpoint: "tcp://*:5557".into(),
            bind: None,
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: 100_000,
            max_queue_size: 100_000,
            topic: String::new(),
            format: "default".into(),
        }
    }
}

impl KvEventsConfig {
    /// The JSON of `--kv-events-config`, checked; the error names what to fix.
    pub fn parse(json: &str) -> Result<KvEventsConfig, String> {
        let cfg: KvEventsConfig = serde_json::from_str(json)
            .map_err(|e| format!("--kv-events-config is not SGLang's KVEventsConfig JSON: {e}"))?;
        match cfg.publisher.as_str() {
            "zmq" | "null" => {}
            other => {
                return Err(format!(
                    "--kv-events-config: publisher {other:?} is not known (zmq or null)"
                ))
            }
        }
        if cfg.format != "default" {
            return Err(format!(
                "--kv-events-config: format {:?} is not served (default)",
                cfg.format
            ));
        }
        if cfg.buffer_steps == 0 || cfg.max_queue_size == 0 || cfg.hwm < 0 {
            return Err(
                "--kv-events-config: buffer_steps and max_queue_size must be at least 1, hwm not \
                 negative"
                    .into(),
            );
        }
        Ok(cfg)
    }

    /// Whether anything is published.
    pub fn enabled(&self) -> bool {
        self.publisher == "zmq"
    }

    /// Whether the PUB socket binds (SGLang's rule when `bind` is unset).
    pub fn binds(&self) -> bool {
        self.bind.unwrap_or_else(|| {
            let e = &self.endpoint;
            e.contains('*')
                || e.contains("::")
                || e.contains("0.0.0.0")
                || e.starts_with("ipc://")
                || e.starts_with("inproc://")
        })
    }
}

/// `json` (a `--kv-events-config`) with its endpoints set to those a first start bound (port 0
/// became a port), so that the same process started again publishes where its subscribers
/// follow it. Other keys stay as given; JSON that is not an object is returned unchanged.
pub fn pinned(json: &str, endpoint: &str, replay: Option<&str>) -> String {
    let Ok(Value::Object(mut map)) = serde_json::from_str::<Value>(json) else {
        return json.to_string();
    };
    map.insert("endpoint".into(), json!(endpoint));
    map.insert("bind".into(), json!(true));
    if let Some(r) = replay {
        map.insert("replay_endpoint".into(), json!(r));
    }
    Value::Object(map).to_string()
}

/// Host and port of a `tcp://host:port` endpoint (IPv6 in brackets).
pub fn tcp_host_port(endpoint: &str) -> Option<(String, u16)> {
    let rest = endpoint.strip_prefix("tcp://")?;
    let (host, port) = rest.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    (!host.is_empty()).then(|| (host.to_string(), port))
}

/// What `/server_info` shows under `kv_events` (SGLang's `describe_kv_events_publisher`), for
/// the endpoints as bound: `None` when nothing is published over TCP.
pub fn descriptor(
    cfg: &KvEventsConfig,
    bound_endpoint: &str,
    bound_replay: Option<&str>,
    block_size: usize,
) -> Option<Value> {
    if !cfg.enabled() {
        return None;
    }
    let (host, port) = tcp_host_port(bound_endpoint)?;
    let mut d = json!({
        "publisher": cfg.publisher,
        "endpoint_host": host,
        "endpoint_port_base": port,
        "topic": cfg.topic,
        "block_size": block_size,
        "dp_size": 1,
    });
    if let Some((_, replay)) = bound_replay.and_then(tcp_host_port) {
        d["replay_endpoint_port_base"] = json!(replay);
    }
    Some(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_config_binds_the_endpoints_a_first_start_bound() {
        let first = r#"{"publisher":"zmq","endpoint":"tcp://127.0.0.1:0","bind":true,"replay_endpoint":"tcp://127.0.0.1:0","topic":"kv"}"#;
        let again = pinned(
            first,
            "tcp://127.0.0.1:40001",
            Some("tcp://127.0.0.1:40002"),
        );
        let c = KvEventsConfig::parse(&again).unwrap();
        assert_eq!(c.endpoint, "tcp://127.0.0.1:40001");
        assert_eq!(c.replay_endpoint.as_deref(), Some("tcp://127.0.0.1:40002"));
        assert!(c.binds() && c.topic == "kv");
        let none = pinned(
            r#"{"publisher":"zmq","endpoint":"tcp://*:0"}"#,
            "tcp://0.0.0.0:40003",
            None,
        );
        let c = KvEventsConfig::parse(&none).unwrap();
        assert_eq!(
            (c.endpoint.as_str(), c.replay_endpoint),
            ("tcp://0.0.0.0:40003", None)
        );
        assert_eq!(pinned("not json", "tcp://x:1", None), "not json");
    }

    #[test]
    fn sglangs_json_is_read_with_its_defaults() {
        let c = KvEventsConfig::parse(
            r#"{"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv"}"#,
        )
        .unwrap();
        assert!(c.enabled() && c.binds());
        assert_eq!(
            (c.buffer_steps, c.hwm, c.max_queue_size),
            (10_000, 100_000, 100_000)
        );
        assert!(
            !KvEventsConfig::parse(r#"{"endpoint":"tcp://10.0.0.1:5557","publisher":"zmq"}"#)
                .unwrap()
                .binds()
        );
        assert!(!KvEventsConfig::parse("{}").unwrap().enabled());
        let e = KvEventsConfig::parse(r#"{"publisher":"kafka"}"#).unwrap_err();
        assert!(e.contains("kafka"), "{e}");
        let e = KvEventsConfig::parse(r#"{"endpont":"x"}"#).unwrap_err();
        assert!(e.contains("endpont"), "{e}");
    }

    #[test]
    fn the_descriptor_is_sglangs() {
        let c = KvEventsConfig::parse(r#"{"publisher":"zmq","topic":"t"}"#).unwrap();
        let d = descriptor(&c, "tcp://0.0.0.0:40001", Some("tcp://0.0.0.0:40002"), 16).unwrap();
        assert_eq!(
            d,
            json!({"publisher": "zmq", "endpoint_host": "0.0.0.0", "endpoint_port_base": 40001,
                   "topic": "t", "block_size": 16, "dp_size": 1,
                   "replay_endpoint_port_base": 40002})
        );
        assert_eq!(descriptor(&c, "ipc:///tmp/x", None, 16), None);
        assert_eq!(tcp_host_port("tcp://[::1]:7"), Some(("[::1]".into(), 7)));
    }
}
