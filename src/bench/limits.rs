//! The machine's own limits, measured in the same run as the benchmark: one loopback TCP stream,
//! memcpy bandwidth, and request-response round trips over loopback.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// The two limits pool benchmarks report beside their figures: (loopback TCP GB/s, memcpy GB/s).
pub fn machine() -> std::io::Result<(f64, f64)> {
    Ok((loopback_tcp_gbps(1 << 30, 3)?, memcpy_gbps(256 << 20, 5)))
}

/// GB/s of one TCP stream over loopback (sender and receiver threads in this process), best of
/// `rounds` transfers of `bytes`.
pub fn loopback_tcp_gbps(bytes: usize, rounds: usize) -> std::io::Result<f64> {
    let mut best = 0.0f64;
    for _ in 0..rounds {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let receiver = std::thread::spawn(move || -> std::io::Result<Duration> {
            let (mut s, _) = listener.accept()?;
            let mut buf = vec![0u8; 1 << 20];
            let mut got = 0;
            let t0 = Instant::now();
            while got < bytes {
                let n = s.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            Ok(t0.elapsed())
        });
        let mut s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        let chunk = vec![7u8; 1 << 20];
        let mut sent = 0;
        while sent < bytes {
            let n = chunk.len().min(bytes - sent);
            s.write_all(&chunk[..n])?;
            sent += n;
        }
        drop(s);
        let elapsed = receiver
            .join()
            .map_err(|_| std::io::Error::other("receiver panicked"))??;
        best = best.max(bytes as f64 / elapsed.as_secs_f64() / 1e9);
    }
    Ok(best)
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
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src); // fault the pages in
    let mut best = 0.0f64;
    for _ in 0..rounds {
        let t0 = Instant::now();
        dst.copy_from_slice(&src);
        let e = t0.elapsed();
        std::hint::black_box(&dst);
        best = best.max(bytes as f64 / e.as_secs_f64() / 1e9);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_are_counted_and_every_thread_ends() {
        let rate = loopback_round_trips(3, Duration::from_millis(200)).unwrap();
        assert!(rate > 100.0, "{rate}");
    }
}
