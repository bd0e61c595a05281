//! Mooncake compatibility for the master: the `mooncake_master` flag spellings (gflags style)
//! and its JSON config file, read into the master's own arguments. (The `MOONCAKE_*`
//! variables that stores and clients read are `config::mooncake`.)

use super::config::MasterArgs;
use crate::config::{parse_duration, ConfigError, Millis};
use std::path::Path;
use std::time::Duration;

/// `mooncake_master` flags that rbgctl accepts but has no use for (features it does not have,
/// or tuning of Mooncake internals); they are logged and ignored, so existing command lines run.
const IGNORED_MASTER_FLAGS: &[&str] = &[
    "allow_evict_soft_pinned_objects",
    "batch_oplog_retry_timeout_sec",
    "cxl_path",
    "cxl_size",
    "dynamic_replication_admission_qps_threshold",
    "dynamic_replication_heat_window_seconds",
    "dynamic_replication_max_memory_replicas",
    "dynamic_replication_mode",
    "enable_cxl",
    "enable_disk_eviction",
    "enable_kv_events",
    "enable_metadata_cleanup_on_timeout",
    "enable_metric_reporting",
    "enable_multi_tenants",
    "enable_offload",
    "enable_oplog",
    "enable_snapshot",
    "enable_snapshot_restore",
    "global_file_segment_size",
    "kv_events_additional_salt",
    "kv_events_backend_id",
    "kv_events_bind_endpoint",
    "kv_events_block_size",
    "kv_events_dp_rank",
    "kv_events_emit_legacy_compat",
    "kv_events_emit_object_key",
    "kv_events_lora_name",
    "kv_events_model_name",
    "kv_events_queue_capacity",
    "kv_events_tenant_id",
    "max_retry_attempts",
    "max_threads",
    "max_total_finished_tasks",
    "max_total_pending_tasks",
    "max_total_processing_tasks",
    "memory_allocator",
    "nof_eviction_high_watermark_ratio",
    "nof_eviction_ratio",
    "nof_heartbeat_failures_threshold",
    "nof_heartbeat_interval_sec",
    "nof_heartbeat_probe_timeout_ms",
    "offload_cap_ratio",
    "offload_force_evict",
    "offload_on_evict",
    "offloading_queue_limit",
    "oplog_batch_max_entries",
    "oplog_poll_interval_ms",
    "pending_task_timeout_sec",
    "pod_name",
    "pod_namespace",
    "processing_task_timeout_sec",
    "promotion_max_per_heartbeat",
    "promotion_queue_limit",
    "quota_bytes",
    "root_fs_dir",
    "rpc_conn_timeout_seconds",
    "rpc_enable_tcp_no_delay",
    "rpc_interface",
    "rpc_thread_num",
    "snapshot_backup_dir",
    "snapshot_catalog_backend_connstring",
    "snapshot_catalog_backend_type",
    "snapshot_catalog_store_connstring",
    "snapshot_catalog_store_type",
    "snapshot_child_timeout_seconds",
    "snapshot_interval_seconds",
    "snapshot_object_store_type",
    "snapshot_payload_backend_type",
    "snapshot_payload_store_type",
    "snapshot_retention_count",
    "tenant_quota_connector_type",
    "tenant_quota_connector_uri",
    "mmap_arena_pool_size",
    "use_mmap_arena_allocator",
    // glog's own flags
    "logtostderr",
    "alsologtostderr",
    "log_dir",
    "v",
    "minloglevel",
    "stderrthreshold",
];

const BOOL_FLAGS: &[&str] = &["enable_http_metadata_server", "enable_ha"];

fn parse_bool(flag: &str, v: &str) -> Result<bool, ConfigError> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "t" | "1" | "yes" | "y" => Ok(true),
        "false" | "f" | "0" | "no" | "n" => Ok(false),
        _ => Err(ConfigError::invalid(
            format!("--{flag}"),
            format!("expected true or false, got {v:?}"),
        )),
    }
}

fn parse_num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    v.trim()
        .parse()
        .map_err(|e: T::Err| ConfigError::invalid(format!("--{flag}"), format!("{v:?}: {e}")))
}

fn seconds(flag: &str, v: &str) -> Result<Millis, ConfigError> {
    let s: f64 = parse_num(flag, v)?;
    if !(s.is_finite() && s >= 0.0) {
        return Err(ConfigError::invalid(
            format!("--{flag}"),
            format!("{v:?}: not a number of seconds"),
        ));
    }
    Ok(Millis(Duration::from_secs_f64(s)))
}

/// Applies one Mooncake master setting (from a flag or the JSON config file).
fn apply(
    args: &mut MasterArgs,
    name: &str,
    value: &str,
    port_fallback: &mut Option<u16>,
) -> Result<(), ConfigError> {
    let ms = |v: &str| {
        parse_duration(v)
            .map(Millis)
            .map_err(|e| ConfigError::invalid(format!("--{name}"), e))
    };
    match name {
        "rpc_port" => args.rpc_port = Some(parse_num(name, value)?),
        "port" => *port_fallback = Some(parse_num(name, value)?),
        "rpc_address" => args.rpc_address = Some(value.to_string()),
        "enable_http_metadata_server" => {
            args.enable_http_metadata_server = Some(parse_bool(name, value)?)
        }
        "http_metadata_server_host" => args.http_metadata_server_host = Some(value.to_string()),
        "http_metadata_server_port" => {
            args.http_metadata_server_port = Some(parse_num(name, value)?)
        }
        "metrics_port" => args.metrics_port = Some(parse_num(name, value)?),
        "metrics_host" => args.metrics_host = Some(value.to_string()),
        "default_kv_lease_ttl" => args.default_kv_lease_ttl_ms = Some(ms(value)?),
        "default_kv_soft_pin_ttl" => args.default_kv_soft_pin_ttl_ms = Some(ms(value)?),
        "max_kv_soft_pin_ttl" => args.max_kv_soft_pin_ttl_ms = Some(ms(value)?),
        "eviction_high_watermark_ratio" => {
            args.eviction_high_watermark_ratio = Some(parse_num(name, value)?)
        }
        "eviction_ratio" => args.eviction_ratio = Some(parse_num(name, value)?),
        "promotion_on_hit" => args.promotion_on_hit = Some(parse_bool(name, value)?),
        "promotion_admission_threshold" => {
            args.promotion_admission_threshold = Some(parse_num(name, value)?)
        }
        "client_ttl" | "client_live_ttl_sec" => args.client_ttl_ms = Some(seconds(name, value)?),
        "put_start_discard_timeout_sec" => {
            args.put_start_discard_timeout_ms = Some(seconds(name, value)?)
        }
        "put_start_release_timeout_sec" => {
            args.put_start_release_timeout_ms = Some(seconds(name, value)?)
        }
        "allocation_strategy" => args.allocation_strategy = Some(parse_num(name, value)?),
        "enable_ha" => args.enable_ha = Some(parse_bool(name, value)?),
        "etcd_endpoints" | "ha_backend_connstring" => {
            args.ha_backend_connstring = Some(value.to_string())
        }
        "ha_backend_type" => args.ha_backend = Some(parse_num(name, value)?),
        "cluster_id" => args.cluster_id = Some(value.to_string()),
        n if IGNORED_MASTER_FLAGS.contains(&n) => {
            tracing::info!(
                flag = n,
                value,
                "mooncake_master flag accepted but has no effect in rbgctl"
            );
        }
        n => return Err(ConfigError::invalid(
            format!("--{n}"),
            "unknown mooncake_master flag (see `rbgctl master --help` for rbgctl's own spellings)",
        )),
    }
    Ok(())
}

/// The flags `mooncake_master` takes here, with what each sets (`--help`). Every name is one
/// `apply` knows (a unit test holds them together).
pub const MASTER_FLAGS: &[(&str, &str)] = &[
    ("rpc_port", "RPC port (default 50051)"),
    (
        "port",
        "deprecated spelling of rpc_port, used when rpc_port is 0",
    ),
    ("rpc_address", "RPC address to listen on"),
    (
        "enable_http_metadata_server",
        "serve Mooncake's HTTP metadata protocol (bool)",
    ),
    ("http_metadata_server_host", "its address"),
    ("http_metadata_server_port", "its port (default 8080)"),
    (
        "metrics_host",
        "address of /metrics, /health and the admin API",
    ),
    ("metrics_port", "its port (default 9003)"),
    (
        "default_kv_lease_ttl",
        "read lease of an object, milliseconds",
    ),
    (
        "default_kv_soft_pin_ttl",
        "soft pin of an object, milliseconds",
    ),
    ("max_kv_soft_pin_ttl", "longest soft pin, milliseconds"),
    (
        "eviction_high_watermark_ratio",
        "memory use that starts eviction (0..1)",
    ),
    ("eviction_ratio", "share evicted at once (0..1)"),
    (
        "promotion_on_hit",
        "copy a disk-tier object back to memory on a hit (bool)",
    ),
    ("promotion_admission_threshold", "hits before a promotion"),
    (
        "client_ttl",
        "seconds a silent client or store stays known (also client_live_ttl_sec)",
    ),
    (
        "put_start_discard_timeout_sec",
        "seconds before an unfinished put may be replaced",
    ),
    (
        "put_start_release_timeout_sec",
        "seconds before its space is reused",
    ),
    ("allocation_strategy", "random or free_ratio_first"),
    ("enable_ha", "elect a leader among masters (bool)"),
    (
        "etcd_endpoints",
        "etcd members, h1:2379;h2:2379 (also ha_backend_connstring)",
    ),
    ("ha_backend_type", "etcd or k8s"),
    ("cluster_id", "the cluster the masters elect for"),
    (
        "config_path",
        "a JSON file of these flags; the command line overrides it",
    ),
];

/// `mooncake_master --help`: the flags above, and those accepted without effect.
pub fn master_flags_help() -> String {
    let mut h = String::from(
        "mooncake_master (rbgctl's master with Mooncake's flag spellings)\n\n\
         Usage: mooncake_master [--flag=value | --flag value | --bool_flag | --nobool_flag]...\n\n\
         Flags:\n",
    );
    for (name, what) in MASTER_FLAGS {
        h.push_str(&format!("  --{name:<32} {what}\n"));
    }
    h.push_str("\nAccepted, without effect in rbgctl:\n  ");
    h.push_str(&IGNORED_MASTER_FLAGS.join(", "));
    h.push_str("\n\nrbgctl's own spellings of every setting: rbgctl master --help\n");
    h
}

/// Whether `argv` asks for help rather than a master (`--help`, `-h`, gflags' `--helpfull`).
pub fn asks_for_help(argv: &[String]) -> bool {
    argv.iter().any(|a| {
        matches!(
            a.as_str(),
            "-h" | "--help" | "-help" | "--helpfull" | "-helpfull" | "--helpshort"
        )
    })
}

/// Parses `mooncake_master` command-line flags (gflags spellings: `--name=value`,
/// `--name value`, `-name=value`, bare `--bool_flag`, `--nobool_flag`) into master arguments.
/// A `--config_path` JSON file is read first; flags on the command line override it.
pub fn parse_master_flags(argv: &[String]) -> Result<MasterArgs, ConfigError> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    let mut i = 0;
    while i < argv.len() {
        let arg = &argv[i];
        let Some(body) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            return Err(ConfigError::invalid(
                arg.clone(),
                "unexpected positional argument",
            ));
        };
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None if BOOL_FLAGS.contains(&body) => (body.to_string(), "true".to_string()),
            None if body.starts_with("no") && BOOL_FLAGS.contains(&&body[2..]) => {
                (body[2..].to_string(), "false".to_string())
            }
            None => {
                i += 1;
                let v = argv
                    .get(i)
                    .ok_or_else(|| ConfigError::invalid(format!("--{body}"), "missing value"))?;
                (body.to_string(), v.clone())
            }
        };
        pairs.push((name, value));
        i += 1;
    }
    let mut args = MasterArgs::default();
    let mut port_fallback = None;
    if let Some((_, path)) = pairs.iter().find(|(n, _)| n == "config_path") {
        if !path.is_empty() {
            for (name, value) in read_master_json(Path::new(path))? {
                apply(&mut args, &name, &value, &mut port_fallback)?;
            }
        }
    }
    for (name, value) in pairs.iter().filter(|(n, _)| n != "config_path") {
        apply(&mut args, name, value, &mut port_fallback)?;
    }
    // Mooncake: rpc_port 0 (the default) falls back to the deprecated --port.
    if args.rpc_port.unwrap_or(0) == 0 {
        if let Some(p) = port_fallback {
            args.rpc_port = Some(p);
        }
    }
    if args.rpc_port == Some(0) {
        args.rpc_port = None;
    }
    Ok(args)
}

fn read_master_json(path: &Path) -> Result<Vec<(String, String)>, ConfigError> {
    let file_err = |reason: String| ConfigError::File {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| file_err(e.to_string()))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        file_err(format!(
            "{e} (rbgctl reads Mooncake master config files in JSON form)"
        ))
    })?;
    let obj = value
        .as_object()
        .ok_or_else(|| file_err("expected a JSON object".into()))?;
    Ok(obj
        .iter()
        .map(|(k, v)| {
            let s = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), s)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::scratch::ScratchFile;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn seed_command_lines_parse() {
        // Seed 002's master.
        let a = parse_master_flags(&argv(
            "--rpc_address 10.0.0.5 --rpc_port 50051 --http_metadata_server_host 10.0.0.5 \
             --http_metadata_server_port 8080 --metrics_port 9003",
        ))
        .unwrap();
        assert_eq!(a.rpc_address.as_deref(), Some("10.0.0.5"));
        assert_eq!(a.rpc_port, Some(50051));
        assert_eq!(a.http_metadata_server_port, Some(8080));
        assert_eq!(a.metrics_port, Some(9003));
        // Seed 000's master.
        let a = parse_master_flags(&argv(
            "--enable_http_metadata_server=true --eviction_high_watermark_ratio=0.95 --eviction_ratio=0.05",
        ))
        .unwrap();
        assert_eq!(a.enable_http_metadata_server, Some(true));
        assert_eq!(a.eviction_high_watermark_ratio, Some(0.95));
        let c = a.resolve().unwrap();
        assert_eq!(c.eviction_high_watermark_ratio, 0.95);
    }

    #[test]
    fn mooncake_ha_spellings() {
        let a = parse_master_flags(&argv(
            "--enable_ha=true --etcd_endpoints=127.0.0.1:2379;127.0.0.1:22379 --cluster_id prod",
        ))
        .unwrap();
        let c = a.resolve().unwrap();
        assert!(c.enable_ha);
        assert_eq!(c.ha_backend_connstring, "127.0.0.1:2379;127.0.0.1:22379");
        assert_eq!(c.cluster_id, "prod");
        let a = parse_master_flags(&argv(
            "--enable_ha --ha_backend_type=k8s --ha_backend_connstring=pool/masters",
        ))
        .unwrap();
        let c = a.resolve().unwrap();
        assert_eq!(c.ha_backend, crate::master::config::HaBackend::K8s);
        assert_eq!(c.ha_backend_connstring, "pool/masters");
        let e = parse_master_flags(&argv("--enable_ha --ha_backend_type=redis"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--ha_backend_type") && e.contains("etcd or k8s"),
            "{e}"
        );
    }

    #[test]
    fn every_flag_the_help_names_is_taken() {
        for (name, _) in MASTER_FLAGS {
            let value = match *name {
                "enable_http_metadata_server" | "enable_ha" | "promotion_on_hit" => "true",
                "allocation_strategy" => "random",
                "ha_backend_type" => "etcd",
                "etcd_endpoints" => "h:2379",
                "cluster_id" => "c",
                "rpc_address" | "http_metadata_server_host" | "metrics_host" => "127.0.0.1",
                "eviction_high_watermark_ratio" | "eviction_ratio" => "0.5",
                "config_path" => "",
                _ => "1",
            };
            parse_master_flags(&[format!("--{name}={value}")])
                .unwrap_or_else(|e| panic!("--{name}: {e}"));
        }
        let help = master_flags_help();
        assert!(help.contains("--rpc_port") && help.contains("enable_kv_events"));
        assert!(asks_for_help(&["--help".into()]) && asks_for_help(&["-h".into()]));
    }

    #[test]
    fn gflags_spellings() {
        let a = parse_master_flags(&argv(
            "-rpc_port=6000 --enable_http_metadata_server --client_ttl 3 --default_kv_lease_ttl=5s",
        ))
        .unwrap();
        assert_eq!(a.rpc_port, Some(6000));
        assert_eq!(a.enable_http_metadata_server, Some(true));
        assert_eq!(a.client_ttl_ms.unwrap().0, Duration::from_secs(3));
        assert_eq!(a.default_kv_lease_ttl_ms.unwrap().0, Duration::from_secs(5));
        let a = parse_master_flags(&argv("--noenable_http_metadata_server --port 7000")).unwrap();
        assert_eq!(a.enable_http_metadata_server, Some(false));
        assert_eq!(
            a.rpc_port,
            Some(7000),
            "--port is the fallback for rpc_port 0"
        );
        let a =
            parse_master_flags(&argv("--default_kv_lease_ttl 2500 --rpc_thread_num 4")).unwrap();
        assert_eq!(
            a.default_kv_lease_ttl_ms.unwrap().0,
            Duration::from_millis(2500)
        );
    }

    #[test]
    fn bad_flags_are_named() {
        let e = parse_master_flags(&argv("--rpc_prot 1"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--rpc_prot"), "{e}");
        let e = parse_master_flags(&argv("--rpc_port=abc"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--rpc_port"), "{e}");
        let e = parse_master_flags(&argv("--enable_http_metadata_server=maybe"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("enable_http_metadata_server"), "{e}");
        let e = parse_master_flags(&argv("--metrics_port"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing value"), "{e}");
    }

    #[test]
    fn json_config_path_is_read_and_flags_win() {
        let file = ScratchFile::new(
            "master.json",
            r#"{"rpc_port": 6100, "client_live_ttl_sec": 60, "metrics_port": 9100}"#,
        );
        let a = parse_master_flags(&[
            format!("--config_path={}", file.arg()),
            "--metrics_port=9200".into(),
        ])
        .unwrap();
        assert_eq!(a.rpc_port, Some(6100));
        assert_eq!(a.metrics_port, Some(9200));
        assert_eq!(a.client_ttl_ms.unwrap().0, Duration::from_secs(60));
    }
}
