//! The heap state backend: typed maps per key group, no
//! serialization on access, copy-on-write snapshots. See [`table`] for the data structure and
//! the size estimate, [`snapshot`] for what a checkpoint reads, [`restore`] for how a
//! checkpoint comes back.

pub(crate) mod restore;
pub(crate) mod snapshot;
pub(crate) mod states;
pub(crate) mod table;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;

use crate::backend::{CleanupProgress, StateSize};
use crate::descriptor::StateKind;
use crate::error::StateError;
use crate::key_group::{KeyGroup, KeyGroupRange};
use crate::ttl::{Clock, StateTtlConfig, TtlPolicy};
use crate::StateKey;

use restore::{KeyDecoder, RestoreSummary, RestoredStates};
use snapshot::{HeapSnapshot, SharedGroups, SnapshotValue, StateSnapshot, TableSnapshot};
use states::HeapTable;
use table::{GroupCleanup, KeyGroupedTable};

/// What the backend needs of a state's table without knowing its value type.
pub(crate) trait ErasedHeapTable<K, N> {
    fn name(&self) -> &str;
    fn kind(&self) -> StateKind;
    fn has_ttl(&self) -> bool;
    fn value_type(&self) -> &'static str;
    fn user_key_type(&self) -> Option<&'static str>;
    fn entries(&self) -> usize;
    fn estimated_bytes(&self) -> usize;
    fn group_count(&self) -> usize;
    fn cleanup_group(&self, group: usize, start: usize, budget: usize, now: i64) -> GroupCleanup;
    fn clear_group(&self, group: usize);
    fn live_keys(&self, group: usize, now: i64, out: &mut Vec<(K, Option<N>)>);
    fn snapshot(&self) -> Box<dyn TableSnapshot<K, N>>;
}

impl<K: StateKey, N: StateKey, V: SnapshotValue> ErasedHeapTable<K, N> for HeapTable<K, N, V> {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> StateKind {
        self.kind
    }

    fn has_ttl(&self) -> bool {
        self.ttl.is_some()
    }

    fn value_type(&self) -> &'static str {
        V::value_type()
    }

    fn user_key_type(&self) -> Option<&'static str> {
        V::user_key_type()
    }

    fn entries(&self) -> usize {
        self.data.borrow().entries()
    }

    fn estimated_bytes(&self) -> usize {
        self.data.borrow().estimated_bytes()
    }

    fn group_count(&self) -> usize {
        self.data.borrow().group_count()
    }

    fn cleanup_group(&self, group: usize, start: usize, budget: usize, now: i64) -> GroupCleanup {
        self.data
            .borrow_mut()
            .cleanup_group(group, start, budget, now)
    }

    fn clear_group(&self, group: usize) {
        self.data.borrow_mut().clear_group(group);
    }

    fn live_keys(&self, group: usize, now: i64, out: &mut Vec<(K, Option<N>)>) {
        let data = self.data.borrow();
        out.extend(
            data.group(group)
                .iter()
                .filter(|(_, value)| value.any_live(now))
                .map(|(key, _)| key.clone()),
        );
    }

    fn snapshot(&self) -> Box<dyn TableSnapshot<K, N>> {
        Box::new(SharedGroups {
            name: Rc::clone(&self.name),
            groups: self
                .data
                .borrow()
                .share_groups()
                .into_iter()
                .map(RefCell::new)
                .collect(),
            releasing: RefCell::new(None),
        })
    }
}

/// Where incremental TTL cleanup continues.
#[derive(Clone, Copy, Debug, Default)]
struct CleanupCursor {
    table: usize,
    group: usize,
    position: usize,
}

/// The heap side of a keyed backend: its tables, the restored states not registered yet, and
/// the cleanup cursor.
pub(crate) struct HeapStorage<K, N> {
    clock: Arc<dyn Clock>,
    max_parallelism: u32,
    key_groups: KeyGroupRange,
    tables: RefCell<Vec<Rc<dyn ErasedHeapTable<K, N>>>>,
    restored: RefCell<RestoredStates<K, N>>,
    cursor: Cell<CleanupCursor>,
}

impl<K: StateKey, N: StateKey> HeapStorage<K, N> {
    pub(crate) fn new(
        clock: Arc<dyn Clock>,
        max_parallelism: u32,
        key_groups: KeyGroupRange,
    ) -> Self {
        HeapStorage {
            clock,
            max_parallelism,
            key_groups,
            tables: RefCell::new(Vec::new()),
            restored: RefCell::new(RestoredStates::default()),
            cursor: Cell::new(CleanupCursor::default()),
        }
    }

    /// The table of a state being registered: empty, or holding the state's restored entries
    /// if a restore brought it (after checking it is registered as it was checkpointed).
    pub(crate) fn create_table<V: SnapshotValue>(
        &self,
        name: &str,
        kind: StateKind,
        ttl: Option<&StateTtlConfig>,
    ) -> Result<Rc<HeapTable<K, N, V>>, StateError> {
        let table = Rc::new(HeapTable {
            name: Rc::from(name),
            kind,
            ttl: TtlPolicy::new(ttl, &self.clock),
            data: RefCell::new(KeyGroupedTable::new(self.key_groups.len() as usize)),
        });
        let mut restored = self.restored.borrow_mut();
        let position = restored
            .states
            .iter()
            .position(|state| state.header.name == name);
        if let (Some(position), Some(decoder)) = (position, &restored.decoder) {
            let state = &restored.states[position];
            restore::check_registration::<V>(state, kind)?;
            let entries = restore::load(
                state,
                &table,
                decoder,
                self.max_parallelism,
                self.key_groups,
                self.clock.now_ms(),
            )?;
            tracing::debug!(state = name, entries, "restored keyed state registered");
            restored.states.remove(position);
        }
        self.tables
            .borrow_mut()
            .push(Rc::clone(&table) as Rc<dyn ErasedHeapTable<K, N>>);
        Ok(table)
    }

    /// Takes over the states of `snapshots` in this backend's key groups (see [`restore`]).
    pub(crate) fn restore(
        &self,
        snapshots: &[Bytes],
        decoder: KeyDecoder<K, N>,
    ) -> Result<RestoreSummary, StateError> {
        let invalid = |problem: String| -> StateError {
            crate::error::StateErrorKind::InvalidRestore { problem }.into()
        };
        if let Some(table) = self.tables.borrow().first() {
            return Err(invalid(format!(
                "state '{}' is already registered",
                table.name()
            )));
        }
        if self.restored.borrow().done {
            return Err(invalid("this backend was restored before".to_string()));
        }
        let (states, summary) = restore::merge_snapshots(
            snapshots,
            self.max_parallelism,
            self.key_groups,
            std::any::type_name::<K>(),
            std::any::type_name::<N>(),
        )?;
        let mut restored = self.restored.borrow_mut();
        restored.done = true;
        restored.states = states.into_iter().map(Rc::new).collect();
        restored.decoder = Some(decoder);
        Ok(summary)
    }

    /// Names of restored states not registered yet, in checkpoint order.
    pub(crate) fn restored_names(&self) -> Vec<String> {
        self.restored
            .borrow()
            .states
            .iter()
            .map(|state| state.header.name.clone())
            .collect()
    }

    fn table(&self, state: &str) -> Result<Rc<dyn ErasedHeapTable<K, N>>, StateError> {
        self.tables
            .borrow()
            .iter()
            .find(|table| table.name() == state)
            .cloned()
            .ok_or_else(|| StateError::unknown_state(state))
    }

    /// Group indexes of `range` within the backend's key groups.
    fn group_indexes(&self, range: KeyGroupRange) -> std::ops::Range<usize> {
        let start = range.start.max(self.key_groups.start);
        let end = range.end.min(self.key_groups.end);
        if range.is_empty() || start > end {
            return 0..0;
        }
        (start - self.key_groups.start) as usize..(end - self.key_groups.start + 1) as usize
    }

    pub(crate) fn keys(
        &self,
        state: &str,
        range: KeyGroupRange,
    ) -> Result<Vec<(K, Option<N>)>, StateError> {
        let table = self.table(state)?;
        let now = self.clock.now_ms();
        let mut keys = Vec::new();
        for group in self.group_indexes(range) {
            table.live_keys(group, now, &mut keys);
        }
        Ok(keys)
    }

    pub(crate) fn delete_key_groups(&self, range: KeyGroupRange) {
        for table in self.tables.borrow().iter() {
            for group in self.group_indexes(range) {
                table.clear_group(group);
            }
        }
        for state in self.restored.borrow_mut().states.iter_mut() {
            if state
                .blocks
                .iter()
                .any(|block| range.contains(KeyGroup(block.key_group)))
            {
                *state = Rc::new(state.without(range));
            }
        }
    }

    pub(crate) fn sizes(&self) -> Vec<StateSize> {
        self.tables
            .borrow()
            .iter()
            .map(|table| StateSize {
                name: table.name().to_string(),
                kind: table.kind(),
                entries: table.entries() as u64,
                estimated_bytes: table.estimated_bytes() as u64,
            })
            .collect()
    }

    pub(crate) fn snapshot(&self) -> HeapSnapshot<K, N> {
        let taken_at_ms = self.clock.now_ms();
        let states = self
            .tables
            .borrow()
            .iter()
            .map(|table| StateSnapshot {
                name: table.name().to_string(),
                kind: table.kind(),
                value_type: table.value_type(),
                user_key_type: table.user_key_type(),
                has_ttl: table.has_ttl(),
                key_groups: self.key_groups,
                taken_at_ms,
                table: table.snapshot(),
            })
            .collect();
        HeapSnapshot {
            taken_at_ms,
            max_parallelism: self.max_parallelism,
            key_groups: self.key_groups,
            states,
            restored: self.restored.borrow().states.clone(),
        }
    }

    /// Examines at most `max_entries` entries of states with TTL, continuing where the last
    /// call stopped, and removes what has expired.
    pub(crate) fn cleanup_expired(&self, max_entries: usize) -> CleanupProgress {
        let tables = self.tables.borrow();
        let now = self.clock.now_ms();
        let mut cursor = self.cursor.get();
        let mut progress = CleanupProgress::default();
        while progress.examined < max_entries {
            let Some(table) = tables.get(cursor.table) else {
                cursor = CleanupCursor::default();
                progress.round_complete = true;
                break;
            };
            if !table.has_ttl() || cursor.group >= table.group_count() {
                cursor = CleanupCursor {
                    table: cursor.table + 1,
                    group: 0,
                    position: 0,
                };
                continue;
            }
            let step = table.cleanup_group(
                cursor.group,
                cursor.position,
                max_entries - progress.examined,
                now,
            );
            progress.examined += step.examined;
            progress.removed += step.removed;
            match step.next {
                Some(position) => cursor.position = position,
                None => {
                    cursor.group += 1;
                    cursor.position = 0;
                }
            }
        }
        self.cursor.set(cursor);
        progress
    }
}
