//! `rbgctl bench history-load` (test kit builds only): a put/get/remove load on a small key
//! space that records every operation — invoked and completed on the wall clock, key, value
//! digest, outcome — as one JSON line each, for the history checker (`testkit::history`).
//! Every value is unique: the writer, its sequence number and the key lead it, so the digest
//! of a value names the one put that wrote it, and a torn or foreign value matches none.

use super::history::{Kind, Op, Outcome, Read};
use crate::client::{Client, ClientConfig, ClientError, ReplicateConfig};
use crate::transfer::Status;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// `rbgctl bench history-load`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct HistoryLoadArgs {
    /// The master's RPC address (`host:port`, `etcd://…`, `k8s://…`).
    #[arg(long)]
    pub master: String,
    /// Where the history goes: one JSON operation per line, appended as operations complete.
    #[arg(long)]
    pub out: PathBuf,
    /// What every key starts with.
    #[arg(long, default_value = "h-")]
    pub prefix: String,
    /// How many keys: PREFIX0 … PREFIX(keys-1).
    #[arg(long, default_value_t = 64)]
    pub keys: u32,
    /// Threads, each running one operation at a time over one shared client.
    #[arg(long, default_value_t = 4)]
    pub threads: u32,
    /// Bytes per value.
    #[arg(long, default_value_t = 4096)]
    pub value_size: usize,
    /// Stop starting operations after this long (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = crate::config::parse_duration)]
    pub duration: Duration,
    /// …or after this many operations in all, whichever comes first.
    #[arg(long, default_value_t = 100_000)]
    pub max_ops: u64,
    /// Shares of puts, gets and removes, in percent: PUT:GET:REMOVE.
    #[arg(long, default_value = "40:50:10", value_parser = parse_mix)]
    pub mix: Mix,
    /// Copies per put.
    #[arg(long, default_value_t = 1)]
    pub replicas: u8,
    /// Longest wait for one request.
    #[arg(long, default_value = "2s", value_parser = crate::config::parse_duration)]
    pub io_timeout: Duration,
    /// Read every key once, then stop (the final check once faults are healed).
    #[arg(long)]
    pub read_all: bool,
    /// A file holding the cluster secret, when the pool requires it.
    #[arg(long, env = "RBGCTL_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Seed of the key and operation choices (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
}

/// Shares of puts, gets and removes, in percent.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    pub put: u8,
    pub get: u8,
    pub remove: u8,
}

fn parse_mix(text: &str) -> Result<Mix, String> {
    let parts: Vec<u8> = text
        .split(':')
        .map(|p| p.trim().parse::<u8>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("{text:?}: expected PUT:GET:REMOVE percentages, e.g. 40:50:10"))?;
    match parts[..] {
        [put, get, remove] if u32::from(put) + u32::from(get) + u32::from(remove) == 100 => {
            Ok(Mix { put, get, remove })
        }
        _ => Err(format!(
            "{text:?}: expected three percentages adding up to 100, e.g. 40:50:10"
        )),
    }
}

/// Why the history load could not run.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("--keys must be at least 1 and --threads at least 1")]
    Invalid,
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("cannot connect to the master {master} within {within:?}: {source}")]
    Connect {
        master: String,
        within: Duration,
        source: ClientError,
    },
    #[error("{path}: {source}")]
    Output {
        path: String,
        source: std::io::Error,
    },
}

/// Microseconds since the Unix epoch: the clock every process of a test shares.
pub fn wall_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The digest a history records for a value.
pub fn digest(value: &[u8]) -> u64 {
    let hash = Sha256::digest(value);
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash[..8]);
    u64::from_le_bytes(first)
}

/// A value no other put writes: `key|writer|seq|` and then bytes drawn from those.
fn unique_value(key: &str, writer: u64, seq: u64, size: usize) -> Vec<u8> {
    let mut v = format!("{key}|{writer:016x}|{seq}|").into_bytes();
    let mut rng = fastrand::Rng::with_seed(writer ^ seq.rotate_left(32));
    while v.len() < size {
        v.push(rng.u8(..));
    }
    v
}

/// A short reason for a failed operation, for the figures.
fn reason(e: &ClientError) -> String {
    match e {
        ClientError::Rejected { status, .. } => format!("{status:?}"),
        ClientError::Master { source, .. } => format!("master: {}", short(&source.to_string())),
        ClientError::Store { source, .. } => format!("store: {}", short(&source.to_string())),
        ClientError::Unreadable { .. } => "no replica readable".into(),
        ClientError::Checksum { .. } => "checksum mismatch".into(),
        other => short(&other.to_string()),
    }
}

/// The first clause of an error message (addresses and details vary between runs).
fn short(text: &str) -> String {
    let first = text.split(": ").next().unwrap_or(text);
    if first.starts_with("connecting to") {
        return "cannot connect".into();
    }
    first.chars().take(60).collect()
}

struct Worker<'a> {
    client: &'a Client,
    args: &'a HistoryLoadArgs,
    writer: u64,
    seq: u64,
    rng: fastrand::Rng,
}

impl Worker<'_> {
    fn key(&mut self) -> String {
        format!("{}{}", self.args.prefix, self.rng.u32(..self.args.keys))
    }

    fn put(&mut self, key: String) -> Op {
        self.seq += 1;
        let value = unique_value(&key, self.writer, self.seq, self.args.value_size);
        let config = ReplicateConfig {
            replica_num: self.args.replicas,
            ..ReplicateConfig::default()
        };
        let invoked = wall_micros();
        let result = self.client.put(&key, &value, &config);
        let completed = wall_micros();
        let (outcome, error) = match result {
            Ok(()) => (Outcome::Ok, None),
            Err(ClientError::Invalid(m)) => (Outcome::Failed, Some(m)),
            // Where a put failed, the pool may have committed it before the error.
            Err(e) => (Outcome::Unknown, Some(reason(&e))),
        };
        Op {
            key,
            kind: Kind::Put {
                digest: digest(&value),
                outcome,
            },
            invoked,
            completed,
            error,
        }
    }

    fn get(&self, key: String) -> Op {
        let invoked = wall_micros();
        let result = self.client.get(&key);
        let completed = wall_micros();
        let (read, error) = match result {
            Ok(v) => (Read::Value(digest(&v)), None),
            Err(ClientError::NotFound(_)) => (Read::Miss, None),
            Err(e) => (Read::Error, Some(reason(&e))),
        };
        Op {
            key,
            kind: Kind::Get { read },
            invoked,
            completed,
            error,
        }
    }

    fn remove(&self, key: String) -> Op {
        let invoked = wall_micros();
        let result = self.client.remove(&key, true);
        let completed = wall_micros();
        let (outcome, error) = match result {
            Ok(()) => (Outcome::Ok, None),
            Err(e) if e.status() == Some(Status::ObjectNotFound) => (Outcome::Failed, None),
            Err(e) => (Outcome::Unknown, Some(reason(&e))),
        };
        Op {
            key,
            kind: Kind::Remove { outcome },
            invoked,
            completed,
            error,
        }
    }
}

/// What a load did, by kind and outcome.
#[derive(Debug, Default, serde::Serialize)]
pub struct Summary {
    pub ops: u64,
    pub puts_ok: u64,
    pub gets_value: u64,
    pub gets_miss: u64,
    pub removes_ok: u64,
    /// Operations that failed or could not tell, by reason.
    pub failed: std::collections::BTreeMap<String, u64>,
}

impl Summary {
    /// Counts an operation by its kind and outcome.
    pub fn add(&mut self, op: &Op) {
        self.ops += 1;
        match op.kind {
            Kind::Put {
                outcome: Outcome::Ok,
                ..
            } => self.puts_ok += 1,
            Kind::Get {
                read: Read::Value(_),
            } => self.gets_value += 1,
            Kind::Get { read: Read::Miss } => self.gets_miss += 1,
            Kind::Remove {
                outcome: Outcome::Ok,
            } => self.removes_ok += 1,
            _ => {}
        }
        if let Some(e) = &op.error {
            *self.failed.entry(e.clone()).or_default() += 1;
        }
    }
}

/// Connects, retrying until `within` passes (the master may be restarting).
fn connect(args: &HistoryLoadArgs, within: Duration) -> Result<Client, LoadError> {
    let mut cfg =
        ClientConfig::new(args.master.clone()).with_auth_file(args.auth_token_file.as_deref())?;
    // Each process of a fault test stands for a host of its own: no same-host shortcuts.
    cfg.same_host_shm = false;
    cfg.conn.io_timeout = args.io_timeout;
    cfg.conn.connect_timeout = args.io_timeout;
    let deadline = Instant::now() + within;
    loop {
        match Client::connect(cfg.clone()) {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() >= deadline => {
                return Err(LoadError::Connect {
                    master: args.master.clone(),
                    within,
                    source: e,
                })
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Runs the history load by `args` (for `--duration` or `--max-ops`, whichever comes first),
/// appending each operation to the history file as it completes.
pub fn run(args: HistoryLoadArgs) -> Result<(), LoadError> {
    if args.keys == 0 || args.threads == 0 {
        return Err(LoadError::Invalid);
    }
    let output = |source| LoadError::Output {
        path: args.out.display().to_string(),
        source,
    };
    let mut file = std::io::BufWriter::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&args.out)
            .map_err(output)?,
    );
    let client = connect(&args, Duration::from_secs(10))?;
    let seed = args.seed.unwrap_or_else(wall_micros);
    let writer_base = (u64::from(std::process::id()) << 32) ^ seed;
    let started = Instant::now();
    let done = AtomicU64::new(0);
    let next_key = AtomicU64::new(0);
    let (tx, rx) = mpsc::channel::<Op>();
    let mut summary = Summary::default();
    std::thread::scope(|s| -> Result<(), LoadError> {
        for t in 0..args.threads {
            let tx = tx.clone();
            let (client, args, done, next_key) = (&client, &args, &done, &next_key);
            s.spawn(move || {
                let mut w = Worker {
                    client,
                    args,
                    writer: writer_base.wrapping_add(u64::from(t)),
                    seq: 0,
                    rng: fastrand::Rng::with_seed(seed.wrapping_add(u64::from(t))),
                };
                loop {
                    let op = if args.read_all {
                        let i = next_key.fetch_add(1, Ordering::Relaxed);
                        if i >= u64::from(args.keys) {
                            break;
                        }
                        w.get(format!("{}{i}", args.prefix))
                    } else {
                        if started.elapsed() >= args.duration
                            || done.fetch_add(1, Ordering::Relaxed) >= args.max_ops
                        {
                            break;
                        }
                        let key = w.key();
                        let roll = w.rng.u8(..100);
                        if roll < args.mix.put {
                            w.put(key)
                        } else if roll < args.mix.put + args.mix.get {
                            w.get(key)
                        } else {
                            w.remove(key)
                        }
                    };
                    if tx.send(op).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        // Written as they complete: what a run recorded survives its end, however it ends.
        for op in rx {
            summary.add(&op);
            let line = serde_json::to_string(&op).map_err(|e| output(e.into()))?;
            writeln!(file, "{line}").map_err(output)?;
        }
        file.flush().map_err(output)
    })?;
    let text = serde_json::to_string(&summary).unwrap_or_default();
    println!("{text}");
    Ok(())
}

/// Reads a history written by `run` (one JSON operation per line).
pub fn read_history(path: &std::path::Path) -> std::io::Result<Vec<Op>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_unique_per_writer_and_sequence() {
        let a = unique_value("k", 1, 1, 64);
        assert_eq!(a.len(), 64);
        assert_eq!(a, unique_value("k", 1, 1, 64));
        assert_ne!(digest(&a), digest(&unique_value("k", 1, 2, 64)));
        assert_ne!(digest(&a), digest(&unique_value("k", 2, 1, 64)));
        assert_ne!(digest(&a), digest(&unique_value("j", 1, 1, 64)));
    }

    #[test]
    fn the_mix_must_add_up() {
        let m = parse_mix("40:50:10").expect("valid");
        assert_eq!((m.put, m.get, m.remove), (40, 50, 10));
        assert!(parse_mix("40:50").is_err());
        assert!(parse_mix("40:50:20").is_err());
        assert!(parse_mix("a:b:c").is_err());
    }
}
