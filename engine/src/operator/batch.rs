//! Batches: what chained operators hand each other — records and, beside them, their event-time
//! timestamps — and the buffers an operator emits into (its main output plus side outputs).

use std::any::Any;
use std::sync::Arc;

use super::{ChainEvent, LocalBoxFuture, Output};
use crate::error::TaskResult;
use crate::record::NO_TIMESTAMP;

/// Records with their timestamps (`NO_TIMESTAMP` where a record has none), in two parallel
/// vectors of equal length: an operator that maps records in place leaves the timestamps alone.
pub(crate) struct Batch<T> {
    pub(crate) records: Vec<T>,
    pub(crate) timestamps: Vec<i64>,
    /// An emitter's main output only: full chunks of `spill_at` records set aside when one
    /// call emits more than that (a window firing for every key), so that the batch never
    /// grows by reallocating — copying what it holds and touching fresh pages — however much
    /// a call emits. They go downstream before `records` ([`Batch::take_spilled`]).
    spilled: Vec<Batch<T>>,
    /// Chunk size; 0: never spill (every other batch).
    spill_at: usize,
}

impl<T> Default for Batch<T> {
    fn default() -> Self {
        Batch::with_capacity(0)
    }
}

impl<T> Batch<T> {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Batch {
            records: Vec::with_capacity(capacity),
            timestamps: Vec::with_capacity(capacity),
            spilled: Vec::new(),
            spill_at: 0,
        }
    }

    /// An emitter's main output: spills chunks of `chunk` records (see `spilled`).
    pub(crate) fn spilling(chunk: usize) -> Self {
        Batch {
            spill_at: chunk,
            ..Batch::with_capacity(chunk)
        }
    }

    #[inline]
    pub(crate) fn push(&mut self, record: T, timestamp: i64) {
        if self.spill_at != 0 && self.records.len() >= self.spill_at {
            self.spill();
        }
        self.records.push(record);
        self.timestamps.push(timestamp);
    }

    #[cold]
    #[inline(never)]
    fn spill(&mut self) {
        let records = std::mem::replace(&mut self.records, Vec::with_capacity(self.spill_at));
        let timestamps = std::mem::replace(&mut self.timestamps, Vec::with_capacity(self.spill_at));
        self.spilled.push(Batch {
            records,
            timestamps,
            spilled: Vec::new(),
            spill_at: 0,
        });
    }

    /// The chunks spilled since the last call, oldest first: they precede `records`.
    pub(crate) fn take_spilled(&mut self) -> Vec<Batch<T>> {
        std::mem::take(&mut self.spilled)
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub(crate) fn clear(&mut self) {
        self.records.clear();
        self.timestamps.clear();
    }

    /// Takes every record out, with its timestamp, front to back (see [`Taking`]).
    #[inline]
    pub(crate) fn drain(&mut self) -> Taking<'_, T> {
        let len = self.records.len();
        assert_eq!(
            len,
            self.timestamps.len(),
            "a batch has a timestamp per record"
        );
        // SAFETY: the records in `0..len` are now owned by the cursor, which reads each once
        // and drops (also when unwinding) the ones it did not hand out; the length is 0
        // meanwhile, so the vector itself never drops them.
        unsafe { self.records.set_len(0) };
        Taking {
            records: &mut self.records,
            timestamps: &mut self.timestamps,
            next: 0,
            len,
        }
    }

    /// Records the source read (into `records`) get no timestamp.
    pub(crate) fn stamp_missing(&mut self) {
        self.timestamps.resize(self.records.len(), NO_TIMESTAMP);
    }

    /// Appends copies of `other`'s records.
    pub(crate) fn extend_from(&mut self, other: &Batch<T>)
    where
        T: Clone,
    {
        self.records.extend_from_slice(&other.records);
        self.timestamps.extend_from_slice(&other.timestamps);
    }
}

/// A batch's records, taken out by value, each with its timestamp. Each record is read
/// straight from its slot: `Vec::drain` zipped with the timestamps costs a large record (a
/// Nexmark event is 168 bytes) two more copies per step. Records not taken are dropped with
/// the cursor.
pub(crate) struct Taking<'a, T> {
    records: &'a mut Vec<T>,
    /// Left whole until the cursor is dropped.
    timestamps: &'a mut Vec<i64>,
    next: usize,
    len: usize,
}

impl<T> Taking<'_, T> {
    /// The next record, left in its slot, and its timestamp: a consumer that only reads it (to
    /// archive it, say) need not move it out first.
    #[inline(always)]
    pub(crate) fn peek(&self) -> Option<(&T, i64)> {
        if self.next == self.len {
            return None;
        }
        // SAFETY: as in `next`; the slot is not handed out until `next` or `discard` moves past.
        unsafe {
            Some((
                &*self.records.as_ptr().add(self.next),
                *self.timestamps.get_unchecked(self.next),
            ))
        }
    }

    /// Drops the record [`Taking::peek`] showed, in its slot, and moves past it.
    #[inline(always)]
    pub(crate) fn discard(&mut self) {
        if self.next < self.len {
            let i = self.next;
            // Past it first: were its drop to panic, the cursor's own drop must not drop it again.
            self.next += 1;
            // SAFETY: `i < len`, and slot `i` holds a record no one has read out (`Batch::drain`).
            unsafe { std::ptr::drop_in_place(self.records.as_mut_ptr().add(i)) };
        }
    }
}

impl<T> Iterator for Taking<'_, T> {
    type Item = (T, i64);

    #[inline(always)]
    fn next(&mut self) -> Option<(T, i64)> {
        if self.next == self.len {
            return None;
        }
        let i = self.next;
        self.next += 1;
        // SAFETY: `i < len`: slot `i` holds a record no one else reads (see `Batch::drain`),
        // and there are `len` timestamps.
        unsafe {
            Some((
                self.records.as_ptr().add(i).read(),
                *self.timestamps.get_unchecked(i),
            ))
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.len - self.next;
        (left, Some(left))
    }
}

impl<T> Drop for Taking<'_, T> {
    fn drop(&mut self) {
        // SAFETY: slots `next..len` still hold records that were not handed out.
        unsafe {
            let rest = std::ptr::slice_from_raw_parts_mut(
                self.records.as_mut_ptr().add(self.next),
                self.len - self.next,
            );
            std::ptr::drop_in_place(rest);
        }
        self.timestamps.clear();
    }
}

/// Identifies a side output of an operator: a name and the record type `T` that goes there
/// (Flink's `OutputTag`). Two tags are the same output when their names are equal.
pub struct OutputTag<T> {
    pub(crate) id: Arc<str>,
    _record: std::marker::PhantomData<fn(T)>,
}

impl<T> OutputTag<T> {
    /// A tag named `id`.
    pub fn new(id: &str) -> Self {
        OutputTag {
            id: id.into(),
            _record: std::marker::PhantomData,
        }
    }

    /// The tag's name.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl<T> Clone for OutputTag<T> {
    fn clone(&self) -> Self {
        OutputTag {
            id: Arc::clone(&self.id),
            _record: std::marker::PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for OutputTag<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OutputTag({}: {})", self.id, std::any::type_name::<T>())
    }
}

/// One side output's buffer and downstream, with its record type erased.
trait ErasedSideOutput {
    fn buffer(&mut self) -> &mut dyn Any;
    fn output(&mut self) -> &mut dyn ErasedOutput;
    fn take_and_push(&mut self) -> LocalBoxFuture<'_, TaskResult>;
    fn next_processing_time(&self) -> Option<i64>;
}

/// The non-record calls of an [`Output`], whatever its record type.
pub(crate) trait ErasedOutput {
    fn event(&mut self, event: ChainEvent) -> LocalBoxFuture<'_, TaskResult>;
    fn next_processing_time(&self) -> Option<i64>;
}

impl<T: 'static> ErasedOutput for Box<dyn Output<T>> {
    fn event(&mut self, event: ChainEvent) -> LocalBoxFuture<'_, TaskResult> {
        (**self).event(event)
    }
    fn next_processing_time(&self) -> Option<i64> {
        (**self).next_processing_time()
    }
}

struct TypedSideOutput<T> {
    batch: Batch<T>,
    output: Box<dyn Output<T>>,
}

impl<T: 'static> ErasedSideOutput for TypedSideOutput<T> {
    fn buffer(&mut self) -> &mut dyn Any {
        &mut self.batch
    }

    fn output(&mut self) -> &mut dyn ErasedOutput {
        &mut self.output
    }

    fn take_and_push(&mut self) -> LocalBoxFuture<'_, TaskResult> {
        Box::pin(async move {
            if self.batch.is_empty() {
                return Ok(());
            }
            self.output.push(&mut self.batch).await
        })
    }

    fn next_processing_time(&self) -> Option<i64> {
        self.output.next_processing_time()
    }
}

/// An operator's side outputs: per tag, a buffer of records waiting to go downstream.
/// Records emitted to a tag nobody asked for (no `get_side_output`) are dropped, as in Flink.
#[derive(Default)]
pub(crate) struct SideOutputs {
    outputs: Vec<(Arc<str>, Box<dyn ErasedSideOutput>)>,
    /// Where the next latency marker goes: 0 the main output, `i` side output `i - 1`.
    next_marker: usize,
}

impl SideOutputs {
    pub(crate) fn add<T: 'static>(&mut self, tag: Arc<str>, output: Box<dyn Output<T>>) {
        self.outputs.push((
            tag,
            Box::new(TypedSideOutput {
                batch: Batch::default(),
                output,
            }),
        ));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.outputs.is_empty()
    }

    /// Buffers `record` for the side output `tag`.
    pub(crate) fn emit<T: 'static>(&mut self, tag: &OutputTag<T>, record: T, timestamp: i64) {
        let Some((_, side)) = self.outputs.iter_mut().find(|(id, _)| *id == tag.id) else {
            return;
        };
        match side.buffer().downcast_mut::<Batch<T>>() {
            Some(batch) => batch.push(record, timestamp),
            None => panic!(
                "side output '{}' was read as a stream of another type than {} it is emitted as; \
                 use one OutputTag type per name",
                tag.id,
                std::any::type_name::<T>()
            ),
        }
    }

    /// Sends every buffered side-output record downstream.
    pub(crate) async fn push_all(&mut self) -> TaskResult {
        for (_, side) in &mut self.outputs {
            side.take_and_push().await?;
        }
        Ok(())
    }

    /// Passes `event` to every side output and to `main`, the operator's main output; a
    /// latency marker to one of them, each in turn (as Flink's broadcasting output sends it
    /// to one, at random).
    pub(crate) async fn pass_on<T>(
        &mut self,
        main: &mut dyn Output<T>,
        event: ChainEvent,
    ) -> TaskResult {
        if let ChainEvent::LatencyMarker(_) = event {
            let one = self.next_marker % (self.outputs.len() + 1);
            self.next_marker = one + 1;
            return match one {
                0 => main.event(event).await,
                side => self.outputs[side - 1].1.output().event(event).await,
            };
        }
        for (_, side) in &mut self.outputs {
            side.output().event(event).await?;
        }
        main.event(event).await
    }

    pub(crate) fn next_processing_time(&self) -> Option<i64> {
        self.outputs
            .iter()
            .filter_map(|(_, side)| side.next_processing_time())
            .min()
    }
}

/// What an operator emits into while it handles a record, a watermark or a timer: its main
/// output batch and its side outputs. The driving link sends both on afterwards.
pub(crate) struct Emitter<O> {
    pub(crate) main: Batch<O>,
    pub(crate) side: SideOutputs,
}

impl<O> Emitter<O> {
    pub(crate) fn new(capacity: usize, side: SideOutputs) -> Self {
        Emitter {
            main: Batch::spilling(capacity),
            side,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn draining_hands_out_records_with_their_timestamps_and_drops_the_rest_once() {
        let alive = Rc::new(());
        let mut batch = Batch::with_capacity(4);
        for n in 0..4 {
            batch.push((n, Rc::clone(&alive)), n * 10);
        }
        let taken: Vec<(i64, i64)> = batch
            .drain()
            .take(2)
            .map(|((n, _), timestamp)| (n, timestamp))
            .collect();
        assert_eq!(taken, [(0, 0), (1, 10)]);
        assert!(batch.is_empty() && batch.timestamps.is_empty());
        assert_eq!(
            Rc::strong_count(&alive),
            1,
            "the two not taken were dropped"
        );

        batch.push((7, Rc::clone(&alive)), 70);
        let all: Vec<(i64, i64)> = batch.drain().map(|((n, _), t)| (n, t)).collect();
        assert_eq!(all, [(7, 70)], "the batch is reusable after a drain");
        assert_eq!(Rc::strong_count(&alive), 1);
    }

    #[test]
    fn an_emitters_batch_spills_full_chunks_in_order_without_growing() {
        let mut batch = Batch::spilling(4);
        for n in 0..10u32 {
            batch.push(n, i64::from(n) * 10);
        }
        assert!(batch.records.capacity() <= 4, "never grown past a chunk");
        let spilled = batch.take_spilled();
        let chunks: Vec<(Vec<u32>, Vec<i64>)> = spilled
            .into_iter()
            .map(|chunk| (chunk.records, chunk.timestamps))
            .collect();
        assert_eq!(
            chunks,
            vec![
                (vec![0, 1, 2, 3], vec![0, 10, 20, 30]),
                (vec![4, 5, 6, 7], vec![40, 50, 60, 70])
            ]
        );
        assert_eq!(
            (batch.records.clone(), batch.timestamps.clone()),
            (vec![8, 9], vec![80, 90])
        );
        assert!(batch.take_spilled().is_empty(), "taken once");

        // Other batches grow as vectors do.
        let mut plain = Batch::with_capacity(2);
        for n in 0..10u32 {
            plain.push(n, 0);
        }
        assert_eq!(plain.len(), 10);
        assert!(plain.take_spilled().is_empty());
    }
}
