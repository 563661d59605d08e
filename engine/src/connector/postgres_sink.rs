//! The PostgreSQL sink: rows written in transactions that a checkpoint's barrier prepares
//! (`PREPARE TRANSACTION`) and its completion commits (`COMMIT PREPARED`), exactly once
//! through `two_phase`.
//!
//! Each subtask's writer encodes its records as rows of `COPY … FROM STDIN` text on its
//! shard and hands them, a megabyte at a time, to a client thread of its own (the PostgreSQL
//! client blocks; a shard never does). The thread opens a transaction with the first rows
//! after a barrier and writes them with `COPY`; a transaction that reached
//! `sink.postgres.max-transaction-size` (64 MiB) is prepared then and a new one opened. At
//! the barrier it records the transaction's name in `weir_sink_transactions` and prepares
//! it: the name (`weir-<operator>-<scope>-<subtask>-<run>-<n>-chk<checkpoint>-<job>`) is the
//! committable. A second thread commits. `COMMIT PREPARED` of a name PostgreSQL no longer
//! knows is a success when the name is in `weir_sink_transactions` (committed before: the
//! marker was written in the transaction itself) and a failure naming the transaction
//! otherwise (rolled back behind the sink's back: its rows are lost to the checkpoint). The
//! markers are deleted after `sink.postgres.transaction-marker-retention`; a recommit of a
//! transaction older than that which PostgreSQL no longer knows counts as committed. On a
//! start or a restore, prepared transactions of the operator's subtasks that the checkpoint
//! does not hold are rolled back, under the sink's name prefix and the ones its checkpoint
//! recorded (a job renamed since, another table).
//!
//! Upserts (`INSERT … ON CONFLICT (key) DO UPDATE`, the last row of each key) go exactly once
//! through a staging table: the prepared transaction only appends to
//! `weir_staged_<table>_<hash>`, and the commit merges its rows into the table and deletes
//! them in one transaction after `COMMIT PREPARED` (and again, harmlessly, on a recommit). A
//! prepared transaction that upserted into the table itself would hold the row locks of its
//! keys until the checkpoint's notice, which the next transaction's upserts of the same keys
//! would wait for. At least once (or none), upserts go straight into the table.
//!
//! The record-to-row mapping ([`PostgresSink::new`]: columns with their types, and a function
//! that pushes a record's values) is checked against the table when a subtask starts: a
//! missing table or column, a type that differs, or a required column left out fails the
//! job naming the table, the column and both types.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::channel::{mpsc, oneshot};
use futures::future::LocalBoxFuture;
use futures::{SinkExt, StreamExt};
use postgres::error::SqlState;
use postgres::{Client, NoTls};

use super::two_phase::{
    two_phase_writer, CommitError, Committer, DeliveryGuarantee, TransactionWriter,
    TwoPhaseCommitSink,
};
use super::{ConnectorError, Sink, SinkWriter};
use crate::operator::RuntimeContext;

/// A column's type, as the mapping declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PgType {
    /// `smallint`.
    SmallInt,
    /// `integer`.
    Integer,
    /// `bigint`.
    BigInt,
    /// `real`.
    Real,
    /// `double precision`.
    DoublePrecision,
    /// `numeric`.
    Numeric,
    /// `text` (or `varchar`, `char`).
    Text,
    /// `boolean`.
    Boolean,
    /// `timestamp with time zone`.
    Timestamptz,
    /// `date`.
    Date,
}

impl PgType {
    /// The type as SQL spells it.
    pub fn sql(self) -> &'static str {
        match self {
            PgType::SmallInt => "smallint",
            PgType::Integer => "integer",
            PgType::BigInt => "bigint",
            PgType::Real => "real",
            PgType::DoublePrecision => "double precision",
            PgType::Numeric => "numeric",
            PgType::Text => "text",
            PgType::Boolean => "boolean",
            PgType::Timestamptz => "timestamp with time zone",
            PgType::Date => "date",
        }
    }

    /// Whether a column of `data_type` (as `format_type` gives it) takes it.
    fn fits(self, data_type: &str) -> bool {
        match self {
            PgType::Text => matches!(data_type, "text" | "character varying" | "character"),
            other => other.sql() == data_type,
        }
    }
}

/// How rows reach the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// Every row inserted (`COPY`).
    Append,
    /// A row replaces the one with its key (`INSERT … ON CONFLICT (key) DO UPDATE`): the table
    /// needs a unique constraint on these columns.
    Upsert {
        /// The key's columns.
        key: Vec<String>,
    },
}

/// A record's values, pushed in the order of the mapping's columns.
pub struct Row<'a> {
    out: &'a mut Vec<u8>,
    values: usize,
}

impl Row<'_> {
    fn separate(&mut self) {
        if self.values > 0 {
            self.out.push(b'\t');
        }
        self.values += 1;
    }

    /// An integer.
    pub fn int(&mut self, value: i64) -> &mut Self {
        self.separate();
        let _ = write!(Bytes(self.out), "{value}");
        self
    }

    /// A floating-point number.
    pub fn float(&mut self, value: f64) -> &mut Self {
        self.separate();
        let _ = write!(Bytes(self.out), "{value}");
        self
    }

    /// A boolean.
    pub fn bool(&mut self, value: bool) -> &mut Self {
        self.separate();
        self.out.push(if value { b't' } else { b'f' });
        self
    }

    /// Text (also a `numeric`, timestamp or date in PostgreSQL's input syntax).
    pub fn text(&mut self, value: &str) -> &mut Self {
        self.separate();
        for byte in value.bytes() {
            match byte {
                b'\\' => self.out.extend_from_slice(b"\\\\"),
                b'\t' => self.out.extend_from_slice(b"\\t"),
                b'\n' => self.out.extend_from_slice(b"\\n"),
                b'\r' => self.out.extend_from_slice(b"\\r"),
                byte => self.out.push(byte),
            }
        }
        self
    }

    /// SQL `NULL`.
    pub fn null(&mut self) -> &mut Self {
        self.separate();
        self.out.extend_from_slice(b"\\N");
        self
    }
}

/// `fmt::Write` into bytes.
struct Bytes<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Bytes<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

type ToRow<T> = dyn Fn(&T, &mut Row<'_>) + Send + Sync;

/// A prepared transaction of the sink: its committable.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Prepared {
    /// The transaction's name (`pg_prepared_xacts.gid`).
    gid: String,
    /// The subtask that wrote it.
    subtask: u32,
    /// When it was prepared, in µs since the Unix epoch: a marker older than
    /// `sink.postgres.transaction-marker-retention` may be gone.
    prepared_at: i64,
    /// Where its upserts wait until the commit merges them into the table.
    staged: Option<Staged>,
}

/// Upserts a prepared transaction staged.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Staged {
    /// The staging table.
    table: String,
    /// The transaction's id, which its staged rows carry.
    xid: i64,
}

/// Writes records as rows of a PostgreSQL table, exactly once by default.
pub struct PostgresSink<T> {
    target: Arc<Target>,
    to_row: Arc<ToRow<T>>,
    guarantee: Option<DeliveryGuarantee>,
}

/// Where and how rows go: what the client threads need.
#[derive(Debug)]
struct Target {
    /// `postgres://…` without the table.
    url: String,
    /// The URL without a password, for messages.
    shown: String,
    schema: Option<String>,
    table: String,
    columns: Vec<(String, PgType)>,
    mode: WriteMode,
    create_table: bool,
}

impl<T> PostgresSink<T> {
    /// Rows of `table` (`schema.table`, or a table of the connection's schema) in the
    /// database `url` (`postgres://user[:password]@host[:port]/database`): `columns` with
    /// their types, and `to_row`, which pushes a record's values in their order.
    pub fn new(
        url: &str,
        table: &str,
        columns: &[(&str, PgType)],
        to_row: impl Fn(&T, &mut Row<'_>) + Send + Sync + 'static,
    ) -> Result<Self, ConnectorError> {
        if columns.is_empty() {
            return Err(ConnectorError::bad_input(format!(
                "PostgreSQL sink for table '{table}' maps no column; name the columns the \
                 records fill"
            )));
        }
        url.parse::<postgres::Config>().map_err(|e| {
            ConnectorError::bad_input(format!(
                "PostgreSQL sink: '{}' is no PostgreSQL URL ({e}); write \
                 postgres://user[:password]@host[:port]/database",
                hide_password(url)
            ))
        })?;
        let (schema, table) = match table.split_once('.') {
            Some((schema, table)) => (Some(schema.to_string()), table.to_string()),
            None => (None, table.to_string()),
        };
        Ok(PostgresSink {
            target: Arc::new(Target {
                url: url.to_string(),
                shown: hide_password(url),
                schema,
                table,
                columns: columns.iter().map(|(n, t)| (n.to_string(), *t)).collect(),
                mode: WriteMode::Append,
                create_table: false,
            }),
            to_row: Arc::new(to_row),
            guarantee: None,
        })
    }

    /// A sink of `url` given as `postgres://…/database/TABLE` (the CLI's `--sink`).
    pub fn from_url(
        url_and_table: &str,
        columns: &[(&str, PgType)],
        to_row: impl Fn(&T, &mut Row<'_>) + Send + Sync + 'static,
    ) -> Result<Self, ConnectorError> {
        let refused = || {
            ConnectorError::bad_input(format!(
                "'{}' names no table; write postgres://user@host[:port]/database/TABLE",
                hide_password(url_and_table)
            ))
        };
        let (url, table) = url_and_table.rsplit_once('/').ok_or_else(refused)?;
        let path = url.split_once("://").map_or("", |(_, rest)| rest);
        if table.is_empty() || !path.contains('/') {
            return Err(refused());
        }
        PostgresSink::new(url, table, columns, to_row)
    }

    fn target_mut(&mut self) -> &mut Target {
        Arc::get_mut(&mut self.target).expect("configured before the job is built")
    }

    /// Upserts on `key` instead of appending.
    pub fn upsert(mut self, key: &[&str]) -> Self {
        self.target_mut().mode = WriteMode::Upsert {
            key: key.iter().map(|k| k.to_string()).collect(),
        };
        self
    }

    /// Creates the table from the mapping when it does not exist.
    pub fn create_table_if_missing(mut self) -> Self {
        self.target_mut().create_table = true;
        self
    }

    /// This sink's guarantee, instead of the job's `sink.delivery-guarantee`.
    pub fn with_delivery_guarantee(mut self, guarantee: DeliveryGuarantee) -> Self {
        self.guarantee = Some(guarantee);
        self
    }
}

/// `url` with its password replaced: in a URL's user info, or a `password=` setting.
fn hide_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        let words: Vec<String> = url
            .split_whitespace()
            .map(|word| match word.split_once('=') {
                Some(("password", _)) => "password=***".to_string(),
                _ => word.to_string(),
            })
            .collect();
        return words.join(" ");
    };
    // The host part follows the last `@` of the authority (a password may hold one).
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((user, host)) if user.contains(':') => {
            let user = user.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}{path}")
        }
        _ => url.to_string(),
    }
}

/// A name as an SQL identifier.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A string as an SQL literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

impl Target {
    fn table_sql(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", ident(schema), ident(&self.table)),
            None => ident(&self.table),
        }
    }

    fn named(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{schema}.{}", self.table),
            None => self.table.clone(),
        }
    }

    /// `"name" type, …`, as `CREATE TABLE` takes them.
    fn column_definitions(&self) -> String {
        let columns: Vec<String> = self
            .columns
            .iter()
            .map(|(name, ty)| format!("{} {}", ident(name), ty.sql()))
            .collect();
        columns.join(", ")
    }

    fn column_list(&self) -> String {
        let names: Vec<String> = self.columns.iter().map(|(n, _)| ident(n)).collect();
        names.join(", ")
    }

    /// The staging table of exactly-once upserts, in the table's schema, named by the table
    /// and the mapping (another mapping gets another table: rows staged under the old one
    /// keep their columns).
    fn staging_sql(&self) -> String {
        let mapping: Vec<String> = self
            .columns
            .iter()
            .map(|(name, ty)| format!("{name} {}", ty.sql()))
            .chain(match &self.mode {
                WriteMode::Upsert { key } => key.clone(),
                WriteMode::Append => Vec::new(),
            })
            .collect();
        let hash = stable_hash(&[&self.named(), &mapping.join(",")]);
        // PostgreSQL cuts names at 63 bytes: keep the hash in.
        let mut cut = self.table.len().min(32);
        while !self.table.is_char_boundary(cut) {
            cut -= 1;
        }
        let table = &self.table[..cut];
        let name = ident(&format!("weir_staged_{table}_{hash:08x}"));
        match &self.schema {
            Some(schema) => format!("{}.{name}", ident(schema)),
            None => name,
        }
    }
}

/// Rows handed to the client thread at once.
const BATCH_BYTES: usize = 1 << 20;
/// Batches on their way to the client thread (the shard waits beyond).
const BATCHES_QUEUED: usize = 4;
/// Tries to connect, and the wait before the first retry (doubling).
const CONNECT_TRIES: u32 = 4;
const CONNECT_BACKOFF: Duration = Duration::from_millis(250);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The table that marks prepared transactions, written in each.
const MARKERS: &str = "weir_sink_transactions";
/// How often (at most) a committer deletes the markers older than the retention.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// The staging table's own columns: the writing transaction, and the rows' order.
const STAGED_XID: &str = "\"__weir_xid\"";
const STAGED_SEQ: &str = "\"__weir_seq\"";

/// What a client thread is asked.
enum Request {
    /// Rows (COPY text) into the open transaction (opened if none).
    Write(Vec<u8>),
    /// Prepare the open transaction as this name; the answer is its id when it staged upserts.
    Prepare(String, oneshot::Sender<Result<Option<i64>, ConnectorError>>),
    /// Commit these prepared transactions (and merge what they staged).
    Commit(Vec<Prepared>, oneshot::Sender<Result<(), CommitError>>),
    /// Roll back the prepared transactions under `prefixes` owned by `subtask` of
    /// `parallelism`, except `keep`.
    Abort {
        prefixes: Vec<String>,
        subtask: usize,
        parallelism: usize,
        keep: Vec<Prepared>,
        reply: oneshot::Sender<Result<(), ConnectorError>>,
    },
}

/// A client thread: its queue. Dropped (its subtask ended or failed), the thread rolls back
/// what it still holds instead of preparing it: a restarted attempt's restore may already
/// have looked for what the old one left.
struct ClientThread {
    requests: mpsc::Sender<Request>,
    dropped: Arc<AtomicBool>,
}

impl ClientThread {
    fn start(target: Arc<Target>, role: Role, ctx: &RuntimeContext) -> ClientThread {
        let (requests, queue) = mpsc::channel(BATCHES_QUEUED);
        let dropped = Arc::new(AtomicBool::new(false));
        let name = match &role {
            Role::Writer { .. } => format!("weir-pg-writer-{}", ctx.subtask),
            Role::Committer { .. } => format!("weir-pg-committer-{}", ctx.subtask),
        };
        let connection = Connection::new(target, role, Arc::clone(&dropped));
        std::thread::Builder::new()
            .name(name)
            .spawn(move || connection.serve(queue))
            .expect("a thread");
        ClientThread { requests, dropped }
    }

    async fn send(&mut self, request: Request) -> Result<(), ConnectorError> {
        self.requests.send(request).await.map_err(|_| gone())
    }
}

impl Drop for ClientThread {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::Release);
    }
}

fn gone() -> ConnectorError {
    ConnectorError::external("the PostgreSQL sink's client thread ended")
}

/// What a connection does besides its requests.
enum Role {
    /// Writes rows: into the staging table (exactly-once upserts) or the table.
    Writer { staged: bool },
    /// Commits, and deletes the markers its subtask owns older than `retention`, once in a
    /// while.
    Committer { retention: Duration, owner: Owner },
}

/// A committer's subtask and its transactions' name prefix.
struct Owner {
    prefix: String,
    subtask: usize,
    parallelism: usize,
}

/// One connection, on its client thread.
struct Connection {
    target: Arc<Target>,
    role: Role,
    /// When the markers were last pruned.
    pruned: Option<std::time::Instant>,
    client: Option<Client>,
    /// Whether a transaction is open (rows written since the last prepare).
    open: bool,
    /// Why the open transaction cannot be prepared (its connection was lost, a write failed).
    failed: Option<ConnectorError>,
    checked: bool,
    /// Its `ClientThread` was dropped: prepare nothing more.
    dropped: Arc<AtomicBool>,
}

impl Connection {
    fn new(target: Arc<Target>, role: Role, dropped: Arc<AtomicBool>) -> Connection {
        Connection {
            target,
            role,
            pruned: None,
            client: None,
            open: false,
            failed: None,
            checked: false,
            dropped,
        }
    }

    fn serve(mut self, mut queue: mpsc::Receiver<Request>) {
        while let Some(request) = futures::executor::block_on(queue.next()) {
            match request {
                Request::Write(rows) => {
                    if self.failed.is_none() {
                        if let Err(error) = self.write(&rows) {
                            self.failed = Some(error);
                        }
                    }
                }
                Request::Prepare(..) if self.dropped.load(Ordering::Acquire) => break,
                Request::Prepare(name, reply) => {
                    let _ = reply.send(self.prepare(&name));
                }
                Request::Commit(names, reply) => {
                    let _ = reply.send(self.commit(&names));
                }
                Request::Abort {
                    prefixes,
                    subtask,
                    parallelism,
                    keep,
                    reply,
                } => {
                    let _ = reply.send(self.abort(&prefixes, subtask, parallelism, &keep));
                }
            }
        }
        if let Some(client) = self.client.take() {
            let _ = client.close();
        }
    }

    /// The connection, made (and the table checked) if there is none. A connection lost with
    /// a transaction open is a failure: the transaction is gone, and a new connection must
    /// not write the rows after it outside one.
    fn client(&mut self) -> Result<&mut Client, ConnectorError> {
        if self.client.as_ref().is_some_and(Client::is_closed) {
            self.client = None;
            if std::mem::take(&mut self.open) {
                return Err(ConnectorError::external(format!(
                    "PostgreSQL sink lost its connection to {} with a transaction open; the \
                     rows since the last checkpoint are written again after the restart",
                    self.target.shown
                )));
            }
        }
        if self.client.is_none() {
            let mut client = self.connect()?;
            if !self.checked {
                self.check_table(&mut client)?;
                self.checked = true;
            }
            self.client = Some(client);
        }
        Ok(self.client.as_mut().expect("connected"))
    }

    fn connect(&self) -> Result<Client, ConnectorError> {
        let mut config: postgres::Config = self
            .target
            .url
            .parse()
            .map_err(|e| ConnectorError::bad_input(format!("'{}': {e}", self.target.shown)))?;
        config
            .connect_timeout(CONNECT_TIMEOUT)
            .application_name("weir-sink")
            // A dead server or network is found in about 30 s, not TCP's two hours.
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(4)
            .tcp_user_timeout(Duration::from_secs(30))
            // A transaction stays open between barriers, idle while records come slowly.
            .options("-c idle_in_transaction_session_timeout=0 -c statement_timeout=0");
        let mut wait = CONNECT_BACKOFF;
        let mut tries = 0;
        loop {
            tries += 1;
            match config.connect(NoTls) {
                Ok(client) => return Ok(client),
                Err(e) if tries < CONNECT_TRIES => {
                    tracing::warn!(url = %self.target.shown, tries, error = %e, "cannot connect; retrying");
                    std::thread::sleep(wait);
                    wait *= 2;
                }
                Err(e) => {
                    return Err(ConnectorError::external(format!(
                        "PostgreSQL sink cannot connect to {} after {tries} tries: {}; check the \
                         URL and that the server runs and accepts connections",
                        self.target.shown,
                        describe(&e)
                    )))
                }
            }
        }
    }

    /// Checks the mapping against the table (creating it if asked), and makes the marker
    /// table.
    fn check_table(&self, client: &mut Client) -> Result<(), ConnectorError> {
        let target = &self.target;
        let failed = |what: &str, e: postgres::Error| {
            ConnectorError::external(format!(
                "PostgreSQL sink cannot {what} on {}: {}",
                target.shown,
                describe(&e)
            ))
        };
        self.create_missing(client)
            .map_err(|e| failed("create its tables", e))?;
        let prepared: String = client
            .query_one("SHOW max_prepared_transactions", &[])
            .map_err(|e| failed("read max_prepared_transactions", e))?
            .get(0);
        if prepared.trim() == "0" {
            return Err(ConnectorError::bad_input(format!(
                "PostgreSQL sink: the server at {} has max_prepared_transactions = 0, so it \
                 cannot prepare the sink's transactions; set it above the sink's parallelism \
                 (e.g. max_prepared_transactions = 64 in postgresql.conf, then restart the \
                 server)",
                target.shown
            )));
        }
        // The table as COPY and INSERT find it (through the search path); a column is
        // required when it is NOT NULL with no default, identity or generation.
        let rows = client
            .query(
                "SELECT a.attname::text, format_type(a.atttypid, NULL), \
                 a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' AND a.attgenerated = '' \
                 FROM pg_attribute a \
                 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
                &[&target.table_sql()],
            )
            .map_err(|e| failed("read the table's columns", e))?;
        let table: HashMap<String, (String, bool)> = rows
            .iter()
            .map(|row| (row.get(0), (row.get(1), row.get(2))))
            .collect();
        if table.is_empty() {
            let columns: Vec<String> = target
                .columns
                .iter()
                .map(|(name, ty)| format!("{name} {}", ty.sql()))
                .collect();
            return Err(ConnectorError::bad_input(format!(
                "PostgreSQL sink: table '{}' does not exist in {}; create it, e.g. CREATE TABLE \
                 {} ({})",
                target.named(),
                target.shown,
                target.named(),
                columns.join(", ")
            )));
        }
        for (name, ty) in &target.columns {
            match table.get(name) {
                None => {
                    let mut have: Vec<&String> = table.keys().collect();
                    have.sort();
                    return Err(ConnectorError::bad_input(format!(
                        "PostgreSQL sink: table '{}' has no column '{name}' (the record's {}); \
                         it has {have:?}: add the column or change the mapping",
                        target.named(),
                        ty.sql()
                    )));
                }
                Some((data_type, _)) if !ty.fits(data_type) => {
                    return Err(ConnectorError::bad_input(format!(
                        "PostgreSQL sink: column '{name}' of table '{}' is {data_type}, the \
                         record's is {}; change the column's type or the mapping",
                        target.named(),
                        ty.sql()
                    )))
                }
                Some(_) => {}
            }
        }
        let mut required: Vec<&String> = table
            .iter()
            .filter(|(name, (_, required))| {
                *required && !target.columns.iter().any(|(n, _)| n == *name)
            })
            .map(|(name, _)| name)
            .collect();
        if !required.is_empty() {
            required.sort();
            return Err(ConnectorError::bad_input(format!(
                "PostgreSQL sink: table '{}' requires {required:?} (NOT NULL, no default), which \
                 the mapping leaves out; map them or give them a default",
                target.named()
            )));
        }
        Ok(())
    }

    /// Creates what is missing, and only that (DDL on a table that prepared transactions
    /// wrote into waits for them, and a restore must get past this before it resolves them):
    /// the marker table, the table when asked, the staging table of exactly-once upserts.
    fn create_missing(&self, client: &mut Client) -> Result<(), postgres::Error> {
        let target = &self.target;
        let mut transaction = client.transaction()?;
        // Two subtasks may create the tables at once: one at a time, and never stuck.
        transaction.batch_execute(
            "SET LOCAL lock_timeout = '10s'; SELECT pg_advisory_xact_lock(7250001)",
        )?;
        let mut ask = |sql: &str, table: &str| -> Result<bool, postgres::Error> {
            Ok(transaction.query_one(sql, &[&table])?.get(0))
        };
        let regclass = "SELECT to_regclass($1) IS NOT NULL";
        let mut ddl = String::new();
        if !ask(regclass, MARKERS)? {
            let _ = write!(
                ddl,
                "CREATE TABLE {MARKERS} (gid text PRIMARY KEY, \
                 prepared_at timestamptz NOT NULL DEFAULT now()); \
                 CREATE INDEX {MARKERS}_prepared_at ON {MARKERS} (prepared_at);"
            );
        }
        let staging = target.staging_sql();
        let columns = || target.column_definitions();
        if target.create_table && !ask(regclass, &target.table_sql())? {
            let _ = write!(ddl, " CREATE TABLE {} ({});", target.table_sql(), columns());
        }
        if matches!(self.role, Role::Writer { staged: true }) && !ask(regclass, &staging)? {
            let _ = write!(
                ddl,
                " CREATE TABLE {staging} ({STAGED_XID} bigint NOT NULL DEFAULT txid_current(), \
                 {STAGED_SEQ} bigint GENERATED ALWAYS AS IDENTITY, {}); CREATE INDEX {} ON \
                 {staging} ({STAGED_XID});",
                columns(),
                ident(&format!("weir_staged_{:08x}_xid", stable_hash(&[&staging])))
            );
        }
        if !ddl.is_empty() {
            transaction.batch_execute(&ddl)?;
        }
        transaction.commit()
    }

    fn write(&mut self, rows: &[u8]) -> Result<(), ConnectorError> {
        let target = Arc::clone(&self.target);
        self.client()?;
        let failed = |e: postgres::Error| {
            ConnectorError::external(format!(
                "PostgreSQL sink cannot write into '{}' on {}: {}",
                target.named(),
                target.shown,
                describe(&e)
            ))
        };
        let client = self.client.as_mut().expect("connected");
        if !self.open {
            client.batch_execute("BEGIN").map_err(failed)?;
            self.open = true;
        }
        let staged = matches!(self.role, Role::Writer { staged: true });
        match &target.mode {
            WriteMode::Upsert { key } if !staged => {
                let columns = upsert_columns(rows, &target.columns, key)?;
                let sql = upsert_sql(&target, key);
                let params: Vec<&(dyn postgres::types::ToSql + Sync)> = columns
                    .iter()
                    .map(|c| c as &(dyn postgres::types::ToSql + Sync))
                    .collect();
                client.execute(&sql, &params).map_err(failed)?;
            }
            _ => {
                let into = if staged {
                    target.staging_sql()
                } else {
                    target.table_sql()
                };
                let copy = format!("COPY {into} ({}) FROM STDIN", target.column_list());
                let mut writer = client.copy_in(&copy).map_err(failed)?;
                std::io::Write::write_all(&mut writer, rows).map_err(|e| {
                    ConnectorError::external(format!(
                        "PostgreSQL sink cannot write into '{}': {e}",
                        target.named()
                    ))
                })?;
                writer.finish().map_err(failed)?;
            }
        }
        Ok(())
    }

    fn prepare(&mut self, name: &str) -> Result<Option<i64>, ConnectorError> {
        if let Some(error) = self.failed.take() {
            self.open = false;
            self.client = None;
            return Err(error);
        }
        if !self.open {
            return Ok(None);
        }
        let target = Arc::clone(&self.target);
        // Fails if the connection, and with it the transaction, was lost.
        self.client()?;
        self.open = false;
        let staged = matches!(self.role, Role::Writer { staged: true });
        let client = self.client.as_mut().expect("connected");
        let prepared = (|| {
            let xid = match staged {
                true => Some(client.query_one("SELECT txid_current()", &[])?.get(0)),
                false => None,
            };
            client.batch_execute(&format!(
                "INSERT INTO {MARKERS} (gid, prepared_at) VALUES ({name}, clock_timestamp()); \
                 PREPARE TRANSACTION {name};",
                name = literal(name)
            ))?;
            Ok(xid)
        })();
        prepared.map_err(|e: postgres::Error| {
            ConnectorError::external(format!(
                "PostgreSQL sink cannot prepare transaction '{name}' on {}: {}; the rows since \
                 the last checkpoint are written again after the restart",
                target.shown,
                describe(&e)
            ))
        })
    }

    fn commit(&mut self, prepared: &[Prepared]) -> Result<(), CommitError> {
        let target = Arc::clone(&self.target);
        let key = match &target.mode {
            WriteMode::Upsert { key } => Some(key),
            WriteMode::Append => None,
        };
        // Before anything commits: staged upserts this sink cannot merge.
        for transaction in prepared {
            let Some(staged) = &transaction.staged else {
                continue;
            };
            if key.is_none() || staged.table != target.staging_sql() {
                return Err(CommitError::Fail(ConnectorError::bad_input(format!(
                    "PostgreSQL sink cannot merge the upserts of transaction '{}' into '{}': \
                     they wait in {} under another mapping of the table than this job's; \
                     restore with the mapping that wrote them",
                    transaction.gid,
                    target.named(),
                    staged.table
                ))));
            }
        }
        let retention = match self.role {
            Role::Committer { retention, .. } => retention,
            Role::Writer { .. } => Duration::ZERO,
        };
        let retry = |e: ConnectorError| CommitError::Retry(e.message);
        let client = self.client().map_err(retry)?;
        for transaction in prepared {
            let name = &transaction.gid;
            match client.batch_execute(&format!("COMMIT PREPARED {}", literal(name))) {
                Ok(()) => {}
                Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => {
                    let marked = client
                        .query_opt(&format!("SELECT 1 FROM {MARKERS} WHERE gid = $1"), &[name])
                        .map_err(|e| CommitError::Retry(describe(&e)))?;
                    if marked.is_some() {
                        continue;
                    }
                    if may_be_pruned(transaction.prepared_at, retention, SystemTime::now()) {
                        tracing::warn!(
                            transaction = %name,
                            "PostgreSQL sink recommits a transaction older than \
                             sink.postgres.transaction-marker-retention that the server no \
                             longer knows: taken as committed before"
                        );
                        continue;
                    }
                    return Err(CommitError::Fail(ConnectorError::external(format!(
                        "PostgreSQL sink cannot commit transaction '{name}' on {}: it was \
                         rolled back outside Weir, so its rows are lost to the checkpoint that \
                         holds it; restore an earlier checkpoint to write them again",
                        target.shown
                    ))));
                }
                Err(e) => {
                    let error = format!(
                        "COMMIT PREPARED '{name}' on {}: {}",
                        target.shown,
                        describe(&e)
                    );
                    self.forget_if_closed();
                    return Err(CommitError::Retry(error));
                }
            }
        }
        if let Some(key) = key {
            self.merge(prepared, key)?;
        }
        self.prune();
        Ok(())
    }

    /// Merges the upserts `prepared` staged into the table and deletes them, in one
    /// transaction: merged before, they are gone, and nothing happens.
    fn merge(&mut self, prepared: &[Prepared], key: &[String]) -> Result<(), CommitError> {
        let xids: Vec<i64> = prepared
            .iter()
            .filter_map(|transaction| Some(transaction.staged.as_ref()?.xid))
            .collect();
        if xids.is_empty() {
            return Ok(());
        }
        let target = Arc::clone(&self.target);
        let retry = |e: ConnectorError| CommitError::Retry(e.message);
        let client = self.client().map_err(retry)?;
        let (merge, delete) = merge_sql(&target, key);
        let merged = (|| {
            let mut transaction = client.transaction()?;
            transaction.execute(&merge, &[&xids])?;
            transaction.execute(&delete, &[&xids])?;
            transaction.commit()
        })();
        let Err(e) = merged else {
            return Ok(());
        };
        let gids: Vec<&str> = prepared.iter().map(|t| t.gid.as_str()).collect();
        let what = format!(
            "PostgreSQL sink cannot merge the upserts of {gids:?} from {} into '{}' on {}: {}",
            target.staging_sql(),
            target.named(),
            target.shown,
            describe(&e)
        );
        // Rows the table refuses (a constraint the staging table does not have, a value out
        // of range): no retry helps, and the rows stay staged.
        let refused = e
            .code()
            .is_some_and(|code| code.code().starts_with("22") || code.code().starts_with("23"));
        if refused {
            return Err(CommitError::Fail(ConnectorError::bad_input(format!(
                "{what}; they stay in the staging table (\"__weir_xid\" in {xids:?}): fix the \
                 table or the rows there and restart the job, or delete them there to drop \
                 them"
            ))));
        }
        self.forget_if_closed();
        Err(CommitError::Retry(what))
    }

    /// Drops a connection that closed, so the next request connects again.
    fn forget_if_closed(&mut self) {
        if self.client.as_ref().is_some_and(Client::is_closed) {
            self.client = None;
        }
    }

    /// Deletes the markers this committer's subtask owns under its prefix that are older
    /// than the retention, once in a while (a failure waits for the next commit); a
    /// retention of 0 keeps them.
    fn prune(&mut self) {
        let Role::Committer { retention, owner } = &self.role else {
            return;
        };
        if retention.is_zero()
            || self
                .pruned
                .is_some_and(|at| at.elapsed() < PRUNE_EVERY.min(*retention))
        {
            return;
        }
        let Some(client) = self.client.as_mut() else {
            return;
        };
        let start = i32::try_from(owner.prefix.len() + 1).unwrap_or(i32::MAX);
        let (subtask, parallelism) = (owner.subtask as i64, owner.parallelism as i64);
        match client.execute(
            &format!(
                "DELETE FROM {MARKERS} WHERE gid LIKE $1 \
                 AND prepared_at < now() - make_interval(secs => $2) \
                 AND CASE WHEN split_part(substr(gid, $3), '-', 1) ~ '^[0-9]{{1,18}}$' \
                 THEN split_part(substr(gid, $3), '-', 1)::bigint % $4 = $5 ELSE false END"
            ),
            &[
                &like_prefix(&owner.prefix),
                &retention.as_secs_f64(),
                &start,
                &parallelism,
                &subtask,
            ],
        ) {
            Ok(deleted) => {
                self.pruned = Some(std::time::Instant::now());
                tracing::debug!(deleted, "PostgreSQL sink deleted old transaction markers");
            }
            Err(e) => {
                tracing::warn!(error = %describe(&e), "cannot delete old transaction markers")
            }
        }
    }

    fn abort(
        &mut self,
        prefixes: &[String],
        subtask: usize,
        parallelism: usize,
        keep: &[Prepared],
    ) -> Result<(), ConnectorError> {
        let shown = self.target.shown.clone();
        let failed = |e: postgres::Error| {
            ConnectorError::external(format!(
                "PostgreSQL sink cannot roll back the transactions an earlier run left on \
                 {shown}: {}",
                describe(&e)
            ))
        };
        let client = self.client()?;
        for prefix in prefixes {
            let rows = client
                .query(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() \
                     AND gid LIKE $1",
                    &[&like_prefix(prefix)],
                )
                .map_err(failed)?;
            for row in rows {
                let gid: String = row.get(0);
                let owner = gid[prefix.len()..]
                    .split('-')
                    .next()
                    .and_then(|s| s.parse::<usize>().ok());
                let ours = owner.is_some_and(|owner| owner % parallelism == subtask);
                if ours && !keep.iter().any(|kept| kept.gid == gid) {
                    client
                        .batch_execute(&format!("ROLLBACK PREPARED {}", literal(&gid)))
                        .map_err(failed)?;
                }
            }
        }
        Ok(())
    }
}

/// A `LIKE` pattern of the strings that start with `prefix`.
fn like_prefix(prefix: &str) -> String {
    format!(
        "{}%",
        prefix
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_")
    )
}

/// Whether the marker of a transaction prepared at `prepared_at` (µs since the epoch) may
/// have been deleted by `now` under `retention` (with a margin for the server's clock).
/// A retention of 0 keeps every marker.
fn may_be_pruned(prepared_at: i64, retention: Duration, now: SystemTime) -> bool {
    let age = Duration::from_micros(u64::try_from(micros(now) - prepared_at).unwrap_or(0));
    let margin = (retention / 2).min(Duration::from_secs(3600));
    !retention.is_zero() && age > retention.saturating_sub(margin)
}

/// An error with PostgreSQL's own message, when it sent one.
fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// COPY text rows as one text array per column (the statement keeps the last row of each key).
fn upsert_columns(
    rows: &[u8],
    columns: &[(String, PgType)],
    key: &[String],
) -> Result<Vec<Vec<Option<String>>>, ConnectorError> {
    let key_at: Vec<usize> = key
        .iter()
        .map(|k| {
            columns.iter().position(|(n, _)| n == k).ok_or_else(|| {
                ConnectorError::bad_input(format!(
                    "PostgreSQL sink upserts on '{k}', which the mapping does not fill"
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    debug_assert!(!key_at.is_empty());
    let mut by_column: Vec<Vec<Option<String>>> = vec![Vec::new(); columns.len()];
    for line in rows.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        for (column, cell) in by_column.iter_mut().zip(line.split(|&b| b == b'\t')) {
            column.push(unescape(cell));
        }
    }
    Ok(by_column)
}

/// A COPY text cell's value.
fn unescape(cell: &[u8]) -> Option<String> {
    if cell == b"\\N" {
        return None;
    }
    let mut out = Vec::with_capacity(cell.len());
    let mut bytes = cell.iter();
    while let Some(&b) = bytes.next() {
        if b == b'\\' {
            match bytes.next() {
                Some(b't') => out.push(b'\t'),
                Some(b'n') => out.push(b'\n'),
                Some(b'r') => out.push(b'\r'),
                Some(&other) => out.push(other),
                None => out.push(b'\\'),
            }
        } else {
            out.push(b);
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// The upsert of one batch: its rows as text arrays, cast to the columns' types, the last of
/// each key (as PostgreSQL compares the cast values) inserted or updating the row there.
fn upsert_sql(target: &Target, key: &[String]) -> String {
    let arrays: Vec<String> = (1..=target.columns.len())
        .map(|i| format!("${i}::text[]"))
        .collect();
    let values: Vec<String> = (1..=target.columns.len())
        .map(|i| format!("v{i}"))
        .collect();
    let casts: Vec<String> = target
        .columns
        .iter()
        .enumerate()
        .map(|(i, (name, ty))| format!("u.v{}::{} AS {}", i + 1, ty.sql(), ident(name)))
        .collect();
    let from = format!(
        "unnest({}) WITH ORDINALITY AS u({}, ord)",
        arrays.join(", "),
        values.join(", ")
    );
    upsert_latest(target, key, &casts.join(", "), &from, "u.ord")
}

/// The merge of staged upserts into the table (the last staged row of each key), and the
/// deletion of what it merged: the rows the transactions with the ids `$1` (a bigint array)
/// staged.
fn merge_sql(target: &Target, key: &[String]) -> (String, String) {
    let staged = format!("{} WHERE {STAGED_XID} = ANY($1)", target.staging_sql());
    (
        upsert_latest(target, key, &target.column_list(), &staged, STAGED_SEQ),
        format!("DELETE FROM {staged}"),
    )
}

/// `INSERT` of the last row of each key of `SELECT select FROM from` (the greatest `order`),
/// updating the row of its key that the table has.
fn upsert_latest(target: &Target, key: &[String], select: &str, from: &str, order: &str) -> String {
    let updates: Vec<String> = target
        .columns
        .iter()
        .filter(|(name, _)| !key.contains(name))
        .map(|(name, _)| format!("{0} = EXCLUDED.{0}", ident(name)))
        .collect();
    let keys: Vec<String> = key.iter().map(|k| ident(k)).collect();
    let action = if updates.is_empty() {
        "NOTHING".to_string()
    } else {
        format!("UPDATE SET {}", updates.join(", "))
    };
    format!(
        "INSERT INTO {table} ({columns}) SELECT {columns} FROM (SELECT DISTINCT ON ({keys}) \
         {select} FROM {from} ORDER BY {keys}, {order} DESC) AS latest \
         ON CONFLICT ({keys}) DO {action}",
        table = target.table_sql(),
        columns = target.column_list(),
        keys = keys.join(", "),
    )
}

/// The prefix of every transaction name of the operator `operator_id` of job `job` writing
/// into `table`: a restore rolls back what its own sink left, never another job's (or another
/// table's) prepared transactions; the prefixes a checkpoint's run used are kept in it, so a
/// job renamed since rolls back what its old name left too.
fn prefix(operator_id: &str, job: &str, table: &str) -> String {
    let short: String = operator_id.chars().take(16).collect();
    format!("weir-{short}-{:08x}-", stable_hash(&[job, table]))
}

/// FNV-1a of `parts` (separated): stable across builds.
fn stable_hash(parts: &[&str]) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, part) in parts.iter().enumerate() {
        let separator = (i > 0).then_some(0u8);
        for byte in separator.into_iter().chain(part.bytes()) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash as u32
}

struct PgWriter<T> {
    to_row: Arc<ToRow<T>>,
    columns: usize,
    client: ClientThread,
    rows: Vec<u8>,
    /// Bytes of rows handed over since the last prepare (0: no open transaction).
    written: usize,
    /// Transactions the writer prepared by itself (at `roll_bytes`), not yet handed on.
    closed: Vec<Prepared>,
    /// The staging table its rows wait in until the commit merges them (exactly-once
    /// upserts).
    staging: Option<String>,
    subtask: u32,
    /// `sink.postgres.max-transaction-size`.
    roll_bytes: usize,
    /// `<prefix><subtask>-<run>-`: a run's transactions, numbered after it.
    names: String,
    /// The job's name, as a transaction name takes it (for whoever reads
    /// `pg_prepared_xacts`; the operator's id in the prefix is what recovery matches).
    job: String,
    next: u64,
}

impl<T> PgWriter<T> {
    fn encode(&mut self, records: &mut Vec<T>) -> Result<(), ConnectorError> {
        for record in records.drain(..) {
            let mut row = Row {
                out: &mut self.rows,
                values: 0,
            };
            (self.to_row)(&record, &mut row);
            let values = row.values;
            if values != self.columns {
                return Err(ConnectorError::bad_input(format!(
                    "PostgreSQL sink: a record's mapping pushed {values} values for {} columns; \
                     push one value per column, in their order",
                    self.columns
                )));
            }
            self.rows.push(b'\n');
        }
        Ok(())
    }

    async fn hand_over(&mut self) -> Result<(), ConnectorError> {
        if self.rows.is_empty() {
            return Ok(());
        }
        let rows = std::mem::replace(&mut self.rows, Vec::with_capacity(BATCH_BYTES + 4096));
        self.written += rows.len();
        self.client.send(Request::Write(rows)).await
    }

    async fn write_batch(&mut self, records: &mut Vec<T>) -> Result<(), ConnectorError> {
        self.encode(records)?;
        if self.rows.len() >= BATCH_BYTES.min(self.roll_bytes) {
            self.hand_over().await?;
            if self.written >= self.roll_bytes {
                if let Some(name) = self.prepare_open("roll").await? {
                    self.closed.push(name);
                }
            }
        }
        Ok(())
    }

    /// At a barrier (`tag`: `chk<n>`) or the input's end (`end`).
    async fn prepare(&mut self, tag: &str) -> Result<Vec<Prepared>, ConnectorError> {
        self.hand_over().await?;
        let mut closed = std::mem::take(&mut self.closed);
        closed.extend(self.prepare_open(tag).await?);
        Ok(closed)
    }

    /// Prepares the open transaction, if rows went into one: its name,
    /// `<prefix><subtask>-<run>-<n>-<tag>-<job>`.
    async fn prepare_open(&mut self, tag: &str) -> Result<Option<Prepared>, ConnectorError> {
        if self.written == 0 {
            return Ok(None);
        }
        self.written = 0;
        let gid = format!("{}{}-{tag}-{}", self.names, self.next, self.job);
        self.next += 1;
        let (reply, answer) = oneshot::channel();
        self.client
            .send(Request::Prepare(gid.clone(), reply))
            .await?;
        let xid = answer.await.map_err(|_| gone())??;
        let staged = self.staging.clone().zip(xid);
        Ok(Some(Prepared {
            gid,
            subtask: self.subtask,
            prepared_at: micros(SystemTime::now()),
            staged: staged.map(|(table, xid)| Staged { table, xid }),
        }))
    }
}

impl<T: 'static> TransactionWriter<T, Prepared> for PgWriter<T> {
    fn write<'a>(
        &'a mut self,
        batch: &'a mut Vec<T>,
        _timestamps: &'a [i64],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>> {
        Box::pin(self.write_batch(batch))
    }

    fn prepare_commit(
        &mut self,
        checkpoint: Option<u64>,
    ) -> LocalBoxFuture<'_, Result<Vec<Prepared>, ConnectorError>> {
        let tag = checkpoint.map_or_else(|| "end".to_string(), |c| format!("chk{c}"));
        Box::pin(async move { self.prepare(&tag).await })
    }

    fn take_closed(&mut self) -> Vec<Prepared> {
        std::mem::take(&mut self.closed)
    }
}

/// `time` in microseconds since the Unix epoch.
fn micros(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

struct PgCommitter {
    client: ClientThread,
    prefix: String,
    subtask: usize,
    parallelism: usize,
}

impl Committer<Prepared> for PgCommitter {
    fn commit<'a>(
        &'a mut self,
        committables: &'a [Prepared],
    ) -> LocalBoxFuture<'a, Result<(), CommitError>> {
        Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            self.client
                .send(Request::Commit(committables.to_vec(), reply))
                .await
                .map_err(CommitError::Fail)?;
            answer.await.map_err(|_| CommitError::Fail(gone()))?
        })
    }

    fn abort_lingering<'a>(
        &'a mut self,
        keep: &'a [Prepared],
        earlier: &'a [String],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>> {
        Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            let prefixes = std::iter::once(&self.prefix).chain(earlier).cloned();
            let request = Request::Abort {
                prefixes: prefixes.collect(),
                subtask: self.subtask,
                parallelism: self.parallelism,
                keep: keep.to_vec(),
                reply,
            };
            self.client.send(request).await?;
            answer.await.map_err(|_| gone())?
        })
    }

    fn scope(&self) -> Option<String> {
        Some(self.prefix.clone())
    }

    fn writer_of(&self, committable: &Prepared) -> Option<usize> {
        Some(committable.subtask as usize)
    }
}

impl<T: 'static> TwoPhaseCommitSink<T> for PostgresSink<T> {
    type Committable = Prepared;

    fn create_writer(
        &self,
        ctx: &RuntimeContext,
    ) -> Result<Box<dyn TransactionWriter<T, Prepared>>, ConnectorError> {
        let run = micros(SystemTime::now());
        let guarantee = self.guarantee.unwrap_or(ctx.sinks.delivery_guarantee);
        let staged = matches!(self.target.mode, WriteMode::Upsert { .. })
            && guarantee == DeliveryGuarantee::ExactlyOnce;
        let role = Role::Writer { staged };
        Ok(Box::new(PgWriter {
            to_row: Arc::clone(&self.to_row),
            columns: self.target.columns.len(),
            client: ClientThread::start(Arc::clone(&self.target), role, ctx),
            rows: Vec::with_capacity(BATCH_BYTES + 4096),
            written: 0,
            closed: Vec::new(),
            staging: staged.then(|| self.target.staging_sql()),
            subtask: u32::try_from(ctx.subtask).unwrap_or(u32::MAX),
            roll_bytes: usize::try_from(ctx.sinks.max_transaction_bytes)
                .unwrap_or(usize::MAX)
                .max(1),
            names: format!(
                "{}{}-{run}-",
                prefix(&ctx.state.operator_id, &ctx.job_name, &self.target.named()),
                ctx.subtask
            ),
            job: ctx
                .job_name
                .chars()
                .take(64)
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect(),
            next: 0,
        }))
    }

    fn create_committer(
        &self,
        ctx: &RuntimeContext,
    ) -> Result<Box<dyn Committer<Prepared>>, ConnectorError> {
        let prefix = prefix(&ctx.state.operator_id, &ctx.job_name, &self.target.named());
        let role = Role::Committer {
            retention: ctx.sinks.marker_retention,
            owner: Owner {
                prefix: prefix.clone(),
                subtask: ctx.subtask,
                parallelism: ctx.parallelism,
            },
        };
        Ok(Box::new(PgCommitter {
            client: ClientThread::start(Arc::clone(&self.target), role, ctx),
            prefix,
            subtask: ctx.subtask,
            parallelism: ctx.parallelism,
        }))
    }

    fn delivery_guarantee(&self) -> Option<DeliveryGuarantee> {
        self.guarantee
    }
}

impl<T: 'static> Sink<T> for PostgresSink<T> {
    fn create_writer(
        &self,
        ctx: &RuntimeContext,
    ) -> Result<Box<dyn SinkWriter<T>>, ConnectorError> {
        two_phase_writer(self, ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_copy_text_and_read_back() {
        let mut out = Vec::new();
        let mut row = Row {
            out: &mut out,
            values: 0,
        };
        row.int(-3).text("a\tb\\c\nd").null().bool(true).float(1.5);
        assert_eq!(out, b"-3\ta\\tb\\\\c\\nd\t\\N\tt\t1.5");
        let cells: Vec<Option<String>> = out.split(|&b| b == b'\t').map(unescape).collect();
        assert_eq!(
            cells,
            [
                Some("-3".to_string()),
                Some("a\tb\\c\nd".to_string()),
                None,
                Some("t".to_string()),
                Some("1.5".to_string())
            ]
        );
    }

    #[test]
    fn upserts_go_as_one_array_per_column() {
        let columns = vec![
            ("k".to_string(), PgType::Integer),
            ("v".to_string(), PgType::Text),
        ];
        let rows = b"1\ta\n2\t\\N\n1\tc\n";
        let by_column = upsert_columns(rows, &columns, &["k".to_string()]).unwrap();
        let text = |s: &str| Some(s.to_string());
        assert_eq!(
            by_column,
            [
                vec![text("1"), text("2"), text("1")],
                vec![text("a"), None, text("c")]
            ]
        );
        assert!(upsert_columns(rows, &columns, &["x".to_string()]).is_err());
    }

    #[test]
    fn passwords_are_hidden_in_urls_and_settings() {
        assert_eq!(
            hide_password("postgres://u:p@ss@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(hide_password("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            hide_password("host=h user=u password=secret dbname=db"),
            "host=h user=u password=*** dbname=db"
        );
    }

    #[test]
    fn transaction_prefixes_differ_by_job_and_table() {
        let a = prefix("0123456789abcdef0123", "job", "t1");
        assert!(a.starts_with("weir-0123456789abcdef-"), "{a}");
        assert_ne!(a, prefix("0123456789abcdef0123", "job", "t2"));
        assert_ne!(a, prefix("0123456789abcdef0123", "other", "t1"));
        assert_eq!(a, prefix("0123456789abcdef0123", "job", "t1"));
    }

    #[test]
    fn a_marker_may_be_pruned_only_past_the_retention_less_a_margin() {
        let now = UNIX_EPOCH + Duration::from_secs(2_000_000_000);
        let at = |ago: Duration| {
            i64::try_from((now - ago).duration_since(UNIX_EPOCH).unwrap().as_micros()).unwrap()
        };
        let week = Duration::from_secs(7 * 86_400);
        assert!(!may_be_pruned(at(Duration::from_secs(60)), week, now));
        // The margin (an hour, at most half the retention) covers the server's clock.
        assert!(!may_be_pruned(
            at(week - Duration::from_secs(3601)),
            week,
            now
        ));
        assert!(may_be_pruned(
            at(week - Duration::from_secs(3599)),
            week,
            now
        ));
        assert!(may_be_pruned(at(week * 2), week, now));
        let second = Duration::from_secs(1);
        assert!(!may_be_pruned(at(Duration::from_millis(400)), second, now));
        assert!(may_be_pruned(at(Duration::from_millis(600)), second, now));
        // A retention of 0 keeps every marker.
        assert!(!may_be_pruned(at(week * 2), Duration::ZERO, now));
        // A transaction from the future (clocks apart) is never taken as pruned.
        assert!(!may_be_pruned(at(Duration::ZERO) + 5_000_000, week, now));
    }

    #[test]
    fn staging_tables_are_named_by_table_and_mapping() {
        let sink = |columns: &[(&str, PgType)], key: &[&str]| {
            PostgresSink::<u64>::new("postgres://h/db", "s.totals", columns, |_, _| {})
                .unwrap()
                .upsert(key)
        };
        let a = sink(&[("k", PgType::Integer), ("v", PgType::BigInt)], &["k"]);
        let staging = a.target.staging_sql();
        assert!(
            staging.starts_with("\"s\".\"weir_staged_totals_"),
            "{staging}"
        );
        let b = sink(&[("k", PgType::Integer), ("v", PgType::Text)], &["k"]);
        assert_ne!(staging, b.target.staging_sql(), "another type");
        let c = sink(
            &[("k", PgType::Integer), ("v", PgType::BigInt)],
            &["k", "v"],
        );
        assert_ne!(staging, c.target.staging_sql(), "another key");
        let (merge, delete) = merge_sql(&a.target, &["k".to_string()]);
        assert!(
            merge.starts_with("INSERT INTO \"s\".\"totals\" (\"k\", \"v\") SELECT")
                && merge.contains(&format!("FROM {staging} WHERE \"__weir_xid\" = ANY($1)"))
                && merge.contains("ORDER BY \"k\", \"__weir_seq\" DESC")
                && merge.ends_with("ON CONFLICT (\"k\") DO UPDATE SET \"v\" = EXCLUDED.\"v\""),
            "{merge}"
        );
        assert!(
            delete.starts_with(&format!("DELETE FROM {staging} WHERE")),
            "{delete}"
        );
    }

    #[test]
    fn urls_name_their_table_and_hide_passwords() {
        let sink = PostgresSink::<u64>::from_url(
            "postgres://weir:secret@127.0.0.1:5432/db/public.echo",
            &[("n", PgType::BigInt)],
            |n, row| {
                row.int(*n as i64);
            },
        )
        .unwrap();
        assert_eq!(sink.target.url, "postgres://weir:secret@127.0.0.1:5432/db");
        assert_eq!(sink.target.shown, "postgres://weir:***@127.0.0.1:5432/db");
        assert_eq!(sink.target.named(), "public.echo");
        let refused = PostgresSink::<u64>::from_url("postgres://h/db", &[], |_, _| {});
        assert!(refused.is_err());
        let error = PostgresSink::<u64>::from_url(
            "postgres://h:5432/echo",
            &[("n", PgType::BigInt)],
            |_, _| {},
        )
        .err()
        .unwrap();
        assert!(
            error.message.contains("names no table"),
            "{}",
            error.message
        );
    }
}
