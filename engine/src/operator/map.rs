//! `map`: one record in, one record out.

use std::any::TypeId;

use super::{Batch, Emitter, Operator};

pub(crate) struct MapOperator<F>(pub(crate) F);

impl<I: 'static, O: 'static, F: FnMut(I) -> O + 'static> Operator<I, O> for MapOperator<F> {
    #[inline]
    fn process_element(&mut self, record: I, timestamp: i64, out: &mut Emitter<O>) {
        out.main.push((self.0)(record), timestamp);
    }

    const AT_MOST_ONE_PER_RECORD: bool = true;

    /// A map that keeps the record type rewrites the batch in place and hands it on by swapping
    /// it with the (empty) output buffer: one pass over memory instead of a read and a copy.
    /// Measured on the chain benchmark (64-byte records): this and in-place filtering take the
    /// engine from ~4x to ~2x of a fused hand-written loop.
    #[inline]
    /// Timestamps stay where they are: each record keeps its own.
    fn process_batch(&mut self, input: &mut Batch<I>, out: &mut Emitter<O>) {
        let out = &mut out.main;
        if TypeId::of::<I>() != TypeId::of::<O>() || !out.is_empty() {
            out.records.extend(input.records.drain(..).map(&mut self.0));
            out.timestamps.append(&mut input.timestamps);
            return;
        }
        let batch = &mut input.records;
        let len = batch.len();
        let records = batch.as_mut_ptr();
        // SAFETY: the length is 0 while records are moved out and back, so if `f` panics the
        // remaining records leak instead of being dropped twice.
        unsafe { batch.set_len(0) };
        for i in 0..len {
            // SAFETY: `i < len` is inside the batch's initialised part; each slot is read once
            // and written once. `O` is `I` (same `TypeId`), so an `O` fits the slot exactly.
            unsafe {
                let slot = records.add(i);
                let mapped = (self.0)(slot.read());
                slot.cast::<O>().write(mapped);
            }
        }
        // SAFETY: every slot in `0..len` holds a record again.
        unsafe { batch.set_len(len) };
        // SAFETY: `Vec<I>` and `Vec<O>` are the same type (same `TypeId`).
        let batch = unsafe { &mut *std::ptr::from_mut(batch).cast::<Vec<O>>() };
        std::mem::swap(batch, &mut out.records);
        std::mem::swap(&mut input.timestamps, &mut out.timestamps);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::SideOutputs;

    fn run<I: 'static, O: 'static>(
        map: &mut MapOperator<impl FnMut(I) -> O + 'static>,
        records: Vec<I>,
    ) -> Batch<O> {
        let mut batch = Batch::default();
        for (i, r) in records.into_iter().enumerate() {
            batch.push(r, i as i64 * 10);
        }
        let mut out = Emitter::new(0, SideOutputs::default());
        map.process_batch(&mut batch, &mut out);
        assert!(batch.is_empty() && batch.timestamps.is_empty());
        out.main
    }

    #[test]
    fn in_place_and_type_changing_maps_agree_and_keep_timestamps() {
        let out = run(&mut MapOperator(|x: u64| x * 3), (0..100).collect());
        assert_eq!(out.records, (0..100).map(|x| x * 3).collect::<Vec<u64>>());
        assert_eq!(
            out.timestamps,
            (0..100).map(|i| i * 10).collect::<Vec<i64>>()
        );

        let out = run(&mut MapOperator(|x: u64| x.to_string()), (0..100).collect());
        assert_eq!(
            out.records,
            (0..100).map(|x| x.to_string()).collect::<Vec<String>>()
        );
        assert_eq!(
            out.timestamps,
            (0..100).map(|i| i * 10).collect::<Vec<i64>>()
        );

        let strings = (0..10).map(|i| i.to_string()).collect();
        let out = run(&mut MapOperator(|s: String| s + "!"), strings);
        assert_eq!(out.records[3], "3!");
        assert_eq!(out.timestamps[3], 30);
    }
}
