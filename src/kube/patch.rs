//! Patch algebra on JSON values: RFC 7386 merge patch and RFC 6902 JSON patch (both from the
//! `json-patch` crate), and the part of Kubernetes' strategic merge patch that pod templates
//! need (lists of containers, env, volumes, ports ... merged by their key instead of replaced).
//! Pure functions, shared by the operator (template patches) and the API stand-in.

use serde_json::{Map, Value};

/// Why a patch could not be applied to a value.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PatchError {
    #[error("not a JSON patch (a list of operations): {0}")]
    Invalid(String),
    #[error("JSON patch not applied: {0}")]
    Failed(String),
}

/// RFC 7386: objects merge recursively, `null` deletes, anything else replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch)
}

/// The merge key of a list field under strategic merge patch, for the fields of pod specs
/// and object metadata that have one.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims"
        | "hostAliases" => "name",
        "volumeMounts" | "volumeDevices" => "mountPath",
        "ports" => "containerPort",
        "conditions" | "readinessGates" => "type",
        "ownerReferences" => "uid",
        _ => return None,
    })
}

/// Strategic merge patch as Kubernetes applies it to built-in kinds, for the lists that
/// carry a merge key (`containers` by name, `volumeMounts` by mountPath, ...); other lists
/// are replaced, `null` deletes, and `$patch: delete` in a keyed list element removes it.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    strategic_field(target, patch, None);
}

fn strategic_field(target: &mut Value, patch: &Value, field: Option<&str>) {
    match (patch, field.and_then(merge_key)) {
        (Value::Object(p), _) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if k.starts_with("$") {
                        continue;
                    }
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        strategic_field(t.entry(k.clone()).or_insert(Value::Null), v, Some(k));
                    }
                }
            }
        }
        (Value::Array(items), Some(key)) if items.iter().all(|i| i.get(key).is_some()) => {
            if !target.is_array() {
                *target = Value::Array(Vec::new());
            }
            if let Value::Array(t) = target {
                for item in items {
                    let k = &item[key];
                    let pos = t.iter().position(|x| x.get(key) == Some(k));
                    let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                    match (pos, delete) {
                        (Some(i), true) => {
                            t.remove(i);
                        }
                        (None, true) => {}
                        (Some(i), false) => strategic_field(&mut t[i], item, None),
                        (None, false) => {
                            let mut fresh = Value::Null;
                            strategic_field(&mut fresh, item, None);
                            t.push(fresh);
                        }
                    }
                }
            }
        }
        (other, _) => *target = other.clone(),
    }
}

/// Escapes one JSON-pointer token (`/` in label keys becomes `~1`).
pub fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// RFC 6902, all six operations; the document is unchanged when any operation fails.
pub fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), PatchError> {
    let patch: json_patch::Patch =
        serde_json::from_value(ops.clone()).map_err(|e| PatchError::Invalid(e.to_string()))?;
    json_patch::patch(doc, &patch).map_err(|e| PatchError::Failed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut d = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge(&mut d, &json!({"a": "z", "c": {"f": null}, "l": [3]}));
        assert_eq!(d, json!({"a": "z", "c": {"d": "e"}, "l": [3]}));
    }

    #[test]
    fn strategic_merge_keys_containers_by_name() {
        let mut t = json!({"spec": {"containers": [
            {"name": "a", "image": "x:1", "env": [{"name": "K", "value": "1"}]},
            {"name": "b", "image": "y:1"}]}});
        strategic_merge(
            &mut t,
            &json!({"spec": {"containers": [
                {"name": "a", "image": "x:2", "env": [{"name": "L", "value": "2"}]},
                {"name": "b", "$patch": "delete"},
                {"name": "c", "image": "z:1"}]}}),
        );
        assert_eq!(
            t,
            json!({"spec": {"containers": [
                {"name": "a", "image": "x:2", "env": [{"name": "K", "value": "1"}, {"name": "L", "value": "2"}]},
                {"name": "c", "image": "z:1"}]}})
        );
        // A list without a merge key is replaced.
        let mut t = json!({"spec": {"containers": [{"name": "a", "args": ["1", "2"]}]}});
        strategic_merge(
            &mut t,
            &json!({"spec": {"containers": [{"name": "a", "args": ["3"]}]}}),
        );
        assert_eq!(t["spec"]["containers"][0]["args"], json!(["3"]));
    }

    #[test]
    fn json_patch_applies_all_or_nothing() {
        let mut d = json!({"metadata": {"labels": {"a/b": "1"}}, "l": [1, 2, 3]});
        json_patch(
            &mut d,
            &json!([
                {"op": "test", "path": "/metadata/labels/a~1b", "value": "1"},
                {"op": "replace", "path": "/metadata/labels/a~1b", "value": "2"},
                {"op": "add", "path": "/l/-", "value": 4},
                {"op": "remove", "path": "/l/0"},
                {"op": "copy", "from": "/l/0", "path": "/first"},
                {"op": "move", "from": "/first", "path": "/moved"}
            ]),
        )
        .unwrap();
        assert_eq!(
            d,
            json!({"metadata": {"labels": {"a/b": "2"}}, "l": [2, 3, 4], "moved": 2})
        );
        let before = d.clone();
        let e = json_patch(
            &mut d,
            &json!([{"op": "replace", "path": "/l/0", "value": 9},
                    {"op": "test", "path": "/moved", "value": 3}]),
        )
        .unwrap_err();
        assert!(
            matches!(&e, PatchError::Failed(m) if m.contains("/moved")),
            "{e}"
        );
        assert_eq!(d, before);
        assert!(json_patch(
            &mut d,
            &json!([{"op": "replace", "path": "/nope/x", "value": 1}])
        )
        .is_err());
        assert!(json_patch(&mut d, &json!({"op": "add"})).is_err());
    }
}
