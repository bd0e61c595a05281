//! `rbgctl up`: a master and N stores on loopback, as child processes of this one, for trying the
//! pool on one machine. Ctrl-C (or SIGTERM) stops them all cleanly.

use crate::config::ByteSize;
use crate::transfer::message::ListSegmentsResp;
use crate::transfer::{ConnOptions, Connection, Opcode};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Number of stores.
    #[arg(long, default_value_t = 2)]
    pub stores: usize,
    /// Memory each store contributes.
    #[arg(long, default_value = "256MiB")]
    pub segment_size: ByteSize,
    /// Master RPC port.
    #[arg(long, default_value_t = 50051)]
    pub master_port: u16,
    /// HTTP metadata server port.
    #[arg(long, default_value_t = 8080)]
    pub metadata_port: u16,
    /// Master metrics and admin API port.
    #[arg(long, default_value_t = 9003)]
    pub metrics_port: u16,
    /// Directory for the stores' segment files (default: a fresh one under /dev/shm).
    #[arg(long)]
    pub shm_dir: Option<PathBuf>,
}

struct Children(Vec<(String, Child)>);

impl Children {
    fn stop(&mut self) {
        for (_, c) in self.0.iter().rev() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for (name, c) in self.0.iter_mut().rev() {
            loop {
                match c.try_wait() {
                    Ok(Some(_)) => break,
                    _ if Instant::now() > deadline => {
                        eprintln!("{name} did not stop in time; killing it");
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    _ => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        self.0.clear();
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.stop();
    }
}

fn wait_for_segments(
    master: &str,
    n: usize,
    timeout: Duration,
) -> anyhow::Result<ListSegmentsResp> {
    let deadline = Instant::now() + timeout;
    let opts = ConnOptions {
        spin: Duration::ZERO,
        ..ConnOptions::default()
    };
    loop {
        let listed = Connection::connect(master, &opts)
            .and_then(|mut c| c.call::<_, ListSegmentsResp>(Opcode::ListSegments, &()));
        match listed {
            Ok(r) if r.segments.len() >= n => return Ok(r),
            _ if Instant::now() > deadline => {
                anyhow::bail!("the master at {master} did not list {n} segments within {timeout:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

pub fn run(args: UpArgs) -> anyhow::Result<()> {
    // Signal handlers first, so that a SIGTERM during start-up still stops the children cleanly.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut term, mut int) = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        Ok::<_, std::io::Error>((
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        ))
    })?;
    let exe = std::env::current_exe()?;
    let shm_dir = args
        .shm_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("/dev/shm/rbgctl-up-{}", std::process::id())));
    let host = "127.0.0.1";
    let master = format!("{host}:{}", args.master_port);
    let metadata = format!("http://{host}:{}/metadata", args.metadata_port);
    let mut children = Children(Vec::new());
    let spawn = |name: &str, cmd: &mut Command| -> anyhow::Result<(String, Child)> {
        let child = cmd
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start {name}: {e}"))?;
        Ok((name.to_string(), child))
    };
    children.0.push(spawn(
        "master",
        Command::new(&exe).args([
            "master",
            "--rpc-address",
            host,
            "--rpc-port",
            &args.master_port.to_string(),
            "--enable-http-metadata-server",
            "--http-metadata-server-host",
            host,
            "--http-metadata-server-port",
            &args.metadata_port.to_string(),
            "--metrics-host",
            host,
            "--metrics-port",
            &args.metrics_port.to_string(),
        ]),
    )?);
    wait_for_segments(&master, 0, Duration::from_secs(10))?;
    for i in 0..args.stores {
        children.0.push(spawn(
            &format!("store-{i}"),
            Command::new(&exe)
                .args([
                    "store",
                    "--master",
                    &master,
                    "--bind-address",
                    host,
                    "--local-hostname",
                    host,
                    "--segment-size",
                    &args.segment_size.0.to_string(),
                    "--metrics-host",
                    host,
                    "--metrics-port",
                    "0",
                    "--metadata-server",
                    &metadata,
                    // A throwaway directory and kernel-chosen ports: nothing to keep.
                    "--persistent",
                    "false",
                ])
                .arg("--shm-dir")
                .arg(&shm_dir),
        )?);
    }
    let listed = wait_for_segments(&master, args.stores, Duration::from_secs(15))?;
    println!("rbgctl is up on loopback:");
    println!("  master RPC          {master}");
    println!("  metadata server     {metadata}");
    println!(
        "  metrics / admin     http://{host}:{}/metrics  /api/v1/segments",
        args.metrics_port
    );
    for s in &listed.segments {
        println!(
            "  store {:<22} {} ({})",
            s.info.name,
            s.info.endpoint,
            crate::config::human_bytes(s.info.size)
        );
    }
    println!();
    println!("Try it:");
    println!("  rbgctl kv --master {master} put hello world --replicas 2");
    println!("  rbgctl kv --master {master} get hello");
    println!("  rbgctl bench store --master {master}");
    println!("Ctrl-C stops everything.");

    let failed = runtime.block_on(async {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                _ = term.recv() => return None,
                _ = int.recv() => return None,
                _ = tick.tick() => {
                    for (name, c) in children.0.iter_mut() {
                        if let Ok(Some(status)) = c.try_wait() {
                            return Some(format!("{name} exited ({status})"));
                        }
                    }
                }
            }
        }
    });
    eprintln!("stopping...");
    children.stop();
    let _ = std::fs::remove_dir(&shm_dir);
    match failed {
        Some(why) => anyhow::bail!("{why}; stopped the rest"),
        None => Ok(()),
    }
}
