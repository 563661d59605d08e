//! Operator ids: what a checkpoint matches an operator's state to when the job starts again.
//!
//! An id must survive a restart, a new build, and an edit of unrelated parts of the job, so it
//! never comes from creation order:
//! - an operator with a `uid` gets the hash of its uid (Flink's `OperatorID` from a uid);
//! - any other gets a hash of its place in the topology: its kind, its name, and the ids of its
//!   inputs in order (with each edge's partitioning and side output), plus its rank among
//!   earlier operators that match it in all of those (two identical `map`s of one stream).
//!   Adding, removing or editing an operator elsewhere in the job changes none of these; an
//!   edit upstream of it (or renaming it) does, which is why a stateful operator should carry a
//!   uid ([`super::JobGraph::stateful_without_uid`] names those that do not).
//!
//! The two preimages start with different tags, so a uid can never produce the id of an
//! operator without one (a uid `node-3` beside an unnamed third node), and the uid is hashed as
//! it is, so uids that differ only in a character that would need escaping in a file or
//! column-family name (`a:b`, `a_b`) get different ids. An id is 128 bits, printed as 32
//! lowercase hex digits (which is also how it appears in RocksDB column-family names).
//!
//! **Weir operator id v1** (never change it: it is how checkpoints find their operators): the
//! preimage is a sequence of fields written as bytes by this module alone (a string as its
//! length, 8 bytes little-endian, then its UTF-8 bytes; a number as 8 or 16 bytes little-endian),
//! never through a type's `Hash` impl; the two 64-bit halves of the id are [`StableHasher`]
//! (Weir key hash v1) over the word `1` (high half) or `2` (low half) followed by the preimage.

use std::fmt;
use std::hash::Hasher;

use weir_state::StableHasher;

use super::stream_graph::{EdgeRequest, StreamNode};

/// An operator's id (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OperatorId(u128);

impl OperatorId {
    /// The id of an operator with this uid.
    pub fn from_uid(uid: &str) -> OperatorId {
        OperatorId::of(|p| {
            p.text("uid");
            p.text(uid);
        })
    }

    /// The 128-bit value.
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// The id of the preimage that `write` writes.
    fn of(write: impl Fn(&mut Preimage)) -> OperatorId {
        let half = |seed: u64| {
            let mut preimage = Preimage(StableHasher::new());
            preimage.0.write_u64(seed);
            write(&mut preimage);
            preimage.0.finish()
        };
        OperatorId((u128::from(half(1)) << 64) | u128::from(half(2)))
    }
}

/// Writes the fields of an id's preimage (see the module docs for their bytes).
struct Preimage(StableHasher);

impl Preimage {
    fn text(&mut self, text: &str) {
        self.0.write_u64(text.len() as u64);
        self.0.write(text.as_bytes());
    }

    fn number(&mut self, number: u64) {
        self.0.write_u64(number);
    }

    fn id(&mut self, id: OperatorId) {
        self.0.write_u128(id.0);
    }
}

impl fmt::Display for OperatorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for OperatorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OperatorId({self})")
    }
}

/// The ids of `nodes`, which are in creation order (every input before its consumers).
pub(crate) fn operator_ids(nodes: &[StreamNode]) -> Vec<OperatorId> {
    let mut ids: Vec<OperatorId> = Vec::with_capacity(nodes.len());
    // The topology hashes of the nodes without a uid so far, for the rank of twins.
    let mut shapes: Vec<OperatorId> = Vec::new();
    for node in nodes {
        let id = match &node.uid {
            Some(uid) => OperatorId::from_uid(uid),
            None => {
                let shape = OperatorId::of(|p| {
                    p.text("topology");
                    p.text(node.kind_name());
                    p.text(&node.name);
                    p.number(node.inputs.len() as u64);
                    for edge in &node.inputs {
                        p.id(ids[edge.source]);
                        p.text(match edge.request {
                            EdgeRequest::Default => "default",
                            EdgeRequest::Rebalance => "rebalance",
                            EdgeRequest::Broadcast => "broadcast",
                            EdgeRequest::Hash => "hash",
                        });
                        match edge.side.as_deref() {
                            None => p.number(0),
                            Some(tag) => {
                                p.number(1);
                                p.text(tag);
                            }
                        }
                    }
                });
                let rank = shapes.iter().filter(|&&earlier| earlier == shape).count() as u64;
                shapes.push(shape);
                OperatorId::of(|p| {
                    p.text("rank");
                    p.id(shape);
                    p.number(rank);
                })
            }
        };
        ids.push(id);
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_ids_are_pinned() {
        // Part of the checkpoint format: if this fails, restored jobs lose their state.
        assert_eq!(
            OperatorId::from_uid("orders").to_string(),
            PINNED_ORDERS,
            "{}",
            OperatorId::from_uid("orders")
        );
        assert_eq!(
            OperatorId::from_uid("orders"),
            OperatorId::from_uid("orders")
        );
        assert_ne!(OperatorId::from_uid("a:b"), OperatorId::from_uid("a_b"));
        assert_ne!(OperatorId::from_uid(""), OperatorId::from_uid(" "));
    }

    const PINNED_ORDERS: &str = "cbc47e61bf900d1a7eb85999c0a98c26";
}
