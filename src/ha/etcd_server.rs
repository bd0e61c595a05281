//! Real etcd members on loopback, for the HA tests and `rbgctl bench failover`: the `etcd`
//! program (Debian's `etcd-server`, or `RBGCTL_ETCD`), each member with its own data directory
//! and kernel-chosen ports, killed with the cluster.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The etcd program: `RBGCTL_ETCD`, else `etcd` on the PATH or in `/usr/bin`.
pub fn etcd_program() -> Option<PathBuf> {
    if let Some(p) = crate::config::env_var("RBGCTL_ETCD") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
}

/// Why the etcd members could not be started.
#[derive(Debug, thiserror::Error)]
pub enum EtcdServerError {
    #[error("the etcd program was not found (install Debian's etcd-server, or set RBGCTL_ETCD)")]
    NotInstalled,
    #[error("etcd: {0}")]
    Io(#[from] std::io::Error),
    #[error("etcd member {name} did not become healthy within {waited:?}; its log:\n{log}")]
    NotHealthy {
        name: String,
        waited: Duration,
        log: String,
    },
}

/// One member.
pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    data: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Member {
    /// The member's client address.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The member's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the member's process runs.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The arguments of one etcd member named `name`, keeping its data in `data`, serving clients
/// at URL `client` and peers at `peer`, in a new cluster of `initial_cluster`
/// (`name=peer-url,…`). Elections inside etcd are quick, so a lost member costs little.
pub fn member_args(
    name: &str,
    data: &Path,
    client: &str,
    peer: &str,
    initial_cluster: &str,
) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = vec!["--name".into(), name.into()];
    args.extend(["--data-dir".into(), data.as_os_str().to_owned()]);
    for (flag, value) in [
        ("--listen-client-urls", client),
        ("--advertise-client-urls", client),
        ("--listen-peer-urls", peer),
        ("--initial-advertise-peer-urls", peer),
        ("--initial-cluster", initial_cluster),
        ("--initial-cluster-state", "new"),
        ("--initial-cluster-token", "rbgctl-test"),
        ("--heartbeat-interval", "50"),
        ("--election-timeout", "500"),
    ] {
        args.extend([flag.into(), value.into()]);
    }
    args
}

/// A cluster of members started together.
pub struct EtcdCluster {
    program: PathBuf,
    pub members: Vec<Member>,
    initial_cluster: String,
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl EtcdCluster {
    /// Starts `n` members with their data and logs under `dir`, and waits until each answers
    /// `/health`.
    pub fn start(n: usize, dir: &Path) -> Result<EtcdCluster, EtcdServerError> {
        let program = etcd_program().ok_or(EtcdServerError::NotInstalled)?;
        std::fs::create_dir_all(dir)?;
        let mut members = Vec::new();
        for i in 0..n.max(1) {
            let name = format!("etcd-{i}");
            members.push(Member {
                data: dir.join(format!("{name}.data")),
                log: dir.join(format!("{name}.log")),
                name,
                client_port: free_port()?,
                peer_port: free_port()?,
                child: None,
            });
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            program,
            members,
            initial_cluster,
        };
        for i in 0..cluster.members.len() {
            cluster.spawn(i)?;
        }
        for i in 0..cluster.members.len() {
            cluster.wait_healthy(i, Duration::from_secs(30))?;
        }
        Ok(cluster)
    }

    /// `h1:port;h2:port` of every member.
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(Member::endpoint)
            .collect::<Vec<_>>()
            .join(";")
    }

    fn spawn(&mut self, i: usize) -> Result<(), EtcdServerError> {
        let m = &self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)?;
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let child = Command::new(&self.program)
            .args(member_args(
                &m.name,
                &m.data,
                &client,
                &peer,
                &self.initial_cluster,
            ))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.members[i].child = Some(child);
        Ok(())
    }

    /// Waits until member `i` answers `/health` with `true`.
    pub fn wait_healthy(&self, i: usize, within: Duration) -> Result<(), EtcdServerError> {
        let m = &self.members[i];
        let url = format!("http://127.0.0.1:{}/health", m.client_port);
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let ok = http
                .get(&url)
                .send()
                .and_then(|r| r.text())
                .is_ok_and(|t| t.contains("\"health\":\"true\""));
            if ok {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(EtcdServerError::NotHealthy {
            name: m.name.clone(),
            waited: within,
            log: tail(&m.log, 2000),
        })
    }

    /// Kills member `i` (SIGKILL); its data stays for a restart.
    pub fn kill(&mut self, i: usize) {
        self.members[i].kill();
    }

    /// Starts member `i` again on its data and ports.
    pub fn restart(&mut self, i: usize) -> Result<(), EtcdServerError> {
        // A member that comes back finds its cluster in its data directory.
        self.members[i].kill();
        self.spawn(i)?;
        self.wait_healthy(i, Duration::from_secs(30))
    }

    /// Sends `sig` to member `i`.
    pub fn signal(&self, i: usize, sig: nix::sys::signal::Signal) {
        if let Some(pid) = self.members[i].pid() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            m.kill();
        }
    }
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(n);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[start..].to_string()
}
