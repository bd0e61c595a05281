//! Label selectors in the API server's query syntax: `k=v`, `k==v`, `k!=v`, `k in (a,b)`,
//! `k notin (a)`, `k` (exists) and `!k` (does not exist), joined by commas (all must hold).

use super::object::ObjectMeta;
use serde_json::Value;
use std::collections::BTreeSet;

/// One requirement of a label selector (`key=value`, `key!=value`, `key in (…)`,
/// `key notin (…)`, `key`, `!key`).
#[derive(Clone, Debug, PartialEq)]
pub enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
}

/// A label selector: every requirement must hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selector(pub Vec<Requirement>);

/// A label selector that does not parse, and why.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("label selector {selector:?}: {reason}")]
pub struct SelectorError {
    pub selector: String,
    pub reason: String,
}

/// Splits at commas outside parentheses.
fn terms(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 316
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

impl Selector {
    /// A label selector as Kubernetes writes it (`a=b,c!=d,e in (f,g),!h`); the error says what
    /// is wrong.
    pub fn parse(s: &str) -> Result<Selector, SelectorError> {
        let err = |reason: String| SelectorError {
            selector: s.to_string(),
            reason,
        };
        let mut reqs = Vec::new();
        for term in terms(s) {
            let t = term.trim();
            if t.is_empty() {
                continue;
            }
            let set = |rest: &str| -> Result<BTreeSet<String>, SelectorError> {
                let inner = rest
                    .trim()
                    .strip_prefix('(')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(|| err(format!("{t:?}: values must be in parentheses")))?;
                Ok(inner.split(',').map(|v| v.trim().to_string()).collect())
            };
            let req = if let Some((k, v)) = t.split_once("!=") {
                Requirement::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = t.split_once("==") {
                Requirement::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = t.split_once('=') {
                Requirement::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = t.split_once(" notin ") {
                Requirement::NotIn(k.trim().into(), set(rest)?)
            } else if let Some((k, rest)) = t.split_once(" in ") {
                Requirement::In(k.trim().into(), set(rest)?)
            } else if let Some(k) = t.strip_prefix('!') {
                Requirement::NotExists(k.trim().into())
            } else {
                Requirement::Exists(t.into())
            };
            let key = match &req {
                Requirement::Eq(k, _)
                | Requirement::NotEq(k, _)
                | Requirement::In(k, _)
                | Requirement::NotIn(k, _)
                | Requirement::Exists(k)
                | Requirement::NotExists(k) => k,
            };
            if !valid_key(key) {
                return Err(err(format!("invalid key {key:?}")));
            }
            reqs.push(req);
        }
        Ok(Selector(reqs))
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let meta = ObjectMeta::of(obj);
        let get = |k: &str| meta.labels.get(k).copied();
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEq(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.contains(x)),
            Requirement::NotIn(k, vs) => !get(k).is_some_and(|x| vs.contains(x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors_match_like_the_api_server() {
        let o = json!({"metadata": {"labels": {"app": "w", "tier": "gpu"}}});
        let m = |s: &str| Selector::parse(s).unwrap().matches(&o);
        assert!(m("app=w"));
        assert!(m("app==w,tier"));
        assert!(m("app in (x, w),tier notin (cpu)"));
        assert!(m("!missing"));
        assert!(m(""));
        assert!(!m("app!=w"));
        assert!(!m("app=w,tier=cpu"));
        assert!(!m("missing"));
        assert!(!m("tier notin (gpu)"));
        assert!(Selector::parse("app in x").is_err());
        assert!(Selector::parse("a b=c").is_err());
    }
}
