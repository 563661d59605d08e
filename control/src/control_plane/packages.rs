//! Job packages: the built-in one (the `weir` binary) and those uploaded over
//! `POST /jars/upload`, kept in `control.data-dir/jars/<id>/` (the executable and what it
//! said it holds). An upload is checked before it is kept: the file must answer
//! `--weir-package-info` within [`INFO_TIMEOUT`] with its jobs and the executor protocol this
//! Weir speaks.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use weir_engine::package::{PackageInfo, PROTOCOL_VERSION};

use super::cluster::now_ms;

/// How long an uploaded file may take to say what it holds.
pub const INFO_TIMEOUT: Duration = Duration::from_secs(10);

/// The built-in package's id.
pub const BUILTIN: &str = "weir-builtin";

/// Checks a job's program arguments: why they are refused.
pub type ArgsCheck = fn(&[String]) -> Result<(), String>;

/// A package jobs are run from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Package {
    /// Its id in `/jars`.
    pub id: String,
    /// The uploaded file's name.
    pub file_name: String,
    /// What it holds.
    pub info: PackageInfo,
    /// When it was registered, ms since the epoch.
    pub uploaded: i64,
    /// Checks a job's program arguments before it is accepted (the built-in package's; an
    /// uploaded package checks its own when its job is built).
    #[serde(skip)]
    pub check_args: Option<ArgsCheck>,
}

/// Every package, and where uploaded ones are kept.
#[derive(Debug)]
pub(crate) struct Packages {
    dir: PathBuf,
    list: Vec<Package>,
}

/// Why an upload is refused: a message for a 400.
#[derive(Debug)]
pub(crate) struct NotAPackage(pub String);

impl Packages {
    /// The built-in package and those kept in `dir` (created if missing).
    pub fn open(dir: &Path, builtin: Package) -> Result<Packages> {
        std::fs::create_dir_all(dir).with_context(|| {
            format!(
                "cannot create {}; set control.data-dir to a writable directory",
                dir.display()
            )
        })?;
        let mut list = vec![builtin];
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            // What an upload cut short left (a staging directory, a temporary file).
            if entry.file_name().to_string_lossy().starts_with('.') {
                let _ = std::fs::remove_dir_all(entry.path());
                continue;
            }
            let path = entry.path().join("info.json");
            match std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|bytes| {
                    serde_json::from_slice::<Package>(&bytes).map_err(|e| e.to_string())
                }) {
                Ok(package) if entry.file_name().to_string_lossy() == package.id => {
                    if package.info.protocol != PROTOCOL_VERSION {
                        tracing::warn!(
                            "package {} speaks executor protocol {}, this Weir {PROTOCOL_VERSION}: \
                             its jobs are refused until it is rebuilt and uploaded again",
                            package.id,
                            package.info.protocol
                        );
                    }
                    list.push(package)
                }
                Ok(package) => tracing::error!(
                    "package directory {} holds package {}; it is left out",
                    entry.path().display(),
                    package.id
                ),
                Err(error) if path.parent().is_some_and(|p| p.join("package").exists()) => {
                    tracing::error!(
                        "package {} cannot be read ({error}); it is left out",
                        path.display()
                    );
                }
                // An upload cut short: nothing was kept.
                Err(_) => {}
            }
        }
        list.sort_by_key(|p| p.uploaded);
        Ok(Packages {
            dir: dir.to_path_buf(),
            list,
        })
    }

    /// Every package, oldest first.
    pub fn list(&self) -> &[Package] {
        &self.list
    }

    /// Package `id`.
    pub fn get(&self, id: &str) -> Option<&Package> {
        self.list.iter().find(|p| p.id == id)
    }

    /// The executable of uploaded package `id`.
    pub fn executable(&self, id: &str) -> Option<PathBuf> {
        (id != BUILTIN && self.get(id).is_some()).then(|| self.dir.join(id).join("package"))
    }

    /// Where uploaded packages are kept.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Adds a package [`checked`] kept in this directory.
    pub fn add(&mut self, package: Package) {
        self.list.push(package);
    }

    /// Removes uploaded package `id`.
    pub fn remove(&mut self, id: &str) -> Result<()> {
        std::fs::remove_dir_all(self.dir.join(id))?;
        self.list.retain(|p| p.id != id);
        Ok(())
    }
}

/// An upload under way: a staging directory in the packages' directory, removed unless the
/// upload is kept (also when the request is dropped half way).
pub(crate) struct Staging {
    pub id: String,
    pub dir: PathBuf,
    kept: bool,
}

impl Staging {
    /// A staging directory in `packages` for a file named `file_name`.
    pub fn new(packages: &Path, file_name: &str) -> Staging {
        let clean: String = file_name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        let id = format!("{:016x}_{clean}", super::nonce());
        let dir = packages.join(format!(".{id}"));
        Staging {
            id,
            dir,
            kept: false,
        }
    }

    /// The uploaded executable.
    pub fn executable(&self) -> PathBuf {
        self.dir.join("package")
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Checks the executable uploaded into `staging` and keeps it under the packages' directory
/// `packages` (the list is the caller's to update).
pub(crate) async fn checked(
    mut staging: Staging,
    file_name: String,
    packages: &Path,
) -> Result<Result<Package, NotAPackage>> {
    let executable = staging.executable();
    std::fs::set_permissions(&executable, std::fs::Permissions::from_mode(0o755))?;
    let info = match describe(&executable, &file_name).await {
        Ok(info) => info,
        Err(refusal) => return Ok(Err(refusal)),
    };
    let package = Package {
        id: staging.id.clone(),
        file_name,
        info,
        uploaded: now_ms(),
        check_args: None,
    };
    // The directory's name is the package's id; a staging directory (a dot name) is never
    // loaded, so a crash before the rename keeps nothing.
    std::fs::write(
        staging.dir.join("info.json"),
        serde_json::to_vec_pretty(&package)?,
    )?;
    std::fs::rename(&staging.dir, packages.join(&package.id))?;
    staging.kept = true;
    std::fs::File::open(packages)?.sync_all()?;
    Ok(Ok(package))
}

/// Most of a package's answer to `--weir-package-info` read.
const INFO_LIMIT: u64 = 1 << 20;

/// Asks an uploaded executable what it holds: run with no environment, in an empty
/// directory, in a process group of its own that is killed whole after [`INFO_TIMEOUT`].
async fn describe(executable: &Path, file_name: &str) -> Result<PackageInfo, NotAPackage> {
    let refuse = |why: String| {
        NotAPackage(format!(
            "'{file_name}' is not a Weir job package: {why}; a package is an executable built \
             against weir-engine whose main calls weir_engine::package::main"
        ))
    };
    let cwd = executable.parent().unwrap_or(Path::new("/"));
    let mut child = match tokio::process::Command::new(executable)
        .arg("--weir-package-info")
        .env_clear()
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
    {
        Ok(child) => child,
        Err(error) => return Err(refuse(format!("it does not run here ({error})"))),
    };
    let group = child.id();
    let mut stdout = child.stdout.take().expect("piped");
    let read = async {
        let mut answer = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(
            &mut tokio::io::AsyncReadExt::take(&mut stdout, INFO_LIMIT),
            &mut answer,
        )
        .await
        .map(|_| answer)
    };
    let answer = tokio::time::timeout(INFO_TIMEOUT, read).await;
    if let Some(group) = group {
        // SAFETY: killpg of the process group this child leads (it was started with one of
        // its own), whatever it left running.
        unsafe {
            libc::killpg(group as libc::pid_t, libc::SIGKILL);
        }
    }
    let _ = child.wait().await;
    let answer = match answer {
        Ok(Ok(answer)) => answer,
        Ok(Err(error)) => return Err(refuse(format!("its answer cannot be read ({error})"))),
        Err(_) => {
            return Err(refuse(format!(
                "it did not answer --weir-package-info within {INFO_TIMEOUT:?}"
            )))
        }
    };
    let info: PackageInfo = serde_json::from_slice(&answer)
        .map_err(|_| refuse("it does not answer --weir-package-info".into()))?;
    if info.protocol != PROTOCOL_VERSION {
        return Err(NotAPackage(format!(
            "package '{}' speaks executor protocol {} (engine {}), this Weir {PROTOCOL_VERSION} \
             (engine {}); rebuild it against this Weir release",
            info.package,
            info.protocol,
            info.engine_version,
            weir_engine::package::ENGINE_VERSION
        )));
    }
    if info.jobs.is_empty() {
        return Err(refuse("it holds no job".into()));
    }
    Ok(info)
}
