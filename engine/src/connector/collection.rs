//! A source over an in-memory collection (Flink's `fromCollection`), split into contiguous
//! ranges; a split's position is the index of its next element.

use std::sync::Arc;

use futures::future::LocalBoxFuture;

use super::source::{
    Boundedness, ReadStatus, Source, SourceReader, SourceSplit, SplitEnumerator, StaticSplits,
};
use super::ConnectorError;
use crate::operator::RuntimeContext;

/// A range of the collection.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct CollectionSplit {
    /// Next element to emit.
    pub next: usize,
    /// One past the last element of the range.
    pub end: usize,
}

impl SourceSplit for CollectionSplit {
    fn split_id(&self) -> String {
        format!("collection-{}-{}", self.next, self.end)
    }
}

/// Emits the elements of a `Vec`.
pub struct CollectionSource<T> {
    elements: Arc<Vec<T>>,
}

impl<T> CollectionSource<T> {
    /// A source emitting `elements` (in order within each split).
    pub fn new(elements: Vec<T>) -> Self {
        CollectionSource {
            elements: Arc::new(elements),
        }
    }
}

impl<T: Clone + Send + Sync + 'static> Source<T> for CollectionSource<T> {
    type Split = CollectionSplit;

    fn boundedness(&self) -> Boundedness {
        Boundedness::Bounded
    }

    fn create_enumerator(&self, parallelism: usize) -> Box<dyn SplitEnumerator<CollectionSplit>> {
        let n = self.elements.len();
        let splits = (0..parallelism)
            .map(|i| CollectionSplit {
                next: n * i / parallelism,
                end: n * (i + 1) / parallelism,
            })
            .filter(|s| s.next < s.end)
            .collect();
        Box::new(StaticSplits::shared(splits))
    }

    fn create_reader(&self, _ctx: &RuntimeContext) -> Box<dyn SourceReader<T, CollectionSplit>> {
        Box::new(CollectionReader {
            elements: Arc::clone(&self.elements),
            splits: Vec::new(),
            added: 0,
        })
    }
}

struct CollectionReader<T> {
    elements: Arc<Vec<T>>,
    /// Splits with their numbers (in the order they were added).
    splits: Vec<(u32, CollectionSplit)>,
    added: u32,
}

impl<T: Clone> SourceReader<T, CollectionSplit> for CollectionReader<T> {
    fn add_split(&mut self, split: CollectionSplit) {
        self.splits.push((self.added, split));
        self.added += 1;
    }

    fn poll_next<'a>(
        &'a mut self,
        out: &'a mut Vec<T>,
        max: usize,
    ) -> LocalBoxFuture<'a, Result<ReadStatus, ConnectorError>> {
        let status = match self.splits.last_mut() {
            None => ReadStatus::NeedSplit,
            Some((number, split)) if split.next == split.end => {
                let number = *number;
                self.splits.pop();
                ReadStatus::SplitFinished { split: number }
            }
            Some((number, split)) => {
                let end = split.end.min(split.next + max);
                out.extend_from_slice(&self.elements[split.next..end]);
                split.next = end;
                ReadStatus::Records { split: *number }
            }
        };
        Box::pin(async move { Ok(status) })
    }

    fn snapshot_splits(&self) -> Vec<CollectionSplit> {
        self.splits.iter().map(|(_, s)| s.clone()).collect()
    }
}
