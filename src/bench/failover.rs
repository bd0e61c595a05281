//! `rbgctl bench failover`: master high availability measured. It starts etcd members, two or
//! three masters electing a leader through them, and stores; fills the pool; then runs a client
//! that puts and gets without pause while it
//!
//! 1. kills the leader with SIGKILL, and times from the kill to the first successful put and to
//!    every object committed before the kill being listed again;
//! 2. pauses the new leader with SIGSTOP for `--pause` (writes are sent to it meanwhile on
//!    connections that know nothing of the failover), continues it, and counts the writes it
//!    accepted after its lease ran out (must be 0) and how long it took to step down.
//!
//! With `--idle-clients N`, N more clients sit connected and idle through it all, following
//! the leader as a client's heartbeat does (`idle_clients`); the kill times each one's return
//! to the new leader and counts the connections full accept queues dropped meanwhile.
//!
//! At the end every object any put acknowledged is read back and compared byte for byte:
//! objects lost must be 0.

use super::recovery::fill_value;
use crate::bench::kit::report::BenchReport;
use crate::client::{Client, ClientConfig, ReplicateConfig};
use crate::config::{ByteSize, Millis};
use crate::ha::etcd_server::EtcdCluster;
use crate::launch::{Launcher, Logs, Pool, PoolSpec};
use crate::master::config::MasterConfig;
use crate::transfer::message::{PutStartReq, Wire};
use crate::transfer::{ConnOptions, Connection, Opcode, Status, TransferError};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `rbgctl bench failover`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct FailoverBenchArgs {
    /// Masters electing a leader (2 or 3).
    #[arg(long, default_value_t = 2)]
    pub masters: usize,
    /// etcd members (1 or 3).
    #[arg(long, default_value_t = 1)]
    pub etcd_members: usize,
    /// The leader's lease TTL (whole seconds).
    #[arg(long, default_value = "2s")]
    pub lease_ttl: Millis,
    /// Stores contributing a segment each.
    #[arg(long, default_value_t = 2)]
    pub stores: usize,
    /// Segment size of each store.
    #[arg(long, default_value = "512MiB")]
    pub segment_size: ByteSize,
    /// Objects written before the faults.
    #[arg(long, default_value_t = 5000)]
    pub objects: usize,
    /// Size of each object.
    #[arg(long, default_value = "16KiB")]
    pub value_size: ByteSize,
    /// How long the second leader is paused (SIGSTOP) before it is continued.
    #[arg(long, default_value = "10s")]
    pub pause: Millis,
    /// Clients that are connected and idle, as most of a cluster's are (`bench master
    /// --idle-clients`): each bound to the leader by one ping, following it as a client's
    /// heartbeat does. The kill times each one's return to the new leader, and counts the
    /// connections the host's accept queues dropped meanwhile. Default: 0.
    #[arg(long, default_value_t = 0)]
    pub idle_clients: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also write an HTML report with charts (puts acknowledged and operations failed per
    /// second over the run, the faults marked; the epoch of the master that acknowledged
    /// each put) to this file.
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
}

/// What one fault did, as the client saw it.
#[derive(Debug, Default, serde::Serialize)]
struct Fault {
    /// From the fault to the bench seeing a new leader in its `/health` (polled every 20 ms).
    leader_seen_s: Option<f64>,
    /// From the fault to the first put acknowledged after it.
    first_put_s: Option<f64>,
    /// From the fault to every object committed before it being listed by the new leader.
    all_readable_s: Option<f64>,
    /// Objects committed before the fault.
    objects_before: usize,
    /// The new leader's epoch, and the old one's.
    epoch_before: u64,
    epoch_after: u64,
    /// Client operations that failed from the fault until the pool was whole again, by reason.
    errors: BTreeMap<String, u64>,
}

#[derive(Debug, Default, serde::Serialize)]
struct Pause {
    #[serde(flatten)]
    fault: Fault,
    pause_s: f64,
    /// Writes (PUT_START) sent to the paused leader on connections that knew nothing of the
    /// failover, answered once it continued.
    stale_writes_sent: usize,
    /// Of those, answered with success: writes accepted after the lease ran out (must be 0).
    stale_writes_accepted: usize,
    /// Of those, refused with NOT_LEADER.
    stale_writes_refused: usize,
    /// From SIGCONT until the old leader's `/health` says standby.
    stepped_down_after_continue_s: Option<f64>,
}

/// How the idle clients came back to the new leader after the kill.
#[derive(Debug, Default, serde::Serialize)]
struct IdleReturn {
    clients: usize,
    /// Answered by the new leader within the wait (a minute).
    back: usize,
    /// Of those, within 5 s of the bench seeing the new leader.
    back_within_5s_of_leader: usize,
    /// Seconds from the bench seeing the new leader to each client's first answer from it:
    /// 50th and 99th percentile, last.
    p50_s: Option<f64>,
    p99_s: Option<f64>,
    max_s: Option<f64>,
    /// Connections the host's accept queues dropped from the kill until all were back (or
    /// the wait ran out): `TcpExt: ListenOverflows`.
    listen_overflows: Option<u64>,
    /// Their whole run: pings, failed tries, connections made again.
    #[serde(flatten)]
    figures: super::kit::idle_clients::IdleFigures,
}

impl IdleReturn {
    /// From the seconds since the kill at which each client was back (in order), and the
    /// moment the new leader was seen.
    fn new(
        back: &[f64],
        leader_seen_s: f64,
        listen_overflows: Option<u64>,
        figures: super::kit::idle_clients::IdleFigures,
    ) -> IdleReturn {
        let after: Vec<f64> = back.iter().map(|b| (b - leader_seen_s).max(0.0)).collect();
        let at = |q: f64| (!after.is_empty()).then(|| super::kit::stats::percentile(&after, q));
        IdleReturn {
            clients: figures.connections,
            back: back.len(),
            back_within_5s_of_leader: after.iter().filter(|a| **a <= 5.0).count(),
            p50_s: at(0.5),
            p99_s: at(0.99),
            max_s: after.last().copied(),
            listen_overflows,
            figures,
        }
    }
}

#[derive(Debug, Default, serde::Serialize)]
struct Report {
    masters: usize,
    etcd_members: usize,
    lease_ttl_s: f64,
    stores: usize,
    value_bytes: u64,
    kill: Fault,
    /// With `--idle-clients`: how they came back to the new leader after the kill.
    idle_return: Option<IdleReturn>,
    pause: Pause,
    /// Distinct objects a put acknowledged over the whole run (prefill included).
    objects_committed: usize,
    /// Of those, not read back byte-exact at the end (must be 0).
    objects_lost: usize,
    /// Puts acknowledged (the loop writes its keys again and again, the same bytes each time).
    puts_acknowledged: usize,
    /// Client operations over the run.
    client_ops: u64,
    client_errors: u64,
    errors_by_reason: BTreeMap<String, u64>,
    /// The client's run over time, for the report's charts.
    #[serde(skip)]
    timeline: Timeline,
}

/// Seconds from the start of the client's loop: each acknowledged put (with the epoch of the
/// master that acknowledged it), each failed operation, and the faults.
#[derive(Debug, Default)]
struct Timeline {
    acks: Vec<(f64, u64)>,
    errors: Vec<f64>,
    events: Vec<(f64, String)>,
}

fn key(i: usize) -> String {
    format!("failover/{i}")
}

/// The distinct objects acknowledged so far.
fn committed_objects(rec: &Record) -> Vec<usize> {
    let set: std::collections::BTreeSet<usize> = rec.committed.iter().map(|(i, _, _)| *i).collect();
    set.into_iter().collect()
}

fn committed_keys(rec: &Record) -> Vec<String> {
    committed_objects(rec).into_iter().map(key).collect()
}

/// The client's record of its loop: what it committed and what failed.
#[derive(Default)]
struct Record {
    /// (object index, when acknowledged, the epoch of the master that acknowledged it).
    committed: Vec<(usize, Instant, u64)>,
    /// (when, reason).
    errors: Vec<(Instant, String)>,
    ops: u64,
}

fn reason(e: &crate::client::ClientError) -> String {
    let s = e.to_string();
    for (needle, name) in [
        ("NOT_LEADER", "not the leader"),
        ("no master leader", "no leader known"),
        ("connect", "master unreachable"),
        ("deposed master", "stale epoch"),
        ("NO_SPACE", "no space (stores not reported yet)"),
        ("not found", "miss (stores not reported yet)"),
        ("timed out", "timeout"),
        ("reset by peer", "connection cut (the master died)"),
    ] {
        if s.contains(needle) {
            return name.into();
        }
    }
    let mut short: String = s.chars().take(80).collect();
    if short.len() < s.len() {
        short.push('…');
    }
    format!("other ({short})")
}

/// Dropped in field order: the pool (stores, then masters), then etcd, then the run
/// directory.
struct Bench {
    pool: Pool,
    spec: String,
    http: reqwest::blocking::Client,
    _etcd: EtcdCluster,
    _launcher: Launcher,
}

impl Bench {
    fn health(&self, i: usize) -> Option<serde_json::Value> {
        let m = &self.pool.masters[i];
        m.pid()?;
        self.http
            .get(format!("http://{}/health", m.addrs.metrics))
            .send()
            .ok()?
            .json()
            .ok()
    }

    fn leader(&self) -> Option<(usize, u64)> {
        (0..self.pool.masters.len()).find_map(|i| {
            let h = self.health(i)?;
            (h["role"] == "leader").then(|| (i, h["epoch"].as_u64().unwrap_or(0)))
        })
    }

    fn wait_leader(
        &self,
        other_than: Option<usize>,
        within: Duration,
    ) -> anyhow::Result<(usize, u64)> {
        let deadline = Instant::now() + within;
        loop {
            if let Some((i, e)) = self.leader() {
                if Some(i) != other_than {
                    return Ok((i, e));
                }
            }
            anyhow::ensure!(Instant::now() < deadline, "no master led within {within:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Waits until every one of `keys` exists (the new leader has them from the stores).
fn wait_all_listed(
    client: &Client,
    keys: &[String],
    since: Instant,
    within: Duration,
) -> Option<f64> {
    let mut from = 0;
    while since.elapsed() < within {
        let chunk: Vec<&str> = keys[from..(from + 512).min(keys.len())]
            .iter()
            .map(String::as_str)
            .collect();
        if let Ok(found) = client.batch_exists(&chunk) {
            match found.iter().position(|f| !f) {
                None => {
                    from += chunk.len();
                    if from >= keys.len() {
                        return Some(since.elapsed().as_secs_f64());
                    }
                    continue;
                }
                Some(at) => from += at,
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// Runs `rbgctl bench failover` by its arguments: progress on standard error, the report on
/// standard output (`--json`, `--report` as asked).
pub fn run(args: FailoverBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (2..=3).contains(&args.masters),
        "--masters: 2 or 3, got {}",
        args.masters
    );
    anyhow::ensure!(
        args.etcd_members == 1 || args.etcd_members == 3,
        "--etcd-members: 1 or 3, got {}",
        args.etcd_members
    );
    let progress = |msg: &str| {
        if !args.json {
            eprintln!("… {msg}");
        }
    };
    let ttl = args.lease_ttl.0;
    let size = args.value_size.0 as usize;
    let launcher = Launcher::new(Logs::Null)?;
    progress(&format!("starting {} etcd member(s)", args.etcd_members));
    let etcd = EtcdCluster::start(args.etcd_members, &launcher.dir().join("etcd"))?;
    let cluster_id = format!("bench-{}", std::process::id());
    progress(&format!(
        "starting {} masters electing through etcd (lease TTL {ttl:?}) and {} stores",
        args.masters, args.stores
    ));
    let mut pool = PoolSpec::loopback(args.stores, args.segment_size.0);
    pool.name = "rbgctl-bench-failover".into();
    pool.masters = args.masters;
    pool.master = MasterConfig {
        enable_http_metadata_server: false,
        enable_ha: true,
        ha_backend_connstring: etcd.endpoints(),
        cluster_id: cluster_id.clone(),
        ha_lease_ttl_ms: args.lease_ttl,
        client_ttl_ms: Millis(Duration::from_secs(3)),
        // Every connection comes from one address: room for all the idle clients.
        max_connections: pool.master.max_connections.max(args.idle_clients + 1024),
        max_connections_per_peer: pool
            .master
            .max_connections_per_peer
            .max(args.idle_clients + 1024),
        ..pool.master
    };
    pool.store.heartbeat_interval_ms = Millis(Duration::from_millis(200));
    let pool = Pool::start(&launcher, pool)?;
    let mut bench = Bench {
        spec: pool.rpc.clone(),
        pool,
        http: reqwest::blocking::Client::builder()
            .timeout(Duration::from_millis(300))
            .build()?,
        _etcd: etcd,
        _launcher: launcher,
    };
    let report = measure(&mut bench, &args, size, ttl, progress)?;
    report.publish(args.json, args.report.as_deref())
}

fn client(spec: &str) -> anyhow::Result<Client> {
    Ok(Client::connect(ClientConfig {
        same_host_shm: false,
        ..ClientConfig::new(spec.to_string())
    })?)
}

fn measure(
    bench: &mut Bench,
    args: &FailoverBenchArgs,
    size: usize,
    ttl: Duration,
    progress: impl Fn(&str),
) -> anyhow::Result<Report> {
    let main = client(&bench.spec)?;
    // Wait until every store has mounted at the leader: a put lands on some store.
    let deadline = Instant::now() + Duration::from_secs(30);
    while main.segments().map_or(0, |s| s.len()) < args.stores {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the stores did not mount at the leader"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    progress(&format!("writing {} objects of {size} bytes", args.objects));
    let record = Arc::new(Mutex::new(Record::default()));
    let mut buf = vec![0u8; size];
    for start in (0..args.objects).step_by(64) {
        let end = (start + 64).min(args.objects);
        let keys: Vec<String> = (start..end).map(key).collect();
        let vals: Vec<Vec<u8>> = (start..end)
            .map(|i| {
                fill_value(i, &mut buf);
                buf.clone()
            })
            .collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let vrefs: Vec<&[u8]> = vals.iter().map(Vec::as_slice).collect();
        for (j, r) in main
            .batch_put(&refs, &vrefs, &ReplicateConfig::default())
            .into_iter()
            .enumerate()
        {
            r.map_err(|e| anyhow::anyhow!("prefill put {}: {e}", keys[j]))?;
            record
                .lock()
                .committed
                .push((start + j, Instant::now(), main.master_epoch()));
        }
    }

    let idle = match args.idle_clients {
        0 => None,
        n => {
            progress(&format!(
                "opening {n} idle clients following the leader (bound by a ping each, then quiet)"
            ));
            let every = ClientConfig::new(bench.spec.clone()).heartbeat_interval;
            Some(super::kit::idle_clients::IdleClients::open(
                &bench.spec,
                n,
                every,
            )?)
        }
    };

    // The loop: one put and one get of a committed object, without pause. The puts cycle
    // through keys that fit under the eviction watermark with the prefill (a put of a key
    // again writes the same bytes), so that nothing is evicted and every loss is a loss.
    let capacity = args.stores as u64 * args.segment_size.0;
    let fit = (capacity as f64 * 0.7 / size as f64) as usize;
    anyhow::ensure!(
        fit > args.objects + 100,
        "{} objects of {size} bytes leave no room under the eviction watermark of {} stores of {}: \
         use fewer --objects or a larger --segment-size",
        args.objects,
        args.stores,
        crate::config::human_bytes(args.segment_size.0)
    );
    let loop_keys = fit - args.objects;
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let at = |i: Instant| i.saturating_duration_since(t0).as_secs_f64();
    let mut events: Vec<(f64, String)> = Vec::new();
    let looper = {
        let (record, stop, spec) = (record.clone(), stop.clone(), bench.spec.clone());
        let first = args.objects;
        std::thread::Builder::new()
            .name("failover-client".into())
            .spawn(move || -> anyhow::Result<()> {
                let c = client(&spec)?;
                let mut buf = vec![0u8; size];
                let mut n = 0;
                let mut rng = fastrand::Rng::with_seed(7);
                while !stop.load(Ordering::Relaxed) {
                    let i = first + n % loop_keys;
                    fill_value(i, &mut buf);
                    let r = c.put(&key(i), &buf, &ReplicateConfig::default());
                    let now = Instant::now();
                    {
                        let mut rec = record.lock();
                        rec.ops += 1;
                        match &r {
                            Ok(()) => rec.committed.push((i, now, c.master_epoch())),
                            Err(e) => rec.errors.push((now, format!("put: {}", reason(e)))),
                        }
                    }
                    if r.is_ok() {
                        n += 1;
                    } else {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    let probe = {
                        let rec = record.lock();
                        rec.committed[rng.usize(..rec.committed.len())].0
                    };
                    let g = c.get(&key(probe));
                    let mut rec = record.lock();
                    rec.ops += 1;
                    if let Err(e) = g {
                        rec.errors
                            .push((Instant::now(), format!("get: {}", reason(&e))));
                    }
                }
                Ok(())
            })?
    };
    std::thread::sleep(Duration::from_secs(1));

    // 1. kill -9 of the leader.
    let (old, old_epoch) = bench.wait_leader(None, Duration::from_secs(5))?;
    progress(&format!(
        "kill -9 of the leader (master-{old}, epoch {old_epoch})"
    ));
    let before = committed_keys(&record.lock());
    let overflows_before = super::kit::procfs::listen_overflows();
    let killed = Instant::now();
    if let Some(idle) = &idle {
        idle.fault(killed);
    }
    bench.pool.masters[old].kill();
    events.push((at(killed), format!("kill -9 of master-{old}")));
    let kill = fault_outcome(
        bench,
        &main,
        &record,
        &before,
        killed,
        Some(old),
        old_epoch,
        ttl,
    )?;
    let idle_return = idle.as_ref().map(|idle| {
        progress("waiting for the idle clients to be back on the new leader");
        let back = idle.wait_return(Duration::from_secs(60));
        let overflows = super::kit::procfs::listen_overflows()
            .zip(overflows_before)
            .map(|(after, before)| after.saturating_sub(before));
        IdleReturn::new(
            &back,
            kill.leader_seen_s.unwrap_or(0.0),
            overflows,
            idle.figures(),
        )
    });
    progress(&format!("master-{old} started again: it stands by"));
    bench.pool.masters[old].start()?;
    events.push((at(Instant::now()), format!("master-{old} restarted")));

    // 2. SIGSTOP of the new leader for --pause, writes sent to it meanwhile.
    std::thread::sleep(Duration::from_secs(1));
    let (paused, paused_epoch) = bench.wait_leader(None, Duration::from_secs(5))?;
    let rpc = bench.pool.masters[paused].addrs.rpc.to_string();
    let mut stale: Vec<Connection> = (0..16)
        .map(|_| Connection::connect(&rpc, &ConnOptions::default()))
        .collect::<Result<_, _>>()?;
    progress(&format!(
        "SIGSTOP of the leader (master-{paused}, epoch {paused_epoch}) for {:?}",
        args.pause.0
    ));
    let before = committed_keys(&record.lock());
    let pid = bench.pool.masters[paused].pid().unwrap_or(0) as i32;
    let signal = |s| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), s);
    signal(nix::sys::signal::Signal::SIGSTOP)?;
    let stopped = Instant::now();
    events.push((at(stopped), format!("SIGSTOP of master-{paused}")));
    // A signal takes effect a moment after it is sent: the writes must reach a master that
    // is really stopped, or they are rightly answered by a leader still within its lease.
    anyhow::ensure!(
        wait_stopped(pid, Duration::from_secs(5)),
        "master-{paused} did not stop"
    );
    let mut ids = Vec::new();
    for (j, conn) in stale.iter_mut().enumerate() {
        let req = PutStartReq {
            client_id: 1 + j as u64,
            key: format!("stale/{j}"),
            size: 4096,
            config: Default::default(),
        };
        ids.push(conn.send(Opcode::PutStart, &req.to_meta(), &[])?);
    }
    let fault = fault_outcome(
        bench,
        &main,
        &record,
        &before,
        stopped,
        Some(paused),
        paused_epoch,
        ttl,
    )?;
    let left = args.pause.0.saturating_sub(stopped.elapsed());
    std::thread::sleep(left);
    signal(nix::sys::signal::Signal::SIGCONT)?;
    let continued = Instant::now();
    events.push((at(continued), format!("SIGCONT of master-{paused}")));
    let (mut accepted, mut refused) = (0, 0);
    for (conn, id) in stale.iter_mut().zip(ids) {
        match conn.recv(id) {
            Ok(_) => accepted += 1,
            Err(TransferError::Remote {
                status: Status::NotLeader,
                ..
            }) => refused += 1,
            Err(_) => {}
        }
    }
    let mut stepped_down = None;
    while continued.elapsed() < Duration::from_secs(30) {
        if bench.health(paused).is_some_and(|h| h["role"] == "standby") {
            stepped_down = Some(continued.elapsed().as_secs_f64());
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let pause = Pause {
        fault,
        pause_s: continued.duration_since(stopped).as_secs_f64(),
        stale_writes_sent: stale.len(),
        stale_writes_accepted: accepted,
        stale_writes_refused: refused,
        stepped_down_after_continue_s: stepped_down,
    };

    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    if let Ok(Err(e)) = looper.join() {
        progress(&format!("the client loop stopped: {e}"));
    }
    let rec = record.lock();
    let objects = committed_objects(&rec);
    progress(&format!(
        "reading all {} committed objects back",
        objects.len()
    ));
    let mut good = 0;
    let mut expected = vec![0u8; size];
    for chunk in objects.chunks(64) {
        let keys: Vec<String> = chunk.iter().map(|i| key(*i)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        for (i, r) in chunk.iter().zip(main.batch_get(&refs)) {
            fill_value(*i, &mut expected);
            if r.is_ok_and(|v| v == expected) {
                good += 1;
            }
        }
    }
    Ok(Report {
        masters: args.masters,
        etcd_members: args.etcd_members,
        lease_ttl_s: ttl.as_secs_f64(),
        stores: args.stores,
        value_bytes: size as u64,
        kill,
        idle_return,
        pause,
        objects_committed: objects.len(),
        objects_lost: objects.len() - good,
        puts_acknowledged: rec.committed.len(),
        client_ops: rec.ops,
        client_errors: rec.errors.len() as u64,
        errors_by_reason: rec.errors.iter().fold(BTreeMap::new(), |mut m, (_, why)| {
            *m.entry(why.clone()).or_insert(0) += 1;
            m
        }),
        timeline: Timeline {
            acks: rec
                .committed
                .iter()
                .filter(|(_, when, _)| *when >= t0)
                .map(|(_, when, epoch)| (at(*when), *epoch))
                .collect(),
            errors: rec.errors.iter().map(|(when, _)| at(*when)).collect(),
            events,
        },
    })
}

/// The epoch of the acknowledging master as a step line: the first acknowledgement, each change
/// (the old epoch held until the new one's first acknowledgement), and the last.
fn epoch_steps(acks: &[(f64, u64)]) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    for (i, &(at, epoch)) in acks.iter().enumerate() {
        let epoch = epoch as f64;
        match out.last() {
            None => out.push((at, epoch)),
            Some(&(_, prev)) if prev != epoch => {
                out.push((at, prev));
                out.push((at, epoch));
            }
            _ if i + 1 == acks.len() => out.push((at, epoch)),
            _ => {}
        }
    }
    out
}

impl BenchReport for Report {
    fn table(&self) -> String {
        let r = self;
        let mut out = String::new();
        let s = |v: Option<f64>| v.map_or("never".to_string(), |v| format!("{v:.3} s"));
        let _ = writeln!(
            out,
            "{} masters on {} etcd member(s), lease TTL {:.0} s; {} stores; objects of {} bytes",
            r.masters, r.etcd_members, r.lease_ttl_s, r.stores, r.value_bytes
        );
        for (name, f) in [
            ("kill -9 of the leader", &r.kill),
            ("SIGSTOP of the leader", &r.pause.fault),
        ] {
            let _ = writeln!(
                out,
                "{name} (epoch {} → {}): new leader seen after {}, first put after {}, all {} \
                 earlier objects listed after {}; client errors meanwhile: {}",
                f.epoch_before,
                f.epoch_after,
                s(f.leader_seen_s),
                s(f.first_put_s),
                f.objects_before,
                s(f.all_readable_s),
                if f.errors.is_empty() {
                    "none".to_string()
                } else {
                    f.errors
                        .iter()
                        .map(|(k, v)| format!("{v} {k}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            );
        }
        if let Some(i) = &r.idle_return {
            let _ = writeln!(
                out,
                "idle clients: {} of {} back on the new leader ({} within 5 s of it being seen): \
                 after it was seen p50 {}, p99 {}, last {}; {} connections dropped by full accept \
                 queues; {} pings, {} failed tries, {} connections made again",
                i.back,
                i.clients,
                i.back_within_5s_of_leader,
                s(i.p50_s),
                s(i.p99_s),
                s(i.max_s),
                i.listen_overflows
                    .map_or("unknown".to_string(), |n| n.to_string()),
                i.figures.pings,
                i.figures.ping_errors,
                i.figures.reconnects,
            );
        }
        let _ = writeln!(
            out,
            "paused {:.1} s: writes sent to it meanwhile {}, accepted after its lease {} (must be 0), \
             refused NOT_LEADER {}; it stepped down {} after SIGCONT",
            r.pause.pause_s,
            r.pause.stale_writes_sent,
            r.pause.stale_writes_accepted,
            r.pause.stale_writes_refused,
            s(r.pause.stepped_down_after_continue_s)
        );
        let _ = writeln!(
            out,
            "objects committed {} ({} puts acknowledged), lost {} (must be 0); client operations {}, \
             failed {} ({})",
            r.objects_committed,
            r.puts_acknowledged,
            r.objects_lost,
            r.client_ops,
            r.client_errors,
            r.errors_by_reason
                .iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        out
    }

    /// The HTML report: the client's puts and failures per second with the faults marked, and
    /// the epoch of the master behind each acknowledgement.
    fn page(&self) -> anyhow::Result<crate::report::Page> {
        let r = self;
        use crate::report::{Format, LineChart, Page, Series};
        let t = &r.timeline;
        let mut page = Page::new("Master failover: kill -9 and SIGSTOP of the leader");
        page.fact(
            "cluster",
            format!(
                "{} masters electing through {} etcd member(s), lease TTL {} s; {} stores; values of {} bytes",
                r.masters, r.etcd_members, r.lease_ttl_s, r.stores, r.value_bytes
            ),
        )
        .fact(
            "outcome",
            format!(
                "{} objects committed, {} lost; writes a paused leader accepted after its lease: {}",
                r.objects_committed, r.objects_lost, r.pause.stale_writes_accepted
            ),
        );
        let acks = Series::per_second(
            "puts acknowledged/s",
            &t.acks.iter().map(|(s, _)| (*s, 1.0)).collect::<Vec<_>>(),
        );
        let errors = Series::per_second(
            "operations failed/s",
            &t.errors.iter().map(|s| (*s, 1.0)).collect::<Vec<_>>(),
        );
        let top = acks
            .points
            .iter()
            .chain(&errors.points)
            .map(|p| p.1)
            .fold(1.0, f64::max);
        let mut rates = LineChart::new(
            "failover-rates",
            "The client's puts and failures over the run",
            "seconds since the loop started",
            "per second",
        )
        .series(acks)
        .series(errors);
        let mut epochs = LineChart::new(
            "failover-epochs",
            "Epoch of the master that acknowledged each put",
            "seconds since the loop started",
            "epoch",
        )
        .formats(Format::Number, Format::Integer);
        epochs = epochs.series(Series::new("epoch", epoch_steps(&t.acks)));
        for (at, what) in &t.events {
            rates = rates.series(Series {
                name: what.clone(),
                points: vec![(*at, 0.0), (*at, top)],
                reference: true,
            });
        }
        page.heading("Charts");
        page.line_chart(&rates, "Dashed: the faults, when they were made.")?;
        page.line_chart(
            &epochs,
            "A new epoch is a new leader: every put after a failover is acknowledged by it. Each \
             step is the first put the new leader acknowledged.",
        )?;
        page.heading("Figures");
        let fault_row = |name: &str, f: &Fault| {
            vec![
                name.to_string(),
                f.first_put_s.map_or("-".into(), |s| format!("{s:.2}")),
                f.all_readable_s.map_or("-".into(), |s| format!("{s:.2}")),
                f.objects_before.to_string(),
                format!("{} → {}", f.epoch_before, f.epoch_after),
                f.errors.values().sum::<u64>().to_string(),
            ]
        };
        page.table(
            &[
                "fault",
                "first put after (s)",
                "all readable after (s)",
                "objects before",
                "epoch",
                "client errors",
            ],
            vec![
                fault_row("kill -9 of the leader", &r.kill),
                fault_row("SIGSTOP of the next leader", &r.pause.fault),
            ],
        );
        Ok(page)
    }
}

/// Waits until every thread of `pid` is stopped (state `T` in `/proc/<pid>/task/*/stat`).
fn wait_stopped(pid: i32, within: Duration) -> bool {
    let stopped = || super::kit::procfs::all_threads_stopped(pid as u32);
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if stopped() == Some(true) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

/// Waits for the failover that `at` started and measures it from the client's record.
#[allow(clippy::too_many_arguments)]
fn fault_outcome(
    bench: &Bench,
    main: &Client,
    record: &Mutex<Record>,
    before: &[String],
    at: Instant,
    old: Option<usize>,
    old_epoch: u64,
    ttl: Duration,
) -> anyhow::Result<Fault> {
    let within = ttl * 5 + Duration::from_secs(20);
    let (_, epoch_after) = bench.wait_leader(old, within)?;
    let leader_seen_s = Some(at.elapsed().as_secs_f64());
    let all_readable_s = wait_all_listed(main, before, at, within);
    let deadline = Instant::now() + within;
    let first_put_s = loop {
        // The first put a newer leader acknowledged (the old one may answer for a moment
        // after a signal is sent: delivery is not instant).
        let first = record
            .lock()
            .committed
            .iter()
            .rev()
            .take_while(|(_, t, _)| *t > at)
            .filter(|(_, _, epoch)| *epoch > old_epoch)
            .last()
            .map(|(_, t, _)| t.duration_since(at).as_secs_f64());
        if first.is_some() || Instant::now() > deadline {
            break first;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let until = at
        + Duration::from_secs_f64(
            all_readable_s
                .unwrap_or(0.0)
                .max(first_put_s.unwrap_or(0.0)),
        );
    let mut errors = BTreeMap::new();
    for (t, why) in &record.lock().errors {
        if *t >= at && *t <= until {
            *errors.entry(why.clone()).or_insert(0) += 1;
        }
    }
    Ok(Fault {
        leader_seen_s,
        first_put_s,
        all_readable_s,
        objects_before: before.len(),
        epoch_before: old_epoch,
        epoch_after,
        errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_are_drawn_as_steps_through_the_gap_a_failover_leaves() {
        let acks = [(0.0, 2), (0.5, 2), (1.0, 2), (3.5, 4), (4.0, 4), (7.0, 6)];
        assert_eq!(
            epoch_steps(&acks),
            vec![(0.0, 2.0), (3.5, 2.0), (3.5, 4.0), (7.0, 4.0), (7.0, 6.0)]
        );
        assert_eq!(
            epoch_steps(&[(1.0, 3), (2.0, 3)]),
            vec![(1.0, 3.0), (2.0, 3.0)]
        );
        assert!(epoch_steps(&[]).is_empty());
    }
}
