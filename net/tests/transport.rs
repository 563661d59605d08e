//! Channels over QUIC between two shards, each on its own glommio executor with its own
//! endpoint on loopback and a certificate of one cluster CA: segments cross whole and in
//! order within the receiver's credit, both ways; a slow receiver stops only its own
//! channel; a receiver that goes closes its sender; an announcement overtakes the data held
//! back for credit; a peer that shuts down fails every channel it carried; and peers without
//! a certificate of the cluster's CA are refused.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use futures::StreamExt;
use glommio::{LocalExecutorBuilder, Placement};
use rustls::pki_types::pem::PemObject;
use weir_memory::{Segment, SegmentPool};
use weir_net::tls::{ClusterCa, TlsIdentity};
use weir_net::{ChannelReceiver, ChannelSender, NetConfig, NetError, NetShard, Peer, TrySend};

const SEGMENT: usize = 4096;

fn identity(ca: &ClusterCa, name: &str) -> TlsIdentity {
    let node = ca.issue(name, &[]).unwrap();
    TlsIdentity::from_pem(ca.cert_pem(), &node.cert_pem, &node.key_pem, name).unwrap()
}

fn config(identity: TlsIdentity) -> NetConfig {
    let mut config = NetConfig::new("127.0.0.1:0".parse().unwrap(), identity);
    config.connect_timeout = Duration::from_secs(5);
    config.idle_timeout = Duration::from_secs(5);
    config
}

/// A segment of `pool` holding the message `n` of channel `channel`: its length varies with
/// `n`, every byte says where it belongs.
fn message(pool: &SegmentPool, channel: u8, n: u32) -> Segment {
    let mut segment = pool.acquire().unwrap();
    let len = 8 + (n as usize * 97) % (SEGMENT - 8);
    let buffer = segment.buffer_mut();
    buffer[..4].copy_from_slice(&n.to_le_bytes());
    buffer[4] = channel;
    for (i, byte) in buffer[8..len].iter_mut().enumerate() {
        *byte = (i as u32).wrapping_mul(31).wrapping_add(n) as u8 ^ channel;
    }
    segment.set_len(len);
    segment
}

fn check(segment: &Segment, channel: u8, n: u32) {
    let expected = message(&SegmentPool::new(9, 1, SEGMENT), channel, n);
    assert_eq!(
        segment.len(),
        expected.len(),
        "message {n} of channel {channel}: length"
    );
    assert!(
        segment.filled() == expected.filled(),
        "message {n} of channel {channel}: bytes"
    );
}

/// Runs `body` on a glommio executor of its own thread.
fn shard<T: Send + 'static, F: std::future::Future<Output = T> + 'static>(
    name: &str,
    body: impl FnOnce() -> F + Send + 'static,
) -> glommio::ExecutorJoinHandle<T> {
    LocalExecutorBuilder::new(Placement::Unbound)
        .name(name)
        .spawn(body)
        .unwrap()
}

/// Waits, without blocking the executor, for what another thread sends; fails the test
/// after 30 s without it.
async fn arrive<T>(receiver: &mpsc::Receiver<T>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(value) = receiver.try_recv() {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nothing arrived within 30 s"
        );
        glommio::timer::sleep(Duration::from_millis(2)).await;
    }
}

#[test]
fn segments_cross_whole_and_in_order_both_ways_within_the_receivers_credit() {
    const MESSAGES: u32 = 3000;
    let ca = ClusterCa::generate("test cluster").unwrap();
    let (a_identity, b_identity) = (identity(&ca, "a"), identity(&ca, "b"));
    let (a_addr_tx, a_addr_rx) = mpsc::channel::<SocketAddr>();
    let (b_addr_tx, b_addr_rx) = mpsc::channel::<SocketAddr>();
    let run = |me: u8,
               identity: TlsIdentity,
               addr_tx: mpsc::Sender<SocketAddr>,
               peer_rx: mpsc::Receiver<SocketAddr>| {
        move || async move {
            let net = NetShard::bind(&config(identity)).unwrap();
            addr_tx.send(net.local_addr()).unwrap();
            let other = 1 - me;
            // Two channels into this shard, each with a pool of two segments: the sender's
            // credit is two.
            let receivers: Vec<_> = (0..2u8)
                .map(|c| {
                    net.receive(&[other, c], SegmentPool::new(c as usize, 2, SEGMENT))
                        .unwrap()
                })
                .collect();
            let peer = net
                .connect(arrive(&peer_rx).await, ["a", "b"][other as usize])
                .await
                .unwrap();
            let pool = SegmentPool::new(7, 8, SEGMENT);
            let sending = glommio::spawn_local(async move {
                let senders: Vec<_> = (0..2u8)
                    .map(|c| peer.open_channel(&[me, c]).unwrap())
                    .collect();
                for n in 0..MESSAGES {
                    for (c, sender) in senders.iter().enumerate() {
                        sender.send(message(&pool, c as u8, n)).await.unwrap();
                        assert!(sender.credit() <= 2, "credit beyond the receiver's pool");
                    }
                }
            });
            let receiving: Vec<_> = receivers
                .into_iter()
                .enumerate()
                .map(|(c, mut receiver)| {
                    glommio::spawn_local(async move {
                        let mut n = 0;
                        while let Some(segment) = receiver.next().await {
                            check(&segment, c as u8, n);
                            n += 1;
                        }
                        assert!(receiver.failure().is_none(), "{:?}", receiver.failure());
                        n
                    })
                })
                .collect();
            let mut counts = Vec::new();
            for channel in receiving {
                counts.push(channel.await);
            }
            sending.await;
            counts
        }
    };
    let a = shard("a", run(0, a_identity, a_addr_tx, b_addr_rx));
    let b = shard("b", run(1, b_identity, b_addr_tx, a_addr_rx));
    assert_eq!(a.join().unwrap(), vec![MESSAGES, MESSAGES]);
    assert_eq!(b.join().unwrap(), vec![MESSAGES, MESSAGES]);
}

#[test]
fn a_slow_receiver_stops_only_its_own_channel_and_a_receiver_that_goes_closes_its_sender() {
    let ca = ClusterCa::generate("test cluster").unwrap();
    let (a_identity, b_identity) = (identity(&ca, "a"), identity(&ca, "b"));
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let (held_tx, held_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let receiving = shard("b", move || async move {
        let net = NetShard::bind(&config(b_identity)).unwrap();
        let mut slow = net
            .receive(b"slow", SegmentPool::new(0, 2, SEGMENT))
            .unwrap();
        let mut fast = net
            .receive(b"fast", SegmentPool::new(1, 2, SEGMENT))
            .unwrap();
        let gone = net
            .receive(b"gone", SegmentPool::new(2, 2, SEGMENT))
            .unwrap();
        addr_tx.send(net.local_addr()).unwrap();
        // Hold the slow channel's two segments: its pool is empty, it announces nothing.
        let held = vec![slow.next().await.unwrap(), slow.next().await.unwrap()];
        let mut fast_count = 0u32;
        while let Some(segment) = fast.next().await {
            check(&segment, 1, fast_count);
            fast_count += 1;
        }
        drop(gone);
        held_tx.send(()).unwrap();
        arrive(&release_rx).await;
        drop(held);
        let mut slow_count = 2u32;
        while let Some(segment) = slow.next().await {
            check(&segment, 0, slow_count);
            slow_count += 1;
        }
        (fast_count, slow_count)
    });
    let sending = shard("a", move || async move {
        let net = NetShard::bind(&config(a_identity)).unwrap();
        let peer = net.connect(addr_rx.recv().unwrap(), "b").await.unwrap();
        let pool = SegmentPool::new(7, 16, SEGMENT);
        let slow = peer.open_channel(b"slow").unwrap();
        let fast = peer.open_channel(b"fast").unwrap();
        let gone = peer.open_channel(b"gone").unwrap();
        slow.send(message(&pool, 0, 0)).await.unwrap();
        slow.send(message(&pool, 0, 1)).await.unwrap();
        // The slow receiver holds both: the fast channel flows on beside it.
        for n in 0..500 {
            fast.send(message(&pool, 1, n)).await.unwrap();
        }
        drop(fast);
        arrive(&held_rx).await;
        // The held segments' credit never came back.
        assert_eq!(slow.credit(), 0);
        match slow.try_send(message(&pool, 0, 2)) {
            Err(TrySend::NoCredit(_)) => {}
            other => panic!("a send without credit: {other:?}"),
        }
        // The receiver of `gone` went: its sender learns it.
        let closed = loop {
            match gone.send(message(&pool, 2, 0)).await {
                Err(error) => break error,
                Ok(()) => glommio::timer::sleep(Duration::from_millis(5)).await,
            }
        };
        assert!(matches!(closed, NetError::ReceiverGone { .. }), "{closed}");
        release_tx.send(()).unwrap();
        for n in 2..100 {
            slow.send(message(&pool, 0, n)).await.unwrap();
        }
    });
    sending.join().unwrap();
    assert_eq!(receiving.join().unwrap(), (500, 100));
}

/// A sender whose receiver holds every segment of its pool announces a checkpoint: the
/// receiver hears it before it reads anything, with the data behind it still held back for
/// credit; announcements no newer than one heard are not passed on; a hook set later hears
/// the newest at once.
#[test]
fn an_announcement_overtakes_the_data_held_back_for_credit() {
    let ca = ClusterCa::generate("test cluster").unwrap();
    let (a_identity, b_identity) = (identity(&ca, "a"), identity(&ca, "b"));
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let (full_tx, full_rx) = mpsc::channel::<()>();
    let (heard_tx, heard_rx) = mpsc::channel::<u32>();
    let receiving = shard("b", move || async move {
        let net = NetShard::bind(&config(b_identity)).unwrap();
        let mut channel = net.receive(b"ch", SegmentPool::new(0, 2, SEGMENT)).unwrap();
        channel.on_announce(move |checkpoint| heard_tx.send(checkpoint).unwrap());
        addr_tx.send(net.local_addr()).unwrap();
        // Nothing read until the first announcement came: both segments of the pool stay
        // queued, the sender has no credit.
        arrive(&full_rx).await;
        assert_eq!(arrive(&heard_rx).await, 7);
        let mut n = 0;
        while let Some(segment) = channel.next().await {
            check(&segment, 0, n);
            n += 1;
        }
        let mut later = Vec::new();
        while let Ok(checkpoint) = heard_rx.try_recv() {
            later.push(checkpoint);
        }
        let (newest_tx, newest_rx) = mpsc::channel::<u32>();
        channel.on_announce(move |checkpoint| newest_tx.send(checkpoint).unwrap());
        (n, later, newest_rx.try_recv().ok())
    });
    let sending = shard("a", move || async move {
        let net = NetShard::bind(&config(a_identity)).unwrap();
        let peer = net.connect(addr_rx.recv().unwrap(), "b").await.unwrap();
        let pool = SegmentPool::new(7, 8, SEGMENT);
        let channel = peer.open_channel(b"ch").unwrap();
        channel.send(message(&pool, 0, 0)).await.unwrap();
        channel.send(message(&pool, 0, 1)).await.unwrap();
        match channel.try_send(message(&pool, 0, 2)) {
            Err(TrySend::NoCredit(_)) => {}
            other => panic!("a send without credit: {other:?}"),
        }
        channel.announce(7);
        full_tx.send(()).unwrap();
        // Behind the announcement, the data that waited for credit.
        channel.send(message(&pool, 0, 2)).await.unwrap();
        channel.announce(7);
        channel.announce(5);
        channel.announce(8);
        channel.send(message(&pool, 0, 3)).await.unwrap();
        drop(channel);
        assert!(net.drain(Duration::from_secs(5)).await, "not drained");
    });
    sending.join().unwrap();
    let (received, later, newest) = receiving.join().unwrap();
    assert_eq!(received, 4);
    assert_eq!(later, [8]);
    assert_eq!(newest, Some(8));
}

#[test]
fn channels_opened_before_their_receivers_register_wait_for_them() {
    let ca = ClusterCa::generate("test cluster").unwrap();
    let (a_identity, b_identity) = (identity(&ca, "a"), identity(&ca, "b"));
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let (opened_tx, opened_rx) = mpsc::channel::<()>();
    let receiving = shard("b", move || async move {
        let net = NetShard::bind(&config(b_identity)).unwrap();
        addr_tx.send(net.local_addr()).unwrap();
        arrive(&opened_rx).await;
        glommio::timer::sleep(Duration::from_millis(100)).await;
        // Opened, and ended with nothing sent, before this receiver came.
        let mut empty = net
            .receive(b"empty", SegmentPool::new(1, 2, SEGMENT))
            .unwrap();
        let mut late = net
            .receive(b"late", SegmentPool::new(0, 2, SEGMENT))
            .unwrap();
        let mut dup = net
            .receive(b"dup", SegmentPool::new(4, 2, SEGMENT))
            .unwrap();
        assert!(empty.next().await.is_none());
        assert!(empty.failure().is_none(), "{:?}", empty.failure());
        let mut n = 0;
        while let Some(segment) = late.next().await {
            check(&segment, 0, n);
            n += 1;
        }
        assert!(late.failure().is_none(), "{:?}", late.failure());
        // Of two streams for one channel, one was refused, the other carried its segment.
        check(&dup.next().await.unwrap(), 2, 0);
        assert!(dup.next().await.is_none());
        assert!(dup.failure().is_none(), "{:?}", dup.failure());
        // A pool serves one channel; a key one receiver.
        let pool = SegmentPool::new(2, 2, SEGMENT);
        let _twice = net.receive(b"twice", pool.clone()).unwrap();
        assert!(matches!(
            net.receive(b"again", pool),
            Err(NetError::Config { .. })
        ));
        let taken = net.receive(b"twice", SegmentPool::new(3, 2, SEGMENT));
        assert!(matches!(taken, Err(NetError::Duplicate { .. })));
        n
    });
    shard("a", move || async move {
        let net = NetShard::bind(&config(a_identity)).unwrap();
        let peer = net.connect(addr_rx.recv().unwrap(), "b").await.unwrap();
        let pool = SegmentPool::new(7, 8, SEGMENT);
        drop(peer.open_channel(b"empty").unwrap());
        let late = peer.open_channel(b"late").unwrap();
        let dup = [
            peer.open_channel(b"dup").unwrap(),
            peer.open_channel(b"dup").unwrap(),
        ];
        opened_tx.send(()).unwrap();
        for n in 0..50 {
            late.send(message(&pool, 0, n)).await.unwrap();
        }
        let first = dup[0].send(message(&pool, 2, 0)).await;
        let second = dup[1].send(message(&pool, 2, 0)).await;
        let refused = match (first, second) {
            (Ok(()), Err(refused)) | (Err(refused), Ok(())) => refused,
            other => panic!("both or neither of two streams for one channel: {other:?}"),
        };
        assert!(
            matches!(refused, NetError::ReceiverGone { .. }),
            "{refused}"
        );
        drop(dup);
        // A stream for a channel whose receiver has one is refused; the first goes on.
        let again = peer.open_channel(b"late").unwrap();
        let refused = again.send(message(&pool, 0, 0)).await.unwrap_err();
        assert!(
            matches!(refused, NetError::ReceiverGone { .. }),
            "{refused}"
        );
        assert!(peer.open_channel(&[0; 257]).is_err());
    })
    .join()
    .unwrap();
    assert_eq!(receiving.join().unwrap(), 50);
}

/// One side of two shards that each open a channel to the other and trade a segment over it:
/// its endpoint, its receiver of the other's channel (the segment read), its peer and its
/// sender.
async fn trade(
    config: NetConfig,
    me: u8,
    my_addr: mpsc::Sender<SocketAddr>,
    their_addr: mpsc::Receiver<SocketAddr>,
) -> (NetShard, ChannelReceiver, Peer, ChannelSender) {
    let other = 1 - me;
    let net = NetShard::bind(&config).unwrap();
    let mut inbound = net
        .receive(&[other, me], SegmentPool::new(0, 2, SEGMENT))
        .unwrap();
    my_addr.send(net.local_addr()).unwrap();
    let name = ["a", "b"][other as usize];
    let peer = net.connect(arrive(&their_addr).await, name).await.unwrap();
    let outbound = peer.open_channel(&[me, other]).unwrap();
    let pool = SegmentPool::new(7, 2, SEGMENT);
    outbound.send(message(&pool, me, 0)).await.unwrap();
    check(&inbound.next().await.unwrap(), other, 0);
    (net, inbound, peer, outbound)
}

#[test]
fn a_shard_that_drains_before_it_goes_cuts_no_channel_short() {
    // The receiver's whole pool: the sender's credit, all of it sent at once.
    const MESSAGES: u32 = 64;
    let ca = ClusterCa::generate("test cluster").unwrap();
    let (a_identity, b_identity) = (identity(&ca, "a"), identity(&ca, "b"));
    let (a_addr_tx, a_addr_rx) = mpsc::channel::<SocketAddr>();
    let (b_addr_tx, b_addr_rx) = mpsc::channel::<SocketAddr>();
    let a = shard("a", move || async move {
        let (net, _inbound, peer, outbound) =
            trade(config(a_identity), 0, a_addr_tx, b_addr_rx).await;
        drop(outbound);
        let pool = SegmentPool::new(7, MESSAGES as usize, SEGMENT);
        let sender = peer.open_channel(b"slow").unwrap();
        for n in 0..MESSAGES {
            sender.send(message(&pool, 9, n)).await.unwrap();
        }
        // Nearly all of it is still on this side, not even on the wire (a send with credit
        // does not wait for the driver), and b reads slowly: closing the connection now
        // would lose it; draining waits until b received the channel's end.
        drop(sender);
        assert!(net.drain(Duration::from_secs(20)).await, "a drained");
        drop(net);
        glommio::timer::sleep(Duration::from_millis(100)).await;
    });
    let b = shard("b", move || async move {
        let (net, _inbound, _peer, outbound) =
            trade(config(b_identity), 1, b_addr_tx, a_addr_rx).await;
        drop(outbound);
        let mut slow = net
            .receive(b"slow", SegmentPool::new(1, MESSAGES as usize, SEGMENT))
            .unwrap();
        let mut n = 0;
        while let Some(segment) = slow.next().await {
            check(&segment, 9, n);
            n += 1;
            glommio::timer::sleep(Duration::from_millis(2)).await;
        }
        assert!(slow.failure().is_none(), "{:?}", slow.failure());
        n
    });
    a.join().unwrap();
    assert_eq!(b.join().unwrap(), MESSAGES, "every segment arrived");
}

#[test]
fn a_channel_no_sender_opens_fails_after_the_open_timeout() {
    let ca = ClusterCa::generate("test cluster").unwrap();
    let a_identity = identity(&ca, "a");
    shard("a", move || async move {
        let mut config = config(a_identity);
        config.open_timeout = Duration::from_millis(300);
        let net = NetShard::bind(&config).unwrap();
        let mut nobody = net
            .receive(b"nobody", SegmentPool::new(0, 2, SEGMENT))
            .unwrap();
        assert!(nobody.next().await.is_none());
        let failure = nobody.failure().expect("the channel failed");
        assert!(matches!(failure, NetError::NotOpened { .. }), "{failure}");
        assert!(
            failure.to_string().contains("no sender opened channel"),
            "{failure}"
        );
    })
    .join()
    .unwrap();
}

#[test]
fn a_peer_that_shuts_down_fails_every_channel_it_carried() {
    let ca = ClusterCa::generate("test cluster").unwrap();
    let (a_identity, b_identity) = (identity(&ca, "a"), identity(&ca, "b"));
    let (a_addr_tx, a_addr_rx) = mpsc::channel::<SocketAddr>();
    let (b_addr_tx, b_addr_rx) = mpsc::channel::<SocketAddr>();
    let (flowing_tx, flowing_rx) = mpsc::channel::<()>();
    let a = shard("a", move || async move {
        let (net, mut inbound, _peer, outbound) =
            trade(config(a_identity), 0, a_addr_tx, b_addr_rx).await;
        flowing_tx.send(()).unwrap();
        // b shuts down: the channel from it ends unfinished, the one to it closes.
        while inbound.next().await.is_some() {}
        let failure = inbound.failure().expect("the channel from b failed");
        assert!(matches!(failure, NetError::PeerEnded { .. }), "{failure}");
        let pool = SegmentPool::new(7, 8, SEGMENT);
        let closed = loop {
            match outbound.send(message(&pool, 0, 1)).await {
                Err(error) => break error,
                Ok(()) => glommio::timer::sleep(Duration::from_millis(5)).await,
            }
        };
        assert!(matches!(closed, NetError::PeerEnded { .. }), "{closed}");
        // Channels b opened for receivers that came only after it went: the one b had
        // finished ends cleanly, the other failed with the connection.
        let mut ended = net
            .receive(b"ended", SegmentPool::new(1, 2, SEGMENT))
            .unwrap();
        assert!(ended.next().await.is_none());
        assert!(ended.failure().is_none(), "{:?}", ended.failure());
        let mut open = net
            .receive(b"open", SegmentPool::new(2, 2, SEGMENT))
            .unwrap();
        assert!(open.next().await.is_none());
        let failure = open.failure().expect("the open channel failed");
        assert!(matches!(failure, NetError::PeerEnded { .. }), "{failure}");
    });
    let b = shard("b", move || async move {
        let (net, _inbound, peer, _outbound) =
            trade(config(b_identity), 1, b_addr_tx, a_addr_rx).await;
        arrive(&flowing_rx).await;
        drop(peer.open_channel(b"ended").unwrap());
        let _open = peer.open_channel(b"open").unwrap();
        glommio::timer::sleep(Duration::from_millis(100)).await;
        drop(net);
        // The driver sends the close before this executor ends.
        glommio::timer::sleep(Duration::from_millis(100)).await;
    });
    b.join().unwrap();
    a.join().unwrap();
}

#[test]
fn peers_without_a_certificate_of_the_clusters_ca_are_refused() {
    let ca = ClusterCa::generate("test cluster").unwrap();
    let other = ClusterCa::generate("another cluster").unwrap();
    // A node whose certificate another CA signed, though it trusts this cluster's CA.
    let stranger = {
        let node = other.issue("a", &[]).unwrap();
        TlsIdentity::from_pem(ca.cert_pem(), &node.cert_pem, &node.key_pem, "stranger").unwrap()
    };
    let (server, trusted) = (identity(&ca, "b"), identity(&ca, "a"));
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let b = shard("b", move || async move {
        let net = NetShard::bind(&config(server)).unwrap();
        let mut inbound = net.receive(b"ok", SegmentPool::new(0, 2, SEGMENT)).unwrap();
        addr_tx.send(net.local_addr()).unwrap();
        let segment = inbound.next().await.unwrap();
        check(&segment, 0, 0);
        arrive(&done_rx).await;
    });
    shard("a", move || async move {
        let addr = addr_rx.recv().unwrap();
        let refused = |result: Result<Peer, NetError>, why: &str| match result {
            Err(error @ NetError::Connect { .. }) => {
                let text = error.to_string();
                assert!(
                    text.contains("TLS handshake failed") && text.contains(why),
                    "{text}"
                );
            }
            other => panic!("a connection that should be refused: {other:?}"),
        };
        // b refuses a client whose certificate another CA signed.
        let net = NetShard::bind(&config(stranger)).unwrap();
        refused(net.connect(addr, "b").await, "UnknownIssuer");
        // A client refuses a server that is not the node it dialled.
        let net = NetShard::bind(&config(trusted)).unwrap();
        refused(net.connect(addr, "c").await, "not valid for name \"c\"");
        // The cluster's own certificate goes through.
        let peer = net.connect(addr, "b").await.unwrap();
        let sender = peer.open_channel(b"ok").unwrap();
        sender
            .send(message(&SegmentPool::new(7, 2, SEGMENT), 0, 0))
            .await
            .unwrap();
        done_tx.send(()).unwrap();
        glommio::timer::sleep(Duration::from_millis(50)).await;
    })
    .join()
    .unwrap();
    b.join().unwrap();
}

#[test]
fn a_client_without_any_certificate_is_refused() {
    let ca = ClusterCa::generate("test cluster").unwrap();
    let server = identity(&ca, "b");
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let b = shard("b", move || async move {
        let net = NetShard::bind(&config(server)).unwrap();
        addr_tx.send(net.local_addr()).unwrap();
        arrive(&done_rx).await;
    });
    // A plain quinn client that trusts the cluster's CA but presents no certificate.
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca.cert_pem().as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    #[allow(deprecated)]
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let client = quinn::ClientConfig::new(std::sync::Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
    ));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = addr_rx.recv().unwrap();
    let outcome = runtime.block_on(async move {
        let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        endpoint.set_default_client_config(client);
        let connection = endpoint.connect(addr, "b").unwrap().await;
        // TLS 1.3: the client may finish its side before the server's refusal arrives; the
        // refusal then closes the connection.
        match connection {
            Err(error) => error,
            Ok(connection) => {
                let _ = connection.open_bi().await;
                connection.closed().await
            }
        }
    });
    let text = outcome.to_string();
    assert!(
        text.contains("peer sent no certificates"),
        "refused for another reason: {text}"
    );
    done_tx.send(()).unwrap();
    b.join().unwrap();
}

#[test]
fn a_peer_that_goes_silent_is_lost_after_the_idle_timeout() {
    let ca = ClusterCa::generate("test cluster").unwrap();
    let (a_identity, b_identity) = (identity(&ca, "a"), identity(&ca, "b"));
    let (a_addr_tx, a_addr_rx) = mpsc::channel::<SocketAddr>();
    let (b_addr_tx, b_addr_rx) = mpsc::channel::<SocketAddr>();
    let (silent_tx, silent_rx) = mpsc::channel::<()>();
    let b = shard("b", move || async move {
        let parts = trade(config(b_identity), 1, b_addr_tx, a_addr_rx).await;
        // The process hangs: its endpoint neither answers nor closes anything.
        std::mem::forget(parts);
        silent_tx.send(()).unwrap();
    });
    shard("a", move || async move {
        let mut config = config(a_identity);
        config.idle_timeout = Duration::from_millis(600);
        let (_net, mut inbound, _peer, outbound) = trade(config, 0, a_addr_tx, b_addr_rx).await;
        arrive(&silent_rx).await;
        // No credit comes back: a send waits until the connection is lost.
        let pool = SegmentPool::new(7, 8, SEGMENT);
        let error = loop {
            if let Err(error) = outbound.send(message(&pool, 0, 1)).await {
                break error;
            }
        };
        assert!(
            matches!(&error, NetError::Lost { reason, .. } if reason.contains("timed out")),
            "{error}"
        );
        assert!(inbound.next().await.is_none());
        let failure = inbound.failure().expect("the channel from b failed");
        assert!(failure.to_string().contains("timed out"), "{failure}");
    })
    .join()
    .unwrap();
    b.join().unwrap();
}

#[test]
fn channels_that_end_free_their_streams() {
    // More channels, one after another, than a connection carries at once.
    const CHANNELS: u32 = 4200;
    let ca = ClusterCa::generate("test cluster").unwrap();
    let (a_identity, b_identity) = (identity(&ca, "a"), identity(&ca, "b"));
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let receiving = shard("b", move || async move {
        let net = NetShard::bind(&config(b_identity)).unwrap();
        addr_tx.send(net.local_addr()).unwrap();
        for n in 0..CHANNELS {
            let pool = SegmentPool::new(0, 1, 64);
            let mut channel = net.receive(&n.to_le_bytes(), pool).unwrap();
            let segment = channel
                .next()
                .await
                .unwrap_or_else(|| panic!("channel {n}: {:?}", channel.failure()));
            assert_eq!(segment.filled(), n.to_le_bytes());
            drop(segment);
            assert!(channel.next().await.is_none());
            assert!(channel.failure().is_none(), "{:?}", channel.failure());
        }
        done_tx.send(()).unwrap();
    });
    shard("a", move || async move {
        let net = NetShard::bind(&config(a_identity)).unwrap();
        let peer = net.connect(addr_rx.recv().unwrap(), "b").await.unwrap();
        let pool = SegmentPool::new(7, 4, 64);
        for n in 0..CHANNELS {
            let channel = peer.open_channel(&n.to_le_bytes()).unwrap();
            let mut segment = loop {
                match pool.acquire() {
                    Ok(segment) => break segment,
                    Err(_) => glommio::timer::sleep(Duration::from_millis(1)).await,
                }
            };
            segment.buffer_mut()[..4].copy_from_slice(&n.to_le_bytes());
            segment.set_len(4);
            channel.send(segment).await.unwrap();
        }
        arrive(&done_rx).await;
    })
    .join()
    .unwrap();
    receiving.join().unwrap();
}
