//! Roles as child processes of this executable, the one way `up`, the benchmarks and the tests
//! start them.
//!
//! A child's command line is built from its role's config struct: the config is written as the
//! role's TOML file into the launcher's run directory and passed with `--config`, so flag
//! spellings live in one place (each role's `Args`). Children bind the ports their config names
//! — port 0 lets the kernel choose, so there is no probe-then-bind race — and report the
//! addresses they got through `RBGCTL_READY_FILE` (see `crate::role`). A restarted child is
//! given the addresses it had, so its clients find it again.

mod pool;

pub use pool::{Dir, Pool, PoolError, PoolSpec};

use crate::role::{Ready, READY_FILE_ENV};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Environment variables a child must not inherit: they would override its config file.
const CONFIG_ENV_PREFIXES: &[&str] = &[
    "MOONCAKE_",
    "RBGCTL_MASTER_",
    "RBGCTL_STORE_",
    "RBGCTL_ROUTER_",
    "RBGCTL_OPERATOR_",
    READY_FILE_ENV,
];

/// Bytes of a child's log quoted in an error.
const LOG_TAIL: usize = 4000;

/// Why a role's process could not be started or did not come up.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("{name}: {source}")]
    Io {
        name: String,
        source: std::io::Error,
    },
    #[error("{name}: cannot write its config: {reason}")]
    Config { name: String, reason: String },
    #[error("{name} exited before it was ready ({status}){log}")]
    Exited {
        name: String,
        status: ExitStatus,
        log: String,
    },
    #[error("{name} was not ready within {timeout:?}{log}")]
    Timeout {
        name: String,
        timeout: Duration,
        log: String,
    },
}

/// A role that can run as a child: its subcommand, config and the addresses it reports.
pub trait Launchable {
    /// The subcommand.
    const ROLE: &'static str;
    type Config: Serialize + Clone;
    type Addrs: DeserializeOwned + Clone + std::fmt::Debug;
    /// Binds `cfg` to the addresses a previous run got, so that a restart keeps them.
    fn pin(cfg: &mut Self::Config, addrs: &Self::Addrs);
    /// Gives back to `cfg` the addresses that `first` (the config as first given) left to the
    /// kernel and that a restart may take anew when another process holds them now (ports
    /// its clients find it again by, as an engine's KV events through its `/server_info`).
    /// What clients reach it by (its HTTP port) stays pinned. Nothing by default.
    fn loosen(_cfg: &mut Self::Config, _first: &Self::Config) {}
}

/// `rbgctl master`.
pub struct Master;
impl Launchable for Master {
    const ROLE: &'static str = "master";
    type Config = crate::master::config::MasterConfig;
    type Addrs = crate::master::Addrs;
    fn pin(cfg: &mut Self::Config, addrs: &Self::Addrs) {
        cfg.rpc_port = addrs.rpc.port();
        cfg.metrics_port = addrs.metrics.port();
        if let Some(m) = addrs.metadata {
            cfg.http_metadata_server_port = m.port();
        }
        pin_kv_events(
            &mut cfg.kv_events_config,
            addrs.kv_events.as_deref(),
            addrs.kv_events_replay.as_deref(),
        );
    }
}

/// `rbgctl store`.
pub struct Store;
impl Launchable for Store {
    const ROLE: &'static str = "store";
    type Config = crate::store::config::StoreConfig;
    type Addrs = crate::store::Addrs;
    fn pin(cfg: &mut Self::Config, addrs: &Self::Addrs) {
        cfg.port = addrs.data.port();
        cfg.metrics_port = addrs.metrics.port();
        if let Some(disk) = addrs.disk {
            cfg.disk_tier_port = disk.port();
        }
    }
}

/// `rbgctl router`.
pub struct Router;
impl Launchable for Router {
    const ROLE: &'static str = "router";
    type Config = crate::router::config::RouterConfig;
    type Addrs = crate::router::Addrs;
    fn pin(cfg: &mut Self::Config, addrs: &Self::Addrs) {
        cfg.server.port = addrs.http.port();
        if let Some(m) = addrs.metrics {
            cfg.metrics.prometheus_port = m.port();
        }
    }
}

/// `rbgctl operator`.
pub struct Operator;
impl Launchable for Operator {
    const ROLE: &'static str = "operator";
    type Config = crate::operator::OperatorConfig;
    type Addrs = crate::operator::Addrs;
    fn pin(cfg: &mut Self::Config, addrs: &Self::Addrs) {
        if let Some(m) = addrs.metrics {
            cfg.metrics_port = m.port();
        }
    }
}

/// `rbgctl sim-engine`.
pub struct Engine;
impl Launchable for Engine {
    const ROLE: &'static str = "sim-engine";
    type Config = crate::engine::EngineConfig;
    type Addrs = crate::engine::Addrs;
    fn pin(cfg: &mut Self::Config, addrs: &Self::Addrs) {
        cfg.port = addrs.http.port();
        if let Some(b) = addrs.bootstrap {
            cfg.disaggregation_bootstrap_port = Some(b.port());
        }
        pin_kv_events(
            &mut cfg.kv_events_config,
            addrs.kv_events.as_deref(),
            addrs.kv_events_replay.as_deref(),
        );
    }
    fn loosen(cfg: &mut Self::Config, first: &Self::Config) {
        // The router reads where an engine publishes from its /server_info, each time the
        // engine comes back: the ports need not be the same.
        cfg.kv_events_config = first.kv_events_config.clone();
    }
}

/// A child's KV events endpoints as its first start bound them, so that a restart publishes
/// where its subscribers (the router) already follow it.
fn pin_kv_events(config: &mut Option<String>, bound: Option<&str>, replay: Option<&str>) {
    if let (Some(json), Some(endpoint)) = (config.as_deref(), bound) {
        *config = Some(crate::kv_events::config::pinned(json, endpoint, replay));
    }
}

/// Where a child's stdout and stderr go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logs {
    /// This process's standard error, each line prefixed with the child's name (`rbgctl up`).
    Inherit,
    /// Nowhere; children log warnings only (benchmarks).
    Null,
    /// `<run dir>/<name>.log`, quoted in errors (tests).
    File,
}

struct Context {
    exe: PathBuf,
    dir: PathBuf,
    /// Remove `dir` when the launcher goes.
    owned: bool,
    logs: Logs,
    ready_timeout: Duration,
    /// Numbers the children, so that each has files of its own.
    seq: std::sync::atomic::AtomicU64,
}

impl Drop for Context {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Starts children; owns the run directory their config, ready and log files live in.
#[derive(Clone)]
pub struct Launcher {
    ctx: Arc<Context>,
    /// Words the children's command lines start with (`ip netns exec NS`), if any.
    wrapper: Arc<[String]>,
}

impl Launcher {
    /// A launcher of this executable with a fresh run directory under the system's temp dir,
    /// removed when the launcher and its children are gone.
    pub fn new(logs: Logs) -> std::io::Result<Launcher> {
        let exe = std::env::current_exe()?;
        Launcher::with_exe(exe, logs)
    }

    /// A launcher of `exe` (the tests' `CARGO_BIN_EXE_rbgctl`).
    pub fn with_exe(exe: PathBuf, logs: Logs) -> std::io::Result<Launcher> {
        let dir = std::env::temp_dir().join(format!(
            "rbgctl-run-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(Launcher {
            ctx: Arc::new(Context {
                exe,
                dir,
                owned: true,
                logs,
                ready_timeout: Duration::from_secs(60),
                seq: std::sync::atomic::AtomicU64::new(0),
            }),
            wrapper: Arc::new([]),
        })
    }

    /// The same launcher (run directory, logs, numbering) whose children run under `wrapper`,
    /// e.g. `ip netns exec NS` to put them on a host of their own. The wrapper must exec the
    /// child in its place, so that signals reach the child itself.
    pub fn wrapped(&self, wrapper: Vec<String>) -> Launcher {
        Launcher {
            ctx: self.ctx.clone(),
            wrapper: wrapper.into(),
        }
    }

    /// The run directory (configs, ready files, logs).
    pub fn dir(&self) -> &Path {
        &self.ctx.dir
    }

    /// Starts `R` with `cfg` and waits until it reports its addresses.
    pub fn spawn<R: Launchable>(
        &self,
        name: &str,
        cfg: R::Config,
    ) -> Result<Child<R>, LaunchError> {
        self.spawn_with_args(name, cfg, &[])
    }

    /// Starts `R` with `cfg` and extra flags after `--config` (flags the config file cannot
    /// say, or a test of the flags themselves).
    pub fn spawn_with_args<R: Launchable>(
        &self,
        name: &str,
        mut config: R::Config,
        extra: &[&str],
    ) -> Result<Child<R>, LaunchError> {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let stem = self.stem(name);
        let first = config.clone();
        let Spawned { process, addrs } = self.run::<R>(name, &stem, &config, &extra)?;
        R::pin(&mut config, &addrs);
        Ok(Child {
            config,
            first,
            addrs,
            process,
            launcher: self.clone(),
            extra,
        })
    }

    /// Writes the config file and runs `R` with it.
    fn run<R: Launchable>(
        &self,
        name: &str,
        stem: &str,
        config: &R::Config,
        extra: &[String],
    ) -> Result<Spawned<R::Addrs>, LaunchError> {
        let path = self.path(stem, "toml");
        let text = toml::to_string(config).map_err(|e| LaunchError::Config {
            name: name.to_string(),
            reason: e.to_string(),
        })?;
        std::fs::write(&path, text).map_err(|source| LaunchError::Io {
            name: name.to_string(),
            source,
        })?;
        let mut argv = vec![
            R::ROLE.to_string(),
            "--config".into(),
            path.display().to_string(),
        ];
        argv.extend(extra.iter().cloned());
        self.spawn_stem(&self.ctx.exe, name, stem, &argv, &[])
    }

    /// Runs this executable with `argv` and waits until it reports its addresses: for
    /// children that have no config file (test kit programs) or whose command line is itself
    /// under test (`mooncake_master --rpc_port=0`).
    pub fn spawn_argv<A: DeserializeOwned>(
        &self,
        name: &str,
        argv: &[String],
    ) -> Result<Spawned<A>, LaunchError> {
        self.spawn_program(&self.ctx.exe, name, argv, &[])
    }

    /// [`Launcher::spawn_argv`] with extra environment variables for the child.
    pub fn spawn_argv_with_env<A: DeserializeOwned>(
        &self,
        name: &str,
        argv: &[String],
        env: &[(&str, &Path)],
    ) -> Result<Spawned<A>, LaunchError> {
        self.spawn_program(&self.ctx.exe, name, argv, env)
    }

    /// Runs `program` (e.g. a link to this executable under another name) with `argv`.
    pub fn spawn_program<A: DeserializeOwned>(
        &self,
        program: &Path,
        name: &str,
        argv: &[String],
        env: &[(&str, &Path)],
    ) -> Result<Spawned<A>, LaunchError> {
        self.spawn_stem(program, name, &self.stem(name), argv, env)
    }

    /// A file stem of its own for a child called `name`.
    fn stem(&self, name: &str) -> String {
        let n = self
            .ctx
            .seq
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let safe: String = name
            .chars()
            .map(
                |c| match c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    true => c,
                    false => '_',
                },
            )
            .collect();
        format!("{safe}-{n}")
    }

    fn spawn_stem<A: DeserializeOwned>(
        &self,
        program: &Path,
        name: &str,
        stem: &str,
        argv: &[String],
        env: &[(&str, &Path)],
    ) -> Result<Spawned<A>, LaunchError> {
        let ready = self.path(stem, "ready.json");
        let mut cmd = self.command(program, stem, &ready)?;
        cmd.args(argv);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().map_err(|source| LaunchError::Io {
            name: name.to_string(),
            source,
        })?;
        let mut forwarders = Vec::new();
        if self.ctx.logs == Logs::Inherit {
            if let Some(out) = child.stdout.take() {
                forwarders.extend(forward_lines(name, out));
            }
            if let Some(err) = child.stderr.take() {
                forwarders.extend(forward_lines(name, err));
            }
        }
        let mut process = Process {
            name: name.to_string(),
            stem: stem.to_string(),
            child: Some(child),
            log: (self.ctx.logs == Logs::File).then(|| self.path(stem, "log")),
            forwarders,
        };
        let addrs = self.wait_ready(name, &ready, &mut process)?;
        Ok(Spawned { process, addrs })
    }

    fn path(&self, stem: &str, ext: &str) -> PathBuf {
        self.ctx.dir.join(format!("{stem}.{ext}"))
    }

    /// The child's command with its environment and log routing; the ready file is cleared.
    fn command(&self, program: &Path, stem: &str, ready: &Path) -> Result<Command, LaunchError> {
        let io = |source| LaunchError::Io {
            name: stem.to_string(),
            source,
        };
        match std::fs::remove_file(ready) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
            _ => {}
        }
        let mut cmd = match self.wrapper.split_first() {
            Some((first, rest)) => {
                let mut cmd = Command::new(first);
                cmd.args(rest).arg(program);
                cmd
            }
            None => Command::new(program),
        };
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if CONFIG_ENV_PREFIXES.iter().any(|p| k.starts_with(p)) {
                cmd.env_remove(k.as_ref());
            }
        }
        cmd.env(READY_FILE_ENV, ready).stdin(Stdio::null());
        bound_to_this_process(&mut cmd);
        // Children log as this process does (`--log-format` is not in their config).
        cmd.env("RBGCTL_LOG_FORMAT", crate::telemetry::log_format().as_str());
        let level = std::env::var("RBGCTL_TEST_LOG").ok();
        match self.ctx.logs {
            Logs::Inherit => {
                cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            }
            Logs::Null => {
                cmd.stdout(Stdio::null()).stderr(Stdio::null());
                cmd.env("RBGCTL_LOG", level.as_deref().unwrap_or("warn"));
            }
            Logs::File => {
                let log = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.path(stem, "log"))
                    .map_err(io)?;
                let err = log.try_clone().map_err(io)?;
                cmd.stdout(log).stderr(err);
                cmd.env("RBGCTL_LOG", level.as_deref().unwrap_or("info"));
                cmd.env("NO_COLOR", "1");
            }
        }
        Ok(cmd)
    }

    /// Polls the ready file until it holds the child's addresses, the child exits, or the
    /// ready timeout passes.
    fn wait_ready<A: DeserializeOwned>(
        &self,
        name: &str,
        ready: &Path,
        process: &mut Process,
    ) -> Result<A, LaunchError> {
        let deadline = Instant::now() + self.ctx.ready_timeout;
        loop {
            if let Ok(bytes) = std::fs::read(ready) {
                if let Ok(r) = serde_json::from_slice::<Ready<A>>(&bytes) {
                    return Ok(r.addrs);
                }
            }
            if let Some(status) = process.exited() {
                // Its last lines (why it exited) are relayed before this error is reported.
                process.drain_output(Duration::from_secs(2));
                return Err(LaunchError::Exited {
                    name: name.to_string(),
                    status,
                    log: log_tail(process),
                });
            }
            if Instant::now() > deadline {
                return Err(LaunchError::Timeout {
                    name: name.to_string(),
                    timeout: self.ctx.ready_timeout,
                    log: log_tail(process),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Makes a child live and die with this process: it gets SIGTERM (its graceful stop) when this
/// process dies, however it dies (`kill -9` included), and it runs in a process group of its
/// own, so that a terminal's Ctrl-C reaches only this process, which then stops each child once.
/// The death signal is tied to the thread that starts the child: children are started from
/// threads that outlive them (the launcher's owner).
pub(crate) fn bound_to_this_process(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    cmd.process_group(0);
    // SAFETY: between fork and exec only async-signal-safe calls (prctl, getppid, kill, getpid).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the death signal was set: it will never come.
            if libc::getppid() != parent {
                libc::kill(libc::getpid(), libc::SIGTERM);
            }
            Ok(())
        });
    }
}

/// Copies a child's output to this process's standard error, a line at a time, until the child
/// closes it. A text line is prefixed with the child's name; a JSON line (`--log-format json`)
/// gets it as its first field, `"role"`, and stays one JSON object.
fn forward_lines(
    name: &str,
    from: impl std::io::Read + Send + 'static,
) -> Option<std::thread::JoinHandle<()>> {
    use std::io::{BufRead, Write};
    let prefix = format!("{name:>9} | ");
    let json_field = format!("{{\"role\":{},", serde_json::Value::from(name));
    let spawned = std::thread::Builder::new()
        .name(format!("log-{name}"))
        .spawn(move || {
            let mut lines = std::io::BufReader::new(from);
            let mut line = Vec::new();
            loop {
                line.clear();
                match lines.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        let mut err = std::io::stderr().lock();
                        match line.strip_prefix(b"{") {
                            Some(rest) if rest.first() == Some(&b'"') => {
                                let _ = err.write_all(json_field.as_bytes());
                                let _ = err.write_all(rest);
                            }
                            _ => {
                                let _ = err.write_all(prefix.as_bytes());
                                let _ = err.write_all(&line);
                            }
                        }
                        if !line.ends_with(b"\n") {
                            let _ = err.write_all(b"\n");
                        }
                    }
                }
            }
        });
    spawned
        .inspect_err(
            |e| tracing::warn!(child = name, error = %e, "cannot forward the child's output"),
        )
        .ok()
}

/// The end of a child's log file, formatted for an error message.
fn log_tail(process: &Process) -> String {
    if process.log.is_none() {
        return String::new();
    }
    let text = process.log();
    let start = text.len().saturating_sub(LOG_TAIL);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    format!("; its log ends:\n{}", &text[start..])
}

/// A child process started by a launcher; killed (and reaped) when dropped.
pub struct Process {
    pub name: String,
    /// Its files in the run directory: `<stem>.toml`, `.ready.json`, `.log`.
    stem: String,
    child: Option<std::process::Child>,
    log: Option<PathBuf>,
    /// Threads relaying its output (with `Logs::Inherit`).
    forwarders: Vec<std::thread::JoinHandle<()>>,
}

/// A child that reported its addresses.
pub struct Spawned<A> {
    pub process: Process,
    pub addrs: A,
}

impl Process {
    /// Waits (at most `within`) until the output of an exited child has been relayed.
    fn drain_output(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.forwarders.iter().all(|f| f.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.forwarders.retain(|f| !f.is_finished());
    }

    /// The process's id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|p| p.id())
    }

    /// The whole log file (with `Logs::File`).
    pub fn log(&self) -> String {
        self.log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    /// SIGKILL, and reaped.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.child.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }

    /// Sends `sig` (SIGSTOP, SIGCONT, ...) without waiting.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(p) = &self.child {
            signal(p, sig);
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited within 5 s. Returns how it exited.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut p = self.child.take()?;
        stop_process(&mut p, &self.name, Duration::from_secs(5))
    }

    /// Sends SIGTERM and waits up to `within` for it to exit by itself.
    pub fn sigterm_exits_within(&mut self, within: Duration) -> Option<ExitStatus> {
        self.signal_exits_within(nix::sys::signal::Signal::SIGTERM, within)
    }

    /// Sends `sig` and waits up to `within` for it to exit by itself.
    pub fn signal_exits_within(
        &mut self,
        sig: nix::sys::signal::Signal,
        within: Duration,
    ) -> Option<ExitStatus> {
        let p = self.child.as_mut()?;
        signal(p, sig);
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = p.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// How it exited, if it has (without waiting).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }
}

/// How long a dropped child has to stop by itself before it is killed.
const DROP_GRACE: Duration = Duration::from_secs(3);

impl Drop for Process {
    /// A graceful stop (SIGTERM; SIGKILL after `DROP_GRACE`), so that a child that owns
    /// children and files (`up`, the benchmarks) takes them along.
    fn drop(&mut self) {
        if let Some(mut p) = self.child.take() {
            // A paused child must run to take its SIGTERM.
            signal(&p, nix::sys::signal::Signal::SIGCONT);
            stop_process(&mut p, &self.name, DROP_GRACE);
        }
    }
}

/// A role started from its config; derefs to its [`Process`].
pub struct Child<R: Launchable> {
    /// The config it runs with, pinned to the addresses it got.
    pub config: R::Config,
    /// The config as first given (ports the kernel was to choose still 0).
    first: R::Config,
    /// Where it listens (as of its last start).
    pub addrs: R::Addrs,
    pub process: Process,
    launcher: Launcher,
    extra: Vec<String>,
}

impl<R: Launchable> Child<R> {
    /// Starts it again (after a kill or stop; a running one is killed first) with its config,
    /// on the same addresses; when that fails and some of them need not be the same
    /// ([`Launchable::loosen`]: another process may hold them now), on new ones for those.
    pub fn start(&mut self) -> Result<(), LaunchError> {
        self.process.kill();
        let (name, stem) = (self.process.name.clone(), self.process.stem.clone());
        let started = self
            .launcher
            .run::<R>(&name, &stem, &self.config, &self.extra);
        let Spawned { process, addrs } = match started {
            Ok(s) => s,
            Err(e) => {
                let mut loose = self.config.clone();
                R::loosen(&mut loose, &self.first);
                let same =
                    serde_json::to_value(&loose).ok() == serde_json::to_value(&self.config).ok();
                if same {
                    return Err(e);
                }
                tracing::warn!(child = %name, error = %e,
                    "could not start again on the same addresses; trying with new ports for those its clients find again");
                let s = self.launcher.run::<R>(&name, &stem, &loose, &self.extra)?;
                self.config = loose;
                s
            }
        };
        R::pin(&mut self.config, &addrs);
        self.process = process;
        self.addrs = addrs;
        Ok(())
    }
}

impl<R: Launchable> std::ops::Deref for Child<R> {
    type Target = Process;
    fn deref(&self) -> &Process {
        &self.process
    }
}

impl<R: Launchable> std::ops::DerefMut for Child<R> {
    fn deref_mut(&mut self) -> &mut Process {
        &mut self.process
    }
}

fn signal(p: &std::process::Child, sig: nix::sys::signal::Signal) {
    if let Ok(pid) = i32::try_from(p.id()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}

/// SIGTERM, then SIGKILL after `grace`; always reaped.
pub fn stop_process(
    p: &mut std::process::Child,
    name: &str,
    grace: Duration,
) -> Option<ExitStatus> {
    signal(p, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    loop {
        match p.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                tracing::warn!(%name, "did not stop in time; killing it");
                let _ = p.kill();
                return p.wait().ok();
            }
        }
    }
}

/// Waits until `GET url` answers 2xx.
pub fn wait_http_ok(url: &str, timeout: Duration) -> Result<(), HttpWaitError> {
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| HttpWaitError {
            url: url.to_string(),
            last: e.to_string(),
        })?;
    let deadline = Instant::now() + timeout;
    loop {
        let last = match http.get(url).send() {
            Ok(r) if r.status().is_success() => return Ok(()),
            Ok(r) => format!("status {}", r.status()),
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            return Err(HttpWaitError {
                url: url.to_string(),
                last,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An HTTP endpoint that did not answer as awaited in time, and what it answered last.
#[derive(Debug, thiserror::Error)]
#[error("{url} did not answer 200 in time (last: {last})")]
pub struct HttpWaitError {
    pub url: String,
    pub last: String,
}
