//! Keyed state, kept per key group so that a job restores with another parallelism.
//!
//! A keyed stage's subtask owns a contiguous range of key groups (Flink's
//! `KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex`, see
//! [`key_group_range`]); its [`KeyedState`] holds one map per key group of that range.
//! A snapshot writes the groups one after another, each with its id; a restore at any
//! parallelism (up to the max parallelism, which cannot change) reads the snapshots of
//! every old subtask and keeps the groups its new range holds. Keys therefore land where
//! the keyed exchange sends them after the restore, as in Flink.
//!
//! Each key group's map is shared behind a reference count: a checkpoint takes
//! [`KeyedState::snapshot_view`] at the barrier, a reference count per key group in time
//! independent of the state's size (the task's pause), and the view is encoded on the
//! checkpoint service's thread while the task goes on (Flink's heap backend snapshots its
//! copy-on-write state maps the same way, entry by entry). A write to a group that a view
//! still shares copies that group's map first (`Arc::make_mut`), once per group and
//! checkpoint; reads and all other writes go to a plain hash map at its full speed. With
//! Flink's 128 key groups or more, a group is a small part of a subtask's state.

use std::collections::HashMap;
use std::hash::Hash;
use std::ops::Range;
use std::sync::Arc;

use crate::exchange::codec::{Codec, DecodeError};
use crate::graph::keys::{key_group_for_hash, KeyHashCode, MAX_PARALLELISM_UPPER_BOUND};

/// Format version of a keyed-state snapshot.
const KEYED_VERSION: u8 = 1;

/// Flink's `computeKeyGroupRangeForOperatorIndex`: the key groups subtask `index` of
/// `parallelism` owns, out of `max_parallelism`.
pub fn key_group_range(max_parallelism: usize, parallelism: usize, index: usize) -> Range<usize> {
    let start = (index * max_parallelism).div_ceil(parallelism);
    let end = ((index + 1) * max_parallelism - 1) / parallelism + 1;
    start..end
}

/// Why keyed state could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyedStateError {
    /// A parallelism above the max parallelism, or zero.
    #[error(
        "parallelism {parallelism} with max parallelism {max_parallelism}: the parallelism \
         must be 1 to the max parallelism, which must be 1 to {MAX_PARALLELISM_UPPER_BOUND}"
    )]
    Parallelism {
        /// The parallelism.
        parallelism: usize,
        /// The max parallelism.
        max_parallelism: usize,
    },
    /// A snapshot taken with another max parallelism (Flink cannot change it either: it
    /// decides every key's group).
    #[error(
        "the state was written with max parallelism {found}, the job has {expected}: run \
         the job with max parallelism {found}"
    )]
    MaxParallelism {
        /// The snapshot's.
        found: usize,
        /// The job's.
        expected: usize,
    },
    /// A key outside this subtask's key groups (the stream was not keyed by this key).
    #[error(
        "a key of key group {group} reached the subtask that owns key groups {start}..{end}: \
         key the stream by the same key before this state"
    )]
    ForeignKey {
        /// The key's group.
        group: usize,
        /// First group owned.
        start: usize,
        /// One past the last.
        end: usize,
    },
    /// Bytes that are not a keyed-state snapshot of these types.
    #[error("keyed state cannot be decoded: {0}")]
    Decode(String),
}

impl From<DecodeError> for KeyedStateError {
    fn from(e: DecodeError) -> Self {
        KeyedStateError::Decode(e.to_string())
    }
}

/// One subtask's keyed state: a value per key, kept per key group.
#[derive(Debug, Clone)]
pub struct KeyedState<K, V> {
    max_parallelism: usize,
    groups: Range<usize>,
    /// One map per key group of `groups`, shared with the snapshot views taken since
    /// it was last written.
    maps: Vec<Arc<HashMap<K, V>>>,
}

impl<K, V> KeyedState<K, V>
where
    K: KeyHashCode + Codec + Eq + Hash + Clone,
    V: Codec + Clone,
{
    /// Empty state for subtask `index` of `parallelism`, out of `max_parallelism` key
    /// groups.
    pub fn new(
        max_parallelism: usize,
        parallelism: usize,
        index: usize,
    ) -> Result<Self, KeyedStateError> {
        if parallelism == 0
            || parallelism > max_parallelism
            || max_parallelism > MAX_PARALLELISM_UPPER_BOUND
            || index >= parallelism
        {
            return Err(KeyedStateError::Parallelism {
                parallelism,
                max_parallelism,
            });
        }
        let groups = key_group_range(max_parallelism, parallelism, index);
        let maps = groups.clone().map(|_| Arc::default()).collect::<Vec<_>>();
        Ok(KeyedState {
            max_parallelism,
            groups,
            maps,
        })
    }

    /// The key groups this subtask owns.
    pub fn key_groups(&self) -> Range<usize> {
        self.groups.clone()
    }

    fn map_of(&self, key: &K) -> Result<usize, KeyedStateError> {
        let group = key_group_for_hash(key.hash_code(), self.max_parallelism);
        if !self.groups.contains(&group) {
            return Err(KeyedStateError::ForeignKey {
                group,
                start: self.groups.start,
                end: self.groups.end,
            });
        }
        Ok(group - self.groups.start)
    }

    /// The value of `key`, if it has one.
    pub fn get(&self, key: &K) -> Result<Option<&V>, KeyedStateError> {
        let map = self.map_of(key)?;
        Ok(self.maps[map].get(key))
    }

    /// The value of `key`, made by `default` if it has none (Flink's `ValueState` with a
    /// default).
    pub fn get_or_insert_with(
        &mut self,
        key: K,
        default: impl FnOnce() -> V,
    ) -> Result<&mut V, KeyedStateError> {
        let map = self.map_of(&key)?;
        Ok(Arc::make_mut(&mut self.maps[map])
            .entry(key)
            .or_insert_with(default))
    }

    /// Sets `key`'s value; returns the one it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Result<Option<V>, KeyedStateError> {
        let map = self.map_of(&key)?;
        Ok(Arc::make_mut(&mut self.maps[map]).insert(key, value))
    }

    /// Clears `key`'s value; returns it.
    pub fn remove(&mut self, key: &K) -> Result<Option<V>, KeyedStateError> {
        let map = self.map_of(key)?;
        if !self.maps[map].contains_key(key) {
            // Nothing to remove: a shared group is not copied for it.
            return Ok(None);
        }
        Ok(Arc::make_mut(&mut self.maps[map]).remove(key))
    }

    /// Keys with a value.
    pub fn len(&self) -> usize {
        self.maps.iter().map(|m| m.len()).sum()
    }

    /// Whether no key has a value.
    pub fn is_empty(&self) -> bool {
        self.maps.iter().all(|m| m.is_empty())
    }

    /// Every key and its value, key group by key group.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.maps.iter().flat_map(|m| m.iter())
    }

    /// The state as bytes: version, max parallelism, then each non-empty key group's id,
    /// entry count and entries.
    pub fn snapshot(&self) -> Vec<u8> {
        encode_maps(self.max_parallelism, self.groups.start, &self.maps)
    }

    /// A view of the state as it is now, which [`snapshot`](Self::snapshot)'s bytes can
    /// be made from later, elsewhere: taking it costs a reference count per key group,
    /// whatever the state's size, and later writes here do not change it (the first
    /// write to a group the view still shares copies that group).
    pub fn snapshot_view(&self) -> impl FnOnce() -> Vec<u8> + Send + Sync + 'static
    where
        K: Send + Sync + 'static,
        V: Send + Sync + 'static,
    {
        let (max_parallelism, first) = (self.max_parallelism, self.groups.start);
        let maps = self.maps.clone();
        move || encode_maps(max_parallelism, first, &maps)
    }

    /// The state of subtask `index` of `parallelism` restored from the snapshots of
    /// every subtask of the stage when the checkpoint was taken (at any parallelism):
    /// it keeps the key groups it owns now and leaves the others to their subtasks.
    pub fn restore<'a>(
        max_parallelism: usize,
        parallelism: usize,
        index: usize,
        snapshots: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<Self, KeyedStateError> {
        let mut state = KeyedState::new(max_parallelism, parallelism, index)?;
        for snapshot in snapshots {
            let mut input = snapshot;
            let version = u8::decode(&mut input)?;
            if version != KEYED_VERSION {
                return Err(KeyedStateError::Decode(format!(
                    "format version {version}, this build reads {KEYED_VERSION}"
                )));
            }
            let found = u32::decode(&mut input)? as usize;
            if found != max_parallelism {
                return Err(KeyedStateError::MaxParallelism {
                    found,
                    expected: max_parallelism,
                });
            }
            let groups = u32::decode(&mut input)?;
            for _ in 0..groups {
                let group = u32::decode(&mut input)? as usize;
                let entries = u32::decode(&mut input)?;
                let mine = state.groups.contains(&group);
                for _ in 0..entries {
                    let key = K::decode(&mut input)?;
                    let value = V::decode(&mut input)?;
                    if mine {
                        if key_group_for_hash(key.hash_code(), max_parallelism) != group {
                            return Err(KeyedStateError::Decode(format!(
                                "a key filed under key group {group} belongs to another"
                            )));
                        }
                        Arc::make_mut(&mut state.maps[group - state.groups.start])
                            .insert(key, value);
                    }
                }
            }
            if !input.is_empty() {
                return Err(KeyedStateError::Decode(format!(
                    "{} bytes after the last key group",
                    input.len()
                )));
            }
        }
        Ok(state)
    }
}

/// See [`KeyedState::snapshot`]: `maps` are the groups from `first` on.
fn encode_maps<K: Codec, V: Codec>(
    max_parallelism: usize,
    first: usize,
    maps: &[Arc<HashMap<K, V>>],
) -> Vec<u8> {
    let mut out = Vec::new();
    KEYED_VERSION.encode(&mut out);
    (max_parallelism as u32).encode(&mut out);
    let groups = maps.iter().filter(|m| !m.is_empty()).count() as u32;
    groups.encode(&mut out);
    for (offset, map) in maps.iter().enumerate() {
        if map.is_empty() {
            continue;
        }
        ((first + offset) as u32).encode(&mut out);
        (map.len() as u32).encode(&mut out);
        for (key, value) in map.iter() {
            key.encode(&mut out);
            value.encode(&mut out);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::keys::{operator_index_for_key_group, subtask_for_key};

    /// Every key group belongs to exactly the subtask the keyed exchange sends it to.
    /// A view taken at a barrier encodes the state as it was then, however the state
    /// changes before it is encoded (on another thread).
    #[test]
    fn a_snapshot_view_is_the_state_when_it_was_taken() {
        let mut state: KeyedState<u64, u64> = KeyedState::new(128, 1, 0).unwrap();
        for key in 0..10_000u64 {
            state.insert(key, key * 2).unwrap();
        }
        let then = state.snapshot();
        let view = state.snapshot_view();
        for key in 0..10_000u64 {
            if key % 3 == 0 {
                state.remove(&key).unwrap();
            } else {
                state.insert(key, key + 1).unwrap();
            }
        }
        state.insert(20_000, 1).unwrap();
        let encoded = std::thread::spawn(view).join().unwrap();
        assert_eq!(encoded, then);
        assert_ne!(state.snapshot(), then);
        let restored = KeyedState::<u64, u64>::restore(128, 1, 0, [encoded.as_slice()]).unwrap();
        assert_eq!(restored.len(), 10_000);
        assert_eq!(restored.get(&9_999).unwrap(), Some(&19_998));
    }

    #[test]
    fn key_group_ranges_match_the_exchange() {
        for max in [1, 7, 128, 1000] {
            for parallelism in 1..=max.min(12) {
                let mut next = 0;
                for index in 0..parallelism {
                    let range = key_group_range(max, parallelism, index);
                    assert_eq!(range.start, next, "{max} {parallelism} {index}");
                    for group in range.clone() {
                        assert_eq!(operator_index_for_key_group(max, parallelism, group), index);
                    }
                    next = range.end;
                }
                assert_eq!(next, max);
            }
        }
    }

    /// Counts per key at `parallelism`, each key on the subtask the exchange picks.
    fn counts(max: usize, parallelism: usize, keys: u64) -> Vec<KeyedState<u64, u64>> {
        let mut states: Vec<_> = (0..parallelism)
            .map(|i| KeyedState::new(max, parallelism, i).expect("state"))
            .collect();
        for key in 0..keys {
            let subtask = subtask_for_key(&key, max, parallelism);
            *states[subtask]
                .get_or_insert_with(key, || 0)
                .expect("own key") += key * 3 + 1;
        }
        states
    }

    /// A restore with another parallelism puts every key's state on the subtask the
    /// exchange sends the key to at the new parallelism, and loses none.
    #[test]
    fn state_restores_at_another_parallelism() {
        let max = 128;
        for (before, after) in [(2, 3), (3, 2), (1, 4), (4, 1), (5, 5)] {
            let snapshots: Vec<Vec<u8>> = counts(max, before, 2_000)
                .iter()
                .map(KeyedState::snapshot)
                .collect();
            let mut seen = 0;
            for index in 0..after {
                let state = KeyedState::<u64, u64>::restore(
                    max,
                    after,
                    index,
                    snapshots.iter().map(Vec::as_slice),
                )
                .expect("restore");
                for (key, value) in state.iter() {
                    assert_eq!(
                        subtask_for_key(key, max, after),
                        index,
                        "{before} → {after}"
                    );
                    assert_eq!(*value, key * 3 + 1);
                    seen += 1;
                }
            }
            assert_eq!(seen, 2_000, "{before} → {after}");
        }
    }

    #[test]
    fn foreign_keys_other_max_parallelism_and_garbage_are_refused() {
        let mut state = KeyedState::<u64, u64>::new(128, 2, 0).expect("state");
        let foreign = (0..100u64)
            .find(|k| subtask_for_key(k, 128, 2) == 1)
            .expect("a key of subtask 1");
        assert!(matches!(
            state.insert(foreign, 1),
            Err(KeyedStateError::ForeignKey { .. })
        ));
        let snapshot = counts(128, 2, 100)[0].snapshot();
        assert!(matches!(
            KeyedState::<u64, u64>::restore(256, 2, 0, [snapshot.as_slice()]),
            Err(KeyedStateError::MaxParallelism {
                found: 128,
                expected: 256
            })
        ));
        for cut in 0..snapshot.len() {
            assert!(
                KeyedState::<u64, u64>::restore(128, 2, 0, [&snapshot[..cut]]).is_err(),
                "cut at {cut}"
            );
        }
        assert!(KeyedState::<u64, u64>::new(128, 0, 0).is_err());
        assert!(KeyedState::<u64, u64>::new(128, 129, 0).is_err());
        assert!(KeyedState::<u64, u64>::new(128, 2, 2).is_err());
    }
}
