//! Global windows with a purging count trigger: every `count` records of a key, the key's
//! window fires with them and starts over. Records of a window that never fills up are not
//! emitted (as in Flink, a count window fires only when full). Checkpoints are written after
//! their barrier, incrementally (`deferred.rs`).

use std::marker::PhantomData;

use std::collections::hash_map::Entry;

use weir_state::{KeyedSnapshotEntries, StateError, StateKind, StateValueCodec, WriterState};

use super::checkpoint::{AccCodec, KeyedScope, Layout, WindowSnapshot, COUNTS};
use super::deferred::{Changes, KeyContents, KeyWriter, Marks, TrackedKey, STEP_BYTES};
use super::function::WindowLogic;
use super::{GlobalWindow, KeyMap, Window};
use crate::checkpoint::task_state::OperatorSnapshot;
use crate::operator::{Emitter, Operator, RuntimeContext};
use crate::record::Key;

pub(crate) struct CountWindowOperator<K, T, O, KS, L: WindowLogic<K, GlobalWindow, T, O>> {
    key_selector: KS,
    logic: L,
    count: u64,
    keys: KeyMap<K, CountKey<L::Acc>>,
    changes: Changes<K, CountKey<L::Acc>, CountWriter<K, L::Acc>>,
    /// The input ended (`Operator::finish`).
    finished: bool,
    /// Set when opened.
    scope: Option<KeyedScope>,
    _types: PhantomData<fn(T) -> O>,
}

/// A key's window: the records it holds so far and their accumulator.
struct CountKey<A> {
    seen: u64,
    acc: A,
    /// For the snapshots written after their barrier ([`Changes`]).
    marks: Marks,
}

impl<A> TrackedKey for CountKey<A> {
    fn marks(&self) -> &Marks {
        &self.marks
    }
}

/// What a snapshot holds of a key: its window and count (`checkpoint.rs` has the layout).
struct CountContents {
    counts: (WriterState, StateValueCodec<u64>),
}

/// The snapshots' writer.
type CountWriter<K, A> = KeyWriter<K, GlobalWindow, A, CountContents>;

impl<K: Key, A> KeyContents<K, CountKey<A>, GlobalWindow, A> for CountContents {
    fn put(
        &self,
        snapshot: &mut WindowSnapshot<K, GlobalWindow, A>,
        key: &K,
        state: &CountKey<A>,
    ) -> Result<(), StateError> {
        snapshot.key(key)?;
        snapshot.contents(None, &state.acc)?;
        snapshot.put(&self.counts, &state.seen)
    }
}

impl<K, T, O, KS, L: WindowLogic<K, GlobalWindow, T, O>> CountWindowOperator<K, T, O, KS, L> {
    pub(crate) fn new(key_selector: KS, logic: L, count: u64) -> Self {
        CountWindowOperator {
            key_selector,
            logic,
            count,
            keys: KeyMap::default(),
            changes: Changes::untracked(),
            finished: false,
            scope: None,
            _types: PhantomData,
        }
    }

    /// Writes every key's window and count (`checkpoint.rs` has the layout) — or,
    /// checkpointing incrementally, those of the keys changed since the last checkpoint, and
    /// which went (`checkpoint::chain`) — after the barrier, in pieces (`deferred.rs`).
    fn write_snapshot(&mut self, snapshot: &mut OperatorSnapshot) -> Result<(), StateError>
    where
        K: Key,
        L::Acc: 'static,
    {
        let scope = self.scope.expect("opened");
        let layout = self.logic.layout(snapshot.is_savepoint());
        let mut writer =
            super::checkpoint::snapshot::<K, GlobalWindow, L::Acc>(&scope, layout.codec);
        let counts = writer.add_state::<u64>(COUNTS, StateKind::Value);
        let writer = KeyWriter::new(writer, CountContents { counts });
        self.changes
            .take(&self.keys, writer, snapshot, layout.part, self.finished)?;
        self.logic.snapshot_contents(snapshot)
    }

    /// Takes back the windows and counts of this subtask's key groups from the checkpoint the
    /// job resumes from, its accumulators written with `codec`.
    fn restore(
        &mut self,
        restored: &KeyedSnapshotEntries<K, GlobalWindow>,
        codec: AccCodec<L::Acc>,
    ) -> Result<(), StateError>
    where
        K: Key,
    {
        let (keys, logic) = (&mut self.keys, &self.logic);
        codec.restore(restored, |key, _, bytes| {
            let state = keys.entry(key.clone()).or_insert_with(|| CountKey {
                seen: 0,
                acc: logic.create(key),
                marks: Marks::default(),
            });
            codec.decode_into(&mut state.acc, bytes)
        })?;
        restored.for_each(
            COUNTS,
            StateKind::Value,
            &StateValueCodec::<u64>::of(),
            |key, _, count| {
                if let Some(state) = self.keys.get_mut(key) {
                    state.seen = count;
                }
                Ok(())
            },
        )?;
        Ok(())
    }
}

impl<K, T, O, KS, L> Operator<T, O> for CountWindowOperator<K, T, O, KS, L>
where
    K: Key,
    T: 'static,
    O: 'static,
    KS: Fn(&T) -> K + 'static,
    L: WindowLogic<K, GlobalWindow, T, O>,
{
    fn open(&mut self, ctx: &RuntimeContext) {
        let Layout { part, codec } = self.logic.restored_layout(ctx);
        let scope = super::checkpoint::open(ctx, "count windows", part, |restored| {
            self.restore(restored, codec)
        });
        self.scope = Some(scope);
        self.changes = Changes::opened(ctx, self.logic.layout(false).part);
    }

    fn snapshot_state(&mut self, snapshot: &mut OperatorSnapshot) -> Result<(), String> {
        self.write_snapshot(snapshot)
            .map_err(|error| error.to_string())
    }

    fn process_element(&mut self, record: T, _timestamp: i64, out: &mut Emitter<O>) {
        let key = (self.key_selector)(&record);
        let (logic, changes) = (&mut self.logic, &mut self.changes);
        let state = match self.keys.entry(key.clone()) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => {
                let state = entry.insert(CountKey {
                    seen: 0,
                    acc: logic.create(&key),
                    marks: Marks::default(),
                });
                changes.added(state);
                state
            }
        };
        changes.record(&key, state);
        logic.add(&mut state.acc, record);
        state.seen += 1;
        if state.seen >= self.count {
            let state = self.keys.remove(&key).expect("present");
            self.changes.gone(&key);
            self.logic.fire(
                &key,
                &GlobalWindow,
                &[&state.acc],
                GlobalWindow.max_timestamp(),
                &mut out.main,
            );
        }
    }

    /// While a snapshot written after its barrier has keys left, the operator writes some
    /// between batches of records (`deferred.rs`).
    fn on_processing_time(&mut self, _now: i64, _out: &mut Emitter<O>) {
        self.changes.write_some(&self.keys, STEP_BYTES);
    }

    fn next_processing_time(&self) -> Option<i64> {
        self.changes.writing().then_some(i64::MIN)
    }

    fn finish(&mut self, _out: &mut Emitter<O>) {
        self.finished = true;
        // No turn need follow the input's end (a source task's chain gets none).
        self.changes.finish_pending(&self.keys);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::chain::KeyedChain;
    use crate::checkpoint::task_state::PART_KEYED;
    use crate::checkpoint::SnapshotKind;
    use crate::operator::SideOutputs;
    use crate::window::deferred::{encode_while_fed, WrittenInPieces};

    type Summing = CountWindowOperator<
        u8,
        (u8, u64),
        (u8, u64),
        fn(&(u8, u64)) -> u8,
        super::super::function::ReduceLogic<
            fn((u8, u64), (u8, u64)) -> (u8, u64),
            fn(&u8, &GlobalWindow, (u8, u64)) -> (u8, u64),
        >,
    >;

    impl WrittenInPieces for Summing {
        fn take_snapshot(&mut self, snapshot: &mut OperatorSnapshot) {
            self.write_snapshot(snapshot).expect("a snapshot");
        }

        fn write_some_keys(&mut self, budget: usize) {
            self.changes.write_some(&self.keys, budget);
        }
    }

    /// Count windows of `count` records summing the records' values per key.
    fn summing(count: u64) -> Summing {
        let logic = super::super::function::ReduceLogic {
            reduce: (|a, b| (a.0, a.1 + b.1)) as fn((u8, u64), (u8, u64)) -> (u8, u64),
            post: (|_: &u8, _: &GlobalWindow, r: (u8, u64)| r)
                as fn(&u8, &GlobalWindow, (u8, u64)) -> (u8, u64),
        };
        let mut op = CountWindowOperator::new((|r| r.0) as fn(&(u8, u64)) -> u8, logic, count);
        op.scope = Some(KeyedScope::single(16));
        op
    }

    fn feed(op: &mut Summing, input: &[(u8, u64)], out: &mut Emitter<(u8, u64)>) {
        for &record in input {
            op.process_element(record, 0, out);
        }
    }

    proptest::proptest! {
        /// A snapshot of count windows written after its barrier holds the windows at the
        /// barrier, however they change while it is written (records go on between the
        /// writer's pieces, windows fill up and fire, keys come and go), also with a second
        /// barrier before the writer is done: an operator restored from it emits, with the
        /// original's output before the barrier, what the original emits. A checkpoint
        /// without incremental links, or a savepoint next to a chain.
        #[test]
        fn a_count_window_snapshot_written_after_its_barrier_holds_the_windows_at_the_barrier(
            count in 1u64..6,
            input in proptest::collection::vec((0u8..6, 1u64..1000), 0..120),
            cut in 0usize..120,
            budget in 1usize..120,
            chained in proptest::prelude::any::<bool>(),
            second_barrier_after in proptest::option::of(0usize..40),
        ) {
            let cut = cut.min(input.len());
            let mut whole = summing(count);
            let mut expected = Emitter::new(0, SideOutputs::default());
            feed(&mut whole, &input, &mut expected);

            let mut first = summing(count);
            first.changes = Changes::tracked(
                chained.then(|| KeyedChain::deltas_only(PART_KEYED)),
            );
            let mut out = Emitter::new(0, SideOutputs::default());
            feed(&mut first, &input[..cut], &mut out);
            let kind = if chained { SnapshotKind::Savepoint } else { SnapshotKind::Checkpoint };
            let mut snapshot = OperatorSnapshot::new(kind);
            first.write_snapshot(&mut snapshot).expect("a snapshot");
            let before = out.main.records.clone();
            let rest = &input[cut..];
            let bytes = encode_while_fed(snapshot, budget, &mut first, rest, second_barrier_after, |op, &record| {
                feed(op, &[record], &mut out)
            });
            let restored = KeyedScope::single(16).read(&[bytes.into()]).expect("it reads back");
            let mut second = summing(count);
            let codec = second.logic.acc_codec();
            second.restore(&restored, codec).expect("restored");
            let mut after = Emitter::new(0, SideOutputs::default());
            after.main.records = before;
            feed(&mut second, &input[cut..], &mut after);
            let (mut fired, mut want) = (after.main.records.clone(), expected.main.records.clone());
            fired.sort_unstable();
            want.sort_unstable();
            proptest::prop_assert_eq!(fired, want);
            let left = |op: &Summing| {
                let mut left: Vec<(u8, u64)> = op.keys.iter().map(|(k, s)| (*k, s.seen)).collect();
                left.sort_unstable();
                left
            };
            proptest::prop_assert_eq!(left(&second), left(&whole));
        }
    }
}
