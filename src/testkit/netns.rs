//! Hosts of their own for the fault tests. Each host is a network namespace with one address
//! on a bridge that lives in a switch namespace of its own, so the processes on a host see a
//! real network: their own address, the kernel's TCP, and links that fail.
//!
//! Links are broken in the switch, where both ends see only silence, as on a real network:
//! - `cut(a, b)` drops every packet between two hosts, `isolate(a)` between a host and all;
//! - `lossy(a, percent)` drops that share of the packets to and from a host, at random;
//! - `delay(a, d)` holds a host's outgoing packets with `tc netem`, where the kernel has it
//!   (`NetError::Unsupported` otherwise).
//!
//! Everything is made inside namespaces the harness creates and deletes when dropped; the
//! addresses are from 198.18.0.0/15 (RFC 2544's benchmarking range) and exist only in them,
//! so nothing touches the machine's own network. Where namespaces cannot be made (no root, no
//! `ip`, no `nft`), `Net::new` says so with `NetError::Unavailable` and tests skip.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Why a network namespace or its fault could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// This machine cannot make network namespaces here: tests skip with this reason.
    #[error("network namespaces are not available here: {0}")]
    Unavailable(String),
    /// The kernel lacks what one kind of fault needs.
    #[error("not supported by this kernel: {0}")]
    Unsupported(String),
    #[error("`{command}` failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("no host {0:?} in this network")]
    NoSuchHost(String),
}

/// One host: its namespace, address and port on the switch.
#[derive(Clone, Debug)]
pub struct Host {
    pub name: String,
    /// The network namespace's name (`ip netns exec NS ...`).
    pub ns: String,
    pub addr: Ipv4Addr,
}

/// A network of hosts on one switch.
pub struct Net {
    switch: String,
    hosts: Vec<Host>,
    /// Lossy hosts and their loss in percent.
    loss: parking_lot::Mutex<Vec<(Ipv4Addr, u8)>>,
}

/// Namespaces made by this process so far (their names carry it with the pid).
static NEXT_NET: AtomicU32 = AtomicU32::new(0);

/// Runs `ip`, `nft` or `tc` and fails with its error output.
fn run(program: &str, args: &[&str]) -> Result<(), NetError> {
    run_input(program, args, None)
}

fn run_input(program: &str, args: &[&str], input: Option<&str>) -> Result<(), NetError> {
    use std::io::Write;
    let command = format!("{program} {}", args.join(" "));
    let failed = |stderr: String| NetError::Command {
        command: command.clone(),
        stderr,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| failed(e.to_string()))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| failed(e.to_string()))?;
    if !out.status.success() {
        return Err(failed(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(())
}

/// Runs `program args` inside namespace `ns`.
fn run_in_ns(ns: &str, program: &str, args: &[&str]) -> Result<(), NetError> {
    let mut all = vec!["netns", "exec", ns, program];
    all.extend_from_slice(args);
    run("ip", &all)
}

/// Why namespaces cannot be made here, if they cannot.
fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("the tests do not run as root".into());
    }
    for program in ["ip", "nft"] {
        let found = Command::new(program)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!(
                "`{program}` is not installed (Debian: iproute2, nftables)"
            ));
        }
    }
    None
}

impl Net {
    /// Makes a switch and one host per name, host `i` at 198.18.0.(i+1), each reachable from
    /// every other.
    pub fn new(names: &[&str]) -> Result<Net, NetError> {
        if let Some(why) = unavailable() {
            return Err(NetError::Unavailable(why));
        }
        let tag = format!(
            "rbg{}x{}",
            std::process::id(),
            NEXT_NET.fetch_add(1, Ordering::Relaxed)
        );
        let switch = format!("{tag}-sw");
        let mut net = Net {
            switch: switch.clone(),
            hosts: Vec::new(),
            loss: Default::default(),
        };
        // From here on, Drop removes whatever was made.
        if let Err(e) = run("ip", &["netns", "add", &switch]) {
            return Err(NetError::Unavailable(e.to_string()));
        }
        run_in_ns(&switch, "ip", &["link", "add", "br0", "type", "bridge"])?;
        run_in_ns(&switch, "ip", &["link", "set", "br0", "up"])?;
        run_input(
            "ip",
            &["netns", "exec", &switch, "nft", "-f", "-"],
            Some(SWITCH_RULES),
        )?;
        for (i, name) in names.iter().enumerate() {
            let ns = format!("{tag}-h{i}");
            run("ip", &["netns", "add", &ns])?;
            net.hosts.push(Host {
                name: name.to_string(),
                ns: ns.clone(),
                addr: Ipv4Addr::new(198, 18, 0, i as u8 + 1),
            });
            let port = format!("p{i}");
            // Made in the switch, one end moved to the host as eth0.
            run_in_ns(
                &switch,
                "ip",
                &[
                    "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns,
                ],
            )?;
            run_in_ns(&switch, "ip", &["link", "set", &port, "master", "br0"])?;
            run_in_ns(&switch, "ip", &["link", "set", &port, "up"])?;
            let cidr = format!("198.18.0.{}/24", i + 1);
            run_in_ns(&ns, "ip", &["addr", "add", &cidr, "dev", "eth0"])?;
            run_in_ns(&ns, "ip", &["link", "set", "eth0", "up"])?;
            run_in_ns(&ns, "ip", &["link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// The hosts, in the order given.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The host named `name`.
    pub fn host(&self, name: &str) -> Result<&Host, NetError> {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .ok_or_else(|| NetError::NoSuchHost(name.to_string()))
    }

    /// The address of the host named `name`.
    pub fn addr(&self, name: &str) -> Result<Ipv4Addr, NetError> {
        Ok(self.host(name)?.addr)
    }

    /// The words that run a command on `name`: `ip netns exec NS`.
    pub fn prefix(&self, name: &str) -> Result<Vec<String>, NetError> {
        Ok(vec![
            "ip".into(),
            "netns".into(),
            "exec".into(),
            self.host(name)?.ns.clone(),
        ])
    }

    /// `program` to run on host `name`.
    pub fn command(
        &self,
        name: &str,
        program: impl AsRef<std::ffi::OsStr>,
    ) -> Result<Command, NetError> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.host(name)?.ns])
            .arg(program);
        Ok(cmd)
    }

    /// Runs `f` on a thread inside host `name`'s namespace (sockets it opens are that host's)
    /// and returns what it returns.
    pub fn run_on<T: Send + 'static>(
        &self,
        name: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, NetError> {
        let path = Path::new("/var/run/netns").join(&self.host(name)?.ns);
        let file = std::fs::File::open(&path).map_err(|e| NetError::Command {
            command: format!("open {}", path.display()),
            stderr: e.to_string(),
        })?;
        let joined = std::thread::spawn(move || {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| e.to_string())?;
            Ok::<T, String>(f())
        })
        .join();
        match joined {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(NetError::Command {
                command: "setns".into(),
                stderr: e,
            }),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// Drops every packet between `a` and `b`, both ways, until `join(a, b)`.
    pub fn cut(&self, a: &str, b: &str) -> Result<(), NetError> {
        self.pair_set("add", a, b)
    }

    /// Undoes `cut(a, b)`.
    pub fn join(&self, a: &str, b: &str) -> Result<(), NetError> {
        self.pair_set("delete", a, b)
    }

    fn pair_set(&self, verb: &str, a: &str, b: &str) -> Result<(), NetError> {
        let (a, b) = (self.addr(a)?, self.addr(b)?);
        let elements = format!("{{ {a} . {b}, {b} . {a} }}");
        self.nft(&format!("{verb} element bridge rbg cut {elements}"))
    }

    /// Drops every packet to and from `name`, until `rejoin(name)`.
    pub fn isolate(&self, name: &str) -> Result<(), NetError> {
        let a = self.addr(name)?;
        self.nft(&format!("add element bridge rbg isolated {{ {a} }}"))
    }

    /// Undoes `isolate(name)`.
    pub fn rejoin(&self, name: &str) -> Result<(), NetError> {
        let a = self.addr(name)?;
        self.nft(&format!("delete element bridge rbg isolated {{ {a} }}"))
    }

    /// Drops `percent` of the packets to and from `name` at random (0 restores the link).
    pub fn lossy(&self, name: &str, percent: u8) -> Result<(), NetError> {
        let a = self.addr(name)?;
        let mut loss = self.loss.lock();
        loss.retain(|(addr, _)| *addr != a);
        if percent > 0 {
            loss.push((a, percent.min(100)));
        }
        let mut script = String::from("flush chain bridge rbg loss\n");
        for (addr, p) in loss.iter() {
            for dir in ["saddr", "daddr"] {
                script.push_str(&format!(
                    "add rule bridge rbg loss ip {dir} {addr} numgen random mod 100 < {p} drop\n"
                ));
            }
        }
        run_input(
            "ip",
            &["netns", "exec", &self.switch, "nft", "-f", "-"],
            Some(&script),
        )
    }

    /// Holds every packet `name` sends for `by` (`tc netem`); `Duration::ZERO` restores the
    /// link. `NetError::Unsupported` where the kernel has no netem.
    pub fn delay(&self, name: &str, by: Duration) -> Result<(), NetError> {
        let ns = self.host(name)?.ns.clone();
        if by.is_zero() {
            let _ = run_in_ns(&ns, "tc", &["qdisc", "del", "dev", "eth0", "root"]);
            return Ok(());
        }
        let ms = format!("{}ms", by.as_millis());
        match run_in_ns(
            &ns,
            "tc",
            &[
                "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", &ms,
            ],
        ) {
            Err(NetError::Command { stderr, .. }) if stderr.contains("qdisc kind is unknown") => {
                Err(NetError::Unsupported(
                    "tc netem (sch_netem): this kernel was built without it".into(),
                ))
            }
            other => other,
        }
    }

    fn nft(&self, command: &str) -> Result<(), NetError> {
        let args: Vec<&str> = command.split(' ').collect();
        run_in_ns(&self.switch, "nft", &args)
    }
}

/// The switch's filter: frames between hosts are dropped when their pair is cut, one end is
/// isolated, or by chance on a lossy host's link. Cuts and isolation are sets, so they come and
/// go without touching the rules; the `loss` chain is rewritten whenever a host's loss changes.
const SWITCH_RULES: &str = "
table bridge rbg {
    set cut { type ipv4_addr . ipv4_addr; }
    set isolated { type ipv4_addr; }
    chain loss {
    }
    chain forward {
        type filter hook forward priority 0; policy accept;
        ip saddr . ip daddr @cut drop
        ip saddr @isolated drop
        ip daddr @isolated drop
        jump loss
    }
}
";

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of each veth, and with it the other end.
        for h in &self.hosts {
            let _ = run("ip", &["netns", "del", &h.ns]);
        }
        let _ = run("ip", &["netns", "del", &self.switch]);
    }
}
