//! Grants: the master's word, checked by the store, that a write may land where it asks to.
//!
//! Holding the cluster secret lets a process talk to the master and the stores; it must not let
//! it write over another client's value. So each store makes a random key when it starts and
//! gives it to the master when it mounts its segments (nowhere else: it is never listed or
//! logged). For each replica of a put, the master answers a grant: an HMAC under that store's
//! key over the put's version, the replica's offset and the value's size. The store takes a
//! `WRITE` or a `SEAL` only with the grant of exactly that range and version, so a client
//! writes only the ranges the master allocated to its own puts, and no version but theirs (a
//! version out of thin air could otherwise shadow every later put of the range).
//!
//! The orders only the master gives a store (`FORGET`, `FORGET_LEASE`, `MOVE`) carry a tag
//! under the same key over the opcode and the request, appended to the request's meta.
//!
//! What grants do not bind: bytes that reach segment memory without the store moving them. A
//! same-host client maps the segment's file (readable and writable by the store's user only)
//! and an RDMA client writes the registered segment one-sidedly; both announce their writes
//! with a granted `SEAL`, but the bytes are in place before any check (`docs/security.md`).

use super::codec::{Decoder, Encoder};
use super::frame::Opcode;
use super::message::{MinLen, Wire};
use super::TransferError;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// Bytes of a grant or an order's tag (a truncated HMAC-SHA256).
pub const GRANT_LEN: usize = 16;
/// Bytes of a store's grant key.
pub const KEY_LEN: usize = 32;

/// What a grant is computed over, so that a grant can never pass as an order's tag.
const GRANT_LABEL: &[u8] = b"rbgctl grant v1";
const ORDER_LABEL: &[u8] = b"rbgctl order v1";

/// The master's permission for one replica write: `GRANT_LEN` bytes, opaque to clients.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Grant(pub [u8; GRANT_LEN]);

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Grant({})", crate::hash::hex(&self.0[..4]))
    }
}

impl Wire for Grant {
    fn encode(&self, e: &mut Encoder) {
        e.raw(&self.0);
    }
    fn decode(d: &mut Decoder<'_>) -> Result<Self, TransferError> {
        d.array().map(Grant)
    }
}

impl MinLen for Grant {
    const MIN_LEN: usize = GRANT_LEN;
}

/// A grant is its hex in test vectors.
impl serde::Serialize for Grant {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::hash::hex(&self.0))
    }
}

/// Why a grant or an order is not one the master made.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    #[error("no random numbers from the system for a grant key")]
    Random,
    #[error("a grant key is {KEY_LEN} bytes, this one is {0}: the store is older than its master; upgrade the store")]
    KeyLength(usize),
    #[error("a master's order must end with its {GRANT_LEN}-byte tag; this one has {0} bytes")]
    Untagged(usize),
    #[error("this order's tag is not the master's: only the master that mounted this store's segment may give it")]
    NotTheMasters,
}

/// A store's grant key: the store checks grants with it, the master makes them.
#[derive(Clone)]
pub struct GrantKey {
    raw: [u8; KEY_LEN],
    key: hmac::Key,
}

impl std::fmt::Debug for GrantKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GrantKey(..)")
    }
}

impl GrantKey {
    /// A fresh random key (a store, as it starts).
    pub fn generate() -> Result<GrantKey, GrantError> {
        let mut raw = [0u8; KEY_LEN];
        SystemRandom::new()
            .fill(&mut raw)
            .map_err(|_| GrantError::Random)?;
        Ok(GrantKey::new(raw))
    }

    /// The key a store sent with its mount.
    pub fn from_bytes(bytes: &[u8]) -> Result<GrantKey, GrantError> {
        let raw: [u8; KEY_LEN] = bytes
            .try_into()
            .map_err(|_| GrantError::KeyLength(bytes.len()))?;
        Ok(GrantKey::new(raw))
    }

    fn new(raw: [u8; KEY_LEN]) -> GrantKey {
        GrantKey {
            key: hmac::Key::new(hmac::HMAC_SHA256, &raw),
            raw,
        }
    }

    /// The key's bytes, to send to the master with a mount.
    pub fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.raw
    }

    fn tag(&self, parts: &[&[u8]]) -> Grant {
        let mut ctx = hmac::Context::with_key(&self.key);
        for p in parts {
            ctx.update(p);
        }
        let full = ctx.sign();
        let mut out = [0u8; GRANT_LEN];
        out.copy_from_slice(&full.as_ref()[..GRANT_LEN]);
        Grant(out)
    }

    /// The grant for writing `size` bytes of version `version` at `offset` of this key's
    /// store.
    pub fn grant(&self, version: u64, offset: u64, size: u64) -> Grant {
        self.tag(&[
            GRANT_LABEL,
            &version.to_le_bytes(),
            &offset.to_le_bytes(),
            &size.to_le_bytes(),
        ])
    }

    /// Whether `grant` is this key's for exactly that write.
    pub fn allows(&self, grant: &Grant, version: u64, offset: u64, size: u64) -> bool {
        same(&self.grant(version, offset, size), grant)
    }

    /// An order's meta: `body` followed by its tag.
    pub fn order(&self, op: Opcode, mut body: Vec<u8>) -> Vec<u8> {
        let tag = self.tag(&[ORDER_LABEL, &(op as u8).to_le_bytes(), &body]);
        body.extend_from_slice(&tag.0);
        body
    }

    /// The body of an order's meta whose tag is this key's, or why not.
    pub fn open_order<'a>(&self, op: Opcode, meta: &'a [u8]) -> Result<&'a [u8], GrantError> {
        let Some(split) = meta.len().checked_sub(GRANT_LEN) else {
            return Err(GrantError::Untagged(meta.len()));
        };
        let (body, sent) = meta.split_at(split);
        let tag = self.tag(&[ORDER_LABEL, &(op as u8).to_le_bytes(), body]);
        if same(&tag, &Grant(sent.try_into().expect("GRANT_LEN bytes"))) {
            Ok(body)
        } else {
            Err(GrantError::NotTheMasters)
        }
    }
}

/// Compares two tags in time that does not depend on where they differ.
fn same(a: &Grant, b: &Grant) -> bool {
    a.0.iter()
        .zip(b.0.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_allows_exactly_its_version_offset_and_size_on_its_store() {
        let key = GrantKey::generate().unwrap();
        let g = key.grant(7, 4096, 100);
        assert!(key.allows(&g, 7, 4096, 100));
        assert!(!key.allows(&g, 8, 4096, 100), "another version");
        assert!(!key.allows(&g, 7, 0, 100), "another offset");
        assert!(!key.allows(&g, 7, 4096, 101), "another size");
        assert!(!key.allows(&Grant::default(), 7, 4096, 100), "no grant");
        let other = GrantKey::generate().unwrap();
        assert!(!other.allows(&g, 7, 4096, 100), "another store's key");
        let again = GrantKey::from_bytes(key.bytes()).unwrap();
        assert!(
            again.allows(&g, 7, 4096, 100),
            "the master's copy of the key"
        );
    }

    #[test]
    fn an_order_opens_only_under_its_key_and_opcode() {
        let key = GrantKey::generate().unwrap();
        let meta = key.order(Opcode::Forget, b"body".to_vec());
        assert_eq!(key.open_order(Opcode::Forget, &meta).unwrap(), b"body");
        assert!(matches!(
            key.open_order(Opcode::ForgetLease, &meta),
            Err(GrantError::NotTheMasters)
        ));
        let mut forged = meta.clone();
        forged[0] ^= 1;
        assert!(key.open_order(Opcode::Forget, &forged).is_err());
        assert!(matches!(
            key.open_order(Opcode::Forget, b"short"),
            Err(GrantError::Untagged(5))
        ));
        let other = GrantKey::generate().unwrap();
        assert!(other.open_order(Opcode::Forget, &meta).is_err());
    }

    #[test]
    fn a_key_of_the_wrong_length_names_the_fix() {
        let e = GrantKey::from_bytes(&[0u8; 5]).unwrap_err().to_string();
        assert!(e.contains("upgrade the store"), "{e}");
        assert!(
            !format!("{:?}", GrantKey::generate().unwrap()).contains(|c: char| c.is_ascii_digit())
        );
    }
}
