//! FNV-1a, the one stable hash of the house: the same input hashes the same in every process,
//! release and platform (std's `DefaultHasher` promises neither). Used where a hash is shared
//! across processes: revision names (operator), rendezvous picks (router), token ids (engine).
//! And [`hex`], how digests are written out.

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0100_0000_01b3;

/// 64-bit FNV-1a, fed in pieces.
#[derive(Clone, Copy, Debug)]
pub struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64(OFFSET)
    }
}

impl Fnv64 {
    /// The hasher at FNV-1a's offset basis.
    pub fn new() -> Fnv64 {
        Fnv64::default()
    }

    /// Feeds bytes, one at a time.
    pub fn write(&mut self, bytes: &[u8]) -> &mut Fnv64 {
        for b in bytes {
            self.mix(*b as u64);
        }
        self
    }

    /// Feeds one whole word in a single step (faster than its bytes; a different hash).
    pub fn mix(&mut self, word: u64) -> &mut Fnv64 {
        self.0 ^= word;
        self.0 = self.0.wrapping_mul(PRIME);
        self
    }

    /// The hash of the bytes written.
    pub fn finish(&self) -> u64 {
        self.0
    }
}

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    Fnv64::new().write(bytes).finish()
}

/// `bytes` in lower-case hexadecimal, two digits a byte.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &x in bytes {
        s.push(DIGITS[(x >> 4) as usize] as char);
        s.push(DIGITS[(x & 15) as usize] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_two_lower_case_digits_a_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(hex(&[]), "");
    }

    #[test]
    fn matches_the_published_fnv1a_vectors() {
        // From the FNV reference test suite.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
