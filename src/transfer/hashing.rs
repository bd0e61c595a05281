//! CRC-32C of many values at once, on several threads: the values are cut into pieces of at
//! most [`PIECE`] bytes, the pieces shared out between threads, and each value's CRC joined from
//! its pieces' (`crc32c_combine`). A store hashes this way every object it kept across a
//! restart, and what a writer put into its segment without sending a checksum (Mooncake's
//! Transfer Engine over RDMA: just after the put with `hash_mooncake_writes`, or at the next
//! start): one core hashing a 4 MiB value takes as long as a fast NIC moving it.

/// The most bytes one thread hashes as one piece.
pub const PIECE: usize = 1 << 20;

/// The CRC-32C of each of `values`, on at most `threads` threads (one when there is less than a
/// piece in all).
pub fn crc32c_many(values: &[&[u8]], threads: usize) -> Vec<u32> {
    let pieces: Vec<(usize, &[u8])> = values
        .iter()
        .enumerate()
        .flat_map(|(i, v)| v.chunks(PIECE).map(move |p| (i, p)))
        .collect();
    let threads = threads.clamp(1, pieces.len().max(1));
    let crcs: Vec<u32> = if threads == 1 {
        pieces
            .iter()
            .map(|(_, p)| crate::checksum::crc32c(p))
            .collect()
    } else {
        let per = pieces.len().div_ceil(threads);
        std::thread::scope(|s| {
            let handles: Vec<_> = pieces
                .chunks(per)
                .map(|share| {
                    s.spawn(move || {
                        share
                            .iter()
                            .map(|(_, p)| crate::checksum::crc32c(p))
                            .collect::<Vec<u32>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        })
    };
    let mut out = vec![0u32; values.len()];
    for ((i, piece), crc) in pieces.iter().zip(crcs) {
        out[*i] = crate::checksum::crc32c_combine(out[*i], crc, piece.len());
    }
    out
}

/// Threads a store hashes with: the machine's cores, at most eight.
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_hash_as_one_thread_hashes_them_whole() {
        let mut rng = fastrand::Rng::with_seed(7);
        let sizes = [
            0,
            1,
            4096,
            PIECE - 1,
            PIECE,
            PIECE + 1,
            3 * PIECE + 17,
            256 << 10,
        ];
        let values: Vec<Vec<u8>> = sizes
            .iter()
            .map(|&n| (0..n).map(|_| rng.u8(..)).collect())
            .collect();
        let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        let want: Vec<u32> = refs.iter().map(|v| crc32c::crc32c(v)).collect();
        for threads in [1, 2, 3, 8, 64] {
            assert_eq!(crc32c_many(&refs, threads), want, "{threads} threads");
        }
        assert!(crc32c_many(&[], 4).is_empty());
        assert_eq!(crc32c_many(&[&[]], 4), vec![0]);
    }
}
