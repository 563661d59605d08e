//! Weir's engine: the DataStream API, the graphs a job is translated through, the operators,
//! the shard executors that run them (one pinned glommio executor per core) and the local
//! exchange that carries records between shards in network segments.
//!
//! ```no_run
//! use weir_engine::prelude::*;
//!
//! let env = StreamEnvironment::new(Configuration::default()).unwrap();
//! env.from_source(DataGeneratorSource::sequence(0, 1_000), WatermarkStrategy::no_watermarks(), "numbers")
//!     .map(|n: u64| n * 2)
//!     .filter(|n: &u64| n % 3 == 0)
//!     .sink_to(DiscardSink::new(), "blackhole");
//! let result = env.execute("example").unwrap();
//! println!("{} records in {:?}", result.records_in("Sink: blackhole"), result.duration);
//! ```
#![warn(missing_docs)]

pub mod api;
pub mod checkpoint;
pub mod config;
pub mod connector;
pub mod error;
pub mod graph;
pub mod logging;
pub mod metrics;
pub mod monitor;
mod operator;
pub mod package;
pub mod record;
pub mod runtime;
pub mod state;
pub mod time;
pub mod window;

pub use api::{DataStream, DataStreamSink, JobResult, KeyedStream, StreamEnvironment};
pub use config::Configuration;
pub use error::JobError;
pub use record::{Key, Record, Watermark, NO_TIMESTAMP};

/// The names a job needs, in one import.
pub mod prelude {
    pub use crate::api::{
        CoGroupFunction, CoProcessFunction, Either, FlatJoinFunction, JoinFunction,
        KeyedCoProcessFunction, ProcessJoinContext, ProcessJoinFunction,
    };
    pub use crate::api::{
        Collector, DataStream, DataStreamSink, JobResult, KeyedProcessContext,
        KeyedProcessFunction, KeyedStream, OutputTag, ProcessContext, ProcessFunction,
        RuntimeContext, StreamEnvironment,
    };
    pub use crate::config::Configuration;
    pub use crate::connector::{
        CollectSink, CollectionSource, DataGeneratorSource, DiscardSink, FileSink, FileSource,
        PrintSink, Sink, Source,
    };
    pub use crate::error::JobError;
    pub use crate::record::{Key, Record};
    pub use crate::state::{
        AggregatingState, AggregatingStateDescriptor, ListState, ListStateDescriptor, MapState,
        MapStateDescriptor, ReducingState, ReducingStateDescriptor, StateError, StateTtlConfig,
        ValueState, ValueStateDescriptor,
    };
    pub use crate::time::{TimeDomain, WatermarkStrategy};
    pub use crate::window::{
        AggregateFunction, EventTimeSessionWindows, GlobalWindows, ProcessWindowFunction,
        ProcessingTimeSessionWindows, SlidingEventTimeWindows, SlidingProcessingTimeWindows,
        TimeWindow, TumblingEventTimeWindows, TumblingProcessingTimeWindows, WindowElements,
    };
}
