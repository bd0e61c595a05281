//! Redis beside the pool: `bench store --redis-server PATH` starts that `redis-server` on
//! loopback (nothing saved, nothing appended) and runs the small-value single-client phases
//! against it the way `redis-benchmark -c 1 -d SIZE -t set,get` does: one connection, one
//! request in flight, `SET` of new keys then `GET` of each. Its rows (case `redis`, ops `put`
//! and `get`) stand beside the pool's one-thread TCP rows of the same size.

use super::stats::PhaseResult;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What to run against the server.
pub struct RedisPlan<'a> {
    pub server: &'a Path,
    /// Value sizes (each at most [`MAX_VALUE`]); a phase per operation and size.
    pub sizes: &'a [u64],
    pub phase_time: Duration,
    pub phase_ops: u64,
}

/// Largest value measured: Redis is the peer for small values only.
pub const MAX_VALUE: u64 = 64 << 10;
/// Longest wait for the server to answer its first `PING`.
const START_WAIT: Duration = Duration::from_secs(10);
/// Longest wait for any reply.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// A running `redis-server`, killed (and its directory removed) when dropped.
struct Server {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Server {
    fn start(path: &Path) -> anyhow::Result<Server> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = std::env::temp_dir().join(format!(
            "rbgctl-redis-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir(&dir)?;
        let mut cmd = Command::new(path);
        cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        crate::launch::bound_to_this_process(&mut cmd);
        let child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                anyhow::bail!("cannot run {}: {e}", path.display());
            }
        };
        let mut server = Server { child, dir, port };
        let t0 = Instant::now();
        loop {
            if let Some(status) = server.child.try_wait()? {
                anyhow::bail!("{} exited at start ({status})", path.display());
            }
            if let Ok(mut c) = Conn::open(server.port) {
                if c.ping().is_ok() {
                    return Ok(server);
                }
            }
            anyhow::ensure!(
                t0.elapsed() < START_WAIT,
                "{} did not answer PING within {} s",
                path.display(),
                START_WAIT.as_secs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One client connection speaking RESP.
struct Conn {
    w: TcpStream,
    r: BufReader<TcpStream>,
    line: String,
}

impl Conn {
    fn open(port: u16) -> std::io::Result<Conn> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(Conn {
            r: BufReader::with_capacity(256 << 10, s.try_clone()?),
            w: s,
            line: String::new(),
        })
    }

    /// Sends one command, its arguments as RESP bulk strings, in one write.
    fn send(&mut self, buf: &mut Vec<u8>, args: &[&[u8]]) -> std::io::Result<()> {
        buf.clear();
        write!(buf, "*{}\r\n", args.len())?;
        for a in args {
            write!(buf, "${}\r\n", a.len())?;
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
        self.w.write_all(buf)
    }

    /// The next reply's first line, without its `\r\n`.
    fn reply_line(&mut self) -> std::io::Result<&str> {
        self.line.clear();
        if self.r.read_line(&mut self.line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(self.line.trim_end())
    }

    fn ping(&mut self) -> anyhow::Result<()> {
        self.send(&mut Vec::new(), &[b"PING"])?;
        let line = self.reply_line()?;
        anyhow::ensure!(line == "+PONG", "PING answered {line:?}");
        Ok(())
    }

    fn set(&mut self, buf: &mut Vec<u8>, key: &[u8], value: &[u8]) -> anyhow::Result<()> {
        self.send(buf, &[b"SET", key, value])?;
        let line = self.reply_line()?;
        anyhow::ensure!(line == "+OK", "SET answered {line:?}");
        Ok(())
    }

    /// `GET key` into `dst` (whose length is the value's): answers whether the key was there.
    fn get(&mut self, buf: &mut Vec<u8>, key: &[u8], dst: &mut [u8]) -> anyhow::Result<bool> {
        self.send(buf, &[b"GET", key])?;
        let line = self.reply_line()?;
        if line == "$-1" {
            return Ok(false);
        }
        let len: usize = line
            .strip_prefix('$')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("GET answered {line:?}"))?;
        anyhow::ensure!(
            len == dst.len(),
            "GET answered {len} bytes, not {}",
            dst.len()
        );
        self.r.read_exact(dst)?;
        let mut end = [0u8; 2];
        self.r.read_exact(&mut end)?;
        anyhow::ensure!(&end == b"\r\n", "a bulk reply without its end");
        Ok(true)
    }
}

/// Runs the phases; answers the rows (case `redis`).
pub fn run(plan: &RedisPlan<'_>) -> anyhow::Result<Vec<PhaseResult>> {
    let server = Server::start(plan.server)?;
    let mut conn = Conn::open(server.port)?;
    let mut buf = Vec::with_capacity(MAX_VALUE as usize + 128);
    let mut rows = Vec::new();
    for &size in plan.sizes.iter().filter(|&&s| s <= MAX_VALUE) {
        let value: Vec<u8> = (0..size).map(|i| (i * 13 + size) as u8).collect();
        let key = |i: u64| format!("bench-store/{size}/{i}");
        let t0 = Instant::now();
        let mut lat = Vec::new();
        while (lat.len() as u64) < plan.phase_ops && t0.elapsed() < plan.phase_time {
            let start = Instant::now();
            conn.set(&mut buf, key(lat.len() as u64).as_bytes(), &value)?;
            lat.push(start.elapsed());
        }
        let written = lat.len() as u64;
        rows.push(row("put", size, lat, t0.elapsed()));
        let mut dst = vec![0u8; size as usize];
        let t0 = Instant::now();
        let mut lat = Vec::with_capacity(written as usize);
        for i in 0..written {
            let start = Instant::now();
            anyhow::ensure!(
                conn.get(&mut buf, key(i).as_bytes(), &mut dst)?,
                "redis lost key {i} of {written}"
            );
            lat.push(start.elapsed());
        }
        anyhow::ensure!(dst == value, "redis answered other bytes than were set");
        rows.push(row("get", size, lat, t0.elapsed()));
        conn.send(&mut buf, &[b"FLUSHALL"])?;
        conn.reply_line()?;
    }
    drop(server);
    Ok(rows)
}

fn row(op: &str, size: u64, lat: Vec<Duration>, elapsed: Duration) -> PhaseResult {
    PhaseResult::from_samples("redis", op, size, 1, lat, 1, 0, elapsed)
}
