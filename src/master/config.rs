//! `rbgctl master` configuration. Precedence: flag > environment (`RBGCTL_MASTER_*`) > TOML file
//! (`--config`) > the defaults documented on each field (Mooncake's defaults where it has one).
//! Example: `config/master.toml`.

use crate::config::{check_pair, check_ratio, layered, ByteSize, ConfigError, Millis};
use crate::master::placement::Strategy;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// The master's settings, from its flags, environment and TOML file.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct MasterConfig {
    /// Address the RPC server binds to. Default `0.0.0.0`.
    pub rpc_address: String,
    /// RPC port. Default 50051.
    pub rpc_port: u16,
    /// Serve Mooncake's HTTP metadata protocol (`/metadata?key=`). Default false.
    pub enable_http_metadata_server: bool,
    /// Default `0.0.0.0`.
    pub http_metadata_server_host: String,
    /// Default 8080.
    pub http_metadata_server_port: u16,
    /// Most bytes (keys and values) the metadata server holds; past it a PUT gets 507.
    /// Default 64 MiB.
    pub http_metadata_max_bytes: ByteSize,
    /// Most keys the metadata server holds; past it a PUT of a new key gets 507. Default 65536.
    pub http_metadata_max_keys: usize,
    /// Largest value a PUT may carry (413 above, from the request's headers). Default 1 MiB;
    /// Mooncake's descriptors are a few KiB.
    pub http_metadata_max_value_bytes: ByteSize,
    /// Address of `/metrics`, `/health` and the admin API. Default `0.0.0.0`.
    pub metrics_host: String,
    /// Default 9003.
    pub metrics_port: u16,
    /// A client (store) whose heartbeats stop for this long is dropped with its segments.
    /// Default 10 s.
    pub client_ttl_ms: Millis,
    /// How long the objects of a persistent store that went away (stopped with SIGTERM, or
    /// stopped heartbeating for `client_ttl`) are kept, unreadable, waiting for it to come
    /// back with the same segment; then they are dropped. 0 drops them at once. Default 300 s.
    pub store_grace_period_ms: Millis,
    /// How long a store may answer reads of locations clients cached (one round trip to the
    /// store instead of one to the master first) after the master last told it what was
    /// removed or replaced. A store the master cannot reach stops within this; a remove or
    /// replace whose news cannot reach a store waits this long before it is acknowledged.
    /// Used up to half of `client_ttl` (a store the master drops must have stopped); 0 turns
    /// cached locations off. Default 2 s.
    pub store_read_lease_ms: Millis,
    /// Read lease granted by every get. Default 10 s.
    pub default_kv_lease_ttl_ms: Millis,
    /// Soft pin duration when a put asks for one without a TTL. Default 30 min.
    pub default_kv_soft_pin_ttl_ms: Millis,
    /// Longest soft pin a put may ask for. Default 24 h.
    pub max_kv_soft_pin_ttl_ms: Millis,
    /// Eviction starts when used/capacity passes this. Default 0.9.
    pub eviction_high_watermark_ratio: f64,
    /// Each eviction brings usage this far below the watermark. Default 0.05.
    pub eviction_ratio: f64,
    /// Disk tier eviction (objects dropped from disk, least recently used first) starts when a
    /// disk segment's used/capacity passes this. Default 0.95.
    pub disk_eviction_high_watermark_ratio: f64,
    /// Each disk tier eviction brings the segment's usage this far below its watermark.
    /// Default 0.05.
    pub disk_eviction_ratio: f64,
    /// Most bytes of demotions (memory → disk copies) in flight per store; past it, eviction
    /// waits for them, and drops what memory must give up at once. Default 256 MiB.
    pub disk_tier_queue_bytes: ByteSize,
    /// Pace of a store's hand-over to the others before it goes (bytes a second copied;
    /// 0: as fast as the stores go). Default 256 MiB.
    pub hand_over_bytes_per_sec: ByteSize,
    /// Copy an object that lives only on disk back to memory when it is read (Mooncake's
    /// `promotion_on_hit`). Default true.
    pub promotion_on_hit: bool,
    /// Reads of a disk-only object before it is promoted: 1 promotes on the first hit, 2 on the
    /// second (Mooncake's `promotion_admission_threshold`, whose default is 2). Default 1.
    pub promotion_admission_threshold: u32,
    /// An unfinished put older than this may be replaced by a new put of its key. Default 30 s.
    pub put_start_discard_timeout_ms: Millis,
    /// An unfinished put older than this is reclaimed. Default 600 s.
    pub put_start_release_timeout_ms: Millis,
    /// How long a client may start writing into a put reservation (space allocated for its
    /// next put of a size, so that put needs only its commit). A restarted master allocates
    /// nothing for this long, so no reservation of its predecessor can be written over a new
    /// object. 0 turns reservations off. Default 500 ms.
    pub put_reservation_ttl_ms: Millis,
    /// Most bytes of reservations one client may hold. Default 64 MiB.
    pub put_reservation_max_bytes: ByteSize,
    /// `random` (default) or `free_ratio_first`.
    pub allocation_strategy: Strategy,
    /// Most simultaneous RPC connections. Default 16384.
    pub max_connections: usize,
    /// Most simultaneous connections from one IP address. Default 4096.
    pub max_connections_per_peer: usize,
    /// A connection with no request for this long is closed (clients reconnect). Default 120 s.
    pub idle_timeout_ms: Millis,
    /// A new connection's first request must begin within this, and a request whose bytes stop
    /// coming for this long ends its connection. Default 10 s.
    pub request_timeout_ms: Millis,
    /// Spin-poll window of the RPC server in microseconds: how long an event loop that just
    /// served something polls before it sleeps (0 = sleep at once). Default 0.
    pub poll_spin_us: u64,
    /// Event-loop threads of the RPC server (0: half the cores, at least 1, at most 16).
    /// Default 0.
    pub rpc_threads: usize,
    /// Interval of the summary log line. Default 10 s.
    pub summary_interval_ms: Millis,
    /// Run as one of several masters that elect a leader (`docs/ha.md`); the others stand by.
    /// Default false.
    pub enable_ha: bool,
    /// Where the election happens: `etcd` (default) or `k8s` (a coordination.k8s.io Lease).
    pub ha_backend: HaBackend,
    /// For `etcd`: the endpoints, `h1:2379;h2:2379`. For `k8s`: `namespace/lease-name`.
    /// Mooncake's `--etcd_endpoints` and `--ha_backend_connstring` set it. Default empty.
    pub ha_backend_connstring: String,
    /// The group's name: masters with the same id elect one leader; clients give it after the
    /// endpoints (`etcd://h1:2379/ID`). Default `mooncake_cluster` (Mooncake's).
    pub cluster_id: String,
    /// How long the leader's lease lasts without renewal: the longest a dead leader blocks a
    /// failover. Whole seconds, at least 1. Default 5 s.
    pub ha_lease_ttl_ms: Millis,
    /// A file holding the cluster secret: RPC connections must prove they hold it, and writes
    /// to the metadata server carry it (`docs/security.md`). Default none: no authentication.
    pub auth_token_file: Option<std::path::PathBuf>,
    /// Serve the metrics and admin port and the metadata server over HTTPS with this PEM
    /// certificate chain, leaf first (with `tls_key_path`). Default: none (plain HTTP).
    pub tls_cert_path: Option<std::path::PathBuf>,
    /// The PEM private key of `tls_cert_path`. Default: none.
    pub tls_key_path: Option<std::path::PathBuf>,
    /// Publish the pool's pages as KV events (medium `EXTERNAL` in memory, `DISK` on the disk
    /// tier), in SGLang's `--kv-events-config` JSON
    /// (`{"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}`).
    /// Default: none.
    pub kv_events_config: Option<String>,
    /// The pool's tenants and their quotas in bytes (`[[tenant]] name = "team-a", quota =
    /// "64GiB"`), read again when the file changes (`docs/kv-pool.md`, Tenants). Default: none
    /// (the default tenant alone, without a quota).
    pub tenants_file: Option<std::path::PathBuf>,
    /// The host other processes reach this master at, published to the election backend.
    /// Default: `rpc_address` when it is a specific address, else `POD_IP`, else the address
    /// this host's name resolves to.
    pub advertise_host: String,
}

/// Where masters elect their leader.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HaBackend {
    #[default]
    Etcd,
    K8s,
}

impl std::str::FromStr for HaBackend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "etcd" => Ok(HaBackend::Etcd),
            "k8s" | "kubernetes" => Ok(HaBackend::K8s),
            other => Err(format!("expected etcd or k8s, got {other:?}")),
        }
    }
}

impl Default for MasterConfig {
    fn default() -> Self {
        MasterConfig {
            rpc_address: "0.0.0.0".into(),
            rpc_port: 50051,
            enable_http_metadata_server: false,
            http_metadata_server_host: "0.0.0.0".into(),
            http_metadata_server_port: 8080,
            http_metadata_max_bytes: ByteSize(64 << 20),
            http_metadata_max_keys: 65_536,
            http_metadata_max_value_bytes: ByteSize(1 << 20),
            metrics_host: "0.0.0.0".into(),
            metrics_port: 9003,
            client_ttl_ms: Millis(Duration::from_secs(10)),
            store_grace_period_ms: Millis(Duration::from_secs(300)),
            store_read_lease_ms: Millis(Duration::from_secs(2)),
            default_kv_lease_ttl_ms: Millis(Duration::from_secs(10)),
            default_kv_soft_pin_ttl_ms: Millis(Duration::from_secs(30 * 60)),
            max_kv_soft_pin_ttl_ms: Millis(Duration::from_secs(24 * 3600)),
            eviction_high_watermark_ratio: 0.9,
            eviction_ratio: 0.05,
            disk_eviction_high_watermark_ratio: 0.95,
            disk_eviction_ratio: 0.05,
            disk_tier_queue_bytes: ByteSize(256 << 20),
            hand_over_bytes_per_sec: ByteSize(256 << 20),
            promotion_on_hit: true,
            promotion_admission_threshold: 1,
            put_start_discard_timeout_ms: Millis(Duration::from_secs(30)),
            put_start_release_timeout_ms: Millis(Duration::from_secs(600)),
            put_reservation_ttl_ms: Millis(Duration::from_millis(500)),
            put_reservation_max_bytes: ByteSize(64 << 20),
            allocation_strategy: Strategy::Random,
            max_connections: 16384,
            max_connections_per_peer: 4096,
            idle_timeout_ms: Millis(Duration::from_secs(120)),
            request_timeout_ms: Millis(Duration::from_secs(10)),
            poll_spin_us: 0,
            rpc_threads: 0,
            summary_interval_ms: Millis(Duration::from_secs(10)),
            enable_ha: false,
            ha_backend: HaBackend::Etcd,
            ha_backend_connstring: String::new(),
            cluster_id: crate::ha::DEFAULT_CLUSTER_ID.into(),
            ha_lease_ttl_ms: Millis(Duration::from_secs(5)),
            auth_token_file: None,
            tls_cert_path: None,
            tls_key_path: None,
            kv_events_config: None,
            tenants_file: None,
            advertise_host: String::new(),
        }
    }
}

/// Flags of `rbgctl master`; each one also reads an environment variable.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, clap::Args, serde::Serialize)]
pub struct MasterArgs {
    /// TOML config file (see config/master.toml). Default: none (built-in defaults).
    #[arg(long, env = "RBGCTL_MASTER_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Address the RPC server binds to. Default `0.0.0.0`.
    #[arg(long, env = "RBGCTL_MASTER_RPC_ADDRESS")]
    pub rpc_address: Option<String>,
    /// RPC port. Default 50051.
    #[arg(long, env = "RBGCTL_MASTER_RPC_PORT")]
    pub rpc_port: Option<u16>,
    /// Serve Mooncake's HTTP metadata protocol (`/metadata?key=`). Default false.
    #[arg(long, env = "RBGCTL_MASTER_ENABLE_HTTP_METADATA_SERVER", num_args = 0..=1, default_missing_value = "true")]
    pub enable_http_metadata_server: Option<bool>,
    /// Default `0.0.0.0`.
    #[arg(long, env = "RBGCTL_MASTER_HTTP_METADATA_SERVER_HOST")]
    pub http_metadata_server_host: Option<String>,
    /// Default 8080.
    #[arg(long, env = "RBGCTL_MASTER_HTTP_METADATA_SERVER_PORT")]
    pub http_metadata_server_port: Option<u16>,
    /// Address of `/metrics`, `/health` and the admin API. Default `0.0.0.0`.
    #[arg(long, env = "RBGCTL_MASTER_METRICS_HOST")]
    pub metrics_host: Option<String>,
    /// Default 9003.
    #[arg(long, env = "RBGCTL_MASTER_METRICS_PORT")]
    pub metrics_port: Option<u16>,
    /// Client TTL (`10s`, or milliseconds). Default 10 s.
    #[arg(allow_hyphen_values = true, long, env = "RBGCTL_MASTER_CLIENT_TTL")]
    #[serde(rename = "client_ttl_ms")]
    pub client_ttl: Option<Millis>,
    /// How long a restarting persistent store's objects are kept (`300s`, or milliseconds). Default 300 s.
    #[arg(
        allow_hyphen_values = true,
        long,
        env = "RBGCTL_MASTER_STORE_GRACE_PERIOD"
    )]
    #[serde(rename = "store_grace_period_ms")]
    pub store_grace_period: Option<Millis>,
    /// How long a store may serve clients' cached locations after the master last reached it
    /// (`2s`, or milliseconds; 0 = off). Default 2 s.
    #[arg(
        allow_hyphen_values = true,
        long,
        env = "RBGCTL_MASTER_STORE_READ_LEASE"
    )]
    #[serde(rename = "store_read_lease_ms")]
    pub store_read_lease: Option<Millis>,
    /// Read lease of a get (`10s`, or milliseconds). Default 10 s.
    #[arg(
        allow_hyphen_values = true,
        long,
        env = "RBGCTL_MASTER_DEFAULT_KV_LEASE_TTL"
    )]
    #[serde(rename = "default_kv_lease_ttl_ms")]
    pub default_kv_lease_ttl: Option<Millis>,
    /// Soft pin duration when a put asks for one without a TTL. Default 30 min.
    #[arg(
        allow_hyphen_values = true,
        long,
        env = "RBGCTL_MASTER_DEFAULT_KV_SOFT_PIN_TTL"
    )]
    #[serde(rename = "default_kv_soft_pin_ttl_ms")]
    pub default_kv_soft_pin_ttl: Option<Millis>,
    /// Longest soft pin a put may ask for. Default 24 h.
    #[arg(
        allow_hyphen_values = true,
        long,
        env = "RBGCTL_MASTER_MAX_KV_SOFT_PIN_TTL"
    )]
    #[serde(rename = "max_kv_soft_pin_ttl_ms")]
    pub max_kv_soft_pin_ttl: Option<Millis>,
    /// Eviction starts when used/capacity passes this. Default 0.9.
    #[arg(long, env = "RBGCTL_MASTER_EVICTION_HIGH_WATERMARK_RATIO")]
    pub eviction_high_watermark_ratio: Option<f64>,
    /// Each eviction brings usage this far below the watermark. Default 0.05.
    #[arg(long, env = "RBGCTL_MASTER_EVICTION_RATIO")]
    pub eviction_ratio: Option<f64>,
    /// Disk tier eviction starts when a disk segment's used/capacity passes this. Default 0.95.
    #[arg(long, env = "RBGCTL_MASTER_DISK_EVICTION_HIGH_WATERMARK_RATIO")]
    pub disk_eviction_high_watermark_ratio: Option<f64>,
    /// Each disk tier eviction brings usage this far below its watermark. Default 0.05.
    #[arg(long, env = "RBGCTL_MASTER_DISK_EVICTION_RATIO")]
    pub disk_eviction_ratio: Option<f64>,
    /// Most bytes of memory → disk copies in flight per store (256MiB, bytes). Default 256 MiB.
    #[arg(
        allow_hyphen_values = true,
        long,
        env = "RBGCTL_MASTER_DISK_TIER_QUEUE_BYTES"
    )]
    pub disk_tier_queue_bytes: Option<ByteSize>,
    /// Pace of a store's hand-over to the others before it goes (bytes a second, 0: as fast
    /// as the stores go). Default 256 MiB.
    #[arg(
        allow_hyphen_values = true,
        long,
        env = "RBGCTL_MASTER_HAND_OVER_BYTES_PER_SEC"
    )]
    pub hand_over_bytes_per_sec: Option<ByteSize>,
    /// Copy disk-only objects back to memory when read (true/false). Default true.
    #[arg(long, env = "RBGCTL_MASTER_PROMOTION_ON_HIT")]
    pub promotion_on_hit: Option<bool>,
    /// Reads of a disk-only object before it is promoted (1 = first hit). Default 1.
    #[arg(long, env = "RBGCTL_MASTER_PROMOTION_ADMISSION_THRESHOLD")]
    pub promotion_admission_threshold: Option<u32>,
    /// An unfinished put older than this may be replaced by a new put of its key. Default 30 s.
    #[arg(
        allow_hyphen_values = true,
        long,
        env = "RBGCTL_MASTER_PUT_START_DISCARD_TIMEOUT"
    )]
    #[serde(rename = "put_start_discard_timeout_ms")]
    pub put_start_discard_timeout: Option<Millis>,
    /// An unfinished put older than this is reclaimed. Default 600 s.
    #[arg(
        allow_hyphen_values = true,
        long,
        env = "RBGCTL_MASTER_PUT_START_RELEASE_TIMEOUT"
    )]
    #[serde(rename = "put_start_release_timeout_ms")]
    pub put_start_release_timeout: Option<Millis>,
    /// How long a client may write into a put reservation (`500ms`, or milliseconds; 0 =
    /// no reservations, every put takes two master round trips). Default 500 ms.
    #[arg(
        allow_hyphen_values = true,
        long,
        env = "RBGCTL_MASTER_PUT_RESERVATION_TTL"
    )]
    #[serde(rename = "put_reservation_ttl_ms")]
    pub put_reservation_ttl: Option<Millis>,
    /// Most bytes of put reservations one client may hold (`64MiB`). Default 64 MiB.
    #[arg(
        allow_hyphen_values = true,
        long,
        env = "RBGCTL_MASTER_PUT_RESERVATION_MAX_BYTES"
    )]
    pub put_reservation_max_bytes: Option<ByteSize>,
    /// `random` (default) or `free_ratio_first`.
    #[arg(long, env = "RBGCTL_MASTER_ALLOCATION_STRATEGY")]
    #[serde(skip)]
    pub allocation_strategy: Option<String>,
    /// Most simultaneous RPC connections. Default 16384.
    #[arg(long, env = "RBGCTL_MASTER_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Most simultaneous connections from one IP address. Default 4096.
    #[arg(long, env = "RBGCTL_MASTER_MAX_CONNECTIONS_PER_PEER")]
    pub max_connections_per_peer: Option<usize>,
    /// Close connections idle this long (`120s`, or milliseconds). Default 120 s.
    #[arg(allow_hyphen_values = true, long, env = "RBGCTL_MASTER_IDLE_TIMEOUT")]
    #[serde(rename = "idle_timeout_ms")]
    pub idle_timeout: Option<Millis>,
    /// Longest wait for a request's bytes (`10s`, or milliseconds). Default 10 s.
    #[arg(
        allow_hyphen_values = true,
        long,
        env = "RBGCTL_MASTER_REQUEST_TIMEOUT"
    )]
    #[serde(rename = "request_timeout_ms")]
    pub request_timeout: Option<Millis>,
    /// Spin-poll window of the RPC server in microseconds: how long an event loop that just
    /// served something polls before it sleeps (0 = sleep at once). Default 0.
    #[arg(long, env = "RBGCTL_MASTER_POLL_SPIN_US")]
    pub poll_spin_us: Option<u64>,
    /// Event-loop threads of the RPC server (0: half the cores, at least 1, at most 16).
    /// Default 0.
    #[arg(long, env = "RBGCTL_MASTER_RPC_THREADS")]
    pub rpc_threads: Option<usize>,
    /// Take part in leader election with other masters (see docs/ha.md). Default false.
    #[arg(long, env = "RBGCTL_MASTER_ENABLE_HA", num_args = 0..=1, default_missing_value = "true")]
    pub enable_ha: Option<bool>,
    /// Election backend: `etcd` (default) or `k8s` (a coordination.k8s.io/v1 Lease).
    #[arg(long, env = "RBGCTL_MASTER_HA_BACKEND")]
    #[serde(skip)]
    pub ha_backend: Option<String>,
    /// etcd endpoints, `h1:2379;h2:2379` (same as --ha-backend-connstring with etcd).
    /// Default: none (required with --enable-ha on etcd).
    #[arg(long, env = "RBGCTL_MASTER_ETCD_ENDPOINTS")]
    #[serde(skip)]
    pub etcd_endpoints: Option<String>,
    /// etcd endpoints (`h1:2379;h2:2379`) or, for k8s, `namespace/lease-name`. Default: none.
    #[arg(long, env = "RBGCTL_MASTER_HA_BACKEND_CONNSTRING")]
    pub ha_backend_connstring: Option<String>,
    /// Masters with the same cluster id elect one leader. Default `mooncake_cluster`.
    #[arg(long, env = "RBGCTL_MASTER_CLUSTER_ID")]
    pub cluster_id: Option<String>,
    /// Leader lease TTL (`5s`; whole seconds, at least 1). Default 5 s.
    #[arg(allow_hyphen_values = true, long, env = "RBGCTL_MASTER_HA_LEASE_TTL")]
    #[serde(rename = "ha_lease_ttl_ms")]
    pub ha_lease_ttl: Option<Millis>,
    /// Host published for others to reach this master. Default: the RPC address, POD_IP or
    /// the host name's address.
    #[arg(long, env = "RBGCTL_MASTER_ADVERTISE_HOST")]
    pub advertise_host: Option<String>,
    /// A file holding the cluster secret (at least 16 bytes): connections must prove they
    /// hold it. Default: no authentication.
    #[arg(long, env = "RBGCTL_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<std::path::PathBuf>,
    /// Serve the metrics/admin port and the metadata server over HTTPS with this PEM
    /// certificate chain (needs --tls-key-path). Default: plain HTTP.
    #[arg(long, env = "RBGCTL_MASTER_TLS_CERT_PATH")]
    pub tls_cert_path: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert-path. Default: none.
    #[arg(long, env = "RBGCTL_MASTER_TLS_KEY_PATH")]
    pub tls_key_path: Option<std::path::PathBuf>,
    /// Publish the pool's pages as KV events, for routers (SGLang's JSON, e.g.
    /// '{"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}').
    /// Default: none.
    #[arg(long, env = "RBGCTL_MASTER_KV_EVENTS_CONFIG")]
    pub kv_events_config: Option<String>,
    /// The pool's tenants and their quotas, a TOML file of `[[tenant]] name = "team-a",
    /// quota = "64GiB"`, read again when it changes. Default: none (the default tenant alone,
    /// without a quota).
    #[arg(long, env = "RBGCTL_MASTER_TENANTS_FILE")]
    pub tenants_file: Option<std::path::PathBuf>,
}

impl MasterArgs {
    /// Layers file, then these values, over the defaults, and validates the result.
    pub fn resolve(&self) -> Result<MasterConfig, ConfigError> {
        let mut c: MasterConfig = layered(self.config.as_deref(), self)?;
        // Mooncake's spelling of the connection string, which wins as it always did.
        if let Some(e) = &self.etcd_endpoints {
            c.ha_backend_connstring = e.clone();
        }
        if let Some(s) = &self.ha_backend {
            c.ha_backend = s
                .parse()
                .map_err(|e: String| ConfigError::invalid("master.ha_backend", e))?;
        }
        if let Some(s) = &self.allocation_strategy {
            c.allocation_strategy = s
                .parse()
                .map_err(|e: String| ConfigError::invalid("master.allocation_strategy", e))?;
        }
        c.validate()?;
        Ok(c)
    }
}

impl MasterConfig {
    /// The store read lease in force: as configured, at most half of `client_ttl`.
    pub fn store_read_lease(&self) -> Duration {
        self.store_read_lease_ms.0.min(self.client_ttl_ms.0 / 2)
    }

    /// The RPC server's event-loop threads: `rpc_threads`, or half the cores (1 to 16).
    pub fn rpc_threads(&self) -> usize {
        match self.rpc_threads {
            0 => {
                let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
                (cores / 2).clamp(1, 16)
            }
            n => n,
        }
    }

    /// The RPC server's connection limits and waits.
    pub fn server_options(&self) -> crate::transfer::server::ServerOptions {
        crate::transfer::server::ServerOptions {
            max_connections: self.max_connections,
            max_connections_per_peer: self.max_connections_per_peer,
            idle_timeout: self.idle_timeout_ms.0,
            request_timeout: self.request_timeout_ms.0,
            spin: Duration::from_micros(self.poll_spin_us),
            role: "master",
            auth: None,
            // Bound clients need not heartbeat: a vanished one's connection ends by keepalive.
            keepalive: Some(self.client_ttl_ms.0),
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        check_ratio(
            "master.eviction_high_watermark_ratio",
            self.eviction_high_watermark_ratio,
            false,
        )?;
        check_ratio("master.eviction_ratio", self.eviction_ratio, true)?;
        check_ratio(
            "master.disk_eviction_high_watermark_ratio",
            self.disk_eviction_high_watermark_ratio,
            false,
        )?;
        check_ratio("master.disk_eviction_ratio", self.disk_eviction_ratio, true)?;
        if self.promotion_admission_threshold == 0 {
            return Err(ConfigError::invalid(
                "master.promotion_admission_threshold",
                "must be at least 1 (promotion on the first hit); turn promotion off with \
                 promotion_on_hit = false",
            ));
        }
        if self.client_ttl_ms.0 < Duration::from_millis(100) {
            return Err(ConfigError::invalid(
                "master.client_ttl_ms",
                format!("must be at least 100 ms, got {:?}", self.client_ttl_ms.0),
            ));
        }
        self.server_options().validate()?;
        if let Some(json) = &self.kv_events_config {
            crate::kv_events::KvEventsConfig::parse(json)
                .map_err(|e| ConfigError::invalid("master.kv_events_config", e))?;
        }
        check_pair(
            ("master.tls_cert_path", self.tls_cert_path.is_some()),
            ("master.tls_key_path", self.tls_key_path.is_some()),
        )?;
        if self.http_metadata_max_value_bytes.0 == 0
            || self.http_metadata_max_value_bytes.0 > self.http_metadata_max_bytes.0
        {
            return Err(ConfigError::invalid(
                "master.http_metadata_max_value_bytes",
                "must be at least 1 byte and at most http_metadata_max_bytes",
            ));
        }
        if self.put_start_release_timeout_ms.0 < self.put_start_discard_timeout_ms.0 {
            return Err(ConfigError::invalid(
                "master.put_start_release_timeout_ms",
                "must not be shorter than put_start_discard_timeout_ms",
            ));
        }
        if self.enable_ha {
            self.validate_ha()?;
        }
        for (field, host) in [
            ("master.rpc_address", &self.rpc_address),
            (
                "master.http_metadata_server_host",
                &self.http_metadata_server_host,
            ),
            ("master.metrics_host", &self.metrics_host),
        ] {
            if host.parse::<std::net::IpAddr>().is_err() {
                return Err(ConfigError::invalid(
                    field,
                    format!("expected an IP address to bind, got {host:?}"),
                ));
            }
        }
        Ok(())
    }
}

impl MasterConfig {
    fn validate_ha(&self) -> Result<(), ConfigError> {
        let ttl = self.ha_lease_ttl_ms.0;
        if ttl < Duration::from_secs(1) || ttl.subsec_nanos() != 0 {
            return Err(ConfigError::invalid(
                "master.ha_lease_ttl_ms",
                format!(
                    "must be whole seconds, at least 1 s (etcd leases count seconds), got {ttl:?}"
                ),
            ));
        }
        crate::ha::check_cluster_id(&self.cluster_id)
            .map_err(|e| ConfigError::invalid("master.cluster_id", e))?;
        let conn = self.ha_backend_connstring.trim();
        match self.ha_backend {
            HaBackend::Etcd => {
                crate::ha::etcd::parse_endpoints(conn).map_err(|e| {
                    ConfigError::invalid(
                        "master.ha_backend_connstring (--etcd-endpoints)",
                        e.to_string(),
                    )
                })?;
            }
            HaBackend::K8s => {
                crate::ha::MasterAddress::parse(&format!("k8s://{conn}")).map_err(|e| {
                    ConfigError::invalid(
                        "master.ha_backend_connstring",
                        format!("{e}; for k8s give namespace/lease-name"),
                    )
                })?;
            }
        }
        Ok(())
    }

    /// What the election backend is told about where to reach this master.
    pub fn advertised_host(&self) -> Result<String, ConfigError> {
        if !self.advertise_host.is_empty() {
            return Ok(self.advertise_host.clone());
        }
        match self.rpc_address.parse::<std::net::IpAddr>() {
            Ok(ip) if !ip.is_unspecified() => return Ok(self.rpc_address.clone()),
            _ => {}
        }
        if let Some(ip) = crate::config::env_var("POD_IP") {
            return Ok(ip);
        }
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default();
        use std::net::ToSocketAddrs;
        (host.as_str(), 0)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.find(|a| !a.ip().is_loopback()))
            .map(|a| a.ip().to_string())
            .ok_or_else(|| {
                ConfigError::invalid(
                    "master.advertise_host",
                    "the RPC server listens on every address and this host's name does not resolve \
                     to one others can reach: set --advertise-host (or POD_IP)",
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_toml;

    #[test]
    fn ha_settings_are_checked_and_name_what_to_fix() {
        let ok = MasterArgs {
            enable_ha: Some(true),
            etcd_endpoints: Some("127.0.0.1:2379;127.0.0.1:2380".into()),
            cluster_id: Some("prod".into()),
            ha_lease_ttl: Some(Millis(Duration::from_secs(2))),
            ..Default::default()
        };
        let c = ok.resolve().unwrap();
        assert_eq!(c.ha_backend, HaBackend::Etcd);
        assert_eq!(c.ha_backend_connstring, "127.0.0.1:2379;127.0.0.1:2380");
        for (args, field) in [
            (
                MasterArgs {
                    etcd_endpoints: Some("".into()),
                    ..ok.clone()
                },
                "etcd-endpoints",
            ),
            (
                MasterArgs {
                    etcd_endpoints: Some("h1".into()),
                    ..ok.clone()
                },
                "no port",
            ),
            (
                MasterArgs {
                    cluster_id: Some("a/b".into()),
                    ..ok.clone()
                },
                "master.cluster_id",
            ),
            (
                MasterArgs {
                    ha_lease_ttl: Some(Millis(Duration::from_millis(1500))),
                    ..ok.clone()
                },
                "whole seconds",
            ),
            (
                MasterArgs {
                    ha_backend: Some("zk".into()),
                    ..ok.clone()
                },
                "etcd or k8s",
            ),
            (
                MasterArgs {
                    ha_backend: Some("k8s".into()),
                    ha_backend_connstring: Some("pool".into()),
                    ..ok.clone()
                },
                "namespace/lease-name",
            ),
        ] {
            let e = args.resolve().unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
        let c = MasterArgs {
            rpc_address: Some("10.1.2.3".into()),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(c.advertised_host().unwrap(), "10.1.2.3");
    }

    #[test]
    fn defaults_match_mooncake() {
        let c = MasterConfig::default();
        c.validate().unwrap();
        assert_eq!(c.rpc_port, 50051);
        assert_eq!(c.metrics_port, 9003);
        assert_eq!(c.http_metadata_server_port, 8080);
        assert_eq!(c.client_ttl_ms.0, Duration::from_secs(10));
        assert_eq!(c.default_kv_lease_ttl_ms.0, Duration::from_secs(10));
        assert_eq!(c.eviction_high_watermark_ratio, 0.9);
        assert_eq!(c.eviction_ratio, 0.05);
    }

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.toml");
        std::fs::write(
            &path,
            "rpc_port = 6000\nmetrics_port = 7000\nclient_ttl_ms = \"3s\"\n",
        )
        .unwrap();
        let args = MasterArgs {
            config: Some(path),
            rpc_port: Some(6001),
            ..Default::default()
        };
        let c = args.resolve().unwrap();
        assert_eq!(c.rpc_port, 6001, "flag wins");
        assert_eq!(c.metrics_port, 7000, "file beats default");
        assert_eq!(c.client_ttl_ms.0, Duration::from_secs(3));
    }

    #[test]
    fn errors_name_the_field() {
        let args = MasterArgs {
            eviction_high_watermark_ratio: Some(1.5),
            ..Default::default()
        };
        let e = args.resolve().unwrap_err().to_string();
        assert!(e.contains("master.eviction_high_watermark_ratio"), "{e}");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.toml");
        std::fs::write(&path, "rpc_prot = 1\n").unwrap();
        let e = MasterArgs {
            config: Some(path.clone()),
            ..Default::default()
        }
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(e.contains("rpc_prot"), "{e}");
        std::fs::write(&path, "rpc_port = \"high\"\n").unwrap();
        let e = MasterArgs {
            config: Some(path),
            ..Default::default()
        }
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 1"), "{e}");
    }

    #[test]
    fn the_example_file_parses_and_holds_the_defaults() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/master.toml");
        let c: MasterConfig = load_toml(&path).unwrap();
        c.validate().unwrap();
        let d = MasterConfig::default();
        assert_eq!(
            (
                c.max_connections_per_peer,
                c.idle_timeout_ms.0,
                c.request_timeout_ms.0
            ),
            (
                d.max_connections_per_peer,
                d.idle_timeout_ms.0,
                d.request_timeout_ms.0
            )
        );
    }

    /// Every flag lands in the setting of its name (a renamed one under the config's name):
    /// the shared layering rule refuses a flag that names none.
    #[test]
    fn every_flag_names_a_setting() {
        let ms = |n| Some(Millis(Duration::from_millis(n)));
        let args = MasterArgs {
            config: None,
            rpc_address: Some("127.0.0.2".into()),
            rpc_port: Some(1),
            enable_http_metadata_server: Some(true),
            http_metadata_server_host: Some("127.0.0.3".into()),
            http_metadata_server_port: Some(2),
            metrics_host: Some("127.0.0.4".into()),
            metrics_port: Some(3),
            client_ttl: ms(20_000),
            store_grace_period: ms(4),
            store_read_lease: ms(5),
            default_kv_lease_ttl: ms(6),
            default_kv_soft_pin_ttl: ms(7),
            max_kv_soft_pin_ttl: ms(8),
            eviction_high_watermark_ratio: Some(0.9),
            eviction_ratio: Some(0.1),
            disk_eviction_high_watermark_ratio: Some(0.8),
            disk_eviction_ratio: Some(0.2),
            disk_tier_queue_bytes: Some(ByteSize(9 << 20)),
            hand_over_bytes_per_sec: Some(ByteSize(1 << 20)),
            promotion_on_hit: Some(false),
            promotion_admission_threshold: Some(10),
            put_start_discard_timeout: ms(11),
            put_start_release_timeout: ms(12),
            put_reservation_ttl: ms(13),
            put_reservation_max_bytes: Some(ByteSize(14 << 20)),
            allocation_strategy: Some("random".into()),
            max_connections: Some(15),
            max_connections_per_peer: Some(16),
            idle_timeout: ms(1700),
            request_timeout: ms(1800),
            poll_spin_us: Some(19),
            rpc_threads: Some(3),
            enable_ha: Some(false),
            ha_backend: Some("etcd".into()),
            etcd_endpoints: Some("127.0.0.1:2379".into()),
            ha_backend_connstring: Some("ignored:1".into()),
            cluster_id: Some("c".into()),
            ha_lease_ttl: ms(2100),
            advertise_host: Some("h".into()),
            auth_token_file: Some("/a".into()),
            tls_cert_path: Some("/c".into()),
            tls_key_path: Some("/k".into()),
            kv_events_config: Some(r#"{"endpoint":"tcp://*:0"}"#.into()),
            tenants_file: Some("/etc/rbgctl/tenants.toml".into()),
        };
        let c = args.resolve().unwrap();
        assert_eq!(c.client_ttl_ms, Millis(Duration::from_secs(20)));
        assert_eq!(c.ha_lease_ttl_ms, Millis(Duration::from_millis(2100)));
        assert_eq!(c.put_reservation_max_bytes, ByteSize(14 << 20));
        assert_eq!(
            c.ha_backend_connstring, "127.0.0.1:2379",
            "etcd_endpoints wins"
        );
        assert_eq!(c.poll_spin_us, 19);
        assert_eq!((c.rpc_threads, c.rpc_threads()), (3, 3));
        assert_eq!(c.advertise_host, "h");
        assert_eq!(c.tls_key_path.as_deref(), Some(std::path::Path::new("/k")));
        assert!(c.kv_events_config.is_some());
        assert!(c.tenants_file.is_some());
        assert!(!c.promotion_on_hit);
    }
}
