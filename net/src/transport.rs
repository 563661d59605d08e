//! QUIC on a shard: the shard's own executor drives quinn-proto (sans-IO) over a UDP socket of
//! the shard's, so a channel's segments go from the sending task to the wire, and from the
//! wire into the receiving task's pool, without leaving the core (`docs/design/exchange.md`
//! measures this against a network thread per executor).
//!
//! A [`NetShard`] is one shard's endpoint: its socket (quinn-udp: GSO and GRO, several
//! datagrams per system call; glommio's io_uring only says when a datagram waits), its
//! connections, and a driver task that moves datagrams, timers, stream data and credit. A
//! connection joins two shards ([`NetShard::connect`] gives a [`Peer`]); each channel is a
//! bidirectional stream of it: an open frame naming the channel's key and data frames one
//! way, credit frames back (`wire.rs`, `credit.rs`). A receiver registers its key and its own
//! pool ([`NetShard::receive`]); a sender ([`Peer::open_channel`]) sends a segment only
//! against the receiver's credit and hands the segment's bytes to QUIC without a copy: the
//! segment returns to its pool once the peer acknowledged them.
//!
//! Every handle and the driver share the shard's state (`Rc<RefCell<_>>`): all of them run
//! on the shard's thread, and none holds the state across an await.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::task::AtomicWaker;
use futures::Stream;
use quinn_proto::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn_proto::{
    ClientConfig, Connection, ConnectionError, ConnectionHandle, DatagramEvent, Dir, Endpoint,
    EndpointConfig, Event, IdleTimeout, ReadError, ServerConfig, StreamEvent, StreamId,
    TransportConfig, VarInt, WriteError,
};
use weir_memory::{Segment, SegmentPool};

use crate::credit::{ReceiverCredit, SenderCredit};
use crate::tls::TlsIdentity;
use crate::wire::{
    announce_frame, credit_frame, data_header, open_frame, FrameReader, Inbound, OpenReader,
    Opened, HEADER, MAX_KEY,
};

/// A stream's or connection's error codes (QUIC application codes).
const RECEIVER_GONE: u32 = 1;
const PROTOCOL: u32 = 2;
const SHUTDOWN: u32 = 3;

/// The most channels a connection carries at once.
const MAX_CHANNELS: u32 = 4096;

/// What the accepting side sends on a unidirectional stream once the handshake is done on its
/// side, having verified the connecting side's certificate: the connecting side counts the
/// connection made only then (in TLS 1.3 its own handshake ends before the accepting side has
/// judged its certificate). Magic and the exchange's protocol version.
const HELLO: [u8; 8] = *b"WEIR\x01\x00\x00\x00";

/// How a shard's endpoint runs.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// The address its UDP socket binds (port 0: any free port).
    pub bind: SocketAddr,
    /// Its certificate, key and the cluster CA.
    pub identity: TlsIdentity,
    /// A connection that hears nothing for this long is lost (keep-alives go at a third of it).
    pub idle_timeout: Duration,
    /// How long [`NetShard::connect`] retries a peer that does not answer.
    pub connect_timeout: Duration,
    /// How long a receiver waits for its sender to open the channel before the channel fails
    /// (a sender that never came: its process failed before opening it, or named another
    /// channel).
    pub open_timeout: Duration,
    /// The UDP socket's receive buffer, bytes (the kernel caps it at `net.core.rmem_max`).
    pub udp_receive_buffer: usize,
    /// The UDP socket's send buffer, bytes (capped at `net.core.wmem_max`).
    pub udp_send_buffer: usize,
    /// QUIC's window per stream, bytes: at least a channel's credit (its receiver's pool
    /// and frame headers); [`NetShard::receive`] refuses a pool larger.
    pub stream_window: u32,
    /// QUIC's window per connection, bytes: the most a peer may have unread on this side.
    pub connection_window: u32,
    /// The round trip assumed before one is measured. It times the handshake's first
    /// retransmission (three of it): a peer whose socket is not bound yet when a spread run's
    /// shards dial each other drops the first Initial packet, and QUIC's default of 333 ms
    /// left half the spread runs without an exchange for their first second. Servers of one data centre are
    /// well under a millisecond apart; on a longer path a too short guess costs a few
    /// repeated handshake packets until the first measurement replaces it.
    pub initial_rtt: Duration,
}

impl NetConfig {
    /// The defaults, binding `bind` with `identity`.
    pub fn new(bind: SocketAddr, identity: TlsIdentity) -> NetConfig {
        NetConfig {
            bind,
            identity,
            idle_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(30),
            open_timeout: Duration::from_secs(60),
            udp_receive_buffer: 8 << 20,
            udp_send_buffer: 8 << 20,
            stream_window: 1 << 20,
            connection_window: 64 << 20,
            initial_rtt: Duration::from_millis(10),
        }
    }

    fn transport(&self) -> Result<Arc<TransportConfig>, NetError> {
        let mut transport = TransportConfig::default();
        let idle = IdleTimeout::try_from(self.idle_timeout).map_err(|_| NetError::Config {
            detail: format!(
                "an idle timeout of {:?} is longer than QUIC allows",
                self.idle_timeout
            ),
        })?;
        transport
            .max_idle_timeout(Some(idle))
            .initial_rtt(self.initial_rtt)
            .keep_alive_interval(Some(self.idle_timeout / 3))
            .max_concurrent_bidi_streams(VarInt::from_u32(MAX_CHANNELS))
            .max_concurrent_uni_streams(VarInt::from_u32(1))
            .stream_receive_window(VarInt::from_u32(self.stream_window))
            // Credit bounds what a channel has in flight (the receiver checks that its pool
            // fits the stream's window); the connection's window bounds what a peer can make
            // this side hold whatever it does.
            .receive_window(VarInt::from_u32(self.connection_window))
            .send_window(u64::from(self.connection_window));
        Ok(Arc::new(transport))
    }
}

/// What goes wrong with the exchange's connections and channels.
#[derive(Clone, Debug, thiserror::Error)]
pub enum NetError {
    /// The socket cannot be made.
    #[error("cannot bind the exchange's UDP socket to {addr}: {detail}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        detail: String,
    },
    /// A setting QUIC cannot take.
    #[error("the exchange's settings are refused: {detail}")]
    Config {
        /// Why.
        detail: String,
    },
    /// The identity does not make a TLS configuration.
    #[error("the exchange's TLS configuration is refused: {0}")]
    Tls(String),
    /// A peer cannot be reached or refused the handshake.
    #[error("cannot connect to {name} at {addr}: {reason}")]
    Connect {
        /// The peer's node name (its certificate's).
        name: String,
        /// Its address.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
    /// A connection went: every channel on it fails.
    #[error("the connection to {peer} is lost: {reason}")]
    Lost {
        /// The peer's address.
        peer: SocketAddr,
        /// Why.
        reason: String,
    },
    /// The peer shut its endpoint down (its run ended) with the connection's channels open:
    /// every channel on it fails.
    #[error("the peer at {peer} shut its endpoint down (its run ended)")]
    PeerEnded {
        /// The peer's address.
        peer: SocketAddr,
    },
    /// No sender opened a registered channel in time.
    #[error("no sender opened channel {} within {waited:?}", String::from_utf8_lossy(.key))]
    NotOpened {
        /// The channel's key.
        key: Vec<u8>,
        /// How long its receiver waited.
        waited: Duration,
    },
    /// A channel's stream broke the protocol.
    #[error("the channel from {peer} breaks the exchange's protocol: {detail}")]
    Protocol {
        /// The peer's address.
        peer: SocketAddr,
        /// How.
        detail: String,
    },
    /// The other end of a channel went (its task failed or was cancelled).
    #[error("the channel's receiver at {peer} is gone")]
    ReceiverGone {
        /// The receiver's address.
        peer: SocketAddr,
    },
    /// A second receiver for one channel.
    #[error("channel {key:?} has a receiver on this shard already")]
    Duplicate {
        /// The channel's key.
        key: Vec<u8>,
    },
    /// The shard's endpoint was shut down.
    #[error("the shard's network endpoint is shut down")]
    Shutdown,
}

/// Wakes the driver: from handles on the shard, and from a receiver pool's return hook.
#[derive(Default)]
struct Signal {
    raised: AtomicBool,
    waker: AtomicWaker,
}

impl Signal {
    fn raise(&self) {
        self.raised.store(true, Ordering::Release);
        self.waker.wake();
    }

    fn take(&self) -> bool {
        self.raised.swap(false, Ordering::AcqRel)
    }
}

/// Resolves once the signal is raised.
struct Raised<'a>(&'a Signal);

impl Future for Raised<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.waker.register(cx.waker());
        if self.0.take() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

struct Shared {
    state: RefCell<State>,
    signal: Arc<Signal>,
    socket: UdpSocket,
    udp: quinn_udp::UdpSocketState,
    /// The same socket, for glommio to say when a datagram waits.
    ready: glommio::net::UdpSocket,
    local: SocketAddr,
    connect_timeout: Duration,
    open_timeout: Duration,
    stream_window: u32,
}

/// A connection, for as long as this endpoint lives: quinn-proto reuses its own handles once
/// a connection drained, and a handle kept by a channel must never reach the next one.
type ConnId = u64;

/// How a channel ended: `Ok` when its sender finished it.
type End = Result<(), NetError>;

struct State {
    endpoint: Endpoint,
    client: ClientConfig,
    connections: HashMap<ConnId, Conn>,
    /// quinn-proto's handles of the connections.
    by_handle: HashMap<ConnectionHandle, ConnId>,
    next_conn: ConnId,
    /// Registered receivers, by channel key.
    receivers: HashMap<Vec<u8>, Receiving>,
    /// Streams a peer opened for a channel with no receiver yet: the key's stream and the
    /// bytes after its open frame.
    unmatched: HashMap<Vec<u8>, (ConnId, StreamId, Option<End>)>,
    senders: HashMap<(ConnId, StreamId), Sending>,
    /// A transmit the socket could not take yet, and its bytes.
    blocked: Option<(quinn_proto::Transmit, Vec<u8>)>,
    shutdown: bool,
}

struct Conn {
    handle: ConnectionHandle,
    conn: Connection,
    peer: SocketAddr,
    connected: bool,
    lost: Option<Lost>,
    /// Tasks waiting for the handshake.
    waiters: Vec<Waker>,
    /// The accepting side's hello stream (on the connecting side), and what came of it.
    hello: Option<(StreamId, Vec<u8>)>,
    /// Streams the peer opened whose open frame has not come whole yet.
    opening: HashMap<StreamId, OpenReader>,
    /// Streams the peer opened, matched to a receiver: their keys.
    inbound: HashMap<StreamId, Vec<u8>>,
    /// Streams the peer opened for a key with no receiver yet: their keys.
    waiting: HashMap<StreamId, Vec<u8>>,
}

struct Receiving {
    /// Its stream, once a peer opened it.
    stream: Option<(ConnId, StreamId)>,
    reader: FrameReader,
    segments: VecDeque<Segment>,
    /// Credit frames not yet taken by the stream.
    credit_out: Vec<u8>,
    waker: Option<Waker>,
    /// Why the channel ended.
    end: Option<End>,
    /// When the channel fails if no sender opened it by then.
    open_by: Instant,
    /// The newest checkpoint its sender announced, and who is told of each (see
    /// [`ChannelReceiver::on_announce`]).
    announced: u32,
    on_announce: Option<Box<dyn Fn(u32)>>,
}

struct Sending {
    peer: SocketAddr,
    credit: SenderCredit,
    credits: FrameReader,
    /// Bytes accepted (with credit) that QUIC has not taken yet.
    pending: VecDeque<Bytes>,
    /// Tasks waiting for credit.
    wakers: Vec<Waker>,
    closed: Option<NetError>,
    /// The handle was dropped: finish the stream once `pending` is out.
    dropped: bool,
}

/// One shard's QUIC endpoint. Made on the shard's executor; its driver runs there until the
/// endpoint is dropped (which closes every connection).
pub struct NetShard {
    shared: Rc<Shared>,
}

impl fmt::Debug for NetShard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetShard")
            .field("local", &self.shared.local)
            .finish()
    }
}

impl NetShard {
    /// Binds the shard's socket and starts its driver on the current glommio executor.
    pub fn bind(config: &NetConfig) -> Result<NetShard, NetError> {
        let bind_error = |detail: String| NetError::Bind {
            addr: config.bind,
            detail,
        };
        let socket = UdpSocket::bind(config.bind).map_err(|e| bind_error(e.to_string()))?;
        socket
            .set_nonblocking(true)
            .map_err(|e| bind_error(e.to_string()))?;
        let udp = quinn_udp::UdpSocketState::new((&socket).into())
            .map_err(|e| bind_error(e.to_string()))?;
        size_buffers(&udp, &socket, config);
        // SAFETY: `dup` gives a new descriptor of the same socket, owned by glommio's socket
        // alone; it is used only to wait for datagrams (a peek), never to read or write them.
        let ready = unsafe {
            let fd = libc::dup(socket.as_raw_fd());
            if fd < 0 {
                return Err(bind_error(std::io::Error::last_os_error().to_string()));
            }
            glommio::net::UdpSocket::from_raw_fd(fd)
        };
        let local = socket.local_addr().map_err(|e| bind_error(e.to_string()))?;
        let transport = config.transport()?;
        let tls = |e: &dyn std::fmt::Display| NetError::Tls(e.to_string());
        let server = config.identity.server_config().map_err(|e| tls(&e))?;
        let server = QuicServerConfig::try_from(server).map_err(|e| tls(&e))?;
        let mut server = ServerConfig::with_crypto(Arc::new(server));
        server.transport_config(Arc::clone(&transport));
        let client = config.identity.client_config().map_err(|e| tls(&e))?;
        let client = QuicClientConfig::try_from(client).map_err(|e| tls(&e))?;
        let mut client = ClientConfig::new(Arc::new(client));
        client.transport_config(transport);
        let endpoint = Endpoint::new(
            Arc::new(EndpointConfig::default()),
            Some(Arc::new(server)),
            !udp.may_fragment(),
            None,
        );
        let shared = Rc::new(Shared {
            state: RefCell::new(State {
                endpoint,
                client,
                connections: HashMap::new(),
                by_handle: HashMap::new(),
                next_conn: 0,
                receivers: HashMap::new(),
                unmatched: HashMap::new(),
                senders: HashMap::new(),
                blocked: None,
                shutdown: false,
            }),
            signal: Arc::default(),
            socket,
            udp,
            ready,
            local,
            connect_timeout: config.connect_timeout,
            open_timeout: config.open_timeout,
            stream_window: config.stream_window,
        });
        glommio::spawn_local(drive(Rc::clone(&shared))).detach();
        Ok(NetShard { shared })
    }

    /// The address peers reach this shard at.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local
    }

    /// Waits until every channel this shard took part in is over at both ends — each sender's
    /// receiving side has received its end (or went), and the peers acknowledged everything
    /// this side wrote — or its connection is lost, for `timeout` at most; whether it
    /// drained. Dropping the shard then closes its connections without cutting any channel
    /// short: what was still on its way when a connection closes is lost.
    pub async fn drain(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.drained() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
    }

    fn drained(&self) -> bool {
        let mut state = self.shared.state.borrow_mut();
        state.senders.is_empty()
            && state
                .connections
                .values_mut()
                .all(|conn| conn.lost.is_some() || conn.conn.streams().send_streams() == 0)
    }

    /// A connection to the shard at `addr`, whose certificate must name `name`; retried with
    /// backoff while the peer does not answer, up to the connect timeout. A refused
    /// handshake (a certificate the peer or this side does not trust) is not retried.
    pub async fn connect(&self, addr: SocketAddr, name: &str) -> Result<Peer, NetError> {
        let deadline = Instant::now() + self.shared.connect_timeout;
        let mut backoff = Duration::from_millis(50);
        loop {
            let handle = {
                let mut state = self.shared.state.borrow_mut();
                if state.shutdown {
                    return Err(NetError::Shutdown);
                }
                let config = state.client.clone();
                let (handle, conn) = state
                    .endpoint
                    .connect(Instant::now(), config, addr, name)
                    .map_err(|e| NetError::Connect {
                        name: name.to_string(),
                        addr,
                        reason: e.to_string(),
                    })?;
                state.add(handle, conn, addr)
            };
            self.shared.signal.raise();
            let error = match (Handshake {
                shared: &self.shared,
                handle,
            })
            .await
            {
                Ok(()) => {
                    return Ok(Peer {
                        shared: Rc::clone(&self.shared),
                        handle,
                        addr,
                    })
                }
                Err(error) => error,
            };
            if !error.unanswered || Instant::now() + backoff >= deadline {
                return Err(NetError::Connect {
                    name: name.to_string(),
                    addr,
                    reason: error.reason,
                });
            }
            glommio::timer::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// The receiving end of the channel `key`, landing its segments in `pool` (the channel's
    /// own: its size is the sender's credit). The stream may come before or after this.
    pub fn receive(&self, key: &[u8], pool: SegmentPool) -> Result<ChannelReceiver, NetError> {
        let mut state = self.shared.state.borrow_mut();
        if state.receivers.contains_key(key) {
            return Err(NetError::Duplicate { key: key.to_vec() });
        }
        let credit = (pool.segment_size() + HEADER) * pool.capacity();
        if credit > self.shared.stream_window as usize {
            return Err(NetError::Config {
                detail: format!(
                    "channel {key:?}'s pool holds {credit} bytes of frames, more than QUIC's \
                     stream window of {} bytes: credit must bind, not the window",
                    self.shared.stream_window
                ),
            });
        }
        let signal = Arc::clone(&self.shared.signal);
        let credit =
            ReceiverCredit::new(pool, move || signal.raise()).ok_or_else(|| NetError::Config {
                detail: format!(
                    "channel {key:?}'s pool belongs to another channel: each channel needs a \
                     pool of its own"
                ),
            })?;
        let mut receiving = Receiving {
            stream: None,
            reader: FrameReader::data(credit),
            segments: VecDeque::new(),
            credit_out: Vec::new(),
            waker: None,
            end: state.shutdown.then_some(Err(NetError::Shutdown)),
            open_by: Instant::now() + self.shared.open_timeout,
            announced: 0,
            on_announce: None,
        };
        let unmatched = state.unmatched.remove(key);
        if let Some((handle, stream, end)) = unmatched {
            let state = &mut *state;
            if let Some(conn) = state.connections.get_mut(&handle) {
                conn.waiting.remove(&stream);
                conn.inbound.insert(stream, key.to_vec());
                receiving.stream = Some((handle, stream));
                if end.is_some() {
                    let _ = conn.conn.send_stream(stream).finish();
                }
            }
            if let Some(end) = end {
                receiving.finish(end);
            }
        }
        state.receivers.insert(key.to_vec(), receiving);
        drop(state);
        self.shared.signal.raise();
        Ok(ChannelReceiver {
            shared: Rc::clone(&self.shared),
            key: key.to_vec(),
        })
    }
}

impl Drop for NetShard {
    fn drop(&mut self) {
        self.shared.state.borrow_mut().shutdown = true;
        self.shared.signal.raise();
    }
}

/// Waits for a connection's handshake.
struct Handshake<'a> {
    shared: &'a Shared,
    handle: ConnId,
}

/// Why a connection went.
#[derive(Clone, Debug)]
struct Lost {
    reason: String,
    /// The peer never answered (worth trying again).
    unanswered: bool,
    /// The peer shut its endpoint down.
    ended: bool,
}

impl Lost {
    fn from(error: &ConnectionError) -> Lost {
        Lost {
            reason: describe(error),
            unanswered: matches!(error, ConnectionError::TimedOut),
            ended: matches!(error, ConnectionError::ApplicationClosed(close)
                if close.error_code == VarInt::from_u32(SHUTDOWN)),
        }
    }
}

impl Future for Handshake<'_> {
    type Output = Result<(), Lost>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.shared.state.borrow_mut();
        let Some(conn) = state.connections.get_mut(&self.handle) else {
            return Poll::Ready(Err(Lost::from(&ConnectionError::LocallyClosed)));
        };
        if let Some(error) = &conn.lost {
            return Poll::Ready(Err(error.clone()));
        }
        if conn.connected {
            return Poll::Ready(Ok(()));
        }
        conn.waiters.push(cx.waker().clone());
        Poll::Pending
    }
}

/// A connection to another shard: opens channels to it.
pub struct Peer {
    shared: Rc<Shared>,
    handle: ConnId,
    addr: SocketAddr,
}

impl fmt::Debug for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Peer").field("addr", &self.addr).finish()
    }
}

impl Peer {
    /// The peer's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Opens the channel `key` to the peer (at most [`crate::wire::MAX_KEY`] bytes): a
    /// stream of its own, which the peer's receiver registered under `key` takes.
    pub fn open_channel(&self, key: &[u8]) -> Result<ChannelSender, NetError> {
        if key.len() > MAX_KEY {
            return Err(NetError::Config {
                detail: format!("a channel key of {} bytes, more than {MAX_KEY}", key.len()),
            });
        }
        let mut state = self.shared.state.borrow_mut();
        let lost = |reason: String| NetError::Lost {
            peer: self.addr,
            reason,
        };
        let conn = state
            .connections
            .get_mut(&self.handle)
            .ok_or_else(|| lost("closed".into()))?;
        if let Some(error) = &conn.lost {
            return Err(lost(error.reason.clone()));
        }
        let stream = conn
            .conn
            .streams()
            .open(Dir::Bi)
            .ok_or_else(|| NetError::Config {
                detail: format!("more than {MAX_CHANNELS} channels to {}", self.addr),
            })?;
        let mut sending = Sending {
            peer: self.addr,
            credit: SenderCredit::new(),
            credits: FrameReader::credits(),
            pending: VecDeque::from([Bytes::from(open_frame(key))]),
            wakers: Vec::new(),
            closed: None,
            dropped: false,
        };
        push(&mut sending, &mut conn.conn, stream);
        state.senders.insert((self.handle, stream), sending);
        drop(state);
        self.shared.signal.raise();
        Ok(ChannelSender {
            shared: Rc::clone(&self.shared),
            key: (self.handle, stream),
        })
    }
}

/// Why [`ChannelSender::try_send`] did not send.
#[derive(Debug)]
pub enum TrySend {
    /// No credit now: the segment, back.
    NoCredit(Segment),
    /// The channel failed.
    Closed(NetError),
}

/// The sending end of a channel to another shard's receiver. Dropping it ends the channel
/// once what it sent is out.
pub struct ChannelSender {
    shared: Rc<Shared>,
    key: (ConnId, StreamId),
}

impl fmt::Debug for ChannelSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChannelSender")
            .field("stream", &self.key.1)
            .finish()
    }
}

impl ChannelSender {
    /// Sends `segment` if the receiver has credit for it now.
    pub fn try_send(&self, segment: Segment) -> Result<(), TrySend> {
        let mut state = self.shared.state.borrow_mut();
        let state = &mut *state;
        let Some(sending) = state.senders.get_mut(&self.key) else {
            return Err(TrySend::Closed(NetError::Shutdown));
        };
        if let Some(error) = &sending.closed {
            return Err(TrySend::Closed(error.clone()));
        }
        if !sending.credit.try_take() {
            return Err(TrySend::NoCredit(segment));
        }
        sending
            .pending
            .push_back(Bytes::copy_from_slice(&data_header(segment.len())));
        sending
            .pending
            .push_back(Bytes::from_owner(SegmentBytes(segment)));
        if let Some(conn) = state.connections.get_mut(&self.key.0) {
            push(sending, &mut conn.conn, self.key.1);
        }
        self.shared.signal.raise();
        Ok(())
    }

    /// Sends `segment` once the receiver grants credit for it.
    pub async fn send(&self, mut segment: Segment) -> Result<(), NetError> {
        loop {
            match self.try_send(segment) {
                Ok(()) => return Ok(()),
                Err(TrySend::Closed(error)) => return Err(error),
                Err(TrySend::NoCredit(back)) => segment = back,
            }
            Credit { sender: self }.await;
        }
    }

    /// Tells the receiver, ahead of the data waiting for credit, that the sender passed
    /// checkpoint `checkpoint`'s barrier into the channel: an unaligned checkpoint, which the
    /// receiver starts at once. It takes no credit. Not sent before the receiver announced
    /// credit (it has not taken the channel yet, and learns of the checkpoint from the
    /// barrier's in-band copy), nor on a closed channel.
    pub fn announce(&self, checkpoint: u32) {
        let mut state = self.shared.state.borrow_mut();
        let state = &mut *state;
        let Some(sending) = state.senders.get_mut(&self.key) else {
            return;
        };
        if sending.closed.is_some() || !sending.credit.heard() {
            return;
        }
        sending
            .pending
            .push_back(Bytes::copy_from_slice(&announce_frame(checkpoint)));
        if let Some(conn) = state.connections.get_mut(&self.key.0) {
            push(sending, &mut conn.conn, self.key.1);
        }
        self.shared.signal.raise();
    }

    /// Credit not yet used: segments the receiver can take now.
    pub fn credit(&self) -> u64 {
        let state = self.shared.state.borrow();
        state
            .senders
            .get(&self.key)
            .map_or(0, |sending| sending.credit.available())
    }
}

impl Drop for ChannelSender {
    fn drop(&mut self) {
        let mut state = self.shared.state.borrow_mut();
        let state = &mut *state;
        if let Some(sending) = state.senders.get_mut(&self.key) {
            sending.dropped = true;
            // Its credit half is read on until the receiver ends it, having read the channel's
            // end: only then is the channel over at both ends (`NetShard::drain`).
            if let Some(conn) = state.connections.get_mut(&self.key.0) {
                push(sending, &mut conn.conn, self.key.1);
            }
            // Kept until its receiver read the end (its credit half ends) or the channel
            // failed: until then the shard has not drained (`NetShard::drain`).
            if sending.closed.is_some() {
                state.senders.remove(&self.key);
            }
        }
        self.shared.signal.raise();
    }
}

/// Resolves when a sender has credit or its channel closed.
struct Credit<'a> {
    sender: &'a ChannelSender,
}

impl Future for Credit<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.sender.shared.state.borrow_mut();
        match state.senders.get_mut(&self.sender.key) {
            Some(sending) if sending.closed.is_none() && sending.credit.available() == 0 => {
                sending.wakers.push(cx.waker().clone());
                Poll::Pending
            }
            _ => Poll::Ready(()),
        }
    }
}

/// A segment's filled bytes, owned by a `Bytes` QUIC keeps until they are acknowledged.
struct SegmentBytes(Segment);

impl AsRef<[u8]> for SegmentBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.filled()
    }
}

/// The receiving end of a channel from another shard: its segments, in order, in the pool
/// given at [`NetShard::receive`]. The stream ends when the sender finished the channel or
/// the channel failed ([`ChannelReceiver::failure`] says why). Dropping it tells the sender.
pub struct ChannelReceiver {
    shared: Rc<Shared>,
    key: Vec<u8>,
}

impl fmt::Debug for ChannelReceiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChannelReceiver")
            .field("key", &self.key)
            .finish()
    }
}

impl ChannelReceiver {
    /// Calls `announced` with every checkpoint the sender announces newer than any before
    /// ([`ChannelSender::announce`]), on this shard as the announcement lands; at once with
    /// the newest announced before, if any. It runs while the shard's endpoint is borrowed:
    /// it must not touch the endpoint or its channels (nor own one, which would be dropped
    /// there when the hook is replaced); the engine's sets an atomic.
    pub fn on_announce(&self, announced: impl Fn(u32) + 'static) {
        let mut state = self.shared.state.borrow_mut();
        if let Some(receiving) = state.receivers.get_mut(&self.key) {
            if receiving.announced > 0 {
                announced(receiving.announced);
            }
            receiving.on_announce = Some(Box::new(announced));
        }
    }

    /// Why the channel failed, once it ended without its sender finishing it.
    pub fn failure(&self) -> Option<NetError> {
        let state = self.shared.state.borrow();
        match &state.receivers.get(&self.key)?.end {
            Some(Err(error)) => Some(error.clone()),
            _ => None,
        }
    }
}

impl Stream for ChannelReceiver {
    type Item = Segment;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Segment>> {
        let mut state = self.shared.state.borrow_mut();
        let Some(receiving) = state.receivers.get_mut(&self.key) else {
            return Poll::Ready(None);
        };
        if let Some(segment) = receiving.segments.pop_front() {
            return Poll::Ready(Some(segment));
        }
        if receiving.end.is_some() {
            return Poll::Ready(None);
        }
        receiving.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for ChannelReceiver {
    fn drop(&mut self) {
        let mut state = self.shared.state.borrow_mut();
        let state = &mut *state;
        if let Some(receiving) = state.receivers.remove(&self.key) {
            if let Some((handle, stream)) = receiving.stream {
                if let Some(conn) = state.connections.get_mut(&handle) {
                    conn.inbound.remove(&stream);
                    let gone = VarInt::from_u32(RECEIVER_GONE);
                    let _ = conn.conn.recv_stream(stream).stop(gone);
                    // Stopped by its sender already: `process` resets it.
                    let _ = conn.conn.send_stream(stream).finish();
                }
            }
        }
        self.shared.signal.raise();
    }
}

impl Sending {
    /// The channel is over: nothing more goes out, and whoever waits for credit learns why.
    fn close(&mut self, error: NetError) {
        self.pending.clear();
        self.closed = Some(error);
        self.wakers.drain(..).for_each(Waker::wake);
    }
}

impl Receiving {
    /// When the channel fails unless a sender opens it first (`None`: opened, or ended).
    fn open_deadline(&self) -> Option<Instant> {
        (self.stream.is_none() && self.end.is_none()).then_some(self.open_by)
    }

    /// The channel ended (the first end is the one that stays): its task learns it.
    fn finish(&mut self, end: End) {
        self.end.get_or_insert(end);
        wake(&mut self.waker);
    }
}

impl State {
    /// A new connection: its id.
    fn add(&mut self, handle: ConnectionHandle, conn: Connection, peer: SocketAddr) -> ConnId {
        let id = self.next_conn;
        self.next_conn += 1;
        self.by_handle.insert(handle, id);
        self.connections.insert(id, Conn::new(handle, conn, peer));
        id
    }
}

impl Conn {
    fn new(handle: ConnectionHandle, conn: Connection, peer: SocketAddr) -> Conn {
        Conn {
            handle,
            conn,
            peer,
            connected: false,
            lost: None,
            waiters: Vec::new(),
            hello: None,
            opening: HashMap::new(),
            inbound: HashMap::new(),
            waiting: HashMap::new(),
        }
    }
}

/// Why a connection went, for people.
fn describe(error: &ConnectionError) -> String {
    const TLS: &str = "the TLS handshake failed: both sides need certificates signed by the \
                       cluster's CA, the dialled one for the name dialled";
    // QUIC carries TLS alerts as the error codes 0x100 to 0x1ff.
    let tls = |code: quinn_proto::TransportErrorCode| (0x100..0x200).contains(&u64::from(code));
    match error {
        ConnectionError::TimedOut => "no answer (timed out)".into(),
        ConnectionError::TransportError(e) if tls(e.code) => format!("{TLS} ({e})"),
        ConnectionError::ConnectionClosed(close) if tls(close.error_code) => {
            format!("{TLS}; the peer refused this side ({close})")
        }
        other => other.to_string(),
    }
}

/// Hands a sender's pending bytes to its stream as far as QUIC takes them; finishes the
/// stream once the handle is gone and everything is out.
fn push(sending: &mut Sending, conn: &mut Connection, stream: StreamId) {
    let mut send = conn.send_stream(stream);
    while let Some(front) = sending.pending.front_mut() {
        match send.write_chunks(std::slice::from_mut(front)) {
            Ok(_) if front.is_empty() => {
                sending.pending.pop_front();
            }
            Ok(_) | Err(WriteError::Blocked) => return,
            Err(WriteError::Stopped(_)) | Err(WriteError::ClosedStream) => {
                sending.close(NetError::ReceiverGone { peer: sending.peer });
                return;
            }
        }
    }
    if sending.dropped && sending.closed.is_none() {
        let _ = send.finish();
    }
}

/// Feeds a receiver's stream bytes to its reader: whole segments queue for its task; a
/// protocol error ends the channel.
fn land(receiving: &mut Receiving, peer: SocketAddr, bytes: &[u8]) -> bool {
    let mut out = Vec::new();
    if let Err(error) = receiving.reader.feed(bytes, &mut out) {
        receiving.end = Some(Err(NetError::Protocol {
            peer,
            detail: error.to_string(),
        }));
        wake(&mut receiving.waker);
        return false;
    }
    for inbound in out {
        match inbound {
            Inbound::Segment(segment) => receiving.segments.push_back(segment),
            Inbound::Announce(checkpoint) if checkpoint > receiving.announced => {
                receiving.announced = checkpoint;
                if let Some(announced) = &receiving.on_announce {
                    announced(checkpoint);
                }
            }
            Inbound::Announce(_) | Inbound::Credit(_) => {}
        }
    }
    if !receiving.segments.is_empty() {
        wake(&mut receiving.waker);
    }
    true
}

fn wake(waker: &mut Option<Waker>) {
    if let Some(waker) = waker.take() {
        waker.wake();
    }
}

/// Sets the socket's buffers, warning (once a process) when the kernel keeps them smaller.
fn size_buffers(udp: &quinn_udp::UdpSocketState, socket: &UdpSocket, config: &NetConfig) {
    static WARNED: std::sync::atomic::AtomicBool = AtomicBool::new(false);
    let _ = udp.set_recv_buffer_size(socket.into(), config.udp_receive_buffer);
    let _ = udp.set_send_buffer_size(socket.into(), config.udp_send_buffer);
    if WARNED.load(Ordering::Relaxed) {
        return;
    }
    // Linux reports twice what it grants (the other half is its bookkeeping).
    let short = |got: std::io::Result<usize>, want: usize| {
        let short = got.map(|got| got / 2 < want).unwrap_or(false);
        if short {
            WARNED.store(true, Ordering::Relaxed);
        }
        short
    };
    if short(
        udp.recv_buffer_size(socket.into()),
        config.udp_receive_buffer,
    ) {
        tracing::warn!(
            wanted = config.udp_receive_buffer,
            "the kernel keeps the exchange's UDP receive buffer smaller than wanted: raise \
             net.core.rmem_max (`weir tune apply --tuner udp-buffers`)"
        );
    }
    if short(udp.send_buffer_size(socket.into()), config.udp_send_buffer) {
        tracing::warn!(
            wanted = config.udp_send_buffer,
            "the kernel keeps the exchange's UDP send buffer smaller than wanted: raise \
             net.core.wmem_max (`weir tune apply --tuner udp-buffers`)"
        );
    }
}

/// The shard's driver: datagrams in, events to channels, credit and data out, timers.
async fn drive(shared: Rc<Shared>) {
    let mut receive = vec![0u8; 64 * 1024 * shared.udp.gro_segments().max(1)];
    let mut closing = false;
    loop {
        let deadline = {
            let mut state = shared.state.borrow_mut();
            if state.shutdown && !closing {
                closing = true;
                shut_down(&mut state);
            }
            let opening = state
                .receivers
                .values()
                .filter_map(Receiving::open_deadline)
                .min();
            state
                .connections
                .values_mut()
                .filter_map(|conn| conn.conn.poll_timeout())
                .chain(opening)
                .min()
        };
        if closing && shared.state.borrow().connections.is_empty() {
            return;
        }
        if closing {
            // Close frames are out; peers learn the rest from their idle timeout.
            flush(&shared);
            if shared.state.borrow().blocked.is_none() {
                return;
            }
        }
        wait(&shared, deadline).await;
        receive_datagrams(&shared, &mut receive);
        {
            let mut state = shared.state.borrow_mut();
            let now = Instant::now();
            for conn in state.connections.values_mut() {
                if conn.conn.poll_timeout().is_some_and(|at| at <= now) {
                    conn.conn.handle_timeout(now);
                }
            }
            let open_timeout = shared.open_timeout;
            for (key, receiving) in &mut state.receivers {
                if receiving.open_deadline().is_some_and(|at| at <= now) {
                    receiving.finish(Err(NetError::NotOpened {
                        key: key.clone(),
                        waited: open_timeout,
                    }));
                }
            }
            process(&mut state);
            announce(&mut state);
        }
        flush(&shared);
        if shared.state.borrow().blocked.is_some() {
            glommio::timer::sleep(Duration::from_micros(50)).await;
        }
        glommio::yield_if_needed().await;
    }
}

/// Waits for a datagram, the next timeout or the signal.
async fn wait(shared: &Shared, deadline: Option<Instant>) {
    if shared.signal.take() || shared.state.borrow().blocked.is_some() {
        return;
    }
    let mut peek = [0u8; 1];
    let readable = shared.ready.peek_from(&mut peek);
    let timer = async {
        match deadline {
            Some(at) => glommio::timer::sleep(at.saturating_duration_since(Instant::now())).await,
            None => futures::future::pending().await,
        }
    };
    let raised = Raised(&shared.signal);
    futures::pin_mut!(readable, timer, raised);
    futures::future::select(readable, futures::future::select(timer, raised)).await;
}

/// Reads every datagram waiting (a bounded number of reads) and hands each to its connection.
fn receive_datagrams(shared: &Shared, buffer: &mut [u8]) {
    let mut state = shared.state.borrow_mut();
    let state = &mut *state;
    let mut response = Vec::new();
    for _ in 0..64 {
        let mut meta = [quinn_udp::RecvMeta::default()];
        let read = {
            let mut slices = [std::io::IoSliceMut::new(buffer)];
            shared
                .udp
                .recv((&shared.socket).into(), &mut slices, &mut meta)
        };
        match read {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => {
                tracing::debug!(error = %e, "the exchange's socket refused a read");
                return;
            }
        }
        let meta = meta[0];
        let now = Instant::now();
        for datagram in buffer[..meta.len].chunks(meta.stride.max(1)) {
            response.clear();
            let event = state.endpoint.handle(
                now,
                meta.addr,
                meta.dst_ip,
                meta.ecn.map(|ecn| {
                    quinn_proto::EcnCodepoint::from_bits(ecn as u8).expect("a codepoint")
                }),
                BytesMut::from(datagram),
                &mut response,
            );
            match event {
                Some(DatagramEvent::ConnectionEvent(handle, event)) => {
                    let id = state.by_handle.get(&handle);
                    if let Some(conn) = id.and_then(|id| state.connections.get_mut(id)) {
                        conn.conn.handle_event(event);
                    }
                }
                Some(DatagramEvent::NewConnection(incoming)) => {
                    let peer = incoming.remote_address();
                    // A peer proves it owns its address (a retry token) before this shard
                    // spends a handshake's cryptography on it.
                    if !incoming.remote_address_validated() && incoming.may_retry() {
                        match state.endpoint.retry(incoming, &mut response) {
                            Ok(transmit) => send_now(shared, &transmit, &response),
                            Err(error) => state.endpoint.ignore(error.into_incoming()),
                        }
                        continue;
                    }
                    match state.endpoint.accept(incoming, now, &mut response, None) {
                        Ok((handle, conn)) => {
                            state.add(handle, conn, peer);
                        }
                        Err(error) => {
                            tracing::info!(%peer, error = %error.cause, "refused a connection");
                            if let Some(transmit) = error.response {
                                send_now(shared, &transmit, &response);
                            }
                        }
                    }
                }
                Some(DatagramEvent::Response(transmit)) => send_now(shared, &transmit, &response),
                None => {}
            }
        }
    }
}

/// Everything connections have to say: handshakes, losses, streams opened, readable,
/// writable and stopped.
fn process(state: &mut State) {
    let handles: Vec<ConnId> = state.connections.keys().copied().collect();
    for handle in handles {
        let Some(conn) = state.connections.get_mut(&handle) else {
            continue;
        };
        while let Some(event) = conn.conn.poll_endpoint_events() {
            if let Some(event) = state.endpoint.handle_event(conn.handle, event) {
                conn.conn.handle_event(event);
            }
        }
        let mut events = Vec::new();
        while let Some(event) = conn.conn.poll() {
            events.push(event);
        }
        for event in events {
            match event {
                Event::Connected => {
                    let conn = state.connections.get_mut(&handle).expect("the connection");
                    if conn.conn.side().is_server() {
                        conn.connected = true;
                        greet(&mut conn.conn);
                    }
                }
                Event::ConnectionLost { reason } => lose(state, handle, Lost::from(&reason)),
                Event::Stream(StreamEvent::Opened { dir: Dir::Uni }) => {
                    let conn = state.connections.get_mut(&handle).expect("the connection");
                    if let Some(stream) = conn.conn.streams().accept(Dir::Uni) {
                        conn.hello = Some((stream, Vec::new()));
                        hear(state, handle);
                    }
                }
                Event::Stream(StreamEvent::Readable { id })
                    if state.connections[&handle]
                        .hello
                        .as_ref()
                        .is_some_and(|(stream, _)| *stream == id) =>
                {
                    hear(state, handle)
                }
                Event::Stream(StreamEvent::Opened { dir: Dir::Bi }) => {
                    let conn = state.connections.get_mut(&handle).expect("the connection");
                    let mut opened = Vec::new();
                    while let Some(stream) = conn.conn.streams().accept(Dir::Bi) {
                        conn.opening.insert(stream, OpenReader::new());
                        opened.push(stream);
                    }
                    for stream in opened {
                        read_stream(state, handle, stream);
                    }
                }
                Event::Stream(StreamEvent::Readable { id }) => read_stream(state, handle, id),
                Event::Stream(StreamEvent::Writable { id }) => {
                    if let (Some(sending), Some(conn)) = (
                        state.senders.get_mut(&(handle, id)),
                        state.connections.get_mut(&handle),
                    ) {
                        push(sending, &mut conn.conn, id);
                        if sending.dropped && sending.closed.is_some() {
                            state.senders.remove(&(handle, id));
                        }
                    }
                }
                Event::Stream(StreamEvent::Stopped { id, error_code }) => {
                    // quinn-proto leaves a stopped stream to be reset: only then is it freed.
                    if let Some(conn) = state.connections.get_mut(&handle) {
                        let _ = conn.conn.send_stream(id).reset(error_code);
                    }
                    if let Some(sending) = state.senders.get_mut(&(handle, id)) {
                        sending.close(NetError::ReceiverGone { peer: sending.peer });
                        if sending.dropped {
                            state.senders.remove(&(handle, id));
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(conn) = state.connections.get(&handle) {
            if conn.conn.is_drained() {
                state.by_handle.remove(&conn.handle);
                state.connections.remove(&handle);
            }
        }
    }
}

/// Reads what a stream holds: an open frame (matching the stream to its receiver), data
/// frames into the receiver's pool, credit frames for a sender.
fn read_stream(state: &mut State, handle: ConnId, stream: StreamId) {
    let Some(conn) = state.connections.get_mut(&handle) else {
        return;
    };
    let peer = conn.peer;
    let mut recv = conn.conn.recv_stream(stream);
    let Ok(mut chunks) = recv.read(true) else {
        return;
    };
    let mut ended: Option<Result<(), NetError>> = None;
    // Set when the stream breaks the protocol: it is refused after the read.
    let mut refused = false;
    loop {
        let chunk = match chunks.next(usize::MAX) {
            Ok(Some(chunk)) => chunk.bytes,
            Ok(None) => {
                ended = Some(Ok(()));
                break;
            }
            Err(ReadError::Blocked) => break,
            Err(ReadError::Reset(code)) => {
                ended = Some(Err(NetError::Protocol {
                    peer,
                    detail: format!("the sender reset the channel (code {code})"),
                }));
                break;
            }
        };
        // A stream this side opened: credit frames for its sender.
        if let Some(sending) = state.senders.get_mut(&(handle, stream)) {
            let mut out = Vec::new();
            if let Err(error) = sending.credits.feed(&chunk, &mut out) {
                sending.closed = Some(NetError::Protocol {
                    peer,
                    detail: error.to_string(),
                });
                refused = true;
            }
            for inbound in out {
                if let Inbound::Credit(credits) = inbound {
                    sending.credit.grant(credits);
                }
            }
            sending.wakers.drain(..).for_each(Waker::wake);
            if refused {
                break;
            }
            continue;
        }
        let mut bytes = &chunk[..];
        let opened: Vec<u8>;
        if let Some(opening) = conn.opening.get_mut(&stream) {
            match opening.feed(bytes) {
                Ok(None) => continue,
                Ok(Some(Opened { key, rest })) => {
                    conn.opening.remove(&stream);
                    opened = rest;
                    bytes = &opened;
                    match state.receivers.get_mut(&key) {
                        Some(receiving) if receiving.stream.is_none() => {
                            receiving.stream = Some((handle, stream));
                            conn.inbound.insert(stream, key);
                        }
                        // A second stream for a channel: refused.
                        Some(_) => {
                            refused = true;
                            break;
                        }
                        // A second stream for a waiting channel, unless the first one's
                        // connection was lost (a sender reconnecting).
                        None if state
                            .unmatched
                            .get(&key)
                            .is_some_and(|(_, _, end)| !matches!(end, Some(Err(_)))) =>
                        {
                            refused = true;
                            break;
                        }
                        None => {
                            conn.waiting.insert(stream, key.clone());
                            state.unmatched.insert(key, (handle, stream, None));
                        }
                    }
                }
                Err(error) => {
                    tracing::info!(%peer, %error, "refused a channel");
                    conn.opening.remove(&stream);
                    refused = true;
                    break;
                }
            }
        }
        if bytes.is_empty() {
            continue;
        }
        if let Some(key) = conn.inbound.get(&stream) {
            if let Some(receiving) = state.receivers.get_mut(key) {
                if !land(receiving, peer, bytes) {
                    refused = true;
                    break;
                }
            }
        } else if let Some(key) = conn.waiting.remove(&stream) {
            // Data before any credit (none is granted before the receiver registers).
            tracing::info!(%peer, "refused a channel that sent data without credit");
            state.unmatched.remove(&key);
            refused = true;
            break;
        }
    }
    let _ = chunks.finalize();
    if refused {
        refuse(conn, stream);
    }
    // A sender's credit half that broke the protocol or ended: its channel is over.
    if let Some(sending) = state.senders.get_mut(&(handle, stream)) {
        if refused || ended.is_some() {
            let error = sending.closed.take();
            sending.close(error.unwrap_or(NetError::ReceiverGone { peer }));
            if sending.dropped {
                state.senders.remove(&(handle, stream));
            }
        }
        return;
    }
    if refused {
        return;
    }
    let Some(end) = ended else {
        return;
    };
    if conn.opening.remove(&stream).is_some() {
        // Ended before naming its channel: freed on this side too.
        let _ = conn
            .conn
            .send_stream(stream)
            .reset(VarInt::from_u32(PROTOCOL));
        return;
    }
    if let Some(key) = conn.waiting.get(&stream) {
        // Ended before its receiver registered: it learns so when it does.
        if let Some(entry) = state.unmatched.get_mut(key) {
            entry.2 = Some(end);
        }
        return;
    }
    let Some(key) = conn.inbound.get(&stream) else {
        return;
    };
    if let Some(receiving) = state.receivers.get_mut(key) {
        let end = match end {
            Ok(()) if !receiving.reader.between_frames() => Err(NetError::Protocol {
                peer,
                detail: "the sender's stream ended inside a frame".into(),
            }),
            end => end,
        };
        receiving.finish(end);
    }
    // The credit half is done too: the stream is freed on both sides.
    let _ = conn.conn.send_stream(stream).finish();
}

/// The accepting side's hello, on a stream of its own.
fn greet(conn: &mut Connection) {
    if let Some(stream) = conn.streams().open(Dir::Uni) {
        let mut send = conn.send_stream(stream);
        let _ = send.write(&HELLO);
        let _ = send.finish();
    }
}

/// Reads the accepting side's hello: the connection is made once it came whole, and closed
/// if it is not Weir's or not this version's.
fn hear(state: &mut State, handle: ConnId) {
    let Some(conn) = state.connections.get_mut(&handle) else {
        return;
    };
    let Some((stream, heard)) = conn.hello.as_mut() else {
        return;
    };
    let mut recv = conn.conn.recv_stream(*stream);
    if let Ok(mut chunks) = recv.read(true) {
        while let Ok(Some(chunk)) = chunks.next(HELLO.len() - heard.len().min(HELLO.len())) {
            heard.extend_from_slice(&chunk.bytes);
            if heard.len() >= HELLO.len() {
                break;
            }
        }
        let _ = chunks.finalize();
    }
    if heard.len() < HELLO.len() || conn.connected {
        return;
    }
    if *heard == HELLO {
        conn.connected = true;
        conn.waiters.drain(..).for_each(Waker::wake);
        return;
    }
    let reason = format!(
        "the peer is not a Weir exchange of protocol version {} (it said {:?})",
        HELLO[4], heard
    );
    conn.conn.close(
        Instant::now(),
        VarInt::from_u32(PROTOCOL),
        Bytes::from(reason.clone()),
    );
    lose(
        state,
        handle,
        Lost {
            reason,
            unanswered: false,
            ended: false,
        },
    );
}

/// Refuses a stream that breaks the protocol.
fn refuse(conn: &mut Conn, stream: StreamId) {
    let _ = conn
        .conn
        .recv_stream(stream)
        .stop(VarInt::from_u32(PROTOCOL));
    let _ = conn
        .conn
        .send_stream(stream)
        .reset(VarInt::from_u32(PROTOCOL));
}

/// A connection is gone: every channel on it fails, and whoever waits for its handshake
/// learns why.
fn lose(state: &mut State, handle: ConnId, lost: Lost) {
    let Some(conn) = state.connections.get_mut(&handle) else {
        return;
    };
    if conn.lost.is_some() {
        return;
    }
    let error = if lost.ended {
        NetError::PeerEnded { peer: conn.peer }
    } else {
        NetError::Lost {
            peer: conn.peer,
            reason: lost.reason.clone(),
        }
    };
    conn.lost = Some(lost);
    conn.waiters.drain(..).for_each(Waker::wake);
    for key in conn.inbound.values() {
        if let Some(receiving) = state.receivers.get_mut(key) {
            receiving.finish(Err(error.clone()));
        }
    }
    state.senders.retain(|(h, _), sending| {
        if *h != handle {
            return true;
        }
        sending.close(error.clone());
        !sending.dropped
    });
    // Streams still waiting for their receivers: one that ended keeps its end, one that did
    // not has failed; either way its receiver learns it when it comes.
    for (h, _, end) in state.unmatched.values_mut() {
        if *h == handle {
            end.get_or_insert(Err(error.clone()));
        }
    }
}

/// Announces every receiver's new credit on its stream.
fn announce(state: &mut State) {
    for receiving in state.receivers.values_mut() {
        let Some((handle, stream)) = receiving.stream else {
            continue;
        };
        if receiving.end.is_some() {
            continue;
        }
        while let Some(credits) = receiving.reader.announce() {
            receiving
                .credit_out
                .extend_from_slice(&credit_frame(credits));
        }
        if receiving.credit_out.is_empty() {
            continue;
        }
        if let Some(conn) = state.connections.get_mut(&handle) {
            if let Ok(written) = conn.conn.send_stream(stream).write(&receiving.credit_out) {
                receiving.credit_out.drain(..written);
            }
        }
    }
}

/// Closes every connection and fails every channel: the endpoint is shutting down.
fn shut_down(state: &mut State) {
    let now = Instant::now();
    let handles: Vec<ConnId> = state.connections.keys().copied().collect();
    for handle in handles {
        if let Some(conn) = state.connections.get_mut(&handle) {
            conn.conn.close(
                now,
                VarInt::from_u32(SHUTDOWN),
                Bytes::from_static(b"shutdown"),
            );
        }
        lose(state, handle, Lost::from(&ConnectionError::LocallyClosed));
    }
    for receiving in state.receivers.values_mut() {
        receiving.finish(Err(NetError::Shutdown));
    }
}

/// Sends what every connection has to send, in GSO batches, until the socket is full.
fn flush(shared: &Shared) {
    let mut state = shared.state.borrow_mut();
    let state = &mut *state;
    if let Some((transmit, bytes)) = state.blocked.take() {
        if !try_send(shared, &transmit, &bytes) {
            state.blocked = Some((transmit, bytes));
            return;
        }
    }
    let now = Instant::now();
    let gso = shared.udp.max_gso_segments();
    for conn in state.connections.values_mut() {
        let most = gso.clamp(1, (64 * 1024 - 1) / usize::from(conn.conn.current_mtu()));
        loop {
            let mut bytes = Vec::new();
            let Some(transmit) = conn.conn.poll_transmit(now, most, &mut bytes) else {
                break;
            };
            if !try_send(shared, &transmit, &bytes) {
                state.blocked = Some((transmit, bytes));
                return;
            }
        }
    }
}

/// A response the endpoint makes itself (a refusal, a retry): sent now or lost.
fn send_now(shared: &Shared, transmit: &quinn_proto::Transmit, bytes: &[u8]) {
    let _ = try_send(shared, transmit, bytes);
}

/// Sends one transmit: false when the socket is full (try again), true when it went or is
/// lost for good (QUIC recovers a loss).
fn try_send(shared: &Shared, transmit: &quinn_proto::Transmit, bytes: &[u8]) -> bool {
    let udp = quinn_udp::Transmit {
        destination: transmit.destination,
        ecn: transmit
            .ecn
            .map(|ecn| quinn_udp::EcnCodepoint::from_bits(ecn as u8).expect("a codepoint")),
        contents: &bytes[..transmit.size],
        segment_size: transmit.segment_size,
        src_ip: transmit.src_ip,
    };
    match shared.udp.try_send((&shared.socket).into(), &udp) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(e) => {
            // Too large for the path (an MTU probe), or a route gone: lost, as quinn does.
            tracing::debug!(error = %e, destination = %transmit.destination, "a datagram was not sent");
            true
        }
    }
}
