//! The Mooncake store measured beside rbgctl in the same run (`bench store --mooncake-python`):
//! runs `scripts/mooncake_peer.py` (embedded in the binary) with a Python that has the
//! `mooncake-transfer-engine-non-cuda` wheel, which starts Mooncake's master, one storage process
//! and a client in the topology rbgctl's rows use, and reads back its rows. The same script runs
//! the same wheel client against rbgctl's master and store (`PeerPlan::on_master`), so that
//! Mooncake's own client is measured on both pools in one run.

use super::stats::PhaseResult;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SCRIPT: &str = include_str!("../../../scripts/mooncake_peer.py");

/// Longest the peer may run: its phases are bounded by the same time and size limits as ours.
const LIMIT: Duration = Duration::from_secs(600);

/// What the peer run is told: the same phases as rbgctl's single-thread TCP rows.
pub struct PeerPlan {
    pub sizes: Vec<u64>,
    pub phase_time: Duration,
    pub phase_ops: u64,
    pub phase_bytes: u64,
    pub batch: usize,
    pub batch_value: u64,
    pub segment: u64,
    /// Run the wheel's client against this master (rbgctl's) instead of starting Mooncake's.
    pub on_master: Option<String>,
    /// Mooncake's RDMA transport on these devices (`None`: its TCP transport).
    pub rdma_device: Option<String>,
    /// The client's local buffer (Mooncake's staging for calls without registered memory).
    pub buffer: u64,
}

/// What one run of the peer script measured.
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize)]
pub struct PeerRun {
    pub rows: Vec<PhaseResult>,
    /// Master RPCs the client's calls made (by the calls' count: Mooncake's client makes two
    /// per put, one per get, batch or exists).
    pub client_rpcs: u64,
    /// The client's calls (a batch is one).
    #[serde(default)]
    pub client_calls: u64,
    /// CPU time the master spent while the client ran: Mooncake's when the script started
    /// it, rbgctl's as the benchmark measured it.
    pub master_cpu_seconds: Option<f64>,
    /// The same for the process that holds the segment (Mooncake's storage process, or
    /// rbgctl's store).
    #[serde(default)]
    pub store_cpu_seconds: Option<f64>,
}

impl PeerRun {
    /// Master CPU per RPC, in microseconds.
    pub fn master_cpu_us_per_rpc(&self) -> Option<f64> {
        let cpu = self.master_cpu_seconds?;
        (self.client_rpcs > 0).then(|| cpu * 1e6 / self.client_rpcs as f64)
    }

    /// CPU of the segment's process per client call, in microseconds.
    pub fn store_cpu_us_per_call(&self) -> Option<f64> {
        let cpu = self.store_cpu_seconds?;
        (self.client_calls > 0).then(|| cpu * 1e6 / self.client_calls as f64)
    }
}

impl PeerRun {
    /// Several runs of the same plan as one: each row the run whose ops/s is the median of
    /// that row's (so one noisy moment of a shared machine moves no row), the servers' CPU
    /// and the client's RPCs and calls summed over the runs.
    pub fn median_of(runs: Vec<PeerRun>) -> PeerRun {
        let Some(first) = runs.first() else {
            return PeerRun::default();
        };
        let rows = first
            .rows
            .iter()
            .map(|row| {
                let mut same: Vec<&PhaseResult> = runs
                    .iter()
                    .filter_map(|r| {
                        r.rows
                            .iter()
                            .find(|o| o.op == row.op && o.value_bytes == row.value_bytes)
                    })
                    .collect();
                same.sort_by(|a, b| a.ops_per_s.total_cmp(&b.ops_per_s));
                same[same.len() / 2].clone()
            })
            .collect();
        PeerRun {
            rows,
            client_rpcs: runs.iter().map(|r| r.client_rpcs).sum(),
            client_calls: runs.iter().map(|r| r.client_calls).sum(),
            master_cpu_seconds: runs.iter().map(|r| r.master_cpu_seconds).sum(),
            store_cpu_seconds: runs.iter().map(|r| r.store_cpu_seconds).sum(),
        }
    }
}

/// One row of rbgctl beside the same row of the peer.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Versus {
    pub op: String,
    pub value_bytes: u64,
    pub rbgctl_ops_per_s: f64,
    pub peer_ops_per_s: f64,
    /// rbgctl's throughput over the peer's (objects or bytes per second: the same ratio).
    pub ratio: f64,
    /// Median latency of a call, on rbgctl and on the peer.
    pub rbgctl_p50_us: f64,
    pub peer_p50_us: f64,
    /// The client process's own CPU time per call (all its threads), on rbgctl and on the
    /// peer, when the client reports it (the wheel's rows): a row whose calls cost the client
    /// about their whole latency is bound by the client, whatever the servers do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rbgctl_client_cpu_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_client_cpu_us: Option<f64>,
}

/// Runs the peer; answers its rows (case `mooncake tcp`, or `mooncake client on rbgctl tcp`).
pub fn run(python: &Path, plan: &PeerPlan) -> anyhow::Result<PeerRun> {
    let script =
        std::env::temp_dir().join(format!("rbgctl-mooncake-peer-{}.py", std::process::id()));
    std::fs::write(&script, SCRIPT)?;
    let rows = run_script(python, &script, plan);
    let _ = std::fs::remove_file(&script);
    rows
}

fn run_script(python: &Path, script: &Path, plan: &PeerPlan) -> anyhow::Result<PeerRun> {
    let sizes: Vec<String> = plan.sizes.iter().map(u64::to_string).collect();
    let mut command = Command::new(python);
    if let Some(master) = &plan.on_master {
        command.args([
            script.as_os_str(),
            "run".as_ref(),
            "--on-master".as_ref(),
            master.as_ref(),
        ]);
    } else {
        command.arg(script).arg("run");
    }
    let mut child = command
        .args(["--sizes", &sizes.join(",")])
        .args(["--phase-time", &plan.phase_time.as_secs_f64().to_string()])
        .args(["--phase-ops", &plan.phase_ops.to_string()])
        .args(["--phase-bytes", &plan.phase_bytes.to_string()])
        .args(["--batch", &plan.batch.to_string()])
        .args(["--batch-value", &plan.batch_value.to_string()])
        .args(["--segment", &plan.segment.to_string()])
        .args(["--buffer", &plan.buffer.to_string()])
        .args(match &plan.rdma_device {
            Some(device) => vec!["--protocol", "rdma", "--device", device.as_str()],
            None => vec![],
        })
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", python.display()))?;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!(
                "the Mooncake peer ran longer than {} s; killed",
                LIMIT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    if !status.success() {
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        anyhow::bail!(
            "the Mooncake peer failed ({status}): {}",
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        );
    }
    let json = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| anyhow::anyhow!("the Mooncake peer printed no rows"))?;
    Ok(serde_json::from_str(json)?)
}

/// Pairs rbgctl's single-thread TCP rows with the peer's rows of the same operation and size.
pub fn versus(ours: &[PhaseResult], peer: &[PhaseResult]) -> Vec<Versus> {
    versus_case(ours, "tcp", peer)
}

/// Pairs `ours` rows of `case` on one thread with the peer's of the same operation and size.
pub fn versus_case(ours: &[PhaseResult], case: &str, peer: &[PhaseResult]) -> Vec<Versus> {
    peer.iter()
        .filter_map(|p| {
            let o = ours.iter().find(|o| {
                o.case == case && o.threads == 1 && o.op == p.op && o.value_bytes == p.value_bytes
            })?;
            Some(Versus {
                op: p.op.clone(),
                value_bytes: p.value_bytes,
                rbgctl_ops_per_s: o.ops_per_s,
                peer_ops_per_s: p.ops_per_s,
                ratio: if p.ops_per_s > 0.0 {
                    o.ops_per_s / p.ops_per_s
                } else {
                    f64::INFINITY
                },
                rbgctl_p50_us: o.p50_us,
                peer_p50_us: p.p50_us,
                rbgctl_client_cpu_us: o.client_cpu_us,
                peer_client_cpu_us: p.client_cpu_us,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_combine_by_each_rows_median() {
        let row = |op: &str, ops_per_s: f64| PhaseResult {
            op: op.into(),
            value_bytes: 4096,
            ops_per_s,
            ..Default::default()
        };
        let run = |put, get, cpu: Option<f64>| PeerRun {
            rows: vec![row("put", put), row("get", get)],
            client_rpcs: 10,
            client_calls: 5,
            master_cpu_seconds: cpu,
            store_cpu_seconds: cpu.map(|c| c / 2.0),
        };
        let m = PeerRun::median_of(vec![
            run(1.0, 30.0, Some(1.0)),
            run(3.0, 10.0, Some(2.0)),
            run(2.0, 20.0, Some(3.0)),
        ]);
        let got: Vec<f64> = m.rows.iter().map(|r| r.ops_per_s).collect();
        assert_eq!(got, [2.0, 20.0]);
        assert_eq!((m.client_rpcs, m.master_cpu_seconds), (30, Some(6.0)));
        assert_eq!((m.client_calls, m.store_cpu_seconds), (15, Some(3.0)));
        assert_eq!(m.store_cpu_us_per_call(), Some(200_000.0));
        // A run without the master's CPU leaves the sum unknown.
        let m = PeerRun::median_of(vec![run(1.0, 1.0, None), run(1.0, 1.0, Some(1.0))]);
        assert_eq!(m.master_cpu_seconds, None);
        assert!(PeerRun::median_of(Vec::new()).rows.is_empty());
    }

    fn row(case: &str, op: &str, value: u64, threads: usize, ops_per_s: f64) -> PhaseResult {
        PhaseResult {
            case: case.into(),
            op: op.into(),
            value_bytes: value,
            threads,
            ops_per_s,
            ..PhaseResult::default()
        }
    }

    #[test]
    fn rows_pair_by_operation_and_size_on_one_thread_over_tcp() {
        let ours = [
            row("tcp", "put", 4096, 1, 20_000.0),
            row("tcp", "put", 4096, 4, 50_000.0),
            row("shm", "get", 4096, 1, 90_000.0),
            row("tcp", "get", 4096, 1, 70_000.0),
        ];
        let peer = [
            row("mooncake tcp", "put", 4096, 1, 4_000.0),
            row("mooncake tcp", "get", 4096, 1, 0.0),
            row("mooncake tcp", "put", 65536, 1, 1.0),
        ];
        let v = versus(&ours, &peer);
        assert_eq!(v.len(), 2, "no rbgctl row for 64 KiB: left out");
        assert_eq!((v[0].op.as_str(), v[0].ratio), ("put", 5.0));
        assert!(v[1].ratio.is_infinite());
    }
}
