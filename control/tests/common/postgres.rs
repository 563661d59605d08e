//! A throw-away PostgreSQL cluster for tests: Debian's server binaries, a data directory in a
//! temporary directory, `max_prepared_transactions` on, listening on a free loopback port;
//! run as `nobody` when the tests run as root (PostgreSQL refuses root), stopped by its pid.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running cluster.
pub struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    pub port: u16,
    server: Option<Child>,
    /// `max_prepared_transactions`.
    prepared: u32,
}

/// The newest `/usr/lib/postgresql/<version>/bin` with a server in it.
fn server_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// A command run as `nobody` when this process is root.
fn unprivileged(program: &Path) -> Command {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let mut command = Command::new("setpriv");
        command.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
        command.arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

impl Cluster {
    /// Starts a cluster; `None` (said loudly) when this machine has no PostgreSQL server,
    /// unless `WEIR_REQUIRE_POSTGRES` is set (`.ci/run` sets it), which makes that a failure.
    pub fn start() -> Option<Cluster> {
        Cluster::start_with_prepared(64)
    }

    /// A cluster with `max_prepared_transactions = prepared`.
    pub fn start_with_prepared(prepared: u32) -> Option<Cluster> {
        let Some(bin) = server_bin() else {
            let why = "no PostgreSQL server under /usr/lib/postgresql (apt-get install postgresql)";
            if std::env::var_os("WEIR_REQUIRE_POSTGRES").is_some() {
                panic!("{why}, and WEIR_REQUIRE_POSTGRES is set");
            }
            eprintln!("SKIPPED: {why}");
            return None;
        };
        let dir = tempfile::tempdir().expect("a temporary directory");
        let data = dir.path().join("data");
        std::fs::create_dir(&data).expect("the data directory");
        // SAFETY: chown and chmod of paths this test created.
        unsafe {
            if libc::geteuid() == 0 {
                for path in [dir.path(), data.as_path()] {
                    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
                    libc::chmod(c.as_ptr(), 0o755);
                }
                let c = std::ffi::CString::new(data.as_os_str().as_encoded_bytes()).unwrap();
                libc::chown(c.as_ptr(), 65534, 65534);
                libc::chmod(c.as_ptr(), 0o700);
            }
        }
        let init = unprivileged(&bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "weir",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ])
            .stdout(Stdio::null())
            .output()
            .expect("run initdb");
        assert!(
            init.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        let mut cluster = Cluster {
            dir,
            bin,
            port: free_port(),
            server: None,
            prepared,
        };
        cluster.run();
        Some(cluster)
    }

    /// Starts the server and waits until it takes connections.
    fn run(&mut self) {
        let data = self.dir.path().join("data");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .expect("the server's log");
        let server = unprivileged(&self.bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(&data)
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                &format!("max_prepared_transactions={}", self.prepared),
                "-c",
                "max_connections=64",
                "-c",
                "fsync=off",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start postgres");
        self.server = Some(server);
        let started = Instant::now();
        while postgres::Client::connect(&self.url(), postgres::NoTls).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "postgres did not start: {}",
                std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server (fast shutdown: sessions end, prepared transactions stay).
    fn stop(&mut self) {
        if let Some(mut server) = self.server.take() {
            // SAFETY: a signal to the process this test started, by its pid.
            unsafe { libc::kill(server.id() as libc::pid_t, libc::SIGINT) };
            let _ = server.wait();
        }
    }

    /// Stops the server and starts it again.
    pub fn restart(&mut self) {
        self.stop();
        self.run();
    }

    /// The database's URL.
    pub fn url(&self) -> String {
        format!("postgres://weir@127.0.0.1:{}/postgres", self.port)
    }

    /// A connection.
    pub fn client(&self) -> postgres::Client {
        postgres::Client::connect(&self.url(), postgres::NoTls).expect("connect to postgres")
    }

    /// Runs `sql` (statements separated by `;`).
    pub fn execute(&self, sql: &str) {
        self.client()
            .batch_execute(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The first column of the one row `sql` returns, as a count.
    pub fn count(&self, sql: &str) -> i64 {
        self.client()
            .query_one(sql, &[])
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .get(0)
    }

    /// Creates the echo job's table `echo`, with an `id` in the order rows are written.
    pub fn create_echo_table(&self) {
        self.execute(
            "CREATE TABLE echo (id bigserial PRIMARY KEY, key integer NOT NULL, \
             seq bigint NOT NULL, count bigint NOT NULL)",
        );
    }

    /// The rows of `echo` as (key, seq, count), in the order they were written.
    pub fn echo_rows(&self) -> Vec<(u32, u64, u64)> {
        self.client()
            .query("SELECT key, seq, count FROM echo ORDER BY id", &[])
            .expect("read the table")
            .iter()
            .map(|row| {
                (
                    row.get::<_, i32>(0) as u32,
                    row.get::<_, i64>(1) as u64,
                    row.get::<_, i64>(2) as u64,
                )
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}
