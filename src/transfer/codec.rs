//! The field encoding inside a frame's meta section: little-endian integers, strings as a u16
//! length plus UTF-8, lists as a u32 count plus items. Every read is bounds-checked.

use super::TransferError;

/// Longest key or name accepted on the wire.
pub const MAX_STR_LEN: usize = 4096;
/// Largest list accepted on the wire (batch sizes, segment lists).
pub const MAX_LIST_LEN: usize = 1 << 20;

/// Writes a message's fields into a byte buffer.
#[derive(Default)]
pub struct Encoder {
    pub buf: Vec<u8>,
}

impl Encoder {
    /// An empty message.
    pub fn new() -> Encoder {
        Encoder {
            buf: Vec::with_capacity(64),
        }
    }
    /// A byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    /// A boolean, one byte: 0 or 1.
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(v as u8)
    }
    /// A little-endian u16.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A little-endian u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A little-endian u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A string: its u16 length, then its bytes. Strings longer than `MAX_STR_LEN` are the
    /// caller's bug: they are checked before encoding.
    pub fn str(&mut self, v: &str) -> &mut Self {
        let bytes = &v.as_bytes()[..v.len().min(u16::MAX as usize)];
        self.u16(bytes.len() as u16);
        self.buf.extend_from_slice(bytes);
        self
    }
    /// A list's count (u32), before its items.
    pub fn count(&mut self, n: usize) -> &mut Self {
        self.u32(n as u32)
    }
    /// Bytes of a fixed-size field, as they are (no length: the reader knows it).
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
}

/// Reads a message's fields from bytes, refusing what is short or malformed.
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    /// Reads `buf` from its start.
    pub fn new(buf: &'a [u8]) -> Decoder<'a> {
        Decoder { buf, pos: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], TransferError> {
        if self.buf.len() - self.pos < n {
            return Err(TransferError::Protocol(format!(
                "message truncated: needed {n} more bytes at offset {}, {} left",
                self.pos,
                self.buf.len() - self.pos
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// A byte.
    pub fn u8(&mut self) -> Result<u8, TransferError> {
        Ok(self.take(1)?[0])
    }
    /// A boolean; a byte other than 0 or 1 is refused.
    pub fn bool(&mut self) -> Result<bool, TransferError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(TransferError::Protocol(format!("boolean field is {v}"))),
        }
    }
    /// A little-endian u16.
    pub fn u16(&mut self) -> Result<u16, TransferError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    /// A little-endian u32.
    pub fn u32(&mut self) -> Result<u32, TransferError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    /// A little-endian u64.
    pub fn u64(&mut self) -> Result<u64, TransferError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    /// A string borrowed from the message: at most `MAX_STR_LEN` bytes of UTF-8.
    pub fn str(&mut self) -> Result<&'a str, TransferError> {
        let n = self.u16()? as usize;
        if n > MAX_STR_LEN {
            return Err(TransferError::Protocol(format!(
                "string of {n} bytes exceeds the limit of {MAX_STR_LEN}"
            )));
        }
        let bytes = self.take(n)?;
        if bytes.is_ascii() {
            // Keys are nearly always ASCII, which a word at a time proves in a few
            // instructions (`from_utf8` walks an unaligned key byte by byte).
            // SAFETY: ASCII is UTF-8.
            return Ok(unsafe { std::str::from_utf8_unchecked(bytes) });
        }
        std::str::from_utf8(bytes)
            .map_err(|_| TransferError::Protocol("string is not UTF-8".into()))
    }
    /// A fixed-size field of `N` bytes.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], TransferError> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }
    /// A string, owned.
    pub fn string(&mut self) -> Result<String, TransferError> {
        self.str().map(str::to_owned)
    }
    /// A list count, checked against the limit and against the bytes left (each item takes at
    /// least `min_item_len` bytes), so a hostile count cannot make us allocate.
    pub fn count(&mut self, min_item_len: usize) -> Result<usize, TransferError> {
        let n = self.u32()? as usize;
        let left = self.buf.len() - self.pos;
        if n > MAX_LIST_LEN || n.saturating_mul(min_item_len) > left {
            return Err(TransferError::Protocol(format!(
                "list of {n} items does not fit the message ({left} bytes left)"
            )));
        }
        Ok(n)
    }
    /// Messages must be consumed exactly: trailing bytes mean the peer speaks something else.
    pub fn finish(&self) -> Result<(), TransferError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(TransferError::Protocol(format!(
                "{} unexpected trailing bytes",
                self.buf.len() - self.pos
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let mut e = Encoder::new();
        e.u8(7)
            .u16(300)
            .u32(70000)
            .u64(1 << 40)
            .str("kv/é")
            .bool(true)
            .count(2);
        let mut d = Decoder::new(&e.buf);
        assert_eq!(d.u8().unwrap(), 7);
        assert_eq!(d.u16().unwrap(), 300);
        assert_eq!(d.u32().unwrap(), 70000);
        assert_eq!(d.u64().unwrap(), 1 << 40);
        assert_eq!(d.str().unwrap(), "kv/é");
        assert!(d.bool().unwrap());
        assert!(d.count(0).is_ok());
        d.finish().unwrap();
    }

    #[test]
    fn truncated_and_hostile_input_is_an_error() {
        let mut d = Decoder::new(&[1, 0]);
        assert!(d.u32().unwrap_err().to_string().contains("truncated"));
        // A string claiming 5000 bytes.
        let mut e = Encoder::new();
        e.u16(5000);
        assert!(Decoder::new(&e.buf)
            .str()
            .unwrap_err()
            .to_string()
            .contains("limit"));
        // A list claiming a billion items in a 4-byte message.
        let mut e = Encoder::new();
        e.u32(1_000_000_000);
        assert!(Decoder::new(&e.buf).count(8).is_err());
        // Invalid UTF-8.
        let mut e = Encoder::new();
        e.u16(1).u8(0xff);
        assert!(Decoder::new(&e.buf).str().is_err());
        // ... past the words an ASCII check reads at once, and in their middle.
        let mut e = Encoder::new();
        e.u16(40)
            .buf
            .extend(b"kv/prefix-blocks/".iter().chain(&[0xc3; 23]));
        assert!(Decoder::new(&e.buf).str().is_err());
        // Trailing bytes.
        let d = Decoder::new(&[0]);
        assert!(d.finish().is_err());
        // A bool that is neither 0 nor 1.
        assert!(Decoder::new(&[2]).bool().is_err());
    }
}
