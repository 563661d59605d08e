//! Which operator a panic came from.
//!
//! Every link enters a scope while it runs its operator. When a user function panics, the
//! scopes unwind innermost first; the first one to drop while the thread is panicking records
//! its operator, and the task that catches the panic reports that operator and subtask.

use std::cell::RefCell;

use crate::metrics::OperatorMetrics;

thread_local! {
    static CULPRIT: RefCell<Option<(String, usize)>> = const { RefCell::new(None) };
}

/// Marks an operator as running until dropped.
pub(crate) struct Scope<'a> {
    metrics: &'a OperatorMetrics,
}

pub(crate) fn enter(metrics: &OperatorMetrics) -> Scope<'_> {
    Scope { metrics }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            CULPRIT.with(|c| {
                let mut c = c.borrow_mut();
                if c.is_none() {
                    *c = Some((self.metrics.name.clone(), self.metrics.subtask));
                }
            });
        }
    }
}

/// Takes the operator recorded by the last panic on this thread.
pub(crate) fn take_culprit() -> Option<(String, usize)> {
    CULPRIT.with(|c| c.borrow_mut().take())
}
