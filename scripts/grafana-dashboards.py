#!/usr/bin/env python3
"""Writes manifests/grafana/*.json: Grafana dashboards for the pool (master and stores), the
router and the engines, from the metric names the roles export. Run it after changing a panel;
tests/it/pictures.rs checks that every metric a dashboard queries is exported by a running role.

    python3 scripts/grafana-dashboards.py
"""

import json
import pathlib

OUT = pathlib.Path(__file__).resolve().parent.parent / "manifests" / "grafana"


def panel(title, targets, unit="short", kind="timeseries", description="", stack=False):
    """One panel; targets are (expr, legend) pairs."""
    p = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
    }
    if kind == "timeseries":
        p["fieldConfig"]["defaults"]["custom"] = {
            "fillOpacity": 10,
            "stacking": {"mode": "normal" if stack else "none"},
        }
        p["options"] = {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]}}
    if kind == "stat":
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "graphMode": "area"}
    if kind == "gauge":
        p["fieldConfig"]["defaults"].update({"min": 0, "max": 1})
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}}
    return p


def row(title):
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def dashboard(uid, title, description, rows):
    """Lays the rows' panels out on Grafana's 24-column grid, two or three to a line."""
    panels, y, next_id = [], 0, 1
    for title_, items in rows:
        r = row(title_)
        r.update({"id": next_id, "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        panels.append(r)
        next_id += 1
        y += 1
        per_line = 3 if len(items) % 3 == 0 else 2
        w = 24 // per_line
        for i, p in enumerate(items):
            p["id"] = next_id
            next_id += 1
            p["gridPos"] = {"h": 8, "w": w, "x": (i % per_line) * w, "y": y + (i // per_line) * 8}
            panels.append(p)
        y += ((len(items) + per_line - 1) // per_line) * 8
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["rbgctl"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "timezone": "",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                }
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def rate(metric, by="", window="1m"):
    inner = f"rate({metric}[{window}])"
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def quantile(q, metric, by=""):
    keys = f"{by}, le" if by else "le"
    return f"histogram_quantile({q}, sum by ({keys}) (rate({metric}_bucket[5m])))"


pool = dashboard(
    "rbgctl-pool",
    "rbgctl: KV-cache pool",
    "The master and its stores: capacity and use per tier, objects, traffic, eviction, moves "
    "between memory and disk, restarts and high availability.",
    [
        ("Capacity", [
            panel("Memory use", [("rbgctl_master_used_bytes / rbgctl_master_capacity_bytes", "memory")],
                  unit="percentunit", kind="gauge",
                  description="Allocated over contributed memory; eviction starts at the high watermark."),
            panel("Bytes by tier", [
                ("rbgctl_master_tier_used_bytes", "used {{tier}}"),
                ("rbgctl_master_tier_capacity_bytes", "capacity {{tier}}"),
            ], unit="bytes"),
            panel("Objects by tier", [("rbgctl_master_tier_keys", "{{tier}}")], stack=True,
                  description="Readable objects by where they live: memory, or only a disk tier."),
            panel("Segments and clients", [
                ("rbgctl_master_segments", "segments"),
                ("rbgctl_master_away_segments", "away"),
                ("rbgctl_master_recovering_segments", "recovering"),
                ("rbgctl_master_clients", "clients"),
            ]),
            panel("Store memory", [
                ("rbgctl_store_used_bytes", "used {{instance}}"),
                ("rbgctl_store_segment_bytes", "segment {{instance}}"),
            ], unit="bytes"),
            panel("Puts in progress and reservations", [
                ("rbgctl_master_pending_puts", "pending puts"),
                ("rbgctl_master_put_reservations", "reservations"),
                ("rbgctl_master_soft_pinned_keys", "soft-pinned"),
            ]),
        ]),
        ("Traffic", [
            panel("Master requests/s by operation", [(rate("rbgctl_master_requests_total", "op"), "{{op}}")],
                  unit="reqps", stack=True),
            panel("Master p99 latency by operation",
                  [(quantile(0.99, "rbgctl_master_request_duration_seconds", "op"), "{{op}}")], unit="s"),
            panel("Master failures/s by operation", [(rate("rbgctl_master_failures_total", "op"), "{{op}}")],
                  unit="reqps"),
            panel("Store bytes/s", [
                (rate("rbgctl_store_written_bytes_total", "instance"), "written {{instance}}"),
                (rate("rbgctl_store_read_bytes_total", "instance"), "read {{instance}}"),
            ], unit="Bps"),
            panel("Store requests/s by operation", [(rate("rbgctl_store_requests_total", "op"), "{{op}}")],
                  unit="reqps", stack=True),
            panel("Store p99 latency by operation",
                  [(quantile(0.99, "rbgctl_store_request_duration_seconds", "op"), "{{op}}")], unit="s"),
        ]),
        ("Eviction and tiers", [
            panel("Evictions/s", [
                (rate("rbgctl_master_evicted_objects_total"), "objects"),
                (rate("rbgctl_master_disk_evicted_objects_total"), "objects (disk tier)"),
            ], unit="ops"),
            panel("Evicted bytes/s", [
                (rate("rbgctl_master_evicted_bytes_total"), "memory"),
                (rate("rbgctl_master_disk_evicted_bytes_total"), "disk tier"),
            ], unit="Bps"),
            panel("Moves between tiers", [
                (rate("rbgctl_master_demotions_total"), "demotions/s"),
                (rate("rbgctl_master_promotions_total"), "promotions/s"),
                (rate("rbgctl_master_disk_hits_total"), "reads from disk/s"),
                ("rbgctl_master_tier_moves_in_flight", "in flight"),
            ]),
            panel("Disk tier reads", [
                (rate("rbgctl_store_disk_read_bytes_total", "instance"), "{{instance}}"),
            ], unit="Bps"),
        ]),
        ("Health", [
            panel("Master role", [("rbgctl_master_ha_role == 1", "{{role}} {{instance}}"),
                                  ("rbgctl_master_ha_epoch", "epoch {{instance}}")],
                  description="single (no HA), leader or standby; the epoch grows with each election."),
            panel("Objects recovered and lost", [
                ("increase(rbgctl_master_recovered_objects_total[5m])", "recovered"),
                ("increase(rbgctl_master_lost_objects_total[5m])", "lost"),
                ("increase(rbgctl_master_corrupt_replicas_total[5m])", "corrupt replicas"),
            ]),
            panel("Connections refused or closed idle", [
                (rate("rbgctl_master_refused_connections_total"), "master refused"),
                (rate("rbgctl_master_idle_closed_connections_total"), "master idle closed"),
                (rate("rbgctl_store_refused_connections_total"), "store refused"),
                (rate("rbgctl_store_unauthenticated_connections_total"), "store unauthenticated"),
            ]),
            panel("Master state lock", [
                (rate("rbgctl_master_state_lock_wait_seconds_total"), "waiting (s/s)"),
                (rate("rbgctl_master_state_lock_held_seconds_total"), "held (s/s)"),
            ], unit="percentunit"),
        ]),
    ],
)

router = dashboard(
    "rbgctl-router",
    "rbgctl: router",
    "The gateway (SMG-compatible metrics): traffic, latency, errors, and each worker's health, "
    "circuit breaker and load.",
    [
        ("Traffic", [
            panel("Requests/s by endpoint", [(rate("smg_router_requests_total", "endpoint"), "{{endpoint}}")],
                  unit="reqps", stack=True),
            panel("Latency by endpoint", [
                (quantile(0.5, "smg_router_request_duration_seconds", "endpoint"), "p50 {{endpoint}}"),
                (quantile(0.99, "smg_router_request_duration_seconds", "endpoint"), "p99 {{endpoint}}"),
            ], unit="s"),
            panel("Responses by status", [(rate("smg_http_responses_total", "status_code"), "{{status_code}}")],
                  unit="reqps", stack=True),
            panel("Running and queued", [
                ("rbgctl_router_running_requests", "running"),
                ("rbgctl_router_queued_requests", "queued"),
            ]),
            panel("Retries and rate limiting", [
                (rate("smg_worker_retries_total"), "retries/s"),
                (rate("smg_worker_retries_exhausted_total"), "retries exhausted/s"),
                (rate("smg_http_rate_limit_total", "decision"), "{{decision}}"),
            ]),
            panel("Stream errors and PD dispatches", [
                (rate("rbgctl_router_stream_errors_total"), "stream errors/s"),
                (rate("rbgctl_router_pd_dispatches_total"), "PD dispatches/s"),
            ]),
        ]),
        ("Workers", [
            panel("Healthy workers", [("sum(smg_worker_health)", "healthy"), ("smg_worker_pool_size", "pool")],
                  kind="stat"),
            panel("Health by worker", [("smg_worker_health", "{{worker}}")],
                  description="1 healthy, 0 not."),
            panel("Circuit state by worker", [("smg_worker_cb_state", "{{worker}}")],
                  description="0 closed, 1 open, 2 half-open."),
            panel("Requests in flight by worker", [("smg_worker_requests_active", "{{worker}}")], stack=True),
            panel("Requests/s by worker", [(rate("smg_worker_requests_total", "worker"), "{{worker}}")],
                  unit="reqps", stack=True),
            panel("Worker errors/s", [(rate("smg_worker_errors_total", "worker"), "{{worker}}")], unit="reqps"),
        ]),
    ],
)

engines = dashboard(
    "rbgctl-engines",
    "rbgctl: engines",
    "Inference engines by SGLang's metric names (sglang:*): SGLang itself and the rbgctl "
    "SIMULATED engine export them. The last row is the SIMULATED engine's own (rbgctl_sim_*).",
    [
        ("Throughput and cache", [
            panel("Tokens/s", [
                (rate("sglang:prompt_tokens_total", "instance"), "prompt {{instance}}"),
                (rate("sglang:generation_tokens_total", "instance"), "generated {{instance}}"),
            ]),
            panel("Prefix cache hit rate", [
                ("sum(rate(sglang:cached_tokens_total[1m])) / sum(rate(sglang:prompt_tokens_total[1m]))", "last minute"),
                ("sglang:cache_hit_rate", "since start {{instance}}"),
            ], unit="percentunit"),
            panel("Running and queued requests", [
                ("sglang:num_running_reqs", "running {{instance}}"),
                ("sglang:num_queue_reqs", "queued {{instance}}"),
            ]),
        ]),
        ("Latency", [
            panel("Time to first token", [
                (quantile(0.5, "sglang:time_to_first_token_seconds"), "p50"),
                (quantile(0.9, "sglang:time_to_first_token_seconds"), "p90"),
                (quantile(0.99, "sglang:time_to_first_token_seconds"), "p99"),
            ], unit="s"),
            panel("End-to-end latency", [
                (quantile(0.5, "sglang:e2e_request_latency_seconds"), "p50"),
                (quantile(0.99, "sglang:e2e_request_latency_seconds"), "p99"),
            ], unit="s"),
        ]),
        ("SIMULATED engine: KV tiers and the pool as L3", [
            panel("Cached tokens/s by tier", [(rate("rbgctl_sim_cached_tokens_total", "tier"), "{{tier}}")],
                  stack=True, description="device (L1), host (L2), storage (L3: the rbgctl pool)."),
            panel("Pool traffic", [(rate("rbgctl_sim_l3_bytes_total", "op"), "{{op}}")], unit="Bps"),
            panel("Pool errors and skipped backups", [
                (rate("rbgctl_sim_l3_errors_total", "op"), "errors {{op}}"),
                (rate("rbgctl_sim_l3_backups_skipped_total"), "backups skipped"),
            ]),
        ]),
    ],
)

OUT.mkdir(parents=True, exist_ok=True)
for name, d in [("pool", pool), ("router", router), ("engines", engines)]:
    (OUT / f"{name}.json").write_text(json.dumps(d, indent=2) + "\n")
    print(OUT / f"{name}.json")
