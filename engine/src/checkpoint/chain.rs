//! Keyed parts checkpointed incrementally, as chains of a full snapshot and deltas.
//!
//! An operator that keeps keyed state in maps of its own and knows which keys changed since its
//! last barrier (the tumbling and sliding window operator, `window/aligned.rs`) writes at a
//! barrier either a full keyed snapshot or a delta of the keys changed and removed since
//! (`weir_state::merge_keyed_chain` has the format). Each link is a shared file of the job,
//! `shared/<n>-<operator>-<subtask>-<part>-<link>`, written once by the task's checkpoint writer
//! after the barrier; the operator's part in a checkpoint is a small manifest listing the chain
//! (every link since the last full one), and the checkpoint's metadata lists the links too, so
//! a restore checks them and the storage's sweep keeps a link while a retained checkpoint
//! lists it. A restore (or `weir checkpoint inspect`) reads the chain back as the one full
//! snapshot it stands for ([`expand_parts`]), so everything after sees an ordinary keyed part.
//!
//! **When a full snapshot.** The first after the operator opens (after a restore too); when at
//! least half the keys changed (a delta would cost as much); when the deltas since the last
//! full one add up to its size (so a restore reads at most about twice the state); and every
//! [`MAX_DELTAS`] links. `execution.checkpointing.incremental: false` writes every one full,
//! as an ordinary part.
//!
//! **Nothing lost on an abort.** A link belongs to the chain whether or not its checkpoint
//! completes: the links after it are deltas over it. So links are uploaded one at a time in
//! barrier order, and a link whose checkpoint was aborted before its writer stored it (or whose
//! writing failed) is carried over, bytes and all, and stored by the next checkpoint's writer
//! before that checkpoint's own link.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use weir_state::checkpoint::{PendingCheckpoint, StateFileWriter, StoredFile};

use super::bytes::{ByteReader, ByteWriter};
use super::task_state::{FileParts, OperatorSnapshot, Part};
use crate::operator::RuntimeContext;

const MAGIC: &[u8; 8] = b"WEIRCHN\0";
const VERSION: u32 = 1;

/// Deltas after which the next link is a full snapshot whatever their size.
pub(crate) const MAX_DELTAS: u32 = 32;

/// One operator subtask's chain for one of its parts.
pub(crate) struct KeyedChain {
    part: &'static str,
    links: Rc<Links>,
    /// Barrier-time accounting: the last full link's size, the deltas since and their bytes
    /// (`None`: no full link handed out yet).
    base: Cell<Option<(u64, u32, u64)>>,
    /// The next link's number (from 1).
    next: Cell<u64>,
    /// Every link after the first a delta, whatever changed (tests of the delta path).
    deltas_only: bool,
}

/// What the chain's writers share: the links stored, and which have been dealt with.
struct Links {
    /// `<operator>-<subtask>-<part>`: the links' file names without their numbers.
    name: String,
    /// The chain as stored: the last full link first.
    stored: RefCell<Vec<(bool, StoredFile)>>,
    /// Links handed out at a barrier whose writers are done (stored or carried), past `through`.
    done: RefCell<BTreeSet<u64>>,
    /// Every link up to this one is done.
    through: Cell<u64>,
    /// Links whose checkpoint did not store them: (number, full, bytes), in number order.
    carried: RefCell<Vec<(u64, bool, Vec<u8>)>>,
}

impl Links {
    fn mark_done(&self, link: u64) {
        let mut done = self.done.borrow_mut();
        done.insert(link);
        while done.remove(&(self.through.get() + 1)) {
            self.through.set(self.through.get() + 1);
        }
    }
}

impl KeyedChain {
    /// The chain of subtask `ctx.subtask`'s part `part`, if its checkpoints are incremental
    /// (`None`: the job takes no checkpoints, or `execution.checkpointing.incremental` is off).
    pub(crate) fn open(ctx: &RuntimeContext, part: &'static str) -> Option<KeyedChain> {
        (ctx.state.checkpointed && ctx.state.incremental).then(|| {
            KeyedChain::named(
                format!("{}-{}-{part}", ctx.state.operator_id, ctx.subtask),
                part,
            )
        })
    }

    fn named(name: String, part: &'static str) -> KeyedChain {
        KeyedChain {
            part,
            links: Rc::new(Links {
                name,
                stored: RefCell::default(),
                done: RefCell::default(),
                through: Cell::new(0),
                carried: RefCell::default(),
            }),
            base: Cell::new(None),
            next: Cell::new(1),
            deltas_only: false,
        }
    }

    /// A chain outside any job whose links after the first are all deltas.
    #[cfg(test)]
    pub(crate) fn deltas_only(part: &'static str) -> KeyedChain {
        KeyedChain {
            deltas_only: true,
            ..KeyedChain::named(format!("test-0-{part}"), part)
        }
    }

    /// What the next link should be, `changed` of `keys` keys having changed since the last
    /// one (see the module docs).
    pub(crate) fn next(&self, changed: usize, keys: usize) -> Link {
        match self.base.get() {
            None => Link::Full,
            Some(_) if changed == 0 => Link::Unchanged,
            Some(_) if self.deltas_only => Link::Delta,
            Some((full, deltas, delta_bytes)) => {
                if changed.saturating_mul(2) >= keys || delta_bytes >= full || deltas >= MAX_DELTAS
                {
                    Link::Full
                } else {
                    Link::Delta
                }
            }
        }
    }

    /// Makes the next link a full snapshot, whatever changed (a link could not be written).
    pub(crate) fn restart(&self) {
        self.base.set(None);
    }

    /// Adds the next link to `snapshot`: `new`, a full keyed snapshot (`true`) or a delta, or
    /// none when nothing changed (the part lists the chain as it is).
    pub(crate) fn add(&self, snapshot: &mut OperatorSnapshot, new: Option<(bool, Vec<u8>)>) {
        if let Some((full, bytes)) = &new {
            let len = bytes.len() as u64;
            self.base.set(match (full, self.base.get()) {
                (true, _) | (false, None) => Some((len, 0, 0)),
                (false, Some((base, deltas, delta_bytes))) => {
                    Some((base, deltas + 1, delta_bytes + len))
                }
            });
        }
        let number = self.next.get();
        self.next.set(number + 1);
        snapshot.parts.push((
            self.part,
            Part::Chained(ChainLink {
                number,
                new,
                done: false,
                links: Rc::clone(&self.links),
            }),
        ));
    }
}

/// What the next link of a chain is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Link {
    /// Nothing changed: no link, the part lists the chain again.
    Unchanged,
    /// The keys changed since the last link.
    Delta,
    /// Every key.
    Full,
}

/// One link taken at a barrier, for the task's checkpoint writer to store.
pub(crate) struct ChainLink {
    number: u64,
    /// The link's bytes and whether it is full; `None`: no new link.
    new: Option<(bool, Vec<u8>)>,
    /// Set once the writer dealt with it.
    done: bool,
    links: Rc<Links>,
}

impl ChainLink {
    /// Stores the link (after those before it, and any an earlier checkpoint did not store)
    /// into `pending`, adds the chain's files to `referenced`, and returns the part listing
    /// them.
    pub(crate) async fn store(
        mut self,
        pending: &PendingCheckpoint,
        referenced: &mut Vec<StoredFile>,
    ) -> Result<Vec<u8>, String> {
        while self.links.through.get() + 1 != self.number {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        let mut todo = std::mem::take(&mut *self.links.carried.borrow_mut());
        if let Some((full, bytes)) = self.new.take() {
            todo.push((self.number, full, bytes));
        }
        let mut todo = todo.into_iter();
        let mut stored = Vec::new();
        let mut failed = None;
        while let Some((number, full, bytes)) = todo.next() {
            match store_link(pending, &self.links.name, number, &bytes).await {
                Ok(file) => stored.push((full, file)),
                Err(error) => {
                    // This one and the rest go with the next checkpoint; the ones stored stay.
                    let mut carried = self.links.carried.borrow_mut();
                    carried.push((number, full, bytes));
                    carried.extend(todo.by_ref());
                    failed = Some(error);
                }
            }
        }
        let mut chain = self.links.stored.borrow_mut();
        for (full, file) in stored {
            if full {
                chain.clear();
            }
            chain.push((full, file));
        }
        self.done = true;
        self.links.mark_done(self.number);
        if let Some(error) = failed {
            return Err(error);
        }
        if chain.is_empty() {
            return Err("internal error: a chain's first link was not full".into());
        }
        referenced.extend(chain.iter().map(|(_, file)| file.clone()));
        Ok(encode(&chain))
    }
}

#[cfg(test)]
impl ChainLink {
    /// The link's bytes and whether it is full, taken without storing them.
    pub(crate) fn take(mut self) -> Option<(bool, Vec<u8>)> {
        self.done = true;
        self.links.mark_done(self.number);
        self.new.take()
    }
}

impl Drop for ChainLink {
    /// A link its checkpoint's writer never stored (the checkpoint was aborted first) is
    /// carried over to the next one.
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some((full, bytes)) = self.new.take() {
            self.links
                .carried
                .borrow_mut()
                .push((self.number, full, bytes));
        }
        self.links.mark_done(self.number);
    }
}

async fn store_link(
    pending: &PendingCheckpoint,
    name: &str,
    number: u64,
    bytes: &[u8],
) -> Result<StoredFile, String> {
    let mut writer = StateFileWriter::create_shared(pending, &format!("{name}-{number}"))
        .await
        .map_err(|e| e.to_string())?;
    writer.write(bytes).await.map_err(|e| e.to_string())?;
    writer.finish().await.map_err(|e| e.to_string())
}

fn encode(chain: &[(bool, StoredFile)]) -> Vec<u8> {
    let mut out = ByteWriter::default();
    out.out.extend_from_slice(MAGIC);
    out.u32(VERSION);
    out.u64(chain.len() as u64);
    for (full, file) in chain {
        out.u8(u8::from(*full));
        out.text(&file.name);
        out.u64(file.len);
        out.u32(file.crc32);
    }
    out.out
}

/// The links a chain part lists, the full one first.
fn decode(bytes: &[u8]) -> Result<Vec<(bool, StoredFile)>, String> {
    let mut reader = ByteReader::new(bytes, "a chain part");
    reader.header(MAGIC, VERSION)?;
    let count = reader.count(21)?;
    let mut links = Vec::with_capacity(count);
    for index in 0..count {
        let full = match reader.u8()? {
            0 => false,
            1 => true,
            other => return Err(format!("a chain part's link {index} is of kind {other}")),
        };
        if full != (index == 0) {
            return Err(format!(
                "a chain part's link {index} is {}: a chain is one full link, then deltas",
                if full { "full" } else { "a delta" }
            ));
        }
        links.push((
            full,
            StoredFile {
                name: reader.text()?,
                len: reader.u64()?,
                crc32: reader.u32()?,
            },
        ));
    }
    if links.is_empty() {
        return Err("a chain part lists no link".into());
    }
    if !reader.is_empty() {
        return Err("a chain part has bytes after its links".into());
    }
    Ok(links)
}

/// Whether `bytes` is a chain part.
pub(crate) fn is_chain(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// Replaces each chain part among `parts` (of a checkpoint in `dir`) with the full keyed
/// snapshot it stands for, and returns per part replaced its links and their bytes.
pub(crate) fn expand_parts(dir: &Path, parts: &mut FileParts) -> Result<Vec<(usize, u64)>, String> {
    let mut expanded = Vec::new();
    for (operator, name, bytes) in parts.iter_mut().filter(|(_, _, bytes)| is_chain(bytes)) {
        let what = format!("operator {operator}'s part '{name}'");
        let links = decode(bytes).map_err(|problem| format!("{what}: {problem}"))?;
        let contents = links
            .iter()
            .map(|(_, file)| {
                weir_state::checkpoint::read_verified(dir, file).map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, String>>()?;
        let refs: Vec<&[u8]> = contents.iter().map(Vec::as_slice).collect();
        *bytes = weir_state::merge_keyed_chain(&refs).map_err(|e| format!("{what}: {e}"))?;
        expanded.push((links.len(), contents.iter().map(|c| c.len() as u64).sum()));
    }
    Ok(expanded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_state::checkpoint::CheckpointStorage;
    use weir_state::{
        KeyGroupRange, KeyedSnapshotEntries, KeyedSnapshotWriter, StateKind, StateValueCodec,
    };

    const GROUPS: KeyGroupRange = KeyGroupRange { start: 0, end: 15 };

    /// A keyed snapshot of `(key, value)`s, `removed` keys marked so (a delta).
    fn link(values: &[(u32, u64)], removed: &[u32]) -> Vec<u8> {
        let codec = StateValueCodec::<u64>::of();
        let mut writer = KeyedSnapshotWriter::<u32, i64>::new(16, GROUPS, 0);
        let state = writer.add_state("v", StateKind::Value, codec.value_type());
        for (key, value) in values {
            writer.set_key(key).unwrap();
            writer.put(state, None, &codec, value).unwrap();
        }
        for key in removed {
            writer.set_key(key).unwrap();
            writer.remove_key().unwrap();
        }
        let mut bytes = Vec::new();
        writer.finish(&mut bytes).unwrap();
        bytes
    }

    fn the_link(mut snapshot: OperatorSnapshot) -> ChainLink {
        match snapshot.parts.pop() {
            Some((_, Part::Chained(link))) => link,
            _ => panic!("a link"),
        }
    }

    /// Links are stored in barrier order; one whose checkpoint was aborted before its writer
    /// stored it goes with the next checkpoint, before that one's own link, so the chain the
    /// next checkpoint lists still adds up to the operator's state.
    #[test]
    fn an_aborted_checkpoints_link_is_stored_by_the_next() {
        let root = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::open(root.path(), "job").unwrap();
        let (pending, chk3) = (storage.begin(1).unwrap(), storage.begin(3).unwrap());
        let (listed, referenced) = glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let chain = KeyedChain::named("op-0-p".into(), "p");
                let add = |bytes| {
                    let mut snapshot = OperatorSnapshot::default();
                    chain.add(&mut snapshot, Some(bytes));
                    the_link(snapshot)
                };
                let first = add((true, link(&[(1, 10), (2, 20)], &[])));
                let aborted = add((false, link(&[(3, 30)], &[2])));
                let next = add((false, link(&[(1, 11)], &[])));
                let mut referenced = Vec::new();
                first.store(&pending, &mut referenced).await.unwrap();
                // The next one's writer waits for the aborted one's, dropped meanwhile.
                let writer = glommio::spawn_local(async move {
                    let mut referenced = Vec::new();
                    let part = next.store(&chk3, &mut referenced).await.unwrap();
                    (part, referenced)
                });
                glommio::timer::sleep(Duration::from_millis(20)).await;
                drop(aborted);
                writer.await
            })
            .unwrap()
            .join()
            .unwrap();
        let names: Vec<&str> = referenced.iter().map(|file| file.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "shared/1-op-0-p-1",
                "shared/3-op-0-p-2",
                "shared/3-op-0-p-3"
            ]
        );
        let mut parts = vec![("op".to_string(), "p".to_string(), listed)];
        let expanded = expand_parts(&root.path().join("job/chk-3"), &mut parts).unwrap();
        assert_eq!(expanded.len(), 1);
        assert_eq!(expanded[0].0, 3);
        let codec = StateValueCodec::<u64>::of();
        let entries = KeyedSnapshotEntries::<u32, i64>::read(&[&parts[0].2], 16, GROUPS).unwrap();
        let mut values = Vec::new();
        entries
            .for_each("v", StateKind::Value, &codec, |key, _, value| {
                values.push((*key, value));
                Ok(())
            })
            .unwrap();
        values.sort_unstable();
        assert_eq!(values, [(1, 11), (3, 30)]);
        // A damaged link is named.
        let shared = root.path().join("job/shared/3-op-0-p-3");
        let mut bytes = std::fs::read(&shared).unwrap();
        bytes[10] ^= 1;
        std::fs::write(&shared, bytes).unwrap();
        let mut parts = vec![(
            "op".to_string(),
            "p".to_string(),
            parts_listing(&referenced),
        )];
        let error = expand_parts(&root.path().join("job/chk-3"), &mut parts).unwrap_err();
        assert!(
            error.contains("3-op-0-p-3") && error.contains("damaged"),
            "{error}"
        );
    }

    fn parts_listing(files: &[StoredFile]) -> Vec<u8> {
        let chain: Vec<(bool, StoredFile)> = files
            .iter()
            .enumerate()
            .map(|(i, file)| (i == 0, file.clone()))
            .collect();
        encode(&chain)
    }

    #[test]
    fn a_chain_part_reads_back_and_damage_is_named() {
        let file = |name: &str| StoredFile {
            name: format!("shared/{name}"),
            len: 9,
            crc32: 7,
        };
        let chain = vec![(true, file("1-a-0-p-1")), (false, file("2-a-0-p-2"))];
        let bytes = encode(&chain);
        assert!(is_chain(&bytes));
        assert_eq!(decode(&bytes).unwrap(), chain);
        let error = decode(&bytes[..bytes.len() - 1]).unwrap_err();
        assert!(error.contains("truncated"), "{error}");
        let error = decode(&encode(&chain[1..])).unwrap_err();
        assert!(error.contains("link 0 is a delta"), "{error}");
        let error = decode(&encode(&[])).unwrap_err();
        assert!(error.contains("lists no link"), "{error}");
    }
}
