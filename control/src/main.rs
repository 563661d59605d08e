//! `weir`: the one entry point. Runs jobs embedded (local mode), benchmarks, and shows
//! configuration.
// The CLI's results go to stdout by design; library crates keep the lint.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use weir_engine::api::RunOptions;
use weir_engine::connector::DeliveryGuarantee;
use weir_engine::logging::{self, LogFormat};
use weir_engine::{Configuration, StreamEnvironment};
use weir_memory::CountingAllocator;

/// mimalloc, counted per thread so that each shard's heap can be held to its slot's share.
#[global_allocator]
static GLOBAL: CountingAllocator<mimalloc::MiMalloc> = CountingAllocator::new(mimalloc::MiMalloc);

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "Weir: a thread-per-core stream processing engine with Flink's semantics"
)]
struct Cli {
    /// Write log lines as text or as one JSON object per line (text, json; also
    /// WEIR_LOG_FORMAT). Give it before the command: `weir --log-format json control`. The
    /// executors a worker starts log in the worker's format.
    #[arg(long, value_name = "FORMAT", value_parser = ["text", "json"])]
    log_format: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// The log format `--log-format` (before the command) or `WEIR_LOG_FORMAT` names. Read before
/// the command line is parsed: an executor's arguments are not this CLI's.
fn log_format() -> Result<LogFormat, String> {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = if arg == "--log-format" {
            args.next()
        } else if let Some(value) = arg.strip_prefix("--log-format=") {
            Some(value.to_string())
        } else if arg.starts_with('-') {
            continue;
        } else {
            // The command: what follows is its own.
            break;
        };
        return value
            .ok_or_else(|| "--log-format takes text or json".to_string())?
            .parse()
            .map_err(|e| format!("--log-format: {e}"));
    }
    LogFormat::from_env()
}

/// Configuration sources shared by every subcommand: file, then environment, then flags.
#[derive(clap::Args, Clone, Debug, Default)]
struct ConfigArgs {
    /// A TOML configuration file (Flink-style keys).
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    file: Option<PathBuf>,
    /// Set a configuration key, e.g. -D taskmanager.numberOfTaskSlots=2 (repeatable).
    #[arg(short = 'D', value_name = "KEY=VALUE")]
    pairs: Vec<String>,
}

impl ConfigArgs {
    fn load(&self) -> Result<Configuration> {
        let mut config = match &self.file {
            Some(path) => Configuration::from_toml_file(path)?,
            None => Configuration::default(),
        };
        config.apply_env()?;
        config.apply_pairs(self.pairs.iter().map(String::as_str))?;
        Ok(config)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run an example job embedded (local mode) on every configured core.
    Run {
        /// The job to run.
        #[arg(value_enum)]
        job: builtin::Job,
        #[command(flatten)]
        args: builtin::JobArgs,
        /// Start from the latest completed checkpoint in the job's checkpoint directory
        /// (execution.checkpointing.dir), or from scratch if it has none yet.
        #[arg(long)]
        resume: bool,
        /// Start from this savepoint (a `savepoint-…` directory, or a retained `chk-<n>`):
        /// every state as the savepoint found it, at any parallelism.
        #[arg(long, value_name = "PATH", conflicts_with = "resume")]
        from_savepoint: Option<PathBuf>,
        /// With --from-savepoint or --resume: leave out (with a warning) the state of operators
        /// the job no longer has, instead of refusing to start.
        #[arg(long)]
        allow_non_restored_state: bool,
        /// Print the StreamGraph, JobGraph and ExecutionGraph instead of running.
        #[arg(long)]
        explain: bool,
        /// Print the per-slot memory budgets (managed/RocksDB, network, heap) and the keys that
        /// set them, instead of running.
        #[arg(long, conflicts_with = "explain")]
        explain_memory: bool,
        /// Do not print progress to stderr.
        #[arg(long)]
        quiet: bool,
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Throughput benchmarks, each against a hand-written baseline measured in the same run.
    Bench {
        #[command(subcommand)]
        bench: Bench,
    },
    /// List every configuration key with its effective value and meaning.
    Config {
        /// Print the configuration reference instead (Markdown: every key with what it
        /// accepts, its default and its meaning; `docs/configuration.md` is its output).
        #[arg(long)]
        reference: bool,
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Check and tune this host for a worker (as `rpk redpanda tune` and perftune do), and a
    /// worker's memory per slot.
    Tune {
        #[command(subcommand)]
        tune: tune::TuneCommand,
    },
    /// Read checkpoints.
    Checkpoint {
        #[command(subcommand)]
        checkpoint: CheckpointCommand,
    },
    /// Start the control plane: the REST API on rest.address:rest.port (default
    /// localhost:8081), the workers' registry and one job master per job, with its jobs kept
    /// in control.data-dir (a restarted control plane resumes them).
    Control {
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Start a worker: registers one slot per core (taskmanager.cpu.cores or
    /// taskmanager.numberOfTaskSlots; default every available core) with the control plane
    /// and runs each job deployed to it in an executor process of its own.
    Worker {
        /// The control plane's REST address.
        #[arg(long, value_name = "HOST:PORT")]
        control: String,
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Submit a job of a package to the control plane (exit codes: 0 submitted, 1 refused,
    /// 69 control plane unreachable).
    Submit {
        /// The job (entry class) to run, e.g. word-count; `GET /jars` lists them.
        job: String,
        /// The job's arguments, e.g. --events 1000000: everything after the job's name (so
        /// this command's own options go before it).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
        /// The package (jar id) holding the job.
        #[arg(long, default_value = "weir-builtin")]
        jar: String,
        /// Slots the job runs on (all on one worker).
        #[arg(short = 'p', long, default_value_t = 1)]
        parallelism: usize,
        /// Start from this savepoint (an absolute path the worker can read).
        #[arg(long, value_name = "PATH")]
        from_savepoint: Option<PathBuf>,
        /// With --from-savepoint: leave out the state of operators the job no longer has.
        #[arg(long)]
        allow_non_restored_state: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// List the control plane's running jobs (--all: ended ones too).
    List {
        /// Ended jobs too.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Show a job: state, placement, attempts, last failure.
    Status {
        /// The job's id.
        job: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Cancel a job.
    Cancel {
        /// The job's id.
        job: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Take a savepoint of a running job and print its directory (the job runs on).
    Savepoint {
        /// The job's id.
        job: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Stop a job with a savepoint and print its directory (resume it with `weir submit
    /// --from-savepoint PATH …`).
    Stop {
        /// The job's id.
        job: String,
        /// Send the final watermark first, so that every window fires (a job that ends for
        /// good).
        #[arg(long)]
        drain: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Rescale a job: stop it with a savepoint and start it again from it at this
    /// parallelism.
    Rescale {
        /// The job's id.
        job: String,
        /// The new parallelism.
        #[arg(short = 'p', long)]
        parallelism: usize,
        #[command(flatten)]
        api: ApiArgs,
    },
}

/// How the API commands reach the control plane.
#[derive(clap::Args, Clone, Debug)]
struct ApiArgs {
    /// The control plane's REST address (default: rest.address:rest.port of the
    /// configuration).
    #[arg(long, value_name = "HOST:PORT")]
    control: Option<String>,
    /// Print JSON (the REST API's answer) instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    config: ConfigArgs,
}

impl ApiArgs {
    fn client(&self) -> Result<client::Client> {
        let config = self.config.load()?;
        let endpoint = self.control.clone().unwrap_or_else(|| {
            let (host, port) = config.rest_endpoint();
            format!("{host}:{port}")
        });
        Ok(client::Client::new(endpoint::ControlEndpoint::from_config(
            &config, &endpoint,
        )?))
    }
}

#[derive(Subcommand)]
enum CheckpointCommand {
    /// Print what a checkpoint holds — operators, per subtask its keyed states (types, key
    /// groups, entries), timers, operator states and source positions — and verify every
    /// checksum; exits with an error if any fails.
    Inspect {
        /// A checkpoint (`<dir>/<job>/chk-<n>`) or a job's checkpoint directory (its newest
        /// completed checkpoint).
        path: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Take a checkpoint of a running job now (Flink's `flink checkpoint JOB`) and print its
    /// number and directory; it is one of the job's own, retained like the periodic ones.
    Trigger {
        /// The job's id.
        job: String,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// Submission over the REST API to the first record processed, on a control plane and a
    /// worker started for it on loopback, against the same job started embedded, and from a
    /// savepoint holding state.
    Submit {
        /// Submissions of each kind.
        #[arg(long, default_value_t = 10)]
        rounds: usize,
        /// `--keys` of the job the savepoint is taken of: two records of each in 10 s, stopped
        /// with a savepoint after 9 s (about 90 % of the keys hold state).
        #[arg(long, default_value_t = 100_000)]
        keys: u32,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// A checkpoint asked for through the REST API (control plane → worker → the executor's
    /// coordinator and back), against the same job's checkpoint asked of its coordinator in
    /// this process: what the way to the coordinator costs.
    Coordinator {
        /// Checkpoints asked for each way.
        #[arg(long, default_value_t = 30)]
        checkpoints: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// A control plane's CPU with jobs that only run: their workers' heartbeats and figures,
    /// from simulated workers in this process, against the same control plane without jobs.
    Control {
        /// Jobs, one slot each.
        #[arg(long, default_value_t = 100)]
        jobs: usize,
        /// Slots of each simulated worker.
        #[arg(long, default_value_t = 10)]
        slots_per_worker: usize,
        /// Seconds of each window.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Source → map → filter → discard, chained on one shard, against a hand-written loop.
    Chain {
        /// Records to generate.
        #[arg(long, default_value_t = 50_000_000)]
        records: u64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// The same with a hash exchange between shards, against a two-thread hand-off.
    Exchange {
        /// Records to generate.
        #[arg(long, default_value_t = 20_000_000)]
        records: u64,
        /// Shards (at most the number of cores).
        #[arg(long, default_value_t = 2)]
        shards: usize,
        /// Set a further engine configuration key, e.g. -D taskmanager.cpu.cores=0,2 or
        /// -D taskmanager.network.memory.buffers-per-channel=32 (repeatable).
        #[arg(short = 'D', value_name = "KEY=VALUE")]
        settings: Vec<String>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// The keyed exchange on two slots spread over two executors (QUIC with mutual TLS on
    /// loopback, or --veth across a veth pair, between them) against the same job on one
    /// executor (rings between shards).
    RemoteExchange {
        /// Records to generate.
        #[arg(long, default_value_t = 10_000_000)]
        records: u64,
        /// Bytes per record: 64 or 1024.
        #[arg(long, default_value_t = 64)]
        record_bytes: usize,
        /// Cross a veth pair between two network namespaces (one per executor) instead of
        /// loopback; needs root and iproute2.
        #[arg(long)]
        veth: bool,
        /// Set a further engine configuration key (repeatable).
        #[arg(short = 'D', value_name = "KEY=VALUE")]
        settings: Vec<String>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Segments between two shards over the network exchange (QUIC with mutual TLS and
    /// credit, on loopback or --veth across a veth pair), against a bare quinn transfer of the
    /// same bytes over the same link.
    Net {
        /// Bytes each round sends, e.g. 2g.
        #[arg(long, default_value = "1g", value_parser = parse_bytes)]
        bytes: u64,
        /// The segment size, e.g. 32k (a power of two).
        #[arg(long, default_value = "32kb", value_parser = parse_bytes)]
        segment_size: u64,
        /// Channels (streams of the one connection) the bytes are split over.
        #[arg(long, default_value_t = 1)]
        channels: usize,
        /// Segments of each channel's receiving pool: the sender's credit.
        #[arg(long, default_value_t = 16)]
        credits: usize,
        /// Cross a veth pair between two network namespaces (one per side) instead of
        /// loopback; needs root and iproute2.
        #[arg(long)]
        veth: bool,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// A keyed count per window on one shard, against a hand-written loop with hash maps.
    Window {
        /// tumbling (10 s), sliding (10 s every 2 s) or session (1 s gap).
        #[arg(long, default_value = "tumbling", value_parser = ["tumbling", "sliding", "session"])]
        kind: String,
        /// Records to generate (100 per ms of event time).
        #[arg(long, default_value_t = 20_000_000)]
        records: u64,
        /// Distinct keys.
        #[arg(long, default_value_t = 10_000)]
        keys: u64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// ValueState get + update per key on one shard, against a plain HashMap loop.
    State {
        /// heap or rocksdb (a fresh database in a temporary directory).
        #[arg(long, default_value = "heap", value_parser = ["heap", "rocksdb"])]
        backend: String,
        /// Distinct keys.
        #[arg(long, default_value_t = 10_000)]
        keys: u64,
        /// Operations: each reads one key's value and writes it back.
        #[arg(long, default_value_t = 10_000_000)]
        ops: u64,
        /// RocksDB: state.backend.rocksdb.memory.write-back-ratio (0 turns the write-back
        /// cache off).
        #[arg(long, default_value_t = weir_memory::DEFAULT_WRITE_BACK_RATIO)]
        write_back_ratio: f64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// An interval join of two generated streams on one shard (its buffers on the heap or in
    /// RocksDB), against a hand-written loop with per-key buffers.
    Join {
        /// heap or rocksdb.
        #[arg(long, default_value = "heap", value_parser = ["heap", "rocksdb"])]
        backend: String,
        /// Records of each side (one per millisecond of event time).
        #[arg(long, default_value_t = 2_000_000)]
        records: u64,
        /// Distinct keys.
        #[arg(long, default_value_t = 1_000)]
        keys: u64,
        /// The join's bounds: between(-bound-ms, bound-ms).
        #[arg(long, default_value_t = 2_000)]
        bound_ms: i64,
        /// Checkpoint the engine run every MS milliseconds (into a temporary directory,
        /// removed afterwards); the report adds the checkpoints' figures.
        #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
        checkpoint_interval_ms: Option<u64>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Generated records written as text lines by the exactly-once file sink on one shard,
    /// against a plain buffered write of the same bytes: MB/s of each.
    FileSink {
        /// Records to write (about 35 bytes each).
        #[arg(long, default_value_t = 20_000_000)]
        records: u64,
        /// Checkpoint the engine run every MS milliseconds (parts commit at each checkpoint);
        /// without it the parts commit when the job ends.
        #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
        checkpoint_interval_ms: Option<u64>,
        /// Where both write (in temporary directories, removed after each round).
        #[arg(long, value_name = "DIR", default_value = "/var/tmp")]
        dir: PathBuf,
        /// The sink's delivery guarantee.
        #[arg(long, default_value = "exactly-once", value_parser = DeliveryGuarantee::NAMES)]
        delivery_guarantee: String,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Generated rows written by the PostgreSQL sink from one subtask into a table of a
    /// running server, against a hand-written COPY of the same rows: rows/s.
    Postgres {
        /// The database (postgres://user[:password]@host[:port]/database); the benchmark
        /// creates its own table there and drops it at the end.
        #[arg(long)]
        url: String,
        /// Rows to write.
        #[arg(long, default_value_t = 2_000_000)]
        records: u64,
        /// Checkpoint the engine run every MS milliseconds (each checkpoint commits a
        /// transaction); without it the rows commit when the job ends.
        #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
        checkpoint_interval_ms: Option<u64>,
        /// The sink's delivery guarantee.
        #[arg(long, default_value = "exactly-once", value_parser = DeliveryGuarantee::NAMES)]
        delivery_guarantee: String,
        /// Upsert the rows on their id (the table's primary key) instead of appending them.
        #[arg(long)]
        upsert: bool,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// A keyed job holding --state-bytes of state, checkpointed every --interval-ms under
    /// updates of 1 % of its keys per interval, failed once: sync pauses, checkpoint durations
    /// and sizes (full, and what the last one wrote), restore and recovery times.
    Checkpoint {
        /// heap or rocksdb.
        #[arg(long, default_value = "heap", value_parser = ["heap", "rocksdb"])]
        backend: String,
        /// State to hold, e.g. 1g, 256m or 1000000 (bytes of values).
        #[arg(long, default_value = "1g", value_parser = parse_bytes)]
        state_bytes: u64,
        /// Bytes per key's value.
        #[arg(long, default_value_t = 1024)]
        value_bytes: usize,
        /// The checkpoint interval in milliseconds.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        interval_ms: u64,
        /// Rounds of updates (one per interval) before the failure, and after it.
        #[arg(long, default_value_t = 5)]
        rounds: u32,
        /// Where the checkpoints and RocksDB's files go (a directory made in it, removed
        /// after the run): put it on the disk to be measured.
        #[arg(long, default_value_os_t = std::env::temp_dir())]
        dir: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// A Nexmark query on the engine (or its hand-written baseline): throughput, latency,
    /// result count and checksum.
    Nexmark {
        /// q0, q1, q2, q3, q4, q5, q7, q8, q11 or q12.
        #[arg(long, default_value = "q0", required_unless_present = "all")]
        query: String,
        /// Run every query, engine and baseline, and print a table (or a JSON array).
        #[arg(long, conflicts_with = "baseline")]
        all: bool,
        /// Events to generate.
        #[arg(long, default_value_t = 10_000_000)]
        events: u64,
        /// Shards (and source subtasks); at most the number of cores.
        #[arg(long, default_value_t = 1)]
        parallelism: usize,
        /// Run the hand-written single-threaded baseline instead of the engine.
        #[arg(long)]
        baseline: bool,
        /// Events per second in all (event time follows it); unthrottled if absent.
        #[arg(long)]
        rate: Option<f64>,
        /// hashmap or rocksdb.
        #[arg(long, default_value = "hashmap", value_parser = ["hashmap", "heap", "rocksdb"])]
        state_backend: String,
        /// execution.buffer-timeout in milliseconds (0: flush every record).
        #[arg(long, default_value_t = 1)]
        buffer_timeout_ms: u64,
        /// The generator's seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Checkpoint the engine run every MS milliseconds (into a temporary directory,
        /// removed afterwards); the report adds the checkpoints' figures.
        #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
        checkpoint_interval_ms: Option<u64>,
        /// Set a further engine configuration key, e.g.
        /// -D state.backend.rocksdb.memory.write-back-ratio=0 (repeatable).
        #[arg(short = 'D', value_name = "KEY=VALUE")]
        settings: Vec<String>,
        /// Read the job's live figures every MS milliseconds during the run, as an executor
        /// does for its worker's /metrics (what scraping costs the job).
        #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
        scrape_ms: Option<u64>,
        /// Spread the engine run over N executors in this process, one slot each, with QUIC
        /// and mutual TLS on loopback between them (--parallelism N; with
        /// --checkpoint-interval-ms, the first executor coordinates the checkpoints).
        #[arg(long, value_name = "N", default_value_t = 1)]
        executors: usize,
        /// Print one JSON object (an array with --all).
        #[arg(long)]
        json: bool,
    },
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run {
            job,
            args,
            resume,
            from_savepoint,
            allow_non_restored_state,
            explain,
            explain_memory,
            quiet,
            config,
        } => {
            let config = config.load()?;
            let checkpointed = config.checkpointing()?.is_some();
            if explain_memory {
                print!("{}", memory_budget(&config)?);
                return Ok(());
            }
            let env = StreamEnvironment::new(config)?;
            let name = builtin::build(&env, job, &args)?;
            if explain {
                print!("{}", env.explain(name)?);
                return Ok(());
            }
            let options = RunOptions {
                progress: (!quiet).then_some(Duration::from_secs(1)),
                resume,
                from_savepoint,
                allow_non_restored_state,
                ..RunOptions::default()
            };
            // Before the job's threads start, so that they inherit the blocked signals.
            signals::stop_on_signals(name, checkpointed, &options)?;
            let result = env
                .execute_with(name, options)
                .with_context(|| format!("job '{name}' failed"))?;
            match &result.savepoint {
                Some(savepoint) => eprintln!(
                    "job '{name}' stopped with savepoint {} after {:.3} s; resume it with:\n  {}",
                    savepoint.display(),
                    result.duration.as_secs_f64(),
                    signals::resume_command(savepoint)
                ),
                None => eprintln!(
                    "job '{name}' finished in {:.3} s on {} shard(s)",
                    result.duration.as_secs_f64(),
                    env.slots()
                ),
            }
            if let Some(last) = result.restarts.last() {
                eprintln!(
                    "  restarted {} time(s) after task failures (counts below are the last \
                     run's); last cause: {}",
                    result.restarts.len(),
                    last.cause
                );
            }
            for op in &result.operators {
                eprintln!(
                    "  {:<28} in {:>12}  out {:>12}  backpressure waits {}",
                    op.name, op.records_in, op.records_out, op.backpressure_waits
                );
            }
            Ok(())
        }
        Command::Bench { bench } => run_bench(bench),
        Command::Config {
            reference: true, ..
        } => {
            print!("{}", weir_engine::config::reference());
            Ok(())
        }
        Command::Config { config, .. } => {
            let config = config.load()?;
            for (key, value, description) in config.describe() {
                println!("{key} = {value}\n    {description}");
            }
            Ok(())
        }
        Command::Control { config } => control_plane::serve(
            config.load()?,
            builtin::registry().info(),
            builtin::check_args,
        ),
        Command::Worker { control, config } => worker::serve(config.load()?, control),
        Command::Submit { .. }
        | Command::List { .. }
        | Command::Status { .. }
        | Command::Cancel { .. }
        | Command::Savepoint { .. }
        | Command::Stop { .. }
        | Command::Rescale { .. }
        | Command::Checkpoint {
            checkpoint: CheckpointCommand::Trigger { .. },
        } => unreachable!("main runs the API commands"),
        Command::Tune { .. } => unreachable!("main runs weir tune"),
        Command::Checkpoint {
            checkpoint: CheckpointCommand::Inspect { path, json },
        } => {
            let report =
                weir_engine::checkpoint::inspect::inspect(&path).map_err(anyhow::Error::msg)?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                print!("{report}");
            }
            if !report.problems.is_empty() {
                bail!(
                    "checkpoint {} in {} is damaged: {}",
                    report.checkpoint,
                    report.path.display(),
                    report.problems.join("; ")
                );
            }
            Ok(())
        }
    }
}

/// The memory budget of a worker with `config`: the slots it sets, else those the job would
/// run on (every available core). A slot count this machine cannot run is still explained, so
/// a bigger worker can be planned from here.
fn memory_budget(config: &Configuration) -> Result<weir_memory::WorkerBudget> {
    let slots = match config.slots() {
        Some(slots) => slots,
        None => StreamEnvironment::new(config.clone())?.slots(),
    };
    Ok(config.worker_budget(slots)?)
}

/// A size in bytes: `1g`, `256m`, `64kb`, `4096`.
fn parse_bytes(text: &str) -> Result<u64, String> {
    weir_engine::config::parse_size(text)
        .ok_or_else(|| format!("'{text}' is not a size; use bytes or a size such as 256m or 1g"))
}

/// A `--delivery-guarantee` clap checked against [`DeliveryGuarantee::NAMES`].
fn guarantee(name: &str) -> DeliveryGuarantee {
    DeliveryGuarantee::parse(name).expect("clap checks the name")
}

fn print_report<R: serde::Serialize + std::fmt::Debug>(report: &R, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        println!("{report:#?}");
    }
    Ok(())
}

fn run_bench(bench: Bench) -> Result<()> {
    match bench {
        Bench::Chain { records, json } => print_report(&weir_bench::chain::run(records)?, json),
        Bench::Submit { rounds, keys, json } => {
            print_report(&bench_submit::run(rounds.max(1), keys)?, json)
        }
        Bench::Coordinator { checkpoints, json } => {
            print_report(&bench_coordinator::run(checkpoints)?, json)
        }
        Bench::Control {
            jobs,
            slots_per_worker,
            seconds,
            json,
        } => print_report(&bench_control::run(jobs, slots_per_worker, seconds)?, json),
        Bench::Exchange {
            records,
            shards,
            settings,
            json,
        } => print_report(
            &weir_bench::exchange::run(records, shards, &settings)?,
            json,
        ),
        Bench::RemoteExchange {
            records,
            record_bytes,
            veth,
            settings,
            json,
        } => print_report(
            &weir_bench::exchange::run_remote(records, record_bytes, &settings, veth)?,
            json,
        ),
        Bench::Net {
            bytes,
            segment_size,
            channels,
            credits,
            veth,
            json,
        } => print_report(
            &weir_bench::net::run(bytes, segment_size as usize, channels, credits, veth)?,
            json,
        ),
        Bench::Window {
            kind,
            records,
            keys,
            json,
        } => {
            let kind = kind.parse().map_err(anyhow::Error::msg)?;
            print_report(&weir_bench::window::run(kind, records, keys)?, json)
        }
        Bench::State {
            backend,
            keys,
            ops,
            write_back_ratio,
            json,
        } => {
            let backend = backend.parse().map_err(anyhow::Error::msg)?;
            let report = weir_bench::state::run(backend, write_back_ratio, keys, ops)?;
            print_report(&report, json)
        }
        Bench::Join {
            backend,
            records,
            keys,
            bound_ms,
            checkpoint_interval_ms,
            json,
        } => {
            let backend = backend.parse().map_err(anyhow::Error::msg)?;
            let report =
                weir_bench::join::run(backend, records, keys, bound_ms, checkpoint_interval_ms)?;
            print_report(&report, json)
        }
        Bench::FileSink {
            records,
            checkpoint_interval_ms,
            dir,
            delivery_guarantee,
            json,
        } => {
            let guarantee = guarantee(&delivery_guarantee);
            let report =
                weir_bench::file_sink::run(records, checkpoint_interval_ms, guarantee, &dir)?;
            print_report(&report, json)
        }
        Bench::Postgres {
            url,
            records,
            checkpoint_interval_ms,
            delivery_guarantee,
            upsert,
            json,
        } => {
            let mode = weir_bench::postgres::SinkMode {
                guarantee: guarantee(&delivery_guarantee),
                upsert,
            };
            let report = weir_bench::postgres::run(&url, records, checkpoint_interval_ms, mode)?;
            print_report(&report, json)
        }
        Bench::Checkpoint {
            backend,
            state_bytes,
            value_bytes,
            interval_ms,
            rounds,
            dir,
            json,
        } => {
            let options = weir_bench::checkpoint::CheckpointBenchOptions {
                backend: backend.parse().map_err(anyhow::Error::msg)?,
                state_bytes,
                value_bytes,
                interval: std::time::Duration::from_millis(interval_ms),
                rounds,
                dir,
            };
            print_report(&weir_bench::checkpoint::run(&options)?, json)
        }
        Bench::Nexmark {
            query,
            all,
            events,
            parallelism,
            baseline,
            rate,
            state_backend,
            buffer_timeout_ms,
            seed,
            checkpoint_interval_ms,
            settings,
            scrape_ms,
            executors,
            json,
        } => {
            use weir_bench::nexmark::harness;
            let options = harness::NexmarkOptions {
                query: query.parse().map_err(anyhow::Error::msg)?,
                events,
                parallelism,
                rate,
                state_backend,
                buffer_timeout_ms,
                seed,
                checkpoint_interval_ms,
                settings,
                scrape_ms,
                executors,
            };
            if all {
                let rows = harness::run_suite(&options)?;
                if json {
                    println!("{}", serde_json::to_string(&rows)?);
                } else {
                    print!("{}", harness::suite_table(&rows));
                }
                Ok(())
            } else if baseline {
                print_report(&harness::run_baseline(&options)?, json)
            } else {
                print_report(&harness::run_engine(&options)?, json)
            }
        }
    }
}

mod bench_control;
mod bench_coordinator;
mod bench_submit;
mod builtin;
mod client;
mod control_plane;
mod endpoint;
mod exposition;
mod notify;
mod protocol;
mod signals;
mod tune;
mod worker;

/// How long `weir savepoint`, `stop`, `rescale` and `checkpoint trigger` wait for their
/// result.
const OPERATION_LIMIT: Duration = Duration::from_secs(15 * 60);

/// Runs the commands that are clients of the REST API, with their own exit codes
/// ([`client`]); `None` for the others.
fn api_command(command: &Command) -> Option<ExitCode> {
    let (api, request) = match command {
        Command::Submit {
            job,
            args,
            jar,
            parallelism,
            from_savepoint,
            allow_non_restored_state,
            api,
        } => {
            let mut body = serde_json::json!({
                "entryClass": job,
                "programArgsList": args,
                "parallelism": parallelism,
                "allowNonRestoredState": allow_non_restored_state,
            });
            if let Some(path) = from_savepoint {
                let path = std::path::absolute(path).unwrap_or_else(|_| path.clone());
                body["savepointPath"] = path.display().to_string().into();
            }
            (api, ("POST", format!("/jars/{jar}/run"), Some(body)))
        }
        Command::List { api, .. } => (api, ("GET", "/jobs/overview".to_string(), None)),
        Command::Status { job, api } => (api, ("GET", format!("/jobs/{job}"), None)),
        Command::Cancel { job, api } => (api, ("PATCH", format!("/jobs/{job}?mode=cancel"), None)),
        Command::Savepoint { job, api } => (
            api,
            (
                "POST",
                format!("/jobs/{job}/savepoints"),
                Some(serde_json::json!({})),
            ),
        ),
        Command::Checkpoint {
            checkpoint: CheckpointCommand::Trigger { job, api },
        } => (
            api,
            (
                "POST",
                format!("/jobs/{job}/checkpoints"),
                Some(serde_json::json!({})),
            ),
        ),
        Command::Stop { job, drain, api } => (
            api,
            (
                "POST",
                format!("/jobs/{job}/stop"),
                Some(serde_json::json!({ "drain": drain })),
            ),
        ),
        Command::Rescale {
            job,
            parallelism,
            api,
        } => (
            api,
            (
                "POST",
                format!("/jobs/{job}/rescaling?parallelism={parallelism}"),
                None,
            ),
        ),
        _ => return None,
    };
    let client = match api.client() {
        Ok(client) => client,
        Err(error) => {
            eprintln!("error: {error:#}");
            return Some(ExitCode::from(2));
        }
    };
    let (method, path, body) = request;
    let answer = client
        .call(method, &path, body.as_ref())
        .and_then(|answer| {
            let more = match command {
                Command::Status { job, .. } if !api.json => {
                    client.call("GET", &format!("/jobs/{job}/exceptions"), None)?
                }
                // Asynchronous operations: wait for their result.
                Command::Savepoint { job, .. } | Command::Stop { job, .. } => {
                    let request = answer["request-id"].as_str().unwrap_or_default();
                    client.wait_for(
                        job,
                        &format!("/jobs/{job}/savepoints/{request}"),
                        OPERATION_LIMIT,
                    )?
                }
                Command::Rescale { job, .. } => {
                    let request = answer["request-id"].as_str().unwrap_or_default();
                    client.wait_for(
                        job,
                        &format!("/jobs/{job}/rescaling/{request}"),
                        OPERATION_LIMIT,
                    )?
                }
                Command::Checkpoint {
                    checkpoint: CheckpointCommand::Trigger { job, .. },
                } => {
                    let request = answer["request-id"].as_str().unwrap_or_default();
                    client.wait_for(
                        job,
                        &format!("/jobs/{job}/checkpoints/{request}"),
                        OPERATION_LIMIT,
                    )?
                }
                _ => serde_json::Value::Null,
            };
            Ok((answer, more))
        });
    match answer {
        Ok((answer, more)) => {
            let location = more["operation"]["location"].as_str().map(str::to_string);
            if let Some(cause) = more["operation"]["failure-cause"]["stack-trace"].as_str() {
                if api.json {
                    println!("{more}");
                }
                eprintln!("error: {cause}");
                return Some(ExitCode::FAILURE);
            }
            if api.json {
                match more {
                    serde_json::Value::Null => println!("{answer}"),
                    _ => println!("{more}"),
                }
            } else {
                match command {
                    Command::Submit { .. } => println!(
                        "Job has been submitted with JobID {}",
                        answer["jobid"].as_str().unwrap_or("?")
                    ),
                    Command::List { all, .. } => print!("{}", client::jobs_table(&answer, *all)),
                    Command::Status { .. } => print!("{}", client::job_text(&answer, &more)),
                    Command::Cancel { job, .. } => println!("Cancelling job {job}"),
                    Command::Savepoint { .. } | Command::Stop { .. } => println!(
                        "Savepoint completed. Path: {}",
                        location.unwrap_or_default()
                    ),
                    Command::Checkpoint { .. } => println!(
                        "Checkpoint {} completed. Path: {}",
                        more["operation"]["checkpointId"],
                        location.unwrap_or_default()
                    ),
                    Command::Rescale {
                        job, parallelism, ..
                    } => println!(
                        "Job {job} rescaled to parallelism {parallelism} from savepoint {}",
                        location.unwrap_or_default()
                    ),
                    _ => {}
                }
            }
            Some(ExitCode::SUCCESS)
        }
        Err(failure) => {
            eprintln!("error: {}", failure.message);
            Some(failure.code)
        }
    }
}

fn main() -> ExitCode {
    // Before any shard starts (see weir_memory::disable_transparent_huge_pages); the engine
    // runs without huge pages too, so a kernel without the setting gets a warning, not an error.
    let huge_pages = weir_memory::disable_transparent_huge_pages();
    let format = match log_format() {
        Ok(format) => format,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    // The processes this one starts (a worker's executors) log alike. Set while this process
    // has one thread.
    std::env::set_var(logging::FORMAT_VARIABLE, format.name());
    logging::init(format);
    if let Err(error) = huge_pages {
        tracing::warn!("could not turn transparent huge pages off for this process: {error}");
    }
    if let Some(code) = weir_engine::package::run_if_asked(&builtin::registry()) {
        return code;
    }
    let cli = Cli::parse();
    if let Some(code) = api_command(&cli.command) {
        return code;
    }
    if let Command::Tune { tune } = &cli.command {
        return tune::run(tune);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
