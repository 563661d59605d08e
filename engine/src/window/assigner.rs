//! Window assigners (Flink's names): which windows a record belongs to, and in which time.

use std::any::{Any, TypeId};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use super::aligned::{AlignedWindowOperator, Geometry};
use super::function::WindowLogic;
use super::{CountWindowOperator, GlobalWindow, SessionWindowOperator, TimeWindow, Window};
use crate::graph::OperatorFactory;
use crate::operator::{Batch, Operator, OutputTag};
use crate::record::{Key, Record};
use crate::runtime::factories::OperatorNode;
use crate::time::TimeDomain;

fn millis(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

/// A session's gap: fixed, or computed from each record.
pub(crate) enum SessionGap<T> {
    Static(i64),
    Dynamic(Arc<dyn Fn(&T) -> Duration + Send + Sync>),
}

impl<T> Clone for SessionGap<T> {
    fn clone(&self) -> Self {
        match self {
            SessionGap::Static(gap) => SessionGap::Static(*gap),
            SessionGap::Dynamic(f) => SessionGap::Dynamic(Arc::clone(f)),
        }
    }
}

impl<T> SessionGap<T> {
    pub(crate) fn of(&self, record: &T) -> i64 {
        match self {
            SessionGap::Static(gap) => *gap,
            SessionGap::Dynamic(f) => millis(f(record)).max(1),
        }
    }
}

/// What an assigner asks the window operator for.
pub(crate) enum WindowSpec<T> {
    /// Tumbling (`slide == size`) or sliding windows, aligned to `offset`.
    Aligned {
        size: i64,
        slide: i64,
        offset: i64,
        domain: TimeDomain,
    },
    /// Sessions per key, closed by a gap without records.
    Session {
        gap: SessionGap<T>,
        domain: TimeDomain,
    },
    /// One window per key, fired and purged every `count` records.
    Count { count: u64 },
}

/// Assigns records to windows of type `Self::Window`. The assigners are the types of this
/// module; the trait is how `KeyedStream::window` takes any of them.
pub trait WindowAssigner<T>: std::fmt::Debug + Send + 'static {
    /// The window type the functions see.
    type Window: Window;
    #[doc(hidden)]
    #[allow(private_interfaces)]
    fn spec(self) -> WindowSpec<T>;
    #[doc(hidden)]
    #[allow(private_interfaces, private_bounds)]
    fn factory<K, KS, O, L>(self, parts: WindowParts<T, KS>, logic: L) -> Arc<dyn OperatorFactory>
    where
        T: Record,
        K: Key,
        KS: Fn(&T) -> K + Clone + Send + Sync + 'static,
        O: Record,
        L: WindowLogic<K, Self::Window, T, O> + Clone + Send + Sync,
        Self: Sized,
    {
        let WindowParts {
            key_selector,
            allowed_lateness,
            late_tag,
        } = parts;
        match self.spec() {
            WindowSpec::Aligned {
                size,
                slide,
                offset,
                domain,
            } => time_window_factory::<T, O, L, Self::Window, _>(logic, move |logic| {
                AlignedWindowOperator::new(
                    key_selector.clone(),
                    logic,
                    Geometry::new(size, slide, offset),
                    domain,
                    allowed_lateness,
                    late_tag.clone(),
                )
            }),
            WindowSpec::Session { gap, domain } => {
                time_window_factory::<T, O, L, Self::Window, _>(logic, move |logic| {
                    SessionWindowOperator::new(
                        key_selector.clone(),
                        logic,
                        gap.clone(),
                        domain,
                        allowed_lateness,
                        late_tag.clone(),
                    )
                })
            }
            WindowSpec::Count { count } => {
                let logic = WindowAs::<GlobalWindow, L, Self::Window>::new(logic);
                Arc::new(OperatorNode::<T, O, _>::new(move || {
                    CountWindowOperator::new(key_selector.clone(), logic.clone(), count)
                }))
            }
        }
    }
}

/// What every window operator is built from besides its function.
pub(crate) struct WindowParts<T, KS> {
    pub(crate) key_selector: KS,
    pub(crate) allowed_lateness: i64,
    pub(crate) late_tag: Option<OutputTag<T>>,
}

/// A window function written for the assigner's window type `W`, run by an operator whose
/// windows are `Actual`. They are the same type whenever an assigner builds this (its spec
/// and its `Window` type agree), which `WindowAs::new` checks once.
struct WindowAs<Actual, L, W> {
    logic: L,
    _windows: PhantomData<fn(Actual) -> W>,
}

impl<Actual: 'static, L: Clone, W: 'static> Clone for WindowAs<Actual, L, W> {
    fn clone(&self) -> Self {
        WindowAs {
            logic: self.logic.clone(),
            _windows: PhantomData,
        }
    }
}

impl<Actual: 'static, L, W: 'static> WindowAs<Actual, L, W> {
    fn new(logic: L) -> Self {
        assert_eq!(
            TypeId::of::<Actual>(),
            TypeId::of::<W>(),
            "internal error: a window assigner's spec disagrees with its window type"
        );
        WindowAs {
            logic,
            _windows: PhantomData,
        }
    }
}

impl<K, T, O, Actual, W, L> WindowLogic<K, Actual, T, O> for WindowAs<Actual, L, W>
where
    Actual: 'static,
    W: 'static,
    L: WindowLogic<K, W, T, O>,
{
    type Acc = L::Acc;

    fn create(&self) -> L::Acc {
        self.logic.create()
    }

    #[inline]
    fn add(&mut self, acc: &mut L::Acc, value: T) {
        self.logic.add(acc, value)
    }

    fn merge_owned(&mut self, into: &mut L::Acc, from: L::Acc) {
        self.logic.merge_owned(into, from)
    }

    fn fire(
        &mut self,
        key: &K,
        window: &Actual,
        panes: &[&L::Acc],
        timestamp: i64,
        out: &mut Batch<O>,
    ) {
        let window = (window as &dyn Any)
            .downcast_ref::<W>()
            .expect("checked in WindowAs::new");
        self.logic.fire(key, window, panes, timestamp, out)
    }
}

/// The factory of a time-window operator (`make` builds one from a subtask's logic).
fn time_window_factory<T, O, L, W, Op>(
    logic: L,
    make: impl Fn(WindowAs<TimeWindow, L, W>) -> Op + Send + Sync + 'static,
) -> Arc<dyn OperatorFactory>
where
    T: Record,
    O: Record,
    W: 'static,
    L: Clone + Send + Sync + 'static,
    Op: Operator<T, O>,
{
    let logic = WindowAs::<TimeWindow, L, W>::new(logic);
    Arc::new(OperatorNode::<T, O, _>::new(move || make(logic.clone())))
}

fn check_size(what: &str, size: Duration) -> i64 {
    let ms = millis(size);
    assert!(
        ms > 0,
        "{what} needs a window size of at least 1 ms, got {size:?}"
    );
    ms
}

macro_rules! aligned_assigner {
    ($(#[$doc:meta])* $name:ident, $domain:expr, sliding: $sliding:tt) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug)]
        pub struct $name {
            size: i64,
            slide: i64,
            offset: i64,
        }

        impl $name {
            /// Shifts window starts by `offset_ms` milliseconds (may be negative: `-8 * 3_600_000`
            /// starts daily windows at midnight UTC+8).
            pub fn with_offset(mut self, offset_ms: i64) -> Self {
                self.offset = offset_ms;
                self
            }
        }

        aligned_assigner!(@of $name, sliding: $sliding);

        impl<T> WindowAssigner<T> for $name {
            type Window = TimeWindow;
            #[allow(private_interfaces)]
            fn spec(self) -> WindowSpec<T> {
                WindowSpec::Aligned {
                    size: self.size,
                    slide: self.slide,
                    offset: self.offset,
                    domain: $domain,
                }
            }
        }
    };
    (@of $name:ident, sliding: false) => {
        impl $name {
            /// Windows of `size`, one after the other.
            pub fn of(size: Duration) -> Self {
                let size = check_size(stringify!($name), size);
                $name { size, slide: size, offset: 0 }
            }
        }
    };
    (@of $name:ident, sliding: true) => {
        impl $name {
            /// Windows of `size` starting every `slide`: each record is in `size / slide` of them.
            pub fn of(size: Duration, slide: Duration) -> Self {
                let size = check_size(stringify!($name), size);
                let slide = check_size(stringify!($name), slide);
                assert!(
                    slide <= size,
                    "{} slide ({slide} ms) must not exceed the size ({size} ms)",
                    stringify!($name)
                );
                $name { size, slide, offset: 0 }
            }
        }
    };
}

aligned_assigner!(
    /// Tumbling event-time windows: fixed size, no overlap, fired by the watermark.
    TumblingEventTimeWindows, TimeDomain::EventTime, sliding: false
);
aligned_assigner!(
    /// Tumbling processing-time windows, fired by the wall clock.
    TumblingProcessingTimeWindows, TimeDomain::ProcessingTime, sliding: false
);
aligned_assigner!(
    /// Sliding (hopping) event-time windows.
    SlidingEventTimeWindows, TimeDomain::EventTime, sliding: true
);
aligned_assigner!(
    /// Sliding (hopping) processing-time windows.
    SlidingProcessingTimeWindows, TimeDomain::ProcessingTime, sliding: true
);

macro_rules! session_assigner {
    ($(#[$doc:meta])* $name:ident, $domain:expr) => {
        $(#[$doc])*
        pub struct $name<T> {
            gap: SessionGap<T>,
        }

        impl<T> $name<T> {
            /// Sessions end after `gap` without records of the key.
            pub fn with_gap(gap: Duration) -> Self {
                $name {
                    gap: SessionGap::Static(check_size(stringify!($name), gap)),
                }
            }

            /// The gap after each record is computed from the record.
            pub fn with_dynamic_gap(gap: impl Fn(&T) -> Duration + Send + Sync + 'static) -> Self {
                $name {
                    gap: SessionGap::Dynamic(Arc::new(gap)),
                }
            }
        }

        impl<T> std::fmt::Debug for $name<T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(stringify!($name))
            }
        }

        impl<T: 'static> WindowAssigner<T> for $name<T> {
            type Window = TimeWindow;
            #[allow(private_interfaces)]
            fn spec(self) -> WindowSpec<T> {
                WindowSpec::Session {
                    gap: self.gap,
                    domain: $domain,
                }
            }
        }
    };
}

session_assigner!(
    /// Event-time session windows: a key's records closer than the gap form one window.
    EventTimeSessionWindows, TimeDomain::EventTime
);
session_assigner!(
    /// Processing-time session windows.
    ProcessingTimeSessionWindows, TimeDomain::ProcessingTime
);

/// One window per key holding all its records, fired by a count trigger: every `count`
/// records the window fires and is purged (`KeyedStream::count_window`).
#[derive(Clone, Copy, Debug)]
pub struct GlobalWindows {
    count: u64,
}

impl GlobalWindows {
    /// Global windows with a purging count trigger of `count` records.
    pub fn with_count_trigger(count: u64) -> Self {
        assert!(count > 0, "a count trigger needs a count of at least 1");
        GlobalWindows { count }
    }
}

impl<T> WindowAssigner<T> for GlobalWindows {
    type Window = GlobalWindow;
    #[allow(private_interfaces)]
    fn spec(self) -> WindowSpec<T> {
        WindowSpec::Count { count: self.count }
    }
}
