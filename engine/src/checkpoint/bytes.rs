//! The little-endian, length-prefixed layout of the engine's checkpoint files (task state
//! files and the coordinator's part of `_metadata`): a writer that appends, and a reader that
//! checks every length against what is left, so that damaged bytes give an error naming the
//! file and the offset, never a panic.

/// Appends fields to a byte vector.
#[derive(Default)]
pub(crate) struct ByteWriter {
    pub(crate) out: Vec<u8>,
}

impl ByteWriter {
    pub(crate) fn u8(&mut self, value: u8) {
        self.out.push(value);
    }

    pub(crate) fn u32(&mut self, value: u32) {
        self.out.extend_from_slice(&value.to_le_bytes());
    }

    pub(crate) fn u64(&mut self, value: u64) {
        self.out.extend_from_slice(&value.to_le_bytes());
    }

    pub(crate) fn i64(&mut self, value: i64) {
        self.out.extend_from_slice(&value.to_le_bytes());
    }

    /// A length (`u64`) and the bytes.
    pub(crate) fn bytes(&mut self, bytes: &[u8]) {
        self.u64(bytes.len() as u64);
        self.out.extend_from_slice(bytes);
    }

    pub(crate) fn text(&mut self, text: &str) {
        self.bytes(text.as_bytes());
    }
}

/// Reads fields written by [`ByteWriter`]; `what` names the bytes in errors.
pub(crate) struct ByteReader<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'a str,
}

impl<'a> ByteReader<'a> {
    pub(crate) fn new(bytes: &'a [u8], what: &'a str) -> Self {
        ByteReader { bytes, at: 0, what }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.at == self.bytes.len()
    }

    fn take(&mut self, len: u64) -> Result<&'a [u8], String> {
        let left = (self.bytes.len() - self.at) as u64;
        if len > left {
            return Err(format!(
                "{} is truncated: {len} bytes wanted at offset {}, {left} left",
                self.what, self.at
            ));
        }
        let start = self.at;
        self.at += len as usize;
        Ok(&self.bytes[start..self.at])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self.take(N as u64)?.try_into().expect("N bytes"))
    }

    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, String> {
        self.array().map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self) -> Result<u64, String> {
        self.array().map(u64::from_le_bytes)
    }

    pub(crate) fn i64(&mut self) -> Result<i64, String> {
        self.array().map(i64::from_le_bytes)
    }

    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], String> {
        let len = self.u64()?;
        self.take(len)
    }

    pub(crate) fn text(&mut self) -> Result<String, String> {
        let at = self.at;
        let bytes = self.bytes()?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| format!("{} has text at offset {at} that is not UTF-8", self.what))
    }

    /// A count of items that each take at least `min_item` bytes: refused when the bytes left
    /// cannot hold that many, so a damaged count never makes a huge allocation.
    pub(crate) fn count(&mut self, min_item: u64) -> Result<usize, String> {
        let at = self.at;
        let count = self.u64()?;
        let left = (self.bytes.len() - self.at) as u64;
        if count.saturating_mul(min_item.max(1)) > left {
            return Err(format!(
                "{} has a count of {count} at offset {at} that the {left} bytes after it cannot hold",
                self.what
            ));
        }
        Ok(count as usize)
    }

    /// Checks the magic and version at the start.
    pub(crate) fn header(&mut self, magic: &[u8; 8], version: u32) -> Result<(), String> {
        self.header_versions(magic, version..=version).map(|_| ())
    }

    /// [`ByteReader::header`] of a format this build reads in several versions: the one found.
    pub(crate) fn header_versions(
        &mut self,
        magic: &[u8; 8],
        versions: std::ops::RangeInclusive<u32>,
    ) -> Result<u32, String> {
        let found = self.take(8)?;
        if found != magic {
            return Err(format!(
                "{} starts with {found:02x?}, not {:?}",
                self.what,
                String::from_utf8_lossy(magic)
            ));
        }
        let found = self.u32()?;
        if !versions.contains(&found) {
            let reads = if versions.start() == versions.end() {
                format!("version {}", versions.start())
            } else {
                format!("versions {} to {}", versions.start(), versions.end())
            };
            return Err(format!(
                "{} has format version {found}; this build reads {reads}",
                self.what
            ));
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Vec<u8> {
        let mut w = ByteWriter::default();
        w.out.extend_from_slice(b"WEIRTEST");
        w.u32(1);
        w.u8(7);
        w.i64(-3);
        w.u64(2);
        w.text("first");
        w.bytes(&[1, 2, 3]);
        w.out
    }

    fn read(bytes: &[u8]) -> Result<(u8, i64, Vec<String>), String> {
        let mut r = ByteReader::new(bytes, "the test bytes");
        r.header(b"WEIRTEST", 1)?;
        let a = r.u8()?;
        let b = r.i64()?;
        let n = r.count(8)?;
        let mut items = Vec::new();
        for _ in 0..n {
            items.push(format!("{:?}", r.bytes()?));
        }
        Ok((a, b, items))
    }

    #[test]
    fn fields_read_back() {
        let (a, b, items) = read(&sample()).unwrap();
        assert_eq!((a, b), (7, -3));
        assert_eq!(items, vec![format!("{:?}", b"first"), "[1, 2, 3]".into()]);
    }

    proptest! {
        /// Any cut or flipped byte gives a value or an error, never a panic or a huge
        /// allocation.
        #[test]
        fn damaged_bytes_never_panic(cut in 0usize..64, flip in 0usize..64, bit in 0u8..8) {
            let mut bytes = sample();
            if flip < bytes.len() {
                bytes[flip] ^= 1 << bit;
            }
            bytes.truncate(cut.min(bytes.len()));
            let _ = read(&bytes);
        }
    }
}
