//! A data generator source: record `i` is `generator(i)`, for `i` in `0..count` (or forever).
//!
//! By default subtask `s` of `p` generates indices `s, s + p, s + 2p, …` (one strided slice
//! each). With [`DataGeneratorSource::with_chunks`] the sequence is handed out in chunks of
//! consecutive indices, each to whichever reader asks first (Flink's pull-based split
//! assignment): a reader whose shard has less other work generates more, so the subtasks end
//! together. Either way a split's position is its next index, so a restored split regenerates
//! exactly the records it had not emitted.

use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::LocalBoxFuture;

use super::source::{
    pin_round_robin, Boundedness, ReadStatus, Source, SourceReader, SourceSplit, SplitEnumerator,
    StaticSplits,
};
use super::ConnectorError;
use crate::operator::RuntimeContext;

/// A part of the generated sequence: from `first`, runs of `run` consecutive indices that
/// start every `stride` indices, below `end` (and the source's count). The strided slice `s`
/// of `p` is `first = s, stride = p, run = 1`; a chunk is `stride = run = 1` up to its `end`;
/// a spread run's executors deal the chunks out in turn (`run` = the chunk, `stride` = the
/// chunk times the readers).
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct GeneratorSplit {
    /// The first index (the split's id).
    pub first: u64,
    /// The distance between the starts of consecutive runs.
    pub stride: u64,
    /// Consecutive indices per run (at most `stride`).
    pub run: u64,
    /// One past the last index it may generate (`u64::MAX`: up to the source's count).
    pub end: u64,
    /// The next index to generate (always within a run).
    pub next: u64,
}

impl GeneratorSplit {
    /// Runs of `run` indices every `stride` from `first`, below `end`, read from the start.
    fn runs(first: u64, stride: u64, run: u64, end: u64) -> Self {
        GeneratorSplit {
            first,
            stride,
            run,
            end,
            next: first,
        }
    }

    /// Strided slice `slice` of `slices`.
    fn slice(slice: u64, slices: u64) -> Self {
        GeneratorSplit::runs(slice, slices, 1, u64::MAX)
    }

    /// The indices `first..end`.
    fn range(first: u64, end: u64) -> Self {
        GeneratorSplit::runs(first, 1, 1, end)
    }

    /// The last index it may generate, plus one, in a source of `count` records.
    fn limit(&self, count: u64) -> u64 {
        self.end.min(count)
    }

    /// The rest of this range (a split with stride 1) dealt to `parallelism` readers in
    /// turn, `run` indices at a time: one split per reader.
    fn deal(
        &self,
        parallelism: usize,
        run: u64,
    ) -> impl Iterator<Item = (Option<usize>, GeneratorSplit)> + '_ {
        let readers = parallelism.max(1) as u64;
        (0..readers).map(move |reader| {
            let first = self.next.saturating_add(reader.saturating_mul(run));
            let split = GeneratorSplit::runs(first, run.saturating_mul(readers), run, self.end);
            (Some(reader as usize), split)
        })
    }

    /// The split with a stride and run of at least 1, a run of at most the stride, and `next`
    /// at or after `first` and within a run: what [`GeneratorSplit::generate`] relies on,
    /// whatever a checkpoint held.
    fn normalized(mut self) -> Self {
        self.stride = self.stride.max(1);
        self.run = self.run.clamp(1, self.stride);
        self.next = self.next.max(self.first);
        let offset = (self.next - self.first) % self.stride;
        if offset >= self.run {
            self.next = self.next.saturating_add(self.stride - offset);
        }
        self
    }

    /// Appends the records of up to `budget` indices from `next`, none at or past `limit`,
    /// and moves `next` past them; returns how many. (One call of the generator in one loop:
    /// so it inlines there, as a loop per kind of split would not let it.)
    #[inline]
    fn generate<T, G: Generator<T>>(
        &mut self,
        generator: &G,
        limit: u64,
        budget: u64,
        out: &mut Vec<T>,
    ) -> u64 {
        let mut generated = 0;
        while generated < budget && self.next < limit {
            let (start, left) = (self.next, budget - generated);
            // The indices `start, start + step, ...`, `n` of them, and where `next` goes after.
            let (step, n, after) = if self.run == 1 {
                let n = (limit - start).div_ceil(self.stride).min(left);
                (
                    self.stride,
                    n,
                    start.saturating_add(n.saturating_mul(self.stride)),
                )
            } else {
                let run_start = start - (start - self.first) % self.stride;
                let run_end = run_start.saturating_add(self.run);
                let n = (run_end.min(limit) - start).min(left);
                let after = if start + n == run_end {
                    run_start.saturating_add(self.stride)
                } else {
                    start + n
                };
                (1, n, after)
            };
            let mut filled = Filled::new(out, n as usize);
            for k in 0..n {
                // SAFETY: called `n` times, the number of slots reserved.
                let slot = unsafe { filled.next_slot() };
                let at = slot.as_ptr();
                let written = generator.generate_into(start + k * step, slot);
                // Safe code gets a `&mut T` into the slot only by writing it: this proves the
                // generator wrote the record it was asked for where it was asked to (and is
                // compiled away where `generate_into` inlines).
                assert!(
                    std::ptr::eq(written, at),
                    "a Generator's generate_into returned a record outside the slot it was given"
                );
                filled.count_written();
            }
            generated += n;
            self.next = after;
        }
        generated
    }
}

/// The spare capacity of a vector being written front to back, and its length once it is let go
/// (also when unwinding): as the standard library's `extend` keeps it, so that the length is
/// not stored back after every record.
struct Filled<'a, T> {
    out: &'a mut Vec<T>,
    /// The vector's buffer, and how far it was reserved (read once: a record written through
    /// a slot might, for all the compiler knows, change the vector's own fields).
    base: *mut T,
    end: usize,
    len: usize,
}

impl<'a, T> Filled<'a, T> {
    /// Reserves `additional` slots of `out` to be written.
    fn new(out: &'a mut Vec<T>, additional: usize) -> Self {
        out.reserve(additional);
        let len = out.len();
        Filled {
            base: out.as_mut_ptr(),
            end: len + additional,
            out,
            len,
        }
    }

    /// The first slot not yet written.
    ///
    /// # Safety
    /// Only while fewer than the slots reserved were counted written (`len < end`).
    #[inline(always)]
    unsafe fn next_slot(&mut self) -> &mut MaybeUninit<T> {
        debug_assert!(self.len < self.end, "a reserved slot");
        // SAFETY: `len < end <= capacity` (the caller's promise): inside the allocation, past
        // the records counted.
        unsafe { &mut *self.base.add(self.len).cast::<MaybeUninit<T>>() }
    }

    /// The slot [`Filled::next_slot`] gave holds a record.
    #[inline(always)]
    fn count_written(&mut self) {
        self.len += 1;
    }
}

impl<T> Drop for Filled<'_, T> {
    fn drop(&mut self) {
        // SAFETY: slots up to `len` hold records: each was counted once written.
        unsafe { self.out.set_len(self.len) };
    }
}

impl SourceSplit for GeneratorSplit {
    fn split_id(&self) -> String {
        let GeneratorSplit {
            first,
            stride,
            run,
            end,
            ..
        } = *self;
        let until = if end == u64::MAX {
            String::new()
        } else {
            format!("..{end}")
        };
        match (stride, run, end) {
            // A whole strided slice (of one: the whole sequence).
            (_, 1, u64::MAX) if first < stride => format!("generator-{first}-of-{stride}"),
            (1, 1, _) => format!("generator-{first}..{}", until.trim_start_matches("..")),
            (_, 1, _) => format!("generator-{first}-of-{stride}{until}"),
            _ => format!("generator-{first}-of-{stride}-in-runs-of-{run}{until}"),
        }
    }
}

/// Makes record `i` from its index. Any `Fn(u64) -> T` is one; it is called directly (not
/// through a trait object) so that generation inlines into the reader's loop.
pub trait Generator<T>: Send + Sync + 'static {
    /// Record number `index`.
    fn generate(&self, index: u64) -> T;

    /// Writes record number `index` into `slot` (the reader's batch) and returns it there
    /// (`slot.write(..)`'s result): the reader counts the slot only if the record returned is
    /// in it. A generator of large records overrides it to build each record where it is
    /// stored: a returned one is built on the stack and copied over.
    #[inline]
    fn generate_into<'a>(&self, index: u64, slot: &'a mut MaybeUninit<T>) -> &'a mut T {
        slot.write(self.generate(index))
    }
}

impl<T, F: Fn(u64) -> T + Send + Sync + 'static> Generator<T> for F {
    #[inline]
    fn generate(&self, index: u64) -> T {
        self(index)
    }
}

/// The numbers `from, from + 1, …`.
#[derive(Clone, Copy, Debug)]
pub struct Sequence {
    from: u64,
}

impl Generator<u64> for Sequence {
    #[inline]
    fn generate(&self, index: u64) -> u64 {
        self.from + index
    }
}

/// Generates records from their index. See the module docs.
pub struct DataGeneratorSource<T, G> {
    generator: Arc<G>,
    count: Option<u64>,
    records_per_second: Option<f64>,
    chunk: Option<u64>,
    _record: PhantomData<fn() -> T>,
}

impl DataGeneratorSource<u64, Sequence> {
    /// The numbers `from..to` (Flink's `fromSequence`, end exclusive).
    pub fn sequence(from: u64, to: u64) -> Self {
        DataGeneratorSource::new(Some(to.saturating_sub(from)), Sequence { from })
    }
}

impl<T, G: Generator<T>> DataGeneratorSource<T, G> {
    /// `count` records (unbounded if `None`), record `i` being `generator(i)`.
    pub fn new(count: Option<u64>, generator: G) -> Self {
        DataGeneratorSource {
            generator: Arc::new(generator),
            count,
            records_per_second: None,
            chunk: None,
            _record: PhantomData,
        }
    }

    /// Throttles the whole source (all subtasks together) to this rate.
    pub fn with_rate(mut self, records_per_second: f64) -> Self {
        self.records_per_second = Some(records_per_second);
        self
    }

    /// Hands the sequence out in chunks of `records` consecutive indices, each to whichever
    /// reader asks first, instead of one strided slice per subtask: a reader that has the
    /// time generates more. (In a run spread over several executors each serves its own
    /// readers, so there the chunks are dealt to the readers in turn.)
    ///
    /// # Panics
    /// If `records` is 0.
    pub fn with_chunks(mut self, records: u64) -> Self {
        assert!(
            records > 0,
            "DataGeneratorSource::with_chunks(0): a chunk needs at least one record (65536 is a good size)"
        );
        self.chunk = Some(records);
        self
    }
}

impl<T: Send + 'static, G: Generator<T>> Source<T> for DataGeneratorSource<T, G> {
    type Split = GeneratorSplit;

    fn boundedness(&self) -> Boundedness {
        if self.count.is_some() {
            Boundedness::Bounded
        } else {
            Boundedness::Unbounded
        }
    }

    fn create_enumerator(&self, parallelism: usize) -> Box<dyn SplitEnumerator<GeneratorSplit>> {
        if self.chunk.is_some() {
            return self.restore_enumerator(
                parallelism,
                vec![(None, GeneratorSplit::range(0, u64::MAX))],
            );
        }
        let slices = parallelism as u64;
        let splits = (0..slices)
            .map(|slice| GeneratorSplit::slice(slice, slices))
            .collect();
        Box::new(StaticSplits::pinned(splits, parallelism))
    }

    fn create_reader(&self, ctx: &RuntimeContext) -> Box<dyn SourceReader<T, GeneratorSplit>> {
        Box::new(GeneratorReader::<T, G> {
            generator: Arc::clone(&self.generator),
            count: self.count.unwrap_or(u64::MAX),
            rate: self.records_per_second.map(|r| r / ctx.parallelism as f64),
            splits: Vec::new(),
            added: 0,
            polls: 0,
            started: None,
            emitted: 0,
            _record: PhantomData,
        })
    }

    fn restore_enumerator(
        &self,
        parallelism: usize,
        pending: Vec<(Option<usize>, GeneratorSplit)>,
    ) -> Box<dyn SplitEnumerator<GeneratorSplit>> {
        match self.chunk {
            Some(chunk) => Box::new(Chunks {
                splits: pending,
                chunk,
                count: self.count.unwrap_or(u64::MAX),
            }),
            // A checkpoint of a chunked run: what no reader took yet is cut into one strided
            // slice per reader, as a fresh run's.
            None => Box::new(StaticSplits::restored(
                pending
                    .into_iter()
                    .flat_map(|(owner, split)| strided(parallelism, owner, split))
                    .collect(),
            )),
        }
    }

    /// Chunks are dealt out in turn: each free range becomes one split per reader, of every
    /// `parallelism`-th chunk.
    fn pin_splits(
        &self,
        parallelism: usize,
        pending: Vec<(Option<usize>, GeneratorSplit)>,
    ) -> Vec<(Option<usize>, GeneratorSplit)> {
        let Some(chunk) = self.chunk else {
            return pin_round_robin(parallelism, pending);
        };
        let (ranges, others): (Vec<_>, Vec<_>) = pending
            .into_iter()
            .partition(|(owner, split)| open_range(*owner, split));
        let mut pinned = pin_round_robin(parallelism, others);
        for (_, range) in &ranges {
            pinned.extend(range.deal(parallelism, chunk));
        }
        pinned
    }
}

/// `split` as pending splits of a source without chunks: a range any reader may take becomes
/// one strided slice of it per reader; any other split stays as it is.
fn strided(
    parallelism: usize,
    owner: Option<usize>,
    split: GeneratorSplit,
) -> Vec<(Option<usize>, GeneratorSplit)> {
    if !open_range(owner, &split) {
        return vec![(owner, split)];
    }
    split.deal(parallelism, 1).collect()
}

/// Whether `split` (held for `owner`) is a range any reader may take: what a chunked
/// enumerator cuts chunks off, and what is dealt out when chunks are pinned or given up.
fn open_range(owner: Option<usize>, split: &GeneratorSplit) -> bool {
    owner.is_none() && split.stride == 1
}

/// The enumerator of a chunked source: cuts chunks off the front of its first range any
/// reader may take; any other split goes whole.
struct Chunks {
    splits: Vec<(Option<usize>, GeneratorSplit)>,
    chunk: u64,
    /// The source's count (`u64::MAX`: unbounded).
    count: u64,
}

impl SplitEnumerator<GeneratorSplit> for Chunks {
    fn next_split(&mut self, subtask: usize) -> Option<GeneratorSplit> {
        loop {
            let index = self
                .splits
                .iter()
                .position(|(owner, _)| owner.is_none_or(|o| o == subtask))?;
            let (owner, split) = &mut self.splits[index];
            let limit = split.limit(self.count);
            if split.next >= limit {
                self.splits.remove(index);
                continue;
            }
            // Only a range any reader may take is cut; a reader's own split goes whole.
            if !open_range(*owner, split) {
                return Some(self.splits.remove(index).1);
            }
            let end = limit.min(split.next.saturating_add(self.chunk));
            let chunk = GeneratorSplit::range(split.next, end);
            if end == limit {
                self.splits.remove(index);
            } else {
                split.next = end;
                split.first = end;
            }
            return Some(chunk);
        }
    }

    fn snapshot_state(&self) -> Vec<(Option<usize>, GeneratorSplit)> {
        self.splits.clone()
    }
}

struct GeneratorReader<T, G> {
    generator: Arc<G>,
    _record: PhantomData<fn() -> T>,
    count: u64,
    rate: Option<f64>,
    /// Splits with their numbers (in the order they were added).
    splits: Vec<(u32, GeneratorSplit)>,
    added: u32,
    /// Polls so far: a reader holding several splits (restored into fewer readers) reads
    /// them in turn, so that every one of them moves on, and with it event time.
    polls: usize,
    started: Option<Instant>,
    emitted: u64,
}

impl<T, G: Generator<T>> SourceReader<T, GeneratorSplit> for GeneratorReader<T, G> {
    fn add_split(&mut self, split: GeneratorSplit) {
        self.splits.push((self.added, split.normalized()));
        self.added += 1;
    }

    fn poll_next<'a>(
        &'a mut self,
        out: &'a mut Vec<T>,
        max: usize,
    ) -> LocalBoxFuture<'a, Result<ReadStatus, ConnectorError>> {
        if self.splits.is_empty() {
            // Ask for work before pacing: a split the reader holds, even one it is slow to
            // read, counts for event time (and idleness) downstream.
            return Box::pin(async { Ok(ReadStatus::NeedSplit) });
        }
        let mut budget = max as u64;
        if let Some(rate) = self.rate {
            let started = *self.started.get_or_insert_with(Instant::now);
            let due = (started.elapsed().as_secs_f64() * rate) as u64;
            if due <= self.emitted {
                let wait = Duration::from_secs_f64((self.emitted + 1 - due) as f64 / rate);
                return Box::pin(async move { Ok(ReadStatus::Idle(wait)) });
            }
            budget = budget.min(due - self.emitted);
        }
        let at = self.polls % self.splits.len();
        self.polls = self.polls.wrapping_add(1);
        let (number, split) = &mut self.splits[at];
        let limit = split.limit(self.count);
        let status = if split.next >= limit {
            let split = *number;
            self.splits.remove(at);
            ReadStatus::SplitFinished { split }
        } else {
            self.emitted += split.generate(&*self.generator, limit, budget, out);
            ReadStatus::Records { split: *number }
        };
        Box::pin(async move { Ok(status) })
    }

    fn snapshot_splits(&self) -> Vec<GeneratorSplit> {
        self.splits.iter().map(|(_, s)| s.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(subtask: usize, parallelism: usize) -> RuntimeContext {
        RuntimeContext::new("gen", subtask, parallelism, 128)
    }

    #[test]
    fn slices_cover_the_sequence_once_and_resume_from_snapshot() {
        let source = DataGeneratorSource::sequence(10, 1010);
        let mut enumerator = source.create_enumerator(3);
        let mut all = Vec::new();
        for s in 0..3 {
            let mut reader = source.create_reader(&ctx(s, 3));
            reader.add_split(enumerator.next_split(s).unwrap());
            assert!(enumerator.next_split(s).is_none());
            let mut out = Vec::new();
            // Read a little, snapshot, and resume in a fresh reader.
            assert_eq!(
                futures::executor::block_on(reader.poll_next(&mut out, 7)).unwrap(),
                ReadStatus::Records { split: 0 }
            );
            let mut resumed = source.create_reader(&ctx(s, 3));
            for split in reader.snapshot_splits() {
                resumed.add_split(split);
            }
            loop {
                match futures::executor::block_on(resumed.poll_next(&mut out, 100)).unwrap() {
                    ReadStatus::Records { split: 0 } | ReadStatus::SplitFinished { split: 0 } => {}
                    ReadStatus::Records { .. } | ReadStatus::SplitFinished { .. } => {
                        unreachable!("one split")
                    }
                    ReadStatus::NeedSplit => break,
                    ReadStatus::Idle(_) => unreachable!(),
                }
            }
            all.extend(out);
        }
        all.sort_unstable();
        assert_eq!(all, (10..1010).collect::<Vec<u64>>());
    }

    /// Reads what `reader` holds to its end in polls of up to `budget` records.
    fn read_all(
        reader: &mut Box<dyn SourceReader<u64, GeneratorSplit>>,
        budget: usize,
        out: &mut Vec<u64>,
    ) {
        loop {
            match futures::executor::block_on(reader.poll_next(out, budget)).unwrap() {
                ReadStatus::Records { .. } | ReadStatus::SplitFinished { .. } => {}
                ReadStatus::NeedSplit => return,
                ReadStatus::Idle(_) => unreachable!("not throttled"),
            }
        }
    }

    #[test]
    fn chunks_go_to_whoever_asks_and_cover_the_sequence_once() {
        let source = DataGeneratorSource::sequence(5, 1005).with_chunks(64);
        let mut enumerator = source.create_enumerator(2);
        let mut readers: Vec<_> = (0..2).map(|s| source.create_reader(&ctx(s, 2))).collect();
        let mut got = [Vec::new(), Vec::new()];
        // Reader 0 is three times as quick: it asks three times for each time reader 1 does.
        let mut ids = Vec::new();
        for turn in 0.. {
            let subtask = usize::from(turn % 4 == 3);
            let Some(split) = enumerator.next_split(subtask) else {
                break;
            };
            ids.push(split.split_id());
            let before = got[subtask].len();
            readers[subtask].add_split(split);
            read_all(&mut readers[subtask], 10, &mut got[subtask]);
            let chunk = &got[subtask][before..];
            assert!(chunk.len() <= 64, "a chunk holds at most 64 records");
            assert!(chunk.windows(2).all(|w| w[1] == w[0] + 1), "{chunk:?}");
        }
        assert_eq!(ids[0], "generator-0..64");
        assert_eq!(ids.len(), 16, "{ids:?}");
        assert!(
            got[0].len() > 2 * got[1].len(),
            "the quicker reader read more"
        );
        let mut all = [got[0].clone(), got[1].clone()].concat();
        all.sort_unstable();
        assert_eq!(all, (5..1005).collect::<Vec<u64>>());
    }

    #[test]
    fn an_unbounded_chunked_source_hands_out_chunks_forever() {
        let source = DataGeneratorSource::new(None, |i: u64| i).with_chunks(1_000);
        let mut enumerator = source.create_enumerator(3);
        for k in 0..100u64 {
            let split = enumerator.next_split((k % 3) as usize).expect("no end");
            assert_eq!((split.next, split.end), (k * 1_000, (k + 1) * 1_000));
        }
        // What is pending is one range from the first index not handed out.
        let pending = enumerator.snapshot_state();
        assert_eq!(pending.len(), 1, "{pending:?}");
        assert_eq!((pending[0].1.next, pending[0].1.end), (100_000, u64::MAX));
    }

    #[test]
    fn a_chunked_run_resumes_from_its_snapshot_with_every_record_once() {
        let source = DataGeneratorSource::sequence(0, 1000).with_chunks(50);
        let mut enumerator = source.create_enumerator(2);
        let mut out = Vec::new();
        let mut readers: Vec<_> = (0..2).map(|s| source.create_reader(&ctx(s, 2))).collect();
        for reader in &mut readers {
            let split = enumerator.next_split(0).unwrap();
            reader.add_split(split);
        }
        // Reader 0 finishes its chunk and starts another; reader 1 is half way through its.
        read_all(&mut readers[0], 7, &mut out);
        readers[0].add_split(enumerator.next_split(0).unwrap());
        for reader in &mut readers {
            assert!(matches!(
                futures::executor::block_on(reader.poll_next(&mut out, 25)).unwrap(),
                ReadStatus::Records { .. }
            ));
        }
        // The checkpoint: the readers' positions and the enumerator's pending splits.
        let positions: Vec<_> = readers.iter().map(|r| r.snapshot_splits()).collect();
        let pending = enumerator.snapshot_state();
        drop((readers, enumerator));

        // The run restarts with three readers (rescaled): each gets its positions back, and
        // the restored enumerator cuts chunks from what was pending.
        let mut enumerator = source.restore_enumerator(3, pending);
        for splits in positions {
            let mut reader = source.create_reader(&ctx(0, 3));
            for split in splits {
                reader.add_split(split);
            }
            read_all(&mut reader, 9, &mut out);
        }
        let mut reader = source.create_reader(&ctx(2, 3));
        while let Some(split) = enumerator.next_split(2) {
            assert!(split.end - split.next <= 50, "{split:?}");
            reader.add_split(split);
            read_all(&mut reader, 13, &mut out);
        }
        out.sort_unstable();
        assert_eq!(out, (0..1000).collect::<Vec<u64>>());
    }

    #[test]
    fn executors_of_a_spread_run_deal_the_chunks_out_in_turn() {
        let source = DataGeneratorSource::sequence(0, 1_030).with_chunks(100);
        let fresh = source.create_enumerator(3).snapshot_state();
        let pinned = source.pin_splits(3, fresh);
        assert_eq!(pinned.len(), 3);
        let mut all = Vec::new();
        for subtask in 0..3 {
            // Each executor makes the same enumerator and serves its own reader from it.
            let mut enumerator = source.restore_enumerator(3, pinned.clone());
            let split = enumerator.next_split(subtask).expect("one split each");
            assert_eq!(
                split.split_id(),
                format!("generator-{}-of-300-in-runs-of-100", subtask * 100)
            );
            assert!(enumerator.next_split(subtask).is_none());
            let mut reader = source.create_reader(&ctx(subtask, 3));
            reader.add_split(split);
            let mut out = Vec::new();
            read_all(&mut reader, 33, &mut out);
            // Chunks subtask, subtask + 3, ...: runs of 100 consecutive indices, 300 apart.
            let expected: Vec<u64> = (0..1_030)
                .filter(|i| (i / 100) % 3 == subtask as u64)
                .collect();
            assert_eq!(out, expected, "subtask {subtask}");
            all.extend(out);
        }
        all.sort_unstable();
        assert_eq!(all, (0..1_030).collect::<Vec<u64>>());
    }

    #[test]
    fn a_chunked_checkpoint_restored_without_chunks_gives_each_reader_a_slice_of_the_rest() {
        let chunked = DataGeneratorSource::sequence(0, 1_000).with_chunks(100);
        let mut enumerator = chunked.create_enumerator(2);
        let mut out = Vec::new();
        let mut first = chunked.create_reader(&ctx(0, 2));
        first.add_split(enumerator.next_split(0).unwrap());
        read_all(&mut first, 64, &mut out);
        let pending = enumerator.snapshot_state();
        assert_eq!(pending[0].1.split_id(), "generator-100..");

        let plain = DataGeneratorSource::sequence(0, 1_000);
        let mut enumerator = plain.restore_enumerator(3, pending);
        for subtask in 0..3 {
            let mut reader = plain.create_reader(&ctx(subtask, 3));
            let split = enumerator.next_split(subtask).expect("a slice each");
            assert_eq!(split.stride, 3, "{split:?}");
            reader.add_split(split);
            assert!(enumerator.next_split(subtask).is_none());
            read_all(&mut reader, 64, &mut out);
        }
        out.sort_unstable();
        assert_eq!(out, (0..1_000).collect::<Vec<u64>>());
    }

    /// Whether generating records `0..count` of one split into `out` panics.
    fn generating_panics<T>(generator: &impl Generator<T>, count: u64, out: &mut Vec<T>) -> bool {
        let mut split = GeneratorSplit {
            first: 0,
            stride: 1,
            run: 1,
            end: count,
            next: 0,
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            split.generate(generator, count, count, out)
        }))
        .is_err()
    }

    #[test]
    fn a_generator_that_panics_leaves_the_records_it_made_in_the_batch() {
        // Records that count their drops: one made before the panic is held by the batch and
        // dropped once with it; none is counted that was not written.
        use std::sync::atomic::{AtomicUsize, Ordering};
        let drops = Arc::new(AtomicUsize::new(0));
        struct Counted(u64, Arc<AtomicUsize>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.1.fetch_add(1, Ordering::Relaxed);
            }
        }
        let counter = Arc::clone(&drops);
        let generator = move |i: u64| {
            assert!(i != 5, "record 5 cannot be made");
            Counted(i, Arc::clone(&counter))
        };
        let mut out = Vec::new();
        assert!(generating_panics(&generator, 10, &mut out));
        assert_eq!(
            out.iter().map(|c| c.0).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4]
        );
        drop(out);
        assert_eq!(drops.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn a_generator_that_leaves_its_slot_empty_is_stopped_before_the_slot_is_counted() {
        // It returns a record of its own instead of writing the slot (safe code can): the
        // reader must not count the slot, which holds nothing.
        struct Elsewhere;
        impl Generator<String> for Elsewhere {
            fn generate(&self, index: u64) -> String {
                index.to_string()
            }
            fn generate_into<'a>(
                &self,
                index: u64,
                _slot: &'a mut MaybeUninit<String>,
            ) -> &'a mut String {
                Box::leak(Box::new(self.generate(index)))
            }
        }
        let mut out = Vec::new();
        assert!(generating_panics(&Elsewhere, 3, &mut out));
        assert!(out.is_empty());
    }

    #[test]
    fn splits_end_at_the_top_of_the_index_range() {
        let source = DataGeneratorSource::new(None, |i: u64| i);
        let top = u64::MAX;
        for (split, expected) in [
            // Strided: the last index a stride of 3 reaches below the top.
            (
                GeneratorSplit {
                    first: top - 10,
                    stride: 3,
                    run: 1,
                    end: top,
                    next: top - 10,
                },
                vec![top - 10, top - 7, top - 4, top - 1],
            ),
            // Dealt runs of 4 every 8, the last one cut by the top.
            (
                GeneratorSplit {
                    first: top - 13,
                    stride: 8,
                    run: 4,
                    end: top,
                    next: top - 12,
                },
                vec![
                    top - 12,
                    top - 11,
                    top - 10,
                    top - 5,
                    top - 4,
                    top - 3,
                    top - 2,
                ],
            ),
        ] {
            let mut reader = source.create_reader(&ctx(0, 1));
            reader.add_split(split);
            let mut out = Vec::new();
            read_all(&mut reader, 3, &mut out);
            assert_eq!(out, expected);
        }
    }

    #[test]
    fn a_reader_given_several_unbounded_splits_reads_each_of_them() {
        let source = DataGeneratorSource::new(None, |i: u64| i);
        let mut enumerator = source.create_enumerator(3);
        // Three slices, restored into one reader.
        let mut reader = source.create_reader(&ctx(0, 1));
        for subtask in 0..3 {
            reader.add_split(enumerator.next_split(subtask).unwrap());
        }
        let mut out = Vec::new();
        let mut read = [0; 3];
        for _ in 0..30 {
            match futures::executor::block_on(reader.poll_next(&mut out, 10)).unwrap() {
                ReadStatus::Records { split } => read[split as usize] += 1,
                other => unreachable!("{other:?}"),
            }
        }
        assert_eq!(read, [10, 10, 10]);
        let positions: Vec<u64> = reader.snapshot_splits().iter().map(|s| s.next).collect();
        assert_eq!(positions, [300, 301, 302]);
    }

    #[test]
    fn a_split_of_impossible_shape_is_read_as_the_nearest_possible_one() {
        let source = DataGeneratorSource::sequence(0, 20);
        for (split, expected) in [
            // No stride: every index from `first`.
            ((3, 0, 0, u64::MAX, 3), (3..20).collect::<Vec<u64>>()),
            // `next` between runs: from the next run on.
            ((0, 10, 2, u64::MAX, 5), vec![10, 11]),
            // `next` before `first`.
            ((15, 1, 1, u64::MAX, 2), (15..20).collect()),
        ] {
            let (first, stride, run, end, next) = split;
            let mut reader = source.create_reader(&ctx(0, 1));
            reader.add_split(GeneratorSplit {
                first,
                stride,
                run,
                end,
                next,
            });
            let mut out = Vec::new();
            read_all(&mut reader, 4, &mut out);
            assert_eq!(out, expected, "{split:?}");
        }
    }

    #[test]
    fn strided_slices_keep_their_ids() {
        let source = DataGeneratorSource::sequence(0, 10);
        let mut enumerator = source.create_enumerator(2);
        assert_eq!(
            enumerator.next_split(1).unwrap().split_id(),
            "generator-1-of-2"
        );
        assert_eq!(
            source
                .create_enumerator(1)
                .next_split(0)
                .unwrap()
                .split_id(),
            "generator-0-of-1"
        );
    }

    proptest::proptest! {
        /// However the chunks are dealt and whatever the poll budget, every index is generated
        /// once, in increasing order within each reader, including across a snapshot.
        #[test]
        fn dealt_chunks_generate_every_index_once(
            count in 0u64..3_000,
            chunk in 1u64..400,
            readers in 1usize..5,
            budget in 1usize..300,
            cut in 0usize..40,
        ) {
            let source = DataGeneratorSource::sequence(0, count).with_chunks(chunk);
            let pinned = source.pin_splits(readers, source.create_enumerator(readers).snapshot_state());
            let mut all = Vec::new();
            for subtask in 0..readers {
                let mut enumerator = source.restore_enumerator(readers, pinned.clone());
                let mut reader = source.create_reader(&ctx(subtask, readers));
                let mut out = Vec::new();
                while let Some(split) = enumerator.next_split(subtask) {
                    reader.add_split(split);
                }
                // A few polls, a snapshot, and the rest from a fresh reader.
                for _ in 0..cut {
                    futures::executor::block_on(reader.poll_next(&mut out, budget)).unwrap();
                }
                let mut resumed = source.create_reader(&ctx(subtask, readers));
                for split in reader.snapshot_splits() {
                    resumed.add_split(split);
                }
                read_all(&mut resumed, budget, &mut out);
                proptest::prop_assert!(out.windows(2).all(|w| w[0] < w[1]), "{:?}", out);
                all.extend(out);
            }
            all.sort_unstable();
            proptest::prop_assert_eq!(all, (0..count).collect::<Vec<u64>>());
        }
    }
}
