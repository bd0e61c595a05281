//! TLS for HTTP ports and HTTP clients (rustls with ring): certificates and keys read from PEM
//! files, every error naming the file and what is wrong with it.

use rustls::crypto::ring::default_provider;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why a certificate, key or CA file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("TLS setup: {0}")]
    Setup(#[from] rustls::Error),
    #[error("HTTPS client: {0}")]
    Client(String),
}

fn file_error(path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Every certificate of a PEM file (at least one).
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "holds no PEM certificate"));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_error(path, format!("no private key: {e}")))
}

/// A server speaking HTTP/1.1 over TLS with `cert` (the chain, leaf first) and `key`; with
/// `client_ca`, only clients presenting a certificate that CA signed are served.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certificates(ca)? {
                roots
                    .add(c)
                    .map_err(|e| file_error(ca, format!("not a CA certificate: {e}")))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| file_error(ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certificates(cert)?, private_key(key)?)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The server side of an optional certificate and key pair (the config checked that both or
/// neither are given): `None` serves plain HTTP.
pub fn optional_server(
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Option<Arc<rustls::ServerConfig>>, TlsError> {
    match (cert, key) {
        (Some(cert), Some(key)) => server_config(cert, key, None).map(Some),
        _ => Ok(None),
    }
}

/// A client trusting the public web's roots and the CA certificates in `extra_roots`,
/// presenting `identity` (certificate chain, key) when given.
pub fn client_config(
    extra_roots: &[PathBuf],
    identity: Option<(&Path, &Path)>,
) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for path in extra_roots {
        for cert in certificates(path)? {
            roots
                .add(cert)
                .map_err(|e| file_error(path, format!("not a CA certificate: {e}")))?;
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    Ok(match identity {
        Some((cert, key)) => {
            builder.with_client_auth_cert(certificates(cert)?, private_key(key)?)?
        }
        None => builder.with_no_client_auth(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::scratch::ScratchFile;

    #[test]
    fn bad_files_are_named_with_the_reason() {
        let empty = ScratchFile::new("empty.pem", "not pem\n");
        let missing = empty.sibling("missing.pem");
        let e = server_config(&missing, &missing, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.pem"), "{e}");
        let e = certificates(empty.path()).unwrap_err().to_string();
        assert!(
            e.contains("empty.pem") && e.contains("no PEM certificate"),
            "{e}"
        );
        let e = client_config(&[empty.path().into()], None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("empty.pem"), "{e}");
        assert!(client_config(&[], None).is_ok());
    }
}
