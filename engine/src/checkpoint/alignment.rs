//! Barrier alignment at a task with several input channels (Flink's
//! `SingleCheckpointBarrierHandler`), as a state machine over the barriers, channel ends
//! and clock its input gate reports.
//!
//! - **Aligned**: the first barrier of checkpoint `n` starts the alignment; each channel
//!   whose barrier `n` arrived is blocked (its later records belong after the
//!   checkpoint) until every channel's has; then the task snapshots, forwards the
//!   barrier and every channel is unblocked.
//! - **Unaligned**: the first barrier overtakes everything: the task snapshots at once and
//!   forwards the barrier; what still arrives on a channel before that channel's barrier
//!   was in flight at the checkpoint and is recorded as the checkpoint's channel state
//!   (replayed before new input on restore). No channel is blocked.
//! - **Aligned with a timeout** (Flink's `aligned-checkpoint-timeout`): aligned, but a
//!   checkpoint that waits longer than the timeout switches to unaligned: the task
//!   snapshots then, every channel is unblocked, and the channels whose barrier has not
//!   come yet are recorded until it does. As in Flink the wait counts from the barrier's
//!   start, not from its arrival at this gate: the producer announces the barrier as it
//!   writes it ([`on_aligned_announcement`](BarrierAligner::on_aligned_announcement)),
//!   so a barrier stuck behind a back-pressured queue times out there, and the gate then
//!   reads the announcing channels ahead to it. Without an announcement (a channel that
//!   cannot carry one) the wait counts from the first barrier to arrive.
//!
//! A channel that ended counts as having delivered every later barrier. A barrier of a
//! newer checkpoint while one is aligning aborts the older (its coordinator has given up
//! on it, or will); a barrier of an older or aborted checkpoint is ignored.

use std::time::Duration;

/// How a task aligns barriers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlignmentMode {
    /// Wait for every channel's barrier, blocking those that delivered theirs.
    Aligned,
    /// Snapshot at the first barrier, recording what is still in flight.
    Unaligned,
    /// Aligned, switching to unaligned when alignment takes longer than this.
    AlignedWithTimeout(Duration),
}

/// What the task must do after an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Alignment {
    /// Nothing yet.
    Wait,
    /// Snapshot checkpoint `id` now and forward its barrier.
    Snapshot {
        /// The checkpoint.
        id: u64,
        /// How long the first barrier waited for this moment.
        alignment: Duration,
        /// Whether it is unaligned: the task records [`ChannelState`] for it.
        unaligned: bool,
    },
    /// Checkpoint `id` is abandoned at this task: drop what was recorded for it and tell
    /// the coordinator.
    Abort {
        /// The checkpoint.
        id: u64,
        /// Why.
        reason: String,
    },
}

/// Which channels' input is recorded as channel state of an unaligned checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelState {
    /// The checkpoint.
    pub id: u64,
    /// Channels still recording: their barrier has not come yet.
    pub recording: Vec<bool>,
}

/// See the [module docs](self).
#[derive(Debug)]
pub struct BarrierAligner {
    mode: AlignmentMode,
    /// Channels that ended.
    ended: Vec<bool>,
    /// Channels whose barrier of the current checkpoint arrived.
    arrived: Vec<bool>,
    /// The checkpoint being aligned or recorded, and when its first barrier came.
    current: Option<(u64, u64)>,
    /// Whether the current checkpoint was snapshotted already (unaligned, or switched).
    snapshotted: bool,
    /// The newest checkpoint seen (older barriers are ignored).
    newest: u64,
    /// The newest aligned barrier announced ahead of its arrival, and when the first
    /// announcement of it came: its timeout counts from then.
    announced: Option<(u64, u64)>,
}

impl BarrierAligner {
    /// An aligner for `channels` input channels.
    pub fn new(channels: usize, mode: AlignmentMode) -> Self {
        BarrierAligner {
            mode,
            ended: vec![false; channels],
            arrived: vec![false; channels],
            current: None,
            snapshotted: false,
            newest: 0,
            announced: None,
        }
    }

    /// Whether `channel` must not be read now (its barrier arrived and the alignment
    /// goes on).
    pub fn is_blocked(&self, channel: usize) -> bool {
        self.current.is_some() && !self.snapshotted && self.arrived[channel]
    }

    /// The channels recorded as channel state now, if the current checkpoint is
    /// unaligned and some barriers have yet to come.
    pub fn channel_state(&self) -> Option<ChannelState> {
        let (id, _) = self.current?;
        self.snapshotted.then(|| ChannelState {
            id,
            recording: self
                .arrived
                .iter()
                .zip(&self.ended)
                .map(|(arrived, ended)| !arrived && !ended)
                .collect(),
        })
    }

    /// The checkpoint in progress at this task, if any.
    pub fn current(&self) -> Option<u64> {
        self.current.map(|(id, _)| id)
    }

    /// Whether a checkpoint is in progress here or announced and on its way: the gate
    /// looks at the clock ([`on_time`](Self::on_time)) while it is.
    pub fn is_active(&self) -> bool {
        self.current.is_some() || self.announced.is_some()
    }

    /// Barrier `id` arrived on `channel` at `now_ns`: what the task must do, in order (an
    /// older checkpoint's abort before a newer one's snapshot, when one barrier brings
    /// both).
    pub fn on_barrier(&mut self, channel: usize, id: u64, now_ns: u64) -> Vec<Alignment> {
        let mut out = Vec::new();
        // A barrier of a checkpoint done or abandoned here.
        if self
            .current
            .map_or(id <= self.newest, |(current, _)| id < current)
        {
            return out;
        }
        if let Some((current, _)) = self.current {
            if id > current {
                // A newer checkpoint: the older one will not complete here.
                if !self.snapshotted {
                    out.push(Alignment::Abort {
                        id: current,
                        reason: format!(
                            "barrier {id} arrived before checkpoint {current} was aligned"
                        ),
                    });
                }
                self.reset();
            }
        }
        self.newest = self.newest.max(id);
        let started = match self.current {
            Some((_, started)) => started,
            None => {
                self.current = Some((id, now_ns));
                self.snapshotted = false;
                now_ns
            }
        };
        if self.arrived[channel] {
            return out;
        }
        self.arrived[channel] = true;
        let alignment = Duration::from_nanos(now_ns.saturating_sub(started));
        if !self.snapshotted {
            if self.mode == AlignmentMode::Unaligned {
                self.snapshotted = true;
                out.push(Alignment::Snapshot {
                    id,
                    alignment,
                    unaligned: true,
                });
            } else if self.all_arrived() {
                out.push(Alignment::Snapshot {
                    id,
                    alignment,
                    unaligned: false,
                });
            }
        }
        self.finish_if_complete();
        out
    }

    /// Unaligned barrier `id` was announced ahead of the data (it overtakes the
    /// buffers queued in front of it): the task snapshots now, and every channel whose
    /// barrier has not come in band is recorded until it does. Nothing if `id` is done,
    /// abandoned or already snapshotted here.
    pub fn on_announcement(&mut self, id: u64, now_ns: u64) -> Vec<Alignment> {
        let mut out = Vec::new();
        if self
            .current
            .map_or(id <= self.newest, |(current, _)| id < current)
        {
            return out;
        }
        if let Some((current, _)) = self.current {
            if id > current {
                if !self.snapshotted {
                    out.push(Alignment::Abort {
                        id: current,
                        reason: format!(
                            "barrier {id} was announced before checkpoint {current} was aligned"
                        ),
                    });
                }
                self.reset();
            } else if self.snapshotted {
                return out;
            }
        }
        self.newest = self.newest.max(id);
        let started = *self.current.get_or_insert((id, now_ns));
        self.snapshotted = true;
        out.push(Alignment::Snapshot {
            id,
            alignment: Duration::from_nanos(now_ns.saturating_sub(started.1)),
            unaligned: true,
        });
        self.finish_if_complete();
        out
    }

    /// Aligned barrier `id` was announced at `now_ns` as its producer wrote it in band (it
    /// is queued behind the data in front of it): in
    /// [`AlignmentMode::AlignedWithTimeout`] its timeout counts from the first such
    /// announcement. Nothing in the other modes, or if `id` is done, abandoned or
    /// already announced here.
    pub fn on_aligned_announcement(&mut self, id: u64, now_ns: u64) {
        if !matches!(self.mode, AlignmentMode::AlignedWithTimeout(_)) {
            return;
        }
        let stale = match self.current {
            Some((current, _)) => id < current || (id == current && self.snapshotted),
            None => id <= self.newest,
        };
        if stale || self.announced.is_some_and(|(announced, _)| announced >= id) {
            return;
        }
        self.announced = Some((id, now_ns));
    }

    /// `channel` ended: it delivers no more barriers, so it counts as having delivered
    /// every one.
    pub fn on_end_of_channel(&mut self, channel: usize, now_ns: u64) -> Alignment {
        self.ended[channel] = true;
        let Some((id, started)) = self.current else {
            return Alignment::Wait;
        };
        if !self.snapshotted && self.all_arrived() {
            self.finish_if_complete();
            return Alignment::Snapshot {
                id,
                alignment: Duration::from_nanos(now_ns.saturating_sub(started)),
                unaligned: false,
            };
        }
        self.finish_if_complete();
        Alignment::Wait
    }

    /// The clock reads `now_ns`: in [`AlignmentMode::AlignedWithTimeout`], a checkpoint
    /// that has waited past the timeout (from its announcement, or from its first
    /// barrier here) switches to unaligned and is snapshotted now, whether or not any
    /// of its barriers arrived yet.
    pub fn on_time(&mut self, now_ns: u64) -> Alignment {
        let Some((id, since)) = self.waiting_since() else {
            return Alignment::Wait;
        };
        let AlignmentMode::AlignedWithTimeout(timeout) = self.mode else {
            return Alignment::Wait;
        };
        if Duration::from_nanos(now_ns.saturating_sub(since)) < timeout {
            return Alignment::Wait;
        }
        // The alignment proper: from the first barrier here (none yet: zero).
        let started = *self.current.get_or_insert((id, now_ns));
        self.newest = self.newest.max(id);
        self.snapshotted = true;
        Alignment::Snapshot {
            id,
            alignment: Duration::from_nanos(now_ns.saturating_sub(started.1)),
            unaligned: true,
        }
    }

    /// When [`on_time`](Self::on_time) must be called next, if a checkpoint may time
    /// out.
    pub fn deadline(&self) -> Option<u64> {
        let AlignmentMode::AlignedWithTimeout(timeout) = self.mode else {
            return None;
        };
        let (_, since) = self.waiting_since()?;
        Some(since + timeout.as_nanos() as u64)
    }

    /// The checkpoint that may time out and since when it waits: the one aligning here
    /// (from its announcement if it was announced, else from its first barrier), or,
    /// with none aligning, the one announced.
    fn waiting_since(&self) -> Option<(u64, u64)> {
        match (self.current, self.announced) {
            (Some(_), _) if self.snapshotted => None,
            (Some((id, started)), Some((announced, since))) if announced == id => {
                Some((id, started.min(since)))
            }
            (Some(current), _) => Some(current),
            (None, announced) => announced,
        }
    }

    fn all_arrived(&self) -> bool {
        self.arrived.iter().zip(&self.ended).all(|(a, e)| *a || *e)
    }

    /// Once every channel's barrier came (or the channel ended) and the task
    /// snapshotted, the checkpoint is done here.
    fn finish_if_complete(&mut self) {
        if self.all_arrived() {
            self.reset();
        }
    }

    fn reset(&mut self) {
        if let (Some((id, _)), Some((announced, _))) = (self.current, self.announced) {
            if announced <= id {
                self.announced = None;
            }
        }
        self.current = None;
        self.snapshotted = false;
        self.arrived.iter_mut().for_each(|a| *a = false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn snapshot(id: u64, alignment_ms: u64, unaligned: bool) -> Alignment {
        Alignment::Snapshot {
            id,
            alignment: Duration::from_millis(alignment_ms),
            unaligned,
        }
    }

    /// Three channels: each channel whose barrier came is held back until the last
    /// one's comes; then the task snapshots and every channel is read again.
    #[test]
    fn aligned_barriers_hold_back_each_channel_until_all_arrived() {
        let mut a = BarrierAligner::new(3, AlignmentMode::Aligned);
        assert!(a.on_barrier(0, 1, 0).is_empty());
        assert!(a.is_blocked(0) && !a.is_blocked(1) && !a.is_blocked(2));
        assert!(a.on_barrier(2, 1, 5 * MS).is_empty());
        assert!(a.is_blocked(0) && !a.is_blocked(1) && a.is_blocked(2));
        assert_eq!(a.on_barrier(1, 1, 9 * MS), [snapshot(1, 9, false)]);
        assert!((0..3).all(|c| !a.is_blocked(c)));
        assert_eq!(a.current(), None);
        assert_eq!(a.channel_state(), None);
        // The next checkpoint aligns afresh.
        assert!(a.on_barrier(1, 2, 20 * MS).is_empty());
        assert!(a.is_blocked(1) && !a.is_blocked(0));
    }

    /// The first barrier snapshots at once; what still arrives on a channel before its
    /// barrier is recorded, and no channel is blocked.
    #[test]
    fn unaligned_barriers_snapshot_at_once_and_record_what_is_in_flight() {
        let mut a = BarrierAligner::new(3, AlignmentMode::Unaligned);
        assert_eq!(a.on_barrier(1, 4, 0), [snapshot(4, 0, true)]);
        assert!((0..3).all(|c| !a.is_blocked(c)));
        let recording = |a: &BarrierAligner| a.channel_state().map(|s| s.recording);
        assert_eq!(recording(&a), Some(vec![true, false, true]));
        assert!(a.on_barrier(0, 4, 2 * MS).is_empty());
        assert_eq!(recording(&a), Some(vec![false, false, true]));
        assert!(a.on_barrier(2, 4, 3 * MS).is_empty());
        assert_eq!(recording(&a), None);
        assert_eq!(a.current(), None);
    }

    /// An alignment longer than the aligned timeout switches to unaligned: the task
    /// snapshots then, the blocked channels are read again, and the others are recorded
    /// until their barriers come.
    #[test]
    fn a_long_alignment_switches_to_unaligned() {
        let mut a = BarrierAligner::new(
            3,
            AlignmentMode::AlignedWithTimeout(Duration::from_millis(10)),
        );
        assert!(a.on_barrier(0, 1, 0).is_empty());
        assert_eq!(a.deadline(), Some(10 * MS));
        assert_eq!(a.on_time(5 * MS), Alignment::Wait);
        assert!(a.is_blocked(0));
        assert_eq!(a.on_time(10 * MS), snapshot(1, 10, true));
        assert!(!a.is_blocked(0));
        assert_eq!(a.deadline(), None);
        assert_eq!(
            a.channel_state().map(|s| s.recording),
            Some(vec![false, true, true])
        );
        // Snapshotted once only.
        assert_eq!(a.on_time(20 * MS), Alignment::Wait);
        assert!(a.on_barrier(1, 1, 21 * MS).is_empty());
        assert!(a.on_barrier(2, 1, 22 * MS).is_empty());
        assert_eq!(a.current(), None);
        // A quick alignment stays aligned.
        assert!(a.on_barrier(2, 2, 30 * MS).is_empty());
        assert_eq!(a.on_barrier(0, 2, 31 * MS), Vec::new());
        assert_eq!(a.on_barrier(1, 2, 32 * MS), [snapshot(2, 2, false)]);
    }

    /// An announced aligned barrier times out from its announcement, not from its
    /// arrival: stuck behind a queue, it switches to unaligned before any barrier came,
    /// and every channel is recorded until its barrier does. One that arrives in time
    /// is aligned as usual, its timeout still counted from the announcement.
    #[test]
    fn an_announced_barrier_times_out_before_it_arrives() {
        let timeout = AlignmentMode::AlignedWithTimeout(Duration::from_millis(10));
        let mut a = BarrierAligner::new(2, timeout);
        assert_eq!(a.deadline(), None);
        a.on_aligned_announcement(1, 0);
        assert!(a.is_active());
        // A repeated announcement does not restart the clock.
        a.on_aligned_announcement(1, 4 * MS);
        assert_eq!(a.deadline(), Some(10 * MS));
        assert_eq!(a.on_time(9 * MS), Alignment::Wait);
        assert_eq!(a.on_time(10 * MS), snapshot(1, 0, true));
        assert_eq!(
            a.channel_state().map(|s| s.recording),
            Some(vec![true, true])
        );
        assert_eq!(a.deadline(), None);
        assert!(a.on_barrier(1, 1, 30 * MS).is_empty());
        assert!(a.on_barrier(0, 1, 31 * MS).is_empty());
        assert!(!a.is_active() && a.channel_state().is_none());
        // Announced, then its first barrier: the deadline stays the announcement's.
        a.on_aligned_announcement(2, 40 * MS);
        assert!(a.on_barrier(0, 2, 45 * MS).is_empty());
        assert_eq!(a.deadline(), Some(50 * MS));
        assert_eq!(a.on_barrier(1, 2, 48 * MS), [snapshot(2, 3, false)]);
        assert!(!a.is_active());
        // Late or repeated announcements of a checkpoint done here are ignored.
        a.on_aligned_announcement(2, 60 * MS);
        a.on_aligned_announcement(1, 60 * MS);
        assert!(!a.is_active() && a.deadline().is_none());
        // Without the timeout mode, announcements change nothing.
        let mut aligned = BarrierAligner::new(1, AlignmentMode::Aligned);
        aligned.on_aligned_announcement(1, 0);
        assert!(!aligned.is_active());
        assert_eq!(aligned.on_time(u64::MAX), Alignment::Wait);
    }

    /// A newer barrier during an alignment aborts the older checkpoint here; the older
    /// one's late barriers are ignored.
    #[test]
    fn a_newer_barrier_aborts_the_alignment_of_an_older_one() {
        let mut a = BarrierAligner::new(2, AlignmentMode::Aligned);
        assert!(a.on_barrier(0, 1, 0).is_empty());
        let out = a.on_barrier(1, 2, MS);
        assert!(
            matches!(&out[..], [Alignment::Abort { id: 1, .. }]),
            "{out:?}"
        );
        assert!(a.is_blocked(1) && !a.is_blocked(0));
        assert!(a.on_barrier(1, 1, 2 * MS).is_empty());
        assert_eq!(a.on_barrier(0, 2, 3 * MS), [snapshot(2, 2, false)]);
        assert!(a.on_barrier(0, 1, 4 * MS).is_empty());
        assert!(a.on_barrier(0, 2, 4 * MS).is_empty());
        assert_eq!(a.current(), None);
    }

    /// With one channel, a barrier is a snapshot at once; an ended channel counts as
    /// having delivered every barrier, also when it ends during an alignment.
    #[test]
    fn ended_channels_count_as_aligned() {
        let mut one = BarrierAligner::new(1, AlignmentMode::Aligned);
        assert_eq!(one.on_barrier(0, 3, 7), [snapshot(3, 0, false)]);
        let mut a = BarrierAligner::new(3, AlignmentMode::Aligned);
        assert_eq!(a.on_end_of_channel(2, 0), Alignment::Wait);
        assert!(a.on_barrier(0, 1, 0).is_empty());
        assert_eq!(a.on_barrier(1, 1, MS), [snapshot(1, 1, false)]);
        assert!(a.on_barrier(0, 2, 2 * MS).is_empty());
        assert_eq!(a.on_end_of_channel(1, 5 * MS), snapshot(2, 3, false));
        assert!(!a.is_blocked(0));
    }

    /// Over any order of barriers of increasing checkpoints on three channels, each
    /// checkpoint is snapshotted at most once, never after it was aborted, and every
    /// checkpoint whose barriers all came in order is snapshotted.
    #[test]
    fn every_checkpoint_is_snapshotted_once_or_aborted() {
        use proptest::prelude::*;
        proptest!(|(orders in proptest::collection::vec(Just(vec![0usize, 1, 2]).prop_shuffle(), 1..6))| {
            for mode in [AlignmentMode::Aligned, AlignmentMode::Unaligned] {
                let mut a = BarrierAligner::new(3, mode);
                let mut now = 0;
                for (i, order) in orders.iter().enumerate() {
                    let id = i as u64 + 1;
                    let mut snapshots = 0;
                    for &channel in order {
                        now += MS;
                        for outcome in a.on_barrier(channel, id, now) {
                            match outcome {
                                Alignment::Snapshot { id: s, .. } => {
                                    prop_assert_eq!(s, id);
                                    snapshots += 1;
                                }
                                other => prop_assert!(false, "{:?}", other),
                            }
                        }
                    }
                    prop_assert_eq!(snapshots, 1);
                    prop_assert!((0..3).all(|c| !a.is_blocked(c)));
                }
            }
        });
    }
}
