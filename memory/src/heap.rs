//! The heap share's check: what a shard calls to fail its job, with a message that says what
//! to change, when its heap use outgrows its slot's heap share.
//!
//! The usage comes from the counting allocator ([`crate::current_thread_net_bytes`] on the
//! shard's thread); the share from [`crate::SlotBudget::heap`]. Restarting does not help a job
//! that fails this check, so the control plane treats it as a user error.

use crate::units::Mib;

/// A piece of heap-backend state, named for the error message: usually a slot's largest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeapStateSize {
    /// The operator that owns the state, e.g. `window-agg`.
    pub operator: String,
    /// The state's name, from its descriptor, e.g. `counts`.
    pub state: String,
    /// The state's estimated size in the heap, in bytes.
    pub bytes: u64,
}

/// A slot used more heap than its share.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message())]
pub struct HeapBudgetExceeded {
    /// The slot (= shard) index.
    pub slot: usize,
    /// Heap bytes the slot's shard uses.
    pub used: u64,
    /// The slot's heap share, in bytes.
    pub budget: u64,
    /// The slot's largest heap-backend state, if it has any.
    pub largest_state: Option<HeapStateSize>,
}

impl HeapBudgetExceeded {
    /// Whether the largest state accounts for at least half of the usage, and so is what
    /// the message blames.
    pub fn blames_state(&self) -> bool {
        self.largest_state
            .as_ref()
            .is_some_and(|state| state.bytes.saturating_mul(2) >= self.used)
    }

    fn message(&self) -> String {
        /// The fixes when no one state is to blame.
        const WIDER: &str = "raise taskmanager.memory.process.size, use state.backend.type: \
                             rocksdb (window contents move there) or lower \
                             taskmanager.memory.managed.fraction";
        let head = format!(
            "slot {} heap budget exceeded ({} of {})",
            self.slot,
            Mib(self.used),
            Mib(self.budget)
        );
        match &self.largest_state {
            Some(state) if self.blames_state() => format!(
                "{head} by state '{}' of operator '{}'; raise taskmanager.memory.process.size \
                 or use state.backend.type: rocksdb",
                state.state, state.operator
            ),
            Some(state) => format!(
                "{head}; the largest heap state, '{}' of operator '{}', holds only {}, so \
                 operators (window contents, join buffers) or user code hold the rest; {WIDER}",
                state.state,
                state.operator,
                Mib(state.bytes)
            ),
            None => format!(
                "{head} with no heap-backend state, so operators (window contents, join \
                 buffers) or user code hold it; {WIDER}"
            ),
        }
    }
}

/// Checks a slot's heap use against its share.
///
/// `used` is the shard's net heap bytes as the counting allocator reports them (a negative
/// figure counts as zero). `largest_state` is only called when the share is exceeded, so
/// finding the largest state costs nothing while the slot is within budget.
pub fn check_heap_budget(
    slot: usize,
    heap_share: u64,
    used: i64,
    largest_state: impl FnOnce() -> Option<HeapStateSize>,
) -> Result<(), HeapBudgetExceeded> {
    let used = u64::try_from(used).unwrap_or(0);
    if used <= heap_share {
        return Ok(());
    }
    Err(HeapBudgetExceeded {
        slot,
        used,
        budget: heap_share,
        largest_state: largest_state(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: i64 = 1 << 20;

    fn counts(bytes: u64) -> Option<HeapStateSize> {
        Some(HeapStateSize {
            operator: "window-agg".into(),
            state: "counts".into(),
            bytes,
        })
    }

    #[test]
    fn within_budget_is_ok_and_does_not_look_for_state() {
        let share = 400 << 20;
        let no_lookup = || -> Option<HeapStateSize> { panic!("looked up state within budget") };
        assert_eq!(check_heap_budget(3, share, 400 * MIB, no_lookup), Ok(()));
        assert_eq!(check_heap_budget(3, share, -5 * MIB, no_lookup), Ok(()));
    }

    #[test]
    fn blames_the_state_that_holds_most_of_the_heap() {
        let err = check_heap_budget(3, 400 << 20, 412 * MIB, || counts(380 << 20)).unwrap_err();
        assert!(err.blames_state());
        assert_eq!(
            err.to_string(),
            "slot 3 heap budget exceeded (412 MiB of 400 MiB) by state 'counts' of operator \
             'window-agg'; raise taskmanager.memory.process.size or use state.backend.type: rocksdb"
        );
        assert_eq!((err.slot, err.used, err.budget), (3, 412 << 20, 400 << 20));
    }

    #[test]
    fn a_small_state_is_not_blamed() {
        let err = check_heap_budget(0, 400 << 20, 412 * MIB, || counts(5 << 20)).unwrap_err();
        assert!(!err.blames_state());
        assert_eq!(
            err.to_string(),
            "slot 0 heap budget exceeded (412 MiB of 400 MiB); the largest heap state, 'counts' \
             of operator 'window-agg', holds only 5 MiB, so operators (window contents, join \
             buffers) or user code hold the rest; raise taskmanager.memory.process.size, use \
             state.backend.type: rocksdb (window contents move there) or lower \
             taskmanager.memory.managed.fraction"
        );
        let err = check_heap_budget(1, 400 << 20, 400 * MIB + MIB / 2, || None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "slot 1 heap budget exceeded (400.5 MiB of 400 MiB) with no heap-backend state, so \
             operators (window contents, join buffers) or user code hold it; raise \
             taskmanager.memory.process.size, use state.backend.type: rocksdb (window contents \
             move there) or lower taskmanager.memory.managed.fraction"
        );
    }
}
