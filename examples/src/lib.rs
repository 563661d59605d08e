//! Example Weir jobs, written with the DataStream API exactly as a user would write them.
//! `weir run <name>` runs them embedded on all cores; the tests in this crate check their
//! output against references computed directly.
#![warn(missing_docs)]

pub mod keyed_aggregation;
pub mod sequence_check;
pub mod window_check;
pub mod word_count;

/// Where an example writes its results.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Print each result to stdout (`subtask> record`).
    Print,
    /// Write `part-<subtask>` files of lines into this directory.
    Files(std::path::PathBuf),
    /// Drop the results (measure throughput only).
    Discard,
}
