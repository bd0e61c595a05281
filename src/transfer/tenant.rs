//! Tenants' namespaces in the keys the master and the stores hold: `\u{1}<tenant>\u{1}<key>`
//! for a named tenant, the key itself for the `default` tenant (so a pool from before tenants
//! reads as the default tenant's). A client's key may not begin with that mark, so no key of
//! one tenant can name another's object. Clients scope their keys (rbgctl's Rust and Python
//! clients by their `tenant` setting, Mooncake's requests by their `tenant_id`, which the
//! master's Mooncake RPC scopes); the master reads a key's tenant from it (`master::tenants`).

use std::borrow::Cow;

/// The tenant of a client that names none (Mooncake's default `tenant_id`).
pub const DEFAULT_TENANT: &str = "default";

/// Opens and closes a tenant's name at the head of a scoped key.
const MARK: char = '\u{1}';

/// Longest tenant name.
pub const MAX_NAME_LEN: usize = 64;

/// Why a key or tenant name cannot be held.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamespaceError {
    #[error("tenant name {0:?}: use 1 to {MAX_NAME_LEN} letters, digits, '.', '_' or '-'")]
    BadName(String),
    #[error("a key may not begin with the byte 0x01 (it marks a tenant's namespace)")]
    ReservedKey,
}

/// Checks a tenant's name.
pub fn check_name(name: &str) -> Result<(), NamespaceError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(NamespaceError::BadName(
            name.chars().take(MAX_NAME_LEN).collect(),
        ))
    }
}

/// Checks a client's key: it may not begin with the namespace mark.
pub fn check_key(key: &str) -> Result<(), NamespaceError> {
    if key.starts_with(MARK) {
        Err(NamespaceError::ReservedKey)
    } else {
        Ok(())
    }
}

/// The tenant of a key as the master receives it: a scoped key must name a well-formed
/// tenant (`\u{1}<name>\u{1}<key>`); any other key is the default tenant's.
pub fn tenant_of(held: &str) -> Result<&str, NamespaceError> {
    if !held.starts_with(MARK) {
        return Ok(DEFAULT_TENANT);
    }
    match held[1..].split_once(MARK) {
        Some((tenant, _)) if check_name(tenant).is_ok() && tenant != DEFAULT_TENANT => Ok(tenant),
        _ => Err(NamespaceError::ReservedKey),
    }
}

/// Whether the held key `held` is `tenant`'s, and its key as that tenant names it.
pub fn owned_by<'a>(held: &'a str, tenant: &str) -> Option<&'a str> {
    let (t, key) = split(held);
    (t == tenant).then_some(key)
}

/// The key the master holds for `tenant`'s `key` (both checked already).
pub fn scoped<'a>(tenant: &str, key: &'a str) -> Cow<'a, str> {
    if tenant == DEFAULT_TENANT {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(format!("{MARK}{tenant}{MARK}{key}"))
    }
}

/// The tenant and the client's key of a key the master holds.
pub fn split(held: &str) -> (&str, &str) {
    held.strip_prefix(MARK)
        .and_then(|rest| rest.split_once(MARK))
        .unwrap_or((DEFAULT_TENANT, held))
}

/// A held key as people read it: the tenant's key, and its tenant unless it is the default.
pub struct Shown<'a>(pub &'a str);

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match split(self.0) {
            (DEFAULT_TENANT, key) => write!(f, "{key:?}"),
            (tenant, key) => write!(f, "{key:?} (tenant {tenant})"),
        }
    }
}
