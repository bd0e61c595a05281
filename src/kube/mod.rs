//! A plain-REST Kubernetes API client (no client framework): connection settings from the
//! pod's service account or from a kubeconfig, JSON GETs, and watches read as line-delimited
//! JSON events. Used by the router's pod discovery; the operator builds on it.

pub mod lease;
pub mod object;
pub mod patch;
pub mod selector;
pub mod validation;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Why a request to the Kubernetes API failed (its status and reason when it answered).
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("kubernetes config: {0}")]
    Config(String),
    #[error("kubernetes API {path}: {source}")]
    Http {
        path: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("kubernetes API {path}: {code} {message}")]
    Status {
        path: String,
        code: u16,
        message: String,
    },
    #[error("kubernetes API {path}: bad answer: {reason}")]
    Decode { path: String, reason: String },
}

#[cfg(test)]
mod conflict_tests {
    use super::{status_message, KubeError};

    #[test]
    fn a_status_message_carries_its_causes() {
        let body = r#"{"kind":"Status","status":"Failure","message":"the server rejected our request due to an error in our request","reason":"Invalid","details":{"causes":[{"message":"testing value /metadata/resourceVersion failed: test failed"}]},"code":422}"#;
        let m = status_message(body);
        assert_eq!(
            m,
            "the server rejected our request due to an error in our request: testing value \
             /metadata/resourceVersion failed: test failed"
        );
        let e = KubeError::Status {
            path: "/apis/x".into(),
            code: 422,
            message: m,
        };
        assert!(e.is_conflict(), "the precondition's 422 is a lost race");
        assert_eq!(status_message(r#"{"message":"m"}"#), "m");
        assert_eq!(status_message("plain text"), "plain text");
        let same = r#"{"message":"x: y","details":{"causes":[{"message":"y"}]}}"#;
        assert_eq!(
            status_message(same),
            "x: y",
            "a cause already in the message"
        );
    }

    #[test]
    fn a_lost_race_is_a_conflict_and_other_refusals_are_not() {
        let e = |code, message: &str| KubeError::Status {
            path: "/apis/x".into(),
            code,
            message: message.into(),
        };
        assert!(e(409, "the object has been modified").is_conflict());
        assert!(e(
            422,
            "the server rejected our request: testing value /metadata/resourceVersion failed"
        )
        .is_conflict());
        assert!(!e(422, "spec.replicas: Invalid value").is_conflict());
        assert!(!e(500, "/metadata/resourceVersion").is_conflict());
    }
}

/// The message of an API server's error answer: a Status's `message`, with the messages of
/// its `details.causes` after it (where a 422 says what failed: the server's own message may
/// be only "the server rejected our request due to an error in our request"); the body as it
/// is when it is no Status.
pub fn status_message(body: &str) -> String {
    let Ok(v) = serde_json::from_str::<Value>(body) else {
        return body.to_string();
    };
    let Some(message) = v.get("message").and_then(Value::as_str) else {
        return body.to_string();
    };
    let causes: Vec<&str> = v
        .pointer("/details/causes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("message").and_then(Value::as_str))
        .filter(|c| !message.contains(c))
        .collect();
    match causes.is_empty() {
        true => message.to_string(),
        false => format!("{message}: {}", causes.join("; ")),
    }
}

impl KubeError {
    /// HTTP status of an API error (410 Gone means "list again").
    pub fn code(&self) -> Option<u16> {
        match self {
            KubeError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether the write lost a race with another writer: 409 Conflict, or the 422 a JSON
    /// patch gets when its `test` of `/metadata/resourceVersion` fails (the API server names
    /// the path: "testing value /metadata/resourceVersion failed"). Reading again and
    /// retrying is the normal answer, not a failure.
    pub fn is_conflict(&self) -> bool {
        match self {
            KubeError::Status { code: 409, .. } => true,
            KubeError::Status {
                code: 422, message, ..
            } => message.contains("/metadata/resourceVersion"),
            _ => false,
        }
    }
}

/// Where the API server is and how to authenticate.
#[derive(Clone, Debug, Default)]
pub struct KubeConfig {
    pub server: String,
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    pub ca_pem: Option<Vec<u8>>,
    /// Client certificate and key, PEM, concatenated.
    pub identity_pem: Option<Vec<u8>>,
    pub insecure: bool,
    /// The namespace of this pod, or of the kubeconfig context.
    pub namespace: String,
}

fn read(path: &Path) -> Result<Vec<u8>, KubeError> {
    std::fs::read(path).map_err(|e| KubeError::Config(format!("{}: {e}", path.display())))
}

fn b64(field: &str, s: &str) -> Result<Vec<u8>, KubeError> {
    base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .map_err(|e| KubeError::Config(format!("{field}: not base64: {e}")))
}

#[derive(Deserialize)]
struct Kubeconfig {
    #[serde(default, rename = "current-context")]
    current_context: Option<String>,
    #[serde(default)]
    clusters: Vec<Named<ClusterEntry>>,
    #[serde(default)]
    users: Vec<Named<UserEntry>>,
    #[serde(default)]
    contexts: Vec<Named<ContextEntry>>,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "user", alias = "context")]
    value: T,
}

#[derive(Deserialize, Default)]
struct ClusterEntry {
    server: String,
    #[serde(default, rename = "certificate-authority")]
    ca_file: Option<PathBuf>,
    #[serde(default, rename = "certificate-authority-data")]
    ca_data: Option<String>,
    #[serde(default, rename = "insecure-skip-tls-verify")]
    insecure: bool,
}

#[derive(Deserialize, Default)]
struct UserEntry {
    #[serde(default)]
    token: Option<String>,
    #[serde(default, rename = "tokenFile")]
    token_file: Option<PathBuf>,
    #[serde(default, rename = "client-certificate")]
    cert_file: Option<PathBuf>,
    #[serde(default, rename = "client-certificate-data")]
    cert_data: Option<String>,
    #[serde(default, rename = "client-key")]
    key_file: Option<PathBuf>,
    #[serde(default, rename = "client-key-data")]
    key_data: Option<String>,
}

#[derive(Deserialize, Default)]
struct ContextEntry {
    cluster: String,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
}

impl KubeConfig {
    /// In-cluster settings when `KUBERNETES_SERVICE_HOST` is set, else the kubeconfig named by
    /// `KUBECONFIG` or `~/.kube/config`.
    pub fn infer() -> Result<KubeConfig, KubeError> {
        if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
            return KubeConfig::in_cluster();
        }
        let path = std::env::var_os("KUBECONFIG")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".kube/config")))
            .ok_or_else(|| {
                KubeError::Config("no KUBERNETES_SERVICE_HOST, KUBECONFIG or HOME".into())
            })?;
        KubeConfig::from_kubeconfig(&path)
    }

    /// The API server and credentials a pod is given (its service account's token and CA).
    pub fn in_cluster() -> Result<KubeConfig, KubeError> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST")
            .map_err(|_| KubeError::Config("KUBERNETES_SERVICE_HOST is not set".into()))?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let dir = Path::new(SA_DIR);
        let namespace = std::fs::read_to_string(dir.join("namespace"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "default".into());
        Ok(KubeConfig {
            server: format!("https://{host}:{port}"),
            token_file: Some(dir.join("token")),
            ca_pem: Some(read(&dir.join("ca.crt"))?),
            namespace,
            ..KubeConfig::default()
        })
    }

    /// The API server and credentials of a kubeconfig file's current context.
    pub fn from_kubeconfig(path: &Path) -> Result<KubeConfig, KubeError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| KubeError::Config(format!("{}: {e}", path.display())))?;
        let kc: Kubeconfig = serde_yaml_ng::from_str(&text)
            .map_err(|e| KubeError::Config(format!("{}: {e}", path.display())))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let rel = |p: &PathBuf| {
            if p.is_absolute() {
                p.clone()
            } else {
                base.join(p)
            }
        };
        let ctx_name = kc
            .current_context
            .clone()
            .or_else(|| kc.contexts.first().map(|c| c.name.clone()))
            .ok_or_else(|| KubeError::Config(format!("{}: no context", path.display())))?;
        let ctx = kc
            .contexts
            .iter()
            .find(|c| c.name == ctx_name)
            .map(|c| &c.value)
            .ok_or_else(|| KubeError::Config(format!("context {ctx_name:?} not found")))?;
        let cluster = kc
            .clusters
            .iter()
            .find(|c| c.name == ctx.cluster)
            .map(|c| &c.value)
            .ok_or_else(|| KubeError::Config(format!("cluster {:?} not found", ctx.cluster)))?;
        let default_user = UserEntry::default();
        let user = match &ctx.user {
            Some(u) => kc
                .users
                .iter()
                .find(|x| &x.name == u)
                .map(|x| &x.value)
                .ok_or_else(|| KubeError::Config(format!("user {u:?} not found")))?,
            None => &default_user,
        };
        let ca_pem = match (&cluster.ca_data, &cluster.ca_file) {
            (Some(d), _) => Some(b64("certificate-authority-data", d)?),
            (None, Some(f)) => Some(read(&rel(f))?),
            _ => None,
        };
        let cert = match (&user.cert_data, &user.cert_file) {
            (Some(d), _) => Some(b64("client-certificate-data", d)?),
            (None, Some(f)) => Some(read(&rel(f))?),
            _ => None,
        };
        let key = match (&user.key_data, &user.key_file) {
            (Some(d), _) => Some(b64("client-key-data", d)?),
            (None, Some(f)) => Some(read(&rel(f))?),
            _ => None,
        };
        let identity_pem = match (cert, key) {
            (Some(mut c), Some(k)) => {
                c.push(b'\n');
                c.extend_from_slice(&k);
                Some(c)
            }
            _ => None,
        };
        Ok(KubeConfig {
            server: cluster.server.trim_end_matches('/').to_string(),
            token: user.token.clone(),
            token_file: user.token_file.as_ref().map(rel),
            ca_pem,
            identity_pem,
            insecure: cluster.insecure,
            namespace: ctx.namespace.clone().unwrap_or_else(|| "default".into()),
        })
    }
}

/// One event of a watch.
#[derive(Debug, Deserialize)]
pub struct WatchEvent {
    #[serde(rename = "type")]
    pub kind: String,
    pub object: Value,
}

/// A patch body and its content type.
#[derive(Clone, Debug, PartialEq)]
pub enum Patch {
    /// RFC 7386 JSON merge patch.
    Merge(Value),
    /// RFC 6902 JSON patch (a list of operations).
    Json(Value),
    /// Kubernetes strategic merge patch (built-in kinds only).
    Strategic(Value),
}

/// Requests sent, split into reads and writes (for metrics and benchmarks).
#[derive(Debug, Default)]
pub struct ApiStats {
    pub reads: std::sync::atomic::AtomicU64,
    pub writes: std::sync::atomic::AtomicU64,
}

impl ApiStats {
    fn count(&self, write: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        if write {
            self.writes.fetch_add(1, Relaxed);
        } else {
            self.reads.fetch_add(1, Relaxed);
        }
    }
}

/// A client of the Kubernetes API: its address, credentials and connections.
#[derive(Clone)]
pub struct Kube {
    pub cfg: KubeConfig,
    http: reqwest::Client,
    pub stats: std::sync::Arc<ApiStats>,
    user_agent: Option<String>,
    /// The token file's content and when it was read.
    token_cache: std::sync::Arc<parking_lot::Mutex<Option<(String, std::time::Instant)>>>,
    token_reread: Duration,
}

/// How long a token read from a file is used before the file is read again: projected
/// service-account tokens rotate, and client-go re-reads them once a minute too.
const TOKEN_REREAD: Duration = Duration::from_secs(60);

impl Kube {
    /// A client of the API server `cfg` names, with its credentials and TLS.
    pub fn new(cfg: KubeConfig) -> Result<Kube, KubeError> {
        let mut b = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .tcp_nodelay(true)
            .use_rustls_tls();
        if let Some(ca) = &cfg.ca_pem {
            for cert in reqwest::Certificate::from_pem_bundle(ca)
                .map_err(|e| KubeError::Config(format!("CA certificate: {e}")))?
            {
                b = b.add_root_certificate(cert);
            }
        }
        if let Some(id) = &cfg.identity_pem {
            b = b.identity(
                reqwest::Identity::from_pem(id)
                    .map_err(|e| KubeError::Config(format!("client certificate: {e}")))?,
            );
        }
        if cfg.insecure {
            b = b.danger_accept_invalid_certs(true);
        }
        let http = b
            .build()
            .map_err(|e| KubeError::Config(format!("HTTP client: {e}")))?;
        Ok(Kube {
            cfg,
            http,
            stats: Default::default(),
            user_agent: None,
            token_cache: Default::default(),
            token_reread: TOKEN_REREAD,
        })
    }

    /// Sets the User-Agent header (the operator names its identity there).
    pub fn with_user_agent(mut self, ua: &str) -> Kube {
        self.user_agent = Some(ua.to_string());
        self
    }

    /// The bearer token. A token file is read without blocking the runtime and at most once
    /// per [`TOKEN_REREAD`]; when it cannot be read, the last token read is used.
    async fn token(&self) -> Option<String> {
        if let Some(f) = &self.cfg.token_file {
            let cached = self.token_cache.lock().clone();
            if let Some((t, at)) = &cached {
                if at.elapsed() < self.token_reread {
                    return Some(t.clone());
                }
            }
            match tokio::fs::read_to_string(f).await {
                Ok(t) => {
                    let t = t.trim().to_string();
                    *self.token_cache.lock() = Some((t.clone(), std::time::Instant::now()));
                    return Some(t);
                }
                Err(e) => {
                    tracing::debug!(file = %f.display(), error = %e, "token file unreadable");
                    if let Some((t, _)) = cached {
                        return Some(t);
                    }
                }
            }
        }
        self.cfg.token.clone()
    }

    async fn send(
        &self,
        path: &str,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response, KubeError> {
        self.send_with(reqwest::Method::GET, path, None, timeout)
            .await
    }

    async fn send_with(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<(&'static str, Vec<u8>)>,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response, KubeError> {
        self.stats.count(method != reqwest::Method::GET);
        let mut req = self
            .http
            .request(method, format!("{}{}", self.cfg.server, path))
            .header("accept", "application/json");
        if let Some(t) = self.token().await {
            req = req.bearer_auth(t);
        }
        if let Some(ua) = &self.user_agent {
            req = req.header("user-agent", ua.as_str());
        }
        if let Some((ct, bytes)) = body {
            req = req.header("content-type", ct).body(bytes);
        }
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        let resp = req.send().await.map_err(|source| KubeError::Http {
            path: path.to_string(),
            source,
        })?;
        if !resp.status().is_success() {
            let code = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            let message = status_message(&text);
            return Err(KubeError::Status {
                path: path.to_string(),
                code,
                message,
            });
        }
        Ok(resp)
    }

    async fn json_of(path: &str, resp: reqwest::Response) -> Result<Value, KubeError> {
        resp.json().await.map_err(|e| KubeError::Decode {
            path: path.to_string(),
            reason: e.to_string(),
        })
    }

    /// GETs `path` as JSON.
    pub async fn get_json(&self, path: &str) -> Result<Value, KubeError> {
        let resp = self.send(path, Some(Duration::from_secs(30))).await?;
        Self::json_of(path, resp).await
    }

    /// Every item of a collection, following `continue` tokens; returns the items and the
    /// list's resourceVersion (to watch from). `query` is appended (`&labelSelector=...`).
    pub async fn list_all(
        &self,
        path: &str,
        query: &str,
    ) -> Result<(Vec<Value>, String), KubeError> {
        let mut items = Vec::new();
        let mut cont = String::new();
        loop {
            let mut q = format!("limit=500{query}");
            if !cont.is_empty() {
                q.push_str(&format!("&continue={}", encode(&cont)));
            }
            let page = self.get_json(&format!("{path}?{q}")).await?;
            if let Some(a) = page.get("items").and_then(Value::as_array) {
                items.extend(a.iter().cloned());
            }
            let meta = object::ListMeta::of(&page);
            cont = meta.continue_token.to_string();
            if cont.is_empty() {
                return Ok((items, meta.resource_version.to_string()));
            }
        }
    }

    async fn write(
        &self,
        method: reqwest::Method,
        path: &str,
        ct: &'static str,
        body: &Value,
    ) -> Result<Value, KubeError> {
        let resp = self
            .send_with(
                method,
                path,
                Some((ct, body.to_string().into_bytes())),
                Some(Duration::from_secs(30)),
            )
            .await?;
        Self::json_of(path, resp).await
    }

    /// POST to a collection.
    pub async fn create(&self, path: &str, obj: &Value) -> Result<Value, KubeError> {
        self.write(reqwest::Method::POST, path, "application/json", obj)
            .await
    }

    /// PUT of a whole object; its `metadata.resourceVersion` makes it conditional (409 when
    /// someone else wrote first).
    pub async fn replace(&self, path: &str, obj: &Value) -> Result<Value, KubeError> {
        self.write(reqwest::Method::PUT, path, "application/json", obj)
            .await
    }

    /// PATCHes `path` with `patch`; answers the object as it now is.
    pub async fn patch(&self, path: &str, patch: &Patch) -> Result<Value, KubeError> {
        let (ct, body) = match patch {
            Patch::Merge(v) => ("application/merge-patch+json", v),
            Patch::Json(v) => ("application/json-patch+json", v),
            Patch::Strategic(v) => ("application/strategic-merge-patch+json", v),
        };
        self.write(reqwest::Method::PATCH, path, ct, body).await
    }

    /// DELETE, only while the object still has this UID if one is given. A missing object
    /// is not an error: `Ok(false)`.
    pub async fn delete(&self, path: &str, uid: Option<&str>) -> Result<bool, KubeError> {
        let body = uid.map(|u| {
            let opts = serde_json::json!({"kind": "DeleteOptions", "apiVersion": "v1",
                "preconditions": {"uid": u}, "propagationPolicy": "Background"});
            ("application/json", opts.to_string().into_bytes())
        });
        let r = self
            .send_with(
                reqwest::Method::DELETE,
                path,
                body,
                Some(Duration::from_secs(30)),
            )
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some(404) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Opens a watch (`path` carries `watch=1` and the other query parameters).
    pub async fn watch(&self, path: &str) -> Result<WatchStream, KubeError> {
        let resp = self.send(path, None).await?;
        Ok(WatchStream {
            path: path.to_string(),
            resp,
            buf: Vec::new(),
        })
    }
}

/// A watch response, one JSON event per line.
pub struct WatchStream {
    path: String,
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl WatchStream {
    /// The next event; `None` when the server ended the watch. A line that is not an event is
    /// an error (the caller lists again).
    pub async fn next(&mut self, idle: Duration) -> Result<Option<WatchEvent>, KubeError> {
        loop {
            if let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=nl).collect();
                let line = line.trim_ascii();
                if line.is_empty() {
                    continue;
                }
                return serde_json::from_slice(line)
                    .map(Some)
                    .map_err(|e| KubeError::Decode {
                        path: self.path.clone(),
                        reason: format!("watch event: {e}"),
                    });
            }
            let chunk = tokio::time::timeout(idle, self.resp.chunk())
                .await
                .map_err(|_| KubeError::Decode {
                    path: self.path.clone(),
                    reason: format!("no event or bookmark for {idle:?}"),
                })?
                .map_err(|source| KubeError::Http {
                    path: self.path.clone(),
                    source,
                })?;
            match chunk {
                Some(c) => self.buf.extend_from_slice(&c),
                None => return Ok(None),
            }
        }
    }
}

pub use crate::url::encode;

/// A random suffix of `n` characters from the alphabet Kubernetes uses for `generateName`
/// (no vowels, no look-alike digits, so that no word is spelled).
pub fn random_suffix(n: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..n)
        .map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char)
        .collect()
}

/// A DNS-1123 label: what Kubernetes requires of most names (at most 63 characters of
/// lowercase letters, digits and '-', starting and ending with a letter or digit).
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::scratch::ScratchFile;

    #[test]
    fn kubeconfig_with_token_and_inline_ca() {
        let file = ScratchFile::new(
            "config",
            "apiVersion: v1\nkind: Config\ncurrent-context: dev\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443/\n    certificate-authority-data: aGVsbG8=\nusers:\n- name: u\n  user:\n    token: abc\ncontexts:\n- name: dev\n  context:\n    cluster: c\n    user: u\n    namespace: team\n",
        );
        let c = KubeConfig::from_kubeconfig(file.path()).unwrap();
        assert_eq!(c.server, "https://127.0.0.1:6443");
        assert_eq!(c.token.as_deref(), Some("abc"));
        assert_eq!(c.ca_pem.as_deref(), Some(&b"hello"[..]));
        assert_eq!(c.namespace, "team");
        file.rewrite("current-context: x\ncontexts: []\n");
        let e = KubeConfig::from_kubeconfig(file.path()).unwrap_err();
        assert!(e.to_string().contains("\"x\""), "{e}");
    }

    fn with_token_file(path: &Path) -> Kube {
        Kube::new(KubeConfig {
            server: "http://127.0.0.1:1".into(),
            token: None,
            token_file: Some(path.to_path_buf()),
            ca_pem: None,
            identity_pem: None,
            insecure: false,
            namespace: "default".into(),
        })
        .unwrap()
    }

    #[tokio::test]
    async fn a_token_file_is_read_once_per_interval_and_survives_a_bad_read() {
        let file = ScratchFile::new("token", "first\n");
        let kube = with_token_file(file.path());
        assert_eq!(kube.token().await.as_deref(), Some("first"));
        file.rewrite("second\n");
        assert_eq!(
            kube.token().await.as_deref(),
            Some("first"),
            "not read again on every request"
        );
        let mut rotating = kube.clone();
        rotating.token_reread = Duration::ZERO;
        assert_eq!(rotating.token().await.as_deref(), Some("second"));
        std::fs::remove_file(file.path()).unwrap();
        assert_eq!(
            rotating.token().await.as_deref(),
            Some("second"),
            "the last token read outlives a missing file"
        );
    }
}
