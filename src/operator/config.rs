//! The operator's settings: one struct, read from `--config FILE` (TOML), with the flags (and
//! `RBGCTL_OPERATOR_NAMESPACE`) over it, by the rule every role follows (`config::layered`).

use crate::config::{layered, ConfigError};
pub use crate::operator::gang::Scheduler;
use clap::Args;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

crate::config::settings::settings! {
    /// The operator's settings, from its flags, environment and TOML file.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct OperatorConfig;

    /// The operator's flags: each setting of [`OperatorConfig`] under the same name, given or
    /// not.
    #[serde_with::skip_serializing_none]
    #[derive(Debug, Clone, Default, Args, Serialize)]
    pub struct OperatorArgs {
        /// TOML file with the operator's settings (the flags below win over it).
        #[arg(long, env = "RBGCTL_OPERATOR_CONFIG")]
        #[serde(skip)]
        pub config: Option<PathBuf>,
    }

    settings {
        /// Watch only this namespace. Default: all namespaces.
        #[arg(long, env = "RBGCTL_OPERATOR_NAMESPACE")]
        namespace: Option<String> = None;
        /// Kubeconfig file. Default: the in-cluster service account, else $KUBECONFIG or
        /// ~/.kube/config.
        #[arg(long)]
        kubeconfig: Option<PathBuf> = None;
        /// Group reconciles running at once (different groups only); scaling adapters and
        /// group sets have two workers each.
        #[arg(long)]
        workers: usize = 4;
        /// Reconcile every group this often even without changes, in seconds (0: never).
        #[arg(long)]
        resync_secs: u64 = 300;
        /// Writes per second to the API server (token bucket; 0: unlimited).
        #[arg(long)]
        kube_api_qps: f64 = 50.0;
        /// Writes allowed at once before `kube_api_qps` applies (client-go's burst).
        #[arg(long)]
        kube_api_burst: f64 = 100.0;
        /// Seconds after which an in-place update the kubelet has not confirmed (new image
        /// running, Ready) is reported, in an event and the group's `InPlaceUpdatesConfirmed`
        /// condition.
        #[arg(long)]
        inplace_timeout_secs: u64 = 300;
        /// Take part in leader election (only the Lease holder acts).
        #[arg(long)]
        leader_elect: bool = true;
        /// Name of the Lease the replicas elect a leader with.
        #[arg(long)]
        lease_name: String = "rbgctl-operator".into();
        /// Namespace of the Lease. Default: the operator's own namespace.
        #[arg(long)]
        lease_namespace: Option<String> = None;
        /// How long a Lease holds without renewal, in seconds; a standby takes over after it.
        #[arg(long)]
        lease_duration_secs: u64 = 15;
        /// This replica's name in the Lease. Default: hostname and pid.
        #[arg(long)]
        identity: Option<String> = None;
        /// Serves /metrics, /health (and /healthz, /readyz) here; 0 picks a free port, as for
        /// every role (announced through `RBGCTL_READY_FILE`).
        #[arg(long)]
        metrics_port: u16 = 8081;
        /// Address of the metrics server.
        #[arg(long)]
        metrics_host: String = "0.0.0.0".into();
        /// Server-side timeout asked of each watch, in seconds.
        #[arg(long)]
        watch_timeout_secs: u64 = 290;
        /// The scheduler whose PodGroups gang-scheduled groups get: `scheduler-plugins`
        /// (`scheduling.x-k8s.io`) or `volcano` (`scheduling.volcano.sh`).
        #[arg(long)]
        scheduler_name: Scheduler = Scheduler::default();
    }
}

crate::config::settings::named_setting!(Scheduler);

impl OperatorConfig {
    /// Refuses settings that cannot run together, naming the setting to fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, v) in [
            ("operator.kube_api_qps", self.kube_api_qps),
            ("operator.kube_api_burst", self.kube_api_burst),
        ] {
            if !v.is_finite() {
                return Err(ConfigError::invalid(
                    field,
                    format!("must be a number, got {v}"),
                ));
            }
        }
        if self.lease_name.is_empty() {
            return Err(ConfigError::invalid(
                "operator.lease_name",
                "must not be empty",
            ));
        }
        Ok(())
    }
}

impl OperatorArgs {
    /// The flags over the config file over the defaults, validated.
    pub fn resolve(&self) -> Result<OperatorConfig, ConfigError> {
        let cfg: OperatorConfig = layered(self.config.as_deref(), self)?;
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::scratch::ScratchFile;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: OperatorArgs,
    }

    fn parse(argv: &[&str]) -> OperatorArgs {
        Cli::try_parse_from(std::iter::once("operator").chain(argv.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn every_stated_default_is_the_real_one() {
        let checked = crate::config::settings::check_stated_defaults(OperatorArgs::resolve);
        assert!(checked >= 12, "{checked}");
    }

    #[test]
    fn a_flag_wins_over_the_file_which_wins_over_the_default() {
        let file = ScratchFile::new(
            "operator.toml",
            "workers = 9\nlease_name = \"from-file\"\nresync_secs = 0\n",
        );
        let cfg = parse(&[
            "--config",
            &file.arg(),
            "--workers",
            "2",
            "--leader-elect",
            "false",
        ])
        .resolve()
        .unwrap();
        assert_eq!(cfg.workers, 2, "the flag");
        assert_eq!(cfg.lease_name, "from-file", "the file");
        assert_eq!(cfg.resync_secs, 0, "the file, even where it says 0");
        assert!(!cfg.leader_elect, "the flag");
        assert_eq!(cfg.metrics_port, 8081, "the default");
        assert_eq!(parse(&[]).resolve().unwrap(), OperatorConfig::default());
    }

    #[test]
    fn every_flag_is_checked_to_name_a_setting() {
        let n = crate::config::check_flags_name_settings::<OperatorArgs, OperatorConfig>(
            &["config"],
            &[],
        );
        assert_eq!(n, 16);
    }

    /// The check finds a flag that names no setting (here: the operator's flags against the
    /// SIMULATED engine's settings).
    #[test]
    #[should_panic(expected = "names no setting")]
    fn a_flag_naming_no_setting_is_found() {
        crate::config::check_flags_name_settings::<OperatorArgs, crate::engine::EngineConfig>(
            &["config"],
            &[],
        );
    }

    #[test]
    fn every_flag_names_a_setting() {
        let all = OperatorArgs {
            config: None,
            namespace: Some("ns".into()),
            kubeconfig: Some("/k".into()),
            workers: Some(1),
            resync_secs: Some(1),
            kube_api_qps: Some(1.0),
            kube_api_burst: Some(1.0),
            inplace_timeout_secs: Some(1),
            leader_elect: Some(false),
            lease_name: Some("l".into()),
            lease_namespace: Some("ln".into()),
            lease_duration_secs: Some(1),
            identity: Some("me".into()),
            metrics_port: Some(1),
            metrics_host: Some("h".into()),
            watch_timeout_secs: Some(1),
            scheduler_name: Some(Scheduler::Volcano),
        };
        let cfg = all.resolve().unwrap();
        assert_eq!(cfg.identity.as_deref(), Some("me"));
        assert_eq!(cfg.watch_timeout_secs, 1);
        assert_eq!(cfg.scheduler_name, Scheduler::Volcano);
        assert_eq!(cfg.kubeconfig, Some(PathBuf::from("/k")));
    }

    #[test]
    fn bad_files_and_values_name_what_to_fix() {
        let file = ScratchFile::new("operator.toml", "workerz = 9\n");
        let e = parse(&["--config", &file.arg()])
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(e.contains("workerz") && e.contains("line 1"), "{e}");
        let e = parse(&["--kube-api-qps", "NaN"])
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("operator.kube_api_qps"), "{e}");
    }
}
