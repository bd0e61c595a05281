//! The master's status page (`/` and `/ui` on the admin port): segments with their use as
//! bars, objects per tier, put/get/eviction rates over the last seconds with a chart of the
//! last two minutes, and the master's HA role, in the frame of `report::live` (server-rendered,
//! refreshed by an inline script when scripts are on).
//!
//! `History` (the rates) and `render` (the page from a `View`) are pure; `view` reads the
//! master's state under its lock, once per page.

use super::state::{Counters, Summary};
use crate::report::live::{self, Part};
use crate::report::{self, escape, LineChart, Series};
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Samples kept: two minutes at one a second.
pub const HISTORY_LEN: usize = 120;
/// How often the housekeeper takes a sample.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// The counters the rates come from, at one moment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub at: Instant,
    /// Put requests (single and batch calls, each counted once) and get requests.
    pub puts: u64,
    pub gets: u64,
    pub evicted_objects: u64,
}

/// Per-second rates between two samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rates {
    pub puts: f64,
    pub gets: f64,
    pub evictions: f64,
}

/// The last [`HISTORY_LEN`] samples.
#[derive(Debug, Default)]
pub struct History {
    samples: VecDeque<Sample>,
}

impl History {
    /// Whether a sample is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        self.samples
            .back()
            .is_none_or(|s| now.saturating_duration_since(s.at) >= SAMPLE_EVERY)
    }

    /// Adds a sample (the oldest goes when full).
    pub fn record(&mut self, s: Sample) {
        if self.samples.len() == HISTORY_LEN {
            self.samples.pop_front();
        }
        self.samples.push_back(s);
    }

    /// Rates from the oldest sample within `window` of the newest to the newest; None
    /// until two samples are that close.
    pub fn rates(&self, window: Duration) -> Option<Rates> {
        let last = self.samples.back()?;
        let first = self
            .samples
            .iter()
            .find(|s| last.at.saturating_duration_since(s.at) <= window)?;
        between(first, last)
    }

    /// Rates between consecutive samples, at seconds before the newest (negative).
    pub fn series(&self) -> Vec<(f64, Rates)> {
        let Some(last) = self.samples.back() else {
            return Vec::new();
        };
        let v: Vec<&Sample> = self.samples.iter().collect();
        v.windows(2)
            .filter_map(|w| {
                let r = between(w[0], w[1])?;
                Some((
                    -(last.at.saturating_duration_since(w[1].at)).as_secs_f64(),
                    r,
                ))
            })
            .collect()
    }
}

/// A sample of the master's request statistics and counters.
pub fn sample(stats: &crate::telemetry::OpStats, counters: &Counters, at: Instant) -> Sample {
    use crate::transfer::Opcode;
    let sum = |ops: &[Opcode]| ops.iter().map(|op| stats.requests(*op as u8)).sum();
    Sample {
        at,
        puts: sum(&[
            Opcode::PutStart,
            Opcode::BatchPutStart,
            Opcode::BatchPutCommit,
        ]),
        gets: sum(&[Opcode::GetReplicas, Opcode::BatchGetReplicas]),
        evicted_objects: counters.evicted_objects,
    }
}

fn between(a: &Sample, b: &Sample) -> Option<Rates> {
    let dt = b.at.saturating_duration_since(a.at).as_secs_f64();
    if dt <= 0.0 {
        return None;
    }
    let per_s = |x: u64, y: u64| y.saturating_sub(x) as f64 / dt;
    Some(Rates {
        puts: per_s(a.puts, b.puts),
        gets: per_s(a.gets, b.gets),
        evictions: per_s(a.evicted_objects, b.evicted_objects),
    })
}

/// One segment's row.
#[derive(Clone, Debug)]
pub struct SegmentRow {
    pub name: String,
    pub tier: &'static str,
    pub endpoint: String,
    pub state: &'static str,
    pub used_bytes: u64,
    pub capacity_bytes: u64,
}

/// This master's role, as `/health` says it.
#[derive(Clone, Debug)]
pub struct RoleView {
    /// `single`, `leader` or `standby`.
    pub role: &'static str,
    pub epoch: u64,
    /// The leader's admin address (`host:port`), when this master is a standby that knows it.
    pub leader_admin: Option<String>,
    pub ha_error: Option<String>,
}

/// Everything the page shows, read at one moment.
pub struct View {
    pub role: RoleView,
    pub uptime: Duration,
    pub summary: Summary,
    pub counters: Counters,
    pub high_watermark: f64,
    pub segments: Vec<SegmentRow>,
    pub last_10s: Option<Rates>,
    pub last_60s: Option<Rates>,
    pub history: Vec<(f64, Rates)>,
}

/// The page (or its `<main>`).
pub fn render(v: &View, part: Part) -> String {
    let links = ["/metrics", "/api/v1/status", "/api/v1/segments", "/health"];
    live::page("rbgctl master", main(v), &links, part)
}

fn main(v: &View) -> String {
    let mut h = String::new();
    let r = &v.role;
    let _ = write!(
        h,
        "<dl class=\"facts\"><dt>role</dt><dd id=\"role\">{}{}</dd><dt>up</dt><dd>{}</dd>",
        escape(r.role),
        if r.epoch > 0 {
            format!(" (epoch {})", r.epoch)
        } else {
            String::new()
        },
        duration(v.uptime)
    );
    if let Some(e) = &r.ha_error {
        let _ = write!(h, "<dt>HA</dt><dd class=\"bad\">{}</dd>", escape(e));
    }
    h.push_str("</dl>");
    if r.role == "standby" {
        let _ = match &r.leader_admin {
            Some(a) => write!(
                h,
                "<p>This master is a standby: the pool is served by the leader, \
                 <a href=\"http://{0}/ui\">{0}</a>.</p>",
                escape(a)
            ),
            None => write!(
                h,
                "<p class=\"warn\">This master is a standby and knows no leader yet.</p>"
            ),
        };
        return h;
    }
    let s = &v.summary;
    h.push_str("<h2>Pool</h2><table><tbody>");
    row_bar(
        &mut h,
        "memory",
        s.used_bytes,
        s.capacity_bytes,
        Some(v.high_watermark),
    );
    if s.disk_capacity_bytes > 0 {
        row_bar(
            &mut h,
            "disk tier",
            s.disk_used_bytes,
            s.disk_capacity_bytes,
            None,
        );
    }
    let _ = write!(
        h,
        "</tbody></table><table><thead><tr><th>objects in memory</th><th>only on disk</th>\
         <th>pending puts</th><th>clients</th><th>segments</th><th>away</th><th>recovering</th>\
         <th>evicted (all time)</th></tr></thead><tbody><tr id=\"counts\">{}</tr></tbody></table>",
        [
            s.keys.saturating_sub(s.disk_keys),
            s.disk_keys,
            s.pending_puts,
            s.clients,
            s.segments,
            s.away_segments,
            s.recovering_segments,
            v.counters.evicted_objects,
        ]
        .iter()
        .map(|n| format!("<td class=\"n\">{n}</td>"))
        .collect::<String>()
    );
    h.push_str("<h2>Rates</h2>");
    let rate = |r: Option<Rates>, f: fn(&Rates) -> f64| {
        r.map_or("—".into(), |r| format!("{:.1}", f(&r)))
    };
    let rows = [
        ("put requests/s", (|r: &Rates| r.puts) as fn(&Rates) -> f64),
        ("get requests/s", |r: &Rates| r.gets),
        ("evictions/s", |r: &Rates| r.evictions),
    ]
    .iter()
    .map(|(name, f)| vec![name.to_string(), rate(v.last_10s, *f), rate(v.last_60s, *f)])
    .collect::<Vec<_>>();
    h.push_str(&report::table(
        &["".into(), "last 10 s".into(), "last 60 s".into()],
        &rows,
    ));
    let chart = LineChart::new(
        "rates",
        "Requests and evictions per second, last two minutes",
        "seconds ago",
        "per second",
    )
    .x_range(-(HISTORY_LEN as f64), 0.0)
    .series(Series::new(
        "puts",
        v.history.iter().map(|(t, r)| (*t, r.puts)).collect(),
    ))
    .series(Series::new(
        "gets",
        v.history.iter().map(|(t, r)| (*t, r.gets)).collect(),
    ))
    .series(Series::new(
        "evictions",
        v.history.iter().map(|(t, r)| (*t, r.evictions)).collect(),
    ));
    h.push_str(&report::figure_or_error(
        "rates",
        chart.svg(),
        "Requests the master answered, one point a second; a batch call counts once. A client \
         that remembers where a value lives reads it from its store without asking.",
    ));
    let _ = write!(h, "<h2>Segments ({})</h2>", v.segments.len());
    if v.segments.is_empty() {
        h.push_str("<p class=\"warn\">No store has mounted a segment.</p>");
        return h;
    }
    h.push_str(
        "<table id=\"segments\"><thead><tr><th>segment</th><th>tier</th><th>state</th>\
                <th>endpoint</th><th>use</th><th>used</th><th>capacity</th></tr></thead><tbody>",
    );
    for seg in &v.segments {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            escape(&seg.name),
            seg.tier,
            if seg.state == "live" { "ok" } else { "warn" },
            seg.state,
            escape(&seg.endpoint),
            bar(seg.used_bytes, seg.capacity_bytes),
            crate::config::human_bytes(seg.used_bytes),
            crate::config::human_bytes(seg.capacity_bytes),
        );
    }
    h.push_str("</tbody></table>");
    h
}

/// A row with a use bar, and the watermark where eviction starts.
fn row_bar(h: &mut String, name: &str, used: u64, capacity: u64, watermark: Option<f64>) {
    let _ = write!(
        h,
        "<tr><th>{name}</th><td>{}</td><td class=\"n\">{} of {}</td><td>{}</td></tr>",
        bar(used, capacity),
        crate::config::human_bytes(used),
        crate::config::human_bytes(capacity),
        watermark.map_or(String::new(), |w| format!(
            "eviction starts at {:.0}%",
            w * 100.0
        )),
    );
}

/// A CSS bar (no script, no image) with the share as its label.
fn bar(used: u64, capacity: u64) -> String {
    let share = if capacity == 0 {
        0.0
    } else {
        (used as f64 / capacity as f64).clamp(0.0, 1.0)
    };
    format!(
        "<span class=\"bar\" title=\"{0:.1}%\"><span style=\"width:{0:.1}%\"></span></span> {0:.1}%",
        share * 100.0
    )
}

fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: Instant, puts: u64, gets: u64, evicted: u64) -> Sample {
        Sample {
            at,
            puts,
            gets,
            evicted_objects: evicted,
        }
    }

    #[test]
    fn rates_come_from_samples_within_the_window() {
        let t0 = Instant::now();
        let mut h = History::default();
        assert!(h.due(t0));
        assert_eq!(h.rates(Duration::from_secs(10)), None);
        for i in 0..=20u64 {
            h.record(sample(t0 + Duration::from_secs(i), i * 100, i * 300, i * 2));
        }
        assert!(!h.due(t0 + Duration::from_millis(20_500)));
        assert!(h.due(t0 + Duration::from_secs(21)));
        let r = h.rates(Duration::from_secs(10)).unwrap();
        assert_eq!((r.puts, r.gets, r.evictions), (100.0, 300.0, 2.0));
        let s = h.series();
        assert_eq!(s.len(), 20);
        assert_eq!(s.last().unwrap().0, 0.0);
        assert_eq!(s.first().unwrap().0, -19.0);
        for i in 0..200u64 {
            h.record(sample(t0 + Duration::from_secs(21 + i), 0, 0, 0));
        }
        assert_eq!(h.samples.len(), HISTORY_LEN);
    }

    fn view(role: &'static str, segments: Vec<SegmentRow>) -> View {
        View {
            role: RoleView {
                role,
                epoch: 3,
                leader_admin: Some("10.0.0.1:9003".into()),
                ha_error: None,
            },
            uptime: Duration::from_secs(75),
            summary: Summary {
                used_bytes: 64 << 20,
                capacity_bytes: 256 << 20,
                keys: 10,
                disk_keys: 4,
                segments: segments.len() as u64,
                ..Summary::default()
            },
            counters: Counters::default(),
            high_watermark: 0.9,
            segments,
            last_10s: Some(Rates {
                puts: 12.0,
                gets: 30.5,
                evictions: 0.0,
            }),
            last_60s: None,
            history: vec![(-1.0, Rates::default()), (0.0, Rates::default())],
        }
    }

    #[test]
    fn the_page_shows_segments_as_bars_counts_and_rates() {
        let seg = |name: &str, used| SegmentRow {
            name: name.into(),
            tier: "memory",
            endpoint: "127.0.0.1:1".into(),
            state: "live",
            used_bytes: used,
            capacity_bytes: 128 << 20,
        };
        let v = view(
            "leader",
            vec![seg("store-<a>", 32 << 20), seg("store-b", 0)],
        );
        let html = render(&v, Part::Whole);
        assert!(html.contains("store-&lt;a&gt;"), "names are escaped");
        assert!(html.contains("width:25.0%"), "a quarter used: {html}");
        assert!(
            html.contains("<td class=\"n\">6</td><td class=\"n\">4</td>"),
            "6 in memory, 4 on disk"
        );
        assert!(html.contains("<td class=\"n\">30.5</td>"), "get rate");
        assert!(html.contains("id=\"rates\"") && html.contains("id=\"segments\""));
        assert!(html.contains("leader (epoch 3)"));
        assert!(
            html.contains("http-equiv=\"refresh\""),
            "reloads without scripts"
        );
        let main = render(&v, Part::Main);
        assert!(!main.contains("<html") && main.contains("store-b"));
    }

    #[test]
    fn a_standby_points_at_the_leader_instead_of_an_empty_pool() {
        let html = render(&view("standby", Vec::new()), Part::Main);
        assert!(html.contains("href=\"http://10.0.0.1:9003/ui\""), "{html}");
        assert!(!html.contains("Segments"), "{html}");
    }
}
