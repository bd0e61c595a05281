//! What every benchmark ends with: its figures as JSON (`--json`) or as a table a person reads,
//! and, with `--report`, a self-contained HTML page of charts (`crate::report::Page`).

use crate::report::Page;
use serde::Serialize;
use std::path::Path;

/// A benchmark's result: serialized as its JSON, written as its table, drawn as its page.
pub trait BenchReport: Serialize {
    /// The figures as a table a person reads (ending with a newline).
    fn table(&self) -> String;

    /// The figures as JSON: pretty, or one line where a benchmark prints a line per step (JSON
    /// Lines, as `bench multiturn` does per rate).
    fn json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(self)
    }

    /// The HTML page of charts and figures, for a benchmark that draws one.
    fn page(&self) -> anyhow::Result<Page> {
        anyhow::bail!("--report: this benchmark draws no HTML report")
    }

    /// Writes the page to `html` when given, then prints the figures on standard output:
    /// JSON when `json`, else the table.
    fn publish(&self, json: bool, html: Option<&Path>) -> anyhow::Result<()> {
        if let Some(path) = html {
            self.page()?.save(path)?;
        }
        match json {
            true => println!("{}", self.json()?),
            false => print!("{}", self.table()),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Figures {
        ops_per_s: f64,
    }

    impl BenchReport for Figures {
        fn table(&self) -> String {
            format!("{:.0} ops/s\n", self.ops_per_s)
        }
    }

    #[test]
    fn a_report_without_a_page_refuses_an_html_path_before_printing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.html");
        let err = Figures { ops_per_s: 1.0 }
            .publish(false, Some(&path))
            .unwrap_err();
        assert!(err.to_string().contains("draws no HTML report"), "{err}");
        assert!(!path.exists());
        assert_eq!(Figures { ops_per_s: 2.4 }.table(), "2 ops/s\n");
    }
}
