//! Configuration: one set of Flink-style keys, read from a TOML file, the environment
//! (`WEIR_` + the key upper-cased with `.` and `-` as `_`) and `-D key=value` flags.
//!
//! Every key is declared in [`OPTIONS`] with its type, default and meaning; an unknown key or
//! a value that does not parse is refused with a message naming the key, the value and the fix.
//! Configuration is passed explicitly, never read from a global.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use weir_memory::{MemoryConfig, RocksDbMemoryRatios, WorkerBudget};
use weir_state::BackendType;

use crate::checkpoint::restart::{ExponentialDelay, RestartStrategy};
use crate::connector::{DeliveryGuarantee, RollingPolicy, SinkSettings};

/// A setting that cannot be used.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum ConfigError {
    /// The key is not one Weir knows.
    #[error("unknown config key '{key}'{}; `weir config` lists every key", suggestion.as_ref().map(|s| format!(" (did you mean '{s}'?)")).unwrap_or_default())]
    UnknownKey {
        /// The key as written.
        key: String,
        /// The closest known key, if one is close.
        suggestion: Option<String>,
    },
    /// The value does not parse or is out of range.
    #[error("config key '{key}' has invalid value '{value}': expected {expected}")]
    InvalidValue {
        /// The key.
        key: String,
        /// The value as written.
        value: String,
        /// What a valid value looks like.
        expected: String,
    },
    /// The configuration file cannot be read or parsed.
    #[error("cannot read config file {path}: {message}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
}

impl From<weir_memory::MemoryConfigError> for ConfigError {
    fn from(error: weir_memory::MemoryConfigError) -> ConfigError {
        let weir_memory::MemoryConfigError::Invalid { key, value, fix } = error;
        ConfigError::InvalidValue {
            key: key.into(),
            value,
            expected: fix,
        }
    }
}

/// The type of a configuration value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptionKind {
    /// A whole number of at least the given minimum.
    Count(u64),
    /// A whole number in the given inclusive range.
    Range(u64, u64),
    /// A duration such as `1 ms`, `200ms`, `10 s`, `0`.
    Duration,
    /// A size such as `1728m`, `32kb`, `1 gb`.
    Size,
    /// A fraction in `[0, 1]`.
    Fraction,
    /// A decimal number of at least 1, e.g. `1.5`.
    Factor,
    /// `true` or `false`.
    Bool,
    /// A comma-separated list of CPU core ids, e.g. `0,1,2`.
    CoreList,
    /// One of the listed words.
    Choice(&'static [&'static str]),
    /// A filesystem path (not empty).
    Path,
    /// A word without spaces (a host name, a token).
    Text,
}

/// One known configuration key.
#[derive(Debug)]
pub struct ConfigOption {
    /// The key.
    pub key: &'static str,
    /// Its type.
    pub kind: OptionKind,
    /// The default, as text; empty means "derived at start-up" (see the description).
    pub default: &'static str,
    /// What it controls.
    pub description: &'static str,
}

macro_rules! option {
    ($key:literal, $kind:expr, $default:literal, $description:literal) => {
        ConfigOption {
            key: $key,
            kind: $kind,
            default: $default,
            description: $description,
        }
    };
}

/// `table.optimizer.agg-phase-strategy` (Flink's names): whether a window aggregate behind a
/// `key_by` pre-aggregates on the sending shard (see `window::two_phase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AggPhaseStrategy {
    /// Two phases where the exchange may cross shards (either side's parallelism above 1);
    /// with one subtask on each side the exchange is chained and a local phase only adds work.
    Auto,
    /// Always one phase: every record crosses the exchange.
    OnePhase,
    /// Two phases wherever the result cannot differ.
    TwoPhase,
}

/// What `execution.checkpointing.*` configures, when checkpointing is on.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointConfig {
    /// `execution.checkpointing.dir`: checkpoints go to `<dir>/<job name>/`.
    pub dir: PathBuf,
    /// `execution.checkpointing.mode`: aligned barriers (else at-least-once).
    pub exactly_once: bool,
    /// When checkpoints are triggered, time out and fail the job.
    pub settings: crate::checkpoint::CheckpointSettings,
    /// `execution.checkpointing.num-retained`.
    pub retained: usize,
    /// `execution.checkpointing.incremental` (RocksDB files, window deltas).
    pub incremental: bool,
    /// `execution.checkpointing.savepoint-dir`: where savepoints go (`None`: into
    /// `<dir>/<job name>/savepoints/`).
    pub savepoint_dir: Option<PathBuf>,
    /// `execution.checkpointing.unaligned.enabled`: checkpoints go unaligned after
    /// `execution.checkpointing.aligned-checkpoint-timeout` (the value; zero: at once).
    pub unaligned: Option<std::time::Duration>,
}

/// What the exchange between workers is configured with ([`Configuration::exchange`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ExchangeConfig {
    /// `taskmanager.host`, if set.
    pub host: Option<String>,
    /// `taskmanager.data.port`: the worker's first slot's port.
    pub port: u16,
    /// `security.ssl.internal.dir`, if set.
    pub tls_dir: Option<PathBuf>,
    /// `security.ssl.internal.node`, if set.
    pub node: Option<String>,
    /// `taskmanager.network.connect-timeout`.
    pub connect_timeout: Duration,
    /// `taskmanager.network.idle-timeout`.
    pub idle_timeout: Duration,
    /// `taskmanager.network.udp.receive-buffer`, bytes.
    pub udp_receive_buffer: usize,
    /// `taskmanager.network.udp.send-buffer`, bytes.
    pub udp_send_buffer: usize,
}

impl ExchangeConfig {
    /// The cluster CA's certificate, this node's certificate and its key, in the TLS
    /// directory (`weir tune certs`' names).
    pub fn tls_files(dir: &Path, node: &str) -> [PathBuf; 3] {
        [
            dir.join("ca.pem"),
            dir.join(format!("{node}.pem")),
            dir.join(format!("{node}-key.pem")),
        ]
    }
}

/// Every key Weir reads.
pub const OPTIONS: &[ConfigOption] = &[
    option!("taskmanager.numberOfTaskSlots", OptionKind::Count(1), "",
        "Shards (= slots = pinned cores) of the worker. Default: every available core."),
    option!("taskmanager.cpu.cores", OptionKind::CoreList, "",
        "CPU core ids the shards are pinned to, in shard order. Default: the available cores."),
    option!("parallelism.default", OptionKind::Count(1), "",
        "Parallelism of operators that set none. Default: the number of slots."),
    option!("pipeline.max-parallelism", OptionKind::Range(1, 32768), "128",
        "Number of key groups; the upper bound of any keyed operator's parallelism."),
    option!("pipeline.auto-watermark-interval", OptionKind::Duration, "200 ms",
        "How often sources emit periodic watermarks (0 turns periodic emission off)."),
    option!("metrics.latency.interval", OptionKind::Duration, "0 ms",
        "How often each source subtask sends a latency marker down the job (Flink's key); sinks show how long markers took to reach them (weir_operator_latency_seconds). 0 (the default, as in Flink) sends none."),
    option!("pipeline.operator-chaining.enabled", OptionKind::Bool, "true",
        "Chain operators connected by forward edges with equal parallelism into one task."),
    option!("execution.buffer-timeout", OptionKind::Duration, "1 ms",
        "Longest time a partly filled network segment waits before it is sent; 0 sends per record."),
    option!("execution.batch-size", OptionKind::Count(1), "256",
        "Records handed between chained operators in one call."),
    option!("table.optimizer.agg-phase-strategy", OptionKind::Choice(&["AUTO", "TWO_PHASE", "ONE_PHASE"]), "AUTO",
        "Window aggregates behind a key_by pre-aggregate per key and pane on the sending shard where the result cannot differ: TWO_PHASE always, AUTO where the exchange may cross shards (a parallelism above 1 on either side), ONE_PHASE never."),
    option!("taskmanager.memory.process.size", OptionKind::Size, "",
        "Total memory of the worker process, split into managed, network and heap shares. Default: 1728m (Flink's TaskManager default) for up to 2 slots, 864m per slot beyond, at most three quarters of the host's memory."),
    option!("taskmanager.memory.managed.fraction", OptionKind::Fraction, "0.4",
        "Share of the process size for state backends."),
    option!("taskmanager.memory.network.fraction", OptionKind::Fraction, "0.1",
        "Share of the process size for network segments."),
    option!("taskmanager.memory.network.min", OptionKind::Size, "64m",
        "Lower bound of the network share."),
    option!("taskmanager.memory.network.max", OptionKind::Size, "1g",
        "Upper bound of the network share."),
    option!("taskmanager.memory.segment-size", OptionKind::Size, "32kb",
        "Size of one network segment."),
    option!("taskmanager.network.memory.buffers-per-channel", OptionKind::Count(1), "16",
        "Credits per exchange channel: segments a sender may have in flight to a receiver on another shard, batches to one on its own shard (rounded up to a power of two)."),
    option!("taskmanager.shard.spin-before-park", OptionKind::Duration, "1 ms",
        "How long an idle shard spins before it sleeps; shorter saves CPU, longer cuts wake-up latency."),
    option!("sink.delivery-guarantee", OptionKind::Choice(&DeliveryGuarantee::NAMES), "exactly-once",
        "What transactional sinks (the file sink) promise when the job fails and recovers, unless a sink sets its own: exactly-once commits output when the checkpoint after it completes (at the job's end without checkpointing); at-least-once commits at every barrier, so records replayed after a failure are written again; none commits as files roll and at the end."),
    option!("sink.rolling-policy.file-size", OptionKind::Size, "128m",
        "The file sink rolls a part file (closes it, and starts the next) once it holds this much; parts also roll at every checkpoint barrier."),
    option!("sink.rolling-policy.rollover-interval", OptionKind::Duration, "60 s",
        "The file sink rolls a part file open this long."),
    option!("sink.rolling-policy.inactivity-interval", OptionKind::Duration, "60 s",
        "The file sink rolls a part file not written to for this long (checked when the next records come)."),
    option!("sink.postgres.max-transaction-size", OptionKind::Size, "64m",
        "The PostgreSQL sink prepares a transaction holding this many bytes of rows without waiting for a barrier (committed with the next checkpoint; at once without exactly-once), so that none grows without bound."),
    option!("sink.postgres.transaction-marker-retention", OptionKind::Duration, "7 d",
        "The PostgreSQL sink keeps a row per committed transaction in weir_sink_transactions this long, so that a restore recommitting it can tell it committed from rolled back outside Weir; a restore of a checkpoint or savepoint older than this takes a transaction it no longer finds as committed (and says so in the log). 0 keeps them."),
    option!("execution.checkpointing.interval", OptionKind::Duration, "0",
        "Time between checkpoints (Flink's name); 0 turns checkpointing off."),
    option!("execution.checkpointing.dir", OptionKind::Path, "",
        "Directory of the checkpoints (`<dir>/<job name>/chk-<n>/`); a local directory or a shared mount. Needed when checkpointing is on."),
    option!("execution.checkpointing.savepoint-dir", OptionKind::Path, "",
        "Directory savepoints go to (`<dir>/savepoint-<job>-<n>-<time>/`, self-contained, never deleted by Weir); default `<execution.checkpointing.dir>/<job name>/savepoints`."),
    option!("execution.checkpointing.mode", OptionKind::Choice(&["EXACTLY_ONCE", "AT_LEAST_ONCE"]), "EXACTLY_ONCE",
        "EXACTLY_ONCE aligns barriers (a task holds an input channel after its barrier until every channel delivered it); AT_LEAST_ONCE does not align, so records after a barrier may be counted again after a restore."),
    option!("execution.checkpointing.unaligned.enabled", OptionKind::Bool, "false",
        "Unaligned checkpoints (EXACTLY_ONCE only): a barrier overtakes the data queued in the channels, the task snapshots at once, and that in-flight data goes into the checkpoint and is replayed on restore, so a checkpoint completes in bounded time under backpressure. Savepoints are always aligned. Needs execution.checkpointing.max-concurrent-checkpoints 1; a checkpoint with in-flight data restores only at the parallelism it was taken at."),
    option!("execution.checkpointing.aligned-checkpoint-timeout", OptionKind::Duration, "0",
        "With unaligned checkpoints: how long a task's barriers align before its checkpoint goes unaligned (0: unaligned at once)."),
    option!("execution.checkpointing.timeout", OptionKind::Duration, "10 min",
        "A checkpoint not completed this long after its trigger is aborted."),
    option!("execution.checkpointing.min-pause", OptionKind::Duration, "0",
        "Least time from the end of one checkpoint to the trigger of the next."),
    option!("execution.checkpointing.max-concurrent-checkpoints", OptionKind::Count(1), "1",
        "Most checkpoints in progress at once."),
    option!("execution.checkpointing.tolerable-failed-checkpoints", OptionKind::Range(0, 1_000_000), "0",
        "Checkpoint failures in a row (expired or declined) the job tolerates before it fails."),
    option!("execution.checkpointing.num-retained", OptionKind::Count(1), "1",
        "Completed checkpoints kept on disk; older ones are deleted."),
    option!("execution.checkpointing.incremental", OptionKind::Bool, "true",
        "A checkpoint writes only what changed since the last one and lists the rest again (shared files, deleted once no retained checkpoint lists them): RocksDB the SST files no earlier checkpoint of the instance wrote; tumbling, sliding, session and count windows (either backend) the keys that changed, as a delta over a full snapshot written now and then. false writes everything each time. Other heap state is always written whole."),
    option!("restart-strategy.type", OptionKind::Choice(&["none", "off", "disable", "fixed-delay", "fixeddelay", "failure-rate", "failurerate", "exponential-delay", "exponentialdelay"]), "",
        "What happens when a task fails (Flink's strategies): the job's tasks restart from the latest completed checkpoint (from the start without checkpointing) after a delay, until the strategy gives up and the job fails. Default: exponential-delay when checkpointing is on, none otherwise."),
    option!("restart-strategy.fixed-delay.attempts", OptionKind::Count(0), "1",
        "fixed-delay: restarts before the job fails."),
    option!("restart-strategy.fixed-delay.delay", OptionKind::Duration, "1 s",
        "fixed-delay: wait before each restart."),
    option!("restart-strategy.failure-rate.max-failures-per-interval", OptionKind::Count(1), "1",
        "failure-rate: failures within the interval before the job fails."),
    option!("restart-strategy.failure-rate.failure-rate-interval", OptionKind::Duration, "1 min",
        "failure-rate: the interval failures are counted in."),
    option!("restart-strategy.failure-rate.delay", OptionKind::Duration, "1 s",
        "failure-rate: wait before each restart."),
    option!("restart-strategy.exponential-delay.initial-backoff", OptionKind::Duration, "1 s",
        "exponential-delay: wait before the first restart."),
    option!("restart-strategy.exponential-delay.max-backoff", OptionKind::Duration, "1 min",
        "exponential-delay: the longest wait."),
    option!("restart-strategy.exponential-delay.backoff-multiplier", OptionKind::Factor, "1.5",
        "exponential-delay: each wait is this many times the one before."),
    option!("restart-strategy.exponential-delay.reset-backoff-threshold", OptionKind::Duration, "1 h",
        "exponential-delay: running this long without a failure starts again from the initial backoff."),
    option!("restart-strategy.exponential-delay.jitter-factor", OptionKind::Fraction, "0.1",
        "exponential-delay: each wait moves by up to this share of itself either way, so jobs failing together do not restart together."),
    option!("restart-strategy.exponential-delay.attempts-before-reset-backoff", OptionKind::Count(1), "",
        "exponential-delay: restarts without a reset before the job fails. Default: unlimited."),
    option!("rest.address", OptionKind::Text, "localhost",
        "Address the control plane's REST API binds to and clients (the CLI, workers) connect to; localhost unless the control plane should be reachable from other hosts."),
    option!("rest.port", OptionKind::Range(0, 65535), "8081",
        "Port of the control plane's REST API (Flink's default); 0 takes a free port, which `weir control` prints."),
    option!("rest.auth.token", OptionKind::Text, "",
        "When set, every request to the control plane (REST and workers) must carry `Authorization: Bearer <token>`; others get 401. Default: no token."),
    option!("security.ssl.rest.enabled", OptionKind::Bool, "false",
        "Mutual TLS on the control plane's port, its REST API and the workers' links (Flink's key): the control plane presents its node's certificate from security.ssl.internal.dir and serves only a client presenting one the cluster CA signed; set it on the workers and for the CLI too, which then present theirs and accept only a control plane certified for the host they dial (`weir tune certs --node NAME=HOST`). Default: plain HTTP."),
    option!("web.upload.enabled", OptionKind::Bool, "false",
        "Whether the control plane takes job packages over POST /jars/upload (Flink's key). Off by default: a package is a program the workers run."),
    option!("rest.server.max-content-length", OptionKind::Size, "100m",
        "The largest request body the control plane takes, an uploaded package included (Flink's key)."),
    option!("heartbeat.interval", OptionKind::Duration, "10 s",
        "How often a worker and the control plane tell each other they are alive."),
    option!("heartbeat.timeout", OptionKind::Duration, "50 s",
        "A worker not heard from this long is lost: its jobs fail over (restart from their latest checkpoint on free slots); a worker that does not hear from the control plane this long reconnects. After a control plane restart, a running job that no worker reports within this time is restarted."),
    option!("metrics.reporter.prom.host", OptionKind::Text, "0.0.0.0",
        "Address a worker serves its Prometheus `/metrics` on (every interface by default, as Flink's reporter)."),
    option!("metrics.reporter.prom.port", OptionKind::Range(0, 65535), "9249",
        "Port of a worker's Prometheus `/metrics` (Flink's reporter port); 0 takes a free port, which `weir worker` prints. The control plane serves its own on its REST port."),
    option!("slot.request.timeout", OptionKind::Duration, "5 min",
        "A submitted or restarting job waits this long for enough free slots (on one worker, or over the workers with a certificate: security.ssl.internal.dir) before it fails."),
    option!("control.data-dir", OptionKind::Path, "/var/lib/weir/control",
        "Where the control plane keeps its durable store: submitted jobs, their state and their checkpoint directories' places (written atomically; a restarted control plane resumes the jobs it finds there)."),
    option!("worker.data-dir", OptionKind::Path, "/var/lib/weir/worker",
        "Where a worker keeps each deployment's descriptor and its executor's log (`<dir>/deployments/<job id>-<attempt>/`)."),
    option!("worker.shutdown.mode", OptionKind::Choice(&["savepoint", "cancel"]), "savepoint",
        "What a worker does with its jobs on SIGTERM (`systemctl stop`). 'savepoint': the control plane stops each checkpointed job with a savepoint and starts it again from it on other slots (or on this worker once it is back), losing and repeating nothing; a job without checkpoints is cancelled and restarts as its restart strategy says. 'cancel': every job is cancelled at once and restarts as after a failure (from its latest checkpoint elsewhere, as its restart strategy allows). Without a control plane to hand its jobs to, a worker cancels them."),
    option!("worker.shutdown.timeout", OptionKind::Duration, "5 min",
        "How long a worker's SIGTERM may take to stop its jobs with savepoints; jobs still running then are cancelled (and killed 30 s later). The worker extends systemd's stop timeout to cover it (EXTEND_TIMEOUT_USEC)."),
    option!("taskmanager.host", OptionKind::Text, "",
        "Address other workers reach this worker's slots at for a job spread over several workers (each slot's exchange endpoint binds it). Default: the address the control plane sees the worker connect from."),
    option!("taskmanager.data.port", OptionKind::Range(1, 65535), "6121",
        "First UDP port of the worker's exchange endpoints: slot i of the worker listens on this port + i while a job spread over several workers runs there. Workers on one host need ranges of their own (the control plane keeps a worker whose range overlaps another's out of jobs over several workers, saying why)."),
    option!("security.ssl.internal.dir", OptionKind::Path, "",
        "Directory with the cluster CA's certificate `ca.pem` and this node's certificate `<node>.pem` and key `<node>-key.pem`, as `weir tune certs` writes them: the mutual TLS of the exchange between workers. A worker without it runs only jobs that fit its own slots."),
    option!("security.ssl.internal.node", OptionKind::Text, "",
        "The name this worker's certificate was issued for (`weir tune certs --node NAME`); peers check it. Default: the host name."),
    option!("taskmanager.network.connect-timeout", OptionKind::Duration, "2 min",
        "Set on workers: how long a slot retries a slot on another worker that does not answer yet (its executor may start later: it covers the workers' start skew, a package download included); a channel no sender opened within twice this fails."),
    option!("taskmanager.network.idle-timeout", OptionKind::Duration, "30 s",
        "Set on workers: a connection between two workers' slots that hears nothing for this long (keep-alives go at a third of it) is lost, and the job fails over."),
    option!("taskmanager.network.udp.receive-buffer", OptionKind::Size, "8m",
        "Set on workers: the receive buffer of each exchange endpoint's UDP socket; the kernel caps it at net.core.rmem_max (the worker warns when that is smaller)."),
    option!("taskmanager.network.udp.send-buffer", OptionKind::Size, "8m",
        "Set on workers: the send buffer of each exchange endpoint's UDP socket; the kernel caps it at net.core.wmem_max (the worker warns when that is smaller)."),
    option!("cluster.evenly-spread-out-slots", OptionKind::Bool, "false",
        "How the control plane places a job's slots (Flink's key): false packs them on the fewest workers (one worker when one has enough free slots, else the workers with a certificate, those with the most free slots first); true deals them one at a time round the workers with a certificate (security.ssl.internal.dir) and free slots, falling back to one worker when they have too few. A checkpointed job over several workers needs its checkpoint directory on storage every worker sees at one path."),
    option!("state.backend.type", OptionKind::Choice(&["hashmap", "heap", "rocksdb"]), "hashmap",
        "Where keyed state lives: typed maps on the heap ('hashmap', also 'heap') or RocksDB, one instance per keyed operator subtask in its slot's memory ('rocksdb')."),
    option!("state.backend.rocksdb.localdir", OptionKind::Path, "",
        "Directory for the slots' RocksDB working files (a job's files are removed when it ends; those a killed process left, by the next job opening RocksDB there). Default: the system temp directory."),
    option!("state.backend.rocksdb.memory.write-buffer-ratio", OptionKind::Fraction, "0.5",
        "Share of a slot's managed memory RocksDB's memtables may take (charged to its block cache)."),
    option!("state.backend.rocksdb.memory.write-back-ratio", OptionKind::Fraction, "0.25",
        "Share of a slot's managed memory for the write-back cache of value, reducing and aggregating state (window accumulators) in front of RocksDB; written back on eviction and before every snapshot; 0 turns it off. The block cache gets the rest."),
];

/// Rules beyond one key's type and range: the keys each concerns and what it asks. Listed in
/// the reference; [`Configuration::check`] enforces every one.
pub const RULES: [(&[&str], &str); 6] = [
    (
        &["heartbeat.interval", "heartbeat.timeout"],
        "The interval is above 0 and the timeout longer than it.",
    ),
    (
        &["execution.checkpointing.dir", "execution.checkpointing.interval"],
        "A checkpoint directory is set whenever the interval is above 0.",
    ),
    (
        &[
            "execution.checkpointing.unaligned.enabled",
            "execution.checkpointing.mode",
            "execution.checkpointing.max-concurrent-checkpoints",
        ],
        "With checkpointing on, unaligned checkpoints only with the mode EXACTLY_ONCE and one checkpoint at a time.",
    ),
    (
        &[
            "taskmanager.memory.managed.fraction",
            "taskmanager.memory.network.fraction",
        ],
        "Managed below 1, network above 0, and the two together below 0.9: the heap keeps a tenth at least.",
    ),
    (
        &[
            "taskmanager.memory.network.min",
            "taskmanager.memory.network.max",
            "taskmanager.memory.segment-size",
        ],
        "The network minimum at most its maximum; the segment size a power of two, 4kb at least.",
    ),
    (
        &[
            "state.backend.rocksdb.memory.write-buffer-ratio",
            "state.backend.rocksdb.memory.write-back-ratio",
        ],
        "The write-buffer ratio above 0, the write-back ratio below 1, and the two together below 1 (memtables are charged to the block cache the write-back cache leaves).",
    ),
];

fn option(key: &str) -> Option<&'static ConfigOption> {
    OPTIONS.iter().find(|o| o.key == key)
}

/// Parses `1 ms`, `250us`, `2s`, `1 min`, `1 h`, `0`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    let nanos = match unit.trim() {
        "" if number == 0 => 0,
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        _ => return None,
    };
    Some(Duration::from_nanos(number.checked_mul(nanos)?))
}

/// Parses `1728m`, `32kb`, `1 gb`, `4096` (bytes).
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim().to_ascii_lowercase();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    let shift = match unit.trim() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    number.checked_mul(1u64 << shift)
}

fn parse_core_list(text: &str) -> Option<Vec<usize>> {
    let cores: Option<Vec<usize>> = text.split(',').map(|c| c.trim().parse().ok()).collect();
    cores.filter(|c| !c.is_empty())
}

fn validate(option: &ConfigOption, value: &str) -> Result<(), ConfigError> {
    let ok = match option.kind {
        OptionKind::Count(min) => value.trim().parse::<u64>().is_ok_and(|v| v >= min),
        OptionKind::Range(min, max) => value
            .trim()
            .parse::<u64>()
            .is_ok_and(|v| (min..=max).contains(&v)),
        OptionKind::Duration => parse_duration(value).is_some(),
        OptionKind::Size => parse_size(value).is_some(),
        OptionKind::Fraction => value
            .trim()
            .parse::<f64>()
            .is_ok_and(|v| (0.0..=1.0).contains(&v)),
        OptionKind::Factor => value.trim().parse::<f64>().is_ok_and(|v| v >= 1.0),
        OptionKind::Bool => matches!(value.trim(), "true" | "false"),
        OptionKind::CoreList => parse_core_list(value).is_some(),
        OptionKind::Choice(words) => words.contains(&value.trim()),
        OptionKind::Path => !value.trim().is_empty(),
        OptionKind::Text => !value.is_empty() && !value.contains(char::is_whitespace),
    };
    if ok {
        return Ok(());
    }
    Err(ConfigError::InvalidValue {
        key: option.key.to_string(),
        value: value.to_string(),
        expected: option.kind.expected(),
    })
}

impl OptionKind {
    /// What a valid value looks like: what a refused value's message and the configuration
    /// reference say.
    pub fn expected(&self) -> String {
        match *self {
            OptionKind::Count(min) => format!("a whole number of at least {min}"),
            OptionKind::Range(min, max) => format!("a whole number from {min} to {max}"),
            OptionKind::Duration => "a duration: a whole number and one of ns, us, ms, s, min, h, \
                                     d, such as '200ms', '10 s' or '7 d', or '0'"
                .into(),
            OptionKind::Size => "a size such as '1728m', '32kb' or '1 gb'".into(),
            OptionKind::Fraction => "a fraction between 0 and 1, e.g. 0.1".into(),
            OptionKind::Factor => "a number of at least 1, e.g. 1.5".into(),
            OptionKind::Bool => "true or false".into(),
            OptionKind::CoreList => "a comma-separated list of core ids, e.g. 0,1".into(),
            OptionKind::Choice(words) => format!("one of {}", words.join(", ")),
            OptionKind::Path => "a directory path".into(),
            OptionKind::Text => "a word without spaces".into(),
        }
    }
}

/// The configuration reference (`docs/configuration.md`): every key of [`OPTIONS`], in its
/// order, with what it accepts, its default and its meaning. `weir config --reference`
/// prints it; a test fails when the file and this differ.
pub fn reference() -> String {
    use std::fmt::Write;
    let cell = |text: &str| text.replace('|', "\\|");
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from `OPTIONS` in `engine/src/config.rs` by `weir config --reference > \
         docs/configuration.md`; a test fails when they differ, so change the code, then \
         regenerate.\n\n\
         Weir reads Flink's keys where Flink has one. Every process (`weir run`, `weir \
         control`, `weir worker`, …) takes them from a TOML file (`-c FILE`: a key as a \
         dotted name, or as nested tables), then the environment (`WEIR_<KEY>`: the key \
         upper-cased, `.` and `-` as `_`), then `-D key=value` flags, each overriding the \
         one before. A key Weir does not know (in the file or a flag), or a value it does \
         not accept, stops the process at start with a message naming the key, the value and what it accepts. \
         `weir config` prints every key with the value it takes. A default of — is derived \
         at start, as its meaning says.\n\n\
         | key | accepts | default | meaning |\n|---|---|---|---|\n",
    );
    for option in OPTIONS {
        let default = if option.default.is_empty() {
            "—".to_string()
        } else {
            format!("`{}`", option.default)
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            option.key,
            cell(&option.kind.expected()),
            default,
            cell(option.description)
        );
    }
    out.push_str(
        "\n## Rules between keys\n\nThe control plane and a worker check every one at start, \
         after the file, the environment and the flags, and refuse to start on the first one \
         broken, naming the key, its value and the fix; `weir run` checks those of the \
         settings it uses as its job starts.\n\n",
    );
    for (keys, rule) in RULES {
        let keys: Vec<String> = keys.iter().map(|key| format!("`{key}`")).collect();
        let _ = writeln!(out, "- {}: {rule}", keys.join(", "));
    }
    out
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

fn unknown_key(key: &str) -> ConfigError {
    let lower = key.to_ascii_lowercase();
    let suggestion = OPTIONS
        .iter()
        .map(|o| (edit_distance(&lower, &o.key.to_ascii_lowercase()), o.key))
        .min()
        .filter(|(d, _)| *d <= key.len() / 3 + 1)
        .map(|(_, k)| k.to_string());
    ConfigError::UnknownKey {
        key: key.to_string(),
        suggestion,
    }
}

/// A validated set of configuration values; keys not set take their defaults.
#[derive(Clone, Debug, Default)]
pub struct Configuration {
    values: BTreeMap<&'static str, String>,
}

impl Configuration {
    /// Sets `key` to `value`, refusing unknown keys and invalid values.
    pub fn set(&mut self, key: &str, value: impl Into<String>) -> Result<&mut Self, ConfigError> {
        let option = option(key).ok_or_else(|| unknown_key(key))?;
        let value = value.into();
        validate(option, &value)?;
        self.values.insert(option.key, value);
        Ok(self)
    }

    /// Builder-style [`Configuration::set`].
    pub fn with(mut self, key: &str, value: impl Into<String>) -> Result<Self, ConfigError> {
        self.set(key, value)?;
        Ok(self)
    }

    /// Applies `key=value` pairs (the CLI's `-D` flags).
    pub fn apply_pairs<'a>(
        &mut self,
        pairs: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), ConfigError> {
        for pair in pairs {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| ConfigError::InvalidValue {
                    key: pair.to_string(),
                    value: String::new(),
                    expected: "key=value, e.g. -D taskmanager.numberOfTaskSlots=2".into(),
                })?;
            self.set(key.trim(), value.trim())?;
        }
        Ok(())
    }

    /// Applies `WEIR_*` environment variables for known keys (`execution.buffer-timeout` is
    /// `WEIR_EXECUTION_BUFFER_TIMEOUT`).
    pub fn apply_env(&mut self) -> Result<(), ConfigError> {
        for option in OPTIONS {
            let var = format!(
                "WEIR_{}",
                option.key.to_ascii_uppercase().replace(['.', '-'], "_")
            );
            if let Ok(value) = std::env::var(&var) {
                self.set(option.key, value)?;
            }
        }
        Ok(())
    }

    /// Reads a TOML file: flat quoted keys (`"execution.buffer-timeout" = "5 ms"`) or nested
    /// tables (`[taskmanager] numberOfTaskSlots = 2`) both work.
    pub fn from_toml_file(path: &Path) -> Result<Configuration, ConfigError> {
        let file_error = |message: String| ConfigError::File {
            path: path.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
        Configuration::from_toml_str(&text).map_err(|e| match e {
            ConfigError::File { message, .. } => file_error(message),
            other => other,
        })
    }

    /// Parses TOML text (see [`Configuration::from_toml_file`]).
    pub fn from_toml_str(text: &str) -> Result<Configuration, ConfigError> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::File {
                path: "<toml>".into(),
                message: e.to_string(),
            })?;
        let mut config = Configuration::default();
        fn walk(
            prefix: &str,
            table: &toml::Table,
            config: &mut Configuration,
        ) -> Result<(), ConfigError> {
            for (k, v) in table {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match v {
                    toml::Value::Table(t) => walk(&key, t, config)?,
                    toml::Value::String(s) => {
                        config.set(&key, s.clone())?;
                    }
                    toml::Value::Array(items) => {
                        let joined: Vec<String> = items.iter().map(|i| i.to_string()).collect();
                        config.set(&key, joined.join(","))?;
                    }
                    other => {
                        config.set(&key, other.to_string())?;
                    }
                }
            }
            Ok(())
        }
        walk("", &table, &mut config)?;
        Ok(config)
    }

    fn raw(&self, key: &'static str) -> Option<&str> {
        debug_assert!(option(key).is_some(), "undeclared key {key}");
        self.values.get(key).map(String::as_str).or_else(|| {
            let default = option(key).map(|o| o.default).unwrap_or_default();
            (!default.is_empty()).then_some(default)
        })
    }

    /// A true-or-false key's value (validated as such, spaces around it allowed).
    fn flag(&self, key: &'static str) -> bool {
        self.raw(key).is_some_and(|value| value.trim() == "true")
    }

    fn count(&self, key: &'static str) -> Option<usize> {
        self.raw(key).map(|v| v.trim().parse().expect("validated"))
    }

    fn duration(&self, key: &'static str) -> Duration {
        parse_duration(self.raw(key).expect("has a default")).expect("validated")
    }

    fn size(&self, key: &'static str) -> u64 {
        parse_size(self.raw(key).expect("has a default")).expect("validated")
    }

    /// A fraction or a factor.
    fn number(&self, key: &'static str) -> f64 {
        self.raw(key)
            .expect("has a default")
            .trim()
            .parse()
            .expect("validated")
    }

    /// `taskmanager.numberOfTaskSlots`, if set.
    pub fn slots(&self) -> Option<usize> {
        self.count("taskmanager.numberOfTaskSlots")
    }

    /// `taskmanager.cpu.cores`, if set.
    pub fn cores(&self) -> Option<Vec<usize>> {
        self.raw("taskmanager.cpu.cores")
            .map(|v| parse_core_list(v).expect("validated"))
    }

    /// `parallelism.default`, if set.
    pub fn default_parallelism(&self) -> Option<usize> {
        self.count("parallelism.default")
    }

    /// `pipeline.max-parallelism`.
    pub fn max_parallelism(&self) -> usize {
        self.count("pipeline.max-parallelism")
            .expect("has a default")
    }

    /// `pipeline.auto-watermark-interval` (`None` when 0: periodic emission off).
    pub fn auto_watermark_interval(&self) -> Option<Duration> {
        Some(self.duration("pipeline.auto-watermark-interval")).filter(|d| !d.is_zero())
    }

    /// `metrics.latency.interval` (`None` when 0: no latency markers).
    pub fn latency_interval(&self) -> Option<Duration> {
        Some(self.duration("metrics.latency.interval")).filter(|d| !d.is_zero())
    }

    /// `pipeline.operator-chaining.enabled`.
    pub fn chaining_enabled(&self) -> bool {
        self.flag("pipeline.operator-chaining.enabled")
    }

    /// `execution.buffer-timeout`.
    pub fn buffer_timeout(&self) -> Duration {
        self.duration("execution.buffer-timeout")
    }

    /// `execution.batch-size`.
    pub fn batch_size(&self) -> usize {
        self.count("execution.batch-size").expect("has a default")
    }

    /// `taskmanager.network.memory.buffers-per-channel`, rounded up to a power of two: the
    /// capacity glommio gives a channel's ring, and so the credits a receiver really grants.
    pub fn buffers_per_channel(&self) -> usize {
        self.count("taskmanager.network.memory.buffers-per-channel")
            .expect("has a default")
            .next_power_of_two()
    }

    /// `taskmanager.shard.spin-before-park`.
    pub fn spin_before_park(&self) -> Duration {
        self.duration("taskmanager.shard.spin-before-park")
    }

    /// The `taskmanager.memory.*` settings of a worker with `slots` slots (which the default
    /// process size grows with).
    pub fn memory(&self, slots: usize) -> MemoryConfig {
        MemoryConfig {
            process_size: match self.raw("taskmanager.memory.process.size") {
                Some(size) => parse_size(size).expect("validated"),
                None => weir_memory::default_process_size(slots, weir_memory::host_memory()),
            },
            managed_fraction: self.number("taskmanager.memory.managed.fraction"),
            network_fraction: self.number("taskmanager.memory.network.fraction"),
            network_min: self.size("taskmanager.memory.network.min"),
            network_max: self.size("taskmanager.memory.network.max"),
            segment_size: self.size("taskmanager.memory.segment-size") as usize,
        }
    }

    /// `table.optimizer.agg-phase-strategy`.
    pub fn agg_phase_strategy(&self) -> AggPhaseStrategy {
        match self
            .raw("table.optimizer.agg-phase-strategy")
            .map(str::trim)
        {
            Some("ONE_PHASE") => AggPhaseStrategy::OnePhase,
            Some("TWO_PHASE") => AggPhaseStrategy::TwoPhase,
            _ => AggPhaseStrategy::Auto,
        }
    }

    /// `state.backend.type`.
    pub fn state_backend(&self) -> BackendType {
        match self.raw("state.backend.type").map(str::trim) {
            Some("rocksdb") => BackendType::RocksDb,
            _ => BackendType::Heap,
        }
    }

    /// `state.backend.rocksdb.localdir`, else the system temp directory.
    pub fn rocksdb_local_dir(&self) -> PathBuf {
        self.raw("state.backend.rocksdb.localdir")
            .map(|dir| PathBuf::from(dir.trim()))
            .unwrap_or_else(std::env::temp_dir)
    }

    /// How RocksDB divides a slot's managed memory (`state.backend.rocksdb.memory.*`).
    pub fn rocksdb_memory_ratios(&self) -> RocksDbMemoryRatios {
        RocksDbMemoryRatios {
            write_buffer_ratio: self.number("state.backend.rocksdb.memory.write-buffer-ratio"),
            write_back_ratio: self.number("state.backend.rocksdb.memory.write-back-ratio"),
            ..RocksDbMemoryRatios::default()
        }
    }

    /// The `sink.*` settings.
    pub fn sink_settings(&self) -> SinkSettings {
        SinkSettings {
            delivery_guarantee: self
                .raw("sink.delivery-guarantee")
                .and_then(DeliveryGuarantee::parse)
                .unwrap_or_default(),
            rolling_policy: RollingPolicy::default()
                .with_max_part_size(self.size("sink.rolling-policy.file-size"))
                .with_rollover_interval(self.duration("sink.rolling-policy.rollover-interval"))
                .with_inactivity_interval(self.duration("sink.rolling-policy.inactivity-interval")),
            max_transaction_bytes: self.size("sink.postgres.max-transaction-size"),
            marker_retention: self.duration("sink.postgres.transaction-marker-retention"),
        }
    }

    /// The `execution.checkpointing.*` settings; `None` when checkpointing is off.
    pub fn checkpointing(&self) -> Result<Option<CheckpointConfig>, ConfigError> {
        let interval = self.duration("execution.checkpointing.interval");
        if interval.is_zero() {
            return Ok(None);
        }
        let Some(dir) = self.raw("execution.checkpointing.dir") else {
            return Err(ConfigError::InvalidValue {
                key: "execution.checkpointing.dir".into(),
                value: String::new(),
                expected: format!(
                    "a directory for the checkpoints, since execution.checkpointing.interval is {}; \
                     set it, e.g. -D execution.checkpointing.dir=/var/lib/weir/checkpoints",
                    self.raw("execution.checkpointing.interval").unwrap_or_default()
                ),
            });
        };
        let ms = |key| self.duration(key).as_millis().min(i64::MAX as u128) as i64;
        let exactly_once =
            self.raw("execution.checkpointing.mode").map(str::trim) != Some("AT_LEAST_ONCE");
        let unaligned = self.flag("execution.checkpointing.unaligned.enabled");
        let max_concurrent = self
            .count("execution.checkpointing.max-concurrent-checkpoints")
            .expect("has a default");
        if unaligned && !exactly_once {
            return Err(ConfigError::InvalidValue {
                key: "execution.checkpointing.unaligned.enabled".into(),
                value: "true".into(),
                expected: "false with execution.checkpointing.mode: AT_LEAST_ONCE (unaligned \
                           checkpoints are exactly once); set the mode to EXACTLY_ONCE or turn \
                           unaligned checkpoints off"
                    .into(),
            });
        }
        if unaligned && max_concurrent > 1 {
            return Err(ConfigError::InvalidValue {
                key: "execution.checkpointing.unaligned.enabled".into(),
                value: "true".into(),
                expected: format!(
                    "false with execution.checkpointing.max-concurrent-checkpoints: \
                     {max_concurrent} (a task records one checkpoint's in-flight data at a \
                     time); set max-concurrent-checkpoints to 1"
                ),
            });
        }
        Ok(Some(CheckpointConfig {
            dir: PathBuf::from(dir.trim()),
            exactly_once,
            unaligned: unaligned
                .then(|| self.duration("execution.checkpointing.aligned-checkpoint-timeout")),
            settings: crate::checkpoint::CheckpointSettings {
                interval_ms: ms("execution.checkpointing.interval").max(1),
                timeout_ms: ms("execution.checkpointing.timeout").max(1),
                min_pause_ms: ms("execution.checkpointing.min-pause"),
                max_concurrent,
                tolerable_failures: self
                    .count("execution.checkpointing.tolerable-failed-checkpoints")
                    .expect("has a default") as u32,
            },
            retained: self
                .count("execution.checkpointing.num-retained")
                .expect("has a default"),
            incremental: self
                .raw("execution.checkpointing.incremental")
                .map(str::trim)
                != Some("false"),
            savepoint_dir: self
                .raw("execution.checkpointing.savepoint-dir")
                .map(str::trim)
                .filter(|dir| !dir.is_empty())
                .map(PathBuf::from),
        }))
    }

    /// The `restart-strategy.*` settings; without `restart-strategy.type`, `exponential-delay`
    /// for a `checkpointed` job and `none` otherwise (Flink's defaults).
    pub fn restart_strategy(&self, checkpointed: bool) -> RestartStrategy {
        let ms = |key| self.duration(key).as_millis().min(i64::MAX as u128) as i64;
        let count = |key| {
            self.count(key)
                .map_or(u32::MAX, |n| n.min(u32::MAX as usize) as u32)
        };
        let kind = self.raw("restart-strategy.type").map(str::trim);
        match kind {
            None if !checkpointed => RestartStrategy::None,
            Some("none" | "off" | "disable") => RestartStrategy::None,
            Some("fixed-delay" | "fixeddelay") => RestartStrategy::FixedDelay {
                attempts: count("restart-strategy.fixed-delay.attempts"),
                delay_ms: ms("restart-strategy.fixed-delay.delay"),
            },
            Some("failure-rate" | "failurerate") => RestartStrategy::FailureRate {
                max_failures: count("restart-strategy.failure-rate.max-failures-per-interval"),
                interval_ms: ms("restart-strategy.failure-rate.failure-rate-interval"),
                delay_ms: ms("restart-strategy.failure-rate.delay"),
            },
            _ => RestartStrategy::ExponentialDelay(ExponentialDelay {
                initial_backoff_ms: ms("restart-strategy.exponential-delay.initial-backoff"),
                max_backoff_ms: ms("restart-strategy.exponential-delay.max-backoff"),
                multiplier: self.number("restart-strategy.exponential-delay.backoff-multiplier"),
                reset_threshold_ms: ms(
                    "restart-strategy.exponential-delay.reset-backoff-threshold",
                ),
                jitter: self.number("restart-strategy.exponential-delay.jitter-factor"),
                attempts_before_reset: count(
                    "restart-strategy.exponential-delay.attempts-before-reset-backoff",
                ),
            }),
        }
    }

    /// The memory budget of a worker with `slots` slots under these settings.
    pub fn worker_budget(&self, slots: usize) -> Result<WorkerBudget, ConfigError> {
        let memory = self.memory(slots);
        memory.validate()?;
        let ratios = self.rocksdb_memory_ratios();
        ratios.validate()?;
        Ok(memory.worker_budget_with(slots, ratios))
    }

    /// The keys set explicitly (not left at their defaults), with their values as written:
    /// what a deployment hands to the process that runs the job.
    pub fn explicit(&self) -> Vec<(String, String)> {
        self.values
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    /// `rest.address`:`rest.port`, the control plane's REST endpoint.
    pub fn rest_endpoint(&self) -> (String, u16) {
        let port = self.count("rest.port").expect("has a default");
        (
            self.raw("rest.address").expect("has a default").to_string(),
            u16::try_from(port).expect("validated"),
        )
    }

    /// `metrics.reporter.prom.host`:`metrics.reporter.prom.port`, a worker's `/metrics`.
    pub fn metrics_endpoint(&self) -> (String, u16) {
        let port = self
            .count("metrics.reporter.prom.port")
            .expect("has a default");
        (
            self.raw("metrics.reporter.prom.host")
                .expect("has a default")
                .to_string(),
            u16::try_from(port).expect("validated"),
        )
    }

    /// `web.upload.enabled`.
    pub fn upload_enabled(&self) -> bool {
        self.flag("web.upload.enabled")
    }

    /// `rest.server.max-content-length`, bytes.
    pub fn rest_max_content_length(&self) -> u64 {
        self.size("rest.server.max-content-length")
    }

    /// `rest.auth.token`, if set.
    pub fn rest_token(&self) -> Option<&str> {
        self.raw("rest.auth.token")
    }

    /// `security.ssl.rest.enabled`.
    pub fn rest_ssl_enabled(&self) -> bool {
        self.flag("security.ssl.rest.enabled")
    }

    /// Every rule of [`RULES`]: the first broken one's key, value and fix. The control plane
    /// and a worker run it at start.
    pub fn check(&self) -> Result<(), ConfigError> {
        let (interval, timeout) = self.heartbeat();
        if interval.is_zero() || timeout <= interval {
            let key = if interval.is_zero() {
                "heartbeat.interval"
            } else {
                "heartbeat.timeout"
            };
            return Err(ConfigError::InvalidValue {
                key: key.into(),
                value: self.raw(key).unwrap_or_default().into(),
                expected: format!(
                    "an interval above 0 and a timeout longer than it (now {interval:?} and \
                     {timeout:?}); e.g. 10 s and 50 s, the defaults"
                ),
            });
        }
        self.checkpointing()?;
        self.worker_budget(1)?;
        Ok(())
    }

    /// `heartbeat.interval` and `heartbeat.timeout`.
    pub fn heartbeat(&self) -> (Duration, Duration) {
        (
            self.duration("heartbeat.interval"),
            self.duration("heartbeat.timeout"),
        )
    }

    /// `slot.request.timeout`.
    pub fn slot_request_timeout(&self) -> Duration {
        self.duration("slot.request.timeout")
    }

    /// `control.data-dir`.
    pub fn control_data_dir(&self) -> PathBuf {
        PathBuf::from(self.raw("control.data-dir").expect("has a default"))
    }

    /// `worker.shutdown.mode` (whether jobs stop with a savepoint) and
    /// `worker.shutdown.timeout`.
    pub fn worker_shutdown(&self) -> (bool, Duration) {
        (
            self.raw("worker.shutdown.mode").map(str::trim) == Some("savepoint"),
            self.duration("worker.shutdown.timeout"),
        )
    }

    /// `taskmanager.host`, `taskmanager.data.port`, `security.ssl.internal.*` and
    /// `taskmanager.network.*`: the exchange between workers.
    pub fn exchange(&self) -> ExchangeConfig {
        ExchangeConfig {
            host: self.raw("taskmanager.host").map(str::to_string),
            port: self
                .count("taskmanager.data.port")
                .and_then(|p| u16::try_from(p).ok())
                .expect("validated"),
            tls_dir: self.raw("security.ssl.internal.dir").map(PathBuf::from),
            node: self.raw("security.ssl.internal.node").map(str::to_string),
            connect_timeout: self.duration("taskmanager.network.connect-timeout"),
            idle_timeout: self.duration("taskmanager.network.idle-timeout"),
            udp_receive_buffer: self.size("taskmanager.network.udp.receive-buffer") as usize,
            udp_send_buffer: self.size("taskmanager.network.udp.send-buffer") as usize,
        }
    }

    /// `cluster.evenly-spread-out-slots`.
    pub fn spread_out_slots(&self) -> bool {
        self.flag("cluster.evenly-spread-out-slots")
    }

    /// `worker.data-dir`.
    pub fn worker_data_dir(&self) -> PathBuf {
        PathBuf::from(self.raw("worker.data-dir").expect("has a default"))
    }

    /// Every key with its effective value (set, default, or "derived").
    pub fn describe(&self) -> Vec<(&'static str, String, &'static str)> {
        OPTIONS
            .iter()
            .map(|o| {
                let value = self
                    .raw(o.key)
                    .map(str::to_string)
                    .unwrap_or_else(|| "(derived)".into());
                (o.key, value, o.description)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_reference_is_generated_from_the_code() {
        let file = include_str!("../../docs/configuration.md");
        assert!(
            file == reference(),
            "docs/configuration.md differs from OPTIONS in engine/src/config.rs: regenerate \
             it with `weir config --reference > docs/configuration.md`"
        );
        // One row per key, in OPTIONS's order, each saying what it accepts.
        let rows: Vec<&str> = file.lines().filter(|l| l.starts_with("| `")).collect();
        assert_eq!(rows.len(), OPTIONS.len());
        for (row, option) in rows.iter().zip(OPTIONS) {
            assert!(row.starts_with(&format!("| `{}` |", option.key)), "{row}");
            assert!(row.contains(&option.kind.expected()), "{row}");
        }
    }

    #[test]
    fn every_rule_between_keys_is_enforced_naming_one_of_its_keys() {
        let broken: [&[(&str, &str)]; RULES.len()] = [
            &[("heartbeat.interval", "10s"), ("heartbeat.timeout", "5s")],
            &[("execution.checkpointing.interval", "1s")],
            &[
                ("execution.checkpointing.interval", "1s"),
                ("execution.checkpointing.dir", "/tmp/chk"),
                ("execution.checkpointing.unaligned.enabled", "true"),
                ("execution.checkpointing.mode", "AT_LEAST_ONCE"),
            ],
            &[
                ("taskmanager.memory.managed.fraction", "0.5"),
                ("taskmanager.memory.network.fraction", "0.4"),
            ],
            &[("taskmanager.memory.segment-size", "3kb")],
            &[
                ("state.backend.rocksdb.memory.write-buffer-ratio", "0.6"),
                ("state.backend.rocksdb.memory.write-back-ratio", "0.5"),
            ],
        ];
        assert!(Configuration::default().check().is_ok());
        for ((keys, rule), pairs) in RULES.iter().zip(broken) {
            let mut config = Configuration::default();
            for (key, value) in pairs {
                config = config.with(key, *value).unwrap();
            }
            match config.check() {
                Err(ConfigError::InvalidValue { key, expected, .. }) => {
                    assert!(keys.contains(&key.as_str()), "{rule}: named {key}");
                    assert!(!expected.is_empty());
                }
                other => panic!("{rule}: {pairs:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn a_refused_value_names_what_its_key_accepts() {
        let error = Configuration::default()
            .with("pipeline.max-parallelism", "0")
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "config key 'pipeline.max-parallelism' has invalid value '0': expected a whole \
             number from 1 to 32768"
        );
    }

    #[test]
    fn restart_strategies_read_flinks_keys_and_defaults() {
        let default = Configuration::default();
        assert_eq!(default.restart_strategy(false), RestartStrategy::None);
        assert_eq!(
            default.restart_strategy(true),
            RestartStrategy::ExponentialDelay(ExponentialDelay::default())
        );
        let fixed = Configuration::default()
            .with("restart-strategy.type", "fixed-delay")
            .and_then(|c| c.with("restart-strategy.fixed-delay.attempts", "3"))
            .and_then(|c| c.with("restart-strategy.fixed-delay.delay", "250 ms"))
            .unwrap();
        let expected = RestartStrategy::FixedDelay {
            attempts: 3,
            delay_ms: 250,
        };
        assert_eq!(fixed.restart_strategy(false), expected);
        assert_eq!(fixed.restart_strategy(true), expected);
        let rate = Configuration::default()
            .with("restart-strategy.type", "failurerate")
            .unwrap();
        assert_eq!(rate.restart_strategy(true), RestartStrategy::FAILURE_RATE);
        let exponential = Configuration::default()
            .with("restart-strategy.type", "exponential-delay")
            .and_then(|c| c.with("restart-strategy.exponential-delay.backoff-multiplier", "2"))
            .and_then(|c| {
                c.with(
                    "restart-strategy.exponential-delay.reset-backoff-threshold",
                    "2 h",
                )
            })
            .and_then(|c| {
                c.with(
                    "restart-strategy.exponential-delay.attempts-before-reset-backoff",
                    "4",
                )
            })
            .unwrap();
        assert_eq!(
            exponential.restart_strategy(false),
            RestartStrategy::ExponentialDelay(ExponentialDelay {
                multiplier: 2.0,
                reset_threshold_ms: 2 * 60 * 60 * 1_000,
                attempts_before_reset: 4,
                ..ExponentialDelay::default()
            })
        );
        let off = Configuration::default()
            .with("restart-strategy.type", "none")
            .unwrap();
        assert_eq!(off.restart_strategy(true), RestartStrategy::None);
        let error = Configuration::default()
            .with(
                "restart-strategy.exponential-delay.backoff-multiplier",
                "0.5",
            )
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("backoff-multiplier") && error.contains("at least 1"),
            "{error}"
        );
        let error = Configuration::default()
            .with("restart-strategy.type", "sometimes")
            .unwrap_err()
            .to_string();
        assert!(error.contains("fixed-delay"), "{error}");
    }

    #[test]
    fn defaults_and_overrides() {
        let mut config = Configuration::default();
        assert_eq!(config.buffer_timeout(), Duration::from_millis(1));
        assert_eq!(config.max_parallelism(), 128);
        assert_eq!(config.slots(), None);
        config.set("execution.buffer-timeout", "0").unwrap();
        config.set("taskmanager.numberOfTaskSlots", "2").unwrap();
        assert_eq!(config.buffer_timeout(), Duration::ZERO);
        assert_eq!(config.slots(), Some(2));
        assert_eq!(config.memory(2).segment_size, 32 << 10);
        assert_eq!(config.memory(2).process_size, 1728 << 20);
    }

    #[test]
    fn unknown_key_suggests_the_closest() {
        let err = Configuration::default()
            .set("taskmanager.numberOfTaskSlot", "2")
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("unknown config key 'taskmanager.numberOfTaskSlot'"),
            "{text}"
        );
        assert!(
            text.contains("did you mean 'taskmanager.numberOfTaskSlots'"),
            "{text}"
        );
        let err = Configuration::default().set("nonsense", "2").unwrap_err();
        assert_eq!(
            err,
            ConfigError::UnknownKey {
                key: "nonsense".into(),
                suggestion: None
            }
        );
    }

    #[test]
    fn invalid_values_name_key_value_and_fix() {
        let err = Configuration::default()
            .set("parallelism.default", "0")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("'parallelism.default'") && err.contains("'0'"),
            "{err}"
        );
        assert!(err.contains("at least 1"), "{err}");
        let err = Configuration::default()
            .set("pipeline.max-parallelism", "4294967296")
            .unwrap_err()
            .to_string();
        assert!(err.contains("from 1 to 32768"), "{err}");
        let err = Configuration::default()
            .set("execution.buffer-timeout", "fast")
            .unwrap_err()
            .to_string();
        assert!(err.contains("a duration"), "{err}");
    }

    #[test]
    fn toml_flat_and_nested() {
        let config = Configuration::from_toml_str(
            "\"execution.buffer-timeout\" = \"5 ms\"\n[taskmanager]\nnumberOfTaskSlots = 2\n[taskmanager.memory]\n\"process.size\" = \"1g\"\n",
        )
        .unwrap();
        assert_eq!(config.buffer_timeout(), Duration::from_millis(5));
        assert_eq!(config.slots(), Some(2));
        assert_eq!(config.memory(16).process_size, 1 << 30);
        let err = Configuration::from_toml_str("[taskmanager]\nslots = 2\n").unwrap_err();
        assert!(matches!(err, ConfigError::UnknownKey { .. }));
    }

    /// A true-or-false key reads as it validates: with spaces around it (a TOML string, an
    /// environment variable) `true` is on — a security switch must not pass the check and
    /// then read as off.
    #[test]
    fn flags_read_as_they_validate() {
        let config = Configuration::from_toml_str(
            "\"security.ssl.rest.enabled\" = \" true \"\n\"web.upload.enabled\" = \"false \"\n",
        )
        .unwrap();
        assert!(config.rest_ssl_enabled());
        assert!(!config.upload_enabled());
        assert!(!Configuration::default().rest_ssl_enabled());
    }

    #[test]
    fn parsers() {
        assert_eq!(parse_duration("250us"), Some(Duration::from_micros(250)));
        assert_eq!(parse_duration("2 s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("7 d"), Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_size("32kb"), Some(32 << 10));
        assert_eq!(parse_size("1728m"), Some(1728 << 20));
        assert_eq!(parse_size("x"), None);
    }
}
