//! The REST API: Flink's paths, verbs and field names where Flink has them. Errors are
//! `{"errors": ["…"]}` with a 4xx for what the client can fix.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use weir_engine::monitor::{Figures, SubtaskFigures};

use super::cluster::{
    now_ms, Cluster, Job, JobStatus, OperationKind, Placement, Refusal, Submission,
};
use super::packages::{self, Staging, BUILTIN};
// The workers' link is served here too (`__path_connect` is its OpenAPI description).
use super::links::{__path_connect, connect};
use super::{insight, Shared};
use crate::protocol::{PACKAGES_PATH, WORKERS_PATH};

/// An error answer.
pub(crate) struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            errors: vec![self.1],
        };
        (self.0, Json(body)).into_response()
    }
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> ApiError {
        match refusal {
            Refusal::NotFound(m) => ApiError(StatusCode::NOT_FOUND, m),
            Refusal::Conflict(m) => ApiError(StatusCode::CONFLICT, m),
        }
    }
}

fn bad_request(message: String) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message)
}

type Answer = Result<Json<Value>, ApiError>;

/// Every endpoint once, by path, with its methods' handlers: the router serves this table and
/// the OpenAPI document lists it (each handler's `#[utoipa::path]` says what it takes and
/// answers; a test checks that the two agree).
macro_rules! endpoints {
    ($shared:ident; $($path:literal => [$($($method:ident)|+ $handler:ident),+] $(limit $limit:expr)?;)+) => {
        /// Method and path of every endpoint the router serves.
        #[cfg(test)]
        const ENDPOINTS: &[(&str, &str)] = &[$($($((stringify!($method), $path)),+),+),+];

        /// The routes of the table.
        fn endpoints($shared: &Shared) -> Router<Shared> {
            Router::new()$(.route(
                $path,
                axum::routing::MethodRouter::new()$($(.$method($handler))+)+
                    $(.layer(axum::extract::DefaultBodyLimit::max($limit)))?,
            ))+
        }

        /// The OpenAPI document of the table (`GET /openapi.json`).
        #[derive(utoipa::OpenApi)]
        #[openapi(
            info(
                title = "Weir control plane",
                description = "Flink's REST paths, verbs and field names where Flink has them. \
                    Errors are {\"errors\": [\"…\"]} with a 4xx naming what to fix. With \
                    rest.auth.token set, every request sends Authorization: Bearer <token>."
            ),
            paths($($($handler),+),+),
            components(schemas(ErrorBody)),
            modifiers(&BearerToken),
        )]
        pub(crate) struct ApiDoc;
    };
}

endpoints! { shared;
    "/overview" => [get overview];
    "/config" => [get config];
    "/taskmanagers" => [get taskmanagers];
    "/jars" => [get jars];
    "/jars/upload" => [post upload_jar] limit shared.max_body;
    "/jars/{jar}" => [delete delete_jar];
    "/jars/{jar}/run" => [post run_jar];
    "/v1/packages/{jar}" => [get package_binary];
    "/v1/workers" => [get connect];
    "/jobs" => [get jobs];
    "/jobs/overview" => [get jobs_overview];
    "/jobs/{job}" => [get job_details, patch patch_job];
    "/jobs/{job}/exceptions" => [get job_exceptions];
    "/jobs/{job}/checkpoints" => [get job_checkpoints, post trigger_checkpoint];
    "/jobs/{job}/checkpoints/{trigger}" => [get checkpoint_status];
    "/jobs/{job}/vertices/{vertex}/backpressure" => [get vertex_backpressure];
    "/jobs/{job}/vertices/{vertex}/watermarks" => [get vertex_watermarks];
    "/jobs/{job}/bottleneck" => [get job_bottleneck];
    "/jobs/{job}/watermarks/holdback" => [get job_holdback];
    "/jobs/{job}/savepoints" => [post trigger_savepoint];
    "/jobs/{job}/savepoints/{trigger}" => [get savepoint_status];
    "/jobs/{job}/stop" => [post stop_job];
    "/jobs/{job}/rescaling" => [post | patch rescale_job];
    "/jobs/{job}/rescaling/{trigger}" => [get rescaling_status];
    "/metrics" => [get metrics];
    "/openapi.json" => [get openapi];
}

/// An error answer's body.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorBody {
    /// What went wrong and what to do about it.
    errors: Vec<String>,
}

/// Every endpoint may answer 401: with `rest.auth.token` set, each request needs it as a
/// bearer token (the document says so once, here, for all of them).
struct BearerToken;

impl utoipa::Modify for BearerToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let refused = ResponseBuilder::new()
            .description("No or a wrong bearer token (with rest.auth.token set)")
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build();
        for item in openapi.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
            ];
            for operation in operations.into_iter().flatten() {
                operation
                    .responses
                    .responses
                    .insert("401".into(), refused.clone().into());
            }
        }
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "rest.auth.token",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// A job's id in a path.
#[allow(dead_code)]
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
struct JobId {
    /// The job's id (GET /jobs lists them).
    job: String,
}

/// A job's vertex in a path.
#[allow(dead_code)]
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
struct JobVertex {
    /// The job's id (GET /jobs lists them).
    job: String,
    /// An operator's id (GET /jobs/:id lists them).
    vertex: String,
}

/// A job's asynchronous request in a path.
#[allow(dead_code)]
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
struct JobTrigger {
    /// The job's id (GET /jobs lists them).
    job: String,
    /// The request id its trigger answered.
    trigger: String,
}

/// A package's id in a path.
#[allow(dead_code)]
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
struct JarId {
    /// The package's id (GET /jars lists them).
    jar: String,
}

/// `POST /jars/upload`'s multipart form.
#[allow(dead_code)]
#[derive(utoipa::ToSchema)]
struct PackageUpload {
    /// The package: an executable built against weir-engine (stripped, at most
    /// rest.server.max-content-length).
    #[schema(value_type = String, format = Binary)]
    jarfile: Vec<u8>,
}

/// `GET /openapi.json`: this API's OpenAPI 3 document, made from the code.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "cluster",
    responses(
        (status = 200, description = "The OpenAPI document of every endpoint", body = Object),
    )
)]
async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(<ApiDoc as utoipa::OpenApi>::openapi())
}

/// Every route.
pub(crate) fn router(shared: Shared) -> Router {
    debug_assert_eq!(
        (PACKAGES_PATH, WORKERS_PATH),
        ("/v1/packages/{jar}", "/v1/workers"),
        "the endpoint table names the workers' paths"
    );
    endpoints(&shared)
        .fallback(unknown_path)
        .method_not_allowed_fallback(wrong_method)
        .layer(middleware::from_fn_with_state(shared.clone(), authorize))
        .layer(middleware::map_response(errors_as_json))
        .with_state(shared)
}

/// Answers axum and its extractors give as plain text (a path that does not decode, a body
/// over the limit, a plain GET of the workers' WebSocket) in the API's error shape.
async fn errors_as_json(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let text = match axum::body::to_bytes(response.into_body(), 64 * 1024).await {
        Ok(bytes) if !bytes.is_empty() => String::from_utf8_lossy(&bytes).into_owned(),
        _ => status.canonical_reason().unwrap_or("error").to_string(),
    };
    ApiError(status, text).into_response()
}

async fn unknown_path(method: Method, uri: Uri) -> ApiError {
    ApiError(
        StatusCode::NOT_FOUND,
        format!("no endpoint {method} {}", uri.path()),
    )
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not take {method}", uri.path()),
    )
}

/// With `rest.auth.token` set, every request carries `Authorization: Bearer <token>`.
async fn authorize(State(shared): State<Shared>, request: Request, next: Next) -> Response {
    if let Some(token) = &shared.token {
        // The scheme's name is case-insensitive (RFC 9110).
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes())) {
            let problem = if given.is_some() { "wrong" } else { "no" };
            return ApiError(
                StatusCode::UNAUTHORIZED,
                format!(
                    "{problem} bearer token: this control plane requires `Authorization: Bearer \
                     <rest.auth.token>` (the CLI sends it with --token or WEIR_REST_AUTH_TOKEN)"
                ),
            )
            .into_response();
        }
    }
    next.run(request).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A JSON body, or a 400 naming what is wrong with it.
fn body<T>(payload: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    payload
        .map(|Json(value)| value)
        .map_err(|rejection| match rejection {
            JsonRejection::MissingJsonContentType(_) => bad_request(
                "the request body must be JSON: send Content-Type: application/json".into(),
            ),
            other => bad_request(format!("request body: {}", other.body_text())),
        })
}

#[utoipa::path(
    get,
    path = "/overview",
    tag = "cluster",
    responses(
        (status = 200, description = "Workers, slots and jobs by state", body = Object),
    )
)]
async fn overview(State(shared): State<Shared>) -> Answer {
    let cluster = shared.cluster();
    let count = |status: JobStatus| cluster.jobs.values().filter(|j| j.status == status).count();
    let total: usize = cluster.workers.values().map(|w| w.info.cores.len()).sum();
    let free: usize = cluster
        .workers
        .keys()
        .map(|w| cluster.free_slots(w).len())
        .sum();
    Ok(Json(json!({
        "taskmanagers": cluster.workers.len(),
        "slots-total": total,
        "slots-available": free,
        "jobs-running": cluster.jobs.values().filter(|j| !j.status.is_terminal()).count(),
        "jobs-finished": count(JobStatus::Finished),
        "jobs-cancelled": count(JobStatus::Canceled),
        "jobs-failed": count(JobStatus::Failed),
        "weir-version": env!("CARGO_PKG_VERSION"),
    })))
}

#[utoipa::path(
    get,
    path = "/config",
    tag = "cluster",
    responses(
        (status = 200, description = "The control plane's settings the web UI reads", body = Object),
    )
)]
async fn config(State(shared): State<Shared>) -> Answer {
    let cluster = shared.cluster();
    let (interval, timeout) = cluster.config().heartbeat();
    Ok(Json(json!({
        "refresh-interval": 3000,
        "timezone-name": "UTC",
        "timezone-offset": 0,
        "weir-version": env!("CARGO_PKG_VERSION"),
        "features": { "web-submit": false, "web-cancel": true },
        "heartbeat-interval": u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
        "heartbeat-timeout": u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        "started": cluster.started,
    })))
}

#[utoipa::path(
    get,
    path = "/taskmanagers",
    tag = "cluster",
    responses(
        (status = 200, description = "The workers: slots total and free, cores, memory shares, last heartbeat", body = Object),
    )
)]
async fn taskmanagers(State(shared): State<Shared>) -> Answer {
    let cluster = shared.cluster();
    let workers: Vec<Value> = cluster
        .workers
        .iter()
        .map(|(id, w)| {
            json!({
                "id": id,
                "path": w.address,
                "host": w.info.host,
                "pid": w.info.pid,
                "timeSinceLastHeartbeat": w.last_heartbeat,
                "slotsNumber": w.info.cores.len(),
                "freeSlots": cluster.free_slots(id).len(),
                // Weir's: it is shutting down and its jobs move off it.
                "shuttingDown": w.leaving.is_some(),
                "cores": w.info.cores,
                "engineVersion": w.info.engine_version,
                // Weir's: how runs over several workers reach its slots (none without a
                // certificate: it runs only jobs that fit its own slots).
                "exchange": w.info.exchange.as_ref().map(|e| json!({
                    "node": e.node,
                    "host": e.host.map(|h| h.to_string()),
                    "dataPort": e.port,
                })),
                "hardware": {
                    "cpuCores": w.info.cores.len(),
                    "physicalMemory": w.info.physical_memory,
                    "managedMemory": w.info.managed_memory,
                },
                "memoryConfiguration": {
                    "processSize": w.info.process_memory,
                    "managedMemory": w.info.managed_memory,
                    "networkMemory": w.info.network_memory,
                    "heapMemory": w.info.heap_memory,
                },
            })
        })
        .collect();
    Ok(Json(json!({ "taskmanagers": workers })))
}

#[utoipa::path(
    get,
    path = "/jars",
    tag = "jars",
    responses(
        (status = 200, description = "The job packages and their jobs (the built-in one is weir-builtin)", body = Object),
    )
)]
async fn jars(State(shared): State<Shared>) -> Answer {
    let packages = shared.packages.lock().await;
    let files: Vec<Value> = packages
        .list()
        .iter()
        .map(|p| {
            json!({
                "id": p.id,
                "name": p.file_name,
                "package": p.info.package,
                "uploaded": p.uploaded,
                "protocol": p.info.protocol,
                "engineVersion": p.info.engine_version,
                "entry": p.info.jobs.iter().map(|j| json!({
                    "name": j.name,
                    "description": j.description,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(Json(json!({ "address": "", "files": files })))
}

/// `POST /jars/upload`: a job package in the multipart field `jarfile` (Flink's name), kept
/// once it says what it holds.
#[utoipa::path(
    post,
    path = "/jars/upload",
    tag = "jars",
    request_body(content = inline(PackageUpload), content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "The package was stored: its id is `filename`", body = Object),
        (status = 400, description = "A malformed or unsupported request, named", body = ErrorBody),
        (status = 403, description = "Uploads are off (web.upload.enabled)", body = ErrorBody),
        (status = 413, description = "Over rest.server.max-content-length", body = ErrorBody),
    )
)]
async fn upload_jar(
    State(shared): State<Shared>,
    multipart: Result<axum::extract::Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    if !shared.uploads {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            "package upload is off: a package is a program the workers run; set \
             web.upload.enabled: true on the control plane to allow it"
                .into(),
        ));
    }
    let mut multipart = multipart.map_err(|e| {
        bad_request(format!(
            "the upload must be multipart/form-data: {}",
            e.body_text()
        ))
    })?;
    let limit = shared.max_body;
    let refused = move |status: StatusCode, what: String| {
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError(
                status,
                format!(
                    "the package is larger than rest.server.max-content-length ({limit} bytes); \
                     strip its debug information (strip --strip-debug) or raise the limit"
                ),
            )
        } else {
            bad_request(format!("the upload cannot be read: {what}"))
        }
    };
    let field_error =
        |e: axum::extract::multipart::MultipartError| refused(e.status(), e.body_text());
    // No lock while the file comes in and is checked: other requests go on meanwhile.
    let packages_dir = shared.packages.lock().await.dir().to_path_buf();
    while let Some(mut field) = multipart.next_field().await.map_err(field_error)? {
        if field.name() != Some("jarfile") {
            continue;
        }
        let file_name = field.file_name().unwrap_or("package").to_string();
        let staging = Staging::new(&packages_dir, &file_name);
        let executable = staging.executable();
        let write = async {
            tokio::fs::create_dir_all(&staging.dir).await?;
            let mut file = tokio::fs::File::create(&executable).await?;
            while let Some(chunk) = field.chunk().await.map_err(std::io::Error::other)? {
                tokio::io::AsyncWriteExt::write_all(&mut file, &chunk).await?;
            }
            tokio::io::AsyncWriteExt::flush(&mut file).await?;
            file.sync_all().await
        };
        let written: std::io::Result<()> = write.await;
        if let Err(error) = written {
            let status = error
                .get_ref()
                .and_then(|e| e.downcast_ref::<axum::extract::multipart::MultipartError>())
                .map_or(StatusCode::BAD_REQUEST, |e| e.status());
            return Err(refused(status, error.to_string()));
        }
        return match packages::checked(staging, file_name, &packages_dir).await {
            Ok(Ok(package)) => {
                let id = package.id.clone();
                shared.packages.lock().await.add(package);
                Ok((
                    StatusCode::OK,
                    Json(json!({ "filename": id, "status": "success" })),
                ))
            }
            Ok(Err(refusal)) => Err(bad_request(refusal.0)),
            Err(error) => Err(ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the package cannot be kept: {error:#}"),
            )),
        };
    }
    Err(bad_request(
        "the upload has no field 'jarfile': send the package as multipart field jarfile, e.g. \
         curl -F jarfile=@PACKAGE …/jars/upload"
            .into(),
    ))
}

/// `DELETE /jars/:id`: refused for the built-in package and for packages a job not yet ended
/// runs from (its restarts need it).
#[utoipa::path(
    delete,
    path = "/jars/{jar}",
    params(JarId),
    tag = "jars",
    responses(
        (status = 200, description = "The package was removed", body = Object),
        (status = 400, description = "A malformed or unsupported request, named", body = ErrorBody),
        (status = 404, description = "No such package", body = ErrorBody),
        (status = 409, description = "A job that has not ended uses it", body = ErrorBody),
    )
)]
async fn delete_jar(
    State(shared): State<Shared>,
    Path(jar): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let mut packages = shared.packages.lock().await;
    if packages.executable(&jar).is_none() {
        return Err(if jar == BUILTIN {
            bad_request("the built-in package cannot be deleted".into())
        } else {
            ApiError(
                StatusCode::NOT_FOUND,
                format!("no jar '{jar}'; GET /jars lists them"),
            )
        });
    }
    let users: Vec<String> = shared
        .cluster()
        .jobs
        .values()
        .filter(|j| j.submission.package == jar && !j.status.is_terminal())
        .map(|j| j.id.clone())
        .collect();
    if !users.is_empty() {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "jar '{jar}' runs jobs {}; cancel or stop them first",
                users.join(", ")
            ),
        ));
    }
    packages.remove(&jar).map_err(|e| {
        ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot delete jar '{jar}': {e:#}"),
        )
    })?;
    Ok(Json(json!({})))
}

/// `GET /v1/packages/:id`: an uploaded package's executable, for the workers.
#[utoipa::path(
    get,
    path = "/v1/packages/{jar}",
    params(JarId),
    tag = "workers",
    responses(
        (status = 200, description = "The package's executable, for a worker to run", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 404, description = "No such package", body = ErrorBody),
    )
)]
async fn package_binary(
    State(shared): State<Shared>,
    Path(jar): Path<String>,
) -> Result<Response, ApiError> {
    let path = shared
        .packages
        .lock()
        .await
        .executable(&jar)
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no uploaded jar '{jar}'")))?;
    let bytes = tokio::fs::read(&path).await.map_err(|e| {
        ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot read {}: {e}", path.display()),
        )
    })?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

/// `POST /jars/:id/run`'s body (Flink's `JarRunRequestBody`, the fields Weir uses).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RunRequest {
    entry_class: Option<String>,
    program_args: Option<String>,
    program_args_list: Option<Vec<String>>,
    parallelism: Option<usize>,
    savepoint_path: Option<String>,
    #[serde(default)]
    allow_non_restored_state: bool,
}

#[utoipa::path(
    post,
    path = "/jars/{jar}/run",
    params(JarId),
    tag = "jars",
    request_body(content = RunRequest, description = "Flink's JarRunRequestBody, the fields Weir uses", content_type = "application/json"),
    responses(
        (status = 200, description = "The job was accepted: its id is `jobid`", body = Object),
        (status = 400, description = "A malformed or unsupported request, named", body = ErrorBody),
        (status = 404, description = "No such package", body = ErrorBody),
    )
)]
async fn run_jar(
    State(shared): State<Shared>,
    Path(jar): Path<String>,
    payload: Result<Json<RunRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let request = body(payload)?;
    let packages = shared.packages.lock().await;
    let package = packages.get(&jar).ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            format!("no jar '{jar}'; GET /jars lists them"),
        )
    })?;
    if package.info.protocol != weir_engine::package::PROTOCOL_VERSION {
        return Err(bad_request(format!(
            "jar '{jar}' speaks executor protocol {}, this Weir {}; rebuild it against this Weir \
             release and upload it again",
            package.info.protocol,
            weir_engine::package::PROTOCOL_VERSION
        )));
    }
    let names: Vec<&str> = package.info.jobs.iter().map(|j| j.name.as_str()).collect();
    let entry = match request.entry_class {
        Some(entry) if names.contains(&entry.as_str()) => entry,
        Some(entry) => {
            return Err(bad_request(format!(
                "entryClass '{entry}' is not a job of jar '{jar}'; it has {}",
                names.join(", ")
            )))
        }
        None => {
            return Err(bad_request(format!(
                "entryClass is missing: name the job to run, one of {}",
                names.join(", ")
            )))
        }
    };
    let args = match (request.program_args, request.program_args_list) {
        (Some(_), Some(_)) => {
            return Err(bad_request(
                "give programArgs or programArgsList, not both".into(),
            ))
        }
        (Some(text), None) => split_args(&text).map_err(bad_request)?,
        (None, list) => list.unwrap_or_default(),
    };
    if let Some(check) = package.check_args {
        check(&args).map_err(|e| {
            bad_request(format!(
                "programArgs of '{entry}' do not parse: {e}; `weir run {entry} --help` lists \
                 them"
            ))
        })?;
    }
    let parallelism = match request.parallelism {
        Some(0) => {
            return Err(bad_request(
                "parallelism must be at least 1 (the slots the job runs on)".into(),
            ))
        }
        Some(p) => p,
        None => 1,
    };
    let savepoint_path = request.savepoint_path.map(std::path::PathBuf::from);
    if let Some(path) = &savepoint_path {
        if !path.is_absolute() {
            return Err(bad_request(format!(
                "savepointPath '{}' must be an absolute path (the worker resolves it)",
                path.display()
            )));
        }
    }
    let submission = Submission {
        package: package.id.clone(),
        entry,
        args,
        parallelism,
        savepoint_path,
        allow_non_restored_state: request.allow_non_restored_state,
    };
    let id = shared.cluster().submit(submission).map_err(|e| {
        ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the job was not accepted: {e:#}"),
        )
    })?;
    Ok((StatusCode::OK, Json(json!({ "jobid": id }))))
}

/// Splits Flink's `programArgs` string: words separated by spaces, a quoted part ('…' or "…")
/// kept as one word.
fn split_args(text: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    if let Some(q) = quote {
        return Err(format!(
            "programArgs has an unclosed {q}: {text}; close it, or send programArgsList"
        ));
    }
    words.extend(word);
    Ok(words)
}

#[utoipa::path(
    get,
    path = "/jobs",
    tag = "jobs",
    responses(
        (status = 200, description = "Every job's id and state", body = Object),
    )
)]
async fn jobs(State(shared): State<Shared>) -> Answer {
    let cluster = shared.cluster();
    let jobs: Vec<Value> = cluster
        .jobs
        .values()
        .map(|j| json!({ "id": j.id, "status": j.status.name() }))
        .collect();
    Ok(Json(json!({ "jobs": jobs })))
}

fn duration(job: &Job, now: i64) -> i64 {
    job.end_time.unwrap_or(now) - job.start_time
}

fn summary(job: &Job, now: i64) -> Value {
    let slots = job.placement.as_ref().map_or(0, |p| p.slots());
    let running = job.placement.as_ref().map_or(0, |p| {
        p.executors
            .iter()
            .filter(|e| e.running && e.finished.is_none())
            .map(|e| e.slots.len())
            .sum()
    });
    json!({
        "jid": job.id,
        "name": job.submission.entry,
        "state": job.status.name(),
        "start-time": job.start_time,
        "end-time": job.end_time.unwrap_or(-1),
        "duration": duration(job, now),
        "last-modification": job.timestamps.values().max().copied().unwrap_or(job.start_time),
        "tasks": { "total": slots, "running": running },
    })
}

#[utoipa::path(
    get,
    path = "/jobs/overview",
    tag = "jobs",
    responses(
        (status = 200, description = "Every job with its name, state, times and task counts", body = Object),
    )
)]
async fn jobs_overview(State(shared): State<Shared>) -> Answer {
    let cluster = shared.cluster();
    let now = now_ms();
    let jobs: Vec<Value> = cluster.jobs.values().map(|j| summary(j, now)).collect();
    Ok(Json(json!({ "jobs": jobs })))
}

fn find<'a>(
    jobs: &'a std::collections::BTreeMap<String, Job>,
    id: &str,
) -> Result<&'a Job, ApiError> {
    jobs.get(id).ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            format!("no job '{id}'; GET /jobs lists the jobs"),
        )
    })
}

#[utoipa::path(
    get,
    path = "/jobs/{job}",
    params(JobId),
    tag = "jobs",
    responses(
        (status = 200, description = "The job: state, placement, attempts, its vertices with records and bytes in and out per subtask, and while it runs its plan's edges, each chained, local or remote", body = Object),
        (status = 404, description = "No such job", body = ErrorBody),
    )
)]
async fn job_details(State(shared): State<Shared>, Path(id): Path<String>) -> Answer {
    let cluster = shared.cluster();
    let job = find(&cluster.jobs, &id)?;
    let now = now_ms();
    let mut details = summary(job, now);
    let vertices = match &job.live {
        Some(figures) => live_vertices(figures, job.placement.as_ref()),
        None => job
            .totals
            .iter()
            .map(|o| {
                json!({
                    "name": o.name,
                    "parallelism": o.parallelism,
                    "status": JobStatus::Finished.name(),
                    "metrics": { "read-records": o.records_in, "write-records": o.records_out },
                })
            })
            .collect(),
    };
    let extra = json!({
        "now": now,
        "isStoppable": job.status == JobStatus::Running,
        "timestamps": job.timestamps,
        "parallelism": job.submission.parallelism,
        "programArgs": job.submission.args,
        "attempts": job.attempts,
        "restarts": job.attempts.saturating_sub(1),
        // Weir's: the savepoint the current generation started from (a restore, rescale or
        // move off a worker that shut down).
        "restoredFrom": job.submission.savepoint_path,
        "placement": job.placement.as_ref().map(|p| placement(&cluster, p)),
        "firstRecordTime": job.first_record,
        // Weir's: the latest run's start to its last task built (its state restored).
        "tasksReadyMs": job.tasks_ready.map(|seconds| seconds * 1000.0),
        "vertices": vertices,
        "plan": { "edges": job.live.as_ref().map(|figures| plan_edges(figures)) },
    });
    if let (Value::Object(details), Value::Object(extra)) = (&mut details, extra) {
        details.extend(extra);
    }
    Ok(Json(details))
}

/// The edges of a running job's plan between its vertices (operators): the partitioning and
/// the exchange — `chained` (in one task), `local` (channels in one process) or `remote`
/// (some channels between executors on different workers) — with its channel counts.
fn plan_edges(figures: &Figures) -> Vec<Value> {
    figures
        .edges
        .iter()
        .map(|edge| {
            let exchange = match (edge.chained, edge.remote_channels) {
                (true, _) => "chained",
                (false, 0) => "local",
                (false, _) => "remote",
            };
            json!({
                "source": edge.source,
                "target": edge.target,
                "partitioning": edge.partitioning,
                "exchange": exchange,
                "channels": edge.channels,
                "remote-channels": edge.remote_channels,
            })
        })
        .collect()
}

/// Where a run is: its executors, each with its worker, host, the worker's slots and the
/// job's slots (subtask indexes) it runs, and whether it runs; for a run over several
/// workers, the address every job slot's exchange listens on.
fn placement(cluster: &Cluster, placement: &Placement) -> Value {
    let mut first = 0;
    let executors: Vec<Value> = placement
        .executors
        .iter()
        .map(|e| {
            let job_slots: Vec<usize> = (first..first + e.slots.len()).collect();
            first += e.slots.len();
            json!({
                "taskmanager": e.worker,
                "host": cluster.workers.get(&e.worker).map(|w| &w.info.host),
                "slots": e.slots,
                "job-slots": job_slots,
                "running": e.running,
                "finished": e.finished.is_some(),
            })
        })
        .collect();
    json!({
        "attempt": placement.deployment.attempt,
        "running": placement.running(),
        "executors": executors,
        "exchange": placement.spread.as_ref().map(|places| places
            .iter()
            .enumerate()
            .map(|(slot, place)| json!({ "slot": slot, "node": place.node, "address": place.addr.to_string() }))
            .collect::<Vec<_>>()),
    })
}

/// The worker of each of the job's slots, in slot order.
fn slot_workers(placement: Option<&Placement>) -> Vec<&str> {
    placement.map_or_else(Vec::new, |p| {
        p.executors
            .iter()
            .flat_map(|e| e.slots.iter().map(|_| e.worker.as_str()))
            .collect()
    })
}

/// The running operators (Weir reports per operator, Flink per chained vertex), each with
/// its subtasks' counts and worker, from a run's latest figures. Bytes read are its task's,
/// shown on the chain's first operator; bytes written, the operator's own (what it sent to
/// other shards).
fn live_vertices(figures: &Figures, placement: Option<&Placement>) -> Vec<Value> {
    let workers = slot_workers(placement);
    let task_of = |node: usize, subtask: usize| figures.task_of(node, subtask);
    let read_bytes = |node: usize, subtask: usize| {
        task_of(node, subtask)
            .filter(|t| t.head == node)
            .map_or(0, |t| t.bytes_in)
    };
    let mut nodes: Vec<usize> = figures.subtasks.iter().map(|s| s.node).collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes
        .into_iter()
        .map(|node| {
            let subtasks: Vec<_> = figures.subtasks.iter().filter(|s| s.node == node).collect();
            let sum =
                |field: fn(&SubtaskFigures) -> u64| subtasks.iter().map(|s| field(s)).sum::<u64>();
            json!({
                "id": node,
                "name": subtasks[0].operator,
                "task": task_of(node, subtasks[0].subtask).map(|t| &t.name),
                "parallelism": subtasks.len(),
                "status": JobStatus::Running.name(),
                "metrics": {
                    "read-records": sum(|s| s.records_in),
                    "write-records": sum(|s| s.records_out),
                    "read-bytes": subtasks.iter().map(|s| read_bytes(node, s.subtask)).sum::<u64>(),
                    "write-bytes": sum(|s| s.bytes_out),
                    "backpressure-waits": sum(|s| s.backpressure_waits),
                },
                "subtasks": subtasks.iter().map(|s| json!({
                    "subtask": s.subtask,
                    "read-records": s.records_in,
                    "write-records": s.records_out,
                    "read-bytes": read_bytes(node, s.subtask),
                    "write-bytes": s.bytes_out,
                    "backpressure-waits": s.backpressure_waits,
                    "watermark": task_of(node, s.subtask).and_then(|t| t.watermark),
                    // Subtask i of every vertex runs on the job's slot i.
                    "taskmanager": workers.get(s.subtask),
                })).collect::<Vec<_>>(),
            })
        })
        .collect()
}

/// `GET /jobs/:id/checkpoints` (Flink's `CheckpointingStatistics`, the fields Weir has): the
/// checkpoints of the job's current run (its executor process: a failover or a rescale starts
/// the counts again), or of its last run once it ended.
#[utoipa::path(
    get,
    path = "/jobs/{job}/checkpoints",
    params(JobId),
    tag = "checkpoints",
    responses(
        (status = 200, description = "Checkpoint counts, the latest completed, savepoint and failed ones, and the last ten", body = Object),
        (status = 404, description = "No such job", body = ErrorBody),
    )
)]
async fn job_checkpoints(State(shared): State<Shared>, Path(id): Path<String>) -> Answer {
    let cluster = shared.cluster();
    let job = find(&cluster.jobs, &id)?;
    // The running one's, else the last run's.
    let checkpoints = job
        .live
        .as_ref()
        .map(|f| f.checkpoints.clone())
        .or_else(|| job.last_checkpoints.clone())
        .unwrap_or_default();
    let entry = |c: &weir_engine::monitor::CheckpointRecord| {
        json!({
            "id": c.id,
            "status": if c.completed { "COMPLETED" } else { "FAILED" },
            "is_savepoint": c.savepoint,
            "latest_ack_timestamp": c.end_timestamp,
            "end_to_end_duration": c.duration_ms,
            // Weir's checkpoints often take less than a millisecond's resolution shows.
            "end_to_end_duration_us": c.duration_us,
            "state_size": c.full_bytes,
            "checkpointed_size": c.incremental_bytes,
            "max_sync_pause_ms": c.max_sync_pause_ms,
            "max_alignment_ms": c.max_alignment_ms,
            "failure_message": c.failure,
        })
    };
    let latest = |pick: fn(&weir_engine::monitor::CheckpointRecord) -> bool| {
        checkpoints
            .history
            .iter()
            .rev()
            .find(|c| pick(c))
            .map(entry)
    };
    Ok(Json(json!({
        "counts": {
            "completed": checkpoints.completed,
            "failed": checkpoints.failed,
            "savepoints": checkpoints.savepoints,
            "total": checkpoints.completed + checkpoints.failed + checkpoints.savepoints,
        },
        "latest": {
            "completed": checkpoints.latest_completed.as_ref().map(entry),
            "savepoint": latest(|c| c.completed && c.savepoint),
            "failed": latest(|c| !c.completed),
        },
        "history": checkpoints.history.iter().rev().map(entry).collect::<Vec<_>>(),
    })))
}

/// The latest figures of a job's run, or a 409 when it has none (it is not running, or its
/// executor has not reported yet).
fn running(job: &Job) -> Result<&Figures, ApiError> {
    job.live.as_deref().ok_or_else(|| {
        let why = if job.status == JobStatus::Running {
            "RUNNING, but its executor has not reported its tasks' figures yet (it does every \
             second); ask again in a second"
                .to_string()
        } else {
            format!(
                "{}: its tasks' figures are known while it runs",
                job.status.name()
            )
        };
        ApiError(StatusCode::CONFLICT, format!("job '{}' is {why}", job.id))
    })
}

/// A running job's vertex named by the path (an operator's id, as `GET /jobs/:id` lists
/// them), with the job's latest figures: a 404 naming the vertices there are, or a 409 when
/// the job does not run or its executor reports no task figures.
fn running_vertex<'a>(job: &'a Job, text: &str) -> Result<(&'a Figures, usize), ApiError> {
    let live = running(job)?;
    let mut ids: Vec<usize> = live.subtasks.iter().map(|s| s.node).collect();
    ids.sort_unstable();
    ids.dedup();
    let Some(vertex) = text.parse::<usize>().ok().filter(|id| ids.contains(id)) else {
        let ids: Vec<String> = ids.iter().map(usize::to_string).collect();
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!(
                "no vertex '{text}' in this job; its vertices are {} (the ids of GET /jobs/:id)",
                ids.join(", ")
            ),
        ));
    };
    if !insight::runs(live, vertex) {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "job '{}' reports no task figures for vertex {vertex}: its package was built \
                 with an older engine; rebuild it against this one",
                job.id
            ),
        ));
    }
    Ok((live, vertex))
}

/// `GET /jobs/:id/vertices/:vid/backpressure`: the shares of the last second each subtask of
/// the vertex's task was backpressured, idle and busy (measured, not sampled).
#[utoipa::path(
    get,
    path = "/jobs/{job}/vertices/{vertex}/backpressure",
    params(JobVertex),
    tag = "jobs",
    responses(
        (status = 200, description = "Per subtask, the shares of the last second backpressured, idle and busy, with a level (ok, low, high)", body = Object),
        (status = 404, description = "No such job or vertex", body = ErrorBody),
        (status = 409, description = "The job does not run, or its executor has not reported yet", body = ErrorBody),
    )
)]
async fn vertex_backpressure(
    State(shared): State<Shared>,
    Path((id, vertex)): Path<(String, String)>,
) -> Answer {
    let cluster = shared.cluster();
    let job = find(&cluster.jobs, &id)?;
    let (live, vertex) = running_vertex(job, &vertex)?;
    let loads = insight::loads(job.previous.as_deref(), live);
    Ok(Json(insight::backpressure(
        &loads,
        vertex,
        now_ms(),
        job.attempts,
    )))
}

/// `GET /jobs/:id/vertices/:vid/watermarks`.
#[utoipa::path(
    get,
    path = "/jobs/{job}/vertices/{vertex}/watermarks",
    params(JobVertex),
    tag = "jobs",
    responses(
        (status = 200, description = "Per subtask, the input watermark (`N.currentInputWatermark`)", body = serde_json::Value),
        (status = 404, description = "No such job or vertex", body = ErrorBody),
        (status = 409, description = "The job does not run, or its executor has not reported yet", body = ErrorBody),
    )
)]
async fn vertex_watermarks(
    State(shared): State<Shared>,
    Path((id, vertex)): Path<(String, String)>,
) -> Answer {
    let cluster = shared.cluster();
    let job = find(&cluster.jobs, &id)?;
    let (live, vertex) = running_vertex(job, &vertex)?;
    Ok(Json(insight::watermarks(live, vertex)))
}

/// `GET /jobs/:id/bottleneck`.
#[utoipa::path(
    get,
    path = "/jobs/{job}/bottleneck",
    params(JobId),
    tag = "jobs",
    responses(
        (status = 200, description = "The task that limits the job, why, and every task's shares of time", body = Object),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "The job does not run, or its executor has not reported yet", body = ErrorBody),
    )
)]
async fn job_bottleneck(State(shared): State<Shared>, Path(id): Path<String>) -> Answer {
    let cluster = shared.cluster();
    let job = find(&cluster.jobs, &id)?;
    let live = running(job)?;
    Ok(Json(insight::bottleneck(&insight::loads(
        job.previous.as_deref(),
        live,
    ))))
}

/// `GET /jobs/:id/watermarks/holdback`.
#[utoipa::path(
    get,
    path = "/jobs/{job}/watermarks/holdback",
    params(JobId),
    tag = "jobs",
    responses(
        (status = 200, description = "The source split or input channel holding the job's event time back, with its lag", body = Object),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "The job does not run, or its executor has not reported yet", body = ErrorBody),
    )
)]
async fn job_holdback(State(shared): State<Shared>, Path(id): Path<String>) -> Answer {
    let cluster = shared.cluster();
    let job = find(&cluster.jobs, &id)?;
    Ok(Json(insight::holdback(running(job)?, now_ms())))
}

/// `GET /metrics`: the control plane's Prometheus text exposition.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "metrics",
    responses(
        (status = 200, description = "Prometheus text exposition of the workers, slots and jobs", content_type = "text/plain; version=0.0.4", body = String),
    )
)]
async fn metrics(State(shared): State<Shared>) -> Response {
    let text = shared.cluster().exposition();
    ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text).into_response()
}

/// `PATCH /jobs/:id?mode=cancel`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchQuery {
    mode: Option<String>,
}

#[utoipa::path(
    patch,
    path = "/jobs/{job}",
    tag = "jobs",
    params(JobId, ("mode" = Option<String>, Query, description = "cancel (the only mode)")),
    responses(
        (status = 202, description = "The job is being cancelled", body = Object),
        (status = 400, description = "A malformed or unsupported request, named", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "The job ended already", body = ErrorBody),
    )
)]
async fn patch_job(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    query: Result<Query<PatchQuery>, QueryRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Query(query) = query.map_err(|e| bad_request(format!("query: {}", e.body_text())))?;
    match query.mode.as_deref() {
        None | Some("cancel") => {}
        Some(other) => {
            return Err(bad_request(format!(
                "mode '{other}' is not supported; PATCH /jobs/:id?mode=cancel cancels the job"
            )))
        }
    }
    shared.cluster().cancel(&id)?;
    Ok((StatusCode::ACCEPTED, Json(json!({}))))
}

#[utoipa::path(
    get,
    path = "/jobs/{job}/exceptions",
    params(JobId),
    tag = "jobs",
    responses(
        (status = 200, description = "The job's failures, newest first", body = Object),
        (status = 404, description = "No such job", body = ErrorBody),
    )
)]
async fn job_exceptions(State(shared): State<Shared>, Path(id): Path<String>) -> Answer {
    let cluster = shared.cluster();
    let job = find(&cluster.jobs, &id)?;
    let entries: Vec<Value> = job
        .failures
        .iter()
        .rev()
        .map(|f| {
            json!({
                "exceptionName": "JobFailure",
                "stacktrace": f.cause,
                "timestamp": f.timestamp,
                "taskName": job.submission.entry,
                "taskManagerId": f.worker,
            })
        })
        .collect();
    let last = job.failures.last();
    Ok(Json(json!({
        "root-exception": last.map(|f| f.cause.clone()),
        "timestamp": last.map(|f| f.timestamp),
        "all-exceptions": [],
        "truncated": false,
        "exceptionHistory": { "entries": entries, "truncated": false },
    })))
}

/// `POST /jobs/:id/savepoints` (Flink's `SavepointTriggerRequestBody`).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct SavepointRequest {
    target_directory: Option<String>,
    #[serde(default)]
    cancel_job: bool,
    #[serde(rename = "formatType")]
    format_type: Option<String>,
    #[serde(rename = "triggerId")]
    trigger_id: Option<String>,
}

/// `POST /jobs/:id/stop` (Flink's `StopWithSavepointRequestBody`).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct StopRequest {
    target_directory: Option<String>,
    #[serde(default)]
    drain: bool,
    format_type: Option<String>,
    trigger_id: Option<String>,
}

/// `POST /jobs/:id/checkpoints` (Flink's `CheckpointTriggerRequestBody`).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CheckpointRequest {
    checkpoint_type: Option<String>,
    trigger_id: Option<String>,
}

/// Savepoints go where the job's configuration says, in Weir's canonical format; a request
/// asking for another place or format is refused rather than ignored.
fn refuse_unsupported(target: Option<String>, format: Option<String>) -> Result<(), ApiError> {
    if let Some(target) = target {
        return Err(bad_request(format!(
            "a savepoint's directory is set by execution.checkpointing.savepoint-dir (default \
             <checkpoint dir>/<job id>/<generation>/<job name>/savepoints), not per request; \
             leave out the target directory '{target}', or set the key on the control plane"
        )));
    }
    match format.as_deref() {
        None | Some("CANONICAL") => Ok(()),
        Some(other) => Err(bad_request(format!(
            "formatType '{other}' is not supported: Weir's savepoints are CANONICAL (restorable \
             on either state backend); leave it out"
        ))),
    }
}

/// A trigger's JSON body; an empty body is `{}`. Content types are not checked: these
/// bodies are small and optional, and what they hold is.
fn trigger_body<T: Default + serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| bad_request(format!("request body: {e}")))
}

fn triggered(result: Result<String, Refusal>) -> Result<(StatusCode, Json<Value>), ApiError> {
    let request = result?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "request-id": request }))))
}

#[utoipa::path(
    post,
    path = "/jobs/{job}/savepoints",
    params(JobId),
    tag = "checkpoints",
    request_body(content = Option<SavepointRequest>, description = "Flink's SavepointTriggerRequestBody (optional)", content_type = "application/json"),
    responses(
        (status = 202, description = "The savepoint was triggered: `request-id` names it", body = Object),
        (status = 400, description = "A malformed or unsupported request, named", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "The job does not run or takes no checkpoints", body = ErrorBody),
    )
)]
async fn trigger_savepoint(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let request: SavepointRequest = trigger_body(&bytes)?;
    refuse_unsupported(request.target_directory, request.format_type)?;
    let kind = if request.cancel_job {
        OperationKind::Stop { drain: false }
    } else {
        OperationKind::Savepoint
    };
    triggered(shared.cluster().savepoint(&id, kind, request.trigger_id))
}

#[utoipa::path(
    post,
    path = "/jobs/{job}/checkpoints",
    params(JobId),
    tag = "checkpoints",
    request_body(content = Option<CheckpointRequest>, description = "Flink's CheckpointTriggerRequestBody (optional)", content_type = "application/json"),
    responses(
        (status = 202, description = "The checkpoint was asked for (taken at once, or once a pending one ended): `request-id` names it", body = Object),
        (status = 400, description = "A malformed or unsupported request, named", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "The job does not run or takes no checkpoints", body = ErrorBody),
    )
)]
async fn trigger_checkpoint(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let request: CheckpointRequest = trigger_body(&bytes)?;
    match request.checkpoint_type.as_deref() {
        None | Some("CONFIGURED") => {}
        Some(other) => {
            return Err(bad_request(format!(
                "checkpointType '{other}' is not supported: a checkpoint asked for is taken as \
                 the job's configuration says (incremental unless \
                 execution.checkpointing.incremental is false), CONFIGURED; leave it out, or \
                 take a savepoint for a full, self-contained copy"
            )))
        }
    }
    triggered(
        shared
            .cluster()
            .savepoint(&id, OperationKind::Checkpoint, request.trigger_id),
    )
}

#[utoipa::path(
    post,
    path = "/jobs/{job}/stop",
    params(JobId),
    tag = "checkpoints",
    request_body(content = Option<StopRequest>, description = "Flink's StopWithSavepointRequestBody (optional)", content_type = "application/json"),
    responses(
        (status = 202, description = "The stop with a savepoint was triggered: `request-id` names it", body = Object),
        (status = 400, description = "A malformed or unsupported request, named", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "The job does not run or takes no checkpoints", body = ErrorBody),
    )
)]
async fn stop_job(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let request: StopRequest = trigger_body(&bytes)?;
    refuse_unsupported(request.target_directory, request.format_type)?;
    let kind = OperationKind::Stop {
        drain: request.drain,
    };
    triggered(shared.cluster().savepoint(&id, kind, request.trigger_id))
}

/// `PATCH` (Flink's verb) or `POST /jobs/:id/rescaling?parallelism=N`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RescaleQuery {
    parallelism: usize,
}

#[utoipa::path(
    method(post, patch),
    path = "/jobs/{job}/rescaling",
    tag = "checkpoints",
    params(JobId, ("parallelism" = usize, Query, description = "The new parallelism (at least 1)")),
    responses(
        (status = 202, description = "The rescale (a savepoint, then a restart at the new parallelism) was triggered: `request-id` names it", body = Object),
        (status = 400, description = "A missing or bad parallelism", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "The job does not run or takes no checkpoints", body = ErrorBody),
    )
)]
async fn rescale_job(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    query: Result<Query<RescaleQuery>, QueryRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Query(query) = query.map_err(|e| {
        bad_request(format!(
            "{}; /jobs/:id/rescaling?parallelism=N takes the new parallelism",
            e.body_text()
        ))
    })?;
    if query.parallelism == 0 {
        return Err(bad_request(
            "parallelism must be at least 1 (the slots the job runs on)".into(),
        ));
    }
    let kind = OperationKind::Rescale {
        parallelism: query.parallelism,
    };
    triggered(shared.cluster().savepoint(&id, kind, None))
}

/// `GET /jobs/:id/checkpoints/:trigger`: a checkpoint's state.
#[utoipa::path(
    get,
    path = "/jobs/{job}/checkpoints/{trigger}",
    params(JobTrigger),
    tag = "checkpoints",
    responses(
        (status = 200, description = "IN_PROGRESS, or COMPLETED with the `checkpointId` (and Weir's `location`) or a `failure-cause`", body = Object),
        (status = 404, description = "No such job or checkpoint request", body = ErrorBody),
    )
)]
async fn checkpoint_status(state: State<Shared>, path: Path<(String, String)>) -> Answer {
    operation_status(state, path, "checkpoint", |kind| {
        kind == OperationKind::Checkpoint
    })
}

/// `GET /jobs/:id/savepoints/:trigger`: a savepoint's or stop's state.
#[utoipa::path(
    get,
    path = "/jobs/{job}/savepoints/{trigger}",
    params(JobTrigger),
    tag = "checkpoints",
    responses(
        (status = 200, description = "IN_PROGRESS, or COMPLETED with the savepoint's `location` or a `failure-cause`", body = Object),
        (status = 404, description = "No such job or savepoint or stop request", body = ErrorBody),
    )
)]
async fn savepoint_status(state: State<Shared>, path: Path<(String, String)>) -> Answer {
    operation_status(state, path, "savepoint or stop", |kind| {
        matches!(kind, OperationKind::Savepoint | OperationKind::Stop { .. })
    })
}

/// `GET /jobs/:id/rescaling/:trigger`: a rescale's state.
#[utoipa::path(
    get,
    path = "/jobs/{job}/rescaling/{trigger}",
    params(JobTrigger),
    tag = "checkpoints",
    responses(
        (status = 200, description = "IN_PROGRESS, or COMPLETED with the savepoint's `location` or a `failure-cause`", body = Object),
        (status = 404, description = "No such job or rescale request", body = ErrorBody),
    )
)]
async fn rescaling_status(state: State<Shared>, path: Path<(String, String)>) -> Answer {
    operation_status(state, path, "rescale", |kind| {
        matches!(kind, OperationKind::Rescale { .. })
    })
}

/// The state of an asynchronous operation of the kinds `of` accepts, `what` in words (Flink's
/// asynchronous operation result).
fn operation_status(
    State(shared): State<Shared>,
    Path((id, trigger)): Path<(String, String)>,
    what: &str,
    of: fn(OperationKind) -> bool,
) -> Answer {
    let cluster = shared.cluster();
    let job = find(&cluster.jobs, &id)?;
    let operation = job
        .operations
        .iter()
        .find(|o| o.id == trigger && of(o.kind))
        .ok_or_else(|| {
            ApiError(
                StatusCode::NOT_FOUND,
                format!("job {id} has no {what} request '{trigger}'"),
            )
        })?;
    if !operation.done() {
        return Ok(Json(json!({ "status": { "id": "IN_PROGRESS" } })));
    }
    let outcome = match (operation.result.as_ref().expect("done"), operation.kind) {
        (Ok(path), OperationKind::Checkpoint) => json!({
            "checkpointId": operation.checkpoint,
            "location": path,
        }),
        (Ok(path), _) => json!({ "location": path }),
        (Err(cause), kind) => json!({
            "failure-cause": {
                "class": match kind {
                    OperationKind::Checkpoint => "CheckpointException",
                    _ => "SavepointError",
                },
                "stack-trace": cause,
            }
        }),
    };
    Ok(Json(
        json!({ "status": { "id": "COMPLETED" }, "operation": outcome }),
    ))
}

#[cfg(test)]
mod tests {
    use super::{split_args, ApiDoc, ENDPOINTS};
    use utoipa::OpenApi;

    #[test]
    fn the_openapi_document_lists_exactly_the_endpoints_served() {
        let document = ApiDoc::openapi();
        let mut listed = Vec::new();
        for (path, item) in &document.paths.paths {
            let methods = [
                ("get", &item.get),
                ("post", &item.post),
                ("put", &item.put),
                ("patch", &item.patch),
                ("delete", &item.delete),
            ];
            for (method, operation) in methods {
                let Some(operation) = operation else { continue };
                listed.push((method.to_string(), path.clone()));
                // Every `{name}` of the path is a documented path parameter.
                let parameters: Vec<&str> = operation
                    .parameters
                    .iter()
                    .flatten()
                    .map(|p| p.name.as_str())
                    .collect();
                for name in path.split('{').skip(1).map(|p| &p[..p.find('}').unwrap()]) {
                    assert!(
                        parameters.contains(&name),
                        "{method} {path} documents no parameter {name}: {parameters:?}"
                    );
                }
                assert!(
                    operation
                        .responses
                        .responses
                        .keys()
                        .any(|s| s.starts_with('2') || s == "101"),
                    "{method} {path} documents no success"
                );
                assert!(
                    operation.responses.responses.contains_key("401"),
                    "{method} {path} documents no 401"
                );
            }
        }
        let mut served: Vec<(String, String)> = ENDPOINTS
            .iter()
            .map(|(method, path)| (method.to_string(), path.to_string()))
            .collect();
        listed.sort();
        served.sort();
        served.dedup();
        assert_eq!(listed, served);
        let json = document.to_json().unwrap();
        assert!(json.contains("\"openapi\":\"3."), "{json}");
    }

    #[test]
    fn program_args_split_on_spaces_and_keep_quoted_words() {
        assert_eq!(
            split_args(r#" --input "a b.txt"  --events 5 --x '' "#).unwrap(),
            ["--input", "a b.txt", "--events", "5", "--x", ""]
        );
        assert_eq!(split_args("").unwrap(), Vec::<String>::new());
        let error = split_args("--input 'a").unwrap_err();
        assert!(error.contains("unclosed '"), "{error}");
    }
}
