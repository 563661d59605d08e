//! Byte counts as people read them in budgets and error messages.

use std::fmt;

const MIB: u64 = 1 << 20;

/// Bytes shown in MiB: whole numbers as `512 MiB`, others with one decimal, `409.6 MiB`;
/// under 1 MiB, whole KiB as `32 KiB`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mib(pub(crate) u64);

impl fmt::Display for Mib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = if self.0.is_multiple_of(MIB) {
            format!("{} MiB", self.0 / MIB)
        } else if self.0 < MIB && self.0.is_multiple_of(1024) {
            format!("{} KiB", self.0 / 1024)
        } else {
            format!("{:.1} MiB", self.0 as f64 / MIB as f64)
        };
        // Honour width and alignment, so that tables line up.
        f.pad(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_and_fractional_mebibytes() {
        assert_eq!(Mib(512 << 20).to_string(), "512 MiB");
        assert_eq!(Mib(429_496_729).to_string(), "409.6 MiB");
        assert_eq!(Mib(0).to_string(), "0 MiB");
        assert_eq!(Mib(32 << 10).to_string(), "32 KiB");
        assert_eq!(Mib(1000).to_string(), "0.0 MiB");
        assert_eq!(format!("{:>10}", Mib(1 << 30)), "  1024 MiB");
    }
}
