//! Where `tracing` events go: standard error, as text or as one JSON object per line
//! (`--log-format json`, or `WEIR_LOG_FORMAT=json`, which the processes a worker starts
//! inherit), filtered by `WEIR_LOG` (an `EnvFilter` directive such as `weir=debug`).

use std::str::FromStr;

/// The environment variable naming the log format.
pub const FORMAT_VARIABLE: &str = "WEIR_LOG_FORMAT";

/// The environment variable holding the log filter.
pub const FILTER_VARIABLE: &str = "WEIR_LOG";

/// What is logged when `WEIR_LOG` is not set: warnings, and the lines an operator follows —
/// where a job's checkpoints start from, an executor's start, the control plane's and the
/// workers' events (one line per job state change).
pub const DEFAULT_FILTER: &str = "warn,weir_engine::checkpoint::driver=info,\
     weir_engine::package=info,weir::control_plane=info,weir::worker=info";

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (colours only on a terminal).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the event's
    /// fields (`job_id`, `status`, …) at the top level.
    Json,
}

impl LogFormat {
    /// Its name, as `--log-format` takes it.
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }

    /// The format `WEIR_LOG_FORMAT` names (text when it is not set).
    pub fn from_env() -> Result<LogFormat, String> {
        match std::env::var(FORMAT_VARIABLE) {
            Ok(value) => value.parse().map_err(|e| format!("{FORMAT_VARIABLE}: {e}")),
            Err(_) => Ok(LogFormat::Text),
        }
    }
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<LogFormat, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!(
                "unknown log format '{text}'; the formats are text and json"
            )),
        }
    }
}

/// Sends this process's `tracing` events to standard error in `format`. A process that set
/// up its own subscriber keeps it.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env(FILTER_VARIABLE)
        .unwrap_or_else(|_| DEFAULT_FILTER.into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _already_set = match format {
        // Colours only on a terminal: executors' and services' logs go to files.
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_by_name_and_refuse_others_naming_them() {
        assert_eq!("json".parse(), Ok(LogFormat::Json));
        assert_eq!(" Text ".parse(), Ok(LogFormat::Text));
        let error = "yaml".parse::<LogFormat>().unwrap_err();
        assert!(
            error.contains("'yaml'") && error.contains("text and json"),
            "{error}"
        );
        assert_eq!(LogFormat::Json.name().parse(), Ok(LogFormat::Json));
    }
}
