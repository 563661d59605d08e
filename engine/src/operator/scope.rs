//! Which operator a panic came from.
//!
//! Every link enters a scope while it calls into its operator's user code (and only then: not
//! while its output travels downstream). When user code panics, the first scope to drop while
//! the thread is panicking records its operator, and the task that catches the panic reports
//! that operator. A panic outside every scope is a bug in Weir or a library, not in the job.

use std::cell::RefCell;

thread_local! {
    static CULPRIT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Marks an operator as running until dropped.
pub(crate) struct Scope<'a> {
    operator: &'a str,
}

/// Marks `operator`'s user code as running until the scope drops.
#[inline]
pub(crate) fn enter(operator: &str) -> Scope<'_> {
    Scope { operator }
}

impl Drop for Scope<'_> {
    /// Inlined: it runs around every call into user code, and all but a panicking thread only
    /// load the panic count.
    #[inline]
    fn drop(&mut self) {
        if std::thread::panicking() {
            record_culprit(self.operator);
        }
    }
}

#[cold]
#[inline(never)]
fn record_culprit(operator: &str) {
    CULPRIT.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            *c = Some(operator.to_string());
        }
    });
}

/// Takes the operator recorded by the last panic on this thread.
pub(crate) fn take_culprit() -> Option<String> {
    CULPRIT.with(|c| c.borrow_mut().take())
}
