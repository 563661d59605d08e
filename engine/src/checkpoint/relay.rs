//! Checkpoints of a run spread over several executors: what their coordination threads tell
//! each other, and the [`Relay`] that carries it.
//!
//! One executor coordinates: the one running slot 0 (the leader). Its coordinator counts every
//! task of the job, wherever it runs; it begins each checkpoint's directory, triggers its own
//! sources and tells the other executors (the followers) to trigger theirs, and commits the
//! checkpoint once every task acknowledged. A follower's coordination thread triggers its
//! sources when told, writes its tasks' state files into the directory the leader began (the
//! checkpoint directory is shared storage, at one path on every worker, as Flink's), and passes
//! its tasks' acknowledgements on to the leader. No checkpoint is triggered before every
//! follower joined and restored the checkpoint the leader restored.
//!
//! Every executor runs its own copy of each source's split enumerator, serving its own
//! readers (`SourceFactory::create_enumerator`, pinned); each snapshots its readers' pending
//! splits as it triggers them, and the leader joins the parts into the checkpoint's.
//!
//! The messages go through whatever connects the executors — the worker and the control
//! plane between executors of a cluster ([`Relay::new`]), channels between executors in one
//! process ([`in_process`]) — in order between each follower and the leader. The control
//! plane keeps those for a worker whose link is down until it is back, but one it held when
//! it went down itself is lost: a follower says it joined every second until it hears from
//! the leader, and takes a checkpoint whose metadata it finds in the shared directory as
//! completed; any other loss leaves the checkpoint to expire
//! (`execution.checkpointing.timeout`).

use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use weir_state::checkpoint::StoredFile;

use super::driver::TaskReport;
use super::savepoint::StopMode;

/// What the coordination threads of a spread run's executors tell each other.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "message", rename_all = "kebab-case", deny_unknown_fields)]
pub enum CheckpointMessage {
    /// To the leader, from a follower whose job is built: its node, and the checkpoint it
    /// restored (`None`: none).
    Joined {
        /// The follower's node.
        node: String,
        /// The checkpoint (or savepoint) number it restored.
        restored: Option<u64>,
    },
    /// To the followers: snapshot the split enumerators and trigger the sources for
    /// `checkpoint`, whose files go into `dir`.
    Trigger {
        /// The checkpoint (savepoints are numbered with them).
        checkpoint: u64,
        /// Its directory, which the leader began.
        dir: PathBuf,
        /// What it is.
        take: Take,
    },
    /// To the leader: a follower's readers' pending splits of each source for `checkpoint`
    /// (operator id, snapshot), or why it has none.
    Splits {
        /// The checkpoint.
        checkpoint: u64,
        /// The follower's node.
        node: String,
        /// The snapshots, or why they failed.
        enumerators: Result<Vec<(String, Vec<u8>)>, String>,
    },
    /// To the leader: task `task` (its index in the execution graph) wrote its state file.
    Acknowledge {
        /// The checkpoint.
        checkpoint: u64,
        /// The task.
        task: usize,
        /// Its state file.
        file: FileRecord,
        /// The files its state stands for (RocksDB's).
        referenced: Vec<FileRecord>,
        /// The longest its shard worked on the snapshot at once, µs.
        pause_us: u64,
        /// How long its input's barriers took to line up, µs.
        alignment_us: u64,
    },
    /// To the leader: task `task` could not write its state.
    Decline {
        /// The checkpoint.
        checkpoint: u64,
        /// The task.
        task: usize,
        /// Why.
        reason: String,
    },
    /// To the leader: a source subtask's input ended.
    InputEnded,
    /// To the followers: `checkpoint` is committed.
    Complete {
        /// The checkpoint.
        checkpoint: u64,
    },
    /// To the followers: `checkpoint` was aborted.
    Aborted {
        /// The checkpoint.
        checkpoint: u64,
    },
    /// To the leader: a follower's tasks write nothing more into aborted `checkpoint`'s
    /// directory (the leader removes it once every follower said so).
    Released {
        /// The checkpoint.
        checkpoint: u64,
    },
}

impl CheckpointMessage {
    /// Whether it goes to the leader (else from the leader to every follower).
    pub fn to_leader(&self) -> bool {
        !matches!(
            self,
            CheckpointMessage::Trigger { .. }
                | CheckpointMessage::Complete { .. }
                | CheckpointMessage::Aborted { .. }
        )
    }
}

/// What a triggered checkpoint is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Take {
    /// A checkpoint.
    Checkpoint,
    /// The final checkpoint (every source's input ended).
    Final,
    /// A savepoint, stopping the job as `stop` says once it completed.
    Savepoint {
        /// How the job stops with it, if it does.
        stop: Option<StopMode>,
    },
}

/// A checkpoint's file as the messages carry it ([`StoredFile`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRecord {
    /// Its name in the checkpoint's directory (`shared/…` for shared files).
    pub name: String,
    /// Its length, bytes.
    pub len: u64,
    /// The CRC-32 of its bytes.
    pub crc32: u32,
}

impl From<StoredFile> for FileRecord {
    fn from(file: StoredFile) -> FileRecord {
        FileRecord {
            name: file.name,
            len: file.len,
            crc32: file.crc32,
        }
    }
}

impl From<FileRecord> for StoredFile {
    fn from(file: FileRecord) -> StoredFile {
        StoredFile {
            name: file.name,
            len: file.len,
            crc32: file.crc32,
        }
    }
}

/// How one executor of a spread run reaches the others about checkpoints: `send` carries a
/// message to the leader (from a follower) or to every follower (from the leader); what the
/// others send comes in through [`Relay::deliver`]. Clones share the relay.
#[derive(Clone)]
pub struct Relay {
    send: Arc<dyn Fn(CheckpointMessage) + Send + Sync>,
    inbox: Arc<Mutex<Inbox>>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay").finish_non_exhaustive()
    }
}

/// Messages that came before the coordination thread started wait for it.
enum Inbox {
    Waiting(Vec<CheckpointMessage>),
    Open(Sender<TaskReport>),
}

impl Inbox {
    fn deliver(&mut self, message: CheckpointMessage) {
        match self {
            Inbox::Waiting(waiting) => waiting.push(message),
            // Gone only when the run is over.
            Inbox::Open(reports) => {
                let _ = reports.send(TaskReport::Relayed(message));
            }
        }
    }
}

impl Relay {
    /// A relay that sends with `send`.
    pub fn new(send: impl Fn(CheckpointMessage) + Send + Sync + 'static) -> Relay {
        Relay::with_inbox(Arc::new(send), new_inbox())
    }

    fn with_inbox(
        send: Arc<dyn Fn(CheckpointMessage) + Send + Sync>,
        inbox: Arc<Mutex<Inbox>>,
    ) -> Relay {
        Relay { send, inbox }
    }

    /// A message from another executor of the run.
    pub fn deliver(&self, message: CheckpointMessage) {
        self.inbox.lock().expect("relay lock").deliver(message);
    }

    pub(crate) fn send(&self, message: CheckpointMessage) {
        (self.send)(message);
    }

    /// From now on, messages go to the coordination thread's `reports` (those that came
    /// before first).
    pub(crate) fn open(&self, reports: Sender<TaskReport>) {
        let mut inbox = self.inbox.lock().expect("relay lock");
        if let Inbox::Waiting(waiting) = &mut *inbox {
            for message in waiting.drain(..) {
                let _ = reports.send(TaskReport::Relayed(message));
            }
        }
        *inbox = Inbox::Open(reports);
    }
}

fn new_inbox() -> Arc<Mutex<Inbox>> {
    Arc::new(Mutex::new(Inbox::Waiting(Vec::new())))
}

/// Relays between `executors` executors of a run in this process, in slot order of their
/// nodes: the first is the leader's.
pub fn in_process(executors: usize) -> Vec<Relay> {
    let inboxes: Vec<Arc<Mutex<Inbox>>> = (0..executors).map(|_| new_inbox()).collect();
    (0..executors)
        .map(|executor| {
            let targets: Vec<Arc<Mutex<Inbox>>> = if executor == 0 {
                inboxes[1..].to_vec()
            } else {
                vec![Arc::clone(&inboxes[0])]
            };
            let send = move |message: CheckpointMessage| {
                for target in &targets {
                    target.lock().expect("relay lock").deliver(message.clone());
                }
            };
            Relay::with_inbox(Arc::new(send), Arc::clone(&inboxes[executor]))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_as_json_and_know_their_direction() {
        let messages = [
            CheckpointMessage::Joined {
                node: "b".into(),
                restored: Some(4),
            },
            CheckpointMessage::Trigger {
                checkpoint: 5,
                dir: PathBuf::from("/c/job/chk-5"),
                take: Take::Savepoint {
                    stop: Some(StopMode::Drain),
                },
            },
            CheckpointMessage::Splits {
                checkpoint: 5,
                node: "b".into(),
                enumerators: Ok(vec![("op".into(), vec![1, 2, 3])]),
            },
            CheckpointMessage::Acknowledge {
                checkpoint: 5,
                task: 3,
                file: FileRecord {
                    name: "task-3".into(),
                    len: 10,
                    crc32: 7,
                },
                referenced: Vec::new(),
                pause_us: 1,
                alignment_us: 2,
            },
            CheckpointMessage::Complete { checkpoint: 5 },
            CheckpointMessage::Aborted { checkpoint: 5 },
            CheckpointMessage::Released { checkpoint: 5 },
        ];
        for message in messages {
            let text = serde_json::to_string(&message).unwrap();
            let back: CheckpointMessage = serde_json::from_str(&text).unwrap();
            assert_eq!(back, message, "{text}");
            let to_leader = !matches!(
                message,
                CheckpointMessage::Trigger { .. }
                    | CheckpointMessage::Complete { .. }
                    | CheckpointMessage::Aborted { .. }
            );
            assert_eq!(message.to_leader(), to_leader, "{text}");
        }
        let error = serde_json::from_str::<CheckpointMessage>(r#"{"message":"nonsense"}"#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown variant `nonsense`"), "{error}");
    }

    #[test]
    fn in_process_relays_reach_the_leader_or_every_follower_and_keep_early_messages() {
        let relays = in_process(3);
        let (sender, leader) = std::sync::mpsc::channel();
        // Sent before the leader opened: kept for it.
        relays[1].send(CheckpointMessage::InputEnded);
        relays[0].open(sender);
        relays[2].send(CheckpointMessage::Released { checkpoint: 1 });
        let got: Vec<String> = leader
            .try_iter()
            .map(|report| format!("{report:?}"))
            .collect();
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].contains("InputEnded") && got[1].contains("Released"));
        let followers: Vec<_> = (1..3)
            .map(|i| {
                let (sender, receiver) = std::sync::mpsc::channel();
                relays[i].open(sender);
                receiver
            })
            .collect();
        relays[0].send(CheckpointMessage::Complete { checkpoint: 2 });
        for follower in &followers {
            assert_eq!(follower.try_iter().count(), 1);
        }
        assert_eq!(leader.try_iter().count(), 0, "the leader hears not itself");
    }
}
