//! `rbgctl bench operator`: the operator against the API server stand-in and its SIMULATED
//! kubelet, in one process. Four figures:
//!
//! 1. seed 002 (3 roles): seconds from the create to its first pod, and to Ready;
//! 2. API writes per minute at steady state for that group (goal: none);
//! 3. a large group (`--roles` x `--replicas`): seconds to Ready and API requests per pod;
//! 4. `--groups` groups of 3 roles: seconds until all are Ready, then the reconciles per second
//!    the operator sustains while every group is touched as fast as the API takes it (each
//!    touch is a metadata change that queues a reconcile and needs no write).

use crate::bench::kit::report::BenchReport;
use crate::operator::context::Kind;
use crate::testkit::apiserver::{ApiServer, Kubelet, KubeletConfig};
use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// `rbgctl bench operator`'s arguments.
#[derive(Debug, Args)]
pub struct OperatorBenchArgs {
    /// Roles in the large group (a dependency chain: role i depends on role i-1).
    #[arg(long, default_value_t = 3)]
    pub roles: u32,
    /// Replicas per role of the large group.
    #[arg(long, default_value_t = 100)]
    pub replicas: u32,
    /// Groups (3 roles x 1 replica each) for the reconcile-rate figure.
    #[arg(long, default_value_t = 200)]
    pub groups: u32,
    /// Seconds of steady state watched for writes (the operator resyncs every second here).
    #[arg(long, default_value_t = 10)]
    pub steady_secs: u64,
    /// Seconds every group is touched for the reconcile-rate figure.
    #[arg(long, default_value_t = 5)]
    pub storm_secs: u64,
    /// Writes per second the operator allows itself (0: unlimited).
    #[arg(long, default_value_t = 0.0)]
    pub kube_api_qps: f64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

const NS: &str = "default";
const SEED_002: &str = include_str!("../../tests/seeds/002-sglang-demo.yaml");
/// How long any one phase may take before the bench gives up.
const PHASE_LIMIT: Duration = Duration::from_secs(300);

fn chain_group(name: &str, roles: u32, replicas: u32) -> Value {
    let roles: Vec<Value> = (0..roles)
        .map(|i| {
            let deps: Vec<String> = if i == 0 {
                vec![]
            } else {
                vec![format!("role{}", i - 1)]
            };
            json!({"name": format!("role{i}"), "replicas": replicas, "dependencies": deps,
                   "standalonePattern": {"template": {"spec": {"containers": [
                       {"name": "c", "image": "rbgctl:bench", "command": ["rbgctl", "store"]}]}}}})
        })
        .collect();
    json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
           "metadata": {"name": name}, "spec": {"roles": roles}})
}

fn ready(api: &ApiServer, name: &str) -> bool {
    api.get("rolebasedgroups", NS, name).is_some_and(|g| {
        g["status"]["observedGeneration"] == g["metadata"]["generation"]
            && g["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
    })
}

/// Polls `f` every millisecond until it holds; the time it took.
fn until(what: &str, f: impl Fn() -> bool) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    while !f() {
        if t0.elapsed() > PHASE_LIMIT {
            anyhow::bail!("{what}: not after {} s", PHASE_LIMIT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(t0.elapsed())
}

/// What `bench operator` reports, one part per figure of the module's list.
#[derive(Debug, Serialize)]
struct Report {
    seed_002: SeedFigures,
    large_group: LargeGroupFigures,
    many_groups: ManyGroupsFigures,
}

/// Seed 002: to its first pod and to Ready, then its steady state.
#[derive(Debug, Serialize)]
struct SeedFigures {
    seconds_to_first_pod: f64,
    seconds_to_ready: f64,
    steady_state_seconds: u64,
    steady_state_reconciles: f64,
    steady_state_writes: u64,
    steady_state_writes_per_minute: f64,
}

/// One large group: to Ready, and the API requests it took.
#[derive(Debug, Serialize)]
struct LargeGroupFigures {
    roles: u32,
    replicas_per_role: u32,
    pods: usize,
    seconds_to_ready: f64,
    api_requests: u64,
    api_writes: u64,
    api_requests_by_verb: std::collections::BTreeMap<String, u64>,
    requests_per_pod: f64,
}

/// Many groups: bringing them up, then touching each as fast as the API takes it.
#[derive(Debug, Serialize)]
struct ManyGroupsFigures {
    groups: u32,
    pods: u32,
    seconds_to_all_ready: f64,
    reconciles_per_second_bringing_up: f64,
    touch_seconds: f64,
    touches: u64,
    reconciles_per_second_sustained: f64,
    operator_writes_while_touched: u64,
}

impl BenchReport for Report {
    fn table(&self) -> String {
        let (seed, large, many) = (&self.seed_002, &self.large_group, &self.many_groups);
        format!(
            "operator bench (API stand-in, SIMULATED kubelet, one process)\n\
             \x20 seed 002 (3 roles)     first pod {:.3} s after the create; Ready in {:.3} s\n\
             \x20 steady state           {} writes in {} s ({:.1}/min) over {:.0} reconciles\n\
             \x20 large group            {} roles x {} = {} pods Ready in {:.2} s; {} requests ({} writes, {:.2} per pod)\n\
             \x20 {} groups             all Ready in {:.2} s ({:.0} reconciles/s while bringing up)\n\
             \x20 sustained              {:.0} reconciles/s with {} groups ({} touches in {:.1} s, {} operator writes)\n",
            seed.seconds_to_first_pod,
            seed.seconds_to_ready,
            seed.steady_state_writes,
            seed.steady_state_seconds,
            seed.steady_state_writes_per_minute,
            seed.steady_state_reconciles,
            large.roles,
            large.replicas_per_role,
            large.pods,
            large.seconds_to_ready,
            large.api_requests,
            large.api_writes,
            large.requests_per_pod,
            many.groups,
            many.seconds_to_all_ready,
            many.reconciles_per_second_bringing_up,
            many.reconciles_per_second_sustained,
            many.groups,
            many.touches,
            many.touch_seconds,
            many.operator_writes_while_touched,
        )
    }
}

/// Writes by the operator (its user agent), leases aside.
fn operator_writes(api: &ApiServer) -> u64 {
    api.counts()
        .writes_by_agent
        .iter()
        .filter(|(a, _)| a.starts_with("rbgctl-operator/"))
        .map(|(_, n)| n)
        .sum()
}

/// The operator's metrics, read from its port.
fn metric(port: u16, line_prefix: &str) -> anyhow::Result<f64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    text.lines()
        .find_map(|l| l.strip_prefix(line_prefix))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no metric {line_prefix:?}"))
}

fn group_reconciles(port: u16) -> anyhow::Result<f64> {
    metric(
        port,
        &format!(
            "rbgctl_operator_reconciles_total{{kind=\"{}\"}} ",
            Kind::Group.label()
        ),
    )
}

/// Runs `rbgctl bench operator` by its arguments: progress on standard error, the report on
/// standard output (`--json`, `--report` as asked).
pub fn run(args: OperatorBenchArgs) -> anyhow::Result<()> {
    let api = ApiServer::new();
    let port = api.serve()?;
    let kubelet = Kubelet::new(
        &api,
        KubeletConfig {
            start_delay: Duration::from_millis(0),
            stop_delay: Duration::from_millis(0),
            tick: Duration::from_millis(10),
        },
    );
    kubelet.spawn_thread();
    let dir = std::env::temp_dir().join(format!("rbgctl-bench-operator-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let kubeconfig = dir.join("config");
    std::fs::write(&kubeconfig, ApiServer::kubeconfig(port, NS))?;
    let op = crate::operator::OperatorConfig {
        kubeconfig: Some(kubeconfig),
        resync_secs: 1,
        kube_api_qps: args.kube_api_qps,
        kube_api_burst: args.kube_api_qps.max(1.0) * 2.0,
        leader_elect: false,
        identity: Some("bench".into()),
        metrics_port: 0,
        metrics_host: "127.0.0.1".into(),
        ..crate::operator::OperatorConfig::default()
    };
    let listeners = crate::operator::Listeners::bind(&op)?;
    let operator = crate::operator::start(op, listeners, crate::shutdown::Shutdown::new())?;
    let metrics_port = operator
        .addrs
        .metrics
        .map(|a| a.port())
        .ok_or_else(|| anyhow::anyhow!("the operator has no metrics port"))?;
    // The informers have listed when a first resync has run.
    until("operator started", || {
        group_reconciles(metrics_port).is_ok()
    })?;
    std::thread::sleep(Duration::from_millis(300));

    // 1 + 2: seed 002.
    let seed = serde_yaml_ng::Deserializer::from_str(SEED_002)
        .filter_map(|d| <Value as serde::Deserialize>::deserialize(d).ok())
        .find(|v| v["kind"] == "RoleBasedGroup")
        .ok_or_else(|| anyhow::anyhow!("seed 002 has no RoleBasedGroup"))?;
    let seed_name = seed["metadata"]["name"].as_str().unwrap_or("").to_string();
    eprintln!("SIMULATED kubelet; seed 002 ({seed_name}, 3 roles)");
    let t0 = Instant::now();
    api.create("rolebasedgroups", NS, seed)
        .map_err(|e| anyhow::anyhow!("create: {}", e.message))?;
    let selector = format!("rbg.workloads.x-k8s.io/group-name={seed_name}");
    until("first pod of seed 002", || {
        !api.list("pods", NS, &selector).is_empty()
    })?;
    let first_pod = t0.elapsed();
    until("seed 002 Ready", || ready(&api, &seed_name))?;
    let seed_ready = t0.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    eprintln!(
        "watching {} s of steady state (a resync every second)",
        args.steady_secs
    );
    api.reset_counts();
    let r0 = group_reconciles(metrics_port)?;
    std::thread::sleep(Duration::from_secs(args.steady_secs.max(1)));
    let steady_writes = operator_writes(&api);
    let steady_reconciles = group_reconciles(metrics_port)? - r0;
    let writes_per_minute = steady_writes as f64 * 60.0 / args.steady_secs.max(1) as f64;

    // 3: the large group.
    let pods = (args.roles * args.replicas) as usize;
    eprintln!(
        "a group of {} roles x {} replicas ({pods} pods)",
        args.roles, args.replicas
    );
    api.reset_counts();
    let t0 = Instant::now();
    api.create(
        "rolebasedgroups",
        NS,
        chain_group("bench", args.roles, args.replicas),
    )
    .map_err(|e| anyhow::anyhow!("create: {}", e.message))?;
    until("the large group Ready", || ready(&api, "bench"))?;
    let large_ready = t0.elapsed();
    let large = api.counts();

    // 4: many groups, then the sustained reconcile rate.
    eprintln!("{} groups of 3 roles x 1 replica", args.groups);
    let names: Vec<String> = (0..args.groups).map(|i| format!("many-{i}")).collect();
    let r0 = group_reconciles(metrics_port)?;
    let t0 = Instant::now();
    for n in &names {
        api.create("rolebasedgroups", NS, chain_group(n, 3, 1))
            .map_err(|e| anyhow::anyhow!("create {n}: {}", e.message))?;
    }
    until("every group Ready", || names.iter().all(|n| ready(&api, n)))?;
    let many_ready = t0.elapsed();
    let bringup_rate = (group_reconciles(metrics_port)? - r0) / many_ready.as_secs_f64();
    eprintln!(
        "touching every group for {} s (annotation changes: a reconcile each, no write needed)",
        args.storm_secs
    );
    std::thread::sleep(Duration::from_millis(500));
    api.reset_counts();
    let r0 = group_reconciles(metrics_port)?;
    let t0 = Instant::now();
    let storm = Duration::from_secs(args.storm_secs.max(1));
    let mut touches = 0u64;
    'storm: loop {
        for n in &names {
            if t0.elapsed() >= storm {
                break 'storm;
            }
            let _ = api.merge_patch(
                "rolebasedgroups",
                NS,
                n,
                false,
                json!({"metadata": {"annotations": {"bench.rbgctl/touch": touches.to_string()}}}),
            );
            touches += 1;
        }
    }
    let storm_took = t0.elapsed();
    let storm_reconciles = group_reconciles(metrics_port)? - r0;
    let sustained = storm_reconciles / storm_took.as_secs_f64();
    let storm_writes = operator_writes(&api);

    let report = Report {
        seed_002: SeedFigures {
            seconds_to_first_pod: first_pod.as_secs_f64(),
            seconds_to_ready: seed_ready.as_secs_f64(),
            steady_state_seconds: args.steady_secs,
            steady_state_reconciles: steady_reconciles,
            steady_state_writes: steady_writes,
            steady_state_writes_per_minute: writes_per_minute,
        },
        large_group: LargeGroupFigures {
            roles: args.roles,
            replicas_per_role: args.replicas,
            pods,
            seconds_to_ready: large_ready.as_secs_f64(),
            api_requests: large.total(),
            api_writes: large.writes(),
            requests_per_pod: large.total() as f64 / pods.max(1) as f64,
            api_requests_by_verb: large.by_verb,
        },
        many_groups: ManyGroupsFigures {
            groups: args.groups,
            pods: args.groups * 3,
            seconds_to_all_ready: many_ready.as_secs_f64(),
            reconciles_per_second_bringing_up: bringup_rate,
            touch_seconds: storm_took.as_secs_f64(),
            touches,
            reconciles_per_second_sustained: sustained,
            operator_writes_while_touched: storm_writes,
        },
    };
    report.publish(args.json, None)?;
    operator.stop()?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
