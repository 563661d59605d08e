//! `filter`: keeps the records a predicate accepts.

use super::Operator;

pub(crate) struct FilterOperator<F>(pub(crate) F);

impl<T, F: FnMut(&T) -> bool + 'static> Operator<T, T> for FilterOperator<F> {
    #[inline]
    fn process_element(&mut self, record: T, out: &mut Vec<T>) {
        if (self.0)(&record) {
            out.push(record);
        }
    }
}
