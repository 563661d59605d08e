//! CRC-32 (IEEE 802.3: reflected, polynomial `0xEDB88320`, as zlib and `cksum -a crc32b`
//! compute it), the checksum of every file a checkpoint writes. Part of the checkpoint format:
//! never change it.

/// Lookup tables for slicing-by-8: `TABLES[0]` is the classic table (one entry per byte
/// value); `TABLES[k][b]` is the CRC of byte `b` followed by `k` zero bytes, so that eight
/// bytes are folded with eight lookups and no dependency between them.
const TABLES: [[u32; 256]; 8] = {
    let mut tables = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                0xEDB8_8320 ^ (crc >> 1)
            } else {
                crc >> 1
            };
            bit += 1;
        }
        tables[0][i] = crc;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let previous = tables[k - 1][i];
            tables[k][i] = (previous >> 8) ^ tables[0][(previous & 0xff) as usize];
            i += 1;
        }
        k += 1;
    }
    tables
};

/// A CRC-32 computed over bytes handed in pieces.
#[derive(Clone, Copy, Debug)]
pub struct Crc32(u32);

impl Default for Crc32 {
    fn default() -> Self {
        Crc32(!0)
    }
}

impl Crc32 {
    /// Adds `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        let mut crc = self.0;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let low = crc ^ u32::from_le_bytes(chunk[..4].try_into().expect("4 bytes"));
            let high = u32::from_le_bytes(chunk[4..].try_into().expect("4 bytes"));
            crc = TABLES[7][(low & 0xff) as usize]
                ^ TABLES[6][((low >> 8) & 0xff) as usize]
                ^ TABLES[5][((low >> 16) & 0xff) as usize]
                ^ TABLES[4][(low >> 24) as usize]
                ^ TABLES[3][(high & 0xff) as usize]
                ^ TABLES[2][((high >> 8) & 0xff) as usize]
                ^ TABLES[1][((high >> 16) & 0xff) as usize]
                ^ TABLES[0][(high >> 24) as usize];
        }
        for &byte in chunks.remainder() {
            crc = TABLES[0][((crc ^ u32::from(byte)) & 0xff) as usize] ^ (crc >> 8);
        }
        self.0 = crc;
    }

    /// The checksum of everything added.
    pub fn finish(self) -> u32 {
        !self.0
    }
}

/// The CRC-32 of `bytes`.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = Crc32::default();
    crc.update(bytes);
    crc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    /// The CRC one byte at a time, straight from the polynomial: what the tables must give.
    fn bitwise(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &byte in bytes {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    0xEDB8_8320 ^ (crc >> 1)
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    proptest! {
        #[test]
        fn slicing_by_eight_computes_the_bitwise_crc(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            prop_assert_eq!(crc32(&bytes), bitwise(&bytes));
        }

        #[test]
        fn pieces_sum_like_the_whole(bytes in proptest::collection::vec(any::<u8>(), 0..300), cut in 0usize..300) {
            let cut = cut.min(bytes.len());
            let mut crc = Crc32::default();
            crc.update(&bytes[..cut]);
            crc.update(&bytes[cut..]);
            prop_assert_eq!(crc.finish(), crc32(&bytes));
        }
    }
}
