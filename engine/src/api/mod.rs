//! The DataStream API: build a job from sources, transformations and sinks, then execute it.

mod environment;
pub(crate) mod function;
mod keyed;
mod stream;
mod windowed;

pub use crate::runtime::{CancelHandle, JobResult, RunOptions};
pub use environment::{JobClient, StreamEnvironment};
pub use function::{
    Collector, KeyedProcessContext, KeyedProcessFunction, ProcessContext, ProcessFunction,
};
pub use keyed::KeyedStream;
pub use stream::{DataStream, DataStreamSink};
pub use windowed::WindowedStream;

pub use crate::operator::{OutputTag, RuntimeContext};
