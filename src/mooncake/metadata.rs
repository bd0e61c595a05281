//! A client of Mooncake's HTTP metadata server (`http://host:port/metadata`, as the master
//! embeds it): `GET|PUT <url>?key=<escaped key>`, JSON bodies, 404 for a key it does not hold.
//! Stores publish their segment descriptors through it; rbgctl's clients read a Mooncake
//! process's descriptor through it.

use std::io::Read;
use std::time::Duration;

/// Largest answer read (a descriptor is a few hundred bytes).
const MAX_ANSWER: u64 = 1 << 20;

/// Why a request to Mooncake's HTTP metadata server failed.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("metadata server {url}: {why}")]
    Server { url: String, why: String },
}

/// An HTTP metadata server and the one client that talks to it, trusting `ca_cert_paths`
/// beside the public web's roots for `https://`.
pub struct MetadataServer {
    pub url: String,
    http: reqwest::blocking::Client,
}

impl MetadataServer {
    /// Each request ends within `timeout`.
    pub fn new(
        url: &str,
        ca_cert_paths: &[std::path::PathBuf],
        timeout: Duration,
    ) -> Result<MetadataServer, crate::tls::TlsError> {
        let tls = crate::tls::client_config(ca_cert_paths, None)?;
        let http = reqwest::blocking::Client::builder()
            .timeout(timeout)
            .use_preconfigured_tls(tls)
            .build()
            .map_err(|e| crate::tls::TlsError::Client(e.to_string()))?;
        Ok(MetadataServer {
            url: url.to_string(),
            http,
        })
    }

    fn failed(&self, why: impl std::fmt::Display) -> MetadataError {
        MetadataError::Server {
            url: self.url.clone(),
            why: why.to_string(),
        }
    }

    /// `key`'s JSON, `None` when the server holds no such key.
    pub fn get(&self, key: &str) -> Result<Option<serde_json::Value>, MetadataError> {
        let r = self
            .http
            .get(&self.url)
            .query(&[("key", key)])
            .send()
            .map_err(|e| self.failed(e))?;
        match r.status() {
            reqwest::StatusCode::NOT_FOUND => Ok(None),
            s if s.is_success() => {
                let mut body = Vec::new();
                r.take(MAX_ANSWER)
                    .read_to_end(&mut body)
                    .map_err(|e| self.failed(e))?;
                serde_json::from_slice(&body)
                    .map(Some)
                    .map_err(|e| self.failed(format!("{key} is not JSON: {e}")))
            }
            s => Err(self.failed(format!("answered {s} for {key}"))),
        }
    }

    /// Sets `key` to `value`, with the cluster secret's Bearer when there is one.
    pub fn put(
        &self,
        key: &str,
        value: &serde_json::Value,
        auth: Option<&crate::auth::Secret>,
    ) -> Result<(), MetadataError> {
        let mut request = self.http.put(&self.url).query(&[("key", key)]);
        if let Some(secret) = auth {
            request = request.header("Authorization", secret.bearer());
        }
        let r = request
            .header("Content-Type", "application/json")
            .body(value.to_string())
            .send()
            .map_err(|e| self.failed(e))?;
        if r.status().is_success() {
            Ok(())
        } else {
            Err(self.failed(format!("refused {key}: {}", r.status())))
        }
    }
}
