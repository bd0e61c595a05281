//! `rbgctl kv`: a command-line client of the pool, for trying it out and for scripts.

use crate::client::{Client, ClientConfig, ClientError, ReplicateConfig};
use clap::{Args, Subcommand};
use std::io::{IsTerminal, Read, Write};

/// `rbgctl kv`'s arguments: the pool to reach and the operation.
#[derive(Debug, Args)]
pub struct KvArgs {
    /// The master's RPC address (host:port), or elected masters' `etcd://h1:2379;h2:2379/ID`
    /// or `k8s://namespace/lease`; may stand before or after the operation.
    #[arg(
        long,
        global = true,
        env = "MOONCAKE_MASTER",
        default_value = "127.0.0.1:50051"
    )]
    pub master: String,
    /// A file holding the cluster secret, when the pool requires it.
    #[arg(long, global = true, env = "RBGCTL_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<std::path::PathBuf>,
    /// How bytes reach stores: tcp, or rdma (through --rdma-device, for stores that serve it).
    #[arg(long, global = true, env = "MOONCAKE_PROTOCOL", default_value = "tcp")]
    pub protocol: crate::transfer::Transport,
    /// The RDMA devices to use with --protocol rdma (rxe0, mlx5_0,mlx5_1).
    #[arg(long, global = true, env = "MOONCAKE_DEVICE", default_value = "")]
    pub rdma_device: String,
    /// Reach stores on this host over the network too, instead of their shared memory.
    #[arg(long, global = true)]
    pub no_shm: bool,
    /// How segments that Mooncake's processes mounted are found: P2PHANDSHAKE, or the HTTP
    /// metadata server they publish to (http://host:port/metadata).
    #[arg(
        long,
        global = true,
        env = "MOONCAKE_TE_META_DATA_SERVER",
        default_value = "P2PHANDSHAKE"
    )]
    pub mooncake_metadata_server: crate::client::Discovery,
    /// The tenant whose namespace the keys are in (the master's tenants file names it).
    #[arg(
        long,
        global = true,
        env = "MOONCAKE_TENANT_ID",
        default_value = "default"
    )]
    pub tenant: String,
    #[command(subcommand)]
    pub op: KvOp,
}

/// The operations of `rbgctl kv`.
#[derive(Debug, Subcommand)]
pub enum KvOp {
    /// Store a value (from the argument, or standard input when it is `-`).
    Put {
        /// The key (at most 4096 bytes of UTF-8).
        #[arg(allow_hyphen_values = true)]
        key: String,
        /// The value, or `-` to read it from standard input (up to the largest segment's size).
        #[arg(allow_hyphen_values = true)]
        value: String,
        /// Copies on distinct segments.
        #[arg(long, default_value_t = 1)]
        replicas: u8,
        /// Keep the object out of eviction while anything else can go (for the master's
        /// default soft-pin time).
        #[arg(long)]
        soft_pin: bool,
        /// Segment name to place the first copy on when it has room (see `kv segments`).
        #[arg(long, default_value = "")]
        preferred_segment: String,
    },
    /// Print a value to standard output (a newline follows on a terminal).
    Get {
        /// The key.
        #[arg(allow_hyphen_values = true)]
        key: String,
    },
    /// Print true and exit 0 when the key exists; print false and exit 1 when not.
    Exists {
        /// The key.
        #[arg(allow_hyphen_values = true)]
        key: String,
    },
    /// Print where a value is: size, checksum, version, and each replica's segment, tier
    /// (memory or disk), endpoint and offset. Counts as a read (it may promote the value from
    /// a disk tier).
    Describe {
        /// The key.
        #[arg(allow_hyphen_values = true)]
        key: String,
    },
    /// Remove a key.
    Rm {
        /// The key.
        #[arg(allow_hyphen_values = true)]
        key: String,
        /// Remove even while a reader holds a lease on it.
        #[arg(long)]
        force: bool,
    },
    /// List the readable keys a regular expression matches anywhere in them (every key
    /// without one), sorted, one a line; says on standard error when more match than --limit.
    Keys {
        /// The regular expression (`^page/`, `_Qwen-.*_0_`); Rust's `regex` syntax.
        #[arg(default_value = "", allow_hyphen_values = true)]
        pattern: String,
        /// Most keys listed.
        #[arg(long, default_value_t = 1000)]
        limit: u32,
    },
    /// List the mounted segments: name, tier, endpoint, used and total bytes.
    Segments,
    /// Wait until the master answers and lists at least `--segments` memory segments (a pool
    /// started in the background is ready); exit 1 if it does not within `--timeout`.
    Wait {
        /// Memory segments to wait for.
        #[arg(long, default_value_t = 1)]
        segments: usize,
        /// How long to wait (`30s`, `500ms`).
        #[arg(long, default_value = "30s", allow_hyphen_values = true)]
        timeout: crate::config::Millis,
    },
}

/// What a `kv` command can fail with: the pool's answer, or this process's own I/O.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(
        "the value on standard input is larger than the largest segment ({limit} bytes); \
         nothing was stored"
    )]
    TooLarge { limit: u64 },
    #[error("no segment is mounted at the master: start a store (rbgctl store), or wait for one to mount")]
    NoSegment,
    #[error("the pool at {master} was not ready within {timeout:?} (last: {last})")]
    NotReady {
        master: String,
        timeout: std::time::Duration,
        last: String,
    },
}

/// Reads standard input, up to `limit` bytes; more is an error (a value larger than any
/// segment could not be stored anyway, and `/dev/zero` never ends).
fn read_value(input: impl Read, limit: u64) -> Result<Vec<u8>, KvError> {
    let mut b = Vec::new();
    input.take(limit.saturating_add(1)).read_to_end(&mut b)?;
    if b.len() as u64 > limit {
        return Err(KvError::TooLarge { limit });
    }
    Ok(b)
}

/// `kv wait`: polls the master (connecting again each time) until it lists `want` memory
/// segments or `timeout` passes.
fn wait_ready(
    cfg: &ClientConfig,
    want: usize,
    timeout: std::time::Duration,
) -> Result<(), KvError> {
    let deadline = std::time::Instant::now() + timeout;
    let mut last;
    loop {
        match Client::connect(cfg.clone()).and_then(|c| c.segments()) {
            Ok(segments) => {
                let n = segments
                    .iter()
                    .filter(|s| s.info.tier == crate::transfer::message::Tier::Memory)
                    .count();
                if n >= want {
                    eprintln!("ready: {n} segments mounted at {}", cfg.master);
                    return Ok(());
                }
                last = format!("{n} of {want} segments mounted");
            }
            Err(e) => last = e.to_string(),
        }
        if std::time::Instant::now() >= deadline {
            return Err(KvError::NotReady {
                master: cfg.master.clone(),
                timeout,
                last,
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Runs `rbgctl kv`: one operation on the pool, its answer on standard output.
pub fn run(args: KvArgs) -> Result<(), KvError> {
    let cfg = ClientConfig {
        transport: args.protocol,
        rdma_devices: args.rdma_device,
        same_host_shm: !args.no_shm,
        mooncake_discovery: args.mooncake_metadata_server,
        ..ClientConfig::new(args.master)
    }
    .with_auth_file(args.auth_token_file.as_deref())?
    .with_tenant(&args.tenant)?;
    if let KvOp::Wait { segments, timeout } = args.op {
        return wait_ready(&cfg, segments, timeout.0);
    }
    let client = Client::connect(cfg)?;
    match args.op {
        KvOp::Put {
            key,
            value,
            replicas,
            soft_pin,
            preferred_segment,
        } => {
            let memory: Vec<u64> = client
                .segments()?
                .iter()
                .filter(|s| s.info.tier == crate::transfer::message::Tier::Memory)
                .map(|s| s.info.size)
                .collect();
            let Some(&largest) = memory.iter().max() else {
                return Err(KvError::NoSegment);
            };
            if usize::from(replicas) > memory.len() {
                eprintln!(
                    "warning: {replicas} replicas asked, {} segments mounted: at most {} copies \
                     can be kept (one per segment)",
                    memory.len(),
                    memory.len()
                );
            }
            let bytes = if value == "-" {
                read_value(std::io::stdin().lock(), largest)?
            } else {
                value.into_bytes()
            };
            let cfg = ReplicateConfig {
                replica_num: replicas,
                soft_pin,
                soft_pin_ttl_ms: 0,
                preferred_segment,
                ..ReplicateConfig::default()
            };
            client.put(&key, &bytes, &cfg)?;
            eprintln!("stored {key:?} ({} bytes)", bytes.len());
        }
        KvOp::Get { key } => {
            let v = client.get(&key)?;
            let mut out = std::io::stdout().lock();
            out.write_all(&v)?;
            if out.is_terminal() && !v.ends_with(b"\n") {
                out.write_all(b"\n")?;
            }
        }
        KvOp::Keys { pattern, limit } => {
            let (keys, truncated) = client.keys(&pattern, limit)?;
            let mut out = std::io::stdout().lock();
            for k in &keys {
                writeln!(out, "{k}")?;
            }
            if truncated {
                eprintln!("more keys match than the {limit} listed (--limit)");
            }
        }
        KvOp::Exists { key } => {
            let e = client.exists(&key)?;
            println!("{e}");
            if !e {
                std::process::exit(1);
            }
        }
        KvOp::Describe { key } => {
            let (desc, segments) = client.describe(&key)?;
            let crc = if desc.unhashed {
                "none (put unhashed by Mooncake's client)".to_string()
            } else {
                format!("{:08x}", desc.checksum)
            };
            println!(
                "key {key:?}: {} bytes, crc32c {crc}, version {}",
                desc.size, desc.version
            );
            for r in &desc.replicas {
                let s = segments.iter().find(|s| s.id == r.segment_id);
                println!(
                    "  replica: segment {} tier {} endpoint {} offset {}",
                    s.map_or("?", |s| s.info.name.as_str()),
                    s.map_or("?", |s| s.info.tier.name()),
                    s.map_or("?", |s| s.info.endpoint.as_str()),
                    r.offset
                );
            }
        }
        KvOp::Rm { key, force } => {
            client.remove(&key, force)?;
            eprintln!("removed {key:?}");
        }
        // Answered before connecting, above.
        KvOp::Wait { .. } => {}
        KvOp::Segments => {
            let segments = client.segments()?;
            println!(
                "{:<24} {:<6} {:<24} {:>10} {:>10}",
                "NAME", "TIER", "ENDPOINT", "USED", "SIZE"
            );
            for s in segments {
                println!(
                    "{:<24} {:<6} {:<24} {:>10} {:>10}",
                    s.info.name,
                    s.info.tier.name(),
                    s.info.endpoint,
                    crate::config::human_bytes(s.used),
                    crate::config::human_bytes(s.info.size)
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_input_is_read_up_to_the_largest_segment_only() {
        assert_eq!(read_value(&b"abc"[..], 3).unwrap(), b"abc");
        let endless = std::io::repeat(0);
        let e = read_value(endless, 1 << 20).unwrap_err();
        assert!(
            e.to_string()
                .contains("larger than the largest segment (1048576 bytes)"),
            "{e}"
        );
    }
}
