//! `DataStream`: a stream of records of one type, and the transformations on it.

use std::sync::Arc;

use super::environment::{NodeSpec, StreamEnvironment, StreamMarker};
use super::function::{Collector, ProcessFunction};
use super::keyed::KeyedStream;
use crate::connector::Sink;
use crate::graph::{EdgeRequest, NodeKind, OperatorFactory, StreamEdge, WriterFactory};
use crate::operator::{FlatMapOperator, MapOperator, OutputTag, ProcessOperator};
use crate::record::{Key, Record};
use crate::runtime::factories::{type_ops, FilterNode, OperatorNode, PlainWriter, SinkNode};

/// Where a stream's records come from: a node's main output or one of its side outputs, and
/// how they are partitioned on the way to the next operator.
#[derive(Clone, Debug)]
pub(crate) struct Upstream {
    pub(crate) node: usize,
    pub(crate) request: EdgeRequest,
    pub(crate) side: Option<Arc<str>>,
}

impl Upstream {
    pub(crate) fn main(node: usize) -> Vec<Upstream> {
        vec![Upstream {
            node,
            request: EdgeRequest::Default,
            side: None,
        }]
    }

    /// The edge from this upstream, written by `writer`.
    pub(crate) fn edge(&self, request: EdgeRequest, writer: Arc<dyn WriterFactory>) -> StreamEdge {
        StreamEdge {
            source: self.node,
            request,
            side: self.side.clone(),
            writer,
        }
    }
}

/// A stream of `T` records: the output of a source or operator, a side output, a union of
/// streams, or a stream repartitioned with `rebalance`/`broadcast`.
pub struct DataStream<T> {
    pub(crate) env: StreamEnvironment,
    /// The producing nodes and how records leave each of them.
    pub(crate) upstreams: Vec<Upstream>,
    _record: StreamMarker<T>,
}

impl<T> Clone for DataStream<T> {
    fn clone(&self) -> Self {
        DataStream {
            env: self.env.clone(),
            upstreams: self.upstreams.clone(),
            _record: StreamMarker::default(),
        }
    }
}

impl<T> std::fmt::Debug for DataStream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataStream")
            .field("upstreams", &self.upstreams)
            .finish()
    }
}

/// The end of a stream in a sink; set the sink's name, uid, parallelism and chaining here.
#[derive(Debug)]
pub struct DataStreamSink {
    env: StreamEnvironment,
    node: usize,
}

fn set_name(env: &StreamEnvironment, node: usize, name: &str) {
    env.state.borrow_mut().nodes[node].name = name.to_string();
}

fn set_uid(env: &StreamEnvironment, node: usize, uid: &str) {
    let mut state = env.state.borrow_mut();
    if let Some(other) = state
        .nodes
        .iter()
        .find(|n| n.id != node && n.uid.as_deref() == Some(uid))
    {
        let message = format!(
            "uid '{uid}' is used by both '{}' and '{}'; uids must be unique",
            other.name, state.nodes[node].name
        );
        state.errors.push(message);
        return;
    }
    state.nodes[node].uid = Some(uid.to_string());
}

fn set_parallelism(env: &StreamEnvironment, node: usize, parallelism: usize) {
    env.state.borrow_mut().nodes[node].parallelism = Some(parallelism);
}

fn disable_chaining(env: &StreamEnvironment, node: usize) {
    env.state.borrow_mut().nodes[node].chaining_allowed = false;
}

impl DataStreamSink {
    /// Names the sink (default `Sink: <name given to sink_to>`).
    pub fn name(self, name: &str) -> Self {
        set_name(&self.env, self.node, name);
        self
    }

    /// A stable id for the sink's state across job versions.
    pub fn uid(self, uid: &str) -> Self {
        set_uid(&self.env, self.node, uid);
        self
    }

    /// Number of parallel sink subtasks.
    pub fn parallelism(self, parallelism: usize) -> Self {
        set_parallelism(&self.env, self.node, parallelism);
        self
    }

    /// Runs the sink in its own task, not chained to its input.
    pub fn disable_chaining(self) -> Self {
        disable_chaining(&self.env, self.node);
        self
    }
}

impl<T: Record> DataStream<T> {
    pub(crate) fn new(env: StreamEnvironment, upstreams: Vec<Upstream>) -> Self {
        DataStream {
            env,
            upstreams,
            _record: StreamMarker::default(),
        }
    }

    pub(crate) fn edges(&self) -> Vec<StreamEdge> {
        let writer: Arc<dyn WriterFactory> = Arc::new(PlainWriter::<T>::new());
        self.upstreams
            .iter()
            .map(|upstream| upstream.edge(upstream.request, Arc::clone(&writer)))
            .collect()
    }

    /// The node that produced this stream, for the naming and parallelism setters.
    fn producer(&self, setter: &str) -> Option<usize> {
        match self.upstreams.as_slice() {
            [Upstream {
                node,
                request: EdgeRequest::Default,
                side: None,
            }] => Some(*node),
            _ => {
                self.env.record_error(format!(
                    "{setter}() was called on a union, repartitioned or side-output stream; call it on \
                     the operator that produces the stream, before union/rebalance/broadcast"
                ));
                None
            }
        }
    }

    pub(crate) fn then<O: Record>(
        &self,
        name: &str,
        factory: Arc<dyn OperatorFactory>,
    ) -> DataStream<O> {
        let node = self.env.add_node(NodeSpec {
            name: name.to_string(),
            kind: NodeKind::Operator(factory),
            inputs: self.edges(),
            input_ops: Some(type_ops::<T>()),
            output_ops: Some(type_ops::<O>()),
        });
        DataStream::new(self.env.clone(), Upstream::main(node))
    }

    /// `then`, with the parallelism its producer set (if it set one and is a single node), so
    /// that an operator the engine inserts after it chains to it.
    pub(crate) fn then_beside<O: Record>(
        &self,
        name: &str,
        factory: Arc<dyn OperatorFactory>,
    ) -> DataStream<O> {
        let parallelism = match self.upstreams.as_slice() {
            [upstream] => self.env.state.borrow().nodes[upstream.node].parallelism,
            _ => None,
        };
        let stream = self.then::<O>(name, factory);
        if let (Some(parallelism), [upstream]) = (parallelism, stream.upstreams.as_slice()) {
            set_parallelism(&self.env, upstream.node, parallelism);
        }
        stream
    }

    /// Applies `f` to every record.
    pub fn map<O: Record, F>(self, f: F) -> DataStream<O>
    where
        F: FnMut(T) -> O + Clone + Send + Sync + 'static,
    {
        self.then(
            "Map",
            Arc::new(OperatorNode::<T, O, _>::new(move || MapOperator(f.clone()))),
        )
    }

    /// Keeps the records `f` accepts.
    pub fn filter<F>(self, f: F) -> DataStream<T>
    where
        F: FnMut(&T) -> bool + Clone + Send + Sync + 'static,
    {
        self.then("Filter", Arc::new(FilterNode::<T, F>::new(f)))
    }

    /// Turns every record into zero or more records.
    pub fn flat_map<O: Record, F>(self, f: F) -> DataStream<O>
    where
        F: FnMut(T, &mut Collector<'_, O>) + Clone + Send + Sync + 'static,
    {
        self.then(
            "Flat Map",
            Arc::new(OperatorNode::<T, O, _>::new(move || {
                FlatMapOperator(f.clone())
            })),
        )
    }

    /// Runs a [`ProcessFunction`] over every record.
    pub fn process<O: Record, F: ProcessFunction<T, O>>(self, f: F) -> DataStream<O> {
        self.then(
            "Process",
            Arc::new(OperatorNode::<T, O, _>::new(move || {
                ProcessOperator::new(f.clone())
            })),
        )
    }

    /// Partitions the stream by key: every record of a key goes to the same subtask of the next
    /// operator (by key group, see `weir_state::key_group`).
    pub fn key_by<K: Key, KS>(self, key_selector: KS) -> KeyedStream<T, K, KS>
    where
        KS: Fn(&T) -> K + Clone + Send + Sync + 'static,
    {
        KeyedStream::new(self.env.clone(), self.upstreams.clone(), key_selector)
    }

    /// Merges streams of the same type.
    pub fn union(mut self, others: impl IntoIterator<Item = DataStream<T>>) -> DataStream<T> {
        for other in others {
            if !std::rc::Rc::ptr_eq(&self.env.state, &other.env.state) {
                self.env
                    .record_error("union() of streams from different environments".into());
                continue;
            }
            self.upstreams.extend(other.upstreams);
        }
        self
    }

    /// Distributes records round-robin over the next operator's subtasks.
    pub fn rebalance(mut self) -> DataStream<T> {
        self.upstreams
            .iter_mut()
            .for_each(|upstream| upstream.request = EdgeRequest::Rebalance);
        self
    }

    /// Sends every record to every subtask of the next operator.
    pub fn broadcast(mut self) -> DataStream<T> {
        self.upstreams
            .iter_mut()
            .for_each(|upstream| upstream.request = EdgeRequest::Broadcast);
        self
    }

    /// The records the producing operator emitted to the side output `tag` (with
    /// `ctx.output(&tag, ..)` in a process function, or late records of a window with
    /// `side_output_late_data`).
    pub fn get_side_output<X: Record>(&self, tag: &OutputTag<X>) -> DataStream<X> {
        let node = self.producer("get_side_output").unwrap_or(usize::MAX);
        let upstreams = if node == usize::MAX {
            Vec::new()
        } else {
            if !matches!(
                self.env.state.borrow().nodes[node].kind,
                NodeKind::Operator(_)
            ) {
                self.env.record_error(format!(
                    "get_side_output('{}') was called on a source's stream; side outputs come from \
                     process functions and windows",
                    tag.id
                ));
            }
            vec![Upstream {
                node,
                request: EdgeRequest::Default,
                side: Some(Arc::clone(&tag.id)),
            }]
        };
        DataStream::new(self.env.clone(), upstreams)
    }

    /// Writes the stream to `sink`; the node is named `Sink: <name>`.
    pub fn sink_to<S: Sink<T>>(self, sink: S, name: &str) -> DataStreamSink {
        let node = self.env.add_node(NodeSpec {
            name: format!("Sink: {name}"),
            kind: NodeKind::Sink(Arc::new(SinkNode::new(sink))),
            inputs: self.edges(),
            input_ops: Some(type_ops::<T>()),
            output_ops: None,
        });
        DataStreamSink {
            env: self.env,
            node,
        }
    }

    /// Names the operator that produced this stream.
    pub fn name(self, name: &str) -> Self {
        if let Some(node) = self.producer("name") {
            set_name(&self.env, node, name);
        }
        self
    }

    /// A stable id for the producing operator's state across job versions.
    pub fn uid(self, uid: &str) -> Self {
        if let Some(node) = self.producer("uid") {
            set_uid(&self.env, node, uid);
        }
        self
    }

    /// Number of parallel subtasks of the producing operator.
    pub fn parallelism(self, parallelism: usize) -> Self {
        if let Some(node) = self.producer("parallelism") {
            set_parallelism(&self.env, node, parallelism);
        }
        self
    }

    /// Runs the producing operator in its own task, chained to neither its input nor its output.
    pub fn disable_chaining(self) -> Self {
        if let Some(node) = self.producer("disable_chaining") {
            disable_chaining(&self.env, node);
        }
        self
    }
}
