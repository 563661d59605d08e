//! The writes a RocksDB instance's write-back cache holds at a cut: its dirty entries, which
//! RocksDB's own files lack.
//!
//! A cut ([`super::RocksDbInstance::cut`]) copies them into a file of its checkpoint,
//! [`HELD_WRITES_FILE`], instead of writing them back to RocksDB at the barrier (a memtable
//! insert per entry, 0.65 µs each: 136 ms for q5's 210 K dirty entries); the copy is made
//! after the barrier, in pieces, with a change to an entry not yet copied copying it first
//! (`cache.rs`, "Cuts"). They stay dirty
//! in the cache, and reach RocksDB as they would without checkpoints (evicted, or past the
//! dirty bound), so a window pane created, fired and deleted between two evictions still
//! never reaches RocksDB. An instance opened on a directory that holds the file writes them
//! into RocksDB and removes it, so the state is whole again.
//!
//! Layout: the magic `WEIRHWR\0`, the version (u32), then records to the end, each a tag byte
//! and its fields (u32 little-endian lengths and indices):
//! - `0` a column family: its name (length, bytes); the next index;
//! - `1` a put: the column family's index, the key (length, bytes), the value frame (length,
//!   bytes);
//! - `2` a delete: the column family's index, the key (length, bytes).
//!
//! Every column family comes before the first entry.

/// The file of a checkpoint that holds a cut's held writes.
pub const HELD_WRITES_FILE: &str = "WEIR-HELD-WRITES";

const MAGIC: &[u8; 8] = b"WEIRHWR\0";
const VERSION: u32 = 1;

const COLUMN: u8 = 0;
const PUT: u8 = 1;
const DELETE: u8 = 2;

/// Held writes being encoded (see the module docs).
pub(crate) struct HeldWrites {
    bytes: Vec<u8>,
    columns: u32,
    entries: usize,
}

impl Default for HeldWrites {
    fn default() -> Self {
        let mut bytes = Vec::with_capacity(64 << 10);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&VERSION.to_le_bytes());
        HeldWrites {
            bytes,
            columns: 0,
            entries: 0,
        }
    }
}

impl HeldWrites {
    /// Adds column family `name`; its index. Every column family comes before any entry.
    pub(crate) fn column(&mut self, name: &str) -> u32 {
        debug_assert_eq!(self.entries, 0, "a column family after an entry");
        self.bytes.push(COLUMN);
        self.field(name.as_bytes());
        self.columns += 1;
        self.columns - 1
    }

    /// Adds a put of `value` (`Some`) or a delete of `key` in column family `column`.
    pub(crate) fn entry(&mut self, column: u32, key: &[u8], value: Option<&[u8]>) {
        self.bytes.push(if value.is_some() { PUT } else { DELETE });
        self.bytes.extend_from_slice(&column.to_le_bytes());
        self.field(key);
        if let Some(value) = value {
            self.field(value);
        }
        self.entries += 1;
    }

    /// Entries added.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> usize {
        self.entries
    }

    /// The encoded file.
    #[cfg(test)]
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Bytes encoded and not yet moved out ([`HeldWrites::drain_into`]).
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Moves the bytes encoded since the last call (the magic and version first) to the end
    /// of `out`: the file in pieces.
    pub(crate) fn drain_into(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.bytes);
        self.bytes.clear();
    }

    fn field(&mut self, bytes: &[u8]) {
        self.bytes
            .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(bytes);
    }
}

/// Hands every entry of held-writes file `bytes` to `write`, in order: its column family's
/// name, key, and value frame (`None`: a delete). Fails with what is wrong with the file, or
/// with `write`'s error.
pub(crate) fn for_each<E>(
    bytes: &[u8],
    mut write: impl FnMut(&str, &[u8], Option<&[u8]>) -> Result<(), E>,
) -> Result<Result<(), E>, String> {
    let mut reader = Reader { bytes, at: 0 };
    if reader.take(MAGIC.len())? != MAGIC {
        return Err("it does not start with the held-writes magic".into());
    }
    let version = reader.u32()?;
    if version != VERSION {
        return Err(format!(
            "it is of version {version}; this build reads version {VERSION}"
        ));
    }
    let mut columns: Vec<&str> = Vec::new();
    while reader.at < bytes.len() {
        let tag = reader.take(1)?[0];
        match tag {
            COLUMN => {
                let name = std::str::from_utf8(reader.field()?)
                    .map_err(|_| format!("column family {} is not UTF-8", columns.len()))?;
                columns.push(name);
            }
            PUT | DELETE => {
                let index = reader.u32()?;
                let column = *columns.get(index as usize).ok_or_else(|| {
                    format!("an entry names column family {index} of {}", columns.len())
                })?;
                let key = reader.field()?;
                let value = if tag == PUT {
                    Some(reader.field()?)
                } else {
                    None
                };
                if let Err(error) = write(column, key, value) {
                    return Ok(Err(error));
                }
            }
            other => {
                return Err(format!(
                    "byte {} holds the record tag {other}; tags are 0, 1 and 2",
                    reader.at - 1
                ))
            }
        }
    }
    Ok(Ok(()))
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(len)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| {
                format!(
                    "it ends at byte {} inside a record that needs {len} bytes from byte {}",
                    self.bytes.len(),
                    self.at
                )
            })?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u32(&mut self) -> Result<u32, String> {
        let mut le = [0; 4];
        le.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(le))
    }

    fn field(&mut self) -> Result<&'a [u8], String> {
        let len = self.u32()? as usize;
        self.take(len)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    type Entry = (u8, Vec<u8>, Option<Vec<u8>>);
    /// A decoded entry: column family, key, value.
    type Decoded = (String, Vec<u8>, Option<Vec<u8>>);

    fn decoded(bytes: &[u8]) -> Result<Vec<Decoded>, String> {
        let mut out = Vec::new();
        for_each(bytes, |column, key, value| {
            out.push((column.to_string(), key.to_vec(), value.map(<[u8]>::to_vec)));
            Ok::<(), ()>(())
        })?
        .unwrap();
        Ok(out)
    }

    proptest! {
        /// Whatever is encoded decodes to the same entries, in order; a file cut short reads
        /// as fewer entries (at a record's end) or fails, never as other entries. (A checkpoint's
        /// files are checked against their CRC-32 before a restore reads them.)
        #[test]
        fn held_writes_round_trip(
            columns in proptest::collection::vec("[a-z:]{1,12}", 1..4),
            entries in proptest::collection::vec(
                (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..40),
                 proptest::option::of(proptest::collection::vec(any::<u8>(), 0..80))),
                0..40,
            ),
        ) {
            let mut held = HeldWrites::default();
            let indices: Vec<u32> = columns.iter().map(|name| held.column(name)).collect();
            let entries: Vec<Entry> = entries;
            for (column, key, value) in &entries {
                let index = indices[*column as usize % indices.len()];
                held.entry(index, key, value.as_deref());
            }
            prop_assert_eq!(held.entries(), entries.len());
            let bytes = held.into_bytes();
            let expected: Vec<Decoded> = entries
                .iter()
                .map(|(column, key, value)| {
                    (columns[*column as usize % columns.len()].clone(), key.clone(), value.clone())
                })
                .collect();
            prop_assert_eq!(&decoded(&bytes).unwrap(), &expected);
            for len in [bytes.len().saturating_sub(1), bytes.len() / 2, 3] {
                if len < bytes.len() {
                    let cut = decoded(&bytes[..len]);
                    // A cut at a record boundary reads as the records before it; inside one
                    // it fails.
                    if let Ok(cut) = cut {
                        prop_assert_eq!(&cut[..], &expected[..cut.len()]);
                    }
                }
            }
        }
    }

    #[test]
    fn a_bad_file_is_named_for_what_is_wrong() {
        assert!(decoded(b"NOTHELD!\x01\0\0\0")
            .unwrap_err()
            .contains("magic"));
        let mut held = HeldWrites::default();
        let column = held.column("value:op:v");
        held.entry(column, b"k", Some(b"v"));
        let mut bytes = held.into_bytes();
        bytes[8] = 9;
        assert!(decoded(&bytes).unwrap_err().contains("version 9"));
        bytes[8] = 1;
        let last = bytes.len() - 1;
        assert!(decoded(&bytes[..last])
            .unwrap_err()
            .contains("ends at byte"));
        bytes.push(7);
        assert!(decoded(&bytes).unwrap_err().contains("tag 7"));
    }
}
