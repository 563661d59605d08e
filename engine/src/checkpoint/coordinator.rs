//! The checkpoint coordinator's decisions, apart from any I/O: when to trigger a checkpoint,
//! when one is complete, when it is aborted, and when the job has failed too many.
//!
//! [`Coordinator`] is a state machine fed with what happens — time passing ([`Coordinator::tick`],
//! with the time as a number: no clock), a task's acknowledgement with its state handle, a
//! task declining — and answering with [`Command`]s for whoever runs it: trigger checkpoint `n`
//! at the sources, persist a completed checkpoint's handles, tell every task that a checkpoint
//! completed or was aborted, fail the job. Nothing in it assumes one process: in local mode the
//! job's driver runs it, later the control plane's job master, and both only move messages.
//!
//! Flink's rules, with its setting names:
//! - `execution.checkpointing.interval`: a checkpoint is due `interval` after the previous
//!   trigger;
//! - `execution.checkpointing.min-pause`: and no sooner than `min-pause` after the last
//!   checkpoint completed or was aborted; with a pause, at most one is pending at a time;
//! - `execution.checkpointing.max-concurrent-checkpoints`: at most this many pending at once
//!   (a due trigger waits);
//! - `execution.checkpointing.timeout`: a pending checkpoint older than this is aborted;
//! - a task that declines aborts the checkpoint;
//! - a checkpoint completes when every task has acknowledged it and its metadata is committed
//!   ([`Coordinator::committed`]; only then do the tasks hear it completed — a checkpoint
//!   whose commit failed, [`Coordinator::not_committed`], is aborted instead); pending
//!   checkpoints older than one every task acknowledged are aborted as subsumed (the newer one
//!   supersedes them), and acknowledgements of checkpoints no longer pending are ignored;
//! - `execution.checkpointing.tolerable-failed-checkpoints`: the job fails when more than this
//!   many checkpoints in a row were aborted by a timeout, a decline or a failed commit (a
//!   subsumed one is not a failure); a completed checkpoint resets the count.
//!
//! Savepoints ([`Coordinator::trigger_savepoint`]) are numbered with the checkpoints and
//! complete and abort the same way, but are triggered on request, at once, whatever the
//! interval, pause and concurrency say; while one is pending no checkpoint is triggered; a
//! completed savepoint subsumes no checkpoint and is subsumed by none; and a failed one is
//! no checkpoint failure (Flink's rules). A savepoint that stops the job stops the periodic
//! checkpoints too, as Flink stops its checkpoint scheduler for a stop-with-savepoint: none is
//! triggered once it was (its tasks close once it completed, and a checkpoint cut after its
//! barrier could not be written), unless it is aborted or not committed.
//!
//! A checkpoint asked for ([`Coordinator::trigger_checkpoint`], Flink's manual checkpoint) is
//! one of the job's own, triggered whatever the interval and pause say, but within the
//! concurrency: it waits while as many are pending as may be, or a savepoint is; the interval
//! counts again from it.
//!
//! The final checkpoint ([`Coordinator::end_of_input`], Flink's checkpoint after tasks
//! finish): once every source's input ended and the operators finished, no periodic checkpoint
//! is triggered; the final one is, at once or as soon as the checkpoints pending then ended
//! (they do not cover the end of the input). Its completion lets the tasks end; an aborted one
//! counts as a failure like any checkpoint and is triggered again.

use std::collections::BTreeMap;

/// The coordinator's settings (Flink's defaults where it has them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointSettings {
    /// Time between triggers, ms.
    pub interval_ms: i64,
    /// A pending checkpoint older than this is aborted, ms (Flink: 10 minutes).
    pub timeout_ms: i64,
    /// Least time from the end of one checkpoint to the start of the next, ms (Flink: 0).
    pub min_pause_ms: i64,
    /// Most checkpoints pending at once (Flink: 1).
    pub max_concurrent: usize,
    /// Checkpoint failures in a row the job tolerates (Flink: 0).
    pub tolerable_failures: u32,
}

impl CheckpointSettings {
    /// Flink's defaults with this interval.
    pub fn every(interval_ms: i64) -> CheckpointSettings {
        CheckpointSettings {
            interval_ms,
            timeout_ms: 10 * 60 * 1000,
            min_pause_ms: 0,
            max_concurrent: 1,
            tolerable_failures: 0,
        }
    }
}

/// Why a checkpoint was aborted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AbortReason {
    /// It was pending longer than the timeout.
    Expired,
    /// A task declined it, saying why.
    Declined {
        /// The task.
        task: usize,
        /// Its reason.
        reason: String,
    },
    /// A newer checkpoint completed first.
    Subsumed {
        /// The newer checkpoint.
        by: u64,
    },
    /// Every task acknowledged it, but its metadata could not be committed.
    NotCommitted {
        /// Why.
        reason: String,
    },
}

impl AbortReason {
    /// Whether it counts towards the tolerable failures.
    fn is_failure(&self) -> bool {
        !matches!(self, AbortReason::Subsumed { .. })
    }
}

/// What the coordinator asks for, in the order it asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command<H> {
    /// Inject barrier `checkpoint` at every source, stamped with `timestamp_ms`.
    Trigger {
        /// The checkpoint.
        checkpoint: u64,
        /// When it was triggered.
        timestamp_ms: i64,
    },
    /// Every task acknowledged `checkpoint`: persist its metadata from these handles (by task),
    /// then say how that went ([`Coordinator::committed`], which tells the tasks it completed,
    /// or [`Coordinator::not_committed`], which aborts it).
    Persist {
        /// The checkpoint.
        checkpoint: u64,
        /// When it was triggered.
        timestamp_ms: i64,
        /// Each task's state handle, by task index.
        handles: Vec<H>,
    },
    /// Tell every task that `checkpoint` completed (`notify_checkpoint_complete`).
    NotifyComplete {
        /// The checkpoint.
        checkpoint: u64,
    },
    /// Tell every task that `checkpoint` was aborted (`notify_checkpoint_aborted`); what it
    /// wrote for it can go.
    NotifyAborted {
        /// The checkpoint.
        checkpoint: u64,
        /// Why.
        reason: AbortReason,
    },
    /// Too many checkpoints failed in a row: fail the job (it restarts from the last completed
    /// checkpoint, per its restart strategy).
    FailJob {
        /// What happened, naming the setting.
        reason: String,
    },
}

/// One pending checkpoint: when it was triggered and the handles so far.
#[derive(Debug)]
struct Pending<H> {
    timestamp_ms: i64,
    savepoint: bool,
    handles: Vec<Option<H>>,
    acknowledged: usize,
}

/// The coordinator of one job (see the module docs).
#[derive(Debug)]
pub struct Coordinator<H> {
    settings: CheckpointSettings,
    tasks: usize,
    next: u64,
    pending: BTreeMap<u64, Pending<H>>,
    last_trigger_ms: Option<i64>,
    /// When the last checkpoint completed or was aborted.
    last_end_ms: Option<i64>,
    failures_in_a_row: u32,
    failed: bool,
    /// Every source's input ended: only the final checkpoint is triggered.
    input_ended: bool,
    /// The final checkpoint, while it is pending or once it completed.
    final_checkpoint: Option<u64>,
    /// Checkpoints acknowledged by every task whose metadata is being committed, and whether
    /// each is a savepoint.
    persisting: BTreeMap<u64, bool>,
    /// The savepoint that stops the job, once triggered, unless it was aborted or not
    /// committed: no periodic checkpoint is triggered meanwhile.
    stopping: Option<u64>,
}

impl<H> Coordinator<H> {
    /// A coordinator of a job with `tasks` tasks, whose next checkpoint is `next` (one after
    /// the checkpoint it was restored from, or 1).
    pub fn new(settings: CheckpointSettings, tasks: usize, next: u64) -> Coordinator<H> {
        Coordinator {
            settings,
            tasks,
            next,
            pending: BTreeMap::new(),
            last_trigger_ms: None,
            last_end_ms: None,
            failures_in_a_row: 0,
            failed: false,
            input_ended: false,
            final_checkpoint: None,
            persisting: BTreeMap::new(),
            stopping: None,
        }
    }

    /// Every source's input ended and its operators finished, at `now_ms`: triggers the final
    /// checkpoint (see the module docs) if nothing else is pending.
    pub fn end_of_input(&mut self, now_ms: i64) -> Vec<Command<H>> {
        self.input_ended = true;
        self.tick(now_ms)
    }

    /// The final checkpoint's number, once it was triggered (`None` again if it was aborted,
    /// until it is triggered anew).
    pub fn final_checkpoint(&self) -> Option<u64> {
        self.final_checkpoint
    }

    /// The checkpoints pending now, oldest first.
    pub fn pending(&self) -> impl Iterator<Item = u64> + '_ {
        self.pending.keys().copied()
    }

    /// Time passed to `now_ms`: expires what timed out, then triggers a checkpoint if one is
    /// due.
    pub fn tick(&mut self, now_ms: i64) -> Vec<Command<H>> {
        let mut commands = Vec::new();
        if self.failed {
            return commands;
        }
        let expired: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, pending)| now_ms - pending.timestamp_ms >= self.settings.timeout_ms)
            .map(|(&checkpoint, _)| checkpoint)
            .collect();
        for checkpoint in expired {
            self.abort(checkpoint, AbortReason::Expired, now_ms, &mut commands);
        }
        if !self.failed && self.trigger_due(now_ms) {
            self.last_trigger_ms = Some(now_ms);
            let checkpoint = self.begin(now_ms, false);
            if self.input_ended {
                self.final_checkpoint = Some(checkpoint);
            }
            commands.push(Command::Trigger {
                checkpoint,
                timestamp_ms: now_ms,
            });
        }
        commands
    }

    /// Triggers a savepoint stamped `now_ms` at once, one that `stops` the job or not (see
    /// the module docs): its number, to be triggered like a checkpoint's, or why none can be
    /// taken.
    pub fn trigger_savepoint(&mut self, now_ms: i64, stops: bool) -> Result<u64, String> {
        if self.failed {
            return Err("the job is failing (too many checkpoints failed)".into());
        }
        if let Some((savepoint, _)) = self.pending.iter().find(|(_, p)| p.savepoint) {
            return Err(format!("savepoint {savepoint} is still in progress"));
        }
        let savepoint = self.begin(now_ms, true);
        if stops {
            self.stopping = Some(savepoint);
        }
        Ok(savepoint)
    }

    /// Triggers a checkpoint stamped `now_ms` whatever the interval (a checkpoint asked for,
    /// see the module docs): its number, to be triggered; `None` while it must wait for a
    /// pending one to end; or why none can be taken.
    pub fn trigger_checkpoint(&mut self, now_ms: i64) -> Result<Option<u64>, String> {
        if self.failed {
            return Err("the job is failing (too many checkpoints failed)".into());
        }
        if let Some(savepoint) = self.stopping {
            return Err(format!("the job is stopping with savepoint {savepoint}"));
        }
        if self.input_ended {
            return Err(
                "every source's input ended: the job takes only its final checkpoint now".into(),
            );
        }
        let savepoint = self.pending.values().any(|p| p.savepoint);
        if savepoint || self.pending.len() >= self.most_pending() {
            return Ok(None);
        }
        self.last_trigger_ms = Some(now_ms);
        Ok(Some(self.begin(now_ms, false)))
    }

    /// How many checkpoints may be pending at once.
    fn most_pending(&self) -> usize {
        if self.settings.min_pause_ms > 0 {
            1
        } else {
            self.settings.max_concurrent.max(1)
        }
    }

    /// Makes the next checkpoint (or savepoint) pending: its number.
    fn begin(&mut self, now_ms: i64, savepoint: bool) -> u64 {
        let checkpoint = self.next;
        self.next += 1;
        self.pending.insert(
            checkpoint,
            Pending {
                timestamp_ms: now_ms,
                savepoint,
                handles: (0..self.tasks).map(|_| None).collect(),
                acknowledged: 0,
            },
        );
        checkpoint
    }

    /// When the next trigger is due, ms: the caller's timer for [`Coordinator::tick`] (the
    /// earliest expiry matters too: see [`Coordinator::next_expiry`]).
    pub fn next_trigger(&self) -> i64 {
        let after_trigger = self
            .last_trigger_ms
            .map_or(i64::MIN, |t| t + self.settings.interval_ms);
        let after_end = self
            .last_end_ms
            .map_or(i64::MIN, |t| t + self.settings.min_pause_ms);
        after_trigger.max(after_end)
    }

    /// When the oldest pending checkpoint expires, ms, if one is pending.
    pub fn next_expiry(&self) -> Option<i64> {
        self.pending
            .values()
            .next()
            .map(|pending| pending.timestamp_ms + self.settings.timeout_ms)
    }

    fn trigger_due(&self, now_ms: i64) -> bool {
        if self.stopping.is_some() {
            return false;
        }
        if self.input_ended {
            // The final checkpoint: once, after every other pending one ended.
            return self.final_checkpoint.is_none() && self.pending.is_empty();
        }
        let savepoint = self.pending.values().any(|p| p.savepoint);
        !savepoint && self.pending.len() < self.most_pending() && now_ms >= self.next_trigger()
    }

    /// Task `task` acknowledged `checkpoint` with its state handle.
    pub fn acknowledge(
        &mut self,
        checkpoint: u64,
        task: usize,
        handle: H,
        now_ms: i64,
    ) -> Vec<Command<H>> {
        let mut commands = Vec::new();
        let Some(pending) = self.pending.get_mut(&checkpoint) else {
            // Late: aborted, subsumed or completed already.
            return commands;
        };
        let Some(slot) = pending.handles.get_mut(task) else {
            return commands;
        };
        if slot.is_none() {
            pending.acknowledged += 1;
        }
        *slot = Some(handle);
        if pending.acknowledged < self.tasks {
            return commands;
        }
        let pending = self.pending.remove(&checkpoint).expect("pending");
        if !pending.savepoint {
            // Older pending checkpoints are superseded by this one (savepoints are not).
            let older: Vec<u64> = self
                .pending
                .range(..checkpoint)
                .filter(|(_, p)| !p.savepoint)
                .map(|(&c, _)| c)
                .collect();
            for old in older {
                self.abort(
                    old,
                    AbortReason::Subsumed { by: checkpoint },
                    now_ms,
                    &mut commands,
                );
            }
            self.last_end_ms = Some(now_ms);
        }
        self.persisting.insert(checkpoint, pending.savepoint);
        commands.push(Command::Persist {
            checkpoint,
            timestamp_ms: pending.timestamp_ms,
            handles: pending
                .handles
                .into_iter()
                .map(|h| h.expect("acked"))
                .collect(),
        });
        commands
    }

    /// `checkpoint`'s metadata is committed: it completed, and every task hears so.
    pub fn committed(&mut self, checkpoint: u64) -> Vec<Command<H>> {
        if self.persisting.remove(&checkpoint) == Some(false) {
            self.failures_in_a_row = 0;
        }
        vec![Command::NotifyComplete { checkpoint }]
    }

    /// `checkpoint`'s metadata could not be committed, at `now_ms`: it did not complete, and
    /// no task may hear it did (a sink would commit output no checkpoint holds). It is
    /// aborted, and counted as a failure unless it is a savepoint; the final checkpoint is
    /// triggered again.
    pub fn not_committed(
        &mut self,
        checkpoint: u64,
        reason: String,
        now_ms: i64,
    ) -> Vec<Command<H>> {
        let mut commands = Vec::new();
        let Some(savepoint) = self.persisting.remove(&checkpoint) else {
            return commands;
        };
        self.ended_without_completing(checkpoint);
        commands.push(Command::NotifyAborted {
            checkpoint,
            reason: AbortReason::NotCommitted { reason },
        });
        if !savepoint {
            self.count_failure(checkpoint, now_ms, &mut commands);
        }
        commands
    }

    /// Task `task` declined `checkpoint`.
    pub fn decline(
        &mut self,
        checkpoint: u64,
        task: usize,
        reason: &str,
        now_ms: i64,
    ) -> Vec<Command<H>> {
        let mut commands = Vec::new();
        if self.pending.contains_key(&checkpoint) {
            let reason = AbortReason::Declined {
                task,
                reason: reason.to_string(),
            };
            self.abort(checkpoint, reason, now_ms, &mut commands);
        }
        commands
    }

    fn abort(
        &mut self,
        checkpoint: u64,
        reason: AbortReason,
        now_ms: i64,
        commands: &mut Vec<Command<H>>,
    ) {
        let Some(pending) = self.pending.remove(&checkpoint) else {
            return;
        };
        let failure = reason.is_failure() && !pending.savepoint;
        self.ended_without_completing(checkpoint);
        commands.push(Command::NotifyAborted { checkpoint, reason });
        if failure {
            self.count_failure(checkpoint, now_ms, commands);
        }
    }

    /// `checkpoint` was aborted or not committed: a final checkpoint is triggered again, and
    /// a stopping savepoint no longer stops the periodic checkpoints.
    fn ended_without_completing(&mut self, checkpoint: u64) {
        if self.final_checkpoint == Some(checkpoint) {
            self.final_checkpoint = None;
        }
        if self.stopping == Some(checkpoint) {
            self.stopping = None;
        }
    }

    /// `checkpoint` failed at `now_ms`: one more failure in a row, which fails the job past
    /// the tolerated number.
    fn count_failure(&mut self, checkpoint: u64, now_ms: i64, commands: &mut Vec<Command<H>>) {
        self.last_end_ms = Some(now_ms);
        self.failures_in_a_row += 1;
        if self.failures_in_a_row > self.settings.tolerable_failures && !self.failed {
            self.failed = true;
            commands.push(Command::FailJob {
                reason: format!(
                    "{} checkpoint(s) in a row failed, more than \
                     execution.checkpointing.tolerable-failed-checkpoints = {}; raise it to \
                     ride out more, or see why checkpoint {checkpoint} failed",
                    self.failures_in_a_row, self.settings.tolerable_failures
                ),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn triggers<H>(commands: &[Command<H>]) -> Vec<u64> {
        commands
            .iter()
            .filter_map(|c| match c {
                Command::Trigger { checkpoint, .. } => Some(*checkpoint),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn triggers_on_the_interval_and_completes_when_every_task_acks() {
        let mut c: Coordinator<&str> = Coordinator::new(CheckpointSettings::every(1000), 2, 1);
        assert_eq!(
            c.tick(0),
            [Command::Trigger {
                checkpoint: 1,
                timestamp_ms: 0
            }]
        );
        assert!(c.tick(500).is_empty(), "one pending at most");
        assert!(c.acknowledge(1, 1, "b1", 600).is_empty());
        assert!(
            c.acknowledge(1, 1, "b1 again", 600).is_empty(),
            "counted once"
        );
        assert_eq!(
            c.acknowledge(1, 0, "a1", 700),
            [Command::Persist {
                checkpoint: 1,
                timestamp_ms: 0,
                handles: vec!["a1", "b1 again"]
            },]
        );
        assert_eq!(c.committed(1), [Command::NotifyComplete { checkpoint: 1 }]);
        assert!(
            c.tick(999).is_empty(),
            "the interval counts from the trigger"
        );
        assert_eq!(triggers(&c.tick(1000)), [2]);
    }

    #[test]
    fn min_pause_counts_from_the_end_of_the_last_checkpoint() {
        let settings = CheckpointSettings {
            min_pause_ms: 800,
            max_concurrent: 5,
            ..CheckpointSettings::every(1000)
        };
        let mut c: Coordinator<()> = Coordinator::new(settings, 1, 1);
        assert_eq!(triggers(&c.tick(0)), [1]);
        assert!(c.tick(1500).is_empty(), "a pause allows one pending");
        c.acknowledge(1, 0, (), 1500);
        assert!(c.tick(2000).is_empty(), "pause until 2300");
        assert_eq!(c.next_trigger(), 2300);
        assert_eq!(triggers(&c.tick(2300)), [2]);
    }

    #[test]
    fn expired_and_declined_checkpoints_abort_and_too_many_fail_the_job() {
        let settings = CheckpointSettings {
            timeout_ms: 300,
            tolerable_failures: 1,
            max_concurrent: 2,
            ..CheckpointSettings::every(100)
        };
        let mut c: Coordinator<()> = Coordinator::new(settings, 1, 7);
        assert_eq!(triggers(&c.tick(0)), [7]);
        assert_eq!(triggers(&c.tick(100)), [8]);
        assert_eq!(c.next_expiry(), Some(300));
        let commands = c.tick(300);
        assert_eq!(
            commands[0],
            Command::NotifyAborted {
                checkpoint: 7,
                reason: AbortReason::Expired
            }
        );
        assert_eq!(triggers(&commands), [9], "a slot is free again");
        let commands = c.decline(8, 0, "disk full", 350);
        assert_eq!(
            commands[0],
            Command::NotifyAborted {
                checkpoint: 8,
                reason: AbortReason::Declined {
                    task: 0,
                    reason: "disk full".into()
                }
            }
        );
        let Command::FailJob { reason } = &commands[1] else {
            panic!("{commands:?}")
        };
        assert!(reason.contains("2 checkpoint(s) in a row"), "{reason}");
        assert!(
            reason.contains("tolerable-failed-checkpoints = 1"),
            "{reason}"
        );
        assert!(c.tick(10_000).is_empty(), "a failed job triggers nothing");
    }

    #[test]
    fn a_completed_checkpoint_subsumes_older_ones_and_resets_the_failures() {
        let settings = CheckpointSettings {
            max_concurrent: 3,
            tolerable_failures: 1,
            timeout_ms: 1_000,
            ..CheckpointSettings::every(10)
        };
        let mut c: Coordinator<u64> = Coordinator::new(settings, 1, 1);
        for t in [0, 10, 20] {
            c.tick(t);
        }
        assert_eq!(c.pending().collect::<Vec<_>>(), [1, 2, 3]);
        c.decline(1, 0, "busy", 25);
        let commands = c.acknowledge(3, 0, 33, 30);
        assert_eq!(
            commands[0],
            Command::NotifyAborted {
                checkpoint: 2,
                reason: AbortReason::Subsumed { by: 3 }
            }
        );
        assert!(matches!(
            commands[1],
            Command::Persist { checkpoint: 3, .. }
        ));
        assert!(
            c.acknowledge(2, 0, 22, 31).is_empty(),
            "a late ack is ignored"
        );
        c.committed(3);
        // One failure before the completion was forgiven: one more is tolerated.
        c.tick(40);
        let commands = c.decline(4, 0, "busy", 41);
        assert!(
            !commands
                .iter()
                .any(|c| matches!(c, Command::FailJob { .. })),
            "{commands:?}"
        );
    }

    #[test]
    fn the_final_checkpoint_waits_for_the_pending_one_and_is_retriggered_after_an_abort() {
        let settings = CheckpointSettings {
            tolerable_failures: 1,
            ..CheckpointSettings::every(1000)
        };
        let mut c: Coordinator<&str> = Coordinator::new(settings, 1, 1);
        assert_eq!(triggers(&c.tick(0)), [1]);
        // The input ends while checkpoint 1 is pending: it does not cover the end.
        assert!(c.end_of_input(10).is_empty());
        assert_eq!(c.final_checkpoint(), None);
        let done = c.acknowledge(1, 0, "a1", 20);
        assert!(matches!(
            done.last(),
            Some(Command::Persist { checkpoint: 1, .. })
        ));
        c.committed(1);
        // Not the interval: the final checkpoint goes at the next tick after the pending ended.
        assert_eq!(triggers(&c.tick(21)), [2]);
        assert_eq!(c.final_checkpoint(), Some(2));
        assert!(
            triggers(&c.tick(5000)).is_empty(),
            "no periodic checkpoint after the end"
        );
        // Declined: a failure (tolerated here), and the final checkpoint goes again.
        let aborted = c.decline(2, 0, "disk full", 5001);
        assert!(matches!(
            aborted[..],
            [Command::NotifyAborted { checkpoint: 2, .. }]
        ));
        assert_eq!(c.final_checkpoint(), None);
        assert_eq!(triggers(&c.tick(5002)), [3]);
        assert_eq!(c.final_checkpoint(), Some(3));
        let done = c.acknowledge(3, 0, "a3", 5003);
        assert!(matches!(
            done.last(),
            Some(Command::Persist { checkpoint: 3, .. })
        ));
        assert_eq!(c.committed(3), [Command::NotifyComplete { checkpoint: 3 }]);
        assert!(
            triggers(&c.tick(99_999)).is_empty(),
            "nothing after the final checkpoint"
        );
        assert_eq!(c.final_checkpoint(), Some(3));
        // With nothing pending, the end of the input triggers at once.
        let mut idle: Coordinator<&str> = Coordinator::new(CheckpointSettings::every(60_000), 1, 7);
        assert!(triggers(&idle.tick(0)).len() == 1 && idle.acknowledge(7, 0, "x", 1).len() == 1);
        idle.committed(7);
        assert_eq!(triggers(&idle.end_of_input(2)), [8]);
    }

    /// Every task acknowledged, but the metadata could not be committed: no task hears the
    /// checkpoint completed (a sink would commit output no checkpoint holds); it is aborted and
    /// counted as a failure, and the final checkpoint goes again. A savepoint's is no
    /// checkpoint failure.
    #[test]
    fn a_checkpoint_whose_metadata_is_not_committed_is_aborted_not_completed() {
        let settings = CheckpointSettings {
            tolerable_failures: 1,
            ..CheckpointSettings::every(100)
        };
        let mut c: Coordinator<&str> = Coordinator::new(settings, 1, 1);
        assert_eq!(triggers(&c.end_of_input(0)), [1]);
        assert_eq!(c.final_checkpoint(), Some(1));
        assert!(matches!(
            c.acknowledge(1, 0, "a1", 10)[..],
            [Command::Persist { checkpoint: 1, .. }]
        ));
        assert_eq!(
            c.not_committed(1, "disk full".into(), 11),
            [Command::NotifyAborted {
                checkpoint: 1,
                reason: AbortReason::NotCommitted {
                    reason: "disk full".into()
                }
            }]
        );
        assert_eq!(c.final_checkpoint(), None);
        assert_eq!(
            triggers(&c.tick(12)),
            [2],
            "the final checkpoint goes again"
        );
        c.acknowledge(2, 0, "a2", 13);
        let failed = c.not_committed(2, "disk full".into(), 14);
        assert!(
            matches!(failed.last(), Some(Command::FailJob { .. })),
            "two failures in a row, one tolerated: {failed:?}"
        );
        // A savepoint's commit failing is no checkpoint failure.
        let mut c: Coordinator<&str> = Coordinator::new(CheckpointSettings::every(100), 1, 1);
        assert_eq!(c.trigger_savepoint(0, false), Ok(1));
        c.acknowledge(1, 0, "s1", 1);
        assert!(matches!(
            c.not_committed(1, "disk full".into(), 2)[..],
            [Command::NotifyAborted { checkpoint: 1, .. }]
        ));
        assert!(
            c.not_committed(1, "again".into(), 3).is_empty(),
            "ended once"
        );
    }

    #[test]
    fn a_savepoint_triggers_at_once_and_neither_subsumes_nor_is_subsumed() {
        let settings = CheckpointSettings {
            max_concurrent: 2,
            timeout_ms: 1_000,
            ..CheckpointSettings::every(100)
        };
        let mut c: Coordinator<u64> = Coordinator::new(settings, 1, 1);
        assert_eq!(triggers(&c.tick(0)), [1]);
        // Whatever the interval says.
        assert_eq!(c.trigger_savepoint(5, false), Ok(2));
        assert_eq!(
            c.trigger_savepoint(6, false),
            Err("savepoint 2 is still in progress".to_string())
        );
        assert!(
            c.tick(200).is_empty(),
            "no checkpoint while a savepoint is pending"
        );
        // The savepoint completes without subsuming checkpoint 1.
        let commands = c.acknowledge(2, 0, 22, 210);
        assert!(matches!(
            commands[0],
            Command::Persist { checkpoint: 2, .. }
        ));
        assert_eq!(commands.len(), 1, "{commands:?}");
        c.committed(2);
        assert_eq!(c.pending().collect::<Vec<_>>(), [1]);
        assert_eq!(triggers(&c.tick(210)), [3]);
        // A later savepoint is not subsumed by a completed checkpoint, and its failure is no
        // checkpoint failure (the job tolerates none).
        assert_eq!(c.trigger_savepoint(220, false), Ok(4));
        let commands = c.acknowledge(3, 0, 33, 230);
        assert!(
            !commands
                .iter()
                .any(|c| matches!(c, Command::NotifyAborted { checkpoint: 4, .. })),
            "{commands:?}"
        );
        let commands = c.decline(4, 0, "busy", 240);
        assert_eq!(
            commands,
            [Command::NotifyAborted {
                checkpoint: 4,
                reason: AbortReason::Declined {
                    task: 0,
                    reason: "busy".into()
                }
            }]
        );
        assert!(
            c.trigger_savepoint(250, false).is_ok(),
            "the job is not failing"
        );
    }

    /// A savepoint that stops the job stops the periodic checkpoints (a checkpoint cut after
    /// its barrier could not be written once its tasks close), while pending, being committed
    /// and once completed; aborted, it stops nothing.
    #[test]
    fn a_stopping_savepoint_stops_the_periodic_checkpoints_unless_it_fails() {
        let settings = CheckpointSettings {
            max_concurrent: 2,
            ..CheckpointSettings::every(100)
        };
        let mut c: Coordinator<u64> = Coordinator::new(settings, 1, 1);
        assert_eq!(triggers(&c.tick(0)), [1]);
        assert_eq!(c.trigger_savepoint(5, true), Ok(2));
        assert!(c.tick(200).is_empty(), "none while it is pending");
        c.acknowledge(1, 0, 11, 210);
        c.committed(1);
        c.acknowledge(2, 0, 22, 220);
        assert!(c.tick(300).is_empty(), "none while it is committed");
        c.committed(2);
        assert!(c.tick(400).is_empty(), "none once it completed");
        assert_eq!(c.next_expiry(), None);

        let mut c: Coordinator<u64> = Coordinator::new(settings, 1, 1);
        assert_eq!(c.trigger_savepoint(0, true), Ok(1));
        c.decline(1, 0, "busy", 10);
        assert_eq!(triggers(&c.tick(200)), [2], "a failed one stops nothing");
        assert_eq!(c.trigger_savepoint(210, true), Ok(3));
        c.acknowledge(2, 0, 22, 220);
        c.committed(2);
        c.acknowledge(3, 0, 33, 230);
        c.not_committed(3, "disk full".into(), 240);
        assert_eq!(triggers(&c.tick(400)), [4], "nor one not committed");
    }

    #[test]
    fn a_checkpoint_asked_for_triggers_at_once_and_the_interval_counts_from_it() {
        let mut c: Coordinator<u64> = Coordinator::new(CheckpointSettings::every(100), 1, 1);
        assert_eq!(triggers(&c.tick(0)), [1]);
        assert_eq!(
            c.trigger_checkpoint(5),
            Ok(None),
            "one may be pending: it waits"
        );
        c.acknowledge(1, 0, 11, 8);
        c.committed(1);
        assert_eq!(
            c.trigger_checkpoint(10),
            Ok(Some(2)),
            "at once, before the interval"
        );
        c.acknowledge(2, 0, 22, 20);
        c.committed(2);
        assert!(
            c.tick(100).is_empty(),
            "the interval counts from the one asked for"
        );
        assert_eq!(triggers(&c.tick(110)), [3]);
        c.acknowledge(3, 0, 33, 115);
        c.committed(3);

        assert_eq!(c.trigger_savepoint(120, false), Ok(4));
        assert_eq!(c.trigger_checkpoint(125), Ok(None), "behind the savepoint");
        c.acknowledge(4, 0, 44, 126);
        c.committed(4);
        assert_eq!(c.trigger_savepoint(127, true), Ok(5));
        assert_eq!(
            c.trigger_checkpoint(130),
            Err("the job is stopping with savepoint 5".into())
        );
        c.decline(5, 0, "busy", 140);
        assert_eq!(
            c.trigger_checkpoint(150),
            Ok(Some(6)),
            "a failed stop stops nothing"
        );

        c.end_of_input(160);
        assert!(
            c.trigger_checkpoint(170).is_err(),
            "only the final checkpoint is taken"
        );
    }

    proptest! {
        /// Whatever happens, in any order: every checkpoint is triggered once, in increasing
        /// order, ends at most once (completed or aborted), never completes without every
        /// task's ack and its commit, and the pending ones respect the limit.
        #[test]
        fn any_schedule_keeps_the_invariants(
            events in proptest::collection::vec((0u8..4, 0u64..12, 0usize..3, 0i64..400), 1..120)
        ) {
            let settings = CheckpointSettings {
                max_concurrent: 2,
                tolerable_failures: 3,
                timeout_ms: 900,
                ..CheckpointSettings::every(100)
            };
            let tasks = 3;
            let mut c: Coordinator<usize> = Coordinator::new(settings, tasks, 1);
            let mut now = 0;
            let mut triggered = Vec::new();
            let mut ended = std::collections::HashSet::new();
            let mut acked: BTreeMap<u64, std::collections::HashSet<usize>> = BTreeMap::new();
            for (kind, checkpoint, task, step) in events {
                now += step;
                let commands = match kind {
                    0 | 1 => c.tick(now),
                    2 => {
                        // Mostly a pending checkpoint, sometimes a stale or unknown one.
                        let pending: Vec<u64> = c.pending().collect();
                        let checkpoint = match pending.len() {
                            n if n > 0 && checkpoint < 9 => pending[checkpoint as usize % n],
                            _ => checkpoint,
                        };
                        acked.entry(checkpoint).or_default().insert(task);
                        c.acknowledge(checkpoint, task, task, now)
                    }
                    _ => c.decline(checkpoint, task, "no", now),
                };
                let mut commands: std::collections::VecDeque<_> = commands.into();
                while let Some(command) = commands.pop_front() {
                    match command {
                        Command::Trigger { checkpoint, .. } => {
                            prop_assert!(triggered.last().is_none_or(|&l| l < checkpoint));
                            acked.remove(&checkpoint);
                            triggered.push(checkpoint);
                        }
                        Command::Persist { checkpoint, handles, .. } => {
                            prop_assert_eq!(handles.len(), tasks);
                            prop_assert_eq!(acked.get(&checkpoint).map_or(0, |a| a.len()), tasks);
                            // Its commit fails now and then.
                            if (checkpoint + task as u64).is_multiple_of(5) {
                                commands.extend(c.not_committed(checkpoint, "no".into(), now));
                            } else {
                                commands.extend(c.committed(checkpoint));
                            }
                        }
                        Command::NotifyAborted { checkpoint, .. }
                        | Command::NotifyComplete { checkpoint } => {
                            prop_assert!(ended.insert(checkpoint), "ended twice");
                        }
                        Command::FailJob { .. } => {}
                    }
                }
                prop_assert!(c.pending().count() <= 2);
                for pending in c.pending() {
                    prop_assert!(triggered.contains(&pending) && !ended.contains(&pending));
                }
            }
        }
    }
}
