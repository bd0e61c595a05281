//! The limits the RDMA rows are judged against, measured in the same run on the same device:
//! perftest's `ib_read_bw`, `ib_write_bw` (bandwidth at a message size) and `ib_read_lat`
//! (latency), each run as a server and a client on this host (their own TCP exchange on a port
//! of their own, the traffic through the device), as RDMA users measure a link; and the CPU
//! time a process spent, read from `/proc`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One perftest measurement.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Perftest {
    pub tool: String,
    pub message_bytes: u64,
    /// Bandwidth tools: the average, in GB/s (perftest prints MiB/s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gb_per_s: Option<f64>,
    /// `ib_read_lat`: the typical (median) latency, in microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub typical_us: Option<f64>,
}

/// Runs `tool` (ib_read_bw, ib_write_bw, ib_read_lat) on `device` with `gid_index`: a server in
/// the background, then the client against it on 127.0.0.1. A run that fails or prints no
/// usable figure (perftest prints `inf` or `nan` when its clock saw no time pass, which a
/// starved emulated machine can make happen) is tried again, up to three times in all.
pub fn perftest(
    tool: &str,
    device: &str,
    gid_index: u32,
    message: u64,
    iterations: u64,
    port: u16,
) -> anyhow::Result<Perftest> {
    let mut last = None;
    for _ in 0..3 {
        match perftest_once(tool, message, |cmd| {
            cmd.args(["-d", device, "-x", &gid_index.to_string(), "-F"])
                .args(["-s", &message.to_string(), "-n", &iterations.to_string()])
                .args(["-p", &port.to_string()]);
        }) {
            Ok(p) => return Ok(p),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("{tool}: not run")))
}

/// One run of `tool` for `message`-byte messages, `args` giving both sides their options.
fn perftest_once(
    tool: &str,
    message: u64,
    args: impl Fn(&mut Command),
) -> anyhow::Result<Perftest> {
    let mut server = Command::new(tool);
    args(&mut server);
    let mut server = server
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot run {tool} (perftest): {e}"))?;
    // The server listens once it has set its device up; the client retries until it answers.
    let deadline = Instant::now() + Duration::from_secs(60);
    let out = loop {
        let mut client = Command::new(tool);
        args(&mut client);
        let out = client.arg("127.0.0.1").output()?;
        if out.status.success() || Instant::now() > deadline {
            break out;
        }
        if server.try_wait()?.is_some() {
            break out;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = server.kill();
    let _ = server.wait();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    anyhow::ensure!(
        out.status.success(),
        "{tool} -s {message} failed: {}{}",
        text.trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    parse(tool, message, &text)
}

/// The result line of perftest's output: the first line whose first field is the message size.
fn parse(tool: &str, message: u64, text: &str) -> anyhow::Result<Perftest> {
    // Fields by position: one perftest could not print as a number reads as none.
    let row: Vec<Option<f64>> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.first() == Some(&message.to_string().as_str()))
        .map(|f| f.iter().map(|x| x.parse().ok()).collect())
        .ok_or_else(|| anyhow::anyhow!("{tool}: no result line in its output:\n{text}"))?;
    let mut p = Perftest {
        tool: tool.to_string(),
        message_bytes: message,
        ..Default::default()
    };
    if tool.ends_with("_lat") {
        // #bytes #iterations t_min t_max t_typical t_avg ...
        p.typical_us = row.get(4).copied().flatten();
    } else {
        // #bytes #iterations BW_peak BW_average MsgRate (MiB/s)
        p.gb_per_s = row
            .get(3)
            .copied()
            .flatten()
            .map(|mib| mib * 1_048_576.0 / 1e9);
    }
    anyhow::ensure!(
        p.typical_us
            .or(p.gb_per_s)
            .is_some_and(|x| x.is_finite() && x > 0.0),
        "{tool}: no usable figure in its result line:\n{text}"
    );
    Ok(p)
}

/// CPU time `pid` has used (all its threads, user and system), in seconds.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    super::procfs::cpu_time(pid)
        .map(|t| t.as_secs_f64())
        .ok_or_else(|| anyhow::anyhow!("cannot read the CPU time of process {pid}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perftest_result_lines_are_read() {
        let bw =
            " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n \
                  1048576    200              42.31              40.26  \t\t   0.000040\n";
        let p = parse("ib_read_bw", 1 << 20, bw).unwrap();
        assert!((p.gb_per_s.unwrap() - 40.26 * 1_048_576.0 / 1e9).abs() < 1e-9);
        let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    \
                   t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n \
                   4096    1000          31.20          160.4        35.10          \
                   36.02        4.1       60.3             150.2   \n";
        let p = parse("ib_read_lat", 4096, lat).unwrap();
        assert_eq!(p.typical_us, Some(35.10));
        assert!(parse("ib_read_bw", 4096, bw).is_err());
        for starved in ["inf  -nan", "inf  inf", "12.0  bogus"] {
            let line = format!(" 1048576    200   {starved}  \t\t   0.000040\n");
            assert!(parse("ib_read_bw", 1 << 20, &line).is_err(), "{line}");
        }
    }
}
