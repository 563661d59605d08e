//! The source contract: splits, a split enumerator, and one reader per subtask.

use std::fmt::Debug;
use std::time::Duration;

use futures::future::LocalBoxFuture;

use super::ConnectorError;
use crate::operator::RuntimeContext;

/// Whether a source ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boundedness {
    /// The source ends when its splits are read; the job ends when every source has.
    Bounded,
    /// The source runs until the job is cancelled.
    Unbounded,
}

/// A piece of a source's input, with the position reading has reached in it. A reader's
/// [`SourceReader::snapshot_splits`] returns its splits with current positions; restarting a
/// reader from them resumes exactly where it left off. Checkpoints store splits encoded
/// ([`weir_state::StateCodec`]: derive rkyv's `Archive`, `Serialize` and `Deserialize`).
pub trait SourceSplit: Clone + Debug + Send + weir_state::StateCodec + 'static {
    /// A stable id for the split (a file path, a generator slice).
    fn split_id(&self) -> String;
}

/// Hands a source's splits to its readers. Runs off the data path (once per split).
pub trait SplitEnumerator<S>: Send {
    /// The next split for `subtask`, or `None` when there is no more work for it.
    fn next_split(&mut self, subtask: usize) -> Option<S>;

    /// The splits not handed out yet, each with the subtask it is kept for (`None`: any), for
    /// a checkpoint; [`Source::restore_enumerator`] makes an enumerator from them again.
    fn snapshot_state(&self) -> Vec<(Option<usize>, S)>;
}

/// An enumerator over a fixed list of splits, each either pinned to one subtask or free for
/// whichever reader asks first.
#[derive(Debug)]
pub struct StaticSplits<S> {
    splits: Vec<(Option<usize>, S)>,
}

impl<S> StaticSplits<S> {
    /// Splits any reader may take, in order.
    pub fn shared(splits: Vec<S>) -> Self {
        StaticSplits {
            splits: splits.into_iter().map(|s| (None, s)).collect(),
        }
    }

    /// Split `i` goes to subtask `i % parallelism` only (for slices that must stay put).
    pub fn pinned(splits: Vec<S>, parallelism: usize) -> Self {
        StaticSplits {
            splits: splits
                .into_iter()
                .enumerate()
                .map(|(i, s)| (Some(i % parallelism), s))
                .collect(),
        }
    }
}

impl<S> StaticSplits<S> {
    /// The splits a checkpoint held (see [`SplitEnumerator::snapshot_state`]).
    pub fn restored(splits: Vec<(Option<usize>, S)>) -> Self {
        StaticSplits { splits }
    }
}

impl<S: Clone + Send> SplitEnumerator<S> for StaticSplits<S> {
    fn next_split(&mut self, subtask: usize) -> Option<S> {
        let index = self
            .splits
            .iter()
            .position(|(owner, _)| owner.is_none_or(|o| o == subtask))?;
        Some(self.splits.remove(index).1)
    }

    fn snapshot_state(&self) -> Vec<(Option<usize>, S)> {
        self.splits.clone()
    }
}

/// What a reader's poll produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadStatus {
    /// Records were appended (more may follow at once), all read from split number `split`:
    /// a reader numbers its splits from 0 in the order `add_split` gave them to it. Event-time
    /// watermarks are tracked per split.
    Records {
        /// The split the records came from.
        split: u32,
    },
    /// Split number `split` has been read to its end: it no longer holds event time back.
    SplitFinished {
        /// The finished split.
        split: u32,
    },
    /// The reader has finished every split it was given and wants another.
    NeedSplit,
    /// Nothing to read for now; poll again after at most this long.
    Idle(Duration),
}

/// Reads the splits assigned to one subtask. Lives on the subtask's shard.
pub trait SourceReader<T, S> {
    /// Takes over a split (from the enumerator, or restored from a snapshot).
    fn add_split(&mut self, split: S);

    /// Appends up to `max` records to `out`.
    fn poll_next<'a>(
        &'a mut self,
        out: &'a mut Vec<T>,
        max: usize,
    ) -> LocalBoxFuture<'a, Result<ReadStatus, ConnectorError>>;

    /// The reader's unfinished splits with their current positions.
    fn snapshot_splits(&self) -> Vec<S>;
}

/// A source of records of type `T`.
pub trait Source<T>: Send + Sync + 'static {
    /// The split type, carrying a replayable position.
    type Split: SourceSplit;

    /// Whether the source ends.
    fn boundedness(&self) -> Boundedness;

    /// Creates the enumerator for a run with `parallelism` readers.
    fn create_enumerator(&self, parallelism: usize) -> Box<dyn SplitEnumerator<Self::Split>>;

    /// Creates the reader of one subtask, on its shard.
    fn create_reader(&self, ctx: &RuntimeContext) -> Box<dyn SourceReader<T, Self::Split>>;

    /// The enumerator of a run that resumes from a checkpoint, from the splits its enumerator
    /// had not handed out then ([`SplitEnumerator::snapshot_state`]). The default hands them
    /// out as [`StaticSplits`] does.
    fn restore_enumerator(
        &self,
        _parallelism: usize,
        pending: Vec<(Option<usize>, Self::Split)>,
    ) -> Box<dyn SplitEnumerator<Self::Split>> {
        Box::new(StaticSplits::restored(pending))
    }

    /// For the executors of a run spread over several, which each make the same enumerator
    /// and serve only their own readers from it: `pending` (the
    /// [`SplitEnumerator::snapshot_state`] of the run's new enumerator, fresh or restored from
    /// a checkpoint) with every split any reader could take kept for one reader, so that each
    /// split is read once in all. The default keeps those splits for the readers in turn
    /// ([`pin_round_robin`]).
    fn pin_splits(
        &self,
        parallelism: usize,
        pending: Vec<(Option<usize>, Self::Split)>,
    ) -> Vec<(Option<usize>, Self::Split)> {
        pin_round_robin(parallelism, pending)
    }
}

/// `splits` with the `i`-th of those any reader could take kept for reader
/// `i % parallelism`.
pub fn pin_round_robin<S>(
    parallelism: usize,
    splits: Vec<(Option<usize>, S)>,
) -> Vec<(Option<usize>, S)> {
    let mut free = 0;
    splits
        .into_iter()
        .map(|(owner, split)| {
            let owner = owner.unwrap_or_else(|| {
                free += 1;
                (free - 1) % parallelism.max(1)
            });
            (Some(owner), split)
        })
        .collect()
}
