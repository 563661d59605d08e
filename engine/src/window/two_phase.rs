//! Two-phase (local-global) window aggregation, Flink's `LocalWindowAggregate` /
//! `GlobalWindowAggregate`.
//!
//! An incremental aggregate over tumbling or sliding event-time windows behind a hash exchange
//! pre-aggregates on the sending shard: a *local* operator, chained to the stage before the
//! exchange, folds records into one accumulator per (key, pane) and emits them as [`Partial`]s
//! — when it holds 16 × `execution.batch-size` groups, when a watermark passes (before it is
//! forwarded, so a partial never arrives behind the watermark its records preceded), when the
//! buffer timeout flushes the exchange, and when the input ends. The *global* operator is the
//! ordinary pane window operator whose function merges each partial into the pane's
//! accumulator (`AggregateFunction::merge`). So per key and pane one partial crosses the
//! exchange per flush instead of every record: a hot key costs its shard one merge per flush,
//! not half of the job's records.
//!
//! Event-time sessions work the same way: the local operator merges a key's records into
//! partial sessions (`[start, end)` with their accumulator) as the window operator would, and
//! the global session operator merges partial sessions instead of one-record windows. A
//! session's lateness depends on the sessions it merges with, which only the global operator
//! knows; so a record that could be late there — its own window ends at or before the last
//! watermark the local operator forwarded, which the global watermark never passes — goes on
//! alone, after the key's pending partials, as it would have in one phase. Every other record
//! can never be late, nor can any session that contains it.
//!
//! Processing-time tumbling and sliding windows file a record under the clock of the operator
//! that holds it when the record arrives, so the global operator files each partial under its
//! own clock on arrival, as it would a record. The local operator emits what it holds at the
//! buffer timeout's flush, as the exchange sends a partly filled segment, so its records reach
//! the global operator within the same bound as records sent one by one: the plans differ
//! only in which of two adjacent windows a record in flight as a window closes lands in, which
//! is what processing time leaves open.
//!
//! It is used for `aggregate` and `aggregate_with` on tumbling and sliding windows (event or
//! processing time) and event-time session windows when the result cannot differ from one-phase
//! aggregation (beyond processing time's own dependence on arrival): no allowed lateness (a late
//! record would fire its window once per partial, not once per record) and no late-data side output
//! (its records would be partials). Pane lateness is decided per pane, so a partial is late exactly
//! when each of its records would have been; dropped partials count their records.
//! `table.optimizer.agg-phase-strategy` decides where: `AUTO` (the default) where the exchange may
//! cross shards — with one subtask on each side it is chained, and a local phase would only add a
//! second hash lookup per record — `TWO_PHASE` always, `ONE_PHASE` never.

use std::cell::RefCell;
use std::collections::hash_map::Entry;
use std::marker::PhantomData;
use std::sync::Arc;

use weir_state::{LocalKeyedBackend, StateError, StateValue};

use super::aligned::Geometry;
use super::assigner::SessionGap;
use super::function::{StoredLogic, WindowLogic};
use super::{element_time, KeyMap, TimeWindow};
use crate::metrics::OperatorMetrics;
use crate::operator::{Batch, Emitter, Operator};
use crate::record::{Key, Record, Scratch};
use crate::time::TimeDomain;

/// What the local phase sends: a key's accumulator for one pane or partial session
/// `[start, end)`, and how many records it holds. Its timestamp is `start`.
#[derive(Clone, Debug)]
pub(crate) struct Partial<K, A> {
    pub(crate) key: K,
    pub(crate) start: i64,
    pub(crate) end: i64,
    pub(crate) acc: A,
    /// Records folded into `acc`.
    pub(crate) records: u64,
}

/// The key of a partial (the global phase's key selector).
pub(crate) fn partial_key<K: Clone, A>(partial: &Partial<K, A>) -> K {
    partial.key.clone()
}

/// The length of a partial session (the global session operator's gap for it).
pub(crate) fn partial_length<K, A>(partial: &Partial<K, A>) -> std::time::Duration {
    std::time::Duration::from_millis(partial.end.saturating_sub(partial.start).max(1) as u64)
}

/// Offset of the key in an encoded partial: start, end, records, key length (8 bytes each).
const PARTIAL_HEADER: usize = 32;

thread_local! {
    /// Scratch for encoding a partial's key and accumulator (state codecs append to a vector).
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Partials cross the exchange in the state codec's encoding (keys and accumulators are state
/// values already): start, end, record count and key length, then the key, then the
/// accumulator.
impl<K: Key, A: StateValue + Send> Record for Partial<K, A> {
    fn encode(&self, out: &mut [u8], _scratch: &mut Scratch<'_>) -> Option<usize> {
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            scratch.clear();
            self.key.encode_into(&mut scratch).ok()?;
            let key_len = scratch.len();
            self.acc.encode_into(&mut scratch).ok()?;
            let len = PARTIAL_HEADER + scratch.len();
            let out = out.get_mut(..len)?;
            out[0..8].copy_from_slice(&self.start.to_le_bytes());
            out[8..16].copy_from_slice(&self.end.to_le_bytes());
            out[16..24].copy_from_slice(&self.records.to_le_bytes());
            out[24..32].copy_from_slice(&(key_len as u64).to_le_bytes());
            out[PARTIAL_HEADER..].copy_from_slice(&scratch);
            Some(len)
        })
    }

    unsafe fn decode(bytes: &[u8]) -> Self {
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let key_end = PARTIAL_HEADER + word(24) as usize;
        Partial {
            start: word(0) as i64,
            end: word(8) as i64,
            records: word(16),
            key: K::decode(&bytes[PARTIAL_HEADER..key_end]).expect("a partial's key decodes"),
            acc: A::decode(&bytes[key_end..]).expect("a partial's accumulator decodes"),
        }
    }

    fn check(bytes: &[u8]) -> Result<(), String> {
        let word = |at: usize| {
            bytes
                .get(at..at + 8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        };
        let key_end = word(24)
            .and_then(|len| usize::try_from(len).ok())
            .and_then(|len| len.checked_add(PARTIAL_HEADER))
            .filter(|&end| end <= bytes.len())
            .ok_or_else(|| {
                format!(
                    "a partial of {} bytes has no whole header and key",
                    bytes.len()
                )
            })?;
        K::decode(&bytes[PARTIAL_HEADER..key_end])
            .map_err(|e| format!("a partial's key does not decode: {e}"))?;
        A::decode(&bytes[key_end..])
            .map_err(|e| format!("a partial's accumulator does not decode: {e}"))?;
        Ok(())
    }
}

/// The local phase: folds records into one accumulator per (key, pane) and emits partials.
pub(crate) struct LocalWindowAggregate<K, T, O, KS, L: WindowLogic<K, TimeWindow, T, O>> {
    key_selector: KS,
    logic: L,
    geometry: Geometry,
    domain: TimeDomain,
    /// Groups held before they are all emitted.
    limit: usize,
    groups: KeyMap<(K, i64), (L::Acc, u64)>,
    operator: Arc<str>,
    _types: PhantomData<fn(T) -> O>,
}

impl<K, T, O, KS, L: WindowLogic<K, TimeWindow, T, O>> LocalWindowAggregate<K, T, O, KS, L> {
    pub(crate) fn new(
        key_selector: KS,
        logic: L,
        geometry: Geometry,
        domain: TimeDomain,
        limit: usize,
    ) -> Self {
        LocalWindowAggregate {
            key_selector,
            logic,
            geometry,
            domain,
            limit: limit.max(1),
            groups: KeyMap::default(),
            operator: "".into(),
            _types: PhantomData,
        }
    }
}

impl<K, T, O, KS, L> LocalWindowAggregate<K, T, O, KS, L>
where
    K: Key,
    L: WindowLogic<K, TimeWindow, T, O>,
{
    fn emit_all(&mut self, out: &mut Emitter<Partial<K, L::Acc>>) {
        let pane = self.geometry.pane();
        for ((key, start), (acc, records)) in self.groups.drain() {
            out.main.push(
                Partial {
                    key,
                    start,
                    end: start.saturating_add(pane),
                    acc,
                    records,
                },
                start,
            );
        }
    }
}

impl<K, T, O, KS, L> Operator<T, Partial<K, L::Acc>> for LocalWindowAggregate<K, T, O, KS, L>
where
    K: Key,
    T: 'static,
    O: 'static,
    KS: Fn(&T) -> K + 'static,
    L: WindowLogic<K, TimeWindow, T, O>,
{
    fn bind_metrics(&mut self, metrics: &Arc<OperatorMetrics>) {
        self.operator = metrics.name.as_str().into();
    }

    #[inline]
    fn process_element(
        &mut self,
        record: T,
        timestamp: i64,
        out: &mut Emitter<Partial<K, L::Acc>>,
    ) {
        let time = element_time(self.domain, timestamp, &self.operator);
        let pane = self.geometry.pane_start(time);
        let key = (self.key_selector)(&record);
        let (acc, records) = match self.groups.entry((key, pane)) {
            Entry::Occupied(group) => group.into_mut(),
            Entry::Vacant(group) => {
                let acc = self.logic.create(&group.key().0);
                group.insert((acc, 0))
            }
        };
        self.logic.add(acc, record);
        *records += 1;
        if self.groups.len() >= self.limit {
            self.emit_all(out);
        }
    }

    fn on_watermark(
        &mut self,
        _watermark: crate::record::Watermark,
        out: &mut Emitter<Partial<K, L::Acc>>,
    ) {
        // A partial must not arrive behind the watermark its records preceded; processing-time
        // panes ignore watermarks.
        if self.domain == TimeDomain::EventTime {
            self.emit_all(out);
        }
    }

    fn flush(&mut self, out: &mut Emitter<Partial<K, L::Acc>>) {
        self.emit_all(out);
    }

    fn finish(&mut self, out: &mut Emitter<Partial<K, L::Acc>>) {
        self.emit_all(out);
    }
}

/// A key's partial session in the local phase.
struct PendingSession<A> {
    start: i64,
    end: i64,
    acc: A,
    records: u64,
}

/// A key's partial sessions. Within one flush a key's records nearly always fall in one session,
/// which is held without a vector: most keys have a single record then, and a vector per key
/// cost each an allocation and a free.
enum Held<A> {
    One(PendingSession<A>),
    /// Pairwise apart (neither touching nor overlapping).
    Many(Vec<PendingSession<A>>),
}

impl<A> Held<A> {
    fn len(&self) -> usize {
        match self {
            Held::One(_) => 1,
            Held::Many(sessions) => sessions.len(),
        }
    }

    /// The sessions in a vector, the one session moved into it first.
    fn many(&mut self) -> &mut Vec<PendingSession<A>> {
        if let Held::One(_) = self {
            let Held::One(one) = std::mem::replace(self, Held::Many(Vec::new())) else {
                unreachable!("matched above")
            };
            *self = Held::Many(vec![one]);
        }
        let Held::Many(sessions) = self else {
            unreachable!("made a vector above")
        };
        sessions
    }

    fn into_sessions(self) -> impl Iterator<Item = PendingSession<A>> {
        let (one, many) = match self {
            Held::One(one) => (Some(one), Vec::new()),
            Held::Many(many) => (None, many),
        };
        one.into_iter().chain(many)
    }
}

/// The local phase of session windows: merges a key's records into partial sessions.
pub(crate) struct LocalSessionAggregate<K, T, O, KS, L: WindowLogic<K, TimeWindow, T, O>> {
    key_selector: KS,
    logic: L,
    gap: SessionGap<T>,
    /// The last watermark forwarded: the global operator's is never ahead of it.
    watermark: i64,
    /// Sessions held before they are all emitted.
    limit: usize,
    held: usize,
    keys: KeyMap<K, Held<L::Acc>>,
    operator: Arc<str>,
    _output: PhantomData<fn() -> O>,
}

impl<K, T, O, KS, L: WindowLogic<K, TimeWindow, T, O>> LocalSessionAggregate<K, T, O, KS, L> {
    pub(crate) fn new(key_selector: KS, logic: L, gap: SessionGap<T>, limit: usize) -> Self {
        LocalSessionAggregate {
            key_selector,
            logic,
            gap,
            watermark: i64::MIN,
            limit: limit.max(1),
            held: 0,
            keys: KeyMap::default(),
            operator: "".into(),
            _output: PhantomData,
        }
    }
}

fn emit_session<K, A>(key: K, session: PendingSession<A>, out: &mut Emitter<Partial<K, A>>) {
    out.main.push(
        Partial {
            key,
            start: session.start,
            end: session.end,
            acc: session.acc,
            records: session.records,
        },
        session.start,
    );
}

impl<K, T, O, KS, L> LocalSessionAggregate<K, T, O, KS, L>
where
    K: Key,
    L: WindowLogic<K, TimeWindow, T, O>,
{
    fn emit_all(&mut self, out: &mut Emitter<Partial<K, L::Acc>>) {
        for (key, sessions) in self.keys.drain() {
            for session in sessions.into_sessions() {
                emit_session(key.clone(), session, out);
            }
        }
        self.held = 0;
    }
}

impl<K, T, O, KS, L> Operator<T, Partial<K, L::Acc>> for LocalSessionAggregate<K, T, O, KS, L>
where
    K: Key,
    T: 'static,
    O: 'static,
    KS: Fn(&T) -> K + 'static,
    L: WindowLogic<K, TimeWindow, T, O>,
{
    fn bind_metrics(&mut self, metrics: &Arc<OperatorMetrics>) {
        self.operator = metrics.name.as_str().into();
    }

    fn process_element(
        &mut self,
        record: T,
        timestamp: i64,
        out: &mut Emitter<Partial<K, L::Acc>>,
    ) {
        let start = element_time(TimeDomain::EventTime, timestamp, &self.operator);
        let end = start.saturating_add(self.gap.of(&record));
        let key = (self.key_selector)(&record);
        if end.saturating_sub(1) <= self.watermark {
            // It may be late where it is merged: it goes alone, after what came before it.
            if let Some(sessions) = self.keys.remove(&key) {
                self.held -= sessions.len();
                for session in sessions.into_sessions() {
                    emit_session(key.clone(), session, out);
                }
            }
            let mut acc = self.logic.create(&key);
            self.logic.add(&mut acc, record);
            let alone = PendingSession {
                start,
                end,
                acc,
                records: 1,
            };
            emit_session(key, alone, out);
            return;
        }
        let logic = &mut self.logic;
        match self.keys.get_mut(&key) {
            None => {
                let mut acc = logic.create(&key);
                logic.add(&mut acc, record);
                let session = PendingSession {
                    start,
                    end,
                    acc,
                    records: 1,
                };
                self.keys.insert(key, Held::One(session));
                self.held += 1;
            }
            // The key's one session touches or overlaps `[start, end)`: the record joins it.
            Some(Held::One(session)) if session.end >= start && session.start <= end => {
                session.start = session.start.min(start);
                session.end = session.end.max(end);
                logic.add(&mut session.acc, record);
                session.records += 1;
            }
            Some(held) => {
                let sessions = held.many();
                // Sessions that touch or overlap `[start, end)` merge with it, as in the window
                // operator.
                let mut merged = PendingSession {
                    start,
                    end,
                    acc: logic.create(&key),
                    records: 0,
                };
                let before = sessions.len();
                let mut i = 0;
                while i < sessions.len() {
                    let session = &sessions[i];
                    if session.end >= merged.start && session.start <= merged.end {
                        let session = sessions.swap_remove(i);
                        merged.start = merged.start.min(session.start);
                        merged.end = merged.end.max(session.end);
                        merged.records += session.records;
                        logic.merge_owned(&mut merged.acc, session.acc);
                    } else {
                        i += 1;
                    }
                }
                logic.add(&mut merged.acc, record);
                merged.records += 1;
                sessions.push(merged);
                self.held = self.held + sessions.len() - before;
            }
        }
        if self.held >= self.limit {
            self.emit_all(out);
        }
    }

    fn on_watermark(
        &mut self,
        watermark: crate::record::Watermark,
        out: &mut Emitter<Partial<K, L::Acc>>,
    ) {
        self.emit_all(out);
        self.watermark = watermark.0;
    }

    fn flush(&mut self, out: &mut Emitter<Partial<K, L::Acc>>) {
        self.emit_all(out);
    }

    fn finish(&mut self, out: &mut Emitter<Partial<K, L::Acc>>) {
        self.emit_all(out);
    }
}

/// The global phase's window function: merges partials into a pane's accumulator with the
/// user's function, and fires as it does.
pub(crate) struct MergeLogic<L, T> {
    inner: L,
    _input: PhantomData<fn(T)>,
}

impl<L: Clone, T> Clone for MergeLogic<L, T> {
    fn clone(&self) -> Self {
        MergeLogic {
            inner: self.inner.clone(),
            _input: PhantomData,
        }
    }
}

impl<L, T> MergeLogic<L, T> {
    pub(crate) fn new(inner: L) -> Self {
        MergeLogic {
            inner,
            _input: PhantomData,
        }
    }
}

impl<K, W, T, O, L> WindowLogic<K, W, Partial<K, L::Acc>, O> for MergeLogic<L, T>
where
    K: 'static,
    T: 'static,
    L: WindowLogic<K, W, T, O>,
{
    type Acc = L::Acc;

    fn create(&self, key: &K) -> L::Acc {
        self.inner.create(key)
    }

    #[inline]
    fn add(&mut self, acc: &mut L::Acc, value: Partial<K, L::Acc>) {
        self.inner.merge_owned(acc, value.acc);
    }

    fn merge_owned(&mut self, into: &mut L::Acc, from: L::Acc) {
        self.inner.merge_owned(into, from);
    }

    fn fire(&mut self, key: &K, window: &W, panes: &[&L::Acc], timestamp: i64, out: &mut Batch<O>) {
        self.inner.fire(key, window, panes, timestamp, out);
    }

    fn weight(&self, value: &Partial<K, L::Acc>) -> u64 {
        value.records
    }

    fn acc_codec(&self) -> super::checkpoint::AccCodec<L::Acc> {
        self.inner.acc_codec()
    }

    fn stored_codec(&self) -> Option<super::checkpoint::AccCodec<L::Acc>> {
        self.inner.stored_codec()
    }

    fn snapshot_contents(
        &self,
        snapshot: &mut crate::checkpoint::task_state::OperatorSnapshot,
    ) -> Result<(), StateError> {
        self.inner.snapshot_contents(snapshot)
    }
}

impl<K, W, T, O, L> StoredLogic<K, W, Partial<K, L::Acc>, O> for MergeLogic<L, T>
where
    K: 'static,
    T: 'static,
    L: StoredLogic<K, W, T, O>,
{
    type Contents = L::Contents;

    fn register(backend: &LocalKeyedBackend<K, u64>) -> Result<L::Contents, StateError> {
        L::register(backend)
    }

    fn add_stored(
        &mut self,
        contents: &L::Contents,
        value: Partial<K, L::Acc>,
    ) -> Result<(), StateError> {
        self.inner.merge_stored(contents, value.acc)
    }

    fn add_new(
        &mut self,
        contents: &L::Contents,
        value: Partial<K, L::Acc>,
    ) -> Result<(), StateError> {
        self.inner.merge_new(contents, value.acc)
    }

    fn merge_new(&mut self, contents: &L::Contents, from: L::Acc) -> Result<(), StateError> {
        self.inner.merge_new(contents, from)
    }

    fn load(&mut self, contents: &L::Contents) -> Result<L::Acc, StateError> {
        self.inner.load(contents)
    }

    fn merge_stored(&mut self, contents: &L::Contents, from: L::Acc) -> Result<(), StateError> {
        self.inner.merge_stored(contents, from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rkyv::ser::allocator::Arena;

    proptest! {
        #[test]
        fn partials_round_trip(key in ".{0,40}", pane in any::<i64>(), acc in any::<(u64, i32)>(), records in any::<u64>()) {
            #[repr(align(16))]
            struct Aligned([u8; 512]);
            let mut buf = Aligned([0; 512]);
            let partial = Partial { key: key.clone(), start: pane, end: pane.saturating_add(1), acc, records };
            let len = partial.encode(&mut buf.0, &mut Scratch::new(&mut Arena::new())).expect("fits");
            // SAFETY: decoding exactly what `encode` wrote for this type.
            let back: Partial<String, (u64, i32)> = unsafe { Partial::decode(&buf.0[..len]) };
            prop_assert_eq!((back.key, back.start, back.end, back.acc, back.records), (key, pane, pane.saturating_add(1), acc, records));
            prop_assert!(partial.encode(&mut buf.0[..len - 1], &mut Scratch::new(&mut Arena::new())).is_none());
        }
    }
}
