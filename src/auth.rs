//! The cluster secret, and how processes prove they hold it.
//!
//! Every role of one cluster reads the same secret from a file (`--auth-token-file`, env
//! `RBGCTL_AUTH_TOKEN_FILE`; a Kubernetes Secret in the manifests). On RPC connections to the
//! master and the stores, both ends prove they hold it without sending it: the connecting side
//! sends a fresh nonce (`AUTH_HELLO`), the server answers its own nonce and an HMAC-SHA256 over
//! both, and the connecting side answers an HMAC over both the other way round
//! (`AUTH_PROOF`). A proof is bound to the server's nonce, fresh for each connection, so one
//! recorded from another connection is refused. On HTTP, writes carry the secret itself as
//! `Authorization: Bearer` (use TLS where the network is not trusted).

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use std::path::{Path, PathBuf};

/// Bytes of a handshake nonce.
pub const NONCE_LEN: usize = 16;
/// Shortest secret accepted.
pub const MIN_SECRET_LEN: usize = 16;
/// Longest secret file read.
const MAX_SECRET_LEN: usize = 4096;

/// The environment variable naming the secret file, for every role and client.
pub const TOKEN_FILE_ENV: &str = "RBGCTL_AUTH_TOKEN_FILE";

/// Why a process could not prove, or check, the cluster secret.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("auth token file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "auth token file {path}: the secret is {len} bytes; use at least {MIN_SECRET_LEN} \
         (e.g. `head -c 32 /dev/urandom | base64 > {path}`)"
    )]
    TooShort { path: PathBuf, len: usize },
    #[error("auth token file {path}: larger than {MAX_SECRET_LEN} bytes; is it the right file?")]
    TooLong { path: PathBuf },
    #[error(
        "auth token file {path}: the secret must be printable ASCII without spaces (it travels \
         in HTTP headers); base64 output is"
    )]
    NotText { path: PathBuf },
    #[error("no random numbers from the system")]
    Random,
}

/// Which side a proof is made by: the two sides' proofs differ, so one cannot be replayed as
/// the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Server,
    Client,
}

impl Side {
    fn label(self) -> &'static [u8] {
        match self {
            Side::Server => b"rbgctl auth v1 server",
            Side::Client => b"rbgctl auth v1 client",
        }
    }
}

/// The cluster secret.
pub struct Secret {
    token: Vec<u8>,
    key: hmac::Key,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// The secret in `text`, without surrounding whitespace (a trailing newline).
    pub fn new(text: &[u8], path: &Path) -> Result<Secret, AuthError> {
        let token = text.trim_ascii().to_vec();
        if !token.iter().all(u8::is_ascii_graphic) {
            return Err(AuthError::NotText {
                path: path.to_path_buf(),
            });
        }
        if token.len() < MIN_SECRET_LEN {
            return Err(AuthError::TooShort {
                path: path.to_path_buf(),
                len: token.len(),
            });
        }
        let key = hmac::Key::new(hmac::HMAC_SHA256, &token);
        Ok(Secret { token, key })
    }

    /// Reads the secret from `path`. A file others may read is used, with a warning.
    pub fn from_file(path: &Path) -> Result<Secret, AuthError> {
        let read = |source| AuthError::Read {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read)?;
        if meta.len() > MAX_SECRET_LEN as u64 {
            return Err(AuthError::TooLong {
                path: path.to_path_buf(),
            });
        }
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o004 != 0 {
            tracing::warn!(path = %path.display(), "the auth token file is readable by every user; chmod 600 it");
        }
        let text = std::fs::read(path).map_err(read)?;
        Secret::new(&text, path)
    }

    /// `side`'s proof over the client's and the server's nonces.
    pub fn prove(&self, side: Side, client_nonce: &[u8], server_nonce: &[u8]) -> Vec<u8> {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(side.label());
        ctx.update(client_nonce);
        ctx.update(server_nonce);
        ctx.sign().as_ref().to_vec()
    }

    /// Whether `proof` is `side`'s over the two nonces (compared in constant time).
    pub fn verify(
        &self,
        side: Side,
        client_nonce: &[u8],
        server_nonce: &[u8],
        proof: &[u8],
    ) -> bool {
        let mut msg = Vec::with_capacity(32 + client_nonce.len() + server_nonce.len());
        msg.extend_from_slice(side.label());
        msg.extend_from_slice(client_nonce);
        msg.extend_from_slice(server_nonce);
        hmac::verify(&self.key, &msg, proof).is_ok()
    }

    /// Whether an HTTP `Authorization` header value is `Bearer <the secret>` (compared in
    /// constant time).
    pub fn bearer_ok(&self, header: Option<&str>) -> bool {
        let Some(token) = header.and_then(bearer_token) else {
            return false;
        };
        // Compared as their HMACs, which `hmac::verify` does in constant time.
        let own = hmac::sign(&self.key, &self.token);
        hmac::verify(&self.key, token.trim().as_bytes(), own.as_ref()).is_ok()
    }

    /// The `Authorization` header value that `bearer_ok` accepts.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", String::from_utf8_lossy(&self.token))
    }
}

/// The token of an `Authorization: Bearer <token>` value. The scheme is case-insensitive
/// (RFC 7235: `bearer`, `BEARER`), the token is what follows the spaces after it, trimmed.
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once([' ', '\t'])?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The secret in `file`, if one is named (a role's `auth_token_file`).
pub fn load(file: Option<&Path>) -> Result<Option<std::sync::Arc<Secret>>, AuthError> {
    file.map(|f| Secret::from_file(f).map(std::sync::Arc::new))
        .transpose()
}

/// A fresh nonce from the system's random number generator.
pub fn nonce() -> Result<[u8; NONCE_LEN], AuthError> {
    let mut n = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut n)
        .map_err(|_| AuthError::Random)?;
    Ok(n)
}

/// Warns when a role listens beyond loopback with no secret: anyone who can reach it can
/// command it.
pub fn warn_if_open(role: &str, host: &str, secret: Option<&Secret>) {
    if secret.is_some() {
        return;
    }
    let loopback = host
        .parse::<std::net::IpAddr>()
        .map(|ip| ip.is_loopback())
        .unwrap_or(host == "localhost");
    if !loopback {
        tracing::warn!(role, address = host,
            "listening beyond loopback without authentication: anyone who can reach this port can command it; set --auth-token-file");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(text: &str) -> Secret {
        Secret::new(text.as_bytes(), Path::new("test")).expect("long enough")
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("BEARER\tabc"), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearerabc"), None);
        let s = secret("0123456789abcdef-cluster");
        assert!(s.bearer_ok(Some("bearer 0123456789abcdef-cluster")));
        assert!(!s.bearer_ok(Some("bearer 0123456789abcdef-clusteR")));
    }

    #[test]
    fn proofs_bind_both_nonces_and_the_side() {
        let s = secret("0123456789abcdef-cluster");
        let (c, n) = (nonce().unwrap(), nonce().unwrap());
        assert_ne!(c, n, "fresh nonces");
        let server = s.prove(Side::Server, &c, &n);
        assert!(s.verify(Side::Server, &c, &n, &server));
        assert!(
            !s.verify(Side::Client, &c, &n, &server),
            "not the other side's"
        );
        let other = nonce().unwrap();
        assert!(
            !s.verify(Side::Server, &c, &other, &server),
            "another connection"
        );
        assert!(!secret("another-secret-of-16-bytes").verify(Side::Server, &c, &n, &server));
        assert!(!s.verify(Side::Server, &c, &n, &server[..31]));
    }

    #[test]
    fn secrets_are_trimmed_checked_and_compared_as_bearers() {
        let s = secret("  0123456789abcdef\n");
        assert!(s.bearer_ok(Some("Bearer 0123456789abcdef")));
        assert!(s.bearer_ok(Some(&s.bearer())));
        assert!(!s.bearer_ok(Some("Bearer 0123456789abcdeX")));
        assert!(!s.bearer_ok(Some("0123456789abcdef")));
        assert!(!s.bearer_ok(None));
        let e = Secret::new(b"short\n", Path::new("/etc/rbgctl/token")).unwrap_err();
        assert!(e.to_string().contains("at least 16"), "{e}");
        let e = Secret::new(b"two words of a long enough secret", Path::new("t")).unwrap_err();
        assert!(e.to_string().contains("printable ASCII"), "{e}");
    }
}
