//! The CLI's commands that talk to a control plane over its REST API (`weir submit`, `list`,
//! `status`, `cancel`): human tables by default, `--json` for scripts.
//!
//! Exit codes: 0 done; 1 the control plane refused the request (its message is printed);
//! 2 a usage error; 69 the control plane cannot be reached.

use std::process::ExitCode;
use std::time::Duration;

use serde_json::{json, Value};

use crate::endpoint::ControlEndpoint;

/// The exit code when the control plane cannot be reached (`EX_UNAVAILABLE`).
pub const UNREACHABLE: u8 = 69;

/// A failed request: what to print and the exit code.
#[derive(Debug)]
pub struct Failure {
    /// The message.
    pub message: String,
    /// The exit code.
    pub code: ExitCode,
}

/// A client of one control plane.
pub struct Client {
    endpoint: ControlEndpoint,
    agent: ureq::Agent,
}

impl Client {
    /// A client of the control plane at `endpoint`.
    pub(crate) fn new(endpoint: ControlEndpoint) -> Client {
        let agent = endpoint.agent(Duration::from_secs(30), false);
        Client { endpoint, agent }
    }

    /// Sends a request and returns the JSON answer of a 2xx; a refusal carries the control
    /// plane's `errors`.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, Failure> {
        let url = self.endpoint.url(path);
        let auth = self.endpoint.authorization();
        let result = match (method, body) {
            ("GET", _) => with_auth(self.agent.get(&url), auth.as_deref()).call(),
            ("POST", Some(body)) => {
                with_auth(self.agent.post(&url), auth.as_deref()).send_json(body)
            }
            ("POST", None) => with_auth(self.agent.post(&url), auth.as_deref()).send_empty(),
            ("PATCH", _) => with_auth(self.agent.patch(&url), auth.as_deref()).send_empty(),
            _ => unreachable!("the client sends GET, POST and PATCH"),
        };
        let mut response = result.map_err(|error| Failure {
            message: format!(
                "cannot reach the control plane at {} ({error}); start it with `weir control`, or \
                 point --control at it{}",
                self.endpoint.url(""),
                self.endpoint.hint()
            ),
            code: ExitCode::from(UNREACHABLE),
        })?;
        let status = response.status();
        let value: Value = response
            .body_mut()
            .read_json()
            .unwrap_or_else(|e| json!({ "errors": [format!("the answer is not JSON: {e}")] }));
        if status.is_success() {
            return Ok(value);
        }
        let errors: Vec<String> = value["errors"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        Err(Failure {
            message: format!("{method} {path}: {status}: {}", errors.join("; ")),
            code: ExitCode::FAILURE,
        })
    }
}

impl Client {
    /// Polls job `job`'s asynchronous operation (`path`: `…/savepoints/:trigger`,
    /// `…/rescaling/:trigger`) until it is `COMPLETED`, and returns that answer. Gives up when
    /// the job ended with the operation still in progress, or after `limit`; rides out a
    /// control plane that restarts meanwhile.
    pub fn wait_for(&self, job: &str, path: &str, limit: Duration) -> Result<Value, Failure> {
        let started = std::time::Instant::now();
        loop {
            match self.call("GET", path, None) {
                Ok(status) if status["status"]["id"] == "COMPLETED" => return Ok(status),
                Ok(_) => {
                    let details = self.call("GET", &format!("/jobs/{job}"), None)?;
                    let state = details["state"].as_str().unwrap_or_default();
                    if matches!(state, "FINISHED" | "CANCELED" | "FAILED") {
                        // Ended meanwhile: the operation's result is final now, or never comes.
                        let status = self.call("GET", path, None)?;
                        if status["status"]["id"] == "COMPLETED" {
                            return Ok(status);
                        }
                        return Err(Failure {
                            message: format!(
                                "job {job} ended {state} before the request completed"
                            ),
                            code: ExitCode::FAILURE,
                        });
                    }
                }
                Err(failure) if failure.code != ExitCode::from(UNREACHABLE) => return Err(failure),
                Err(_) => {}
            }
            if started.elapsed() > limit {
                return Err(Failure {
                    message: format!(
                        "{path} did not complete within {limit:?}; ask for it again with GET {path}"
                    ),
                    code: ExitCode::FAILURE,
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn with_auth<B>(request: ureq::RequestBuilder<B>, auth: Option<&str>) -> ureq::RequestBuilder<B> {
    match auth {
        Some(auth) => request.header("Authorization", auth),
        None => request,
    }
}

/// A time as the tables show it: UTC, to the second.
fn clock(ms: i64) -> String {
    if ms < 0 {
        return "-".into();
    }
    let secs = ms / 1000;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = weir_engine::time::civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

fn seconds(ms: i64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// The `weir list` table.
pub fn jobs_table(overview: &Value, all: bool) -> String {
    let mut out = format!(
        "{:<32}  {:<20}  {:<11}  {:<19}  {:>10}\n",
        "JOB ID", "NAME", "STATE", "STARTED (UTC)", "DURATION"
    );
    let mut jobs = overview["jobs"].as_array().cloned().unwrap_or_default();
    jobs.sort_by_key(|job| std::cmp::Reverse(job["start-time"].as_i64()));
    let mut shown = 0;
    for job in &jobs {
        let state = job["state"].as_str().unwrap_or("?");
        if !all && matches!(state, "FINISHED" | "CANCELED" | "FAILED") {
            continue;
        }
        shown += 1;
        out += &format!(
            "{:<32}  {:<20}  {:<11}  {:<19}  {:>10}\n",
            job["jid"].as_str().unwrap_or("?"),
            job["name"].as_str().unwrap_or("?"),
            state,
            clock(job["start-time"].as_i64().unwrap_or(-1)),
            seconds(job["duration"].as_i64().unwrap_or(0)),
        );
    }
    if shown == 0 {
        out += if all {
            "(no jobs)\n"
        } else {
            "(no running jobs; --all lists ended ones too)\n"
        };
    }
    out
}

/// The `weir status` text.
pub fn job_text(job: &Value, exceptions: &Value) -> String {
    let mut out = format!(
        "job {}  {}\n  state      {}\n  started    {} UTC\n  duration   {}\n  parallelism {}\n  attempts   {}\n",
        job["jid"].as_str().unwrap_or("?"),
        job["name"].as_str().unwrap_or("?"),
        job["state"].as_str().unwrap_or("?"),
        clock(job["start-time"].as_i64().unwrap_or(-1)),
        seconds(job["duration"].as_i64().unwrap_or(0)),
        job["parallelism"],
        job["attempts"],
    );
    for executor in job["placement"]["executors"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let state = match (
            executor["finished"].as_bool(),
            executor["running"].as_bool(),
        ) {
            (Some(true), _) => "finished",
            (_, Some(true)) => "running",
            _ => "deploying",
        };
        out += &format!(
            "  placement  worker {} slots {} (job slots {}, {state})\n",
            executor["taskmanager"].as_str().unwrap_or("?"),
            executor["slots"],
            executor["job-slots"],
        );
    }
    for vertex in job["vertices"].as_array().into_iter().flatten() {
        out += &format!(
            "  {:<28} in {:>12}  out {:>12}\n",
            vertex["name"].as_str().unwrap_or("?"),
            vertex["metrics"]["read-records"],
            vertex["metrics"]["write-records"],
        );
    }
    if let Some(root) = exceptions["root-exception"].as_str() {
        out += &format!(
            "  last failure ({} UTC): {root}\n",
            clock(exceptions["timestamp"].as_i64().unwrap_or(-1))
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_prints_utc_dates() {
        assert_eq!(clock(0), "1970-01-01 00:00:00");
        assert_eq!(clock(1_796_342_400_000 + 3_723_000), "2026-12-04 01:02:03");
        assert_eq!(clock(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(clock(-1), "-");
    }

    #[test]
    fn the_list_leaves_ended_jobs_out_unless_asked() {
        let overview = json!({ "jobs": [
            { "jid": "a", "name": "word-count", "state": "FINISHED", "start-time": 0, "duration": 1500 },
            { "jid": "b", "name": "sequence-check", "state": "RUNNING", "start-time": 0, "duration": 2000 },
        ]});
        let running = jobs_table(&overview, false);
        assert!(
            running.contains("sequence-check") && !running.contains("word-count"),
            "{running}"
        );
        let all = jobs_table(&overview, true);
        assert!(all.contains("word-count") && all.contains("1.5 s"), "{all}");
    }
}
