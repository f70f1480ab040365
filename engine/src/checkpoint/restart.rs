//! Restart strategies (Flink's `restart-strategy`): after a task fails, whether the job
//! restarts from its latest completed checkpoint, and after how long.
//!
//! - [`RestartStrategy::None`]: the failure ends the job.
//! - [`RestartStrategy::FixedDelay`]: up to `attempts` restarts, `delay` apart.
//! - [`RestartStrategy::ExponentialDelay`] (Flink's default for a checkpointed job): the
//!   delay starts at `initial`, grows by `multiplier` up to `max`, with up to `jitter`
//!   (a fraction) of it added or taken at random; a job that ran `reset_after` without
//!   failing starts again at `initial`; at most `attempts` restarts in a row.
//!
//! [`Restarts`] applies a strategy to a run's failures, by the caller's clock.

use std::time::{Duration, Instant};

use super::CheckpointError;

/// How a failed job restarts; see the [module docs](self).
#[derive(Debug, Clone, PartialEq)]
pub enum RestartStrategy {
    /// No restart.
    None,
    /// Up to `attempts` restarts, `delay` apart.
    FixedDelay {
        /// Restarts at most.
        attempts: u32,
        /// Before each.
        delay: Duration,
    },
    /// Growing delays.
    ExponentialDelay {
        /// The first delay.
        initial: Duration,
        /// The longest.
        max: Duration,
        /// Each delay is the last times this.
        multiplier: f64,
        /// A run this long without failure starts again at `initial`.
        reset_after: Duration,
        /// Up to this fraction of each delay added or taken at random.
        jitter: f64,
        /// Restarts at most without a reset.
        attempts: u32,
    },
}

impl RestartStrategy {
    /// Flink's exponential-delay defaults: 1 s growing by 1.5 up to 1 min, reset after
    /// 1 h without failure, jitter 0.1, no limit on attempts.
    pub fn exponential_delay() -> Self {
        RestartStrategy::ExponentialDelay {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
            multiplier: 1.5,
            reset_after: Duration::from_secs(3600),
            jitter: 0.1,
            attempts: u32::MAX,
        }
    }

    /// Refuses settings that cannot work, saying which.
    pub fn validate(&self) -> Result<(), CheckpointError> {
        if let RestartStrategy::ExponentialDelay {
            initial,
            max,
            multiplier,
            jitter,
            ..
        } = self
        {
            if initial > max {
                return Err(CheckpointError::Config(format!(
                    "the first restart delay {initial:?} is above the longest {max:?}"
                )));
            }
            if !(*multiplier >= 1.0 && multiplier.is_finite()) {
                return Err(CheckpointError::Config(format!(
                    "the restart delay multiplier {multiplier} must be 1 or more"
                )));
            }
            if !(0.0..=1.0).contains(jitter) {
                return Err(CheckpointError::Config(format!(
                    "the restart delay jitter {jitter} must be between 0 and 1"
                )));
            }
        }
        Ok(())
    }
}

impl std::str::FromStr for RestartStrategy {
    type Err = String;

    /// `none`, `fixed-delay:<attempts>:<delay>` (e.g. `fixed-delay:3:1s`), or
    /// `exponential-delay` (Flink's defaults).
    fn from_str(text: &str) -> Result<Self, String> {
        let usage = "use none, fixed-delay:<attempts>:<delay> (e.g. fixed-delay:3:1s) or \
                     exponential-delay";
        match text {
            "none" => return Ok(RestartStrategy::None),
            "exponential-delay" => return Ok(RestartStrategy::exponential_delay()),
            _ => {}
        }
        let rest = text
            .strip_prefix("fixed-delay:")
            .ok_or_else(|| format!("unknown restart strategy {text:?}; {usage}"))?;
        let (attempts, delay) = rest
            .split_once(':')
            .ok_or_else(|| format!("{text:?} lacks the delay; {usage}"))?;
        let attempts = attempts
            .parse()
            .map_err(|_| format!("{attempts:?} is not a number of attempts; {usage}"))?;
        let delay = parse_delay(delay).ok_or_else(|| {
            format!("{delay:?} is not a delay (write e.g. 0s, 500ms, 2s); {usage}")
        })?;
        Ok(RestartStrategy::FixedDelay { attempts, delay })
    }
}

fn parse_delay(text: &str) -> Option<Duration> {
    let (number, unit) = text.split_at(text.find(|c: char| c.is_ascii_alphabetic())?);
    let value: f64 = number.parse().ok()?;
    let seconds = match unit {
        "ms" => value / 1e3,
        "s" => value,
        "min" => value * 60.0,
        _ => return None,
    };
    (seconds >= 0.0 && seconds.is_finite()).then(|| Duration::from_secs_f64(seconds))
}

/// A job's restarts under a strategy.
#[derive(Debug, Clone)]
pub struct Restarts {
    strategy: RestartStrategy,
    /// Restarts so far (since the last reset).
    attempts: u32,
    /// Restarts in all.
    total: u32,
    last_delay: Option<Duration>,
    /// When the current run started.
    started: Instant,
    rng: u64,
}

impl Restarts {
    /// Restarts of a job whose first run starts `now`.
    pub fn new(strategy: RestartStrategy, now: Instant) -> Self {
        Restarts {
            strategy,
            attempts: 0,
            total: 0,
            last_delay: None,
            started: now,
            rng: 0x9E37_79B9_7F4A_7C15,
        }
    }

    /// Restarts in all so far.
    pub fn total(&self) -> u32 {
        self.total
    }

    /// The run failed at `now`: the delay before the next run starts, or `None` when
    /// the strategy gives up (the failure ends the job). The next run counts as started
    /// once the delay has passed.
    pub fn on_failure(&mut self, now: Instant) -> Option<Duration> {
        let ran = now.saturating_duration_since(self.started);
        let delay = match &self.strategy {
            RestartStrategy::None => return None,
            RestartStrategy::FixedDelay { attempts, delay } => {
                if self.attempts >= *attempts {
                    return None;
                }
                *delay
            }
            RestartStrategy::ExponentialDelay {
                initial,
                max,
                multiplier,
                reset_after,
                jitter,
                attempts,
            } => {
                if ran >= *reset_after {
                    self.attempts = 0;
                    self.last_delay = None;
                }
                if self.attempts >= *attempts {
                    return None;
                }
                let base = match self.last_delay {
                    None => *initial,
                    Some(last) => last.mul_f64(*multiplier).min(*max),
                };
                self.last_delay = Some(base);
                // xorshift64: a factor in [1 - jitter, 1 + jitter].
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                let unit = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
                base.mul_f64(1.0 + jitter * (2.0 * unit - 1.0))
            }
        };
        self.attempts += 1;
        self.total += 1;
        self.started = now + delay;
        Some(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_delay_gives_up_after_its_attempts() {
        let now = Instant::now();
        let mut restarts = Restarts::new("fixed-delay:2:50ms".parse().unwrap(), now);
        assert_eq!(restarts.on_failure(now), Some(Duration::from_millis(50)));
        assert_eq!(restarts.on_failure(now), Some(Duration::from_millis(50)));
        assert_eq!(restarts.on_failure(now), None);
        assert_eq!(restarts.total(), 2);
    }

    #[test]
    fn exponential_delay_grows_to_its_maximum_and_resets_after_a_quiet_run() {
        let strategy = RestartStrategy::ExponentialDelay {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(3),
            multiplier: 2.0,
            reset_after: Duration::from_secs(100),
            jitter: 0.0,
            attempts: u32::MAX,
        };
        let now = Instant::now();
        let mut restarts = Restarts::new(strategy, now);
        let delays: Vec<u64> = (0..4)
            .map(|_| restarts.on_failure(now).unwrap().as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 3, 3]);
        // A run of 100 s after the last restart: back to the first delay.
        let later = now + Duration::from_secs(3 + 100);
        assert_eq!(restarts.on_failure(later), Some(Duration::from_secs(1)));
    }

    #[test]
    fn jitter_stays_within_its_fraction() {
        let now = Instant::now();
        let mut restarts = Restarts::new(RestartStrategy::exponential_delay(), now);
        let first = restarts.on_failure(now).unwrap();
        assert!(first >= Duration::from_millis(900) && first <= Duration::from_millis(1100));
    }

    #[test]
    fn bad_strategies_are_refused_with_what_to_write() {
        for text in [
            "sometimes",
            "fixed-delay:3",
            "fixed-delay:x:1s",
            "fixed-delay:3:soon",
        ] {
            let error = text.parse::<RestartStrategy>().unwrap_err();
            assert!(error.contains("fixed-delay:<attempts>:<delay>"), "{error}");
        }
        let strategy = RestartStrategy::ExponentialDelay {
            initial: Duration::from_secs(2),
            max: Duration::from_secs(1),
            multiplier: 1.5,
            reset_after: Duration::from_secs(1),
            jitter: 0.1,
            attempts: 1,
        };
        assert!(strategy.validate().is_err());
    }
}
