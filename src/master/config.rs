//! `rbgctl master` configuration. Precedence: flag > environment (`RBGCTL_MASTER_*`) > TOML file
//! (`--config`) > the defaults documented on each field (Mooncake's defaults where it has one).
//! Example: `config/master.toml`.

use crate::config::{check_pair, check_ratio, layered, ByteSize, ConfigError, Millis};
use crate::master::state::placement::Strategy;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

crate::config::settings::settings! {
    /// The master's settings, from its flags, environment and TOML file.
    #[derive(Clone, Debug, Deserialize, Serialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct MasterConfig;

    /// Flags of `rbgctl master`; each one also reads an environment variable.
    #[serde_with::skip_serializing_none]
    #[derive(Clone, Debug, Default, clap::Args, serde::Serialize)]
    pub struct MasterArgs {
        /// TOML config file (see config/master.toml). Default: none (built-in defaults).
        #[arg(long, env = "RBGCTL_MASTER_CONFIG")]
        #[serde(skip)]
        pub config: Option<PathBuf>,
        /// etcd endpoints, `h1:2379;h2:2379` (Mooncake's spelling of --ha-backend-connstring
        /// with etcd; wins over it). Default: none (required with --enable-ha on etcd).
        #[arg(long, env = "RBGCTL_MASTER_ETCD_ENDPOINTS")]
        #[serde(skip)]
        pub etcd_endpoints: Option<String>,
    }

    settings {
        /// Address the RPC server binds to.
        #[arg(long, env = "RBGCTL_MASTER_RPC_ADDRESS")]
        rpc_address: String = "0.0.0.0".into();
        /// RPC port.
        #[arg(long, env = "RBGCTL_MASTER_RPC_PORT")]
        rpc_port: u16 = 50051;
        /// Serve Mooncake's HTTP metadata protocol (`/metadata?key=`).
        #[arg(long, env = "RBGCTL_MASTER_ENABLE_HTTP_METADATA_SERVER")]
        enable_http_metadata_server: bool = false;
        /// Address the metadata server binds to.
        #[arg(long, env = "RBGCTL_MASTER_HTTP_METADATA_SERVER_HOST")]
        http_metadata_server_host: String = "0.0.0.0".into();
        /// Port of the metadata server.
        #[arg(long, env = "RBGCTL_MASTER_HTTP_METADATA_SERVER_PORT")]
        http_metadata_server_port: u16 = 8080;
        /// Most bytes (keys and values) the metadata server holds; past it a PUT gets 507.
        http_metadata_max_bytes: ByteSize = ByteSize(64 << 20);
        /// Most keys the metadata server holds; past it a PUT of a new key gets 507.
        http_metadata_max_keys: usize = 65_536;
        /// Largest value a PUT may carry (413 above, from the request's headers); Mooncake's
        /// descriptors are a few KiB.
        http_metadata_max_value_bytes: ByteSize = ByteSize(1 << 20);
        /// Address of `/metrics`, `/health` and the admin API.
        #[arg(long, env = "RBGCTL_MASTER_METRICS_HOST")]
        metrics_host: String = "0.0.0.0".into();
        /// Port of `/metrics`, `/health` and the admin API.
        #[arg(long, env = "RBGCTL_MASTER_METRICS_PORT")]
        metrics_port: u16 = 9003;
        /// A client (store) whose heartbeats stop for this long is dropped with its segments
        /// (`10s`, or milliseconds).
        #[arg(long = "client-ttl", env = "RBGCTL_MASTER_CLIENT_TTL")]
        client_ttl_ms: Millis = Millis(Duration::from_secs(10));
        /// How long the objects of a persistent store that went away (stopped with SIGTERM, or
        /// stopped heartbeating for `client_ttl`) are kept, unreadable, waiting for it to come
        /// back with the same segment; then they are dropped. 0 drops them at once.
        #[arg(long = "store-grace-period", env = "RBGCTL_MASTER_STORE_GRACE_PERIOD")]
        store_grace_period_ms: Millis = Millis(Duration::from_secs(300));
        /// How long a store may answer reads of locations clients cached (one round trip to the
        /// store instead of one to the master first) after the master last told it what was
        /// removed or replaced. A store the master cannot reach stops within this; a remove or
        /// replace whose news cannot reach a store waits this long before it is acknowledged.
        /// Used up to half of `client_ttl` (a store the master drops must have stopped); 0 turns
        /// cached locations off.
        #[arg(long = "store-read-lease", env = "RBGCTL_MASTER_STORE_READ_LEASE")]
        store_read_lease_ms: Millis = Millis(Duration::from_secs(2));
        /// Read lease granted by every get.
        #[arg(long = "default-kv-lease-ttl", env = "RBGCTL_MASTER_DEFAULT_KV_LEASE_TTL")]
        default_kv_lease_ttl_ms: Millis = Millis(Duration::from_secs(10));
        /// Soft pin duration when a put asks for one without a TTL.
        #[arg(long = "default-kv-soft-pin-ttl", env = "RBGCTL_MASTER_DEFAULT_KV_SOFT_PIN_TTL")]
        default_kv_soft_pin_ttl_ms: Millis = Millis(Duration::from_secs(30 * 60));
        /// Longest soft pin a put may ask for.
        #[arg(long = "max-kv-soft-pin-ttl", env = "RBGCTL_MASTER_MAX_KV_SOFT_PIN_TTL")]
        max_kv_soft_pin_ttl_ms: Millis = Millis(Duration::from_secs(24 * 3600));
        /// Eviction starts when used/capacity passes this.
        #[arg(long, env = "RBGCTL_MASTER_EVICTION_HIGH_WATERMARK_RATIO")]
        eviction_high_watermark_ratio: f64 = 0.9;
        /// Each eviction brings usage this far below the watermark.
        #[arg(long, env = "RBGCTL_MASTER_EVICTION_RATIO")]
        eviction_ratio: f64 = 0.05;
        /// Disk tier eviction (objects dropped from disk, least recently used first) starts when
        /// a disk segment's used/capacity passes this.
        #[arg(long, env = "RBGCTL_MASTER_DISK_EVICTION_HIGH_WATERMARK_RATIO")]
        disk_eviction_high_watermark_ratio: f64 = 0.95;
        /// Each disk tier eviction brings the segment's usage this far below its watermark.
        #[arg(long, env = "RBGCTL_MASTER_DISK_EVICTION_RATIO")]
        disk_eviction_ratio: f64 = 0.05;
        /// Most bytes of demotions (memory → disk copies) in flight per store; past it,
        /// eviction waits for them, and drops what memory must give up at once.
        #[arg(long, env = "RBGCTL_MASTER_DISK_TIER_QUEUE_BYTES")]
        disk_tier_queue_bytes: ByteSize = ByteSize(256 << 20);
        /// Pace of a store's hand-over to the others before it goes (bytes a second copied;
        /// 0: as fast as the stores go).
        #[arg(long, env = "RBGCTL_MASTER_HAND_OVER_BYTES_PER_SEC")]
        hand_over_bytes_per_sec: ByteSize = ByteSize(256 << 20);
        /// Copy an object that lives only on disk back to memory when it is read (Mooncake's
        /// `promotion_on_hit`).
        #[arg(long, env = "RBGCTL_MASTER_PROMOTION_ON_HIT")]
        promotion_on_hit: bool = true;
        /// Reads of a disk-only object before it is promoted: 1 promotes on the first hit, 2 on
        /// the second (Mooncake's `promotion_admission_threshold`, whose default is 2).
        #[arg(long, env = "RBGCTL_MASTER_PROMOTION_ADMISSION_THRESHOLD")]
        promotion_admission_threshold: u32 = 1;
        /// An unfinished put older than this may be replaced by a new put of its key.
        #[arg(long = "put-start-discard-timeout", env = "RBGCTL_MASTER_PUT_START_DISCARD_TIMEOUT")]
        put_start_discard_timeout_ms: Millis = Millis(Duration::from_secs(30));
        /// An unfinished put older than this is reclaimed.
        #[arg(long = "put-start-release-timeout", env = "RBGCTL_MASTER_PUT_START_RELEASE_TIMEOUT")]
        put_start_release_timeout_ms: Millis = Millis(Duration::from_secs(600));
        /// How long a client may start writing into a put reservation (space allocated for its
        /// next put of a size, so that put needs only its commit). A restarted master allocates
        /// nothing for this long, so no reservation of its predecessor can be written over a
        /// new object. 0 turns reservations off (every put takes two master round trips).
        #[arg(long = "put-reservation-ttl", env = "RBGCTL_MASTER_PUT_RESERVATION_TTL")]
        put_reservation_ttl_ms: Millis = Millis(Duration::from_millis(500));
        /// Most bytes of put reservations one client may hold.
        #[arg(long, env = "RBGCTL_MASTER_PUT_RESERVATION_MAX_BYTES")]
        put_reservation_max_bytes: ByteSize = ByteSize(64 << 20);
        /// How the master orders candidate segments: `random` or `free_ratio_first`.
        #[arg(long, env = "RBGCTL_MASTER_ALLOCATION_STRATEGY")]
        allocation_strategy: Strategy = Strategy::Random;
        /// Most simultaneous RPC connections.
        #[arg(long, env = "RBGCTL_MASTER_MAX_CONNECTIONS")]
        max_connections: usize = 16384;
        /// Most simultaneous connections from one IP address.
        #[arg(long, env = "RBGCTL_MASTER_MAX_CONNECTIONS_PER_PEER")]
        max_connections_per_peer: usize = 4096;
        /// A connection with no request for this long is closed (clients reconnect).
        #[arg(long = "idle-timeout", env = "RBGCTL_MASTER_IDLE_TIMEOUT")]
        idle_timeout_ms: Millis = Millis(Duration::from_secs(120));
        /// A new connection's first request must begin within this, and a request whose bytes
        /// stop coming for this long ends its connection.
        #[arg(long = "request-timeout", env = "RBGCTL_MASTER_REQUEST_TIMEOUT")]
        request_timeout_ms: Millis = Millis(Duration::from_secs(10));
        /// Spin-poll window of the RPC server in microseconds: how long an event loop that just
        /// served something polls before it sleeps (0 = sleep at once).
        #[arg(long, env = "RBGCTL_MASTER_POLL_SPIN_US")]
        poll_spin_us: u64 = 0;
        /// Event-loop threads of the RPC server (0: half the cores, at least 1, at most 16).
        #[arg(long, env = "RBGCTL_MASTER_RPC_THREADS")]
        rpc_threads: usize = 0;
        /// Interval of the summary log line.
        summary_interval_ms: Millis = Millis(Duration::from_secs(10));
        /// Run as one of several masters that elect a leader (`docs/ha.md`); the others stand
        /// by.
        #[arg(long, env = "RBGCTL_MASTER_ENABLE_HA")]
        enable_ha: bool = false;
        /// Where the election happens: `etcd` or `k8s` (a coordination.k8s.io/v1 Lease).
        #[arg(long, env = "RBGCTL_MASTER_HA_BACKEND")]
        ha_backend: HaBackend = HaBackend::Etcd;
        /// For `etcd`: the endpoints, `h1:2379;h2:2379`. For `k8s`: `namespace/lease-name`.
        /// Mooncake's `--etcd_endpoints` and `--ha_backend_connstring` set it. Default: none.
        #[arg(long, env = "RBGCTL_MASTER_HA_BACKEND_CONNSTRING")]
        ha_backend_connstring: String = String::new();
        /// The group's name: masters with the same id elect one leader; clients give it after
        /// the endpoints (`etcd://h1:2379/ID`); Mooncake's default.
        #[arg(long, env = "RBGCTL_MASTER_CLUSTER_ID")]
        cluster_id: String = crate::ha::DEFAULT_CLUSTER_ID.into();
        /// How long the leader's lease lasts without renewal: the longest a dead leader blocks
        /// a failover. Whole seconds, at least 1.
        #[arg(long = "ha-lease-ttl", env = "RBGCTL_MASTER_HA_LEASE_TTL")]
        ha_lease_ttl_ms: Millis = Millis(Duration::from_secs(5));
        /// A file holding the cluster secret (at least 16 bytes): RPC connections must prove
        /// they hold it, and writes to the metadata server carry it (`docs/security.md`).
        /// Default: none, no authentication.
        #[arg(long, env = "RBGCTL_AUTH_TOKEN_FILE")]
        auth_token_file: Option<PathBuf> = None;
        /// Serve the metrics and admin port and the metadata server over HTTPS with this PEM
        /// certificate chain, leaf first (with `tls_key_path`). Default: none (plain HTTP).
        #[arg(long, env = "RBGCTL_MASTER_TLS_CERT_PATH")]
        tls_cert_path: Option<PathBuf> = None;
        /// The PEM private key of `tls_cert_path`. Default: none.
        #[arg(long, env = "RBGCTL_MASTER_TLS_KEY_PATH")]
        tls_key_path: Option<PathBuf> = None;
        /// Publish the pool's pages as KV events (medium `EXTERNAL` in memory, `DISK` on the
        /// disk tier), for routers, in SGLang's `--kv-events-config` JSON
        /// (`{"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}`).
        /// Default: none.
        #[arg(long, env = "RBGCTL_MASTER_KV_EVENTS_CONFIG")]
        kv_events_config: Option<String> = None;
        /// The pool's tenants and their quotas in bytes, a TOML file of `[[tenant]] name =
        /// "team-a", quota = "64GiB"`, read again when it changes (`docs/kv-pool.md`, Tenants).
        /// Default: none (the default tenant alone, without a quota).
        #[arg(long, env = "RBGCTL_MASTER_TENANTS_FILE")]
        tenants_file: Option<PathBuf> = None;
        /// The host other processes reach this master at, published to the election backend.
        /// Default: `rpc_address` when it is a specific address, else `POD_IP`, else the
        /// address this host's name resolves to.
        #[arg(long, env = "RBGCTL_MASTER_ADVERTISE_HOST")]
        advertise_host: String = String::new();
    }
}

/// Where masters elect their leader.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HaBackend {
    #[default]
    Etcd,
    K8s,
}

crate::config::settings::named_setting!(HaBackend, Strategy);

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

impl MasterArgs {
    /// Layers file, then these values, over the defaults, and validates the result.
    pub fn resolve(&self) -> Result<MasterConfig, ConfigError> {
        let mut c: MasterConfig = layered(self.config.as_deref(), self)?;
        // Mooncake's spelling of the connection string, which wins as it always did.
        if let Some(e) = &self.etcd_endpoints {
            c.ha_backend_connstring = e.clone();
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

    /// Refuses settings that cannot run together, naming the setting to fix.
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
    use crate::testkit::scratch::ScratchFile;

    #[test]
    fn ha_settings_are_checked_and_name_what_to_fix() {
        let ok = MasterArgs {
            enable_ha: Some(true),
            etcd_endpoints: Some("127.0.0.1:2379;127.0.0.1:2380".into()),
            cluster_id: Some("prod".into()),
            ha_lease_ttl_ms: Some(Millis(Duration::from_secs(2))),
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
                    ha_lease_ttl_ms: Some(Millis(Duration::from_millis(1500))),
                    ..ok.clone()
                },
                "whole seconds",
            ),
            (
                MasterArgs {
                    ha_backend: Some(HaBackend::K8s),
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
    fn a_bad_choice_is_refused_by_its_flag() {
        use clap::{Args, FromArgMatches};
        let cmd = MasterArgs::augment_args(clap::Command::new("master").no_binary_name(true));
        for (argv, said) in [
            (["--ha-backend", "zk"], "expected etcd or k8s"),
            (
                ["--allocation-strategy", "first"],
                "random, free_ratio_first",
            ),
            (["--client-ttl", "-5s"], "cannot be negative"),
        ] {
            let e = cmd
                .clone()
                .try_get_matches_from(argv)
                .unwrap_err()
                .to_string();
            assert!(e.contains(argv[0]) && e.contains(said), "{e}");
        }
        let m = cmd
            .try_get_matches_from(["--enable-ha", "--etcd-endpoints", "h:1"])
            .unwrap();
        let args = MasterArgs::from_arg_matches(&m).unwrap();
        assert_eq!(args.enable_ha, Some(true), "a switch given alone is on");
    }

    #[test]
    fn every_stated_default_is_the_real_one() {
        let checked = crate::config::settings::check_stated_defaults(MasterArgs::resolve);
        assert!(checked >= 35, "{checked}");
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
        let file = ScratchFile::new(
            "m.toml",
            "rpc_port = 6000\nmetrics_port = 7000\nclient_ttl_ms = \"3s\"\n",
        );
        let args = MasterArgs {
            config: Some(file.path().into()),
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

        let file = ScratchFile::new("m.toml", "rpc_prot = 1\n");
        let e = MasterArgs {
            config: Some(file.path().into()),
            ..Default::default()
        }
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(e.contains("rpc_prot"), "{e}");
        file.rewrite("rpc_port = \"high\"\n");
        let e = MasterArgs {
            config: Some(file.path().into()),
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
            client_ttl_ms: ms(20_000),
            store_grace_period_ms: ms(4),
            store_read_lease_ms: ms(5),
            default_kv_lease_ttl_ms: ms(6),
            default_kv_soft_pin_ttl_ms: ms(7),
            max_kv_soft_pin_ttl_ms: ms(8),
            eviction_high_watermark_ratio: Some(0.9),
            eviction_ratio: Some(0.1),
            disk_eviction_high_watermark_ratio: Some(0.8),
            disk_eviction_ratio: Some(0.2),
            disk_tier_queue_bytes: Some(ByteSize(9 << 20)),
            hand_over_bytes_per_sec: Some(ByteSize(1 << 20)),
            promotion_on_hit: Some(false),
            promotion_admission_threshold: Some(10),
            put_start_discard_timeout_ms: ms(11),
            put_start_release_timeout_ms: ms(12),
            put_reservation_ttl_ms: ms(13),
            put_reservation_max_bytes: Some(ByteSize(14 << 20)),
            allocation_strategy: Some(Strategy::Random),
            max_connections: Some(15),
            max_connections_per_peer: Some(16),
            idle_timeout_ms: ms(1700),
            request_timeout_ms: ms(1800),
            poll_spin_us: Some(19),
            rpc_threads: Some(3),
            enable_ha: Some(false),
            ha_backend: Some(HaBackend::Etcd),
            etcd_endpoints: Some("127.0.0.1:2379".into()),
            ha_backend_connstring: Some("ignored:1".into()),
            cluster_id: Some("c".into()),
            ha_lease_ttl_ms: ms(2100),
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
