//! Latency distributions of the lookup service, and the small deterministic random
//! number generator that samples them and the fault injection.

use std::str::FromStr;
use std::time::Duration;

/// How long the service waits before answering a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Latency {
    /// Always the same.
    Fixed(Duration),
    /// Uniform between two bounds.
    Uniform(Duration, Duration),
    /// Log-normal with this median and shape σ (σ of the underlying normal): a long
    /// tail, as real services have.
    LogNormal {
        /// The median.
        median: Duration,
        /// Tail heaviness (0.5: p99 ≈ 3.2 × median).
        sigma: f64,
    },
}

impl Latency {
    /// Draws one latency.
    pub fn sample(&self, rng: &mut Rng) -> Duration {
        match *self {
            Latency::Fixed(d) => d,
            Latency::Uniform(low, high) => {
                let span = high.saturating_sub(low).as_nanos() as f64;
                low + Duration::from_nanos((rng.next_f64() * span) as u64)
            }
            Latency::LogNormal { median, sigma } => {
                let z = rng.next_normal();
                let nanos = median.as_nanos() as f64 * (sigma * z).exp();
                Duration::from_nanos(nanos.min(60e9) as u64)
            }
        }
    }

    /// The mean, for Little's law.
    pub fn mean(&self) -> Duration {
        match *self {
            Latency::Fixed(d) => d,
            Latency::Uniform(low, high) => (low + high) / 2,
            Latency::LogNormal { median, sigma } => Duration::from_nanos(
                (median.as_nanos() as f64 * (sigma * sigma / 2.0).exp()) as u64,
            ),
        }
    }
}

/// Parses `250us`, `1ms`, `1.5ms`, `2s`, `100ns`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    // Zero is zero in any unit ("--buffer-timeout 0": flush every record).
    if text.parse::<f64>() == Ok(0.0) {
        return Ok(Duration::ZERO);
    }
    let (number, unit) = text
        .find(|c: char| c.is_ascii_alphabetic())
        .map(|i| text.split_at(i))
        .ok_or_else(|| format!("{text:?} has no unit; use ns, us, ms or s"))?;
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{number:?} is not a number"))?;
    if !(value.is_finite() && value >= 0.0) {
        return Err(format!("{text:?} must be a non-negative duration"));
    }
    let nanos = match unit {
        "ns" => value,
        "us" | "µs" => value * 1e3,
        "ms" => value * 1e6,
        "s" => value * 1e9,
        other => return Err(format!("unknown unit {other:?}; use ns, us, ms or s")),
    };
    Ok(Duration::from_nanos(nanos as u64))
}

/// Writes a duration the way [`parse_duration`] reads it, in its largest whole unit
/// with at most three decimals: `1ms`, `500us`, `1.5s`, `333.333ms`, `0s`.
pub fn format_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos() as f64;
    let (value, unit) = if duration.is_zero() {
        (0.0, "s")
    } else if nanos >= 1e9 {
        (nanos / 1e9, "s")
    } else if nanos >= 1e6 {
        (nanos / 1e6, "ms")
    } else if nanos >= 1e3 {
        (nanos / 1e3, "us")
    } else {
        (nanos, "ns")
    };
    let text = format!("{value:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}{unit}")
}

impl std::fmt::Display for Latency {
    /// As `--latency` takes it: `fixed:1ms`, `uniform:500us..2ms`, `lognormal:1ms,0.5`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Latency::Fixed(d) => write!(f, "fixed:{}", format_duration(d)),
            Latency::Uniform(low, high) => write!(
                f,
                "uniform:{}..{}",
                format_duration(low),
                format_duration(high)
            ),
            Latency::LogNormal { median, sigma } => {
                write!(f, "lognormal:{},{sigma}", format_duration(median))
            }
        }
    }
}

impl FromStr for Latency {
    type Err = String;

    /// `fixed:1ms`, `uniform:500us..2ms`, `lognormal:1ms,0.5` (median, σ).
    fn from_str(text: &str) -> Result<Self, String> {
        let (kind, rest) = text.split_once(':').ok_or_else(|| {
            format!("{text:?}: expected fixed:<d>, uniform:<d>..<d> or lognormal:<median>,<sigma>")
        })?;
        match kind {
            "fixed" => Ok(Latency::Fixed(parse_duration(rest)?)),
            "uniform" => {
                let (low, high) = rest.split_once("..").ok_or("uniform needs low..high")?;
                let (low, high) = (parse_duration(low)?, parse_duration(high)?);
                if low > high {
                    return Err(format!(
                        "uniform bounds out of order: {} > {}",
                        format_duration(low),
                        format_duration(high)
                    ));
                }
                Ok(Latency::Uniform(low, high))
            }
            "lognormal" => {
                let (median, sigma) = rest.split_once(',').ok_or("lognormal needs median,sigma")?;
                let sigma: f64 = sigma
                    .trim()
                    .parse()
                    .map_err(|_| format!("sigma {sigma:?} is not a number"))?;
                if !(sigma.is_finite() && (0.0..=4.0).contains(&sigma)) {
                    return Err(format!("sigma {sigma} outside 0..=4"));
                }
                Ok(Latency::LogNormal {
                    median: parse_duration(median)?,
                    sigma,
                })
            }
            other => Err(format!(
                "unknown latency kind {other:?}; use fixed, uniform or lognormal"
            )),
        }
    }
}

/// xorshift64*: deterministic from its seed, fast, good enough for load generation.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is remapped).
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub fn next_normal(&mut self) -> f64 {
        let u1 = self.next_f64().max(f64::MIN_POSITIVE);
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// True with probability `p`.
    #[inline]
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.next_f64() < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_needs_no_unit_and_other_numbers_do() {
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0.0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0ms"), Ok(Duration::ZERO));
        assert!(parse_duration("5").unwrap_err().contains("no unit"));
    }

    #[test]
    fn parses_latency_specs() {
        assert_eq!(
            "fixed:1ms".parse::<Latency>().unwrap(),
            Latency::Fixed(Duration::from_millis(1))
        );
        assert_eq!(
            "uniform:500us..2ms".parse::<Latency>().unwrap(),
            Latency::Uniform(Duration::from_micros(500), Duration::from_millis(2))
        );
        assert!(matches!(
            "lognormal:1ms,0.5".parse::<Latency>().unwrap(),
            Latency::LogNormal { .. }
        ));
        for bad in [
            "1ms",
            "fixed:",
            "fixed:1",
            "uniform:2ms..1ms",
            "lognormal:1ms,-1",
            "gamma:1ms",
        ] {
            assert!(bad.parse::<Latency>().is_err(), "{bad}");
        }
    }

    #[test]
    fn latencies_print_as_they_are_written() {
        for text in [
            "fixed:1ms",
            "uniform:500us..2ms",
            "lognormal:1ms,0.5",
            "fixed:0s",
        ] {
            assert_eq!(text.parse::<Latency>().unwrap().to_string(), text);
        }
        assert_eq!(format_duration(Duration::from_secs(1) / 3), "333.333ms");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_nanos(100)), "100ns");
    }

    #[test]
    fn lognormal_median_is_the_median() {
        let latency = Latency::LogNormal {
            median: Duration::from_millis(1),
            sigma: 0.5,
        };
        let mut rng = Rng::new(7);
        let mut samples: Vec<Duration> = (0..10_001).map(|_| latency.sample(&mut rng)).collect();
        samples.sort();
        let median = samples[5_000].as_micros();
        assert!((900..1100).contains(&median), "median {median} µs");
    }
}
