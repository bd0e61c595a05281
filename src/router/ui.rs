//! The router's status page (`/ui`): its policy, and each worker's health, circuit state, load
//! and requests served, as a table with load bars and a chart; with tenants, each priority
//! class's queue and each tenant's requests by outcome; in the frame of `report::live`
//! (server-rendered, refreshed by an inline script when scripts are on).

use crate::report::live::{self, Part};
use crate::report::{escape, BarChart, Format, Group, Panel};
use crate::router::tenants::admission::{ClassRow, TenantRow};
use std::fmt::Write as _;

/// One worker's row.
#[derive(Clone, Debug)]
pub struct WorkerRow {
    pub url: String,
    pub worker_type: &'static str,
    pub healthy: bool,
    pub circuit: &'static str,
    /// Requests in flight.
    pub load: usize,
    pub processed: u64,
    pub model: Option<String>,
}

/// What the page shows.
pub struct View {
    /// The policy, or `prefill: X, decode: Y` with PD.
    pub policy: String,
    pub pd: bool,
    pub workers: Vec<WorkerRow>,
    /// With tenants: the classes in the order they are served, and the tenants seen.
    pub tenants: Option<(Vec<ClassRow>, Vec<TenantRow>)>,
}

/// Tenants shown by name on the page (those with the most requests); the rest are counted.
const PAGE_TENANTS: usize = 50;

fn tenants(h: &mut String, classes: &[ClassRow], tenants: &[TenantRow]) {
    let _ = write!(h, "<h2>Priority classes ({})</h2>", classes.len());
    h.push_str(
        "<table id=\"classes\"><thead><tr><th>class</th><th>running</th><th>waiting</th><th></th>\
         <th>queue size</th><th>TTL</th><th>served after waiting</th><th>expired (503)</th>\
         <th>queue full (503)</th></tr></thead><tbody>",
    );
    for c in classes {
        let share = c.queued as f64 / c.queue_size.max(1) as f64 * 100.0;
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td><span class=\"bar\"><span style=\"width:{share:.0}%\"></span></span></td>\
             <td class=\"n\">{}</td><td class=\"n\">{:.1} s</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            escape(&c.name),
            match c.max_running {
                Some(m) => format!("{} of {m}", c.running),
                None => c.running.to_string(),
            },
            c.queued,
            c.queue_size,
            c.ttl.as_secs_f64(),
            c.granted,
            c.expired,
            c.refused_full,
        );
    }
    h.push_str("</tbody></table>");
    let mut rows: Vec<&TenantRow> = tenants.iter().collect();
    rows.sort_by_key(|t| {
        std::cmp::Reverse(t.counts.admitted + t.counts.refused_rate + t.counts.refused_concurrency)
    });
    let _ = write!(h, "<h2>Tenants ({} seen)</h2>", tenants.len());
    h.push_str(
        "<table id=\"tenants\"><thead><tr><th>tenant</th><th>running</th><th>waiting</th>\
         <th>admitted</th><th>over rate (429)</th><th>over concurrency (429)</th>\
         <th>queue full (503)</th><th>expired (503)</th><th>prompt tokens</th><th>output tokens</th>\
         </tr></thead><tbody>",
    );
    for t in rows.iter().take(PAGE_TENANTS) {
        let c = &t.counts;
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            escape(&t.name),
            t.running,
            t.queued,
            c.admitted,
            c.refused_rate,
            c.refused_concurrency,
            c.refused_queue_full,
            c.expired,
            c.prompt_tokens,
            c.output_tokens,
        );
    }
    h.push_str("</tbody></table>");
    if rows.len() > PAGE_TENANTS {
        let _ = write!(
            h,
            "<p>{} more tenants: /metrics has the first {} of the tenants file by name.</p>",
            rows.len() - PAGE_TENANTS,
            crate::router::tenants::admission::MAX_TENANT_SERIES
        );
    }
}

/// The status page (or one part of it, for its live refresh) from `v`.
pub fn render(v: &View, part: Part) -> String {
    live::page(
        "rbgctl router",
        main(v),
        &["/metrics", "/workers", "/health"],
        part,
    )
}

fn main(v: &View) -> String {
    let mut h = String::new();
    let healthy = v.workers.iter().filter(|w| w.healthy).count();
    let _ = write!(
        h,
        "<dl class=\"facts\"><dt>policy</dt><dd id=\"policy\">{}</dd><dt>mode</dt><dd>{}</dd>\
         <dt>workers</dt><dd>{} ({} healthy)</dd><dt>in flight</dt><dd>{}</dd></dl>",
        escape(&v.policy),
        if v.pd {
            "prefill/decode disaggregation"
        } else {
            "regular"
        },
        v.workers.len(),
        healthy,
        v.workers.iter().map(|w| w.load).sum::<usize>()
    );
    if let Some((c, t)) = &v.tenants {
        tenants(&mut h, c, t);
    }
    let _ = write!(h, "<h2>Workers ({})</h2>", v.workers.len());
    if v.workers.is_empty() {
        h.push_str(
            "<p class=\"warn\">No workers: add some with POST /workers, flags or discovery.</p>",
        );
        return h;
    }
    let most = v.workers.iter().map(|w| w.load).max().unwrap_or(0).max(1);
    h.push_str(
        "<table id=\"workers\"><thead><tr><th>worker</th><th>type</th><th>health</th>\
         <th>circuit</th><th>in flight</th><th></th><th>served</th><th>model</th></tr></thead><tbody>",
    );
    for w in &v.workers {
        let share = w.load as f64 / most as f64 * 100.0;
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td class=\"{}\">{}</td>\
             <td class=\"n\">{}</td><td><span class=\"bar\"><span style=\"width:{share:.0}%\"></span></span></td>\
             <td class=\"n\">{}</td><td>{}</td></tr>",
            escape(&w.url),
            w.worker_type,
            if w.healthy { "ok" } else { "bad" },
            if w.healthy { "healthy" } else { "unhealthy" },
            if w.circuit == "closed" { "ok" } else { "bad" },
            w.circuit,
            w.load,
            w.processed,
            escape(w.model.as_deref().unwrap_or("")),
        );
    }
    h.push_str("</tbody></table>");
    let urls: Vec<String> = v.workers.iter().map(|w| w.url.clone()).collect();
    let chart = BarChart::new(
        "worker-load",
        "Workers: requests in flight and served",
        urls,
    )
    .panel(Panel::bars(
        "",
        "in flight",
        Format::Integer,
        vec![Group::new(
            "in flight",
            v.workers.iter().map(|w| Some(w.load as f64)).collect(),
        )],
    ))
    // Bars, not a line: the workers are categories, and nothing lies between two of them.
    .panel(Panel::bars(
        "",
        "served",
        Format::Integer,
        vec![Group::new(
            "served",
            v.workers.iter().map(|w| Some(w.processed as f64)).collect(),
        )],
    ));
    h.push_str(&crate::report::figure_or_error(
        "worker-load",
        chart.svg(),
        "Requests in flight now, and requests served since the router started, per worker.",
    ));
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_shows_each_workers_health_circuit_and_load() {
        let w = |url: &str, healthy, circuit, load| WorkerRow {
            url: url.into(),
            worker_type: "regular",
            healthy,
            circuit,
            load,
            processed: 7,
            model: Some("m".into()),
        };
        let v = View {
            policy: "cache_aware".into(),
            pd: false,
            workers: vec![
                w("http://a:1", true, "closed", 4),
                w("http://b<2>", false, "open", 1),
            ],
            tenants: Some((
                vec![ClassRow {
                    name: "interactive".into(),
                    running: 1,
                    max_running: Some(4),
                    queued: 3,
                    queue_size: 4,
                    ttl: std::time::Duration::from_secs(10),
                    granted: 9,
                    expired: 2,
                    refused_full: 1,
                }],
                vec![TenantRow {
                    name: "team<a>".into(),
                    running: 2,
                    queued: 3,
                    counts: Default::default(),
                }],
            )),
        };
        let html = render(&v, Part::Whole);
        assert!(html.contains("cache_aware"));
        assert!(html.contains("http://b&lt;2&gt;"), "escaped");
        assert!(html.contains("class=\"bad\">unhealthy") && html.contains("class=\"bad\">open"));
        assert!(html.contains("width:25%"), "load 1 of the most, 4");
        assert!(
            html.contains("id=\"classes\"") && html.contains("width:75%"),
            "3 of 4 waiting"
        );
        assert!(html.contains("team&lt;a&gt;"), "tenant names escaped");
        assert!(html.contains("id=\"worker-load\""));
        // Issue 40, item 26: workers are categories: bars, and no line drawn from one to another.
        let load = html
            .split("id=\"worker-load\"")
            .nth(1)
            .and_then(|rest| rest.split("</figure>").next())
            .unwrap();
        // Axis ticks are thin polylines; a data series is drawn 2 px wide.
        let series_lines = load
            .split("<polyline")
            .skip(1)
            .filter(|p| p.contains("stroke-width=\"2\""))
            .count();
        assert_eq!(series_lines, 0, "a line between workers");
        assert!(load.contains("served") && load.contains("in flight"));
        let empty = View {
            policy: "random".into(),
            pd: true,
            workers: vec![],
            tenants: None,
        };
        assert!(render(&empty, Part::Main).contains("No workers"));
    }
}
