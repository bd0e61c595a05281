//! Benchmark reports: one self-contained HTML file per run (`rbgctl bench ... --report F`),
//! with the charts a reader of this field expects drawn as inline SVG, the figures as tables,
//! and how the run was made. No script and nothing fetched: it opens offline, in any browser.

pub mod chart;
pub mod live;

pub use chart::{BarChart, Format, Group, LineChart, Panel, Series};

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("drawing a chart: {0}")]
    Draw(String),
    #[error("--report {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What a page holds, in order.
enum Block {
    Heading(String),
    Text(String),
    Figure {
        id: String,
        svg: String,
        caption: String,
    },
    Table {
        headers: Vec<String>,
        rows: Vec<Vec<String>>,
    },
}

/// One report page.
pub struct Page {
    title: String,
    facts: Vec<(String, String)>,
    blocks: Vec<Block>,
}

impl Page {
    /// A page titled `title`, stamped with the program, its arguments and the time.
    pub fn new(title: &str) -> Page {
        let command: Vec<String> = std::env::args().collect();
        let host = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default();
        Page {
            title: title.into(),
            facts: vec![
                ("command".into(), command.join(" ")),
                (
                    "made".into(),
                    chrono::Utc::now()
                        .format("%Y-%m-%d %H:%M:%S UTC")
                        .to_string(),
                ),
                ("host".into(), host),
                ("rbgctl".into(), env!("CARGO_PKG_VERSION").to_string()),
            ],
            blocks: Vec::new(),
        }
    }

    /// A line in the page's header (the machine's limits, the workload).
    pub fn fact(&mut self, name: &str, value: impl Into<String>) -> &mut Page {
        self.facts.push((name.into(), value.into()));
        self
    }

    /// Adds a section heading.
    pub fn heading(&mut self, text: &str) -> &mut Page {
        self.blocks.push(Block::Heading(text.into()));
        self
    }

    /// Adds a paragraph.
    pub fn text(&mut self, text: impl Into<String>) -> &mut Page {
        self.blocks.push(Block::Text(text.into()));
        self
    }

    /// Adds a line chart with its caption.
    pub fn line_chart(&mut self, c: &LineChart, caption: &str) -> Result<&mut Page, ReportError> {
        let svg = c.svg()?;
        Ok(self.figure(&c.id, svg, caption))
    }

    /// Adds a bar chart with its caption.
    pub fn bar_chart(&mut self, c: &BarChart, caption: &str) -> Result<&mut Page, ReportError> {
        let svg = c.svg()?;
        Ok(self.figure(&c.id, svg, caption))
    }

    fn figure(&mut self, id: &str, svg: String, caption: &str) -> &mut Page {
        self.blocks.push(Block::Figure {
            id: id.into(),
            svg,
            caption: caption.into(),
        });
        self
    }

    /// Adds a table: its headers, and its rows (a cell per header).
    pub fn table(&mut self, headers: &[&str], rows: Vec<Vec<String>>) -> &mut Page {
        self.blocks.push(Block::Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows,
        });
        self
    }

    /// The page as HTML.
    pub fn render(&self) -> String {
        let mut h = String::with_capacity(64 << 10);
        let _ = write!(
            h,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
             <title>{}</title>{FAVICON}<style>{STYLE}</style></head><body>\n<h1>{}</h1>\n<dl class=\"facts\">",
            escape(&self.title),
            escape(&self.title)
        );
        for (k, v) in &self.facts {
            let _ = write!(h, "<dt>{}</dt><dd>{}</dd>", escape(k), escape(v));
        }
        h.push_str("</dl>\n");
        for b in &self.blocks {
            match b {
                Block::Heading(t) => {
                    let _ = writeln!(h, "<h2>{}</h2>", escape(t));
                }
                Block::Text(t) => {
                    let _ = writeln!(h, "<p>{}</p>", escape(t));
                }
                Block::Figure { id, svg, caption } => {
                    h.push_str(&figure(id, svg, caption));
                    h.push('\n');
                }
                Block::Table { headers, rows } => h.push_str(&table(headers, rows)),
            }
        }
        h.push_str("<footer>Written by rbgctl; charts drawn with plotters as inline SVG.</footer>\n</body></html>\n");
        h
    }

    /// Writes the page to `path` and says where on standard error (a benchmark's last word
    /// about its report).
    pub fn save(&self, path: &Path) -> Result<(), ReportError> {
        self.write(path)?;
        eprintln!("report: {}", path.display());
        Ok(())
    }

    /// Writes the page to `path` (through a temporary file, so a reader never sees half).
    pub fn write(&self, path: &Path) -> Result<(), ReportError> {
        let err = |source| ReportError::Write {
            path: path.to_path_buf(),
            source,
        };
        let tmp = path.with_extension("html.partial");
        std::fs::write(&tmp, self.render()).map_err(err)?;
        std::fs::rename(&tmp, path).map_err(err)
    }
}

/// A chart in its `<figure>`, found by `id`.
pub fn figure(id: &str, svg: &str, caption: &str) -> String {
    format!(
        "<figure class=\"chart\" id=\"{}\">{svg}<figcaption>{}</figcaption></figure>",
        escape(id),
        escape(caption)
    )
}

/// A chart's figure, or the reason it could not be drawn.
pub fn figure_or_error(id: &str, svg: Result<String, ReportError>, caption: &str) -> String {
    match svg {
        Ok(svg) => figure(id, &svg, caption),
        Err(e) => format!("<p class=\"bad\">{}</p>", escape(&e.to_string())),
    }
}

/// An HTML table; cells that read as numbers are right-aligned.
pub fn table(headers: &[String], rows: &[Vec<String>]) -> String {
    let mut h = String::from("<table><thead><tr>");
    for c in headers {
        let _ = write!(h, "<th>{}</th>", escape(c));
    }
    h.push_str("</tr></thead><tbody>");
    for r in rows {
        h.push_str("<tr>");
        for c in r {
            let numeric = c
                .trim_end_matches(['%', 's', ' ', 'x', '×'])
                .replace([',', '.'], "")
                .parse::<i64>()
                .is_ok();
            let class = if numeric { " class=\"n\"" } else { "" };
            let _ = write!(h, "<td{class}>{}</td>", escape(c));
        }
        h.push_str("</tr>");
    }
    h.push_str("</tbody></table>\n");
    h
}

/// Text made safe for HTML element content and quoted attributes.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The pages' icon, inline: a browser asks for nothing (no `/favicon.ico` to miss).
pub const FAVICON: &str = "<link rel=\"icon\" href=\"data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' \
viewBox='0 0 16 16'%3E%3Crect width='16' height='16' rx='3' fill='%231f77b4'/%3E%3Crect x='3' y='8' \
width='3' height='5' fill='white'/%3E%3Crect x='7' y='5' width='3' height='8' fill='white'/%3E%3Crect \
x='11' y='3' width='2' height='10' fill='white'/%3E%3C/svg%3E\">";

/// The pages' one style sheet (also the status pages'): system fonts, readable widths.
pub const STYLE: &str = "\
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1400px;\
padding:0 16px;color:#222;background:#fff}\
h1{font-size:1.5em;margin:0 0 8px}h2{font-size:1.2em;margin:28px 0 8px;border-bottom:1px solid #ddd}\
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;font-size:.85em;color:#555}\
dl.facts dt{font-weight:600}dl.facts dd{margin:0;word-break:break-all}\
figure.chart{margin:12px 0}figure.chart svg{width:100%;height:auto}\
figcaption{font-size:.85em;color:#555}\
table{border-collapse:collapse;font-size:.9em;margin:8px 0}\
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left}td.n{text-align:right;\
font-variant-numeric:tabular-nums}th{background:#f4f4f4}\
.bar{background:#eee;width:220px;height:14px;display:inline-block;vertical-align:middle}\
.bar>span{display:block;height:100%;background:#1f77b4}\
.ok{color:#2c7a2c}.bad{color:#b22}.warn{color:#a60}\
footer{margin-top:32px;font-size:.8em;color:#888}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_holds_its_charts_tables_and_facts_escaped() {
        let mut p = Page::new("bench <x>");
        p.fact("loopback TCP", "4.5 GB/s");
        p.line_chart(
            &LineChart::new("ttft-cdf", "TTFT", "s", "share")
                .series(Series::cdf("rate 2", &[0.1, 0.2])),
            "caption & more",
        )
        .unwrap();
        p.table(
            &["tier", "hit rate"],
            vec![vec!["L1".into(), "2.2%".into()]],
        );
        let html = p.render();
        assert!(html.contains("<title>bench &lt;x&gt;</title>"), "{html}");
        assert!(
            html.contains("<figure class=\"chart\" id=\"ttft-cdf\"><svg"),
            "{html}"
        );
        assert!(html.contains("caption &amp; more"), "{html}");
        assert!(html.contains("<td class=\"n\">2.2%</td>"), "{html}");
        assert!(!html.contains("<script"), "a report carries no script");
        assert!(
            !html.contains(" src=") && !html.contains("href=\"http"),
            "nothing fetched"
        );
    }

    #[test]
    fn write_names_the_path_it_could_not_write() {
        let e = Page::new("x")
            .write(Path::new("/nonexistent-dir/r.html"))
            .unwrap_err();
        assert!(e.to_string().contains("/nonexistent-dir/r.html"), "{e}");
    }
}
