//! `flat_map`: each record becomes zero or more records.

use super::{Emitter, Operator};
use crate::api::Collector;

pub(crate) struct FlatMapOperator<F>(pub(crate) F);

impl<I, O, F> Operator<I, O> for FlatMapOperator<F>
where
    F: FnMut(I, &mut Collector<'_, O>) + 'static,
{
    #[inline]
    fn process_element(&mut self, record: I, timestamp: i64, out: &mut Emitter<O>) {
        (self.0)(
            record,
            &mut Collector {
                out: &mut out.main,
                timestamp,
            },
        );
    }
}
