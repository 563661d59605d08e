//! Global windows with a purging count trigger: every `count` records of a key, the key's
//! window fires with them and starts over. Records of a window that never fills up are not
//! emitted (as in Flink, a count window fires only when full).

use std::marker::PhantomData;

use weir_state::{KeyedSnapshotEntries, StateError, StateKind, StateValueCodec};

use super::checkpoint::{AccCodec, KeyedScope, Layout, COUNTS};
use super::function::WindowLogic;
use super::{GlobalWindow, KeyMap, Window};
use crate::checkpoint::task_state::OperatorSnapshot;
use crate::operator::{Emitter, Operator, RuntimeContext};
use crate::record::Key;

pub(crate) struct CountWindowOperator<K, T, O, KS, L: WindowLogic<K, GlobalWindow, T, O>> {
    key_selector: KS,
    logic: L,
    count: u64,
    keys: KeyMap<K, (u64, L::Acc)>,
    /// Set when opened.
    scope: Option<KeyedScope>,
    _types: PhantomData<fn(T) -> O>,
}

impl<K, T, O, KS, L: WindowLogic<K, GlobalWindow, T, O>> CountWindowOperator<K, T, O, KS, L> {
    pub(crate) fn new(key_selector: KS, logic: L, count: u64) -> Self {
        CountWindowOperator {
            key_selector,
            logic,
            count,
            keys: KeyMap::default(),
            scope: None,
            _types: PhantomData,
        }
    }

    /// Writes every key's window and count (`checkpoint.rs` has the layout).
    fn write_snapshot(&self, snapshot: &mut OperatorSnapshot) -> Result<(), StateError>
    where
        K: Key,
    {
        let scope = self.scope.expect("opened");
        let layout = self.logic.layout(snapshot.is_savepoint());
        let mut writer =
            super::checkpoint::snapshot::<K, GlobalWindow, L::Acc>(&scope, layout.codec);
        let counts = writer.add_state::<u64>(COUNTS, StateKind::Value);
        for (key, (seen, acc)) in &self.keys {
            writer.key(key)?;
            writer.contents(None, acc)?;
            writer.put(&counts, seen)?;
        }
        snapshot.add(layout.part, writer.finish()?);
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
            let (_, acc) = keys
                .entry(key.clone())
                .or_insert_with(|| (0, logic.create(key)));
            codec.decode_into(acc, bytes)
        })?;
        restored.for_each(
            COUNTS,
            StateKind::Value,
            &StateValueCodec::<u64>::of(),
            |key, _, count| {
                if let Some((seen, _)) = self.keys.get_mut(key) {
                    *seen = count;
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
    }

    fn snapshot_state(&mut self, snapshot: &mut OperatorSnapshot) -> Result<(), String> {
        self.write_snapshot(snapshot)
            .map_err(|error| error.to_string())
    }

    fn process_element(&mut self, record: T, _timestamp: i64, out: &mut Emitter<O>) {
        let key = (self.key_selector)(&record);
        let logic = &mut self.logic;
        let (seen, acc) = self
            .keys
            .entry(key.clone())
            .or_insert_with(|| (0, logic.create(&key)));
        logic.add(acc, record);
        *seen += 1;
        if *seen >= self.count {
            let (_, acc) = self.keys.remove(&key).expect("present");
            self.logic.fire(
                &key,
                &GlobalWindow,
                &[&acc],
                GlobalWindow.max_timestamp(),
                &mut out.main,
            );
        }
    }
}
