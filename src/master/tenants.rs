//! Tenants of the pool: each tenant's objects live in a namespace of their own
//! (`transfer::tenant`), and a tenant may have a quota of bytes.
//!
//! Because the scoped key is what the stores record and report, a tenant's objects keep their
//! tenant across store and master restarts and failover, as every object's key does.
//!
//! Quotas are bytes of values held. They can never add up to more than the pool holds: when
//! they do (a store left, or the file asks for more than there is), each is scaled down in
//! proportion ([`Quotas::effective`]). A put that would take its tenant past its quota is
//! refused ([`admit`]); eviction takes first from the tenants furthest over their share
//! ([`eviction_order`]). Pure: no I/O, no clock.

use crate::config::ByteSize;
pub use crate::transfer::tenant::{
    check_key, check_name, owned_by, scoped, split, tenant_of, NamespaceError, DEFAULT_TENANT,
    MAX_NAME_LEN,
};
use serde::Deserialize;
use std::collections::HashMap;

/// Most tenants one master serves.
pub const MAX_TENANTS: usize = 4096;

/// Why a tenants file or a tenant is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    #[error(transparent)]
    Namespace(#[from] NamespaceError),
    #[error("tenant {0:?} is not registered with this master (its tenants file names it)")]
    NotRegistered(String),
    #[error("tenant {0:?} is named twice in the tenants file")]
    Duplicate(String),
    #[error("the tenants file names {0} tenants: at most {MAX_TENANTS}")]
    TooMany(usize),
    #[error("tenants file: {0}")]
    Parse(String),
}

/// One `[[tenant]]` of a master's tenants file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    name: String,
    /// Bytes of values it may hold (`"64GiB"`); none: no quota of its own.
    quota: Option<ByteSize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantsFile {
    #[serde(default)]
    tenant: Vec<TenantEntry>,
}

/// The tenants a master serves, with their quotas as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quotas {
    /// Tenant → quota in bytes (`None`: no quota of its own).
    asked: HashMap<Box<str>, Option<u64>>,
    /// The quotas asked, added up.
    sum: u128,
}

impl Default for Quotas {
    /// The default tenant alone, without a quota (a master without a tenants file).
    fn default() -> Quotas {
        Quotas {
            asked: HashMap::from([(DEFAULT_TENANT.into(), None)]),
            sum: 0,
        }
    }
}

impl Quotas {
    /// Reads a tenants file's text. The default tenant is always served, with a quota only if
    /// the file gives it one.
    pub fn parse(text: &str) -> Result<Quotas, TenantError> {
        let file: TenantsFile =
            toml::from_str(text).map_err(|e| TenantError::Parse(e.message().to_string()))?;
        if file.tenant.len() > MAX_TENANTS {
            return Err(TenantError::TooMany(file.tenant.len()));
        }
        let mut asked = HashMap::with_capacity(file.tenant.len() + 1);
        for t in file.tenant {
            check_name(&t.name)?;
            if asked
                .insert(t.name.as_str().into(), t.quota.map(|q| q.0))
                .is_some()
            {
                return Err(TenantError::Duplicate(t.name));
            }
        }
        asked.entry(DEFAULT_TENANT.into()).or_insert(None);
        let sum = asked.values().flatten().map(|&q| u128::from(q)).sum();
        Ok(Quotas { asked, sum })
    }

    /// Whether any tenant has a quota.
    pub fn any_quota(&self) -> bool {
        self.sum > 0 || self.asked.values().any(Option::is_some)
    }

    /// Tenants served.
    pub fn len(&self) -> usize {
        self.asked.len()
    }

    /// Whether no tenant has a quota.
    pub fn is_empty(&self) -> bool {
        self.asked.is_empty()
    }

    /// The quota asked for `tenant` (`None`: none of its own, or not served).
    pub fn asked(&self, tenant: &str) -> Option<u64> {
        self.asked.get(tenant).copied().flatten()
    }

    /// `tenant`'s quota in force with `capacity` bytes in the pool (see [`Quotas::effective`]).
    pub fn in_force(&self, tenant: &str, capacity: u64) -> Option<u64> {
        self.asked(tenant).map(|q| scale(q, self.sum, capacity))
    }

    /// Whether `tenant` is served, or why not.
    pub fn serves(&self, tenant: &str) -> Result<(), TenantError> {
        if tenant == DEFAULT_TENANT || self.asked.contains_key(tenant) {
            Ok(())
        } else {
            Err(TenantError::NotRegistered(
                tenant.chars().take(MAX_NAME_LEN).collect(),
            ))
        }
    }

    /// Tenants served, by name.
    pub fn names(&self) -> Vec<&str> {
        let mut n: Vec<&str> = self.asked.keys().map(|k| &**k).collect();
        n.sort_unstable();
        n
    }

    /// The quotas in force with `capacity` bytes in the pool: as asked while they add up to no
    /// more than it, else each scaled down in proportion so that they add up to it (rounded
    /// down). A tenant without a quota of its own has `None`.
    pub fn effective(&self, capacity: u64) -> HashMap<&str, Option<u64>> {
        self.asked
            .iter()
            .map(|(name, q)| (&**name, q.map(|q| scale(q, self.sum, capacity))))
            .collect()
    }
}

/// Quota `q` of quotas adding up to `sum`, scaled down in proportion when they add up to more
/// than `capacity` (rounded down).
fn scale(q: u64, sum: u128, capacity: u64) -> u64 {
    if sum <= u128::from(capacity) {
        q
    } else {
        (u128::from(q) * u128::from(capacity) / sum) as u64
    }
}

/// A put refused: it would take its tenant past its quota.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "tenant {tenant:?} is at its quota: it holds {used} bytes of {quota}, and this put asks \
     {asked} more (remove some of its objects, or raise its quota in the master's tenants file)"
)]
pub struct QuotaExceeded {
    pub tenant: String,
    pub quota: u64,
    pub used: u64,
    pub asked: u64,
}

/// Whether `tenant`, holding `used` bytes under `quota`, may put `asked` more. The bytes a put
/// replaces are counted as held until it ends (a replacement needs room for both meanwhile).
pub fn admit(tenant: &str, quota: Option<u64>, used: u64, asked: u64) -> Result<(), QuotaExceeded> {
    match quota {
        Some(quota) if used.saturating_add(asked) > quota => Err(QuotaExceeded {
            tenant: tenant.to_string(),
            quota,
            used,
            asked,
        }),
        _ => Ok(()),
    }
}

/// Bytes of values each tenant holds (pending puts included), kept as objects come and go.
/// The default tenant's count is a field of its own: a pool without tenants pays no lookup.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Usage {
    default: u64,
    named: HashMap<Box<str>, u64>,
}

impl Usage {
    /// Counts `bytes` more for the tenant of the held key `key`.
    pub fn add(&mut self, key: &str, bytes: u64) {
        match split(key).0 {
            DEFAULT_TENANT => self.default = self.default.saturating_add(bytes),
            tenant => match self.named.get_mut(tenant) {
                Some(b) => *b = b.saturating_add(bytes),
                None => {
                    self.named.insert(tenant.into(), bytes);
                }
            },
        }
    }

    /// Counts `bytes` fewer for the tenant of the held key `key`.
    pub fn sub(&mut self, key: &str, bytes: u64) {
        match split(key).0 {
            DEFAULT_TENANT => self.default = self.default.saturating_sub(bytes),
            tenant => {
                if let Some(b) = self.named.get_mut(tenant) {
                    *b = b.saturating_sub(bytes);
                    if *b == 0 {
                        self.named.remove(tenant);
                    }
                }
            }
        }
    }

    /// Bytes `tenant` holds.
    pub fn of(&self, tenant: &str) -> u64 {
        match tenant {
            DEFAULT_TENANT => self.default,
            t => self.named.get(t).copied().unwrap_or(0),
        }
    }

    /// Whether only the default tenant holds bytes (or nobody does).
    pub fn only_default(&self) -> bool {
        self.named.is_empty()
    }

    /// Every tenant holding bytes, unordered.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        std::iter::once((DEFAULT_TENANT, self.default))
            .filter(|(_, b)| *b > 0)
            .chain(self.named.iter().map(|(t, b)| (&**t, *b)))
    }
}

/// Which tenants eviction takes from first, and by how many bytes each is over its share:
/// those over it, furthest over first (ties by name). A tenant's share is its quota in force
/// (`quotas`, from [`Quotas::effective`]); the tenants holding bytes without a quota of their
/// own share what the quotas leave of `capacity` equally.
pub fn eviction_order(
    usage: &Usage,
    quotas: &HashMap<&str, Option<u64>>,
    capacity: u64,
) -> Vec<(String, u64)> {
    let quota_sum: u64 = quotas.values().flatten().sum();
    let unquoted = usage
        .iter()
        .filter(|(t, _)| quotas.get(t).copied().flatten().is_none())
        .count()
        .max(1) as u64;
    let rest_share = capacity.saturating_sub(quota_sum) / unquoted;
    let mut over: Vec<(String, u64)> = usage
        .iter()
        .filter_map(|(t, used)| {
            let share = quotas.get(t).copied().flatten().unwrap_or(rest_share);
            (used > share).then(|| (t.to_string(), used - share))
        })
        .collect();
    over.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    over
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_scoped_by_tenant_and_no_client_key_reaches_another_namespace() {
        assert_eq!(scoped(DEFAULT_TENANT, "k"), "k");
        let held = scoped("team-a", "k");
        assert_ne!(held, "k");
        assert_eq!(split(&held), ("team-a", "k"));
        assert_eq!(split("k"), (DEFAULT_TENANT, "k"));
        // The same key of two tenants is two objects.
        assert_ne!(scoped("team-a", "k"), scoped("team-b", "k"));
        // A key that looks like another tenant's is refused, whoever sends it.
        assert_eq!(check_key(&held), Err(NamespaceError::ReservedKey));
        assert_eq!(check_key("\u{1}"), Err(NamespaceError::ReservedKey));
        assert_eq!(check_key("a\u{1}b"), Ok(()));
        assert_eq!(split(&scoped("team-a", "a\u{1}b")), ("team-a", "a\u{1}b"));
        // Names are checked.
        for bad in ["", "a b", "a/b", &"x".repeat(MAX_NAME_LEN + 1), "\u{1}"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        check_name("Team_a-1.prod").unwrap();
    }

    #[test]
    fn a_tenants_file_registers_tenants_and_quotas_never_add_up_past_the_pool() {
        let q = Quotas::parse(
            "[[tenant]]\nname = \"a\"\nquota = \"6GiB\"\n[[tenant]]\nname = \"b\"\nquota = \"2GiB\"\n\
             [[tenant]]\nname = \"c\"\n",
        )
        .unwrap();
        assert_eq!(q.names(), ["a", "b", "c", "default"]);
        q.serves("a").unwrap();
        q.serves(DEFAULT_TENANT).unwrap();
        assert_eq!(q.serves("z"), Err(TenantError::NotRegistered("z".into())));
        const GIB: u64 = 1 << 30;
        // Room for both: as asked.
        let e = q.effective(10 * GIB);
        assert_eq!(
            (e["a"], e["b"], e["c"]),
            (Some(6 * GIB), Some(2 * GIB), None)
        );
        // A pool of 4 GiB: scaled to 3 and 1.
        let e = q.effective(4 * GIB);
        assert_eq!((e["a"], e["b"]), (Some(3 * GIB), Some(GIB)));
        for capacity in [0, 1, 7, 4 * GIB + 3, 8 * GIB - 1] {
            let sum: u64 = q.effective(capacity).values().flatten().sum();
            assert!(sum <= capacity, "{capacity}: {sum}");
        }
        // Bad files say what is wrong.
        let dup = Quotas::parse("[[tenant]]\nname = \"a\"\n[[tenant]]\nname = \"a\"\n");
        assert_eq!(dup, Err(TenantError::Duplicate("a".into())));
        assert!(matches!(
            Quotas::parse("[[tenant]]\nname = \"a b\"\n"),
            Err(TenantError::Namespace(NamespaceError::BadName(_)))
        ));
        assert!(matches!(
            Quotas::parse("[[tenant]]\nname = \"a\"\nquota = \"lots\"\n"),
            Err(TenantError::Parse(_))
        ));
        assert!(matches!(
            Quotas::parse("[[tenant]]\nnam = \"a\"\n"),
            Err(TenantError::Parse(_))
        ));
        assert_eq!(Quotas::parse("").unwrap().names(), ["default"]);
    }

    #[test]
    fn a_put_past_its_tenants_quota_is_refused_and_the_usage_follows_the_objects() {
        let mut u = Usage::default();
        let (a1, a2, b1) = (scoped("a", "1"), scoped("a", "2"), scoped("b", "1"));
        u.add(&a1, 600);
        u.add(&a2, 300);
        u.add(&b1, 50);
        u.add("plain", 7);
        assert_eq!((u.of("a"), u.of("b"), u.of(DEFAULT_TENANT)), (900, 50, 7));
        admit("a", Some(1000), u.of("a"), 100).unwrap();
        let refused = admit("a", Some(1000), u.of("a"), 101).unwrap_err();
        assert_eq!(
            (refused.used, refused.quota, refused.asked),
            (900, 1000, 101)
        );
        assert!(
            refused.to_string().contains("tenant \"a\" is at its quota"),
            "{refused}"
        );
        // The other tenant is not held back by it, and no quota is no limit.
        admit("b", Some(1000), u.of("b"), 900).unwrap();
        admit(DEFAULT_TENANT, None, u.of(DEFAULT_TENANT), u64::MAX).unwrap();
        u.sub(&a1, 600);
        admit("a", Some(1000), u.of("a"), 700).unwrap();
        u.sub(&a2, 300);
        u.sub(&a2, 300);
        assert_eq!(u.of("a"), 0);
        assert_eq!(u.iter().count(), 2, "a tenant holding nothing is dropped");
    }

    #[test]
    fn eviction_takes_first_from_the_tenant_furthest_over_its_share() {
        let q = Quotas::parse(
            "[[tenant]]\nname = \"a\"\nquota = \"400B\"\n[[tenant]]\nname = \"b\"\nquota = \"400B\"\n\
             [[tenant]]\nname = \"c\"\n",
        )
        .unwrap();
        let mut u = Usage::default();
        u.add(&scoped("a", "x"), 300);
        u.add(&scoped("b", "x"), 450);
        u.add(&scoped("c", "x"), 150);
        u.add("x", 60);
        // 1,000 bytes: a and b have 400 each; c and default share the other 200.
        let e = q.effective(1000);
        assert_eq!(
            eviction_order(&u, &e, 1000),
            [("b".to_string(), 50), ("c".to_string(), 50)]
        );
        // The pool shrinks to 500: the quotas are scaled to 250 each, nothing is left for the
        // rest, and every tenant is over.
        let e = q.effective(500);
        let order: Vec<String> = eviction_order(&u, &e, 500)
            .into_iter()
            .map(|(t, _)| t)
            .collect();
        assert_eq!(order, ["b", "c", "default", "a"]);
    }
}
