//! `process`: user functions with a context that emits records (main and side outputs), tells
//! the current key and event time, and — on keyed streams — sets timers.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use weir_state::{KeyGroup, KeyGroupRange, StateError};

use super::{Emitter, Operator, RuntimeContext};
use crate::api::function::KeyedTimers;
use crate::api::{KeyedProcessContext, KeyedProcessFunction, ProcessContext, ProcessFunction};
use crate::checkpoint::bytes::{ByteReader, ByteWriter};
use crate::checkpoint::keyed::KeyedScope;
use crate::checkpoint::task_state::{
    AfterBarrier, DeferredPart, InPieces, OperatorSnapshot, WrittenBetweenRecords, PART_OWN_KEYED,
    PART_TIMERS, PIECE_BYTES,
};
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
    /// The state of every key of the subtask owning `scope` as it is at the barrier, encoded
    /// by the checkpoint writer after it.
    fn snapshot(&mut self, scope: &KeyedScope) -> Result<DeferredPart, StateError>;
    /// Takes back what `parts` (one per old subtask) hold for the key groups of `scope`.
    fn restore(&mut self, scope: &KeyedScope, parts: &[Bytes]) -> Result<(), StateError>;
}

pub(crate) struct KeyedProcessOperator<K, KS, F> {
    key_selector: KS,
    function: F,
    runtime: Option<RuntimeContext>,
    state: Option<Rc<KeyedStateStore<K>>>,
    timers: KeyedTimers<K>,
    /// The timers of a checkpoint being written after its barrier.
    timers_written: Option<Rc<RefCell<TimersWrite>>>,
    /// The input ended: no turn may follow a barrier, so snapshots are written at it.
    finished: bool,
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
            timers_written: None,
            finished: false,
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

    /// Writes about `budget` bytes more of the timers of the checkpoint being written after
    /// its barrier, if one is.
    fn write_timers_some(&mut self, budget: usize) {
        let Some(written) = &self.timers_written else {
            return;
        };
        if Rc::strong_count(written) == 1 {
            // The checkpoint was given up.
            self.timers.end_cut();
            self.timers_written = None;
            return;
        }
        let started = Instant::now();
        let mut write = written.borrow_mut();
        let result = write.step(&mut self.timers, budget);
        write.longest = write.longest.max(started.elapsed());
        let done = match result {
            Ok(done) => done,
            Err(error) => {
                write.error = Some(error);
                self.timers.end_cut();
                true
            }
        };
        drop(write);
        if done {
            self.timers_written = None;
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
        self.write_timers_some(PIECE_BYTES);
        self.fire(TimeDomain::ProcessingTime, now, out);
    }

    /// While the timers of a checkpoint are being written after its barrier, now: the task
    /// gives the operator a turn between batches of records to write some.
    fn next_processing_time(&self) -> Option<i64> {
        if self.timers_written.is_some() {
            return Some(i64::MIN);
        }
        self.timers.processing.next_time()
    }

    fn finish(&mut self, _out: &mut Emitter<O>) {
        self.finished = true;
        // No turn need follow the input's end (a source task's chain gets none).
        self.write_timers_some(usize::MAX);
    }

    /// The timers are cut at the barrier and written after it (`TimerQueue::cut`), unless no
    /// turn may follow (a savepoint: the job may stop; or the input ended).
    fn snapshot_state(&mut self, snapshot: &mut OperatorSnapshot) -> Result<(), String> {
        let state = self.state.as_deref().expect("opened");
        state.snapshot_into(snapshot)?;
        // Each snapshot cuts at its own barrier.
        self.write_timers_some(usize::MAX);
        let checkpointed = self.runtime.as_ref().expect("opened").state.checkpointed;
        if checkpointed && !self.finished && !snapshot.is_savepoint() {
            let written = Rc::new(RefCell::new(TimersWrite::cut(&mut self.timers)));
            self.timers_written = Some(Rc::clone(&written));
            snapshot.add_deferred(PART_TIMERS, AfterBarrier::part(written));
        } else {
            snapshot.add(PART_TIMERS, encode_timers(&mut self.timers)?);
        }
        if let Some(own) = self.function.own_keyed_state() {
            let scope = KeyedScope::of(self.runtime.as_ref().expect("opened"));
            let part = own.snapshot(&scope).map_err(|error| error.to_string())?;
            snapshot.add_deferred(PART_OWN_KEYED, part);
        }
        Ok(())
    }

    fn unsupported_state(&self) -> Option<&'static str> {
        self.function.unmanaged_state()
    }
}

/// A keyed operator's timers as a checkpoint part: their count, then per timer its domain
/// (`u8`: 0 event time, 1 processing time), time and length-prefixed encoded key, in the
/// order they fire.
pub(crate) fn encode_timers<K: Key>(timers: &mut KeyedTimers<K>) -> Result<Vec<u8>, String> {
    let mut write = TimersWrite::cut(timers);
    if let Err(error) = write.step(timers, usize::MAX) {
        timers.end_cut();
        return Err(error);
    }
    Ok(write.out.out)
}

impl<K: Key> KeyedTimers<K> {
    /// Gives up the cut being written, if one is.
    fn end_cut(&mut self) {
        self.event.end_cut();
        self.processing.end_cut();
    }
}

/// A keyed operator's timers as they stood at a barrier, being written in steps.
struct TimersWrite {
    /// The part so far.
    out: ByteWriter,
    /// Timers at the barrier, and written so far.
    count: u64,
    written: u64,
    /// The queue being written: 0 event time, 1 processing time, 2 once both are.
    domain: u8,
    /// Why the timers cannot be written, for the checkpoint writer to report.
    error: Option<String>,
    /// The longest of the operator's steps.
    longest: Duration,
}

/// The fewest bytes a timer takes in a timers part (its domain, time and key length).
const TIMER_BYTES: usize = 1 + 8 + 8;

impl TimersWrite {
    /// Cuts `timers` at a barrier.
    fn cut<K: Key>(timers: &mut KeyedTimers<K>) -> TimersWrite {
        let count = (timers.event.cut() + timers.processing.cut()) as u64;
        let mut out = ByteWriter::default();
        out.u64(count);
        TimersWrite {
            out,
            count,
            written: 0,
            domain: 0,
            error: None,
            longest: Duration::ZERO,
        }
    }

    /// Writes about `budget` bytes more; returns whether every timer of the cut is written.
    fn step<K: Key>(&mut self, timers: &mut KeyedTimers<K>, budget: usize) -> Result<bool, String> {
        let start = self.out.out.len();
        while self.out.out.len() - start < budget {
            let queue = match self.domain {
                0 => &mut timers.event,
                1 => &mut timers.processing,
                _ => break,
            };
            let left = budget - (self.out.out.len() - start);
            let (domain, out, written) = (self.domain, &mut self.out, &mut self.written);
            let done = queue.write_cut(left.div_ceil(TIMER_BYTES), |time, key| {
                put_timer(out, domain, time, key)?;
                *written += 1;
                Ok::<(), String>(())
            })?;
            if done {
                self.domain += 1;
            }
        }
        if self.domain < 2 {
            return Ok(false);
        }
        if self.written != self.count {
            return Err(format!(
                "internal error: {} timers written of the {} a barrier cut",
                self.written, self.count
            ));
        }
        Ok(true)
    }
}

/// Appends one timer to a timers part.
fn put_timer<K: Key>(out: &mut ByteWriter, domain: u8, time: i64, key: &K) -> Result<(), String> {
    out.u8(domain);
    out.i64(time);
    // The key's length is filled in once it is written (no buffer per key).
    let len_at = out.out.len();
    out.u64(0);
    key.encode_into(&mut out.out)
        .map_err(|error| format!("cannot encode a timer's key: {error}"))?;
    let len = (out.out.len() - len_at - 8) as u64;
    out.out[len_at..len_at + 8].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

/// Timers written after their barrier: once the operator has written them, the checkpoint
/// writer hands them out in pieces.
impl WrittenBetweenRecords for TimersWrite {
    type Written = InPieces;
    const UNWRITTEN: &'static str =
        "the keyed process operator closed before its timers were written";

    fn take_written(&mut self) -> Result<Option<InPieces>, String> {
        if let Some(error) = self.error.take() {
            return Err(error);
        }
        Ok((self.domain == 2).then(|| InPieces::of(std::mem::take(&mut self.out.out))))
    }

    fn longest_step(&self) -> Duration {
        self.longest
    }

    /// The operator sees its checkpoint given up by the writer's side gone.
    fn give_up(&mut self) {}
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
        let encoded = encode_timers(&mut timers).expect("timers encode");
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
        assert!(encode_timers(&mut KeyedTimers::<u64>::default()).is_ok_and(|b| b == [0; 8]));
    }

    /// Timers cut at a barrier and written in small steps while timers of both domains are
    /// registered, deleted and fired hand the checkpoint writer the bytes they would have been
    /// encoded into at the barrier; the writer waits until the operator has written them.
    #[test]
    fn timers_written_after_their_barrier_are_the_timers_at_it() {
        let mut timers: KeyedTimers<u64> = KeyedTimers::default();
        for key in 0..500u64 {
            timers.event.register(&key, (key % 37) as i64 * 10);
            if key % 4 == 0 {
                timers.processing.register(&key, (key % 11) as i64);
            }
        }
        let mut reference = ByteWriter::default();
        reference.u64((timers.event.len() + timers.processing.len()) as u64);
        for (domain, queue) in [(0u8, &timers.event), (1, &timers.processing)] {
            queue.for_each(|time, key| {
                put_timer(&mut reference, domain, time, key).expect("a key encodes")
            });
        }
        let written = Rc::new(RefCell::new(TimersWrite::cut(&mut timers)));
        let mut part = AfterBarrier::part(Rc::clone(&written));
        let mut handed = Vec::new();
        assert!(part
            .encode_next(&mut handed, PIECE_BYTES)
            .expect("no error"));
        assert!(
            handed.is_empty() && part.waiting(),
            "nothing before the operator wrote it"
        );
        let mut step = 0u64;
        while !written
            .borrow_mut()
            .step(&mut timers, 64)
            .expect("the timers are written")
        {
            // Changes between steps, before and behind the writer.
            step += 1;
            timers
                .event
                .register(&(1_000 + step), (step % 40) as i64 * 10 + 5);
            timers.event.delete(&step, (step % 37) as i64 * 10);
            timers.processing.register(&step, (step % 13) as i64);
            if step.is_multiple_of(3) {
                timers.event.pop_due(i64::MAX);
                timers.processing.pop_due(i64::MAX);
            }
        }
        assert!(step > 10, "written in {step} steps");
        while part.encode_next(&mut handed, 1000).expect("no error") {}
        assert_eq!(handed, reference.out);
        assert!(!part.waiting());
    }
}
