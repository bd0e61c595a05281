//! The JSON patches that add and release a finalizer, guarded by the resourceVersion read
//! (pure; groups and sets both hold one until their children are gone).

use crate::kube::object::ObjectMeta;
use serde_json::{json, Value};

/// Adds `finalizer` to the object `meta` describes.
pub fn add(meta: &ObjectMeta, finalizer: &str) -> Value {
    let op = if meta.finalizers.is_empty() {
        json!({"op": "add", "path": "/metadata/finalizers", "value": [finalizer]})
    } else {
        json!({"op": "add", "path": "/metadata/finalizers/-", "value": finalizer})
    };
    json!([{"op": "test", "path": "/metadata/resourceVersion", "value": meta.resource_version},
           op])
}

/// Removes `finalizer`, keeping the others.
pub fn release(meta: &ObjectMeta, finalizer: &str) -> Value {
    let rest: Vec<&str> = meta
        .finalizers
        .iter()
        .copied()
        .filter(|f| *f != finalizer)
        .collect();
    json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": meta.resource_version},
        {"op": "replace", "path": "/metadata/finalizers", "value": rest}
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_after_others_and_releases_only_its_own() {
        let none = json!({"metadata": {"resourceVersion": "7"}});
        assert_eq!(
            add(&ObjectMeta::of(&none), "a/b")[1],
            json!({"op": "add", "path": "/metadata/finalizers", "value": ["a/b"]})
        );
        let two = json!({"metadata": {"resourceVersion": "8", "finalizers": ["x/y", "a/b"]}});
        let m = ObjectMeta::of(&two);
        assert_eq!(add(&m, "c/d")[1]["path"], "/metadata/finalizers/-");
        let r = release(&m, "a/b");
        assert_eq!(r[0]["value"], "8");
        assert_eq!(r[1]["value"], json!(["x/y"]));
    }
}
