//! The SIMULATED scheduler in front of the SIMULATED kubelet: which pending pods are bound to
//! a node in this pass. Without a capacity every pod is bound at once; with one, at most that
//! many pods hold a node. Pods of a gang (scheduler-plugins' `pod-group.scheduling.sigs.k8s.io/name`
//! label, Volcano's `scheduling.k8s.io/group-name` annotation) are bound as those schedulers
//! admit them: nothing until their PodGroup exists, it counts `minMember` pods, and (Volcano's
//! `subGroupPolicy`) `minSubGroups` whole sub-groups of each policy can be placed together,
//! all at once or none; past its minimum a gang's further pods are bound one by one.

use crate::kube::selector::Selector;
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};

/// The label scheduler-plugins' coscheduling reads.
pub const PLUGINS_LABEL: &str = "pod-group.scheduling.sigs.k8s.io/name";
/// The annotation Volcano reads.
pub const VOLCANO_ANNOTATION: &str = "scheduling.k8s.io/group-name";

/// Where a pod's gang is: the PodGroup's resource, namespace and name.
pub type GangRef = (&'static str, String, String);

/// The gang a pod belongs to, if any.
pub fn gang_of(pod: &Value) -> Option<GangRef> {
    let ns = pod["metadata"]["namespace"]
        .as_str()
        .unwrap_or("")
        .to_string();
    if let Some(n) = pod["metadata"]["labels"][PLUGINS_LABEL].as_str() {
        return Some(("podgroups.scheduling.x-k8s.io", ns, n.to_string()));
    }
    pod["metadata"]["annotations"][VOLCANO_ANNOTATION]
        .as_str()
        .map(|n| ("podgroups.scheduling.volcano.sh", ns, n.to_string()))
}

fn bound(pod: &Value) -> bool {
    pod.pointer("/spec/nodeName").is_some()
}

fn terminating(pod: &Value) -> bool {
    pod.pointer("/metadata/deletionTimestamp").is_some()
}

/// Why a pending pod stays pending, by its index in `pods`; the pods not named are bound.
pub type Verdicts = BTreeMap<usize, String>;

/// Decides which of `pods` (every pod, in the order they were made) are bound this pass.
/// `podgroup` finds a PodGroup; `capacity` caps the pods holding a node.
pub fn schedule(
    pods: &[Value],
    podgroup: impl Fn(&GangRef) -> Option<Value>,
    capacity: Option<usize>,
) -> Verdicts {
    let mut free = capacity.map_or(usize::MAX, |c| {
        c.saturating_sub(pods.iter().filter(|p| bound(p)).count())
    });
    let mut pending: Verdicts = BTreeMap::new();
    let mut gangs: BTreeMap<GangRef, Vec<usize>> = BTreeMap::new();
    for (i, p) in pods.iter().enumerate() {
        if terminating(p) {
            continue;
        }
        match gang_of(p) {
            Some(g) => gangs.entry(g).or_default().push(i),
            None if bound(p) => {}
            None if free > 0 => free -= 1,
            None => {
                pending.insert(i, "0/3 nodes are available: insufficient capacity".into());
            }
        }
    }
    for (gang, members) in gangs {
        let waiting: Vec<usize> = members
            .iter()
            .copied()
            .filter(|&i| !bound(&pods[i]))
            .collect();
        if waiting.is_empty() {
            continue;
        }
        let refuse = |pending: &mut Verdicts, why: String| {
            for &i in &waiting {
                pending.insert(i, why.clone());
            }
        };
        let Some(pg) = podgroup(&gang) else {
            refuse(
                &mut pending,
                format!("PodGroup {}/{} not found", gang.1, gang.2),
            );
            continue;
        };
        let min = pg["spec"]["minMember"].as_u64().unwrap_or(1) as usize;
        if members.len() < min {
            refuse(
                &mut pending,
                format!("{} of the gang's minMember {min} pods exist", members.len()),
            );
            continue;
        }
        let placed = members.len() - waiting.len();
        // The pods to place together: whole sub-groups first, then any until the minimum.
        let mut chosen: Vec<usize> = Vec::new();
        let mut unmet = None;
        for policy in pg["spec"]["subGroupPolicy"]
            .as_array()
            .into_iter()
            .flatten()
        {
            match sub_groups_to_place(pods, &members, policy) {
                Ok(more) => {
                    for i in more {
                        if !chosen.contains(&i) {
                            chosen.push(i);
                        }
                    }
                }
                Err(why) => {
                    unmet = Some(why);
                    break;
                }
            }
        }
        if let Some(why) = unmet {
            refuse(&mut pending, why);
            continue;
        }
        for &i in &waiting {
            if placed + chosen.len() >= min {
                break;
            }
            if !chosen.contains(&i) {
                chosen.push(i);
            }
        }
        if chosen.len() > free {
            refuse(
                &mut pending,
                format!(
                    "the gang needs {} more pods placed at once; {free} fit",
                    chosen.len()
                ),
            );
            continue;
        }
        free -= chosen.len();
        // Past its minimum, each further pod of the gang as capacity allows.
        for &i in &waiting {
            if chosen.contains(&i) {
                continue;
            }
            if free > 0 {
                free -= 1;
            } else {
                pending.insert(i, "0/3 nodes are available: insufficient capacity".into());
            }
        }
    }
    pending
}

/// The pending pods that complete `minSubGroups` sub-groups of a Volcano `subGroupPolicy`
/// (pods matching its `labelSelector.matchLabels`, grouped by the values of its
/// `matchLabelKeys`, `subGroupSize` each), counting those already whole.
fn sub_groups_to_place(
    pods: &[Value],
    members: &[usize],
    policy: &Value,
) -> Result<Vec<usize>, String> {
    let name = policy["name"].as_str().unwrap_or("");
    let size = policy["subGroupSize"].as_u64().unwrap_or(1) as usize;
    let need = policy["minSubGroups"].as_u64().unwrap_or(0) as usize;
    let selector = policy["labelSelector"]["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let selector = Selector::parse(&selector).unwrap_or_default();
    let keys: Vec<&str> = policy["matchLabelKeys"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut groups: BTreeMap<Vec<String>, Vec<usize>> = BTreeMap::new();
    for &i in members {
        if !selector.matches(&pods[i]) {
            continue;
        }
        let id = keys
            .iter()
            .map(|k| {
                pods[i]["metadata"]["labels"][k]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        groups.entry(id).or_default().push(i);
    }
    let whole: HashSet<&Vec<String>> = groups
        .iter()
        .filter(|(_, g)| g.len() >= size && g.iter().all(|&i| bound(&pods[i])))
        .map(|(k, _)| k)
        .collect();
    let mut chosen = Vec::new();
    let mut count = whole.len();
    for (k, g) in &groups {
        if count >= need {
            break;
        }
        if whole.contains(k) || g.len() < size {
            continue;
        }
        chosen.extend(g.iter().copied().filter(|&i| !bound(&pods[i])));
        count += 1;
    }
    if count < need {
        return Err(format!(
            "sub-group policy {name}: {count} of its minSubGroups {need} groups of {size} pods \
             exist"
        ));
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, role: &str, instance: &str, gang: Option<&str>) -> Value {
        let mut p = json!({"metadata": {"name": name, "namespace": "ns",
            "labels": {"role": role, "instance": instance}, "annotations": {}}});
        if let Some(g) = gang {
            p["metadata"]["annotations"][VOLCANO_ANNOTATION] = json!(g);
        }
        p
    }

    #[test]
    fn a_gang_waits_for_its_podgroup_and_its_minimum_then_binds_at_once() {
        let pods: Vec<Value> = (0..4)
            .map(|i| pod(&format!("p{i}"), "r", &format!("i{i}"), Some("g")))
            .collect();
        let none = schedule(&pods, |_| None, None);
        assert_eq!(none.len(), 4);
        assert!(none[&0].contains("not found"), "{none:?}");
        let pg = json!({"spec": {"minMember": 4}});
        assert!(schedule(&pods, |_| Some(pg.clone()), None).is_empty());
        // Room for three: nothing of a gang of four.
        let three = schedule(&pods, |_| Some(pg.clone()), Some(3));
        assert_eq!(three.len(), 4, "{three:?}");
        let pg3 = json!({"spec": {"minMember": 3}});
        assert_eq!(schedule(&pods, |_| Some(pg3.clone()), Some(3)).len(), 1);
        // Pods outside any gang take what is free, in order.
        let plain: Vec<Value> = (0..3)
            .map(|i| pod(&format!("q{i}"), "r", "x", None))
            .collect();
        assert_eq!(
            schedule(&plain, |_| None, Some(2))
                .keys()
                .collect::<Vec<_>>(),
            [&2]
        );
    }

    #[test]
    fn sub_groups_are_placed_whole_up_to_their_minimum() {
        // Two prefill instances of two pods and two decode pods; room for five.
        let mut pods = Vec::new();
        for i in 0..2 {
            for c in 0..2 {
                pods.push(pod(
                    &format!("p{i}-{c}"),
                    "prefill",
                    &format!("p{i}"),
                    Some("g"),
                ));
            }
        }
        for i in 0..2 {
            pods.push(pod(&format!("d{i}"), "decode", &format!("d{i}"), Some("g")));
        }
        let policy = |role: &str, size: u64, min: u64| {
            json!({"name": role, "subGroupSize": size, "minSubGroups": min,
                   "labelSelector": {"matchLabels": {"role": role}},
                   "matchLabelKeys": ["instance"]})
        };
        let pg = json!({"spec": {"minMember": 3, "subGroupPolicy":
            [policy("prefill", 2, 1), policy("decode", 1, 1)]}});
        let left = schedule(&pods, |_| Some(pg.clone()), Some(3));
        // Exactly one whole prefill instance and one decode pod.
        let placed: Vec<&str> = (0..pods.len())
            .filter(|i| !left.contains_key(i))
            .map(|i| pods[i]["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(placed, ["p0-0", "p0-1", "d0"], "{left:?}");
        let tight = schedule(&pods, |_| Some(pg.clone()), Some(2));
        assert_eq!(tight.len(), pods.len(), "{tight:?}");
        let want_two = json!({"spec": {"minMember": 5, "subGroupPolicy":
            [policy("prefill", 2, 3)]}});
        let why = schedule(&pods, |_| Some(want_two.clone()), None);
        assert!(why[&0].contains("minSubGroups 3"), "{why:?}");
    }
}
