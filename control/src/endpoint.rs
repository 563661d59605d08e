//! The control plane's one port — its REST API and the workers' links — and how the CLI and
//! the workers reach it: plain HTTP, or with `security.ssl.rest.enabled` mutual TLS. Then the
//! control plane presents its node's certificate (`security.ssl.internal.dir`, the files
//! `weir tune certs` writes) and accepts only a client presenting one the cluster CA signed;
//! a worker and the CLI present theirs and accept only a control plane whose certificate the
//! cluster CA signed for the host they dial. A peer without a certificate, or with one from
//! another CA, is refused in the handshake: nothing reaches the API or a worker's link
//! unauthenticated. The bearer token (`rest.auth.token`) still applies on top.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_tungstenite::tungstenite;
use weir_engine::config::{Configuration, ExchangeConfig};
use weir_net::tls::TlsIdentity;

/// How long a client may take over its TLS handshake before the control plane drops it.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes under way at once, at most: further connections wait in the kernel's backlog
/// (each handshake holds a descriptor and its cryptography's CPU for up to the timeout).
const HANDSHAKES: usize = 256;

/// This process's certificate as a cluster member: node `node`'s in `dir`.
#[derive(Clone)]
pub(crate) struct NodeIdentity {
    pub(crate) node: String,
    pub(crate) dir: PathBuf,
    pub(crate) tls: TlsIdentity,
    /// The same, for the HTTP client (`ureq`).
    https: ureq::tls::TlsConfig,
}

impl NodeIdentity {
    /// The certificate `security.ssl.internal.dir` holds for `security.ssl.internal.node`
    /// (default: `hostname`), if the directory is set; checked now, so that a missing or bad
    /// one is refused at start, naming the files.
    pub(crate) fn of(config: &Configuration, hostname: &str) -> Result<Option<NodeIdentity>> {
        let exchange = config.exchange();
        let Some(dir) = exchange.tls_dir else {
            return Ok(None);
        };
        let node = exchange.node.unwrap_or_else(|| hostname.to_string());
        let [ca, cert, key] = ExchangeConfig::tls_files(&dir, &node);
        let unusable = || {
            format!(
                "security.ssl.internal.dir {} holds no usable certificate of node '{node}'; \
                 issue one with `weir tune certs --dir {} --node {node}` (or set \
                 security.ssl.internal.node to the name it was issued for)",
                dir.display(),
                dir.display()
            )
        };
        let tls = TlsIdentity::from_files(&ca, &cert, &key).with_context(unusable)?;
        // ureq takes the key as PEM (or DER of a kind it does not export), and the
        // certificates rustls already read.
        let key = std::fs::read(&key)
            .map_err(anyhow::Error::from)
            .and_then(|pem| Ok(ureq::tls::PrivateKey::from_pem(&pem)?))
            .with_context(unusable)?;
        let certs = |certs: &[rustls::pki_types::CertificateDer<'static>]| -> Vec<_> {
            certs
                .iter()
                .map(|cert| ureq::tls::Certificate::from_der(cert).to_owned())
                .collect()
        };
        let https = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::new_with_certs(&certs(tls.ca())))
            .client_cert(Some(ureq::tls::ClientCert::new_with_certs(
                &certs(tls.chain()),
                key,
            )))
            .unversioned_rustls_crypto_provider(weir_net::tls::provider())
            .build();
        Ok(Some(NodeIdentity {
            node,
            dir,
            tls,
            https,
        }))
    }

    /// The identity the control plane's port is served or reached with, if
    /// `security.ssl.rest.enabled`: then `security.ssl.internal.dir` must hold one.
    pub(crate) fn for_rest(config: &Configuration) -> Result<Option<NodeIdentity>> {
        if !config.rest_ssl_enabled() {
            return Ok(None);
        }
        match NodeIdentity::of(config, &hostname())? {
            Some(identity) => Ok(Some(identity)),
            None => bail!(
                "security.ssl.rest.enabled needs this process's certificate: set \
                 security.ssl.internal.dir to the directory `weir tune certs --dir DIR --node \
                 NAME` wrote (and security.ssl.internal.node to NAME, if it is not the host name)"
            ),
        }
    }

    /// A hint for a refused handshake: what this side presented.
    fn presented(&self) -> String {
        format!(
            "this side presents node '{}''s certificate from {} and trusts only its ca.pem",
            self.node,
            self.dir.display()
        )
    }
}

/// The host's name (`/proc/sys/kernel/hostname`): a node's default name.
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// The control plane at `address` (HOST:PORT) as a client reaches it: its bearer token and,
/// with TLS, the identity presented.
#[derive(Clone)]
pub(crate) struct ControlEndpoint {
    address: String,
    token: Option<String>,
    tls: Option<NodeIdentity>,
}

impl ControlEndpoint {
    /// The control plane at `address`, reached as `config` says (`rest.auth.token`,
    /// `security.ssl.rest.enabled`).
    pub(crate) fn from_config(config: &Configuration, address: &str) -> Result<ControlEndpoint> {
        Ok(ControlEndpoint {
            address: address.to_string(),
            token: config.rest_token().map(str::to_string),
            tls: NodeIdentity::for_rest(config)?,
        })
    }

    /// The control plane at `address` over plain HTTP without a token (one a benchmark
    /// started on loopback).
    pub(crate) fn plain(address: &str) -> ControlEndpoint {
        ControlEndpoint {
            address: address.to_string(),
            token: None,
            tls: None,
        }
    }

    /// The URL of `path` (`https://` with TLS).
    pub(crate) fn url(&self, path: &str) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}{path}", self.address)
    }

    /// `Authorization`'s value, with a token.
    pub(crate) fn authorization(&self) -> Option<String> {
        self.token.as_ref().map(|token| format!("Bearer {token}"))
    }

    /// An HTTP agent for this control plane: every request ends within `timeout`; with
    /// `answers_as_errors` false a 4xx or 5xx is an answer, not an error.
    pub(crate) fn agent(&self, timeout: Duration, answers_as_errors: bool) -> ureq::Agent {
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(answers_as_errors)
            .timeout_global(Some(timeout));
        if let Some(identity) = &self.tls {
            config = config.tls_config(identity.https.clone());
        }
        config.build().into()
    }

    /// What to add to a failure to reach the control plane: with TLS, what this side
    /// presented (a refused handshake is the likely cause when the address is right).
    pub(crate) fn hint(&self) -> String {
        match &self.tls {
            Some(identity) => format!(
                "; over TLS (security.ssl.rest.enabled), {}",
                identity.presented()
            ),
            None => String::new(),
        }
    }

    /// Opens the WebSocket at `path` (`wss://` with TLS), with the bearer token; Nagle's
    /// algorithm off (small messages each way).
    pub(crate) async fn websocket(&self, path: &str) -> Result<WebSocket, Connect> {
        use tungstenite::client::IntoClientRequest;
        let scheme = if self.tls.is_some() { "wss" } else { "ws" };
        let mut request = format!("{scheme}://{}{path}", self.address)
            .into_client_request()
            .map_err(|e| Connect::Refused(format!("'{}' is not HOST:PORT ({e})", self.address)))?;
        if let Some(authorization) = self.authorization() {
            let value = authorization.parse().map_err(|_| {
                Connect::Refused("rest.auth.token is not a valid header value".into())
            })?;
            request.headers_mut().insert("authorization", value);
        }
        let connector = match &self.tls {
            Some(identity) => {
                let config = identity
                    .tls
                    .client_config()
                    .map_err(|e| Connect::Refused(format!("the TLS identity is refused: {e}")))?;
                tokio_tungstenite::Connector::Rustls(Arc::new(config))
            }
            None => tokio_tungstenite::Connector::Plain,
        };
        let connected =
            tokio_tungstenite::connect_async_tls_with_config(request, None, true, Some(connector))
                .await;
        match connected {
            Ok((socket, _)) => Ok(socket),
            Err(tungstenite::Error::Http(response)) if response.status().as_u16() == 401 => Err(
                Connect::Refused("401: set rest.auth.token to the control plane's token".into()),
            ),
            Err(error) => Err(self.failure(&error)),
        }
    }
}

impl ControlEndpoint {
    /// Why a WebSocket to the control plane failed with `error`: a refused certificate is
    /// for good; otherwise a retry may help, with a hint when the control plane answered in
    /// another tongue (TLS against plain, say).
    fn failure(&self, error: &tungstenite::Error) -> Connect {
        if let (Some(identity), Some(reason)) = (&self.tls, tls_refusal(error)) {
            return Connect::Refused(format!(
                "the TLS handshake with the control plane at {} failed: {reason}; {}",
                self.address,
                identity.presented()
            ));
        }
        if unreachable(error) {
            return Connect::Failed(error.to_string());
        }
        let speaks = if self.tls.is_some() {
            "speaks"
        } else {
            "does not speak"
        };
        Connect::Failed(format!(
            "{error} (this side {speaks} TLS: security.ssl.rest.enabled must be set alike here \
             and on the control plane)"
        ))
    }
}

/// A WebSocket to the control plane.
pub(crate) type WebSocket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

/// Why a connection to the control plane was not made.
pub(crate) enum Connect {
    /// Refused for a reason no retry helps (a token, a certificate, a registration).
    Refused(String),
    /// Not reachable now.
    Failed(String),
}

/// Whether `error` is the control plane not answering at all (nothing to hint at).
fn unreachable(error: &tungstenite::Error) -> bool {
    matches!(
        error,
        tungstenite::Error::Io(io) if matches!(
            io.kind(),
            io::ErrorKind::ConnectionRefused
                | io::ErrorKind::TimedOut
                | io::ErrorKind::HostUnreachable
                | io::ErrorKind::NetworkUnreachable
                | io::ErrorKind::AddrNotAvailable
        )
    )
}

/// The certificate problem in `error`, if a handshake failed over one: this side refused the
/// control plane's certificate, or the control plane refused this side's (an alert).
fn tls_refusal(error: &tungstenite::Error) -> Option<String> {
    use rustls::AlertDescription as Alert;
    let tls = match error {
        tungstenite::Error::Tls(tungstenite::error::TlsError::Rustls(tls)) => Some(&**tls),
        tungstenite::Error::Io(io) => io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>()),
        _ => None,
    }?;
    match tls {
        rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => {
            Some(format!(
                "the control plane's certificate is refused ({tls}); it must be \
                          the cluster CA's, issued for the host dialled (`weir tune certs \
                          --node NAME=HOST`)"
            ))
        }
        rustls::Error::AlertReceived(
            Alert::BadCertificate
            | Alert::UnknownCA
            | Alert::CertificateRequired
            | Alert::CertificateUnknown
            | Alert::CertificateExpired
            | Alert::AccessDenied
            | Alert::DecryptError,
        ) => Some(format!(
            "the control plane refused this side's certificate ({tls}): it accepts only one \
             the cluster CA signed"
        )),
        _ => None,
    }
}

/// The control plane's listener with TLS: each connection's handshake runs in a task of its
/// own (a slow or silent client holds up no other), and [`axum::serve`] gets the connections
/// whose handshake succeeded — those presenting a certificate the cluster CA signed.
pub(crate) struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Serves `listener`'s connections with `identity` (mutual TLS 1.3, HTTP/1.1).
    pub(crate) fn new(listener: TcpListener, identity: &NodeIdentity) -> Result<TlsListener> {
        let mut config = identity
            .tls
            .server_config()
            .with_context(|| format!("node '{}''s TLS identity is refused", identity.node))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let local = listener.local_addr()?;
        let (handed, accepted) = mpsc::channel(64);
        let handshakes = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let Ok(handshake) = Arc::clone(&handshakes).acquire_owned().await else {
                    return;
                };
                let (stream, peer) = match listener.accept().await {
                    Ok(connection) => connection,
                    // A connection gone before it was taken: the next one.
                    Err(error) if is_connection_error(&error) => continue,
                    Err(error) => {
                        // Out of descriptors, say: as axum's own listener does, wait a little.
                        tracing::warn!("cannot accept a connection: {error}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let handed = handed.clone();
                tokio::spawn(async move {
                    let _handshake = handshake;
                    let accepting = acceptor.accept(stream).into_fallible();
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, accepting).await {
                        Ok(Ok(stream)) => {
                            let _ = handed.send((stream, peer)).await;
                        }
                        Ok(Err((error, stream))) => {
                            tracing::warn!(
                                %peer,
                                "refused a connection: {error} (only a client presenting a \
                                 certificate the cluster CA signed is served)"
                            );
                            close_gently(stream).await;
                        }
                        Err(_) => tracing::debug!(%peer, "a TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { accepted, local })
    }
}

/// Whether an accept failed over one connection only (axum's own listener moves on at once).
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Closes a refused connection so that its client reads the alert saying why: a close with
/// the client's unread bytes still here (its first request, sent as its side of the
/// handshake ended) would reset the connection, and a reset may cost the client the alert.
/// So: end this side, and read what the client still sends until it closes (2 s at most).
async fn close_gently(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = stream.shutdown().await;
    let mut unread = [0u8; 4096];
    let drained = async { while matches!(stream.read(&mut unread).await, Ok(read) if read > 0) {} };
    let _ = tokio::time::timeout(Duration::from_secs(2), drained).await;
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(connection) => connection,
            // The accepting task runs as long as the runtime: never ends before the server.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}
