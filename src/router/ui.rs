//! The router's status page (`/ui`): its policy, and each worker's health, circuit state, load
//! and requests served, as a table with load bars and a chart, in the frame of `report::live`
//! (server-rendered, refreshed by an inline script when scripts are on).

use crate::report::live::{self, Part};
use crate::report::{escape, BarChart, Format, Group, Panel};
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
}

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
        };
        let html = render(&v, Part::Whole);
        assert!(html.contains("cache_aware"));
        assert!(html.contains("http://b&lt;2&gt;"), "escaped");
        assert!(html.contains("class=\"bad\">unhealthy") && html.contains("class=\"bad\">open"));
        assert!(html.contains("width:25%"), "load 1 of the most, 4");
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
        };
        assert!(render(&empty, Part::Main).contains("No workers"));
    }
}
