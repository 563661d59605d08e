//! The keyed-state checkpoint format (`state/src/backend/keyed_snapshot.rs`): pinned byte by
//! byte, and damaged bytes — truncated, flipped, with lengths changed behind a recomputed
//! checksum — are errors, never panics.

mod restore_support;

use std::time::Duration;

use proptest::prelude::*;
use restore_support::*;
use weir_state::checksum::crc32;
use weir_state::{
    decode_keyed_snapshot, KeyGroup, ListStateDescriptor, MapStateDescriptor, StateCodec,
    StateErrorKind, StateTtlConfig, ValueStateDescriptor,
};

/// The format, byte by byte, as the module docs of `keyed_snapshot.rs` describe it: a change
/// to the encoder that would make old checkpoints unreadable fails here.
#[test]
fn the_format_is_pinned() {
    let ttl = StateTtlConfig::new(Duration::from_millis(500));
    let (source, _) = heap::<u64>(2, 1);
    let value = source
        .value_state(&ValueStateDescriptor::<u64>::new("v"))
        .unwrap();
    let map = source
        .map_state(&MapStateDescriptor::<u32, u64>::new("m").with_ttl(ttl))
        .unwrap();
    source.set_current_key(&7).unwrap();
    value.update(42).unwrap();
    source.set_current_namespace(3).unwrap();
    map.put(9, 10).unwrap();
    let bytes = checkpoint(&source);

    let text = |out: &mut Vec<u8>, bytes: &[u8]| {
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    };
    let key_group = KeyGroup::of(&7u64, MAX_PARALLELISM).0;
    assert!(key_group >= 64, "key 7 must belong to subtask 1");
    let mut expected = Vec::new();
    expected.extend_from_slice(b"WKST");
    expected.extend_from_slice(&1u32.to_le_bytes());
    expected.extend_from_slice(&MAX_PARALLELISM.to_le_bytes());
    expected.extend_from_slice(&64u32.to_le_bytes());
    expected.extend_from_slice(&127u32.to_le_bytes());
    expected.extend_from_slice(&START_MS.to_le_bytes());
    text(&mut expected, b"u64");
    text(&mut expected, b"u64");
    expected.extend_from_slice(&2u32.to_le_bytes());
    // ValueState<u64> "v": one block of one entry, flags 0.
    text(&mut expected, b"v");
    expected.push(0);
    text(&mut expected, b"u64");
    expected.push(0);
    expected.extend_from_slice(&1u32.to_le_bytes());
    let mut entry = vec![0];
    text(&mut entry, &7u64.encode().unwrap());
    text(&mut entry, &42u64.encode().unwrap());
    expected.extend_from_slice(&key_group.to_le_bytes());
    expected.extend_from_slice(&1u32.to_le_bytes());
    expected.extend_from_slice(&(entry.len() as u64).to_le_bytes());
    expected.extend_from_slice(&entry);
    // MapState<u32, u64> "m" with TTL: namespace, user key and expiry (flags 1 | 2 | 4).
    text(&mut expected, b"m");
    expected.push(2);
    text(&mut expected, b"u64");
    text(&mut expected, b"u32");
    expected.push(1);
    expected.extend_from_slice(&1u32.to_le_bytes());
    let mut entry = vec![7];
    text(&mut entry, &7u64.encode().unwrap());
    text(&mut entry, &3u64.encode().unwrap());
    text(&mut entry, &9u32.encode().unwrap());
    text(&mut entry, &10u64.encode().unwrap());
    entry.extend_from_slice(&(START_MS + 500).to_le_bytes());
    expected.extend_from_slice(&key_group.to_le_bytes());
    expected.extend_from_slice(&1u32.to_le_bytes());
    expected.extend_from_slice(&(entry.len() as u64).to_le_bytes());
    expected.extend_from_slice(&entry);
    let checksum = crc32(&expected);
    expected.extend_from_slice(&checksum.to_le_bytes());
    assert_eq!(bytes, expected);
}

/// A checkpoint with some of everything, for the damage tests.
fn sample_checkpoint() -> Vec<u8> {
    let ttl = StateTtlConfig::new(Duration::from_secs(60));
    let (source, _) = heap::<u64>(2, 1);
    let keys: Vec<u64> = (0..40).filter(|&key| owner(key, 2) == 1).collect();
    write_all(&source, keys.iter().copied(), &[None, Some(5)]);
    let timed = source
        .list_state(&ListStateDescriptor::<String>::new("timed").with_ttl(ttl))
        .unwrap();
    for key in keys {
        source.set_current_key(&key).unwrap();
        timed.add(format!("t{key}")).unwrap();
    }
    checkpoint(&source)
}

/// Restores `bytes` and registers and reads every state; what went wrong, if anything. Must
/// never panic.
fn restore_and_read(bytes: &[u8]) -> Result<(), weir_state::StateError> {
    let (backend, _) = heap::<u64>(1, 0);
    backend.restore(&[bytes])?;
    let ttl = StateTtlConfig::new(Duration::from_secs(60));
    backend.list_state(&ListStateDescriptor::<String>::new("timed").with_ttl(ttl))?;
    backend.value_state(&value_d())?;
    backend.list_state(&list_d())?;
    backend.map_state(&map_d())?;
    backend.reducing_state(&reducing_d())?;
    backend.aggregating_state(&aggregating_d())?;
    let _ = dump(&backend);
    Ok(())
}

#[test]
fn the_sample_checkpoint_restores() {
    let bytes = sample_checkpoint();
    restore_and_read(&bytes).unwrap();
    assert_eq!(decode_keyed_snapshot(&bytes).unwrap().states.len(), 6);
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample_checkpoint();
    for cut in 0..bytes.len() {
        let err = restore_and_read(&bytes[..cut]).expect_err("a truncated snapshot must not load");
        assert!(
            matches!(err.kind(), StateErrorKind::CorruptSnapshot { .. }),
            "cut at {cut}: {err}"
        );
        assert!(decode_keyed_snapshot(&bytes[..cut]).is_err());
    }
}

/// Offsets of the `u32` length fields of the first state's first block, found by walking the
/// format: the header, the state header, the block header and its first entry.
fn length_fields(bytes: &[u8]) -> Vec<usize> {
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let mut at = 4 + 4 + 4 + 8 + 8; // magic, version, max parallelism, key groups, time
    let mut fields = Vec::new();
    for _ in 0..2 {
        fields.push(at); // key type, namespace type
        at += 4 + u32_at(at);
    }
    at += 4; // state count
    fields.push(at); // name
    at += 4 + u32_at(at);
    let kind = bytes[at];
    at += 1;
    fields.push(at); // value type
    at += 4 + u32_at(at);
    if kind == 2 {
        fields.push(at);
        at += 4 + u32_at(at);
    }
    at += 1 + 4; // TTL flag, block count
    fields.push(at + 4); // entry count
    at += 16; // key group, entry count, block length
    at += 1; // flags
    fields.push(at); // key length
    fields
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any flipped byte is caught (by the checksum, if not before).
    #[test]
    fn a_flipped_byte_is_an_error(position in any::<prop::sample::Index>(), mask in 1u8..) {
        let mut bytes = sample_checkpoint();
        let at = position.index(bytes.len());
        bytes[at] ^= mask;
        prop_assert!(restore_and_read(&bytes).is_err());
        prop_assert!(decode_keyed_snapshot(&bytes).is_err());
    }

    /// A flipped byte with the checksum made to match: the structure checks and the validated
    /// decoding must answer, with an error or with data, but never panic.
    #[test]
    fn damage_that_passes_the_checksum_never_panics(
        position in any::<prop::sample::Index>(),
        mask in 1u8..,
    ) {
        let mut bytes = sample_checkpoint();
        let at = position.index(bytes.len() - 4);
        bytes[at] ^= mask;
        let bytes = with_checksum(bytes);
        let _ = restore_and_read(&bytes);
        let _ = decode_keyed_snapshot(&bytes);
    }

    /// A damaged length, even with a matching checksum, is an error.
    #[test]
    fn a_damaged_length_is_an_error(
        field in any::<prop::sample::Index>(),
        byte in 0usize..4,
        mask in 1u8..,
    ) {
        let mut bytes = sample_checkpoint();
        let fields = length_fields(&bytes);
        bytes[fields[field.index(fields.len())] + byte] ^= mask;
        let bytes = with_checksum(bytes);
        prop_assert!(restore_and_read(&bytes).is_err());
    }
}
