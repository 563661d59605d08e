//! How a record picks its receiving subtask on an exchange edge.

use std::fmt;
use std::marker::PhantomData;

use weir_state::KeyGroup;

use crate::operator::scope;
use crate::record::Key;

/// The kind of an edge between two operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartitionKind {
    /// Subtask `i` sends to subtask `i` (same parallelism); chainable.
    Forward,
    /// Round-robin over all receivers.
    Rebalance,
    /// Every record to every receiver.
    Broadcast,
    /// By key group of the record's key.
    Hash,
}

impl fmt::Display for PartitionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PartitionKind::Forward => "FORWARD",
            PartitionKind::Rebalance => "REBALANCE",
            PartitionKind::Broadcast => "BROADCAST",
            PartitionKind::Hash => "HASH",
        })
    }
}

/// Picks the channel of each record.
pub(crate) trait Partitioner<T>: 'static {
    /// The channel for `record`, or `None` for every channel.
    fn channel(&mut self, record: &T, channels: usize) -> Option<usize>;
}

pub(crate) struct ForwardPartitioner;

impl<T> Partitioner<T> for ForwardPartitioner {
    #[inline]
    fn channel(&mut self, _record: &T, _channels: usize) -> Option<usize> {
        Some(0)
    }
}

pub(crate) struct RebalancePartitioner {
    pub(crate) next: usize,
}

impl<T> Partitioner<T> for RebalancePartitioner {
    #[inline]
    fn channel(&mut self, _record: &T, channels: usize) -> Option<usize> {
        let channel = self.next;
        self.next += 1;
        if self.next == channels {
            self.next = 0;
        }
        Some(channel)
    }
}

pub(crate) struct BroadcastPartitioner;

impl<T> Partitioner<T> for BroadcastPartitioner {
    #[inline]
    fn channel(&mut self, _record: &T, _channels: usize) -> Option<usize> {
        None
    }
}

/// Routes by key group: `subtask = key_group(key) * parallelism / max_parallelism`.
pub(crate) struct KeyGroupPartitioner<K, KS> {
    pub(crate) key_selector: KS,
    pub(crate) max_parallelism: u32,
    /// Names the key selector in the report of a panic inside it.
    pub(crate) consumer: String,
    pub(crate) _key: PhantomData<fn() -> K>,
}

impl<T, K: Key, KS: Fn(&T) -> K + 'static> Partitioner<T> for KeyGroupPartitioner<K, KS> {
    #[inline]
    fn channel(&mut self, record: &T, channels: usize) -> Option<usize> {
        let key = {
            let _scope = scope::enter(&self.consumer);
            (self.key_selector)(record)
        };
        let group = KeyGroup::of(&key, self.max_parallelism);
        Some(group.subtask(self.max_parallelism, channels as u32) as usize)
    }
}
