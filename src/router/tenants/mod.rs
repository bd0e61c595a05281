//! Tenants: who calls the router, and what each may use.
//!
//! With `--tenants-file`, every inference request belongs to a tenant: the one whose API key it
//! carries (`Authorization: Bearer`, looked up by its SHA-256: the file holds no key), or, with
//! `--tenant-header`, the one a trusted front names in that header (taken only from the
//! addresses of `--tenant-header-trusted-from`). Its class is the tenant's default, or the one
//! it asks for in `x-priority-class` among those it may use. Admission (`admission`) then
//! applies the tenant's limits and the classes' queues. The file is read again when it changes
//! (a Kubernetes Secret mounted as a file included); a file that does not parse leaves the
//! keys and limits in force, with an error logged and counted.
//!
//! - `table` (pure): the file, checked.
//! - `admission`: limits, classes, fair sharing; tickets.
//! - `usage` (pure): output tokens read from an answer as it is relayed.

pub mod admission;
pub mod table;
pub mod usage;

use crate::router::policy::TextForm;
use crate::router::request::RouteInfo;
use admission::Admission;
use http::HeaderMap;
use parking_lot::RwLock;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use table::Table;

/// The header a tenant asks for a priority class in.
pub const CLASS_HEADER: &str = "x-priority-class";
/// How often the tenants file is looked at for changes.
pub const RELOAD_EVERY: Duration = Duration::from_secs(2);

/// Why the tenants file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TenantsError {
    #[error("tenants file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "tenants file {path}: larger than {} bytes; is it the right file?",
        table::MAX_FILE_BYTES
    )]
    TooLarge { path: PathBuf },
    #[error("tenants file {path}: {source}")]
    Table {
        path: PathBuf,
        source: table::TableError,
    },
}

/// Why a request names no tenant it may act as.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("missing or unknown API key (send Authorization: Bearer <key>)")]
    UnknownKey,
    #[error(
        "the {header} header names a tenant only when a trusted front sends it; \
         authenticate with your API key instead"
    )]
    UntrustedHeader { header: String },
    #[error("the trusted front named tenant {0:?}, which the tenants file does not define")]
    UnknownTenant(String),
    #[error("no priority class {asked:?} (classes: {known})")]
    UnknownClass { asked: String, known: String },
    #[error("tenant {tenant:?} may not use priority class {asked:?} (its classes: {allowed})")]
    ClassNotAllowed {
        tenant: String,
        asked: String,
        allowed: String,
    },
}

impl IdentityError {
    /// The HTTP status the refusal is answered with.
    pub fn status(&self) -> u16 {
        match self {
            IdentityError::UnknownKey => 401,
            IdentityError::UnknownClass { .. } => 400,
            _ => 403,
        }
    }
}

/// An address block, `10.0.0.0/8` or `::1/128` (a bare address is its own block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Cidr, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let net: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not an address or address/prefix"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix must be 0 to {max}"))?,
            None => max,
        };
        Ok(Cidr { net, prefix })
    }
}

impl Cidr {
    /// Whether `ip` is in the range (an IPv4-mapped IPv6 address as its IPv4 one).
    pub fn contains(&self, ip: IpAddr) -> bool {
        // An IPv4 client on a dual-stack socket shows as ::ffff:a.b.c.d.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// Who a request is: its tenant and its class (indices into the table it was read under).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub tenant: usize,
    pub class: usize,
}

/// How a request names its tenant besides its key.
#[derive(Clone, Debug, Default)]
pub struct TrustedHeader {
    /// Lower case.
    pub name: String,
    pub from: Vec<Cidr>,
}

/// Names the caller of a request under `table`. Pure: the headers and the peer's address.
pub fn identify(
    table: &Table,
    trusted: Option<&TrustedHeader>,
    headers: &HeaderMap,
    peer: Option<IpAddr>,
) -> Result<Caller, IdentityError> {
    let named = trusted.and_then(|t| headers.get(t.name.as_str()).map(|v| (t, v)));
    let tenant = match named {
        Some((t, value)) => {
            if !peer.is_some_and(|ip| t.from.iter().any(|c| c.contains(ip))) {
                return Err(IdentityError::UntrustedHeader {
                    header: t.name.clone(),
                });
            }
            let name = value.to_str().unwrap_or("").trim();
            table
                .by_name(name)
                .ok_or_else(|| IdentityError::UnknownTenant(name.chars().take(64).collect()))?
        }
        None => headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(crate::auth::bearer_token)
            .and_then(|key| table.by_key_hash(&table::key_digest(key)))
            .ok_or(IdentityError::UnknownKey)?,
    };
    let t = &table.tenants[tenant];
    let class = match headers.get(CLASS_HEADER) {
        None => t.classes[0],
        Some(v) => {
            let asked = v.to_str().unwrap_or("").trim();
            let names = |ids: &mut dyn Iterator<Item = usize>| {
                ids.map(|i| &*table.classes[i].name)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let Some(c) = table.class_named(asked) else {
                return Err(IdentityError::UnknownClass {
                    asked: asked.chars().take(64).collect(),
                    known: names(&mut (0..table.classes.len())),
                });
            };
            if !t.classes.contains(&c) {
                return Err(IdentityError::ClassNotAllowed {
                    tenant: t.name.to_string(),
                    asked: asked.to_string(),
                    allowed: names(&mut t.classes.iter().copied()),
                });
            }
            c
        }
    };
    Ok(Caller { tenant, class })
}

/// Prompt tokens as the router sees a request: its token ids when it has them, else about
/// four characters a token of its text, or of its body when the text was not read (no tenant
/// has a token rate, and no policy reads it).
pub fn prompt_tokens(info: &RouteInfo, body_len: usize) -> u64 {
    if info.form == TextForm::Text && info.text.is_empty() {
        return (body_len / 4) as u64;
    }
    crate::router::policy::text_tokens(&info.text, info.form) as u64
}

/// The tenants of a router: the file's table as last read, admission, and how callers are
/// named.
pub struct Tenants {
    path: PathBuf,
    table: RwLock<Arc<Table>>,
    /// What the file was when last read.
    seen: parking_lot::Mutex<Option<Stamp>>,
    pub trusted: Option<TrustedHeader>,
    pub admission: Arc<Admission>,
    pub reloads: AtomicU64,
    pub reload_errors: AtomicU64,
}

use crate::config::{file_stamp as stamp, FileStamp as Stamp};
use crate::telemetry::Family;

// The `/metrics` families this file writes, each declared once.
const TENANTS: Family = Family::gauge(
    "rbgctl_router_tenants",
    "Tenants in the tenants file in force.",
);
const TENANTS_RELOADS_TOTAL: Family = Family::counter(
    "rbgctl_router_tenants_reloads_total",
    "Times the tenants file was read again after a change.",
);
const TENANTS_RELOAD_ERRORS_TOTAL: Family = Family::counter(
    "rbgctl_router_tenants_reload_errors_total",
    "Changes of the tenants file that were not taken (unreadable or invalid).",
);

fn read_table(path: &Path) -> Result<Table, TenantsError> {
    let read = |source| TenantsError::Read {
        path: path.to_path_buf(),
        source,
    };
    if std::fs::metadata(path).map_err(read)?.len() > table::MAX_FILE_BYTES {
        return Err(TenantsError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    let text = std::fs::read_to_string(path).map_err(read)?;
    Table::parse(&text).map_err(|source| TenantsError::Table {
        path: path.to_path_buf(),
        source,
    })
}

impl Tenants {
    /// Reads `path` (an error stops the router: it would otherwise refuse everyone).
    /// `capacity` bounds the requests running at once; `replicas` routers share each
    /// tenant's limits.
    pub fn load(
        path: &Path,
        trusted: Option<TrustedHeader>,
        capacity: Option<usize>,
        replicas: usize,
    ) -> Result<Tenants, TenantsError> {
        let seen = stamp(path).ok();
        let table = read_table(path)?;
        tracing::info!(path = %path.display(), tenants = table.tenants.len(), keys = table.keys(),
            classes = table.classes.len(), "tenants file read");
        Ok(Tenants {
            path: path.to_path_buf(),
            table: RwLock::new(Arc::new(table)),
            seen: parking_lot::Mutex::new(seen),
            trusted,
            admission: Admission::new(capacity, replicas),
            reloads: AtomicU64::new(0),
            reload_errors: AtomicU64::new(0),
        })
    }

    /// The table in force.
    pub fn table(&self) -> Arc<Table> {
        self.table.read().clone()
    }

    /// Who calls with `headers`, under the table in force (the peer's address taken from the
    /// connection being served).
    pub fn caller(&self, headers: &HeaderMap) -> Result<(Arc<Table>, Caller), IdentityError> {
        let table = self.table();
        let peer = crate::http_server::peer().map(|p| p.ip());
        let caller = identify(&table, self.trusted.as_ref(), headers, peer)?;
        Ok((table, caller))
    }

    /// Reads the file again if it changed since last read. A file that cannot be read or
    /// does not parse leaves the table in force (logged and counted once per change).
    pub fn reload_if_changed(&self) {
        let now = match stamp(&self.path) {
            Ok(s) => Some(s),
            Err(e) => {
                let mut seen = self.seen.lock();
                if seen.take().is_some() {
                    self.reload_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(path = %self.path.display(), error = %e,
                        "tenants file unreadable: the keys and limits read before stay in force");
                }
                return;
            }
        };
        {
            let mut seen = self.seen.lock();
            if *seen == now {
                return;
            }
            *seen = now;
        }
        match read_table(&self.path) {
            Ok(t) => {
                tracing::info!(path = %self.path.display(), tenants = t.tenants.len(),
                    keys = t.keys(), "tenants file read again");
                *self.table.write() = Arc::new(t);
                self.reloads.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                self.reload_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e,
                    "tenants file not taken: the keys and limits read before stay in force");
            }
        }
    }

    /// Looks at the file every [`RELOAD_EVERY`] for as long as the runtime runs.
    pub fn watch(self: &Arc<Self>) {
        let t = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RELOAD_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let t = t.clone();
                // A file read is blocking I/O.
                let _ = tokio::task::spawn_blocking(move || t.reload_if_changed()).await;
            }
        });
    }

    /// The tenants' families of `/metrics`.
    pub fn render(&self, p: &mut crate::telemetry::PromText) {
        let table = self.table();
        p.single(&TENANTS, table.tenants.len() as f64);
        p.atomic(&TENANTS_RELOADS_TOTAL, &self.reloads);
        p.atomic(&TENANTS_RELOAD_ERRORS_TOTAL, &self.reload_errors);
        self.admission.render(&table, p);
    }
}

#[cfg(test)]
mod tests {
    use super::table::key_entry;
    use super::*;
    use crate::testkit::scratch::ScratchFile;
    use http::HeaderValue;

    fn table() -> Table {
        Table::parse(&format!(
            "[[tenant]]\nname = \"a\"\nkeys = [\"{}\"]\nclasses = [\"interactive\", \"batch\"]\n\
             [[tenant]]\nname = \"b\"\nkeys = [\"{}\"]\nclasses = [\"batch\"]\n",
            key_entry("key-a"),
            key_entry("key-b")
        ))
        .unwrap()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.insert(*n, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn a_key_names_its_tenant_and_the_class_header_is_checked() {
        let t = table();
        let who = |h: &[(&'static str, &str)]| identify(&t, None, &headers(h), None);
        assert_eq!(
            who(&[("authorization", "Bearer key-a")]),
            Ok(Caller {
                tenant: 0,
                class: 0
            })
        );
        assert_eq!(
            who(&[("authorization", "Bearer key-b")]),
            Ok(Caller {
                tenant: 1,
                class: 1
            }),
            "b's default is batch"
        );
        assert_eq!(
            who(&[("authorization", "Bearer key-a"), (CLASS_HEADER, "batch")])
                .unwrap()
                .class,
            1
        );
        let e = who(&[
            ("authorization", "Bearer key-b"),
            (CLASS_HEADER, "interactive"),
        ])
        .unwrap_err();
        assert_eq!(e.status(), 403);
        assert!(e.to_string().contains("its classes: batch"), "{e}");
        let e = who(&[("authorization", "Bearer key-a"), (CLASS_HEADER, "gold")]).unwrap_err();
        assert_eq!(e.status(), 400);
        for bad in [
            &[][..],
            &[("authorization", "Bearer key-c")],
            &[("authorization", "key-a")],
        ] {
            assert_eq!(who(bad), Err(IdentityError::UnknownKey));
        }
    }

    #[test]
    fn the_tenant_header_counts_only_from_the_trusted_front() {
        let t = table();
        let trusted = TrustedHeader {
            name: "x-tenant".into(),
            from: vec!["10.0.0.0/8".parse().unwrap(), "::1".parse().unwrap()],
        };
        let front: IpAddr = "10.1.2.3".parse().unwrap();
        let h = headers(&[("x-tenant", "b")]);
        assert_eq!(
            identify(&t, Some(&trusted), &h, Some(front))
                .unwrap()
                .tenant,
            1
        );
        assert_eq!(
            identify(&t, Some(&trusted), &h, Some("::1".parse().unwrap()))
                .unwrap()
                .tenant,
            1
        );
        // A mapped IPv4 client is matched as IPv4.
        assert!(identify(
            &t,
            Some(&trusted),
            &h,
            Some("::ffff:10.9.9.9".parse().unwrap())
        )
        .is_ok());
        // Forged: from elsewhere, the header is refused even with another tenant's key.
        let forged = headers(&[("x-tenant", "b"), ("authorization", "Bearer key-a")]);
        let e = identify(
            &t,
            Some(&trusted),
            &forged,
            Some("192.168.1.1".parse().unwrap()),
        )
        .unwrap_err();
        assert_eq!(e.status(), 403);
        assert!(matches!(e, IdentityError::UntrustedHeader { .. }));
        assert_eq!(
            identify(&t, Some(&trusted), &forged, None)
                .unwrap_err()
                .status(),
            403
        );
        // Without the header the key counts; the front naming an unknown tenant is refused.
        let keyed = headers(&[("authorization", "Bearer key-a")]);
        assert_eq!(
            identify(&t, Some(&trusted), &keyed, None).unwrap().tenant,
            0
        );
        let e = identify(
            &t,
            Some(&trusted),
            &headers(&[("x-tenant", "zz")]),
            Some(front),
        )
        .unwrap_err();
        assert_eq!(e, IdentityError::UnknownTenant("zz".into()));
        // Not configured: the header means nothing.
        assert_eq!(
            identify(&t, None, &h, Some(front)),
            Err(IdentityError::UnknownKey)
        );
    }

    #[test]
    fn address_blocks() {
        let c: Cidr = "192.168.0.0/16".parse().unwrap();
        assert!(c.contains("192.168.7.1".parse().unwrap()));
        assert!(!c.contains("192.169.0.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        for bad in ["10.0.0.0/33", "x", "::/129", "1.2.3.4/"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_garbage_file_leaves_the_keys_in_force() {
        let file = ScratchFile::new(
            "tenants.toml",
            format!(
                "[[tenant]]\nname = \"a\"\nkeys = [\"{}\"]\n",
                key_entry("k1")
            ),
        );
        let t = Tenants::load(file.path(), None, None, 1).unwrap();
        assert!(t.table().by_key_hash(&table::hash_key("k1")).is_some());
        file.rewrite("garbage [[[");
        t.reload_if_changed();
        assert_eq!(t.reload_errors.load(Ordering::Relaxed), 1);
        assert!(t.table().by_key_hash(&table::hash_key("k1")).is_some());
        // Unchanged: not read again, not counted again.
        t.reload_if_changed();
        assert_eq!(t.reload_errors.load(Ordering::Relaxed), 1);
        file.rewrite(format!(
            "[[tenant]]\nname = \"a\"\nkeys = [\"{}\"]\n\n",
            key_entry("k2")
        ));
        t.reload_if_changed();
        assert_eq!(t.reloads.load(Ordering::Relaxed), 1);
        assert!(t.table().by_key_hash(&table::hash_key("k1")).is_none());
        assert!(t.table().by_key_hash(&table::hash_key("k2")).is_some());
        assert!(Tenants::load(&file.sibling("none.toml"), None, None, 1).is_err());
    }
}
