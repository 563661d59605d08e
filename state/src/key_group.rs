//! Key groups: the unit in which keyed state is partitioned, routed and rescaled.
//!
//! A key is hashed with [`StableHasher`] (Weir key hash v1, below), the hash picks one of
//! `max_parallelism` key groups, and the key group picks the operator subtask:
//!
//! ```text
//! key_group = hash(key) % max_parallelism
//! subtask   = key_group * parallelism / max_parallelism
//! ```
//!
//! Subtask `i` therefore owns the contiguous range `ceil(i * max / p) ..= ceil((i + 1) * max / p) - 1`
//! ([`KeyGroupRange::for_subtask`]), and changing the parallelism moves whole key groups only.
//!
//! **Weir key hash v1** (never change it: state written today must restore tomorrow): the key's
//! `std::hash::Hash` impl feeds bytes and integers; integers are taken as little-endian bytes
//! (`usize`/`isize` as 8 bytes); every 8 bytes form a little-endian word `w`, folded as
//! `h = (h.rotl(5) ^ w) * 0x517cc1b727220a95` from `h = 0`; at `finish`, a partial last word is
//! zero-padded and folded the same way, then the total byte count is folded, and the result
//! goes through MurmurHash3's 64-bit finalizer.

use std::hash::{Hash, Hasher};

const SEED_MULTIPLIER: u64 = 0x517c_c1b7_2722_0a95;

/// The stable key hasher (Weir key hash v1). Its output depends only on the bytes the key's
/// `Hash` impl writes, not on the platform, process or Rust version's `DefaultHasher`.
#[derive(Clone, Debug, Default)]
pub struct StableHasher {
    state: u64,
    tail: u64,
    tail_len: u32,
    total: u64,
}

impl StableHasher {
    /// A fresh hasher.
    pub fn new() -> StableHasher {
        StableHasher::default()
    }

    #[inline]
    fn fold(&mut self, word: u64) {
        self.state = (self.state.rotate_left(5) ^ word).wrapping_mul(SEED_MULTIPLIER);
    }

    #[inline]
    fn push_byte(&mut self, byte: u8) {
        self.tail |= u64::from(byte) << (8 * self.tail_len);
        self.tail_len += 1;
        if self.tail_len == 8 {
            let word = self.tail;
            self.fold(word);
            self.tail = 0;
            self.tail_len = 0;
        }
    }

    /// Folds one 8-byte integer: a single fold when no partial word is pending (every key made
    /// of 8-byte integers, and every enum discriminant), else the general path. Same result as
    /// `write_le(&word.to_le_bytes())`; kept small so that it inlines into the key's `Hash`.
    #[inline(always)]
    fn write_word(&mut self, word: u64) {
        if self.tail_len == 0 {
            self.total += 8;
            self.fold(word);
        } else {
            self.write_le_outlined(&word.to_le_bytes());
        }
    }

    #[inline(never)]
    fn write_le_outlined(&mut self, bytes: &[u8]) {
        self.write_le(bytes);
    }

    #[inline]
    fn write_le(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let mut rest = bytes;
        if self.tail_len == 0 {
            while rest.len() >= 8 {
                let word = u64::from_le_bytes(rest[..8].try_into().expect("8 bytes"));
                self.fold(word);
                rest = &rest[8..];
            }
        }
        for &byte in rest {
            self.push_byte(byte);
        }
    }
}

/// MurmurHash3's finalizer: every output bit depends on every input bit.
#[inline]
pub(crate) fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

impl Hasher for StableHasher {
    #[inline]
    fn finish(&self) -> u64 {
        let mut copy = self.clone();
        if copy.tail_len > 0 {
            let word = copy.tail;
            copy.fold(word);
        }
        copy.fold(copy.total);
        fmix64(copy.state)
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        self.write_le(bytes);
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.write_le(&[i]);
    }
    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.write_le(&i.to_le_bytes());
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_le(&i.to_le_bytes());
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.write_word(i);
    }
    #[inline]
    fn write_u128(&mut self, i: u128) {
        self.write_le(&i.to_le_bytes());
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_word(i as u64);
    }
    #[inline]
    fn write_i8(&mut self, i: i8) {
        self.write_u8(i as u8);
    }
    #[inline]
    fn write_i16(&mut self, i: i16) {
        self.write_u16(i as u16);
    }
    #[inline]
    fn write_i32(&mut self, i: i32) {
        self.write_u32(i as u32);
    }
    #[inline]
    fn write_i64(&mut self, i: i64) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn write_i128(&mut self, i: i128) {
        self.write_u128(i as u128);
    }
    #[inline]
    fn write_isize(&mut self, i: isize) {
        self.write_u64(i as u64);
    }
}

/// Hashes a key with Weir key hash v1.
#[inline]
pub fn stable_hash<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut hasher = StableHasher::new();
    key.hash(&mut hasher);
    hasher.finish()
}

/// A key group index in `0..max_parallelism`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyGroup(pub u32);

impl KeyGroup {
    /// The key group of `key`.
    #[inline]
    pub fn of<K: Hash + ?Sized>(key: &K, max_parallelism: u32) -> KeyGroup {
        KeyGroup::of_hash(stable_hash(key), max_parallelism)
    }

    /// The key group of a key whose stable hash is `hash`.
    #[inline]
    pub fn of_hash(hash: u64, max_parallelism: u32) -> KeyGroup {
        let max = u64::from(max_parallelism);
        // Same value as `%`; a mask when the number of key groups is a power of two (the
        // default 128), which the hash partitioner pays for on every record.
        if max.is_power_of_two() {
            KeyGroup((hash & (max - 1)) as u32)
        } else {
            KeyGroup((hash % max) as u32)
        }
    }

    /// The subtask (of `parallelism`) that owns this key group.
    #[inline]
    pub fn subtask(self, max_parallelism: u32, parallelism: u32) -> u32 {
        let scaled = u64::from(self.0) * u64::from(parallelism);
        // Same value as the division; a shift when `max_parallelism` is a power of two.
        if max_parallelism.is_power_of_two() {
            (scaled >> max_parallelism.trailing_zeros()) as u32
        } else {
            (scaled / u64::from(max_parallelism)) as u32
        }
    }
}

/// The contiguous, inclusive range of key groups one subtask owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyGroupRange {
    /// First key group of the range.
    pub start: u32,
    /// Last key group of the range (inclusive); `end < start` means empty.
    pub end: u32,
}

impl KeyGroupRange {
    /// The key groups owned by `subtask` of `parallelism` (Flink's formula).
    pub fn for_subtask(max_parallelism: u32, parallelism: u32, subtask: u32) -> KeyGroupRange {
        let max = u64::from(max_parallelism);
        let p = u64::from(parallelism);
        let i = u64::from(subtask);
        let start = (i * max).div_ceil(p);
        let end = ((i + 1) * max).div_ceil(p);
        KeyGroupRange {
            start: start as u32,
            end: end as u32 - 1,
        }
    }

    /// Whether `group` lies in the range.
    pub fn contains(&self, group: KeyGroup) -> bool {
        self.start <= group.0 && group.0 <= self.end
    }

    /// Number of key groups in the range.
    pub fn len(&self) -> u32 {
        (self.end + 1).saturating_sub(self.start)
    }

    /// Whether the range holds no key group.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hash_is_pinned() {
        // These values are part of the on-disk contract: if this test fails, the hash changed
        // and state written by earlier versions would be routed to the wrong subtask.
        assert_eq!(stable_hash(&42u64), stable_hash(&42u64));
        let pinned = [
            stable_hash(&0u64),
            stable_hash("weir"),
            stable_hash(&(7u32, "a")),
        ];
        assert_eq!(pinned, [PINNED_0, PINNED_WEIR, PINNED_TUPLE], "{pinned:x?}");
    }

    #[test]
    fn key_groups_are_pinned() {
        // Where state written today lives: a change here moves keys to other key groups (and
        // subtasks) for every restored job. 128 key groups is the default, 1000 is not a power
        // of two (so `%`, not a mask). `u64::MAX` and `-1i64` write the same bytes, so they
        // share a group.
        let groups = |max| {
            [
                KeyGroup::of(&0u64, max).0,
                KeyGroup::of(&u64::MAX, max).0,
                KeyGroup::of(&-1i64, max).0,
                KeyGroup::of(&42u32, max).0,
                KeyGroup::of("", max).0,
                KeyGroup::of(&"auction-17".to_string(), max).0,
                KeyGroup::of(&(7u64, "a"), max).0,
                KeyGroup::of(&(1u64, 2u64), max).0,
            ]
        };
        assert_eq!(groups(128), PINNED_GROUPS_128, "{:?}", groups(128));
        assert_eq!(groups(1000), PINNED_GROUPS_1000, "{:?}", groups(1000));
    }

    const PINNED_GROUPS_128: [u32; 8] = [2, 52, 52, 62, 26, 33, 105, 122];
    const PINNED_GROUPS_1000: [u32; 8] = [930, 140, 140, 54, 114, 329, 849, 994];

    const PINNED_0: u64 = 0x0323_a40d_a27b_fa82;
    const PINNED_WEIR: u64 = 0xbeca_6222_fcbd_80e8;
    const PINNED_TUPLE: u64 = 0x7e47_d668_1ae9_19c1;

    #[test]
    fn split_writes_hash_like_one_write() {
        let mut a = StableHasher::new();
        a.write(b"hello, key groups");
        let mut b = StableHasher::new();
        b.write(b"hello, ");
        b.write(b"key groups");
        assert_eq!(a.finish(), b.finish());
    }

    /// One `write_*` call of a hashed key.
    #[derive(Clone, Debug)]
    enum Write {
        Bytes(Vec<u8>),
        U8(u8),
        U32(u32),
        U64(u64),
        Usize(usize),
        Isize(isize),
    }

    fn write() -> impl Strategy<Value = Write> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..20).prop_map(Write::Bytes),
            any::<u8>().prop_map(Write::U8),
            any::<u32>().prop_map(Write::U32),
            any::<u64>().prop_map(Write::U64),
            any::<usize>().prop_map(Write::Usize),
            any::<isize>().prop_map(Write::Isize),
        ]
    }

    proptest! {
        /// The integer fast paths hash exactly like the little-endian bytes (Weir key hash v1).
        #[test]
        fn integer_writes_hash_like_their_bytes(writes in proptest::collection::vec(write(), 0..12)) {
            let mut fast = StableHasher::new();
            let mut bytes = StableHasher::new();
            for write in &writes {
                match write {
                    Write::Bytes(b) => { fast.write(b); bytes.write(b); }
                    Write::U8(i) => { fast.write_u8(*i); bytes.write(&i.to_le_bytes()); }
                    Write::U32(i) => { fast.write_u32(*i); bytes.write(&i.to_le_bytes()); }
                    Write::U64(i) => { fast.write_u64(*i); bytes.write(&i.to_le_bytes()); }
                    Write::Usize(i) => { fast.write_usize(*i); bytes.write(&(*i as u64).to_le_bytes()); }
                    Write::Isize(i) => { fast.write_isize(*i); bytes.write(&(*i as i64).to_le_bytes()); }
                }
            }
            prop_assert_eq!(fast.finish(), bytes.finish());
        }

        #[test]
        fn every_key_group_has_exactly_one_owner(max in 1u32..=512, p_seed in 0u32..512) {
            let p = p_seed % max + 1;
            let ranges: Vec<KeyGroupRange> =
                (0..p).map(|i| KeyGroupRange::for_subtask(max, p, i)).collect();
            for g in 0..max {
                let owner = KeyGroup(g).subtask(max, p);
                prop_assert!(owner < p);
                let holders: Vec<u32> =
                    (0..p).filter(|&i| ranges[i as usize].contains(KeyGroup(g))).collect();
                prop_assert_eq!(holders, vec![owner]);
            }
            let total: u32 = ranges.iter().map(|r| r.len()).sum();
            prop_assert_eq!(total, max);
        }

        #[test]
        fn every_key_maps_to_one_subtask_in_range(key in any::<String>(), max in 1u32..=1024, p_seed in 0u32..1024) {
            let p = p_seed % max + 1;
            let group = KeyGroup::of(&key, max);
            prop_assert!(group.0 < max);
            let subtask = group.subtask(max, p);
            prop_assert!(subtask < p);
            prop_assert!(KeyGroupRange::for_subtask(max, p, subtask).contains(group));
            prop_assert_eq!(KeyGroup::of(&key, max), group);
        }

        #[test]
        fn rescaling_moves_only_whole_key_groups(keys in proptest::collection::vec(any::<u64>(), 1..200),
                                                 max in 1u32..=256, a in 0u32..256, b in 0u32..256) {
            let (pa, pb) = (a % max + 1, b % max + 1);
            // Keys of one key group land together at any parallelism.
            for k in &keys {
                let g = KeyGroup::of(k, max);
                for other in &keys {
                    if KeyGroup::of(other, max) == g {
                        prop_assert_eq!(g.subtask(max, pa), KeyGroup::of(other, max).subtask(max, pa));
                        prop_assert_eq!(g.subtask(max, pb), KeyGroup::of(other, max).subtask(max, pb));
                    }
                }
            }
        }
    }
}
