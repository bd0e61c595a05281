//! A RoleBasedGroup read from its JSON, in either API form (`v1alpha1`: `roles[].template`,
//! `workload`, `leaderWorkerSet`, `spec.coordination`; `v1alpha2`: `standalonePattern`,
//! `leaderWorkerPattern`, `roleTemplates`), into one model the controller works on.

use crate::kube::object::ObjectMeta;
use crate::kube::patch;
use crate::operator::restarts::{self, RestartPolicy};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// What is wrong with a group's spec, naming the role or field to fix.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    #[error("role {role:?}: {reason}")]
    Role { role: String, reason: String },
    #[error("{0}")]
    Group(String),
}

fn role_err(role: &str, reason: impl Into<String>) -> SpecError {
    SpecError::Role {
        role: role.to_string(),
        reason: reason.into(),
    }
}

/// An int-or-percent field (`2`, `"2"`, `"25%"`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum IntOrPct {
    Int(u32),
    Pct(u32),
}

impl IntOrPct {
    /// An int-or-percent field (`2` or `"25%"`); the error says what was found.
    pub fn parse(v: &Value) -> Result<IntOrPct, String> {
        match v {
            Value::Number(n) => n
                .as_u64()
                .map(|n| IntOrPct::Int(n as u32))
                .ok_or_else(|| format!("{n} is not a non-negative integer")),
            Value::String(s) => {
                let s = s.trim();
                if let Some(p) = s.strip_suffix('%') {
                    p.parse()
                        .map(IntOrPct::Pct)
                        .map_err(|_| format!("{s:?} is not a percentage"))
                } else {
                    s.parse()
                        .map(IntOrPct::Int)
                        .map_err(|_| format!("{s:?} is not an integer or a percentage"))
                }
            }
            other => Err(format!("{other} is not an integer or a percentage")),
        }
    }

    /// The count this stands for out of `total`.
    pub fn resolve(self, total: u32, round_up: bool) -> u32 {
        match self {
            IntOrPct::Int(n) => n,
            IntOrPct::Pct(p) => {
                let x = total as u64 * p as u64;
                (if round_up { x.div_ceil(100) } else { x / 100 }) as u32
            }
        }
    }
}

/// How a role's instances are made of pods.
#[derive(Clone, Debug, PartialEq)]
pub enum Pattern {
    /// One pod per instance, named like the instance.
    Standalone,
    /// `size` pods per instance: `<instance>-0` the leader, the rest workers.
    LeaderWorker {
        size: u32,
        leader_patch: Value,
        worker_patch: Value,
        /// The role's Service selects only leaders (the RoleInstanceSet default).
        leader_only_service: bool,
    },
}

/// How a role's pods move to a new template (`rolloutStrategy`).
#[derive(Clone, Debug, PartialEq)]
pub struct Rollout {
    /// `Recreate`/`RecreatePod`: never update in place.
    pub recreate: bool,
    pub max_unavailable: IntOrPct,
    pub max_surge: IntOrPct,
    pub partition: IntOrPct,
    pub paused: bool,
}

impl Default for Rollout {
    fn default() -> Self {
        Rollout {
            recreate: false,
            max_unavailable: IntOrPct::Int(1),
            max_surge: IntOrPct::Int(0),
            partition: IntOrPct::Int(0),
            paused: false,
        }
    }
}

/// One role of a group, as the operator reconciles it.
#[derive(Clone, Debug, PartialEq)]
pub struct Role {
    pub name: String,
    pub replicas: u32,
    pub dependencies: Vec<String>,
    /// The pod template (`metadata`, `spec`), templateRef and patches resolved.
    pub template: Value,
    pub pattern: Pattern,
    /// Instances have random names and no ordinal (`Stateless` pattern, Deployment workload).
    pub stateless: bool,
    pub rollout: Rollout,
    /// `servicePorts` as (name, port), for the discovery file.
    pub service_ports: Vec<(String, u16)>,
    /// `scalingAdapter.enable: true`: the role is scaled through a RoleBasedGroupScalingAdapter
    /// `<group>-<role>`, which carries these extra labels (`scalingAdapter.labels`).
    pub scaling_adapter: Option<BTreeMap<String, String>>,
    /// What a container restart in one of an instance's pods does (`restarts`).
    pub restart: RestartPolicy,
    /// The role as written, its template inline (a templateRef and its patch resolved) and
    /// without `replicas`: what its ControllerRevision keeps and a rollback writes back.
    pub source: Value,
    /// A pool store role whose pods hand their objects over to the other stores before they
    /// go, within this many seconds (the role annotation [`HAND_OVER`]).
    pub hand_over_secs: Option<u32>,
}

/// The role annotation that makes a role's pods pool stores that hand their objects over
/// before they go: the seconds a hand-over may take.
pub const HAND_OVER: &str = "rbg.workloads.x-k8s.io/store-hand-over-seconds";

impl Role {
    /// Pods in one instance of the role: one, or a leader-worker group's size.
    pub fn size(&self) -> u32 {
        match &self.pattern {
            Pattern::Standalone => 1,
            Pattern::LeaderWorker { size, .. } => *size,
        }
    }
}

/// How a coordinated scale-up of several roles proceeds (`scaling.progression`): all at
/// once, or a role's next step only once the others' pods are scheduled or Ready.
#[derive(Clone, Debug, PartialEq)]
pub enum Progression {
    None,
    OrderScheduled,
    OrderReady,
}

/// A coordination rule's `rollingUpdate`: the roles it names roll out together.
#[derive(Clone, Debug, PartialEq)]
pub struct RollingRule {
    pub max_skew_pct: Option<u32>,
    pub partition: Option<IntOrPct>,
    pub max_unavailable: Option<IntOrPct>,
    /// The roles whose rollouts lead, first to last: a later role is never further along
    /// than an earlier one's updated, Ready share (`order`; empty: no order).
    pub order: Vec<String>,
    /// How long a rollout of the rule's roles may take; past it, unfinished, every role goes
    /// back to the revision it had, in reverse order (`progressDeadlineSeconds`).
    pub progress_deadline_secs: Option<u64>,
}

/// A coordination rule's `scaling`: the roles it names scale together, no role's share
/// more than `max_skew_pct` ahead of another's.
#[derive(Clone, Debug, PartialEq)]
pub struct ScalingRule {
    pub max_skew_pct: u32,
    pub progression: Progression,
}

/// `strategy.scheduling.gang` (RBG KEP-430): the roles' pods are placed as a gang, each
/// named role with at least its `minReplicas` instances (a role not named: all of them).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GangRule {
    pub min_replicas: BTreeMap<String, u32>,
}

/// One coordination rule: roles that roll out, scale or are scheduled together.
#[derive(Clone, Debug, PartialEq)]
pub struct Coordination {
    pub name: String,
    pub roles: Vec<String>,
    pub rolling: Option<RollingRule>,
    pub scaling: Option<ScalingRule>,
    pub gang: Option<GangRule>,
}

/// A RoleBasedGroup as the operator reads it: its identity, roles and coordination rules.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub generation: i64,
    /// Written in the v1alpha1 form (gets the old `<group>-<role>` Service names too).
    pub legacy: bool,
    pub roles: Vec<Role>,
    pub coordination: Vec<Coordination>,
    /// The scheduler whose gang the pods join, when the group asks for one (set by the
    /// reconcile from `gang::wanted` and the operator's `--scheduler-name`).
    pub gang: Option<super::gang::Scheduler>,
}

/// A string field of a spec object, when present and a string.
fn text<'a>(v: &'a Value, name: &str) -> Option<&'a str> {
    v.get(name).and_then(Value::as_str)
}

/// One of a group's `status.roleStatuses`, as the operator writes and the adapter reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RoleStatus {
    pub name: String,
    pub replicas: u32,
    pub ready_replicas: u32,
    pub updated_replicas: u32,
    /// The revision instances below `partition` keep while a rollout is under way
    /// (StatefulSet's `currentRevision`; the ControllerRevision `<group>-<role>-<hash>`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub current_revision: String,
    /// The revision the role's spec names.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub update_revision: String,
}

impl RoleStatus {
    /// `status.roleStatuses` of a group object; empty when it has none yet.
    pub fn all_of(group: &Value) -> Vec<RoleStatus> {
        group
            .pointer("/status/roleStatuses")
            .and_then(|r| Vec::<RoleStatus>::deserialize(r).ok())
            .unwrap_or_default()
    }
}

/// Whether a group is written in the v1alpha1 form.
pub fn is_legacy(obj: &Value) -> bool {
    if text(obj, "apiVersion") == Some("workloads.x-k8s.io/v1alpha1") {
        return true;
    }
    let spec = &obj["spec"];
    if spec.get("coordination").is_some() || spec.get("podGroupPolicy").is_some() {
        return true;
    }
    spec["roles"].as_array().is_some_and(|roles| {
        roles.iter().any(|r| {
            [
                "template",
                "templateRef",
                "workload",
                "leaderWorkerSet",
                "components",
            ]
            .iter()
            .any(|f| r.get(*f).is_some())
        })
    })
}

fn percent(v: &Value, what: &str) -> Result<u32, String> {
    match IntOrPct::parse(v)? {
        IntOrPct::Pct(p) if p <= 100 => Ok(p),
        _ => Err(format!("{what}: {v} must be a percentage like \"10%\"")),
    }
}

fn parse_coordination(list: &Value) -> Result<Vec<Coordination>, SpecError> {
    let mut out = Vec::new();
    for (i, c) in list.as_array().into_iter().flatten().enumerate() {
        let name = text(c, "name").unwrap_or("").to_string();
        let bad = |m: String| SpecError::Group(format!("coordination {i} ({name}): {m}"));
        let roles: Vec<String> = c["roles"]
            .as_array()
            .map(|r| {
                r.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if roles.is_empty() {
            return Err(bad("names no roles".into()));
        }
        let st = &c["strategy"];
        let rolling = match st.get("rollingUpdate") {
            None | Some(Value::Null) => None,
            Some(r) => Some(RollingRule {
                max_skew_pct: r
                    .get("maxSkew")
                    .map(|v| percent(v, "maxSkew"))
                    .transpose()
                    .map_err(bad)?,
                partition: r
                    .get("partition")
                    .map(IntOrPct::parse)
                    .transpose()
                    .map_err(bad)?,
                max_unavailable: r
                    .get("maxUnavailable")
                    .map(IntOrPct::parse)
                    .transpose()
                    .map_err(bad)?,
                order: {
                    let order: Vec<String> = r["order"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|v| v.as_str().map(str::to_string))
                        .collect::<Option<_>>()
                        .ok_or_else(|| bad("rollingUpdate.order: role names, please".into()))?;
                    if let Some(o) = order.iter().find(|o| !roles.contains(o)) {
                        return Err(bad(format!(
                            "rollingUpdate.order names {o:?}, which is not among the rule's \
                             roles {roles:?}"
                        )));
                    }
                    order
                },
                progress_deadline_secs: match r.get("progressDeadlineSeconds") {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(v.as_u64().filter(|s| *s > 0).ok_or_else(|| {
                        bad(format!(
                            "rollingUpdate.progressDeadlineSeconds: {v} is not a positive count"
                        ))
                    })?),
                },
            }),
        };
        let scaling = match st.get("scaling") {
            None | Some(Value::Null) => None,
            Some(r) => Some(ScalingRule {
                max_skew_pct: r
                    .get("maxSkew")
                    .map(|v| percent(v, "maxSkew"))
                    .transpose()
                    .map_err(bad)?
                    .unwrap_or(100),
                progression: match text(r, "progression") {
                    None | Some("") => Progression::None,
                    Some("OrderScheduled") => Progression::OrderScheduled,
                    Some("OrderReady") => Progression::OrderReady,
                    Some(o) => return Err(bad(format!("unknown progression {o:?}"))),
                },
            }),
        };
        let gang = match st.pointer("/scheduling/gang") {
            None | Some(Value::Null) => None,
            Some(g) => {
                let mut min_replicas = BTreeMap::new();
                for (role, n) in g["minReplicas"].as_object().into_iter().flatten() {
                    let n = n
                        .as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| {
                            bad(format!(
                                "scheduling.gang.minReplicas.{role}: {n} is not a count"
                            ))
                        })?;
                    if !roles.contains(role) {
                        return Err(bad(format!(
                            "scheduling.gang.minReplicas names {role:?}, which is not among \
                             the rule's roles {roles:?}"
                        )));
                    }
                    min_replicas.insert(role.clone(), n);
                }
                Some(GangRule { min_replicas })
            }
        };
        out.push(Coordination {
            name,
            roles,
            rolling,
            scaling,
            gang,
        });
    }
    Ok(out)
}

/// Reads a CoordinatedPolicy's `spec.policies` (same shape as v1alpha1 `coordination`).
pub fn parse_policy(obj: &Value) -> Result<Vec<Coordination>, SpecError> {
    parse_coordination(&obj["spec"]["policies"])
}

fn role_template(spec: &Value, name: &str, reference: &str) -> Result<Value, SpecError> {
    spec["roleTemplates"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| text(t, "name") == Some(reference)))
        .map(|t| t["template"].clone())
        .ok_or_else(|| {
            role_err(
                name,
                format!("templateRef {reference:?} is not in spec.roleTemplates"),
            )
        })
}

/// `template` or `templateRef` (+ patch) of a pattern or of a v1alpha1 role.
fn template_of(
    spec: &Value,
    name: &str,
    holder: &Value,
    ref_patch: Option<&Value>,
) -> Result<Value, SpecError> {
    match (holder.get("template"), holder.get("templateRef")) {
        (Some(_), Some(_)) => Err(role_err(name, "template and templateRef are exclusive")),
        (Some(t), None) => Ok(t.clone()),
        (None, Some(r)) => {
            let reference = text(r, "name").unwrap_or("");
            let mut t = role_template(spec, name, reference)?;
            if let Some(p) = r.get("patch").or(ref_patch).filter(|p| !p.is_null()) {
                patch::strategic_merge(&mut t, p);
            }
            Ok(t)
        }
        (None, None) => Err(role_err(name, "has no template")),
    }
}

fn parse_rollout(name: &str, r: &Value) -> Result<Rollout, SpecError> {
    let mut out = Rollout::default();
    let ru = r["rolloutStrategy"].get("rollingUpdate");
    let Some(ru) = ru.filter(|v| !v.is_null()) else {
        return Ok(out);
    };
    out.recreate = match text(ru, "type") {
        None | Some("") => false,
        Some("InPlaceIfPossible" | "InplaceIfPossible" | "InPlaceOnly") => false,
        Some("Recreate" | "RecreatePod") => true,
        Some(o) => return Err(role_err(name, format!("unknown rollingUpdate.type {o:?}"))),
    };
    let field = |f: &str| -> Result<Option<IntOrPct>, SpecError> {
        ru.get(f)
            .filter(|v| !v.is_null())
            .map(|v| IntOrPct::parse(v).map_err(|e| role_err(name, format!("{f}: {e}"))))
            .transpose()
    };
    if let Some(v) = field("maxUnavailable")? {
        out.max_unavailable = v;
    }
    if let Some(v) = field("maxSurge")? {
        out.max_surge = v;
    }
    if let Some(v) = field("partition")? {
        out.partition = v;
    }
    out.paused = ru.get("paused").and_then(Value::as_bool).unwrap_or(false);
    Ok(out)
}

fn parse_role(spec: &Value, r: &Value, legacy: bool) -> Result<Role, SpecError> {
    let name = text(r, "name").unwrap_or("").to_string();
    if !crate::kube::is_dns_label(&name) {
        return Err(role_err(&name, "name must be a DNS label"));
    }
    let replicas = match r.get("replicas") {
        None | Some(Value::Null) => 1,
        Some(v) => v
            .as_u64()
            .filter(|n| *n <= 100_000)
            .ok_or_else(|| role_err(&name, format!("replicas {v} is not a count")))?
            as u32,
    };
    let dependencies = r["dependencies"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let annotations = &r["annotations"];
    let pattern_annotation = text(annotations, "rbg.workloads.x-k8s.io/role-instance-pattern")
        .or_else(|| {
            text(
                annotations,
                "instance.rolebasedgroup.workloads.x-k8s.io/pattern",
            )
        });
    let workload_kind = if legacy {
        text(&r["workload"], "kind")
            .unwrap_or("StatefulSet")
            .to_string()
    } else {
        text(annotations, "rbg.workloads.x-k8s.io/role-workload-type")
            .and_then(|t| t.rsplit('/').next())
            .unwrap_or("RoleInstanceSet")
            .to_string()
    };
    let stateless = pattern_annotation == Some("Stateless") || workload_kind == "Deployment";
    // RBG: a leader-worker instance is recreated by default, a standalone pod never.
    let mut restart = RestartPolicy::NONE;
    let (template, pattern) = if legacy {
        restart = parse_restart(&name, r, false)?;
        let patch = r.get("templatePatch");
        let template = template_of(spec, &name, r, patch)?;
        match r.get("leaderWorkerSet").filter(|v| !v.is_null()) {
            Some(lws) => (
                template,
                Pattern::LeaderWorker {
                    size: lws["size"].as_u64().unwrap_or(1).max(1) as u32,
                    leader_patch: lws
                        .get("patchLeaderTemplate")
                        .cloned()
                        .unwrap_or(Value::Null),
                    worker_patch: lws
                        .get("patchWorkerTemplate")
                        .cloned()
                        .unwrap_or(Value::Null),
                    leader_only_service: false,
                },
            ),
            None => (template, Pattern::Standalone),
        }
    } else if let Some(p) = r.get("standalonePattern").filter(|v| !v.is_null()) {
        if r.get("leaderWorkerPattern").is_some() {
            return Err(role_err(
                &name,
                "standalonePattern and leaderWorkerPattern are exclusive",
            ));
        }
        (template_of(spec, &name, p, None)?, Pattern::Standalone)
    } else if let Some(p) = r.get("leaderWorkerPattern").filter(|v| !v.is_null()) {
        restart = parse_restart(&name, p, true)?;
        let leader_only = match text(p, "sharedServiceSelection") {
            Some("All") => false,
            Some("LeaderOnly") | None => true,
            Some(o) => {
                return Err(role_err(
                    &name,
                    format!("unknown sharedServiceSelection {o:?}"),
                ))
            }
        };
        (
            template_of(spec, &name, p, None)?,
            Pattern::LeaderWorker {
                size: p["size"].as_u64().unwrap_or(1).max(1) as u32,
                leader_patch: p.get("leaderTemplatePatch").cloned().unwrap_or(Value::Null),
                worker_patch: p.get("workerTemplatePatch").cloned().unwrap_or(Value::Null),
                leader_only_service: leader_only,
            },
        )
    } else if r.get("customComponentsPattern").is_some() {
        return Err(role_err(
            &name,
            "customComponentsPattern is not supported by rbgctl yet",
        ));
    } else {
        return Err(role_err(
            &name,
            "needs standalonePattern or leaderWorkerPattern (v1alpha2) or template (v1alpha1)",
        ));
    };
    if template["spec"]["containers"]
        .as_array()
        .is_none_or(|c| c.is_empty())
    {
        return Err(role_err(&name, "template has no containers"));
    }
    let service_ports = r["servicePorts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let port = p["port"].as_u64()? as u16;
            let key = text(p, "name")
                .map(|n| n.to_lowercase().replace('-', "_"))
                .unwrap_or_else(|| format!("port{port}"));
            Some((key, port))
        })
        .collect();
    let scaling_adapter = match r.get("scalingAdapter").filter(|v| !v.is_null()) {
        None => None,
        Some(a) => match a.get("enable").filter(|v| !v.is_null()) {
            None | Some(Value::Bool(false)) => None,
            Some(Value::Bool(true)) => Some(
                a["labels"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect(),
            ),
            Some(v) => {
                return Err(role_err(
                    &name,
                    format!("scalingAdapter.enable {v} is not true or false"),
                ))
            }
        },
    };
    let source = inline_source(r, legacy, &template);
    let hand_over_secs = match text(annotations, HAND_OVER) {
        None => None,
        Some(v) => Some(
            v.parse::<u32>()
                .ok()
                .filter(|n| (1..=86_400).contains(n))
                .ok_or_else(|| {
                    role_err(
                        &name,
                        format!("annotation {HAND_OVER}: {v:?} is not a number of seconds from 1 to 86400"),
                    )
                })?,
        ),
    };
    Ok(Role {
        rollout: parse_rollout(&name, r)?,
        scaling_adapter,
        restart,
        source,
        hand_over_secs,
        name,
        replicas,
        dependencies,
        template,
        pattern,
        stateless,
        service_ports,
    })
}

/// `r` without `replicas`, the template its pattern (or, v1alpha1, the role) names written
/// inline as `template` instead of a `templateRef` (and its patch).
fn inline_source(r: &Value, legacy: bool, template: &Value) -> Value {
    let mut s = r.clone();
    let Some(o) = s.as_object_mut() else {
        return s;
    };
    o.remove("replicas");
    let holder = if legacy {
        Some(o)
    } else {
        ["standalonePattern", "leaderWorkerPattern"]
            .into_iter()
            .find(|k| o.get(*k).is_some_and(Value::is_object))
            .and_then(|k| o.get_mut(k))
            .and_then(Value::as_object_mut)
    };
    if let Some(h) = holder {
        h.remove("templateRef");
        h.remove("templatePatch");
        h.insert("template".into(), template.clone());
    }
    s
}

/// The role a ControllerRevision keeps (`source`, from [`Role::source`]) with `replicas`.
pub fn role_at(source: &Value, legacy: bool, replicas: u32) -> Result<Role, SpecError> {
    let mut r = source.clone();
    r["replicas"] = replicas.into();
    parse_role(&Value::Null, &r, legacy)
}

/// A role's restart policy from `at` (a v1alpha2 `leaderWorkerPattern`, or a v1alpha1 role):
/// `restartPolicyConfig.type`, else the older `restartPolicy`, else recreate when
/// `recreate_by_default`; delays in whole seconds, the cap no less than the base (RBG's rule).
fn parse_restart(
    name: &str,
    at: &Value,
    recreate_by_default: bool,
) -> Result<RestartPolicy, SpecError> {
    let cfg = &at["restartPolicyConfig"];
    let kind = text(cfg, "type").or_else(|| text(at, "restartPolicy"));
    let recreate = match kind {
        None => recreate_by_default,
        Some(restarts::RECREATE) => true,
        Some("None") => false,
        Some(other) => {
            return Err(role_err(
                name,
                format!(
                    "restartPolicy {other:?}: use None or {} (RecreateRBGOnPodRestart was \
                     removed from RBG)",
                    restarts::RECREATE
                ),
            ))
        }
    };
    let seconds = |field: &str, default: std::time::Duration| match cfg.get(field) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_u64()
            .filter(|s| *s <= 86_400)
            .map(std::time::Duration::from_secs)
            .ok_or_else(|| {
                role_err(
                    name,
                    format!(
                        "restartPolicyConfig.{field} {v} is not a number of seconds (0 to 86400)"
                    ),
                )
            }),
    };
    let base = seconds("baseDelaySeconds", restarts::BASE_DELAY)?;
    let max = seconds("maxDelaySeconds", restarts::MAX_DELAY)?;
    if max < base {
        return Err(role_err(
            name,
            "restartPolicyConfig.maxDelaySeconds must be at least baseDelaySeconds",
        ));
    }
    Ok(RestartPolicy {
        recreate,
        base,
        max,
    })
}

/// The model of a group object; a spec error names the role and field.
pub fn parse_group(obj: &Value) -> Result<Group, SpecError> {
    let legacy = is_legacy(obj);
    let spec = &obj["spec"];
    let roles_json = spec["roles"]
        .as_array()
        .filter(|r| !r.is_empty())
        .ok_or_else(|| SpecError::Group("spec.roles: at least one role is required".into()))?;
    let mut roles = Vec::new();
    for r in roles_json {
        let role = parse_role(spec, r, legacy)?;
        if roles.iter().any(|x: &Role| x.name == role.name) {
            return Err(role_err(&role.name, "appears twice"));
        }
        roles.push(role);
    }
    let meta = ObjectMeta::of(obj);
    Ok(Group {
        name: meta.name.to_string(),
        namespace: if meta.namespace.is_empty() {
            "default".to_string()
        } else {
            meta.namespace.to_string()
        },
        uid: meta.uid.to_string(),
        generation: meta.generation,
        legacy,
        roles,
        coordination: parse_coordination(&spec["coordination"])?,
        gang: None,
    })
}

/// Roles in dependency tiers (a role's tier is one more than its deepest dependency's);
/// unknown dependencies and cycles are errors.
pub fn dependency_tiers(roles: &[Role]) -> Result<Vec<Vec<String>>, SpecError> {
    use std::collections::BTreeMap;
    let by_name: BTreeMap<&str, &Role> = roles.iter().map(|r| (r.name.as_str(), r)).collect();
    for r in roles {
        for d in &r.dependencies {
            if !by_name.contains_key(d.as_str()) {
                return Err(role_err(
                    &r.name,
                    format!("depends on {d:?}, which is not a role of this group"),
                ));
            }
        }
    }
    let mut tier: BTreeMap<&str, usize> = BTreeMap::new();
    fn visit<'a>(
        n: &'a str,
        by_name: &BTreeMap<&'a str, &'a Role>,
        tier: &mut BTreeMap<&'a str, usize>,
        path: &mut Vec<&'a str>,
    ) -> Result<usize, SpecError> {
        if let Some(t) = tier.get(n) {
            return Ok(*t);
        }
        if path.contains(&n) {
            path.push(n);
            return Err(SpecError::Group(format!(
                "dependency cycle: {}",
                path.join(" -> ")
            )));
        }
        path.push(n);
        let mut t = 0;
        for d in &by_name[n].dependencies {
            t = t.max(visit(d, by_name, tier, path)? + 1);
        }
        path.pop();
        tier.insert(n, t);
        Ok(t)
    }
    for r in roles {
        visit(&r.name, &by_name, &mut tier, &mut Vec::new())?;
    }
    let depth = tier.values().max().copied().unwrap_or(0);
    let mut out = vec![Vec::new(); depth + 1];
    for r in roles {
        out[tier[r.name.as_str()]].push(r.name.clone());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn role(name: &str, deps: &[&str]) -> Value {
        json!({"name": name, "dependencies": deps,
               "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}})
    }

    #[test]
    fn int_or_percent_resolves_with_rounding() {
        assert_eq!(
            IntOrPct::parse(&json!("25%")).unwrap().resolve(10, false),
            2
        );
        assert_eq!(IntOrPct::parse(&json!("25%")).unwrap().resolve(10, true), 3);
        assert_eq!(IntOrPct::parse(&json!(3)).unwrap().resolve(10, true), 3);
        assert_eq!(IntOrPct::parse(&json!("4")).unwrap(), IntOrPct::Int(4));
        assert!(IntOrPct::parse(&json!("x%")).is_err());
        assert!(IntOrPct::parse(&json!(-1)).is_err());
    }

    #[test]
    fn dependencies_form_tiers_and_bad_ones_are_named() {
        let g = parse_group(&json!({"metadata": {"name": "g"}, "spec": {"roles": [
            role("router", &["prefill", "decode"]), role("prefill", &["master"]),
            role("decode", &["master"]), role("master", &[])]}}))
        .unwrap();
        assert!(g.legacy);
        assert_eq!(
            dependency_tiers(&g.roles).unwrap(),
            vec![vec!["master"], vec!["prefill", "decode"], vec!["router"]]
        );
        let mut bad = g.roles.clone();
        bad[3].dependencies = vec!["nope".into()];
        let e = dependency_tiers(&bad).unwrap_err().to_string();
        assert!(e.contains("master") && e.contains("nope"), "{e}");
        let mut cyc = g.roles.clone();
        cyc[3].dependencies = vec!["router".into()];
        let e = dependency_tiers(&cyc).unwrap_err().to_string();
        assert!(e.contains("cycle"), "{e}");
    }

    #[test]
    fn v1alpha2_patterns_and_role_templates_resolve() {
        let g = parse_group(&json!({"metadata": {"name": "g"}, "spec": {
            "roleTemplates": [{"name": "base", "template": {"spec": {"containers": [
                {"name": "c", "image": "x:1", "env": [{"name": "A", "value": "1"}]}]}}}],
            "roles": [
              {"name": "a", "replicas": 2, "standalonePattern": {"templateRef": {"name": "base",
                 "patch": {"spec": {"containers": [{"name": "c", "image": "x:2"}]}}}},
               "rolloutStrategy": {"rollingUpdate": {"type": "RecreatePod", "maxSurge": "50%", "paused": true}}},
              {"name": "b", "leaderWorkerPattern": {"size": 3, "templateRef": {"name": "base"},
                 "workerTemplatePatch": {"metadata": {"labels": {"w": "1"}}}},
               "annotations": {"rbg.workloads.x-k8s.io/role-instance-pattern": "Stateful"}}]}}))
        .unwrap();
        assert!(!g.legacy);
        let a = &g.roles[0];
        assert_eq!(a.template["spec"]["containers"][0]["image"], "x:2");
        assert_eq!(a.template["spec"]["containers"][0]["env"][0]["value"], "1");
        assert!(a.rollout.recreate && a.rollout.paused);
        assert_eq!(a.rollout.max_surge, IntOrPct::Pct(50));
        assert_eq!(g.roles[1].size(), 3);
        assert_eq!(g.roles[1].replicas, 1, "replicas default to 1");
        let e = parse_group(&json!({"metadata": {"name": "g"}, "spec": {"roles": [
            {"name": "a", "standalonePattern": {"templateRef": {"name": "missing"}}}]}}))
        .unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        let e = parse_group(&json!({"spec": {"roles": [{"name": "a", "replicas": "x",
            "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}]}}))
        .unwrap_err();
        assert!(e.to_string().contains("replicas"), "{e}");
    }

    #[test]
    fn restart_policies_follow_rbgs_resolution_and_their_delays_are_checked() {
        let group = |lwp: Value, solo: Value| {
            json!({"apiVersion": "workloads.x-k8s.io/v1alpha2", "kind": "RoleBasedGroup",
                "metadata": {"name": "g"},
                "spec": {"roles": [
                    {"name": "lw", "leaderWorkerPattern": lwp},
                    {"name": "solo", "standalonePattern": solo}]}})
        };
        let tpl = json!({"spec": {"containers": [{"name": "c", "image": "i"}]}});
        let with = |extra: Value| {
            let mut p = json!({"size": 2, "template": tpl});
            for (k, v) in extra.as_object().unwrap() {
                p[k] = v.clone();
            }
            p
        };
        let policy = |lwp: Value| {
            parse_group(&group(lwp, json!({"template": tpl})))
                .map(|g| (g.roles[0].restart, g.roles[1].restart))
        };
        // Defaults: a leader-worker instance is recreated, a standalone pod never.
        let (lw, solo) = policy(with(json!({}))).unwrap();
        assert!(lw.recreate && !solo.recreate);
        assert_eq!((lw.base.as_secs(), lw.max.as_secs()), (30, 600));
        // The config's type wins over the older string; delays as given.
        let (lw, _) = policy(with(
            json!({"restartPolicy": "RecreateRoleInstanceOnPodRestart",
            "restartPolicyConfig": {"type": "None", "baseDelaySeconds": 5, "maxDelaySeconds": 5}}),
        ))
        .unwrap();
        assert!(!lw.recreate);
        assert_eq!(lw.base.as_secs(), 5);
        let (lw, _) = policy(with(json!({"restartPolicy": "None"}))).unwrap();
        assert!(!lw.recreate);
        // Refused with the field named.
        for (bad, says) in [
            (
                json!({"restartPolicy": "RecreateRBGOnPodRestart"}),
                "RecreateRBGOnPodRestart",
            ),
            (
                json!({"restartPolicyConfig": {"baseDelaySeconds": 60, "maxDelaySeconds": 10}}),
                "maxDelaySeconds must be at least baseDelaySeconds",
            ),
            (
                json!({"restartPolicyConfig": {"baseDelaySeconds": -1}}),
                "baseDelaySeconds",
            ),
        ] {
            let e = policy(with(bad)).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("lw"), "{e}");
        }
    }
}
