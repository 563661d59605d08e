//! The built-in jobs: what `weir run JOB` runs embedded, and the jobs of the `weir` package that
//! a worker's executor runs (`weir --weir-execute`), from the same arguments.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Parser, ValueEnum};
use weir_engine::package::Registry;
use weir_engine::StreamEnvironment;
use weir_examples::Output;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Job {
    /// Streaming word count over a text file (or a directory of them).
    WordCount,
    /// Running per-sensor statistics over generated readings.
    KeyedAggregation,
    /// Exactly-once check: per key, counts records and the gaps and repeats in their sequence
    /// numbers, and reports each key when the input ends (kill it and `--resume` it).
    SequenceCheck,
    /// Exactly-once output check: every record of sequence-check's source, after a keyed
    /// count, written as a line `key seq count` (kill it, `--resume` it, and count each
    /// record in the committed part files of --output).
    SequenceEcho,
}

impl Job {
    /// The job's name (its entry in the `weir` package, and its job name).
    pub fn name(self) -> &'static str {
        match self {
            Job::WordCount => "word-count",
            Job::KeyedAggregation => "keyed-aggregation",
            Job::SequenceCheck => "sequence-check",
            Job::SequenceEcho => "sequence-echo",
        }
    }
}

/// The arguments of the built-in jobs.
#[derive(clap::Args, Clone, Debug)]
pub struct JobArgs {
    /// word-count: the text file or directory to read (default: the bundled sample).
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// Write results as part files into this directory instead of printing them.
    #[arg(long, conflicts_with = "discard")]
    pub output: Option<PathBuf>,
    /// Drop results instead of printing them (throughput runs).
    #[arg(long)]
    pub discard: bool,
    /// sequence-echo: write its records into PostgreSQL, exactly once with checkpointing
    /// (postgres://user[:password]@host[:port]/database/TABLE; the table is created if
    /// missing).
    #[arg(long, value_name = "URL", conflicts_with_all = ["output", "discard"])]
    pub sink: Option<String>,
    /// keyed-aggregation: number of generated readings; sequence-check and sequence-echo: of records.
    #[arg(long, default_value_t = 10_000_000)]
    pub events: u64,
    /// keyed-aggregation: number of sensors.
    #[arg(long, default_value_t = 100)]
    pub sensors: u32,
    /// keyed-aggregation: report a sensor every this many readings.
    #[arg(long, default_value_t = 25_000)]
    pub report_every: u64,
    /// sequence-check and sequence-echo: number of keys (rounded to a multiple of its 16 splits).
    #[arg(long, default_value_t = 800)]
    pub keys: u32,
    /// sequence-check and sequence-echo: records per second per source subtask at most (unthrottled if
    /// absent).
    #[arg(long)]
    pub rate: Option<f64>,
}

/// A job's program arguments as a worker's executor gets them (`programArgs`).
#[derive(Parser)]
#[command(name = "weir-job", no_binary_name = true)]
struct ProgramArgs {
    #[command(flatten)]
    args: JobArgs,
}

/// Builds `job` into `env` and returns its name.
pub fn build(env: &StreamEnvironment, job: Job, args: &JobArgs) -> Result<&'static str> {
    let JobArgs {
        input,
        output,
        discard,
        sink,
        events,
        sensors,
        report_every,
        keys,
        rate,
    } = args.clone();
    let output = match (output, discard) {
        (Some(dir), _) => Output::Files(dir),
        (None, true) => Output::Discard,
        (None, false) => Output::Print,
    };
    if sink.is_some() && job != Job::SequenceEcho {
        bail!(
            "--sink postgres://… takes the records of sequence-echo; run \
             `weir run sequence-echo --sink URL`"
        );
    }
    match job {
        Job::WordCount => {
            let input =
                input.unwrap_or_else(|| PathBuf::from(weir_examples::word_count::SAMPLE_INPUT));
            if !input.exists() {
                bail!(
                    "word-count input '{}' does not exist; pass --input FILE",
                    input.display()
                );
            }
            weir_examples::word_count::build(env, &input, output);
        }
        Job::KeyedAggregation => {
            weir_examples::keyed_aggregation::build(env, events, sensors, report_every, output);
        }
        Job::SequenceCheck | Job::SequenceEcho => {
            let spec = weir_examples::sequence_check::SequenceSpec::of_cli(events, keys, rate);
            match (job, &sink) {
                (Job::SequenceCheck, _) => {
                    weir_examples::sequence_check::build(env, spec, output);
                }
                (_, None) => weir_examples::sequence_check::build_echo(env, spec, output),
                (_, Some(url)) => {
                    weir_examples::sequence_check::build_echo_to_postgres(env, spec, url)?;
                }
            }
        }
    }
    Ok(job.name())
}

/// A built-in job's program arguments, parsed.
pub fn parse_args(args: &[String]) -> Result<JobArgs, String> {
    ProgramArgs::try_parse_from(args)
        .map(|p| p.args)
        .map_err(|e| e.to_string())
}

/// Checks a built-in job's program arguments without building it (the control plane refuses
/// a submission whose arguments do not parse); the error is clap's first line.
pub fn check_args(args: &[String]) -> Result<(), String> {
    ProgramArgs::try_parse_from(args).map(drop).map_err(|e| {
        let text = e.to_string();
        text.lines()
            .next()
            .unwrap_or_default()
            .trim_start_matches("error: ")
            .to_string()
    })
}

/// The `weir` package: every built-in job, built from its program arguments.
pub fn registry() -> Registry {
    Job::value_variants()
        .iter()
        .fold(Registry::new("weir"), |registry, &job| {
            let description = job
                .to_possible_value()
                .and_then(|v| v.get_help().map(ToString::to_string))
                .unwrap_or_default();
            registry.job(job.name(), &description, move |env, args| {
                let parsed = ProgramArgs::try_parse_from(args).map_err(|e| e.to_string())?;
                build(env, job, &parsed.args)
                    .map(drop)
                    .map_err(|e| format!("{e:#}"))
            })
        })
}
