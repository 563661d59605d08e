//! The RocksDB key layout.
//!
//! ```text
//! key group   u16, big-endian            sorts (and range-deletes) by key group
//! key         varint length, bytes       the StateCodec encoding of the key
//! namespace   0x00                       no namespace
//!             0x01, varint length, bytes the StateCodec encoding of the namespace
//! user key    bytes (MapState only)      the StateCodec encoding of the map key, to the end
//! ```
//!
//! Lengths are LEB128 varints. Because key and namespace are length-prefixed, the bytes up to
//! the end of the namespace are a prefix of exactly the entries of one `(key, namespace)`, so a
//! map is read with a prefix scan, and every key group is one contiguous range.

use crate::key_group::{KeyGroup, KeyGroupRange};

/// The largest supported max parallelism: key groups must fit the two-byte prefix, and
/// `end + 1` of a range must too (Flink's limit is the same, 2^15).
pub const MAX_PARALLELISM_LIMIT: u32 = 1 << 15;

const VOID_NAMESPACE: u8 = 0;
const NAMESPACE: u8 = 1;

fn write_varint(out: &mut Vec<u8>, mut value: usize) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn read_varint(bytes: &[u8]) -> Option<(usize, &[u8])> {
    let mut value = 0usize;
    for (index, &byte) in bytes.iter().enumerate().take(10) {
        value |= usize::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Some((value, &bytes[index + 1..]));
        }
    }
    None
}

/// Appends the key group and the encoded key.
pub(crate) fn write_key(out: &mut Vec<u8>, key_group: KeyGroup, encoded_key: &[u8]) {
    out.extend_from_slice(&(key_group.0 as u16).to_be_bytes());
    write_varint(out, encoded_key.len());
    out.extend_from_slice(encoded_key);
}

/// Appends the marker of "no namespace".
pub(crate) fn write_void_namespace(out: &mut Vec<u8>) {
    out.push(VOID_NAMESPACE);
}

/// Appends an encoded namespace.
pub(crate) fn write_namespace(out: &mut Vec<u8>, encoded_namespace: &[u8]) {
    out.push(NAMESPACE);
    write_varint(out, encoded_namespace.len());
    out.extend_from_slice(encoded_namespace);
}

/// The parts of a stored key, still encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateKeyParts<'a> {
    /// The key group.
    pub key_group: KeyGroup,
    /// The encoded key.
    pub key: &'a [u8],
    /// The encoded namespace, if any.
    pub namespace: Option<&'a [u8]>,
    /// Everything up to the end of the namespace: the prefix of this `(key, namespace)`.
    pub prefix_len: usize,
    /// The encoded map key (empty for other states).
    pub user_key: &'a [u8],
}

/// Splits a stored key into its parts, or `None` if it does not follow the layout.
pub fn split_key(bytes: &[u8]) -> Option<StateKeyParts<'_>> {
    let (group, rest) = bytes.split_first_chunk::<2>()?;
    let (key_len, rest) = read_varint(rest)?;
    let key = rest.get(..key_len)?;
    let rest = &rest[key_len..];
    let (&marker, rest) = rest.split_first()?;
    let (namespace, rest) = match marker {
        VOID_NAMESPACE => (None, rest),
        NAMESPACE => {
            let (len, rest) = read_varint(rest)?;
            (Some(rest.get(..len)?), &rest[len..])
        }
        _ => return None,
    };
    Some(StateKeyParts {
        key_group: KeyGroup(u32::from(u16::from_be_bytes(*group))),
        key,
        namespace,
        prefix_len: bytes.len() - rest.len(),
        user_key: rest,
    })
}

/// The `(key group, key, namespace)` part of a stored key: RocksDB's prefix extractor, so that
/// a memtable finds a value (or a map's entries) by hashing it. A key that does not follow the
/// layout is its own prefix.
pub(crate) fn state_prefix(bytes: &[u8]) -> &[u8] {
    match split_key(bytes) {
        Some(parts) => &bytes[..parts.prefix_len],
        None => bytes,
    }
}

/// Whether `bytes` follows the key layout (the domain of [`state_prefix`]).
pub(crate) fn has_state_prefix(bytes: &[u8]) -> bool {
    split_key(bytes).is_some()
}

/// The smallest key after every key that starts with `prefix` (`None`: no such bound).
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The key bounds `[start, end)` of a key-group range.
pub(crate) fn key_group_bounds(range: KeyGroupRange) -> ([u8; 2], [u8; 2]) {
    // Stored key groups are below MAX_PARALLELISM_LIMIT (checked when a backend is built), so
    // clamping there loses nothing and `end + 1` fits in two bytes.
    let start = range.start.min(MAX_PARALLELISM_LIMIT) as u16;
    let end = range.end.saturating_add(1).min(MAX_PARALLELISM_LIMIT) as u16;
    (start.to_be_bytes(), end.max(start).to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn build(group: u32, key: &[u8], namespace: Option<&[u8]>, user_key: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_key(&mut out, KeyGroup(group), key);
        match namespace {
            None => write_void_namespace(&mut out),
            Some(namespace) => write_namespace(&mut out, namespace),
        }
        out.extend_from_slice(user_key);
        out
    }

    proptest! {
        #[test]
        fn keys_split_back(group in 0u32..MAX_PARALLELISM_LIMIT,
                           key in proptest::collection::vec(any::<u8>(), 0..300),
                           namespace in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
                           user_key in proptest::collection::vec(any::<u8>(), 0..20)) {
            let bytes = build(group, &key, namespace.as_deref(), &user_key);
            let parts = split_key(&bytes).unwrap();
            prop_assert_eq!(parts.key_group, KeyGroup(group));
            prop_assert_eq!(parts.key, &key[..]);
            prop_assert_eq!(parts.namespace, namespace.as_deref());
            prop_assert_eq!(parts.user_key, &user_key[..]);
            prop_assert_eq!(parts.prefix_len, bytes.len() - user_key.len());
        }

        #[test]
        fn prefixes_of_different_pairs_do_not_nest(a in proptest::collection::vec(any::<u8>(), 0..8),
                                                  b in proptest::collection::vec(any::<u8>(), 0..8),
                                                  na in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..4)),
                                                  nb in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..4))) {
            prop_assume!((&a, &na) != (&b, &nb));
            let pa = build(3, &a, na.as_deref(), &[]);
            let pb = build(3, &b, nb.as_deref(), &[]);
            prop_assert!(!pb.starts_with(&pa) && !pa.starts_with(&pb));
        }
    }

    #[test]
    fn state_prefix_is_the_key_and_namespace() {
        let plain = build(3, b"key", None, &[]);
        assert_eq!(state_prefix(&plain), &plain[..]);
        let map_entry = build(3, b"key", Some(b"ns"), b"user key");
        let prefix = build(3, b"key", Some(b"ns"), &[]);
        assert_eq!(state_prefix(&map_entry), &prefix[..]);
        assert!(has_state_prefix(&map_entry));
        // Bounds of key-group scans are not state keys: their own prefix, out of the domain.
        assert_eq!(state_prefix(&[0, 5]), &[0, 5]);
        assert!(!has_state_prefix(&[0, 5]));
    }

    #[test]
    fn prefix_end_carries() {
        assert_eq!(prefix_end(&[1, 2, 0xff]), Some(vec![1, 3]));
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
    }

    #[test]
    fn key_group_bounds_cover_the_range() {
        let (start, end) = key_group_bounds(KeyGroupRange { start: 5, end: 9 });
        assert_eq!((start, end), ([0, 5], [0, 10]));
        let (_, end) = key_group_bounds(KeyGroupRange {
            start: 0,
            end: MAX_PARALLELISM_LIMIT - 1,
        });
        assert_eq!(end, [0x80, 0]);
    }
}
