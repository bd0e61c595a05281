//! Keep-alive connections to workers: one exchange at a time on each, the response body read
//! by the task that relays it (no connection task, no channel between them), and the
//! connection back in its runtime's pool once the body has ended.

use super::codec::{self, CodecError, Decoded, Framing, Head};
use super::UpstreamError;
use bytes::{Bytes, BytesMut};
use http::Method;
use http_body::{Frame, SizeHint};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// A read asks for at least this much room ...
const READ_MIN: usize = 8 * 1024;
/// ... and up to this much while reads keep filling it (large bodies).
const READ_MAX: usize = 256 * 1024;

/// One connection to a worker.
pub(super) struct Conn {
    io: TcpStream,
    /// Bytes read and not yet parsed.
    buf: BytesMut,
    /// How much room the next read asks for.
    read_size: usize,
}

impl Conn {
    pub(super) async fn open(host: &str, port: u16, timeout: Duration) -> io::Result<Conn> {
        let io = tokio::time::timeout(timeout, TcpStream::connect((host, port)))
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection within {timeout:?}"),
                )
            })??;
        io.set_nodelay(true)?;
        let keepalive = socket2::TcpKeepalive::new().with_time(Duration::from_secs(60));
        socket2::SockRef::from(&io).set_tcp_keepalive(&keepalive)?;
        Ok(Conn {
            io,
            buf: BytesMut::new(),
            read_size: READ_MIN,
        })
    }

    /// Reads what the socket has into the buffer: the count, 0 at the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.buf.reserve(self.read_size);
        let spare = self.buf.spare_capacity_mut();
        let room = spare.len();
        let mut rb = ReadBuf::uninit(spare);
        ready!(Pin::new(&mut self.io).poll_read(cx, &mut rb))?;
        let n = rb.filled().len();
        // SAFETY: `poll_read` initialised and filled the first `n` bytes of the spare
        // capacity, which follow the buffer's length directly.
        unsafe { self.buf.set_len(self.buf.len() + n) };
        self.read_size = match n == room {
            true => (self.read_size * 2).min(READ_MAX),
            false => READ_MIN,
        };
        Poll::Ready(Ok(n))
    }

    /// Sends a request (its head and body in one write when small) and reads the head of its
    /// response.
    pub(super) async fn exchange(
        &mut self,
        head: &[u8],
        body: &Bytes,
        method: &Method,
    ) -> Result<Head, UpstreamError> {
        const JOIN_BELOW: usize = 16 * 1024;
        let written = match body.len() < JOIN_BELOW {
            true if body.is_empty() => self.io.write_all(head).await,
            true => {
                let mut one = Vec::with_capacity(head.len() + body.len());
                one.extend_from_slice(head);
                one.extend_from_slice(body);
                self.io.write_all(&one).await
            }
            false => match self.io.write_all(head).await {
                Ok(()) => self.io.write_all(body).await,
                Err(e) => Err(e),
            },
        };
        written.map_err(UpstreamError::Write)?;
        loop {
            if let Some(head) = codec::parse_response(&mut self.buf, method)? {
                return Ok(head);
            }
            let before = self.buf.len();
            match std::future::poll_fn(|cx| self.poll_fill(cx)).await {
                Ok(0) => {
                    return Err(UpstreamError::Closed {
                        answered: before > 0,
                    })
                }
                Ok(_) => {}
                Err(e) if before == 0 => return Err(UpstreamError::Reset(e)),
                Err(e) => return Err(UpstreamError::Read(e)),
            }
        }
    }

    /// Whether the worker has closed this idle connection (or sent something unasked): a
    /// check of the readiness the reactor has seen, a syscall only if it says readable.
    fn closed(&self) -> bool {
        !matches!(self.io.try_read(&mut [0u8; 1]), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

/// Idle connections of one runtime, by worker address (`host:port`): the newest is reused
/// first, those idle too long or closed by their worker are dropped.
pub(super) struct Pool {
    idle: Mutex<HashMap<Box<str>, VecDeque<Idle>, foldhash::fast::RandomState>>,
    max_per_host: usize,
    idle_timeout: Duration,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

impl Pool {
    pub(super) fn new(max_per_host: usize, idle_timeout: Duration) -> Pool {
        Pool {
            idle: Mutex::default(),
            max_per_host,
            idle_timeout,
        }
    }

    /// An idle connection to `addr` that is still open.
    pub(super) fn take(&self, addr: &str) -> Option<Conn> {
        let now = Instant::now();
        let mut idle = self.idle.lock();
        let list = idle.get_mut(addr)?;
        while let Some(i) = list.pop_back() {
            if now.duration_since(i.since) < self.idle_timeout && !i.conn.closed() {
                return Some(i.conn);
            }
        }
        None
    }

    /// Keeps `conn` for the next request to `addr`; the oldest of them go once too many or
    /// too old.
    pub(super) fn put(&self, addr: &str, mut conn: Conn) {
        // An idle connection holds no large read buffer (one grown for a large body).
        if conn.buf.capacity() > 2 * READ_MIN {
            conn.buf = BytesMut::new();
        }
        conn.read_size = READ_MIN;
        let now = Instant::now();
        let mut idle = self.idle.lock();
        let list = match idle.get_mut(addr) {
            Some(l) => l,
            None => idle.entry(addr.into()).or_default(),
        };
        while list.front().is_some_and(|i| {
            list.len() >= self.max_per_host || now.duration_since(i.since) >= self.idle_timeout
        }) {
            list.pop_front();
        }
        list.push_back(Idle { conn, since: now });
    }

    /// Idle connections held, all workers together.
    #[cfg(test)]
    pub(super) fn idle(&self) -> usize {
        self.idle.lock().values().map(VecDeque::len).sum()
    }
}

/// A response body read off its connection as the relaying task polls it.
pub struct RawBody {
    /// `None` once the body has ended (the connection back in the pool, or closed).
    conn: Option<Conn>,
    framing: Framing,
    keep_alive: bool,
    pool: Arc<Pool>,
    addr: Arc<str>,
}

impl RawBody {
    pub(super) fn new(
        conn: Conn,
        framing: Framing,
        keep_alive: bool,
        pool: Arc<Pool>,
        addr: Arc<str>,
    ) -> RawBody {
        let mut body = RawBody {
            conn: Some(conn),
            framing,
            keep_alive,
            pool,
            addr,
        };
        if body.framing.is_done() {
            body.finish();
        }
        body
    }

    /// The body has ended: the connection goes back to the pool if it can carry another
    /// exchange.
    fn finish(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.keep_alive && conn.buf.is_empty() {
                self.pool.put(&self.addr, conn);
            }
        }
    }
}

impl http_body::Body for RawBody {
    type Data = Bytes;
    type Error = UpstreamError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        let this = &mut *self;
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match this.framing.decode(&mut conn.buf) {
                Ok(Decoded::Data(data)) => {
                    if this.framing.is_done() {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Decoded::End) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Decoded::NeedMore) => {}
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(CodecError::from(e).into())));
                }
            }
            match ready!(conn.poll_fill(cx)) {
                Ok(0) => {
                    this.conn = None;
                    return match this.framing.at_eof() {
                        Ok(()) => Poll::Ready(None),
                        Err(e) => Poll::Ready(Some(Err(CodecError::from(e).into()))),
                    };
                }
                Ok(_) => {}
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(UpstreamError::Read(e))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none() && (self.framing.is_done() || self.framing == Framing::UntilClose)
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// A worker that answers each request on a connection with `answer`, then closes the
    /// connection after `answers` of them.
    async fn worker(
        answer: &'static [u8],
        answers: usize,
    ) -> (u16, tokio::task::JoinHandle<usize>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut served = 0;
            let mut buf = vec![0u8; 4096];
            while served < answers {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                s.write_all(answer).await.unwrap();
                served += 1;
            }
            served
        });
        (port, task)
    }

    /// A GET on a new connection to the worker at `port`: its pool, address and body.
    async fn answered(port: u16) -> (Arc<Pool>, Arc<str>, RawBody) {
        let pool = Arc::new(Pool::new(8, Duration::from_secs(60)));
        let mut conn = Conn::open("127.0.0.1", port, Duration::from_secs(5))
            .await
            .unwrap();
        let head = get(&mut conn).await;
        let addr: Arc<str> = format!("127.0.0.1:{port}").into();
        let body = RawBody::new(
            conn,
            head.framing,
            head.keep_alive,
            pool.clone(),
            addr.clone(),
        );
        (pool, addr, body)
    }

    async fn get(conn: &mut Conn) -> Head {
        conn.exchange(
            b"GET / HTTP/1.1\r\nhost: w\r\n\r\n",
            &Bytes::new(),
            &Method::GET,
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn a_connection_goes_back_to_the_pool_only_once_its_body_is_read() {
        let (port, _w) = worker(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
            2,
        )
        .await;
        let (pool, addr, body) = answered(port).await;
        assert_eq!(pool.idle(), 0, "not before the body is read");
        assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"hi");
        assert_eq!(pool.idle(), 1);
        let mut again = pool.take(&addr).expect("the connection is reused");
        assert_eq!(get(&mut again).await.status, 200);
    }

    #[tokio::test]
    async fn a_connection_its_worker_closed_is_not_reused() {
        let (port, w) = worker(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", 1).await;
        let (pool, addr, body) = answered(port).await;
        assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"ok");
        assert_eq!(w.await.unwrap(), 1, "the worker closed its end");
        // The close reaches the reactor: wait for the idle connection to read as closed.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let closed = {
                let idle = pool.idle.lock();
                idle[&*addr][0].conn.closed()
            };
            if closed || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(pool.take(&addr).is_none());
        assert_eq!(pool.idle(), 0);
    }

    #[tokio::test]
    async fn a_body_dropped_unread_closes_its_connection() {
        let (port, _w) = worker(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", 1).await;
        let pool = Arc::new(Pool::new(8, Duration::from_secs(60)));
        let mut conn = Conn::open("127.0.0.1", port, Duration::from_secs(5))
            .await
            .unwrap();
        let head = get(&mut conn).await;
        let body = RawBody::new(
            conn,
            head.framing,
            head.keep_alive,
            pool.clone(),
            "a".into(),
        );
        drop(body);
        assert_eq!(pool.idle(), 0);
    }

    #[test]
    fn the_pool_keeps_the_newest_within_its_bound() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = l.local_addr().unwrap().port();
            let pool = Pool::new(2, Duration::from_secs(60));
            let mut peers = Vec::new();
            for _ in 0..3 {
                let c = Conn::open("127.0.0.1", port, Duration::from_secs(5))
                    .await
                    .unwrap();
                peers.push(l.accept().await.unwrap());
                pool.put("w", c);
            }
            assert_eq!(pool.idle(), 2);
            assert!(pool.take("w").is_some());
            assert!(pool.take("w").is_some());
            assert!(pool.take("w").is_none());
        });
    }
}
