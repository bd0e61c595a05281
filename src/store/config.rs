//! `rbgctl store` configuration. Precedence: flag or `RBGCTL_STORE_*` variable > `MOONCAKE_*`
//! variables (or `MOONCAKE_CONFIG_PATH`) > TOML file (`--config`) > the defaults documented on
//! each field. Example: `config/store.toml`.

use crate::config::mooncake::MooncakeEnv;
use crate::config::{check_pair, layered_over, table_of, ByteSize, ConfigError, Millis};
use crate::transfer::Transport;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

crate::config::settings::settings! {
    /// The store's settings, from its flags, environment and TOML file.
    #[derive(Clone, Debug, Deserialize, Serialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct StoreConfig;

    /// The store's flags, each also an environment variable.
    #[serde_with::skip_serializing_none]
    #[derive(Clone, Debug, Default, clap::Args, Serialize)]
    pub struct StoreArgs {
        /// TOML config file (see config/store.toml). Default: none (built-in defaults).
        #[arg(long, env = "RBGCTL_STORE_CONFIG")]
        #[serde(skip)]
        pub config: Option<PathBuf>,
    }

    settings {
        /// The master's RPC address (`host:port`), or elected masters'
        /// `etcd://h1:2379;h2:2379/ID` or `k8s://namespace/lease`.
        #[arg(long, env = "RBGCTL_STORE_MASTER")]
        master: String = "127.0.0.1:50051".into();
        /// Address the data server binds to.
        #[arg(long, env = "RBGCTL_STORE_BIND_ADDRESS")]
        bind_address: String = "0.0.0.0".into();
        /// Host name or IP that clients use to reach this store (Mooncake's `local_hostname`).
        /// Default: `$POD_IP` when set, else the address of this host's interface that reaches
        /// the master (`127.0.0.1` for a master on loopback).
        #[arg(long, env = "RBGCTL_STORE_LOCAL_HOSTNAME")]
        local_hostname: String = String::new();
        /// Data port; 0 picks a free one.
        #[arg(long, env = "RBGCTL_STORE_PORT")]
        port: u16 = 0;
        /// Segment name. Default: `<local_hostname>:<port>`.
        #[arg(long, env = "RBGCTL_STORE_NAME")]
        name: Option<String> = None;
        /// Memory contributed to the pool (`4GiB`, `512mb`, bytes); 0 = a pure client that
        /// serves nothing.
        #[arg(long, env = "RBGCTL_STORE_SEGMENT_SIZE")]
        segment_size: ByteSize = ByteSize(1 << 30);
        /// Mooncake's transfer staging buffer. rbgctl moves bytes straight from the caller's
        /// memory and needs none; the value is accepted and reported only.
        #[arg(long, env = "RBGCTL_STORE_LOCAL_BUFFER_SIZE")]
        local_buffer_size: ByteSize = ByteSize(0);
        /// `tcp` or `rdma`: with `rdma`, the segment is also registered on the RDMA devices in
        /// `device` and clients READ and WRITE it one-sidedly (TCP is still served). A build
        /// without the `rdma` feature refuses it at start, naming this field.
        #[arg(long, env = "RBGCTL_STORE_PROTOCOL")]
        protocol: Transport = Transport::Tcp;
        /// RDMA device names (Mooncake's `MOONCAKE_DEVICE`): `rxe0`, or `mlx5_0,mlx5_1` for
        /// several NICs, used in turn by clients' queue pairs. The GID index is found (RoCE
        /// v2, IPv4) unless `MC_GID_INDEX` names one. Default: none.
        #[arg(long, env = "RBGCTL_STORE_DEVICE")]
        device: String = String::new();
        /// `http://host:port/metadata` to publish this segment's Mooncake descriptor to, or
        /// `P2PHANDSHAKE` for none.
        #[arg(long, env = "RBGCTL_STORE_METADATA_SERVER")]
        metadata_server: String = "P2PHANDSHAKE".into();
        /// Serve Mooncake's Transfer Engine (its TCP transport) and P2P handshake into the
        /// memory segment, so that Mooncake's own clients (its wheel, SGLang's `mooncake`
        /// backend) put and get here. Default: on without `auth_token_file`, off with it
        /// (Mooncake's transport has no authentication; docs/security.md).
        #[arg(long, env = "RBGCTL_STORE_MOONCAKE_TRANSFER")]
        mooncake_transfer: Option<bool> = None;
        /// Hash the values Mooncake's clients write one-sided (RDMA) after each put is
        /// answered, at the lowest CPU priority, and give the master their CRC-32C, so that
        /// rbgctl's readers check those values as they check their own. Off, such values stay
        /// unhashed, as in Mooncake (readers check their version only), and the store spends no
        /// CPU on a transfer (a restart, a report to a new master and a move to the disk tier
        /// hash what they keep).
        #[arg(long, env = "RBGCTL_STORE_HASH_MOONCAKE_WRITES")]
        hash_mooncake_writes: bool = false;
        /// Port of Mooncake's Transfer Engine transport; 0 picks a free one in Mooncake's
        /// range 15000-16999.
        #[arg(long, env = "RBGCTL_STORE_TE_PORT")]
        te_port: u16 = 0;
        /// Port of Mooncake's P2P handshake, which also names the segment for Mooncake's
        /// clients (`<local_hostname>:<port>`); 0 picks a free one in 15000-16999.
        #[arg(long, env = "RBGCTL_STORE_TE_HANDSHAKE_PORT")]
        te_handshake_port: u16 = 0;
        /// Where the segment's backing file and durable index live: `/dev/shm` (or a pod's
        /// memory-backed `emptyDir`) survives process restarts, a local disk or NVMe path
        /// survives reboots too.
        #[arg(long, env = "RBGCTL_STORE_SHM_DIR")]
        shm_dir: PathBuf = PathBuf::from("/dev/shm/rbgctl");
        /// A group (name or number) whose members may map the segment from same-host clients
        /// running as another user. Default: none, the store's files are its user's alone
        /// (the directory `0700`, the files `0600`).
        #[arg(long, env = "RBGCTL_STORE_SHM_GROUP")]
        shm_group: Option<String> = None;
        /// Keep objects across restarts: the segment file and an index of its objects stay in
        /// `shm_dir`, and a store started again with the same name and directory serves them
        /// again. Needs a stable name (`name` set, or a fixed `port`); with neither, the store
        /// runs non-persistent.
        #[arg(long, env = "RBGCTL_STORE_PERSISTENT")]
        persistent: bool = true;
        /// Seconds a stop may spend handing the segment's objects over to the other stores
        /// before it unmounts (the master copies each to another store, paced by its
        /// `hand_over_bytes_per_sec`); for a store that will not come back with them (a pod
        /// scaled away or recreated elsewhere). 0: no hand-over.
        #[arg(long, env = "RBGCTL_STORE_HAND_OVER_SECS")]
        hand_over_secs: u64 = 0;
        /// Fault the segment's pages in behind the start (`MADV_POPULATE_WRITE`, which changes
        /// no byte), so that writes do not pay the kernel's first-touch fault of each page.
        /// `false` leaves each page to fault in on its first write: a store whose segment stays
        /// mostly empty for long, or a benchmark of fresh memory.
        #[arg(long, env = "RBGCTL_STORE_PREFAULT")]
        prefault: bool = true;
        /// Address of `/metrics` and `/health`.
        #[arg(long, env = "RBGCTL_STORE_METRICS_HOST")]
        metrics_host: String = "0.0.0.0".into();
        /// Port of `/metrics` and `/health`; 0 picks a free one.
        #[arg(long, env = "RBGCTL_STORE_METRICS_PORT")]
        metrics_port: u16 = 9004;
        /// Heartbeat period.
        #[arg(long = "heartbeat-interval", env = "RBGCTL_STORE_HEARTBEAT_INTERVAL")]
        heartbeat_interval_ms: Millis = Millis(Duration::from_secs(1));
        /// How long a store whose name another running store holds (the master refuses the
        /// mount) waits for that one to go before it exits with an error. Covers a pod
        /// rescheduled before the master noticed its predecessor died.
        #[arg(long = "name-conflict-wait", env = "RBGCTL_STORE_NAME_CONFLICT_WAIT")]
        name_conflict_wait_ms: Millis = Millis(Duration::from_secs(30));
        /// Most simultaneous data connections.
        #[arg(long, env = "RBGCTL_STORE_MAX_CONNECTIONS")]
        max_connections: usize = 4096;
        /// Most simultaneous connections from one IP address.
        #[arg(long, env = "RBGCTL_STORE_MAX_CONNECTIONS_PER_PEER")]
        max_connections_per_peer: usize = 1024;
        /// A connection with no request for this long is closed (clients reconnect).
        #[arg(long = "idle-timeout", env = "RBGCTL_STORE_IDLE_TIMEOUT")]
        idle_timeout_ms: Millis = Millis(Duration::from_secs(120));
        /// A new connection's first request must begin within this, and a request whose bytes
        /// stop coming for this long ends its connection.
        #[arg(long = "request-timeout", env = "RBGCTL_STORE_REQUEST_TIMEOUT")]
        request_timeout_ms: Millis = Millis(Duration::from_secs(10));
        /// Spin-poll window in microseconds (0 = block at once).
        #[arg(long, env = "RBGCTL_STORE_POLL_SPIN_US")]
        poll_spin_us: u64 = 50;
        /// A directory on a local filesystem (NVMe, SSD) for the disk tier: objects the memory
        /// segment gives up are written here instead of dropped, and served from here.
        /// Mooncake's `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH` sets it too. Default: none (no disk
        /// tier).
        #[arg(long, env = "RBGCTL_STORE_DISK_TIER")]
        disk_tier: Option<PathBuf> = None;
        /// Size of the disk tier's file, preallocated at start (`200GiB`, bytes; a multiple of
        /// 4 KiB); must be set with `disk_tier`.
        #[arg(long, env = "RBGCTL_STORE_DISK_TIER_SIZE")]
        disk_tier_size: ByteSize = ByteSize(0);
        /// Port of the disk tier's data service (its segment's endpoint); 0 picks a free one.
        #[arg(long, env = "RBGCTL_STORE_DISK_TIER_PORT")]
        disk_tier_port: u16 = 0;
        /// A file holding the cluster secret (at least 16 bytes): connections to this store
        /// must prove they hold it, and so do this store's own to the master
        /// (`docs/security.md`). Default: none, no authentication.
        #[arg(long, env = "RBGCTL_AUTH_TOKEN_FILE")]
        auth_token_file: Option<PathBuf> = None;
        /// Serve the metrics port over HTTPS with this PEM certificate chain, leaf first (with
        /// `tls_key_path`). Default: none (plain HTTP).
        #[arg(long, env = "RBGCTL_STORE_TLS_CERT_PATH")]
        tls_cert_path: Option<PathBuf> = None;
        /// The PEM private key of `tls_cert_path`. Default: none.
        #[arg(long, env = "RBGCTL_STORE_TLS_KEY_PATH")]
        tls_key_path: Option<PathBuf> = None;
        /// PEM CA certificates trusted for an `https://` metadata server, beside the public
        /// web's roots. Default: none.
        #[arg(long)]
        ca_cert_paths: Vec<PathBuf> = Vec::new();
    }
}

crate::config::settings::named_setting!(Transport);

/// What Mooncake's environment (or its JSON config file) sets, under the store's key names:
/// over the store's file, under its flags.
fn mooncake_layer(m: &MooncakeEnv) -> Result<toml::Table, ConfigError> {
    #[serde_with::skip_serializing_none]
    #[derive(serde::Serialize)]
    struct Layer<'a> {
        master: Option<&'a str>,
        local_hostname: Option<&'a str>,
        metadata_server: Option<&'a str>,
        segment_size: Option<ByteSize>,
        local_buffer_size: Option<ByteSize>,
        protocol: Option<Transport>,
        device: Option<&'a str>,
        disk_tier: Option<&'a str>,
    }
    let protocol = match &m.protocol {
        Some(p) => Some(
            p.parse()
                .map_err(|e| ConfigError::invalid("MOONCAKE_PROTOCOL", e))?,
        ),
        None => None,
    };
    table_of(
        &Layer {
            master: m.master.as_deref(),
            local_hostname: m.local_hostname.as_deref(),
            metadata_server: m.metadata_server.as_deref(),
            segment_size: m.global_segment_size.map(ByteSize),
            local_buffer_size: m.local_buffer_size.map(ByteSize),
            protocol,
            device: m.device.as_deref(),
            disk_tier: m.offload_path.as_deref(),
        },
        "the Mooncake environment",
    )
}

impl StoreArgs {
    /// The config: the file's (or the defaults), Mooncake's environment, then the flags given
    /// over them, validated.
    pub fn resolve(&self, mooncake: &MooncakeEnv) -> Result<StoreConfig, ConfigError> {
        let c: StoreConfig = layered_over(
            self.config.as_deref(),
            [mooncake_layer(mooncake)?, table_of(self, "flags")?],
        )?;
        c.validate()?;
        Ok(c)
    }
}

impl StoreConfig {
    /// The host clients reach this store at: `local_hostname` when set, else `$POD_IP`, else
    /// the address of the interface that reaches the master. Warns when that is a loopback address while the
    /// master is elsewhere: no other host could reach the store.
    pub fn advertised_host(&self) -> String {
        let master = master_target(&self.master);
        let host = match self.local_hostname.trim() {
            "" => crate::config::env_var("POD_IP").unwrap_or_else(|| {
                master
                    .and_then(route_source)
                    .map_or_else(|| "127.0.0.1".to_string(), |ip| ip.to_string())
            }),
            h => h.to_string(),
        };
        let loopback = |h: &str| {
            h == "localhost"
                || h.parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        };
        if let Some(m) = master.filter(|m| !m.ip().is_loopback()) {
            if loopback(&host) {
                tracing::warn!(advertised = %host, master = %m,
                    "this store advertises a loopback address but its master is on another \
                     host: clients elsewhere cannot reach it; set --local-hostname to an address \
                     they can");
            }
        }
        host
    }

    /// The data server's connection limits and waits.
    /// Whether Mooncake's Transfer Engine is served: as set, else unless a secret is.
    pub fn serves_mooncake_transfer(&self) -> bool {
        self.mooncake_transfer
            .unwrap_or(self.auth_token_file.is_none())
            && self.segment_size.0 > 0
    }

    /// The RPC server's options: connection limits and timeouts.
    pub fn server_options(&self) -> crate::transfer::server::ServerOptions {
        crate::transfer::server::ServerOptions {
            max_connections: self.max_connections,
            max_connections_per_peer: self.max_connections_per_peer,
            idle_timeout: self.idle_timeout_ms.0,
            request_timeout: self.request_timeout_ms.0,
            spin: Duration::from_micros(self.poll_spin_us),
            role: "store",
            auth: None,
            keepalive: None,
        }
    }

    /// Whether this store keeps its objects across restarts: asked for, contributing memory,
    /// and with a name that a restarted process will have again.
    pub fn effective_persistence(&self) -> bool {
        self.persistent && self.segment_size.0 > 0 && (self.name.is_some() || self.port != 0)
    }

    /// Refuses settings that cannot run together, naming the setting to fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        crate::ha::MasterAddress::check("store.master", &self.master)?;
        self.protocol.check_built("store.protocol")?;
        if self.protocol == Transport::Rdma && self.device.trim().is_empty() {
            return Err(ConfigError::invalid(
                "store.device",
                "protocol rdma needs the RDMA devices to serve on (--device rxe0, \
                 MOONCAKE_DEVICE=mlx5_0,mlx5_1 or device_name); `rdma link` or `ibv_devices` \
                 lists them",
            ));
        }
        self.server_options().validate()?;
        if self.segment_size.0 != 0 && self.segment_size.0 < 4096 {
            return Err(ConfigError::invalid(
                "store.segment_size",
                format!(
                    "must be 0 (pure client) or at least 4 KiB, got {}",
                    self.segment_size.0
                ),
            ));
        }
        // Empty: the address of the interface toward the master (`advertised_host`).
        if self.local_hostname.contains(char::is_whitespace) {
            return Err(ConfigError::invalid(
                "store.local_hostname",
                "must be a host name or IP",
            ));
        }
        if self.bind_address.parse::<std::net::IpAddr>().is_err() {
            return Err(ConfigError::invalid(
                "store.bind_address",
                format!("expected an IP address, got {:?}", self.bind_address),
            ));
        }
        let ms = &self.metadata_server;
        if ms != "P2PHANDSHAKE" && !ms.starts_with("http://") && !ms.starts_with("https://") {
            return Err(ConfigError::invalid(
                "store.metadata_server",
                format!(
                    "expected P2PHANDSHAKE or an http:// URL, got {ms:?} (etcd is not supported)"
                ),
            ));
        }
        check_pair(
            ("store.tls_cert_path", self.tls_cert_path.is_some()),
            ("store.tls_key_path", self.tls_key_path.is_some()),
        )?;
        self.validate_disk_tier()?;
        if self.heartbeat_interval_ms.0 < Duration::from_millis(10) {
            return Err(ConfigError::invalid(
                "store.heartbeat_interval_ms",
                "must be at least 10 ms",
            ));
        }
        Ok(())
    }
}

impl StoreConfig {
    fn validate_disk_tier(&self) -> Result<(), ConfigError> {
        let size = self.disk_tier_size.0;
        match &self.disk_tier {
            None if size != 0 => Err(ConfigError::invalid(
                "store.disk_tier",
                "disk_tier_size is set but no directory is: set --disk-tier DIR too",
            )),
            None => Ok(()),
            Some(_) if self.segment_size.0 == 0 => Err(ConfigError::invalid(
                "store.disk_tier",
                "a disk tier holds what the memory segment gives up: segment_size must not be 0",
            )),
            Some(_) if self.name.is_none() && self.port == 0 => Err(ConfigError::invalid(
                "store.disk_tier",
                "a disk tier needs a stable store name (--name, or a fixed --port) so that a \
                 restarted store finds its files",
            )),
            Some(_) if size == 0 => Err(ConfigError::invalid(
                "store.disk_tier_size",
                "the disk tier needs a size (--disk-tier-size 200GiB)",
            )),
            Some(_) if size % super::disk::BLOCK != 0 => Err(ConfigError::invalid(
                "store.disk_tier_size",
                format!(
                    "must be a multiple of {} bytes, got {size}",
                    super::disk::BLOCK
                ),
            )),
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_toml;
    use crate::testkit::scratch::ScratchFile;

    /// Mooncake's unauthenticated transport is served by default only without a secret, and
    /// never without a segment.
    #[test]
    fn mooncakes_transport_is_on_by_default_only_without_a_secret() {
        let open = StoreConfig::default();
        assert!(open.serves_mooncake_transfer());
        let secret = StoreConfig {
            auth_token_file: Some("/a".into()),
            ..StoreConfig::default()
        };
        assert!(!secret.serves_mooncake_transfer());
        let no_segment = StoreConfig {
            segment_size: ByteSize(0),
            mooncake_transfer: Some(true),
            ..StoreConfig::default()
        };
        assert!(!no_segment.serves_mooncake_transfer());
    }

    /// Every flag lands in the setting of its name (a renamed one under the config's name):
    /// the shared layering rule refuses a flag that names none.
    #[test]
    fn every_stated_default_is_the_real_one() {
        let checked = crate::config::settings::check_stated_defaults(|a: &StoreArgs| {
            a.resolve(&MooncakeEnv::default())
        });
        assert!(checked >= 25, "{checked}");
    }

    #[test]
    fn every_flag_names_a_setting() {
        let ms = |n| Some(Millis(Duration::from_millis(n)));
        let args = StoreArgs {
            config: None,
            master: Some("m:1".into()),
            bind_address: Some("127.0.0.2".into()),
            local_hostname: Some("127.0.0.3".into()),
            port: Some(2),
            name: Some("n".into()),
            segment_size: Some(ByteSize(8 << 20)),
            local_buffer_size: Some(ByteSize(4 << 20)),
            protocol: Some(Transport::Tcp),
            device: Some("d".into()),
            metadata_server: Some("P2PHANDSHAKE".into()),
            mooncake_transfer: Some(true),
            hash_mooncake_writes: Some(true),
            te_port: Some(15100),
            te_handshake_port: Some(15101),
            shm_dir: Some("/s".into()),
            shm_group: Some("g".into()),
            persistent: Some(true),
            hand_over_secs: Some(30),
            prefault: Some(false),
            metrics_host: Some("127.0.0.4".into()),
            metrics_port: Some(3),
            heartbeat_interval_ms: ms(1500),
            name_conflict_wait_ms: ms(2500),
            max_connections: Some(5),
            max_connections_per_peer: Some(6),
            idle_timeout_ms: ms(7000),
            request_timeout_ms: ms(8000),
            poll_spin_us: Some(9),
            disk_tier: Some("/d".into()),
            disk_tier_size: Some(ByteSize(64 << 20)),
            disk_tier_port: Some(10),
            auth_token_file: Some("/a".into()),
            tls_cert_path: Some("/c".into()),
            tls_key_path: Some("/k".into()),
            ca_cert_paths: Some(vec!["/ca".into()]),
        };
        let c = args.resolve(&MooncakeEnv::default()).unwrap();
        assert_eq!(c.heartbeat_interval_ms, Millis(Duration::from_millis(1500)));
        assert_eq!(c.request_timeout_ms, Millis(Duration::from_secs(8)));
        assert_eq!(c.name.as_deref(), Some("n"));
        assert_eq!(c.shm_group.as_deref(), Some("g"));
        assert_eq!((c.te_port, c.te_handshake_port), (15100, 15101));
        // Named on, Mooncake's transport is served even with a secret.
        assert!(c.serves_mooncake_transfer());
        assert_eq!(c.ca_cert_paths, vec![PathBuf::from("/ca")]);
        assert_eq!(c.disk_tier_port, 10);
        assert!(!c.prefault);
        assert!(c.hash_mooncake_writes);
    }

    #[test]
    fn mooncake_env_sits_between_file_and_flags() {
        let file = ScratchFile::new(
            "s.toml",
            "master = \"file:1\"\nsegment_size = \"64MiB\"\nport = 7000\n",
        );
        let env = MooncakeEnv {
            master: Some("env:2".into()),
            global_segment_size: Some(50 << 30),
            protocol: Some("TCP".into()),
            ..Default::default()
        };
        let args = StoreArgs {
            config: Some(file.path().into()),
            segment_size: Some(ByteSize(1 << 20)),
            ..Default::default()
        };
        let c = args.resolve(&env).unwrap();
        assert_eq!(c.master, "env:2", "MOONCAKE_MASTER beats the file");
        assert_eq!(
            c.segment_size.0,
            1 << 20,
            "the flag beats MOONCAKE_GLOBAL_SEGMENT_SIZE"
        );
        assert_eq!(c.port, 7000);
        assert_eq!(
            c.protocol,
            Transport::Tcp,
            "MOONCAKE_PROTOCOL is read case-blind"
        );
    }

    #[test]
    fn bad_values_name_the_field() {
        let bad = |args: StoreArgs| {
            args.resolve(&MooncakeEnv::default())
                .unwrap_err()
                .to_string()
        };
        assert!(bad(StoreArgs {
            master: Some("nohost".into()),
            ..Default::default()
        })
        .contains("store.master"));
        let rdma = bad(StoreArgs {
            protocol: Some(Transport::Rdma),
            ..Default::default()
        });
        if cfg!(feature = "rdma") {
            assert!(
                rdma.contains("store.device") && rdma.contains("--device rxe0"),
                "{rdma}"
            );
        } else {
            assert!(
                rdma.contains("store.protocol") && rdma.contains("without RDMA"),
                "{rdma}"
            );
        }
        let env = MooncakeEnv {
            protocol: Some("udp".into()),
            ..Default::default()
        };
        let udp = StoreArgs::default().resolve(&env).unwrap_err().to_string();
        assert!(
            udp.contains("MOONCAKE_PROTOCOL") && udp.contains("udp"),
            "{udp}"
        );
        assert!(bad(StoreArgs {
            segment_size: Some(ByteSize(10)),
            ..Default::default()
        })
        .contains("store.segment_size"));
        assert!(bad(StoreArgs {
            metadata_server: Some("etcd://x".into()),
            ..Default::default()
        })
        .contains("store.metadata_server"));
    }

    #[test]
    fn the_example_file_parses_and_holds_the_defaults() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/store.toml");
        let c: StoreConfig = load_toml(&path).unwrap();
        c.validate().unwrap();
        let d = StoreConfig::default();
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
}

/// The master's socket address, for choosing the interface that reaches it: the address of a
/// direct master, or the first etcd member of an elected one (`None` for a Lease, or a name
/// that does not resolve).
fn master_target(spec: &str) -> Option<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let target = match crate::ha::MasterAddress::parse(spec).ok()? {
        crate::ha::MasterAddress::Direct(a) => a,
        crate::ha::MasterAddress::Etcd { endpoints, .. } => {
            let first = endpoints.into_iter().next()?;
            first
                .trim_start_matches("http://")
                .trim_start_matches("https://")
                .to_string()
        }
        crate::ha::MasterAddress::Kube { .. } => return None,
    };
    target.to_socket_addrs().ok()?.next()
}

/// The local address the kernel would send from to reach `to` (a UDP socket's connect sends
/// nothing).
fn route_source(to: std::net::SocketAddr) -> Option<std::net::IpAddr> {
    let any: std::net::SocketAddr = match to {
        std::net::SocketAddr::V4(_) => ([0, 0, 0, 0], 0).into(),
        std::net::SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = std::net::UdpSocket::bind(any).ok()?;
    socket.connect(to).ok()?;
    Some(socket.local_addr().ok()?.ip())
}

#[cfg(test)]
mod advertise_tests {
    use super::*;

    #[test]
    fn the_advertised_host_is_the_one_given_or_the_interface_toward_the_master() {
        let mut c = StoreConfig {
            master: "127.0.0.1:50051".into(),
            local_hostname: String::new(),
            ..StoreConfig::default()
        };
        assert_eq!(c.advertised_host(), "127.0.0.1");
        c.local_hostname = "store-0.example".into();
        assert_eq!(c.advertised_host(), "store-0.example");
        c.local_hostname = String::new();
        c.master = "etcd://127.0.0.1:2379/bars".into();
        assert_eq!(c.advertised_host(), "127.0.0.1");
    }
}
