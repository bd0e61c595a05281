//! `rbgctl mooncake-wire` (beside the benchmarks, whose cluster it starts): checks a Mooncake
//! client version against rbgctl's master. Starts a master and a store on loopback, drives the
//! wheel installed beside `--python` through every call a HiCache backend makes
//! (`scripts/mooncake_wire.py`, embedded), then prints, for every RPC, the function id and
//! request type hash the master expects beside the hash the wheel sent, and the function ids
//! the master does not serve that the wheel called. Exits non-zero when a hash differs or an
//! unknown function was called: that wheel speaks another version.

use crate::bench::kit::report::BenchReport;
use crate::mooncake::master::WireRow;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const SCRIPT: &str = include_str!("../../scripts/mooncake_wire.py");

/// Longest the wheel's script may run.
const LIMIT: Duration = Duration::from_secs(180);

/// `rbgctl mooncake-wire`'s arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct WireArgs {
    /// A Python with Mooncake's wheel installed (`mooncake-transfer-engine-non-cuda`).
    #[arg(long)]
    pub python: PathBuf,
    /// Print the rows as JSON.
    #[arg(long)]
    pub json: bool,
}

/// How an RPC's request type compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The wheel sent the hash the master decodes.
    Same,
    /// It sent another: that call fails against this master.
    Differs,
    /// The wheel did not call it in the script.
    NotSeen,
    /// It takes no arguments: nothing to compare but its function id.
    NoArguments,
    /// The master does not serve it (answered NOT_SUPPORTED or "not registered").
    NotServed,
}

/// What a row of the wire table says: the same, differing, not called or not served.
pub fn verdict(row: &WireRow) -> Verdict {
    match (row.served, row.request_type_hash, row.seen_type_hash) {
        (false, _, _) => Verdict::NotServed,
        (true, Some(want), Some(got)) if want != got => Verdict::Differs,
        (true, Some(_), Some(_)) => Verdict::Same,
        (true, Some(_), None) => Verdict::NotSeen,
        (true, None, _) => Verdict::NoArguments,
    }
}

/// What `bench mooncake-wire` reports: a row per type and call (its JSON).
#[derive(serde::Serialize)]
#[serde(transparent)]
struct WireFigures<'a>(&'a [WireRow]);

impl BenchReport for WireFigures<'_> {
    fn table(&self) -> String {
        table(self.0)
    }
}

/// The report as a table.
pub fn table(rows: &[WireRow]) -> String {
    use std::fmt::Write as _;
    let hash = |h: Option<u32>| h.map_or("-".to_string(), |h| format!("{h:#010x}"));
    let mut out = format!(
        "{:<26} {:>12} {:>12} {:>12}  {}\n",
        "rpc", "function id", "rbgctl", "the wheel", "verdict"
    );
    for r in rows {
        let v = match verdict(r) {
            Verdict::Same => "same",
            Verdict::Differs => "DIFFERS",
            Verdict::NotSeen => "not called",
            Verdict::NoArguments => "no arguments",
            Verdict::NotServed if r.seen_type_hash.is_some() => "CALLED, not served",
            Verdict::NotServed => "not served",
        };
        let _ = writeln!(
            out,
            "{:<26} {:>12} {:>12} {:>12}  {v}",
            r.rpc,
            format!("{:#010x}", r.function_id),
            hash(r.request_type_hash),
            hash(r.seen_type_hash)
        );
    }
    out
}

/// Whether the wheel speaks what the master serves: no hash differs, no call unserved.
pub fn agrees(rows: &[WireRow]) -> bool {
    rows.iter().all(|r| match verdict(r) {
        Verdict::Differs => false,
        Verdict::NotServed => r.seen_type_hash.is_none(),
        _ => true,
    })
}

/// Runs `rbgctl mooncake-wire`: drives the given wheel through every call a HiCache backend
/// makes against a master and store of its own, and prints what each RPC sent beside what
/// the master expects; an error when a hash differs or an RPC is not served.
pub fn run(args: WireArgs) -> anyhow::Result<()> {
    let cluster = super::kit::cluster::OwnCluster::start(256 << 20, false)?;
    let script =
        std::env::temp_dir().join(format!("rbgctl-mooncake-wire-{}.py", std::process::id()));
    std::fs::write(&script, SCRIPT)?;
    let out = Command::new("timeout")
        .arg(LIMIT.as_secs().to_string())
        .arg(&args.python)
        .arg(&script)
        .args(["--master", &cluster.master])
        .env("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        .output();
    let _ = std::fs::remove_file(&script);
    let out = out.map_err(|e| anyhow::anyhow!("cannot run {}: {e}", args.python.display()))?;
    if !out.status.success() {
        anyhow::bail!(
            "the wheel's script failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (admin, _) = cluster.master_http_addrs();
    let rows: Vec<WireRow> =
        reqwest::blocking::get(format!("http://{admin}/api/v1/mooncake/wire"))?.json()?;
    if !args.json {
        eprint!("{}", String::from_utf8_lossy(&out.stdout));
    }
    WireFigures(&rows).publish(args.json, None)?;
    if !agrees(&rows) {
        anyhow::bail!(
            "this wheel sends types or calls that rbgctl's master does not decode (DIFFERS, or \
             CALLED, not served, above): it speaks another Mooncake version than the master's \
             (0.3.13.post1)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(served: bool, want: Option<u32>, got: Option<u32>) -> WireRow {
        WireRow {
            rpc: "X".into(),
            served,
            function_id: 1,
            request_type_hash: want,
            seen_type_hash: got,
        }
    }

    #[test]
    fn verdicts_and_agreement() {
        assert_eq!(verdict(&row(true, Some(2), Some(2))), Verdict::Same);
        assert_eq!(verdict(&row(true, Some(2), Some(4))), Verdict::Differs);
        assert_eq!(verdict(&row(true, Some(2), None)), Verdict::NotSeen);
        assert_eq!(verdict(&row(true, None, None)), Verdict::NoArguments);
        assert_eq!(verdict(&row(false, None, Some(4))), Verdict::NotServed);
        assert!(agrees(&[
            row(true, Some(2), Some(2)),
            row(false, None, None)
        ]));
        assert!(!agrees(&[row(true, Some(2), Some(4))]));
        assert!(!agrees(&[row(false, None, Some(4))]));
        assert!(table(&[row(true, Some(2), Some(4))]).contains("DIFFERS"));
    }
}
