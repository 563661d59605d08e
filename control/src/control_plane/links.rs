//! The control plane's end of the workers' links (see [`crate::protocol`]).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, State};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;

use super::Shared;
use crate::protocol::{ControlMessage, WorkerMessage, PROTOCOL_VERSION};

/// `GET /v1/workers`: a worker's link.
#[utoipa::path(
    get,
    path = "/v1/workers",
    tag = "workers",
    responses(
        (status = 101, description = "A worker's link: a WebSocket of typed, versioned messages (control/src/protocol.rs)"),
        (status = 400, description = "Not a WebSocket upgrade", body = super::rest::ErrorBody),
    )
)]
pub(crate) async fn connect(
    State(shared): State<Shared>,
    ConnectInfo(address): ConnectInfo<SocketAddr>,
    upgrade: WebSocketUpgrade,
) -> Response {
    upgrade.on_upgrade(move |socket| link(shared, address, socket))
}

fn text(message: &ControlMessage) -> Message {
    Message::Text(serde_json::to_string(message).expect("serializable").into())
}

async fn link(shared: Shared, address: SocketAddr, mut socket: WebSocket) {
    let (interval, timeout) = shared.cluster().config().heartbeat();
    let first = match tokio::time::timeout(timeout, socket.recv()).await {
        Ok(Some(Ok(Message::Text(first)))) => first,
        _ => {
            tracing::warn!("a worker link from {address} sent no registration; closed");
            return;
        }
    };
    let (protocol, worker, executors, leaving) = match serde_json::from_str(first.as_str()) {
        Ok(WorkerMessage::Register {
            protocol,
            worker,
            executors,
            leaving,
        }) => (protocol, worker, executors, leaving),
        other => {
            let reason = match other {
                Ok(_) => "the first message must be a registration".to_string(),
                Err(error) => format!("the registration does not parse: {error}"),
            };
            tracing::warn!("worker link from {address}: {reason}");
            let _ = socket.send(text(&ControlMessage::Refused { reason })).await;
            return;
        }
    };
    if protocol != PROTOCOL_VERSION {
        let reason = format!(
            "worker {} speaks protocol version {protocol}, this control plane {PROTOCOL_VERSION}; \
             run the same Weir release on both",
            worker.id
        );
        tracing::warn!("{reason}");
        let _ = socket.send(text(&ControlMessage::Refused { reason })).await;
        return;
    }
    let id = worker.id.clone();
    let connection = shared.connections.fetch_add(1, Ordering::Relaxed);
    let (queue, mut outgoing) = mpsc::unbounded_channel();
    let _ = queue.send(ControlMessage::Registered {
        heartbeat_interval_ms: millis(interval),
        heartbeat_timeout_ms: millis(timeout),
    });
    shared.cluster().register(
        worker,
        address.to_string(),
        queue,
        connection,
        executors,
        leaving,
    );
    let (mut sink, mut stream) = socket.split();
    let mut heartbeats = tokio::time::interval(interval);
    loop {
        tokio::select! {
            incoming = stream.next() => {
                let text = match incoming {
                    Some(Ok(Message::Text(text))) => text,
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                    Some(Ok(_)) => continue,
                };
                match serde_json::from_str::<WorkerMessage>(text.as_str()) {
                    Ok(WorkerMessage::Heartbeat) => shared.cluster().heartbeat(&id, connection),
                    Ok(WorkerMessage::Executor(report)) => {
                        let mut cluster = shared.cluster();
                        cluster.heartbeat(&id, connection);
                        cluster.executor(&id, report);
                    }
                    Ok(WorkerMessage::Figures { deployment, figures }) => {
                        let mut cluster = shared.cluster();
                        cluster.heartbeat(&id, connection);
                        cluster.figures(&id, &deployment, figures);
                    }
                    Ok(WorkerMessage::Snapshot { deployment, request, result }) => {
                        let mut cluster = shared.cluster();
                        cluster.heartbeat(&id, connection);
                        cluster.savepoint_done(&deployment, &request, result);
                    }
                    Ok(WorkerMessage::Checkpoint { deployment, message }) => {
                        let mut cluster = shared.cluster();
                        cluster.heartbeat(&id, connection);
                        cluster.relay(&id, &deployment, message);
                    }
                    Ok(WorkerMessage::Leaving { shutdown }) => {
                        let mut cluster = shared.cluster();
                        cluster.heartbeat(&id, connection);
                        cluster.leave(&id, shutdown);
                    }
                    Ok(WorkerMessage::Register { .. }) => {
                        tracing::warn!(tm_id = %id, "worker registered twice on one link; ignored");
                    }
                    Err(error) => {
                        tracing::warn!(tm_id = %id, "ignoring a worker message that does not parse ({error}): {text}");
                    }
                }
            }
            message = outgoing.recv() => {
                // None: the control plane dropped this worker (lost); closing the link makes
                // a worker that is still alive register again.
                let Some(message) = message else { break };
                if sink.send(text(&message)).await.is_err() {
                    break;
                }
            }
            _ = heartbeats.tick() => {
                if sink.send(text(&ControlMessage::Heartbeat)).await.is_err() {
                    break;
                }
            }
        }
    }
    shared.cluster().disconnected(&id, connection);
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
