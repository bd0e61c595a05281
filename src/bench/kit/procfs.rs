//! What the benchmarks read about processes from `/proc`: CPU time, resident memory, open
//! files, whether every thread is stopped, and this process's system calls. The parsers are
//! pure (tested on captured text); the readers return `None` once a process is gone or where a
//! kernel does not report a field.

use std::time::Duration;

/// User + system CPU time of process `pid`.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    cpu_split(pid).map(|c| c.user + c.system)
}

/// CPU time of a process, in its own code and in the kernel on its behalf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuSplit {
    pub user: Duration,
    pub system: Duration,
}

/// [`CpuSplit`] of process `pid`.
pub fn cpu_split(pid: u32) -> Option<CpuSplit> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    cpu_of_stat(&stat, clock_ticks_per_second())
}

/// Resident memory of process `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    rss_of_status(&status)
}

/// Files process `pid` has open (0 once it is gone).
pub fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Whether every thread of process `pid` is stopped (state `T` or `t`).
pub fn all_threads_stopped(pid: u32) -> Option<bool> {
    let mut all = true;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("stat")).ok()?;
        all &= matches!(state_of_stat(&stat)?, 'T' | 't');
    }
    Some(all)
}

/// Reads and writes this process has made (`syscr` + `syscw` of `/proc/self/io`).
pub fn own_syscalls() -> Option<u64> {
    syscalls_of_io(&std::fs::read_to_string("/proc/self/io").ok()?)
}

/// The whole host's CPU time spent busy (all but idle and I/O wait), summed over its cores,
/// from the first line of `/proc/stat`.
pub fn host_busy() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    busy_of_proc_stat(&stat, clock_ticks_per_second())
}

/// Connections this network namespace's listeners dropped because their accept queue was
/// full (`TcpExt: ListenOverflows` of `/proc/net/netstat`).
pub fn listen_overflows() -> Option<u64> {
    tcp_ext(
        &std::fs::read_to_string("/proc/net/netstat").ok()?,
        "ListenOverflows",
    )
}

/// A `TcpExt` counter of a `/proc/net/netstat` text: a line of names, then a line of values.
fn tcp_ext(netstat: &str, name: &str) -> Option<u64> {
    let mut lines = netstat.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next()?, lines.next()?);
    let at = names.split_whitespace().position(|n| n == name)?;
    values.split_whitespace().nth(at)?.parse().ok()
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a constant.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).max(1) as f64
}

/// The fields of a `stat` line after the command name, which may hold spaces and parentheses:
/// the first of them is the state (field 3).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    Some(stat.rsplit_once(')')?.1.split_whitespace().collect())
}

fn state_of_stat(stat: &str) -> Option<char> {
    stat_fields(stat)?.first()?.chars().next()
}

/// utime + stime (fields 14 and 15), in clock ticks of `hz` per second.
fn cpu_of_stat(stat: &str, hz: f64) -> Option<CpuSplit> {
    let f = stat_fields(stat)?;
    let time = |field: usize| {
        let ticks = f.get(field - 3)?.parse::<u64>().ok()?;
        Some(Duration::from_secs_f64(ticks as f64 / hz))
    };
    Some(CpuSplit {
        user: time(14)?,
        system: time(15)?,
    })
}

/// `cpu user nice system idle iowait irq softirq steal ...`: all but idle (4th) and iowait
/// (5th), in clock ticks of `hz` per second.
fn busy_of_proc_stat(stat: &str, hz: f64) -> Option<Duration> {
    let mut f = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace();
    let ticks: Vec<u64> = f.by_ref().map(|t| t.parse().ok()).collect::<Option<_>>()?;
    // guest and guest_nice (9th, 10th) are counted in user and nice already.
    let busy: u64 = ticks
        .iter()
        .enumerate()
        .filter(|(i, _)| !matches!(i, 3 | 4 | 8 | 9))
        .map(|(_, t)| t)
        .sum();
    (ticks.len() >= 5).then(|| Duration::from_secs_f64(busy as f64 / hz))
}

fn rss_of_status(status: &str) -> Option<u64> {
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

fn syscalls_of_io(io: &str) -> Option<u64> {
    let field = |name: &str| -> Option<u64> {
        io.lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .parse()
            .ok()
    };
    Some(field("syscr:")? + field("syscw:")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tcp_ext_counter_is_read_by_its_name() {
        let netstat = "TcpExt: SyncookiesSent ListenOverflows ListenDrops\n\
                       TcpExt: 0 17 19\n\
                       IpExt: InNoRoutes\n\
                       IpExt: 3\n";
        assert_eq!(tcp_ext(netstat, "ListenOverflows"), Some(17));
        assert_eq!(tcp_ext(netstat, "ListenDrops"), Some(19));
        assert_eq!(tcp_ext(netstat, "InNoRoutes"), None);
        assert!(
            listen_overflows().is_some(),
            "this kernel has /proc/net/netstat"
        );
    }

    // A command name with spaces and a closing parenthesis, as `comm` may hold.
    const STAT: &str = "4242 (rbg (ctl) x) S 1 4242 4242 0 -1 4194560 1513 0 0 0 250 75 0 0 \
                        20 0 9 0 12345 1000000 500 18446744073709551615";

    #[test]
    fn the_host_is_busy_for_all_but_its_idle_and_io_wait_time() {
        let stat = "cpu  100 20 30 1000 50 5 6 7 8 9\ncpu0 1 2 3 4 5 6 7 8 9 10\n";
        // user + nice + system + irq + softirq + steal = 168 ticks
        assert_eq!(
            busy_of_proc_stat(stat, 100.0),
            Some(Duration::from_millis(1680))
        );
        assert_eq!(busy_of_proc_stat("cpu0 1 2 3 4 5\n", 100.0), None);
        assert_eq!(busy_of_proc_stat("cpu 1 2 x 4 5\n", 100.0), None);
    }

    #[test]
    fn stat_lines_are_read_past_a_tricky_command_name() {
        assert_eq!(state_of_stat(STAT), Some('S'));
        let cpu = cpu_of_stat(STAT, 100.0).unwrap();
        assert_eq!(cpu.user, Duration::from_millis(2500));
        assert_eq!(cpu.system, Duration::from_millis(750));
        assert_eq!(cpu_of_stat("4242 (x) S 1", 100.0), None);
        assert_eq!(state_of_stat("no parenthesis"), None);
    }

    #[test]
    fn status_and_io_fields_are_read() {
        let status = "Name:\trbgctl\nVmPeak:\t  9000 kB\nVmRSS:\t    2048 kB\nThreads:\t9\n";
        assert_eq!(rss_of_status(status), Some(2 << 20));
        assert_eq!(rss_of_status("Name:\tzombie\n"), None);
        let io = "rchar: 10\nwchar: 20\nsyscr: 7\nsyscw: 5\nread_bytes: 0\n";
        assert_eq!(syscalls_of_io(io), Some(12));
        assert_eq!(syscalls_of_io("rchar: 1\n"), None);
    }

    #[test]
    fn this_process_is_readable() {
        let me = std::process::id();
        assert!(cpu_time(me).is_some());
        assert!(rss_bytes(me).is_some_and(|b| b > 0));
        assert!(open_files(me) > 0);
        assert_eq!(all_threads_stopped(me), Some(false));
        assert!(own_syscalls().is_some());
    }
}
