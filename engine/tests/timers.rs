//! Timers on keyed streams: event-time timers fire once per (key, time), in time order, when
//! the watermark passes them; deleted timers do not fire; processing-time timers fire on the
//! wall clock.

mod common;

use std::time::{Duration, Instant};

use weir_engine::api::RunOptions;
use weir_engine::prelude::*;

type Event = (u32, i64);

/// On each record of key k at (even) time t: a timer at t + 1 000 (registered twice), and one
/// at t + 5 001 that is deleted again (odd, so it never removes another record's timer). `on_timer` reports (key, time, watermark when fired).
#[derive(Clone)]
struct Reminders;

impl KeyedProcessFunction<u32, Event, (u32, i64, i64)> for Reminders {
    fn process_element(
        &mut self,
        e: Event,
        ctx: &mut KeyedProcessContext<'_, u32, (u32, i64, i64)>,
    ) {
        ctx.register_event_time_timer(e.1 + 1_000);
        ctx.register_event_time_timer(e.1 + 1_000);
        ctx.register_event_time_timer(e.1 + 5_001);
        ctx.delete_event_time_timer(e.1 + 5_001);
    }

    fn on_timer(
        &mut self,
        timestamp: i64,
        ctx: &mut KeyedProcessContext<'_, u32, (u32, i64, i64)>,
    ) {
        assert_eq!(ctx.time_domain(), Some(TimeDomain::EventTime));
        assert_eq!(
            ctx.timestamp(),
            Some(timestamp),
            "output carries the timer's time"
        );
        let fired = (*ctx.current_key(), timestamp, ctx.current_watermark());
        ctx.emit(fired);
    }
}

#[test]
fn event_time_timers_fire_once_in_time_order_after_the_watermark() {
    let env = common::env_with(
        common::slots(),
        &[("pipeline.auto-watermark-interval", "1 ms")],
    );
    let mut rng = common::XorShift::new(11);
    let input: Vec<Event> = (0..2_000)
        .map(|_| (rng.below(20) as u32, 2 * rng.below(50_000) as i64))
        .collect();
    let (sink, out) = CollectSink::new();
    env.from_source(
        CollectionSource::new(input.clone()),
        WatermarkStrategy::for_bounded_out_of_orderness(Duration::from_secs(200))
            .with_timestamp_assigner(|e: &Event, _| e.1),
        "events",
    )
    .key_by(|e: &Event| e.0)
    .process(Reminders)
    .parallelism(1)
    .sink_to(sink, "fired")
    .parallelism(1);
    env.execute("timers").expect("the job succeeds");

    let fired = out.records();
    let mut expected: Vec<(u32, i64)> = input.iter().map(|&(k, t)| (k, t + 1_000)).collect();
    expected.sort_unstable();
    expected.dedup();
    let mut got: Vec<(u32, i64)> = fired.iter().map(|&(k, t, _)| (k, t)).collect();
    let times: Vec<i64> = fired.iter().map(|f| f.1).collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "fired in time order"
    );
    assert!(
        fired.iter().all(|&(_, t, watermark)| watermark >= t),
        "a timer fires only once the watermark has reached it"
    );
    got.sort_unstable();
    assert_eq!(got, expected, "each (key, time) once; deleted timers never");
}

/// Sets a processing-time timer 50 ms ahead for the first record of each key.
#[derive(Clone)]
struct WakeUp;

impl KeyedProcessFunction<u64, u64, (u64, i64, i64)> for WakeUp {
    fn process_element(&mut self, n: u64, ctx: &mut KeyedProcessContext<'_, u64, (u64, i64, i64)>) {
        if n < 5 {
            let at = ctx.current_processing_time() + 50;
            ctx.register_processing_time_timer(at);
        }
    }

    fn on_timer(
        &mut self,
        timestamp: i64,
        ctx: &mut KeyedProcessContext<'_, u64, (u64, i64, i64)>,
    ) {
        assert_eq!(ctx.time_domain(), Some(TimeDomain::ProcessingTime));
        let fired = (*ctx.current_key(), timestamp, ctx.current_processing_time());
        ctx.emit(fired);
    }
}

#[test]
fn processing_time_timers_fire_on_the_wall_clock() {
    let env = common::env();
    let (sink, out) = CollectSink::new();
    env.from_source(
        DataGeneratorSource::new(None, |i| i).with_rate(200.0),
        WatermarkStrategy::no_watermarks(),
        "slow",
    )
    .key_by(|n: &u64| n % 5)
    .process(WakeUp)
    .sink_to(sink, "fired");
    let client = env
        .execute_async("processing timers", RunOptions::default())
        .expect("starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while out.len() < 5 {
        assert!(Instant::now() < deadline, "timers did not fire");
        std::thread::sleep(Duration::from_millis(10));
    }
    client.cancel();
    let _ = client.wait();
    let fired = out.records();
    let mut keys: Vec<u64> = fired.iter().map(|f| f.0).collect();
    keys.sort_unstable();
    assert_eq!(keys, vec![0, 1, 2, 3, 4], "one timer per key, each once");
    assert!(
        fired.iter().all(|&(_, at, now)| now >= at),
        "not before its time"
    );
}
