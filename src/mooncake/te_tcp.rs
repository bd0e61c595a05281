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

use crate::transfer::server::{
    self, recv_some, send_some, ConnCounters, ForeignConn, Next, ServerHandle, ServerOptions, Step,
};
use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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

/// A Transfer Engine request's opcode.
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

/// Why a Transfer Engine request was refused.
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
    /// A session header read off the wire; an error for an operation it does not know.
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

    /// The header as the wire carries it.
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

    /// Keeps the CRC-32C of the `len` bytes written at `offset` (forgetting what they overlap),
    /// for the seal to take.
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
/// per address, the idle one making way, the idle and request timeouts), every connection
/// driven by `loops` event loops (`transfer::server::foreign`): the lanes of Mooncake's
/// clients take turns of at most `server::BUDGET` bytes, as Mooncake's own event loop serves
/// them, rather than each a thread.
pub fn serve<S: TeSegment + 'static>(
    listener: TcpListener,
    segment: Arc<S>,
    (opts, counters, loops): (ServerOptions, Arc<ConnCounters>, usize),
    stats: Arc<TeStats>,
) -> std::io::Result<ServerHandle> {
    let new_conn: server::NewConn = Arc::new(move |_peer| {
        Box::new(TeConn {
            segment: segment.clone(),
            stats: stats.clone(),
            head: [0; HEADER_LEN],
            stage: Stage::Header { got: 0 },
        })
    });
    server::spawn_foreign_evented(listener, opts, counters, loops, new_conn)
}

/// Where a connection is in its request.
#[derive(Clone, Copy, Debug)]
enum Stage {
    /// Reading a session header: `got` of its bytes so far.
    Header { got: usize },
    /// Taking a WRITE's bytes into the segment, hashing each piece as it comes.
    Receiving {
        offset: u64,
        size: u64,
        at: u64,
        crc: u32,
        v2: bool,
    },
    /// Sending a status frame (`status_left` of its bytes, v2) and a READ's bytes (`size`, 0
    /// after a WRITE), `at` of them sent.
    Sending {
        status_left: usize,
        offset: u64,
        size: u64,
        at: u64,
    },
}

/// One connection of the transport: its request, as far as it got.
struct TeConn<S> {
    segment: Arc<S>,
    stats: Arc<TeStats>,
    head: [u8; HEADER_LEN],
    stage: Stage,
}

impl<S: TeSegment> TeConn<S> {
    /// The request its header asks for, checked against the segment.
    fn located(&self) -> Result<(SessionHeader, u64), TeError> {
        let h = SessionHeader::decode(&self.head)?;
        let offset = h.offset_in(self.segment.size())?;
        if h.op == Op::Write {
            if let Some(at) = self.segment.recorded_over(offset, h.size) {
                return Err(TeError::Recorded {
                    addr: h.addr,
                    size: h.size,
                    offset: at,
                });
            }
        }
        Ok((h, offset))
    }

    /// The header is whole: the request starts, or is refused (v2 is told; the connection
    /// then ends).
    fn start(&mut self, stream: &TcpStream) -> Option<Next> {
        match self.located() {
            Ok((h, offset)) => {
                self.stage = match h.op {
                    Op::Write => {
                        self.segment.writing(offset, h.size);
                        Stage::Receiving {
                            offset,
                            size: h.size,
                            at: 0,
                            crc: 0,
                            v2: h.v2,
                        }
                    }
                    Op::Read => Stage::Sending {
                        status_left: if h.v2 { STATUS_LEN } else { 0 },
                        offset,
                        size: h.size,
                        at: 0,
                    },
                };
                None
            }
            Err(e) => {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "Mooncake transfer request refused");
                if self.head[16] & OPCODE_V2 != 0 {
                    // Eight bytes into an idle socket's buffer: taken whole, or the peer is gone.
                    let _ = send_some(stream, &STATUS_REFUSED.to_le_bytes());
                }
                Some(Next::Linger)
            }
        }
    }
}

/// Bytes of a v2 status frame.
const STATUS_LEN: usize = 8;

impl<S: TeSegment> ForeignConn for TeConn<S> {
    fn turn(&mut self, stream: &TcpStream, budget: usize) -> std::io::Result<Step> {
        let mut moved = 0usize;
        loop {
            let busy = !matches!(self.stage, Stage::Header { got: 0 });
            if busy && moved >= budget {
                return Ok(Step {
                    moved,
                    next: Next::More,
                });
            }
            let stepped = match self.stage {
                Stage::Header { got } => self.read_header(stream, got),
                Stage::Receiving { .. } => self.receive(stream),
                Stage::Sending { .. } => self.send(stream),
            };
            match stepped {
                Ok(Ok(n)) => moved += n,
                Ok(Err(next)) => return Ok(Step { moved, next }),
                // The socket has nothing more now: wait for it, idle between requests.
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    let next = if busy { Next::Busy } else { Next::Idle };
                    return Ok(Step { moved, next });
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// One socket call of a stage: the bytes it moved, or how the connection goes on (it closed,
/// or lingers after a refusal).
type Moved = std::io::Result<Result<usize, Next>>;

impl<S: TeSegment> TeConn<S> {
    /// Reads more of a request's header (`got` bytes of it so far); a whole one starts the
    /// request.
    fn read_header(&mut self, stream: &TcpStream, got: usize) -> Moved {
        let n = recv_some(stream, &mut self.head[got..])?;
        if n == 0 {
            return match got {
                0 => Ok(Err(Next::Close)),
                _ => Err(ErrorKind::UnexpectedEof.into()),
            };
        }
        if got + n < HEADER_LEN {
            self.stage = Stage::Header { got: got + n };
        } else if let Some(next) = self.start(stream) {
            return Ok(Err(next));
        }
        Ok(Ok(n))
    }

    /// Takes more of a WRITE's bytes into the segment, hashed as they come (while the piece
    /// is still in cache); the last of them records the hash and answers v2's status.
    fn receive(&mut self, stream: &TcpStream) -> Moved {
        let Stage::Receiving {
            offset,
            size,
            at,
            crc,
            v2,
        } = self.stage
        else {
            unreachable!("receive is called in the Receiving stage")
        };
        let want = (size - at).min(CHUNK as u64);
        // SAFETY: the range lies in the segment and holds no recorded object.
        let dst = unsafe { self.segment.bytes_mut(offset + at, want) };
        let n = recv_some(stream, dst)?;
        if n == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        let crc = crate::checksum::crc32c_append(crc, &dst[..n]);
        let at = at + n as u64;
        self.stage = if at < size {
            Stage::Receiving {
                offset,
                size,
                at,
                crc,
                v2,
            }
        } else {
            self.segment.wrote(offset, size, crc);
            self.stats.writes.fetch_add(1, Ordering::Relaxed);
            self.stats.bytes_written.fetch_add(size, Ordering::Relaxed);
            match v2 {
                true => Stage::Sending {
                    status_left: STATUS_LEN,
                    offset,
                    size: 0,
                    at: 0,
                },
                false => Stage::Header { got: 0 },
            }
        };
        Ok(Ok(n))
    }

    /// Sends more of the status frame and a READ's bytes, both in one send.
    fn send(&mut self, stream: &TcpStream) -> Moved {
        let Stage::Sending {
            status_left,
            offset,
            size,
            at,
        } = self.stage
        else {
            unreachable!("send is called in the Sending stage")
        };
        let status = STATUS_OK.to_le_bytes();
        let want = (size - at).min(CHUNK as u64);
        // SAFETY: the range lies in the segment; the bytes are only read.
        let src = unsafe { self.segment.bytes(offset + at, want) };
        let n = send_both(stream, &status[STATUS_LEN - status_left..], src)?;
        if n == 0 {
            return Err(ErrorKind::WriteZero.into());
        }
        let from_status = n.min(status_left);
        let (status_left, at) = (status_left - from_status, at + (n - from_status) as u64);
        self.stage = if status_left > 0 || at < size {
            Stage::Sending {
                status_left,
                offset,
                size,
                at,
            }
        } else {
            if size > 0 {
                self.stats.reads.fetch_add(1, Ordering::Relaxed);
                self.stats.bytes_read.fetch_add(size, Ordering::Relaxed);
            }
            Stage::Header { got: 0 }
        };
        Ok(Ok(n))
    }
}

/// `a` then `b` in one `sendmsg`; answers the bytes the socket took.
fn send_both(stream: &TcpStream, a: &[u8], b: &[u8]) -> std::io::Result<usize> {
    if a.is_empty() {
        return send_some(stream, b);
    }
    let iov = [std::io::IoSlice::new(a), std::io::IoSlice::new(b)];
    Ok(rustix::net::sendmsg(
        stream,
        &iov,
        &mut rustix::net::SendAncillaryBuffer::default(),
        rustix::net::SendFlags::NOSIGNAL,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A segment of plain memory, recording one object at [4096, 8192).
    struct Memory {
        bytes: Vec<std::cell::UnsafeCell<u8>>,
        hashes: WrittenHashes,
    }

    // SAFETY: the tests' connections touch disjoint ranges, one turn at a time.
    unsafe impl Sync for Memory {}

    impl TeSegment for Memory {
        fn size(&self) -> u64 {
            self.bytes.len() as u64
        }
        fn recorded_over(&self, offset: u64, len: u64) -> Option<u64> {
            (offset < 8192 && offset + len > 4096).then_some(4096)
        }
        unsafe fn bytes(&self, offset: u64, len: u64) -> &[u8] {
            let p = self.bytes[offset as usize].get();
            // SAFETY: the caller checked the range.
            unsafe { std::slice::from_raw_parts(p, len as usize) }
        }
        unsafe fn bytes_mut(&self, offset: u64, len: u64) -> &mut [u8] {
            let p = self.bytes[offset as usize].get();
            // SAFETY: the caller checked the range.
            unsafe { std::slice::from_raw_parts_mut(p, len as usize) }
        }
        fn writing(&self, offset: u64, len: u64) {
            self.hashes.forget(offset, len);
        }
        fn wrote(&self, offset: u64, len: u64, crc: u32) {
            self.hashes.put(offset, len, crc);
        }
    }

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        (peer, server)
    }

    fn conn(size: usize) -> TeConn<Memory> {
        TeConn {
            segment: Arc::new(Memory {
                bytes: (0..size).map(|_| std::cell::UnsafeCell::new(0)).collect(),
                hashes: WrittenHashes::default(),
            }),
            stats: Arc::default(),
            head: [0; HEADER_LEN],
            stage: Stage::Header { got: 0 },
        }
    }

    fn header(op: Op, offset: u64, size: u64) -> [u8; HEADER_LEN] {
        SessionHeader {
            size,
            addr: SEGMENT_BASE + offset,
            op,
            v2: true,
        }
        .encode()
    }

    /// Turns `c` until it waits with nothing more to do now.
    fn settle(c: &mut TeConn<Memory>, s: &TcpStream) -> (usize, Next) {
        let mut moved = 0;
        loop {
            let step = c.turn(s, BUDGET).unwrap();
            moved += step.moved;
            if step.next != Next::More {
                return (moved, step.next);
            }
        }
    }

    const BUDGET: usize = server::BUDGET;

    #[test]
    fn a_request_split_anywhere_is_served_whole_and_each_turn_keeps_to_its_budget() {
        use std::io::{Read, Write};
        let (mut peer, server) = pair();
        let mut c = conn(8 << 20);
        assert_eq!(settle(&mut c, &server), (0, Next::Idle), "nothing came yet");
        // A header in two pieces: busy after the first.
        let value: Vec<u8> = (0..(3usize << 20)).map(|i| (i % 251) as u8).collect();
        let h = header(Op::Write, 1 << 20, value.len() as u64);
        peer.write_all(&h[..5]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(settle(&mut c, &server).1, Next::Busy);
        // The rest and the bytes, from another thread (more than the socket holds).
        let sender = {
            let mut peer = peer.try_clone().unwrap();
            let (h, value) = (h, value.clone());
            std::thread::spawn(move || {
                peer.write_all(&h[5..]).unwrap();
                peer.write_all(&value).unwrap();
            })
        };
        let mut status = [0u8; 8];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while c.stats.writes.load(Ordering::Relaxed) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the write never ended"
            );
            let step = c.turn(&server, BUDGET).unwrap();
            assert!(step.moved <= BUDGET + CHUNK, "a turn moved {}", step.moved);
            if step.next != Next::More {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        sender.join().unwrap();
        settle(&mut c, &server);
        peer.read_exact(&mut status).unwrap();
        assert_eq!(status, STATUS_OK.to_le_bytes());
        let crc = c.segment.hashes.take(1 << 20, value.len() as u64);
        assert_eq!(crc, Some(crc32c::crc32c(&value)), "hashed as it came");
        // A READ of it: status and bytes, more than the socket's buffers hold.
        peer.write_all(&header(Op::Read, 1 << 20, value.len() as u64))
            .unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; 8 + value.len()];
            peer.read_exact(&mut got).unwrap();
            (got, value, peer)
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while c.stats.reads.load(Ordering::Relaxed) == 0 {
            assert!(std::time::Instant::now() < deadline, "the read never ended");
            if c.turn(&server, BUDGET).unwrap().next != Next::More {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        let (got, value, peer) = reader.join().unwrap();
        assert_eq!(got[..8], STATUS_OK.to_le_bytes());
        assert!(got[8..] == value[..], "the bytes came back as written");
        assert_eq!(settle(&mut c, &server).1, Next::Idle);
        drop(peer);
        assert_eq!(settle(&mut c, &server).1, Next::Close, "the peer closed");
    }

    #[test]
    fn a_write_over_a_recorded_object_or_outside_the_segment_is_refused_and_the_connection_lingers()
    {
        use std::io::{Read, Write};
        for (offset, size) in [(4000, 200), (8 << 20, 1)] {
            let (mut peer, server) = pair();
            let mut c = conn(8 << 20);
            peer.write_all(&header(Op::Write, offset, size)).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert_eq!(settle(&mut c, &server).1, Next::Linger);
            let mut status = [0u8; 8];
            peer.read_exact(&mut status).unwrap();
            assert_eq!(status, STATUS_REFUSED.to_le_bytes());
            assert_eq!(c.stats.refused.load(Ordering::Relaxed), 1);
            assert_eq!(c.stats.writes.load(Ordering::Relaxed), 0);
        }
        // A connection cut inside a header is an error, not an idle close.
        let (mut peer, server) = pair();
        let mut c = conn(1 << 20);
        peer.write_all(&[1, 2, 3]).unwrap();
        drop(peer);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut last = c.turn(&server, BUDGET);
        while matches!(
            last,
            Ok(Step {
                next: Next::Busy,
                ..
            })
        ) {
            last = c.turn(&server, BUDGET);
        }
        assert_eq!(
            last.unwrap_err().kind(),
            ErrorKind::UnexpectedEof,
            "cut mid-header"
        );
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
