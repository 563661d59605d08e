//! State descriptors: the name, types and TTL of a keyed state, as an operator declares them in
//! `open` (Flink's `ValueStateDescriptor`, `ListStateDescriptor`, ...).
//!
//! A descriptor is plain data (`Send + Sync`, cheap to clone); handing it to
//! [`crate::LocalKeyedBackend`] registers the state and returns a handle. Registering the same
//! name again with the same kind, types and TTL returns a handle to the same state; anything
//! else is an [`crate::StateErrorKind::IncompatibleRegistration`] error naming the state.

use std::any::{type_name, TypeId};
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::ttl::StateTtlConfig;

/// The kinds of keyed state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// [`crate::ValueState`].
    Value,
    /// [`crate::ListState`].
    List,
    /// [`crate::MapState`].
    Map,
    /// [`crate::ReducingState`].
    Reducing,
    /// [`crate::AggregatingState`].
    Aggregating,
}

impl fmt::Display for StateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StateKind::Value => "ValueState",
            StateKind::List => "ListState",
            StateKind::Map => "MapState",
            StateKind::Reducing => "ReducingState",
            StateKind::Aggregating => "AggregatingState",
        })
    }
}

/// What identifies a registration: kind, type signature and TTL. Two registrations of one name
/// must agree on all three.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StateSignature {
    pub(crate) kind: StateKind,
    pub(crate) types: TypeId,
    pub(crate) type_names: String,
    pub(crate) ttl: Option<StateTtlConfig>,
}

impl StateSignature {
    pub(crate) fn new<Types: 'static>(
        kind: StateKind,
        type_names: String,
        ttl: Option<StateTtlConfig>,
    ) -> StateSignature {
        StateSignature {
            kind,
            types: TypeId::of::<Types>(),
            type_names,
            ttl,
        }
    }
}

impl fmt::Display for StateSignature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}<{}>", self.kind, self.type_names)?;
        match &self.ttl {
            Some(ttl) => write!(f, " with {ttl}"),
            None => f.write_str(" without TTL"),
        }
    }
}

/// A number no other descriptor of this process has.
fn next_descriptor_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Declares a [`crate::ValueState<T>`]: one value per key (and namespace).
pub struct ValueStateDescriptor<T> {
    id: u64,
    name: String,
    ttl: Option<StateTtlConfig>,
    _type: PhantomData<fn() -> T>,
}

/// Declares a [`crate::ListState<T>`]: a list of values per key.
pub struct ListStateDescriptor<T> {
    id: u64,
    name: String,
    ttl: Option<StateTtlConfig>,
    _type: PhantomData<fn() -> T>,
}

/// Declares a [`crate::MapState<UK, UV>`]: a map per key.
pub struct MapStateDescriptor<UK, UV> {
    id: u64,
    name: String,
    ttl: Option<StateTtlConfig>,
    _type: PhantomData<fn() -> (UK, UV)>,
}

/// The function a [`crate::ReducingState`] folds added values with: `reduce(current, added)`.
pub type ReduceFn<T> = Arc<dyn Fn(&T, &T) -> T + Send + Sync>;

/// Declares a [`crate::ReducingState<T>`]: one value per key, folded with a reduce function.
pub struct ReducingStateDescriptor<T> {
    id: u64,
    name: String,
    ttl: Option<StateTtlConfig>,
    reduce: ReduceFn<T>,
}

/// An incremental aggregation (Flink's `AggregateFunction`): inputs are folded into an
/// accumulator as they arrive, which yields the result. The same trait serves
/// [`AggregatingStateDescriptor`] and the engine's window `aggregate`.
pub trait AggregateFunction<IN, ACC, OUT>: Send + Sync + 'static {
    /// A fresh, empty accumulator.
    fn create_accumulator(&self) -> ACC;
    /// Folds `value` into `accumulator`.
    fn add(&self, value: IN, accumulator: &mut ACC);
    /// The result of what was folded into `accumulator`.
    fn get_result(&self, accumulator: &ACC) -> OUT;
    /// Folds `other` into `into` (the panes of a sliding window, merging sessions).
    fn merge(&self, into: &mut ACC, other: &ACC);
}

/// Declares a [`crate::AggregatingState<IN, OUT>`] with accumulator type `ACC`.
pub struct AggregatingStateDescriptor<IN, ACC, OUT> {
    id: u64,
    name: String,
    ttl: Option<StateTtlConfig>,
    function: Arc<dyn AggregateFunction<IN, ACC, OUT>>,
}

macro_rules! common_descriptor_methods {
    () => {
        /// The state name (unique per operator).
        pub fn name(&self) -> &str {
            &self.name
        }

        /// What tells this descriptor (and its clones) from any other made in this process,
        /// even one of the same name: the engine finds the handle it registered by it.
        pub fn id(&self) -> u64 {
            self.id
        }

        /// Gives entries a time to live (a new descriptor, with an id of its own).
        pub fn with_ttl(mut self, ttl: StateTtlConfig) -> Self {
            self.ttl = Some(ttl);
            self.id = next_descriptor_id();
            self
        }

        /// The TTL settings, if any.
        pub fn ttl(&self) -> Option<&StateTtlConfig> {
            self.ttl.as_ref()
        }
    };
}

impl<T: 'static> ValueStateDescriptor<T> {
    /// A value state named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        ValueStateDescriptor {
            name: name.into(),
            id: next_descriptor_id(),
            ttl: None,
            _type: PhantomData,
        }
    }

    common_descriptor_methods!();

    pub(crate) fn signature(&self) -> StateSignature {
        StateSignature::new::<T>(StateKind::Value, type_name::<T>().to_string(), self.ttl)
    }
}

impl<T: 'static> ListStateDescriptor<T> {
    /// A list state named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        ListStateDescriptor {
            name: name.into(),
            id: next_descriptor_id(),
            ttl: None,
            _type: PhantomData,
        }
    }

    common_descriptor_methods!();

    pub(crate) fn signature(&self) -> StateSignature {
        StateSignature::new::<T>(StateKind::List, type_name::<T>().to_string(), self.ttl)
    }
}

impl<UK: 'static, UV: 'static> MapStateDescriptor<UK, UV> {
    /// A map state named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        MapStateDescriptor {
            name: name.into(),
            id: next_descriptor_id(),
            ttl: None,
            _type: PhantomData,
        }
    }

    common_descriptor_methods!();

    pub(crate) fn signature(&self) -> StateSignature {
        StateSignature::new::<(UK, UV)>(
            StateKind::Map,
            format!("{}, {}", type_name::<UK>(), type_name::<UV>()),
            self.ttl,
        )
    }
}

impl<T: 'static> ReducingStateDescriptor<T> {
    /// A reducing state named `name` that folds added values with `reduce(current, added)`.
    pub fn new(
        name: impl Into<String>,
        reduce: impl Fn(&T, &T) -> T + Send + Sync + 'static,
    ) -> Self {
        ReducingStateDescriptor {
            name: name.into(),
            id: next_descriptor_id(),
            ttl: None,
            reduce: Arc::new(reduce),
        }
    }

    common_descriptor_methods!();

    /// The reduce function.
    pub fn reduce_fn(&self) -> &ReduceFn<T> {
        &self.reduce
    }

    pub(crate) fn signature(&self) -> StateSignature {
        StateSignature::new::<T>(StateKind::Reducing, type_name::<T>().to_string(), self.ttl)
    }
}

impl<IN: 'static, ACC: 'static, OUT: 'static> AggregatingStateDescriptor<IN, ACC, OUT> {
    /// An aggregating state named `name` that aggregates with `function`.
    pub fn new(name: impl Into<String>, function: impl AggregateFunction<IN, ACC, OUT>) -> Self {
        AggregatingStateDescriptor {
            name: name.into(),
            id: next_descriptor_id(),
            ttl: None,
            function: Arc::new(function),
        }
    }

    common_descriptor_methods!();

    /// The aggregate function.
    pub fn function(&self) -> &Arc<dyn AggregateFunction<IN, ACC, OUT>> {
        &self.function
    }

    pub(crate) fn signature(&self) -> StateSignature {
        StateSignature::new::<(IN, ACC, OUT)>(
            StateKind::Aggregating,
            format!(
                "{}, {}, {}",
                type_name::<IN>(),
                type_name::<ACC>(),
                type_name::<OUT>()
            ),
            self.ttl,
        )
    }
}

impl<T> Clone for ValueStateDescriptor<T> {
    fn clone(&self) -> Self {
        ValueStateDescriptor {
            id: self.id,
            name: self.name.clone(),
            ttl: self.ttl,
            _type: PhantomData,
        }
    }
}

impl<T> Clone for ListStateDescriptor<T> {
    fn clone(&self) -> Self {
        ListStateDescriptor {
            id: self.id,
            name: self.name.clone(),
            ttl: self.ttl,
            _type: PhantomData,
        }
    }
}

impl<UK, UV> Clone for MapStateDescriptor<UK, UV> {
    fn clone(&self) -> Self {
        MapStateDescriptor {
            id: self.id,
            name: self.name.clone(),
            ttl: self.ttl,
            _type: PhantomData,
        }
    }
}

impl<T> Clone for ReducingStateDescriptor<T> {
    fn clone(&self) -> Self {
        ReducingStateDescriptor {
            id: self.id,
            name: self.name.clone(),
            ttl: self.ttl,
            reduce: Arc::clone(&self.reduce),
        }
    }
}

impl<IN, ACC, OUT> Clone for AggregatingStateDescriptor<IN, ACC, OUT> {
    fn clone(&self) -> Self {
        AggregatingStateDescriptor {
            id: self.id,
            name: self.name.clone(),
            ttl: self.ttl,
            function: Arc::clone(&self.function),
        }
    }
}

macro_rules! debug_descriptor {
    ($ty:ident < $($param:ident),+ >) => {
        impl<$($param),+> fmt::Debug for $ty<$($param),+> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("name", &self.name)
                    .field("ttl", &self.ttl)
                    .finish_non_exhaustive()
            }
        }
    };
}

debug_descriptor!(ValueStateDescriptor<T>);
debug_descriptor!(ListStateDescriptor<T>);
debug_descriptor!(MapStateDescriptor<UK, UV>);
debug_descriptor!(ReducingStateDescriptor<T>);
debug_descriptor!(AggregatingStateDescriptor<IN, ACC, OUT>);

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn signatures_tell_kinds_types_and_ttl_apart() {
        let a = ValueStateDescriptor::<u64>::new("a").signature();
        let b = ReducingStateDescriptor::<u64>::new("a", |x, y| x + y).signature();
        let c = ValueStateDescriptor::<u32>::new("a").signature();
        let d = ValueStateDescriptor::<u64>::new("a")
            .with_ttl(StateTtlConfig::new(Duration::from_secs(1)))
            .signature();
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
        assert_eq!(a, ValueStateDescriptor::<u64>::new("other").signature());
        assert_eq!(a.to_string(), "ValueState<u64> without TTL");
    }

    #[test]
    fn clones_share_an_id_and_new_or_changed_descriptors_get_their_own() {
        let a = ValueStateDescriptor::<u64>::new("count");
        assert_eq!(a.clone().id(), a.id());
        assert_ne!(ValueStateDescriptor::<u64>::new("count").id(), a.id());
        let with_ttl = a
            .clone()
            .with_ttl(StateTtlConfig::new(Duration::from_secs(1)));
        assert_ne!(with_ttl.id(), a.id(), "a TTL makes it another declaration");
        let reducing = ReducingStateDescriptor::<u64>::new("sum", |x, y| x + y);
        assert_eq!(reducing.clone().id(), reducing.id());
    }

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn descriptors_cross_threads() {
        assert_send_sync::<ReducingStateDescriptor<u64>>();
        assert_send_sync::<MapStateDescriptor<String, Vec<u8>>>();
    }
}
