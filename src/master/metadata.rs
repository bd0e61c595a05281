//! The HTTP metadata store that Mooncake's transfer engines use (`/metadata?key=…`), as rules
//! separate from the HTTP plumbing. Behaviour follows Mooncake's C++ server: keys are the raw
//! query value (not URL-decoded), and an `rpc_meta` key may be re-published only unchanged.

use std::collections::HashMap;
use std::net::IpAddr;

/// One writer's (one address's) share of the keys and bytes, at most: without the cluster
/// secret anyone may write, and one address must not fill the store that every engine's
/// transfer descriptors go to.
pub const WRITER_SHARE: usize = 16;

/// A reply: status code, body, and whether the body is the stored JSON.
#[derive(Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
    pub json: bool,
}

fn text(status: u16, body: &str) -> Reply {
    Reply {
        status,
        body: body.as_bytes().to_vec(),
        json: false,
    }
}

/// What the metadata server may hold (an open port must not grow without bound).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_bytes: u64,
    pub max_keys: usize,
    pub max_value_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 64 << 20,
            max_keys: 65_536,
            max_value_bytes: 1 << 20,
        }
    }
}

/// The keys and values Mooncake's transfer engines keep in the master's metadata server.
#[derive(Default)]
pub struct MetadataStore {
    map: HashMap<String, Vec<u8>>,
    limits: Limits,
    /// Bytes of keys and values held.
    bytes: u64,
    /// Who wrote each key first (when known), and what each writer holds: keys and bytes.
    owners: HashMap<String, IpAddr>,
    by_writer: HashMap<IpAddr, (usize, u64)>,
}

impl MetadataStore {
    /// An empty store bounded by `limits`.
    pub fn new(limits: Limits) -> MetadataStore {
        MetadataStore {
            limits,
            ..MetadataStore::default()
        }
    }

    /// Bytes of keys and values held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Handles one request. `query` is the raw query string of the URL.
    pub fn handle(&mut self, method: &str, query: Option<&str>, body: &[u8]) -> Reply {
        self.handle_from(method, query, body, None)
    }

    /// Handles one request from `writer` (its address, when known): a writer holds at most
    /// a [`WRITER_SHARE`]th of the keys and bytes.
    pub fn handle_from(
        &mut self,
        method: &str,
        query: Option<&str>,
        body: &[u8],
        writer: Option<IpAddr>,
    ) -> Reply {
        let Some(key) = query
            .and_then(|q| raw_query_param(q, "key"))
            .filter(|k| !k.is_empty())
        else {
            return text(400, "Missing key parameter");
        };
        match method {
            "GET" => match self.map.get(key) {
                Some(v) => Reply {
                    status: 200,
                    body: v.clone(),
                    json: true,
                },
                None => text(404, "metadata not found"),
            },
            "PUT" => {
                if key.contains("rpc_meta") {
                    if let Some(existing) = self.map.get(key) {
                        return if existing.as_slice() == body {
                            text(200, "metadata unchanged")
                        } else {
                            text(400, "Duplicate rpc_meta key not allowed")
                        };
                    }
                }
                let l = self.limits;
                if body.len() as u64 > l.max_value_bytes {
                    return text(
                        413,
                        &format!(
                            "value of {} bytes is over the {}-byte limit",
                            body.len(),
                            l.max_value_bytes
                        ),
                    );
                }
                let old = self.map.get(key).map(|v| (key.len() + v.len()) as u64);
                let new = (key.len() + body.len()) as u64;
                if old.is_none() && self.map.len() >= l.max_keys {
                    return text(507, &format!("metadata store full: {} keys", l.max_keys));
                }
                if self.bytes - old.unwrap_or(0) + new > l.max_bytes {
                    return text(507, &format!("metadata store full: {} bytes", l.max_bytes));
                }
                // A key is charged to whoever wrote it first.
                let owner = self.owners.get(key).copied().or(writer);
                if let Some(w) = owner {
                    let (keys, bytes) = self.by_writer.get(&w).copied().unwrap_or_default();
                    let (keys_after, bytes_after) = (
                        keys + usize::from(old.is_none()),
                        bytes - old.unwrap_or(0) + new,
                    );
                    let (max_keys, max_bytes) = (
                        (l.max_keys / WRITER_SHARE).max(1),
                        (l.max_bytes / WRITER_SHARE as u64).max(l.max_value_bytes),
                    );
                    if keys_after > max_keys || bytes_after > max_bytes {
                        return text(
                            507,
                            &format!(
                                "{w} holds its share of the metadata store ({max_keys} keys, \
                                 {max_bytes} bytes): delete keys it no longer needs"
                            ),
                        );
                    }
                    self.by_writer.insert(w, (keys_after, bytes_after));
                    self.owners.insert(key.to_string(), w);
                }
                self.bytes = self.bytes - old.unwrap_or(0) + new;
                self.map.insert(key.to_string(), body.to_vec());
                text(200, "metadata updated")
            }
            "DELETE" => match self.map.remove(key) {
                Some(v) => {
                    let freed = (key.len() + v.len()) as u64;
                    self.bytes -= freed;
                    if let Some(w) = self.owners.remove(key) {
                        if let Some((keys, bytes)) = self.by_writer.get_mut(&w) {
                            *keys -= 1;
                            *bytes -= freed;
                            if *keys == 0 {
                                self.by_writer.remove(&w);
                            }
                        }
                    }
                    text(200, "metadata deleted")
                }
                None => text(404, "metadata not found"),
            },
            _ => text(404, "404 Not Found"),
        }
    }
}

/// The raw (still percent-encoded) value of query parameter `name`.
pub fn raw_query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|pair| match pair.split_once('=') {
            Some((k, v)) if k == name => Some(v),
            None if pair == name => Some(""),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_bytes_and_value_sizes_are_bounded() {
        let mut s = MetadataStore::new(Limits {
            max_bytes: 100,
            max_keys: 2,
            max_value_bytes: 40,
        });
        assert_eq!(s.handle("PUT", Some("key=a"), &[b'x'; 41]).status, 413);
        assert_eq!(s.handle("PUT", Some("key=a"), &[b'x'; 40]).status, 200);
        assert_eq!(s.handle("PUT", Some("key=b"), &[b'x'; 40]).status, 200);
        assert_eq!(s.bytes(), 82);
        let r = s.handle("PUT", Some("key=c"), b"1");
        assert_eq!(
            (r.status, r.body.as_slice()),
            (507, &b"metadata store full: 2 keys"[..])
        );
        // Replacing a value counts the difference only.
        assert_eq!(s.handle("PUT", Some("key=a"), &[b'y'; 10]).status, 200);
        assert_eq!(s.bytes(), 52);
        assert_eq!(s.handle("DELETE", Some("key=b"), b"").status, 200);
        assert_eq!(s.bytes(), 11);
        assert_eq!(s.handle("PUT", Some("key=b"), &[b'x'; 40]).status, 200);
        assert_eq!(s.handle("PUT", Some("key=a"), &[b'x'; 40]).status, 200);
        assert_eq!(s.bytes(), 82);
        assert_eq!(s.handle("DELETE", Some("key=a"), b"").status, 200);
        assert_eq!(s.handle("PUT", Some("key=d"), &[b'x'; 40]).status, 200);
        assert_eq!(
            s.handle("PUT", Some("key=d"), &[b'x'; 40]).status,
            200,
            "same size again"
        );
    }

    /// Issue 62, item A18: one address holds at most its share, so that it cannot fill the
    /// store a new engine's descriptor goes to; what it deletes comes back to it.
    #[test]
    fn one_writer_holds_at_most_its_share() {
        let mut s = MetadataStore::new(Limits {
            max_bytes: 1 << 20,
            max_keys: 64,
            max_value_bytes: 1024,
        });
        let (a, b): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        let put = |s: &mut MetadataStore, k: usize, w| {
            s.handle_from("PUT", Some(&format!("key=k{k}")), b"{}", Some(w))
                .status
        };
        for k in 0..64 / WRITER_SHARE {
            assert_eq!(put(&mut s, k, a), 200);
        }
        let r = s.handle_from("PUT", Some("key=more"), b"{}", Some(a));
        assert_eq!(r.status, 507);
        assert!(String::from_utf8_lossy(&r.body).contains("10.0.0.1 holds its share"));
        // Another writer is not held back; a's own key may still be replaced.
        assert_eq!(put(&mut s, 100, b), 200);
        assert_eq!(put(&mut s, 0, a), 200);
        assert_eq!(s.handle("DELETE", Some("key=k0"), b"").status, 200);
        assert_eq!(put(&mut s, 200, a), 200);
    }

    #[test]
    fn get_put_delete_codes_and_bodies() {
        let mut s = MetadataStore::default();
        let q = Some("key=mooncake%2Fram%2Fh%3A1");
        assert_eq!(s.handle("GET", q, b""), text(404, "metadata not found"));
        assert_eq!(
            s.handle("PUT", q, b"{\"a\":1}"),
            text(200, "metadata updated")
        );
        let r = s.handle("GET", q, b"");
        assert_eq!(
            (r.status, r.body.as_slice(), r.json),
            (200, &b"{\"a\":1}"[..], true)
        );
        assert_eq!(
            s.handle("PUT", q, b"{\"a\":2}"),
            text(200, "metadata updated"),
            "plain keys are overwritten"
        );
        assert_eq!(s.handle("DELETE", q, b""), text(200, "metadata deleted"));
        assert_eq!(s.handle("DELETE", q, b""), text(404, "metadata not found"));
        assert_eq!(
            s.handle("GET", None, b""),
            text(400, "Missing key parameter")
        );
        assert_eq!(
            s.handle("PUT", Some("other=1"), b""),
            text(400, "Missing key parameter")
        );
    }

    #[test]
    fn rpc_meta_may_only_be_republished_unchanged() {
        let mut s = MetadataStore::default();
        let q = Some("key=mooncake%2Frpc_meta%2Fh%3A1");
        assert_eq!(s.handle("PUT", q, b"A"), text(200, "metadata updated"));
        assert_eq!(s.handle("PUT", q, b"A"), text(200, "metadata unchanged"));
        assert_eq!(
            s.handle("PUT", q, b"B"),
            text(400, "Duplicate rpc_meta key not allowed")
        );
    }

    #[test]
    fn keys_are_not_url_decoded() {
        let mut s = MetadataStore::default();
        s.handle("PUT", Some("key=mooncake%2Fram%2FX"), b"1");
        assert_eq!(s.handle("GET", Some("key=mooncake/ram/X"), b"").status, 404);
        assert_eq!(
            s.handle("GET", Some("a=b&key=mooncake%2Fram%2FX"), b"")
                .status,
            200
        );
    }
}
