//! `rbgctl bench operator`: how long the operator takes to bring up a large group, how many
//! API requests that costs, and how many writes a steady-state resync makes (goal: none).
//! Runs the operator in-process against the API server stand-in and its SIMULATED kubelet.

use crate::testkit::apiserver::{ApiServer, Kubelet, KubeletConfig};
use clap::Args;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct OperatorBenchArgs {
    /// Roles in the group (a dependency chain: role i depends on role i-1).
    #[arg(long, default_value_t = 3)]
    pub roles: u32,
    /// Replicas per role.
    #[arg(long, default_value_t = 100)]
    pub replicas: u32,
    /// Writes per second the operator allows itself (0: unlimited).
    #[arg(long, default_value_t = 0.0)]
    pub kube_api_qps: f64,
    /// Resync periods to watch for writes once the group is ready.
    #[arg(long, default_value_t = 3)]
    pub resyncs: u32,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn group(roles: u32, replicas: u32) -> Value {
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
           "metadata": {"name": "bench"}, "spec": {"roles": roles}})
}

fn ready(api: &ApiServer) -> bool {
    api.get("rolebasedgroups", "default", "bench")
        .and_then(|g| g.pointer("/status/conditions").cloned())
        .and_then(|c| c.as_array().cloned())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

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
    let dir = tempfile_dir()?;
    let kubeconfig = dir.join("config");
    std::fs::write(&kubeconfig, ApiServer::kubeconfig(port, "default"))?;
    let resync = 1u64;
    let op = crate::operator::OperatorArgs {
        namespace: None,
        kubeconfig: Some(kubeconfig),
        workers: 4,
        resync_secs: resync,
        kube_api_qps: args.kube_api_qps,
        kube_api_burst: args.kube_api_qps.max(1.0) * 2.0,
        inplace_timeout_secs: 300,
        leader_elect: false,
        lease_name: "rbgctl-operator".into(),
        lease_namespace: None,
        lease_duration_secs: 15,
        identity: Some("bench".into()),
        metrics_port: 0,
        metrics_host: "127.0.0.1".into(),
        watch_timeout_secs: 290,
    };
    let operator = crate::operator::start(
        op,
        crate::operator::Listeners { metrics: None },
        crate::shutdown::Shutdown::new(),
    )?;
    // Let the informers list before the clock starts.
    std::thread::sleep(Duration::from_millis(500));
    api.reset_counts();
    let pods = (args.roles * args.replicas) as usize;
    eprintln!(
        "SIMULATED kubelet; creating a group of {} roles x {} replicas ({pods} pods)",
        args.roles, args.replicas
    );
    let start = Instant::now();
    api.create(
        "rolebasedgroups",
        "default",
        group(args.roles, args.replicas),
    )
    .map_err(|e| anyhow::anyhow!("create: {}", e.message))?;
    let deadline = start + Duration::from_secs(300);
    while !ready(&api) {
        if Instant::now() > deadline {
            anyhow::bail!("group not ready after 300 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = start.elapsed();
    let created = api.counts();
    std::thread::sleep(Duration::from_millis(300));
    api.reset_counts();
    std::thread::sleep(
        Duration::from_secs(resync * args.resyncs as u64) + Duration::from_millis(200),
    );
    let steady = api.counts();
    let out = json!({
        "roles": args.roles, "replicas_per_role": args.replicas, "pods": pods,
        "seconds_to_ready": took.as_secs_f64(),
        "api_requests": created.total(), "api_writes": created.writes(),
        "api_requests_by_verb": created.by_verb,
        "requests_per_pod": created.total() as f64 / pods as f64,
        "steady_state_resyncs": args.resyncs,
        "steady_state_writes": steady.writes(),
        "steady_state_requests": steady.total(),
    });
    if args.json {
        println!("{out}");
    } else {
        println!("operator bench (API stand-in, SIMULATED kubelet)");
        println!(
            "  group                 {} roles x {} replicas = {pods} pods, dependency chain",
            args.roles, args.replicas
        );
        println!("  created and Ready in  {:.2} s", took.as_secs_f64());
        println!(
            "  API requests          {} ({} writes, {:.2} per pod)",
            created.total(),
            created.writes(),
            created.total() as f64 / pods as f64
        );
        println!("  by verb               {:?}", created.by_verb);
        println!(
            "  steady state          {} resyncs: {} writes, {} requests",
            args.resyncs,
            steady.writes(),
            steady.total()
        );
    }
    operator.stop()?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("rbgctl-bench-operator-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
