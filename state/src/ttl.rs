//! State time-to-live: configuration, the injectable clock, and expiry arithmetic.
//!
//! As in Flink, TTL runs on processing time. A state entry written (or, with
//! [`TtlUpdateType::OnReadAndWrite`], also read) at `now` expires at `now + ttl`; it is expired
//! once the clock reaches that instant. Expired entries are never returned: a read that finds
//! one removes it. Besides reads, the heap backend removes them in
//! [`crate::LocalKeyedBackend::cleanup_expired`] (bounded work per call, driven by the engine)
//! and RocksDB drops them in compaction (a compaction filter reading the expiry stored in front
//! of each value).
//!
//! Every backend takes its time from a [`Clock`], so tests advance a [`ManualClock`] instead of
//! sleeping.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of processing time in milliseconds since the Unix epoch.
///
/// `Send + Sync` because RocksDB calls its compaction filter (which reads the clock) on its
/// background threads.
pub trait Clock: Send + Sync + 'static {
    /// The current time, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The operating system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|since| since.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to; clones share the same time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock showing `start_ms`.
    pub fn new(start_ms: i64) -> ManualClock {
        ManualClock(Arc::new(AtomicI64::new(start_ms)))
    }

    /// Sets the time.
    pub fn set(&self, now_ms: i64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }

    /// Moves the time forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as i64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// When an entry's time to live restarts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TtlUpdateType {
    /// On every write (Flink's `OnCreateAndWrite`).
    OnCreateAndWrite,
    /// On every write and every read that returns the entry (Flink's `OnReadAndWrite`).
    OnReadAndWrite,
}

/// Whether expired-but-not-yet-removed entries may be returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateVisibility {
    /// Never return an expired entry (Flink's `NeverReturnExpired`, the only choice).
    NeverReturnExpired,
}

/// The time-to-live settings of one state (Flink's `StateTtlConfig`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StateTtlConfig {
    ttl: Duration,
    update_type: TtlUpdateType,
    visibility: StateVisibility,
}

impl StateTtlConfig {
    /// Entries live for `ttl` after their last write ([`TtlUpdateType::OnCreateAndWrite`],
    /// [`StateVisibility::NeverReturnExpired`]). A `ttl` is counted in whole milliseconds.
    pub fn new(ttl: Duration) -> StateTtlConfig {
        StateTtlConfig {
            ttl,
            update_type: TtlUpdateType::OnCreateAndWrite,
            visibility: StateVisibility::NeverReturnExpired,
        }
    }

    /// Sets when the time to live restarts.
    pub fn with_update_type(mut self, update_type: TtlUpdateType) -> StateTtlConfig {
        self.update_type = update_type;
        self
    }

    /// Sets the visibility of expired entries.
    pub fn with_visibility(mut self, visibility: StateVisibility) -> StateTtlConfig {
        self.visibility = visibility;
        self
    }

    /// The time to live.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the time to live restarts.
    pub fn update_type(&self) -> TtlUpdateType {
        self.update_type
    }

    /// The visibility of expired entries.
    pub fn visibility(&self) -> StateVisibility {
        self.visibility
    }
}

impl fmt::Display for StateTtlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TTL {:?} ({:?})", self.ttl, self.update_type)
    }
}

/// The expiry instant of an entry without TTL.
pub(crate) const NEVER_EXPIRES: i64 = i64::MAX;

/// Whether an entry that expires at `expires_at` is expired at `now`.
#[inline]
pub(crate) fn is_expired(expires_at: i64, now: i64) -> bool {
    expires_at <= now
}

/// The TTL behaviour of one registered state: its config bound to the backend's clock.
#[derive(Clone)]
pub(crate) struct TtlPolicy {
    ttl_ms: i64,
    refresh_on_read: bool,
    clock: Arc<dyn Clock>,
}

impl TtlPolicy {
    /// The policy of a state with `config`, or `None` without TTL.
    pub(crate) fn new(
        config: Option<&StateTtlConfig>,
        clock: &Arc<dyn Clock>,
    ) -> Option<TtlPolicy> {
        config.map(|config| TtlPolicy {
            ttl_ms: i64::try_from(config.ttl.as_millis()).unwrap_or(i64::MAX),
            refresh_on_read: config.update_type == TtlUpdateType::OnReadAndWrite,
            clock: Arc::clone(clock),
        })
    }

    /// The current time.
    #[inline]
    pub(crate) fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The expiry of an entry written (or refreshed) at `now`.
    #[inline]
    pub(crate) fn expiry_from(&self, now: i64) -> i64 {
        now.saturating_add(self.ttl_ms)
    }

    /// Whether reads restart the time to live.
    #[inline]
    pub(crate) fn refresh_on_read(&self) -> bool {
        self.refresh_on_read
    }
}

/// The time of an access and the expiry a write at that time gets, for an optional policy.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AccessTime {
    /// The current time (meaningless without TTL).
    pub(crate) now: i64,
    /// The expiry a write now receives ([`NEVER_EXPIRES`] without TTL).
    pub(crate) write_expiry: i64,
    /// Whether reads now refresh entries to `write_expiry`.
    pub(crate) refresh_on_read: bool,
}

impl AccessTime {
    /// Reads the clock once (not at all without TTL).
    #[inline]
    pub(crate) fn of(policy: Option<&TtlPolicy>) -> AccessTime {
        match policy {
            None => AccessTime {
                now: i64::MIN,
                write_expiry: NEVER_EXPIRES,
                refresh_on_read: false,
            },
            Some(policy) => {
                let now = policy.now();
                AccessTime {
                    now,
                    write_expiry: policy.expiry_from(now),
                    refresh_on_read: policy.refresh_on_read(),
                }
            }
        }
    }

    /// Whether an entry expiring at `expires_at` is expired now.
    #[inline]
    pub(crate) fn expired(&self, expires_at: i64) -> bool {
        is_expired(expires_at, self.now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_drives_expiry() {
        let clock = ManualClock::new(1_000);
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        let config = StateTtlConfig::new(Duration::from_millis(100));
        let policy = TtlPolicy::new(Some(&config), &shared).unwrap();
        let access = AccessTime::of(Some(&policy));
        assert_eq!(access.write_expiry, 1_100);
        assert!(!access.expired(1_100));
        clock.advance(Duration::from_millis(100));
        assert!(AccessTime::of(Some(&policy)).expired(1_100));
        // Without TTL nothing expires.
        let none = AccessTime::of(None);
        assert!(!none.expired(NEVER_EXPIRES));
        assert!(!none.refresh_on_read);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }
}
