//! Window contents in the state backend: the window operators' RocksDB path.
//!
//! With `state.backend.type: rocksdb` a window operator keeps what its windows hold — each
//! pane's (or session's) accumulator, or its records for `process` — in its RocksDB instance, as
//! keyed state of the window's key with the pane as namespace. The operator itself is the same
//! one the heap path runs (`aligned.rs`, `session.rs`, `global.rs`): it is built over
//! [`Stored`], whose accumulator is a small token ([`StoredAcc`]: key and pane number) standing
//! for the contents in RocksDB. Adding a record folds it into the stored contents, firing loads
//! the panes, and dropping a token (the operator cleaning a pane up) deletes them. RocksDB
//! holds nothing for a pane number not taken yet — numbers are taken in order, a restore goes
//! on after the highest restored pane, and contents that reached RocksDB are deleted there with
//! their pane — so a pane's first record is written without a read
//! ([`weir_state::ValueState::insert_new`]), and a pane nothing was written for has nothing to
//! delete. What stays on
//! the heap is the operator's bookkeeping: which panes or sessions a key has and their timers,
//! a few dozen bytes per key and pane (Flink's `state.backend.rocksdb.timer-service.factory:
//! HEAP`).
//!
//! A checkpoint writes the contents as the RocksDB instance's native checkpoint
//! (`checkpoint::native`), and the bookkeeping as the operator's `own-keyed` part, with each
//! token's pane number as its accumulator; a restore brings both back, and numbers new panes
//! after the highest restored one. A savepoint writes the canonical layout instead, as the
//! heap path does (`checkpoint.rs`): each pane's contents read out of the instance at the
//! barrier, encoded as the heap's accumulator of the same function is. A restore from that
//! layout (any savepoint, or a heap checkpoint) writes each pane's contents into the fresh
//! instance under a new pane number. So window state moves between the backends the way
//! keyed state does.

use std::cell::Cell;
use std::rc::Rc;

use weir_state::{LocalKeyedBackend, StateCodec, StateError, StateKind};

use super::checkpoint::{decode_entry, AccCodec};
use super::function::{Contents, StoredLogic, WindowLogic};
use super::recycle;
use crate::checkpoint::native::NativeState;
use crate::checkpoint::task_state::OperatorSnapshot;
use crate::operator::{Batch, RuntimeContext};
use crate::record::Key;

/// An operator subtask's window contents: its backend (namespace = pane number) and the
/// handle of the contents' state.
pub(crate) struct PaneStore<K, C> {
    backend: LocalKeyedBackend<K, u64>,
    contents: C,
    /// The next pane number: RocksDB holds nothing for it or any after it (see the module
    /// docs).
    next: Cell<u64>,
    /// Set when the operator is dropped: its backend's files go with the job, so the panes
    /// still held need no deleting one by one.
    closing: Cell<bool>,
    /// The RocksDB instance's checkpoints.
    native: NativeState,
}

impl<K: Key, C: Contents> PaneStore<K, C> {
    /// Makes `(key, pane)` the backend's current key and namespace.
    fn try_select(&self, key: &K, pane: u64) -> Result<(), StateError> {
        self.backend.set_current_key_and_namespace(key, pane)
    }

    fn select(&self, key: &K, pane: u64) {
        self.try_select(key, pane)
            .unwrap_or_else(|error| fail(error));
    }
}

/// A state error in a window operator fails its job with the backend's message.
fn fail(error: StateError) -> ! {
    panic!("window state: {error}")
}

/// The accumulator the window operators hold on the RocksDB path: which key and pane the
/// contents in the backend belong to. Dropping it deletes them.
pub(crate) struct StoredAcc<K: Key, C: Contents> {
    key: K,
    pane: u64,
    /// Nothing has been written for the pane since its number was taken, so the backend holds
    /// no contents for it (the first write need not read, and dropping it deletes nothing).
    fresh: bool,
    store: Rc<PaneStore<K, C>>,
}

impl<K: Key, C: Contents> Drop for StoredAcc<K, C> {
    /// Deletes the pane's contents. Never panics: a failing job drops its operators while
    /// unwinding, and a second panic would abort the process.
    fn drop(&mut self) {
        if self.fresh || self.store.closing.get() || std::thread::panicking() {
            return;
        }
        let cleared = self
            .store
            .try_select(&self.key, self.pane)
            .and_then(|()| self.store.contents.clear());
        if let Err(error) = cleared {
            tracing::warn!(%error, "cannot delete a window pane's contents");
        }
    }
}

/// A window function whose contents live in the state backend (see the module docs).
pub(crate) struct Stored<K: Key, L: StoredLogic<K, W, T, O>, W, T, O> {
    logic: L,
    store: Rc<PaneStore<K, L::Contents>>,
    /// The panes a firing loaded, and references to them: buffers kept across firings, so
    /// that firing every key's window allocates nothing.
    loaded: Vec<L::Acc>,
    refs: Vec<&'static L::Acc>,
    _types: std::marker::PhantomData<fn(W, T) -> O>,
}

impl<K, L, W, T, O> Stored<K, L, W, T, O>
where
    K: Key,
    L: StoredLogic<K, W, T, O>,
{
    /// `logic` over subtask `ctx.subtask`'s key groups in its RocksDB instance, in the column
    /// family of the operator's contents.
    pub(crate) fn open(ctx: &RuntimeContext, logic: L) -> Self {
        let (backend, native) = match crate::state::open_keyed_backend(ctx) {
            Ok((backend, Some(native))) => (backend, native),
            Ok((_, None)) => {
                panic!("internal error: window contents in RocksDB without a RocksDB backend")
            }
            Err(error) => fail(error),
        };
        let contents = L::register(&backend).unwrap_or_else(|error| fail(error));
        Stored {
            logic,
            store: Rc::new(PaneStore {
                backend,
                contents,
                next: Cell::new(0),
                closing: Cell::new(false),
                native,
            }),
            loaded: Vec::new(),
            refs: Vec::new(),
            _types: std::marker::PhantomData,
        }
    }

    /// Loads `acc`'s contents.
    fn load(&mut self, acc: &StoredAcc<K, L::Contents>) -> L::Acc {
        self.store.select(&acc.key, acc.pane);
        self.logic
            .load(&self.store.contents)
            .unwrap_or_else(|error| fail(error))
    }
}

impl<K, L, W, T, O> Drop for Stored<K, L, W, T, O>
where
    K: Key,
    L: StoredLogic<K, W, T, O>,
{
    fn drop(&mut self) {
        self.store.closing.set(true);
    }
}

impl<K, L, W, T, O> WindowLogic<K, W, T, O> for Stored<K, L, W, T, O>
where
    K: Key,
    W: 'static,
    T: 'static,
    O: 'static,
    L: StoredLogic<K, W, T, O>,
{
    type Acc = StoredAcc<K, L::Contents>;

    fn create(&self, key: &K) -> Self::Acc {
        let pane = self.store.next.get();
        self.store.next.set(pane + 1);
        StoredAcc {
            key: key.clone(),
            pane,
            fresh: true,
            store: Rc::clone(&self.store),
        }
    }

    fn weight(&self, value: &T) -> u64 {
        self.logic.weight(value)
    }

    fn add(&mut self, acc: &mut Self::Acc, value: T) {
        self.store.select(&acc.key, acc.pane);
        let contents = &self.store.contents;
        let added = if std::mem::take(&mut acc.fresh) {
            self.logic.add_new(contents, value)
        } else {
            self.logic.add_stored(contents, value)
        };
        added.unwrap_or_else(|error| fail(error));
    }

    fn merge_owned(&mut self, into: &mut Self::Acc, from: Self::Acc) {
        let loaded = if from.fresh {
            // Nothing stored to load.
            self.logic.create(&from.key)
        } else {
            self.load(&from)
        };
        self.store.select(&into.key, into.pane);
        let contents = &self.store.contents;
        let merged = if std::mem::take(&mut into.fresh) {
            self.logic.merge_new(contents, loaded)
        } else {
            self.logic.merge_stored(contents, loaded)
        };
        merged.unwrap_or_else(|error| fail(error));
        // Dropping `from` deletes its contents.
    }

    fn fire(
        &mut self,
        key: &K,
        window: &W,
        panes: &[&Self::Acc],
        timestamp: i64,
        out: &mut Batch<O>,
    ) {
        // Every pane's entry asked for before any is read: their cache misses overlap.
        if panes.len() > 1 {
            for acc in panes {
                self.store.select(&acc.key, acc.pane);
                self.store.contents.prefetch();
            }
        }
        let mut loaded = std::mem::take(&mut self.loaded);
        loaded.clear();
        loaded.extend(panes.iter().map(|acc| self.load(acc)));
        let mut refs = recycle(std::mem::take(&mut self.refs));
        refs.extend(loaded.iter());
        self.logic.fire(key, window, &refs, timestamp, out);
        self.refs = recycle(refs);
        loaded.clear();
        self.loaded = loaded;
    }

    /// The contents, read from (and written into) the instance at the pane's key and number.
    fn acc_codec(&self) -> AccCodec<Self::Acc> {
        let canonical = self.logic.acc_codec();
        AccCodec {
            kind: canonical.kind,
            value_type: canonical.value_type,
            encode: |acc, entries| {
                acc.store.try_select(&acc.key, acc.pane)?;
                acc.store.contents.encode_entries(entries)
            },
            decode_entry: |acc, bytes| {
                acc.fresh = false;
                acc.store.try_select(&acc.key, acc.pane)?;
                acc.store.contents.put_entry(bytes)
            },
        }
    }

    /// The pane number, beside the instance's checkpoint.
    fn stored_codec(&self) -> Option<AccCodec<Self::Acc>> {
        Some(AccCodec {
            kind: StateKind::Value,
            value_type: "pane number (u64) of window contents in RocksDB",
            encode: |acc, entries| entries.put(|out| acc.pane.encode_into(out)),
            decode_entry: |acc, bytes| {
                // The restored instance holds the contents of the pane with this number.
                acc.fresh = false;
                acc.pane = decode_entry(bytes)?;
                let next = &acc.store.next;
                next.set(next.get().max(acc.pane.saturating_add(1)));
                Ok(())
            },
        })
    }

    fn snapshot_contents(&self, snapshot: &mut OperatorSnapshot) -> Result<(), StateError> {
        if snapshot.is_savepoint() {
            // Written with the windows: a savepoint's layout is the canonical one.
            return Ok(());
        }
        self.store.native.snapshot(snapshot)
    }
}
