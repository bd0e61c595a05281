//! A thread per connection, each request read, served and answered on it with blocking
//! reads that spin first (`FramedStream`): what the store's data port runs, where a connection
//! carries one large transfer at a time and the spin saves a wake-up per request.

use super::handshake::{bad_header_answer, check_request, unknown_opcode, Handshake, Step};
use super::{ConnCounters, ConnLogs, ServerIo, ServerOptions, Service, Sink};
use crate::transfer::frame::{Header, Opcode, Status};
use crate::transfer::stream::FramedStream;
use crate::transfer::TransferError;
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

pub(super) fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    service: &dyn Service,
    opts: &ServerOptions,
    logs: &ConnLogs,
    slot: &super::admission::Slot,
) {
    let role = opts.role;
    let mut io = match FramedStream::new(stream, opts.spin) {
        Ok(io) => io,
        Err(e) => {
            tracing::warn!(role, %peer, error = %e, "cannot set up connection");
            return;
        }
    };
    // The first request must come soon; later ones may wait out an idle pooled connection.
    if let Err(e) = io.set_server_waits(opts.request_timeout, opts.request_timeout) {
        tracing::warn!(role, %peer, error = %e, "cannot set up connection");
        return;
    }
    let mut first = true;
    let mut waits_idle = false;
    let opened = Instant::now();
    let mut handshake = Handshake::new(opts.auth.clone());
    let mut attached: Option<Box<dyn std::any::Any + Send>> = None;
    let bad_frame = |reason: &dyn std::fmt::Display| {
        ConnCounters::count(&service.connections().bad_frames);
        if let Some(n) = logs.bad_frames.spend(Instant::now()) {
            tracing::warn!(role, %peer, %reason, bad_frames = n, "closing connection: bad frame");
        }
    };
    tracing::debug!(role, %peer, "connection opened");
    loop {
        // Until it proves the secret, a connection has `request_timeout` in all; then the
        // waits of a pooled connection (idle between requests).
        if !handshake.proven {
            let left = opts.request_timeout.saturating_sub(opened.elapsed());
            if left.is_zero() || io.set_server_waits(left, left).is_err() {
                ConnCounters::count(&service.connections().unauthenticated);
                tracing::debug!(role, %peer, "closing a connection that did not prove the secret in time");
                break;
            }
        } else if !first && !waits_idle {
            waits_idle = true;
            if io
                .set_server_waits(opts.idle_timeout, opts.request_timeout)
                .is_err()
            {
                break;
            }
        }
        let (req, meta) = match io.read_frame_within(true, handshake.meta_limit()) {
            Ok(x) => x,
            Err(TransferError::Closed) => break,
            Err(TransferError::Idle) => {
                tracing::debug!(role, %peer, first, "closing idle connection");
                ConnCounters::count(&service.connections().idle_closed);
                break;
            }
            Err(TransferError::Timeout) => {
                ConnCounters::count(&service.connections().bad_frames);
                if let Some(n) = logs.stalls.spend(Instant::now()) {
                    tracing::warn!(role, %peer, timeout = ?opts.request_timeout, stalled = n,
                        "closing connection: a request stopped arriving");
                }
                break;
            }
            Err(e) => {
                bad_frame(&e);
                // A header that did not decode (bad magic or version) still gets its answer,
                // addressed as far as its bytes go, before the connection closes.
                if let Some(raw) = io.take_bad_header() {
                    let reason = e.to_string();
                    let header = bad_header_answer(&raw, &reason);
                    let _ = io.write_frame(&header, reason.as_bytes(), &[]);
                }
                break;
            }
        };
        first = false;
        if let Err(reason) = check_request(&req, service.max_data_len()) {
            bad_frame(&reason);
            let header = Header::response(&req, Status::MalformedFrame, reason.len(), 0);
            let _ = io.write_frame(&header, reason.as_bytes(), &[]);
            break;
        }
        let Some(op) = Opcode::from_u8(req.opcode) else {
            let (status, msg) = unknown_opcode(handshake.proven, req.opcode, role);
            let header = Header::response(&req, status, msg.len(), 0);
            if !handshake.proven {
                let _ = io.write_frame(&header, msg.as_bytes(), &[]);
                ConnCounters::count(&service.connections().unauthenticated);
                break;
            }
            // Unknown operation: answer and keep the connection (the frame itself was sound).
            if io.discard_data().is_err() || io.write_frame(&header, msg.as_bytes(), &[]).is_err() {
                break;
            }
            continue;
        };
        let arrived = Instant::now();
        // A request in hand: this connection does not give way until it is answered.
        slot.active(arrived, true);
        let mut sio = ServerIo::new(Sink::Stream(&mut io), req, &mut attached, true, arrived);
        let step = handshake.step(op, &meta, &mut sio);
        if handshake.proven {
            slot.proven();
        }
        match step {
            Ok(Step::Answered) if sio.pending_data() == 0 => {
                slot.active(Instant::now(), false);
                continue;
            }
            Ok(Step::Answered) => break,
            Ok(Step::Refused(why)) => {
                ConnCounters::count(&service.connections().unauthenticated);
                if let Some(n) = logs.bad_frames.spend(Instant::now()) {
                    tracing::warn!(role, %peer, op = op.name(), refused = n, "closing connection: {why}");
                }
                break;
            }
            Ok(Step::Pass) => {}
            Err(e) => {
                tracing::debug!(role, %peer, error = %e, "connection ended in its handshake");
                break;
            }
        }
        match service.handle(op, &meta, &mut sio) {
            Ok(handled) => match sio.check(&handled) {
                Ok(()) if sio.pending_data() == 0 => slot.active(Instant::now(), false),
                Ok(()) => {
                    tracing::error!(role, %peer, op = op.name(), "the handler left part of the request's payload unread");
                    break;
                }
                Err(why) => {
                    tracing::error!(role, %peer, op = op.name(), "{why}");
                    break;
                }
            },
            Err(TransferError::Protocol(reason)) => {
                bad_frame(&format!("{}: {reason}", op.name()));
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
