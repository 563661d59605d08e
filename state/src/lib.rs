//! Keyed state for Weir operators.
//!
//! Today this crate holds key groups: the stable assignment of keys to key groups and of key
//! groups to operator subtasks that keyed exchange and (later) keyed state share. The state
//! backends land with the keyed-state work.
#![warn(missing_docs)]

pub mod key_group;

pub use key_group::{KeyGroup, KeyGroupRange, StableHasher};
