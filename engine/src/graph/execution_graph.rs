//! JobGraph → ExecutionGraph: subtasks on slots, channels between them.

use std::fmt::Write;

use super::job_graph::{JobEdge, JobGraph};
use super::stream_graph::NodeKind;
use crate::connector::Boundedness;
use crate::error::JobError;
use crate::runtime::exchange::PartitionKind;

/// One subtask of one vertex, placed on a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecutionVertex {
    /// The job vertex.
    pub vertex: usize,
    /// The subtask index.
    pub subtask: usize,
    /// The slot (= shard = core) it runs on.
    pub slot: usize,
}

/// The job expanded to subtasks on slots.
#[derive(Debug)]
pub struct ExecutionGraph {
    /// The chained job.
    pub job: JobGraph,
    /// Number of slots.
    pub slots: usize,
    /// Core id of each slot; in a run spread over several executors, of each of this
    /// executor's slots, in slot order (this executor's cores).
    pub cores: Vec<usize>,
    /// Every subtask.
    pub subtasks: Vec<ExecutionVertex>,
}

/// What a slot's channels need of its network segments (see
/// [`ExecutionGraph::required_segments`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotSegments {
    /// Its pool, which its outgoing channels fill.
    pub sending: usize,
    /// The pools of its channels from other processes, one each.
    pub receiving: usize,
}

/// The (sender subtask, receiver subtask) pairs of an exchange edge, in channel order per
/// sender: pointwise `i → i` for forward edges, all-to-all otherwise.
pub(crate) fn edge_channels(
    edge: &JobEdge,
    senders: usize,
    receivers: usize,
) -> Vec<(usize, usize)> {
    if edge.kind == PartitionKind::Forward {
        (0..senders).map(|i| (i, i)).collect()
    } else {
        (0..senders)
            .flat_map(|s| (0..receivers).map(move |r| (s, r)))
            .collect()
    }
}

/// Whether the channel from subtask `sender` to subtask `receiver` stays within one slot:
/// subtask `i` of every vertex runs on slot `i` (see [`ExecutionGraph::new`]).
pub(crate) fn within_slot(sender: usize, receiver: usize) -> bool {
    sender == receiver
}

impl ExecutionGraph {
    /// Places every subtask of `job` on `slots` slots pinned to `cores`: subtask `i` of every
    /// vertex shares slot `i` (slot sharing).
    pub fn new(job: JobGraph, slots: usize, cores: Vec<usize>) -> Result<ExecutionGraph, JobError> {
        for vertex in &job.vertices {
            if vertex.parallelism > slots {
                return Err(JobError::InvalidJob(format!(
                    "'{}' has parallelism {}, but the worker has only {slots} slot(s) \
                     (taskmanager.numberOfTaskSlots); lower the parallelism or add slots",
                    vertex.name, vertex.parallelism
                )));
            }
        }
        let subtasks = job
            .vertices
            .iter()
            .flat_map(|v| {
                (0..v.parallelism).map(move |i| ExecutionVertex {
                    vertex: v.id,
                    subtask: i,
                    slot: i,
                })
            })
            .collect();
        Ok(ExecutionGraph {
            job,
            slots,
            cores,
            subtasks,
        })
    }

    /// The channels of non-chained edge `edge_index`.
    pub(crate) fn channels(&self, edge_index: usize) -> Vec<(usize, usize)> {
        let edge = &self.job.edges[edge_index];
        edge_channels(
            edge,
            self.job.node_parallelism[edge.source_node],
            self.job.node_parallelism[edge.target_node],
        )
    }

    /// Network segments each slot needs so that no sender ever finds its pool empty, where
    /// `crosses(sender, receiver)` says whether a channel between two slots leaves the
    /// process. Per outgoing channel to another slot of this process: one segment being
    /// filled, `credits` in flight and one being read. Per channel to another process: as
    /// many again as are in flight, since a sent segment is held until the peer acknowledged
    /// it; and per channel from one, the receiver's own `credits` segments. (Channels within
    /// a slot move records without segments.)
    pub fn required_segments(
        &self,
        credits: usize,
        crosses: impl Fn(usize, usize) -> bool,
    ) -> Vec<SlotSegments> {
        let mut per_slot = vec![SlotSegments::default(); self.slots];
        for (index, edge) in self.job.edges.iter().enumerate() {
            if edge.chained {
                continue;
            }
            for (sender, receiver) in self.channels(index) {
                if within_slot(sender, receiver) {
                    continue;
                }
                if crosses(sender, receiver) {
                    per_slot[sender].sending += 2 * credits + 2;
                    per_slot[receiver].receiving += credits;
                } else {
                    per_slot[sender].sending += credits + 2;
                }
            }
        }
        per_slot
    }

    /// The three graphs, as text.
    pub fn explain(&self) -> String {
        let job = &self.job;
        let graph = job.stream_graph();
        let mut out = String::new();
        let _ = writeln!(out, "== StreamGraph: {} ==", graph.job_name);
        for node in &graph.nodes {
            let p = job.node_parallelism[node.id];
            if p == 0 {
                let _ = writeln!(
                    out,
                    "  [{}] {} (pruned: reaches no sink)",
                    node.id, node.name
                );
                continue;
            }
            let uid = node
                .uid
                .as_deref()
                .map(|u| format!(", uid={u}"))
                .unwrap_or_default();
            let inputs: Vec<String> = job
                .edges
                .iter()
                .filter(|e| e.target_node == node.id)
                .map(|e| format!("[{}] {}", e.source_node, e.kind))
                .collect();
            let from = if inputs.is_empty() {
                String::new()
            } else {
                format!(" <- {}", inputs.join(", "))
            };
            let kind = match &node.kind {
                NodeKind::Source(factory) => match factory.boundedness() {
                    Boundedness::Bounded => "bounded source",
                    Boundedness::Unbounded => "unbounded source",
                },
                _ => node.kind_name(),
            };
            let _ = writeln!(
                out,
                "  [{}] {} ({kind}, parallelism {p}{uid}, id={}){from}",
                node.id, node.name, job.operator_ids[node.id]
            );
        }
        let _ = writeln!(out, "== JobGraph: {} task(s) ==", job.vertices.len());
        for vertex in &job.vertices {
            let inputs: Vec<String> = job
                .network_inputs(vertex.id)
                .map(|(_, e)| format!("v{} {}", job.node_vertex[e.source_node], e.kind))
                .collect();
            let from = if inputs.is_empty() {
                String::new()
            } else {
                format!(" <- {}", inputs.join(", "))
            };
            let _ = writeln!(
                out,
                "  v{} {} (parallelism {}){from}",
                vertex.id, vertex.name, vertex.parallelism
            );
        }
        let _ = writeln!(
            out,
            "== ExecutionGraph: {} subtask(s) on {} slot(s) ==",
            self.subtasks.len(),
            self.slots
        );
        for slot in 0..self.slots {
            let here: Vec<String> = self
                .subtasks
                .iter()
                .filter(|s| s.slot == slot)
                .map(|s| {
                    format!(
                        "v{} {}/{}",
                        s.vertex,
                        s.subtask + 1,
                        job.vertices[s.vertex].parallelism
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "  slot {slot} (core {}): {}",
                self.cores
                    .get(slot)
                    .map_or("elsewhere".into(), |c| c.to_string()),
                here.join(", ")
            );
        }
        for (index, edge) in job.edges.iter().enumerate().filter(|(_, e)| !e.chained) {
            let _ = writeln!(
                out,
                "  exchange v{} -> v{} ({}): {} channel(s)",
                job.node_vertex[edge.source_node],
                job.node_vertex[edge.target_node],
                edge.kind,
                self.channels(index).len()
            );
        }
        out
    }
}
