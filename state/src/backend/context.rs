//! The current key and namespace of a keyed backend, shared by all its state handles.
//!
//! `set_current_key` hashes the key once (Weir key hash v1) and caches its key group; the heap
//! backend looks entries up by the cached `(key, namespace)` pair and its cached hash without
//! cloning or hashing it again, and the RocksDB backend keeps the encoded key prefix (key group,
//! key, namespace) up to date so that a state access only appends what is specific to it.
//!
//! Both hashes come from one pass over the key: the key group is `finish` of the stable hasher
//! after the key (exactly [`KeyGroup::of`]), and the heap maps' hash of `(key, namespace)` is the
//! same hasher continued with the namespace (exactly what the maps' `BuildHasher` computes for
//! the tuple, which hashes its fields in order).

use std::cell::{Ref, RefCell};
use std::hash::{Hash, Hasher};

use rkyv::rancor;

use crate::backend::rocksdb::key as rocks_key;
use crate::error::{StateError, StateErrorKind};
use crate::key_group::{KeyGroup, KeyGroupRange, StableHasher};
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
    /// The heap maps' hash of `composite` (see the module docs); heap only (RocksDB never
    /// reads it, so there it stays 0).
    pub(crate) composite_hash: u64,
    /// The stable hasher after the current key, before the namespace.
    key_hasher: StableHasher,
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

impl<K: StateKey, N: StateKey> Current<K, N> {
    /// Whether `key` is the current key.
    #[inline]
    fn holds_key(&self, key: &K) -> bool {
        self.composite
            .as_ref()
            .is_some_and(|(stored, _)| stored == key)
    }

    /// Makes `namespace` the current namespace, without deriving anything from it.
    fn replace_namespace(&mut self, namespace: Option<N>) {
        if let Some((_, stored)) = &mut self.composite {
            stored.clone_from(&namespace);
        }
        self.namespace = namespace;
    }

    /// Recomputes `composite_hash` from the key's hasher and the namespace.
    #[inline]
    fn hash_composite(&mut self) {
        let mut hasher = self.key_hasher.clone();
        self.namespace.hash(&mut hasher);
        self.composite_hash = hasher.finish();
    }
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
                composite_hash: 0,
                key_hasher: StableHasher::new(),
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

    #[inline]
    pub(crate) fn set_key(&self, key: &K) -> Result<(), StateError> {
        let mut current = self.current.borrow_mut();
        if current.holds_key(key) {
            // A run of records or timers of one key: its hashes, key group and encoding are
            // those already set.
            return Ok(());
        }
        self.change_key(&mut current, key)?;
        self.derive_namespaced(&mut current)
    }

    pub(crate) fn set_namespace(&self, namespace: Option<N>) -> Result<(), StateError> {
        let mut current = self.current.borrow_mut();
        if current.composite.is_some() && current.namespace == namespace {
            // The hash and the encoded prefix are those of this namespace already.
            return Ok(());
        }
        current.replace_namespace(namespace);
        self.derive_namespaced(&mut current)
    }

    /// [`KeyContext::set_key`] and [`KeyContext::set_namespace`] in one: what depends on the
    /// namespace is derived once, not for the old namespace and then the new one.
    #[inline]
    pub(crate) fn set_key_and_namespace(
        &self,
        key: &K,
        namespace: Option<N>,
    ) -> Result<(), StateError> {
        let mut current = self.current.borrow_mut();
        let same_key = current.holds_key(key);
        if same_key && current.namespace == namespace {
            return Ok(());
        }
        if !same_key {
            self.change_key(&mut current, key)?;
        }
        if current.namespace != namespace {
            current.replace_namespace(namespace);
        }
        self.derive_namespaced(&mut current)
    }

    /// Makes `key` the current key: its hash and key group, and (RocksDB) its encoding at the
    /// front of the prefix. What depends on the namespace too is left to
    /// [`KeyContext::derive_namespaced`].
    #[inline]
    fn change_key(&self, current: &mut Current<K, N>, key: &K) -> Result<(), StateError> {
        let mut key_hasher = StableHasher::new();
        key.hash(&mut key_hasher);
        let key_group = KeyGroup::of_hash(key_hasher.finish(), self.max_parallelism);
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
        current.key_hasher = key_hasher;
        Ok(())
    }

    /// Derives what depends on the key and the namespace: the heap maps' hash of the pair,
    /// or RocksDB's encoded namespace after the key (RocksDB never reads the hash).
    #[inline]
    fn derive_namespaced(&self, current: &mut Current<K, N>) -> Result<(), StateError> {
        if self.codec.is_none() {
            current.hash_composite();
            Ok(())
        } else if current.composite.is_some() {
            self.encode_namespace(current)
        } else {
            Ok(())
        }
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

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;
    use crate::backend::heap::table::StableBuildHasher;

    /// The cached hashes equal what `KeyGroup::of` and the heap maps' hasher compute.
    fn check<K: StateKey, N: StateKey>(key: K, namespace: Option<N>) {
        let context: KeyContext<K, N> =
            KeyContext::new(128, KeyGroupRange { start: 0, end: 127 }, None);
        context.set_namespace(namespace.clone()).unwrap();
        context.set_key(&key).unwrap();
        let current = context.current();
        assert_eq!(current.key_group, KeyGroup::of(&key, 128));
        let composite = (key.clone(), namespace);
        assert_eq!(
            current.composite_hash,
            StableBuildHasher::default().hash_one(&composite)
        );
        assert_eq!(current.composite.as_ref(), Some(&composite));
    }

    #[test]
    fn cached_hashes_match_the_hashers() {
        check::<u64, ()>(42, None);
        check::<u64, ()>(42, Some(()));
        check::<String, (i64, i64)>("a longer key of 29 characters".into(), Some((-5, 10)));
        check::<(u32, String), String>((7, "k".into()), Some("window".into()));
        check::<i8, u8>(-1, None);
    }

    /// A RocksDB backend's encoders of `u64` keys and `u32` namespaces.
    fn rocksdb_codec() -> KeyCodec<u64, u32> {
        KeyCodec {
            encode_key: |key: &u64, out: &mut Vec<u8>| {
                out.extend_from_slice(&key.to_le_bytes());
                Ok(())
            },
            encode_namespace: |namespace: &u32, out: &mut Vec<u8>| {
                out.extend_from_slice(&namespace.to_le_bytes());
                Ok(())
            },
            decode_key: |_: &[u8]| Ok(0),
            decode_namespace: |_: &[u8]| Ok(0),
        }
    }

    /// What a context derives from its key and namespace: the pair, its hash, the key group
    /// and RocksDB's prefix.
    type Derived = (Option<(u64, Option<u32>)>, u64, KeyGroup, Vec<u8>);

    fn derived(context: &KeyContext<u64, u32>) -> Derived {
        let current = context.current();
        (
            current.composite,
            current.composite_hash,
            current.key_group,
            current.prefix.clone(),
        )
    }

    /// Setting the current key or namespace again keeps everything derived from them; another
    /// key or namespace recomputes it, prefix included.
    #[test]
    fn setting_the_same_key_again_keeps_what_was_derived() {
        let context: KeyContext<u64, u32> = KeyContext::new(
            128,
            KeyGroupRange { start: 0, end: 127 },
            Some(rocksdb_codec()),
        );
        context.set_key(&7).unwrap();
        context.set_namespace(Some(1)).unwrap();
        let seven = derived(&context);
        context.set_key(&7).unwrap();
        context.set_namespace(Some(1)).unwrap();
        assert_eq!(derived(&context), seven);
        context.set_key(&8).unwrap();
        assert_ne!(derived(&context).3, seven.3);
        context.set_key(&7).unwrap();
        assert_eq!(derived(&context), seven);
        context.set_namespace(Some(2)).unwrap();
        assert_ne!(derived(&context), seven);
        assert!(context.current().prefix.ends_with(&2u32.to_le_bytes()));
    }

    /// Setting key and namespace in one call derives what setting them one after the other
    /// does, on the heap (the pair's hash) and on RocksDB (the encoded prefix), whichever of
    /// the two changes.
    #[test]
    fn key_and_namespace_set_together_derive_as_set_one_by_one() {
        let steps = [
            (7, Some(1)),
            (7, Some(2)),
            (8, Some(2)),
            (8, None),
            (9, Some(3)),
            (9, Some(3)),
            (7, Some(1)),
        ];
        for codec in [None, Some(rocksdb_codec)] {
            let range = KeyGroupRange { start: 0, end: 127 };
            let one_by_one = KeyContext::new(128, range, codec.map(|codec| codec()));
            let together = KeyContext::new(128, range, codec.map(|codec| codec()));
            for (key, namespace) in steps {
                one_by_one.set_key(&key).unwrap();
                one_by_one.set_namespace(namespace).unwrap();
                together.set_key_and_namespace(&key, namespace).unwrap();
                assert_eq!(
                    derived(&together),
                    derived(&one_by_one),
                    "key {key}, namespace {namespace:?}, RocksDB: {}",
                    codec.is_some()
                );
            }
        }
    }

    #[test]
    fn namespace_changes_rehash() {
        let context: KeyContext<u64, u32> =
            KeyContext::new(8, KeyGroupRange { start: 0, end: 7 }, None);
        context.set_key(&9).unwrap();
        let without = context.current().composite_hash;
        context.set_namespace(Some(3)).unwrap();
        let with = context.current().composite_hash;
        assert_ne!(without, with);
        assert_eq!(
            with,
            StableBuildHasher::default().hash_one((9u64, Some(3u32)))
        );
        context.set_namespace(None).unwrap();
        assert_eq!(context.current().composite_hash, without);
    }
}
