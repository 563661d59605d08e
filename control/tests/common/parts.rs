//! Reading the part files a file sink committed (shared by the tests that check its output).

use std::path::Path;

/// The lines of an output directory's committed part files, each subtask's parts in the order
/// they were written; fails on a file the sink left uncommitted.
pub fn read_parts(dir: &Path) -> Vec<String> {
    let mut parts = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the output directory") {
        let path = entry.expect("an entry").path();
        let name = path
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        let (subtask, n) = name
            .strip_prefix("part-")
            .and_then(|rest| rest.split_once('-'))
            .unwrap_or_else(|| panic!("'{name}' is left in the output directory"));
        let order: (usize, u64) = (
            subtask.parse().expect("a subtask"),
            n.parse().expect("a number"),
        );
        parts.push((order, path));
    }
    parts.sort();
    let mut lines = Vec::new();
    for (_, path) in parts {
        let text = std::fs::read_to_string(&path).expect("a part file");
        lines.extend(text.lines().map(str::to_string));
    }
    lines
}
