//! Mooncake Transfer Engine's TCP transport, served by a store into its memory segment, so
//! that Mooncake's clients write and read the replicas the master hands them on rbgctl stores.
//!
//! A connection carries requests one after another, each a 24-byte session header (bytes to
//! move, the absolute address in the target, an opcode: READ 0, WRITE 1, `| 0x80` for protocol
//! v2) followed, for a WRITE, by its bytes. With v2 the server answers an 8-byte status frame:
//! after the bytes of a WRITE are in place, before the bytes of a READ. v1 has no status frames.
//!
//! Addresses are the segment's offsets plus [`SEGMENT_BASE`], the same for every store and
//! across restarts, so an address handed out stays valid for as long as its object does. Every
//! range is checked to lie inside the segment before a byte moves (v2 answers the refusal
//! frame, v1 a close), and a WRITE may not touch an object the store records: Mooncake's
//! transport carries no grant, so it writes only space the master has not given to a
//! committed object (its own puts' ranges, until their `PutEnd` has them recorded).

use crate::transfer::server::{self, ConnCounters, Place, ServerHandle, ServerOptions};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Length of a request's session header.
pub const HEADER_LEN: usize = 24;
/// Where every rbgctl store's segment starts in Mooncake's addresses (never 0: a descriptor
/// with a buffer at 0 is refused by Mooncake's decoder).
pub const SEGMENT_BASE: u64 = 0x1000_0000_0000;
/// The v2 status frame of a request carried out.
pub const STATUS_OK: u64 = 0x4D43_5456_0000_0000;
/// The v2 status frame of a request whose range was refused.
pub const STATUS_REFUSED: u64 = 0x4D43_5456_0000_0001;
const OPCODE_V2: u8 = 0x80;

/// Bytes moved per read or write call on the socket.
const CHUNK: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
}

/// One request's session header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionHeader {
    pub size: u64,
    pub addr: u64,
    pub op: Op,
    /// Protocol v2: status frames.
    pub v2: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TeError {
    #[error("unknown Transfer Engine opcode {0:#04x} (READ is 0, WRITE 1, | 0x80 for v2)")]
    Opcode(u8),
    #[error("a Transfer Engine request of 0 bytes")]
    Empty,
    #[error(
        "range [{addr:#x}, +{size}) is outside this store's segment [{base:#x}, +{len}); \
         Mooncake addresses here are the segment's offsets plus {base:#x}"
    )]
    OutOfSegment {
        addr: u64,
        size: u64,
        base: u64,
        len: u64,
    },
    #[error(
        "range [{addr:#x}, +{size}) holds an object this store records (offset {offset}); \
         a Transfer Engine WRITE may only fill space the master gave a put still in progress"
    )]
    Recorded { addr: u64, size: u64, offset: u64 },
}

impl SessionHeader {
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<SessionHeader, TeError> {
        let size = u64::from_le_bytes(b[0..8].try_into().expect("8"));
        let addr = u64::from_le_bytes(b[8..16].try_into().expect("8"));
        let v2 = b[16] & OPCODE_V2 != 0;
        let op = match b[16] & !OPCODE_V2 {
            0 => Op::Read,
            1 => Op::Write,
            _ => return Err(TeError::Opcode(b[16])),
        };
        Ok(SessionHeader { size, addr, op, v2 })
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&self.size.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16] = match self.op {
            Op::Read => 0,
            Op::Write => 1,
        } | if self.v2 { OPCODE_V2 } else { 0 };
        b
    }

    /// The segment offset the request's range starts at, if all of it lies in a segment of
    /// `len` bytes.
    pub fn offset_in(&self, len: u64) -> Result<u64, TeError> {
        if self.size == 0 {
            return Err(TeError::Empty);
        }
        let out = || TeError::OutOfSegment {
            addr: self.addr,
            size: self.size,
            base: SEGMENT_BASE,
            len,
        };
        let offset = self.addr.checked_sub(SEGMENT_BASE).ok_or_else(out)?;
        match offset.checked_add(self.size) {
            Some(end) if end <= len => Ok(offset),
            _ => Err(out()),
        }
    }
}

/// The segment as the transport reaches it.
pub trait TeSegment: Send + Sync + 'static {
    fn size(&self) -> u64;
    /// The offset of an object recorded over `[offset, offset + len)`, if any.
    fn recorded_over(&self, offset: u64, len: u64) -> Option<u64>;
    /// # Safety
    /// The range was checked against `len`.
    unsafe fn bytes(&self, offset: u64, len: u64) -> &[u8];
    /// # Safety
    /// The range was checked against `len`, and no committed object lies in it.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes_mut(&self, offset: u64, len: u64) -> &mut [u8];
    /// A WRITE of `[offset, offset + len)` begins: what was known of the range is not.
    fn writing(&self, offset: u64, len: u64);
    /// A WRITE of `[offset, offset + len)` is in place; its bytes hash to `crc` (CRC-32C,
    /// worked out as they arrived), so that recording it need not read them again.
    fn wrote(&self, offset: u64, len: u64, crc: u32);
}

/// CRC-32C of ranges the transport wrote whole, by offset, until a seal takes them: a seal
/// of a Mooncake put then reads no byte again. Ranges written over are forgotten.
#[derive(Debug, Default)]
pub struct WrittenHashes {
    by_offset: parking_lot::Mutex<std::collections::BTreeMap<u64, (u64, u32)>>,
}

/// Removes from `m` every range that overlaps `[offset, offset + len)` (the kept ranges never
/// overlap each other, so the walk back from the end stops at the first that ends before).
fn forget_in(m: &mut std::collections::BTreeMap<u64, (u64, u32)>, offset: u64, len: u64) {
    let end = offset.saturating_add(len);
    let overlapping: Vec<u64> = m
        .range(..end)
        .rev()
        .take_while(|(&o, &(l, _))| o.saturating_add(l) > offset)
        .map(|(&o, _)| o)
        .collect();
    for o in overlapping {
        m.remove(&o);
    }
}

/// Ranges whose hashes are kept at most (beyond, all are forgotten: a seal then reads).
const HASHES_KEPT: usize = 1 << 16;

impl WrittenHashes {
    /// Forgets every range that overlaps `[offset, offset + len)`.
    pub fn forget(&self, offset: u64, len: u64) {
        forget_in(&mut self.by_offset.lock(), offset, len);
    }

    pub fn put(&self, offset: u64, len: u64, crc: u32) {
        let mut m = self.by_offset.lock();
        forget_in(&mut m, offset, len);
        if m.len() >= HASHES_KEPT {
            m.clear();
        }
        m.insert(offset, (len, crc));
    }

    /// The hash of exactly `[offset, offset + len)`, if it was written whole (taken).
    pub fn take(&self, offset: u64, len: u64) -> Option<u32> {
        let mut m = self.by_offset.lock();
        match m.get(&offset) {
            Some(&(l, crc)) if l == len => {
                m.remove(&offset);
                Some(crc)
            }
            _ => None,
        }
    }
}

/// What the transport served, for `/metrics` (its connections are counted by the port's
/// admission, `ConnCounters`).
#[derive(Debug, Default)]
pub struct TeStats {
    pub bytes_written: AtomicU64,
    pub bytes_read: AtomicU64,
    pub writes: AtomicU64,
    pub reads: AtomicU64,
    /// Requests refused (out of the segment, over a recorded object, bad opcode).
    pub refused: AtomicU64,
}

/// Serves the transport on `listener` under rbgctl's admission (`opts`: connections in all and
/// per address, the idle one making way, the idle and request timeouts), a thread per
/// connection, each ended within a tick once `stop` is set.
pub fn serve<S: TeSegment>(
    listener: TcpListener,
    segment: Arc<S>,
    (opts, counters): (ServerOptions, Arc<ConnCounters>),
    stats: Arc<TeStats>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<ServerHandle> {
    let timeouts = (opts.idle_timeout, opts.request_timeout);
    server::spawn_foreign(listener, opts, counters, move |stream, peer, place| {
        if let Err(e) = serve_conn(stream, &*segment, timeouts, &stats, (&stop, &place)) {
            tracing::debug!(%peer, error = %e, "Mooncake transfer connection ended");
        }
    })
}

fn serve_conn<S: TeSegment>(
    mut stream: TcpStream,
    segment: &S,
    (idle_timeout, request_timeout): (Duration, Duration),
    stats: &TeStats,
    (stop, place): (&AtomicBool, &Place),
) -> std::io::Result<()> {
    // The socket's timeouts are set once: reads wake every tick to count a stall against
    // its limit (idle between requests, the request timeout inside one) and to see `stop`.
    let tick = request_timeout.min(TICK);
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(tick))?;
    stream.set_write_timeout(Some(request_timeout))?;
    let mut patient = Patient {
        stream: &mut stream,
        tick,
        stop,
    };
    let mut head = [0u8; HEADER_LEN];
    loop {
        place.active(false);
        // The first bytes of a request end the idle wait (usually the whole header at once);
        // the rest of it must come within the request timeout.
        let first = patient.read(&mut head, idle_timeout)?;
        if first == 0 {
            return Ok(());
        }
        place.active(true);
        patient.read_exact(&mut head[first..], request_timeout)?;
        let located = SessionHeader::decode(&head).and_then(|h| {
            let offset = h.offset_in(segment.size())?;
            if h.op == Op::Write {
                if let Some(at) = segment.recorded_over(offset, h.size) {
                    return Err(TeError::Recorded {
                        addr: h.addr,
                        size: h.size,
                        offset: at,
                    });
                }
            }
            Ok((h, offset))
        });
        let (h, offset) = match located {
            Ok(x) => x,
            Err(e) => {
                stats.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "Mooncake transfer request refused");
                if head[16] & OPCODE_V2 != 0 {
                    let _ = patient.stream.write_all(&STATUS_REFUSED.to_le_bytes());
                }
                close_gently(stream);
                return Ok(());
            }
        };
        match h.op {
            Op::Write => {
                segment.writing(offset, h.size);
                // SAFETY: the range lies in the segment and holds no recorded object.
                let dst = unsafe { segment.bytes_mut(offset, h.size) };
                // Each piece the socket gives is hashed at once, while it is still in cache.
                let (mut crc, mut at) = (0, 0);
                while at < dst.len() {
                    let end = dst.len().min(at + CHUNK);
                    match patient.read(&mut dst[at..end], request_timeout)? {
                        0 => return Err(ErrorKind::UnexpectedEof.into()),
                        n => {
                            crc = crc32c::crc32c_append(crc, &dst[at..at + n]);
                            at += n;
                        }
                    }
                }
                segment.wrote(offset, h.size, crc);
                stats.writes.fetch_add(1, Ordering::Relaxed);
                stats.bytes_written.fetch_add(h.size, Ordering::Relaxed);
                if h.v2 {
                    patient.stream.write_all(&STATUS_OK.to_le_bytes())?;
                }
            }
            Op::Read => {
                // SAFETY: the range lies in the segment; the bytes are only read.
                let src = unsafe { segment.bytes(offset, h.size) };
                // v2's status frame and the bytes in one send.
                let status = STATUS_OK.to_le_bytes();
                let status: &[u8] = if h.v2 { &status } else { &[] };
                write_both(patient.stream, status, src)?;
                stats.reads.fetch_add(1, Ordering::Relaxed);
                stats.bytes_read.fetch_add(h.size, Ordering::Relaxed);
            }
        }
    }
}

/// How often a connection's reads wake to count a stall and see whether the store stops.
const TICK: Duration = Duration::from_millis(250);

/// A connection's reads, each stall allowed up to a limit, all ended when the store stops.
struct Patient<'a> {
    stream: &'a mut TcpStream,
    /// The socket's read timeout.
    tick: Duration,
    stop: &'a AtomicBool,
}

impl Patient<'_> {
    /// Reads some bytes into `buf` (0 at the end of the stream), waiting at most `limit` for
    /// the first.
    fn read(&mut self, buf: &mut [u8], limit: Duration) -> std::io::Result<usize> {
        let mut stalled = Duration::ZERO;
        loop {
            match self.stream.read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    stalled += self.tick;
                    if stalled >= limit || self.stop.load(Ordering::Relaxed) {
                        return Err(ErrorKind::TimedOut.into());
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Fills `buf`, each stall allowed up to `limit`.
    fn read_exact(&mut self, buf: &mut [u8], limit: Duration) -> std::io::Result<()> {
        let mut at = 0;
        while at < buf.len() {
            match self.read(&mut buf[at..], limit)? {
                0 => return Err(ErrorKind::UnexpectedEof.into()),
                n => at += n,
            }
        }
        Ok(())
    }
}

/// Writes `a` then `b`, vectored: usually one send for both.
fn write_both(stream: &mut TcpStream, mut a: &[u8], mut b: &[u8]) -> std::io::Result<()> {
    while !a.is_empty() {
        let n = match stream.write_vectored(&[std::io::IoSlice::new(a), std::io::IoSlice::new(b)]) {
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            r => r?,
        };
        if n == 0 {
            return Err(ErrorKind::WriteZero.into());
        }
        let from_a = n.min(a.len());
        a = &a[from_a..];
        b = &b[n - from_a..];
    }
    stream.write_all(b)
}

/// Closes after reading what the peer sent on for a moment (up to 64 KiB), so that the close
/// is not a reset that could discard the refusal frame before the peer read it.
fn close_gently(mut stream: TcpStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let mut scratch = [0u8; 4096];
    for _ in 0..16 {
        if !matches!(stream.read(&mut scratch), Ok(n) if n > 0) {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_and_its_bytes_go_out_whole_and_in_order() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut rx, _) = listener.accept().unwrap();
        // More than a socket's buffers hold: the sends come back short and go on.
        let data: Vec<u8> = (0..(8usize << 20)).map(|i| (i % 251) as u8).collect();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            rx.read_to_end(&mut got).unwrap();
            got
        });
        write_both(&mut tx, &STATUS_OK.to_le_bytes(), &data).unwrap();
        write_both(&mut tx, &[], b"v1: no status").unwrap();
        drop(tx);
        let got = reader.join().unwrap();
        assert_eq!(got[..8], STATUS_OK.to_le_bytes());
        assert_eq!(got[8..8 + data.len()], data[..]);
        assert_eq!(&got[8 + data.len()..], b"v1: no status");
    }

    #[test]
    fn headers_decode_as_captured_from_the_wheel() {
        // captures/http/te_decoded.txt: a 1039-byte v2 WRITE.
        let b: [u8; 24] = [
            0x0f, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xf4, 0x0d, 0x7f, 0, 0, 0x81, 0, 0, 0, 0, 0, 0,
            0,
        ];
        let h = SessionHeader::decode(&b).unwrap();
        assert_eq!(
            h,
            SessionHeader {
                size: 1039,
                addr: 0x7f0d_f400_0000,
                op: Op::Write,
                v2: true
            }
        );
        assert_eq!(h.encode(), b);
        let mut read_v1 = b;
        read_v1[16] = 0;
        assert_eq!(SessionHeader::decode(&read_v1).unwrap().op, Op::Read);
        read_v1[16] = 0x82;
        assert_eq!(SessionHeader::decode(&read_v1), Err(TeError::Opcode(0x82)));
        assert_eq!(
            STATUS_OK.to_le_bytes(),
            [0, 0, 0, 0, 0x56, 0x54, 0x43, 0x4d]
        );
    }

    #[test]
    fn written_hashes_are_taken_once_and_forgotten_when_written_over() {
        let h = WrittenHashes::default();
        h.put(0, 4096, 1);
        h.put(4096, 4096, 2);
        h.put(8192, 4096, 3);
        assert_eq!(h.take(0, 4096), Some(1));
        assert_eq!(h.take(0, 4096), None, "taken once");
        assert_eq!(h.take(4096, 100), None, "another length");
        // A write over the end of one range and the start of the next forgets both.
        h.forget(8000, 400);
        assert_eq!(h.take(4096, 4096), None);
        assert_eq!(h.take(8192, 4096), None);
        h.put(100, 10, 4);
        h.forget(0, 101);
        assert_eq!(h.take(100, 10), None);
        h.put(100, 10, 5);
        h.forget(110, 5);
        assert_eq!(h.take(100, 10), Some(5), "a write just after it leaves it");
    }

    #[test]
    fn a_stalled_read_ends_at_its_limit_and_at_once_when_the_store_stops() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut stream, _) = listener.accept().unwrap();
        let tick = Duration::from_millis(20);
        stream.set_read_timeout(Some(tick)).unwrap();
        let stop = AtomicBool::new(false);
        let mut patient = Patient {
            stream: &mut stream,
            tick,
            stop: &stop,
        };
        // Bytes that come within the limit are read, however they are split.
        peer.write_all(&[1, 2]).unwrap();
        let mut buf = [0u8; 2];
        patient
            .read_exact(&mut buf, Duration::from_secs(5))
            .unwrap();
        assert_eq!(buf, [1, 2]);
        // Nothing more: a stall of 100 ms, then the read gives up.
        let t0 = std::time::Instant::now();
        let e = patient
            .read(&mut buf, Duration::from_millis(100))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut);
        assert!(t0.elapsed() >= Duration::from_millis(100));
        // A store that stops ends a read that could wait an hour, within a tick.
        stop.store(true, Ordering::Relaxed);
        let t0 = std::time::Instant::now();
        let e = patient
            .read(&mut buf, Duration::from_secs(3600))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut);
        assert!(t0.elapsed() < Duration::from_secs(5));
        drop(peer);
    }

    #[test]
    fn every_range_is_checked_against_the_segment() {
        let at = |addr: u64, size: u64| SessionHeader {
            size,
            addr,
            op: Op::Read,
            v2: true,
        };
        let len = 4096;
        assert_eq!(at(SEGMENT_BASE, 4096).offset_in(len), Ok(0));
        assert_eq!(at(SEGMENT_BASE + 4000, 96).offset_in(len), Ok(4000));
        assert_eq!(at(SEGMENT_BASE, 0).offset_in(len), Err(TeError::Empty));
        for (addr, size) in [
            (SEGMENT_BASE + 4000, 97),
            (SEGMENT_BASE - 1, 1),
            (0, 1),
            (SEGMENT_BASE + 1, u64::MAX),
            (u64::MAX, 1),
        ] {
            assert!(
                matches!(
                    at(addr, size).offset_in(len),
                    Err(TeError::OutOfSegment { .. })
                ),
                "{addr:#x} +{size}"
            );
        }
    }
}
