//! Keyed snapshots as a chain: one full snapshot and the deltas written after it.
//!
//! An operator that knows which keys changed since its last checkpoint (the window operators'
//! own maps) need not write every key each time. It writes a full snapshot now and then, and in
//! between a **delta**: a keyed snapshot in the same format holding, for each key changed since
//! the previous link, every entry the key has now, and for each key removed since, an entry in
//! the state [`REMOVED_KEYS`]. A key a delta holds replaces all that earlier links hold of it.
//! The checkpoint lists the chain; [`merge_keyed_chain`] turns it back into the one full
//! snapshot it stands for, so a restore (at any parallelism) and a tool read it as any other.

use std::collections::{HashMap, HashSet};

use crate::backend::keyed_snapshot::{
    corrupt, parse, with_checksum, write_entry, write_header_raw, write_state_blocks, BlockEntries,
    ParsedSnapshot, StateHeader,
};
use crate::error::StateError;

/// The state of a delta whose entries are the keys removed since the previous link (value:
/// empty). Never in a full snapshot, nor in a merged one.
pub const REMOVED_KEYS: &str = "removed-keys";

/// The full keyed snapshot a chain stands for: `links[0]` a full snapshot, each later one a
/// delta over those before it (see the module docs). Every link must be of the same subtask
/// (key groups), max parallelism, key and namespace types; their state headers must agree.
pub fn merge_keyed_chain(links: &[&[u8]]) -> Result<Vec<u8>, StateError> {
    let count = links.len();
    let parsed: Vec<ParsedSnapshot<'_>> = links
        .iter()
        .enumerate()
        .map(|(index, bytes)| {
            parse(bytes, &|_| true).map_err(|problem| {
                corrupt(format!("link {index} of {count} of a chain: {problem}"))
            })
        })
        .collect::<Result<_, _>>()?;
    let Some(newest) = parsed.last() else {
        return Err(corrupt("a chain of no snapshots".into()));
    };
    let base = &parsed[0];
    if base
        .states
        .iter()
        .any(|state| state.header.name == REMOVED_KEYS)
    {
        return Err(corrupt(format!(
            "the first link of a chain holds '{REMOVED_KEYS}': it is a delta, not a full snapshot"
        )));
    }
    // The merged states, in the order they first appear, with their blocks' entries.
    let mut headers: Vec<&StateHeader> = Vec::new();
    for (index, link) in parsed.iter().enumerate() {
        let same = link.max_parallelism == base.max_parallelism
            && link.key_groups == base.key_groups
            && link.key_type == base.key_type
            && link.namespace_type == base.namespace_type;
        if !same {
            return Err(corrupt(format!(
                "link {index} of {count} of a chain is of key groups {}..={} of {} ({}, {}), \
                 the first of {}..={} of {} ({}, {})",
                link.key_groups.start,
                link.key_groups.end,
                link.max_parallelism,
                link.key_type,
                link.namespace_type,
                base.key_groups.start,
                base.key_groups.end,
                base.max_parallelism,
                base.key_type,
                base.namespace_type
            )));
        }
        for state in link.states.iter().filter(|s| s.header.name != REMOVED_KEYS) {
            match headers.iter().find(|h| h.name == state.header.name) {
                Some(known) if **known != state.header => {
                    return Err(corrupt(format!(
                        "state '{}' is {} in one link of a chain and {} in link {index}",
                        known.name,
                        known.describe(),
                        state.header.describe()
                    )))
                }
                Some(_) => {}
                None => headers.push(&state.header),
            }
        }
    }
    // Per state, per key group: entry count and entries.
    let mut merged: Vec<Vec<(u32, u32, Vec<u8>)>> = vec![Vec::new(); headers.len()];
    let state_index: HashMap<&str, usize> = headers
        .iter()
        .enumerate()
        .map(|(i, h)| (h.name.as_str(), i))
        .collect();
    for group in base.key_groups.start..=base.key_groups.end {
        // Keys a newer link decided: their entries in older links are gone.
        let mut decided: HashSet<&[u8]> = HashSet::new();
        for link in parsed.iter().rev() {
            let mut here: Vec<&[u8]> = Vec::new();
            for state in &link.states {
                let Some(block) = state.blocks.iter().find(|b| b.key_group == group) else {
                    continue;
                };
                let name = state.header.name.as_str();
                for entry in BlockEntries::new(block.bytes, block.entries, &state.header) {
                    let entry =
                        entry.map_err(|problem| corrupt(format!("state '{name}': {problem}")))?;
                    here.push(entry.key);
                    if name == REMOVED_KEYS || decided.contains(entry.key) {
                        continue;
                    }
                    let blocks = &mut merged[state_index[name]];
                    if blocks.last().is_none_or(|(g, _, _)| *g != group) {
                        blocks.push((group, 0, Vec::new()));
                    }
                    let (_, entries, out) = blocks.last_mut().expect("pushed");
                    write_entry(out, name, &entry)?;
                    *entries += 1;
                }
            }
            decided.extend(here);
        }
    }
    let mut out = Vec::new();
    with_checksum(&mut out, |out| {
        write_header_raw(
            out,
            base.max_parallelism,
            base.key_groups,
            newest.taken_at_ms,
            base.key_type,
            base.namespace_type,
            headers.len(),
        )?;
        for (header, blocks) in headers.iter().zip(&merged) {
            let blocks = blocks
                .iter()
                .map(|(group, entries, bytes)| (*group, *entries, bytes.as_slice()));
            write_state_blocks(out, header, blocks)?;
        }
        Ok(())
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::{
        KeyGroupRange, KeyedSnapshotEntries, KeyedSnapshotWriter, StateKind, StateValueCodec,
    };

    /// Per key: its list of values, and its single value (either may be absent).
    type Model = BTreeMap<u32, (Vec<u64>, Option<u64>)>;

    const GROUPS: KeyGroupRange = KeyGroupRange { start: 0, end: 31 };

    /// Writes the `keys` of `model` (a full snapshot: all of them), with removed ones marked.
    fn write(model: &Model, keys: &[u32], delta: bool) -> Vec<u8> {
        let codec = StateValueCodec::<u64>::of();
        let mut writer = KeyedSnapshotWriter::<u32, i64>::new(32, GROUPS, 7);
        let list = writer.add_state("list", StateKind::List, codec.value_type());
        let value = writer.add_state("value", StateKind::Value, codec.value_type());
        for key in keys {
            writer.set_key(key).unwrap();
            match model.get(key) {
                Some((elements, single)) => {
                    for element in elements {
                        writer.put(list, Some(&1), &codec, element).unwrap();
                    }
                    if let Some(single) = single {
                        writer.put(value, None, &codec, single).unwrap();
                    }
                }
                None if delta => writer.remove_key().unwrap(),
                None => {}
            }
        }
        let mut bytes = Vec::new();
        writer.finish(&mut bytes).unwrap();
        bytes
    }

    fn read(bytes: &[u8]) -> Model {
        let codec = StateValueCodec::<u64>::of();
        let entries = KeyedSnapshotEntries::<u32, i64>::read(&[bytes], 32, GROUPS).unwrap();
        assert!(entries.state_names().all(|name| name != REMOVED_KEYS));
        let mut model = Model::new();
        entries
            .for_each("list", StateKind::List, &codec, |key, _, element| {
                model.entry(*key).or_default().0.push(element);
                Ok(())
            })
            .unwrap();
        entries
            .for_each("value", StateKind::Value, &codec, |key, _, single| {
                assert!(model.entry(*key).or_default().1.replace(single).is_none());
                Ok(())
            })
            .unwrap();
        model
    }

    proptest! {
        /// A chain of a full snapshot and deltas of the keys changed (or removed) since the link
        /// before merges into the full snapshot of the last state.
        #[test]
        fn a_chain_merges_into_the_full_snapshot(
            rounds in proptest::collection::vec(
                proptest::collection::vec((0u32..40, 0u8..4, any::<u64>()), 0..30), 1..6),
        ) {
            let mut model = Model::new();
            let mut links = Vec::new();
            for (round, changes) in rounds.iter().enumerate() {
                let mut touched = Vec::new();
                for &(key, op, v) in changes {
                    match op {
                        0 => { model.remove(&key); }
                        1 => model.entry(key).or_default().0.push(v),
                        2 => model.entry(key).or_default().1 = Some(v),
                        _ => { model.insert(key, (vec![v, v / 2], None)); }
                    }
                    if !touched.contains(&key) {
                        touched.push(key);
                    }
                }
                if round == 0 {
                    let all: Vec<u32> = model.keys().copied().collect();
                    links.push(write(&model, &all, false));
                } else {
                    links.push(write(&model, &touched, true));
                }
                let refs: Vec<&[u8]> = links.iter().map(Vec::as_slice).collect();
                let merged = merge_keyed_chain(&refs).unwrap();
                prop_assert_eq!(read(&merged), model.clone());
            }
        }
    }

    #[test]
    fn a_chain_must_start_full_and_stay_one_subtasks() {
        let mut model = Model::new();
        model.insert(1, (vec![1], None));
        let full = write(&model, &[1], false);
        let delta = write(&Model::new(), &[1], true);
        let error = merge_keyed_chain(&[&delta]).unwrap_err().to_string();
        assert!(
            error.contains("it is a delta, not a full snapshot"),
            "{error}"
        );
        let mut other =
            KeyedSnapshotWriter::<u32, i64>::new(32, KeyGroupRange { start: 0, end: 15 }, 7);
        let _ = other.add_state(
            "list",
            StateKind::List,
            StateValueCodec::<u64>::of().value_type(),
        );
        let mut half = Vec::new();
        other.finish(&mut half).unwrap();
        let error = merge_keyed_chain(&[&full, &half]).unwrap_err().to_string();
        assert!(
            error.contains("link 1 of 2 of a chain is of key groups 0..=15"),
            "{error}"
        );
        assert_eq!(
            read(&merge_keyed_chain(&[&full, &delta]).unwrap()),
            Model::new()
        );
    }
}
