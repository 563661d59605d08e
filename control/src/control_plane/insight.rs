//! What a running job's figures say about it: where each task's time went over the last
//! reporting interval (backpressure), which task limits the job (its bottleneck), and what
//! holds its event time back (holdback). Pure functions of two consecutive readings.

use serde_json::{json, Value};
use weir_engine::metrics::ChannelFigures;
use weir_engine::monitor::{Figures, TaskFigures};

/// Below this share of its time backpressured a task is `ok`, up to [`HIGH`] `low`, above it
/// `high` (Flink's thresholds).
const LOW: f64 = 0.10;
const HIGH: f64 = 0.50;

/// A reading shorter than this after the previous one is too short to divide by: the task's
/// whole life counts instead.
const MIN_INTERVAL_SECONDS: f64 = 0.05;

/// How one task spent the last interval, as shares of it.
#[derive(Clone, Debug)]
pub struct TaskLoad<'a> {
    /// The task.
    pub task: &'a TaskFigures,
    /// Share of the interval it worked.
    pub busy: f64,
    /// Share of the interval it waited for input.
    pub idle: f64,
    /// Share of the interval it waited for credit downstream.
    pub backpressured: f64,
}

/// Backpressure level of a share of time backpressured.
pub fn level(backpressured: f64) -> &'static str {
    if backpressured <= LOW {
        "ok"
    } else if backpressured <= HIGH {
        "low"
    } else {
        "high"
    }
}

/// Each running task's shares of the interval since `previous` (the same run's reading before
/// `live`), or of its life so far where there is none.
pub fn loads<'a>(previous: Option<&Figures>, live: &'a Figures) -> Vec<TaskLoad<'a>> {
    live.tasks
        .iter()
        .map(|task| {
            let before = previous
                .and_then(|p| {
                    p.tasks
                        .iter()
                        .find(|t| t.operators == task.operators && t.subtask == task.subtask)
                })
                .filter(|b| task.elapsed_seconds - b.elapsed_seconds >= MIN_INTERVAL_SECONDS);
            let (elapsed, idle, backpressured) = match before {
                Some(b) => (
                    task.elapsed_seconds - b.elapsed_seconds,
                    task.idle_seconds - b.idle_seconds,
                    task.backpressured_seconds - b.backpressured_seconds,
                ),
                None => (
                    task.elapsed_seconds,
                    task.idle_seconds,
                    task.backpressured_seconds,
                ),
            };
            let share = |seconds: f64| {
                if elapsed > 0.0 {
                    (seconds / elapsed).clamp(0.0, 1.0)
                } else {
                    0.0
                }
            };
            let (idle, backpressured) = (share(idle), share(backpressured));
            TaskLoad {
                task,
                busy: (1.0 - idle - backpressured).max(0.0),
                idle,
                backpressured,
            }
        })
        .collect()
}

/// Rounds a share for display.
fn round(share: f64) -> f64 {
    (share * 1000.0).round() / 1000.0
}

/// `GET /jobs/:id/vertices/:vid/backpressure` (Flink's `JobVertexBackPressureInfo`): each
/// subtask of the task that runs operator `vertex` (one that [`runs`] says runs).
pub fn backpressure(loads: &[TaskLoad<'_>], vertex: usize, now: i64, attempt: u32) -> Value {
    let subtasks: Vec<&TaskLoad<'_>> = loads
        .iter()
        .filter(|l| l.task.operators.contains(&vertex))
        .collect();
    let worst = subtasks.iter().map(|l| l.backpressured).fold(0.0, f64::max);
    json!({
        "status": "ok",
        "backpressure-level": level(worst),
        "end-timestamp": now,
        "task": subtasks.first().map(|l| &l.task.name),
        "subtasks": subtasks.iter().map(|l| json!({
            "subtask": l.task.subtask,
            "attempt-number": attempt.saturating_sub(1),
            "backpressure-level": level(l.backpressured),
            "ratio": round(l.backpressured),
            "backpressuredRatio": round(l.backpressured),
            "idleRatio": round(l.idle),
            "busyRatio": round(l.busy),
        })).collect::<Vec<_>>(),
    })
}

/// Whether a running task runs operator `vertex`.
pub fn runs(live: &Figures, vertex: usize) -> bool {
    live.tasks.iter().any(|t| t.operators.contains(&vertex))
}

/// `GET /jobs/:id/vertices/:vid/watermarks` (Flink's shape): each subtask's current input
/// watermark of the task that runs operator `vertex`, `i64::MIN` before the first.
pub fn watermarks(live: &Figures, vertex: usize) -> Value {
    Value::Array(
        live.tasks
            .iter()
            .filter(|t| t.operators.contains(&vertex))
            .map(|t| {
                json!({
                    "id": format!("{}.currentInputWatermark", t.subtask),
                    "value": t.watermark.unwrap_or(i64::MIN).to_string(),
                })
            })
            .collect(),
    )
}

/// One task vertex (all subtasks of a chain) over the last interval: the worst subtask's
/// shares.
struct VertexLoad<'a> {
    head: usize,
    name: &'a str,
    busy: f64,
    idle: f64,
    backpressured: f64,
    /// The task vertices feeding it.
    upstream: Vec<usize>,
}

fn vertex_loads<'a>(loads: &[TaskLoad<'a>]) -> Vec<VertexLoad<'a>> {
    let mut vertices: Vec<VertexLoad<'a>> = Vec::new();
    for load in loads {
        let head = load.task.head;
        let index = match vertices.iter().position(|v| v.head == head) {
            Some(index) => index,
            None => {
                vertices.push(VertexLoad {
                    head,
                    name: &load.task.name,
                    busy: 0.0,
                    idle: 0.0,
                    backpressured: 0.0,
                    upstream: Vec::new(),
                });
                vertices.len() - 1
            }
        };
        let vertex = &mut vertices[index];
        vertex.busy = vertex.busy.max(load.busy);
        vertex.idle = vertex.idle.max(load.idle);
        vertex.backpressured = vertex.backpressured.max(load.backpressured);
        for channel in &load.task.channels {
            if !vertex.upstream.contains(&channel.from.head) {
                vertex.upstream.push(channel.from.head);
            }
        }
    }
    vertices
}

/// `GET /jobs/:id/bottleneck`: the task that limits the job. Where backpressure shows, it is
/// the first task downstream of a backpressured one that is not backpressured itself (it
/// cannot take its input as fast as it comes); where none shows, the busiest task (a busy
/// source means the job keeps up with all it is given).
pub fn bottleneck(loads: &[TaskLoad<'_>]) -> Value {
    let vertices = vertex_loads(loads);
    let backpressured = |head: usize| {
        vertices
            .iter()
            .any(|v| v.head == head && v.backpressured > LOW)
    };
    let limiting = vertices
        .iter()
        .filter(|v| v.backpressured <= LOW && v.upstream.iter().any(|&u| backpressured(u)))
        .max_by(|a, b| a.busy.total_cmp(&b.busy));
    let busiest = vertices.iter().max_by(|a, b| a.busy.total_cmp(&b.busy));
    let (vertex, reason) = match limiting {
        Some(v) => {
            let feeding: Vec<&str> = vertices
                .iter()
                .filter(|u| v.upstream.contains(&u.head) && u.backpressured > LOW)
                .map(|u| u.name)
                .collect();
            let reason = format!(
                "'{}' is backpressured by '{}', which is busy {:.0}% of the time and not \
                 backpressured itself: it cannot take its input as fast as it comes; raise its \
                 parallelism or make it cheaper",
                feeding.join("', '"),
                v.name,
                v.busy * 100.0
            );
            (Some(v), reason)
        }
        None if vertices.iter().any(|v| v.backpressured > LOW) => match busiest {
            Some(v) => (
                Some(v),
                format!(
                    "backpressure shows, but every task below it is backpressured too; '{}' \
                     is the busiest ({:.0}%)",
                    v.name,
                    v.busy * 100.0
                ),
            ),
            None => (None, "the job runs no tasks".to_string()),
        },
        None => match busiest {
            Some(v) if v.upstream.is_empty() => (
                Some(v),
                format!(
                    "no task is backpressured: the job keeps up with its input; '{}', a \
                     source, is the busiest ({:.0}%)",
                    v.name,
                    v.busy * 100.0
                ),
            ),
            Some(v) => (
                Some(v),
                format!(
                    "no task is backpressured; '{}' is the busiest ({:.0}%)",
                    v.name,
                    v.busy * 100.0
                ),
            ),
            None => (None, "the job runs no tasks".to_string()),
        },
    };
    let entry = |v: &VertexLoad<'_>| {
        json!({
            "id": v.head,
            "name": v.name,
            "backpressure-level": level(v.backpressured),
            "busyRatio": round(v.busy),
            "idleRatio": round(v.idle),
            "backpressuredRatio": round(v.backpressured),
        })
    };
    json!({
        "bottleneck": vertex.map(entry),
        "reason": reason,
        "vertices": vertices.iter().map(entry).collect::<Vec<_>>(),
    })
}

/// Where [`holdback`] found the job's event time held back.
#[derive(Debug, PartialEq)]
enum Hold<'a> {
    /// A source split.
    Split {
        task: &'a TaskFigures,
        split: &'a str,
        watermark: Option<i64>,
    },
    /// A source subtask (whose splits are not known, or all idle).
    Source { task: &'a TaskFigures },
    /// An input channel whose watermark waits behind queued records: its sender is well
    /// ahead of what it received.
    Channel {
        task: &'a TaskFigures,
        channel: &'a ChannelFigures,
        sender: &'a TaskFigures,
    },
}

/// Whether a watermark counts as holding time back: an ended input's does not.
fn holds(watermark: Option<i64>) -> bool {
    !weir_engine::monitor::ended(watermark)
}

/// `GET /jobs/:id/watermarks/holdback`: follows the job's lowest event time from the task
/// furthest downstream to where it comes from — the slowest active input channel of each
/// task, up to the sender, to a source split; a channel whose sender is further ahead of it
/// than the rest of the job is ahead of that sender is the holdback itself (its watermark is
/// queued behind records).
pub fn holdback(live: &Figures, now: i64) -> Value {
    let tasks = &live.tasks;
    let find = |head: usize, subtask: usize| {
        tasks
            .iter()
            .find(|t| t.head == head && t.subtask == subtask)
    };
    // The most advanced event time of any input: what the slowest one is behind.
    let ahead = tasks
        .iter()
        .filter(|t| t.channels.is_empty())
        .flat_map(|t| {
            let splits = t.splits.iter().filter(|s| !s.idle).map(|s| s.watermark);
            splits.chain(std::iter::once(t.watermark))
        })
        .flatten()
        .filter(|&w| holds(Some(w)))
        .max();
    // Tasks nothing reads from: where the job's event time shows.
    let last = tasks
        .iter()
        .filter(|t| {
            !tasks.iter().any(|other| {
                other
                    .channels
                    .iter()
                    .any(|c| c.from.head == t.head && c.from.subtask == t.subtask)
            })
        })
        .filter(|t| holds(t.watermark))
        .min_by_key(|t| t.watermark.unwrap_or(i64::MIN));
    let Some(mut task) = last else {
        return json!({
            "watermark": null,
            "holdback": null,
            "reason": "every task's input ended: nothing holds event time back",
        });
    };
    let job_watermark = task.watermark;
    // Each step goes one task upstream: a job's graph has no cycles, so it ends within as
    // many steps as there are tasks (the bound guards against figures that say otherwise).
    let mut steps = tasks.len() + 1;
    let hold = loop {
        steps = steps.saturating_sub(1);
        if steps == 0 {
            break Hold::Source { task };
        }
        let slowest = task
            .channels
            .iter()
            .filter(|c| !c.idle && holds(c.watermark))
            .min_by_key(|c| c.watermark.unwrap_or(i64::MIN));
        if task.channels.is_empty() {
            let split = task
                .splits
                .iter()
                .filter(|s| !s.idle && holds(s.watermark))
                .min_by_key(|s| s.watermark.unwrap_or(i64::MIN));
            break match split {
                Some(split) => Hold::Split {
                    task,
                    split: &split.split,
                    watermark: split.watermark,
                },
                None => Hold::Source { task },
            };
        }
        let Some(channel) = slowest else {
            // Every channel is idle or ended: the task itself is where time stands.
            break Hold::Source { task };
        };
        let Some(sender) = find(channel.from.head, channel.from.subtask) else {
            break Hold::Source { task };
        };
        let received = channel.watermark.unwrap_or(i64::MIN);
        let sent = sender.watermark.unwrap_or(i64::MIN);
        let in_flight = sent.saturating_sub(received);
        let upstream = ahead.unwrap_or(sent).saturating_sub(sent);
        if in_flight > upstream {
            break Hold::Channel {
                task,
                channel,
                sender,
            };
        }
        task = sender;
    };
    let lag = |watermark: Option<i64>| {
        watermark
            .filter(|&w| holds(Some(w)))
            .map(|w| now.saturating_sub(w))
    };
    let behind = |watermark: Option<i64>| {
        ahead
            .zip(watermark)
            .map(|(ahead, w)| ahead.saturating_sub(w).max(0))
    };
    let task_entry =
        |t: &TaskFigures| json!({ "id": t.head, "name": t.name, "subtask": t.subtask });
    let detail = match hold {
        Hold::Split {
            task,
            split,
            watermark,
        } => json!({
            "kind": "split",
            "task": task_entry(task),
            "split": split,
            "watermark": watermark,
            "lagMs": lag(watermark),
            "behindMs": behind(watermark),
        }),
        Hold::Source { task } => json!({
            "kind": "subtask",
            "task": task_entry(task),
            "watermark": task.watermark,
            "lagMs": lag(task.watermark),
            "behindMs": behind(task.watermark),
        }),
        Hold::Channel {
            task,
            channel,
            sender,
        } => json!({
            "kind": "channel",
            "task": task_entry(task),
            "from": task_entry(sender),
            "watermark": channel.watermark,
            "senderWatermark": sender.watermark,
            "lagMs": lag(channel.watermark),
            "behindMs": behind(channel.watermark),
        }),
    };
    json!({
        "watermark": job_watermark,
        "lagMs": lag(job_watermark),
        "holdback": detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_engine::metrics::{ChannelSource, SplitFigures};

    fn task(operators: &[usize], subtask: usize, times: (f64, f64, f64)) -> TaskFigures {
        let (elapsed, idle, backpressured) = times;
        TaskFigures {
            name: format!("task {}", operators[0]),
            head: operators[0],
            operators: operators.to_vec(),
            subtask,
            elapsed_seconds: elapsed,
            busy_seconds: elapsed - idle - backpressured,
            idle_seconds: idle,
            backpressured_seconds: backpressured,
            bytes_in: 0,
            bytes_out: 0,
            watermark: None,
            channels: Vec::new(),
            splits: Vec::new(),
        }
    }

    fn channel(head: usize, subtask: usize, watermark: i64) -> ChannelFigures {
        ChannelFigures {
            from: ChannelSource { head, subtask },
            watermark: Some(watermark),
            idle: false,
        }
    }

    fn figures(tasks: Vec<TaskFigures>) -> Figures {
        Figures {
            tasks,
            ..Figures::default()
        }
    }

    #[test]
    fn shares_come_from_the_interval_since_the_previous_reading() {
        let before = figures(vec![task(&[0], 0, (10.0, 9.0, 0.0))]);
        // In the last second the task was backpressured 0.8 s, idle 0.1 s.
        let now = figures(vec![task(&[0], 0, (11.0, 9.1, 0.8))]);
        let loads = loads(Some(&before), &now);
        assert!((loads[0].backpressured - 0.8).abs() < 1e-9);
        assert!((loads[0].idle - 0.1).abs() < 1e-9);
        assert!((loads[0].busy - 0.1).abs() < 1e-9);
        assert_eq!(level(loads[0].backpressured), "high");
        // No previous reading: its whole life.
        let loads = super::loads(None, &now);
        assert!((loads[0].idle - 9.1 / 11.0).abs() < 1e-9);
        assert_eq!((level(0.1), level(0.3), level(0.51)), ("ok", "low", "high"));
    }

    #[test]
    fn the_bottleneck_is_the_first_task_below_a_backpressured_one() {
        // source (0) -> map (2) -> sink (5): the source is backpressured, the map is busy,
        // the sink mostly idle.
        let mut map = task(&[2, 3], 0, (1.0, 0.0, 0.05));
        map.channels = vec![channel(0, 0, 0)];
        let mut sink = task(&[5], 0, (1.0, 0.7, 0.0));
        sink.channels = vec![channel(2, 0, 0)];
        let live = figures(vec![task(&[0], 0, (1.0, 0.0, 0.9)), map, sink]);
        let answer = bottleneck(&loads(None, &live));
        assert_eq!(answer["bottleneck"]["id"], 2, "{answer}");
        assert!(answer["reason"]
            .as_str()
            .unwrap()
            .contains("'task 0' is backpressured by 'task 2'"));
        // Backpressure eases on its way down (high, then low): the first task free of it.
        let mut easing = task(&[2], 0, (1.0, 0.0, 0.3));
        easing.channels = vec![channel(0, 0, 0)];
        let mut last = task(&[5], 0, (1.0, 0.0, 0.0));
        last.channels = vec![channel(2, 0, 0)];
        let live = figures(vec![task(&[0], 0, (1.0, 0.0, 0.9)), easing, last]);
        let answer = bottleneck(&loads(None, &live));
        assert_eq!(answer["bottleneck"]["id"], 5, "{answer}");
        // Nothing backpressured: the busiest, here the source.
        let mut idle_map = task(&[2], 0, (1.0, 0.8, 0.0));
        idle_map.channels = vec![channel(0, 0, 0)];
        let live = figures(vec![task(&[0], 0, (1.0, 0.1, 0.0)), idle_map]);
        let answer = bottleneck(&loads(None, &live));
        assert_eq!(answer["bottleneck"]["id"], 0, "{answer}");
        assert!(answer["reason"].as_str().unwrap().contains("keeps up"));
    }

    #[test]
    fn holdback_follows_the_slowest_channel_to_the_split_behind() {
        let split = |name: &str, watermark: i64| SplitFigures {
            number: 0,
            split: name.to_string(),
            watermark: Some(watermark),
            idle: false,
        };
        let mut source0 = task(&[0], 0, (1.0, 0.0, 0.0));
        source0.watermark = Some(100_000);
        source0.splits = vec![split("a", 100_000)];
        let mut source1 = task(&[0], 1, (1.0, 0.0, 0.0));
        source1.watermark = Some(40_000);
        source1.splits = vec![split("b", 40_000), split("c", 90_000)];
        let mut sink = task(&[1], 0, (1.0, 0.0, 0.0));
        sink.watermark = Some(39_800);
        sink.channels = vec![channel(0, 0, 99_900), channel(0, 1, 39_800)];
        let live = figures(vec![source0.clone(), source1.clone(), sink.clone()]);
        let answer = holdback(&live, 160_000);
        assert_eq!(answer["watermark"], 39_800, "{answer}");
        assert_eq!(answer["holdback"]["kind"], "split", "{answer}");
        assert_eq!(answer["holdback"]["split"], "b");
        assert_eq!(answer["holdback"]["task"]["subtask"], 1);
        assert_eq!(answer["holdback"]["lagMs"], 120_000);
        assert_eq!(answer["holdback"]["behindMs"], 60_000);

        // Source 1 caught up, but its watermark waits in the channel behind records.
        source1.watermark = Some(99_000);
        source1.splits = vec![split("b", 99_000)];
        let live = figures(vec![source0, source1, sink]);
        let answer = holdback(&live, 160_000);
        assert_eq!(answer["holdback"]["kind"], "channel", "{answer}");
        assert_eq!(answer["holdback"]["from"]["subtask"], 1);
        assert_eq!(answer["holdback"]["behindMs"], 60_200);
    }
}
