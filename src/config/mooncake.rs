//! Mooncake compatibility for stores and clients: the `MOONCAKE_*` environment variables and
//! the JSON config file that Mooncake's store service reads. (The `mooncake_master` flags are
//! `master::compat`.)

use super::{env_var, ByteSize, ConfigError};
use std::path::{Path, PathBuf};

/// What Mooncake's store service reads from `MOONCAKE_*` variables or `MOONCAKE_CONFIG_PATH`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MooncakeEnv {
    /// `MOONCAKE_MASTER` / `master_server_address`: the master's `host:port` (or an elected
    /// group's `etcd://…` / `k8s://…`).
    pub master: Option<String>,
    /// `MOONCAKE_LOCAL_HOSTNAME` / `local_hostname`: the host part of the segment name and the
    /// address peers use to reach this process.
    pub local_hostname: Option<String>,
    /// `MOONCAKE_TE_META_DATA_SERVER` / `metadata_server`: `http://…/metadata` to publish the
    /// segment descriptor to, or `P2PHANDSHAKE` for none.
    pub metadata_server: Option<String>,
    /// `MOONCAKE_GLOBAL_SEGMENT_SIZE` / `global_segment_size`: memory contributed; 0 = pure client.
    pub global_segment_size: Option<u64>,
    /// `MOONCAKE_LOCAL_BUFFER_SIZE` / `local_buffer_size`.
    pub local_buffer_size: Option<u64>,
    /// `MOONCAKE_PROTOCOL` / `protocol`: `tcp` or `rdma` (lower-cased).
    pub protocol: Option<String>,
    /// `MOONCAKE_DEVICE` / `device_name`: RDMA device names.
    pub device: Option<String>,
    /// `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH` / `ssd_offload_path`: the disk tier's directory.
    pub offload_path: Option<String>,
}

impl MooncakeEnv {
    /// Reads the process environment; `MOONCAKE_CONFIG_PATH` wins over the single variables.
    pub fn from_process() -> Result<MooncakeEnv, ConfigError> {
        Self::from_lookup(env_var)
    }

    /// Mooncake's settings from the environment as `get` reads it (`MOONCAKE_CONFIG_PATH`'s
    /// file first).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<MooncakeEnv, ConfigError> {
        if let Some(path) = get("MOONCAKE_CONFIG_PATH") {
            return Self::from_json_file(&PathBuf::from(path));
        }
        let size = |name: &str| -> Result<Option<u64>, ConfigError> {
            get(name)
                .map(|v| {
                    v.parse::<ByteSize>()
                        .map(|b| b.0)
                        .map_err(|e| ConfigError::invalid(name, e))
                })
                .transpose()
        };
        Ok(MooncakeEnv {
            master: get("MOONCAKE_MASTER"),
            local_hostname: get("MOONCAKE_LOCAL_HOSTNAME"),
            metadata_server: get("MOONCAKE_TE_META_DATA_SERVER"),
            global_segment_size: size("MOONCAKE_GLOBAL_SEGMENT_SIZE")?,
            local_buffer_size: size("MOONCAKE_LOCAL_BUFFER_SIZE")?,
            protocol: get("MOONCAKE_PROTOCOL").map(|p| p.to_ascii_lowercase()),
            device: get("MOONCAKE_DEVICE"),
            offload_path: get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH").filter(|p| !p.is_empty()),
        })
    }

    /// Mooncake's JSON config (`mooncake_config.py`): `local_hostname`, `metadata_server` and
    /// `master_server_address` are required.
    pub fn from_json_file(path: &Path) -> Result<MooncakeEnv, ConfigError> {
        let file_err = |reason: String| ConfigError::File {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file_err(e.to_string()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| file_err(e.to_string()))?;
        let obj = v
            .as_object()
            .ok_or_else(|| file_err("expected a JSON object".into()))?;
        let text_field = |k: &str| obj.get(k).and_then(|x| x.as_str()).map(str::to_string);
        for required in ["local_hostname", "metadata_server", "master_server_address"] {
            if text_field(required).is_none() {
                return Err(file_err(format!("missing required field {required:?}")));
            }
        }
        let size = |k: &str| -> Result<Option<u64>, ConfigError> {
            match obj.get(k) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::Number(n)) => n
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| file_err(format!("{k}: not a byte count"))),
                Some(serde_json::Value::String(s)) => s
                    .parse::<ByteSize>()
                    .map(|b| Some(b.0))
                    .map_err(|e| file_err(format!("{k}: {e}"))),
                Some(_) => Err(file_err(format!("{k}: not a byte count"))),
            }
        };
        Ok(MooncakeEnv {
            master: text_field("master_server_address"),
            local_hostname: text_field("local_hostname"),
            metadata_server: text_field("metadata_server"),
            global_segment_size: size("global_segment_size")?,
            local_buffer_size: size("local_buffer_size")?,
            protocol: text_field("protocol").map(|p| p.to_ascii_lowercase()),
            device: text_field("device_name"),
            offload_path: text_field("ssd_offload_path").filter(|p| !p.is_empty()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::scratch::ScratchFile;

    #[test]
    fn mooncake_env_is_read_as_documented() {
        let env = |k: &str| match k {
            "MOONCAKE_MASTER" => Some("m:50051".to_string()),
            "MOONCAKE_GLOBAL_SEGMENT_SIZE" => Some("50gb".to_string()),
            "MOONCAKE_LOCAL_BUFFER_SIZE" => Some("4194304".to_string()),
            "MOONCAKE_PROTOCOL" => Some("TCP".to_string()),
            "MOONCAKE_TE_META_DATA_SERVER" => Some("http://m:8080/metadata".to_string()),
            _ => None,
        };
        let e = MooncakeEnv::from_lookup(env).unwrap();
        assert_eq!(e.master.as_deref(), Some("m:50051"));
        assert_eq!(e.global_segment_size, Some(50 << 30));
        assert_eq!(e.local_buffer_size, Some(4 << 20));
        assert_eq!(e.protocol.as_deref(), Some("tcp"));
        let bad = |k: &str| (k == "MOONCAKE_GLOBAL_SEGMENT_SIZE").then(|| "50%".to_string());
        let err = MooncakeEnv::from_lookup(bad).unwrap_err().to_string();
        assert!(err.contains("MOONCAKE_GLOBAL_SEGMENT_SIZE"), "{err}");
    }

    #[test]
    fn mooncake_config_path_wins_and_checks_required_fields() {
        let file = ScratchFile::new(
            "mc.json",
            r#"{"local_hostname":"h","metadata_server":"P2PHANDSHAKE","master_server_address":"m:1",
                "global_segment_size":"16MB","local_buffer_size":0,"protocol":"tcp"}"#,
        );
        let path = file.arg();
        let e = MooncakeEnv::from_lookup(|k| match k {
            "MOONCAKE_CONFIG_PATH" => Some(path.clone()),
            "MOONCAKE_MASTER" => Some("ignored:1".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(e.master.as_deref(), Some("m:1"));
        assert_eq!(e.global_segment_size, Some(16 << 20));
        file.rewrite(r#"{"local_hostname":"h"}"#);
        let err = MooncakeEnv::from_json_file(file.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("metadata_server"), "{err}");
    }
}
