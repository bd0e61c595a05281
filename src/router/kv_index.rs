//! The router's global KV index: every worker that publishes KV events (its `/server_info`
//! says where, under `kv_events`) is followed by a subscription that keeps the index in step
//! (`kv_events::subscribe`), and `precise_prefix` asks it which worker holds how much of a
//! request (`PrefixView`). A worker whose events are not followed, or are out of step, is
//! unknown to the policy, which then falls back for it. The pool's master may be followed too
//! (`--kv-events-pool-endpoint`): what it holds any engine can load, so a request's blocks an
//! engine lacks and the pool has count for every engine, as pool blocks.

use crate::kv_events::hash::block_hashes;
use crate::kv_events::{Index, Sink, Source, SourceId, SourceStats, Subscription};
use crate::router::policy::tree::Tenant;
use crate::router::policy::{HeldPrefix, PrefixView, TextForm};
use crate::router::tokenize::{ids_of_token_text, parse_ids};
use crate::telemetry::Family;
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::Arc;

// The `/metrics` families this file writes, each declared once.
const KV_INDEX_BLOCKS: Family = Family::gauge(
    "rbgctl_router_kv_index_blocks",
    "Blocks the global KV index holds (any worker, any tier).",
);
const KV_INDEX_CAPACITY_BLOCKS: Family = Family::gauge(
    "rbgctl_router_kv_index_capacity_blocks",
    "Blocks the index's byte budget holds.",
);
const KV_INDEX_EVICTED_TOTAL: Family = Family::counter(
    "rbgctl_router_kv_index_evicted_total",
    "Blocks dropped because the index was full (the one stored longest ago).",
);
const KV_INDEX_WORKERS_FOLLOWED: Family = Family::gauge(
    "rbgctl_router_kv_index_workers_followed",
    "Workers whose KV events are followed.",
);
const KV_INDEX_WORKERS_UNFOLLOWED: Family = Family::gauge(
    "rbgctl_router_kv_index_workers_unfollowed",
    "Workers whose KV events could not be followed yet (tried again, at most every 30 s).",
);

const KV_EVENT_CATCH_UP_SECONDS: Family = Family::gauge(
    "rbgctl_router_kv_event_catch_up_seconds",
    "How long catching up a worker's events from its replay buffer took when it was first \
     followed.",
);
const KV_EVENTS_TOTAL: Family = Family::counter(
    "rbgctl_router_kv_events_total",
    "KV events applied, by worker.",
);
const KV_EVENT_GAPS_TOTAL: Family = Family::counter(
    "rbgctl_router_kv_event_gaps_total",
    "Gaps in a worker's event sequence (missed messages, a restart, a late start).",
);
const KV_EVENT_REPLAYS_TOTAL: Family = Family::counter(
    "rbgctl_router_kv_event_replays_total",
    "Gaps a replay filled.",
);
const KV_EVENT_LOSSES_TOTAL: Family = Family::counter(
    "rbgctl_router_kv_event_losses_total",
    "Gaps no replay could fill (the worker's blocks were forgotten).",
);
const KV_EVENTS_IN_STEP: Family = Family::gauge(
    "rbgctl_router_kv_events_in_step",
    "1 while a worker's events are followed whole, else 0 (precise_prefix falls back for it).",
);

/// A per-worker metric family and its value from a subscription's account.
type PerWorker = (&'static Family<'static>, fn(&SourceStats) -> f64);

/// Default byte budget of the index.
pub const DEFAULT_BUDGET: usize = 256 << 20;

/// Most data-parallel ranks one worker's descriptor may declare: each rank costs a thread and
/// three sockets.
pub const MAX_DP_RANKS: usize = 128;
/// Most ranks followed, all workers together: three sockets a rank (SUB, its monitor, a
/// replay's DEALER) stay within libzmq's 1,023 sockets a context.
pub const MAX_FOLLOWED_RANKS: usize = 256;

/// A followed worker: one subscription per data-parallel rank it runs (each rank has a cache,
/// and publishes, of its own), as its descriptor said.
struct Followed {
    block_size: usize,
    published: Published,
    ranks: Vec<FollowedRank>,
}

/// Where the router stands with a worker's KV events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventsOf {
    /// Followed, and heard since any disconnection.
    Followed,
    /// Followed, but a connection dropped and nothing came since: the engine may have started
    /// again on other ports.
    Quiet,
    /// It publishes none.
    NonePublished,
    /// Not followed (yet): its descriptor could not be read, or its publisher reached.
    NotFollowed,
}

struct FollowedRank {
    rank: usize,
    id: SourceId,
    subscription: Subscription,
}

impl Followed {
    /// The ranks whose events are followed whole, with their sources.
    fn in_step(&self) -> impl Iterator<Item = &FollowedRank> {
        self.ranks
            .iter()
            .filter(|r| r.subscription.stats.in_step.load(Ordering::Relaxed))
    }
}

/// The router's global KV index, fed by the workers' KV events.
pub struct KvIndex {
    index: Arc<Mutex<Index>>,
    followed: Mutex<HashMap<Tenant, Followed>>,
    /// The pool's master, when followed (its blocks are any engine's).
    pool: Mutex<Option<(SourceId, String, Subscription)>>,
    next_id: AtomicU16,
    /// A followed worker is the SIMULATED engine: prompts are tokenized as it tokenizes them.
    simulated: AtomicBool,
    /// The ZMQ context of every subscription (one I/O thread for them all).
    zmq: zmq::Context,
    /// Workers whose events the router is still finding out about (`expect`).
    pending: Mutex<std::collections::HashSet<Tenant>>,
    /// Workers that publish none, and those whose events could not be followed (yet).
    silent: Mutex<std::collections::HashSet<Tenant>>,
    unfollowed: Mutex<std::collections::HashSet<Tenant>>,
    /// When the router started, and whether its start-up catch-up is over (`warming`).
    started: std::time::Instant,
    warm: AtomicBool,
}

/// Longest a starting router stays not ready while it catches up the workers' events.
pub const WARM_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Where a worker publishes, as its descriptor (`/server_info`'s `kv_events`) says: each
/// data-parallel rank on the base ports plus its rank (as SGLang's publisher offsets them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    pub host: String,
    pub port_base: u64,
    pub replay_port_base: Option<u64>,
    pub topic: String,
    pub block_size: usize,
    pub dp_size: usize,
}

impl Published {
    /// The ZMQ endpoint rank `rank` publishes its events on.
    pub fn endpoint(&self, rank: usize) -> String {
        format!("tcp://{}:{}", self.host, self.port_base + rank as u64)
    }

    /// The endpoint rank `rank` replays missed events on, when the worker offers replay.
    pub fn replay_endpoint(&self, rank: usize) -> Option<String> {
        self.replay_port_base
            .map(|p| format!("tcp://{}:{}", self.host, p + rank as u64))
    }
}

/// Where a worker's descriptor (`/server_info`'s `kv_events`) says to subscribe: the host is
/// the worker's own when the descriptor names a wildcard.
pub fn source_of(descriptor: &Value, worker_host: &str) -> Option<Published> {
    if descriptor.get("publisher").and_then(Value::as_str) != Some("zmq") {
        return None;
    }
    let host = match descriptor.get("endpoint_host").and_then(Value::as_str)? {
        "*" | "0.0.0.0" | "::" | "[::]" => worker_host,
        h => h,
    };
    let port_base = descriptor
        .get("endpoint_port_base")
        .and_then(Value::as_u64)?;
    let replay_port_base = descriptor
        .get("replay_endpoint_port_base")
        .and_then(Value::as_u64);
    let topic = descriptor
        .get("topic")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let block_size = descriptor.get("block_size").and_then(Value::as_u64)? as usize;
    let dp_size = match descriptor.get("dp_size") {
        None => 1,
        Some(n) => n
            .as_u64()
            .filter(|n| (1..=MAX_DP_RANKS as u64).contains(n))? as usize,
    };
    let fits = |base: u64| base + dp_size as u64 - 1 <= u64::from(u16::MAX);
    (block_size > 0 && fits(port_base) && replay_port_base.is_none_or(fits)).then(|| Published {
        host: host.to_string(),
        port_base,
        replay_port_base,
        topic,
        block_size,
        dp_size,
    })
}

impl KvIndex {
    /// An empty index holding at most about `budget_bytes` of blocks.
    pub fn new(budget_bytes: usize) -> KvIndex {
        KvIndex {
            index: Arc::new(Mutex::new(Index::with_budget(budget_bytes))),
            followed: Mutex::new(HashMap::new()),
            pool: Mutex::new(None),
            next_id: AtomicU16::new(0),
            simulated: AtomicBool::new(false),
            zmq: zmq::Context::new(),
            pending: Mutex::new(Default::default()),
            silent: Mutex::new(Default::default()),
            unfollowed: Mutex::new(Default::default()),
            started: std::time::Instant::now(),
            warm: AtomicBool::new(false),
        }
    }

    /// The router is finding out whether and where `worker` publishes events.
    pub fn expect(&self, worker: &Tenant) {
        self.pending.lock().insert(worker.clone());
    }

    /// What `worker` publishes is settled: followed, none, or given up on for now.
    pub fn settled(&self, worker: &str) {
        self.pending.lock().remove(worker);
    }

    /// `worker`'s events could not be followed this time (it is tried again).
    pub fn not_followed(&self, worker: &Tenant) {
        self.unfollowed.lock().insert(worker.clone());
    }

    /// Workers whose events are not followed (yet), for readiness and metrics.
    pub fn unfollowed(&self) -> usize {
        self.unfollowed.lock().len()
    }

    /// Where the router stands with `worker`'s events.
    pub fn state_of(&self, worker: &str) -> EventsOf {
        if self.silent.lock().contains(worker) {
            return EventsOf::NonePublished;
        }
        match self.followed.lock().get(worker) {
            None => EventsOf::NotFollowed,
            Some(f) => {
                let quiet = f
                    .ranks
                    .iter()
                    .any(|r| r.subscription.stats.disconnected.load(Ordering::Relaxed));
                if quiet {
                    EventsOf::Quiet
                } else {
                    EventsOf::Followed
                }
            }
        }
    }

    /// Whether a router that just started is still catching up what the workers (and the
    /// pool) hold: a worker's events not yet found out about, or a subscription's catch-up from
    /// its replay buffer not over. Its readiness waits for this, so that a restarted router
    /// takes traffic knowing the caches rather than cold. Once over, or past [`WARM_LIMIT`]
    /// from the start, never again: a worker that joins later is caught up while the router
    /// serves.
    pub fn warming(&self) -> bool {
        if self.warm.load(Ordering::Relaxed) {
            return false;
        }
        let synced = |s: &Subscription| s.stats.synced.load(Ordering::Acquire);
        let busy = !self.pending.lock().is_empty()
            || self
                .followed
                .lock()
                .values()
                .flat_map(|f| &f.ranks)
                .any(|r| !synced(&r.subscription))
            || self
                .pool
                .lock()
                .as_ref()
                .is_some_and(|(_, _, s)| !synced(s));
        if busy && self.started.elapsed() < WARM_LIMIT {
            return true;
        }
        self.warm.store(true, Ordering::Relaxed);
        false
    }

    /// Starts a subscription of `source`'s events into the index.
    fn subscribe(
        &self,
        endpoint: &str,
        replay: Option<String>,
        topic: String,
    ) -> Result<(SourceId, Subscription), String> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let index = self.index.clone();
        let sink: Sink = Arc::new(move |source, event| index.lock().apply(source, event));
        let source = Source {
            id,
            endpoint: endpoint.to_string(),
            replay_endpoint: replay,
            topic,
        };
        let subscription =
            Subscription::start(&self.zmq, source, sink).map_err(|e| format!("{endpoint}: {e}"))?;
        Ok((id, subscription))
    }

    /// Follows the pool master's events (`rbgctl master --kv-events-config`), every topic.
    pub fn follow_pool(&self, endpoint: &str, replay: Option<String>) -> Result<(), String> {
        let (id, subscription) = self.subscribe(endpoint, replay, String::new())?;
        tracing::info!(%endpoint, source = id, "following the pool's KV events");
        *self.pool.lock() = Some((id, endpoint.to_string(), subscription));
        Ok(())
    }

    /// Follows `worker`'s events as its `/server_info` (`info`) describes them: every
    /// data-parallel rank's, or with `dp_rank` (a `--dp-aware` worker, one rank of a server)
    /// that rank's alone. A worker followed already is left as it is while its descriptor says
    /// the same, and followed anew where it now publishes when it says otherwise. False when
    /// it publishes none. Opens sockets and starts threads: call it off the async runtime.
    pub fn follow(
        &self,
        worker: &Tenant,
        worker_host: &str,
        info: &Value,
        dp_rank: Option<usize>,
    ) -> Result<bool, String> {
        let Some(published) = info
            .get("kv_events")
            .and_then(|d| source_of(d, worker_host))
        else {
            if info.get("kv_events").is_some_and(|d| !d.is_null())
                && info["kv_events"].get("publisher").and_then(Value::as_str) == Some("zmq")
            {
                return Err(format!(
                    "its KV events descriptor is not one the router follows (a block size, \
                     ports within 1..=65535, dp_size within 1..={MAX_DP_RANKS}): {}",
                    info["kv_events"]
                ));
            }
            self.silent.lock().insert(worker.clone());
            self.unfollowed.lock().remove(worker);
            return Ok(false);
        };
        if let Some(f) = self.followed.lock().get(worker) {
            if f.published == published {
                return Ok(true);
            }
        }
        let ranks: Vec<usize> = match dp_rank {
            None => (0..published.dp_size).collect(),
            Some(r) if r < published.dp_size => vec![r],
            Some(r) => {
                return Err(format!(
                    "rank {r} of a server whose KV events descriptor says dp_size {}",
                    published.dp_size
                ))
            }
        };
        let others: usize = self
            .followed
            .lock()
            .iter()
            .filter(|(w, _)| *w != worker)
            .map(|(_, f)| f.ranks.len())
            .sum();
        if others + ranks.len() > MAX_FOLLOWED_RANKS {
            return Err(format!(
                "following its {} ranks would pass the router's {MAX_FOLLOWED_RANKS} followed \
                 ranks (now {others})",
                ranks.len()
            ));
        }
        // A worker that publishes elsewhere now: its old subscriptions go first.
        self.stop_following(worker);
        let mut followed = Vec::with_capacity(ranks.len());
        for rank in ranks {
            let endpoint = published.endpoint(rank);
            let (id, subscription) = self.subscribe(
                &endpoint,
                published.replay_endpoint(rank),
                published.topic.clone(),
            )?;
            tracing::info!(worker = %worker, %endpoint, dp_rank = rank, block_size = published.block_size,
                source = id, "following KV events");
            followed.push(FollowedRank {
                rank,
                id,
                subscription,
            });
        }
        if info.get("simulated").and_then(Value::as_bool) == Some(true) {
            self.simulated.store(true, Ordering::Relaxed);
        }
        self.followed.lock().insert(
            worker.clone(),
            Followed {
                block_size: published.block_size,
                published,
                ranks: followed,
            },
        );
        self.unfollowed.lock().remove(worker);
        Ok(true)
    }

    /// Stops following `worker`; what it held is forgotten. The subscription's thread may be
    /// in a replay's wait (up to 2 s): it is stopped, and the blocks cleared after it, on a
    /// thread of their own, so that the caller (an API request) never waits.
    pub fn forget(&self, worker: &str) {
        self.unfollowed.lock().remove(worker);
        self.silent.lock().remove(worker);
        self.stop_following(worker);
    }

    /// Stops `worker`'s subscriptions, if any, and forgets the blocks they brought (see
    /// [`KvIndex::forget`]).
    fn stop_following(&self, worker: &str) {
        let Some(f) = self.followed.lock().remove(worker) else {
            return;
        };
        let index = self.index.clone();
        let stop = move || {
            for r in f.ranks {
                drop(r.subscription);
                index.lock().clear_source(r.id);
            }
        };
        if let Err(e) = std::thread::Builder::new()
            .name("kv-sub-stop".into())
            .spawn(stop)
        {
            tracing::warn!(error = %e, "cannot stop a KV event subscription on a thread of its own");
        }
    }

    /// Whether prompts are tokenized as the SIMULATED engine does (a followed worker is one).
    pub fn simulated(&self) -> bool {
        self.simulated.load(Ordering::Relaxed)
    }

    /// The index's Prometheus families: its size, and per followed worker what came in.
    pub fn render_metrics(&self) -> String {
        let mut p = crate::telemetry::PromText::new();
        let (blocks, capacity, stats) = {
            let ix = self.index.lock();
            (ix.len(), ix.capacity(), ix.stats)
        };
        p.single(&KV_INDEX_BLOCKS, blocks as f64);
        p.single(&KV_INDEX_CAPACITY_BLOCKS, capacity as f64);
        p.single(&KV_INDEX_EVICTED_TOTAL, stats.evicted as f64);
        p.single(&KV_INDEX_WORKERS_UNFOLLOWED, self.unfollowed() as f64);
        let followed = self.followed.lock();
        p.single(&KV_INDEX_WORKERS_FOLLOWED, followed.len() as f64);
        let families: [PerWorker; 6] = [
            (&KV_EVENT_CATCH_UP_SECONDS, |s| {
                s.sync_ms.load(Ordering::Relaxed) as f64 / 1000.0
            }),
            (&KV_EVENTS_TOTAL, |s| {
                s.events.load(Ordering::Relaxed) as f64
            }),
            (&KV_EVENT_GAPS_TOTAL, |s| {
                s.gaps.load(Ordering::Relaxed) as f64
            }),
            (&KV_EVENT_REPLAYS_TOTAL, |s| {
                s.replayed.load(Ordering::Relaxed) as f64
            }),
            (&KV_EVENT_LOSSES_TOTAL, |s| {
                s.lost.load(Ordering::Relaxed) as f64
            }),
            (&KV_EVENTS_IN_STEP, |s| {
                u8::from(s.in_step.load(Ordering::Relaxed)) as f64
            }),
        ];
        for (family, value) in families {
            p.family(family);
            for (url, f) in followed.iter() {
                for r in &f.ranks {
                    let rank = r.rank.to_string();
                    let labels = [("worker", &**url), ("dp_rank", &rank)];
                    p.sample(family, &labels, value(&r.subscription.stats));
                }
            }
            if let Some((_, endpoint, s)) = &*self.pool.lock() {
                let source = format!("pool {endpoint}");
                p.sample(
                    family,
                    &[("worker", &source), ("dp_rank", "0")],
                    value(&s.stats),
                );
            }
        }
        p.finish()
    }
}

/// A Mooncake Conductor query (`POST /query` with `token_ids`, `POST /query_by_hash` with
/// `seq_hashes` or `block_hash`), as its indexer API takes it.
#[derive(Debug, serde::Deserialize)]
pub struct ConductorQuery {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub token_ids: Option<Vec<u32>>,
    #[serde(default, alias = "block_hash")]
    pub seq_hashes: Option<BlockHashes>,
    pub block_size: usize,
    #[serde(default)]
    pub tenant_id: Option<String>,
    #[serde(default)]
    pub instance_id: Option<String>,
    #[serde(default)]
    pub lora_name: Option<String>,
    #[serde(default)]
    pub cache_salt: Option<String>,
}

/// SGLang's block hashes as a Conductor query gives them: 64-bit integers, signed or not
/// (an unsigned one is its signed twin's bits), read straight into a list of them.
#[derive(Debug, Default)]
pub struct BlockHashes(pub Vec<i64>);

impl<'de> serde::Deserialize<'de> for BlockHashes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Hash(i64);
        impl<'de> serde::Deserialize<'de> for Hash {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = Hash;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("a 64-bit block hash")
                    }
                    fn visit_i64<E>(self, n: i64) -> Result<Hash, E> {
                        Ok(Hash(n))
                    }
                    fn visit_u64<E>(self, n: u64) -> Result<Hash, E> {
                        Ok(Hash(n as i64))
                    }
                }
                d.deserialize_i64(V)
            }
        }
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = BlockHashes;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of 64-bit block hashes")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<BlockHashes, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(Hash(h)) = seq.next_element()? {
                    out.push(h);
                }
                Ok(BlockHashes(out))
            }
        }
        d.deserialize_seq(V)
    }
}

impl KvIndex {
    /// Answers a Conductor query in its tiered shape: per tenant (`default`), per instance (a
    /// worker URL) of that block size, the prefix tokens held (`longest_matched`), on each
    /// medium alone (`GPU`, `CPU`, `DISK`, `EXTERNAL`), and by data-parallel rank (`DP`).
    pub fn conductor(&self, q: &ConductorQuery) -> Result<Value, String> {
        if q.block_size == 0 {
            return Err("block_size must be at least 1".into());
        }
        if q.lora_name.as_deref().is_some_and(|l| !l.is_empty()) || q.cache_salt.is_some() {
            return Err(
                "LoRA and salted hash namespaces are not indexed: leave lora_name and \
                 cache_salt out"
                    .into(),
            );
        }
        let hashes: Vec<i64> = match (&q.token_ids, &q.seq_hashes) {
            (Some(t), None) => block_hashes(t, q.block_size),
            (None, Some(h)) => h.0.clone(),
            _ => {
                return Err(
                    "give token_ids (POST /query) or seq_hashes (POST /query_by_hash)".into(),
                )
            }
        };
        let tenant = q.tenant_id.clone().unwrap_or_else(|| "default".into());
        let followed: Vec<(Tenant, Vec<(usize, SourceId)>)> = self
            .followed
            .lock()
            .iter()
            .filter(|(url, f)| {
                f.block_size == q.block_size
                    && q.instance_id.as_deref().is_none_or(|i| i == &***url)
            })
            .map(|(url, f)| {
                (
                    url.clone(),
                    f.ranks.iter().map(|r| (r.rank, r.id)).collect(),
                )
            })
            .collect();
        let index = self.index.lock();
        let mut instances = serde_json::Map::new();
        let tokens = |blocks: usize| blocks * q.block_size;
        for (url, ranks) in followed {
            // The instance's figures are its best rank's; `DP` says each rank's.
            let runs: Vec<(usize, (usize, [usize; 4]))> = ranks
                .iter()
                .map(|&(rank, id)| (rank, index.runs(&hashes, id)))
                .collect();
            let Some(&(_, (any, [gpu, cpu, disk, external]))) = runs
                .iter()
                .max_by_key(|(rank, (any, _))| (*any, std::cmp::Reverse(*rank)))
            else {
                continue;
            };
            let dp: serde_json::Map<String, Value> = runs
                .iter()
                .map(|(rank, (any, _))| (rank.to_string(), Value::from(tokens(*any))))
                .collect();
            instances.insert(
                url.to_string(),
                serde_json::json!({
                    "longest_matched": tokens(any),
                    "GPU": tokens(gpu),
                    "CPU": tokens(cpu),
                    "DISK": tokens(disk),
                    "EXTERNAL": tokens(external),
                    "DP": dp,
                }),
            );
        }
        Ok(serde_json::json!({ tenant: instances }))
    }
}

/// A request's token ids for the index, from its routing text: its `input_ids`, the router's
/// tokenizer's ids, or with SIMULATED engines their stand-in tokenizer's (one token a word).
pub fn tokens_of(text: &str, form: TextForm, simulated: bool) -> Option<Vec<u32>> {
    match form {
        TextForm::SpacedIds => Some(parse_ids(text)),
        TextForm::TokenChars => Some(ids_of_token_text(text)),
        TextForm::Text => simulated.then(|| crate::simulated_tokens::encode(text)),
    }
}

impl PrefixView for KvIndex {
    fn prefixes(
        &self,
        tokens: &[u32],
        adapter: Option<&str>,
        workers: &[Tenant],
    ) -> Vec<Option<HeldPrefix>> {
        let followed = self.followed.lock();
        let mut hashes_by_size: HashMap<usize, Vec<i64>> = HashMap::new();
        // A worker's ranks followed whole (none: unknown to the policy).
        let known: Vec<Option<(Vec<SourceId>, usize)>> = workers
            .iter()
            .map(|w| {
                let f = followed.get(w)?;
                let ids: Vec<SourceId> = f.in_step().map(|r| r.id).collect();
                (!ids.is_empty()).then_some((ids, f.block_size))
            })
            .collect();
        drop(followed);
        let pool = self
            .pool
            .lock()
            .as_ref()
            .filter(|(_, _, s)| s.stats.in_step.load(Ordering::Relaxed))
            .map(|(id, _, _)| *id);
        for (_, size) in known.iter().flatten() {
            hashes_by_size
                .entry(*size)
                .or_insert_with(|| match adapter {
                    Some(name) => crate::kv_events::hash::adapter_block_keys(name, tokens, *size),
                    None => block_hashes(tokens, *size),
                });
        }
        let index = self.index.lock();
        // A worker holds what its best rank holds (the server, or a `--dp-aware` router,
        // picks the rank).
        known
            .iter()
            .map(|k| {
                let (ids, size) = k.as_ref()?;
                let prefix = index
                    .prefixes(&hashes_by_size[size], ids, pool)
                    .into_iter()
                    .max_by(|a, b| {
                        crate::router::policy::worth(a).total_cmp(&crate::router::policy::worth(b))
                    })?;
                Some(HeldPrefix {
                    prefix,
                    block_size: *size,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_starting_router_warms_until_every_workers_events_are_settled_and_only_once() {
        let ix = KvIndex::new(1 << 20);
        ix.expect(&Tenant::from("http://w1"));
        ix.expect(&Tenant::from("http://w2"));
        assert!(ix.warming());
        ix.settled("http://w1");
        assert!(ix.warming(), "w2 is not settled yet");
        ix.settled("http://w2");
        assert!(!ix.warming());
        // A worker that joins later is caught up while the router serves.
        ix.expect(&Tenant::from("http://w3"));
        assert!(!ix.warming());
    }

    #[test]
    fn tokens_come_from_ids_the_tokenizer_or_the_simulated_stand_in() {
        assert_eq!(
            tokens_of("5 6 7", TextForm::SpacedIds, false),
            Some(vec![5, 6, 7])
        );
        let chars = crate::router::tokenize::token_text(&[70_000, 3]);
        assert_eq!(
            tokens_of(&chars, TextForm::TokenChars, false),
            Some(vec![70_000, 3])
        );
        assert_eq!(
            tokens_of("t12 t13", TextForm::Text, true),
            Some(vec![12, 13])
        );
        assert_eq!(tokens_of("plain text", TextForm::Text, false), None);
    }

    #[test]
    fn conductor_queries_say_what_is_wrong() {
        let k = KvIndex::new(1 << 20);
        let q = |v: serde_json::Value| -> ConductorQuery { serde_json::from_value(v).unwrap() };
        let e = k.conductor(&q(json!({"block_size": 4}))).unwrap_err();
        assert!(e.contains("token_ids"), "{e}");
        let e = k
            .conductor(&q(json!({"block_size": 0, "token_ids": [1]})))
            .unwrap_err();
        assert!(e.contains("block_size"), "{e}");
        let e = k
            .conductor(&q(
                json!({"block_size": 4, "token_ids": [1], "lora_name": "a"}),
            ))
            .unwrap_err();
        assert!(e.contains("lora_name"), "{e}");
        // Nobody followed: an empty tenant, not an error.
        let v = k
            .conductor(&q(json!({"block_size": 4, "block_hash": [1, -2]})))
            .unwrap();
        assert_eq!(v, json!({"default": {}}));
        // Hashes are 64-bit integers, signed or not (the unsigned one's bits).
        let h = q(json!({"block_size": 4, "seq_hashes": [u64::MAX, -5, 7]}));
        assert_eq!(h.seq_hashes.unwrap().0, vec![-1, -5, 7]);
        for bad in [json!([1.5]), json!(["1"]), json!(3)] {
            let r = serde_json::from_value::<ConductorQuery>(
                json!({"block_size": 4, "seq_hashes": bad}),
            );
            assert!(r.is_err(), "{bad}");
        }
    }

    #[test]
    fn a_wildcard_host_is_the_workers_own() {
        let d = json!({"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 5557,
                       "replay_endpoint_port_base": 5558, "topic": "kv", "block_size": 16,
                       "dp_size": 1});
        let p = source_of(&d, "10.0.0.7").unwrap();
        assert_eq!(p.endpoint(0), "tcp://10.0.0.7:5557");
        assert_eq!(p.replay_endpoint(0).as_deref(), Some("tcp://10.0.0.7:5558"));
        assert_eq!((p.topic.as_str(), p.block_size, p.dp_size), ("kv", 16, 1));
        let d = json!({"publisher": "zmq", "endpoint_host": "127.0.0.2", "endpoint_port_base": 1,
                       "block_size": 4});
        let p = source_of(&d, "x").unwrap();
        assert_eq!(
            (p.endpoint(0), p.replay_endpoint(0)),
            ("tcp://127.0.0.2:1".into(), None)
        );
        // Data-parallel ranks publish on the base ports plus their rank, as SGLang offsets them.
        let d = json!({"publisher": "zmq", "endpoint_host": "h", "endpoint_port_base": 6000,
                       "replay_endpoint_port_base": 7000, "block_size": 4, "dp_size": 4});
        let p = source_of(&d, "x").unwrap();
        assert_eq!(p.dp_size, 4);
        assert_eq!(p.endpoint(3), "tcp://h:6003");
        assert_eq!(p.replay_endpoint(2).as_deref(), Some("tcp://h:7002"));
        for bad in [json!(0), json!("2"), json!(5000), json!(MAX_DP_RANKS + 1)] {
            let d = json!({"publisher": "zmq", "endpoint_host": "h", "endpoint_port_base": 6000,
                           "block_size": 4, "dp_size": bad});
            assert_eq!(source_of(&d, "x"), None, "dp_size {bad}");
        }
        let d = json!({"publisher": "zmq", "endpoint_host": "h", "endpoint_port_base": 65535,
                       "block_size": 4, "dp_size": 2});
        assert_eq!(source_of(&d, "x"), None, "rank 1 would be past port 65535");
        assert_eq!(source_of(&json!({"publisher": "null"}), "x"), None);
        assert_eq!(
            source_of(
                &json!({"publisher": "zmq", "endpoint_host": "h", "endpoint_port_base": 1,
                              "block_size": 0}),
                "x"
            ),
            None
        );
    }
}
