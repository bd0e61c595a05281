//! `rbgctl router` end to end: real router and FAKE worker processes (`bench fake-worker`, no
//! model) on loopback.

use crate::common;

use clap::Parser;
use common::wait_until;
use rbgctl::launch::{self, Launcher, Process, Spawned};
use rbgctl::router::config::{RouterArgs, RouterConfig};
use rbgctl::testkit::fake_worker;
use serde_json::{json, Value};
use std::io::Read;
use std::time::{Duration, Instant};

struct Worker {
    proc: Process,
    port: u16,
    /// Its Mooncake bootstrap server's port, with `--kv-bootstrap-port`.
    bootstrap: Option<u16>,
}

impl Worker {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn bootstrap(&self) -> u16 {
        self.bootstrap
            .expect("a worker started with a bootstrap server")
    }
}

/// The test's launcher: children log into its run directory, quoted if one fails to start.
fn launcher() -> &'static Launcher {
    common::shared_launcher()
}

/// A FAKE worker on `host:port` (port 0: the kernel chooses).
fn fake_worker_on(host: &str, port: u16, name: &str, extra: &[&str]) -> Worker {
    let extra: Vec<&str> = ["--threads", "1"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let w =
        fake_worker::spawn(launcher(), host, port, name, &extra).expect("the fake worker starts");
    Worker {
        port: w.addrs.http.port(),
        bootstrap: w.addrs.kv_bootstrap.map(|a| a.port()),
        proc: w.process,
    }
}

fn fake_worker(name: &str, extra: &[&str]) -> Worker {
    fake_worker_on("127.0.0.1", 0, name, extra)
}

struct Router {
    /// Kept so that the process lives as long as the test (stopped on drop).
    _proc: Process,
    port: u16,
}

/// The router's settings from `args`, sglang-router's flags as a user writes them, on
/// kernel-chosen ports.
fn router_config(args: &[String]) -> RouterConfig {
    #[derive(clap::Parser)]
    struct Cmd {
        #[command(flatten)]
        args: RouterArgs,
    }
    let argv = common::router_argv(&[])
        .into_iter()
        .chain(args.iter().cloned());
    Cmd::try_parse_from(argv)
        .expect("the router's flags parse")
        .args
        .resolve()
        .expect("the router's settings resolve")
}

/// A router with `args`, once `/readiness` answers as `ready` says. The flags are resolved
/// here and the router started from the settings (the launcher writes them to its config
/// file), so every test also carries the settings through the file and back.
fn router(args: &[String], ready: bool) -> Router {
    let child = launcher()
        .spawn::<launch::Router>("router", router_config(args))
        .expect("the router starts");
    let r = Router {
        port: child.addrs.http.port(),
        _proc: child.process,
    };
    await_readiness(&r, ready);
    r
}

/// A router started from `args` on its command line, with environment variables (what the
/// environment says is the router's to read); `ready: None` does not wait for `/readiness`.
fn router_with_env(
    args: &[String],
    ready: Option<bool>,
    env: &[(&str, &std::path::Path)],
) -> Router {
    let mut argv = common::router_argv(&[]);
    argv.extend(args.iter().cloned());
    let r: Spawned<rbgctl::router::Addrs> = launcher()
        .spawn_argv_with_env("router", &argv, env)
        .expect("the router starts");
    let r = Router {
        port: r.addrs.http.port(),
        _proc: r.process,
    };
    if let Some(ready) = ready {
        await_readiness(&r, ready);
    }
    r
}

fn await_readiness(r: &Router, ready: bool) {
    let want = if ready { 200 } else { 503 };
    assert!(
        wait_until(Duration::from_secs(20), || get(r.port, "/readiness").0
            == want),
        "router did not come up"
    );
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn get(port: u16, path: &str) -> (u16, String) {
    match client()
        .get(format!("http://127.0.0.1:{port}{path}"))
        .send()
    {
        Ok(r) => (r.status().as_u16(), r.text().unwrap_or_default()),
        Err(_) => (0, String::new()),
    }
}

fn post(port: u16, path: &str, body: &str) -> (u16, reqwest::header::HeaderMap, String) {
    let r = client()
        .post(format!("http://127.0.0.1:{port}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.text().unwrap())
}

fn recorded(w: &Worker) -> Vec<Value> {
    let (_, body) = get(w.port, "/fake/requests");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["requests"].as_array().unwrap().clone()
}

fn metric(port: u16, line_start: &str) -> Option<f64> {
    let (_, text) = get(port, "/metrics");
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Reads a streamed response, noting when each chunk arrived.
fn read_chunks(mut resp: reqwest::blocking::Response) -> (Vec<u8>, Vec<(Instant, usize)>) {
    let mut all = Vec::new();
    let mut arrivals = Vec::new();
    let mut buf = [0u8; 65536];
    for _ in 0..10_000 {
        match resp.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                all.extend_from_slice(&buf[..n]);
                arrivals.push((Instant::now(), n));
            }
        }
    }
    (all, arrivals)
}

#[test]
fn streams_pass_through_byte_for_byte_and_as_they_come() {
    let w = fake_worker("w1", &["--token-delay-ms", "150"]);
    let r = router(
        &s(&["--worker-urls", &w.url(), "--policy", "round_robin"]),
        true,
    );
    for (path, body) in [
        (
            "/generate",
            json!({"text": "hello", "stream": true, "sampling_params": {"max_new_tokens": 4}}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
                   "stream": true, "max_tokens": 4, "stream_options": {"include_usage": true}}),
        ),
    ] {
        let fetch = |port: u16| {
            let resp = client()
                .post(format!("http://127.0.0.1:{port}{path}"))
                .header("x-request-id", "same-id-for-both")
                .json(&body)
                .send()
                .unwrap();
            assert_eq!(resp.status(), 200);
            assert_eq!(
                resp.headers()["content-type"],
                "text/event-stream",
                "{path}"
            );
            read_chunks(resp)
        };
        let (direct, _) = fetch(w.port);
        let (routed, arrivals) = fetch(r.port);
        assert_eq!(
            String::from_utf8_lossy(&routed),
            String::from_utf8_lossy(&direct),
            "{path}: the router changed the stream"
        );
        assert!(routed.ends_with(b"data: [DONE]\n\n"));
        // Tokens are 150 ms apart at the worker; relayed as they come, the first and last
        // chunks arrive at least 3 × 150 ms apart (a buffering proxy would deliver them together).
        let spread = arrivals.last().unwrap().0 - arrivals.first().unwrap().0;
        assert!(
            spread >= Duration::from_millis(400),
            "{path}: chunks arrived together ({spread:?}): {} reads",
            arrivals.len()
        );
    }
}

#[test]
fn bodies_are_forwarded_as_sent_and_request_ids_echoed() {
    let w = fake_worker("w1", &[]);
    let r = router(&s(&["--worker-urls", &w.url()]), true);
    // Odd spacing, unknown fields, number formats serde would rewrite: all must arrive unchanged.
    let body = r#"{ "text" : "abc",  "foo_unknown": {"x": 1.50, "y": 1e3}, "sampling_params":{"max_new_tokens":2} }"#;
    let resp = client()
        .post(format!("http://127.0.0.1:{}/generate", r.port))
        .header("x-request-id", "my-req-123")
        .header("authorization", "Bearer worker-secret")
        .body(body)
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-request-id"], "my-req-123");
    let v: Value = resp.json().unwrap();
    assert_eq!(v["text"], "tok0 tok1 ");
    let reqs = recorded(&w);
    let last = reqs.last().unwrap();
    assert_eq!(last["body"], body);
    assert_eq!(last["headers"]["x-request-id"], "my-req-123");
    assert_eq!(last["headers"]["authorization"], "Bearer worker-secret");
    // Without an id header the router makes one, per endpoint.
    let (st, h, _) = post(r.port, "/v1/chat/completions", r#"{"messages":[]}"#);
    assert_eq!(st, 200);
    let id = h["x-request-id"].to_str().unwrap();
    assert!(id.starts_with("chatcmpl-") && id.len() == 33, "{id}");
    // Non-inference routes.
    let (st, body) = get(r.port, "/v1/models");
    assert_eq!(st, 200);
    assert!(
        wait_until(Duration::from_secs(10), || get(r.port, "/v1/models")
            .1
            .contains("fake-model")),
        "{body}"
    );
    let (st, body) = get(r.port, "/get_server_info");
    assert_eq!(st, 200);
    assert!(body.contains("fake_worker"), "{body}");
    assert_eq!(get(r.port, "/health"), (200, "OK".into()));
    let (st, _) = get(r.port, "/no/such/route");
    assert_eq!(st, 404);
}

#[test]
fn bad_json_is_a_clear_400() {
    let w = fake_worker("w1", &[]);
    let r = router(&s(&["--worker-urls", &w.url()]), true);
    let (st, _, body) = post(r.port, "/generate", r#"{"text": "x",}"#);
    assert_eq!(st, 400);
    let v: Value = serde_json::from_str(&body).unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("not valid JSON") && msg.contains("line 1"),
        "{msg}"
    );
    let (st, _, body) = post(r.port, "/v1/chat/completions", "[1,2]");
    assert_eq!(st, 400);
    assert!(body.contains("must be a JSON object"), "{body}");
    let (st, _, body) = post(r.port, "/generate", r#"{"stream": "yes"}"#);
    assert_eq!(st, 400);
    assert!(body.contains("stream"), "{body}");
    assert!(
        recorded(&w).is_empty(),
        "bad requests must not reach workers"
    );
    // The router is fine afterwards.
    assert_eq!(post(r.port, "/generate", r#"{"text":"ok"}"#).0, 200);
}

#[test]
fn pd_sends_the_same_body_with_bootstrap_fields_to_both_sides() {
    let p = fake_worker("prefill", &[]);
    let d = fake_worker("decode", &["--token-delay-ms", "20"]);
    let r = router(
        &s(&[
            "--pd-disaggregation",
            "--prefill",
            &p.url(),
            "8998",
            "--decode",
            &d.url(),
            "--policy",
            "round_robin",
        ]),
        true,
    );
    let resp = client()
        .post(format!("http://127.0.0.1:{}/generate", r.port))
        .body(r#"{"text":"pd please","stream":true,"sampling_params":{"max_new_tokens":3}}"#)
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-fake-worker"],
        "decode",
        "the client gets decode's answer"
    );
    let (body, _) = read_chunks(resp);
    let text = String::from_utf8(body).unwrap();
    assert_eq!(text.matches("data: ").count(), 4, "{text}");
    let (pb, db) = (recorded(&p), recorded(&d));
    assert_eq!((pb.len(), db.len()), (1, 1));
    assert_eq!(pb[0]["body"], db[0]["body"], "both sides get the same JSON");
    let sent = pb[0]["body"].as_str().unwrap();
    assert!(
        sent.starts_with(r#"{"text":"pd please","stream":true,"sampling_params":{"max_new_tokens":3},"bootstrap_host":"127.0.0.1","bootstrap_port":8998,"bootstrap_room":"#),
        "{sent}"
    );
    let v: Value = serde_json::from_str(sent).unwrap();
    assert!(v["bootstrap_room"].as_u64().unwrap() <= i64::MAX as u64);
    // A batch gets arrays, one room per item.
    let (st, _, _) = post(r.port, "/generate", r#"{"text":["a","b","c"]}"#);
    assert_eq!(st, 200);
    let v: Value = serde_json::from_str(recorded(&d)[1]["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        v["bootstrap_host"],
        json!(["127.0.0.1", "127.0.0.1", "127.0.0.1"])
    );
    assert_eq!(v["bootstrap_port"], json!([8998, 8998, 8998]));
    assert_eq!(v["bootstrap_room"].as_array().unwrap().len(), 3);
    // Chat too.
    let (st, _, _) = post(
        r.port,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"x"}]}"#,
    );
    assert_eq!(st, 200);
    assert_eq!(recorded(&p).len(), 3);

    // A dead prefill worker is a clear error at once, never a hang.
    let mut p = p;
    p.proc.kill();
    let t0 = Instant::now();
    let (st, _, body) = post(r.port, "/generate", r#"{"text":"x"}"#);
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(st, 502, "{body}");
    assert!(body.contains("prefill worker"), "{body}");
}

#[test]
fn a_worker_killed_mid_stream_ends_the_stream_with_an_error() {
    let mut w = fake_worker("w1", &["--token-delay-ms", "200", "--tokens", "50"]);
    let r = router(&s(&["--worker-urls", &w.url()]), true);
    let mut resp = client()
        .post(format!("http://127.0.0.1:{}/generate", r.port))
        .body(r#"{"text":"long","stream":true}"#)
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut first = [0u8; 4096];
    let n = resp.read(&mut first).unwrap();
    assert!(n > 0 && first.starts_with(b"data: "));
    let t0 = Instant::now();
    w.proc.kill();
    let (rest, _) = read_chunks(resp);
    assert!(t0.elapsed() < Duration::from_secs(10), "stream hung");
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.contains("closed the stream before it ended"),
        "no error event: {rest}"
    );
    assert!(!rest.contains("[DONE]"));
    assert_eq!(
        metric(r.port, "rbgctl_router_stream_errors_total"),
        Some(1.0)
    );
}

#[test]
fn retries_then_circuit_opens_half_opens_and_closes() {
    let w = fake_worker("w1", &[]);
    let r = router(
        &s(&[
            "--worker-urls",
            &w.url(),
            "--retry-max-retries",
            "2",
            "--retry-initial-backoff-ms",
            "10",
            "--cb-failure-threshold",
            "3",
            "--cb-success-threshold",
            "2",
            "--cb-timeout-duration-secs",
            "1",
        ]),
        true,
    );
    let fail = |n: u32| {
        let (st, _, _) = post(w.port, &format!("/fake/fail?count={n}&status=503"), "");
        assert_eq!(st, 200);
    };
    // One 503, then fine: the retry hides it.
    fail(1);
    let (st, _, body) = post(r.port, "/generate", r#"{"text":"a"}"#);
    assert_eq!(st, 200, "{body}");
    assert_eq!(metric(r.port, "smg_worker_retries_total"), Some(1.0));
    // Three 503s in a row: all retries fail, the client gets the worker's 503, the circuit opens.
    fail(3);
    let (st, _, body) = post(r.port, "/generate", r#"{"text":"b"}"#);
    assert_eq!(st, 503, "{body}");
    assert!(body.contains("injected failure"), "{body}");
    let cb_state = format!("smg_worker_cb_state{{worker=\"{}\"", w.url());
    assert_eq!(
        metric(r.port, &cb_state),
        Some(1.0),
        "circuit should be open"
    );
    // While open, the worker is not tried at all.
    let before = recorded(&w).len();
    let (st, _, body) = post(r.port, "/generate", r#"{"text":"c"}"#);
    assert_eq!(st, 503);
    assert!(body.contains("no available workers"), "{body}");
    assert_eq!(recorded(&w).len(), before);
    assert_eq!(get(r.port, "/readiness").0, 503);
    // After the timeout it is half-open; two successes close it.
    assert!(wait_until(Duration::from_secs(5), || metric(
        r.port, &cb_state
    ) == Some(2.0)));
    for _ in 0..2 {
        assert_eq!(post(r.port, "/generate", r#"{"text":"d"}"#).0, 200);
    }
    assert_eq!(
        metric(r.port, &cb_state),
        Some(0.0),
        "circuit should be closed"
    );
    assert!(metric(r.port, "smg_worker_retries_exhausted_total").unwrap() >= 1.0);
}

#[test]
fn a_full_queue_is_429_and_a_long_wait_408() {
    let w = fake_worker("w1", &["--token-delay-ms", "250", "--tokens", "12"]);
    let r = router(
        &s(&[
            "--worker-urls",
            &w.url(),
            "--max-concurrent-requests",
            "1",
            "--queue-size",
            "1",
            "--queue-timeout-secs",
            "1",
        ]),
        true,
    );
    let port = r.port;
    // A holds the only slot for ~3 s (its stream).
    let a = std::thread::spawn(move || {
        let resp = client()
            .post(format!("http://127.0.0.1:{port}/generate"))
            .body(r#"{"text":"a","stream":true}"#)
            .send()
            .unwrap();
        let status = resp.status().as_u16();
        read_chunks(resp);
        status
    });
    assert!(wait_until(Duration::from_secs(5), || metric(
        port,
        "rbgctl_router_running_requests"
    ) == Some(1.0)));
    // B waits in the queue ...
    let b = std::thread::spawn(move || post(port, "/generate", r#"{"text":"b"}"#).0);
    assert!(wait_until(Duration::from_secs(5), || metric(
        port,
        "rbgctl_router_queued_requests"
    ) == Some(1.0)));
    // ... so C finds the queue full.
    let (st, _, body) = post(port, "/generate", r#"{"text":"c"}"#);
    assert_eq!(st, 429, "{body}");
    // B gives up after the 1 s queue timeout, while A is still streaming.
    assert_eq!(b.join().unwrap(), 408);
    assert_eq!(a.join().unwrap(), 200);
    // Free again.
    assert_eq!(post(port, "/generate", r#"{"text":"d"}"#).0, 200);
}

#[test]
fn worker_management_and_fan_out() {
    let w1 = fake_worker("w1", &[]);
    let w2 = fake_worker("w2", &[]);
    let r = router(
        &s(&["--worker-urls", &w1.url(), "--api-key", "sekret"]),
        true,
    );
    let authed = |method: reqwest::Method, path: &str, body: Option<Value>| {
        let mut req = client()
            .request(method, format!("http://127.0.0.1:{}{path}", r.port))
            .bearer_auth("sekret");
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().unwrap();
        let st = resp.status().as_u16();
        (st, resp.text().unwrap())
    };
    // The key guards inference and admin routes, not health.
    assert_eq!(post(r.port, "/generate", r#"{"text":"x"}"#).0, 401);
    assert_eq!(get(r.port, "/workers").0, 401);
    assert_eq!(get(r.port, "/health").0, 200);
    assert_eq!(
        authed(
            reqwest::Method::POST,
            "/generate",
            Some(json!({"text": "x"}))
        )
        .0,
        200
    );

    let (st, body) = authed(
        reqwest::Method::POST,
        "/workers",
        Some(json!({"url": w2.url()})),
    );
    assert_eq!(st, 202, "{body}");
    let id = serde_json::from_str::<Value>(&body).unwrap()["worker_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, body) = authed(reqwest::Method::GET, "/workers", None);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["total"], 2);
    let (st, _) = authed(
        reqwest::Method::POST,
        "/workers",
        Some(json!({"url": w2.url()})),
    );
    assert_eq!(st, 409, "duplicate");
    let (st, body) = authed(
        reqwest::Method::POST,
        "/workers",
        Some(json!({"url": "ftp://x"})),
    );
    assert_eq!(st, 400, "{body}");
    // Fan-out: flush reaches both workers; loads come from both.
    let (st, body) = authed(reqwest::Method::POST, "/flush_cache", None);
    assert_eq!(st, 200, "{body}");
    for w in [&w1, &w2] {
        let (_, stats) = get(w.port, "/fake/stats");
        assert_eq!(serde_json::from_str::<Value>(&stats).unwrap()["flushes"], 1);
    }
    let (st, body) = authed(reqwest::Method::GET, "/get_loads", None);
    assert_eq!(st, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["workers"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // Removal: by id, then unknown ids and URLs are 404 with a clear message.
    let (st, _) = authed(reqwest::Method::DELETE, &format!("/workers/{id}"), None);
    assert_eq!(st, 202);
    let (st, body) = authed(reqwest::Method::DELETE, &format!("/workers/{id}"), None);
    assert_eq!(st, 404);
    assert!(body.contains("no worker"), "{body}");
    let (st, _) = authed(
        reqwest::Method::POST,
        "/remove_worker?url=http://127.0.0.1:1",
        None,
    );
    assert_eq!(st, 404);
    // The older API.
    let (st, body) = authed(
        reqwest::Method::POST,
        &format!("/add_worker?url={}", w2.url()),
        None,
    );
    assert_eq!(st, 200, "{body}");
    let (_, body) = authed(reqwest::Method::GET, "/list_workers", None);
    assert!(body.contains(&w2.url()));
    let (st, _) = authed(
        reqwest::Method::POST,
        &format!("/remove_worker?url={}", w2.url()),
        None,
    );
    assert_eq!(st, 200);
    assert_eq!(metric(r.port, "smg_worker_pool_size"), Some(1.0));
}

#[test]
fn health_checks_take_a_dead_worker_out_and_back() {
    let mut w1 = fake_worker("w1", &[]);
    let w2 = fake_worker("w2", &[]);
    let r = router(
        &s(&[
            "--worker-urls",
            &w1.url(),
            &w2.url(),
            "--policy",
            "round_robin",
            "--health-check-interval-secs",
            "0.2",
            "--health-failure-threshold",
            "2",
            "--health-check-timeout-secs",
            "1",
            "--disable-retries",
        ]),
        true,
    );
    let port1 = w1.port;
    w1.proc.kill();
    let health = format!("smg_worker_health{{worker=\"http://127.0.0.1:{port1}\"");
    assert!(wait_until(Duration::from_secs(10), || metric(
        r.port, &health
    ) == Some(0.0)));
    // Every request now goes to w2, with no retries needed.
    for _ in 0..6 {
        let (st, h, _) = post(r.port, "/generate", r#"{"text":"x"}"#);
        assert_eq!(st, 200);
        assert_eq!(h["x-fake-worker"], "w2");
    }
    drop(w2);
    assert!(wait_until(Duration::from_secs(10), || get(
        r.port,
        "/readiness"
    )
    .0 == 503));
}

#[test]
fn discovery_file_changes_are_picked_up() {
    let w1 = fake_worker("w1", &[]);
    let w2 = fake_worker("w2", &[]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    let write = |ports: &[u16]| {
        let instances: String = ports
            .iter()
            .map(|p| format!("      - address: 127.0.0.1\n        ports: {{http: {p}}}\n"))
            .collect();
        let text = format!(
            "group:\n  name: demo\n  size: 2\n  roles: [router, worker]\nroles:\n  worker:\n    size: {}\n    instances:\n{instances}",
            ports.len()
        );
        // Replace atomically, as a ConfigMap volume update does.
        let tmp = dir.path().join("config.yaml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
    };
    write(&[w1.port]);
    let r = router(
        &s(&[
            "--rbg-config",
            file.to_str().unwrap(),
            "--rbg-role",
            "worker",
            "--rbg-poll-secs",
            "0.1",
        ]),
        true,
    );
    let urls = || {
        let (_, body) = get(r.port, "/workers");
        let v: Value = serde_json::from_str(&body).unwrap();
        let mut u: Vec<String> = v["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["url"].as_str().unwrap().to_string())
            .collect();
        u.sort();
        u
    };
    assert_eq!(urls(), [w1.url()]);
    write(&[w2.port]);
    assert!(
        wait_until(Duration::from_secs(5), || urls() == [w2.url()]),
        "{:?}",
        urls()
    );
    let (st, h, _) = post(r.port, "/generate", r#"{"text":"x"}"#);
    assert_eq!((st, h["x-fake-worker"].to_str().unwrap()), (200, "w2"));
    write(&[w1.port, w2.port]);
    let mut both = vec![w1.url(), w2.url()];
    both.sort();
    assert!(wait_until(Duration::from_secs(5), || urls() == both));
    // A broken file changes nothing: once the router has read and refused it, the workers are
    // as before.
    let rejected =
        || metric(r.port, "rbgctl_router_discovery_file_rejected_total ").unwrap_or(-1.0);
    assert_eq!(rejected(), 0.0);
    std::fs::write(&file, "roles: [oops").unwrap();
    assert!(wait_until(Duration::from_secs(5), || rejected() >= 1.0));
    assert_eq!(urls(), both);
}

#[test]
fn cache_aware_consistent_and_prefix_hashing_keep_requests_together() {
    let w1 = fake_worker("w1", &[]);
    let w2 = fake_worker("w2", &[]);
    let r = router(&s(&["--worker-urls", &w1.url(), &w2.url()]), true);
    let mut history =
        String::from("System: you are a helpful assistant. User: tell me a long story about ");
    let mut first = None;
    for turn in 0..6 {
        history.push_str(&format!("turn {turn} and more words to make it grow; "));
        let (st, h, _) = post(r.port, "/generate", &json!({"text": history}).to_string());
        assert_eq!(st, 200);
        let who = h["x-fake-worker"].to_str().unwrap().to_string();
        let first = first.get_or_insert(who.clone());
        assert_eq!(&who, first, "turn {turn} moved");
    }
    // Consistent hashing: the routing key decides, the same key always the same worker.
    let r2 = router(
        &s(&[
            "--worker-urls",
            &w1.url(),
            &w2.url(),
            "--policy",
            "consistent_hashing",
        ]),
        true,
    );
    let send = |key: &str| {
        let resp = client()
            .post(format!("http://127.0.0.1:{}/generate", r2.port))
            .header("x-smg-routing-key", key)
            .body(r#"{"text":"x"}"#)
            .send()
            .unwrap();
        resp.headers()["x-fake-worker"]
            .to_str()
            .unwrap()
            .to_string()
    };
    let mut seen = std::collections::HashSet::new();
    for k in 0..20 {
        let key = format!("session-{k}");
        let a = send(&key);
        assert_eq!(send(&key), a);
        seen.insert(a);
    }
    assert_eq!(seen.len(), 2, "20 sessions should use both workers");
    // Prefix hash: the prompt's head decides (4 tokens here: 16 bytes of text, or 4 ids).
    let r3 = router(
        &s(&[
            "--worker-urls",
            &w1.url(),
            &w2.url(),
            "--policy",
            "prefix_hash",
            "--prefix-token-count",
            "4",
        ]),
        true,
    );
    let send = |body: Value| {
        let (st, h, _) = post(r3.port, "/generate", &body.to_string());
        assert_eq!(st, 200);
        h["x-fake-worker"].to_str().unwrap().to_string()
    };
    let mut seen = std::collections::HashSet::new();
    for k in 0..20 {
        let head = format!("document {k:04}...");
        let a = send(json!({"text": format!("{head} first question")}));
        assert_eq!(send(json!({"text": format!("{head} another one")})), a);
        seen.insert(a);
    }
    assert_eq!(seen.len(), 2, "20 heads should use both workers");
    let a = send(json!({"input_ids": [7, 8, 9, 10, 11]}));
    assert_eq!(send(json!({"input_ids": [7, 8, 9, 10, 99, 98]})), a);
}

/// A minimal stand-in for the Kubernetes API server's pod list and watch (the part the router
/// uses): list with `resourceVersion`, watch streaming line-delimited events, and the
/// `ERROR` event with code 410 that a real API server sends when a watch's version is too old.
#[test]
fn kubernetes_pods_are_listed_watched_and_relisted_after_410() {
    use rbgctl::testkit::apiserver::ApiServer;
    // Fake workers on one port, on three loopback addresses (pod IPs).
    let a = fake_worker_on("127.0.0.1", 0, "pod-a", &[]);
    let port = a.port;
    let _b = fake_worker_on("127.0.0.2", port, "pod-b", &[]);
    let _c = fake_worker_on("127.0.0.3", port, "pod-c", &[]);
    let api = ApiServer::new();
    let set_status = |name: &str, ip: &str, ready: bool| {
        let ready = if ready { "True" } else { "False" };
        let status = json!({"status": {"phase": "Running", "podIP": ip,
                            "conditions": [{"type": "Ready", "status": ready}]}});
        api.merge_patch("pods", "ns", name, true, status).unwrap();
    };
    let add_pod = |name: &str, ip: &str, ready: bool| {
        let pod = json!({"metadata": {"name": name, "labels": {"app": "w"}},
                         "spec": {"containers": [{"name": "w", "image": "w:1"}]}});
        api.create("pods", "ns", pod).unwrap();
        set_status(name, ip, ready);
    };
    add_pod("a", "127.0.0.1", true);
    // A pod without the label is never a worker.
    let other = json!({"metadata": {"name": "other", "labels": {"app": "x"}},
                       "spec": {"containers": [{"name": "w", "image": "w:1"}]}});
    api.create("pods", "ns", other).unwrap();
    let api_port = api.serve().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("config");
    std::fs::write(&kubeconfig, ApiServer::kubeconfig(api_port, "ns")).unwrap();
    let router = router_with_env(
        &s(&[
            "--service-discovery",
            "--selector",
            "app=w",
            "--service-discovery-port",
            &port.to_string(),
            "--service-discovery-namespace",
            "ns",
            "--policy",
            "round_robin",
        ]),
        None,
        &[("KUBECONFIG", kubeconfig.as_path())],
    );
    let rport = router.port;
    let urls = || {
        let (_, body) = get(rport, "/workers");
        let v: Value = serde_json::from_str(&body).unwrap_or_default();
        let mut u: Vec<String> = v["workers"]
            .as_array()
            .map(|ws| {
                ws.iter()
                    .map(|w| w["url"].as_str().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default();
        u.sort();
        u
    };
    let url = |host: &str| format!("http://{host}:{port}");
    let (a_url, b_url, c_url) = (url("127.0.0.1"), url("127.0.0.2"), url("127.0.0.3"));
    assert!(
        wait_until(Duration::from_secs(20), || urls() == [a_url.clone()]),
        "{:?}",
        urls()
    );
    assert!(wait_until(Duration::from_secs(10), || api.open_watches() > 0));
    // Pod b comes up not Ready, then pod c Ready: once the router shows c, it has seen b's
    // event too (one watch, in order), and b is no worker.
    add_pod("b", "127.0.0.2", false);
    add_pod("c", "127.0.0.3", true);
    assert!(
        wait_until(Duration::from_secs(10), || urls().contains(&c_url)),
        "{:?}",
        urls()
    );
    assert_eq!(
        urls(),
        [a_url.clone(), c_url.clone()],
        "a pod that is not Ready is no worker"
    );
    set_status("b", "127.0.0.2", true);
    assert!(wait_until(Duration::from_secs(10), || urls()
        == [a_url.clone(), b_url.clone(), c_url.clone()]));
    // All serve requests.
    let mut names = std::collections::HashSet::new();
    for _ in 0..6 {
        let (st, h, _) = post(rport, "/generate", r#"{"text":"x"}"#);
        assert_eq!(st, 200);
        names.insert(h["x-fake-worker"].to_str().unwrap().to_string());
    }
    assert_eq!(names.len(), 3);
    // The watch stalls while pod a goes away and the history is compacted; when the watch
    // breaks, the router resumes from a version that is gone (410), lists again and drops a.
    api.stall_watches();
    api.delete("pods", "ns", "a").unwrap();
    api.compact();
    let lists = || api.counts().by_verb.get("list").copied().unwrap_or(0);
    let lists_before = lists();
    api.break_watches();
    assert!(
        wait_until(Duration::from_secs(10), || urls()
            == [b_url.clone(), c_url.clone()]),
        "{:?}",
        urls()
    );
    assert!(lists() > lists_before, "no relist after 410");
}

#[test]
fn a_body_declared_above_max_payload_size_is_refused_from_its_headers() {
    let w = fake_worker("w", &[]);
    let r = router(
        &s(&["--worker-urls", &w.url(), "--max-payload-size", "1024"]),
        true,
    );
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", r.port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    use std::io::{Read, Write};
    conn.write_all(
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n{\"text\":",
    )
    .unwrap();
    let t0 = Instant::now();
    let mut answer = vec![0u8; 1024];
    let n = conn.read(&mut answer).unwrap_or(0);
    let text = String::from_utf8_lossy(&answer[..n]).to_string();
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(
        text.contains("larger than this port's limit of 1024 bytes"),
        "{text}"
    );
    // From the headers: the alternative is the body deadline (10 s).
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(recorded(&w).is_empty(), "nothing reached the worker");
}

/// Sends `head` (request line and headers, then the blank line) and `body_part` on a new
/// connection and returns it; reads nothing.
fn hold_body(port: u16, head: &str, body_part: &[u8]) -> std::net::TcpStream {
    use std::io::Write;
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(body_part).unwrap();
    conn
}

/// The status line's code of what `conn` answers (0 if nothing).
fn status_of(conn: &mut std::net::TcpStream) -> (u16, String) {
    let mut answer = vec![0u8; 4096];
    let n = conn.read(&mut answer).unwrap_or(0);
    let text = String::from_utf8_lossy(&answer[..n]).to_string();
    (common::status_code(&text), text)
}

/// Issue 40, item 6: the bodies the router receives at once are bounded all together: a body
/// that would take it past `--max-inflight-body-bytes` is answered 503 from its headers; the
/// room comes back once a body is done with. Item 5: a body that stops arriving is cut off.
#[test]
fn bodies_in_flight_are_bounded_together_and_a_withheld_body_is_cut_off() {
    let w = fake_worker("w", &[]);
    let r = router(
        &s(&[
            "--worker-urls",
            &w.url(),
            "--max-inflight-body-bytes",
            "1000000",
        ]),
        true,
    );
    let head = |n: usize| {
        format!("POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n\r\n")
    };
    // Two bodies of 600 kB announced and begun: one is held, the other (whichever the router
    // reads second) has no room and is answered 503 from its headers.
    let t0 = Instant::now();
    let held: Vec<_> = (0..2)
        .map(|_| {
            let mut conn = hold_body(r.port, &head(600_000), b"{\"text\":\"");
            std::thread::spawn(move || (status_of(&mut conn), t0.elapsed()))
        })
        .collect();
    // A small one fits beside the held one.
    let (code, _, body) = post(r.port, "/generate", r#"{"text":"hi"}"#);
    assert_eq!(code, 200, "{body}");
    let mut answers: Vec<((u16, String), Duration)> =
        held.into_iter().map(|h| h.join().unwrap()).collect();
    answers.sort_by_key(|((code, _), _)| *code);
    let [((held_code, held_text), held_at), ((refused_code, refused_text), refused_at)] =
        <[_; 2]>::try_from(answers).unwrap();
    assert_eq!(refused_code, 503, "{refused_text}");
    assert!(
        refused_text.contains("too many request bodies"),
        "{refused_text}"
    );
    assert!(
        refused_at < Duration::from_secs(5),
        "refused from its headers: {refused_at:?}"
    );
    // The held one never finishes its body: cut off by the body deadline (10 s), its room back.
    assert_eq!(held_code, 408, "{held_text}");
    assert!(held_text.contains("did not arrive within"), "{held_text}");
    assert!(
        held_at >= Duration::from_secs(9) && held_at < Duration::from_secs(20),
        "{held_at:?}"
    );
    let mut third = hold_body(r.port, &head(600_000), b"");
    use std::io::Write;
    let mut rest = format!("{{\"text\":\"{}\"}}", "a".repeat(600_000 - 11)).into_bytes();
    rest.truncate(600_000);
    third.write_all(&rest).unwrap();
    let (code, text) = status_of(&mut third);
    assert_eq!(code, 200, "{}", &text[..text.len().min(300)]);
}

/// Issue 40, item 9: with `--api-key`, what runs a generation or tells about the workers needs
/// the key; the scheme of `Authorization: Bearer` is case-insensitive.
#[test]
fn with_an_api_key_health_generate_server_info_and_engine_metrics_need_it() {
    let w = fake_worker("w", &[]);
    let r = router(
        &s(&["--worker-urls", &w.url(), "--api-key", "sekret"]),
        true,
    );
    for path in ["/health_generate", "/get_server_info", "/engine_metrics"] {
        assert_eq!(get(r.port, path).0, 401, "{path} without the key");
        let with = client()
            .get(format!("http://127.0.0.1:{}{path}", r.port))
            .header("Authorization", "bearer sekret")
            .send()
            .unwrap();
        assert_ne!(with.status().as_u16(), 401, "{path} with the key");
    }
    assert_eq!(get(r.port, "/health").0, 200, "liveness stays open");
}

fn body_of(recorded: &Value) -> Value {
    serde_json::from_str(recorded["body"].as_str().unwrap()).unwrap()
}

fn stats(w: &Worker) -> Value {
    serde_json::from_str(&get(w.port, "/fake/stats").1).unwrap_or(Value::Null)
}

/// A FAKE vLLM prefill engine with its Mooncake bootstrap server on a port the kernel chooses
/// (`Worker::bootstrap`).
fn vllm_prefill(name: &str, extra: &[&str]) -> Worker {
    vllm_prefill_on(name, 0, extra)
}

/// A FAKE vLLM prefill engine with its Mooncake bootstrap server on `bootstrap`.
fn vllm_prefill_on(name: &str, bootstrap: u16, extra: &[&str]) -> Worker {
    let b = bootstrap.to_string();
    let mut args = vec!["--engine", "vllm", "--kv-bootstrap-port", &b];
    args.extend(extra);
    fake_worker(name, &args)
}

fn vllm_decode(name: &str, extra: &[&str]) -> Worker {
    let mut args = vec!["--engine", "vllm"];
    args.extend(extra);
    fake_worker(name, &args)
}

/// A router running vLLM's prefill/decode contract over `p` (its bootstrap server on
/// `bootstrap`, when it has one) and `d`, with `extra` flags.
fn vllm_pd_router(p: &Worker, bootstrap: Option<u16>, d: &Worker, extra: &[&str]) -> Router {
    let b = bootstrap.map(|b| b.to_string());
    let mut args = vec!["--backend", "vllm", "--pd-disaggregation"];
    args.extend(extra);
    let (p_url, d_url) = (p.url(), d.url());
    args.extend(["--prefill", &p_url]);
    args.extend(b.as_deref());
    args.extend(["--decode", &d_url]);
    router(&s(&args), true)
}

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"disaggregate me"}],"max_tokens":32,"max_completion_tokens":32,"stream":true,"stream_options":{"include_usage":true},"min_tokens":2,"temperature":0.70}"#;

/// What the prefill leg must look like whatever the connector.
fn check_prefill_leg(v: &Value) {
    assert_eq!(v["max_tokens"], 1, "{v}");
    assert_eq!(v["max_completion_tokens"], 1, "{v}");
    assert_eq!(v["stream"], false, "{v}");
    assert_eq!(v["n"], 1, "{v}");
    for gone in ["stream_options", "min_tokens"] {
        assert!(v.get(gone).is_none(), "{gone}: {v}");
    }
    assert_eq!(v["messages"][0]["content"], "disaggregate me");
}

#[test]
fn vllm_pd_over_nixl_relays_the_prefill_answers_transfer_parameters() {
    let p = vllm_prefill("nixl-p", &[]);
    let d = vllm_decode("nixl-d", &[]);
    let r = vllm_pd_router(&p, None, &d, &["--vllm-kv-connector", "nixl"]);
    let resp = client()
        .post(format!("http://127.0.0.1:{}/v1/chat/completions", r.port))
        .body(CHAT)
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-fake-worker"], "nixl-d");
    let (body, _) = read_chunks(resp);
    assert!(String::from_utf8_lossy(&body).contains("[DONE]"));
    let (pb, db) = (recorded(&p), recorded(&d));
    assert_eq!((pb.len(), db.len()), (1, 1));
    let pv = body_of(&pb[0]);
    check_prefill_leg(&pv);
    assert_eq!(
        pv["kv_transfer_params"],
        json!({"do_remote_decode": true, "do_remote_prefill": false})
    );
    let dv = body_of(&db[0]);
    assert_eq!(dv["stream"], true, "decode gets the request as sent");
    assert_eq!(dv["max_tokens"], 32);
    assert_eq!(dv["stream_options"], json!({"include_usage": true}));
    assert_eq!(
        dv["kv_transfer_params"]["remote_engine_id"],
        "nixl-p-engine"
    );
    assert_eq!(
        dv["kv_transfer_params"]["remote_block_ids"],
        json!([0, 1, 2])
    );
    // vLLM has no /generate; n > 1 would silently recompute: both refused and counted.
    let (st, _, b) = post(r.port, "/generate", r#"{"text":"x"}"#);
    assert_eq!(st, 400, "{b}");
    let (st, _, b) = post(r.port, "/v1/completions", r#"{"prompt":"x","n":2}"#);
    assert_eq!(st, 400, "{b}");
    assert!(b.contains("n = 2"), "{b}");
    assert_eq!(
        metric(r.port, "rbgctl_router_vllm_pd_n_refused_total"),
        Some(1.0)
    );
    assert_eq!(recorded(&p).len(), 1, "nothing sent for refused requests");
}

#[test]
fn vllm_pd_over_mooncake_sends_one_transfer_id_with_the_engine_concurrently_or_in_turn() {
    for legs in ["concurrent", "sequential"] {
        // Prefill answers after 600 ms: concurrent legs reach decode before that.
        let p = vllm_prefill(&format!("mc-p-{legs}"), &["--headers-delay-ms", "600"]);
        let bootstrap = p.bootstrap();
        let d = vllm_decode(&format!("mc-d-{legs}"), &[]);
        let r = vllm_pd_router(&p, Some(bootstrap), &d, &["--vllm-pd-legs", legs]);
        let (st, h, _) = post(r.port, "/v1/chat/completions", CHAT);
        assert_eq!(st, 200, "{legs}");
        assert_eq!(h["x-fake-worker"], format!("mc-d-{legs}"));
        // When each leg arrived, as the workers recorded it: prefill cannot answer before
        // 600 ms after its request came.
        let at = |w: &Worker| recorded(w)[0]["received_us"].as_u64().unwrap();
        let (prefill_at, decode_at) = (at(&p), at(&d));
        let answer_at = prefill_at + 600_000;
        match legs {
            "concurrent" => assert!(
                decode_at < answer_at,
                "decode was sent beside prefill: it came {} µs after prefill",
                decode_at as i64 - prefill_at as i64
            ),
            _ => assert!(
                decode_at >= answer_at,
                "decode waits for the prefill answer: it came {} µs after prefill",
                decode_at as i64 - prefill_at as i64
            ),
        }
        let (pv, dv) = (body_of(&recorded(&p)[0]), body_of(&recorded(&d)[0]));
        check_prefill_leg(&pv);
        let id = pv["kv_transfer_params"]["transfer_id"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(id.starts_with("xfer-"), "{id}");
        assert_eq!(
            pv["kv_transfer_params"],
            json!({"do_remote_decode": true, "do_remote_prefill": false, "transfer_id": id})
        );
        assert_eq!(
            dv["kv_transfer_params"],
            json!({"do_remote_decode": false, "do_remote_prefill": true, "transfer_id": id,
                   "remote_engine_id": format!("mc-p-{legs}-engine"),
                   "remote_bootstrap_addr": format!("http://127.0.0.1:{bootstrap}")})
        );
        assert_eq!(dv["stream"], true);
        assert_eq!(stats(&d)["cancelled"], 0, "a whole answer is not a cancel");
    }
}

#[test]
fn a_failing_vllm_leg_cancels_the_other_at_once() {
    // Prefill fails after 300 ms while decode would hold its answer for 5 s: and the reverse.
    // (300 ms: the other leg's request is in flight when the failure comes.)
    for failing in ["prefill", "decode"] {
        let slow = ["--headers-delay-ms", "5000"];
        let soon = ["--headers-delay-ms", "300"];
        let (p, d) = if failing == "prefill" {
            (vllm_prefill("cx-p1", &soon), vllm_decode("cx-d1", &slow))
        } else {
            (vllm_prefill("cx-p2", &slow), vllm_decode("cx-d2", &soon))
        };
        let r = vllm_pd_router(&p, Some(p.bootstrap()), &d, &["--retry-max-retries", "0"]);
        let bad = if failing == "prefill" { &p } else { &d };
        let other = if failing == "prefill" { &d } else { &p };
        let (st, _) = {
            let r = client()
                .post(format!(
                    "http://127.0.0.1:{}/fake/fail?count=1&status=500",
                    bad.port
                ))
                .send()
                .unwrap();
            (r.status().as_u16(), ())
        };
        assert_eq!(st, 200);
        let t0 = Instant::now();
        let (st, _, body) = post(
            r.port,
            "/v1/completions",
            r#"{"prompt":"x","max_tokens":4}"#,
        );
        let took = t0.elapsed();
        assert_eq!(st, 500, "{failing}: {body}");
        assert!(
            took < Duration::from_secs(2),
            "{failing}: answered after {took:?}"
        );
        assert!(
            wait_until(Duration::from_secs(3), || stats(other)["cancelled"] == 1),
            "{failing} failed: the other leg was not cancelled: {}",
            stats(other)
        );
        assert_eq!(
            metric(r.port, "rbgctl_router_vllm_pd_legs_cancelled_total"),
            Some(1.0)
        );
    }
}

#[test]
fn a_prefill_failing_after_the_decode_answer_began_cuts_that_answer() {
    // Concurrent Mooncake legs: decode streams at once (a token every 400 ms), prefill fails
    // after 300 ms. The client has had decode's headers; its stream ends with an error event
    // and the decode request is cancelled.
    let p = vllm_prefill("cut-p", &["--headers-delay-ms", "300"]);
    let d = vllm_decode("cut-d", &["--token-delay-ms", "400"]);
    let r = vllm_pd_router(&p, Some(p.bootstrap()), &d, &["--retry-max-retries", "0"]);
    let failing = client()
        .post(format!(
            "http://127.0.0.1:{}/fake/fail?count=1&status=500",
            p.port
        ))
        .send()
        .unwrap();
    assert_eq!(failing.status(), 200);
    let t0 = Instant::now();
    let resp = client()
        .post(format!("http://127.0.0.1:{}/v1/chat/completions", r.port))
        .header("content-type", "application/json")
        .body(CHAT)
        .send()
        .unwrap();
    assert_eq!(
        resp.status(),
        200,
        "decode's answer began before prefill failed"
    );
    let (body, _) = read_chunks(resp);
    let took = t0.elapsed();
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("prefill_server_error"), "{text}");
    assert!(!text.contains("[DONE]"), "the answer was cut: {text}");
    assert!(took < Duration::from_secs(3), "cut after {took:?}");
    assert!(
        wait_until(Duration::from_secs(3), || stats(&d)["cancelled"] == 1),
        "the decode request was not cancelled: {}",
        stats(&d)
    );
    assert_eq!(
        metric(r.port, "rbgctl_router_vllm_pd_legs_cancelled_total"),
        Some(1.0)
    );
}

#[test]
fn a_mooncake_prefill_whose_bootstrap_is_not_up_is_503_until_it_answers() {
    let p = vllm_prefill("late-p", &["--kv-bootstrap-ready-after-ms", "1500"]);
    let bootstrap = p.bootstrap();
    let d = vllm_decode("late-d", &[]);
    let r = vllm_pd_router(&p, Some(bootstrap), &d, &[]);
    let (st, _, body) = post(r.port, "/v1/completions", r#"{"prompt":"x"}"#);
    assert_eq!(st, 503, "{body}");
    assert!(
        body.contains(&format!("127.0.0.1:{bootstrap}/query")),
        "{body}"
    );
    assert!(
        recorded(&p).is_empty() && recorded(&d).is_empty(),
        "nothing sent without the engine"
    );
    assert!(wait_until(Duration::from_secs(10), || {
        post(r.port, "/v1/completions", r#"{"prompt":"x"}"#).0 == 200
    }));
    assert!(metric(r.port, "rbgctl_router_vllm_kv_transfer_failures_total").unwrap_or(0.0) >= 1.0);
}

/// Seed 003's two gateway lines, run as the YAML lists them (each list item one argument,
/// the program named `smg`), with the workers' addresses in place of the cluster's names.
/// Both listen on port 8000, as the seed's do, one after the other.
#[test]
fn seed_003s_gateway_lines_start_the_router_as_written() {
    let bin = launcher().dir().join("seed-003-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let smg = bin.join("smg");
    let _ = std::fs::remove_file(&smg);
    std::os::unix::fs::symlink(common::BIN, &smg).unwrap();
    let smg = Launcher::with_exe(smg, rbgctl::launch::Logs::File).unwrap();
    let up = |name: &str, argv: &[String]| {
        let r: Spawned<rbgctl::router::Addrs> = smg.spawn_argv(name, argv).expect("smg starts");
        assert_eq!(r.addrs.http.port(), 8000, "the seed's port");
        assert!(wait_until(Duration::from_secs(20), || get(
            8000,
            "/readiness"
        )
        .0 == 200));
        r.process
    };
    // sglang-mooncake-smg-v2: `- --prefill http://…:8000` is one argument.
    let (p, d) = (fake_worker("seed-p", &[]), fake_worker("seed-d", &[]));
    let line = [
        "--pd-disaggregation".to_string(),
        format!("--prefill {}", p.url()),
        format!("--decode {}", d.url()),
        "--host 0.0.0.0".into(),
        "--port 8000".into(),
    ];
    let mut router = up("smg-sglang", &line);
    let (st, h, _) = post(
        8000,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(st, 200);
    assert_eq!(h["x-fake-worker"], "seed-d");
    assert!(body_of(&recorded(&p)[0])["bootstrap_room"].is_u64());
    router.stop();
    // vllm-pd-with-mooncake-demo: vLLM's proxy flags, hosts with `http://`, no port given.
    let (vp, vd) = (
        vllm_prefill_on("seed-vp", 8998, &[]),
        vllm_decode("seed-vd", &[]),
    );
    let line = s(&[
        "--prefiller-host",
        "http://127.0.0.1",
        "--prefiller-port",
        &vp.port.to_string(),
        "--decoder-host",
        "http://127.0.0.1",
        "--decoder-port",
        &vd.port.to_string(),
    ]);
    let _router = up("smg-vllm", &line);
    let (st, h, b) = post(8000, "/v1/completions", r#"{"prompt":"hi","max_tokens":4}"#);
    assert_eq!(st, 200, "{b}");
    assert_eq!(h["x-fake-worker"], "seed-vd");
    let kv = &body_of(&recorded(&vd)[0])["kv_transfer_params"];
    assert_eq!(kv["remote_engine_id"], "seed-vp-engine");
    assert_eq!(kv["remote_bootstrap_addr"], "http://127.0.0.1:8998");
}

fn workers(port: u16) -> Vec<Value> {
    serde_json::from_str::<Value>(&get(port, "/workers").1)
        .ok()
        .and_then(|v| v["workers"].as_array().cloned())
        .unwrap_or_default()
}

#[test]
fn vllm_engines_are_recognised_per_worker_and_registered_with_their_connector() {
    // No --backend: the router asks each worker's /v1/models and finds vLLM.
    let p = vllm_prefill("det-p", &[]);
    let bootstrap = p.bootstrap();
    let d = vllm_decode("det-d", &[]);
    let r = router(
        &s(&[
            "--pd-disaggregation",
            "--prefill",
            &p.url(),
            &bootstrap.to_string(),
            "--decode",
            &d.url(),
        ]),
        true,
    );
    assert!(
        wait_until(Duration::from_secs(15), || {
            let ws = workers(r.port);
            ws.len() == 2 && ws.iter().all(|w| w["engine"] == "vllm")
        }),
        "{:?}",
        workers(r.port)
    );
    let (st, _, b) = post(
        r.port,
        "/v1/completions",
        r#"{"prompt":"x","max_tokens":3}"#,
    );
    assert_eq!(st, 200, "{b}");
    let kv = &body_of(&recorded(&d)[0])["kv_transfer_params"];
    assert_eq!(kv["remote_engine_id"], "det-p-engine", "{kv}");

    // Registered through the API with SMG's fields: NIXL for this pair, by worker.
    let (p2, d2) = (vllm_prefill("reg-p", &[]), vllm_decode("reg-d", &[]));
    let r2 = router(&s(&["--pd-disaggregation", "--backend", "vllm"]), false);
    let reg = |body: Value| {
        let resp = client()
            .post(format!("http://127.0.0.1:{}/workers", r2.port))
            .json(&body)
            .send()
            .unwrap();
        (resp.status().as_u16(), resp.text().unwrap())
    };
    let (st, b) =
        reg(json!({"url": p2.url(), "worker_type": "prefill", "kv_connector": "NixlConnector"}));
    assert_eq!(st, 202, "{b}");
    let (st, b) =
        reg(json!({"url": d2.url(), "worker_type": "decode", "kv_connector": "NixlConnector"}));
    assert_eq!(st, 202, "{b}");
    let (st, b) = reg(
        json!({"url": "http://127.0.0.1:9", "worker_type": "prefill",
                             "kv_connector": "LMCacheConnectorV1"}),
    );
    assert_eq!(st, 400, "{b}");
    assert!(b.contains("LMCacheConnectorV1"), "{b}");
    assert!(wait_until(Duration::from_secs(15), || get(
        r2.port,
        "/readiness"
    )
    .0 == 200));
    let (st, _, b) = post(
        r2.port,
        "/v1/completions",
        r#"{"prompt":"x","max_tokens":3}"#,
    );
    assert_eq!(st, 200, "{b}");
    assert_eq!(
        body_of(&recorded(&p2)[0])["kv_transfer_params"],
        json!({"do_remote_decode": true, "do_remote_prefill": false}),
        "NIXL by registration, though the router's default is Mooncake"
    );
    assert_eq!(
        body_of(&recorded(&d2)[0])["kv_transfer_params"]["remote_engine_id"],
        "reg-p-engine"
    );
}

#[test]
fn sglang_router_flags_that_need_services_not_here_are_refused_by_name() {
    for (argv, says) in [
        (
            vec!["router", "--redis-url", "redis://cache:6379"],
            "--redis-url: rbgctl keeps no conversation history",
        ),
        (vec!["router", "--mini-lb"], "--mini-lb:"),
        (
            vec!["router", "--chat-template", "chatml"],
            "--chat-template: rbgctl reads only a local tokenizer.json",
        ),
    ] {
        let out = std::process::Command::new(common::BIN)
            .args(&argv)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{argv:?}: {err}");
        assert!(err.contains(says), "{argv:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
}

#[test]
fn cors_answers_the_listed_origins_or_any_when_none_is_listed() {
    let w = fake_worker("cors-w", &[]);
    let listed = router(
        &s(&[
            "--worker-urls",
            &w.url(),
            "--cors-allowed-origins",
            "https://ui.example.com",
        ]),
        true,
    );
    let any = router(&s(&["--worker-urls", &w.url()]), true);
    let call = |port: u16, origin: &str| {
        client()
            .post(format!("http://127.0.0.1:{port}/v1/completions"))
            .header("origin", origin)
            .header("content-type", "application/json")
            .body(r#"{"prompt":"x","max_tokens":2}"#)
            .send()
            .unwrap()
    };
    let r = call(listed.port, "https://ui.example.com");
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://ui.example.com"
    );
    let r = call(listed.port, "https://elsewhere.example");
    assert_eq!(
        r.status(),
        200,
        "CORS is the browser's check; the request is served"
    );
    assert!(r.headers().get("access-control-allow-origin").is_none());
    let pre = client()
        .request(
            reqwest::Method::OPTIONS,
            format!("http://127.0.0.1:{}/v1/chat/completions", listed.port),
        )
        .header("origin", "https://ui.example.com")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "content-type,authorization",
        )
        .send()
        .unwrap();
    assert!(pre.status().is_success(), "{}", pre.status());
    assert_eq!(
        pre.headers()["access-control-allow-origin"],
        "https://ui.example.com"
    );
    assert!(pre.headers().contains_key("access-control-allow-methods"));
    assert_eq!(
        call(any.port, "https://anyone.example").headers()["access-control-allow-origin"],
        "*"
    );
}

#[test]
fn sigterm_lets_requests_in_flight_finish_within_the_grace_period() {
    use nix::sys::signal::Signal;
    // 8 tokens 250 ms apart: a 2 s stream, begun before the SIGTERM, ends whole.
    let w = fake_worker("grace-w", &["--token-delay-ms", "250"]);
    let mut r = router(
        &s(&[
            "--worker-urls",
            &w.url(),
            "--shutdown-grace-period-secs",
            "20",
        ]),
        true,
    );
    let port = r.port;
    let resp = client()
        .post(format!("http://127.0.0.1:{port}/generate"))
        .body(r#"{"text":"x","stream":true,"sampling_params":{"max_new_tokens":8}}"#)
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200);
    // The answer's headers are in: the 2 s stream is under way when the SIGTERM comes.
    let reader = std::thread::spawn(move || read_chunks(resp).0);
    let exited = std::thread::spawn(move || {
        let st = r
            ._proc
            .signal_exits_within(Signal::SIGTERM, Duration::from_secs(30));
        (st, Instant::now())
    });
    let body = String::from_utf8(reader.join().unwrap()).unwrap();
    let streamed_until = Instant::now();
    assert!(body.contains("[DONE]"), "the stream was cut: {body}");
    let (st, at) = exited.join().unwrap();
    assert!(st.is_some_and(|s| s.success()), "{st:?}");
    assert!(
        at >= streamed_until - Duration::from_millis(50),
        "exited before the stream ended"
    );

    // A grace shorter than the stream: the router goes when it ends, not with the stream.
    let slow = fake_worker("grace-slow", &["--token-delay-ms", "1000"]);
    let mut r = router(
        &s(&[
            "--worker-urls",
            &slow.url(),
            "--shutdown-grace-period-secs",
            "0.5",
        ]),
        true,
    );
    let resp = client()
        .post(format!("http://127.0.0.1:{}/generate", r.port))
        .body(r#"{"text":"x","stream":true,"sampling_params":{"max_new_tokens":30}}"#)
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200);
    let t0 = Instant::now();
    let st = r
        ._proc
        .signal_exits_within(Signal::SIGTERM, Duration::from_secs(20));
    assert!(st.is_some(), "the router did not exit");
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?} for a 0.5 s grace",
        t0.elapsed()
    );
    drop(resp);
}

#[test]
fn workers_that_never_answer_at_start_stop_the_router_after_the_startup_timeout() {
    // Bound but not listening: connections are refused, and no other process can take the
    // port while the test holds it.
    let held = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    held.bind(
        &"127.0.0.1:0"
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )
    .unwrap();
    let port = held.local_addr().unwrap().as_socket().unwrap().port();
    let dead = format!("http://127.0.0.1:{port}");
    let live = fake_worker("startup-live", &[]);
    let mut r = router_with_env(
        &s(&[
            "--worker-urls",
            &live.url(),
            &dead,
            "--worker-startup-timeout-secs",
            "1",
            "--worker-startup-check-interval",
            "0.2",
        ]),
        None,
        &[],
    );
    let mut status = None;
    assert!(
        wait_until(Duration::from_secs(10), || {
            status = r._proc.exited();
            status.is_some()
        }),
        "the router kept running"
    );
    assert!(!status.unwrap().success());
    let log = r._proc.log();
    assert!(
        log.contains("--worker-startup-timeout-secs") && log.contains(&dead),
        "{log}"
    );
    assert!(
        !log.contains(&format!("{}, ", live.url())),
        "only the silent worker is named: {log}"
    );
    // Workers that answer: the router stays (readiness also says so).
    let ok = router(
        &s(&[
            "--worker-urls",
            &live.url(),
            "--worker-startup-timeout-secs",
            "1",
            "--worker-startup-check-interval",
            "0.2",
        ]),
        true,
    );
    // Its startup check passed (it says so once every worker given at start answered), and
    // past it, it serves on.
    assert!(
        wait_until(Duration::from_secs(20), || ok
            ._proc
            .log()
            .contains("the workers given at start answer")),
        "the startup check did not pass: {}",
        ok._proc.log()
    );
    assert_eq!(
        get(ok.port, "/readiness").0,
        200,
        "still serving past the startup check"
    );
}

#[test]
fn duration_histograms_take_the_buckets_given() {
    let w = fake_worker("buckets-w", &[]);
    let r = router(
        &s(&[
            "--worker-urls",
            &w.url(),
            "--prometheus-duration-buckets",
            "0.002",
            "0.75",
            "30",
        ]),
        true,
    );
    assert_eq!(post(r.port, "/v1/completions", r#"{"prompt":"x"}"#).0, 200);
    let (_, text) = get(r.port, "/metrics");
    // The router's and the HTTP layer's histograms both take them.
    for family in [
        "smg_router_request_duration_seconds_bucket{",
        "smg_http_request_duration_seconds_bucket{method=\"POST\"",
    ] {
        let les: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(family) && l.contains("completions"))
            .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(les, ["0.002", "0.75", "30", "+Inf"], "{family}: {text}");
    }
    let out = std::process::Command::new(common::BIN)
        .args(["router", "--prometheus-duration-buckets", "1", "0.5"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("prometheus_duration_buckets") && err.contains("increasing"),
        "{err}"
    );
}

#[test]
fn a_request_rate_limit_admits_its_burst_then_turns_away_or_queues() {
    let w = fake_worker("rate-w", &[]);
    // 0.5 per second, burst 2, no queue: of 4 quick requests, 2 pass and 2 get 429.
    let r = router(
        &s(&[
            "--worker-urls",
            &w.url(),
            "--rate-limit-tokens-per-second",
            "0.5",
            "--max-concurrent-requests",
            "2",
            "--queue-size",
            "0",
        ]),
        true,
    );
    let codes: Vec<u16> = (0..4)
        .map(|_| post(r.port, "/v1/completions", r#"{"prompt":"x"}"#).0)
        .collect();
    assert_eq!(codes, [200, 200, 429, 429]);
    // With a queue, the third waits for its token (2 s at 0.5/s) and is served.
    let q = router(
        &s(&[
            "--worker-urls",
            &w.url(),
            "--rate-limit-tokens-per-second",
            "0.5",
            "--max-concurrent-requests",
            "2",
            "--queue-size",
            "4",
            "--queue-timeout-secs",
            "10",
        ]),
        true,
    );
    let codes: Vec<u16> = (0..3)
        .map(|_| post(q.port, "/v1/completions", r#"{"prompt":"x"}"#).0)
        .collect();
    assert_eq!(codes, [200, 200, 200]);
}

#[test]
fn log_dir_gets_the_log_as_plain_text() {
    let dir = tempfile::tempdir().unwrap();
    let w = fake_worker("logdir-w", &[]);
    let logs = dir.path().join("logs");
    let r = router(
        &s(&[
            "--worker-urls",
            &w.url(),
            "--log-dir",
            logs.to_str().unwrap(),
        ]),
        true,
    );
    assert_eq!(post(r.port, "/v1/completions", r#"{"prompt":"x"}"#).0, 200);
    let text = || {
        std::fs::read_dir(&logs)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("rbgctl-router.")
            })
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect::<String>()
    };
    assert!(
        wait_until(Duration::from_secs(5), || text()
            .contains("router listening")),
        "{}",
        text()
    );
    assert!(!text().contains('\u{1b}'), "no terminal colours in files");
}

#[test]
fn control_plane_keys_guard_worker_management_by_role() {
    let w = fake_worker("cp-w", &[]);
    let extra = fake_worker("cp-extra", &[]);
    let r = router(
        &s(&[
            "--worker-urls",
            &w.url(),
            "--api-key",
            "inference-key",
            "--control-plane-api-keys",
            "ops:Operations:admin:adm-key",
            "dash:Dashboard:user:ro-key",
        ]),
        true,
    );
    let call = |method: reqwest::Method, path: &str, key: Option<&str>, body: Option<Value>| {
        let mut req = client().request(method, format!("http://127.0.0.1:{}{path}", r.port));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        req.send().unwrap().status().as_u16()
    };
    use reqwest::Method;
    let add = || Some(json!({"url": extra.url()}));
    assert_eq!(call(Method::GET, "/workers", None, None), 401);
    assert_eq!(
        call(Method::GET, "/workers", Some("inference-key"), None),
        401,
        "not a control key"
    );
    assert_eq!(
        call(Method::GET, "/workers", Some("ro-key"), None),
        200,
        "a user may read"
    );
    assert_eq!(
        call(Method::POST, "/workers", Some("ro-key"), add()),
        403,
        "but not change"
    );
    assert_eq!(call(Method::POST, "/workers", Some("adm-key"), add()), 202);
    assert_eq!(
        call(
            Method::POST,
            "/v1/completions",
            Some("adm-key"),
            Some(json!({"prompt": "x"}))
        ),
        401,
        "inference takes --api-key"
    );
    assert_eq!(
        call(
            Method::POST,
            "/v1/completions",
            Some("inference-key"),
            Some(json!({"prompt": "x"}))
        ),
        200
    );
    let out = std::process::Command::new(common::BIN)
        .args(["router", "--control-plane-api-keys", "k:n:root:secret"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("control_plane_api_keys") && !err.contains("secret"),
        "{err}"
    );
}

#[test]
fn manual_policy_pins_routing_keys_and_spreads_new_ones_by_group() {
    let (w1, w2) = (fake_worker("man-1", &[]), fake_worker("man-2", &[]));
    let r = router(
        &s(&[
            "--worker-urls",
            &w1.url(),
            &w2.url(),
            "--policy",
            "manual",
            "--assignment-mode",
            "min_group",
            "--max-idle-secs",
            "600",
        ]),
        true,
    );
    let served_by = |key: &str| {
        let resp = client()
            .post(format!("http://127.0.0.1:{}/v1/completions", r.port))
            .header("x-smg-routing-key", key)
            .body(r#"{"prompt":"x"}"#)
            .send()
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.headers()["x-fake-worker"]
            .to_str()
            .unwrap()
            .to_string()
    };
    let a: Vec<String> = (0..5).map(|_| served_by("user-a")).collect();
    assert!(a.iter().all(|w| *w == a[0]), "a key sticks: {a:?}");
    let b = served_by("user-b");
    assert_ne!(
        b, a[0],
        "min_group gives a new key the worker with fewer keys"
    );
    assert!((0..3).all(|_| served_by("user-b") == b));
}

#[test]
fn embeddings_rerank_score_and_responses_pass_through_and_models_and_engine_metrics_answer() {
    let (w1, w2) = (fake_worker("rt-1", &[]), fake_worker("rt-2", &[]));
    let r = router(
        &s(&[
            "--worker-urls",
            &w1.url(),
            &w2.url(),
            "--policy",
            "round_robin",
        ]),
        true,
    );
    for (path, body, field) in [
        (
            "/v1/embeddings",
            r#"{"model":"fake-model","input":["a b","c"]}"#,
            "data",
        ),
        (
            "/v1/rerank",
            r#"{"query":"q","documents":["x","y"]}"#,
            "results",
        ),
        ("/v1/score", r#"{"query":"q","items":["x"]}"#, "scores"),
        (
            "/v1/responses",
            r#"{"model":"fake-model","input":"hello"}"#,
            "output_text",
        ),
    ] {
        let (st, _, text) = post(r.port, path, body);
        assert_eq!(st, 200, "{path}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(v.get(field).is_some(), "{path}: {v}");
        let sent: Vec<Value> = [&w1, &w2]
            .iter()
            .flat_map(|w| recorded(w))
            .filter(|x| x["path"] == path)
            .collect();
        assert_eq!(sent.len(), 1, "{path}");
        assert_eq!(sent[0]["body"], body, "{path}: passed through as sent");
    }
    // The models the workers serve, one by one.
    assert!(wait_until(Duration::from_secs(10), || get(
        r.port,
        "/v1/models/fake-model"
    )
    .0 == 200));
    let (st, body) = get(r.port, "/v1/models/other");
    assert_eq!(st, 404, "{body}");
    // Workers' metrics, each sample labelled with its worker.
    let (st, text) = get(r.port, "/engine_metrics");
    assert_eq!(st, 200);
    for w in [&w1, &w2] {
        assert!(
            text.contains(&format!(
                "fake_worker_requests_total{{worker=\"{}\"}}",
                w.url()
            )),
            "{text}"
        );
    }
    assert_eq!(
        text.matches("# TYPE fake_worker_requests_total").count(),
        1,
        "{text}"
    );
    // A PD router says these are not its routes.
    let pd = router(
        &s(&[
            "--pd-disaggregation",
            "--prefill",
            &w1.url(),
            "--decode",
            &w2.url(),
        ]),
        true,
    );
    let (st, _, body) = post(pd.port, "/v1/embeddings", r#"{"input":"x"}"#);
    assert_eq!(st, 501, "{body}");
}

#[test]
fn metrics_carry_smg_label_sets_and_families() {
    let (w1, w2) = (fake_worker("m-1", &[]), fake_worker("m-2", &[]));
    let r = router(
        &s(&[
            "--worker-urls",
            &w1.url(),
            &w2.url(),
            "--policy",
            "round_robin",
        ]),
        true,
    );
    for body in [
        r#"{"model":"m-a","prompt":"x"}"#,
        r#"{"model":"m-a","prompt":"y"}"#,
        r#"{"prompt":"z"}"#,
    ] {
        assert_eq!(post(r.port, "/v1/completions", body).0, 200);
    }
    let (_, text) = get(r.port, "/metrics");
    let has = |line: &str| text.lines().any(|l| l == line);
    assert!(
        has(
            r#"smg_router_requests_total{router_type="http",backend_type="http",connection_mode="http",model="m-a",endpoint="completions",streaming="false"} 2"#
        ),
        "{text}"
    );
    assert!(
        has(
            r#"smg_router_requests_total{router_type="http",backend_type="http",connection_mode="http",model="unknown",endpoint="completions",streaming="false"} 1"#
        ),
        "{text}"
    );
    assert!(
        has(r#"smg_router_upstream_responses_total{status_code="200"} 3"#),
        "{text}"
    );
    let selected: f64 = [&w1, &w2]
        .iter()
        .filter_map(|w| metric(r.port, &format!("smg_worker_selection_total{{worker=\"{}\",worker_type=\"regular\",policy=\"round_robin\"}}", w.url())))
        .sum();
    assert_eq!(selected, 3.0, "{text}");
    assert!(text.contains("smg_worker_cb_outcomes_total{"), "{text}");
    // The HTTP layer: routes by pattern, responses by status and error code, connections.
    assert_eq!(post(r.port, "/v1/completions", "{not json").0, 400);
    assert_eq!(get(r.port, "/workers/no-such-worker").0, 404);
    assert_eq!(get(r.port, "/no/such/route").0, 404);
    let (_, text) = get(r.port, "/metrics");
    let has = |line: &str| text.lines().any(|l| l == line);
    assert!(
        has(r#"smg_http_requests_total{method="POST",path="/v1/completions"} 4"#),
        "{text}"
    );
    assert!(
        has(r#"smg_http_requests_total{method="GET",path="/workers/{id}"} 1"#),
        "{text}"
    );
    assert!(
        has(r#"smg_http_request_duration_seconds_count{method="POST",path="/v1/completions"} 4"#),
        "{text}"
    );
    // Successes carry no error code (readiness checks and scrapes count too).
    assert!(
        text.contains(r#"smg_http_responses_total{status_code="200",error_code=""} "#),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with(r#"smg_http_responses_total{status_code="400",error_code=""#)),
        "{text}"
    );
    assert!(
        has(r#"smg_http_responses_total{status_code="404",error_code="not_found"} 2"#),
        "{text}"
    );
    let open = metric(r.port, "smg_http_connections_active").unwrap_or(0.0);
    assert!(open >= 1.0, "the scrape's own connection is open: {open}");
}

#[test]
fn bucket_policy_sorts_requests_by_length_and_follows_the_lengths_seen() {
    let (w1, w2) = (fake_worker("bkt-1", &[]), fake_worker("bkt-2", &[]));
    let r = router(
        &s(&[
            "--worker-urls",
            &w1.url(),
            &w2.url(),
            "--policy",
            "bucket",
            "--bucket-adjust-interval-secs",
            "1",
            // Imbalance never overrides the buckets here: only lengths decide.
            "--balance-abs-threshold",
            "100000000",
        ]),
        true,
    );
    let served_by = |chars: usize| {
        let body = json!({ "prompt": "x".repeat(chars) }).to_string();
        let (status, headers, _) = post(r.port, "/v1/completions", &body);
        assert_eq!(status, 200);
        headers["x-fake-worker"].to_str().unwrap().to_string()
    };
    // Before any traffic the buckets split 0..4096 evenly: 100 and 3000 characters differ.
    let short = served_by(100);
    let long = served_by(3000);
    assert_ne!(short, long, "a short and a long prompt share a bucket");
    assert!((0..3).all(|_| served_by(100) == short));
    // Traffic of 100-char prompts and a few of 10 000: half the characters are in the long
    // ones, so within an interval the boundary moves up to them and 3000 becomes short.
    let moved = wait_until(Duration::from_secs(10), || {
        for _ in 0..10 {
            served_by(100);
        }
        served_by(10_000);
        served_by(3000) == short
    });
    assert!(moved, "the boundary never followed the lengths");
    assert_eq!(served_by(10_000), long);
}

#[test]
fn dp_aware_routes_to_every_rank_with_its_data_parallel_rank() {
    let (w1, w2) = (
        fake_worker("dp-1", &["--dp-size", "2"]),
        fake_worker("dp-2", &[]),
    );
    let r = router(
        &s(&[
            "--worker-urls",
            &w1.url(),
            &w2.url(),
            "--dp-aware",
            "--policy",
            "round_robin",
        ]),
        true,
    );
    // Each server joins once it has told its ranks.
    assert!(wait_until(Duration::from_secs(10), || workers(r.port)
        .len()
        == 3));
    let mut names: Vec<String> = workers(r.port)
        .iter()
        .map(|w| w["url"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    let mut want = vec![
        format!("{}@0", w1.url()),
        format!("{}@1", w1.url()),
        format!("{}@0", w2.url()),
    ];
    want.sort();
    assert_eq!(names, want);
    for i in 0..6 {
        // A rank the client wrote is replaced by the worker's.
        let body = if i == 0 {
            r#"{"prompt":"hi","data_parallel_rank":7}"#
        } else {
            r#"{"prompt":"hi"}"#
        };
        assert_eq!(post(r.port, "/v1/completions", body).0, 200);
    }
    let ranks = |w: &Worker| -> Vec<i64> {
        let mut v: Vec<i64> = recorded(w)
            .iter()
            .map(|x| body_of(x)["data_parallel_rank"].as_i64().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(ranks(&w1), [0, 0, 1, 1], "w1's two ranks get two each");
    assert_eq!(ranks(&w2), [0, 0]);
    // Added through the API: one worker per rank; removed by its address: every rank.
    let w3 = fake_worker("dp-3", &["--dp-size", "3"]);
    let (st, _, _) = post(r.port, "/workers", &json!({ "url": w3.url() }).to_string());
    assert_eq!(st, 202);
    assert_eq!(workers(r.port).len(), 6);
    let resp = client()
        .delete(format!(
            "http://127.0.0.1:{}/workers/{}",
            r.port,
            w3.url().replace(':', "%3A").replace('/', "%2F")
        ))
        .send()
        .unwrap();
    assert_eq!(resp.status(), 202);
    assert_eq!(workers(r.port).len(), 3);
    // A server that cannot say its ranks is refused with the reason.
    let (st, _, body) = post(
        r.port,
        "/workers",
        &json!({ "url": "http://127.0.0.1:1" }).to_string(),
    );
    assert_eq!(st, 503, "{body}");
    assert!(body.contains("--dp-aware"), "{body}");
}

#[test]
fn tls_on_the_listener_and_to_workers_with_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let [ca, cert, key, client_cert, client_key] = common::test_pki(dir.path());
    let p = |x: &std::path::PathBuf| x.to_str().unwrap().to_string();
    // A worker over HTTPS that serves only clients with a certificate of the test CA.
    let w = fake_worker(
        "tls-1",
        &[
            "--tls-cert",
            &p(&cert),
            "--tls-key",
            &p(&key),
            "--tls-client-ca",
            &p(&ca),
        ],
    );
    let worker = format!("https://127.0.0.1:{}", w.port);
    let r = router_with_env(
        &s(&[
            "--worker-urls",
            &worker,
            "--ca-cert-paths",
            &p(&ca),
            "--client-cert-path",
            &p(&client_cert),
            "--client-key-path",
            &p(&client_key),
            "--tls-cert-path",
            &p(&cert),
            "--tls-key-path",
            &p(&key),
        ]),
        None,
        &[],
    );
    let https = reqwest::blocking::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(&ca).unwrap()).unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let base = format!("https://localhost:{}", r.port);
    assert!(
        wait_until(Duration::from_secs(20), || https
            .get(format!("{base}/readiness"))
            .send()
            .is_ok_and(|r| r.status() == 200)),
        "the router never answered over HTTPS"
    );
    let resp = https
        .post(format!("{base}/v1/completions"))
        .body(r#"{"prompt":"over TLS both ways"}"#)
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-fake-worker"], "tls-1");
    // The listener speaks only TLS.
    assert_eq!(get(r.port, "/readiness").0, 0, "plain HTTP was answered");
    // Without the client certificate the worker refuses the router.
    let bare = router(
        &s(&[
            "--worker-urls",
            &worker,
            "--ca-cert-paths",
            &p(&ca),
            "--disable-retries",
            "--disable-health-check",
        ]),
        true,
    );
    let (st, _, body) = post(bare.port, "/v1/completions", r#"{"prompt":"x"}"#);
    assert!(st >= 500, "{st} {body}");
    assert!(body.contains(&worker), "{body}");
    // Half a pair is refused by name.
    let out = std::process::Command::new(common::BIN)
        .args(["router", "--tls-cert-path", &p(&cert)])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("tls_key_path"), "{err}");
}

#[test]
fn an_openai_backend_routes_each_model_to_the_upstream_serving_it() {
    let a = fake_worker(
        "oa-a",
        &["--model", "gpt-a", "--extra-models", "gpt-a-mini"],
    );
    let b = fake_worker("oa-b", &["--model", "gpt-b"]);
    let r = router(
        &s(&["--backend", "openai", "--worker-urls", &a.url(), &b.url()]),
        true,
    );
    // Each upstream's model list is read in the background.
    assert!(wait_until(Duration::from_secs(10), || workers(r.port)
        .iter()
        .all(|w| w["models"].as_array().is_some_and(|m| !m.is_empty()))));
    let served_by = |model: &str| {
        let resp = client()
            .post(format!("http://127.0.0.1:{}/v1/chat/completions", r.port))
            .header("authorization", "Bearer sk-client-key")
            .body(
                json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
                    .to_string(),
            )
            .send()
            .unwrap();
        assert_eq!(resp.status(), 200, "{model}");
        resp.headers()["x-fake-worker"]
            .to_str()
            .unwrap()
            .to_string()
    };
    for _ in 0..4 {
        assert_eq!(served_by("gpt-a"), "oa-a");
        assert_eq!(served_by("gpt-a-mini"), "oa-a");
        assert_eq!(served_by("gpt-b"), "oa-b");
    }
    // The client's key reaches the upstream.
    let last = recorded(&b).last().cloned().unwrap();
    assert_eq!(
        last["headers"]["authorization"], "Bearer sk-client-key",
        "{last}"
    );
    // A model nobody serves has no worker; /generate is SGLang's.
    let (st, _, _) = post(
        r.port,
        "/v1/completions",
        r#"{"model":"gpt-z","prompt":"x"}"#,
    );
    assert_eq!(st, 503);
    let (st, _, body) = post(r.port, "/generate", r#"{"text":"x"}"#);
    assert_eq!(st, 501, "{body}");
    assert!(body.contains("--backend openai"), "{body}");
}

#[test]
fn igw_gives_each_model_its_workers_and_its_own_policy() {
    let a1 = fake_worker("igw-a1", &["--model", "llama"]);
    let a2 = fake_worker("igw-a2", &["--model", "llama"]);
    let b = fake_worker("igw-b", &["--model", "qwen"]);
    let r = router(
        &s(&[
            "--enable-igw",
            "--policy",
            "round_robin",
            "--worker-urls",
            &a1.url(),
            &a2.url(),
            &b.url(),
        ]),
        true,
    );
    assert!(wait_until(Duration::from_secs(10), || workers(r.port)
        .iter()
        .all(|w| w["model_id"].is_string())));
    let served_by = |model: &str| {
        let (st, h, body) = post(
            r.port,
            "/v1/completions",
            &json!({"model": model, "prompt": "hello"}).to_string(),
        );
        assert_eq!(st, 200, "{body}");
        h["x-fake-worker"].to_str().unwrap().to_string()
    };
    // qwen always goes to its one worker; llama alternates between its two, its round robin
    // untouched by qwen's requests in between.
    let mut llama = Vec::new();
    for _ in 0..3 {
        llama.push(served_by("llama"));
        assert_eq!(served_by("qwen"), "igw-b");
    }
    llama.push(served_by("llama"));
    assert!(llama.iter().all(|w| w.starts_with("igw-a")), "{llama:?}");
    assert_ne!(llama[0], llama[1], "{llama:?}");
    assert_eq!(llama[0], llama[2], "{llama:?}");
    assert_ne!(llama[2], llama[3], "{llama:?}");
}

#[test]
fn a_local_tokenizer_serves_tokenize_and_detokenize_and_routes_by_token() {
    let dir = tempfile::tempdir().unwrap();
    let words = [
        "you",
        "are",
        "a",
        "helpful",
        "assistant",
        "tell",
        "me",
        "about",
        "rome",
    ];
    let file = dir.path().join("tokenizer.json");
    std::fs::write(&file, rbgctl::testkit::tokenizer::word_level_json(&words)).unwrap();
    let (w1, w2) = (fake_worker("tok-1", &[]), fake_worker("tok-2", &[]));
    let r = router(
        &s(&[
            "--worker-urls",
            &w1.url(),
            &w2.url(),
            "--policy",
            "cache_aware",
            "--tokenizer-path",
            file.to_str().unwrap(),
        ]),
        true,
    );
    let (st, _, body) = post(
        r.port,
        "/v1/tokenize",
        r#"{"prompt":"you are a helpful assistant"}"#,
    );
    assert_eq!(st, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["tokens"], json!([1, 2, 3, 4, 5, 6]));
    assert_eq!(v["count"], 6);
    let (st, _, body) = post(
        r.port,
        "/v1/tokenize",
        r#"{"prompt":["rome","me"],"add_special_tokens":false}"#,
    );
    assert_eq!(st, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["tokens"],
        json!([[10], [8]])
    );
    let (st, _, body) = post(r.port, "/v1/detokenize", r#"{"tokens":[1,7,8,9,10]}"#);
    assert_eq!(st, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["text"],
        "tell me about rome"
    );
    let (st, _, body) = post(r.port, "/v1/detokenize", r#"{"tokens":"nope"}"#);
    assert_eq!(st, 400, "{body}");
    // Matching by token: the text and its token ids (input_ids) share one prefix, so a
    // /generate by ids follows the conversation the text started.
    let served_by = |path: &str, body: Value| {
        let (st, h, b) = post(r.port, path, &body.to_string());
        assert_eq!(st, 200, "{b}");
        h["x-fake-worker"].to_str().unwrap().to_string()
    };
    let first = served_by(
        "/generate",
        json!({"text": "you are a helpful assistant tell me about rome"}),
    );
    for _ in 0..3 {
        assert_eq!(
            served_by(
                "/generate",
                json!({"input_ids": [2, 3, 4, 5, 6, 7, 8, 9, 10]})
            ),
            first,
            "the ids of the same text went elsewhere"
        );
    }
    // Without a tokenizer both routes say how to get one; a hub id is not downloaded.
    let plain = router(&s(&["--worker-urls", &w1.url()]), true);
    let (st, _, body) = post(plain.port, "/v1/tokenize", r#"{"prompt":"x"}"#);
    assert_eq!(st, 501, "{body}");
    assert!(body.contains("--tokenizer-path"), "{body}");
    let out = std::process::Command::new(common::BIN)
        .args(["router", "--model-path", "Qwen/Qwen3-8B"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("Qwen/Qwen3-8B") && err.contains("never downloads"),
        "{err}"
    );
}

/// Held by the tests that load the machine hard (thousands of connections, long CPU-bound
/// queries) and by those that time what they measure, so that neither runs beside the other.
static MEASURED: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The [`MEASURED`] turn (a test that failed while holding it does not poison the rest).
fn measured_turn() -> std::sync::MutexGuard<'static, ()> {
    MEASURED.lock().unwrap_or_else(|e| e.into_inner())
}

/// `rbgctl bench router --reps 1 --json` with `args`: its rows.
fn bench_router_json(args: &[&str]) -> Vec<Value> {
    let _turn = measured_turn();
    let out = std::process::Command::new(common::BIN)
        .args(["bench", "router", "--reps", "1", "--json"])
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap()
}

#[test]
fn bench_router_measures_prefill_decode_cases_beside_a_sequential_peer() {
    // The peer is rbgctl's router with vLLM legs one after the other (as SMG runs them): its
    // time to first byte includes the prefill answer's 200 ms, rbgctl's concurrent legs' not.
    let peer = format!(
        "{} router --host 127.0.0.1 --port {{port}} --prometheus-port {{prometheus_port}} \
         --pd-disaggregation --vllm-pd-legs sequential --prefill {{prefill}} --decode {{decode}}",
        common::BIN
    );
    let rows = bench_router_json(&[
        "--seconds",
        "0.5",
        "--cases",
        "pd-gen,vllm-pd-chat-stream",
        "--clients",
        "2",
        "--prefill-ms",
        "200",
        "--peer-pd-cmd",
        &peer,
    ]);
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        for side in ["direct", "router", "peer"] {
            assert!(r[side]["requests"].as_u64().unwrap() > 0, "{side}: {r}");
            assert_eq!(r[side]["errors"], 0, "{side}: {r}");
        }
    }
    let (sglang, vllm) = (&rows[0], &rows[1]);
    assert_eq!(sglang["mode"], "sglang-pd");
    assert_eq!(vllm["mode"], "vllm-pd");
    // Every request waits for its prefill leg (200 ms) to end.
    assert!(
        vllm["router"]["p50_ms"].as_f64().unwrap() >= 200.0,
        "{vllm}"
    );
    let ttfb = |side: &str| vllm[side]["ttfb_p50_ms"].as_f64().unwrap();
    assert!(ttfb("peer") >= 200.0, "sequential legs: {vllm}");
    assert!(ttfb("router") < 200.0, "concurrent legs: {vllm}");
    assert!(vllm["ttfb_saved_vs_peer_ms"].as_f64().unwrap() > 0.0);
}

/// `--worker-kind sim`: SIMULATED engines publishing KV events behind the router, which
/// `precise_prefix` follows; the router's CPU per request and the kernel's share of it are
/// reported.
#[test]
fn bench_router_runs_simulated_engines_for_precise_prefix() {
    let rows = bench_router_json(&[
        "--seconds",
        "0.5",
        "--cases",
        "gen",
        "--clients",
        "2",
        "--workers",
        "2",
        "--worker-kind",
        "sim",
        "--policy",
        "precise_prefix",
        "--prompts",
        "2",
        "--tenants",
        "3",
    ]);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r = &rows[0];
    // Admission on (issue 66): every request through a tenant's limits, its CPU beside.
    assert!(r["admission_cpu_ratio"].as_f64().unwrap() > 0.0, "{r}");
    for side in ["direct", "router", "admission"] {
        assert!(r[side]["requests"].as_u64().unwrap() > 0, "{side}: {r}");
        assert_eq!(r[side]["errors"], 0, "{side}: {r}");
    }
    assert!(r["router"]["cpu_us_per_req"].as_f64().unwrap() > 0.0, "{r}");
    let kernel = r["router"]["kernel_share"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&kernel), "{r}");
}

#[test]
fn bench_router_measures_a_peer_router_side_by_side() {
    // rbgctl's own router plays the peer here (SMG is measured the same way outside CI).
    let peer = format!(
        "{} router --host 127.0.0.1 --port {{port}} --prometheus-port {{prometheus_port}} --worker-urls {{workers}}",
        common::BIN
    );
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("router.html");
    let rows = bench_router_json(&[
        "--seconds",
        "0.3",
        "--cases",
        "gen",
        "--clients",
        "2",
        "--peer-name",
        "self",
        "--peer-cmd",
        &peer,
        "--report",
        report.to_str().unwrap(),
    ]);
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert!(row["peer"]["requests"].as_u64().unwrap() > 0, "{row}");
    assert!(row["router_over_peer"].as_f64().unwrap() > 0.0, "{row}");
    let bars: &[&str] = &["direct", "rbgctl router", "self", "gen ×2"];
    common::pictures::check_report(
        &report,
        "bench-router",
        &[("req-per-s", bars), ("p50-ms", bars), ("ttfb-p50-ms", bars)],
    );
    // A peer that never comes up is reported with its command.
    let out = std::process::Command::new(common::BIN)
        .args([
            "bench",
            "router",
            "--seconds",
            "0.1",
            "--reps",
            "1",
            "--cases",
            "gen",
        ])
        .args(["--clients", "1", "--peer-cmd", "false {port}"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("exited") && err.contains("false"), "{err}");
}

/// Threads of process `pid` named `name`.
fn threads_named(pid: u32, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim() == name)
        .count()
}

#[test]
fn runtime_threads_sets_the_routers_thread_count() {
    let w = fake_worker("threads-w", &[]);
    // Threads of the router's runtime, named "router", once it has served a request.
    let count = |threads: &str| {
        let r = router(
            &s(&["--worker-urls", &w.url(), "--runtime-threads", threads]),
            true,
        );
        assert_eq!(post(r.port, "/v1/completions", r#"{"prompt":"x"}"#).0, 200);
        threads_named(r._proc.pid().unwrap(), "router")
    };
    let (one, four) = (count("1"), count("4"));
    // (Beside the runtime's workers, a thread of its blocking pool may run.)
    assert_eq!(four, one + 3, "1 thread: {one} named router; 4: {four}");
    let out = std::process::Command::new(common::BIN)
        .args(["router", "--runtime-threads", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("runtime_threads"), "{err}");
}

/// Thread-per-core (the default runtime): one listener, whose connections are handed to the
/// threads, each answering with its own connections to the workers. Requests over many
/// connections are all answered, each counted once, and the threads are the ones asked for.
/// The port is the router's alone: a second router asked for it fails naming it (with one
/// `SO_REUSEPORT` listener per thread it would have joined the port and taken a share of the
/// traffic). The work-stealing runtime answers too.
#[test]
fn thread_per_core_answers_on_every_thread_and_keeps_its_port_to_itself() {
    let w = fake_worker("tpc-w", &[]);
    let start = |runtime: &str| {
        router(
            &s(&[
                "--worker-urls",
                &w.url(),
                "--runtime",
                runtime,
                "--runtime-threads",
                "3",
            ]),
            true,
        )
    };
    let r = start("thread_per_core");
    // 12 threads × 5 requests, each on a connection of its own.
    std::thread::scope(|scope| {
        for _ in 0..12 {
            scope.spawn(|| {
                for _ in 0..5 {
                    let (status, _, body) = post(r.port, "/v1/completions", r#"{"prompt":"x"}"#);
                    assert_eq!(status, 200, "{body}");
                }
            });
        }
    });
    let metrics = get(r.port, "/metrics").1;
    assert!(
        metrics.contains(
            r#"smg_router_requests_total{router_type="http",backend_type="http",connection_mode="http",model="unknown",endpoint="completions",streaming="false"} 60"#
        ),
        "{metrics}"
    );
    let named_router = threads_named(r._proc.pid().unwrap(), "router");
    assert!(named_router >= 3, "{named_router} threads named router");

    let port = r.port.to_string();
    let out = std::process::Command::new(common::BIN)
        .args([
            "router",
            "--host",
            "127.0.0.1",
            "--port",
            &port,
            "--worker-urls",
            &w.url(),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a second router started on port {port}: {err}"
    );
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(err.contains("Address already in use"), "{err}");
    assert_eq!(post(r.port, "/v1/completions", r#"{"prompt":"x"}"#).0, 200);

    let ws = start("work_stealing");
    assert_eq!(post(ws.port, "/v1/completions", r#"{"prompt":"x"}"#).0, 200);
}

/// A SIMULATED engine publishing its caches' KV events (page size 4) on free ports.
fn engine_with_events(launcher: &Launcher, name: &str) -> launch::Child<launch::Engine> {
    launcher
        .spawn::<launch::Engine>(
            name,
            rbgctl::engine::EngineConfig {
                port: 0,
                page_size: 4,
                prefill_us_per_token: 1.0,
                decode_ms_per_token: 0.1,
                kv_events_config: Some(
                    r#"{"publisher":"zmq","endpoint":"tcp://127.0.0.1:0","bind":true,
                        "replay_endpoint":"tcp://127.0.0.1:0"}"#
                        .into(),
                ),
                ..Default::default()
            },
        )
        .expect("the SIMULATED engine starts")
}

/// `precise_prefix` routes on what the engines say they hold: a prompt one engine was given
/// directly (the router never saw it) goes to that engine, which the text-guessing tree could
/// not know; once that engine flushes its cache, the router knows that too.
#[test]
fn precise_prefix_routes_on_the_engines_own_kv_events() {
    let launcher = launcher();
    let e1 = engine_with_events(launcher, "e1");
    let e2 = engine_with_events(launcher, "e2");
    let url = |e: &launch::Child<launch::Engine>| format!("http://{}", e.addrs.http);
    let precise = || {
        router(
            &s(&[
                "--worker-urls",
                &url(&e1),
                &url(&e2),
                "--policy",
                "precise_prefix",
            ]),
            true,
        )
    };
    let r = precise();
    let followed = || metric(r.port, "rbgctl_router_kv_index_workers_followed ").unwrap_or(0.0);
    assert!(
        wait_until(Duration::from_secs(20), || followed() == 2.0),
        "the router did not follow both engines' events"
    );
    let blocks = || metric(r.port, "rbgctl_router_kv_index_blocks ").unwrap_or(-1.0);
    // A prompt of 8 pages (the SIMULATED tokenizer: one token a word), given to e2 directly.
    let prompt: String = (0..32).map(|i| format!("t{} ", 1000 + i)).collect();
    let body = json!({"text": prompt, "sampling_params": {"max_new_tokens": 1}}).to_string();
    assert_eq!(post(e2.addrs.http.port(), "/generate", &body).0, 200);
    assert!(
        wait_until(Duration::from_secs(20), || blocks() >= 8.0),
        "the index did not learn e2's blocks: {}",
        blocks()
    );
    let prompts = |e: &launch::Child<launch::Engine>| {
        metric(e.addrs.http.port(), "sglang:prompt_tokens_total").unwrap_or(0.0)
    };
    let (before1, before2) = (prompts(&e1), prompts(&e2));
    // Through the router: to e2, which holds it (least-loaded would say e1, the first).
    let (code, _, text) = post(r.port, "/generate", &body);
    assert_eq!(code, 200, "{text}");
    assert_eq!(prompts(&e1), before1, "e1 got the prompt e2 holds");
    assert!(prompts(&e2) > before2);
    // The index as Mooncake Conductor's API: e2 holds the 32 tokens on its device, e1 none.
    let ids: Vec<u32> = (1000..1032).collect();
    let (code, _, text) = post(
        r.port,
        "/query",
        &json!({"model": "simulated-model", "token_ids": ids, "block_size": 4}).to_string(),
    );
    assert_eq!(code, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["default"][url(&e2)]["longest_matched"], 32, "{v}");
    assert_eq!(v["default"][url(&e2)]["GPU"], 32, "{v}");
    assert_eq!(v["default"][url(&e1)]["longest_matched"], 0, "{v}");
    let hashes = rbgctl::kv_events::hash::block_hashes(&ids[..8], 4);
    let (_, _, text) = post(
        r.port,
        "/query_by_hash",
        &json!({"model": "simulated-model", "seq_hashes": hashes, "block_size": 4,
                "instance_id": url(&e2)})
        .to_string(),
    );
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["default"][url(&e2)]["longest_matched"], 8, "{v}");
    assert!(
        v["default"].get(url(&e1)).is_none(),
        "one instance asked: {v}"
    );
    // A router started now, next to idle engines, is not cold: it catches up from their
    // replay buffers at once, and says it is ready only once it has.
    let r2 = precise();
    assert!(
        metric(r2.port, "rbgctl_router_kv_index_blocks ").unwrap_or(0.0) >= 8.0,
        "the second router said it was ready before it caught up"
    );
    let (_, ready) = get(r2.port, "/readiness");
    assert!(
        ready.contains(r#""kv_events_catching_up":false"#),
        "{ready}"
    );
    assert!(metric(r2.port, "rbgctl_router_kv_event_catch_up_seconds{").is_some());
    drop(r2);
    // A request in a LoRA adapter's namespace is not matched against the base model's
    // blocks, which SGLang keeps apart from the adapter's: e2 holds this prompt for the base
    // model only, the adapter's blocks are held nowhere, and the request goes by load (e1,
    // which has served fewer).
    let other: String = (0..32).map(|i| format!("t{} ", 2000 + i)).collect();
    let plain = json!({"text": other, "sampling_params": {"max_new_tokens": 1}});
    assert_eq!(
        post(e2.addrs.http.port(), "/generate", &plain.to_string()).0,
        200
    );
    assert!(
        wait_until(Duration::from_secs(20), || blocks() >= 16.0),
        "the index did not learn e2's second prompt: {}",
        blocks()
    );
    let (before1, before2) = (prompts(&e1), prompts(&e2));
    let mut adapted = plain.clone();
    adapted["lora_path"] = json!("sql-adapter");
    let (code, _, text) = post(r.port, "/generate", &adapted.to_string());
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        prompts(&e2),
        before2,
        "the adapter's request followed the base model's blocks"
    );
    assert!(prompts(&e1) > before1);
    // The engines flush: AllBlocksCleared reaches the index, which then holds nothing.
    assert_eq!(post(e1.addrs.http.port(), "/flush_cache", "").0, 200);
    assert_eq!(post(e2.addrs.http.port(), "/flush_cache", "").0, 200);
    assert!(
        wait_until(Duration::from_secs(20), || blocks() == 0.0),
        "the flush did not reach the index: {}",
        blocks()
    );
    assert_eq!(
        metric(r.port, "rbgctl_router_kv_event_losses_total{").unwrap_or(0.0),
        0.0
    );
}

/// Publishers for the data-parallel ranks of one FAKE worker, on consecutive ports as SGLang's
/// ranks publish (PUB on `base + rank`, replay on `base + ranks + rank`).
fn rank_publishers(ranks: usize) -> (u16, Vec<rbgctl::kv_events::Publisher>) {
    for _ in 0..50 {
        let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = first.local_addr().unwrap().port();
        drop(first);
        let start = |port: u16, replay: u16| {
            rbgctl::kv_events::Publisher::start(&rbgctl::kv_events::config::KvEventsConfig {
                publisher: "zmq".into(),
                endpoint: format!("tcp://127.0.0.1:{port}"),
                bind: Some(true),
                replay_endpoint: Some(format!("tcp://127.0.0.1:{replay}")),
                ..Default::default()
            })
        };
        let Some(last) = base.checked_add(2 * ranks as u16) else {
            continue;
        };
        let publishers: Result<Vec<_>, _> = (0..ranks as u16)
            .map(|r| start(base + r, last - ranks as u16 + r))
            .collect();
        if let Ok(p) = publishers {
            return (base, p);
        }
    }
    panic!("no free run of ports for the ranks' publishers");
}

/// The KV events descriptor of one rank publishing on `base` (PUB) and `base + 1` (replay).
fn one_rank_descriptor(base: u16) -> String {
    json!({"publisher": "zmq", "endpoint_host": "127.0.0.1",
        "endpoint_port_base": base, "replay_endpoint_port_base": base + 1,
        "topic": "", "block_size": 4, "dp_size": 1})
    .to_string()
}

/// A FAKE worker whose descriptor points at a publisher of this test's, with that publisher.
fn worker_publishing(name: &str) -> (Worker, rbgctl::kv_events::Publisher) {
    let (base, mut publishers) = rank_publishers(1);
    let descriptor = one_rank_descriptor(base);
    let w = fake_worker(name, &["--kv-events-descriptor", &descriptor]);
    (w, publishers.remove(0))
}

/// A server running two data-parallel ranks publishes each rank's cache on its own ports:
/// the router follows both, a worker holds what its best rank holds, and the index's
/// Conductor answer says each rank's share (`DP`); with `--dp-aware` each rank is a worker of
/// its own, following its rank's events alone.
#[test]
fn precise_prefix_follows_every_data_parallel_rank() {
    use rbgctl::kv_events::{BlockStored, KvEvent, KvEventBatch, Medium};
    let (base, publishers) = rank_publishers(2);
    let descriptor = json!({"publisher": "zmq", "endpoint_host": "127.0.0.1",
        "endpoint_port_base": base, "replay_endpoint_port_base": base + 2,
        "topic": "", "block_size": 4, "dp_size": 2})
    .to_string();
    let w = fake_worker(
        "dp",
        &["--dp-size", "2", "--kv-events-descriptor", &descriptor],
    );
    let url = w.url();
    let tokens: Vec<u32> = (1..=8).collect();
    let hashes = rbgctl::kv_events::hash::block_hashes(&tokens, 4);
    let store = |rank: usize, blocks: usize| {
        publishers[rank].publish(KvEventBatch {
            ts: 0.0,
            events: vec![KvEvent::BlockStored(BlockStored::new(
                hashes[..blocks].to_vec(),
                None,
                tokens[..blocks * 4].to_vec(),
                4,
                Medium::Gpu,
            ))],
            attn_dp_rank: Some(rank as i64),
        })
    };
    // Rank 1 holds both blocks, rank 0 the first: stored before any router follows them
    // (a router catches up from each rank's replay buffer).
    store(1, 2);
    store(0, 1);
    let query = |r: &Router| {
        let body = json!({"token_ids": tokens, "block_size": 4}).to_string();
        let (code, _, text) = post(r.port, "/query", &body);
        assert_eq!(code, 200, "{text}");
        serde_json::from_str::<Value>(&text).unwrap()
    };
    let r = router(
        &s(&["--worker-urls", &url, "--policy", "precise_prefix"]),
        true,
    );
    // Ready is not caught up: each rank's replay arrives on its own; wait for both.
    assert!(
        wait_until(Duration::from_secs(20), || query(&r)["default"][&url]["DP"]
            == json!({"0": 4, "1": 8})),
        "both ranks' replays reached the router: {}",
        query(&r)
    );
    let v = query(&r);
    let instance = &v["default"][&url];
    assert_eq!(instance["longest_matched"], 8, "{v}");
    assert_eq!(instance["GPU"], 8, "{v}");
    assert_eq!(instance["DP"], json!({"0": 4, "1": 8}), "{v}");
    for rank in ["0", "1"] {
        let line =
            format!("rbgctl_router_kv_events_in_step{{worker=\"{url}\",dp_rank=\"{rank}\"}}");
        assert_eq!(metric(r.port, &line), Some(1.0), "rank {rank}");
    }
    drop(r);
    // `--dp-aware`: URL@0 and URL@1, each knowing its own rank's blocks.
    let r = router(
        &s(&[
            "--worker-urls",
            &url,
            "--policy",
            "precise_prefix",
            "--dp-aware",
        ]),
        true,
    );
    // Ready is not caught up: each rank's replay arrives on its own; wait for both.
    let caught_up = |v: &Value| {
        v["default"][format!("{url}@0")]["longest_matched"] == 4
            && v["default"][format!("{url}@1")]["longest_matched"] == 8
    };
    assert!(
        wait_until(Duration::from_secs(20), || caught_up(&query(&r))),
        "both ranks' replays reached the --dp-aware router: {}",
        query(&r)
    );
    let v = query(&r);
    assert_eq!(
        v["default"][format!("{url}@0")]["longest_matched"],
        4,
        "{v}"
    );
    assert_eq!(
        v["default"][format!("{url}@0")]["DP"],
        json!({"0": 4}),
        "{v}"
    );
    assert_eq!(
        v["default"][format!("{url}@1")]["longest_matched"],
        8,
        "{v}"
    );
    assert_eq!(
        v["default"][format!("{url}@1")]["DP"],
        json!({"1": 8}),
        "{v}"
    );
}

/// A LoRA adapter's blocks, which SGLang publishes under hashes seeded by its own id for the
/// adapter's load (with `lora_name` and the token ids), are found by a request naming the
/// adapter (`lora_path`), and never taken for the base model's blocks of the same tokens.
#[test]
fn precise_prefix_finds_an_adapters_blocks_by_its_name() {
    use rbgctl::kv_events::{BlockStored, KvEvent, KvEventBatch, Medium};
    let (w1, base_model) = worker_publishing("w1");
    let (w2, adapters) = worker_publishing("w2");
    let tokens: Vec<u32> = (1..=8).collect();
    // w1 holds the base model's two blocks of the prompt.
    base_model.publish(KvEventBatch {
        ts: 0.0,
        events: vec![KvEvent::BlockStored(BlockStored::new(
            rbgctl::kv_events::hash::block_hashes(&tokens, 4),
            None,
            tokens.clone(),
            4,
            Medium::Gpu,
        ))],
        attn_dp_rank: Some(0),
    });
    // w2 holds adapter "sql"'s, as SGLang publishes them: one event a page, under opaque
    // hashes chained by parent.
    let page = |hash: i64, parent: Option<i64>, from: usize| {
        let mut s = BlockStored::new(
            vec![hash],
            parent,
            tokens[from..from + 4].to_vec(),
            4,
            Medium::Gpu,
        );
        s.lora_name = Some("sql".into());
        KvEvent::BlockStored(s)
    };
    adapters.publish(KvEventBatch {
        ts: 0.0,
        events: vec![page(-7001, None, 0), page(7002, Some(-7001), 4)],
        attn_dp_rank: Some(0),
    });
    let r = router(
        &s(&[
            "--worker-urls",
            &w1.url(),
            &w2.url(),
            "--policy",
            "precise_prefix",
        ]),
        true,
    );
    let to = |body: Value| {
        let (st, h, text) = post(r.port, "/generate", &body.to_string());
        assert_eq!(st, 200, "{text}");
        h["x-fake-worker"].to_str().unwrap().to_string()
    };
    let adapted = json!({"input_ids": tokens, "lora_path": "sql"});
    let base = json!({"input_ids": tokens});
    assert_eq!(to(adapted.clone()), "w2", "the adapter's blocks are on w2");
    assert_eq!(to(base.clone()), "w1", "the base model's blocks are on w1");
    // Another adapter of the same tokens is held nowhere: least loaded (w1, the first).
    assert_eq!(to(json!({"input_ids": tokens, "lora_path": "chat"})), "w1");
    // w2 evicts the adapter's first block: it no longer holds the prefix, and the request
    // goes by load again.
    adapters.publish(KvEventBatch {
        ts: 0.0,
        events: vec![KvEvent::BlockRemoved(rbgctl::kv_events::BlockRemoved {
            block_hashes: vec![-7001],
            medium: Some(Medium::Gpu),
        })],
        attn_dp_rank: Some(0),
    });
    assert!(
        wait_until(Duration::from_secs(10), || to(adapted.clone()) == "w1"),
        "the adapter's removal never reached the index"
    );
}

// ---------------------------------------------------------------------------------------------
// Issue 62: what a hostile client hits

/// A process's memory line from `/proc/PID/status` (`VmRSS`, `VmHWM`), in bytes.
fn vm_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .expect("a memory line")
        * 1024
}

/// Item A1: the fields routing reads are read without building a JSON tree, so a request of
/// a long `input_ids` list costs the router about its body, not 17 times it (the peak before:
/// 1.15 GB for 67 MB); the routes the router answers itself from a body take 16 MiB at most.
#[test]
fn a_request_costs_the_router_about_its_body_and_queries_have_a_limit_of_their_own() {
    let w = fake_worker("w", &[]);
    let r = router(&s(&["--worker-urls", &w.url()]), true);
    let pid = r._proc.pid().unwrap();
    // 20 million ids of one digit: 40 MB of JSON.
    let ids = 20_000_000;
    let mut body = String::with_capacity(2 * ids + 32);
    body.push_str(r#"{"input_ids":["#);
    for i in 0..ids {
        body.push_str(if i == 0 { "7" } else { ",7" });
    }
    body.push_str(r#"],"sampling_params":{"max_new_tokens":1}}"#);
    let before = vm_bytes(pid, "VmRSS");
    let (code, _, text) = post(r.port, "/generate", &body);
    // Read and routed: the FAKE worker itself takes bodies of 2 MB at most (413, or the
    // connection closed on the router: 502).
    assert!(
        [200, 413, 502].contains(&code) && !text.contains("invalid_request_error"),
        "{code} {}",
        &text[..text.len().min(300)]
    );
    let peak = vm_bytes(pid, "VmHWM");
    let grew = peak.saturating_sub(before);
    assert!(
        grew < 4 * body.len() as u64,
        "a {} MB body took the router from {} MB to a peak of {} MB",
        body.len() >> 20,
        before >> 20,
        peak >> 20
    );
    drop(body);
    // /query_by_hash: within its limit a long list is answered, past it 413.
    let hashes: Vec<i64> = (0..500_000).collect();
    let q = |hashes: &[i64]| json!({"seq_hashes": hashes, "block_size": 16}).to_string();
    let small = q(&hashes);
    assert!(small.len() < 16 << 20);
    let (code, _, text) = post(r.port, "/query_by_hash", &small);
    assert_eq!(code, 400, "no KV index without precise_prefix: {text}");
    let pp = router(
        &s(&["--worker-urls", &w.url(), "--policy", "precise_prefix"]),
        true,
    );
    let (code, _, text) = post(pp.port, "/query_by_hash", &small);
    assert_eq!(code, 200, "{text}");
    let big: Vec<i64> = (0..2_500_000).collect();
    let big = q(&big);
    assert!(big.len() > 16 << 20);
    let (code, _, text) = post(pp.port, "/query_by_hash", &big);
    assert_eq!(code, 413, "{text}");
    let (code, _, text) = post(
        pp.port,
        "/query_by_hash",
        r#"{"seq_hashes": [1.5], "block_size": 16}"#,
    );
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("64-bit block hash"), "{text}");
    // The inference routes keep --max-payload-size.
    assert_eq!(post(pp.port, "/generate", r#"{"text":"hi"}"#).0, 200);
}

/// This machine's first address that is not loopback (where a client from elsewhere comes
/// from), from iproute2.
fn an_address_not_loopback() -> Option<std::net::IpAddr> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// An HTTP request from `from` to the router's port on that address, with `headers` (lines
/// ending in CRLF) after the usual ones.
fn request_from(
    from: std::net::IpAddr,
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    headers: &str,
) -> (u16, String) {
    let conn = std::net::TcpStream::connect((from, port)).unwrap();
    assert_eq!(conn.local_addr().unwrap().ip(), from);
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n{headers}\r\n",
        body.len()
    );
    common::exchange(conn, head.as_bytes(), body.as_bytes())
}

/// Item A4 and A16: without any key, the control plane (adding and removing workers, cache
/// flushes, loads, every worker's metrics) answers only this host's clients: a client from
/// elsewhere can neither register a worker (to draw other users' prompts) nor make the router
/// fetch what a worker URL names. Inference stays open; with a key, the key decides.
#[test]
fn without_a_key_the_control_plane_answers_only_this_hosts_clients() {
    let Some(elsewhere) = an_address_not_loopback() else {
        common::skip("this machine has no address but loopback");
        return;
    };
    let w = fake_worker("w", &[]);
    let on_every_address = |args: &[&str]| {
        let mut cfg = router_config(&s(args));
        cfg.server.host = "0.0.0.0".into();
        let child = launcher()
            .spawn::<launch::Router>("router", cfg)
            .expect("the router starts");
        let r = Router {
            port: child.addrs.http.port(),
            _proc: child.process,
        };
        await_readiness(&r, true);
        r
    };
    let open = on_every_address(&["--worker-urls", &w.url()]);
    let add = json!({"url": "http://127.0.0.1:9"}).to_string();
    let (code, text) = request_from(elsewhere, open.port, "POST", "/workers", &add, "");
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("--control-plane-api-keys"), "{text}");
    for path in ["/engine_metrics", "/workers", "/get_loads"] {
        let (code, text) = request_from(elsewhere, open.port, "GET", path, "", "");
        assert_eq!(code, 403, "{path}: {text}");
    }
    assert_eq!(workers(open.port).len(), 1, "nothing was added");
    // Inference and health answer anyone.
    let (code, text) = request_from(
        elsewhere,
        open.port,
        "POST",
        "/generate",
        r#"{"text":"a"}"#,
        "",
    );
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        request_from(elsewhere, open.port, "GET", "/health", "", "").0,
        200
    );
    // From this host it is managed as before.
    let (code, _, text) = post(open.port, "/workers", &add);
    assert_eq!(code, 202, "{text}");
    // With a key, a client from elsewhere holding it may manage the router.
    let keyed = on_every_address(&["--worker-urls", &w.url(), "--api-key", "k"]);
    let bearer = "Authorization: Bearer k\r\n";
    let (code, text) = request_from(elsewhere, keyed.port, "GET", "/workers", "", bearer);
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        request_from(elsewhere, keyed.port, "GET", "/workers", "", "").0,
        401
    );
}

/// One batch storing `tokens`' blocks (of 4) on the device.
fn stored(tokens: &[u32]) -> rbgctl::kv_events::KvEventBatch {
    use rbgctl::kv_events::{BlockStored, KvEvent, KvEventBatch, Medium};
    KvEventBatch {
        ts: 0.0,
        events: vec![KvEvent::BlockStored(BlockStored::new(
            rbgctl::kv_events::hash::block_hashes(tokens, 4),
            None,
            tokens.to_vec(),
            4,
            Medium::Gpu,
        ))],
        attn_dp_rank: Some(0),
    }
}

/// Item A4: a worker added through the API that announces the blocks another engine holds
/// (and more) does not draw that engine's prompts on its claims alone; once it has been sent
/// its share, its claims count as any worker's.
#[test]
fn a_worker_added_through_the_api_does_not_draw_prompts_on_its_claims_alone() {
    let (honest, honest_events) = worker_publishing("honest");
    let (intruder, intruder_events) = worker_publishing("intruder");
    let tokens: Vec<u32> = (1..=32).collect();
    honest_events.publish(stored(&tokens[..16]));
    intruder_events.publish(stored(&tokens));
    let r = router(
        &s(&["--worker-urls", &honest.url(), "--policy", "precise_prefix"]),
        true,
    );
    let (code, _, text) = post(
        r.port,
        "/workers",
        &json!({"url": intruder.url()}).to_string(),
    );
    assert_eq!(code, 202, "{text}");
    let followed = || metric(r.port, "rbgctl_router_kv_index_workers_followed ").unwrap_or(0.0);
    assert!(
        wait_until(Duration::from_secs(20), || followed() == 2.0),
        "the router did not follow both workers' events"
    );
    let to = || {
        let (st, h, text) = post(
            r.port,
            "/generate",
            &json!({"input_ids": tokens}).to_string(),
        );
        assert_eq!(st, 200, "{text}");
        h["x-fake-worker"].to_str().unwrap().to_string()
    };
    let sent: Vec<String> = (0..10).map(|_| to()).collect();
    assert!(
        sent.iter().all(|w| w == "honest"),
        "the intruder drew prompts on its claims: {sent:?}"
    );
    assert!(
        recorded(&intruder).is_empty(),
        "the intruder saw a prompt it claimed"
    );
}

/// Item A9: a worker whose descriptor declares more data-parallel ranks than the router
/// follows for one worker is refused by name (no socket is opened for it), and the router
/// keeps answering meanwhile; item A12: a worker that does not answer at the router's start
/// is followed once it does, however long that takes, and readiness and metrics say how many
/// workers' events are not followed yet.
#[test]
fn a_worker_costs_the_router_a_bounded_share_and_late_engines_are_followed() {
    let greedy = json!({"publisher": "zmq", "endpoint_host": "127.0.0.1",
        "endpoint_port_base": 20000, "replay_endpoint_port_base": 30000,
        "topic": "", "block_size": 4, "dp_size": 4096})
    .to_string();
    let g = fake_worker("greedy", &["--kv-events-descriptor", &greedy]);
    // A port nothing listens on yet: the engine that will answer there later.
    let late_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let late_url = format!("http://127.0.0.1:{late_port}");
    let r = router(
        &s(&[
            "--worker-urls",
            &g.url(),
            &late_url,
            "--policy",
            "precise_prefix",
            "--worker-startup-timeout-secs",
            "600",
        ]),
        true,
    );
    let unfollowed =
        || metric(r.port, "rbgctl_router_kv_index_workers_unfollowed ").unwrap_or(-1.0);
    assert!(
        wait_until(Duration::from_secs(30), || unfollowed() == 2.0),
        "neither the greedy nor the late worker is followed: {}",
        unfollowed()
    );
    let (_, ready) = get(r.port, "/readiness");
    assert!(
        ready.contains(r#""kv_events_unfollowed_workers":2"#),
        "{ready}"
    );
    // The router answers while it keeps trying.
    for _ in 0..5 {
        let t0 = Instant::now();
        assert_eq!(get(r.port, "/health").0, 200);
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
    let subscriptions = std::fs::read_dir(format!("/proc/{}/task", r._proc.pid().unwrap()))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.starts_with("kv-sub-"))
        .count();
    assert_eq!(
        subscriptions, 0,
        "no subscription was started for the greedy worker"
    );
    // The late engine comes up, after the router's first tries are long over.
    let (base, publishers) = rank_publishers(1);
    publishers[0].publish(stored(&[1, 2, 3, 4]));
    let descriptor = one_rank_descriptor(base);
    let _late = fake_worker_on(
        "127.0.0.1",
        late_port,
        "late",
        &["--kv-events-descriptor", &descriptor],
    );
    let followed = || metric(r.port, "rbgctl_router_kv_index_workers_followed ");
    assert!(
        wait_until(Duration::from_secs(60), || followed() == Some(1.0)
            && unfollowed() == 1.0),
        "the late worker's events were never followed ({:?} followed, {} not)",
        followed(),
        unfollowed()
    );
}

/// Item A10 and A17: a KV event message past the size the router takes is dropped before it
/// is read whole (the router's memory stays), and batches that do not decode are logged once
/// per period with a count, not once each.
#[test]
fn oversized_and_malformed_kv_event_messages_cost_the_router_little() {
    let (base, publishers) = rank_publishers(1);
    let descriptor = one_rank_descriptor(base);
    let w = fake_worker("w", &["--kv-events-descriptor", &descriptor]);
    publishers[0].publish(stored(&[1, 2, 3, 4]));
    let r = router(
        &s(&["--worker-urls", &w.url(), "--policy", "precise_prefix"]),
        true,
    );
    let pid = r._proc.pid().unwrap();
    let blocks = || metric(r.port, "rbgctl_router_kv_index_blocks ").unwrap_or(-1.0);
    assert!(wait_until(Duration::from_secs(20), || blocks() == 1.0));
    drop(publishers);
    // Our own PUB socket on the worker's port now: what a hostile publisher sends.
    let ctx = zmq::Context::new();
    let pub_socket = ctx.socket(zmq::PUB).unwrap();
    pub_socket.bind(&format!("tcp://127.0.0.1:{base}")).unwrap();
    let before = vm_bytes(pid, "VmRSS");
    let huge = vec![0x90u8; 100 << 20];
    let bad = [0xc1u8; 16];
    // Send until the router's subscription is back (a PUB drops what it sends before).
    for seq in 0..2_000u64 {
        let payload: &[u8] = if seq % 100 == 0 { &huge } else { &bad };
        pub_socket
            .send_multipart([&b""[..], &seq.to_be_bytes(), payload], 0)
            .unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let peak = vm_bytes(pid, "VmHWM");
    assert!(
        peak.saturating_sub(before) < 40 << 20,
        "the router grew from {} MB to {} MB",
        before >> 20,
        peak >> 20
    );
    let log = r._proc.log();
    let lines = log.matches("KV event batches that do not decode").count();
    assert!(lines <= 3, "{lines} warnings for malformed batches");
    assert_eq!(get(r.port, "/health").0, 200);
}

/// Item A7: the router's 16,384 connections cannot be held by slow bodies: 16,800 connections
/// from four addresses, each sending a `/generate`'s headers and one byte of its body, leave
/// `/health` answered within 5 s every time (without the gate: not at all while they hold), the
/// slow connections making way.
#[test]
fn slow_bodies_cannot_hold_the_routers_connections() {
    let _turn = measured_turn();
    // This test's 16,800 sockets, beside the other tests'.
    rbgctl::role::raise_open_files_limit(40_000);
    let w = fake_worker("w", &[]);
    let r = router(&s(&["--worker-urls", &w.url()]), true);
    let head = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{";
    let held = std::sync::atomic::AtomicUsize::new(0);
    let conns: Vec<std::net::TcpStream> = std::thread::scope(|scope| {
        let threads: Vec<_> = (2..=5u8)
            .map(|from| {
                let held = &held;
                scope.spawn(move || {
                    let mut open = Vec::new();
                    for _ in 0..4_200 {
                        let socket = socket2::Socket::new(
                            socket2::Domain::IPV4,
                            socket2::Type::STREAM,
                            None,
                        )
                        .unwrap();
                        // Source addresses no test listens on (other tests' servers take
                        // ports on 127.0.0.x, which these sockets' ports would collide with).
                        let local: std::net::SocketAddr = ([127, 0, 62, from], 0).into();
                        socket.bind(&local.into()).unwrap();
                        let remote: std::net::SocketAddr = ([127, 0, 0, 1], r.port).into();
                        if socket.connect(&remote.into()).is_err() {
                            continue;
                        }
                        let mut s: std::net::TcpStream = socket.into();
                        use std::io::Write;
                        if s.write_all(head).is_ok() {
                            held.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            open.push(s);
                        }
                    }
                    open
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    assert!(conns.len() > 16_384, "{} slow connections", conns.len());
    let mut answered = 0;
    for _ in 0..10 {
        let started = Instant::now();
        let ok = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap()
            .get(format!("http://127.0.0.1:{}/health", r.port))
            .send()
            .is_ok_and(|resp| resp.status() == 200);
        if ok && started.elapsed() < Duration::from_secs(5) {
            answered += 1;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(answered, 10, "{answered} of 10 health checks answered");
    drop(conns);
}

/// Item A14: the router's KV index shares its capacity by source: a worker announcing more
/// blocks than the index holds (2.5 million) evicts its own oldest, and another worker's
/// blocks stay known.
#[test]
fn one_worker_flooding_the_kv_index_does_not_evict_anothers_blocks() {
    use rbgctl::kv_events::{BlockStored, KvEvent, KvEventBatch, Medium};
    let (honest, honest_events) = worker_publishing("honest");
    let (flooder, flood) = worker_publishing("flooder");
    let tokens: Vec<u32> = (1..=32).collect();
    honest_events.publish(stored(&tokens));
    let r = router(
        &s(&[
            "--worker-urls",
            &honest.url(),
            &flooder.url(),
            "--policy",
            "precise_prefix",
        ]),
        true,
    );
    let blocks = || metric(r.port, "rbgctl_router_kv_index_blocks ").unwrap_or(0.0);
    assert!(wait_until(Duration::from_secs(20), || blocks() >= 8.0));
    let capacity = metric(r.port, "rbgctl_router_kv_index_capacity_blocks ").unwrap();
    let total = (capacity as i64) + 500_000;
    for start in (0..total).step_by(10_000) {
        let hashes: Vec<i64> = (start..(start + 10_000).min(total))
            .map(|h| h + (1 << 40))
            .collect();
        flood.publish(KvEventBatch {
            ts: 0.0,
            events: vec![KvEvent::BlockStored(BlockStored::new(
                hashes,
                None,
                vec![],
                4,
                Medium::Gpu,
            ))],
            attn_dp_rank: Some(0),
        });
        // The publisher's queue is bounded: keep pace with it.
        std::thread::sleep(Duration::from_millis(2));
    }
    let evicted = || metric(r.port, "rbgctl_router_kv_index_evicted_total ").unwrap_or(0.0);
    assert!(
        wait_until(Duration::from_secs(60), || evicted() >= 400_000.0),
        "the flood did not fill the index: {} evicted",
        evicted()
    );
    let body = json!({"token_ids": tokens, "block_size": 4}).to_string();
    let (code, _, text) = post(r.port, "/query", &body);
    assert_eq!(code, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["default"][honest.url()]["longest_matched"], 32, "{v}");
    drop(flooder);
}

/// Item A13: Conductor queries are read and hashed off the runtime threads, half the cores at
/// most: clients repeating 12 MB `/query`s with `block_size: 1` (every token a block) leave a
/// normal `/generate` answered promptly (before: p50 from 2.5 ms to 643 ms).
#[test]
fn long_conductor_queries_do_not_starve_the_requests_routed() {
    let _turn = measured_turn();
    let w = fake_worker("w", &[]);
    let r = router(
        &s(&["--worker-urls", &w.url(), "--policy", "precise_prefix"]),
        true,
    );
    let ids: Vec<u32> = (0..1_700_000).map(|i| 1_000_000 + i).collect();
    let query = json!({"token_ids": ids, "block_size": 1}).to_string();
    assert!(query.len() > 12 << 20 && query.len() < 16 << 20);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let queries = std::sync::atomic::AtomicUsize::new(0);
    let mut latencies = Vec::new();
    std::thread::scope(|scope| {
        for _ in 0..3 {
            scope.spawn(|| {
                // A 14 MB query takes seconds in a debug build on a loaded machine: these wait
                // longer than the other requests, whose latency is what the test measures.
                let slow = reqwest::blocking::Client::builder()
                    .timeout(Duration::from_secs(120))
                    .build()
                    .unwrap();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let resp = slow
                        .post(format!("http://127.0.0.1:{}/query", r.port))
                        .header("content-type", "application/json")
                        .body(query.clone())
                        .send()
                        .expect("a query is answered");
                    let code = resp.status().as_u16();
                    let text = resp.text().unwrap_or_default();
                    assert_eq!(code, 200, "{}", &text[..text.len().min(200)]);
                    queries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
        assert!(wait_until(Duration::from_secs(60), || queries
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 2));
        for _ in 0..40 {
            let t0 = Instant::now();
            assert_eq!(post(r.port, "/generate", r#"{"text":"hi"}"#).0, 200);
            latencies.push(t0.elapsed());
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    latencies.sort();
    let p50 = latencies[latencies.len() / 2];
    eprintln!("generate p50 {p50:?} beside long queries");
    assert!(
        p50 < Duration::from_millis(150),
        "/generate p50 {p50:?} while long queries ran"
    );
}

// ---------------------------------------------------------------------------------------------
// Tenants (issue 66): keys to tenants, limits, classes, a trusted front's header, reloads.

/// Waits up to `secs` for the sample `name` of the router on `port` to read `value`.
fn await_metric(port: u16, name: &str, value: f64, secs: u64) {
    assert!(
        wait_until(Duration::from_secs(secs), || metric(port, name)
            == Some(value)),
        "{name} never read {value} (now {:?})",
        metric(port, name)
    );
}

/// The `sha256:<hex>` entry of `key`, as a tenants file holds it.
fn key_entry(key: &str) -> String {
    rbgctl::router::tenants::table::key_entry(key)
}

/// A POST with headers; its status, headers and body.
fn post_as(
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, reqwest::header::HeaderMap, String) {
    let mut req = client()
        .post(format!("http://127.0.0.1:{port}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let r = req.send().unwrap();
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    (status, headers, r.text().unwrap())
}

/// A `/generate` of `body` with `key` as its bearer key.
fn generate_as(port: u16, key: &str, body: &str) -> (u16, reqwest::header::HeaderMap, String) {
    post_as(port, "/generate", &[("authorization", &bearer(key))], body)
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

/// A tenants file of three tenants: `chat` (interactive, may ask for batch), `bulk` (batch
/// only, 3 at once), `slow` (one request a second).
fn tenants_file(dir: &std::path::Path, ttl_secs: f64) -> std::path::PathBuf {
    let path = dir.join("tenants.toml");
    std::fs::write(
        &path,
        format!(
            "[[class]]\nname = \"interactive\"\nqueue_size = 2\nqueue_ttl_secs = {ttl_secs}\n\
             engine_priority = 7\n[[class]]\nname = \"batch\"\nqueue_size = 1\nqueue_ttl_secs = {ttl_secs}\n\
             [[tenant]]\nname = \"chat\"\nkeys = [\"{}\"]\nclasses = [\"interactive\", \"batch\"]\n\
             [[tenant]]\nname = \"bulk\"\nkeys = [\"{}\"]\nclasses = [\"batch\"]\nmax_concurrent = 3\n\
             [[tenant]]\nname = \"slow\"\nkeys = [\"{}\"]\nrequests_per_second = 1\n",
            key_entry("key-chat"),
            key_entry("key-bulk"),
            key_entry("key-slow"),
        ),
    )
    .unwrap();
    path
}

/// A router in front of `w` with `file`'s tenants and room for one request at a time.
fn one_slot_router(w: &Worker, file: &std::path::Path) -> Router {
    router(
        &s(&[
            "--worker-urls",
            &w.url(),
            "--max-concurrent-requests",
            "1",
            "--tenants-file",
            file.to_str().unwrap(),
        ]),
        true,
    )
}

/// Starts a stream of `key`'s that holds its slot while the worker answers (in a thread);
/// returns its status once it ends.
fn held_stream(port: u16, key: &'static str, text: &'static str) -> std::thread::JoinHandle<u16> {
    std::thread::spawn(move || {
        let resp = client()
            .post(format!("http://127.0.0.1:{port}/generate"))
            .header("authorization", bearer(key))
            .body(format!(r#"{{"text":"{text}","stream":true}}"#))
            .send()
            .unwrap();
        let status = resp.status().as_u16();
        read_chunks(resp);
        status
    })
}

#[test]
fn tenants_are_named_by_their_keys_and_classes_go_in_order_with_429_and_503() {
    let dir = tempfile::tempdir().unwrap();
    let file = tenants_file(dir.path(), 20.0);
    // Each answer streams 8 tokens 150 ms apart: a slot is held for about 1.2 s.
    let w = fake_worker("tenant-w", &["--token-delay-ms", "150", "--tokens", "8"]);
    let r = one_slot_router(&w, &file);
    let port = r.port;
    let gen = r#"{"text":"hello"}"#;
    // Who: no key and unknown keys are 401; a class the tenant may not use is 403.
    assert_eq!(post_as(port, "/generate", &[], gen).0, 401);
    assert_eq!(
        post_as(port, "/generate", &[("authorization", "Bearer nope")], gen).0,
        401
    );
    let (st, _, body) = post_as(
        port,
        "/generate",
        &[
            ("authorization", &bearer("key-bulk")),
            ("x-priority-class", "interactive"),
        ],
        gen,
    );
    assert_eq!(st, 403, "{body}");
    assert!(body.contains("its classes: batch"), "{body}");
    // A bulk stream holds the only slot; a bulk request waits in batch, then a chat one in
    // interactive: when the slot frees, chat goes first though it came last.
    let a = held_stream(port, "key-bulk", "first");
    await_metric(
        port,
        "rbgctl_router_tenant_running{tenant=\"bulk\"}",
        1.0,
        5,
    );
    let b =
        std::thread::spawn(move || generate_as(port, "key-bulk", r#"{"text":"batch-waiter"}"#).0);
    await_metric(port, "rbgctl_router_class_queued{class=\"batch\"}", 1.0, 5);
    // Batch's queue (1) is full: 503 with Retry-After.
    let (st, headers, body) = generate_as(port, "key-bulk", gen);
    assert_eq!(st, 503, "{body}");
    assert!(body.contains("queue of 1 is full"), "{body}");
    assert_eq!(headers["retry-after"], "1");
    let c = std::thread::spawn(move || {
        generate_as(
            port,
            "key-chat",
            r#"{"text":"interactive-waiter","priority":100}"#,
        )
        .0
    });
    await_metric(
        port,
        "rbgctl_router_class_queued{class=\"interactive\"}",
        1.0,
        5,
    );
    assert_eq!(a.join().unwrap(), 200);
    assert_eq!(c.join().unwrap(), 200);
    assert_eq!(b.join().unwrap(), 200);
    let order: Vec<String> = recorded(&w)
        .iter()
        .filter_map(|r| body_of(r)["text"].as_str().map(String::from))
        .filter(|t| t != "hello")
        .collect();
    assert_eq!(order, ["first", "interactive-waiter", "batch-waiter"]);
    // The interactive class's engine priority replaced the client's; batch has none.
    let priorities: Vec<Value> = recorded(&w)
        .iter()
        .map(|r| body_of(r)["priority"].clone())
        .collect();
    assert_eq!(priorities[..3], [Value::Null, json!(7), Value::Null]);
    // A tenant's key is the router's credential: never passed to the worker.
    assert!(
        recorded(&w)
            .iter()
            .all(|r| r["headers"].get("authorization").is_none()),
        "{:?}",
        recorded(&w)
    );
    // A tenant over its rate: 429 with Retry-After.
    assert_eq!(generate_as(port, "key-slow", gen).0, 200);
    let (st, headers, body) = generate_as(port, "key-slow", gen);
    assert_eq!(st, 429, "{body}");
    assert!(body.contains("over its request rate"), "{body}");
    assert_eq!(headers["retry-after"], "1");
    // The totals per tenant add up, output tokens settled from the answers' usage.
    let m = |s: &str| metric(port, s).unwrap_or(-1.0);
    assert_eq!(
        m("rbgctl_router_tenant_requests_total{tenant=\"bulk\",outcome=\"admitted\"}"),
        2.0
    );
    assert_eq!(
        m("rbgctl_router_tenant_requests_total{tenant=\"bulk\",outcome=\"queue_full\"}"),
        1.0
    );
    assert_eq!(
        m("rbgctl_router_tenant_requests_total{tenant=\"chat\",outcome=\"admitted\"}"),
        1.0
    );
    assert_eq!(
        m("rbgctl_router_tenant_requests_total{tenant=\"slow\",outcome=\"rate\"}"),
        1.0
    );
    assert_eq!(
        m("rbgctl_router_class_granted_total{class=\"interactive\"}"),
        1.0
    );
    assert!(m("rbgctl_router_tenant_tokens_total{tenant=\"chat\",kind=\"output\"}") >= 8.0);
    assert!(m("rbgctl_router_tenant_tokens_total{tenant=\"bulk\",kind=\"prompt\"}") >= 2.0);
    let (st, page) = get(port, "/ui");
    assert_eq!(st, 200);
    assert!(
        page.contains("id=\"tenants\"") && page.contains(">bulk<"),
        "{page}"
    );
}

#[test]
fn a_queued_request_past_its_class_ttl_is_503() {
    let dir = tempfile::tempdir().unwrap();
    let file = tenants_file(dir.path(), 0.5);
    let w = fake_worker(
        "tenant-ttl-w",
        &["--token-delay-ms", "200", "--tokens", "10"],
    );
    let r = one_slot_router(&w, &file);
    let port = r.port;
    let a = held_stream(port, "key-bulk", "holder");
    await_metric(
        port,
        "rbgctl_router_tenant_running{tenant=\"bulk\"}",
        1.0,
        5,
    );
    // Waits 0.5 s in interactive, then 503.
    let (st, headers, body) = generate_as(port, "key-chat", r#"{"text":"x"}"#);
    assert_eq!(st, 503, "{body}");
    assert!(body.contains("TTL"), "{body}");
    assert!(headers.contains_key("retry-after"));
    // So does a batch request.
    let b = std::thread::spawn(move || generate_as(port, "key-bulk", r#"{"text":"w"}"#).0);
    await_metric(port, "rbgctl_router_tenant_queued{tenant=\"bulk\"}", 1.0, 5);
    assert_eq!(a.join().unwrap(), 200);
    assert_eq!(
        b.join().unwrap(),
        503,
        "it waited past batch's TTL while the stream held the slot"
    );
    assert_eq!(
        metric(
            port,
            "rbgctl_router_tenant_requests_total{tenant=\"chat\",outcome=\"expired\"}"
        ),
        Some(1.0)
    );
}

#[test]
fn a_trusted_fronts_tenant_header_counts_only_from_it_and_a_garbage_file_keeps_the_keys() {
    let dir = tempfile::tempdir().unwrap();
    let file = tenants_file(dir.path(), 5.0);
    let w = fake_worker("tenant-front-w", &[]);
    let path = file.to_str().unwrap().to_string();
    let args = |from: &str| {
        s(&[
            "--worker-urls",
            &w.url(),
            "--tenants-file",
            &path,
            "--tenant-header",
            "x-tenant",
            "--tenant-header-trusted-from",
            from,
        ])
    };
    let gen = r#"{"text":"hi"}"#;
    // The front is elsewhere: a client naming a tenant is refused, even with a key.
    let r = router(&args("10.0.0.0/8"), true);
    let (st, _, body) = post_as(
        r.port,
        "/generate",
        &[("x-tenant", "chat"), ("authorization", &bearer("key-bulk"))],
        gen,
    );
    assert_eq!(st, 403, "{body}");
    assert!(body.contains("trusted front"), "{body}");
    assert_eq!(generate_as(r.port, "key-bulk", gen).0, 200);
    // This host is the front: its header names the tenant, no key needed.
    let front = router(&args("127.0.0.1"), true);
    assert_eq!(
        post_as(front.port, "/generate", &[("x-tenant", "chat")], gen).0,
        200
    );
    assert_eq!(
        post_as(front.port, "/generate", &[("x-tenant", "nobody")], gen).0,
        403
    );
    assert_eq!(
        metric(
            front.port,
            "rbgctl_router_tenant_requests_total{tenant=\"chat\",outcome=\"admitted\"}"
        ),
        Some(1.0)
    );
    // The file replaced by garbage: the keys read before stay in force, the error is counted.
    std::fs::write(&file, "[[tenant]]\nname = ").unwrap();
    await_metric(r.port, "rbgctl_router_tenants_reload_errors_total", 1.0, 10);
    assert_eq!(generate_as(r.port, "key-chat", gen).0, 200);
    // A good file with a new key: taken without a restart, the old keys gone.
    std::fs::write(
        &file,
        format!(
            "[[tenant]]\nname = \"chat\"\nkeys = [\"{}\"]\n",
            key_entry("key-new")
        ),
    )
    .unwrap();
    assert!(wait_until(Duration::from_secs(10), || generate_as(
        r.port, "key-new", gen
    )
    .0 == 200));
    assert_eq!(generate_as(r.port, "key-chat", gen).0, 401);
}

#[test]
fn ten_thousand_tenants_cost_the_router_a_bounded_memory_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.toml");
    let mut text = String::new();
    for i in 0..10_000 {
        text.push_str(&format!(
            "[[tenant]]\nname = \"t{i}\"\nkeys = [\"{}\"]\nrequests_per_second = 100\nmax_concurrent = 8\n",
            key_entry(&format!("key-{i}"))
        ));
    }
    std::fs::write(&file, text).unwrap();
    let w = fake_worker("tenant-many-w", &[]);
    let plain = router(&s(&["--worker-urls", &w.url()]), true);
    let r = router(
        &s(&[
            "--worker-urls",
            &w.url(),
            "--tenants-file",
            file.to_str().unwrap(),
        ]),
        true,
    );
    // Requests from 2,000 tenants (every fifth), each then known to admission.
    let c = client();
    for i in (0..10_000).step_by(5) {
        let st = c
            .post(format!("http://127.0.0.1:{}/generate", r.port))
            .header("authorization", bearer(&format!("key-{i}")))
            .body(r#"{"text":"x"}"#)
            .send()
            .unwrap()
            .status()
            .as_u16();
        assert_eq!(st, 200);
    }
    let rss = |r: &Router| vm_bytes(r._proc.pid().expect("running"), "VmRSS");
    let (with, without) = (rss(&r), rss(&plain));
    eprintln!("RSS: {with} bytes with 10,000 tenants (2,000 seen), {without} without");
    // docs/router.md states the bound: under 64 MiB more than a router without tenants.
    assert!(
        with < without + (64 << 20),
        "RSS {with} with 10,000 tenants, {without} without"
    );
    let (_, text) = get(r.port, "/metrics");
    let series = text
        .lines()
        .filter(|l| l.starts_with("rbgctl_router_tenant_requests_total{"))
        .count();
    // The first 1,000 of the file by name (200 of them seen), the other 1,800 summed as
    // `other`: five outcomes each.
    assert_eq!(series, (200 + 1) * 5);
    assert!(text.contains(
        "rbgctl_router_tenant_requests_total{tenant=\"other\",outcome=\"admitted\"} 1800"
    ));
    assert_eq!(metric(r.port, "rbgctl_router_tenants"), Some(10_000.0));
}
