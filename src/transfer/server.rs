//! The serving side: an accept loop and one thread per connection running frames through a
//! `Service`. Blocking threads rather than async tasks because a data-plane connection carries one
//! request at a time and the spin-poll (see `stream`) needs a thread of its own; connections are
//! few (a pool per client), and `max_connections` bounds them.

use super::frame::{Header, Opcode, Status};
use super::message::Wire;
use super::stream::FramedStream;
use super::TransferError;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// What a server does with each request.
pub trait Service: Send + Sync + 'static {
    /// Handles one request: consumes its payload and writes exactly one reply through `io`.
    /// A `Protocol` error replies `MALFORMED_FRAME` and closes the connection.
    fn handle(
        &self,
        req: &Header,
        op: Opcode,
        meta: &[u8],
        io: &mut ServerIo<'_>,
    ) -> Result<(), TransferError>;
    /// Largest payload a request may carry.
    fn max_data_len(&self) -> u64;
    /// Called for every connection closed because of bad input (for metrics).
    fn on_bad_frame(&self) {}
}

/// A request's view of its connection.
pub struct ServerIo<'a> {
    stream: &'a mut FramedStream,
    req: Header,
    replied: bool,
}

impl ServerIo<'_> {
    pub fn data_len(&self) -> u64 {
        self.req.data_len
    }

    pub fn read_data_into(&mut self, dst: &mut [u8]) -> Result<(), TransferError> {
        self.stream.read_data_into(dst)
    }

    pub fn discard_data(&mut self) -> Result<(), TransferError> {
        self.stream.discard_data()
    }

    /// Sends the reply: status, meta, and a payload written straight from `data`.
    pub fn reply(
        &mut self,
        status: Status,
        meta: &[u8],
        data: &[&[u8]],
    ) -> Result<(), TransferError> {
        if self.replied {
            return Err(TransferError::Protocol(
                "second reply to one request".into(),
            ));
        }
        self.replied = true;
        let data_len = data.iter().map(|d| d.len() as u64).sum();
        let header = Header::response(&self.req, status, meta.len(), data_len);
        self.stream.write_frame(&header, meta, data)
    }

    pub fn ok<T: Wire>(&mut self, msg: &T) -> Result<(), TransferError> {
        self.reply(Status::Ok, &msg.to_meta(), &[])
    }

    /// An error reply; the message travels as the meta (UTF-8 text).
    pub fn error(&mut self, status: Status, message: &str) -> Result<(), TransferError> {
        self.reply(status, message.as_bytes(), &[])
    }
}

#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub max_connections: usize,
    pub spin: Duration,
    /// Used in thread names and logs.
    pub role: &'static str,
}

/// A running server; dropping the handle does not stop it, `stop` does.
pub struct ServerHandle {
    pub addr: SocketAddr,
    shutdown: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ServerHandle {
    /// Stops accepting; open connections finish when their peers close them.
    pub fn stop(&mut self) {
        self.shutdown.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn spawn(
    listener: TcpListener,
    service: Arc<dyn Service>,
    opts: ServerOptions,
) -> std::io::Result<ServerHandle> {
    let addr = listener.local_addr()?;
    let shutdown = Arc::new(AtomicBool::new(false));
    let stop = shutdown.clone();
    let thread = std::thread::Builder::new()
        .name(format!("{}-accept", opts.role))
        .spawn(move || accept_loop(listener, service, opts, stop))?;
    Ok(ServerHandle {
        addr,
        shutdown,
        thread: Some(thread),
    })
}

fn accept_loop(
    listener: TcpListener,
    service: Arc<dyn Service>,
    opts: ServerOptions,
    shutdown: Arc<AtomicBool>,
) {
    let active = Arc::new(AtomicUsize::new(0));
    loop {
        let (stream, peer) = match listener.accept() {
            Ok(x) => x,
            Err(e) => {
                if shutdown.load(Ordering::SeqCst) {
                    return;
                }
                tracing::warn!(role = opts.role, error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if shutdown.load(Ordering::SeqCst) {
            return;
        }
        if active.load(Ordering::SeqCst) >= opts.max_connections {
            tracing::warn!(role = opts.role, %peer, limit = opts.max_connections,
                "connection limit reached, refusing connection");
            drop(stream);
            continue;
        }
        active.fetch_add(1, Ordering::SeqCst);
        let service = service.clone();
        let active_conn = active.clone();
        let spin = opts.spin;
        let role = opts.role;
        let spawned = std::thread::Builder::new()
            .name(format!("{role}-conn"))
            .stack_size(512 * 1024)
            .spawn(move || {
                serve_connection(stream, peer, service.as_ref(), spin, role);
                active_conn.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            active.fetch_sub(1, Ordering::SeqCst);
            tracing::error!(role, error = %e, "cannot start a connection thread");
        }
    }
}

fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    service: &dyn Service,
    spin: Duration,
    role: &'static str,
) {
    let mut io = match FramedStream::new(stream, spin) {
        Ok(io) => io,
        Err(e) => {
            tracing::warn!(role, %peer, error = %e, "cannot set up connection");
            return;
        }
    };
    tracing::debug!(role, %peer, "connection opened");
    loop {
        let (req, meta) = match io.read_frame(true) {
            Ok(x) => x,
            Err(TransferError::Closed) => break,
            Err(e) => {
                tracing::warn!(role, %peer, error = %e, "closing connection: bad frame");
                service.on_bad_frame();
                break;
            }
        };
        if let Err(reason) = check_request(&req, service.max_data_len()) {
            tracing::warn!(role, %peer, %reason, "closing connection: bad frame");
            service.on_bad_frame();
            let header = Header::response(&req, Status::MalformedFrame, reason.len(), 0);
            let _ = io.write_frame(&header, reason.as_bytes(), &[]);
            break;
        }
        let Some(op) = Opcode::from_u8(req.opcode) else {
            // Unknown operation: answer and keep the connection (the frame itself was sound).
            if io.discard_data().is_err() {
                break;
            }
            let msg = format!("unknown opcode 0x{:02x} for the {role}", req.opcode);
            let header = Header::response(&req, Status::UnknownOpcode, msg.len(), 0);
            if io.write_frame(&header, msg.as_bytes(), &[]).is_err() {
                break;
            }
            continue;
        };
        let mut sio = ServerIo {
            stream: &mut io,
            req,
            replied: false,
        };
        match service.handle(&req, op, &meta, &mut sio) {
            Ok(()) if sio.replied && sio.stream.pending_data() == 0 => {}
            Ok(()) => {
                tracing::error!(role, %peer, op = op.name(), "handler left the request unanswered");
                break;
            }
            Err(TransferError::Protocol(reason)) => {
                tracing::warn!(role, %peer, op = op.name(), %reason, "closing connection: malformed request");
                service.on_bad_frame();
                if !sio.replied {
                    let _ = sio.error(Status::MalformedFrame, &reason);
                }
                break;
            }
            Err(e) => {
                tracing::debug!(role, %peer, op = op.name(), error = %e, "connection ended");
                break;
            }
        }
    }
    tracing::debug!(role, %peer, "connection closed");
}

fn check_request(req: &Header, max_data_len: u64) -> Result<(), String> {
    if req.is_response() {
        return Err("a response frame sent to a server".into());
    }
    if req.data_len > max_data_len {
        return Err(format!(
            "payload of {} bytes exceeds this server's limit of {max_data_len}",
            req.data_len
        ));
    }
    Ok(())
}
