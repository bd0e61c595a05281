//! coro_rpc framing (yalantinglibs), Mooncake's master RPC: a 20-byte request header, a 16-byte
//! response header, each followed by a struct_pack body. No handshake: a client sends its first
//! request at once, numbering requests per connection (`seq_num`), which answers carry back.

use super::struct_pack::TypeSig;
use md5::{Digest, Md5};

/// The first byte of every coro_rpc frame.
pub const MAGIC: u8 = 0x15;
/// Bytes of a coro_rpc request header.
pub const REQUEST_HEADER_LEN: usize = 20;
/// Bytes of a coro_rpc response header.
pub const RESPONSE_HEADER_LEN: usize = 16;

/// coro_rpc's own error codes (`errc`), sent in a response header with the message as body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Errc {
    Ok = 0,
    InvalidRpcArguments = 4,
    FunctionNotRegistered = 11,
    ProtocolError = 12,
    UnknownProtocolVersion = 13,
    MessageTooLarge = 14,
}

/// Why bytes on the port are not a coro_rpc request this master takes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("not a coro_rpc frame: its first byte is {0:#04x}, not 0x15")]
    Magic(u8),
    #[error("coro_rpc version {0} (this master speaks version 0)")]
    Version(u8),
    #[error("coro_rpc serialization {0} (only struct_pack, 0, is served)")]
    Serialization(u8),
    #[error("coro_rpc request of {len} bytes is over the {limit}-byte limit")]
    TooLarge { len: u64, limit: u64 },
}

/// A request's header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestHeader {
    pub seq_num: u32,
    pub function_id: u32,
    /// Bytes of struct_pack body.
    pub length: u32,
    /// Bytes of attachment after the body (Mooncake sends none).
    pub attach_length: u32,
}

impl RequestHeader {
    /// Reads a header; a frame that is not coro_rpc version 0 with struct_pack is refused.
    pub fn decode(b: &[u8; REQUEST_HEADER_LEN]) -> Result<RequestHeader, FrameError> {
        if b[0] != MAGIC {
            return Err(FrameError::Magic(b[0]));
        }
        if b[1] != 0 {
            return Err(FrameError::Version(b[1]));
        }
        if b[2] != 0 {
            return Err(FrameError::Serialization(b[2]));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Ok(RequestHeader {
            seq_num: u32_at(4),
            function_id: u32_at(8),
            length: u32_at(12),
            attach_length: u32_at(16),
        })
    }

    /// The header as the wire carries it.
    pub fn encode(&self) -> [u8; REQUEST_HEADER_LEN] {
        let mut b = [0u8; REQUEST_HEADER_LEN];
        b[0] = MAGIC;
        b[4..8].copy_from_slice(&self.seq_num.to_le_bytes());
        b[8..12].copy_from_slice(&self.function_id.to_le_bytes());
        b[12..16].copy_from_slice(&self.length.to_le_bytes());
        b[16..20].copy_from_slice(&self.attach_length.to_le_bytes());
        b
    }

    /// Body and attachment together.
    pub fn payload_len(&self) -> u64 {
        u64::from(self.length) + u64::from(self.attach_length)
    }
}

/// A response's header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResponseHeader {
    pub err_code: u8,
    pub seq_num: u32,
    pub length: u32,
}

impl ResponseHeader {
    /// The header as the wire carries it.
    pub fn encode(&self) -> [u8; RESPONSE_HEADER_LEN] {
        let mut b = [0u8; RESPONSE_HEADER_LEN];
        b[0] = MAGIC;
        b[2] = self.err_code;
        b[4..8].copy_from_slice(&self.seq_num.to_le_bytes());
        b[8..12].copy_from_slice(&self.length.to_le_bytes());
        b
    }

    /// A response header read off the wire; an error when its magic byte is not coro_rpc's.
    pub fn decode(b: &[u8; RESPONSE_HEADER_LEN]) -> Result<ResponseHeader, FrameError> {
        if b[0] != MAGIC {
            return Err(FrameError::Magic(b[0]));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Ok(ResponseHeader {
            err_code: b[2],
            seq_num: u32_at(4),
            length: u32_at(8),
        })
    }
}

/// A whole response frame: header and body.
pub fn response(seq_num: u32, err_code: Errc, body: &[u8]) -> Vec<u8> {
    let header = ResponseHeader {
        err_code: err_code as u8,
        seq_num,
        length: body.len() as u32,
    };
    let mut out = Vec::with_capacity(RESPONSE_HEADER_LEN + body.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(body);
    out
}

/// A coro_rpc error answer: the code in the header, the message as a struct_pack string.
pub fn error_response(seq_num: u32, err_code: Errc, message: &str) -> Vec<u8> {
    let body = TypeSig::cached::<String>().write(&message.to_string());
    response(seq_num, err_code, &body)
}

/// The function id coro_rpc registers a handler under: the first four bytes of the MD5 of its
/// qualified name, big-endian (`mooncake::WrappedMasterService::PutStart` → `0x65ea9ac1`).
pub fn function_id(name: &str) -> u32 {
    let digest = Md5::digest(name.as_bytes());
    u32::from_be_bytes(digest[..4].try_into().expect("4 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_ids_are_the_md5_of_the_qualified_name() {
        assert_eq!(
            function_id("mooncake::WrappedMasterService::PutStart"),
            0x65ea_9ac1
        );
        assert_eq!(
            function_id("mooncake::WrappedMasterService::ServiceReady"),
            0x7b81_bb56
        );
    }

    #[test]
    fn headers_read_and_write_as_captured() {
        // The wheel's PutStart request header (seq 2, 0x71 bytes of body).
        let captured: [u8; 20] = [
            0x15, 0, 0, 0, 2, 0, 0, 0, 0xc1, 0x9a, 0xea, 0x65, 0x71, 0, 0, 0, 0, 0, 0, 0,
        ];
        let h = RequestHeader::decode(&captured).unwrap();
        assert_eq!((h.seq_num, h.function_id, h.length), (2, 0x65ea_9ac1, 0x71));
        assert_eq!(h.encode(), captured);
        let mut other = captured;
        other[0] = b'R';
        assert_eq!(RequestHeader::decode(&other), Err(FrameError::Magic(b'R')));
        other = captured;
        other[1] = 1;
        assert_eq!(RequestHeader::decode(&other), Err(FrameError::Version(1)));
    }

    #[test]
    fn an_error_answer_is_what_the_wheels_master_sends() {
        // Captured: an unknown function id, seq 4.
        let got = error_response(
            4,
            Errc::FunctionNotRegistered,
            "the rpc function not registered",
        );
        let hex: String = got.iter().map(|b| format!("{b:02x}")).collect();
        let message: String = b"the rpc function not registered"
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            "15000b00040000002800000000000000".to_string() // header
                + "77facf9d04800c00" /* string's hash head, metainfo, literal */
                + "1f" /* length */
                + &message
        );
    }
}
