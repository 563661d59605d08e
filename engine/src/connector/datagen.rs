//! A data generator source: record `i` is `generator(i)`, for `i` in `0..count` (or forever).
//!
//! Subtask `s` of `p` generates indices `s, s + p, s + 2p, …`; its split's position is the next
//! index, so a restored split regenerates exactly the records it had not emitted.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::LocalBoxFuture;

use super::source::{
    Boundedness, ReadStatus, Source, SourceReader, SourceSplit, SplitEnumerator, StaticSplits,
};
use super::ConnectorError;
use crate::operator::RuntimeContext;

/// One strided slice of the generated sequence.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct GeneratorSplit {
    /// Index of the slice (= the first index it generates).
    pub slice: u64,
    /// Number of slices (the stride).
    pub slices: u64,
    /// Next index to generate.
    pub next: u64,
}

impl SourceSplit for GeneratorSplit {
    fn split_id(&self) -> String {
        format!("generator-{}-of-{}", self.slice, self.slices)
    }
}

/// Makes record `i` from its index. Any `Fn(u64) -> T` is one; it is called directly (not
/// through a trait object) so that generation inlines into the reader's loop.
pub trait Generator<T>: Send + Sync + 'static {
    /// Record number `index`.
    fn generate(&self, index: u64) -> T;
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
            _record: PhantomData,
        }
    }

    /// Throttles the whole source (all subtasks together) to this rate.
    pub fn with_rate(mut self, records_per_second: f64) -> Self {
        self.records_per_second = Some(records_per_second);
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
        let slices = parallelism as u64;
        let splits = (0..slices)
            .map(|slice| GeneratorSplit {
                slice,
                slices,
                next: slice,
            })
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
            started: None,
            emitted: 0,
            _record: PhantomData,
        })
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
    started: Option<Instant>,
    emitted: u64,
}

impl<T, G: Generator<T>> SourceReader<T, GeneratorSplit> for GeneratorReader<T, G> {
    fn add_split(&mut self, split: GeneratorSplit) {
        self.splits.push((self.added, split));
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
        let status = match self.splits.last_mut() {
            None => ReadStatus::NeedSplit,
            Some((number, split)) if split.next >= self.count => {
                let split = *number;
                self.splits.pop();
                ReadStatus::SplitFinished { split }
            }
            Some((number, split)) => {
                let remaining = (self.count - split.next).div_ceil(split.slices);
                let n = remaining.min(budget);
                let (generator, first, stride) = (&*self.generator, split.next, split.slices);
                out.extend((0..n).map(|k| generator.generate(first + k * stride)));
                split.next += n * split.slices;
                self.emitted += n;
                ReadStatus::Records { split: *number }
            }
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
}
