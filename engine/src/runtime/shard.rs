//! Shard executors: one glommio `LocalExecutor` per slot, pinned to its core, with separate
//! task queues for record processing, checkpoint I/O and background work.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use std::time::{Duration, Instant};

use glommio::{Latency, LocalExecutorBuilder, Placement, Shares, TaskQueueHandle};

use super::watchdog::{self, Pulse, Watchdog};
use crate::error::JobError;

/// How long a shard's tasks may wait for the CPU: the latency of each of its queues. glommio
/// arms its preempt timer with the shortest latency among the queues *waiting* to run, worked
/// out when a queue wakes or runs dry and leaving aside the one running: a queue whose latency
/// does not matter, woken by a running processing task, gave the next timer glommio's default
/// of 100 ms, and a busy source then held its shard that long. So every queue a shard's tasks
/// wake has this latency, and the shard's work itself (which its subtasks wake as they end,
/// and which starts the network driver) runs in the processing queue: glommio's default queue
/// only waits for it (`docs/design/local-exchange.md`, "The preempt timer"). The executor's own
/// timer stays glommio's default: set to this, shards were left asleep for good at their start.
const SHARD_LATENCY: Duration = Duration::from_millis(1);

/// Lets a task that never waits have its shard's reactor run about every [`SHARD_LATENCY`].
/// glommio polls its reactor — which wakes the tasks that other shards' sends, timers and I/O
/// made ready — only when every queue ran dry or its preempt timer fired, and that timer can
/// be its default of 100 ms (when no other queue was waiting as the task started): a source
/// whose sends to another shard always found room held its shard that long, while the task
/// reading what the other shard sent it was not woken and that shard waited for credit — at
/// the start of a 2-shard Nexmark q8, one shard's flush waited 64 ms
/// (`docs/design/local-exchange.md`, "The preempt timer").
pub(crate) struct ReactorPasses {
    next: Instant,
}

impl ReactorPasses {
    pub(crate) fn new() -> ReactorPasses {
        ReactorPasses {
            next: Instant::now() + SHARD_LATENCY,
        }
    }

    /// Lets the reactor run if the last pass is [`SHARD_LATENCY`] old.
    #[inline]
    pub(crate) async fn pass_if_due(&mut self) {
        if Instant::now() >= self.next {
            // A timer due a microsecond from now is pending when first polled: the task
            // waits, the shard runs whatever else is ready and then polls its reactor, which
            // finds the timer due (and wakes everything else that became ready). Were the
            // thread held up for that microsecond, the timer is due at once and this pass is
            // skipped: the next comes a millisecond later.
            glommio::timer::sleep(Duration::from_micros(1)).await;
            self.next = Instant::now() + SHARD_LATENCY;
        }
    }
}

/// How long each queue of a shard has run, for the progress report and metrics.
#[derive(Debug, Default)]
pub struct ShardLoad {
    /// Nanoseconds the processing queue has run.
    pub processing_ns: AtomicU64,
    /// Nanoseconds the checkpoint I/O queue has run.
    pub checkpoint_io_ns: AtomicU64,
    /// Nanoseconds the background queue has run.
    pub background_ns: AtomicU64,
    /// The shard thread's id (Linux `gettid`), 0 until it started: where its scheduling
    /// figures are read.
    pub os_tid: AtomicU64,
    /// Heap bytes the shard's thread holds (net of what it freed), as the counting allocator
    /// saw them at the last sample; 0 without one.
    pub heap_bytes: AtomicU64,
}

impl ShardLoad {
    /// Notes the calling thread as the shard's.
    pub(crate) fn started_here(&self) {
        // SAFETY: `gettid` has no preconditions.
        let tid = unsafe { libc::gettid() };
        self.os_tid.store(tid as u64, Ordering::Relaxed);
    }

    /// Nanoseconds the shard's thread was ready to run but waited for its core — another
    /// thread ran there (the run-queue delay of Linux's schedstat); `None` before the shard
    /// started or where the kernel does not keep the figure.
    pub fn stalled_ns(&self) -> Option<u64> {
        let tid = self.os_tid.load(Ordering::Relaxed);
        if tid == 0 {
            return None;
        }
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
        stat.split_whitespace().nth(1)?.parse().ok()
    }
}

/// The task queues of one shard.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShardQueues {
    /// Record processing: latency-sensitive, most of the shares.
    pub(crate) processing: TaskQueueHandle,
    /// Checkpoint uploads and compaction: throughput, never ahead of processing. (Snapshots
    /// are written from the processing queue today; nothing is spawned here yet.)
    pub(crate) checkpoint_io: TaskQueueHandle,
    /// Metrics sampling and control.
    pub(crate) background: TaskQueueHandle,
}

impl ShardQueues {
    /// Creates the queues on the current executor.
    pub(crate) fn create() -> ShardQueues {
        let executor = glommio::executor();
        ShardQueues {
            processing: executor.create_task_queue(
                Shares::Static(1000),
                Latency::Matters(SHARD_LATENCY),
                "processing",
            ),
            checkpoint_io: executor.create_task_queue(
                Shares::Static(200),
                Latency::Matters(SHARD_LATENCY),
                "checkpoint-io",
            ),
            background: executor.create_task_queue(
                Shares::Static(50),
                Latency::Matters(SHARD_LATENCY),
                "background",
            ),
        }
    }

    /// Adds to `load` how long each queue has run since the last sample (glommio hands out a
    /// queue's statistics once: reading them resets them).
    pub(crate) fn sample(&self, load: &ShardLoad) {
        let executor = glommio::executor();
        let add = |total: &AtomicU64, queue| {
            let ran = executor
                .task_queue_stats(queue)
                .map_or(0, |s| s.runtime().as_nanos() as u64);
            // This shard is the only writer.
            total.store(total.load(Ordering::Relaxed) + ran, Ordering::Relaxed);
        };
        add(&load.processing_ns, self.processing);
        add(&load.checkpoint_io_ns, self.checkpoint_io);
        add(&load.background_ns, self.background);
        if weir_memory::is_counting() {
            let net = weir_memory::current_thread_net_bytes();
            load.heap_bytes
                .store(u64::try_from(net).unwrap_or(0), Ordering::Relaxed);
        }
    }
}

/// Runs `work` on one executor per core in `cores`, pinned, and returns each shard's result
/// in order. Each shard beats a heartbeat that a watchdog thread checks (`watchdog.rs`).
pub(crate) fn run_on_shards<W, F, R>(
    cores: &[usize],
    spin_before_park: Duration,
    mut work: W,
) -> Result<Vec<R>, JobError>
where
    W: FnMut(usize) -> F,
    F: FnOnce(ShardQueues) -> futures::future::LocalBoxFuture<'static, R> + Send + 'static,
    R: Send + 'static,
{
    let mut handles = Vec::with_capacity(cores.len());
    let pulses: Vec<Arc<Pulse>> = cores.iter().map(|_| Arc::default()).collect();
    let watchdog = Watchdog::start(pulses.clone());
    for (shard, &core) in cores.iter().enumerate() {
        let job = work(shard);
        let pulse = Arc::clone(&pulses[shard]);
        let handle = LocalExecutorBuilder::new(Placement::Fixed(core))
            .name(&format!("weir-shard-{shard}"))
            .spin_before_park(spin_before_park)
            .spawn(move || async move {
                let queues = ShardQueues::create();
                // All of the shard's work runs in the processing queue (see
                // `SHARD_LATENCY`); glommio's default queue only waits for it.
                let work = async move {
                    // Finishes the pulse however the shard ends (a panic unwinding included),
                    // so the watchdog never signals a thread that has exited.
                    let _watched = pulse.start();
                    let beating = Arc::clone(&pulse);
                    let heartbeat = glommio::spawn_local_into(
                        async move {
                            loop {
                                beating.beat();
                                glommio::timer::sleep(watchdog::BEAT).await;
                            }
                        },
                        queues.background,
                    );
                    let result = job(queues).await;
                    // Dropping a glommio task cancels it.
                    drop(heartbeat);
                    result
                };
                glommio::spawn_local_into(work, queues.processing)
                    .expect("spawn the shard's work")
                    .await
            })
            .map_err(|e| JobError::Runtime {
                shard,
                core,
                message: e.to_string(),
            })?;
        handles.push((shard, core, handle));
    }
    let results = handles
        .into_iter()
        .map(|(shard, core, handle)| {
            handle.join().map_err(|e| JobError::Runtime {
                shard,
                core,
                message: e.to_string(),
            })
        })
        .collect();
    let forced = watchdog.interrupts();
    if forced > 0 {
        tracing::info!(forced, "the job's shards needed forced wake-ups");
    }
    results
}

/// Available core ids, in order.
pub fn available_cores() -> Vec<usize> {
    core_affinity::get_core_ids()
        .map(|ids| ids.into_iter().map(|c| c.id).collect())
        .unwrap_or_else(|| {
            (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
        })
}

/// The cores `slots` shards are pinned to: `taskmanager.cpu.cores` if set, else the first
/// available ones. Refuses more shards than cores.
pub fn resolve_cores(
    slots: Option<usize>,
    configured: Option<Vec<usize>>,
) -> Result<Vec<usize>, JobError> {
    let available = available_cores();
    let invalid = |message: String| {
        JobError::Config(crate::config::ConfigError::InvalidValue {
            key: "taskmanager.numberOfTaskSlots".into(),
            value: slots.map(|s| s.to_string()).unwrap_or_default(),
            expected: message,
        })
    };
    let cores = match configured {
        Some(cores) => {
            if let Some(bad) = cores.iter().find(|c| !available.contains(c)) {
                return Err(JobError::Config(crate::config::ConfigError::InvalidValue {
                    key: "taskmanager.cpu.cores".into(),
                    value: format!("{cores:?}"),
                    expected: format!(
                        "core ids this process may run on ({available:?}); core {bad} is not one"
                    ),
                }));
            }
            cores
        }
        None => available.clone(),
    };
    let slots = slots.unwrap_or(cores.len());
    if slots > cores.len() {
        return Err(invalid(format!(
            "at most {} (one shard per core; this machine offers {} core(s))",
            cores.len(),
            available.len()
        )));
    }
    Ok(cores[..slots].to_vec())
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;
    use std::time::Instant;

    use futures::future::LocalBoxFuture;

    use super::*;

    /// How much CPU the busy tasks of these tests spin for.
    const SPIN: Duration = Duration::from_millis(400);

    /// The CPU time the calling thread has used.
    fn thread_cpu() -> Duration {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid `timespec` to write to.
        let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
        assert_eq!(status, 0, "the thread's CPU clock");
        Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
    }

    /// Spins on the processing queue until the shard's thread has used [`SPIN`] more CPU (a
    /// machine busy elsewhere gives it less, not fewer slices), or for 20 times that at most,
    /// yielding whenever glommio asks and calling `each` before every check; how many times
    /// glommio asked.
    async fn spin(mut each: impl FnMut()) -> u32 {
        let (started, cpu) = (Instant::now(), thread_cpu());
        let mut preempted = 0;
        while thread_cpu() - cpu < SPIN && started.elapsed() < 20 * SPIN {
            each();
            if glommio::executor().need_preempt() {
                preempted += 1;
                glommio::yield_if_needed().await;
            }
        }
        preempted
    }

    /// Runs `work` as a shard's work on one core; what it returned.
    fn on_a_shard<R: Send + 'static>(work: fn(ShardQueues) -> LocalBoxFuture<'static, R>) -> R {
        let core = available_cores()[0];
        let mut results = run_on_shards(&[core], Duration::ZERO, |_| work).expect("the shard runs");
        results.pop().expect("one shard")
    }

    /// A processing task that never waits, yielding only when glommio asks it to, leaves the
    /// shard's other queues the CPU every millisecond or so though it wakes a task of another
    /// queue as it goes: the woken task runs hundreds of times while the processing task spins.
    /// (With glommio's default for a queue whose latency does not matter, the timer it arms
    /// after such a wake-up is 100 ms: the woken task ran about once per 100 ms.)
    #[test]
    fn a_busy_processing_task_leaves_the_shard_s_other_queues_the_cpu() {
        let runs = on_a_shard(|queues| {
            Box::pin(async move {
                let (wake, woken) = glommio::channels::local_channel::new_bounded(1);
                let runs = Rc::new(Cell::new(0u32));
                let counted = Rc::clone(&runs);
                let other = glommio::spawn_local_into(
                    async move {
                        while woken.recv().await.is_some() {
                            counted.set(counted.get() + 1);
                        }
                    },
                    queues.background,
                )
                .expect("spawn the woken task");
                // Full while the woken task has not run since the last wake-up.
                spin(|| drop(wake.try_send(()))).await;
                drop(wake);
                other.await;
                runs.get()
            })
        });
        assert!(
            runs >= 25,
            "the woken task ran {runs} times while a busy processing task used {SPIN:?} of CPU"
        );
    }

    /// A task that never waits but takes its [`ReactorPasses`] lets its shard's reactor run
    /// about every millisecond, even where glommio would not preempt it: on an executor with
    /// one queue (so its preempt timer is glommio's default of 100 ms), a task ticking a 1 ms
    /// timer ticks hundreds of times while a busy task uses [`SPIN`] of CPU (once or twice
    /// without the passes: its timers fired only when the busy task ended).
    #[test]
    fn a_busy_task_lets_its_shard_s_reactor_run() {
        let ticks = LocalExecutorBuilder::new(Placement::Unbound)
            .spawn(|| async {
                let ticks = Rc::new(Cell::new(0u32));
                let counted = Rc::clone(&ticks);
                let ticking = glommio::spawn_local(async move {
                    loop {
                        glommio::timer::sleep(Duration::from_millis(1)).await;
                        counted.set(counted.get() + 1);
                    }
                })
                .detach();
                let busy = glommio::spawn_local(async move {
                    let (started, cpu) = (Instant::now(), thread_cpu());
                    let mut passes = ReactorPasses::new();
                    while thread_cpu() - cpu < SPIN && started.elapsed() < 20 * SPIN {
                        passes.pass_if_due().await;
                        glommio::yield_if_needed().await;
                    }
                    ticks.get()
                });
                let ticks = busy.await;
                ticking.cancel();
                ticks
            })
            .expect("an executor")
            .join()
            .expect("the executor runs");
        assert!(
            ticks >= 50,
            "a 1 ms timer ticked {ticks} times beside a task busy for {SPIN:?} of CPU"
        );
    }

    /// The shard's work runs in the processing queue, and so does what it starts in its own
    /// queue (the network driver), so its subtasks ending (which wakes the work waiting for
    /// them) does not change the preempt timer of those still running: a busy one is still
    /// asked to yield about every millisecond. (When the work ran in glommio's default queue,
    /// each subtask's end left the others a 100 ms timer: a busy subtask was asked 9 times in
    /// 400 ms of CPU when this test ran alone. Beside other shards on the same core it was
    /// asked about as often as now, hence the queues are checked too.)
    #[test]
    fn subtasks_ending_leave_a_busy_one_its_preemption() {
        let (queues, preempted) = on_a_shard(|queues| {
            Box::pin(async move {
                let here = glommio::executor().current_task_queue();
                let started =
                    glommio::spawn_local(async { glommio::executor().current_task_queue() }).await;
                let ending: Vec<_> = (1..=15u64)
                    .map(|i| {
                        glommio::spawn_local_into(
                            glommio::timer::sleep(Duration::from_millis(20 * i)),
                            queues.processing,
                        )
                        .expect("spawn a subtask")
                    })
                    .collect();
                let busy = glommio::spawn_local_into(spin(|| ()), queues.processing)
                    .expect("spawn the busy subtask");
                futures::future::join_all(ending).await;
                let processing = queues.processing;
                ((here, started, processing), busy.await)
            })
        });
        let (here, started, processing) = queues;
        assert!(
            here == processing && started == processing,
            "the shard's work runs in {here:?} and starts tasks in {started:?}, not in the \
             processing queue {processing:?}"
        );
        assert!(
            preempted >= 50,
            "a busy subtask was asked to yield {preempted} times in {SPIN:?} of CPU"
        );
    }
}
