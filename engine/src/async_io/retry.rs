//! Retry strategies: how often and how long after a failed attempt to call again.

use std::sync::Arc;
use std::time::Duration;

use super::AsyncError;
use crate::error::ConfigError;

type ErrorPredicate = Arc<dyn Fn(&AsyncError) -> bool + Send + Sync>;
type ResultPredicate<T> = Arc<dyn Fn(&[T]) -> bool + Send + Sync>;

#[derive(Debug, Clone, Copy)]
enum Backoff {
    Fixed(Duration),
    Exponential {
        initial: Duration,
        max_delay: Duration,
        multiplier: f64,
    },
}

/// When to call again, and after what delay.
///
/// `max_attempts` counts every invocation, the first included (so 1 means no retry).
/// Which outcomes are retried, as in Flink's `AsyncRetryStrategies`: nothing unless a
/// predicate says so. An error is retried only under [`retry_on_error`] (or
/// [`retry_on_any_error`], the explicit retry-all), a result only under
/// [`retry_on_result`]; a strategy with neither never retries. A timeout is never
/// retried: the timeout covers every attempt. When attempts run out, the last result or
/// error stands.
/// A retry's delay counts from when the failed attempt's outcome was processed.
///
/// [`retry_on_error`]: RetryStrategy::retry_on_error
/// [`retry_on_any_error`]: RetryStrategy::retry_on_any_error
/// [`retry_on_result`]: RetryStrategy::retry_on_result
pub struct RetryStrategy<T> {
    max_attempts: u32,
    backoff: Backoff,
    on_error: Option<ErrorPredicate>,
    on_result: Option<ResultPredicate<T>>,
}

impl<T> RetryStrategy<T> {
    /// Up to `max_attempts` invocations, `delay` apart.
    pub fn fixed_delay(max_attempts: u32, delay: Duration) -> Self {
        RetryStrategy {
            max_attempts,
            backoff: Backoff::Fixed(delay),
            on_error: None,
            on_result: None,
        }
    }

    /// Up to `max_attempts` invocations; the n-th retry waits
    /// `min(initial × multiplier^(n-1), max_delay)`.
    pub fn exponential_backoff(
        max_attempts: u32,
        initial: Duration,
        max_delay: Duration,
        multiplier: f64,
    ) -> Self {
        RetryStrategy {
            max_attempts,
            backoff: Backoff::Exponential {
                initial,
                max_delay,
                multiplier,
            },
            on_error: None,
            on_result: None,
        }
    }

    /// Retries only the errors for which `predicate` holds.
    pub fn retry_on_error(
        mut self,
        predicate: impl Fn(&AsyncError) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.on_error = Some(Arc::new(predicate));
        self
    }

    /// Retries every error (but a timeout): the explicit retry-all.
    pub fn retry_on_any_error(self) -> Self {
        self.retry_on_error(|_| true)
    }

    /// Retries the results for which `predicate` holds (e.g. `|r| r.is_empty()`).
    pub fn retry_on_result(
        mut self,
        predicate: impl Fn(&[T]) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.on_result = Some(Arc::new(predicate));
        self
    }

    /// Invocations allowed, the first included.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The delay before the `retry`-th retry (1-based).
    pub fn delay(&self, retry: u32) -> Duration {
        match self.backoff {
            Backoff::Fixed(delay) => delay,
            Backoff::Exponential {
                initial,
                max_delay,
                multiplier,
            } => {
                let factor = multiplier.powi(retry.saturating_sub(1).min(i32::MAX as u32) as i32);
                // Rounded, not truncated: `powi` is not exact everywhere (Miri, other
                // platforms), and 40 ms must not come out as 39.999999 ms.
                let nanos = (initial.as_nanos() as f64 * factor).round();
                if !nanos.is_finite() || nanos >= max_delay.as_nanos() as f64 {
                    max_delay
                } else {
                    Duration::from_nanos(nanos as u64)
                }
            }
        }
    }

    pub(crate) fn should_retry_error(&self, error: &AsyncError) -> bool {
        if matches!(error, AsyncError::Timeout) {
            return false;
        }
        self.on_error.as_ref().is_some_and(|p| p(error))
    }

    pub(crate) fn should_retry_result(&self, results: &[T]) -> bool {
        self.on_result.as_ref().is_some_and(|p| p(results))
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_attempts == 0 {
            return Err(ConfigError::ZeroCapacity {
                what: "retry max_attempts (it counts the first call)",
            });
        }
        if let Backoff::Exponential {
            initial,
            max_delay,
            multiplier,
        } = self.backoff
        {
            if !(multiplier.is_finite() && multiplier >= 1.0) {
                return Err(ConfigError::Inconsistent(
                    "exponential backoff multiplier must be a finite number >= 1.0",
                ));
            }
            if initial > max_delay {
                return Err(ConfigError::Inconsistent(
                    "exponential backoff initial delay must not exceed max_delay",
                ));
            }
        }
        Ok(())
    }
}

impl<T> Clone for RetryStrategy<T> {
    fn clone(&self) -> Self {
        RetryStrategy {
            max_attempts: self.max_attempts,
            backoff: self.backoff,
            on_error: self.on_error.clone(),
            on_result: self.on_result.clone(),
        }
    }
}

impl<T> core::fmt::Debug for RetryStrategy<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RetryStrategy")
            .field("max_attempts", &self.max_attempts)
            .field("backoff", &self.backoff)
            .field("retry_on_error", &self.on_error.is_some())
            .field("retry_on_result", &self.on_result.is_some())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn exponential_delay_is_capped() {
        let ms = Duration::from_millis;
        let strategy = RetryStrategy::<()>::exponential_backoff(10, ms(10), ms(100), 2.0);
        let delays: Vec<Duration> = (1..=6).map(|n| strategy.delay(n)).collect();
        assert_eq!(
            delays,
            vec![ms(10), ms(20), ms(40), ms(80), ms(100), ms(100)]
        );
        assert_eq!(strategy.delay(u32::MAX), ms(100));
    }

    #[test]
    fn invalid_strategies_are_config_errors() {
        let ms = Duration::from_millis;
        assert!(RetryStrategy::<()>::fixed_delay(0, ms(1))
            .validate()
            .is_err());
        assert!(
            RetryStrategy::<()>::exponential_backoff(3, ms(1), ms(10), 0.5)
                .validate()
                .is_err()
        );
        assert!(
            RetryStrategy::<()>::exponential_backoff(3, ms(1), ms(10), f64::NAN)
                .validate()
                .is_err()
        );
        assert!(
            RetryStrategy::<()>::exponential_backoff(3, ms(20), ms(10), 2.0)
                .validate()
                .is_err()
        );
    }
}
