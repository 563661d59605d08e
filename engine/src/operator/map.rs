//! `map`: one record in, one record out.

use super::Operator;

pub(crate) struct MapOperator<F>(pub(crate) F);

impl<I, O, F: FnMut(I) -> O + 'static> Operator<I, O> for MapOperator<F> {
    #[inline]
    fn process_element(&mut self, record: I, out: &mut Vec<O>) {
        out.push((self.0)(record));
    }
}
