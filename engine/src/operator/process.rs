//! `process`: user functions with a context that emits records and tells the current key.

use std::marker::PhantomData;

use super::{Operator, RuntimeContext};
use crate::api::{KeyedProcessContext, KeyedProcessFunction, ProcessContext, ProcessFunction};

pub(crate) struct ProcessOperator<F> {
    function: F,
    runtime: Option<RuntimeContext>,
}

impl<F> ProcessOperator<F> {
    pub(crate) fn new(function: F) -> Self {
        ProcessOperator {
            function,
            runtime: None,
        }
    }
}

impl<I, O, F: ProcessFunction<I, O>> Operator<I, O> for ProcessOperator<F> {
    fn open(&mut self, ctx: &RuntimeContext) {
        self.function.open(ctx);
        self.runtime = Some(ctx.clone());
    }

    #[inline]
    fn process_element(&mut self, record: I, out: &mut Vec<O>) {
        let runtime = self.runtime.as_ref().expect("opened");
        self.function
            .process_element(record, &mut ProcessContext { out, runtime });
    }
}

pub(crate) struct KeyedProcessOperator<K, KS, F> {
    key_selector: KS,
    function: F,
    runtime: Option<RuntimeContext>,
    _key: PhantomData<fn() -> K>,
}

impl<K, KS, F> KeyedProcessOperator<K, KS, F> {
    pub(crate) fn new(key_selector: KS, function: F) -> Self {
        KeyedProcessOperator {
            key_selector,
            function,
            runtime: None,
            _key: PhantomData,
        }
    }
}

impl<K, I, O, KS, F> Operator<I, O> for KeyedProcessOperator<K, KS, F>
where
    K: 'static,
    KS: Fn(&I) -> K + 'static,
    F: KeyedProcessFunction<K, I, O>,
{
    fn open(&mut self, ctx: &RuntimeContext) {
        self.function.open(ctx);
        self.runtime = Some(ctx.clone());
    }

    #[inline]
    fn process_element(&mut self, record: I, out: &mut Vec<O>) {
        let key = (self.key_selector)(&record);
        let runtime = self.runtime.as_ref().expect("opened");
        self.function.process_element(
            record,
            &mut KeyedProcessContext {
                key: &key,
                out,
                runtime,
            },
        );
    }
}
