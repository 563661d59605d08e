//! Flink's rules for giving the operator state of the old subtasks to the new ones on restore
//! (`RoundRobinOperatorStateRepartitioner`), as a pure function over snapshots.
//!
//! `old` holds one snapshot per old subtask, in subtask order; `p` is the new parallelism. Per
//! state, by its [`DistributionMode`]:
//!
//! - **Split** lists: when the parallelism is unchanged (`old.len() == p`), every subtask gets
//!   its own list back, as Flink does. Otherwise the lists of all old subtasks are concatenated
//!   in subtask order (`n` elements) and new subtask `i` gets the contiguous slice
//!   `[i·⌊n/p⌋ + min(i, n mod p), …)` of length `⌊n/p⌋ + (1 if i < n mod p)`: the first
//!   `n mod p` subtasks get one element more. (Flink also rotates which subtasks get the larger
//!   slices from one state to the next; Weir keeps the rule per state, so it does not depend on
//!   the order of states.) Concatenating the new lists in subtask order gives the old
//!   concatenation back in both cases: nothing is lost, duplicated or reordered.
//! - **Union** lists: every new subtask gets the concatenation of all old lists, in subtask
//!   order.
//! - **Broadcast** maps: of the old subtasks that hold the state, new subtask `i` gets the copy
//!   of the `(i mod holders)`-th (Flink's rule: all copies are equal, and with the parallelism
//!   unchanged every subtask gets its own back).
//!
//! Every new subtask gets every state name of the old ones, possibly empty, so states
//! registered lazily still find their (empty) restored entry, and a state name keeps its mode.

use indexmap::IndexMap;

use crate::error::{StateError, StateErrorKind};
use crate::operator::snapshot::{
    DistributionMode, OperatorStateData, OperatorStateImage, OperatorStateSnapshot,
};

/// The share of `old` (one snapshot per old subtask, in subtask order) that subtask `subtask`
/// of `parallelism` restores, by the rules in the module docs. An empty `old` (the operator had
/// no state in the checkpoint) gives an empty snapshot.
pub fn redistribute(
    old: &[OperatorStateSnapshot],
    subtask: u32,
    parallelism: u32,
) -> Result<OperatorStateSnapshot, StateError> {
    if parallelism == 0 {
        return Err(StateError::invalid_config(
            "parallelism",
            parallelism,
            "restore operator state for a parallelism of at least 1",
        ));
    }
    if subtask >= parallelism {
        return Err(StateError::invalid_config(
            "subtask index",
            subtask,
            format!("use a subtask index below the parallelism {parallelism}"),
        ));
    }
    let subtask = subtask as usize;
    let parallelism = parallelism as usize;
    let rescaled = old.len() != parallelism;

    let mut states = Vec::new();
    for (name, copies) in group_by_name(old)? {
        let first = copies[0].1;
        let type_names = first.type_names().to_string();
        let data = match first.mode() {
            DistributionMode::SplitDistribute => {
                let elements = if rescaled {
                    let all: Vec<&Vec<u8>> = copies.iter().flat_map(|(_, c)| elements(c)).collect();
                    let range = split_range(all.len(), subtask, parallelism);
                    all[range].iter().map(|element| element.to_vec()).collect()
                } else {
                    copies
                        .iter()
                        .find(|(old_subtask, _)| *old_subtask == subtask)
                        .map(|(_, copy)| elements(copy).to_vec())
                        .unwrap_or_default()
                };
                OperatorStateData::SplitList(elements)
            }
            DistributionMode::Union => OperatorStateData::UnionList(
                copies
                    .iter()
                    .flat_map(|(_, copy)| elements(copy).iter().cloned())
                    .collect(),
            ),
            DistributionMode::Broadcast => copies[subtask % copies.len()].1.data().clone(),
        };
        states.push(OperatorStateImage::new(name.to_string(), type_names, data));
    }
    Ok(OperatorStateSnapshot::new(states))
}

/// The range of the concatenation of `len` split-list elements that `subtask` of `parallelism`
/// gets (see the module docs): contiguous shares, the first `len % parallelism` one longer.
pub fn split_range(len: usize, subtask: usize, parallelism: usize) -> std::ops::Range<usize> {
    let base = len / parallelism;
    let extra = len % parallelism;
    let start = subtask * base + subtask.min(extra);
    let share = base + usize::from(subtask < extra);
    start..start + share
}

/// The copies of one state in the old subtasks that hold it, each with its old subtask index.
type Copies<'a> = Vec<(usize, &'a OperatorStateImage)>;

/// The copies of every state name, in order of first appearance. The copies of one name must
/// agree on the mode.
fn group_by_name(old: &[OperatorStateSnapshot]) -> Result<IndexMap<&str, Copies<'_>>, StateError> {
    let mut by_name: IndexMap<&str, Copies<'_>> = IndexMap::new();
    for (old_subtask, snapshot) in old.iter().enumerate() {
        for image in snapshot.states() {
            let copies = by_name.entry(image.name()).or_default();
            if let Some((first_subtask, first)) = copies.first() {
                if first.mode() != image.mode() {
                    return Err(StateErrorKind::CorruptSnapshot {
                        what: "operator state checkpoint",
                        problem: format!(
                            "state '{}' is a {} in old subtask {first_subtask} but a {} in old \
                             subtask {old_subtask}",
                            image.name(),
                            first.mode(),
                            image.mode()
                        ),
                    }
                    .into());
                }
            }
            copies.push((old_subtask, image));
        }
    }
    Ok(by_name)
}

fn elements(image: &OperatorStateImage) -> &[Vec<u8>] {
    image.list_elements().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_ranges_tile_the_concatenation() {
        for len in 0..40 {
            for parallelism in 1..10 {
                let mut next = 0;
                for subtask in 0..parallelism {
                    let range = split_range(len, subtask, parallelism);
                    assert_eq!(range.start, next);
                    assert!(
                        range.len() == len / parallelism || range.len() == len / parallelism + 1
                    );
                    next = range.end;
                }
                assert_eq!(next, len);
            }
        }
        assert_eq!(split_range(10, 0, 3), 0..4);
        assert_eq!(split_range(10, 1, 3), 4..7);
        assert_eq!(split_range(10, 2, 3), 7..10);
    }
}
