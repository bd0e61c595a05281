//! The machine's own limits, measured in the same run as the benchmark: one loopback TCP stream
//! and memcpy bandwidth.

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
