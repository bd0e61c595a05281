//! One reconcile of a group: finalizer, spec, status, the discovery ConfigMap and Services,
//! then each role's next rollout step in dependency order, orphans last; or, for a group being
//! deleted, its children then its finalizer. It returns what the queue should do next.

use super::action::{Requeue, CACHE_SYNC_WAIT};
use super::context::{core, group_path, ns_of, slices_path, Context, ReconcileError};
use crate::kube::object::{set_condition, timestamp_now, NewCondition, ObjectMeta};
use crate::kube::{KubeError, Patch};
use crate::operator::coordination::{self, RoleState};
use crate::operator::desired::{self, Revision, FINALIZER, GROUP, ROLE};
use crate::operator::informer::key_of;
use crate::operator::model::{self, Group};
use crate::operator::plan::{self, Limits};
use crate::operator::restarts::{self, History, Verdict};
use crate::operator::{adapter, finalizer, gang, revisions, rollout};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How soon to look again after a step the API server refused for now.
const STEP_RETRY: Duration = Duration::from_secs(1);
/// How soon to look again for a scheduler's PodGroup CRD that is not installed.
const GANG_RETRY: Duration = Duration::from_secs(10);
/// Conditions said only while they apply: gone from the status when a reconcile has none.
const WHILE_THEY_APPLY: [&str; 1] = ["GangScheduling"];

/// One reconcile of the group `namespace/name`.
#[tracing::instrument(skip(ctx), fields(group = %key))]
pub async fn reconcile(ctx: &Context, key: &str) -> Result<Requeue, ReconcileError> {
    ctx.metrics.reconciles.fetch_add(1, Ordering::Relaxed);
    let caches = &ctx.caches;
    if !(caches.groups.synced()
        && caches.pods.synced()
        && caches.adapters.synced()
        && caches.revisions.synced())
    {
        return Ok(Requeue::After(CACHE_SYNC_WAIT));
    }
    let Some(mut obj) = ctx.caches.groups.get(key) else {
        return Ok(Requeue::AwaitChange);
    };
    let (ns, name) = ns_of(key);
    if ObjectMeta::of(&obj).is_terminating() {
        return finalize(ctx, &obj).await;
    }
    let meta = ObjectMeta::of(&obj);
    if !meta.has_finalizer(FINALIZER) {
        let ops = finalizer::add(&meta, FINALIZER);
        obj = patch_group(ctx, ns, name, ops).await?;
    }
    let mut g = match model::parse_group(&obj) {
        Ok(g) => g,
        Err(e) => return invalid(ctx, &obj, "InvalidSpec", &e.to_string()).await,
    };
    g.namespace = ns.to_string();
    // A bound scaling adapter sizes its role, even before it has written that into the
    // group (and against an edit of the group that disagrees, which it sets back).
    let held = adapter::overrides(&g, &adapter::adapters_of(ctx, ns, name));
    for r in &mut g.roles {
        if let Some(n) = held.get(&r.name) {
            r.replicas = *n;
        }
    }
    let tiers = match model::dependency_tiers(&g.roles) {
        Ok(t) => t,
        Err(e) => return invalid(ctx, &obj, "InvalidRoleDependency", &e.to_string()).await,
    };
    let mut rules = g.coordination.clone();
    if let Some(p) = ctx.caches.policies.get(key) {
        match model::parse_policy(&p) {
            Ok(r) => rules.extend(r),
            Err(e) => {
                ctx.events
                    .post(&obj, "Warning", "InvalidCoordinatedPolicy", &e.to_string())
                    .await
            }
        }
    }
    let gang = match gang::wanted(&obj, &g, &rules) {
        Ok(gang) => gang,
        Err(e) => return invalid(ctx, &obj, "InvalidGangScheduling", &e).await,
    };
    g.gang = gang.as_ref().map(|_| ctx.scheduler);
    let pods = ctx.pods_of(ns, name);
    let revs: BTreeMap<String, Revision> = g
        .roles
        .iter()
        .map(|r| (r.name.clone(), desired::revision(r)))
        .collect();
    // A rollback asked for is written into the spec first; the rollout follows from it.
    let crs = ctx.caches.revisions.select(|c| {
        let m = ObjectMeta::of(c);
        m.namespace == ns && m.label(GROUP) == name
    });
    let asked = ObjectMeta::of(&obj)
        .annotation(revisions::ROLLBACK_TO)
        .to_string();
    if !asked.is_empty() {
        return roll_back(ctx, &obj, &g, &revs, &crs, &asked).await;
    }
    let views: BTreeMap<String, Vec<plan::PodView>> = g
        .roles
        .iter()
        .map(|r| {
            let v = pods
                .iter()
                .filter(|p| ObjectMeta::of(p).label(ROLE) == r.name)
                .map(plan::view)
                .collect();
            (r.name.clone(), v)
        })
        .collect();
    // StatefulSet's currentRevision per role: what instances below the partition keep.
    let previous = model::RoleStatus::all_of(&obj);
    let current: BTreeMap<String, String> = g
        .roles
        .iter()
        .map(|r| {
            let before = previous
                .iter()
                .find(|s| s.name == r.name)
                .map_or("", |s| s.current_revision.as_str());
            let hash = &revs[&r.name].hash;
            let want = r.replicas * r.size();
            let cur = revisions::current_revision(before, hash, &views[&r.name], want);
            (r.name.clone(), cur)
        })
        .collect();
    let held_back = |role: &str| Some(current[role].clone()).filter(|c| *c != revs[role].hash);
    let instance_name = |role: &str| {
        let (gname, role) = (g.name.clone(), role.to_string());
        move |o: u32| desired::stateful_instance(&gname, &role, o)
    };
    // Restart policy first: an instance a container restart broke is recreated whole (the
    // pods it deletes still look alive in this pass; their deletion brings the next one).
    let mut history = History::of(&obj);
    let (recreated, restart_due) =
        recreate_restarted(ctx, &obj, &g, &revs, &views, &mut history).await?;
    // First pass: counts as things are, and each role's plan without coordination (the plan
    // a role takes when no rule holds it back).
    let mut states: BTreeMap<String, RoleState> = BTreeMap::new();
    let mut counts: BTreeMap<String, plan::Counts> = BTreeMap::new();
    let mut plans: BTreeMap<String, plan::Plan> = BTreeMap::new();
    for r in &g.roles {
        let lim = Limits {
            current_revision: held_back(&r.name),
            ..Limits::of(r, r.replicas, None, None)
        };
        let p = plan::plan(
            r,
            &revs[&r.name],
            &lim,
            &views[&r.name],
            &instance_name(&r.name),
        );
        let c = p.counts.clone();
        states.insert(
            r.name.clone(),
            RoleState {
                desired: r.replicas,
                current: c.replicas,
                ready: c.ready,
                updated: c.updated,
                scheduled: c.scheduled,
                updated_ready: c.updated_ready,
            },
        );
        counts.insert(r.name.clone(), c);
        plans.insert(r.name.clone(), p);
    }
    // A v1alpha1 group's EndpointSlices, computed up front: endpoints the API server would
    // refuse are left out and reported in the status.
    let slices: Vec<(Value, Vec<String>)> = if g.legacy {
        g.roles
            .iter()
            .map(|r| {
                let mine: Vec<&Value> = pods
                    .iter()
                    .filter(|p| {
                        let m = ObjectMeta::of(p);
                        m.label(ROLE) == r.name && !m.is_terminating()
                    })
                    .collect();
                desired::legacy_endpoints(&g, r, &mine)
            })
            .collect()
    } else {
        Vec::new()
    };
    let refused: Vec<&str> = slices
        .iter()
        .flat_map(|(_, s)| s.iter().map(String::as_str))
        .collect();
    // One event per endpoint, told once each: the message does not grow as pods come.
    for endpoint in &refused {
        let msg =
            format!("endpoint left out of the Service (the API server refuses it): {endpoint}");
        ctx.events
            .post_about(&obj, endpoint, "Warning", "EndpointAddressRefused", &msg)
            .await;
    }
    let refused = refused.join("; ");
    // Written before the status says anything about them: the condition reports what the
    // API server took. One slice that cannot be written does not hold the others back;
    // the first failure is returned at the end (and retried).
    let mut slice_failed = None;
    let mut not_written = Vec::new();
    for (slice, _) in slices {
        let name = ObjectMeta::of(&slice).name.to_string();
        if let Err(e) = ctx.ensure_slice(slice).await {
            tracing::warn!(group = %key, slice = %name, error = %e, "EndpointSlice not written");
            not_written.push(format!("{name}: {e}"));
            slice_failed.get_or_insert(e);
        }
    }
    let mut conditions = Vec::new();
    if g.legacy {
        conditions.push(if !not_written.is_empty() {
            NewCondition::new(
                "EndpointsPublished",
                false,
                "EndpointSliceNotWritten",
                format!("the API server did not take: {}", not_written.join("; ")),
            )
        } else if refused.is_empty() {
            NewCondition::new(
                "EndpointsPublished",
                true,
                "AllEndpoints",
                "every pod with an IP is in its Service's endpoints",
            )
        } else {
            NewCondition::new(
                "EndpointsPublished",
                false,
                "EndpointAddressRefused",
                refused,
            )
        });
    }
    // In-place updates the kubelet has not confirmed in time: said, not waited on silently.
    let now = chrono::Utc::now();
    let timeout = chrono::Duration::from_std(ctx.inplace_timeout).unwrap_or_default();
    let mut unconfirmed: Vec<&str> = views
        .values()
        .flatten()
        .filter(|p| {
            p.inplace_unconfirmed_since
                .is_some_and(|t| now - t > timeout)
        })
        .map(|p| p.name.as_str())
        .collect();
    unconfirmed.sort_unstable();
    let pending_soon = views
        .values()
        .flatten()
        .filter_map(|p| p.inplace_unconfirmed_since)
        .map(|t| (t + timeout - now).to_std().unwrap_or_default())
        .filter(|d| !d.is_zero())
        .min();
    if unconfirmed.is_empty() {
        conditions.push(NewCondition::new(
            "InPlaceUpdatesConfirmed",
            true,
            "Confirmed",
            "no in-place update is overdue",
        ));
    } else {
        let msg = format!(
            "in-place updates not confirmed by the kubelet within {} s (new image running and \
             Ready): {}",
            ctx.inplace_timeout.as_secs(),
            unconfirmed.join(", ")
        );
        ctx.events
            .post(&obj, "Warning", "InPlaceUpdateUnconfirmed", &msg)
            .await;
        conditions.push(NewCondition::new(
            "InPlaceUpdatesConfirmed",
            false,
            "InPlaceUpdateUnconfirmed",
            msg,
        ));
    }
    // The PodGroup before any pod is made: the scheduler holds the gang's pods to it.
    let gang_said = ctx.ensure_gang(&obj, &g, gang.as_ref(), &pods).await?;
    let gang_missing = gang_said.as_ref().is_some_and(|c| c.status == "False");
    conditions.extend(gang_said);
    // Coordinated rollouts: where each is, and whether one ran past its deadline.
    let recorded = rollout::Tracked::all_of(&obj);
    let roles_now: BTreeMap<String, rollout::RoleNow> = g
        .roles
        .iter()
        .map(|r| {
            let c = &counts[&r.name];
            let now = rollout::RoleNow {
                current: current[&r.name].clone(),
                update: revs[&r.name].hash.clone(),
                done: c.replicas >= r.replicas && c.updated_ready >= r.replicas,
            };
            (r.name.clone(), now)
        })
        .collect();
    let mut rollouts = Vec::new();
    let mut back = Vec::new();
    let now = chrono::Utc::now();
    for rule in &rules {
        let before = recorded.iter().find(|t| t.name == rule.name);
        match rollout::track(rule, before, &roles_now, now) {
            Some(rollout::Verdict::Keep(t)) => rollouts.push(t),
            Some(rollout::Verdict::RollBack(t)) => {
                back.push(t.clone());
                rollouts.push(t);
            }
            None => {}
        }
    }
    let reversed: Vec<String> = rollouts
        .iter()
        .filter(|t| t.phase == rollout::Phase::RollingBack)
        .map(|t| t.name.clone())
        .collect();
    let deadline_due = rules
        .iter()
        .filter_map(|rule| {
            let d = rule.rolling.as_ref()?.progress_deadline_secs?;
            let t = rollouts.iter().find(|t| t.name == rule.name)?;
            (t.phase == rollout::Phase::Progressing).then_some(())?;
            let started = chrono::DateTime::parse_from_rfc3339(&t.started_at).ok()?;
            let due = started + chrono::Duration::seconds(d as i64);
            Some(
                (due.with_timezone(&chrono::Utc) - now)
                    .to_std()
                    .unwrap_or_default(),
            )
        })
        .min();
    let revision_of: BTreeMap<String, (String, String)> = g
        .roles
        .iter()
        .map(|r| {
            let (cur, upd) = (current[&r.name].clone(), revs[&r.name].hash.clone());
            (r.name.clone(), (cur, upd))
        })
        .collect();
    let parts = StatusParts {
        counts: &counts,
        conditions: &conditions,
        restarts: &history,
        revisions: &revision_of,
        rollouts: &rollouts,
    };
    write_status(ctx, &obj, &g, &parts).await?;
    if !back.is_empty() {
        return roll_back_rollouts(ctx, key, &g, &crs, &back).await;
    }
    if gang_missing {
        return Ok(Requeue::After(GANG_RETRY));
    }
    if recreated {
        return Ok(Requeue::soonest([Some(STEP_RETRY), restart_due]));
    }
    let user_partition: BTreeMap<String, u32> = g
        .roles
        .iter()
        .map(|r| {
            (
                r.name.clone(),
                r.rollout.partition.resolve(r.replicas, false),
            )
        })
        .collect();
    let overrides = coordination::overrides(&rules, &states, &user_partition, &reversed);
    ctx.keep_revisions(&g, &revs, &crs, &views, &current)
        .await?;
    ctx.ensure_config(&g, &views).await?;
    for r in &g.roles {
        for svc in desired::services(&g, r) {
            ctx.ensure_service(svc).await?;
        }
    }
    adapter::ensure(ctx, &g).await?;
    ctx.ensure_budgets(&g, &pods).await?;
    // Roles in dependency order; a role moves only when its dependencies are ready.
    let ready = |role: &str| {
        let st = &states[role];
        st.ready >= st.desired && st.current >= st.desired
    };
    // Whether a step could not be taken and needs another look soon.
    let mut again = false;
    for tier in &tiers {
        for role_name in tier {
            let Some(r) = g.roles.iter().find(|r| &r.name == role_name) else {
                continue;
            };
            let waiting: Vec<&String> = r.dependencies.iter().filter(|d| !ready(d)).collect();
            if !waiting.is_empty() {
                let msg = format!(
                    "role {} waits for {} to be ready",
                    r.name,
                    waiting
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                ctx.events
                    .post_about(&obj, &r.name, "Normal", "DependencyNotMet", &msg)
                    .await;
                continue;
            }
            let o = overrides.get(&r.name).cloned().unwrap_or_default();
            // Planned again only when coordination changes the role's limits.
            let p = match plans.remove(&r.name) {
                Some(p) if o == coordination::Override::default() => p,
                _ => {
                    let replicas = o.replicas.unwrap_or(r.replicas);
                    let lim = Limits::of(r, replicas, None, o.max_unavailable);
                    let lim = Limits {
                        partition: o.partition.map_or(lim.partition, |p| p.min(replicas)),
                        current_revision: held_back(&r.name),
                        ..lim
                    };
                    plan::plan(
                        r,
                        &revs[&r.name],
                        &lim,
                        &views[&r.name],
                        &instance_name(&r.name),
                    )
                }
            };
            let stepped = ctx.execute(&obj, &g, r, &revs[&r.name], &p.actions).await?;
            again |= !stepped;
        }
    }
    // The orphans of removed roles go even when a slice could not be written.
    ctx.remove_orphans(&g, &pods).await?;
    if let Some(e) = slice_failed {
        return Err(e);
    }
    // Look again soon after a refused step, and when an in-place update falls due.
    Ok(Requeue::soonest([
        again.then_some(STEP_RETRY),
        pending_soon,
        restart_due,
        deadline_due,
    ]))
}

/// Recreates the instances whose containers restarted, as their roles' restart policies and
/// their backoff allow (each told in an event), and keeps `history` (pruned of roles gone and
/// of instances without pods whose backoff ran out). Answers whether it recreated any, and how
/// soon the backoff lets the next one go.
async fn recreate_restarted(
    ctx: &Context,
    obj: &Value,
    g: &Group,
    revs: &BTreeMap<String, Revision>,
    views: &BTreeMap<String, Vec<plan::PodView>>,
    history: &mut History,
) -> Result<(bool, Option<Duration>), ReconcileError> {
    let now = chrono::Utc::now();
    let (mut recreated, mut due) = (false, None::<Duration>);
    let mut seen = std::collections::BTreeSet::new();
    for r in &g.roles {
        let mut instances: BTreeMap<&str, Vec<&plan::PodView>> = BTreeMap::new();
        for p in &views[&r.name] {
            instances.entry(&p.instance).or_default().push(p);
        }
        for (instance, pods) in instances {
            let key = (r.name.clone(), instance.to_string());
            seen.insert(key.clone());
            let live: Vec<&plan::PodView> = pods.into_iter().filter(|p| !p.terminating).collect();
            if live.is_empty() {
                continue;
            }
            let restarted = live.iter().any(|p| p.restarted);
            let ready = live.len() == r.size() as usize && live.iter().all(|p| p.ready);
            let past = history.0.get(&key);
            match restarts::verdict(&r.restart, (&r.name, instance), restarted, ready, past, now) {
                Verdict::Leave => {}
                Verdict::Forget => {
                    history.0.remove(&key);
                }
                Verdict::Wait(d) => {
                    due = Some(due.map_or(d, |s| s.min(d)));
                }
                Verdict::Recreate(rec) => {
                    let broke: Vec<&str> = live
                        .iter()
                        .filter(|p| p.restarted)
                        .map(|p| p.name.as_str())
                        .collect();
                    let next = r.restart.delay(rec.count).as_secs();
                    let msg = format!(
                        "role {} instance {instance}: a container restarted in {}; the instance \
                         is recreated (recreation {}; the next no sooner than {next} s after)",
                        r.name,
                        broke.join(", "),
                        rec.count
                    );
                    tracing::warn!(group = %g.name, role = %r.name, instance, count = rec.count,
                        next_after_s = next, "instance recreated after a container restart");
                    ctx.events
                        .post(obj, "Warning", "InstanceRecreated", &msg)
                        .await;
                    let deletes: Vec<plan::Action> = live
                        .iter()
                        .map(|p| plan::Action::Delete {
                            name: p.name.clone(),
                            uid: p.uid.clone(),
                        })
                        .collect();
                    ctx.execute(obj, g, r, &revs[&r.name], &deletes).await?;
                    history.0.insert(key, rec);
                    recreated = true;
                }
            }
        }
    }
    // Records of roles gone, and of instances with no pod left once their backoff ran out.
    history.0.retain(|key, rec| {
        let Some(r) = g.roles.iter().find(|r| r.name == key.0) else {
            return false;
        };
        seen.contains(key) || r.restart.recreate && rec.since(now) < r.restart.max
    });
    Ok((recreated, due))
}

/// Writes the rollback the group's annotation asks for into its spec (and removes the
/// annotation) in one patch; a rollback that cannot be done is said and its annotation removed.
async fn roll_back(
    ctx: &Context,
    obj: &Value,
    g: &Group,
    revs: &BTreeMap<String, Revision>,
    crs: &[Value],
    asked: &str,
) -> Result<Requeue, ReconcileError> {
    let (ns, name) = (&g.namespace, &g.name);
    let (patch, said) = match revisions::rollback_targets(asked, g, revs, crs) {
        Ok(targets) => {
            let to: Vec<String> = targets
                .iter()
                .map(|(role, k)| format!("{role} to {} (revision {})", k.name, k.number))
                .collect();
            let msg = format!("rolled back: {}", to.join(", "));
            (
                revisions::rollback_patch(obj, &targets, true),
                ("Normal", "RolledBack", msg),
            )
        }
        Err(why) => {
            let patch = revisions::rollback_patch(obj, &BTreeMap::new(), true);
            let msg = format!("{}: {asked:?} not done: {why}", revisions::ROLLBACK_TO);
            (patch, ("Warning", "RollbackRefused", msg))
        }
    };
    patch_group(ctx, ns, name, patch).await?;
    let (kind, reason, msg) = said;
    tracing::info!(group = %name, reason, message = %msg, "rollback");
    ctx.events.post(obj, kind, reason, &msg).await;
    Ok(Requeue::After(Duration::ZERO))
}

/// Writes back, for each rollout past its deadline, every role's revision from before it (the
/// group as last written, so the status just recorded is not undone), and tells it.
async fn roll_back_rollouts(
    ctx: &Context,
    key: &str,
    g: &Group,
    crs: &[Value],
    back: &[rollout::Tracked],
) -> Result<Requeue, ReconcileError> {
    let Some(obj) = ctx.caches.groups.get(key) else {
        return Ok(Requeue::AwaitChange);
    };
    let mut targets = BTreeMap::new();
    let mut missing = Vec::new();
    for t in back {
        for (role, hash) in &t.from {
            let name = revisions::name(&g.name, role, hash);
            match crs.iter().find(|c| ObjectMeta::of(c).name == name) {
                Some(cr) => {
                    if let Some(k) = revisions::Kept::of(cr) {
                        targets.insert(role.clone(), k);
                    }
                }
                None => missing.push(name),
            }
        }
    }
    for t in back {
        let mut msg = format!("coordinated rollout {}: {}", t.name, t.message);
        if !missing.is_empty() {
            msg.push_str(&format!(
                " (not kept, left as they are: {})",
                missing.join(", ")
            ));
        }
        tracing::warn!(group = %key, rule = %t.name, "rollout past its deadline rolled back");
        ctx.events
            .post(&obj, "Warning", "RolloutRolledBack", &msg)
            .await;
    }
    if targets.is_empty() {
        return Ok(Requeue::AwaitChange);
    }
    let patch = revisions::rollback_patch(&obj, &targets, false);
    patch_group(ctx, &g.namespace, &g.name, patch).await?;
    Ok(Requeue::After(Duration::ZERO))
}

/// Writes a JSON patch of the group `ns/name`, keeps the answer in the cache and returns it.
async fn patch_group(
    ctx: &Context,
    ns: &str,
    name: &str,
    ops: Value,
) -> Result<Value, ReconcileError> {
    ctx.throttle.wait().await;
    let mark = ctx.caches.groups.mark();
    let written = ctx
        .kube
        .patch(&group_path(ns, name), &Patch::Json(ops))
        .await?;
    ctx.caches.groups.put_written(written.clone(), mark);
    Ok(written)
}

/// A spec that cannot be reconciled: told once as an event and in the Ready condition;
/// nothing more happens until the spec changes.
async fn invalid(
    ctx: &Context,
    obj: &Value,
    reason: &str,
    message: &str,
) -> Result<Requeue, ReconcileError> {
    tracing::warn!(group = %key_of(obj), reason, message, "group not reconciled");
    ctx.events.post(obj, "Warning", reason, message).await;
    let cond = NewCondition::new("Ready", false, reason, message);
    let mut status = obj.get("status").cloned().unwrap_or(json!({}));
    status["observedGeneration"] = json!(ObjectMeta::of(obj).generation);
    set_condition(&mut status, cond, &timestamp_now());
    put_status(ctx, obj, status).await?;
    Ok(Requeue::AwaitChange)
}

async fn put_status(ctx: &Context, obj: &Value, status: Value) -> Result<(), ReconcileError> {
    if obj.get("status") == Some(&status) {
        return Ok(());
    }
    let mut next = obj.clone();
    next["status"] = status;
    let key = key_of(obj);
    let (ns, name) = ns_of(&key);
    ctx.throttle.wait().await;
    let mark = ctx.caches.groups.mark();
    let v = ctx
        .kube
        .replace(&format!("{}/status", group_path(ns, name)), &next)
        .await?;
    ctx.metrics.status_writes.fetch_add(1, Ordering::Relaxed);
    ctx.caches.groups.put_written(v, mark);
    Ok(())
}

/// What a reconcile writes into the group's status.
struct StatusParts<'a> {
    counts: &'a BTreeMap<String, plan::Counts>,
    /// Further conditions to set beside `Ready`.
    conditions: &'a [NewCondition],
    restarts: &'a History,
    /// Each role's (current, update) revision.
    revisions: &'a BTreeMap<String, (String, String)>,
    rollouts: &'a [rollout::Tracked],
}

async fn write_status(
    ctx: &Context,
    obj: &Value,
    g: &Group,
    parts: &StatusParts<'_>,
) -> Result<(), ReconcileError> {
    let StatusParts {
        counts,
        conditions,
        restarts,
        revisions: revision_of,
        rollouts,
    } = parts;
    let role_statuses: Vec<model::RoleStatus> = g
        .roles
        .iter()
        .map(|r| {
            let c = &counts[&r.name];
            let (current_revision, update_revision) = revision_of[&r.name].clone();
            model::RoleStatus {
                name: r.name.clone(),
                replicas: c.replicas,
                ready_replicas: c.ready,
                updated_replicas: c.updated,
                current_revision,
                update_revision,
            }
        })
        .collect();
    let all = g.roles.iter().all(|r| {
        let c = &counts[&r.name];
        c.replicas == r.replicas && c.ready == r.replicas
    });
    let cond = if all {
        NewCondition::new("Ready", true, "AllRolesReady", "All roles are ready")
    } else {
        let waiting: Vec<&str> = g
            .roles
            .iter()
            .filter(|r| counts[&r.name].ready < r.replicas)
            .map(|r| r.name.as_str())
            .collect();
        NewCondition::new(
            "Ready",
            false,
            "RoleNotReady",
            format!("not ready: {}", waiting.join(", ")),
        )
    };
    let mut status = obj.get("status").cloned().unwrap_or(json!({}));
    if !status.is_object() {
        status = json!({});
    }
    status["observedGeneration"] = json!(g.generation);
    status["roleStatuses"] = json!(role_statuses);
    // Only for groups with tracked rollouts: others write what they did.
    if let Some(s) = status.as_object_mut() {
        if rollouts.is_empty() {
            s.remove("coordinatedRollouts");
        } else {
            s.insert("coordinatedRollouts".into(), json!(rollouts));
        }
    }
    // Only while an instance has been recreated: a group without restarts writes what it did.
    match status.as_object_mut() {
        Some(s) if restarts.0.is_empty() => {
            s.remove("instanceRestarts");
        }
        Some(s) => {
            s.insert("instanceRestarts".into(), json!(restarts.to_status()));
        }
        None => {}
    }
    if let Some(list) = status.get_mut("conditions").and_then(Value::as_array_mut) {
        list.retain(|c| {
            let kind = c["type"].as_str().unwrap_or("");
            !WHILE_THEY_APPLY.contains(&kind) || conditions.iter().any(|n| n.kind == kind)
        });
    }
    let now = timestamp_now();
    set_condition(&mut status, cond, &now);
    for c in conditions.iter() {
        set_condition(&mut status, c.clone(), &now);
    }
    put_status(ctx, obj, status).await
}

/// Deleting: remove every child, then the finalizer.
async fn finalize(ctx: &Context, obj: &Value) -> Result<Requeue, ReconcileError> {
    let key = key_of(obj);
    let (ns, name) = ns_of(&key);
    let meta = ObjectMeta::of(obj);
    if !meta.has_finalizer(FINALIZER) {
        return Ok(Requeue::AwaitChange);
    }
    let mine = |v: &Value| {
        let m = ObjectMeta::of(v);
        m.namespace == ns && m.label(GROUP) == name
    };
    let pods = ctx.caches.pods.select(mine);
    let services = ctx.caches.services.select(mine);
    let maps = ctx.caches.configmaps.select(mine);
    let slices = ctx.caches.slices.select(mine);
    let adapters = ctx.caches.adapters.select(|a| {
        let m = ObjectMeta::of(a);
        m.namespace == ns && m.owned_by(meta.uid)
    });
    let kept = ctx.caches.revisions.select(mine);
    ctx.remove_pod_group(ns, name, meta.uid, &pods).await?;
    ctx.remove_budgets(ns, name, meta.uid, &pods).await?;
    ctx.pod_groups.lock().remove(&key);
    let marks = [
        ctx.caches.services.mark(),
        ctx.caches.configmaps.mark(),
        ctx.caches.slices.mark(),
        ctx.caches.adapters.mark(),
        ctx.caches.revisions.mark(),
    ];
    for (list, base) in [
        (&pods, core(ns, "pods")),
        (&services, core(ns, "services")),
        (&maps, core(ns, "configmaps")),
        (&slices, slices_path(ns)),
        (&adapters, adapter::collection(ns)),
        (&kept, revisions::path(ns, None)),
    ] {
        for o in list.iter() {
            let m = ObjectMeta::of(o);
            if m.is_terminating() {
                continue;
            }
            ctx.throttle.wait().await;
            ctx.kube.delete(&format!("{base}/{}", m.name), None).await?;
        }
    }
    for ((store, list), mark) in [
        (&ctx.caches.services, &services),
        (&ctx.caches.configmaps, &maps),
        (&ctx.caches.slices, &slices),
        (&ctx.caches.adapters, &adapters),
        (&ctx.caches.revisions, &kept),
    ]
    .into_iter()
    .zip(marks)
    {
        for o in list.iter() {
            store.remove_written(&key_of(o), mark);
        }
    }
    if !ctx.caches.pods.select(mine).is_empty() {
        // Pods go when their kubelet has stopped them; their watch events bring us back.
        return Ok(Requeue::AwaitChange);
    }
    let ops = finalizer::release(&meta, FINALIZER);
    ctx.throttle.wait().await;
    // What the API server answers goes into the cache at once: a reconcile that comes before
    // the watch's deletion then finds the finalizer gone, not released a second time.
    let mark = ctx.caches.groups.mark();
    match ctx
        .kube
        .patch(&group_path(ns, name), &Patch::Json(ops))
        .await
    {
        Ok(v) => {
            ctx.caches.groups.put_written(v, mark);
            tracing::info!(group = %key, "children removed; finalizer released");
        }
        Err(KubeError::Status { code: 404, .. }) => {
            ctx.caches.groups.remove_written(&key, mark);
            tracing::debug!(group = %key, "the group was gone before its finalizer was released");
        }
        Err(e) => return Err(e.into()),
    }
    ctx.events.forget_group(&key);
    Ok(Requeue::AwaitChange)
}
