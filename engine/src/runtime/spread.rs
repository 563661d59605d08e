//! A run spread over several executors (processes, usually on several servers): which of the
//! job's slots run here, where the others run, and the channels between them — `weir-net`'s
//! QUIC streams, one endpoint per shard, with mutual TLS from the cluster's CA
//! (`docs/design/exchange.md`).
//!
//! Every executor of the run plans the whole job the same way (subtask `i` of every vertex on
//! slot `i`) and runs the subtasks of its own slots. A channel between two of its slots is a
//! ring or a local channel as in a run on one executor; a channel to a slot elsewhere is a
//! stream from the sending shard's endpoint to the receiving shard's, named by the run and
//! the channel (edge, sending subtask, receiving subtask). Each shard dials, once, every
//! shard its subtasks send to, before they start.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use weir_memory::SegmentPool;
use weir_net::tls::TlsIdentity;
use weir_net::{ChannelReceiver, ChannelSender, NetConfig, NetShard, Peer};

use crate::checkpoint::relay::{self, Relay};
use crate::error::{TaskError, TaskResult};

/// Where a run's slots are when it spans several executors.
#[derive(Clone, Debug)]
pub struct Spread {
    /// Names the run's channels: unique among the runs whose executors may reach each other
    /// at one time (a deployment's id: the job's and the attempt's).
    pub run: String,
    /// The node this executor runs on: the name its certificate carries.
    pub node: String,
    /// Per slot of the job (by index): the node that runs it, and its shard's address.
    pub slots: Vec<SlotPlace>,
    /// This node's certificate and key, and the cluster's CA.
    pub identity: TlsIdentity,
    /// A connection that hears nothing for this long is lost (and the channels on it fail).
    pub idle_timeout: Duration,
    /// How long a shard retries a peer shard that does not answer.
    pub connect_timeout: Duration,
    /// Each endpoint's UDP receive and send buffers, bytes.
    pub udp_buffers: (usize, usize),
    /// How this executor's checkpoint coordination reaches the other executors': the
    /// leader's (slot 0's) to the others, the others' to it (`checkpoint::relay`).
    pub relay: Relay,
}

/// Where one slot of a spread run runs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotPlace {
    /// The node (its certificate's name).
    pub node: String,
    /// The address its shard's endpoint binds (on its node) and is dialled at.
    pub addr: SocketAddr,
}

impl Spread {
    /// Whether `slot` runs in this executor.
    pub(crate) fn is_here(&self, slot: usize) -> bool {
        self.slots[slot].node == self.node
    }

    /// How many nodes run the job's slots.
    pub(crate) fn nodes(&self) -> usize {
        let nodes: std::collections::HashSet<&str> =
            self.slots.iter().map(|place| place.node.as_str()).collect();
        nodes.len()
    }

    /// The channel's name on the wire.
    pub(crate) fn key(&self, edge: usize, sender: usize, receiver: usize) -> Vec<u8> {
        format!("{}/{edge}/{sender}/{receiver}", self.run).into_bytes()
    }

    /// Refuses a spread that does not fit the job: a slot count other than the job's, a key
    /// too long, a node with no slot here.
    pub(crate) fn check(&self, slots: usize) -> Result<(), String> {
        if self.slots.len() != slots {
            return Err(format!(
                "the run is spread over {} slots but the job needs {slots}; place every slot",
                self.slots.len()
            ));
        }
        if !self.slots.iter().any(|place| place.node == self.node) {
            return Err(format!(
                "no slot of the run is on node '{}', this executor's",
                self.node
            ));
        }
        let longest = self.key(usize::MAX, usize::MAX, usize::MAX).len();
        if longest > weir_net::wire::MAX_KEY {
            return Err(format!(
                "the run's name '{}' is too long to name its channels ({longest} bytes with a \
                 channel's numbers, at most {})",
                self.run,
                weir_net::wire::MAX_KEY
            ));
        }
        Ok(())
    }
}

/// A run named `run` spread over `slots` executors on this machine, one slot each (node
/// `node-<i>`, with a certificate of a cluster CA made for it, on a free port of loopback),
/// their checkpoints coordinated through channels between them: the [`Spread`] of each
/// executor, in slot order. For tests and benchmarks that run a job's executors side by side
/// in one process.
pub fn on_loopback(run: &str, slots: usize) -> Result<Vec<Spread>, String> {
    let ca = weir_net::tls::ClusterCa::generate("loopback").map_err(|e| e.to_string())?;
    let places = (0..slots)
        .map(|slot| {
            // Free when asked: the executor binds it again right after.
            let socket = std::net::UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            Ok(SlotPlace {
                node: format!("node-{slot}"),
                addr: socket.local_addr().map_err(|e| e.to_string())?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let relays = relay::in_process(slots);
    places
        .iter()
        .zip(relays)
        .map(|(place, relay)| {
            let issued = ca.issue(&place.node, &[]).map_err(|e| e.to_string())?;
            let identity = TlsIdentity::from_pem(
                ca.cert_pem(),
                &issued.cert_pem,
                &issued.key_pem,
                &place.node,
            )
            .map_err(|e| e.to_string())?;
            Ok(Spread {
                run: run.to_string(),
                node: place.node.clone(),
                slots: places.clone(),
                identity,
                idle_timeout: Duration::from_secs(10),
                connect_timeout: Duration::from_secs(10),
                udp_buffers: (8 << 20, 8 << 20),
                relay,
            })
        })
        .collect()
}

/// One shard's endpoint in a spread run, and its connections to the shards its subtasks send
/// to.
pub(crate) struct ShardNet {
    net: NetShard,
    /// The node of every slot of the run.
    nodes: Vec<String>,
    peers: HashMap<usize, Peer>,
    idle_timeout: Duration,
    slot: usize,
    /// A receiving channel's pool: its sender's credit, in segments of this size.
    credits: usize,
    segment_size: usize,
}

impl ShardNet {
    /// Binds `slot`'s endpoint and dials the shards of `targets` (slots elsewhere), all at
    /// once. Each channel it receives gets a pool of its own: `credits` segments of
    /// `segment_size` bytes.
    pub(crate) async fn start(
        spread: &Spread,
        slot: usize,
        targets: &[usize],
        credits: usize,
        segment_size: usize,
    ) -> TaskResult<ShardNet> {
        let place = &spread.slots[slot];
        // QUIC's stream window holds a channel's whole credit, frame headers and all.
        let window = credits * (segment_size + weir_net::wire::HEADER);
        let stream_window = u32::try_from(window).unwrap_or(u32::MAX);
        let mut config = NetConfig::new(place.addr, spread.identity.clone());
        config.idle_timeout = spread.idle_timeout;
        config.connect_timeout = spread.connect_timeout;
        // Every sender opens its channels once its shard dialled its peers, each within the
        // connect timeout: a channel not opened in twice that never will be.
        config.open_timeout = spread.connect_timeout * 2;
        (config.udp_receive_buffer, config.udp_send_buffer) = spread.udp_buffers;
        config.stream_window = config.stream_window.max(stream_window);
        config.connection_window = config.connection_window.max(stream_window);
        let net = NetShard::bind(&config).map_err(|error| {
            TaskError::external(format!(
                "slot {slot} cannot start its exchange on node '{}': {error}",
                place.node
            ))
        })?;
        let dials = targets.iter().map(|&target| {
            let place = &spread.slots[target];
            let net = &net;
            async move {
                let peer = net
                    .connect(place.addr, &place.node)
                    .await
                    .map_err(|error| {
                        TaskError::external(format!(
                            "slot {slot} cannot reach slot {target} on node '{}': {error}",
                            place.node
                        ))
                    })?;
                Ok::<_, TaskError>((target, peer))
            }
        });
        let peers = futures::future::try_join_all(dials).await?;
        Ok(ShardNet {
            net,
            nodes: spread
                .slots
                .iter()
                .map(|place| place.node.clone())
                .collect(),
            peers: peers.into_iter().collect(),
            idle_timeout: spread.idle_timeout,
            slot,
            credits,
            segment_size,
        })
    }

    /// The shard of `slot` and its node, in words.
    pub(crate) fn peer(&self, slot: usize) -> String {
        format!("slot {slot} on node '{}'", self.nodes[slot])
    }

    /// The sending end of channel `key` to the shard of `slot`, or why it cannot be made.
    pub(crate) fn open(&self, key: &[u8], slot: usize) -> Result<ChannelSender, String> {
        let key = String::from_utf8_lossy(key);
        let peer = self
            .peers
            .get(&slot)
            .ok_or_else(|| format!("no connection to slot {slot} was made for channel {key}"))?;
        peer.open_channel(key.as_bytes())
            .map_err(|error| format!("cannot open channel {key} to slot {slot}: {error}"))
    }

    /// The receiving end of channel `key`, landing in a pool of its own, or why it cannot be
    /// made.
    pub(crate) fn receive(&self, key: &[u8]) -> Result<ChannelReceiver, String> {
        let pool = SegmentPool::new(self.slot, self.credits, self.segment_size);
        self.net.receive(key, pool).map_err(|error| {
            format!(
                "cannot receive channel {}: {error}",
                String::from_utf8_lossy(key)
            )
        })
    }

    /// Lets every channel end at both ends before the endpoint goes (its subtasks all ended
    /// well): a peer that has not yet received what this shard sent would otherwise lose it.
    pub(crate) async fn finish(&self) {
        if !self.net.drain(self.idle_timeout).await {
            tracing::warn!(
                addr = %self.net.local_addr(),
                "the exchange's peers did not read every channel's end within {:?}; closing",
                self.idle_timeout
            );
        }
    }
}
