//! CRC-32 (IEEE 802.3: reflected, polynomial `0xEDB88320`, as zlib and `cksum -a crc32b`
//! compute it), the checksum of every file a checkpoint writes. Part of the checkpoint format:
//! never change it.

/// A CRC-32 computed over bytes handed in pieces: `crc32fast`, which folds 64 bytes at a time
/// with carry-less multiplication (PCLMULQDQ) where the CPU has it — verifying a restored
/// checkpoint reads every byte of it — and slices by 16 elsewhere.
#[derive(Clone, Debug, Default)]
pub struct Crc32(crc32fast::Hasher);

impl Crc32 {
    /// Adds `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The checksum of everything added.
    pub fn finish(self) -> u32 {
        self.0.finalize()
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
        fn computes_the_bitwise_crc(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
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
