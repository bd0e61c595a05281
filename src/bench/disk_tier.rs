//! `rbgctl bench store --disk-tier DIR`: the disk tier's figures, beside the filesystem's own
//! sequential read speed measured in the same run.
//!
//! For each value size it starts a master and a store with a small memory segment and a disk
//! tier in `DIR`, and measures:
//! - **put stream at the watermark**: memory is first filled to its eviction watermark, then a
//!   stream of puts twice the memory's size runs while memory gives the oldest objects to disk.
//!   The same stream runs against a store without a disk tier (eviction drops), so the cost of
//!   demoting shows as a ratio. Demotion throughput is the bytes the store copied to disk over
//!   the stream's time.
//! - **gets of disk-resident objects**: values that only the disk tier holds, read by 1 and 4
//!   threads, over TCP (the store reads its disk and sends the bytes) and by a same-host client
//!   that reads the tier's file itself. Promotion is off for this master, so every read is a
//!   disk read (the store's counters confirm it for the TCP rows).

use super::kit::cluster::{scrape, OwnCluster, OwnOpts};
use super::kit::limits;
use super::kit::load::Outcome;
use crate::bench::kit::report::BenchReport;
use crate::client::{Client, ClientConfig, ReplicateConfig};
use crate::config::human_bytes;
use crate::master::config::MasterConfig;
use crate::store::disk;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to measure.
pub struct Plan<'a> {
    pub dir: &'a Path,
    pub memory: u64,
    pub disk: u64,
    pub sizes: Vec<u64>,
    pub threads: Vec<usize>,
    pub json: bool,
    /// Where to write the HTML report, if anywhere.
    pub report: Option<&'a Path>,
}

/// What `bench disk-tier` reports.
#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    pub loopback_tcp_gb_per_s: f64,
    pub memcpy_gb_per_s: f64,
    /// The filesystem's sequential read and write speeds under the disk tier's directory, per
    /// block size.
    pub filesystem: Vec<ProbeRow>,
    /// Whether the disk tier bypasses the page cache (`O_DIRECT`).
    pub direct_io: bool,
    pub memory_bytes: u64,
    pub disk_bytes: u64,
    pub put_streams: Vec<PutStreamRow>,
    pub disk_gets: Vec<DiskGetRow>,
}

/// The filesystem's own speed at one block size, the limit the disk tier is held to.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProbeRow {
    /// Bytes per read and per write.
    pub block_bytes: u64,
    pub read_gb_per_s: f64,
    pub write_gb_per_s: f64,
}

/// A stream of puts past memory, with and without a disk tier.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PutStreamRow {
    pub value_bytes: u64,
    pub bytes: u64,
    /// Puts into a store without a disk tier (eviction drops), GB/s.
    pub no_tier_gb_per_s: f64,
    /// Puts into a store with a disk tier (eviction demotes), GB/s.
    pub disk_tier_gb_per_s: f64,
    /// disk tier / no tier.
    pub kept: f64,
    /// Bytes the store copied from memory to disk during the stream, per second.
    pub demotion_gb_per_s: f64,
    /// Objects dropped during the stream with the disk tier (0 when demotion kept up).
    pub dropped_with_tier: u64,
}

/// Reads of values that live on the disk tier, by path.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DiskGetRow {
    /// `tcp`: the store reads its disk and sends the bytes; `same-host`: the client reads the
    /// disk tier's file itself.
    pub path: &'static str,
    pub value_bytes: u64,
    pub threads: usize,
    pub ops: u64,
    pub gb_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Share of the bytes read that the store read from its disk tier (TCP rows).
    pub from_disk: Option<f64>,
    /// GB/s over the filesystem's sequential read speed for this size.
    pub of_filesystem: f64,
}

fn value(size: u64, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; size as usize];
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    v
}

fn cluster(plan: &Plan<'_>, tier: bool) -> anyhow::Result<OwnCluster> {
    OwnCluster::start_with(OwnOpts {
        segment_size: plan.memory,
        persistent: true,
        disk_tier: tier.then(|| (plan.dir.to_path_buf(), plan.disk)),
        master: MasterConfig {
            // Every read of a disk-resident value is a disk read.
            promotion_on_hit: false,
            ..MasterConfig::default()
        },
        rdma_device: None,
    })
}

fn client(c: &OwnCluster) -> anyhow::Result<Client> {
    Ok(Client::connect(ClientConfig {
        same_host_shm: false,
        ..ClientConfig::new(c.master.clone())
    })?)
}

fn same_host_client(c: &OwnCluster) -> anyhow::Result<Client> {
    Ok(Client::connect(ClientConfig::new(c.master.clone()))?)
}

/// Puts `count` values of `size` from key number `from`; returns the seconds taken.
fn put_run(client: &Client, size: u64, from: u64, count: u64) -> anyhow::Result<f64> {
    let v = value(size, 1);
    let t0 = Instant::now();
    for i in from..from + count {
        client.put(&format!("v{i}"), &v, &ReplicateConfig::default())?;
    }
    Ok(t0.elapsed().as_secs_f64())
}

fn master_counter(c: &OwnCluster, name: &str) -> f64 {
    scrape(c.master_metrics_port, name).unwrap_or(0.0)
}

/// Waits until no copy between tiers is under way (at most 60 s).
fn settle(c: &OwnCluster) -> anyhow::Result<()> {
    let t0 = Instant::now();
    while master_counter(c, "rbgctl_master_tier_moves_in_flight") != 0.0 {
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(60),
            "copies between tiers did not finish within 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Fills memory to its watermark, then puts twice the memory; returns (GB/s, objects put so
/// far, demoted bytes during the stream, dropped objects during the stream).
fn put_stream(c: &OwnCluster, plan: &Plan<'_>, size: u64) -> anyhow::Result<(f64, u64, f64, u64)> {
    let client = client(c)?;
    let fill = (plan.memory as f64 * 0.9 / size as f64) as u64;
    put_run(&client, size, 0, fill)?;
    settle(c)?;
    let store = c.store_metrics_port(0);
    let demoted0 = scrape(store, "rbgctl_store_demoted_bytes_total").unwrap_or(0.0);
    let dropped0 = master_counter(c, "rbgctl_master_evicted_objects_total");
    let count = 2 * plan.memory / size;
    let seconds = put_run(&client, size, fill, count)?;
    let demoted = scrape(store, "rbgctl_store_demoted_bytes_total").unwrap_or(0.0) - demoted0;
    let dropped = master_counter(c, "rbgctl_master_evicted_objects_total") - dropped0;
    Ok((
        (count * size) as f64 / seconds / 1e9,
        fill + count,
        demoted / seconds / 1e9,
        dropped as u64,
    ))
}

/// Reads `keys` (each once) with `threads` threads; returns the row.
fn disk_gets(
    c: &OwnCluster,
    same_host: bool,
    size: u64,
    keys: &[u64],
    threads: usize,
    probe: f64,
) -> anyhow::Result<DiskGetRow> {
    let client = Arc::new(if same_host {
        same_host_client(c)?
    } else {
        client(c)?
    });
    let expected = Arc::new(value(size, 1));
    let store = c.store_metrics_port(0);
    let disk0 = scrape(store, "rbgctl_store_disk_read_bytes_total").unwrap_or(0.0);
    // Each thread reads its share of the keys once.
    let per = keys.len().div_ceil(threads.max(1)) as u64;
    let run = super::kit::load::closed_loop(
        threads,
        keys.len() as u64,
        Duration::MAX,
        |_| Ok(vec![0u8; size as usize]),
        |buf, t, i| {
            let k = keys.get((t as u64 * per + i) as usize)?;
            Some(match client.get_into(&format!("v{k}"), buf) {
                Ok(n) if buf[..n] == expected[..] => Outcome::Ok,
                Ok(_) => Outcome::Failed(format!("v{k}: wrong bytes")),
                Err(e) => Outcome::Failed(format!("v{k}: {e}")),
            })
        },
    );
    if let Some(e) = run.first_error {
        anyhow::bail!(
            "{} of {} reads failed; the first: {e}",
            run.errors,
            keys.len()
        );
    }
    let seconds = run.elapsed.as_secs_f64();
    let mut lat: Vec<f64> = run
        .latencies
        .iter()
        .map(|d| d.as_secs_f64() * 1e6)
        .collect();
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize];
    let bytes = (keys.len() as u64 * size) as f64;
    let from_disk = scrape(store, "rbgctl_store_disk_read_bytes_total").unwrap_or(0.0) - disk0;
    let gb_per_s = bytes / seconds / 1e9;
    Ok(DiskGetRow {
        path: if same_host { "same-host" } else { "tcp" },
        value_bytes: size,
        threads,
        ops: keys.len() as u64,
        gb_per_s,
        p50_us: pct(0.5),
        p99_us: pct(0.99),
        from_disk: (!same_host).then_some(from_disk / bytes),
        of_filesystem: gb_per_s / probe,
    })
}

/// Runs `rbgctl bench disk-tier` by `plan` and prints (or writes) its report.
pub fn run(plan: Plan<'_>) -> anyhow::Result<()> {
    let progress = |msg: &str| {
        if !plan.json {
            eprintln!("… {msg}");
        }
    };
    anyhow::ensure!(
        plan.disk >= 4 * plan.memory,
        "--disk-tier-size must be at least 4 × --disk-tier-memory (the disk tier keeps every \
         value the stream puts: three times the memory)"
    );
    anyhow::ensure!(
        !plan.sizes.is_empty() && plan.sizes.iter().all(|&s| s > 0 && s * 16 <= plan.memory),
        "--disk-tier-values must be non-zero and at most 1/16 of --disk-tier-memory"
    );
    progress("measuring the machine: loopback TCP, memcpy");
    let (loopback, memcpy) = limits::machine()?;
    let mut report = Report {
        loopback_tcp_gb_per_s: loopback,
        memcpy_gb_per_s: memcpy,
        memory_bytes: plan.memory,
        disk_bytes: plan.disk,
        ..Report::default()
    };
    let probe_bytes = plan.disk.min(1 << 30);
    for &size in &plan.sizes {
        progress(&format!(
            "the filesystem's sequential write and read speeds under {} ({} in blocks of {})",
            plan.dir.display(),
            human_bytes(probe_bytes),
            human_bytes(size)
        ));
        let speed = disk::probe(plan.dir, probe_bytes, size as usize)?;
        report.filesystem.push(ProbeRow {
            block_bytes: size,
            read_gb_per_s: speed.read / 1e9,
            write_gb_per_s: speed.write / 1e9,
        });
    }
    for (&size, probe) in plan.sizes.iter().zip(report.filesystem.clone()) {
        progress(&format!("{}: put stream, no disk tier", human_bytes(size)));
        let plain = cluster(&plan, false)?;
        let (no_tier, _, _, _) = put_stream(&plain, &plan, size)?;
        drop(plain);
        progress(&format!(
            "{}: put stream, with the disk tier",
            human_bytes(size)
        ));
        let tiered = cluster(&plan, true)?;
        report.direct_io = scrape(
            tiered.store_metrics_port(0),
            "rbgctl_store_disk_tier_direct_io",
        ) == Some(1.0);
        let (with_tier, total, demotion, dropped) = put_stream(&tiered, &plan, size)?;
        report.put_streams.push(PutStreamRow {
            value_bytes: size,
            bytes: 2 * plan.memory / size * size,
            no_tier_gb_per_s: no_tier,
            disk_tier_gb_per_s: with_tier,
            kept: with_tier / no_tier,
            demotion_gb_per_s: demotion,
            dropped_with_tier: dropped,
        });
        settle(&tiered)?;
        // The oldest values are on disk: memory holds at most its own size of the newest.
        let in_memory = plan.memory / size + 1;
        let on_disk: Vec<u64> = (0..total.saturating_sub(in_memory)).collect();
        // Promotion is off: reading them again is reading the disk again.
        for same_host in [false, true] {
            for &threads in &plan.threads {
                progress(&format!(
                    "{}: gets of {} disk-resident values × {threads} thread(s), {}",
                    human_bytes(size),
                    on_disk.len(),
                    if same_host { "same host" } else { "over TCP" }
                ));
                let row = disk_gets(
                    &tiered,
                    same_host,
                    size,
                    &on_disk,
                    threads,
                    probe.read_gb_per_s,
                )?;
                report.disk_gets.push(row);
            }
        }
    }
    report.publish(plan.json, plan.report)?;
    Ok(())
}

impl BenchReport for Report {
    fn table(&self) -> String {
        let r = self;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "machine: loopback TCP {:.2} GB/s, memcpy {:.2} GB/s; disk tier {} ({}), memory {}",
            r.loopback_tcp_gb_per_s,
            r.memcpy_gb_per_s,
            human_bytes(r.disk_bytes),
            if r.direct_io {
                "O_DIRECT"
            } else {
                "buffered: the filesystem refuses O_DIRECT"
            },
            human_bytes(r.memory_bytes)
        );
        for p in &r.filesystem {
            let _ = writeln!(
                out,
                "filesystem, {} blocks: sequential write {:.2} GB/s, read {:.2} GB/s",
                human_bytes(p.block_bytes),
                p.write_gb_per_s,
                p.read_gb_per_s
            );
        }
        let _ = writeln!(
            out,
            "\n{:<10} {:>12} {:>14} {:>8} {:>14} {:>8}",
            "PUT STREAM", "NO TIER GB/s", "DISK TIER GB/s", "KEPT", "DEMOTION GB/s", "DROPPED"
        );
        for p in &r.put_streams {
            let _ = writeln!(
                out,
                "{:<10} {:>12.2} {:>14.2} {:>7.0}% {:>14.2} {:>8}",
                human_bytes(p.value_bytes),
                p.no_tier_gb_per_s,
                p.disk_tier_gb_per_s,
                p.kept * 100.0,
                p.demotion_gb_per_s,
                p.dropped_with_tier
            );
        }
        let _ = writeln!(
            out,
            "\n{:<10} {:<9} {:>7} {:>7} {:>8} {:>9} {:>9} {:>10} {:>8}",
            "DISK GET", "PATH", "THREADS", "OPS", "GB/s", "p50 µs", "p99 µs", "FROM DISK", "OF FS"
        );
        for g in &r.disk_gets {
            let from_disk = g
                .from_disk
                .map_or("-".to_string(), |f| format!("{:.0}%", f * 100.0));
            let _ = writeln!(
                out,
                "{:<10} {:<9} {:>7} {:>7} {:>8.2} {:>9.0} {:>9.0} {:>10} {:>7.0}%",
                human_bytes(g.value_bytes),
                g.path,
                g.threads,
                g.ops,
                g.gb_per_s,
                g.p50_us,
                g.p99_us,
                from_disk,
                g.of_filesystem * 100.0
            );
        }
        out
    }

    /// The HTML report: put streams with and without the tier as bars, and disk-resident gets per
    /// value size against the filesystem's own sequential read speed.
    fn page(&self) -> anyhow::Result<crate::report::Page> {
        let r = self;
        use crate::report::{BarChart, Format, Group, LineChart, Page, Panel, Series};
        let mut page = Page::new("The disk tier: puts at the watermark, reads from disk");
        page.fact(
            "machine",
            format!(
                "loopback TCP {:.2} GB/s, memcpy {:.2} GB/s; disk tier {} ({}), memory {}",
                r.loopback_tcp_gb_per_s,
                r.memcpy_gb_per_s,
                human_bytes(r.disk_bytes),
                if r.direct_io { "O_DIRECT" } else { "buffered" },
                human_bytes(r.memory_bytes)
            ),
        );
        let sizes: Vec<String> = r
            .put_streams
            .iter()
            .map(|p| Format::Bytes.write(p.value_bytes as f64))
            .collect();
        let puts = BarChart::new(
            "put-streams",
            "A put stream at the memory watermark (GB/s)",
            sizes,
        )
        .panel(Panel::bars(
            "",
            "GB/s",
            Format::Number,
            vec![
                Group::new(
                    "no tier (eviction drops)",
                    r.put_streams
                        .iter()
                        .map(|p| Some(p.no_tier_gb_per_s))
                        .collect(),
                ),
                Group::new(
                    "disk tier (eviction demotes)",
                    r.put_streams
                        .iter()
                        .map(|p| Some(p.disk_tier_gb_per_s))
                        .collect(),
                ),
                Group::new(
                    "demotion to disk",
                    r.put_streams
                        .iter()
                        .map(|p| Some(p.demotion_gb_per_s))
                        .collect(),
                ),
            ],
        ));
        let mut gets = LineChart::new(
            "disk-gets",
            "Gets of disk-resident values",
            "value size",
            "GB/s",
        )
        .formats(Format::Bytes, Format::Number)
        .log_x();
        let mut curves: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        for g in &r.disk_gets {
            let name = format!(
                "{} get, {} thread{}",
                g.path,
                g.threads,
                if g.threads == 1 { "" } else { "s" }
            );
            let point = (g.value_bytes as f64, g.gb_per_s);
            match curves.iter_mut().find(|(n, _)| *n == name) {
                Some((_, pts)) => pts.push(point),
                None => curves.push((name, vec![point])),
            }
        }
        for (name, mut pts) in curves {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            gets = gets.series(Series::new(name, pts));
        }
        let mut fs: Vec<(f64, f64)> = r
            .filesystem
            .iter()
            .map(|p| (p.block_bytes as f64, p.read_gb_per_s))
            .collect();
        fs.sort_by(|a, b| a.0.total_cmp(&b.0));
        gets = gets.series(Series {
            name: "filesystem sequential read (this machine)".into(),
            points: fs,
            reference: true,
        });
        page.heading("Charts");
        page.bar_chart(&puts, "Values streamed into a pool whose memory is full: without a disk tier eviction drops the oldest; with one it copies them to disk first.")?;
        page.line_chart(&gets, "tcp: the store reads its disk and sends the bytes; same-host: the client reads the disk tier's file itself. Dashed: the filesystem's own sequential read speed per block size, measured in this run.")?;
        Ok(page)
    }
}
