//! The master's HTTP servers: Mooncake's metadata protocol on its own port, and `/metrics`,
//! `/health` and the JSON admin API on the metrics port.

use super::metadata::MetadataStore;
use super::state::MasterState;
use super::tenants;
use super::Shared;
use crate::ha::lease::{LeaderHint, Leadership, Role};
use crate::telemetry::{Family, PromText};
use crate::transfer::Opcode;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use parking_lot::Mutex;
use serde::Deserialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

// The `/metrics` families this file writes, each declared once.
const ALLOC_FAILURES_TOTAL: Family = Family::counter(
    "rbgctl_master_alloc_failures_total",
    "Puts that found no space at first try.",
);
const AWAY_SEGMENTS: Family = Family::gauge(
    "rbgctl_master_away_segments",
    "Segments whose store went away; their objects wait, unreadable, for its return.",
);
const BOUND_CLIENTS: Family = Family::gauge(
    "rbgctl_master_bound_clients",
    "Clients with a connection bound to them (by a ping on it) open: live without \
         heartbeats while they hold no segment.",
);
const CAPACITY_BYTES: Family = Family::gauge(
    "rbgctl_master_capacity_bytes",
    "Bytes contributed by all mounted segments.",
);
const CLIENTS: Family = Family::gauge(
    "rbgctl_master_clients",
    "Clients known: heard from within the client TTL, or holding a bound connection.",
);
const CORRUPT_REPLICAS_TOTAL: Family = Family::counter(
    "rbgctl_master_corrupt_replicas_total",
    "Replicas dropped because a reader found them failing the checksum.",
);
const DEFERRED_BYTES: Family = Family::gauge(
    "rbgctl_master_deferred_bytes",
    "Freed bytes waiting for a lease or a writer to end.",
);
const DEMOTED_BYTES_TOTAL: Family = Family::counter(
    "rbgctl_master_demoted_bytes_total",
    "Bytes moved from memory to disk tiers.",
);
const DEMOTING_BYTES: Family = Family::gauge(
    "rbgctl_master_demoting_bytes",
    "Memory the demotions under way will free.",
);
const DEMOTIONS_TOTAL: Family = Family::counter(
    "rbgctl_master_demotions_total",
    "Objects memory gave up to a store's disk tier (copies confirmed).",
);
const DISK_EVICTED_BYTES_TOTAL: Family = Family::counter(
    "rbgctl_master_disk_evicted_bytes_total",
    "Bytes dropped from disk tiers by their own eviction.",
);
const DISK_EVICTED_OBJECTS_TOTAL: Family = Family::counter(
    "rbgctl_master_disk_evicted_objects_total",
    "Objects dropped from disk tiers by their own eviction.",
);
const DISK_FULL_DROPS_TOTAL: Family = Family::counter(
    "rbgctl_master_disk_full_drops_total",
    "Objects memory eviction dropped although their store has a disk tier (no room there, \
         or too large to move).",
);
const DISK_HITS_TOTAL: Family = Family::counter(
    "rbgctl_master_disk_hits_total",
    "Reads answered with a disk tier replica.",
);
const DROPPED_OBJECTS_TOTAL: Family = Family::counter(
    "rbgctl_master_dropped_objects_total",
    "Objects lost with their segments.",
);
const EVICTED_BYTES_TOTAL: Family = Family::counter(
    "rbgctl_master_evicted_bytes_total",
    "Bytes freed by eviction.",
);
const EVICTED_OBJECTS_TOTAL: Family =
    Family::counter("rbgctl_master_evicted_objects_total", "Objects evicted.");
const EVICTION_RUNS_TOTAL: Family =
    Family::counter("rbgctl_master_eviction_runs_total", "Eviction passes.");
const EXPIRED_CLIENTS_TOTAL: Family = Family::counter(
    "rbgctl_master_expired_clients_total",
    "Clients dropped after their TTL.",
);
const EXPIRED_RESERVATIONS_TOTAL: Family = Family::counter(
    "rbgctl_master_expired_reservations_total",
    "Reservations dropped unused after twice their TTL; their space waits for the release \
         timeout.",
);
const HAND_OVER_BYTES_TOTAL: Family = Family::counter(
    "rbgctl_master_hand_over_bytes_total",
    "Bytes copied to another store by a store's hand-over.",
);
const HAND_OVER_FAILURES_TOTAL: Family = Family::counter(
    "rbgctl_master_hand_over_failures_total",
    "Hand-over copies that failed (the object stayed where it was, tried again).",
);
const HAND_OVER_OBJECTS_TOTAL: Family = Family::counter(
    "rbgctl_master_hand_over_objects_total",
    "Objects copied to another store by a store's hand-over.",
);
const HASHED_LATER_TOTAL: Family = Family::counter(
    "rbgctl_master_hashed_later_total",
    "Checksums stores sent after the put for objects committed unhashed (Mooncake's one-sided writes).",
);
const HASH_MISMATCHES_TOTAL: Family = Family::counter(
    "rbgctl_master_hash_mismatches_total",
    "Replicas of one object that hashed differently after the put (the object stays unhashed).",
);
const HA_BACKEND_ERRORS_TOTAL: Family = Family::counter(
    "rbgctl_master_ha_backend_errors_total",
    "Failed calls to the election backend.",
);
const HA_ELECTIONS_WON_TOTAL: Family = Family::counter(
    "rbgctl_master_ha_elections_won_total",
    "Elections this master won.",
);
const HA_EPOCH: Family = Family::gauge(
    "rbgctl_master_ha_epoch",
    "Leadership epoch this master last led with (0: never led).",
);
const HA_LAST_TAKEOVER_SECONDS: Family = Family::gauge(
    "rbgctl_master_ha_last_takeover_seconds",
    "At the last election this master won: seconds from seeing the leadership change to leading.",
);
const HA_LEADERSHIP_LOST_TOTAL: Family = Family::counter(
    "rbgctl_master_ha_leadership_lost_total",
    "Times this master stopped leading without resigning (lease lost or ran out).",
);
const HA_ROLE: Family = Family::gauge(
    "rbgctl_master_ha_role",
    "1 for this master's role: single (no HA), leader or standby.",
);
const KEYS: Family = Family::gauge("rbgctl_master_keys", "Readable objects.");
const KV_EVENTS_DROPPED_TOTAL: Family = Family::counter(
    "rbgctl_master_kv_events_dropped_total",
    "Pool KV events dropped before the publisher took them.",
);
const KV_EVENT_PAGES: Family = Family::gauge(
    "rbgctl_master_kv_event_pages",
    "Pages (HiCache page keys) with an object in the pool, as its KV events say.",
);
const LOST_OBJECTS_TOTAL: Family = Family::counter(
    "rbgctl_master_lost_objects_total",
    "Objects a returning store no longer had.",
);
const PARTIAL_ALLOCATIONS_TOTAL: Family = Family::counter(
    "rbgctl_master_partial_allocations_total",
    "Puts given fewer replicas than asked.",
);
const PENDING_PUTS: Family = Family::gauge(
    "rbgctl_master_pending_puts",
    "Puts started and not yet finished.",
);
const PROMOTED_BYTES_TOTAL: Family = Family::counter(
    "rbgctl_master_promoted_bytes_total",
    "Bytes moved from disk tiers back to memory.",
);
const PROMOTIONS_TOTAL: Family = Family::counter(
    "rbgctl_master_promotions_total",
    "Objects a hit brought back from a disk tier to memory.",
);
const PUT_RESERVATIONS: Family = Family::gauge(
    "rbgctl_master_put_reservations",
    "Space reserved for clients' next puts (a put into one needs only its commit).",
);
const RECLAIMED_PUTS_TOTAL: Family = Family::counter(
    "rbgctl_master_reclaimed_puts_total",
    "Abandoned puts reclaimed.",
);
const RECOVERED_OBJECTS_TOTAL: Family = Family::counter(
    "rbgctl_master_recovered_objects_total",
    "Objects taken back from stores' reports (after a store or master restart).",
);
const RECOVERING_SEGMENTS: Family = Family::gauge(
    "rbgctl_master_recovering_segments",
    "Segments whose store is reporting the objects it kept.",
);
const REJECTED_RECORDS_TOTAL: Family = Family::counter(
    "rbgctl_master_rejected_records_total",
    "Reported records not taken (stale versions, removed objects, invalid ranges).",
);
const RESERVED_PUTS_TOTAL: Family = Family::counter(
    "rbgctl_master_reserved_puts_total",
    "Puts committed into a reservation: one master round trip instead of two.",
);
const SEGMENTS: Family = Family::gauge("rbgctl_master_segments", "Mounted segments.");
const SEGMENTS_GIVEN_UP_TOTAL: Family = Family::counter(
    "rbgctl_master_segments_given_up_total",
    "Away segments dropped after the grace period.",
);
const SOFT_PINNED_KEYS: Family = Family::gauge(
    "rbgctl_master_soft_pinned_keys",
    "Objects under a soft pin.",
);
const TIER_MOVES_IN_FLIGHT: Family = Family::gauge(
    "rbgctl_master_tier_moves_in_flight",
    "Copies between tiers sent or queued and not yet answered.",
);
const TIER_MOVES_SENT_TOTAL: Family = Family::counter(
    "rbgctl_master_tier_moves_sent_total",
    "Copies between tiers sent to stores.",
);
const TIER_MOVE_FAILURES_TOTAL: Family = Family::counter(
    "rbgctl_master_tier_move_failures_total",
    "Copies between tiers that failed (the object stayed where it was).",
);
const USED_BYTES: Family = Family::gauge(
    "rbgctl_master_used_bytes",
    "Bytes allocated in all segments.",
);

fn plain(status: u16, body: Vec<u8>, json: bool) -> Response {
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if json {
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
    }
    resp
}

/// A standby's answer to what only the leader serves: `307` to the same path at the leader
/// (`pick` says which of its addresses), or `503` while no leader is known. `None` on the
/// leader and on a master without HA.
fn to_leader(
    leadership: &Leadership,
    pick: fn(&LeaderHint) -> Option<&str>,
    uri: &Uri,
) -> Option<Response> {
    let Err(not_leader) = leadership.check(Instant::now()) else {
        return None;
    };
    let target = not_leader.leader.as_ref().and_then(|h| {
        let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        pick(h).map(|addr| (format!("http://{addr}{path}"), h.epoch))
    });
    let body = serde_json::json!({
        "error": not_leader.to_string(),
        "role": "standby",
        "leader": target.as_ref().map(|(url, _)| url),
        "leader_epoch": target.as_ref().map(|(_, e)| e),
    });
    let mut resp = plain(
        if target.is_some() { 307 } else { 503 },
        body.to_string().into_bytes(),
        true,
    );
    if let Some((url, _)) = target {
        if let Ok(v) = header::HeaderValue::from_str(&url) {
            resp.headers_mut().insert(header::LOCATION, v);
        }
    }
    Some(resp)
}

/// Mooncake's metadata server: `GET/PUT/DELETE /metadata?key=…`, `GET /health`, 404 otherwise.
/// A standby sends `/metadata` to the leader's. With the cluster secret (`auth`), writes need
/// `Authorization: Bearer <secret>`; reads stay open.
pub fn metadata_router(
    store: Arc<Mutex<MetadataStore>>,
    leadership: Arc<Leadership>,
    auth: Option<Arc<crate::auth::Secret>>,
    max_body: usize,
) -> Router {
    Router::new().fallback(move |req: axum::extract::Request| {
        let store = store.clone();
        let leadership = leadership.clone();
        let auth = auth.clone();
        async move {
            let (method, uri) = (req.method().clone(), req.uri().clone());
            let writer = crate::http_server::peer().map(|p| p.ip());
            if uri.path() == "/metadata" {
                if let Some(r) = to_leader(&leadership, |h| h.metadata.as_deref(), &uri) {
                    return r;
                }
            }
            // From the headers, before a byte of the body is read: a client without the
            // secret holds nothing while it sends (or withholds) a body.
            let write = matches!(method.as_str(), "PUT" | "DELETE");
            if let Some(secret) = auth.as_deref().filter(|_| write) {
                let given = req
                    .headers()
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok());
                if !secret.bearer_ok(given) {
                    return plain(
                        401,
                        b"writes need Authorization: Bearer <the cluster secret> (--auth-token-file)"
                            .to_vec(),
                        false,
                    );
                }
            }
            match (uri.path(), method.as_str()) {
                ("/metadata", m @ ("GET" | "PUT" | "DELETE")) => {
                    let body = match axum::body::to_bytes(req.into_body(), max_body).await {
                        Ok(b) => b,
                        Err(e) => {
                            let (status, why) = crate::http_server::body_error(&e);
                            return plain(status.as_u16(), why.into_bytes(), false);
                        }
                    };
                    let r = store.lock().handle_from(m, uri.query(), &body, writer);
                    plain(r.status, r.body, r.json)
                }
                ("/health", "GET") => plain(200, b"OK".to_vec(), false),
                _ => plain(404, b"404 Not Found".to_vec(), false),
            }
        }
    })
}

#[derive(Deserialize)]
struct KeyQuery {
    key: Option<String>,
    /// The tenant whose namespace the key is in (`master::tenants`). Default `default`.
    tenant: Option<String>,
}

/// The tenant an admin request names (default `default`), checked.
fn tenant_param(tenant: Option<&str>) -> Result<&str, String> {
    let tenant = tenant.unwrap_or(tenants::DEFAULT_TENANT);
    tenants::check_name(tenant).map_err(|e| e.to_string())?;
    Ok(tenant)
}

/// The key the master holds for `tenant`'s `key` (both from an admin request).
fn held_key<'a>(tenant: Option<&str>, key: &'a str) -> Result<std::borrow::Cow<'a, str>, String> {
    let tenant = tenant_param(tenant)?;
    tenants::check_key(key).map_err(|e| e.to_string())?;
    Ok(tenants::scoped(tenant, key))
}

fn bad_request(why: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(serde_json::json!({ "error": why })),
    )
        .into_response()
}

/// `/metrics`, `/health` and `/ready` are every master's own; the rest of the admin API is the
/// leader's, and a standby sends it there.
async fn leader_only(
    State(shared): State<Arc<Shared>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let own = matches!(
        req.uri().path(),
        "/metrics" | "/health" | "/ready" | "/" | "/ui"
    );
    if !own {
        if let Some(r) = to_leader(&shared.leadership, |h| Some(h.admin.as_str()), req.uri()) {
            return r;
        }
    }
    next.run(req).await
}

/// The master's admin and status routes (`/api/v1/…`, `/ui`, `/metrics`, `/health`).
pub fn admin_router(shared: Arc<Shared>) -> Router {
    // Key names, their places and the clients that wrote them: with the cluster secret set,
    // only for those who hold it.
    let objects = Router::new()
        .route("/api/v1/objects", get(object))
        .route("/api/v1/keys", get(keys))
        .route("/api/v1/evictions", get(evictions))
        .route("/api/v1/tenants", get(tenants_usage))
        // Moves every object off a store: for those who hold the secret.
        .route(
            "/api/v1/segments/{name}/drain",
            axum::routing::post(drain).get(drain_status),
        )
        .route("/api/v1/drains", get(drains))
        .route("/query_key", get(query_key))
        // Sends every page to every subscriber: as much the secret holders' as the keys.
        .route(
            "/api/v1/kv_events/snapshot",
            axum::routing::post(kv_events_snapshot),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            require_secret,
        ));
    Router::new()
        .route("/", get(status_page))
        .route("/ui", get(status_page))
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics/summary", get(summary_text))
        .route("/api/v1/status", get(status))
        .route("/api/v1/segments", get(segments))
        .route("/api/v1/mooncake/wire", get(mooncake_wire))
        .route("/get_all_segments", get(all_segments))
        .merge(objects)
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                Json(serde_json::json!({"error": "not found"})),
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            leader_only,
        ))
        .with_state(shared)
}

/// A snapshot at most this often: each is a batch of every page to every subscriber.
const SNAPSHOT_EVERY: Duration = Duration::from_secs(1);

/// `POST /api/v1/kv_events/snapshot`: the pool's whole state goes out on its KV event stream
/// (`PoolEvents::snapshot`), for a router that follows it and has just started. Block hashes
/// only, as the stream itself carries them.
async fn kv_events_snapshot(State(shared): State<Arc<Shared>>) -> Response {
    if shared.kv_events.is_none() {
        return (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({"error":
                "this master publishes no KV events: start it with --kv-events-config"})),
        )
            .into_response();
    }
    let now = Instant::now();
    {
        let mut last = shared.last_snapshot.lock();
        if last.is_some_and(|t| now.duration_since(t) < SNAPSHOT_EVERY) {
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, "1")],
                Json(serde_json::json!({"error": "a snapshot went out less than 1 s ago"})),
            )
                .into_response();
        }
        *last = Some(now);
    }
    let pages = shared.state.lock().pool_events.snapshot();
    shared.service.housekeeper.poke();
    tracing::info!(pages, "KV event snapshot of the pool queued");
    Json(serde_json::json!({"pages": pages})).into_response()
}

/// With the cluster secret set, a request must carry it as `Authorization: Bearer`.
async fn require_secret(
    State(shared): State<Arc<Shared>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(secret) = &shared.secret {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if !secret.bearer_ok(given) {
            return (
                StatusCode::UNAUTHORIZED,
                Json(serde_json::json!({"error":
                    "this route names keys and clients: send Authorization: Bearer <the cluster secret>"})),
            )
                .into_response();
        }
    }
    next.run(req).await
}

/// Alive is 200 whatever the role; `role` tells the leader (or the only master, `single`)
/// from a standby, and a standby names the leader.
async fn health(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let l = &shared.leadership;
    let role = l.role(Instant::now());
    let leader = l.hint();
    Json(serde_json::json!({
        "status": "ok",
        "role": role.name(),
        "service_ready": role != Role::Standby,
        "epoch": if role == Role::Standby { leader.as_ref().map_or(0, |h| h.epoch) } else { l.epoch() },
        "leader": leader.as_ref().map(|h| &h.rpc),
        "ha_error": shared.election.last_error.lock().clone(),
        "uptime_seconds": shared.started.elapsed().as_secs(),
    }))
}

/// 200 while this master serves (it leads, or is the only one), 503 on a standby: a
/// readiness probe, so that a Kubernetes Service in front of the masters goes to the leader
/// (what Mooncake's clients, which read no etcd, are given).
async fn ready(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let role = shared.leadership.role(Instant::now());
    let code = match role {
        Role::Standby => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::OK,
    };
    (code, Json(serde_json::json!({"role": role.name()})))
}

#[derive(Deserialize)]
struct PageQuery {
    part: Option<String>,
}

/// The status page (`super::ui`), from one look at the state.
async fn status_page(State(shared): State<Arc<Shared>>, Query(q): Query<PageQuery>) -> Response {
    use super::ui;
    let now = Instant::now();
    let l = &shared.leadership;
    let role = l.role(now);
    let hint = l.hint();
    let role = ui::RoleView {
        role: role.name(),
        epoch: if role == Role::Standby {
            hint.as_ref().map_or(0, |h| h.epoch)
        } else {
            l.epoch()
        },
        leader_admin: hint.filter(|_| role == Role::Standby).map(|h| h.admin),
        ha_error: shared.election.last_error.lock().clone(),
    };
    let (summary, counters, high_watermark, mut segments) = {
        let st = shared.state.lock();
        let segments: Vec<ui::SegmentRow> = st
            .segments()
            .map(|s| ui::SegmentRow {
                name: s.info.name.clone(),
                tier: s.info.tier.name(),
                endpoint: s.info.endpoint.clone(),
                state: s.state.name(),
                used_bytes: s.alloc.used(),
                capacity_bytes: s.alloc.capacity(),
            })
            .collect();
        (
            st.summary(now),
            st.counters.clone(),
            st.config().eviction_high_watermark_ratio,
            segments,
        )
    };
    segments.sort_by(|a, b| a.name.cmp(&b.name));
    let (last_10s, last_60s, history) = {
        let h = shared.history.lock();
        (
            h.rates(Duration::from_secs(10)),
            h.rates(Duration::from_secs(60)),
            h.series(),
        )
    };
    let view = ui::View {
        role,
        uptime: shared.started.elapsed(),
        summary,
        counters,
        high_watermark,
        segments,
        last_10s,
        last_60s,
        history,
    };
    let part = crate::report::live::Part::from_query(q.part.as_deref());
    let mut resp = ui::render(&view, part).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    resp
}

async fn summary_text(State(shared): State<Arc<Shared>>) -> String {
    super::summary_line(&shared.state.lock(), Instant::now())
}

async fn status(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let st = shared.state.lock();
    let now = Instant::now();
    Json(serde_json::json!({
        "summary": st.summary(now),
        "counters": st.counters,
        "eviction_high_watermark_ratio": st.config().eviction_high_watermark_ratio,
        "eviction_ratio": st.config().eviction_ratio,
        "disk_eviction_high_watermark_ratio": st.config().disk_eviction_high_watermark_ratio,
        "promotion_on_hit": st.config().promotion_on_hit,
        "promotion_admission_threshold": st.config().promotion_admission_threshold,
    }))
}

/// Mooncake's RPCs as this master expects them (function ids, request type hashes) beside
/// what Mooncake's clients sent: `rbgctl mooncake wire` reads it. 404 when the master does not
/// serve Mooncake's RPC (it has a cluster secret).
async fn mooncake_wire(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    match &shared.service.mooncake {
        Some(m) => (StatusCode::OK, Json(serde_json::json!(m.wire_report()))),
        None => (
            StatusCode::NOT_FOUND,
            Json(
                serde_json::json!({"error": "this master does not serve Mooncake's RPC (it has \
                a cluster secret)"}),
            ),
        ),
    }
}

#[derive(Deserialize)]
struct DrainQuery {
    /// Seconds the hand-over may take (default 600).
    deadline_s: Option<u64>,
}

/// Starts handing segment `name` over to the others (`state/handover.rs`); answers where it
/// stands (202 while it runs). Asked again, the same drain.
async fn drain(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path(name): axum::extract::Path<String>,
    Query(q): Query<DrainQuery>,
) -> Response {
    let deadline = Duration::from_secs(q.deadline_s.unwrap_or(600).max(1));
    let res = shared
        .state
        .lock()
        .start_drain(&name, deadline, true, Instant::now());
    shared.service.copier.wake();
    match res {
        Ok(s) => (StatusCode::ACCEPTED, Json(s)).into_response(),
        Err((_, msg)) => (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({"error": msg})),
        )
            .into_response(),
    }
}

async fn drain_status(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Response {
    let now = Instant::now();
    let found = shared
        .state
        .lock()
        .drains(now)
        .into_iter()
        .find(|d| d.segment == name);
    match found {
        Some(s) => Json(s).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({"error": format!("no hand-over of segment {name:?}")})),
        )
            .into_response(),
    }
}

async fn drains(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    Json(shared.state.lock().drains(Instant::now()))
}

async fn segments(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let st = shared.state.lock();
    let mut list: Vec<serde_json::Value> = st
        .segments()
        .map(|s| {
            serde_json::json!({
                "id": s.id,
                "name": s.info.name,
                "endpoint": s.info.endpoint,
                "tier": s.info.tier.name(),
                "client_id": s.client_id,
                "capacity_bytes": s.alloc.capacity(),
                "used_bytes": s.alloc.used(),
                "free_bytes": s.alloc.free(),
                "largest_free_bytes": s.alloc.largest_free(),
                "fragmentation": s.alloc.fragmentation(),
                "shm_path": s.info.shm_path,
                "host_id": s.info.host_id,
                "state": s.state.name(),
                "persistent": s.info.persistent,
            })
        })
        .collect();
    list.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    Json(serde_json::json!({ "segments": list }))
}

fn object_json(st: &MasterState, key: &str, now: Instant) -> Option<serde_json::Value> {
    let e = st.lookup(key)?;
    let replica_json = |r: &crate::transfer::message::ReplicaLoc| {
        let seg = st.segment(r.segment_id);
        serde_json::json!({
            "segment_id": r.segment_id,
            "segment": seg.map(|s| s.info.name.clone()),
            "tier": seg.map(|s| s.info.tier.name()),
            "offset": r.offset,
        })
    };
    let current = e.current.as_ref().map(|v| {
        serde_json::json!({
            "object_id": v.object_id,
            "size": v.size,
            "checksum": v.checksum,
            "replicas": v.replicas.iter().map(replica_json).collect::<Vec<_>>(),
            "lease_ms_left": v.lease_until.saturating_duration_since(now).as_millis() as u64,
            "soft_pin_ms_left": v.soft_pin_until.map(|t| t.saturating_duration_since(now).as_millis() as u64),
            "idle_ms": now.saturating_duration_since(v.last_access).as_millis() as u64,
            "tier": if st.on_disk_only(key) { "disk" } else { "memory" },
            "moving": st.moving(v.object_id),
            "disk_hits": v.disk_hits,
        })
    });
    let pending = e.pending.as_ref().map(|p| {
        serde_json::json!({
            "object_id": p.object_id,
            "client_id": p.client_id,
            "size": p.size,
            "age_ms": now.saturating_duration_since(p.started).as_millis() as u64,
        })
    });
    Some(serde_json::json!({ "key": key, "current": current, "pending": pending }))
}

async fn object(State(shared): State<Arc<Shared>>, Query(q): Query<KeyQuery>) -> Response {
    let Some(key) = q.key else {
        return (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": "missing key parameter"})),
        )
            .into_response();
    };
    let held = match held_key(q.tenant.as_deref(), &key) {
        Ok(k) => k,
        Err(why) => return bad_request(why),
    };
    let st = shared.state.lock();
    match object_json(&st, &held, Instant::now()) {
        Some(v) => Json(v).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({"error": "OBJECT_NOT_FOUND", "key": key})),
        )
            .into_response(),
    }
}

#[derive(Deserialize)]
struct KeysQuery {
    #[serde(default)]
    prefix: String,
    limit: Option<usize>,
    tenant: Option<String>,
}

/// Most keys one `/api/v1/keys` answer lists.
const MAX_KEYS_LISTED: usize = 10_000;

/// `/api/v1/keys?prefix=P&limit=N&tenant=T`: tenant T's (default `default`) readable keys
/// starting with P (default all), at most N (default 100, at most 10,000), sorted;
/// `truncated` says whether more match.
async fn keys(State(shared): State<Arc<Shared>>, Query(q): Query<KeysQuery>) -> Response {
    let limit = q.limit.unwrap_or(100);
    if limit > MAX_KEYS_LISTED {
        return (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": format!("limit {limit} is over {MAX_KEYS_LISTED}")})),
        )
            .into_response();
    }
    let tenant = match tenant_param(q.tenant.as_deref()) {
        Ok(t) => t,
        Err(why) => return bad_request(why),
    };
    let (keys, truncated) = shared
        .state
        .lock()
        .keys_with_prefix(tenant, &q.prefix, limit);
    Json(serde_json::json!({
        "tenant": tenant, "prefix": q.prefix, "keys": keys, "truncated": truncated,
    }))
    .into_response()
}

#[derive(Deserialize)]
struct EvictionsQuery {
    #[serde(default)]
    after: u64,
    limit: Option<usize>,
    tenant: Option<String>,
}

/// `/api/v1/evictions?after=SEQ&limit=N&tenant=T`: the evictions numbered above SEQ (default
/// 0), at most N (default and at most 10,000) looked at, oldest first, those of tenant T's
/// objects (default `default`) each with its key, wall-clock time
/// (`at_us`) and tier; `next` is the `after` to ask with next, `missed` how many entries
/// above SEQ the bounded log no longer holds, `started_us` when this master process began the
/// log (numbering starts again at 1 in a new process).
async fn evictions(State(shared): State<Arc<Shared>>, Query(q): Query<EvictionsQuery>) -> Response {
    let limit = q.limit.unwrap_or(MAX_KEYS_LISTED);
    if limit > MAX_KEYS_LISTED {
        return (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": format!("limit {limit} is over {MAX_KEYS_LISTED}")})),
        )
            .into_response();
    }
    let tenant = match tenant_param(q.tenant.as_deref()) {
        Ok(t) => t,
        Err(why) => return bad_request(why),
    };
    let (entries, missed, next, started_us) = {
        let st = shared.state.lock();
        let log = &st.evictions;
        let (entries, missed) = log.since(q.after, limit);
        let next = entries
            .last()
            .map_or(q.after.min(log.next_seq() - 1), |e| e.seq);
        (entries, missed, next, log.started_us())
    };
    let entries: Vec<_> = entries
        .iter()
        .filter_map(|e| {
            let key = tenants::owned_by(&e.key, tenant)?;
            Some(serde_json::json!({"seq": e.seq, "key": key, "at_us": e.at_us, "tier": e.tier.name()}))
        })
        .collect();
    Json(serde_json::json!({
        "entries": entries, "next": next, "missed": missed, "started_us": started_us,
    }))
    .into_response()
}

/// `/api/v1/tenants`: every tenant served or holding bytes, with its bytes held, its quota
/// as asked and in force, and the puts its quota refused.
async fn tenants_usage(State(shared): State<Arc<Shared>>) -> Response {
    let tenants = shared.state.lock().tenant_usage();
    Json(serde_json::json!({ "tenants": tenants })).into_response()
}

/// Mooncake's `/query_key?key=`: the same 404 body as its admin server.
async fn query_key(State(shared): State<Arc<Shared>>, Query(q): Query<KeyQuery>) -> Response {
    let key = q.key.unwrap_or_default();
    let held = match held_key(q.tenant.as_deref(), &key) {
        Ok(k) => k,
        Err(why) => return bad_request(why),
    };
    let st = shared.state.lock();
    match object_json(&st, &held, Instant::now()) {
        Some(v) if !v["current"].is_null() => Json(serde_json::json!({"success": true, "object": v})).into_response(),
        _ => (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({"success": false, "error_code": -704, "error_message": "OBJECT_NOT_FOUND"})),
        )
            .into_response(),
    }
}

async fn all_segments(State(shared): State<Arc<Shared>>) -> String {
    let st = shared.state.lock();
    let mut names: Vec<String> = st.segments().map(|s| s.info.name.clone()).collect();
    names.sort();
    names.join("\n")
}

/// Each tenant's bytes, quota and refused puts (at most `tenants::MAX_TENANTS` registered,
/// and those no longer registered that still hold objects).
fn render_tenants(tenants: &[super::state::TenantUsage], p: &mut PromText) {
    const USED: Family = Family::gauge(
        "rbgctl_master_tenant_used_bytes",
        "Bytes of values a tenant holds, puts in progress included.",
    );
    const QUOTA: Family = Family::gauge(
        "rbgctl_master_tenant_quota_bytes",
        "A tenant's quota in force: as its tenants file asks, scaled down in proportion when \
         the quotas add up to more than the pool holds.",
    );
    const REFUSED: Family = Family::counter(
        "rbgctl_master_tenant_quota_refusals_total",
        "Puts refused at their tenant's quota.",
    );
    p.family(&USED);
    for t in tenants {
        p.sample(&USED, &[("tenant", &t.name)], t.used_bytes as f64);
    }
    p.family(&QUOTA);
    for t in tenants {
        if let Some(q) = t.quota_in_force_bytes {
            p.sample(&QUOTA, &[("tenant", &t.name)], q as f64);
        }
    }
    p.family(&REFUSED);
    for t in tenants {
        p.sample(&REFUSED, &[("tenant", &t.name)], t.refused_puts as f64);
    }
}

/// Memory vs disk: objects, bytes, and the copies between the tiers.
fn render_tiers(
    shared: &Shared,
    summary: &super::state::Summary,
    counters: &super::state::Counters,
    p: &mut PromText,
) {
    let tiered = |p: &mut PromText, name: &str, help: &str, memory: u64, disk: u64| {
        let family = Family::gauge(name, help);
        p.sample(&family, &[("tier", "memory")], memory as f64)
            .sample(&family, &[("tier", "disk")], disk as f64);
    };
    tiered(
        p,
        "rbgctl_master_tier_keys",
        "Readable objects by the tier they live in (memory, or only the disk tier).",
        summary.keys.saturating_sub(summary.disk_keys),
        summary.disk_keys,
    );
    tiered(
        p,
        "rbgctl_master_tier_used_bytes",
        "Bytes allocated by tier.",
        summary.used_bytes,
        summary.disk_used_bytes,
    );
    tiered(
        p,
        "rbgctl_master_tier_capacity_bytes",
        "Bytes contributed by tier.",
        summary.capacity_bytes,
        summary.disk_capacity_bytes,
    );
    let mover = &shared.mover;
    let copier = &shared.service.copier;
    p.single(&DEMOTIONS_TOTAL, counters.demoted_objects as f64)
        .single(&DEMOTED_BYTES_TOTAL, counters.demoted_bytes as f64)
        .single(&PROMOTIONS_TOTAL, counters.promoted_objects as f64)
        .single(&PROMOTED_BYTES_TOTAL, counters.promoted_bytes as f64)
        .single(&DISK_HITS_TOTAL, counters.disk_hits as f64)
        .single(&TIER_MOVES_IN_FLIGHT, summary.moves_in_flight as f64)
        .single(&DEMOTING_BYTES, summary.demoting_bytes as f64)
        .single(&TIER_MOVE_FAILURES_TOTAL, counters.move_failures as f64)
        .single(
            &TIER_MOVES_SENT_TOTAL,
            mover.sent.load(std::sync::atomic::Ordering::Relaxed) as f64,
        )
        .single(
            &HAND_OVER_OBJECTS_TOTAL,
            copier.copied.load(std::sync::atomic::Ordering::Relaxed) as f64,
        )
        .single(
            &HAND_OVER_BYTES_TOTAL,
            copier.bytes.load(std::sync::atomic::Ordering::Relaxed) as f64,
        )
        .single(
            &HAND_OVER_FAILURES_TOTAL,
            copier.failed.load(std::sync::atomic::Ordering::Relaxed) as f64,
        )
        .single(
            &DISK_EVICTED_OBJECTS_TOTAL,
            counters.disk_evicted_objects as f64,
        )
        .single(
            &DISK_EVICTED_BYTES_TOTAL,
            counters.disk_evicted_bytes as f64,
        )
        .single(&DISK_FULL_DROPS_TOTAL, counters.disk_full_drops as f64);
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let now = Instant::now();
    let (summary, counters, pool, tenants) = {
        let st = shared.state.lock();
        let pool = (st.pool_events.pages(), st.pool_events.dropped);
        (
            st.summary(now),
            st.counters.clone(),
            pool,
            st.tenant_usage(),
        )
    };
    let mut p = PromText::new();
    render_ha(&shared, now, &mut p);
    render_tenants(&tenants, &mut p);
    if let Some(stats) = &shared.kv_events {
        stats.render("rbgctl_master", &mut p);
        p.single(&KV_EVENT_PAGES, pool.0 as f64)
            .single(&KV_EVENTS_DROPPED_TOTAL, pool.1 as f64);
    }
    render_tiers(&shared, &summary, &counters, &mut p);
    p.single(&USED_BYTES, summary.used_bytes as f64)
        .single(&CAPACITY_BYTES, summary.capacity_bytes as f64)
        .single(&KEYS, summary.keys as f64)
        .single(&SOFT_PINNED_KEYS, summary.soft_pinned_keys as f64)
        .single(&PENDING_PUTS, summary.pending_puts as f64)
        .single(&PUT_RESERVATIONS, summary.reservations as f64)
        .single(&CLIENTS, summary.clients as f64)
        .single(&BOUND_CLIENTS, summary.bound_clients as f64)
        .single(&SEGMENTS, summary.segments as f64)
        .single(&AWAY_SEGMENTS, summary.away_segments as f64)
        .single(&RECOVERING_SEGMENTS, summary.recovering_segments as f64)
        .single(&RECOVERED_OBJECTS_TOTAL, counters.recovered_objects as f64)
        .single(&LOST_OBJECTS_TOTAL, counters.lost_objects as f64)
        .single(&REJECTED_RECORDS_TOTAL, counters.rejected_records as f64)
        .single(&CORRUPT_REPLICAS_TOTAL, counters.corrupt_replicas as f64)
        .single(&HASHED_LATER_TOTAL, counters.hashed_later as f64)
        .single(&HASH_MISMATCHES_TOTAL, counters.hash_mismatches as f64)
        .single(&SEGMENTS_GIVEN_UP_TOTAL, counters.segments_given_up as f64)
        .single(&DEFERRED_BYTES, summary.deferred_bytes as f64)
        .single(&EVICTED_OBJECTS_TOTAL, counters.evicted_objects as f64)
        .single(&EVICTED_BYTES_TOTAL, counters.evicted_bytes as f64)
        .single(&EVICTION_RUNS_TOTAL, counters.eviction_runs as f64)
        .single(&EXPIRED_CLIENTS_TOTAL, counters.expired_clients as f64)
        .single(&DROPPED_OBJECTS_TOTAL, counters.dropped_objects as f64)
        .single(&RECLAIMED_PUTS_TOTAL, counters.reclaimed_puts as f64)
        .single(&RESERVED_PUTS_TOTAL, counters.reserved_puts as f64)
        .single(
            &EXPIRED_RESERVATIONS_TOTAL,
            counters.expired_reservations as f64,
        )
        .single(&ALLOC_FAILURES_TOTAL, counters.alloc_failures as f64)
        .single(
            &PARTIAL_ALLOCATIONS_TOTAL,
            counters.partial_allocations as f64,
        );
    shared.state.render(&mut p);
    shared.service.connections.render(&mut p, "rbgctl_master");
    if let Some(mooncake) = &shared.service.mooncake {
        mooncake.render(&mut p);
    }
    shared.service.stats.render(&mut p, "rbgctl_master", |op| {
        Opcode::from_u8(op).map(|o| o.name())
    });
    let mut resp = p.finish().into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    resp
}

fn render_ha(shared: &Shared, now: Instant, p: &mut PromText) {
    use std::sync::atomic::Ordering::Relaxed;
    let l = &shared.leadership;
    let role = l.role(now);
    let e = &shared.election;
    p.family(&HA_ROLE);
    for r in [Role::Single, Role::Leader, Role::Standby] {
        p.sample(&HA_ROLE, &[("role", r.name())], (r == role) as u8 as f64);
    }
    p.single(&HA_EPOCH, l.epoch() as f64)
        .single(
            &HA_ELECTIONS_WON_TOTAL,
            e.elections_won.load(Relaxed) as f64,
        )
        .single(
            &HA_LEADERSHIP_LOST_TOTAL,
            e.leadership_lost.load(Relaxed) as f64,
        )
        .single(
            &HA_BACKEND_ERRORS_TOTAL,
            e.backend_errors.load(Relaxed) as f64,
        )
        .single(
            &HA_LAST_TAKEOVER_SECONDS,
            e.last_takeover_ms.load(Relaxed) as f64 / 1000.0,
        );
}
