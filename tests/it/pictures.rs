//! Pictures, checked in a real browser: each benchmark report and each status page is loaded
//! in headless Chromium (Debian's `chromium`, no network), rendered to a PNG under
//! `target/pictures/`, and asserted to hold the expected charts (figures whose SVG names the
//! series) with no console errors. And the Grafana dashboards of `manifests/grafana/`: every
//! metric they query is exported by a running role.

use crate::common;

use common::pictures::*;
use common::*;
use rbgctl::engine::Addrs as EngineAddrs;
use rbgctl::launch::Spawned;
use rbgctl::testkit::browser::LoadOptions;
use std::path::Path;
use std::process::{Command, Stdio};

fn run_ok(c: &mut Command) {
    let out = c.stdin(Stdio::null()).output().expect("rbgctl runs");
    assert!(
        out.status.success(),
        "{:?} failed: {}",
        c,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_benchmark_report_renders_its_charts_in_a_browser() {
    let Some(mut b) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let o = LoadOptions::default();

    // bench store: its own master and store; GB/s per size against the machine's limits.
    let store = dir.path().join("store.html");
    run_ok(
        Command::new(BIN)
            .args([
                "bench",
                "store",
                "--segment-size",
                "256MiB",
                "--threads",
                "1",
            ])
            .args([
                "--sizes",
                "4KiB,1MiB",
                "--phase-time",
                "200ms",
                "--phase-ops",
                "500",
            ])
            .args(["--phase-bytes", "64MiB", "--no-shm", "--report"])
            .arg(&store),
    );
    check(
        &mut b,
        &file_url(&store),
        "bench-store",
        &o,
        &[
            (
                "gb-per-s-per-size",
                &[
                    "tcp put, 1 thread",
                    "tcp get, 1 thread",
                    "loopback TCP (this machine)",
                    "memcpy (this machine)",
                ],
            ),
            ("p99-per-size", &["tcp put, 1 thread", "tcp get, 1 thread"]),
        ],
    );

    // bench multiturn and bench serving against a SIMULATED engine.
    let launcher = launcher();
    let argv: Vec<String> = ["sim-engine", "--port", "0", "--decode-ms-per-token", "1"]
        .map(String::from)
        .to_vec();
    let e: Spawned<EngineAddrs> = launcher.spawn_argv("engine", &argv).unwrap();
    let port = e.addrs.http.port().to_string();
    let multiturn = dir.path().join("multiturn.html");
    run_ok(
        multiturn_command(&port, 6, 3, "50")
            .arg("--report")
            .arg(&multiturn),
    );
    let run = ["rate 50 req/s"];
    let page = check(
        &mut b,
        &file_url(&multiturn),
        "bench-multiturn",
        &o,
        &[
            ("ttft-cdf", &run),
            ("ttft-per-round", &run),
            ("hit-rate-per-round", &run),
            ("throughput-over-time", &run),
        ],
    );
    assert!(page.text.contains("Multi-turn benchmark"), "{}", page.text);
    // Issue 62, item B6: it says the engine was SIMULATED, in the table's units.
    assert!(page.text.contains("SIMULATED engine"), "{}", page.text);
    let html = std::fs::read_to_string(&multiturn).unwrap();
    assert!(html.contains("TTFT (ms)") && !html.contains("TTFT (s)"));
    let serving = dir.path().join("serving.html");
    run_ok(
        Command::new(BIN)
            .args(["bench", "serving", "--port", &port, "--num-prompts", "20"])
            .args(["--random-input-len", "64", "--random-output-len", "8"])
            .args([
                "--max-concurrency",
                "4",
                "--backend",
                "sglang-oai",
                "--report",
            ])
            .arg(&serving),
    );
    check(
        &mut b,
        &file_url(&serving),
        "bench-serving",
        &o,
        &[
            ("latency-cdf", &["TTFT", "end-to-end latency"]),
            ("itl-cdf", &["inter-token latency"]),
            ("throughput-over-time", &["output tokens/s"]),
        ],
    );

    // bench tiers: seed 000's two figures, its published numbers labelled beside ours.
    let cfg = common::small_tiers_config(dir.path());
    let tiers = dir.path().join("tiers.html");
    run_ok(
        Command::new(BIN)
            .args(["bench", "tiers", "--config"])
            .arg(&cfg)
            .args([
                "--num-clients",
                "8",
                "--num-rounds",
                "3",
                "--request-length",
                "256",
            ])
            .args([
                "--output-length",
                "8",
                "--disable-auto-run",
                "--request-rate",
                "40",
            ])
            .args(["--log-file", "", "--report"])
            .arg(&tiers),
    );
    let page = check(
        &mut b,
        &file_url(&tiers),
        "bench-tiers",
        &o,
        &[
            (
                "tiers-throughput",
                &[
                    "rbgctl input tok/s",
                    "seed 000 input tok/s",
                    "seed 000, as published (SGLang + Mooncake on GPUs)",
                    "rbgctl, this run (SIMULATED engines)",
                    "L1",
                    "L1+L2",
                    "L1+L2+L3",
                    "L1+L2+L3+disk",
                ],
            ),
            (
                "tiers-hit-rate-ttft",
                &[
                    "rbgctl hit rate",
                    "rbgctl mean TTFT",
                    "rbgctl p90 TTFT",
                    "seed 000 hit rate",
                    "seed 000 mean TTFT",
                    "seed 000 p90 TTFT",
                    // The seed's own figures, drawn on its bars.
                    "40.6%",
                    "64.7%",
                ],
            ),
            ("ttft-cdf", &["L1", "L1+L2", "L1+L2+L3", "L1+L2+L3+disk"]),
        ],
    );
    assert!(
        page.text.contains("15022.80"),
        "the seed's table: {}",
        page.text
    );
}

#[test]
fn the_browser_check_sees_script_errors_failed_loads_and_missing_figures() {
    let Some(mut b) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.html");
    std::fs::write(
        &bad,
        "<!DOCTYPE html><html><body><figure id=\"f\"><svg><text>one</text></svg></figure>\
         <img src=\"missing.png\"><script>console.error('said'); undefinedFunction();</script>\
         </body></html>",
    )
    .unwrap();
    let page = b.load(&file_url(&bad), &LoadOptions::default()).unwrap();
    let errors = page.errors.join("\n");
    assert!(errors.contains("said"), "{errors}");
    assert!(errors.contains("undefinedFunction"), "{errors}");
    assert!(errors.contains("missing.png"), "{errors}");
    assert_eq!(
        page.figure("f").map(|f| f.texts.clone()),
        Some(vec!["one".to_string()])
    );
    // With scripts off, the same page runs none of them.
    let quiet = LoadOptions {
        javascript: false,
        ..LoadOptions::default()
    };
    let page = b.load(&file_url(&bad), &quiet).unwrap();
    assert!(
        !page.errors.join("\n").contains("undefinedFunction"),
        "{:?}",
        page.errors
    );
}

/// Waits (up to 10 s) for the page's own script to have refreshed it once.
const REFRESHED: &str = "Number(document.body.dataset.refreshes) >= 1";

/// The last-minute rate of `op` (`put`, `get`) on the master's status page, if shown.
fn last_minute_rate(page: &str, op: &str) -> Option<f64> {
    let row = page
        .split(&format!("<td>{op} requests/s</td>"))
        .nth(1)?
        .split("</tr>")
        .next()?;
    row.rsplit("<td class=\"n\">")
        .next()?
        .strip_suffix("</td>")?
        .parse()
        .ok()
}

#[test]
fn the_master_status_page_shows_segments_objects_and_rates_with_and_without_scripts() {
    let Some(mut b) = browser() else { return };
    let c = Cluster::start(Opts::default());
    let client = c.client();
    let value = vec![7u8; 256 << 10];
    for i in 0..40 {
        client
            .put(&format!("page/{i}"), &value, &Default::default())
            .expect("put");
    }
    // Another client, which has not learnt where the values live: it asks the master.
    let reader = c.client();
    for i in 0..20 {
        assert_eq!(
            reader.get(&format!("page/{i}")).expect("get").len(),
            value.len()
        );
    }
    // The housekeeper samples once a second: wait until the last minute's rates cover the 40
    // puts and the 20 gets (a sample before them and one after), both above zero. (Checked
    // here, not after the pictures: on a loaded machine those can take past the minute.)
    let url = format!("http://127.0.0.1:{}/ui", c.metrics_port);
    assert!(
        wait_until(std::time::Duration::from_secs(20), || {
            let (_, body) = c.http_get("/ui?part=main");
            !body.contains("<td>—</td>")
                && ["put", "get"]
                    .iter()
                    .all(|op| last_minute_rate(&body, op).is_some_and(|r| r > 0.0))
        }),
        "no put and get rates after 20 s"
    );
    let live = LoadOptions {
        wait_for: Some(REFRESHED.into()),
        ..LoadOptions::default()
    };
    let page = check(
        &mut b,
        &url,
        "master-status",
        &live,
        &[("rates", &["puts", "gets", "evictions"])],
    );
    for want in [
        "store-0",
        "store-1",
        "Segments (2)",
        "put requests/s",
        "role",
        "single",
    ] {
        assert!(
            page.text.contains(want),
            "{want:?} not on the page: {}",
            page.text
        );
    }
    assert!(page.text.contains("live, refreshed"), "{}", page.text);
    // Without scripts: the same page from the server, never refreshed by a script.
    let off = LoadOptions {
        javascript: false,
        ..LoadOptions::default()
    };
    let page = check(
        &mut b,
        &url,
        "master-status-noscript",
        &off,
        &[("rates", &["puts", "gets", "evictions"])],
    );
    assert!(
        page.text.contains("store-1") && page.text.contains("reloads every 5 s"),
        "{}",
        page.text
    );
    // The segments' bars: the two stores hold the 40 objects between them.
    let (_, main) = c.http_get("/ui?part=main");
    assert!(
        main.contains("<td class=\"n\">40</td>"),
        "40 objects in memory: {main}"
    );
    assert!(
        main.matches("class=\"bar\"").count() >= 3,
        "memory and two segments: {main}"
    );
}

#[test]
fn the_router_status_page_shows_each_workers_health_circuit_and_load() {
    let Some(mut b) = browser() else { return };
    let launcher = launcher();
    let workers: Vec<_> = ["w1", "w2"]
        .iter()
        .map(|n| {
            rbgctl::testkit::fake_worker::spawn(&launcher, "127.0.0.1", 0, n, &["--threads", "1"])
                .expect("a FAKE worker starts")
        })
        .collect();
    let urls: Vec<String> = workers
        .iter()
        .map(|w| format!("http://127.0.0.1:{}", w.addrs.http.port()))
        .collect();
    let mut argv = router_argv(&["--worker-urls"]);
    argv.extend(urls.iter().cloned());
    argv.extend(["--policy".into(), "round_robin".into()]);
    let r: Spawned<rbgctl::router::Addrs> = launcher.spawn_argv("router", &argv).expect("router");
    let port = r.addrs.http.port();
    assert!(
        wait_until(std::time::Duration::from_secs(20), || http(
            port,
            "GET",
            "/readiness",
            b""
        )
        .0 == 200),
        "the router did not become ready"
    );
    for _ in 0..6 {
        let (status, _) = http(
            port,
            "POST",
            "/generate",
            br#"{"text":"hello","stream":false}"#,
        );
        assert_eq!(status, 200);
    }
    let live = LoadOptions {
        wait_for: Some(REFRESHED.into()),
        ..LoadOptions::default()
    };
    let page = check(
        &mut b,
        &format!("http://127.0.0.1:{port}/ui"),
        "router-status",
        &live,
        &[(
            "worker-load",
            &["in flight", "served", urls[0].as_str(), urls[1].as_str()],
        )],
    );
    assert!(page.text.contains("round_robin"), "{}", page.text);
    assert_eq!(
        page.text.matches("healthy").count() - page.text.matches("unhealthy").count(),
        3,
        "two workers healthy (and the summary): {}",
        page.text
    );
    assert!(page.text.contains("closed"), "{}", page.text);
}

/// The metric names in a PromQL expression: ours (`rbgctl_`), the router's SMG names
/// (`smg_`) and the engines' SGLang names (`sglang:`).
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = ["rbgctl_", "smg_", "sglang:"]
        .iter()
        .filter_map(|p| rest.find(p))
        .min()
    {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// The sample names a `/metrics` page holds (histograms' `_bucket`, `_sum`, `_count`).
fn sample_names(url: &str) -> std::collections::BTreeSet<String> {
    let text = reqwest::blocking::get(format!("{url}/metrics"))
        .and_then(|r| r.text())
        .unwrap_or_else(|e| panic!("{url}/metrics: {e}"));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

#[test]
fn every_metric_a_grafana_dashboard_queries_is_exported_by_a_running_role() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("up.toml");
    std::fs::write(
        &cfg,
        format!(
            "[pool]\nstores = 2\nsegment_size = \"32MiB\"\nmaster_port = 0\nmetadata_port = 0\nmetrics_port = 0\n\
             disk_tier_size = \"64MiB\"\ndisk_tier_dir = {:?}\n\
             [engines]\ncount = 2\nbase_port = 0\ndevice_cache_tokens = 1024\nhost_cache_tokens = 0\nbytes_per_token = 512\n\
             prefill_us_per_token = 20.0\ndecode_ms_per_token = 1.0\n[router]\nport = 0\npolicy = \"round_robin\"\n",
            dir.path().join("disk"),
        ),
    )
    .unwrap();
    let launcher = launcher();
    let argv = vec!["up".into(), "--config".into(), cfg.display().to_string()];
    let up = launcher
        .spawn_argv::<rbgctl::up::UpAddrs>("up", &argv)
        .expect("up starts");
    let a = &up.addrs;
    let router = a.router.clone().expect("a router");
    let port = router.rsplit(':').next().unwrap().to_string();
    // Traffic through every role: conversations through the router, pages through the pool.
    run_ok(&mut multiturn_command(&port, 6, 3, "inf"));
    // The engines reach the stores through shared memory: some traffic over TCP as well.
    run_ok(
        Command::new(BIN)
            .args([
                "bench",
                "store",
                "--master",
                a.master.as_deref().expect("a master"),
            ])
            .args([
                "--no-shm",
                "--allow-eviction",
                "--sizes",
                "4KiB",
                "--threads",
                "1",
            ])
            .args(["--phase-ops", "50", "--phase-time", "200ms", "--batch", "4"])
            .args(["--batch-value", "4KiB", "--exists-batch", "4"]),
    );
    let mut exported = std::collections::BTreeSet::new();
    let mut roles: Vec<String> = vec![router, a.master_metrics.clone().expect("a master")];
    roles.extend(a.engines.iter().cloned());
    roles.extend(a.store_metrics.iter().cloned());
    assert_eq!(a.store_metrics.len(), 2, "{:?}", a.store_metrics);
    for url in &roles {
        exported.extend(sample_names(url));
    }
    let dashboards = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/grafana");
    let mut checked = 0;
    for name in ["pool", "router", "engines"] {
        let path = dashboards.join(format!("{name}.json"));
        let d: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(
            d["uid"].as_str().is_some_and(|u| u.starts_with("rbgctl-")),
            "{name}"
        );
        let mut ids = std::collections::BTreeSet::new();
        for p in d["panels"].as_array().expect("panels") {
            assert!(
                ids.insert(p["id"].as_u64().expect("an id")),
                "{name}: duplicate id"
            );
            if p["type"] == "row" {
                continue;
            }
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{name}: {} has no query", p["title"]);
            for t in targets {
                let expr = t["expr"].as_str().expect("expr");
                let names = metric_names(expr);
                assert!(!names.is_empty(), "{name}: no metric in {expr}");
                for m in names {
                    let sample = if expr.contains(&format!("{m}_bucket")) {
                        format!("{m}_bucket")
                    } else {
                        m.clone()
                    };
                    assert!(
                        exported.contains(&sample) || exported.contains(&m),
                        "{name}.json, panel {}: {m} is not exported by any running role",
                        p["title"]
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 60, "only {checked} queries checked");
    eprintln!("{checked} metric references in 3 dashboards, all exported");
}

#[test]
fn metric_names_are_read_out_of_promql() {
    assert_eq!(
        metric_names("histogram_quantile(0.99, sum by (op, le) (rate(rbgctl_master_request_duration_seconds_bucket[5m])))"),
        ["rbgctl_master_request_duration_seconds_bucket"]
    );
    assert_eq!(
        metric_names(
            "sum(rate(sglang:cached_tokens_total[1m])) / sum(rate(sglang:prompt_tokens_total[1m]))"
        ),
        ["sglang:cached_tokens_total", "sglang:prompt_tokens_total"]
    );
    assert_eq!(metric_names("smg_worker_health"), ["smg_worker_health"]);
}
