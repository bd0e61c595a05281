//! `rbgctl sim-engine` configuration. Precedence: flag > TOML file (`--config`) > the defaults
//! documented on each field (SGLang's where it has one). Example: `config/sim-engine.toml`.

use super::cost::CostModel;
use super::Mode;
use crate::config::{layered, ConfigError};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

crate::config::settings::settings! {
    /// The SIMULATED engine's settings, from its flags and TOML file.
    #[derive(Clone, Debug, Deserialize, Serialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct EngineConfig;

    /// Flags of `rbgctl sim-engine` (SGLang's spellings where it has the setting).
    #[serde_with::skip_serializing_none]
    #[derive(Debug, Clone, Default, clap::Args, serde::Serialize)]
    pub struct SimEngineArgs {
        /// TOML config file (see config/sim-engine.toml).
        #[arg(long)]
        #[serde(skip)]
        pub config: Option<PathBuf>,
    }

    settings {
        /// Address the engine listens on.
        #[arg(long)]
        host: String = "127.0.0.1".into();
        /// The engine's port.
        #[arg(long)]
        port: u16 = 30000;
        /// `regular`, `prefill` or `decode` (SGLang's `--disaggregation-mode`).
        #[arg(long = "disaggregation-mode", alias = "mode")]
        mode: Mode = Mode::Regular;
        /// Prefill mode: also serve the KV bootstrap on this port (the router sends it to
        /// decode). Default: none.
        #[arg(long)]
        disaggregation_bootstrap_port: Option<u16> = None;
        /// Model name it reports (SGLang's `--served-model-name`).
        #[arg(long = "served-model-name")]
        model: String = "simulated-model".into();
        /// Tokens per KV page (SGLang's `--page-size`).
        #[arg(long)]
        page_size: usize = 64;
        /// Device (L1) prefix cache, in tokens.
        #[arg(long)]
        device_cache_tokens: usize = 65_536;
        /// Host (L2) cache, in tokens; 0 = none.
        #[arg(long)]
        host_cache_tokens: usize = 0;
        /// Use the rbgctl KV pool at this master address as the L3 tier. Default: none.
        #[arg(long)]
        l3_master: Option<String> = None;
        /// The pool's cluster secret, for the L3 client (as `rbgctl kv`). Default: none.
        #[arg(long, env = "RBGCTL_AUTH_TOKEN_FILE")]
        auth_token_file: Option<PathBuf> = None;
        /// KV bytes per token (page objects are `page_size` x this).
        #[arg(long)]
        bytes_per_token: usize = 4096;
        /// Prefill compute per uncached token, microseconds.
        #[arg(long)]
        prefill_us_per_token: f64 = 100.0;
        /// Copy to device per token loaded from L2 or L3, microseconds.
        #[arg(long)]
        load_us_per_token: f64 = 5.0;
        /// Decode step, milliseconds.
        #[arg(long)]
        decode_ms_per_token: f64 = 5.0;
        /// Prefill-to-decode KV transfer bandwidth (PD), GB/s; 0 = instant.
        #[arg(long)]
        kv_transfer_gbps: f64 = 10.0;
        /// Tokens generated when a request does not say.
        #[arg(long)]
        default_max_tokens: usize = 128;
        /// Prefill tokens the device computes in one go (SGLang's `--chunked-prefill-size`): a
        /// longer prompt is computed in chunks, and between two the device may go to a request
        /// that goes first; −1 computes every prompt whole.
        #[arg(long)]
        chunked_prefill_size: i64 = 8192;
        /// Prefills wait for the device in the order of the requests' `priority` (higher
        /// first, as SGLang's `--enable-priority-scheduling`), then of arrival; off, arrival
        /// only.
        #[arg(long)]
        enable_priority_scheduling: bool = false;
        /// With priority scheduling, lower `priority` values go first (SGLang's
        /// `--schedule-low-priority-values-first`; vLLM's convention).
        #[arg(long)]
        schedule_low_priority_values_first: bool = false;
        /// Publish the device (L1) and host (L2) caches' blocks as KV events: SGLang's
        /// `--kv-events-config` JSON (`{"publisher":"zmq","endpoint":"tcp://*:5557",
        /// "replay_endpoint":"tcp://*:5558"}`). Default: none.
        #[arg(long)]
        kv_events_config: Option<String> = None;
    }
}

crate::config::settings::named_setting!(Mode);

impl EngineConfig {
    /// Refuses settings that cannot run together, naming the setting to fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.page_size == 0 {
            return Err(ConfigError::invalid("engine.page_size", "must be positive"));
        }
        if self.device_cache_tokens < self.page_size {
            return Err(ConfigError::invalid(
                "engine.device_cache_tokens",
                format!("must hold at least one page ({} tokens)", self.page_size),
            ));
        }
        if let Some(json) = &self.kv_events_config {
            crate::kv_events::KvEventsConfig::parse(json)
                .map_err(|e| ConfigError::invalid("engine.kv_events_config", e))?;
        }
        if self.chunked_prefill_size == 0 || self.chunked_prefill_size < -1 {
            return Err(ConfigError::invalid(
                "engine.chunked_prefill_size",
                format!(
                    "must be positive, or -1 to compute prompts whole; got {}",
                    self.chunked_prefill_size
                ),
            ));
        }
        if self.bytes_per_token == 0 {
            return Err(ConfigError::invalid(
                "engine.bytes_per_token",
                "must be positive",
            ));
        }
        for (field, v) in [
            ("engine.prefill_us_per_token", self.prefill_us_per_token),
            ("engine.load_us_per_token", self.load_us_per_token),
            ("engine.decode_ms_per_token", self.decode_ms_per_token),
            ("engine.kv_transfer_gbps", self.kv_transfer_gbps),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ConfigError::invalid(
                    field,
                    format!("must be a non-negative number, got {v}"),
                ));
            }
        }
        Ok(())
    }

    /// Where a request asking for `priority` stands at the device, higher first: its own
    /// priority with priority scheduling (negated when lower values go first), else all equal.
    pub fn device_priority(&self, priority: i64) -> i64 {
        match (
            self.enable_priority_scheduling,
            self.schedule_low_priority_values_first,
        ) {
            (false, _) => 0,
            (true, false) => priority,
            (true, true) => priority.saturating_neg(),
        }
    }

    /// The cost model its settings describe.
    pub fn cost(&self) -> CostModel {
        CostModel {
            prefill_us_per_token: self.prefill_us_per_token,
            load_us_per_token: self.load_us_per_token,
            decode_ms_per_token: self.decode_ms_per_token,
            kv_transfer_gbps: self.kv_transfer_gbps,
        }
    }
}

impl SimEngineArgs {
    /// Layers file, then these values, over the defaults, and validates the result.
    pub fn resolve(&self) -> Result<EngineConfig, ConfigError> {
        let c: EngineConfig = layered(self.config.as_deref(), self)?;
        c.validate()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_order_the_device_only_with_priority_scheduling() {
        let mut c = EngineConfig::default();
        assert_eq!(c.device_priority(7), 0);
        c.enable_priority_scheduling = true;
        assert_eq!(c.device_priority(7), 7);
        c.schedule_low_priority_values_first = true;
        assert_eq!(c.device_priority(7), -7);
    }

    #[test]
    fn every_stated_default_is_the_real_one() {
        let checked = crate::config::settings::check_stated_defaults(SimEngineArgs::resolve);
        assert!(checked >= 15, "{checked}");
    }

    #[test]
    fn every_flag_names_a_setting() {
        let n = crate::config::check_flags_name_settings::<SimEngineArgs, EngineConfig>(
            &["config"],
            &[],
        );
        assert!(n >= 15, "{n}");
    }

    #[test]
    fn the_example_file_is_the_defaults_and_flags_override_it() {
        let path = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/sim-engine.toml"
        ));
        let args = SimEngineArgs {
            config: Some(path.clone()),
            ..SimEngineArgs::default()
        };
        let from_file = args.resolve().unwrap();
        let defaults = EngineConfig::default();
        assert_eq!(
            toml::to_string(&from_file).unwrap(),
            toml::to_string(&defaults).unwrap()
        );
        let args = SimEngineArgs {
            config: Some(path),
            page_size: Some(16),
            mode: Some(Mode::Prefill),
            ..SimEngineArgs::default()
        };
        let c = args.resolve().unwrap();
        assert_eq!((c.page_size, c.mode), (16, Mode::Prefill));
    }

    #[test]
    fn bad_values_name_their_field() {
        for (args, field) in [
            (
                SimEngineArgs {
                    page_size: Some(0),
                    ..SimEngineArgs::default()
                },
                "engine.page_size",
            ),
            (
                SimEngineArgs {
                    device_cache_tokens: Some(8),
                    ..SimEngineArgs::default()
                },
                "engine.device_cache_tokens",
            ),
            (
                SimEngineArgs {
                    kv_transfer_gbps: Some(f64::NAN),
                    ..SimEngineArgs::default()
                },
                "engine.kv_transfer_gbps",
            ),
        ] {
            let e = args.resolve().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }
}
