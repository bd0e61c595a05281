//! A connection's first steps: proving the cluster secret (`crate::auth`) before anything else,
//! and the checks every request frame passes before its service sees it. Both servers use them.

use super::ServerIo;
use crate::transfer::frame::{Header, Opcode, Status, HEADER_LEN};
use crate::transfer::message::Wire;
use crate::transfer::TransferError;
use std::sync::Arc;

/// Where a connection is in proving it holds the cluster secret.
pub(super) struct Handshake {
    secret: Option<Arc<crate::auth::Secret>>,
    /// Nonces of an `AUTH_HELLO` answered: the client's and this server's.
    nonces: Option<(Vec<u8>, [u8; crate::auth::NONCE_LEN])>,
    pub(super) proven: bool,
}

pub(super) enum Step {
    /// A handshake request, answered.
    Answered,
    /// Not allowed yet (answered `UNAUTHENTICATED`): close the connection.
    Refused(&'static str),
    /// An ordinary request the connection may make.
    Pass,
}

impl Handshake {
    pub(super) fn new(secret: Option<Arc<crate::auth::Secret>>) -> Handshake {
        let proven = secret.is_none();
        Handshake {
            secret,
            nonces: None,
            proven,
        }
    }

    /// The largest meta the next frame may declare: small until the peer proves the secret.
    pub(super) fn meta_limit(&self) -> u32 {
        match self.proven {
            true => crate::transfer::frame::MAX_META_LEN,
            false => crate::transfer::frame::MAX_UNPROVEN_META_LEN,
        }
    }

    /// What the handshake makes of a request: every one of a proven connection but the
    /// handshake's own passes at once.
    #[inline]
    pub(super) fn step(
        &mut self,
        op: Opcode,
        meta: &[u8],
        io: &mut ServerIo<'_>,
    ) -> Result<Step, TransferError> {
        if self.proven && !matches!(op, Opcode::AuthHello | Opcode::AuthProof) {
            return Ok(Step::Pass);
        }
        self.handshake_step(op, meta, io)
    }

    fn handshake_step(
        &mut self,
        op: Opcode,
        meta: &[u8],
        io: &mut ServerIo<'_>,
    ) -> Result<Step, TransferError> {
        use crate::auth::{nonce, Side};
        use crate::transfer::message::{AuthChallengeResp, AuthHelloReq, AuthProofReq};
        match op {
            Opcode::AuthHello => {
                let hello = AuthHelloReq::from_meta(meta)?;
                let mine = nonce().map_err(|e| TransferError::Protocol(e.to_string()))?;
                let proof = match &self.secret {
                    Some(s) => s.prove(Side::Server, &hello.nonce, &mine),
                    // No secret here: an empty proof says so (a client with one refuses us).
                    None => Vec::new(),
                };
                io.ok(&AuthChallengeResp {
                    nonce: mine.to_vec(),
                    proof,
                })?;
                self.nonces = Some((hello.nonce, mine));
                Ok(Step::Answered)
            }
            Opcode::AuthProof => {
                let p = AuthProofReq::from_meta(meta)?;
                let Some(secret) = &self.secret else {
                    io.ok(&())?;
                    return Ok(Step::Answered);
                };
                // One proof per AUTH_HELLO: the nonces are used up either way.
                let good = self.nonces.take().is_some_and(|(client, mine)| {
                    secret.verify(Side::Client, &client, &mine, &p.proof)
                });
                if !good {
                    io.error(
                        Status::Unauthenticated,
                        "the proof does not match this connection's nonces and the cluster secret",
                    )?;
                    return Ok(Step::Refused("a bad authentication proof"));
                }
                self.proven = true;
                io.ok(&())?;
                Ok(Step::Answered)
            }
            _ if !self.proven => {
                // Its payload is not read: an unproven peer gets nothing more from us.
                io.error(Status::Unauthenticated, UNPROVEN)?;
                Ok(Step::Refused("a request before authentication"))
            }
            _ => Ok(Step::Pass),
        }
    }
}

/// Why a request frame cannot be served (answered `MALFORMED_FRAME`, then the connection closes).
pub(super) fn check_request(req: &Header, max_data_len: u64) -> Result<(), String> {
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

/// The answer to a header that did not decode (bad magic or version) or declared too much:
/// addressed as far as its bytes go.
pub(super) fn bad_header_answer(raw: &[u8; HEADER_LEN], reason: &str) -> Header {
    let req = Header {
        opcode: raw[5],
        flags: 0,
        request_id: u64::from_le_bytes(raw[8..16].try_into().unwrap_or_default()),
        status: 0,
        meta_len: 0,
        data_len: 0,
    };
    Header::response(&req, Status::MalformedFrame, reason.len(), 0)
}

/// What an unknown opcode is answered: before the proof, `UNAUTHENTICATED` (and the connection
/// closes); after it, `UNKNOWN_OPCODE` (and the connection stays).
pub(super) fn unknown_opcode(proven: bool, opcode: u8, role: &str) -> (Status, String) {
    match proven {
        false => (Status::Unauthenticated, UNPROVEN.to_owned()),
        true => (
            Status::UnknownOpcode,
            format!("unknown opcode 0x{opcode:02x} for the {role}"),
        ),
    }
}

const UNPROVEN: &str =
    "prove the cluster secret first (AUTH_HELLO, AUTH_PROOF); see --auth-token-file";
