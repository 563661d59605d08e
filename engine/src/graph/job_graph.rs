//! StreamGraph → JobGraph: resolve parallelism and partitioning, prune what reaches no sink,
//! and chain operators.

use std::sync::Arc;

use super::operator_id::{operator_ids, OperatorId};
use super::stream_graph::{EdgeRequest, NodeKind, StreamGraph};
use crate::error::JobError;
use crate::runtime::exchange::PartitionKind;

/// An edge between two stream nodes, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobEdge {
    /// Producing node.
    pub source_node: usize,
    /// Consuming node.
    pub target_node: usize,
    /// Index of this edge among the consuming node's inputs.
    pub input_index: usize,
    /// The resolved partitioning.
    pub kind: PartitionKind,
    /// Whether both ends run in one task (no exchange).
    pub chained: bool,
}

/// A chain of stream nodes run as one task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobVertex {
    /// Vertex id (topological order).
    pub id: usize,
    /// The chain's name, `Source: a -> Map -> Sink: b`.
    pub name: String,
    /// Parallelism of every node in the chain.
    pub parallelism: usize,
    /// The first node of the chain.
    pub head: usize,
    /// The chain's nodes, in topological order.
    pub nodes: Vec<usize>,
}

/// The chained job.
pub struct JobGraph {
    pub(crate) graph: Arc<StreamGraph>,
    /// The vertices, in topological order.
    pub vertices: Vec<JobVertex>,
    /// Every live edge, chained or not, in consuming-node order.
    pub edges: Vec<JobEdge>,
    /// Parallelism of each stream node (0 for pruned nodes).
    pub node_parallelism: Vec<usize>,
    /// Vertex of each stream node (`usize::MAX` for pruned nodes).
    pub node_vertex: Vec<usize>,
    /// Number of key groups.
    pub max_parallelism: usize,
    /// Each stream node's id, which its state is stored and restored under.
    pub operator_ids: Vec<OperatorId>,
}

impl std::fmt::Debug for JobGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobGraph")
            .field("vertices", &self.vertices)
            .field("edges", &self.edges)
            .finish()
    }
}

impl JobGraph {
    /// Translates a stream graph.
    pub fn from_stream_graph(
        graph: StreamGraph,
        default_parallelism: usize,
        max_parallelism: usize,
        chaining_enabled: bool,
    ) -> Result<JobGraph, JobError> {
        let nodes = &graph.nodes;
        // Prune what no sink consumes (Flink only runs what reaches a sink).
        let mut live = vec![false; nodes.len()];
        for node in nodes.iter().rev() {
            if matches!(node.kind, NodeKind::Sink(_)) {
                live[node.id] = true;
            }
            if live[node.id] {
                for input in &node.inputs {
                    live[input.source] = true;
                }
            }
        }
        if !nodes.iter().any(|n| matches!(n.kind, NodeKind::Sink(_))) {
            return Err(JobError::InvalidJob(
                "the job has no sink, so nothing would run; end a stream with sink_to(...)".into(),
            ));
        }

        let operator_ids = operator_ids(nodes);
        let live_ids = nodes
            .iter()
            .filter(|n| live[n.id])
            .map(|n| (operator_ids[n.id], n));
        let mut seen: std::collections::HashMap<OperatorId, &str> = Default::default();
        for (id, node) in live_ids {
            if let Some(other) = seen.insert(id, &node.name) {
                return Err(JobError::InvalidJob(format!(
                    "'{other}' and '{}' have the same operator id {id}; give one of them a uid",
                    node.name
                )));
            }
        }
        let mut node_parallelism = vec![0; nodes.len()];
        for node in nodes.iter().filter(|n| live[n.id]) {
            let p = node.parallelism.unwrap_or(default_parallelism);
            if p == 0 {
                return Err(JobError::InvalidJob(format!(
                    "{} '{}' has parallelism 0; set a parallelism of at least 1",
                    node.kind_name(),
                    node.name
                )));
            }
            node_parallelism[node.id] = p;
        }

        let mut edges = Vec::new();
        for node in nodes.iter().filter(|n| live[n.id]) {
            let p = node_parallelism[node.id];
            for (input_index, input) in node.inputs.iter().enumerate() {
                let source = &nodes[input.source];
                let kind = match input.request {
                    EdgeRequest::Default if node_parallelism[source.id] == p => {
                        PartitionKind::Forward
                    }
                    EdgeRequest::Default | EdgeRequest::Rebalance => PartitionKind::Rebalance,
                    EdgeRequest::Broadcast => PartitionKind::Broadcast,
                    // One subtask on each side holds every key group: a hash exchange would
                    // route every record to where it already is, so the edge is forward (and
                    // may chain).
                    EdgeRequest::Hash if p == 1 && node_parallelism[source.id] == 1 => {
                        PartitionKind::Forward
                    }
                    EdgeRequest::Hash => PartitionKind::Hash,
                };
                if kind == PartitionKind::Hash && p > max_parallelism {
                    return Err(JobError::InvalidJob(format!(
                        "keyed {} '{}' has parallelism {p}, above pipeline.max-parallelism = {max_parallelism}; \
                         lower its parallelism or raise pipeline.max-parallelism",
                        node.kind_name(),
                        node.name
                    )));
                }
                let chained = chaining_enabled
                    && kind == PartitionKind::Forward
                    && node.inputs.len() == 1
                    && source.chaining_allowed
                    && node.chaining_allowed;
                edges.push(JobEdge {
                    source_node: source.id,
                    target_node: node.id,
                    input_index,
                    kind,
                    chained,
                });
            }
        }

        let mut node_vertex = vec![usize::MAX; nodes.len()];
        let mut vertices: Vec<JobVertex> = Vec::new();
        for node in nodes.iter().filter(|n| live[n.id]) {
            let chained_from = edges.iter().find(|e| e.target_node == node.id && e.chained);
            let vertex = match chained_from {
                Some(edge) => node_vertex[edge.source_node],
                None => {
                    vertices.push(JobVertex {
                        id: vertices.len(),
                        name: String::new(),
                        parallelism: node_parallelism[node.id],
                        head: node.id,
                        nodes: Vec::new(),
                    });
                    vertices.len() - 1
                }
            };
            node_vertex[node.id] = vertex;
            vertices[vertex].nodes.push(node.id);
        }
        for vertex in &mut vertices {
            let names: Vec<&str> = vertex
                .nodes
                .iter()
                .map(|&n| nodes[n].name.as_str())
                .collect();
            vertex.name = names.join(" -> ");
        }

        let job = JobGraph {
            graph: Arc::new(graph),
            vertices,
            edges,
            node_parallelism,
            node_vertex,
            max_parallelism,
            operator_ids,
        };
        let uidless = job.stateful_without_uid();
        if !uidless.is_empty() {
            tracing::warn!(
                job = %job.job_name(),
                "stateful operators without a uid: '{}'. A checkpoint finds their state by the \
                 job's shape, which an edit upstream of them changes; give each a stable \
                 .uid(...)",
                uidless.join("', '")
            );
        }
        Ok(job)
    }

    /// The names of the running nodes that hold state a restore finds by operator id but have
    /// no uid: sources (their split positions) and keyed operators.
    pub fn stateful_without_uid(&self) -> Vec<&str> {
        self.graph
            .nodes
            .iter()
            .filter(|node| self.node_parallelism[node.id] > 0 && node.uid.is_none())
            .filter(|node| {
                matches!(node.kind, NodeKind::Source(_))
                    || node
                        .inputs
                        .iter()
                        .any(|edge| edge.request == EdgeRequest::Hash)
            })
            .map(|node| node.name.as_str())
            .collect()
    }

    /// The job's name.
    pub fn job_name(&self) -> &str {
        &self.graph.job_name
    }

    /// The stream graph it was built from.
    pub fn stream_graph(&self) -> &StreamGraph {
        &self.graph
    }

    /// Edges leaving `node`.
    pub(crate) fn out_edges(&self, node: usize) -> impl Iterator<Item = (usize, &JobEdge)> {
        self.edges
            .iter()
            .enumerate()
            .filter(move |(_, e)| e.source_node == node)
    }

    /// Non-chained edges entering `vertex` (its network inputs).
    pub(crate) fn network_inputs(&self, vertex: usize) -> impl Iterator<Item = (usize, &JobEdge)> {
        let head = self.vertices[vertex].head;
        self.edges
            .iter()
            .enumerate()
            .filter(move |(_, e)| e.target_node == head && !e.chained)
    }
}
