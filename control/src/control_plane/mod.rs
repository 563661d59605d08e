//! `weir control`: the control plane. Tokio and axum, off the data path: the REST API, the
//! workers' links and heartbeats, one job master per job, and the durable store its jobs are
//! kept in (see `docs/design/control-plane.md`).

mod cluster;
mod insight;
mod links;
mod packages;
mod rest;
pub(crate) mod store;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::serve::ListenerExt;
use weir_engine::package::PackageInfo;
use weir_engine::Configuration;

use crate::endpoint::{NodeIdentity, TlsListener};
use cluster::{now_ms, Cluster};

/// A random number (for ids).
pub fn nonce() -> u64 {
    cluster::seed()
}

/// What the REST handlers and the links share.
#[derive(Clone)]
pub(crate) struct Shared {
    cluster: Arc<Mutex<Cluster>>,
    /// The packages jobs can be run from.
    packages: Arc<tokio::sync::Mutex<packages::Packages>>,
    /// Whether `POST /jars/upload` takes packages (`web.upload.enabled`).
    uploads: bool,
    /// The largest request body, bytes (`rest.server.max-content-length`).
    max_body: usize,
    token: Option<Arc<str>>,
    /// Numbers the workers' connections.
    connections: Arc<std::sync::atomic::AtomicU64>,
}

impl Shared {
    fn cluster(&self) -> std::sync::MutexGuard<'_, Cluster> {
        // A panic while the lock was held leaves a cluster whose last change may be half
        // done; the store holds what was complete, so go on with it.
        self.cluster.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs the control plane until the process is stopped: binds `rest.address`:`rest.port`,
/// opens the store in `control.data-dir` (resuming the jobs it holds) and serves.
/// `builtin` is what the `weir` package holds, and `check_args` checks its jobs' arguments.
pub fn serve(
    config: Configuration,
    builtin: PackageInfo,
    check_args: fn(&[String]) -> Result<(), String>,
) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("control")
        .enable_all()
        .build()?;
    // The heartbeat, and the checkpoint settings jobs take: refused here rather than at every
    // registration or submission.
    config.check()?;
    runtime.block_on(async move {
        let (host, port) = config.rest_endpoint();
        let listener = tokio::net::TcpListener::bind((host.as_str(), port))
            .await
            .with_context(|| {
                format!(
                    "cannot listen on {host}:{port}; set rest.address and rest.port to a free \
                     address"
                )
            })?;
        let tls = NodeIdentity::for_rest(&config)?;
        let store = store::Store::open(&config.control_data_dir())?;
        let token = config.rest_token().map(Arc::from);
        let builtin = packages::Package {
            id: packages::BUILTIN.to_string(),
            file_name: "weir".into(),
            info: builtin,
            uploaded: now_ms(),
            check_args: Some(check_args),
        };
        let packages = packages::Packages::open(&config.control_data_dir().join("jars"), builtin)?;
        let uploads = config.upload_enabled();
        if uploads && token.is_none() {
            tracing::warn!(
                "web.upload.enabled without rest.auth.token: anyone who reaches {host}:{port} can \
                 run programs on the workers (and on this host, which asks each upload what it \
                 holds); set rest.auth.token"
            );
        }
        let max_body = usize::try_from(config.rest_max_content_length()).unwrap_or(usize::MAX);
        let cluster = Cluster::open(config, store)?;
        let shared = Shared {
            cluster: Arc::new(Mutex::new(cluster)),
            packages: Arc::new(tokio::sync::Mutex::new(packages)),
            uploads,
            max_body,
            token,
            connections: Arc::default(),
        };
        let ticker = shared.clone();
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(Duration::from_millis(200));
            loop {
                interval.tick().await;
                ticker.cluster().tick();
            }
        });
        let address = listener.local_addr()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        tracing::info!(%address, "weir control: REST API on {scheme}://{address}");
        let service = rest::router(shared).into_make_service_with_connect_info::<SocketAddr>();
        // Requests, answers and the workers' messages are small: none may wait for the
        // previous one's acknowledgement (Nagle's algorithm against a delayed ACK, 40 ms).
        let no_delay = |stream: &tokio::net::TcpStream| {
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!("TCP_NODELAY not set on a connection: {error}");
            }
        };
        let server: futures_util::future::BoxFuture<'_, std::io::Result<()>> = match &tls {
            Some(identity) => {
                let listener = TlsListener::new(listener, identity)?
                    .tap_io(move |stream| no_delay(stream.get_ref().0));
                Box::pin(std::future::IntoFuture::into_future(axum::serve(
                    listener, service,
                )))
            }
            None => {
                let listener = listener.tap_io(move |stream| no_delay(stream));
                Box::pin(std::future::IntoFuture::into_future(axum::serve(
                    listener, service,
                )))
            }
        };
        let mut stop = crate::signals::stop_signals()?;
        crate::notify::ready(&format!("serving the REST API on {scheme}://{address}"));
        tokio::select! {
            served = server => served?,
            _ = stop.recv() => {
                crate::notify::notify("STOPPING=1");
                // Every change is stored as it is made: a control plane started again on
                // this store finds the jobs, which run on in their workers meanwhile.
                tracing::info!("weir control: stopping");
            }
        }
        Ok(())
    })
}
