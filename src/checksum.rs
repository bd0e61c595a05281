//! CRC-32C (Castagnoli), the checksum every value the pool keeps is recorded with: computed by
//! writers, checked by readers, stores and the disk tier, and by the store on the bytes
//! Mooncake's Transfer Engine writes as they arrive. One implementation for the house
//! (`crc-fast`: carry-less multiplication folding, AVX-512 where the CPU has it, about four
//! times the SSE4.2 `crc32` instruction's rate on a piece still in cache), so every site gets
//! the same speed and the same values.

use crc_fast::{CrcAlgorithm, Digest};

/// The CRC-32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// The CRC-32C of the bytes whose CRC-32C is `crc` followed by `data` (starting from 0 is
/// [`crc32c`]), so a value is hashed piece by piece as it comes.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    // The register holds the CRC before its final inversion.
    let mut digest = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    digest.update(data);
    digest.finalize() as u32
}

/// The CRC-32C of `a` followed by `b`, from `a`'s CRC, `b`'s and `b`'s length.
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    crc_fast::checksum_combine(
        CrcAlgorithm::Crc32Iscsi,
        u64::from(crc_a),
        u64::from(crc_b),
        len_b as u64,
    ) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_value_and_an_independent_implementation_agree() {
        // The catalogue's check value of CRC-32/ISCSI.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
        let mut rng = fastrand::Rng::with_seed(3);
        for len in [1usize, 7, 64, 255, 4096, 65_537, 1 << 20] {
            let v: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            assert_eq!(crc32c(&v), ::crc32c::crc32c(&v), "{len} bytes");
        }
    }

    #[test]
    fn pieces_appended_or_combined_hash_as_the_whole() {
        let mut rng = fastrand::Rng::with_seed(5);
        let v: Vec<u8> = (0..300_000).map(|_| rng.u8(..)).collect();
        let whole = crc32c(&v);
        for cut in [0usize, 1, 4095, 65_536, 299_999, 300_000] {
            let (a, b) = v.split_at(cut);
            assert_eq!(crc32c_append(crc32c(a), b), whole, "appended at {cut}");
            assert_eq!(
                crc32c_combine(crc32c(a), crc32c(b), b.len()),
                whole,
                "combined at {cut}"
            );
        }
    }
}
