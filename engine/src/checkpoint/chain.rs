//! Keyed parts checkpointed incrementally, as chains of a full snapshot and deltas.
//!
//! An operator that keeps keyed state in maps of its own and knows which keys changed since its
//! last barrier (the tumbling and sliding window operator, `window/aligned`) takes at a
//! barrier either a full keyed snapshot or a delta of the keys changed and removed since
//! (`weir_state::merge_keyed_chain` has the format), handing over its encoder: the link is
//! encoded after the barrier, in pieces. Each link is a shared file of the job,
//! `shared/<n>-<operator>-<subtask>-<part>-<link>`, written once by the task's checkpoint writer
//! after the barrier; the operator's part in a checkpoint is a small manifest listing the chain
//! (every link since the last full one), and the checkpoint's metadata lists the links too, so
//! a restore checks them and the storage's sweep keeps a link while a retained checkpoint
//! lists it. A restore (or `weir checkpoint inspect`) reads the chain back as the one full
//! snapshot it stands for ([`expand_parts`]), so everything after sees an ordinary keyed part.
//!
//! **When a full snapshot.** The first after the operator opens (after a restore too); when at
//! least half the keys changed (a delta would cost as much); when the deltas since the last
//! full one add up to the size of the state as it is now — the full one's bytes per key times
//! the keys the operator holds — as far as their writers have told (so a restore reads at
//! most about twice the state; measured against the full one's size instead, a growing state
//! was written whole every few checkpoints); every [`MAX_DELTAS`] links; and after a link
//! could not be written.
//! `execution.checkpointing.incremental: false` writes every one full, as an ordinary part.
//!
//! **Nothing lost on an abort.** A link belongs to the chain whether or not its checkpoint
//! completes: the links after it are deltas over it. So links are uploaded one at a time in
//! barrier order, and a link whose checkpoint was aborted before its writer stored it is
//! carried over, encoder and all, and stored by the next checkpoint's writer before that
//! checkpoint's own link. A link whose writing failed once it began is lost (its pieces went
//! with the file), and so are the deltas over it, even those already taken: their checkpoints
//! fail, and the next link is a full one.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use weir_state::checkpoint::{PendingCheckpoint, StateFileWriter, StoredFile};

use super::bytes::{ByteReader, ByteWriter};
use super::task_state::{write_in_pieces, DeferredPart, FileParts, OperatorSnapshot, Part};
use crate::operator::RuntimeContext;

const MAGIC: &[u8; 8] = b"WEIRCHN\0";
const VERSION: u32 = 1;

/// Deltas after which the next link is a full snapshot whatever their size.
pub(crate) const MAX_DELTAS: u32 = 32;

/// One operator subtask's chain for one of its parts.
pub(crate) struct KeyedChain {
    part: &'static str,
    links: Rc<Links>,
    /// The next link's number (from 1).
    next: Cell<u64>,
    /// Every link after the first a delta, whatever changed (tests of the delta path).
    deltas_only: bool,
}

/// The chain since its last full link, for choosing the next link: the full link's number,
/// size and keys, the deltas since and their bytes (sizes as their writers learn them).
#[derive(Clone, Copy, Debug)]
struct Base {
    full: u64,
    full_bytes: u64,
    full_keys: usize,
    deltas: u32,
    delta_bytes: u64,
}

impl Base {
    /// About how many bytes a full link would take with `keys` keys: the last full link's
    /// bytes per key (its own size when it had none).
    fn full_bytes_with(&self, keys: usize) -> u64 {
        match self.full_keys {
            0 => self.full_bytes,
            full_keys => {
                let bytes = u128::from(self.full_bytes) * keys as u128 / full_keys as u128;
                u64::try_from(bytes).unwrap_or(u64::MAX)
            }
        }
    }
}

/// What the chain's writers share: the links stored, and which have been dealt with.
struct Links {
    /// `<operator>-<subtask>-<part>`: the links' file names without their numbers.
    name: String,
    /// The chain as stored: the last full link first.
    stored: RefCell<Vec<(bool, StoredFile)>>,
    /// Links handed out at a barrier whose writers are done (stored, carried or failed),
    /// past `through`.
    done: RefCell<BTreeSet<u64>>,
    /// Every link up to this one is done.
    through: Cell<u64>,
    /// Links whose checkpoint did not store them, in number order.
    carried: RefCell<Vec<Carried>>,
    /// The last link whose writing failed after it began (0: none): the deltas over it are
    /// lost with it, and the chain starts again with a full link.
    failed: Cell<u64>,
    /// `None`: no full link handed out yet (or the chain starts again).
    base: Cell<Option<Base>>,
}

impl Links {
    fn mark_done(&self, link: u64) {
        let mut done = self.done.borrow_mut();
        done.insert(link);
        while done.remove(&(self.through.get() + 1)) {
            self.through.set(self.through.get() + 1);
        }
    }

    /// Link `number` was written, `len` bytes: the accounting of the chain's base learns it.
    fn stored_len(&self, number: u64, len: u64) {
        if let Some(mut base) = self.base.get() {
            if number == base.full {
                base.full_bytes = len;
            } else if number > base.full {
                base.delta_bytes += len;
            }
            self.base.set(Some(base));
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
                failed: Cell::new(0),
                base: Cell::new(None),
            }),
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
        let base = self
            .links
            .base
            .get()
            .filter(|base| self.links.failed.get() < base.full);
        match base {
            None => Link::Full,
            Some(_) if changed == 0 => Link::Unchanged,
            Some(_) if self.deltas_only => Link::Delta,
            Some(base) => {
                let grown = base.full_bytes > 0 && base.delta_bytes >= base.full_bytes_with(keys);
                if changed.saturating_mul(2) >= keys || grown || base.deltas >= MAX_DELTAS {
                    Link::Full
                } else {
                    Link::Delta
                }
            }
        }
    }

    /// Makes the next link a full snapshot, whatever changed.
    pub(crate) fn restart(&self) {
        self.links.base.set(None);
    }

    /// Adds the next link to `snapshot`: `new`, the encoder of a full keyed snapshot (`true`)
    /// or of a delta, or none when nothing changed (the part lists the chain as it is), taken
    /// with the operator holding `keys` keys. Its writer stores it after the barrier.
    pub(crate) fn add(
        &self,
        snapshot: &mut OperatorSnapshot,
        new: Option<(bool, DeferredPart)>,
        keys: usize,
    ) {
        let number = self.next.get();
        self.next.set(number + 1);
        if let Some((full, _)) = &new {
            self.links.base.set(match (full, self.links.base.get()) {
                (true, _) | (false, None) => Some(Base {
                    full: number,
                    full_bytes: 0,
                    full_keys: keys,
                    deltas: 0,
                    delta_bytes: 0,
                }),
                (false, Some(base)) => Some(Base {
                    deltas: base.deltas + 1,
                    ..base
                }),
            });
        }
        let base = self.links.base.get().map_or(number, |base| base.full);
        snapshot.parts.push((
            self.part,
            Part::Chained(ChainLink {
                number,
                base,
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
    /// The full link this one builds on (itself, if full).
    base: u64,
    /// The link's encoder and whether it is full; `None`: no new link.
    new: Option<(bool, DeferredPart)>,
    /// Set once the writer dealt with it.
    done: bool,
    links: Rc<Links>,
}

impl ChainLink {
    /// Stores the link (after those before it, and any an earlier checkpoint did not store)
    /// into `pending`, in pieces with records flowing between them; adds the chain's files to
    /// `referenced`, and returns the part listing them and the longest piece's encoding.
    pub(crate) async fn store(
        mut self,
        pending: &PendingCheckpoint,
        referenced: &mut Vec<StoredFile>,
    ) -> Result<(Vec<u8>, Duration), String> {
        while self.links.through.get() + 1 != self.number {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        let (longest, error) = self.store_links(pending).await;
        self.done = true;
        self.links.mark_done(self.number);
        if self.links.failed.get() >= self.base {
            return Err(error.unwrap_or_else(|| {
                format!(
                    "link {} of chain {} builds on a link that could not be written; the \
                     chain starts again with a full link",
                    self.number, self.links.name
                )
            }));
        }
        let chain = self.links.stored.borrow();
        if chain.is_empty() {
            return Err("internal error: a chain's first link was not full".into());
        }
        referenced.extend(chain.iter().map(|(_, file)| file.clone()));
        Ok((encode(&chain), longest))
    }

    /// Stores the links carried over, then this one's; returns the longest piece's encoding
    /// and the last failure. A link that cannot be written is lost, and so are the deltas over
    /// it (`Links::failed`).
    async fn store_links(&mut self, pending: &PendingCheckpoint) -> (Duration, Option<String>) {
        let mut todo = std::mem::take(&mut *self.links.carried.borrow_mut());
        if let Some((full, encoder)) = self.new.take() {
            todo.push(Carried {
                number: self.number,
                base: self.base,
                full,
                encoder,
            });
        }
        let (mut longest, mut error) = (Duration::ZERO, None);
        for mut link in todo {
            if self.links.failed.get() >= link.base {
                self.links.failed.set(link.number);
                continue;
            }
            match store_link(pending, &self.links.name, link.number, &mut link.encoder).await {
                Ok((file, step)) => {
                    longest = longest.max(step);
                    self.links.stored_len(link.number, file.len);
                    let mut chain = self.links.stored.borrow_mut();
                    if link.full {
                        chain.clear();
                    }
                    chain.push((link.full, file));
                }
                Err(problem) => {
                    self.links.failed.set(link.number);
                    error = Some(problem);
                }
            }
        }
        (longest, error)
    }
}

/// A link its checkpoint did not store, for the next checkpoint's writer.
struct Carried {
    number: u64,
    base: u64,
    full: bool,
    encoder: DeferredPart,
}

#[cfg(test)]
impl ChainLink {
    /// Appends the next piece of the link's encoding to `out`; returns whether more follow.
    pub(crate) fn step(&mut self, out: &mut Vec<u8>, budget: usize) -> bool {
        match &mut self.new {
            Some((_, encoder)) => encoder.encode_next(out, budget).expect("a link encodes"),
            None => false,
        }
    }

    /// The link's bytes (the rest of them, after [`ChainLink::step`]) and whether it is full,
    /// encoded without storing them.
    pub(crate) fn take(mut self) -> Option<(bool, Vec<u8>)> {
        self.done = true;
        self.links.mark_done(self.number);
        let (full, mut encoder) = self.new.take()?;
        Some((full, super::task_state::encode_whole(&mut encoder, 64)))
    }
}

impl Drop for ChainLink {
    /// A link its checkpoint's writer never stored (the checkpoint was aborted first) is
    /// carried over to the next one.
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some((full, encoder)) = self.new.take() {
            self.links.carried.borrow_mut().push(Carried {
                number: self.number,
                base: self.base,
                full,
                encoder,
            });
        }
        self.links.mark_done(self.number);
    }
}

/// Writes link `number` as a shared file; returns it and the longest piece's encoding.
async fn store_link(
    pending: &PendingCheckpoint,
    name: &str,
    number: u64,
    encoder: &mut DeferredPart,
) -> Result<(StoredFile, Duration), String> {
    let mut writer = StateFileWriter::create_shared(pending, &format!("{name}-{number}"))
        .await
        .map_err(|e| e.to_string())?;
    let longest = write_in_pieces(&mut writer, None, |out| {
        let more = encoder.encode_next(out, super::task_state::PIECE_BYTES)?;
        Ok((more, encoder.waiting()))
    })
    .await?;
    let file = writer.finish().await.map_err(|e| e.to_string())?;
    Ok((file, longest.max(encoder.longest_step_elsewhere())))
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
        let refs: Vec<&[u8]> = contents.iter().map(|link| &link[..]).collect();
        *bytes = weir_state::merge_keyed_chain(&refs)
            .map_err(|e| format!("{what}: {e}"))?
            .into();
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

    /// An encoder handing out `bytes`.
    fn encoded(bytes: Vec<u8>) -> DeferredPart {
        super::super::task_state::Whole::part(move |out: &mut Vec<u8>| {
            out.extend_from_slice(&bytes);
            Ok(())
        })
    }

    fn the_link(mut snapshot: OperatorSnapshot) -> ChainLink {
        match snapshot.parts.pop() {
            Some((_, Part::Chained(link))) => link,
            _ => panic!("a link"),
        }
    }

    /// The deltas since the last full link are weighed against the state as it is now: a
    /// growing state gets deltas until they add up to its present size, a shrinking one a
    /// full link sooner; half the keys changed, or [`MAX_DELTAS`] deltas, make a full one.
    #[test]
    fn deltas_are_weighed_against_the_state_now() {
        let chain = KeyedChain::named("op-0-p".into(), "p");
        let add = |full: bool, keys: usize, bytes: u64| {
            let mut snapshot = OperatorSnapshot::default();
            chain.add(&mut snapshot, Some((full, encoded(Vec::new()))), keys);
            chain.links.stored_len(chain.next.get() - 1, bytes);
        };
        assert_eq!(chain.next(0, 0), Link::Full, "the first link");
        add(true, 100, 1000);
        assert_eq!(chain.next(0, 100), Link::Unchanged);
        assert_eq!(chain.next(50, 100), Link::Full, "half the keys changed");
        assert_eq!(chain.next(40, 100), Link::Delta);
        add(false, 200, 1500);
        // 1500 bytes of deltas against a full link of 1000: with 200 keys now the state is
        // about 2000 bytes.
        assert_eq!(chain.next(40, 200), Link::Delta);
        assert_eq!(
            chain.next(40, 150),
            Link::Full,
            "shrunk to about 1500 bytes"
        );
        add(false, 200, 500);
        assert_eq!(chain.next(40, 200), Link::Full, "2000 bytes of deltas");
        assert_eq!(chain.next(40, 250), Link::Delta);
        add(true, 250, 2500);
        for _ in 1..MAX_DELTAS {
            add(false, 250, 1);
        }
        assert_eq!(chain.next(1, 250), Link::Delta);
        add(false, 250, 1);
        assert_eq!(chain.next(1, 250), Link::Full, "{MAX_DELTAS} deltas");
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
                let add = |(full, bytes)| {
                    let mut snapshot = OperatorSnapshot::default();
                    chain.add(&mut snapshot, Some((full, encoded(bytes))), 10);
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
                    let (part, _) = next.store(&chk3, &mut referenced).await.unwrap();
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
        let mut parts = vec![("op".to_string(), "p".to_string(), listed.into())];
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
            parts_listing(&referenced).into(),
        )];
        let error = expand_parts(&root.path().join("job/chk-3"), &mut parts).unwrap_err();
        assert!(
            error.contains("3-op-0-p-3") && error.contains("damaged"),
            "{error}"
        );
    }

    /// A link that cannot be written is lost with the deltas over it, even those already
    /// taken: their checkpoints fail, and the chain starts again with a full link.
    #[test]
    fn a_link_that_cannot_be_written_takes_its_deltas_with_it() {
        let root = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::open(root.path(), "job").unwrap();
        let chk: Vec<PendingCheckpoint> = (1..=5).map(|n| storage.begin(n).unwrap()).collect();
        let outcomes = glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let chain = KeyedChain::named("op-0-p".into(), "p");
                let add = |full, encoder| {
                    let mut snapshot = OperatorSnapshot::default();
                    chain.add(&mut snapshot, Some((full, encoder)), 10);
                    the_link(snapshot)
                };
                let failing = || -> DeferredPart {
                    super::super::task_state::Whole::part(|_: &mut Vec<u8>| {
                        Err("the disk is full".to_string())
                    })
                };
                let mut outcomes = Vec::new();
                let store = |link: ChainLink, at: usize| {
                    let pending = &chk[at];
                    async move {
                        let mut referenced = Vec::new();
                        link.store(pending, &mut referenced)
                            .await
                            .map(|_| referenced.len())
                    }
                };
                let first = add(true, encoded(link(&[(1, 10)], &[])));
                outcomes.push(store(first, 0).await);
                assert_eq!(chain.next(1, 10), Link::Delta);
                let broken = add(false, failing());
                // Taken at the next barrier, before the one before it was written.
                let over_it = add(false, encoded(link(&[(2, 20)], &[])));
                outcomes.push(store(broken, 1).await);
                outcomes.push(store(over_it, 2).await);
                let next = chain.next(1, 10);
                let full = add(next == Link::Full, encoded(link(&[(1, 11), (2, 20)], &[])));
                outcomes.push(store(full, 3).await);
                (outcomes, next)
            })
            .unwrap()
            .join()
            .unwrap();
        let (outcomes, next) = outcomes;
        assert_eq!(next, Link::Full);
        assert_eq!(outcomes[0], Ok(1));
        assert!(
            outcomes[1]
                .as_ref()
                .unwrap_err()
                .contains("the disk is full"),
            "{outcomes:?}"
        );
        assert!(
            outcomes[2]
                .as_ref()
                .unwrap_err()
                .contains("could not be written"),
            "{outcomes:?}"
        );
        // The new chain is the full link alone.
        assert_eq!(outcomes[3], Ok(1));
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
