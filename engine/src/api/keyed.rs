//! `KeyedStream`: a stream partitioned by key, and the keyed operators on it.

use std::marker::PhantomData;
use std::sync::Arc;

use super::environment::{NodeSpec, StreamEnvironment};
use super::function::KeyedProcessFunction;
use super::stream::{DataStream, Upstream};
use crate::graph::{EdgeRequest, NodeKind, OperatorFactory, WriterFactory};
use crate::operator::{KeyedProcessOperator, ReduceOperator};
use crate::record::{Key, Record};
use crate::runtime::factories::{type_ops, KeyedWriter, OperatorNode};

/// A stream whose records are routed by the key `KS` extracts (type `K`).
pub struct KeyedStream<T, K, KS> {
    env: StreamEnvironment,
    upstreams: Vec<Upstream>,
    key_selector: KS,
    _types: PhantomData<fn(T) -> K>,
}

impl<T, K, KS> std::fmt::Debug for KeyedStream<T, K, KS> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedStream")
            .field("upstreams", &self.upstreams)
            .finish()
    }
}

impl<T, K, KS> KeyedStream<T, K, KS>
where
    T: Record,
    K: Key,
    KS: Fn(&T) -> K + Clone + Send + Sync + 'static,
{
    pub(crate) fn new(env: StreamEnvironment, upstreams: Vec<Upstream>, key_selector: KS) -> Self {
        KeyedStream {
            env,
            upstreams,
            key_selector,
            _types: PhantomData,
        }
    }

    /// The job's configuration.
    pub(crate) fn config(&self) -> crate::config::Configuration {
        self.env.config()
    }

    /// Parallelism of an operator that sets none.
    pub(crate) fn default_parallelism(&self) -> usize {
        self.env.default_parallelism()
    }

    /// Whether the `key_by` exchange into a consumer of `consumer_parallelism` may cross
    /// shards: either side runs more than one subtask (as far as the job says so far).
    pub(crate) fn may_cross_shards(&self, consumer_parallelism: usize) -> bool {
        let default = self.env.default_parallelism();
        let state = self.env.state.borrow();
        let producers = self
            .upstreams
            .iter()
            .map(|upstream| state.nodes[upstream.node].parallelism.unwrap_or(default))
            .max()
            .unwrap_or(default);
        producers.max(consumer_parallelism) > 1
    }

    /// The key selector (a copy).
    pub(crate) fn key_selector(&self) -> KS {
        self.key_selector.clone()
    }

    /// The stream as it was before `key_by` (same producers, same partitioning requests): for
    /// two-input constructs, which tag each keyed input and key the union again.
    pub(crate) fn into_unkeyed(self) -> DataStream<T> {
        DataStream::new(self.env, self.upstreams)
    }

    pub(crate) fn then<O: Record>(
        self,
        name: &str,
        factory: Arc<dyn OperatorFactory>,
    ) -> DataStream<O> {
        let writer: Arc<dyn WriterFactory> =
            Arc::new(KeyedWriter::<T, K, KS>::new(self.key_selector));
        let inputs = self
            .upstreams
            .iter()
            .map(|upstream| upstream.edge(EdgeRequest::Hash, Arc::clone(&writer)))
            .collect();
        let node = self.env.add_node(NodeSpec {
            name: name.to_string(),
            kind: NodeKind::Operator(factory),
            inputs,
            input_ops: Some(type_ops::<T>()),
            output_ops: Some(type_ops::<O>()),
        });
        DataStream::new(self.env, Upstream::main(node))
    }

    /// Runs a [`KeyedProcessFunction`] over every record; its context tells the current key.
    pub fn process<O: Record, F: KeyedProcessFunction<K, T, O>>(self, f: F) -> DataStream<O> {
        let key_selector = self.key_selector.clone();
        let factory = OperatorNode::<T, O, _>::new(move || {
            KeyedProcessOperator::new(key_selector.clone(), f.clone())
        });
        self.then("Keyed Process", Arc::new(factory))
    }

    /// A running reduce: folds each record into its key's value with `f` and emits the result.
    /// The values are keyed state (`state.backend.type` decides where they live).
    pub fn reduce<F>(self, f: F) -> DataStream<T>
    where
        T: crate::state::StateValue,
        F: FnMut(T, T) -> T + Clone + Send + Sync + 'static,
    {
        let key_selector = self.key_selector.clone();
        let factory = OperatorNode::<T, T, _>::new(move || {
            ReduceOperator::new(key_selector.clone(), f.clone())
        });
        self.then("Keyed Reduce", Arc::new(factory))
    }
}
