//! The three graphs a job goes through (Flink's names):
//!
//! - [`StreamGraph`]: one node per API call (source, operator, sink), edges carrying the
//!   partitioning the user asked for. `key_by`, `rebalance`, `broadcast` are edges, not nodes.
//! - [`JobGraph`]: nodes joined by forward edges of equal parallelism (and chaining allowed)
//!   become one [`JobVertex`], a chain run as one task: records pass between chained operators
//!   by function call.
//! - [`ExecutionGraph`]: each vertex expands into `parallelism` subtasks, placed on slots with
//!   slot sharing (subtask `i` of every vertex shares slot `i`), joined by exchange channels.
//!
//! `weir run --explain` prints all three ([`ExecutionGraph::explain`]). Every node has an
//! [`OperatorId`] that outlives the process (see [`operator_id`]'s docs).

mod execution_graph;
mod job_graph;
pub mod operator_id;
mod stream_graph;

pub(crate) use execution_graph::within_slot;
pub use execution_graph::{ExecutionGraph, ExecutionVertex, SlotSegments};
pub use job_graph::{JobEdge, JobGraph, JobVertex};
pub use operator_id::OperatorId;
pub(crate) use stream_graph::{
    AnyOutput, EdgeRequest, NodeKind, OperatorFactory, ReceiverEnd, SenderEnd, SharedEnumerator,
    SinkFactory, SourceFactory, StreamEdge, StreamNode, TypeOps, WriterFactory, WriterParts,
};
pub use stream_graph::{StreamGraph, StreamNodeInfo};
