//! Buffer debloating (Flink's `taskmanager.network.memory.buffer-debloat.*`): the
//! input gate measures how fast it consumes and asks its producers for buffers small
//! enough that the data in flight takes about a target time to consume.
//!
//! Each period the gate's [`Debloater`] takes the bytes consumed and the time the gate
//! was busy (the period less its idle time, so a consumer waiting for input is not
//! mistaken for a slow one, as Flink's throughput calculator pauses while idle), and
//! computes:
//!
//! ```text
//! throughput   = bytes ÷ busy time
//! desired size = min(throughput × target ÷ (channels × buffers per channel), 2 × size)
//! size         = size + α (desired size − size),   α = 2 ÷ (samples + 1)
//! ```
//!
//! clamped to `[min_size, max_size]`, and announces the size to every channel only when
//! it moved more than `threshold_percent` from the last announcement (no flapping), or
//! reached a bound. As in Flink, the size starts at `starting_size` (Flink's
//! `taskmanager.memory.starting-segment-size`, 1 KiB), announced at the gate's first
//! poll, so producers start small and the size grows to what the throughput asks for;
//! the cap at twice the size makes it grow as fast as it shrinks (a step moves it by at
//! most α of its size either way), so one burst cannot jump it from the minimum to the
//! segment. The buffers the target is spread over are the channels' capacity (Flink
//! counts the buffers in use, which is that capacity under back-pressure, when
//! debloating matters).
//! A channel passes the announcement to its producer, which caps the buffers it *starts*
//! at that size (see `partition`): with `buffers per channel` buffers in flight per
//! channel, the bytes in flight then take about `target` to consume, so an in-band event
//! (a checkpoint barrier, a watermark) waits about that long behind them instead of
//! behind full segments.
//!
//! Debloating is off unless the gate is given a [`DebloatConfig`]: smaller buffers mean
//! more publications and notifications per byte, which a consumer that keeps up does
//! not need (Flink ships it off by default too).

use std::time::Duration;

use crate::error::DebloatError;
use crate::limits::SEGMENT_SIZE_DEFAULT;

/// Flink's `taskmanager.memory.starting-segment-size`: where debloated buffers start.
pub const STARTING_SIZE_DEFAULT: usize = 1024;

/// Debloating settings, with Flink's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DebloatConfig {
    /// How long the data in flight should take to consume
    /// (`buffer-debloat.target`, default 1 s).
    pub target: Duration,
    /// How often the size is recomputed (`buffer-debloat.period`, default 200 ms).
    pub period: Duration,
    /// Periods the size is smoothed over (`buffer-debloat.samples`, default 20).
    pub samples: u32,
    /// Smallest size announced (`memory.min-segment-size`, default 256 bytes).
    pub min_size: usize,
    /// Largest size announced: the segment size (default 32 KiB).
    pub max_size: usize,
    /// The size announced at the start, before anything was measured
    /// (`taskmanager.memory.starting-segment-size`, default 1 KiB; within
    /// `[min_size, max_size]`).
    pub starting_size: usize,
    /// Change, in percent of the last announced size, below which nothing is announced
    /// (`buffer-debloat.threshold-percentages`, default 25).
    pub threshold_percent: u32,
    /// Buffers one channel's producer may have in flight: the size is the target bytes
    /// divided among them.
    pub buffers_per_channel: usize,
}

impl DebloatConfig {
    /// Flink's defaults for channels of `buffers_per_channel` buffers in flight.
    pub fn new(buffers_per_channel: usize) -> Self {
        DebloatConfig {
            target: Duration::from_secs(1),
            period: Duration::from_millis(200),
            samples: 20,
            min_size: 256,
            max_size: SEGMENT_SIZE_DEFAULT,
            starting_size: STARTING_SIZE_DEFAULT,
            threshold_percent: 25,
            buffers_per_channel,
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), DebloatError> {
        if self.target.is_zero() {
            return Err(DebloatError::ZeroTarget);
        }
        if self.period.is_zero() {
            return Err(DebloatError::ZeroPeriod);
        }
        if self.samples == 0 {
            return Err(DebloatError::ZeroSamples);
        }
        if self.buffers_per_channel == 0 {
            return Err(DebloatError::ZeroBuffers);
        }
        if self.min_size == 0 {
            return Err(DebloatError::ZeroMinSize);
        }
        if self.min_size > self.max_size {
            return Err(DebloatError::MinAboveMax {
                min: self.min_size,
                max: self.max_size,
            });
        }
        if self.starting_size < self.min_size || self.starting_size > self.max_size {
            return Err(DebloatError::StartingOutside {
                starting: self.starting_size,
                min: self.min_size,
                max: self.max_size,
            });
        }
        if self.max_size > u32::MAX as usize {
            return Err(DebloatError::MaxTooLarge { max: self.max_size });
        }
        if self.threshold_percent >= 100 {
            return Err(DebloatError::Threshold {
                percent: self.threshold_percent,
            });
        }
        Ok(())
    }
}

/// The size in bytes per buffer that makes `buffers` buffers hold `target` worth of
/// data at `throughput` bytes per second (not clamped).
pub fn desired_size(throughput_bytes_per_s: f64, target: Duration, buffers: usize) -> f64 {
    throughput_bytes_per_s * target.as_secs_f64() / buffers.max(1) as f64
}

/// Whether `size` differs from `announced` by more than `threshold_percent` of it.
pub fn beyond_threshold(size: usize, announced: usize, threshold_percent: u32) -> bool {
    let change = size.abs_diff(announced) as u128 * 100;
    change > announced as u128 * threshold_percent as u128
}

/// The gate's debloater: one per gate, driven by the gate's clock.
#[derive(Debug, Clone)]
pub struct Debloater {
    config: DebloatConfig,
    period_ns: u64,
    alpha: f64,
    /// Start of the current period, and the gate's counters then.
    period_start_ns: Option<u64>,
    bytes_at_start: u64,
    idle_at_start_ns: u64,
    /// The smoothed size.
    size: f64,
    announced: usize,
    throughput_bytes_per_s: f64,
}

impl Debloater {
    /// A debloater starting from `config.starting_size`, which its first period
    /// announces (unless it is the maximum: what producers start with anyway).
    pub fn new(config: DebloatConfig) -> Result<Self, DebloatError> {
        config.validate()?;
        Ok(Debloater {
            config,
            period_ns: config.period.as_nanos().min(u128::from(u64::MAX)) as u64,
            alpha: 2.0 / (f64::from(config.samples) + 1.0),
            period_start_ns: None,
            bytes_at_start: 0,
            idle_at_start_ns: 0,
            size: config.starting_size as f64,
            announced: config.max_size,
            throughput_bytes_per_s: 0.0,
        })
    }

    /// The settings.
    pub fn config(&self) -> &DebloatConfig {
        &self.config
    }

    /// The size last announced.
    pub fn announced(&self) -> usize {
        self.announced
    }

    /// The throughput measured over the last period, in bytes per second of busy time.
    pub fn throughput_bytes_per_s(&self) -> f64 {
        self.throughput_bytes_per_s
    }

    /// Whether the current period ends at `now_ns` (a compare: called on every poll).
    #[inline]
    pub fn is_due(&self, now_ns: u64) -> bool {
        self.period_start_ns
            .is_none_or(|start| now_ns.saturating_sub(start) >= self.period_ns)
    }

    /// Ends the period at `now_ns` given the gate's totals so far (bytes consumed, idle
    /// nanoseconds) over `channels` channels; returns the size to announce, if it moved
    /// beyond the threshold.
    pub fn on_period(
        &mut self,
        now_ns: u64,
        bytes_total: u64,
        idle_total_ns: u64,
        channels: usize,
    ) -> Option<usize> {
        let Some(start) = self.period_start_ns else {
            self.start_period(now_ns, bytes_total, idle_total_ns);
            // The starting size, for the buffers producers start from now on.
            let starting = self.config.starting_size;
            if starting != self.announced {
                self.announced = starting;
                return Some(starting);
            }
            return None;
        };
        let elapsed = now_ns.saturating_sub(start);
        let idle = idle_total_ns
            .saturating_sub(self.idle_at_start_ns)
            .min(elapsed);
        // At least a tenth of the period counts as busy, so a gate idle all period long
        // (and the few bytes it read) does not measure an absurd throughput.
        let busy = (elapsed - idle).max(elapsed / 10).max(1);
        let bytes = bytes_total.saturating_sub(self.bytes_at_start);
        self.start_period(now_ns, bytes_total, idle_total_ns);
        self.throughput_bytes_per_s = bytes as f64 * 1e9 / busy as f64;
        let buffers = channels
            .max(1)
            .saturating_mul(self.config.buffers_per_channel);
        let desired = desired_size(self.throughput_bytes_per_s, self.config.target, buffers)
            .min(2.0 * self.size);
        self.size += self.alpha * (desired - self.size);
        let min = self.config.min_size as f64;
        let max = self.config.max_size as f64;
        self.size = self.size.clamp(min, max);
        let size = self.size.round() as usize;
        let at_bound = size <= self.config.min_size || size >= self.config.max_size;
        if size != self.announced
            && (at_bound || beyond_threshold(size, self.announced, self.config.threshold_percent))
        {
            self.announced = size;
            Some(size)
        } else {
            None
        }
    }

    fn start_period(&mut self, now_ns: u64, bytes_total: u64, idle_total_ns: u64) {
        self.period_start_ns = Some(now_ns);
        self.bytes_at_start = bytes_total;
        self.idle_at_start_ns = idle_total_ns;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Starting at the maximum, as the tests of the formula assume.
    fn config() -> DebloatConfig {
        DebloatConfig {
            samples: 1,
            starting_size: SEGMENT_SIZE_DEFAULT,
            ..DebloatConfig::new(4)
        }
    }

    #[test]
    fn desired_size_spreads_the_target_over_the_buffers() {
        // 1 MB/s for 1 s over 4 buffers: 250 kB each.
        assert_eq!(desired_size(1e6, Duration::from_secs(1), 4), 250_000.0);
        assert_eq!(desired_size(1e6, Duration::from_millis(100), 10), 10_000.0);
        assert_eq!(
            desired_size(1e6, Duration::from_secs(1), 0),
            1e6,
            "no division by 0"
        );
    }

    #[test]
    fn threshold_blocks_small_changes() {
        assert!(!beyond_threshold(1000, 1000, 25));
        assert!(!beyond_threshold(1250, 1000, 25));
        assert!(beyond_threshold(1251, 1000, 25));
        assert!(beyond_threshold(749, 1000, 25));
        assert!(beyond_threshold(1, 0, 25));
    }

    /// One channel, 4 buffers, target 1 s, no smoothing (samples 1: α = 1): 40 kB/s
    /// consumed asks for 10 kB buffers; within the threshold nothing more is announced;
    /// a collapse of the throughput goes down to the minimum.
    #[test]
    fn sizes_follow_the_throughput_within_bounds() {
        let mut debloater = Debloater::new(config()).unwrap();
        assert!(debloater.is_due(0));
        assert_eq!(
            debloater.on_period(0, 0, 0, 1),
            None,
            "the first period starts"
        );
        assert!(!debloater.is_due(199 * MS));
        assert!(debloater.is_due(200 * MS));
        // 8 kB in 200 ms busy = 40 kB/s → 40 kB ÷ 4 buffers.
        assert_eq!(debloater.on_period(200 * MS, 8_000, 0, 1), Some(10_000));
        assert_eq!(debloater.throughput_bytes_per_s(), 40_000.0);
        // 9 kB: 11 250 bytes, within 25 % of 10 000.
        assert_eq!(debloater.on_period(400 * MS, 17_000, 0, 1), None);
        assert_eq!(debloater.announced(), 10_000);
        // Nothing consumed: the minimum.
        assert_eq!(debloater.on_period(600 * MS, 17_000, 0, 1), Some(256));
        // A fast consumer: at most twice the size per period, up to the maximum (the
        // segment size), which is announced although within the threshold of the last.
        let mut total = 17_000;
        let mut sizes = Vec::new();
        for period in 4..12 {
            total += 100_000_000;
            if let Some(size) = debloater.on_period(period * 200 * MS, total, 0, 1) {
                sizes.push(size);
            }
        }
        assert_eq!(
            sizes,
            [512, 1024, 2048, 4096, 8192, 16384, SEGMENT_SIZE_DEFAULT]
        );
    }

    /// Flink's start: the starting size announced at the first poll, then growing from
    /// there by at most α of the size per period (α = 2 ÷ 21 with 20 samples), however
    /// fast the gate reads.
    #[test]
    fn sizes_start_small_and_grow_by_part_of_the_size() {
        let mut debloater = Debloater::new(DebloatConfig {
            threshold_percent: 0,
            ..DebloatConfig::new(4)
        })
        .unwrap();
        assert_eq!(debloater.on_period(0, 0, 0, 1), Some(STARTING_SIZE_DEFAULT));
        let first = debloater.on_period(200 * MS, 1_000_000_000, 0, 1).unwrap();
        assert_eq!(first, (1024.0_f64 * (1.0 + 2.0 / 21.0)).round() as usize);
        // A starting size equal to the maximum announces nothing at first.
        let mut full = Debloater::new(config()).unwrap();
        assert_eq!(full.on_period(0, 0, 0, 1), None);
    }

    /// Idle time is not busy time: 8 kB read in the 100 ms of a 200 ms period the gate
    /// was busy is 80 kB/s.
    #[test]
    fn idle_time_does_not_count() {
        let mut debloater = Debloater::new(config()).unwrap();
        debloater.on_period(0, 0, 0, 2);
        // Two channels: 80 kB over 8 buffers.
        assert_eq!(
            debloater.on_period(200 * MS, 8_000, 100 * MS, 2),
            Some(10_000)
        );
    }

    /// Smoothing: with α = 2 ÷ (3 + 1) = ½ the size goes half way each period.
    #[test]
    fn smoothing_moves_part_of_the_way() {
        let mut debloater = Debloater::new(DebloatConfig {
            samples: 3,
            threshold_percent: 0,
            max_size: 20_000,
            starting_size: 20_000,
            ..DebloatConfig::new(1)
        })
        .unwrap();
        debloater.on_period(0, 0, 0, 1);
        // Desired 10 kB (2 kB in 200 ms, target 1 s, one buffer): 20 000 → 15 000.
        assert_eq!(debloater.on_period(200 * MS, 2_000, 0, 1), Some(15_000));
        assert_eq!(debloater.on_period(400 * MS, 4_000, 0, 1), Some(12_500));
    }

    #[test]
    fn bad_settings_are_typed_errors() {
        let base = DebloatConfig::new(4);
        let cases = [
            (
                DebloatConfig {
                    target: Duration::ZERO,
                    ..base
                },
                DebloatError::ZeroTarget,
            ),
            (
                DebloatConfig {
                    period: Duration::ZERO,
                    ..base
                },
                DebloatError::ZeroPeriod,
            ),
            (
                DebloatConfig { samples: 0, ..base },
                DebloatError::ZeroSamples,
            ),
            (
                DebloatConfig {
                    buffers_per_channel: 0,
                    ..base
                },
                DebloatError::ZeroBuffers,
            ),
            (
                DebloatConfig {
                    min_size: 0,
                    ..base
                },
                DebloatError::ZeroMinSize,
            ),
            (
                DebloatConfig {
                    min_size: 64_000,
                    ..base
                },
                DebloatError::MinAboveMax {
                    min: 64_000,
                    max: SEGMENT_SIZE_DEFAULT,
                },
            ),
            (
                DebloatConfig {
                    threshold_percent: 100,
                    ..base
                },
                DebloatError::Threshold { percent: 100 },
            ),
        ];
        for (config, expected) in cases {
            let error = Debloater::new(config).unwrap_err();
            assert_eq!(error, expected);
            assert!(!error.to_string().is_empty());
        }
        assert!(Debloater::new(base).is_ok());
    }
}
