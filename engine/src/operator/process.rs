//! `process`: user functions with a context that emits records (main and side outputs), tells
//! the current key and event time, and — on keyed streams — sets timers.

use std::marker::PhantomData;
use std::rc::Rc;

use bytes::Bytes;
use weir_state::{KeyGroup, KeyGroupRange, StateError};

use super::{Emitter, Operator, RuntimeContext};
use crate::api::function::KeyedTimers;
use crate::api::{KeyedProcessContext, KeyedProcessFunction, ProcessContext, ProcessFunction};
use crate::checkpoint::bytes::{ByteReader, ByteWriter};
use crate::checkpoint::keyed::KeyedScope;
use crate::checkpoint::task_state::{OperatorSnapshot, PART_OWN_KEYED, PART_TIMERS};
use crate::record::{Key, Watermark, NO_TIMESTAMP};
use crate::state::KeyedStateStore;
use crate::time::TimeDomain;

pub(crate) struct ProcessOperator<F> {
    function: F,
    runtime: Option<RuntimeContext>,
    watermark: Watermark,
}

impl<F> ProcessOperator<F> {
    pub(crate) fn new(function: F) -> Self {
        ProcessOperator {
            function,
            runtime: None,
            watermark: Watermark::MIN,
        }
    }
}

impl<I, O, F: ProcessFunction<I, O>> Operator<I, O> for ProcessOperator<F> {
    fn open(&mut self, ctx: &RuntimeContext) {
        self.function.open(ctx);
        self.runtime = Some(ctx.clone());
    }

    #[inline]
    fn process_element(&mut self, record: I, timestamp: i64, out: &mut Emitter<O>) {
        let runtime = self.runtime.as_ref().expect("opened");
        self.function.process_element(
            record,
            &mut ProcessContext {
                out,
                timestamp,
                watermark: self.watermark,
                runtime,
            },
        );
    }

    fn on_watermark(&mut self, watermark: Watermark, _out: &mut Emitter<O>) {
        self.watermark = watermark;
    }
}

/// Keyed state a keyed process function keeps in fields of its own and writes to checkpoints
/// itself, in the canonical keyed-snapshot format (the interval join's buffers).
pub(crate) trait OwnKeyedState<K> {
    /// The state of every key of the subtask owning `scope`.
    fn snapshot(&mut self, scope: &KeyedScope) -> Result<Vec<u8>, StateError>;
    /// Takes back what `parts` (one per old subtask) hold for the key groups of `scope`.
    fn restore(&mut self, scope: &KeyedScope, parts: &[Bytes]) -> Result<(), StateError>;
}

pub(crate) struct KeyedProcessOperator<K, KS, F> {
    key_selector: KS,
    function: F,
    runtime: Option<RuntimeContext>,
    state: Option<Rc<KeyedStateStore<K>>>,
    timers: KeyedTimers<K>,
    watermark: Watermark,
    _key: PhantomData<fn() -> K>,
}

impl<K, KS, F> KeyedProcessOperator<K, KS, F> {
    pub(crate) fn new(key_selector: KS, function: F) -> Self {
        KeyedProcessOperator {
            key_selector,
            function,
            runtime: None,
            state: None,
            timers: KeyedTimers::default(),
            watermark: Watermark::MIN,
            _key: PhantomData,
        }
    }
}

impl<K: Key, KS, F> KeyedProcessOperator<K, KS, F> {
    /// Fires the timers of `domain` due at `limit`, earliest first; timers a callback sets at
    /// or before `limit` fire in the same pass.
    fn fire<I, O>(&mut self, domain: TimeDomain, limit: i64, out: &mut Emitter<O>)
    where
        F: KeyedProcessFunction<K, I, O>,
    {
        let runtime = self.runtime.as_ref().expect("opened");
        let state = self.state.as_deref().expect("opened");
        loop {
            let queue = match domain {
                TimeDomain::EventTime => &mut self.timers.event,
                TimeDomain::ProcessingTime => &mut self.timers.processing,
            };
            let Some((time, key)) = queue.pop_due(limit) else {
                break;
            };
            let timestamp = match domain {
                TimeDomain::EventTime => time,
                TimeDomain::ProcessingTime => NO_TIMESTAMP,
            };
            state.next_call();
            self.function.on_timer(
                time,
                &mut KeyedProcessContext {
                    key: &key,
                    out,
                    timestamp,
                    watermark: self.watermark,
                    timers: &mut self.timers,
                    domain: Some(domain),
                    runtime,
                    state,
                },
            );
        }
    }
}

impl<K, I, O, KS, F> Operator<I, O> for KeyedProcessOperator<K, KS, F>
where
    K: Key,
    KS: Fn(&I) -> K + 'static,
    F: KeyedProcessFunction<K, I, O>,
{
    fn open(&mut self, ctx: &RuntimeContext) {
        let state = KeyedStateStore::open(ctx)
            .unwrap_or_else(|error| panic!("cannot open the keyed state backend: {error}"));
        ctx.with_restored_of_all(PART_TIMERS, |parts| {
            restore_timers(&mut self.timers, parts, ctx)
        })
        .unwrap_or_else(|error| panic!("cannot restore the timers: {error}"));
        if let Some(own) = self.function.own_keyed_state() {
            ctx.with_restored_of_all(PART_OWN_KEYED, |parts| {
                if !parts.is_empty() {
                    own.restore(&KeyedScope::of(ctx), parts)
                        .unwrap_or_else(|error| {
                            panic!("cannot restore the function's state: {error}")
                        });
                }
            });
        }
        self.state = Some(state);
        self.function.open(ctx);
        self.runtime = Some(ctx.clone());
    }

    #[inline]
    fn process_element(&mut self, record: I, timestamp: i64, out: &mut Emitter<O>) {
        let key = (self.key_selector)(&record);
        let runtime = self.runtime.as_ref().expect("opened");
        let state = self.state.as_deref().expect("opened");
        state.next_call();
        self.function.process_element(
            record,
            &mut KeyedProcessContext {
                key: &key,
                out,
                timestamp,
                watermark: self.watermark,
                timers: &mut self.timers,
                domain: None,
                runtime,
                state,
            },
        );
    }

    fn on_watermark(&mut self, watermark: Watermark, out: &mut Emitter<O>) {
        self.watermark = watermark;
        self.fire(TimeDomain::EventTime, watermark.0, out);
    }

    fn on_processing_time(&mut self, now: i64, out: &mut Emitter<O>) {
        self.fire(TimeDomain::ProcessingTime, now, out);
    }

    fn next_processing_time(&self) -> Option<i64> {
        self.timers.processing.next_time()
    }

    fn snapshot_state(&mut self, snapshot: &mut OperatorSnapshot) -> Result<(), String> {
        let state = self.state.as_deref().expect("opened");
        state.snapshot_into(snapshot)?;
        snapshot.add(PART_TIMERS, encode_timers(&self.timers)?);
        if let Some(own) = self.function.own_keyed_state() {
            let scope = KeyedScope::of(self.runtime.as_ref().expect("opened"));
            let bytes = own.snapshot(&scope).map_err(|error| error.to_string())?;
            snapshot.add(PART_OWN_KEYED, bytes);
        }
        Ok(())
    }

    fn unsupported_state(&self) -> Option<&'static str> {
        self.function.unmanaged_state()
    }
}

/// A keyed operator's timers as a checkpoint part: per timer its domain (`u8`: 0 event time,
/// 1 processing time), time and encoded key, in the order they fire.
pub(crate) fn encode_timers<K: Key>(timers: &KeyedTimers<K>) -> Result<Vec<u8>, String> {
    // Written in place: the count and each key's length are filled in once known (a buffer
    // per key cost an allocation per timer while the barrier passes).
    let mut out = ByteWriter::default();
    out.u64(0);
    let mut count = 0u64;
    let mut failure = None;
    for (domain, queue) in [(0u8, &timers.event), (1, &timers.processing)] {
        queue.for_each(|time, key| {
            if failure.is_some() {
                return;
            }
            out.u8(domain);
            out.i64(time);
            let len_at = out.out.len();
            out.u64(0);
            match key.encode_into(&mut out.out) {
                Ok(()) => {
                    let len = (out.out.len() - len_at - 8) as u64;
                    out.out[len_at..len_at + 8].copy_from_slice(&len.to_le_bytes());
                    count += 1;
                }
                Err(error) => failure = Some(format!("cannot encode a timer's key: {error}")),
            }
        });
    }
    if let Some(failure) = failure {
        return Err(failure);
    }
    out.out[..8].copy_from_slice(&count.to_le_bytes());
    Ok(out.out)
}

/// Registers the timers of `parts` (written by [`encode_timers`], one per old subtask) whose
/// keys fall in `ctx`'s key groups.
pub(crate) fn restore_timers<K: Key>(
    timers: &mut KeyedTimers<K>,
    parts: &[Bytes],
    ctx: &RuntimeContext,
) -> Result<(), String> {
    let max = ctx.max_parallelism as u32;
    let range = KeyGroupRange::for_subtask(max, ctx.parallelism as u32, ctx.subtask as u32);
    for part in parts {
        for timer in read_timers(part)? {
            let key = K::decode(timer.key).map_err(|error| {
                format!(
                    "a timer's key does not decode as {}: {error}",
                    std::any::type_name::<K>()
                )
            })?;
            if !range.contains(KeyGroup::of(&key, max)) {
                continue;
            }
            match timer.domain {
                TimeDomain::EventTime => timers.event.register(&key, timer.time),
                TimeDomain::ProcessingTime => timers.processing.register(&key, timer.time),
            }
        }
    }
    Ok(())
}

/// One timer as [`encode_timers`] wrote it, its key still encoded.
pub(crate) struct RawTimer<'a> {
    pub(crate) domain: TimeDomain,
    pub(crate) time: i64,
    pub(crate) key: &'a [u8],
}

/// Reads what [`encode_timers`] wrote, without the key type.
pub(crate) fn read_timers(part: &[u8]) -> Result<Vec<RawTimer<'_>>, String> {
    let mut reader = ByteReader::new(part, "the timers' snapshot");
    // Domain, time and the key's length.
    let count = reader.count(1 + 2 * 8)?;
    let mut timers = Vec::with_capacity(count);
    for _ in 0..count {
        let domain = match reader.u8()? {
            0 => TimeDomain::EventTime,
            1 => TimeDomain::ProcessingTime,
            other => return Err(format!("a timer has the unknown time domain {other}")),
        };
        timers.push(RawTimer {
            domain,
            time: reader.i64()?,
            key: reader.bytes()?,
        });
    }
    Ok(timers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_state::StateCodec;

    /// Timers are written in place in the format they always had (a count; per timer its
    /// domain, time, and length-prefixed encoded key, in firing order per domain), and read
    /// back as registered.
    #[test]
    fn timers_are_written_in_their_format_and_read_back() {
        let mut timers: KeyedTimers<String> = KeyedTimers::default();
        let keys: Vec<String> = (0..40)
            .map(|i| "k".repeat(i % 13) + &i.to_string())
            .collect();
        for (i, key) in keys.iter().enumerate() {
            timers.event.register(key, (i as i64 * 7) % 11);
            if i % 3 == 0 {
                timers.processing.register(key, -(i as i64));
            }
        }
        let mut expected = Vec::new();
        for (domain, queue) in [(0u8, &timers.event), (1, &timers.processing)] {
            queue.for_each(|time, key| expected.push((domain, time, key.clone())));
        }
        let mut reference = ByteWriter::default();
        reference.u64(expected.len() as u64);
        for (domain, time, key) in &expected {
            reference.u8(*domain);
            reference.i64(*time);
            reference.bytes(&key.encode().expect("a key encodes"));
        }
        let encoded = encode_timers(&timers).expect("timers encode");
        assert_eq!(encoded, reference.out);
        let read: Vec<(u8, i64, String)> = read_timers(&encoded)
            .expect("they read back")
            .into_iter()
            .map(|timer| {
                let domain = u8::from(timer.domain == TimeDomain::ProcessingTime);
                (
                    domain,
                    timer.time,
                    String::decode(timer.key).expect("a key"),
                )
            })
            .collect();
        assert_eq!(read, expected);
        assert!(encode_timers(&KeyedTimers::<u64>::default()).is_ok_and(|b| b == [0; 8]));
    }
}
