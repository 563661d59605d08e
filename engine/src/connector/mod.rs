//! Sources and sinks: how records enter and leave a job.
//!
//! A [`Source`] divides its input into splits, which a [`SplitEnumerator`] hands to the
//! source's parallel readers on request; each split carries a replayable position. A [`Sink`]
//! creates one [`SinkWriter`] per subtask. Readers and writers live on their shard and use its
//! io_uring for file I/O.

mod collect;
mod collection;
mod datagen;
mod discard;
mod file_sink;
mod file_source;
mod postgres_sink;
mod print;
mod sink;
mod source;
mod two_phase;
mod wake_filter;

pub use collect::{CollectSink, Collected};
pub use collection::{CollectionSource, CollectionSplit};
pub use datagen::{DataGeneratorSource, Generator, GeneratorSplit, Sequence};
pub use discard::DiscardSink;
pub use file_sink::{BucketAssigner, BucketPeriod, FileSink, PendingPart, RollingPolicy};
pub use file_source::{FileSource, FileSplit, LineFormat};
pub use futures::future::LocalBoxFuture;
pub use postgres_sink::{PgType, PostgresSink, Row, WriteMode};
pub use print::PrintSink;
pub use sink::{Sink, SinkWriter};
pub use source::{
    pin_round_robin, Boundedness, ReadStatus, Source, SourceReader, SourceSplit, SplitEnumerator,
    StaticSplits,
};
pub use two_phase::{
    two_phase_writer, CommitError, Committer, DeliveryGuarantee, TransactionWriter,
    TwoPhaseCommitSink,
};

/// The job's settings for its sinks (`sink.*`), for sinks that set none of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SinkSettings {
    /// `sink.delivery-guarantee`.
    pub delivery_guarantee: DeliveryGuarantee,
    /// `sink.rolling-policy.*`: when the file sink rolls its parts between barriers.
    pub rolling_policy: RollingPolicy,
    /// `sink.postgres.max-transaction-size`: the PostgreSQL sink prepares a transaction that
    /// holds this many bytes of rows without waiting for a barrier.
    pub max_transaction_bytes: u64,
    /// `sink.postgres.transaction-marker-retention`: how long the PostgreSQL sink keeps the
    /// marker of a committed transaction.
    pub marker_retention: std::time::Duration,
}

impl Default for SinkSettings {
    fn default() -> Self {
        SinkSettings {
            delivery_guarantee: DeliveryGuarantee::default(),
            rolling_policy: RollingPolicy::default(),
            max_transaction_bytes: 64 << 20,
            marker_retention: std::time::Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// A connector failure.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ConnectorError {
    /// What happened, naming the file/record/setting and the fix.
    pub message: String,
    /// Whether the input was bad (no restart helps) or something outside failed.
    pub bad_input: bool,
}

impl ConnectorError {
    /// Bad input: a malformed record, a missing file the job names.
    pub fn bad_input(message: impl Into<String>) -> ConnectorError {
        ConnectorError {
            message: message.into(),
            bad_input: true,
        }
    }

    /// An external failure: an I/O error, a full disk.
    pub fn external(message: impl Into<String>) -> ConnectorError {
        ConnectorError {
            message: message.into(),
            bad_input: false,
        }
    }
}
