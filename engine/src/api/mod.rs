//! The DataStream API: build a job from sources, transformations and sinks, then execute it.

mod connected;
mod either;
mod environment;
pub(crate) mod function;
mod interval_join;
mod join;
mod keyed;
mod stream;
mod windowed;

pub use crate::checkpoint::{PendingSavepoint, SavepointError, SavepointHandle, StopMode, Taken};
pub use crate::runtime::{CancelHandle, JobResult, Restart, RunOptions};
pub use connected::{
    CoProcessFunction, ConnectedStreams, KeyedCoProcessFunction, KeyedConnectedStreams,
};
pub use either::Either;
pub use environment::{JobClient, StreamEnvironment};
pub use function::{
    Collector, KeyedProcessContext, KeyedProcessFunction, ProcessContext, ProcessFunction,
};
pub use interval_join::{IntervalJoin, IntervalJoined, ProcessJoinContext, ProcessJoinFunction};
pub use join::{
    CoGroupEqualTo, CoGroupFunction, CoGroupWhere, CoGroupedStreams, FlatJoinFunction, JoinEqualTo,
    JoinFunction, JoinWhere, JoinedStreams, WindowedCoGroup, WindowedJoin,
};
pub use keyed::KeyedStream;
pub use stream::{DataStream, DataStreamSink};
pub use windowed::WindowedStream;

pub use crate::operator::{OutputTag, RuntimeContext};
