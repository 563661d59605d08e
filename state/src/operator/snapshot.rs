//! The image of one subtask's operator state, and its file format.
//!
//! [`OperatorStateSnapshot`] holds, per state, its name, its [`DistributionMode`], the Rust
//! type names it was registered with (for error messages only) and its elements or map entries,
//! each encoded with [`crate::StateCodec`]. It is plain data (`Send`), so the checkpoint writer
//! may take it to another thread.
//!
//! [`OperatorStateSnapshot::to_bytes`] writes it as a 17-byte header followed by the rkyv
//! archive of the snapshot:
//!
//! | bytes  | content                                                 |
//! |--------|---------------------------------------------------------|
//! | 0..4   | magic `WOPS` (Weir operator state)                      |
//! | 4      | format version, [`SNAPSHOT_FORMAT_VERSION`]             |
//! | 5..13  | length of the body in bytes, little-endian `u64`        |
//! | 13..17 | CRC-32 (IEEE) of the body, little-endian `u32`          |
//! | 17..   | body: the rkyv archive of the snapshot (validated)      |
//!
//! [`OperatorStateSnapshot::from_bytes`] checks all of it and says which part is wrong.

use std::fmt;

use rkyv::{Archive, Deserialize, Serialize};

use crate::checksum::crc32;
use crate::codec::StateCodec;
use crate::error::{StateError, StateErrorKind};

/// The format version [`OperatorStateSnapshot::to_bytes`] writes and
/// [`OperatorStateSnapshot::from_bytes`] reads.
pub const SNAPSHOT_FORMAT_VERSION: u8 = 1;

const MAGIC: [u8; 4] = *b"WOPS";
const HEADER_LEN: usize = 17;
const WHAT: &str = "operator state snapshot";

/// How a state is redistributed when a job is restored (Flink's `OperatorStateHandle.Mode`).
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DistributionMode {
    /// A list split evenly across the new subtasks ([`crate::OperatorStateStore::list_state`]).
    SplitDistribute,
    /// A list every new subtask gets in full, concatenated from all old subtasks
    /// ([`crate::OperatorStateStore::union_list_state`]).
    Union,
    /// A map every subtask holds identically ([`crate::OperatorStateStore::broadcast_state`]).
    Broadcast,
}

impl DistributionMode {
    /// How a state of this mode and these type names is shown in error messages, e.g.
    /// `ListState<u64> (split redistribution)`.
    pub(crate) fn describe(self, type_names: &str) -> String {
        match self {
            DistributionMode::SplitDistribute => {
                format!("ListState<{type_names}> (split redistribution)")
            }
            DistributionMode::Union => format!("ListState<{type_names}> (union redistribution)"),
            DistributionMode::Broadcast => format!("BroadcastState<{type_names}>"),
        }
    }
}

impl fmt::Display for DistributionMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DistributionMode::SplitDistribute => "split list",
            DistributionMode::Union => "union list",
            DistributionMode::Broadcast => "broadcast map",
        })
    }
}

/// The encoded contents of one state; the variant is its [`DistributionMode`].
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq)]
pub(crate) enum OperatorStateData {
    /// Encoded list elements, in list order.
    SplitList(Vec<Vec<u8>>),
    /// Encoded list elements, in list order.
    UnionList(Vec<Vec<u8>>),
    /// Encoded `(key, value)` pairs.
    Broadcast(Vec<(Vec<u8>, Vec<u8>)>),
}

impl OperatorStateData {
    pub(crate) fn mode(&self) -> DistributionMode {
        match self {
            OperatorStateData::SplitList(_) => DistributionMode::SplitDistribute,
            OperatorStateData::UnionList(_) => DistributionMode::Union,
            OperatorStateData::Broadcast(_) => DistributionMode::Broadcast,
        }
    }
}

/// The snapshot of one operator state: name, mode, type names and encoded contents.
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq)]
pub struct OperatorStateImage {
    name: String,
    type_names: String,
    data: OperatorStateData,
}

impl OperatorStateImage {
    pub(crate) fn new(name: String, type_names: String, data: OperatorStateData) -> Self {
        OperatorStateImage {
            name,
            type_names,
            data,
        }
    }

    /// The state name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How the state is redistributed on restore.
    pub fn mode(&self) -> DistributionMode {
        self.data.mode()
    }

    /// The Rust type names the state was registered with (`T` of a list, `K, V` of a broadcast
    /// map). For messages only: they are not checked on restore, the decoding is.
    pub fn type_names(&self) -> &str {
        &self.type_names
    }

    /// How the state is shown in error messages, e.g. `ListState<u64> (split redistribution)`.
    pub fn describe(&self) -> String {
        self.mode().describe(&self.type_names)
    }

    /// Number of list elements or map entries.
    pub fn len(&self) -> usize {
        match &self.data {
            OperatorStateData::SplitList(elements) | OperatorStateData::UnionList(elements) => {
                elements.len()
            }
            OperatorStateData::Broadcast(entries) => entries.len(),
        }
    }

    /// Whether the state holds no element or entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of encoded elements, keys and values.
    pub fn encoded_len(&self) -> usize {
        match &self.data {
            OperatorStateData::SplitList(elements) | OperatorStateData::UnionList(elements) => {
                elements.iter().map(Vec::len).sum()
            }
            OperatorStateData::Broadcast(entries) => entries
                .iter()
                .map(|(key, value)| key.len() + value.len())
                .sum(),
        }
    }

    /// The encoded list elements in list order ([`crate::StateCodec`]); `None` for a broadcast
    /// state.
    pub fn list_elements(&self) -> Option<&[Vec<u8>]> {
        match &self.data {
            OperatorStateData::SplitList(elements) | OperatorStateData::UnionList(elements) => {
                Some(elements)
            }
            OperatorStateData::Broadcast(_) => None,
        }
    }

    /// The encoded `(key, value)` entries of a broadcast state; `None` for a list.
    pub fn broadcast_entries(&self) -> Option<&[(Vec<u8>, Vec<u8>)]> {
        match &self.data {
            OperatorStateData::Broadcast(entries) => Some(entries),
            _ => None,
        }
    }

    pub(crate) fn data(&self) -> &OperatorStateData {
        &self.data
    }
}

impl fmt::Debug for OperatorStateImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperatorStateImage")
            .field("name", &self.name)
            .field("mode", &self.mode())
            .field("type_names", &self.type_names)
            .field("len", &self.len())
            .field("encoded_len", &self.encoded_len())
            .finish()
    }
}

/// All operator states of one subtask at one moment (see the module docs): what
/// [`crate::OperatorStateStore::snapshot`] takes and [`crate::OperatorStateStore::restore`]
/// redistributes.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct OperatorStateSnapshot {
    states: Vec<OperatorStateImage>,
}

impl OperatorStateSnapshot {
    /// A snapshot of these states; their names must be unique.
    pub(crate) fn new(states: Vec<OperatorStateImage>) -> Self {
        OperatorStateSnapshot { states }
    }

    /// The states, in registration order.
    pub fn states(&self) -> &[OperatorStateImage] {
        &self.states
    }

    /// The state named `name`.
    pub fn state(&self, name: &str) -> Option<&OperatorStateImage> {
        self.states.iter().find(|state| state.name == name)
    }

    /// Whether the snapshot holds no state at all.
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    pub(crate) fn into_states(self) -> Vec<OperatorStateImage> {
        self.states
    }

    /// The snapshot as bytes: header and rkyv body (see the module docs).
    pub fn to_bytes(&self) -> Result<Vec<u8>, StateError> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.estimated_body_len());
        out.extend_from_slice(&MAGIC);
        out.push(SNAPSHOT_FORMAT_VERSION);
        out.extend_from_slice(&[0; 12]);
        self.encode_into(&mut out).map_err(|error| -> StateError {
            StateErrorKind::Encode {
                state: "*".to_string(),
                type_name: std::any::type_name::<OperatorStateSnapshot>(),
                reason: error.to_string(),
            }
            .into()
        })?;
        let body_len = (out.len() - HEADER_LEN) as u64;
        let checksum = crc32(&out[HEADER_LEN..]);
        out[5..13].copy_from_slice(&body_len.to_le_bytes());
        out[13..17].copy_from_slice(&checksum.to_le_bytes());
        Ok(out)
    }

    /// Reads bytes written by [`OperatorStateSnapshot::to_bytes`]. Truncated, damaged or
    /// unknown input is a [`StateErrorKind::CorruptSnapshot`] error saying what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, StateError> {
        if bytes.len() < HEADER_LEN {
            return Err(corrupt(format!(
                "truncated: {} bytes, shorter than the {HEADER_LEN}-byte header",
                bytes.len()
            )));
        }
        if bytes[0..4] != MAGIC {
            return Err(corrupt(format!(
                "it starts with {:02x?}, not the magic bytes {:?} (\"WOPS\"): it is not an \
                 operator state snapshot",
                &bytes[0..4],
                MAGIC
            )));
        }
        if bytes[4] != SNAPSHOT_FORMAT_VERSION {
            return Err(corrupt(format!(
                "format version {}, this build reads version {SNAPSHOT_FORMAT_VERSION}",
                bytes[4]
            )));
        }
        let body_len = u64::from_le_bytes(bytes[5..13].try_into().expect("8 header bytes"));
        let stored_checksum = u32::from_le_bytes(bytes[13..17].try_into().expect("4 bytes"));
        let body = &bytes[HEADER_LEN..];
        if (body.len() as u64) < body_len {
            return Err(corrupt(format!(
                "truncated: the header announces a body of {body_len} bytes, only {} follow",
                body.len()
            )));
        }
        if (body.len() as u64) > body_len {
            return Err(corrupt(format!(
                "{} unexpected bytes after the body of {body_len} bytes",
                body.len() as u64 - body_len
            )));
        }
        let checksum = crc32(body);
        if checksum != stored_checksum {
            return Err(corrupt(format!(
                "the body's CRC-32 is {checksum:#010x}, the header says {stored_checksum:#010x}"
            )));
        }
        let snapshot = OperatorStateSnapshot::decode(body)
            .map_err(|error| corrupt(format!("the body does not decode: {error}")))?;
        snapshot.validate()?;
        Ok(snapshot)
    }

    /// State names are unique.
    fn validate(&self) -> Result<(), StateError> {
        let mut seen = std::collections::HashSet::with_capacity(self.states.len());
        for state in &self.states {
            if !seen.insert(state.name.as_str()) {
                return Err(corrupt(format!("state '{}' appears twice", state.name)));
            }
        }
        Ok(())
    }

    /// A guess at the archive's size (rkyv adds a few words per vector and string).
    fn estimated_body_len(&self) -> usize {
        self.states
            .iter()
            .map(|state| {
                64 + state.name.len()
                    + state.type_names.len()
                    + 16 * state.len()
                    + state.encoded_len()
            })
            .sum()
    }
}

fn corrupt(problem: String) -> StateError {
    StateErrorKind::CorruptSnapshot {
        what: WHAT,
        problem,
    }
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_names_are_rejected() {
        let image = OperatorStateImage::new(
            "offsets".into(),
            "u64".into(),
            OperatorStateData::SplitList(vec![]),
        );
        let snapshot = OperatorStateSnapshot::new(vec![image.clone(), image]);
        let bytes = snapshot.to_bytes().unwrap();
        let err = OperatorStateSnapshot::from_bytes(&bytes).unwrap_err();
        assert!(err.to_string().contains("'offsets' appears twice"), "{err}");
    }
}
