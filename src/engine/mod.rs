//! `rbgctl sim-engine`: a SIMULATED SGLang-compatible inference engine. There is no model and
//! no GPU: it answers SGLang's and OpenAI's endpoints with made-up tokens, and its timing comes
//! from a cost model (prefill time in proportion to uncached tokens, a time per decode step).
//! Its KV cache is modelled page by page, as SGLang's HiCache keeps it: a bounded device tier
//! (L1), an optional host tier (L2), and an optional third tier (L3) that is the rbgctl KV pool,
//! reached through the client library and moving real bytes. It reports `cached_tokens` as
//! SGLang does, so that `rbgctl bench multiturn` measures cache hit rates against it. It can
//! play the prefill or the decode side of a disaggregated deployment behind `rbgctl router`.

pub mod cache;
pub mod cost;
pub mod l3;
pub mod server;
pub mod tokens;

use clap::{Args, ValueEnum};

/// The part it plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Prefill and decode.
    Regular,
    /// Prefill only; decode engines fetch the KV cache through its bootstrap port.
    Prefill,
    /// Decode only; waits for the prefill named by the request's bootstrap fields.
    Decode,
}

#[derive(Debug, Clone, Args)]
pub struct SimEngineArgs {
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// `regular`, `prefill` or `decode` (SGLang's `--disaggregation-mode`).
    #[arg(long = "disaggregation-mode", alias = "mode", value_enum, default_value_t = Mode::Regular)]
    pub mode: Mode,
    /// Prefill mode: also serve the KV bootstrap on this port (the router sends it to decode).
    #[arg(long)]
    pub disaggregation_bootstrap_port: Option<u16>,
    /// Model name it reports.
    #[arg(long = "served-model-name", default_value = "simulated-model")]
    pub model: String,
    /// Tokens per KV page (SGLang's `--page-size`).
    #[arg(long, default_value_t = 64)]
    pub page_size: usize,
    /// Device (L1) prefix cache, in tokens.
    #[arg(long, default_value_t = 65_536)]
    pub device_cache_tokens: usize,
    /// Host (L2) cache, in tokens; 0 = none.
    #[arg(long, default_value_t = 0)]
    pub host_cache_tokens: usize,
    /// Use the rbgctl KV pool at this master address as the L3 tier.
    #[arg(long)]
    pub l3_master: Option<String>,
    /// KV bytes per token (page objects are `page-size` x this).
    #[arg(long, default_value_t = 4096)]
    pub bytes_per_token: usize,
    /// Prefill compute per uncached token, microseconds.
    #[arg(long, default_value_t = 100.0)]
    pub prefill_us_per_token: f64,
    /// Copy to device per token loaded from L2 or L3, microseconds.
    #[arg(long, default_value_t = 5.0)]
    pub load_us_per_token: f64,
    /// Decode step, milliseconds.
    #[arg(long, default_value_t = 5.0)]
    pub decode_ms_per_token: f64,
    /// Prefill-to-decode KV transfer bandwidth (PD), GB/s; 0 = instant.
    #[arg(long, default_value_t = 10.0)]
    pub kv_transfer_gbps: f64,
    /// Tokens generated when a request does not say.
    #[arg(long, default_value_t = 128)]
    pub default_max_tokens: usize,
}

impl SimEngineArgs {
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.page_size > 0, "--page-size must be positive");
        anyhow::ensure!(
            self.device_cache_tokens >= self.page_size,
            "--device-cache-tokens must hold at least one page ({} tokens)",
            self.page_size
        );
        anyhow::ensure!(
            self.bytes_per_token > 0,
            "--bytes-per-token must be positive"
        );
        for (name, v) in [
            ("--prefill-us-per-token", self.prefill_us_per_token),
            ("--load-us-per-token", self.load_us_per_token),
            ("--decode-ms-per-token", self.decode_ms_per_token),
            ("--kv-transfer-gbps", self.kv_transfer_gbps),
        ] {
            anyhow::ensure!(
                v.is_finite() && v >= 0.0,
                "{name} must be a non-negative number"
            );
        }
        Ok(())
    }

    pub fn cost(&self) -> cost::CostModel {
        cost::CostModel {
            prefill_us_per_token: self.prefill_us_per_token,
            load_us_per_token: self.load_us_per_token,
            decode_ms_per_token: self.decode_ms_per_token,
            kv_transfer_gbps: self.kv_transfer_gbps,
        }
    }
}

pub fn run(args: SimEngineArgs) -> anyhow::Result<()> {
    args.validate()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(server::serve(args))
}
