//! `rbgctl bench hicache`: SGLang's L3 page traffic — batches of KV pages (128 pages of 256 KiB
//! by default) put and read back — from the Rust client and from the Python HiCache backend
//! (`python/`, its `batch_set_v1` / `batch_get_v1`), on the same pool, over TCP and through
//! same-host shared memory, beside the machine's loopback and memcpy limits.

use super::kit::cluster::master_or_own;
use super::kit::limits;
use super::kit::stats::percentile;
use crate::bench::kit::report::BenchReport;
use crate::client::{Client, ClientConfig, ReplicateConfig};
use crate::config::{human_bytes, ByteSize};
use anyhow::{bail, Context};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// `rbgctl bench hicache`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct HicacheBenchArgs {
    /// An existing master (host:port); by default the benchmark starts a master and one store.
    #[arg(long)]
    pub master: Option<String>,
    /// Segment size of the store it starts.
    #[arg(long, default_value = "2GiB")]
    pub segment_size: ByteSize,
    /// Whether the store it starts keeps its objects across restarts (true/false).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub persistent: bool,
    /// Pages per batch (SGLang's STORAGE_BATCH_SIZE is 128).
    #[arg(long, default_value_t = 128)]
    pub pages: usize,
    /// Bytes per page (K and V of all layers for `page_size` tokens).
    #[arg(long, default_value = "256KiB")]
    pub page_size: ByteSize,
    /// Most batches of each kind per client and path.
    #[arg(long, default_value_t = 20)]
    pub rounds: usize,
    /// Stop starting batches after this many seconds per client and path.
    #[arg(long, default_value_t = 10.0)]
    pub max_seconds: f64,
    /// The Python interpreter that runs the Python side.
    #[arg(long, env = "RBGCTL_PYTHON", default_value = "python3")]
    pub python: String,
    /// A directory put first on PYTHONPATH, for running the package from a checkout
    /// (`python/src`); not needed once it is installed with pip.
    #[arg(long)]
    pub python_path: Option<PathBuf>,
    /// Skip the Python client.
    #[arg(long)]
    pub no_python: bool,
    /// Skip the same-host shared-memory cases.
    #[arg(long)]
    pub no_shm: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One row: a client moving batches of pages one way on one path.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Row {
    pub client: String,
    pub path: String,
    pub op: String,
    pub pages: usize,
    pub page_bytes: u64,
    pub batches: usize,
    pub errors: u64,
    pub pages_per_s: f64,
    pub gb_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

#[derive(Debug, serde::Deserialize)]
struct PythonReport {
    crc32c: String,
    results: Vec<Row>,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    loopback_tcp_gb_per_s: f64,
    memcpy_gb_per_s: f64,
    /// Pages in a batch, and each page's bytes.
    pages: usize,
    page_bytes: u64,
    persistent: bool,
    python_crc32c: Option<String>,
    rows: Vec<Row>,
}

fn row(
    client: &str,
    path: &str,
    op: &str,
    args: &HicacheBenchArgs,
    lat: Vec<Duration>,
    errors: u64,
) -> Row {
    let mut lat = lat;
    lat.sort_unstable();
    let spent: f64 = lat.iter().map(Duration::as_secs_f64).sum();
    let n = lat.len();
    let pages = (args.pages * n) as f64;
    let rate = |x: f64| if spent > 0.0 { x / spent } else { 0.0 };
    Row {
        client: client.into(),
        path: path.into(),
        op: op.into(),
        pages: args.pages,
        page_bytes: args.page_size.0,
        batches: n,
        errors,
        pages_per_s: rate(pages),
        gb_per_s: rate(pages * args.page_size.0 as f64) / 1e9,
        p50_ms: percentile(&lat, 0.5).as_secs_f64() * 1e3,
        p99_ms: percentile(&lat, 0.99).as_secs_f64() * 1e3,
    }
}

/// Batches of pages through the Rust client: `batch_put`, then `batch_get_into` of the same
/// keys, then removal, as many rounds as the budget allows.
fn rust_case(master: &str, shm: bool, args: &HicacheBenchArgs) -> anyhow::Result<Vec<Row>> {
    let client = Client::connect(ClientConfig {
        same_host_shm: shm,
        ..ClientConfig::new(master)
    })?;
    let size = args.page_size.0 as usize;
    let pages: Vec<Vec<u8>> = (0..args.pages)
        .map(|i| (0..size).map(|j| (i * 31 + j * 7) as u8).collect())
        .collect();
    let values: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    let mut bufs: Vec<Vec<u8>> = (0..args.pages).map(|_| vec![0u8; size]).collect();
    let cfg = ReplicateConfig {
        replica_num: 1,
        ..Default::default()
    };
    let run = fastrand::u64(..);
    let (mut put_lat, mut get_lat, mut put_err, mut get_err) = (vec![], vec![], 0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs_f64(args.max_seconds);
    for round in 0..args.rounds {
        if round > 0 && Instant::now() > deadline {
            break;
        }
        let keys: Vec<String> = (0..args.pages)
            .map(|i| format!("bench/hicache/{run:x}/{round}/{i}"))
            .collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let t = Instant::now();
        put_err += client
            .batch_put(&refs, &values, &cfg)
            .iter()
            .filter(|r| r.is_err())
            .count() as u64;
        put_lat.push(t.elapsed());
        let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let t = Instant::now();
        get_err += client
            .batch_get_into(&refs, &mut slices)
            .iter()
            .filter(|r| !matches!(r, Ok(n) if *n == size))
            .count() as u64;
        get_lat.push(t.elapsed());
        if round == 0 && bufs != pages {
            bail!("pages read back differ from the pages written");
        }
        let _ = client.batch_remove(&refs, true);
    }
    let path = if shm { "shm" } else { "tcp" };
    Ok(vec![
        row("rust", path, "batch_put", args, put_lat, put_err),
        row("rust", path, "batch_get_into", args, get_lat, get_err),
    ])
}

/// The interpreter for the Python side: `--python` (or `RBGCTL_PYTHON`), else the active
/// virtualenv's (`$VIRTUAL_ENV/bin/python`), else `python3`.
fn interpreter(args: &HicacheBenchArgs) -> String {
    if args.python != "python3" {
        return args.python.clone();
    }
    match std::env::var_os("VIRTUAL_ENV").map(|v| PathBuf::from(v).join("bin/python")) {
        Some(p) if p.exists() => p.display().to_string(),
        _ => args.python.clone(),
    }
}

/// The interpreter with `--python-path` put first on its PYTHONPATH.
fn python_command(args: &HicacheBenchArgs) -> Command {
    let mut cmd = Command::new(interpreter(args));
    if let Some(p) = &args.python_path {
        let mut path = p.as_os_str().to_owned();
        if let Some(old) = std::env::var_os("PYTHONPATH") {
            path.push(":");
            path.push(old);
        }
        cmd.env("PYTHONPATH", path);
    }
    cmd
}

/// Checks, before anything is measured, that the Python side can run at all.
fn python_ready(args: &HicacheBenchArgs) -> anyhow::Result<()> {
    let python = interpreter(args);
    let out = python_command(args)
        .args(["-c", "import rbgctl.hicache, rbgctl.bench"])
        .output();
    let why = match out {
        Ok(o) if o.status.success() => return Ok(()),
        Ok(o) => String::from_utf8_lossy(&o.stderr)
            .lines()
            .last()
            .unwrap_or("")
            .to_string(),
        Err(e) => e.to_string(),
    };
    bail!(
        "the Python side cannot run with {python} ({why}): install the package into that \
         interpreter (`{python} -m pip install ./python`), point --python (or RBGCTL_PYTHON) at \
         the interpreter that has it (a venv's bin/python), pass --python-path python/src, or \
         --no-python"
    )
}

/// The same through the Python package, in its own interpreter.
fn python_case(master: &str, shm: bool, args: &HicacheBenchArgs) -> anyhow::Result<PythonReport> {
    let python = interpreter(args);
    let mut cmd = python_command(args);
    cmd.args(["-m", "rbgctl.bench", "--json", "--master", master])
        .args(["--pages", &args.pages.to_string()])
        .args(["--page-size", &args.page_size.0.to_string()])
        .args(["--rounds", &args.rounds.to_string()])
        .args(["--max-seconds", &args.max_seconds.to_string()])
        .args(["--path", if shm { "shm" } else { "tcp" }]);
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {python}"))?;
    if !out.status.success() {
        bail!(
            "{python} -m rbgctl.bench failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).context("reading the Python benchmark's JSON")
}

/// Runs `rbgctl bench hicache` by its arguments: progress on standard error, the report on
/// standard output (`--json`, `--report` as asked).
pub fn run(args: HicacheBenchArgs) -> anyhow::Result<()> {
    if args.pages == 0 || args.page_size.0 < 2 || args.page_size.0 % 2 != 0 {
        bail!(
            "--pages must be at least 1 and --page-size an even number of bytes (K and V halves)"
        );
    }
    let progress = |msg: &str| {
        if !args.json {
            eprintln!("… {msg}");
        }
    };
    if !args.no_python {
        python_ready(&args)?;
    }
    progress("measuring the machine: loopback TCP, memcpy");
    let (loopback, memcpy) = limits::machine()?;
    let (master, _cluster) = master_or_own(
        args.master.as_deref(),
        args.segment_size.0,
        args.persistent,
        progress,
    )?;
    let paths: &[bool] = if args.no_shm {
        &[false]
    } else {
        &[false, true]
    };
    let mut rows = Vec::new();
    let mut python_crc = None;
    let mut failed = None;
    'paths: for &shm in paths {
        let path = if shm { "shm" } else { "tcp" };
        progress(&format!(
            "rust client, {path}: batches of {} × {}",
            args.pages,
            human_bytes(args.page_size.0)
        ));
        match rust_case(&master, shm, &args) {
            Ok(r) => rows.extend(r),
            Err(e) => {
                failed = Some(e);
                break 'paths;
            }
        }
        if !args.no_python {
            progress(&format!(
                "python HiCache backend, {path}: batch_set_v1 / batch_get_v1"
            ));
            match python_case(&master, shm, &args) {
                Ok(r) => {
                    python_crc = Some(r.crc32c);
                    rows.extend(r.results);
                }
                Err(e) => {
                    failed = Some(e);
                    break 'paths;
                }
            }
        }
    }
    let report = Report {
        loopback_tcp_gb_per_s: loopback,
        memcpy_gb_per_s: memcpy,
        pages: args.pages,
        page_bytes: args.page_size.0,
        persistent: args.persistent,
        python_crc32c: python_crc,
        rows,
    };
    report.publish(args.json, None)?;
    match failed {
        // What was measured is printed above; the rest could not be.
        Some(e) => Err(e.context("PARTIAL RESULTS: the rows above are all that could be measured")),
        None => Ok(()),
    }
}

impl BenchReport for Report {
    fn table(&self) -> String {
        let r = self;
        let mut out = String::new();
        let _ = writeln!(out,
            "machine: loopback TCP, one stream {:.2} GB/s; memcpy {:.2} GB/s; batches of {} pages × {}; \
             store persistent: {}",
            r.loopback_tcp_gb_per_s,
            r.memcpy_gb_per_s,
            r.pages,
            human_bytes(r.page_bytes),
            r.persistent
        );
        if let Some(crc) = &r.python_crc32c {
            let _ = writeln!(out, "python CRC-32C: {crc}");
        }
        let _ = writeln!(
            out,
            "{:<7} {:<5} {:<15} {:>10} {:>7} {:>9} {:>9} {:>8} {:>7}",
            "client", "path", "op", "pages/s", "GB/s", "p50 ms", "p99 ms", "batches", "errors"
        );
        for x in &r.rows {
            let _ = writeln!(
                out,
                "{:<7} {:<5} {:<15} {:>10.0} {:>7.2} {:>9.2} {:>9.2} {:>8} {:>7}",
                x.client,
                x.path,
                x.op,
                x.pages_per_s,
                x.gb_per_s,
                x.p50_ms,
                x.p99_ms,
                x.batches,
                x.errors
            );
        }
        out
    }
}
