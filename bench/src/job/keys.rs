//! Keys: their distributions (uniform, Zipf) and the lookup cache's settings.

use super::*;

use std::sync::Arc;
use std::time::Duration;

use weir_engine::async_io::LookupCache;

/// Why `weir run` cannot run, or why its job stopped: each message says what to change.
/// How keys are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyDistribution {
    /// Uniform over `0..keys`.
    Uniform {
        /// Distinct keys.
        keys: u64,
    },
    /// `hot_fraction` of records use the first `hot_keys` keys, the rest are uniform.
    Skewed {
        /// Distinct keys.
        keys: u64,
        /// Keys that are hot.
        hot_keys: u64,
        /// Share of records on hot keys.
        hot_fraction: f64,
    },
    /// Zipf over `0..keys`: key `k` drawn with weight `1 / (k + 1)^s` (`--key-distribution
    /// zipf:<s>`).
    Zipf(Zipf),
}

/// A Zipf distribution over `0..keys`, sampled without a table by rejection-inversion
/// (the algorithm of `rand_distr`'s `Zipf`; the job draws from its own xorshift, not
/// `rand`): a table of cumulative weights would be 8 bytes per key per source subtask.
/// A draw takes about 1.1 tries on average, each two uniform numbers and two `powf`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Zipf {
    pub(crate) keys: f64,
    pub(crate) exponent: f64,
    /// The bound's total mass and `1 / (1 - s)` (0 at `s = 1`).
    pub(crate) t: f64,
    pub(crate) q: f64,
}

impl Zipf {
    /// Zipf over `0..keys` (at least one) with exponent `exponent` (positive, finite).
    pub fn new(keys: u64, exponent: f64) -> Result<Self, String> {
        if keys == 0 || !(exponent > 0.0 && exponent.is_finite()) {
            return Err(format!(
                "zipf needs keys >= 1 and a positive exponent (got {keys} keys, exponent \
                 {exponent}); write e.g. zipf:1.1"
            ));
        }
        let n = keys as f64;
        let (t, q) = if exponent == 1.0 {
            (1.0 + n.ln(), 0.0)
        } else {
            let q = 1.0 / (1.0 - exponent);
            ((n.powf(1.0 - exponent) - exponent) * q, q)
        };
        Ok(Zipf {
            keys: n,
            exponent,
            t,
            q,
        })
    }

    /// A key: `first` and as many further draws of `random` (uniform `u64`s) as it takes.
    pub fn sample(&self, first: u64, mut random: impl FnMut() -> u64) -> u64 {
        let unit = |r: u64| (r >> 11) as f64 / (1u64 << 53) as f64;
        let s = self.exponent;
        let mut r = first;
        loop {
            // The inverse of the bound's cumulative mass, at a uniform point.
            let pt = unit(r) * self.t;
            let inv_b = if pt <= 1.0 {
                pt
            } else if s != 1.0 {
                (pt * (1.0 - s) + s).powf(self.q)
            } else {
                (pt - 1.0).exp()
            };
            let x = (inv_b + 1.0).floor();
            let mut ratio = x.powf(-s);
            if x > 1.0 {
                ratio *= inv_b.powf(s);
            }
            if unit(random()) < ratio {
                return (x.min(self.keys) as u64).max(1) - 1;
            }
            r = random();
        }
    }
}

/// `weir run --cache rows=<n>[,write=<dur>][,access=<dur>][,missing=on|off]`: a lookup
/// cache per async subtask (Flink's `PARTIAL` lookup cache; see
/// [`LookupCache`]). The job's lookups always yield one result (a missing key an empty
/// value), so `missing` changes nothing here; it is accepted for the flag's sake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSettings {
    /// Rows per subtask (least recently used evicted).
    pub rows_max: usize,
    /// Rows expire this long after they were stored.
    pub expire_after_write: Option<Duration>,
    /// Rows expire this long after they were stored or last hit.
    pub expire_after_access: Option<Duration>,
    /// Cache lookups that found nothing.
    pub cache_missing_key: bool,
}

impl std::str::FromStr for CacheSettings {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let mut cache = CacheSettings {
            rows_max: 0,
            expire_after_write: None,
            expire_after_access: None,
            cache_missing_key: true,
        };
        let usage = "write rows=<n>[,write=<duration>][,access=<duration>][,missing=on|off]";
        for part in text.split(',') {
            let duration = |v: &str| match weir_net::lookup::parse_duration(v) {
                Ok(d) if !d.is_zero() => Ok(Some(d)),
                _ => Err(format!("{part:?}: expected a positive duration, e.g. 10s")),
            };
            match part.split_once('=') {
                Some(("rows", v)) => {
                    cache.rows_max = v
                        .parse()
                        .map_err(|_| format!("{part:?}: expected a row count"))?
                }
                Some(("write", v)) => cache.expire_after_write = duration(v)?,
                Some(("access", v)) => cache.expire_after_access = duration(v)?,
                Some(("missing", "on")) => cache.cache_missing_key = true,
                Some(("missing", "off")) => cache.cache_missing_key = false,
                _ => return Err(format!("{part:?} is not a cache setting; {usage}")),
            }
        }
        if cache.rows_max == 0 {
            return Err(format!("the cache needs rows=<n> with n >= 1; {usage}"));
        }
        Ok(cache)
    }
}

impl CacheSettings {
    /// The operator's cache: keyed by the record's key; a hit is the record with the
    /// cached value (its own id and creation time).
    pub(crate) fn lookup_cache(&self) -> LookupCache<Lookup, u64, Enriched> {
        let mut cache = LookupCache::new(self.rows_max, |input: &Lookup| input.0.key)
            .with_cache_missing_key(self.cache_missing_key)
            .with_join(|input: &Lookup, cached: &Enriched| Enriched {
                id: input.0.id,
                key: input.0.key,
                created_ns: input.0.created_ns,
                value: cached.value.clone(),
            });
        if let Some(after) = self.expire_after_write {
            cache = cache.with_expire_after_write(after);
        }
        if let Some(after) = self.expire_after_access {
            cache = cache.with_expire_after_access(after);
        }
        cache
    }
}

/// Makes subtask `i` of `n`'s key iterator on its worker's thread (an iterator source).
pub type KeyIterFactory = Arc<dyn Fn(usize, usize) -> Box<dyn Iterator<Item = u64>> + Send + Sync>;

/// Where a collecting sink puts every record it receives (for tests).
pub type Collected<T> = Arc<std::sync::Mutex<Vec<T>>>;

impl KeyDistribution {
    /// A key from the uniform `u64` `first` and as many further draws of `random` as
    /// it takes (Zipf may need more).
    pub fn draw(&self, first: u64, random: impl FnMut() -> u64) -> u64 {
        match *self {
            KeyDistribution::Zipf(zipf) => zipf.sample(first, random),
            KeyDistribution::Uniform { keys } => first % keys.max(1),
            KeyDistribution::Skewed {
                keys,
                hot_keys,
                hot_fraction,
            } => {
                let unit = (first >> 11) as f64 / (1u64 << 53) as f64;
                let r2 = first.rotate_left(32);
                if unit < hot_fraction {
                    r2 % hot_keys.max(1)
                } else {
                    r2 % keys.max(1)
                }
            }
        }
    }
}

/// xorshift64*: the generator's and the stream producer's random numbers.
pub fn xorshift64star(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// Seed of the key sampling.
pub const SEED: u64 = 42;
