//! The control plane's durable store: one JSON file per job under `<control.data-dir>/jobs/`,
//! each replaced atomically (written to a temporary file, synced, renamed over the old one,
//! and the directory synced), so that a control plane killed at any moment finds every job as
//! it last stored it.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{de::DeserializeOwned, Serialize};

/// Where the jobs are kept.
#[derive(Debug)]
pub struct Store {
    jobs: PathBuf,
}

impl Store {
    /// Opens (creating it if missing) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Store> {
        let jobs = dir.join("jobs");
        fs::create_dir_all(&jobs).with_context(|| {
            format!(
                "cannot create the control plane's store {}; set control.data-dir to a \
                 writable directory",
                jobs.display()
            )
        })?;
        Ok(Store { jobs })
    }

    /// Stores `value` as job `id`.
    pub fn put<T: Serialize>(&self, id: &str, value: &T) -> Result<()> {
        let path = self.jobs.join(format!("{id}.json"));
        let temp = self.jobs.join(format!(".{id}.json.tmp"));
        let bytes = serde_json::to_vec_pretty(value)?;
        let write = || -> std::io::Result<()> {
            let mut file = File::create(&temp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            fs::rename(&temp, &path)?;
            File::open(&self.jobs)?.sync_all()
        };
        write().with_context(|| format!("cannot store job {id} in {}", path.display()))
    }

    /// Every stored job, and a message for each file that cannot be read (it is left where it
    /// is, for an operator to look at).
    pub fn load<T: DeserializeOwned>(&self) -> Result<(Vec<T>, Vec<String>)> {
        let mut values = Vec::new();
        let mut problems = Vec::new();
        let entries = fs::read_dir(&self.jobs)
            .with_context(|| format!("cannot list {}", self.jobs.display()))?;
        for entry in entries {
            let path = entry?.path();
            let is_job = path.extension().is_some_and(|e| e == "json")
                && !path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if !is_job {
                continue;
            }
            match fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|e| e.to_string()))
            {
                Ok(value) => values.push(value),
                Err(error) => problems.push(format!(
                    "stored job {} cannot be read ({error}); it is left out — move the file \
                     away to silence this",
                    path.display()
                )),
            }
        }
        Ok((values, problems))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_jobs_come_back_and_unreadable_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.put("a", &vec![1, 2]).unwrap();
        store.put("b", &vec![3]).unwrap();
        store.put("a", &vec![4]).unwrap();
        fs::write(dir.path().join("jobs/c.json"), b"{torn").unwrap();
        let (mut values, problems): (Vec<Vec<i32>>, _) = store.load().unwrap();
        values.sort();
        assert_eq!(values, vec![vec![3], vec![4]]);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("c.json"), "{}", problems[0]);
    }
}
