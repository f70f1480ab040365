//! Key groups, as Flink's `KeyGroupRangeAssignment` computes them.
//!
//! A keyed exchange does not hash keys straight onto subtasks: a key's hash code (Java's
//! `hashCode`, see [`KeyHashCode`]) is scrambled with Flink's `MathUtils.murmurHash`
//! and taken modulo the *max parallelism*, which gives its **key group**; key group
//! `g` belongs to subtask `g × parallelism ÷ max_parallelism`. Each subtask therefore
//! owns a contiguous range of key groups, and changing the parallelism (up to the max
//! parallelism) moves whole key groups between subtasks, never single keys. The
//! arithmetic is Flink's, bit for bit: the same key lands in the same key group and on
//! the same subtask index as in a Flink job with the same max parallelism and
//! parallelism.

/// The largest max parallelism (Flink's `UPPER_BOUND_MAX_PARALLELISM`, 2^15).
pub const MAX_PARALLELISM_UPPER_BOUND: usize = 1 << 15;

/// The smallest default max parallelism (Flink's `DEFAULT_LOWER_BOUND_MAX_PARALLELISM`).
pub const MAX_PARALLELISM_DEFAULT_LOWER_BOUND: usize = 1 << 7;

/// Flink's `MathUtils.bitMix`: the murmur3 finalizer.
#[inline]
fn bit_mix(mut h: i32) -> i32 {
    h ^= ((h as u32) >> 16) as i32;
    h = h.wrapping_mul(0x85eb_ca6b_u32 as i32);
    h ^= ((h as u32) >> 13) as i32;
    h = h.wrapping_mul(0xc2b2_ae35_u32 as i32);
    h ^= ((h as u32) >> 16) as i32;
    h
}

/// Flink's `MathUtils.murmurHash(int)`: murmur3 (seed 0) of one 4-byte block, made
/// non-negative (`i32::MIN` becomes 0).
#[inline]
pub fn murmur_hash(code: i32) -> i32 {
    let mut code = code.wrapping_mul(0xcc9e_2d51_u32 as i32);
    code = code.rotate_left(15);
    code = code.wrapping_mul(0x1b87_3593);
    code = code.rotate_left(13);
    code = code.wrapping_mul(5).wrapping_add(0xe654_6b64_u32 as i32);
    code ^= 4;
    code = bit_mix(code);
    if code >= 0 {
        code
    } else if code != i32::MIN {
        -code
    } else {
        0
    }
}

/// Flink's `computeKeyGroupForKeyHash`: the key group of a key whose hash code is
/// `key_hash`, in `0..max_parallelism`.
#[inline]
pub fn key_group_for_hash(key_hash: i32, max_parallelism: usize) -> usize {
    murmur_hash(key_hash) as usize % max_parallelism
}

/// Flink's `computeOperatorIndexForKeyGroup`: the subtask that owns `key_group`.
#[inline]
pub fn operator_index_for_key_group(
    max_parallelism: usize,
    parallelism: usize,
    key_group: usize,
) -> usize {
    key_group * parallelism / max_parallelism
}

/// Flink's `assignKeyToParallelOperator`: the subtask of `key`.
pub fn subtask_for_key<K: KeyHashCode + ?Sized>(
    key: &K,
    max_parallelism: usize,
    parallelism: usize,
) -> usize {
    let group = key_group_for_hash(key.hash_code(), max_parallelism);
    operator_index_for_key_group(max_parallelism, parallelism, group)
}

/// Flink's `computeDefaultMaxParallelism`: 1.5 × `parallelism` rounded up to a power
/// of two, at least 128 and at most 2^15.
pub fn default_max_parallelism(parallelism: usize) -> usize {
    let wanted = parallelism.saturating_add(parallelism / 2);
    wanted
        .checked_next_power_of_two()
        .unwrap_or(MAX_PARALLELISM_UPPER_BOUND)
        .clamp(
            MAX_PARALLELISM_DEFAULT_LOWER_BOUND,
            MAX_PARALLELISM_UPPER_BOUND,
        )
}

/// A key's hash code as Java's `hashCode` computes it for the same value, so that key
/// groups match Flink's for the same keys. Implement it for your own key types
/// (combine fields as `31 * h + field`, as Java's `Objects.hash` does).
pub trait KeyHashCode {
    /// The hash code.
    fn hash_code(&self) -> i32;
}

macro_rules! small_int_hash {
    ($($t:ty),*) => {$(
        impl KeyHashCode for $t {
            #[inline]
            fn hash_code(&self) -> i32 {
                *self as i32
            }
        }
    )*};
}
small_int_hash!(i8, i16, i32, u8, u16);

/// Java's `Long.hashCode`: the two halves xor-ed.
#[inline]
fn long_hash(value: i64) -> i32 {
    (value ^ ((value as u64) >> 32) as i64) as i32
}

impl KeyHashCode for i64 {
    #[inline]
    fn hash_code(&self) -> i32 {
        long_hash(*self)
    }
}

/// As a Java `long` with the same bits.
impl KeyHashCode for u64 {
    #[inline]
    fn hash_code(&self) -> i32 {
        long_hash(*self as i64)
    }
}

/// As a Java `int` with the same bits.
impl KeyHashCode for u32 {
    #[inline]
    fn hash_code(&self) -> i32 {
        *self as i32
    }
}

/// As a Java `long`.
impl KeyHashCode for usize {
    #[inline]
    fn hash_code(&self) -> i32 {
        long_hash(*self as i64)
    }
}

impl KeyHashCode for bool {
    fn hash_code(&self) -> i32 {
        if *self {
            1231
        } else {
            1237
        }
    }
}

/// Java's `String.hashCode`, over the UTF-16 code units.
impl KeyHashCode for str {
    fn hash_code(&self) -> i32 {
        self.encode_utf16().fold(0i32, |h, unit| {
            h.wrapping_mul(31).wrapping_add(i32::from(unit))
        })
    }
}

impl KeyHashCode for String {
    fn hash_code(&self) -> i32 {
        self.as_str().hash_code()
    }
}

impl<K: KeyHashCode + ?Sized> KeyHashCode for &K {
    fn hash_code(&self) -> i32 {
        (**self).hash_code()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Computed with Flink's `MathUtils.murmurHash` and `KeyGroupRangeAssignment` on
    /// a JVM: (key hash, murmur hash, key group at max parallelism 128, subtask at
    /// parallelism 3).
    const FLINK: [(i32, i32, usize, usize); 12] = [
        (0, 593689054, 94, 2),
        (1, 68075478, 86, 2),
        (2, 1085422463, 127, 2),
        (42, 1134849565, 29, 0),
        (-1, 1982413648, 80, 1),
        (1000, 3506311, 7, 0),
        (i32::MAX, 1653689534, 62, 1),
        (i32::MIN, 1718298732, 108, 2),
        (-2023406815, 178564757, 21, 0),
        (1912276436, 1151597916, 92, 2),
        (99162322, 1715862179, 35, 0),
        (3645559, 1423963908, 4, 0),
    ];

    #[test]
    fn key_groups_equal_flinks() {
        for (hash, murmur, group, subtask) in FLINK {
            assert_eq!(murmur_hash(hash), murmur, "murmur of {hash}");
            assert_eq!(key_group_for_hash(hash, 128), group, "group of {hash}");
            assert_eq!(operator_index_for_key_group(128, 3, group), subtask);
        }
        // The murmur3 test vector: four zero bytes, seed 0.
        assert_eq!(murmur_hash(0) as u32, 0x2362_F9DE);
    }

    #[test]
    fn hash_codes_equal_javas() {
        assert_eq!(1_234_567_890_123i64.hash_code(), 1912276436);
        assert_eq!((-5i64).hash_code(), 4);
        assert_eq!("hello".hash_code(), 99162322);
        assert_eq!(String::from("weir").hash_code(), 3645559);
        assert_eq!(42u64.hash_code(), 42);
    }

    #[test]
    fn default_max_parallelism_is_flinks() {
        assert_eq!(default_max_parallelism(1), 128);
        assert_eq!(default_max_parallelism(100), 256);
        assert_eq!(default_max_parallelism(1000), 2048);
        assert_eq!(
            default_max_parallelism(100_000),
            MAX_PARALLELISM_UPPER_BOUND
        );
    }

    #[test]
    fn subtasks_own_contiguous_key_group_ranges() {
        for (max, parallelism) in [(128, 3), (128, 128), (256, 7), (32768, 1000)] {
            let mut last = 0;
            for group in 0..max {
                let subtask = operator_index_for_key_group(max, parallelism, group);
                assert!(subtask < parallelism);
                assert!(subtask == last || subtask == last + 1);
                last = subtask;
            }
            assert_eq!(last, parallelism - 1);
        }
    }
}
