//! The current key and namespace of a keyed backend, shared by all its state handles.
//!
//! `set_current_key` hashes the key once (Weir key hash v1) and caches its key group; the heap
//! backend looks entries up by the cached `(key, namespace)` pair without cloning it, and the
//! RocksDB backend keeps the encoded key prefix (key group, key, namespace) up to date so that a
//! state access only appends what is specific to it.

use std::cell::{Ref, RefCell};

use rkyv::rancor;

use crate::backend::rocksdb::key as rocks_key;
use crate::error::{StateError, StateErrorKind};
use crate::key_group::{KeyGroup, KeyGroupRange};
use crate::StateKey;

/// Encoders a RocksDB backend uses for keys and namespaces, captured where the types are known
/// to be [`crate::StateCodec`] so that the backend itself needs no such bound.
pub(crate) struct KeyCodec<K, N> {
    pub(crate) encode_key: fn(&K, &mut Vec<u8>) -> Result<(), rancor::Error>,
    pub(crate) encode_namespace: fn(&N, &mut Vec<u8>) -> Result<(), rancor::Error>,
    pub(crate) decode_key: fn(&[u8]) -> Result<K, rancor::Error>,
    pub(crate) decode_namespace: fn(&[u8]) -> Result<N, rancor::Error>,
}

/// The key (and namespace) every state handle of one backend acts on.
pub(crate) struct KeyContext<K, N> {
    max_parallelism: u32,
    key_groups: KeyGroupRange,
    current: RefCell<Current<K, N>>,
    codec: Option<KeyCodec<K, N>>,
}

/// The current key, namespace and what is derived from them.
pub(crate) struct Current<K, N> {
    /// `(key, namespace)` once a key is set: the heap backend's lookup key.
    pub(crate) composite: Option<(K, Option<N>)>,
    /// The namespace, also while no key is set.
    namespace: Option<N>,
    /// Key group of the current key.
    pub(crate) key_group: KeyGroup,
    /// Index of the key group within the backend's range.
    pub(crate) group_index: usize,
    /// RocksDB: encoded key group, key and namespace.
    pub(crate) prefix: Vec<u8>,
    /// RocksDB: where the key ends and the namespace begins in `prefix`.
    key_end: usize,
    /// RocksDB: scratch for encoding.
    scratch: Vec<u8>,
}

impl<K: StateKey, N: StateKey> KeyContext<K, N> {
    pub(crate) fn new(
        max_parallelism: u32,
        key_groups: KeyGroupRange,
        codec: Option<KeyCodec<K, N>>,
    ) -> KeyContext<K, N> {
        KeyContext {
            max_parallelism,
            key_groups,
            current: RefCell::new(Current {
                composite: None,
                namespace: None,
                key_group: KeyGroup(key_groups.start),
                group_index: 0,
                prefix: Vec::new(),
                key_end: 0,
                scratch: Vec::new(),
            }),
            codec,
        }
    }

    pub(crate) fn max_parallelism(&self) -> u32 {
        self.max_parallelism
    }

    pub(crate) fn key_groups(&self) -> KeyGroupRange {
        self.key_groups
    }

    pub(crate) fn codec(&self) -> Option<&KeyCodec<K, N>> {
        self.codec.as_ref()
    }

    /// The current state, for a handle to read. Handles never hold it across calls.
    #[inline]
    pub(crate) fn current(&self) -> Ref<'_, Current<K, N>> {
        self.current.borrow()
    }

    pub(crate) fn set_key(&self, key: &K) -> Result<(), StateError> {
        let key_group = KeyGroup::of(key, self.max_parallelism);
        if !self.key_groups.contains(key_group) {
            return Err(StateErrorKind::KeyGroupOutOfRange {
                key: format!("{key:?}"),
                key_group: key_group.0,
                start: self.key_groups.start,
                end: self.key_groups.end,
                max_parallelism: self.max_parallelism,
            }
            .into());
        }
        let mut current = self.current.borrow_mut();
        let current = &mut *current;
        if let Some(codec) = &self.codec {
            current.scratch.clear();
            if let Err(error) = (codec.encode_key)(key, &mut current.scratch) {
                current.composite = None;
                return Err(StateErrorKind::Encode {
                    state: "<current key>".to_string(),
                    type_name: std::any::type_name::<K>(),
                    reason: error.to_string(),
                }
                .into());
            }
            current.prefix.clear();
            rocks_key::write_key(&mut current.prefix, key_group, &current.scratch);
            current.key_end = current.prefix.len();
        }
        match &mut current.composite {
            Some((stored, _)) => stored.clone_from(key),
            None => current.composite = Some((key.clone(), current.namespace.clone())),
        }
        current.key_group = key_group;
        current.group_index = (key_group.0 - self.key_groups.start) as usize;
        if self.codec.is_some() {
            self.encode_namespace(current)?;
        }
        Ok(())
    }

    pub(crate) fn set_namespace(&self, namespace: Option<N>) -> Result<(), StateError> {
        let mut current = self.current.borrow_mut();
        let current = &mut *current;
        if let Some((_, stored)) = &mut current.composite {
            stored.clone_from(&namespace);
        }
        current.namespace = namespace;
        if self.codec.is_some() && current.composite.is_some() {
            self.encode_namespace(current)?;
        }
        Ok(())
    }

    fn encode_namespace(&self, current: &mut Current<K, N>) -> Result<(), StateError> {
        let Some(codec) = &self.codec else {
            return Ok(());
        };
        current.prefix.truncate(current.key_end);
        match &current.namespace {
            None => rocks_key::write_void_namespace(&mut current.prefix),
            Some(namespace) => {
                current.scratch.clear();
                if let Err(error) = (codec.encode_namespace)(namespace, &mut current.scratch) {
                    current.composite = None;
                    return Err(StateErrorKind::Encode {
                        state: "<current namespace>".to_string(),
                        type_name: std::any::type_name::<N>(),
                        reason: error.to_string(),
                    }
                    .into());
                }
                rocks_key::write_namespace(&mut current.prefix, &current.scratch);
            }
        }
        Ok(())
    }

    pub(crate) fn key(&self) -> Option<K> {
        self.current
            .borrow()
            .composite
            .as_ref()
            .map(|(key, _)| key.clone())
    }

    pub(crate) fn namespace(&self) -> Option<N> {
        self.current.borrow().namespace.clone()
    }

    pub(crate) fn key_group(&self) -> Option<KeyGroup> {
        let current = self.current.borrow();
        current.composite.as_ref().map(|_| current.key_group)
    }
}
