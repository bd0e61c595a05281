//! The machine's own limits, measured in the same run as the benchmark: one loopback TCP stream,
//! memcpy bandwidth, and request-response round trips over loopback.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// The two limits pool benchmarks report beside their figures: (loopback TCP GB/s, memcpy GB/s),
/// each the best of several runs.
pub fn machine() -> std::io::Result<(f64, f64)> {
    let m = machine_spread()?;
    Ok((m.loopback.best, m.memcpy.best))
}

/// The machine's limits with the spread of their runs: the reference swings more from run to run
/// (and machine to machine) than the product does, so figures are judged against the best of
/// several runs, and the spread is reported beside it.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Machine {
    /// One loopback TCP stream, GB/s.
    pub loopback: Spread,
    /// memcpy between two faulted-in buffers, GB/s.
    pub memcpy: Spread,
}

/// Runs of one measurement: the best, the median and the worst, and how many.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Spread {
    pub best: f64,
    pub median: f64,
    pub worst: f64,
    pub runs: usize,
}

impl Spread {
    /// The spread of `samples` (those not finite left out).
    pub fn of(samples: &[f64]) -> Spread {
        let mut s: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if s.is_empty() {
            return Spread::default();
        }
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = match n % 2 {
            1 => s[n / 2],
            _ => (s[n / 2 - 1] + s[n / 2]) / 2.0,
        };
        Spread {
            best: s[n - 1],
            median,
            worst: s[0],
            runs: n,
        }
    }

    /// `6.29 GB/s (median 6.10, worst 5.88 of 7 runs)`.
    pub fn describe(&self) -> String {
        format!(
            "{:.2} GB/s (median {:.2}, worst {:.2} of {} runs)",
            self.best, self.median, self.worst, self.runs
        )
    }
}

/// Both limits, 7 runs each.
pub fn machine_spread() -> std::io::Result<Machine> {
    Ok(Machine {
        loopback: loopback_tcp(256 << 20, 7)?,
        memcpy: memcpy(256 << 20, 7),
    })
}

/// GB/s of one TCP stream over loopback (sender and receiver threads in this process), best of
/// `rounds` transfers of `bytes`.
pub fn loopback_tcp_gbps(bytes: usize, rounds: usize) -> std::io::Result<f64> {
    Ok(loopback_tcp(bytes, rounds)?.best)
}

/// One TCP stream over loopback, `rounds` transfers of `bytes`, with the data path's socket
/// options on both ends (`TCP_NODELAY`) and reads of 1 MiB straight into one buffer, as the
/// client's and the store's reads of a value go.
pub fn loopback_tcp(bytes: usize, rounds: usize) -> std::io::Result<Spread> {
    loopback_tcp_streams(1, bytes, rounds)
}

/// `streams` such streams at once (a sender and a receiver thread each), `rounds` times, each
/// stream carrying `bytes`: their summed GB/s, from the first byte sent to the last received.
/// The limit of several client threads, each on its own connection.
pub fn loopback_tcp_streams(
    streams: usize,
    bytes: usize,
    rounds: usize,
) -> std::io::Result<Spread> {
    let mut runs = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let mut pairs = Vec::with_capacity(streams);
        for _ in 0..streams.max(1) {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            let sender = TcpStream::connect(listener.local_addr()?)?;
            let (receiver, _) = listener.accept()?;
            sender.set_nodelay(true)?;
            receiver.set_nodelay(true)?;
            pairs.push((sender, receiver));
        }
        let start = std::sync::Barrier::new(2 * pairs.len() + 1);
        let elapsed = std::thread::scope(|scope| -> std::io::Result<Duration> {
            let start = &start;
            let mut receivers = Vec::with_capacity(pairs.len());
            for (mut tx, mut rx) in pairs {
                scope.spawn(move || -> std::io::Result<()> {
                    let chunk = vec![7u8; 1 << 20];
                    start.wait();
                    let mut sent = 0;
                    while sent < bytes {
                        let n = chunk.len().min(bytes - sent);
                        tx.write_all(&chunk[..n])?;
                        sent += n;
                    }
                    Ok(())
                });
                receivers.push(scope.spawn(move || -> std::io::Result<Instant> {
                    let mut buf = vec![0u8; 1 << 20];
                    start.wait();
                    let mut got = 0;
                    while got < bytes {
                        match rx.read(&mut buf)? {
                            0 => break,
                            n => got += n,
                        }
                    }
                    Ok(Instant::now())
                }));
            }
            start.wait();
            let t0 = Instant::now();
            let mut last = t0;
            for r in receivers {
                let done = r
                    .join()
                    .map_err(|_| std::io::Error::other("receiver panicked"))??;
                last = last.max(done);
            }
            Ok(last - t0)
        })?;
        runs.push((bytes * streams.max(1)) as f64 / elapsed.as_secs_f64() / 1e9);
    }
    Ok(Spread::of(&runs))
}

/// Round trips per second that `clients` threads, each on its own connection and waiting for
/// each answer, get from an echo server of 64-byte messages with a thread per connection, over
/// `time`: the most any request-response server can answer such clients on this machine.
pub fn loopback_round_trips(clients: usize, time: Duration) -> std::io::Result<f64> {
    const MSG: usize = 64;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let server = std::thread::spawn(move || {
        let mut echoes = Vec::new();
        for _ in 0..clients {
            let Ok((mut s, _)) = listener.accept() else {
                break;
            };
            echoes.push(std::thread::spawn(move || {
                let _ = s.set_nodelay(true);
                let mut buf = [0u8; MSG];
                while s.read_exact(&mut buf).is_ok() && s.write_all(&buf).is_ok() {}
            }));
        }
        for e in echoes {
            let _ = e.join();
        }
    });
    let mut streams = Vec::with_capacity(clients);
    for _ in 0..clients {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        streams.push(s);
    }
    let stop = Instant::now() + time;
    let workers: Vec<_> = streams
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || -> std::io::Result<u64> {
                let mut buf = [7u8; MSG];
                let mut n = 0u64;
                while Instant::now() < stop {
                    s.write_all(&buf)?;
                    s.read_exact(&mut buf)?;
                    n += 1;
                }
                Ok(n)
            })
        })
        .collect();
    let t0 = Instant::now();
    let mut total = 0u64;
    for w in workers {
        total += w
            .join()
            .map_err(|_| std::io::Error::other("client panicked"))??;
    }
    let elapsed = t0.elapsed();
    let _ = server.join();
    Ok(total as f64 / elapsed.as_secs_f64())
}

/// GB/s of `copy_from_slice` between two pre-faulted buffers of `bytes`, best of `rounds`.
pub fn memcpy_gbps(bytes: usize, rounds: usize) -> f64 {
    memcpy(bytes, rounds).best
}

/// `copy_from_slice` between two pre-faulted buffers of `bytes`, `rounds` times.
pub fn memcpy(bytes: usize, rounds: usize) -> Spread {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src); // fault the pages in
    let runs: Vec<f64> = (0..rounds)
        .map(|_| {
            let t0 = Instant::now();
            dst.copy_from_slice(&src);
            let e = t0.elapsed();
            std::hint::black_box(&dst);
            bytes as f64 / e.as_secs_f64() / 1e9
        })
        .collect();
    Spread::of(&runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spread_is_the_best_the_median_and_the_worst_of_its_runs() {
        let s = Spread::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.best, s.median, s.worst, s.runs), (3.0, 2.0, 1.0, 3));
        let s = Spread::of(&[4.0, 1.0, 2.0, 3.0, f64::NAN]);
        assert_eq!((s.best, s.median, s.worst, s.runs), (4.0, 2.5, 1.0, 4));
        assert_eq!(Spread::of(&[]), Spread::default());
        assert_eq!(
            Spread::of(&[6.29, 6.1, 5.88]).describe(),
            "6.29 GB/s (median 6.10, worst 5.88 of 3 runs)"
        );
    }

    #[test]
    fn several_streams_at_once_are_summed_and_every_thread_ends() {
        let s = loopback_tcp_streams(3, 4 << 20, 2).unwrap();
        assert_eq!(s.runs, 2);
        assert!(s.best > 0.0 && s.worst > 0.0 && s.best >= s.worst, "{s:?}");
    }

    #[test]
    fn round_trips_are_counted_and_every_thread_ends() {
        let rate = loopback_round_trips(3, Duration::from_millis(200)).unwrap();
        assert!(rate > 100.0, "{rate}");
    }
}
