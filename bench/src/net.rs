//! The network exchange benchmark: segments from one shard to another over `weir-net`'s
//! channels (QUIC on the shards, mutual TLS, credit) on loopback — or across a veth pair, each
//! side in a network namespace of its own — each shard on a core of its own, against a bare
//! quinn bulk transfer of the same bytes in the same framing (quinn's own tokio runtime, a
//! thread per side, the same TLS and windows) over the same link in the same rounds.
//!
//! A round sends `bytes` split over `channels` channels (one stream each) as full segments of
//! `segment_size` bytes; the receiving side lands each in a segment of the channel's own pool
//! (`credits` segments: the sender's credit) and drops it, which returns credit. The time runs
//! from the first segment received to the last.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use glommio::{LocalExecutorBuilder, Placement};
use serde::Serialize;
use weir_engine::runtime::available_cores;
use weir_memory::SegmentPool;
use weir_net::tls::{ClusterCa, TlsIdentity};
use weir_net::{NetConfig, NetShard};

use crate::error::BenchError;
use crate::measure::{best, rate, Measurement, ROUNDS};
use crate::veth::{Veth, VethSide};

/// What `weir bench net --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct NetReport {
    /// Bytes of segments each round sends (all channels together).
    pub bytes: u64,
    /// The segment size, bytes.
    pub segment_size: usize,
    /// Channels (streams of one connection).
    pub channels: usize,
    /// Segments of each channel's receiving pool: the sender's credit.
    pub credits: usize,
    /// The cores the two shards ran on (both unpinned on a machine of one core).
    pub cores: Vec<usize>,
    /// What the two sides' QUIC crosses: `loopback`, or `veth` (a veth pair between a network
    /// namespace for each).
    pub link: &'static str,
    /// Rounds run; the best round of each side is reported.
    pub rounds: usize,
    /// weir-net's best round, seconds.
    pub seconds: f64,
    /// weir-net's throughput, bytes per second.
    pub bytes_per_second: f64,
    /// The bare quinn transfer's best round, seconds.
    pub quinn_seconds: f64,
    /// Its throughput, bytes per second.
    pub quinn_bytes_per_second: f64,
    /// `bytes_per_second / quinn_bytes_per_second`.
    pub ratio_to_quinn: f64,
}

/// Runs both sides alternately, [`ROUNDS`] times each, on loopback or with `veth` across a
/// veth pair.
pub fn run(
    bytes: u64,
    segment_size: usize,
    channels: usize,
    credits: usize,
    veth: bool,
) -> Result<NetReport, BenchError> {
    if channels == 0 || credits == 0 || !segment_size.is_power_of_two() || segment_size < 64 {
        return Err(BenchError::Net(format!(
            "--channels and --credits must be at least 1 and --segment-size a power of two of \
             at least 64 bytes (got {channels}, {credits}, {segment_size})"
        )));
    }
    let segments = bytes / segment_size as u64 / channels as u64;
    if segments == 0 {
        return Err(BenchError::Net(format!(
            "--bytes {bytes} is less than a segment per channel"
        )));
    }
    let net_error = |e: &dyn std::fmt::Display| BenchError::Net(e.to_string());
    let ca = ClusterCa::generate("bench").map_err(|e| net_error(&e))?;
    let identity = |name: &str| {
        let node = ca.issue(name, &[]).map_err(|e| net_error(&e))?;
        TlsIdentity::from_pem(ca.cert_pem(), &node.cert_pem, &node.key_pem, name)
            .map_err(|e| net_error(&e))
    };
    let (sender, receiver) = (identity("sender")?, identity("receiver")?);
    let cores = available_cores();
    let cores: Vec<usize> = if cores.len() >= 2 {
        cores[..2].to_vec()
    } else {
        Vec::new()
    };
    let veth = veth.then(Veth::make).transpose()?;
    let sides = Sides {
        cores: cores.clone(),
        veth: veth.as_ref().map(|veth| [veth.side(0), veth.side(1)]),
    };
    let shape = Shape {
        segments,
        segment_size,
        channels,
        credits,
    };
    let (mut nets, mut quinns) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        quinns.push(
            quinn_round(&sender, &receiver, &shape, &sides)
                .map_err(|e| BenchError::Net(format!("the bare quinn transfer: {e}")))?,
        );
        nets.push(weir_net_round(&sender, &receiver, &shape, &sides)?);
    }
    let sent = segments * segment_size as u64 * channels as u64;
    for (side, rounds) in [("weir-net", &nets), ("bare quinn", &quinns)] {
        if let Some(short) = rounds.iter().find(|m| m.surviving_records != sent) {
            return Err(BenchError::Net(format!(
                "a round over {side} received {} of the {sent} bytes sent",
                short.surviving_records
            )));
        }
    }
    let (net, quinn) = (best(&nets), best(&quinns));
    let rate = |m: &Measurement| rate(m.surviving_records, m.duration);
    Ok(NetReport {
        bytes: sent,
        segment_size,
        channels,
        credits,
        cores,
        link: if veth.is_some() { "veth" } else { "loopback" },
        rounds: ROUNDS,
        seconds: net.duration.as_secs_f64(),
        bytes_per_second: rate(&net),
        quinn_seconds: quinn.duration.as_secs_f64(),
        quinn_bytes_per_second: rate(&quinn),
        ratio_to_quinn: rate(&net) / rate(&quinn),
    })
}

/// What a round sends.
#[derive(Clone, Copy)]
struct Shape {
    /// Segments per channel.
    segments: u64,
    segment_size: usize,
    channels: usize,
    credits: usize,
}

/// Where the two sides (0 sends, 1 receives) run: their cores, and the veth pair's sides if
/// they run across one.
#[derive(Clone)]
struct Sides {
    cores: Vec<usize>,
    veth: Option<[VethSide; 2]>,
}

impl Sides {
    fn placement(&self, side: usize) -> Placement {
        match self.cores.get(side) {
            Some(&core) => Placement::Fixed(core),
            None => Placement::Unbound,
        }
    }

    /// Moves the calling thread (the side's own) into its namespace, if there is a pair.
    fn enter(&self, side: usize) -> Result<(), String> {
        self.veth.as_ref().map_or(Ok(()), |veth| veth[side].enter())
    }

    /// The address side `side` binds (any free port).
    fn bind(&self, side: usize) -> SocketAddr {
        let ip = self
            .veth
            .as_ref()
            .map_or(std::net::Ipv4Addr::LOCALHOST.into(), |veth| {
                veth[side].addr()
            });
        SocketAddr::new(ip, 0)
    }
}

/// One round over weir-net: received bytes and the time from the first to the last.
fn weir_net_round(
    sender: &TlsIdentity,
    receiver: &TlsIdentity,
    shape: &Shape,
    sides: &Sides,
) -> Result<Measurement, BenchError> {
    let shape = *shape;
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let receiver = receiver.clone();
    let on = sides.clone();
    let receiving = LocalExecutorBuilder::new(sides.placement(1))
        .name("bench-net-receiver")
        .spawn(move || async move {
            on.enter(1)?;
            let config = NetConfig::new(on.bind(1), receiver);
            let net = NetShard::bind(&config).map_err(|e| e.to_string())?;
            let channels: Vec<_> = (0..shape.channels)
                .map(|c| {
                    let key = (c as u32).to_le_bytes();
                    net.receive(&key, SegmentPool::new(c, shape.credits, shape.segment_size))
                })
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?;
            addr_tx.send(net.local_addr()).map_err(|e| e.to_string())?;
            let first = Arc::new(std::sync::OnceLock::new());
            let tasks: Vec<_> = channels
                .into_iter()
                .map(|mut channel| {
                    let first = Arc::clone(&first);
                    glommio::spawn_local(async move {
                        let mut bytes = 0u64;
                        while let Some(segment) = channel.next().await {
                            first.get_or_init(Instant::now);
                            bytes += segment.len() as u64;
                        }
                        match channel.failure() {
                            Some(error) => Err(error.to_string()),
                            None => Ok(bytes),
                        }
                    })
                })
                .collect();
            let mut bytes = 0;
            for task in tasks {
                bytes += task.await?;
            }
            let start = *first.get().ok_or("nothing arrived")?;
            let duration = start.elapsed();
            let _ = done_tx.send(());
            Ok::<_, String>(Measurement {
                duration,
                surviving_records: bytes,
            })
        })
        .map_err(|e| BenchError::Net(e.to_string()))?;
    let sender = sender.clone();
    let on = sides.clone();
    let sending = LocalExecutorBuilder::new(sides.placement(0))
        .name("bench-net-sender")
        .spawn(move || async move {
            on.enter(0)?;
            let config = NetConfig::new(on.bind(0), sender);
            let net = NetShard::bind(&config).map_err(|e| e.to_string())?;
            let addr = addr_rx.recv().map_err(|e| e.to_string())?;
            let peer = net
                .connect(addr, "receiver")
                .await
                .map_err(|e| e.to_string())?;
            let tasks: Vec<_> = (0..shape.channels)
                .map(|c| {
                    let channel = peer.open_channel(&(c as u32).to_le_bytes());
                    // Segments stay in QUIC until acknowledged: twice the credit covers them.
                    let pool = SegmentPool::new(c, 2 * shape.credits + 2, shape.segment_size);
                    glommio::spawn_local(async move {
                        let channel = channel.map_err(|e| e.to_string())?;
                        for n in 0..shape.segments {
                            let mut segment = loop {
                                match pool.acquire() {
                                    Ok(segment) => break segment,
                                    Err(_) => {
                                        glommio::timer::sleep(Duration::from_micros(20)).await
                                    }
                                }
                            };
                            segment.buffer_mut()[..8].copy_from_slice(&n.to_le_bytes());
                            segment.set_len(shape.segment_size);
                            channel.send(segment).await.map_err(|e| e.to_string())?;
                        }
                        Ok::<_, String>(())
                    })
                })
                .collect();
            for task in tasks {
                task.await?;
            }
            // The endpoint stays until the receiver has everything (or went).
            while let Err(mpsc::TryRecvError::Empty) = done_rx.try_recv() {
                glommio::timer::sleep(Duration::from_millis(1)).await;
            }
            drop(net);
            Ok::<_, String>(())
        })
        .map_err(|e| BenchError::Net(e.to_string()))?;
    let measured = receiving
        .join()
        .map_err(|e| BenchError::Net(e.to_string()))?
        .map_err(BenchError::Net)?;
    sending
        .join()
        .map_err(|e| BenchError::Net(e.to_string()))?
        .map_err(BenchError::Net)?;
    Ok(measured)
}

/// One round of the same bytes, framed the same, over bare quinn on tokio.
fn quinn_round(
    sender: &TlsIdentity,
    receiver: &TlsIdentity,
    shape: &Shape,
    sides: &Sides,
) -> Result<Measurement, String> {
    let shape = *shape;
    let error = |e: &dyn std::fmt::Display| e.to_string();
    // weir-net's windows (`NetConfig`'s defaults), so that both sides stream under one bound.
    let windows = NetConfig::new("127.0.0.1:0".parse().expect("an address"), sender.clone());
    let mut transport = quinn::TransportConfig::default();
    transport
        .stream_receive_window(quinn::VarInt::from_u32(windows.stream_window))
        .receive_window(quinn::VarInt::from_u32(windows.connection_window))
        .send_window(u64::from(windows.connection_window));
    let transport = Arc::new(transport);
    let server = quinn::crypto::rustls::QuicServerConfig::try_from(
        receiver.server_config().map_err(|e| error(&e))?,
    )
    .map_err(|e| error(&e))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(server));
    server.transport_config(Arc::clone(&transport));
    let client = quinn::crypto::rustls::QuicClientConfig::try_from(
        sender.client_config().map_err(|e| error(&e))?,
    )
    .map_err(|e| error(&e))?;
    let mut client = quinn::ClientConfig::new(Arc::new(client));
    client.transport_config(transport);
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    };
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let on = sides.clone();
    let receiving = std::thread::spawn(move || {
        on.enter(1)?;
        runtime()?.block_on(async move {
            let endpoint = quinn::Endpoint::server(server, on.bind(1)).map_err(|e| error(&e))?;
            addr_tx
                .send(endpoint.local_addr().map_err(|e| error(&e))?)
                .map_err(|e| error(&e))?;
            let incoming = endpoint.accept().await.ok_or("no connection")?;
            let connection = incoming.await.map_err(|e| error(&e))?;
            let first = Arc::new(std::sync::OnceLock::new());
            let mut tasks = Vec::new();
            for _ in 0..shape.channels {
                let mut stream = connection.accept_uni().await.map_err(|e| error(&e))?;
                let first = Arc::clone(&first);
                tasks.push(tokio::spawn(async move {
                    let mut bytes = 0u64;
                    while let Some(chunk) = stream
                        .read_chunk(usize::MAX, true)
                        .await
                        .map_err(|e| error(&e))?
                    {
                        first.get_or_init(Instant::now);
                        bytes += chunk.bytes.len() as u64;
                    }
                    Ok::<_, String>(bytes)
                }));
            }
            let mut bytes = 0;
            for task in tasks {
                bytes += task.await.map_err(|e| error(&e))??;
            }
            let start = *first.get().ok_or("nothing arrived")?;
            let duration = start.elapsed();
            connection.close(0u32.into(), b"done");
            endpoint.wait_idle().await;
            // The payload only, as weir-net counts it: not the frame headers.
            let headers = 8 * shape.segments * shape.channels as u64;
            Ok::<_, String>(Measurement {
                duration,
                surviving_records: bytes - headers,
            })
        })
    });
    let addr = addr_rx.recv().map_err(|e| error(&e))?;
    let on = sides.clone();
    let sending = std::thread::spawn(move || {
        on.enter(0)?;
        runtime()?.block_on(async move {
            let mut endpoint = quinn::Endpoint::client(on.bind(0)).map_err(|e| error(&e))?;
            endpoint.set_default_client_config(client);
            let connection = endpoint
                .connect(addr, "receiver")
                .map_err(|e| error(&e))?
                .await
                .map_err(|e| error(&e))?;
            let mut tasks = Vec::new();
            for _ in 0..shape.channels {
                let mut stream = connection.open_uni().await.map_err(|e| error(&e))?;
                tasks.push(tokio::spawn(async move {
                    let mut frame = vec![0u8; 8 + shape.segment_size];
                    frame[..4].copy_from_slice(&1u32.to_le_bytes());
                    frame[4..8].copy_from_slice(&(shape.segment_size as u32).to_le_bytes());
                    for n in 0..shape.segments {
                        frame[8..16].copy_from_slice(&n.to_le_bytes());
                        stream.write_all(&frame).await.map_err(|e| error(&e))?;
                    }
                    stream.finish().map_err(|e| error(&e))?;
                    Ok::<_, String>(())
                }));
            }
            for task in tasks {
                task.await.map_err(|e| error(&e))??;
            }
            let _ = connection.closed().await;
            Ok::<_, String>(())
        })
    });
    let measured = receiving.join().map_err(|_| "the receiver panicked")??;
    sending.join().map_err(|_| "the sender panicked")??;
    Ok(measured)
}
