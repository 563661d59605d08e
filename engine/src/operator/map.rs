//! `map`: one record in, one record out.

use std::any::TypeId;

use super::Operator;

pub(crate) struct MapOperator<F>(pub(crate) F);

impl<I: 'static, O: 'static, F: FnMut(I) -> O + 'static> Operator<I, O> for MapOperator<F> {
    #[inline]
    fn process_element(&mut self, record: I, out: &mut Vec<O>) {
        out.push((self.0)(record));
    }

    const AT_MOST_ONE_PER_RECORD: bool = true;

    /// A map that keeps the record type rewrites the batch in place and hands it on by swapping
    /// it with the (empty) output buffer: one pass over memory instead of a read and a copy.
    /// Measured on the chain benchmark (64-byte records): this and in-place filtering take the
    /// engine from ~4x to ~2x of a fused hand-written loop.
    #[inline]
    fn process_batch(&mut self, batch: &mut Vec<I>, out: &mut Vec<O>) {
        if TypeId::of::<I>() != TypeId::of::<O>() || !out.is_empty() {
            out.extend(batch.drain(..).map(&mut self.0));
            return;
        }
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
        std::mem::swap(batch, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_and_type_changing_maps_agree() {
        let mut same = MapOperator(|x: u64| x * 3);
        let mut batch: Vec<u64> = (0..100).collect();
        let mut out = Vec::new();
        same.process_batch(&mut batch, &mut out);
        assert!(batch.is_empty());
        assert_eq!(out, (0..100).map(|x| x * 3).collect::<Vec<u64>>());

        let mut other = MapOperator(|x: u64| x.to_string());
        let mut batch: Vec<u64> = (0..100).collect();
        let mut out = Vec::new();
        other.process_batch(&mut batch, &mut out);
        assert!(batch.is_empty());
        assert_eq!(
            out,
            (0..100).map(|x| x.to_string()).collect::<Vec<String>>()
        );

        // Owned records (Strings) mapped in place are neither leaked nor dropped twice.
        let mut strings = MapOperator(|s: String| s + "!");
        let mut batch: Vec<String> = (0..10).map(|i| i.to_string()).collect();
        let mut out = Vec::new();
        strings.process_batch(&mut batch, &mut out);
        assert_eq!(out[3], "3!");
    }
}
