//! Window assigners (Flink's names): which windows a record belongs to, and in which time.

use std::any::{Any, TypeId};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use super::aligned::{AlignedWindowOperator, Geometry};
use weir_state::{BackendType, LocalKeyedBackend, StateError};

use super::function::{StoredLogic, WindowLogic};
use super::stored::Stored;
use super::{CountWindowOperator, GlobalWindow, SessionWindowOperator, TimeWindow, Window};
use crate::graph::{AnyOutput, OperatorFactory};
use crate::metrics::OperatorMetrics;
use crate::operator::{Batch, Operator, OutputTag, RuntimeContext, SideOutputs};
use crate::record::{Key, Record};
use crate::runtime::factories::link_operator;
use crate::runtime::task::TaskSettings;
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
        L: StoredLogic<K, Self::Window, T, O> + Clone + Send + Sync,
        Self: Sized,
    {
        factory_of_spec::<T, K, KS, O, L, Self::Window>(self.spec(), parts, logic)
    }
}

/// The factory of the window operator `spec` asks for, running `logic` (written for windows
/// of type `W`, which is the spec's own).
pub(crate) fn factory_of_spec<T, K, KS, O, L, W>(
    spec: WindowSpec<T>,
    parts: WindowParts<T, KS>,
    logic: L,
) -> Arc<dyn OperatorFactory>
where
    T: Record,
    K: Key,
    KS: Fn(&T) -> K + Clone + Send + Sync + 'static,
    O: Record,
    W: Window,
    L: StoredLogic<K, W, T, O> + Clone + Send + Sync,
{
    let WindowParts {
        key_selector,
        allowed_lateness,
        late_tag,
    } = parts;
    match spec {
        WindowSpec::Aligned {
            size,
            slide,
            offset,
            domain,
        } => WindowNode::factory(
            WindowAs::<TimeWindow, L, W>::new(logic),
            AlignedMaker {
                key_selector,
                geometry: Geometry::new(size, slide, offset),
                domain,
                allowed_lateness,
                late_tag,
            },
        ),
        WindowSpec::Session { gap, domain } => WindowNode::factory(
            WindowAs::<TimeWindow, L, W>::new(logic),
            SessionMaker {
                key_selector,
                gap,
                domain,
                allowed_lateness,
                late_tag,
            },
        ),
        WindowSpec::Count { count } => WindowNode::factory(
            WindowAs::<GlobalWindow, L, W>::new(logic),
            CountMaker {
                key_selector,
                count,
            },
        ),
    }
}

/// Builds a window operator over whichever window logic a subtask gets: the function itself
/// (contents on the heap) or the function over the state backend ([`Stored`]).
trait MakeOperator<K, W, T, O>: Send + Sync + 'static {
    type Op<L: WindowLogic<K, W, T, O>>: Operator<T, O>;
    fn make<L: WindowLogic<K, W, T, O>>(&self, logic: L) -> Self::Op<L>;
}

struct AlignedMaker<T, KS> {
    key_selector: KS,
    geometry: Geometry,
    domain: TimeDomain,
    allowed_lateness: i64,
    late_tag: Option<OutputTag<T>>,
}

impl<K, T, O, KS> MakeOperator<K, TimeWindow, T, O> for AlignedMaker<T, KS>
where
    K: Key,
    T: Record,
    O: Record,
    KS: Fn(&T) -> K + Clone + Send + Sync + 'static,
{
    type Op<L: WindowLogic<K, TimeWindow, T, O>> = AlignedWindowOperator<K, T, O, KS, L>;

    fn make<L: WindowLogic<K, TimeWindow, T, O>>(&self, logic: L) -> Self::Op<L> {
        AlignedWindowOperator::new(
            self.key_selector.clone(),
            logic,
            self.geometry,
            self.domain,
            self.allowed_lateness,
            self.late_tag.clone(),
        )
    }
}

struct SessionMaker<T, KS> {
    key_selector: KS,
    gap: SessionGap<T>,
    domain: TimeDomain,
    allowed_lateness: i64,
    late_tag: Option<OutputTag<T>>,
}

impl<K, T, O, KS> MakeOperator<K, TimeWindow, T, O> for SessionMaker<T, KS>
where
    K: Key,
    T: Record,
    O: Record,
    KS: Fn(&T) -> K + Clone + Send + Sync + 'static,
{
    type Op<L: WindowLogic<K, TimeWindow, T, O>> = SessionWindowOperator<K, T, O, KS, L>;

    fn make<L: WindowLogic<K, TimeWindow, T, O>>(&self, logic: L) -> Self::Op<L> {
        SessionWindowOperator::new(
            self.key_selector.clone(),
            logic,
            self.gap.clone(),
            self.domain,
            self.allowed_lateness,
            self.late_tag.clone(),
        )
    }
}

struct CountMaker<KS> {
    key_selector: KS,
    count: u64,
}

impl<K, T, O, KS> MakeOperator<K, GlobalWindow, T, O> for CountMaker<KS>
where
    K: Key,
    T: Record,
    O: Record,
    KS: Fn(&T) -> K + Clone + Send + Sync + 'static,
{
    type Op<L: WindowLogic<K, GlobalWindow, T, O>> = CountWindowOperator<K, T, O, KS, L>;

    fn make<L: WindowLogic<K, GlobalWindow, T, O>>(&self, logic: L) -> Self::Op<L> {
        CountWindowOperator::new(self.key_selector.clone(), logic, self.count)
    }
}

/// The factory of a window operator: per subtask, its logic on the heap, or over the state
/// backend when the job's is RocksDB.
struct WindowNode<K, W, T, O, L, M> {
    logic: L,
    maker: M,
    _types: PhantomData<fn(K, W, T) -> O>,
}

impl<K, W, T, O, L, M> WindowNode<K, W, T, O, L, M>
where
    K: Key,
    W: 'static,
    T: Record,
    O: Record,
    L: StoredLogic<K, W, T, O> + Clone + Send + Sync,
    M: MakeOperator<K, W, T, O>,
{
    fn factory(logic: L, maker: M) -> Arc<dyn OperatorFactory> {
        Arc::new(WindowNode {
            logic,
            maker,
            _types: PhantomData,
        })
    }
}

impl<K, W, T, O, L, M> OperatorFactory for WindowNode<K, W, T, O, L, M>
where
    K: Key,
    W: 'static,
    T: Record,
    O: Record,
    L: StoredLogic<K, W, T, O> + Clone + Send + Sync,
    M: MakeOperator<K, W, T, O>,
{
    fn create(
        &self,
        ctx: &RuntimeContext,
        settings: &TaskSettings,
        metrics: Arc<OperatorMetrics>,
        next: AnyOutput,
        side: SideOutputs,
    ) -> AnyOutput {
        if ctx.state.backend == BackendType::RocksDb {
            let operator = self.maker.make(Stored::open(ctx, self.logic.clone()));
            link_operator(operator, ctx, settings, metrics, next, side)
        } else {
            let operator = self.maker.make(self.logic.clone());
            link_operator(operator, ctx, settings, metrics, next, side)
        }
    }

    /// Windows write their panes, sessions and timers (`window::checkpoint`), and on RocksDB
    /// their contents as their instance's checkpoint, or read out of it into a savepoint
    /// (`window::stored`).
    fn unsupported_state(&self) -> Option<&'static str> {
        None
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
pub(crate) struct WindowAs<Actual, L, W> {
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
    pub(crate) fn new(logic: L) -> Self {
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

    fn create(&self, key: &K) -> L::Acc {
        self.logic.create(key)
    }

    #[inline]
    fn add(&mut self, acc: &mut L::Acc, value: T) {
        self.logic.add(acc, value)
    }

    fn weight(&self, value: &T) -> u64 {
        self.logic.weight(value)
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

    fn acc_codec(&self) -> super::checkpoint::AccCodec<L::Acc> {
        self.logic.acc_codec()
    }

    fn stored_codec(&self) -> Option<super::checkpoint::AccCodec<L::Acc>> {
        self.logic.stored_codec()
    }

    fn snapshot_contents(
        &self,
        snapshot: &mut crate::checkpoint::task_state::OperatorSnapshot,
    ) -> Result<(), StateError> {
        self.logic.snapshot_contents(snapshot)
    }
}

impl<K, T, O, Actual, W, L> StoredLogic<K, Actual, T, O> for WindowAs<Actual, L, W>
where
    Actual: 'static,
    W: 'static,
    L: StoredLogic<K, W, T, O>,
{
    type Contents = L::Contents;

    fn register(backend: &LocalKeyedBackend<K, u64>) -> Result<L::Contents, StateError> {
        L::register(backend)
    }

    fn add_stored(&mut self, contents: &L::Contents, value: T) -> Result<(), StateError> {
        self.logic.add_stored(contents, value)
    }

    fn add_new(&mut self, contents: &L::Contents, value: T) -> Result<(), StateError> {
        self.logic.add_new(contents, value)
    }

    fn merge_new(&mut self, contents: &L::Contents, from: L::Acc) -> Result<(), StateError> {
        self.logic.merge_new(contents, from)
    }

    fn load(&mut self, contents: &L::Contents) -> Result<L::Acc, StateError> {
        self.logic.load(contents)
    }

    fn merge_stored(&mut self, contents: &L::Contents, from: L::Acc) -> Result<(), StateError> {
        self.logic.merge_stored(contents, from)
    }
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
