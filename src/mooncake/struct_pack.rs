//! struct_pack (yalantinglibs), as Mooncake's master RPC writes it: the bodies of its requests
//! and responses.
//!
//! A message is a 4-byte hash head, an optional metainfo byte, an optional type literal (ended
//! by a `0x00`), then the values one after another, without padding:
//!
//! - the type literal spells the message's type, one byte per type (`01` i32, `04` u64,
//!   `80 0c` string, `84 T` vector, `fd … ff` struct, `87 T E` expected, …: [`Pack::literal`]);
//!   the hash head is the first four bytes of its MD5, big-endian, bit 0 cleared, and bit 0 set
//!   when a metainfo byte follows;
//! - metainfo bit 2 says a literal follows; bits 3–4 give the width of every length in the
//!   message (1, 2, 4 or 8 bytes), chosen from its longest string or container;
//! - a reader checks the hash head against its own type, and the literal, when one is sent,
//!   byte for byte. A peer may send none.
//!
//! Messages are written as the wheel writes them (with the literal); both forms are read.

use md5::{Digest, Md5};

/// Type literal bytes (yalantinglibs' `type_id`).
pub mod lit {
    pub const I32: u8 = 0x01;
    pub const U32: u8 = 0x02;
    pub const I64: u8 = 0x03;
    pub const U64: u8 = 0x04;
    pub const I8: u8 = 0x05;
    pub const U8: u8 = 0x06;
    pub const I16: u8 = 0x07;
    pub const U16: u8 = 0x08;
    pub const BOOL: u8 = 0x0b;
    pub const CHAR: u8 = 0x0c;
    pub const STRING: u8 = 0x80;
    pub const MAP: u8 = 0x82;
    pub const VECTOR: u8 = 0x84;
    pub const OPTIONAL: u8 = 0x85;
    pub const VARIANT: u8 = 0x86;
    pub const EXPECTED: u8 = 0x87;
    pub const MONOSTATE: u8 = 0xfa;
    pub const STRUCT: u8 = 0xfd;
    pub const END: u8 = 0xff;
}

/// Metainfo: a type literal follows.
const HAS_LITERAL: u8 = 0b100;
/// Longest string or container a message may hold: a peer's count is checked against it (and
/// against the bytes left) before anything is allocated.
pub const MAX_LEN: u64 = 1 << 30;

/// Why bytes are not the struct_pack value expected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpError {
    #[error("struct_pack message truncated: {needed} more bytes needed at byte {at}")]
    Truncated { needed: u64, at: usize },
    #[error("struct_pack type hash {got:#010x} is not the expected {want:#010x}: the peer sends another type (another Mooncake version?)")]
    TypeHash { want: u32, got: u32 },
    #[error("struct_pack type literal differs from this type's (the peer's type has the same hash but another shape)")]
    Literal,
    #[error(
        "struct_pack metainfo {0:#04x} uses compatible fields, which no Mooncake RPC type has"
    )]
    Compatible(u8),
    #[error("struct_pack {what} byte {value} is out of range")]
    Byte { what: &'static str, value: u8 },
    #[error("struct_pack length {0} is larger than the message")]
    Length(u64),
    #[error("struct_pack string is not UTF-8")]
    Utf8,
    #[error("struct_pack message has {0} bytes after its value")]
    Trailing(usize),
}

/// A type struct_pack can carry.
pub trait Pack: Sized {
    /// Appends this type's literal.
    fn literal(out: &mut Vec<u8>);
    /// The longest string or container in this value (0 when it holds none).
    fn max_len(&self) -> usize {
        0
    }
    fn pack(&self, w: &mut Writer);
    fn unpack(r: &mut Reader<'_>) -> Result<Self, SpError>;
}

/// Where values are written: the message so far, and the width of its lengths.
pub struct Writer {
    pub buf: Vec<u8>,
    width: usize,
}

impl Writer {
    /// Bytes as they are.
    pub fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
    /// A string's or container's length, in the message's width.
    pub fn len(&mut self, n: usize) {
        self.buf
            .extend_from_slice(&(n as u64).to_le_bytes()[..self.width]);
    }
}

/// Where values are read from.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    width: usize,
}

impl<'a> Reader<'a> {
    /// The next `n` bytes; an error naming the position if fewer are left.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], SpError> {
        let left = self.buf.len() - self.pos;
        if n > left {
            return Err(SpError::Truncated {
                needed: (n - left) as u64,
                at: self.pos,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], SpError> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }
    /// The next byte.
    pub fn u8(&mut self) -> Result<u8, SpError> {
        Ok(self.take(1)?[0])
    }
    /// A length, checked against what is left: every item takes at least `min_item` bytes.
    pub fn len(&mut self, min_item: usize) -> Result<usize, SpError> {
        let mut b = [0u8; 8];
        b[..self.width].copy_from_slice(self.take(self.width)?);
        let n = u64::from_le_bytes(b);
        let left = (self.buf.len() - self.pos) as u64;
        if n > MAX_LEN || n > left / min_item.max(1) as u64 {
            return Err(SpError::Length(n));
        }
        Ok(n as usize)
    }
    /// A one-byte tag (bool, optional, variant index) that must be below `count`.
    pub fn tag(&mut self, what: &'static str, count: u8) -> Result<u8, SpError> {
        let value = self.u8()?;
        if value >= count {
            return Err(SpError::Byte { what, value });
        }
        Ok(value)
    }
}

/// A message type's literal and its type code (the hash head, bit 0 clear).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeSig {
    pub literal: Vec<u8>,
    pub code: u32,
}

impl TypeSig {
    /// The signature of `T`: struct_pack's type literal and the code the wire carries.
    pub fn of<T: Pack>() -> TypeSig {
        let mut literal = Vec::new();
        T::literal(&mut literal);
        TypeSig::from_literal(literal)
    }

    /// `of::<T>()`, worked out once per type for the life of the process: what a server needs
    /// for every request, without a literal built and hashed each time.
    pub fn cached<T: Pack + 'static>() -> &'static TypeSig {
        use std::any::TypeId;
        use std::collections::HashMap;
        static SIGS: std::sync::OnceLock<parking_lot::RwLock<HashMap<TypeId, &'static TypeSig>>> =
            std::sync::OnceLock::new();
        let sigs = SIGS.get_or_init(Default::default);
        if let Some(sig) = sigs.read().get(&TypeId::of::<T>()) {
            return sig;
        }
        // A few dozen types at most: each is leaked once.
        let mut sigs = sigs.write();
        let sig: &'static TypeSig = sigs
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Box::leak(Box::new(TypeSig::of::<T>())));
        sig
    }

    /// The signature of a type literal: its MD5's first four bytes, big-endian, lowest bit
    /// cleared.
    pub fn from_literal(literal: Vec<u8>) -> TypeSig {
        let digest = Md5::digest(&literal);
        let code = u32::from_be_bytes(digest[..4].try_into().expect("4 bytes")) & !1;
        TypeSig { literal, code }
    }

    /// `v` as a message of this type, literal included (as the wheel sends them).
    pub fn write<T: Pack>(&self, v: &T) -> Vec<u8> {
        let width = width_for(v.max_len());
        let mut buf = Vec::with_capacity(16 + self.literal.len());
        buf.extend_from_slice(&(self.code | 1).to_le_bytes());
        buf.push(HAS_LITERAL | (width_bits(width) << 3));
        buf.extend_from_slice(&self.literal);
        buf.push(0);
        let mut w = Writer { buf, width };
        v.pack(&mut w);
        w.buf
    }

    /// A message of this type, with or without its literal; nothing may follow it.
    pub fn read<T: Pack>(&self, bytes: &[u8]) -> Result<T, SpError> {
        let mut r = Reader {
            buf: bytes,
            pos: 0,
            width: 1,
        };
        let head = u32::from_le_bytes(r.array()?);
        if head >> 1 != self.code >> 1 {
            return Err(SpError::TypeHash {
                want: self.code,
                got: head & !1,
            });
        }
        if head & 1 == 1 {
            let meta = r.u8()?;
            if meta & 0b11 != 0 {
                return Err(SpError::Compatible(meta));
            }
            if meta & HAS_LITERAL != 0 {
                let sent = r.take(self.literal.len())?;
                if sent != self.literal.as_slice() || r.u8()? != 0 {
                    return Err(SpError::Literal);
                }
            }
            r.width = 1 << ((meta >> 3) & 0b11);
        }
        let v = T::unpack(&mut r)?;
        match bytes.len() - r.pos {
            0 => Ok(v),
            n => Err(SpError::Trailing(n)),
        }
    }
}

fn width_for(max_len: usize) -> usize {
    match max_len as u64 {
        0..=0xff => 1,
        0x100..=0xffff => 2,
        0x1_0000..=0xffff_ffff => 4,
        _ => 8,
    }
}

fn width_bits(width: usize) -> u8 {
    width.trailing_zeros() as u8
}

macro_rules! pack_int {
    ($($t:ty => $l:expr),* $(,)?) => {$(
        impl Pack for $t {
            fn literal(out: &mut Vec<u8>) {
                out.push($l);
            }
            fn pack(&self, w: &mut Writer) {
                w.raw(&self.to_le_bytes());
            }
            fn unpack(r: &mut Reader<'_>) -> Result<Self, SpError> {
                Ok(<$t>::from_le_bytes(r.array()?))
            }
        }
    )*};
}
pack_int!(i32 => lit::I32, u32 => lit::U32, i64 => lit::I64, u64 => lit::U64, i8 => lit::I8,
    u8 => lit::U8, i16 => lit::I16, u16 => lit::U16);

impl Pack for bool {
    fn literal(out: &mut Vec<u8>) {
        out.push(lit::BOOL);
    }
    fn pack(&self, w: &mut Writer) {
        w.raw(&[*self as u8]);
    }
    fn unpack(r: &mut Reader<'_>) -> Result<Self, SpError> {
        Ok(r.tag("bool", 2)? == 1)
    }
}

impl Pack for String {
    fn literal(out: &mut Vec<u8>) {
        out.extend_from_slice(&[lit::STRING, lit::CHAR]);
    }
    fn max_len(&self) -> usize {
        self.len()
    }
    fn pack(&self, w: &mut Writer) {
        w.len(self.len());
        w.raw(self.as_bytes());
    }
    fn unpack(r: &mut Reader<'_>) -> Result<Self, SpError> {
        let n = r.len(1)?;
        let bytes = r.take(n)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| SpError::Utf8)
    }
}

impl<T: Pack> Pack for Vec<T> {
    fn literal(out: &mut Vec<u8>) {
        out.push(lit::VECTOR);
        T::literal(out);
    }
    fn max_len(&self) -> usize {
        self.iter().map(Pack::max_len).fold(self.len(), usize::max)
    }
    fn pack(&self, w: &mut Writer) {
        w.len(self.len());
        for v in self {
            v.pack(w);
        }
    }
    fn unpack(r: &mut Reader<'_>) -> Result<Self, SpError> {
        // Every Mooncake element type takes at least one byte.
        let n = r.len(1)?;
        (0..n).map(|_| T::unpack(r)).collect()
    }
}

impl<T: Pack> Pack for Option<T> {
    fn literal(out: &mut Vec<u8>) {
        out.push(lit::OPTIONAL);
        T::literal(out);
    }
    fn max_len(&self) -> usize {
        self.as_ref().map_or(0, Pack::max_len)
    }
    fn pack(&self, w: &mut Writer) {
        match self {
            Some(v) => {
                w.raw(&[1]);
                v.pack(w);
            }
            None => w.raw(&[0]),
        }
    }
    fn unpack(r: &mut Reader<'_>) -> Result<Self, SpError> {
        match r.tag("optional", 2)? {
            1 => Ok(Some(T::unpack(r)?)),
            _ => Ok(None),
        }
    }
}

/// `std::monostate`: a `void` result.
impl Pack for () {
    fn literal(out: &mut Vec<u8>) {
        out.push(lit::MONOSTATE);
    }
    fn pack(&self, _: &mut Writer) {}
    fn unpack(_: &mut Reader<'_>) -> Result<Self, SpError> {
        Ok(())
    }
}

/// `tl::expected<T, E>` with an `i32` error (Mooncake's `ErrorCode`).
impl<T: Pack> Pack for Result<T, i32> {
    fn literal(out: &mut Vec<u8>) {
        out.push(lit::EXPECTED);
        T::literal(out);
        out.push(lit::I32);
    }
    fn max_len(&self) -> usize {
        self.as_ref().map_or(0, Pack::max_len)
    }
    fn pack(&self, w: &mut Writer) {
        match self {
            Ok(v) => {
                w.raw(&[1]);
                v.pack(w);
            }
            Err(e) => {
                w.raw(&[0]);
                e.pack(w);
            }
        }
    }
    fn unpack(r: &mut Reader<'_>) -> Result<Self, SpError> {
        match r.tag("expected", 2)? {
            1 => Ok(Ok(T::unpack(r)?)),
            _ => Ok(Err(i32::unpack(r)?)),
        }
    }
}

/// A map (`std::unordered_map`): its pairs in the order held, as a count and keys and values.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Map<K, V>(pub Vec<(K, V)>);

impl<K: Pack, V: Pack> Pack for Map<K, V> {
    fn literal(out: &mut Vec<u8>) {
        out.push(lit::MAP);
        K::literal(out);
        V::literal(out);
    }
    fn max_len(&self) -> usize {
        self.0
            .iter()
            .map(|(k, v)| k.max_len().max(v.max_len()))
            .fold(self.0.len(), usize::max)
    }
    fn pack(&self, w: &mut Writer) {
        w.len(self.0.len());
        for (k, v) in &self.0 {
            k.pack(w);
            v.pack(w);
        }
    }
    fn unpack(r: &mut Reader<'_>) -> Result<Self, SpError> {
        let n = r.len(2)?;
        (0..n)
            .map(|_| Ok((K::unpack(r)?, V::unpack(r)?)))
            .collect::<Result<_, _>>()
            .map(Map)
    }
}

/// A struct (or a request's argument list): `fd`, its fields' literals, `ff`; the fields'
/// values one after another.
macro_rules! pack_tuple {
    ($($n:tt $t:ident),+) => {
        impl<$($t: Pack),+> Pack for ($($t,)+) {
            fn literal(out: &mut Vec<u8>) {
                out.push(lit::STRUCT);
                $($t::literal(out);)+
                out.push(lit::END);
            }
            fn max_len(&self) -> usize {
                0 $(.max(self.$n.max_len()))+
            }
            fn pack(&self, w: &mut Writer) {
                $(self.$n.pack(w);)+
            }
            fn unpack(r: &mut Reader<'_>) -> Result<Self, SpError> {
                Ok(($($t::unpack(r)?,)+))
            }
        }
    };
}
pack_tuple!(0 A, 1 B);
pack_tuple!(0 A, 1 B, 2 C);
pack_tuple!(0 A, 1 B, 2 C, 3 D);
pack_tuple!(0 A, 1 B, 2 C, 3 D, 4 E);
pack_tuple!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F);

/// Declares a struct whose fields struct_pack carries in order (a `YLT_REFL`'d or aggregate
/// Mooncake type).
#[macro_export]
macro_rules! sp_struct {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $field:ident : $ty:ty),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct $name { $($(#[$fm])* pub $field: $ty),+ }
        impl $crate::mooncake::struct_pack::Pack for $name {
            fn literal(out: &mut Vec<u8>) {
                out.push($crate::mooncake::struct_pack::lit::STRUCT);
                $(<$ty as $crate::mooncake::struct_pack::Pack>::literal(out);)+
                out.push($crate::mooncake::struct_pack::lit::END);
            }
            fn max_len(&self) -> usize {
                0 $(.max($crate::mooncake::struct_pack::Pack::max_len(&self.$field)))+
            }
            fn pack(&self, w: &mut $crate::mooncake::struct_pack::Writer) {
                $($crate::mooncake::struct_pack::Pack::pack(&self.$field, w);)+
            }
            fn unpack(
                r: &mut $crate::mooncake::struct_pack::Reader<'_>,
            ) -> Result<Self, $crate::mooncake::struct_pack::SpError> {
                Ok($name { $($field: <$ty as $crate::mooncake::struct_pack::Pack>::unpack(r)?),+ })
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn a_string_result_is_written_as_the_wheels_master_writes_it() {
        // ServiceReady's answer, captured from the wheel's master: expected<string> "2.0.0".
        let sig = TypeSig::of::<Result<String, i32>>();
        assert_eq!(sig.literal, [0x87, 0x80, 0x0c, 0x01]);
        assert_eq!(sig.code | 1, 0x1cb3_cc35);
        let msg = sig.write(&Ok::<String, i32>("2.0.0".into()));
        assert_eq!(hex(&msg), "35ccb31c0487800c01000105322e302e30");
        assert_eq!(
            sig.read::<Result<String, i32>>(&msg),
            Ok(Ok("2.0.0".into()))
        );
    }

    #[test]
    fn a_types_signature_is_worked_out_once() {
        let first = TypeSig::cached::<Vec<String>>();
        assert!(std::ptr::eq(first, TypeSig::cached::<Vec<String>>()));
        assert_eq!(*first, TypeSig::of::<Vec<String>>());
        assert_ne!(*first, *TypeSig::cached::<Vec<u64>>());
    }

    #[test]
    fn messages_without_a_literal_and_with_wider_lengths_are_read() {
        let sig = TypeSig::of::<(String, String)>();
        let v = ("k".repeat(300), "default".to_string());
        let msg = sig.write(&v);
        assert_eq!(
            msg[4],
            HAS_LITERAL | (1 << 3),
            "2-byte lengths for a 300-byte key"
        );
        assert_eq!(sig.read::<(String, String)>(&msg).unwrap(), v);
        // No metainfo at all: 1-byte lengths.
        let mut bare = sig.code.to_le_bytes().to_vec();
        bare.extend_from_slice(&[1, b'k', 7]);
        bare.extend_from_slice(b"default");
        assert_eq!(
            sig.read::<(String, String)>(&bare).unwrap(),
            ("k".into(), "default".into())
        );
        // Metainfo with 8-byte lengths and no literal.
        let mut wide = (sig.code | 1).to_le_bytes().to_vec();
        wide.push(3 << 3);
        wide.extend_from_slice(&1u64.to_le_bytes());
        wide.push(b'k');
        wide.extend_from_slice(&0u64.to_le_bytes());
        assert_eq!(
            sig.read::<(String, String)>(&wide).unwrap(),
            ("k".into(), String::new())
        );
    }

    #[test]
    fn hostile_messages_are_refused_without_allocating() {
        let sig = TypeSig::of::<Vec<String>>();
        let other = TypeSig::of::<Vec<u64>>();
        let msg = other.write(&vec![1u64, 2]);
        assert!(matches!(
            sig.read::<Vec<String>>(&msg),
            Err(SpError::TypeHash { .. })
        ));
        // A count of 2^40 in 8-byte lengths, with nothing behind it.
        let mut huge = (sig.code | 1).to_le_bytes().to_vec();
        huge.push(3 << 3);
        huge.extend_from_slice(&(1u64 << 40).to_le_bytes());
        assert_eq!(
            sig.read::<Vec<String>>(&huge),
            Err(SpError::Length(1 << 40))
        );
        // The right hash, a literal of another shape.
        let mut forged = sig.write(&vec!["a".to_string()]);
        forged[6] ^= 0x01;
        assert_eq!(sig.read::<Vec<String>>(&forged), Err(SpError::Literal));
        // Truncated, and trailing bytes.
        let good = sig.write(&vec!["abc".to_string()]);
        assert_eq!(
            sig.read::<Vec<String>>(&good[..good.len() - 1]),
            Err(SpError::Length(3)),
            "a string longer than what is left"
        );
        assert!(matches!(
            sig.read::<Vec<String>>(&good[..6]),
            Err(SpError::Truncated { .. })
        ));
        let mut long = good.clone();
        long.push(0);
        assert_eq!(sig.read::<Vec<String>>(&long), Err(SpError::Trailing(1)));
        // A bool of 2, an optional of 7.
        let b = TypeSig::of::<bool>();
        let mut two = b.write(&true);
        *two.last_mut().unwrap() = 2;
        assert!(matches!(b.read::<bool>(&two), Err(SpError::Byte { .. })));
    }
}
