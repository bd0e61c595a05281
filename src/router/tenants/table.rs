//! The tenants file (`--tenants-file`): who calls the router, what each caller may use, and the
//! priority classes requests wait in. Pure: text in, a checked [`Table`] out (or an error
//! naming the entry to fix); `tenants::Tenants` reads it from disk and keeps it current.
//!
//! ```toml
//! [[class]]                      # served in the order listed: the first class first
//! name = "interactive"
//! queue_size = 256               # requests waiting in this class, all tenants together
//! queue_ttl_secs = 10            # longest wait; then 503
//! engine_priority = 10           # written as the body's `priority` for the engine's scheduler
//!
//! [[class]]
//! name = "batch"
//! queue_size = 1024
//! queue_ttl_secs = 60
//! max_running = 56               # of the capacity: the rest stays free for interactive
//!
//! [[tenant]]
//! name = "chat"
//! keys = ["sha256:<hex of SHA-256 of the API key>"]   # `printf %s "$KEY" | sha256sum`
//! classes = ["interactive", "batch"]  # the first is its default; the rest it may ask for
//! weight = 2                     # its share against other tenants in a class (default 1)
//! requests_per_second = 20       # default: no limit
//! tokens_per_second = 40000      # prompt tokens on admission, output tokens settled at the end
//! max_concurrent = 64            # its requests running and waiting at once
//! ```

use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Largest tenants file read (a 10,000-tenant file with two keys each is about 2 MiB).
pub const MAX_FILE_BYTES: u64 = 16 << 20;
/// Most tenants in one file.
pub const MAX_TENANTS: usize = 100_000;
/// Most classes.
pub const MAX_CLASSES: usize = 16;
/// Longest tenant or class name (names are metric labels and pool namespaces).
pub const MAX_NAME_LEN: usize = 64;

/// What is wrong in a tenants file: not TOML, or an entry named with what is wrong with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TableError {
    #[error("not valid TOML for a tenants file: {0}")]
    Parse(String),
    #[error("{what} {name:?}: {why}")]
    Entry {
        what: &'static str,
        name: String,
        why: String,
    },
    #[error("{0}")]
    File(String),
}

fn entry(what: &'static str, name: &str, why: impl Into<String>) -> TableError {
    TableError::Entry {
        what,
        name: name.to_string(),
        why: why.into(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    #[serde(default, rename = "class")]
    classes: Vec<ClassDoc>,
    #[serde(default, rename = "tenant")]
    tenants: Vec<TenantDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClassDoc {
    name: String,
    #[serde(default = "default_queue_size")]
    queue_size: usize,
    #[serde(default = "default_queue_ttl_secs")]
    queue_ttl_secs: f64,
    engine_priority: Option<i64>,
    max_running: Option<usize>,
}

fn default_queue_size() -> usize {
    256
}

fn default_queue_ttl_secs() -> f64 {
    10.0
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantDoc {
    name: String,
    #[serde(default)]
    keys: Vec<String>,
    #[serde(default)]
    classes: Vec<String>,
    #[serde(default = "one")]
    weight: f64,
    requests_per_second: Option<f64>,
    requests_burst: Option<f64>,
    tokens_per_second: Option<f64>,
    tokens_burst: Option<f64>,
    max_concurrent: Option<usize>,
}

fn one() -> f64 {
    1.0
}

/// A priority class: requests of earlier classes leave the queue first.
#[derive(Clone, Debug, PartialEq)]
pub struct Class {
    pub name: Arc<str>,
    /// Requests waiting in it at once, all tenants together; beyond it, 503.
    pub queue_size: usize,
    /// Longest wait in it; then 503.
    pub ttl: Duration,
    /// The `priority` the router writes into its requests' bodies (replacing any the client
    /// sent), for engines that schedule by it (SGLang's and vLLM's priority scheduling).
    /// `None`: the body is left as sent.
    pub engine_priority: Option<i64>,
    /// Requests of this class running at once, all tenants together: the rest of the
    /// service's capacity stays free for the other classes. `None`: all of it.
    pub max_running: Option<usize>,
}

/// A rate with its burst (tokens a full bucket holds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    pub per_second: f64,
    pub burst: f64,
}

/// What a tenant may use.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Limits {
    pub requests: Option<Rate>,
    /// Prompt and output tokens together.
    pub tokens: Option<Rate>,
    /// Its requests running and waiting at once.
    pub max_concurrent: Option<usize>,
}

/// One of `replicas` routers' share of a count (a cap, a capacity): divided rounding up, never
/// below 1.
pub fn share_of(n: usize, replicas: usize) -> usize {
    n.div_ceil(replicas.max(1)).max(1)
}

impl Limits {
    /// These limits for one of `replicas` routers sharing a tenant's traffic evenly: rates and
    /// bursts divided, the concurrency cap by [`share_of`].
    pub fn share(&self, replicas: usize) -> Limits {
        let n = replicas.max(1) as f64;
        let rate = |r: Rate| Rate {
            per_second: r.per_second / n,
            burst: (r.burst / n).max(1.0),
        };
        Limits {
            requests: self.requests.map(rate),
            tokens: self.tokens.map(rate),
            max_concurrent: self.max_concurrent.map(|m| share_of(m, replicas)),
        }
    }
}

/// One caller of the router.
#[derive(Clone, Debug, PartialEq)]
pub struct Tenant {
    pub name: Arc<str>,
    /// Indices into [`Table::classes`]: the first its default, all of them classes it may ask
    /// for.
    pub classes: Vec<usize>,
    /// Its share against other tenants waiting in one class.
    pub weight: f64,
    pub limits: Limits,
}

/// The tenants file, checked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    pub classes: Vec<Class>,
    pub tenants: Vec<Tenant>,
    /// SHA-256 of a key → its tenant.
    by_key: HashMap<[u8; 32], usize, foldhash::fast::RandomState>,
    by_name: HashMap<Arc<str>, usize, foldhash::fast::RandomState>,
}

/// The classes a file that lists none gets.
fn default_classes() -> Vec<Class> {
    vec![
        Class {
            name: "interactive".into(),
            queue_size: 256,
            ttl: Duration::from_secs(10),
            engine_priority: None,
            max_running: None,
        },
        Class {
            name: "batch".into(),
            queue_size: 1024,
            ttl: Duration::from_secs(60),
            engine_priority: None,
            max_running: None,
        },
    ]
}

/// Whether `name` may name a tenant or a class: 1 to 64 of `A-Z a-z 0-9 . _ -`.
pub fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// `sha256:<64 hex digits>` as its 32 bytes.
fn key_hash(text: &str) -> Option<[u8; 32]> {
    let hex = text.strip_prefix("sha256:")?;
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16);
        out[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Some(out)
}

/// The SHA-256 of an API key, as the table looks keys up.
pub fn hash_key(key: &str) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(key.as_bytes()).into()
}

/// [`hash_key`], remembered for the keys this thread saw last: a client sends the same key
/// on every request, and a digest costs a thousand times a lookup. A direct-mapped cache per
/// thread (no lock; the router serves a connection on one thread) of [`DIGEST_SLOTS`] keys of at
/// most [`DIGEST_KEY_MAX`] bytes; longer keys are hashed each time. It maps a key to its digest
/// only, so a new tenants file needs nothing forgotten.
pub fn key_digest(key: &str) -> [u8; 32] {
    use std::cell::RefCell;
    use std::hash::BuildHasher as _;
    /// A slot: a key and its digest.
    type Slot = Option<(Box<str>, [u8; 32])>;
    thread_local! {
        static SEEN: (foldhash::fast::RandomState, RefCell<Vec<Slot>>) =
            (foldhash::fast::RandomState::default(), RefCell::new(vec![None; DIGEST_SLOTS]));
    }
    if key.len() > DIGEST_KEY_MAX {
        return hash_key(key);
    }
    SEEN.with(|(hasher, slots)| {
        let slot = hasher.hash_one(key) as usize % DIGEST_SLOTS;
        let mut slots = slots.borrow_mut();
        match &slots[slot] {
            Some((k, digest)) if **k == *key => *digest,
            _ => {
                let digest = hash_key(key);
                slots[slot] = Some((key.into(), digest));
                digest
            }
        }
    })
}

/// Keys [`key_digest`] remembers per thread ...
pub const DIGEST_SLOTS: usize = 256;
/// ... each of at most this many bytes.
pub const DIGEST_KEY_MAX: usize = 256;

/// `key`'s line for a tenants file: `sha256:<hex>`.
pub fn key_entry(key: &str) -> String {
    format!("sha256:{}", crate::hash::hex(&hash_key(key)))
}

fn rate(
    tenant: &str,
    field: &str,
    per_second: Option<f64>,
    burst: Option<f64>,
) -> Result<Option<Rate>, TableError> {
    let Some(per_second) = per_second else {
        if burst.is_some() {
            return Err(entry(
                "tenant",
                tenant,
                format!("{field}_burst needs {field}_per_second"),
            ));
        }
        return Ok(None);
    };
    if !(per_second.is_finite() && per_second > 0.0) {
        return Err(entry(
            "tenant",
            tenant,
            format!("{field}_per_second must be a positive number, got {per_second}"),
        ));
    }
    let burst = burst.unwrap_or(per_second.max(1.0));
    if !(burst.is_finite() && burst >= 1.0) {
        return Err(entry(
            "tenant",
            tenant,
            format!("{field}_burst must be at least 1, got {burst}"),
        ));
    }
    Ok(Some(Rate { per_second, burst }))
}

impl Table {
    /// Parses and checks a tenants file's text.
    pub fn parse(text: &str) -> Result<Table, TableError> {
        let doc: FileDoc = toml::from_str(text).map_err(|e| TableError::Parse(e.to_string()))?;
        let classes = if doc.classes.is_empty() {
            default_classes()
        } else {
            Self::classes(doc.classes)?
        };
        if doc.tenants.len() > MAX_TENANTS {
            return Err(TableError::File(format!(
                "{} tenants: at most {MAX_TENANTS} in one file",
                doc.tenants.len()
            )));
        }
        let mut t = Table {
            classes,
            ..Table::default()
        };
        for d in doc.tenants {
            t.add(d)?;
        }
        Ok(t)
    }

    fn classes(docs: Vec<ClassDoc>) -> Result<Vec<Class>, TableError> {
        if docs.len() > MAX_CLASSES {
            return Err(TableError::File(format!(
                "{} classes: at most {MAX_CLASSES}",
                docs.len()
            )));
        }
        let mut out: Vec<Class> = Vec::with_capacity(docs.len());
        for c in docs {
            if !valid_name(&c.name) {
                return Err(entry(
                    "class",
                    &c.name,
                    "a name is 1 to 64 of A-Z a-z 0-9 . _ -",
                ));
            }
            if out.iter().any(|o| *o.name == *c.name) {
                return Err(entry("class", &c.name, "listed twice"));
            }
            if c.max_running == Some(0) {
                return Err(entry(
                    "class",
                    &c.name,
                    "max_running 0 would run none of its requests: leave it out for no cap",
                ));
            }
            if !(c.queue_ttl_secs.is_finite() && c.queue_ttl_secs > 0.0) {
                return Err(entry(
                    "class",
                    &c.name,
                    format!(
                        "queue_ttl_secs must be a positive number, got {}",
                        c.queue_ttl_secs
                    ),
                ));
            }
            out.push(Class {
                name: c.name.into(),
                queue_size: c.queue_size,
                ttl: Duration::from_secs_f64(c.queue_ttl_secs),
                engine_priority: c.engine_priority,
                max_running: c.max_running,
            });
        }
        Ok(out)
    }

    fn add(&mut self, d: TenantDoc) -> Result<(), TableError> {
        let name = d.name.as_str();
        if !valid_name(name) {
            return Err(entry(
                "tenant",
                name,
                "a name is 1 to 64 of A-Z a-z 0-9 . _ -",
            ));
        }
        if self.by_name.contains_key(name) {
            return Err(entry("tenant", name, "listed twice"));
        }
        if !(d.weight.is_finite() && d.weight > 0.0) {
            return Err(entry(
                "tenant",
                name,
                format!("weight must be a positive number, got {}", d.weight),
            ));
        }
        if d.max_concurrent == Some(0) {
            return Err(entry(
                "tenant",
                name,
                "max_concurrent 0 would refuse every request: remove the tenant, or leave the \
                 field out for no limit",
            ));
        }
        let classes = if d.classes.is_empty() {
            vec![0]
        } else {
            let mut ids = Vec::with_capacity(d.classes.len());
            for c in &d.classes {
                let Some(i) = self.classes.iter().position(|k| *k.name == **c) else {
                    let known: Vec<&str> = self.classes.iter().map(|k| &*k.name).collect();
                    return Err(entry(
                        "tenant",
                        name,
                        format!("class {c:?} is not defined (classes: {})", known.join(", ")),
                    ));
                };
                if !ids.contains(&i) {
                    ids.push(i);
                }
            }
            ids
        };
        let idx = self.tenants.len();
        for k in &d.keys {
            // The error never repeats the entry: it may be a key pasted by mistake.
            let hash = key_hash(k).ok_or_else(|| {
                entry(
                    "tenant",
                    name,
                    "a key is written as sha256:<64 hex digits>, the SHA-256 of the key \
                     (printf %s \"$KEY\" | sha256sum), never the key itself",
                )
            })?;
            if let Some(other) = self.by_key.insert(hash, idx) {
                return Err(entry(
                    "tenant",
                    name,
                    format!(
                        "a key is also tenant {:?}'s: a key names one tenant",
                        self.tenants.get(other).map_or(name, |t| &*t.name)
                    ),
                ));
            }
        }
        let name: Arc<str> = d.name.into();
        self.by_name.insert(name.clone(), idx);
        self.tenants.push(Tenant {
            limits: Limits {
                requests: rate(&name, "requests", d.requests_per_second, d.requests_burst)?,
                tokens: rate(&name, "tokens", d.tokens_per_second, d.tokens_burst)?,
                max_concurrent: d.max_concurrent,
            },
            name,
            classes,
            weight: d.weight,
        });
        Ok(())
    }

    /// The tenant holding the key whose SHA-256 is `hash`.
    pub fn by_key_hash(&self, hash: &[u8; 32]) -> Option<usize> {
        self.by_key.get(hash).copied()
    }

    /// The index of the tenant named `name`.
    pub fn by_name(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The index of the class named `name`.
    pub fn class_named(&self, name: &str) -> Option<usize> {
        self.classes.iter().position(|c| *c.name == *name)
    }

    /// Whether any tenant has a token rate (its requests' prompts are then counted from
    /// their text, which the router must read).
    pub fn counts_tokens(&self) -> bool {
        self.tenants.iter().any(|t| t.limits.tokens.is_some())
    }

    /// Keys known, all tenants together.
    pub fn keys(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(tenants: &str) -> String {
        format!(
            "[[class]]\nname = \"interactive\"\nqueue_size = 4\nqueue_ttl_secs = 2\n\
             [[class]]\nname = \"batch\"\n{tenants}"
        )
    }

    #[test]
    fn a_file_reads_into_classes_tenants_and_hashed_keys() {
        let text = file(&format!(
            "engine_priority = -3\n[[tenant]]\nname = \"a\"\nkeys = [\"{}\"]\nclasses = [\"batch\", \"interactive\"]\n\
             weight = 2\nrequests_per_second = 5\ntokens_per_second = 1000\nmax_concurrent = 3\n\
             [[tenant]]\nname = \"b\"\nkeys = [\"{}\", \"{}\"]\n",
            key_entry("key-a"),
            key_entry("key-b1"),
            key_entry("key-b2"),
        ));
        let t = Table::parse(&text).unwrap();
        assert_eq!(t.classes.len(), 2);
        assert_eq!(t.classes[0].queue_size, 4);
        assert_eq!(t.classes[0].ttl, Duration::from_secs(2));
        assert_eq!(t.classes[1].queue_size, 256, "the default");
        assert_eq!(t.classes[1].engine_priority, Some(-3));
        assert_eq!(t.classes[0].engine_priority, None);
        let a = t.by_key_hash(&hash_key("key-a")).unwrap();
        assert_eq!(&*t.tenants[a].name, "a");
        assert_eq!(t.tenants[a].classes, vec![1, 0], "batch first: its default");
        assert_eq!(t.tenants[a].weight, 2.0);
        assert_eq!(
            t.tenants[a].limits.requests,
            Some(Rate {
                per_second: 5.0,
                burst: 5.0
            })
        );
        assert_eq!(t.tenants[a].limits.max_concurrent, Some(3));
        let b = t.by_name("b").unwrap();
        assert_eq!(t.by_key_hash(&hash_key("key-b2")), Some(b));
        assert_eq!(t.tenants[b].classes, vec![0], "the first class by default");
        assert_eq!(t.tenants[b].limits, Limits::default());
        assert_eq!(t.by_key_hash(&hash_key("key-c")), None);
        // Remembered digests are the digests, for keys that share a slot, keys seen again,
        // and keys too long to remember.
        let long = "k".repeat(DIGEST_KEY_MAX + 1);
        for round in 0..2 {
            for i in 0..DIGEST_SLOTS * 3 {
                let key = format!("key-{i}");
                assert_eq!(key_digest(&key), hash_key(&key), "{key}, round {round}");
            }
            assert_eq!(key_digest(&long), hash_key(&long));
        }
        assert_eq!(t.keys(), 3);
    }

    #[test]
    fn a_file_without_classes_gets_interactive_then_batch() {
        let t = Table::parse("[[tenant]]\nname = \"x\"\n").unwrap();
        let names: Vec<&str> = t.classes.iter().map(|c| &*c.name).collect();
        assert_eq!(names, ["interactive", "batch"]);
        assert_eq!(Table::parse("").unwrap().tenants.len(), 0);
    }

    #[test]
    fn mistakes_are_named_and_a_key_is_never_repeated() {
        let cases = [
            ("[[tenant]]\nname = \"a b\"\n", "1 to 64"),
            (
                "[[tenant]]\nname = \"a\"\n[[tenant]]\nname = \"a\"\n",
                "listed twice",
            ),
            ("[[tenant]]\nname = \"a\"\nweight = 0\n", "weight"),
            (
                "[[tenant]]\nname = \"a\"\nmax_concurrent = 0\n",
                "max_concurrent 0",
            ),
            (
                "[[tenant]]\nname = \"a\"\nclasses = [\"gold\"]\n",
                "class \"gold\" is not defined",
            ),
            (
                "[[tenant]]\nname = \"a\"\nrequests_per_second = -1\n",
                "positive",
            ),
            ("[[tenant]]\nname = \"a\"\ntokens_burst = 10\n", "needs"),
            ("[[tenant]]\nname = \"a\"\nbogus = 1\n", "unknown field"),
            (
                "[[class]]\nname = \"x\"\nqueue_ttl_secs = 0\n",
                "queue_ttl_secs",
            ),
            (
                "[[class]]\nname = \"x\"\n[[class]]\nname = \"x\"\n",
                "twice",
            ),
            ("not toml [", "not valid TOML"),
        ];
        for (text, want) in cases {
            let e = Table::parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let secret = "plain-secret-key-0123";
        let e = Table::parse(&format!(
            "[[tenant]]\nname = \"a\"\nkeys = [\"{secret}\"]\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("sha256:") && !e.contains(secret), "{e}");
        let shared = key_entry("k");
        let e = Table::parse(&format!(
            "[[tenant]]\nname = \"a\"\nkeys = [\"{shared}\"]\n[[tenant]]\nname = \"b\"\nkeys = [\"{shared}\"]\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("also tenant \"a\"'s"), "{e}");
    }

    #[test]
    fn limits_are_shared_over_replicas() {
        let l = Limits {
            requests: Some(Rate {
                per_second: 10.0,
                burst: 10.0,
            }),
            tokens: None,
            max_concurrent: Some(5),
        };
        let half = l.share(2);
        assert_eq!(half.requests.unwrap().per_second, 5.0);
        assert_eq!(half.max_concurrent, Some(3));
        assert_eq!(l.share(100).max_concurrent, Some(1));
        assert_eq!(l.share(1), l);
    }
}
