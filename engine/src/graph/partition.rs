//! Flink's partitioners: how an exchange routes records from one stage's subtasks to
//! the next stage's, and which subtasks it connects.
//!
//! | partitioner | connects | routes |
//! |---|---|---|
//! | forward | subtask `i` to subtask `i` (equal parallelism) | to its one channel |
//! | rebalance | every subtask to every subtask | round robin, from a random channel |
//! | rescale | pointwise, as Flink's `POINTWISE` pattern | round robin over its channels |
//! | key groups (`key_by`) | all to all | by key group ([`keys`](super::keys)) |
//! | broadcast | all to all | every record to every channel |
//! | global | all to all | everything to subtask 0 |
//! | custom | all to all | a user [`Partitioner`] of a key |
//!
//! Rescale's pointwise pattern (Flink's `EdgeManagerBuildUtil.connectPointwise`): with
//! more upstream subtasks than downstream, downstream subtask `j` reads upstream
//! subtasks `j·m/n .. (j+1)·m/n`; with fewer, upstream subtask `i` feeds downstream
//! subtasks `⌈i·n/m⌉ .. ⌈(i+1)·n/m⌉` (`m` upstream, `n` downstream).

use std::sync::Arc;

use crate::element::Record;
use crate::exchange::{ChannelSelector, Target};
use crate::graph::keys::{key_group_for_hash, operator_index_for_key_group};

/// A user partitioner (Flink's `Partitioner`): the channel of a key among `partitions`.
/// A result outside `0..partitions` fails the job with
/// [`GraphRunError::PartitionOutOfRange`](super::GraphRunError::PartitionOutOfRange).
pub trait Partitioner<K>: Send + Sync + 'static {
    /// The target subtask of `key`.
    fn partition(&self, key: &K, partitions: usize) -> usize;
}

impl<K, F: Fn(&K, usize) -> usize + Send + Sync + 'static> Partitioner<K> for F {
    fn partition(&self, key: &K, partitions: usize) -> usize {
        self(key, partitions)
    }
}

/// How an exchange routes records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partitioning {
    /// One-to-one between equal parallelisms.
    Forward,
    /// Round robin over every downstream subtask.
    Rebalance,
    /// Round robin over a pointwise subset.
    Rescale,
    /// By key group.
    KeyGroups,
    /// To every downstream subtask.
    Broadcast,
    /// To downstream subtask 0.
    Global,
    /// By a user partitioner.
    Custom,
}

impl Partitioning {
    /// Flink's name of it.
    pub fn name(self) -> &'static str {
        match self {
            Partitioning::Forward => "FORWARD",
            Partitioning::Rebalance => "REBALANCE",
            Partitioning::Rescale => "RESCALE",
            Partitioning::KeyGroups => "HASH",
            Partitioning::Broadcast => "BROADCAST",
            Partitioning::Global => "GLOBAL",
            Partitioning::Custom => "CUSTOM",
        }
    }

    /// Whether it connects subtasks pointwise rather than all to all.
    pub fn is_pointwise(self) -> bool {
        matches!(self, Partitioning::Forward | Partitioning::Rescale)
    }
}

/// The downstream subtasks that upstream subtask `index` of `upstream` writes to, in
/// channel order, for an exchange to `downstream` subtasks.
pub fn connected(
    partitioning: Partitioning,
    upstream: usize,
    downstream: usize,
    index: usize,
) -> Vec<usize> {
    if !partitioning.is_pointwise() {
        return (0..downstream).collect();
    }
    if upstream == downstream {
        vec![index]
    } else if upstream > downstream {
        (0..downstream)
            .filter(|&j| {
                (j * upstream / downstream..(j + 1) * upstream / downstream).contains(&index)
            })
            .collect()
    } else {
        let start = (index * downstream).div_ceil(upstream);
        let end = ((index + 1) * downstream).div_ceil(upstream);
        (start..end).collect()
    }
}

/// A key's hash code, for key groups.
pub(crate) type KeyHashFn<T> = Arc<dyn Fn(&T) -> i32 + Send + Sync>;
/// A user partitioner over the record (its key selector applied).
pub(crate) type CustomFn<T> = Arc<dyn Fn(&T, usize) -> usize + Send + Sync>;

/// What a subtask's selector needs, shared by the stage's subtasks.
pub(crate) enum Route<T> {
    Plain(Partitioning),
    KeyGroups(KeyHashFn<T>),
    Custom(CustomFn<T>),
}

impl<T> Clone for Route<T> {
    fn clone(&self) -> Self {
        match self {
            Route::Plain(p) => Route::Plain(*p),
            Route::KeyGroups(f) => Route::KeyGroups(Arc::clone(f)),
            Route::Custom(f) => Route::Custom(Arc::clone(f)),
        }
    }
}

impl<T> Route<T> {
    pub(crate) fn partitioning(&self) -> Partitioning {
        match self {
            Route::Plain(p) => *p,
            Route::KeyGroups(_) => Partitioning::KeyGroups,
            Route::Custom(_) => Partitioning::Custom,
        }
    }
}

/// One upstream subtask's channel selector.
pub(crate) struct Selector<T> {
    route: Route<T>,
    max_parallelism: usize,
    next: usize,
    /// A custom partitioner's answer outside its range: (answer, partitions).
    pub(crate) out_of_range: Option<(usize, usize)>,
}

impl<T> Selector<T> {
    /// `seed` picks rebalance's first channel (Flink starts at a random one).
    pub(crate) fn new(route: Route<T>, max_parallelism: usize, channels: usize, seed: u64) -> Self {
        let next = match route.partitioning() {
            // Flink: nextChannelToSendTo = random(n), then +1 before each record.
            Partitioning::Rebalance => (seed % channels.max(1) as u64) as usize,
            // Flink's rescale starts at -1: the first record goes to channel 0.
            _ => channels.saturating_sub(1),
        };
        Selector {
            route,
            max_parallelism,
            next,
            out_of_range: None,
        }
    }
}

impl<T> ChannelSelector<Record<T>> for Selector<T> {
    #[inline]
    fn select(&mut self, record: &Record<T>, subpartitions: usize) -> Target {
        match &self.route {
            Route::KeyGroups(hash) => {
                let group = key_group_for_hash(hash(&record.value), self.max_parallelism);
                Target::One(operator_index_for_key_group(
                    self.max_parallelism,
                    subpartitions,
                    group,
                ))
            }
            Route::Custom(partition) => {
                let target = partition(&record.value, subpartitions);
                if target < subpartitions {
                    Target::One(target)
                } else {
                    self.out_of_range.get_or_insert((target, subpartitions));
                    Target::One(0)
                }
            }
            Route::Plain(Partitioning::Broadcast) => Target::All,
            Route::Plain(Partitioning::Forward | Partitioning::Global) => Target::One(0),
            Route::Plain(_) => {
                self.next += 1;
                if self.next >= subpartitions {
                    self.next = 0;
                }
                Target::One(self.next)
            }
        }
    }

    fn is_broadcast(&self) -> bool {
        matches!(self.route, Route::Plain(Partitioning::Broadcast))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::codec::Codec;

    #[test]
    fn pointwise_wiring_is_flinks() {
        // 4 → 2: downstream 0 reads 0, 1; downstream 1 reads 2, 3.
        let four_to_two: Vec<_> = (0..4)
            .map(|i| connected(Partitioning::Rescale, 4, 2, i))
            .collect();
        assert_eq!(four_to_two, vec![vec![0], vec![0], vec![1], vec![1]]);
        // 2 → 5: upstream 0 feeds 0..3, upstream 1 feeds 3..5.
        assert_eq!(connected(Partitioning::Rescale, 2, 5, 0), vec![0, 1, 2]);
        assert_eq!(connected(Partitioning::Rescale, 2, 5, 1), vec![3, 4]);
        assert_eq!(connected(Partitioning::Forward, 3, 3, 2), vec![2]);
        assert_eq!(
            connected(Partitioning::KeyGroups, 3, 4, 2),
            vec![0, 1, 2, 3]
        );
        // Every downstream subtask is fed, for any pair.
        for m in 1..9 {
            for n in 1..9 {
                let mut fed = vec![0; n];
                for i in 0..m {
                    for j in connected(Partitioning::Rescale, m, n, i) {
                        fed[j] += 1;
                    }
                }
                assert!(fed.iter().all(|&f| f >= 1), "{m} → {n}: {fed:?}");
            }
        }
    }

    #[test]
    fn a_record_crosses_as_its_timestamp_then_its_value() {
        for timestamp in [None, Some(-3), Some(i64::MAX)] {
            let sent = Record {
                value: (7u64, String::from("seven")),
                timestamp,
            };
            let mut bytes = Vec::new();
            sent.encode(&mut bytes);
            // The wire format: what a peer of another build reads.
            let mut expected = match timestamp {
                None => vec![0],
                Some(t) => [&[1u8][..], &t.to_le_bytes()].concat(),
            };
            expected.extend_from_slice(&7u64.to_le_bytes());
            expected.extend_from_slice(&5u32.to_le_bytes());
            expected.extend_from_slice(b"seven");
            assert_eq!(bytes, expected);
            let mut input = bytes.as_slice();
            assert_eq!(Record::decode(&mut input), Ok(sent));
            assert!(input.is_empty());
            let mut cut = &bytes[..bytes.len() - 1];
            assert!(Record::<(u64, String)>::decode(&mut cut).is_err());
        }
    }

    fn record(value: u64) -> Record<u64> {
        Record {
            timestamp: None,
            value,
        }
    }

    #[test]
    fn rebalance_goes_round_from_a_seeded_channel() {
        let mut selector = Selector::<u64>::new(Route::Plain(Partitioning::Rebalance), 128, 4, 6);
        let picks: Vec<_> = (0..6).map(|v| selector.select(&record(v), 4)).collect();
        let expected: Vec<_> = [3, 0, 1, 2, 3, 0].iter().map(|&c| Target::One(c)).collect();
        assert_eq!(picks, expected);
        let mut rescale = Selector::<u64>::new(Route::Plain(Partitioning::Rescale), 128, 3, 0);
        assert_eq!(rescale.select(&record(0), 3), Target::One(0));
    }

    #[test]
    fn a_custom_partitioner_out_of_range_is_noted() {
        let custom: CustomFn<u64> = Arc::new(|v: &u64, _| *v as usize);
        let mut selector = Selector::new(Route::Custom(custom), 128, 2, 0);
        assert_eq!(selector.select(&record(1), 2), Target::One(1));
        assert_eq!(selector.out_of_range, None);
        selector.select(&record(7), 2);
        assert_eq!(selector.out_of_range, Some((7, 2)));
    }
}
