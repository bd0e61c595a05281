//! An event loop's epoll instance and its waker, as plain system calls (rustix): no libc
//! wrapper around each wait (which marks a cancellation point, costing as many instructions
//! as the call itself), no token bookkeeping beyond the number each watch carries.
//!
//! Watches are edge-triggered: a socket is reported when bytes arrive (or room to write
//! appears), and the loop reads until it has all that came.

use rustix::event::{epoll, eventfd, EventfdFlags};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

/// Events taken from the kernel in one wait, at most.
pub(super) const EVENTS: usize = 1024;

pub(super) struct Epoll {
    fd: OwnedFd,
}

/// What one wait reported: the number each ready watch carries.
pub(super) type Events = Vec<epoll::Event>;

fn interest(writable: bool) -> epoll::EventFlags {
    let read = epoll::EventFlags::IN | epoll::EventFlags::RDHUP | epoll::EventFlags::ET;
    match writable {
        true => read | epoll::EventFlags::OUT,
        false => read,
    }
}

impl Epoll {
    pub(super) fn new() -> io::Result<Epoll> {
        Ok(Epoll {
            fd: epoll::create(epoll::CreateFlags::CLOEXEC)?,
        })
    }

    /// Reports `source` (readable, and writable too if `writable`) as `token`.
    pub(super) fn watch(&self, source: impl AsFd, token: u64, writable: bool) -> io::Result<()> {
        let data = epoll::EventData::new_u64(token);
        Ok(epoll::add(&self.fd, source, data, interest(writable))?)
    }

    /// Changes what `source` is reported for.
    pub(super) fn rewatch(&self, source: impl AsFd, token: u64, writable: bool) -> io::Result<()> {
        let data = epoll::EventData::new_u64(token);
        Ok(epoll::modify(&self.fd, source, data, interest(writable))?)
    }

    pub(super) fn unwatch(&self, source: impl AsFd) -> io::Result<()> {
        Ok(epoll::delete(&self.fd, source)?)
    }

    /// Waits up to `timeout` for events, which replace what `events` held.
    pub(super) fn wait(&self, events: &mut Events, timeout: Duration) -> io::Result<()> {
        events.clear();
        let timeout = rustix::time::Timespec {
            tv_sec: timeout.as_secs() as _,
            tv_nsec: timeout.subsec_nanos() as _,
        };
        let spare = rustix::buffer::spare_capacity(events);
        epoll::wait(&self.fd, spare, Some(&timeout))?;
        Ok(())
    }
}

/// Wakes a loop from another thread: an eventfd its epoll watches.
pub(super) struct Waker {
    fd: OwnedFd,
}

impl Waker {
    /// A waker `epoll` reports as `token`.
    pub(super) fn new(epoll: &Epoll, token: u64) -> io::Result<Waker> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        epoll.watch(&fd, token, false)?;
        Ok(Waker { fd })
    }

    pub(super) fn wake(&self) -> io::Result<()> {
        match rustix::io::write(&self.fd, &1u64.to_ne_bytes()) {
            Ok(_) => Ok(()),
            // The count is at its most: a wake is pending already; reset it and wake again.
            Err(rustix::io::Errno::AGAIN) => {
                self.reset();
                self.wake()
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Takes the wakes so far (the loop, once woken): each later wake is a new event.
    pub(super) fn reset(&self) {
        let mut count = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_socket_and_a_waker_are_reported_by_their_tokens() {
        let epoll = Epoll::new().unwrap();
        let waker = Waker::new(&epoll, u64::MAX).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        epoll.watch(&server, 7, false).unwrap();
        let mut events = Vec::with_capacity(EVENTS);
        let tokens =
            |events: &Events| -> Vec<u64> { events.iter().map(|e| e.data.u64()).collect() };

        epoll.wait(&mut events, Duration::ZERO).unwrap();
        assert_eq!(tokens(&events), Vec::<u64>::new(), "nothing came yet");
        client.write_all(b"x").unwrap();
        epoll.wait(&mut events, Duration::from_secs(10)).unwrap();
        assert_eq!(tokens(&events), [7]);
        // Edge-triggered: the same unread byte is not reported again.
        epoll.wait(&mut events, Duration::ZERO).unwrap();
        assert!(events.is_empty());

        // Many wakes before the loop looks are one event; a wake after a reset is another.
        for _ in 0..3 {
            waker.wake().unwrap();
        }
        epoll.wait(&mut events, Duration::from_secs(10)).unwrap();
        assert_eq!(tokens(&events), [u64::MAX]);
        waker.reset();
        waker.wake().unwrap();
        epoll.wait(&mut events, Duration::from_secs(10)).unwrap();
        assert_eq!(tokens(&events), [u64::MAX]);

        // Watching for room to write reports at once (the socket has room); unwatched, nothing.
        epoll.rewatch(&server, 8, true).unwrap();
        epoll.wait(&mut events, Duration::from_secs(10)).unwrap();
        assert_eq!(tokens(&events), [8]);
        epoll.unwatch(&server).unwrap();
        // (Loopback delivers before `write` returns: a watched socket is ready by now.)
        client.write_all(b"y").unwrap();
        epoll.wait(&mut events, Duration::ZERO).unwrap();
        assert!(events.is_empty());
    }
}
