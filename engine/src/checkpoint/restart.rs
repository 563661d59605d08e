//! Restart strategies: after a task fails, whether the job restarts from its last completed
//! checkpoint, and after how long — decided from the failure times alone (no clock, and the
//! jitter's random number handed in), so every rule is tested exactly.
//!
//! Flink's strategies, settings and defaults (`restart-strategy.type`):
//! - `exponential-delay` (Flink's default for a checkpointed job): the first restart waits
//!   `initial-backoff` (1 s); each further one `backoff-multiplier` (1.5) times longer, up to
//!   `max-backoff` (1 min), each moved by up to `jitter-factor` (0.1) of itself either way; a
//!   job that then runs `reset-backoff-threshold` (1 h) without failing starts again from the
//!   initial backoff; after `attempts-before-reset-backoff` restarts (unlimited by default)
//!   without such a reset it gives up. Failures while a restart is still waiting (other tasks
//!   failing with the first) are one failure, not several (Flink 1.19's merging).
//! - `fixed-delay`: at most `attempts` restarts (1), each after `delay` (1 s).
//! - `failure-rate`: restarts after `delay` (1 s) until more than
//!   `max-failures-per-interval` (1) failures fall within `failure-rate-interval` (1 min).
//! - `none`: the first failure fails the job.

use std::collections::VecDeque;

/// A restart strategy and its settings (see the module docs for the defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RestartStrategy {
    /// Never restart.
    None,
    /// At most `attempts` restarts, each after `delay_ms`.
    FixedDelay {
        /// Restarts allowed.
        attempts: u32,
        /// Wait before each, ms.
        delay_ms: i64,
    },
    /// Restart after `delay_ms` while at most `max_failures` fall within `interval_ms`.
    FailureRate {
        /// Failures allowed within the interval.
        max_failures: u32,
        /// The interval, ms.
        interval_ms: i64,
        /// Wait before each restart, ms.
        delay_ms: i64,
    },
    /// Growing waits (see the module docs).
    ExponentialDelay(ExponentialDelay),
}

/// The settings of `exponential-delay` (`Default`: Flink's).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExponentialDelay {
    /// The first wait, ms.
    pub initial_backoff_ms: i64,
    /// The longest wait, ms.
    pub max_backoff_ms: i64,
    /// How much longer each wait is than the one before.
    pub multiplier: f64,
    /// Running this long without a failure resets the wait, ms.
    pub reset_threshold_ms: i64,
    /// Each wait moves by up to this share of itself either way.
    pub jitter: f64,
    /// Restarts allowed without a reset (`u32::MAX`: unlimited).
    pub attempts_before_reset: u32,
}

impl Default for ExponentialDelay {
    fn default() -> Self {
        ExponentialDelay {
            initial_backoff_ms: 1_000,
            max_backoff_ms: 60_000,
            multiplier: 1.5,
            reset_threshold_ms: 60 * 60 * 1_000,
            jitter: 0.1,
            attempts_before_reset: u32::MAX,
        }
    }
}

impl RestartStrategy {
    /// `fixed-delay` with Flink's defaults.
    pub const FIXED_DELAY: RestartStrategy = RestartStrategy::FixedDelay {
        attempts: 1,
        delay_ms: 1_000,
    };
    /// `failure-rate` with Flink's defaults.
    pub const FAILURE_RATE: RestartStrategy = RestartStrategy::FailureRate {
        max_failures: 1,
        interval_ms: 60_000,
        delay_ms: 1_000,
    };
}

/// What to do about a failure.
#[derive(Clone, Debug, PartialEq)]
pub enum RestartDecision {
    /// Restart the job after this many ms.
    RestartAfter(i64),
    /// Another task's failure while the restart for an earlier one still waits: nothing more
    /// to do.
    AlreadyRestarting,
    /// Fail the job: why, naming the setting that ran out.
    GiveUp(String),
}

/// Applies a [`RestartStrategy`] to one job's failures.
#[derive(Debug)]
pub struct RestartTracker {
    strategy: RestartStrategy,
    restarts: u32,
    /// Failure times within the failure rate's interval.
    recent: VecDeque<i64>,
    /// When the pending restart happens (failures before then are merged into it).
    restart_at: Option<i64>,
    /// The last wait of the exponential strategy, ms.
    backoff_ms: Option<f64>,
    /// Restarts since the exponential backoff was last reset.
    attempts_since_reset: u32,
}

impl RestartTracker {
    /// A tracker for a job that has not failed yet.
    pub fn new(strategy: RestartStrategy) -> RestartTracker {
        RestartTracker {
            strategy,
            restarts: 0,
            recent: VecDeque::new(),
            restart_at: None,
            backoff_ms: None,
            attempts_since_reset: 0,
        }
    }

    /// Restarts decided so far (each logged and counted by the caller).
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// A task failed at `now_ms`; `random` is uniform in `[0, 1)`, for the jitter.
    pub fn on_failure(&mut self, now_ms: i64, random: f64) -> RestartDecision {
        if self.restart_at.is_some_and(|at| now_ms < at) {
            return RestartDecision::AlreadyRestarting;
        }
        let delay = match self.strategy {
            RestartStrategy::None => {
                return RestartDecision::GiveUp(
                    "restart-strategy.type is none: a failure fails the job; set \
                     restart-strategy.type: exponential-delay (or fixed-delay, failure-rate) \
                     to restart from the last checkpoint"
                        .into(),
                )
            }
            RestartStrategy::FixedDelay { attempts, delay_ms } => {
                if self.restarts >= attempts {
                    return RestartDecision::GiveUp(format!(
                        "the job failed after {} restart(s), restart-strategy.fixed-delay.attempts \
                         = {attempts}; raise it to restart more often",
                        self.restarts
                    ));
                }
                delay_ms
            }
            RestartStrategy::FailureRate {
                max_failures,
                interval_ms,
                delay_ms,
            } => {
                self.recent.push_back(now_ms);
                while self
                    .recent
                    .front()
                    .is_some_and(|&at| now_ms - at >= interval_ms)
                {
                    self.recent.pop_front();
                }
                if self.recent.len() > max_failures as usize {
                    return RestartDecision::GiveUp(format!(
                        "{} failures within {interval_ms} ms, more than \
                         restart-strategy.failure-rate.max-failures-per-interval = \
                         {max_failures}; raise it, or fix what fails",
                        self.recent.len()
                    ));
                }
                delay_ms
            }
            RestartStrategy::ExponentialDelay(ExponentialDelay {
                initial_backoff_ms,
                max_backoff_ms,
                multiplier,
                reset_threshold_ms,
                jitter,
                attempts_before_reset,
            }) => {
                // Running long enough since the last restart resets the backoff.
                let stable = self
                    .restart_at
                    .is_some_and(|at| now_ms - at >= reset_threshold_ms);
                if stable {
                    self.backoff_ms = None;
                    self.attempts_since_reset = 0;
                }
                if self.attempts_since_reset >= attempts_before_reset {
                    return RestartDecision::GiveUp(format!(
                        "{} restarts without {reset_threshold_ms} ms of stable running, \
                         restart-strategy.exponential-delay.attempts-before-reset-backoff = \
                         {attempts_before_reset}; raise it, or fix what fails",
                        self.attempts_since_reset
                    ));
                }
                let backoff = match self.backoff_ms {
                    None => initial_backoff_ms as f64,
                    Some(last) => (last * multiplier).min(max_backoff_ms as f64),
                };
                self.backoff_ms = Some(backoff);
                self.attempts_since_reset += 1;
                let moved = backoff * jitter * (2.0 * random - 1.0);
                (backoff + moved).round().max(0.0) as i64
            }
        };
        self.restarts += 1;
        self.restart_at = Some(now_ms + delay);
        RestartDecision::RestartAfter(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random numbers that move nothing (0.5 is the middle of the jitter).
    const NO_JITTER: f64 = 0.5;

    fn delays(tracker: &mut RestartTracker, failures: &[i64]) -> Vec<RestartDecision> {
        failures
            .iter()
            .map(|&at| tracker.on_failure(at, NO_JITTER))
            .collect()
    }

    #[test]
    fn none_gives_up_at_once_naming_the_setting() {
        let mut tracker = RestartTracker::new(RestartStrategy::None);
        let RestartDecision::GiveUp(why) = tracker.on_failure(0, NO_JITTER) else {
            panic!()
        };
        assert!(why.contains("restart-strategy.type is none"), "{why}");
    }

    #[test]
    fn fixed_delay_restarts_its_attempts_then_gives_up() {
        let strategy = RestartStrategy::FixedDelay {
            attempts: 2,
            delay_ms: 500,
        };
        let mut tracker = RestartTracker::new(strategy);
        let decisions = delays(&mut tracker, &[0, 200, 1_000, 5_000]);
        assert_eq!(decisions[0], RestartDecision::RestartAfter(500));
        assert_eq!(
            decisions[1],
            RestartDecision::AlreadyRestarting,
            "a second task failing before the restart is the same failure"
        );
        assert_eq!(decisions[2], RestartDecision::RestartAfter(500));
        let RestartDecision::GiveUp(why) = &decisions[3] else {
            panic!("{decisions:?}")
        };
        assert!(why.contains("fixed-delay.attempts = 2"), "{why}");
        assert_eq!(tracker.restarts(), 2);
    }

    #[test]
    fn failure_rate_gives_up_when_the_interval_holds_too_many() {
        let strategy = RestartStrategy::FailureRate {
            max_failures: 2,
            interval_ms: 10_000,
            delay_ms: 100,
        };
        let mut tracker = RestartTracker::new(strategy);
        // 0 and 5 000 are two in the interval; by 12 000 the first left it; 13 000 makes three
        // within 10 s (5 000, 12 000, 13 000).
        let decisions = delays(&mut tracker, &[0, 5_000, 12_000, 13_000]);
        assert_eq!(
            decisions[..3],
            [
                RestartDecision::RestartAfter(100),
                RestartDecision::RestartAfter(100),
                RestartDecision::RestartAfter(100)
            ]
        );
        let RestartDecision::GiveUp(why) = &decisions[3] else {
            panic!("{decisions:?}")
        };
        assert!(why.contains("3 failures within 10000 ms"), "{why}");
        assert!(why.contains("max-failures-per-interval = 2"), "{why}");
    }

    #[test]
    fn exponential_delay_grows_caps_resets_after_stable_running_and_jitters() {
        let strategy = RestartStrategy::ExponentialDelay(ExponentialDelay {
            max_backoff_ms: 3_000,
            multiplier: 2.0,
            reset_threshold_ms: 60_000,
            ..ExponentialDelay::default()
        });
        let mut tracker = RestartTracker::new(strategy);
        // Each failure comes after the previous restart, before the job ran stable.
        let mut now = 0;
        let mut waits = Vec::new();
        for _ in 0..4 {
            let RestartDecision::RestartAfter(wait) = tracker.on_failure(now, NO_JITTER) else {
                panic!()
            };
            waits.push(wait);
            now += wait + 10;
        }
        assert_eq!(waits, [1_000, 2_000, 3_000, 3_000], "doubles, capped");
        // An hour... here a minute of stable running resets it.
        now += 60_000;
        assert_eq!(
            tracker.on_failure(now, NO_JITTER),
            RestartDecision::RestartAfter(1_000)
        );
        // The jitter moves a wait by up to a tenth either way.
        now += 2_000;
        assert_eq!(
            tracker.on_failure(now, 0.0),
            RestartDecision::RestartAfter(1_800)
        );
        now += 3_000;
        assert_eq!(
            tracker.on_failure(now, 0.999_999),
            RestartDecision::RestartAfter(3_300)
        );
    }

    #[test]
    fn exponential_delay_gives_up_after_its_attempts_without_a_reset() {
        let strategy = RestartStrategy::ExponentialDelay(ExponentialDelay {
            attempts_before_reset: 2,
            ..ExponentialDelay::default()
        });
        let mut tracker = RestartTracker::new(strategy);
        assert_eq!(
            tracker.on_failure(0, NO_JITTER),
            RestartDecision::RestartAfter(1_000)
        );
        assert_eq!(
            tracker.on_failure(2_000, NO_JITTER),
            RestartDecision::RestartAfter(1_500)
        );
        let RestartDecision::GiveUp(why) = tracker.on_failure(5_000, NO_JITTER) else {
            panic!()
        };
        assert!(why.contains("attempts-before-reset-backoff = 2"), "{why}");
    }
}
