//! A worker's answer relayed to the client frame by frame as the worker sends it: data frames
//! already received merged into one, a stream cut by its worker (or by a failed companion leg)
//! ended with an SSE error event, never a hang; the request's load and permit held until the
//! last frame is sent.

use super::{MERGE_BYTES, MERGE_FRAMES};
use crate::router::limiter::Slot;
use crate::router::proxy::BoxError;
use crate::router::request::error_body;
use crate::router::tenants::usage::OutputCount;
use crate::router::upstream::{UpstreamBody, UpstreamError};
use crate::router::worker::{LoadGuard, Worker};
use crate::router::Router;
use bytes::{Bytes, BytesMut};

use http_body::{Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Everything a request holds until its response body has been sent (its queued prefill only
/// until the first byte).
pub(crate) struct Held {
    pub(crate) _load: Vec<LoadGuard>,
    pub(crate) slot: Option<Slot>,
}

/// A leg the relayed answer depends on that is still running (vLLM Mooncake's prefill, sent
/// beside its decode): the reason it failed, if it does. The answer ends after it.
pub(crate) type Companion = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// A worker's response body, relayed frame by frame.
pub(super) struct Relay {
    /// `None` once whole, or cut (dropping it unfinished closes the worker's connection: the
    /// request is cancelled).
    inner: Option<UpstreamBody>,
    /// Watched while the body is relayed: its failure cuts the answer at once.
    companion: Option<Companion>,
    /// What the worker's body gave after the data merged into the last frame: handed out next.
    stash: Option<Option<Result<Frame<Bytes>, UpstreamError>>>,
    sse: bool,
    done: bool,
    worker: Arc<Worker>,
    router: Arc<Router>,
    /// The answer's output tokens, counted for a tenant's ticket.
    output: Option<OutputCount>,
    held: Held,
}

impl Drop for Relay {
    fn drop(&mut self) {
        let ticket = self.held.slot.as_ref().and_then(Slot::ticket);
        if let (Some(count), Some(ticket)) = (&self.output, ticket) {
            ticket.output_tokens(count.tokens());
        }
    }
}

impl Relay {
    /// Ends the answer with `msg`: an SSE error event, or a body error (the status line is
    /// gone already).
    fn cut(
        &mut self,
        status: u16,
        kind: &str,
        msg: String,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.done = true;
        self.inner = None;
        if self.sse {
            let event = format!("data: {}\n\n", error_body(status, kind, &msg));
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
        } else {
            Poll::Ready(Some(Err(msg.into())))
        }
    }
}

impl http_body::Body for Relay {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(leg) = this.companion.as_mut() {
            match leg.as_mut().poll(cx) {
                Poll::Pending => {}
                Poll::Ready(Ok(())) => this.companion = None,
                Poll::Ready(Err(reason)) => {
                    this.companion = None;
                    this.router
                        .metrics
                        .vllm_pd_legs_cancelled
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(worker = %this.worker.url, %reason, "the other leg failed: answer cut");
                    return this.cut(502, "prefill_server_error", reason);
                }
            }
        }
        // The answer ends once it is whole and the leg it depends on has succeeded (which
        // keeps that leg's resources within the client's request).
        let Some(inner) = this.inner.as_mut() else {
            return match this.companion {
                Some(_) => Poll::Pending,
                None => {
                    this.done = true;
                    Poll::Ready(None)
                }
            };
        };
        let polled = match this.stash.take() {
            Some(r) => Poll::Ready(r),
            None => Pin::new(&mut *inner).poll_frame(cx),
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                let first = match frame.into_data() {
                    Ok(d) => d,
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                };
                // Data the worker has sent already goes out with it: one write, not several
                // (an SSE stream's events often come together).
                let mut merged: Option<BytesMut> = None;
                for _ in 0..MERGE_FRAMES {
                    let size = merged.as_ref().map_or(first.len(), |m| m.len());
                    if size >= MERGE_BYTES {
                        break;
                    }
                    match Pin::new(&mut *inner).poll_frame(cx) {
                        Poll::Pending => break,
                        Poll::Ready(Some(Ok(f))) if f.is_data() => {
                            let m = merged.get_or_insert_with(|| BytesMut::from(&first[..]));
                            if let Ok(d) = f.into_data() {
                                m.extend_from_slice(&d);
                            }
                        }
                        Poll::Ready(other) => {
                            this.stash = Some(other);
                            break;
                        }
                    }
                }
                let data = merged.map_or(first, BytesMut::freeze);
                // The first byte: the worker's prefill of this request is done.
                for load in &mut this.held._load {
                    load.prefilled();
                }
                if let Some(count) = this.output.as_mut() {
                    count.frame(&data);
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Poll::Ready(None) => {
                this.inner = None;
                if this.companion.is_some() {
                    // Polled above: it wakes this body when it ends.
                    return Poll::Pending;
                }
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                this.router
                    .metrics
                    .stream_errors
                    .fetch_add(1, Ordering::Relaxed);
                this.worker.record_outcome(&this.router.cfg.breaker, false);
                tracing::warn!(worker = %this.worker.url, error = %e, "worker cut the response");
                if this.sse {
                    let msg = format!(
                        "worker {} closed the stream before it ended: {e}",
                        this.worker.url
                    );
                    this.cut(502, "upstream_error", msg)
                } else {
                    this.done = true;
                    Poll::Ready(Some(Err(Box::new(e))))
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
            || (self.companion.is_none()
                && self.stash.is_none()
                && self.inner.as_ref().is_none_or(|i| i.is_end_stream()))
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map(|i| i.size_hint())
            .unwrap_or_default()
    }
}

impl Relay {
    /// Relays `inner` for `worker` (`sse`: the answer is an event stream), holding `held` until
    /// the last frame and watching `companion` meanwhile.
    pub(super) fn new(
        inner: UpstreamBody,
        sse: bool,
        worker: Arc<Worker>,
        router: Arc<Router>,
        held: Held,
        companion: Option<Companion>,
    ) -> Relay {
        Relay {
            inner: Some(inner),
            companion,
            stash: None,
            sse,
            done: false,
            worker,
            router,
            output: held
                .slot
                .as_ref()
                .and_then(Slot::ticket)
                .map(|_| OutputCount::default()),
            held,
        }
    }
}
