//! How every role starts and stops, the same way for all of them:
//!
//! ```text
//! let listeners = Listeners::bind(&config)?;          // or port-0 sockets bound by a test
//! let handle = role::start(config, listeners, shutdown)?;
//! handle.addrs                                        // where it actually listens
//! handle.stop()?                                      // or wait() until the shutdown token fires
//! ```
//!
//! `run(config)` is that, with the listeners bound from the config and the process's signal
//! token. A role started by a launcher (see `crate::launch`) reports its addresses through the
//! file named by `RBGCTL_READY_FILE` once it serves, so that children can bind port 0 and tell
//! their parent which port they got.

use crate::shutdown::Shutdown;
use serde::Serialize;
use std::net::TcpListener;
use std::path::Path;
use std::thread::JoinHandle;

/// Environment variable naming the file where a role writes its [`Ready`] record.
pub const READY_FILE_ENV: &str = "RBGCTL_READY_FILE";

/// A listener that could not be bound, naming what it was for.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} ({what}): {source}")]
pub struct BindError {
    pub what: &'static str,
    pub addr: String,
    pub source: std::io::Error,
}

/// Connections the kernel queues for a listener until they are accepted (at most
/// `net.core.somaxconn`): thousands of clients reconnecting at once after a failover must not
/// overflow it (an overflowed queue drops their SYNs, and each waits a second to try again).
const BACKLOG: i32 = 4096;

/// Binds `host:port` (port 0: the kernel chooses) for the named purpose.
/// The listener has `SO_REUSEADDR` (as std's) and a queue [`BACKLOG`] long.
pub fn bind(what: &'static str, host: &str, port: u16) -> Result<TcpListener, BindError> {
    let addr = join_host_port(host, port);
    let err = |source| BindError {
        what,
        addr: addr.clone(),
        source,
    };
    let one = |sa: std::net::SocketAddr| -> std::io::Result<TcpListener> {
        let s = socket2::Socket::new(
            socket2::Domain::for_address(sa),
            socket2::Type::STREAM,
            None,
        )?;
        s.set_reuse_address(true)?;
        s.bind(&sa.into())?;
        s.listen(BACKLOG)?;
        Ok(s.into())
    };
    // As std's bind: the first of the name's addresses that binds.
    let mut last = std::io::Error::from(std::io::ErrorKind::AddrNotAvailable);
    for sa in std::net::ToSocketAddrs::to_socket_addrs(&addr).map_err(err)? {
        match one(sa) {
            Ok(l) => return Ok(l),
            Err(e) => last = e,
        }
    }
    Err(err(last))
}

fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The address of an optional listener.
pub fn local_addr(l: Option<&TcpListener>) -> std::io::Result<Option<std::net::SocketAddr>> {
    l.map(TcpListener::local_addr).transpose()
}

/// What a started role writes to `RBGCTL_READY_FILE`.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct Ready<A> {
    pub role: String,
    pub pid: u32,
    pub addrs: A,
}

/// Announces that `role` serves at `addrs`, if a launcher asked (atomically: written to a
/// temporary file, then renamed, so a reader never sees half of it).
pub fn announce<A: Serialize>(role: &str, addrs: &A) {
    let Some(path) = std::env::var_os(READY_FILE_ENV) else {
        return;
    };
    let record = Ready {
        role: role.to_string(),
        pid: std::process::id(),
        addrs,
    };
    if let Err(e) = write_atomically(Path::new(&path), &record) {
        tracing::warn!(path = %Path::new(&path).display(), error = %e, "cannot write the ready file");
    }
}

fn write_atomically<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let body = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, body)?;
    std::fs::rename(&tmp, path)
}

/// A running role: where it listens, its shutdown token, and the thread that runs it.
/// Dropping the handle stops the role and waits for it.
pub struct Handle<A, E> {
    pub addrs: A,
    shutdown: Shutdown,
    thread: Option<JoinHandle<Result<(), E>>>,
}

impl<A, E: Send + 'static> Handle<A, E> {
    /// Runs `body` on a thread named `name`; `body` returns when `shutdown` fires (or on error).
    pub fn spawn(
        name: &str,
        addrs: A,
        shutdown: Shutdown,
        body: impl FnOnce() -> Result<(), E> + Send + 'static,
    ) -> std::io::Result<Self> {
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(body)?;
        Ok(Handle {
            addrs,
            shutdown,
            thread: Some(thread),
        })
    }

    /// What stops the role.
    pub fn shutdown(&self) -> &Shutdown {
        &self.shutdown
    }

    /// True once the role has stopped (by itself, on error, or asked to).
    pub fn finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Waits until the role stops by itself or its token fires.
    pub fn wait(mut self) -> Result<(), E> {
        self.join()
    }

    /// Fires the token and waits until the role has stopped.
    pub fn stop(mut self) -> Result<(), E> {
        self.shutdown.trigger();
        self.join()
    }

    fn join(&mut self) -> Result<(), E> {
        match self.thread.take().map(JoinHandle::join) {
            None => Ok(()),
            Some(Ok(r)) => r,
            Some(Err(panic)) => std::panic::resume_unwind(panic),
        }
    }
}

impl<A, E> Drop for Handle<A, E> {
    fn drop(&mut self) {
        self.shutdown.trigger();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Builds the multi-threaded tokio runtime a role runs its async parts on.
pub fn runtime(name: &str, workers: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        b.worker_threads(n);
    }
    b.thread_name(name).enable_all().build()
}

/// Hands a bound std listener to tokio.
pub fn async_listener(l: TcpListener) -> std::io::Result<tokio::net::TcpListener> {
    l.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(l)
}

/// A runtime for one thread of a thread-per-core role: everything spawned on it stays on the
/// thread that runs it.
pub fn thread_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Lifts this process's soft limit on open files toward `want` (up to the hard limit), for a
/// server that may hold thousands of connections or a bench that opens them.
pub fn raise_open_files_limit(want: u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let target = want.min(hard);
        if target > soft {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, target, hard) {
                tracing::warn!(want = target, soft, error = %e, "cannot raise the open files limit");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_handle_stops_its_role() {
        let s = Shutdown::new();
        let seen = s.clone();
        let h: Handle<(), std::io::Error> = Handle::spawn("t", (), s.clone(), move || {
            seen.sleep(std::time::Duration::from_secs(60));
            Ok(())
        })
        .unwrap();
        assert!(!h.finished());
        drop(h);
        assert!(s.is_triggered());
    }

    #[test]
    fn bind_names_what_failed() {
        let taken = bind("rpc", "127.0.0.1", 0).unwrap();
        let port = taken.local_addr().unwrap().port();
        let e = bind("metrics", "127.0.0.1", port).unwrap_err();
        assert!(e.to_string().contains("metrics"), "{e}");
        assert!(e.to_string().contains(&port.to_string()), "{e}");
    }
}
