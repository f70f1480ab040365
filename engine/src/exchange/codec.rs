//! Serialization of records into bytes and back: the [`Codec`] trait and its
//! implementations for the usual types.
//!
//! Encoding writes into an [`Encoder`] (the record writer's scratch buffer, from which
//! the bytes are copied into segments, spanning them as needed); decoding reads from a
//! [`Decoder`] over a record's bytes, which may have been reassembled from several
//! segments. Fixed-width integers and floats are little-endian; lengths of byte strings
//! and strings are `u32`; `Option` and `bool` are one tag byte.
//!
//! Users implement `Codec` for their own types by encoding and decoding the fields in
//! order, no derive needed:
//!
//! ```
//! use weir_engine::exchange::codec::{Codec, DecodeError, Decoder, Encoder};
//!
//! struct Click { user: u64, url: String }
//!
//! impl Codec for Click {
//!     fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
//!         self.user.encode(out);
//!         self.url.encode(out);
//!     }
//!     fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
//!         Ok(Click { user: u64::decode(input)?, url: String::decode(input)? })
//!     }
//! }
//! ```

/// Where encoded bytes go.
pub trait Encoder {
    /// Appends `bytes`.
    fn write(&mut self, bytes: &[u8]);
}

impl Encoder for Vec<u8> {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Encodes into a fixed slice (the free part of a segment); if the value does not fit,
/// it notes the overflow and the caller falls back to encoding into a growable buffer.
#[derive(Debug)]
pub struct SliceEncoder<'a> {
    buffer: &'a mut [u8],
    len: usize,
    overflow: bool,
}

impl<'a> SliceEncoder<'a> {
    /// An encoder filling `buffer` from its start.
    pub fn new(buffer: &'a mut [u8]) -> Self {
        SliceEncoder {
            buffer,
            len: 0,
            overflow: false,
        }
    }

    /// Bytes written, or `None` if the value did not fit.
    pub fn finish(self) -> Option<usize> {
        (!self.overflow).then_some(self.len)
    }
}

impl Encoder for SliceEncoder<'_> {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if self.overflow || end > self.buffer.len() {
            self.overflow = true;
            return;
        }
        self.buffer[self.len..end].copy_from_slice(bytes);
        self.len = end;
    }
}

/// Where decoded bytes come from: one record's bytes.
pub trait Decoder {
    /// Fills `out` with the next bytes, or fails if fewer remain.
    fn read(&mut self, out: &mut [u8]) -> Result<(), DecodeError>;
    /// Bytes left in the record.
    fn remaining(&self) -> usize;
}

impl Decoder for &[u8] {
    #[inline]
    fn read(&mut self, out: &mut [u8]) -> Result<(), DecodeError> {
        if self.len() < out.len() {
            return Err(DecodeError::Truncated {
                needed: out.len(),
                remaining: self.len(),
            });
        }
        let (head, tail) = self.split_at(out.len());
        out.copy_from_slice(head);
        *self = tail;
        Ok(())
    }

    #[inline]
    fn remaining(&self) -> usize {
        self.len()
    }
}

/// Why bytes could not be decoded: the writer and reader disagree on the type, or the
/// bytes were corrupted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The record ended early.
    #[error("record truncated: {needed} more bytes needed, {remaining} left")]
    Truncated {
        /// Bytes the decoder asked for.
        needed: usize,
        /// Bytes left in the record.
        remaining: usize,
    },
    /// Bytes were left after decoding a whole value.
    #[error("{0} bytes left over after decoding a record; writer and reader types differ")]
    Trailing(usize),
    /// A `bool` or `Option` tag other than 0 or 1.
    #[error("invalid tag byte {0}; writer and reader types differ")]
    InvalidTag(u8),
    /// A string that is not UTF-8.
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
}

/// A type that can be written into and read back from record bytes.
pub trait Codec: Sized {
    /// Writes `self`.
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E);
    /// Reads a value written by `encode`.
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError>;
}

macro_rules! fixed_width {
    ($($t:ty),*) => {$(
        impl Codec for $t {
            #[inline]
            fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
                out.write(&self.to_le_bytes());
            }
            #[inline]
            fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
                let mut bytes = [0u8; core::mem::size_of::<$t>()];
                input.read(&mut bytes)?;
                Ok(<$t>::from_le_bytes(bytes))
            }
        }
    )*};
}

fixed_width!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128, f32, f64);

impl Codec for bool {
    #[inline]
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        out.write(&[u8::from(*self)]);
    }
    #[inline]
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        match u8::decode(input)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::InvalidTag(other)),
        }
    }
}

impl Codec for () {
    #[inline]
    fn encode<E: Encoder + ?Sized>(&self, _out: &mut E) {}
    #[inline]
    fn decode<D: Decoder + ?Sized>(_input: &mut D) -> Result<Self, DecodeError> {
        Ok(())
    }
}

fn decode_len<D: Decoder + ?Sized>(input: &mut D) -> Result<usize, DecodeError> {
    let len = u32::decode(input)? as usize;
    if len > input.remaining() {
        // Checked before allocating, so a corrupt length cannot ask for gigabytes.
        return Err(DecodeError::Truncated {
            needed: len,
            remaining: input.remaining(),
        });
    }
    Ok(len)
}

impl Codec for Vec<u8> {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        (self.len() as u32).encode(out);
        out.write(self);
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        let len = decode_len(input)?;
        let mut bytes = vec![0u8; len];
        input.read(&mut bytes)?;
        Ok(bytes)
    }
}

impl Codec for String {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        (self.len() as u32).encode(out);
        out.write(self.as_bytes());
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        let bytes = Vec::<u8>::decode(input)?;
        String::from_utf8(bytes).map_err(|_| DecodeError::InvalidUtf8)
    }
}

impl<T: Codec> Codec for Option<T> {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        match self {
            None => out.write(&[0]),
            Some(value) => {
                out.write(&[1]);
                value.encode(out);
            }
        }
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        match u8::decode(input)? {
            0 => Ok(None),
            1 => Ok(Some(T::decode(input)?)),
            other => Err(DecodeError::InvalidTag(other)),
        }
    }
}

/// A map as its entry count, then each key and value (in key order): e.g. the map state
/// of a key in `map_with_state` (Flink's `MapState`).
impl<K: Codec + Ord, V: Codec> Codec for std::collections::BTreeMap<K, V> {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        (self.len() as u32).encode(out);
        for (key, value) in self {
            key.encode(out);
            value.encode(out);
        }
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        // Every entry takes a byte at least, so a count past the bytes left is refused
        // before anything is allocated for it.
        let count = decode_len(input)?;
        let mut map = std::collections::BTreeMap::new();
        for _ in 0..count {
            let key = K::decode(input)?;
            let value = V::decode(input)?;
            map.insert(key, value);
        }
        Ok(map)
    }
}

/// A record crosses an exchange as its timestamp, then its value (Flink's
/// `StreamRecord` serializes the timestamp with the value); the exchange carries
/// [`Record`](crate::element::Record) itself, encoded where it lies.
impl<T: Codec> Codec for crate::element::Record<T> {
    #[inline]
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        self.timestamp.encode(out);
        self.value.encode(out);
    }
    #[inline]
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        let timestamp = Option::decode(input)?;
        Ok(crate::element::Record {
            value: T::decode(input)?,
            timestamp,
        })
    }
}

impl<T: Codec, const N: usize> Codec for [T; N] {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        for item in self {
            item.encode(out);
        }
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        let mut items = Vec::with_capacity(N);
        for _ in 0..N {
            items.push(T::decode(input)?);
        }
        Ok(items
            .try_into()
            .unwrap_or_else(|_| unreachable!("exactly N items decoded")))
    }
}

/// A fixed-size byte string written as is (no length, bulk copy): keys, hashes,
/// fixed-width payloads. (`[u8; N]` also works, but goes byte by byte.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FixedBytes<const N: usize>(pub [u8; N]);

impl<const N: usize> Codec for FixedBytes<N> {
    #[inline]
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        out.write(&self.0);
    }
    #[inline]
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        let mut bytes = [0u8; N];
        input.read(&mut bytes)?;
        Ok(FixedBytes(bytes))
    }
}

macro_rules! tuple {
    ($($name:ident),+) => {
        impl<$($name: Codec),+> Codec for ($($name,)+) {
            #[allow(non_snake_case)]
            fn encode<Enc: Encoder + ?Sized>(&self, out: &mut Enc) {
                let ($($name,)+) = self;
                $($name.encode(out);)+
            }
            fn decode<Dec: Decoder + ?Sized>(input: &mut Dec) -> Result<Self, DecodeError> {
                Ok(($($name::decode(input)?,)+))
            }
        }
    };
}

tuple!(A);
tuple!(A, B);
tuple!(A, B, C);
tuple!(A, B, C, D);
tuple!(A, B, C, D, E);
tuple!(A, B, C, D, E, F);

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn round_trip<T: Codec + PartialEq + core::fmt::Debug>(value: T) {
        let mut bytes = Vec::new();
        value.encode(&mut bytes);
        let mut input = bytes.as_slice();
        assert_eq!(T::decode(&mut input).unwrap(), value);
        assert!(input.is_empty());
    }

    #[test]
    fn values_round_trip() {
        round_trip(0xdead_beef_u32);
        round_trip(-7i64);
        round_trip(1.5f64);
        round_trip(true);
        round_trip(Some(String::from("weir")));
        round_trip(None::<u8>);
        round_trip(vec![1u8, 2, 3]);
        round_trip((1u8, String::from("x"), [7u16; 3], Some(false)));
        round_trip(FixedBytes([9u8; 33]));
    }

    #[test]
    fn corrupt_input_is_an_error() {
        let mut input: &[u8] = &[2];
        assert_eq!(bool::decode(&mut input), Err(DecodeError::InvalidTag(2)));
        let mut input: &[u8] = &[0xff, 0xff, 0xff, 0x7f, 1];
        assert!(matches!(
            Vec::<u8>::decode(&mut input),
            Err(DecodeError::Truncated { .. })
        ));
        let mut input: &[u8] = &[1, 0, 0, 0, 0xff];
        assert_eq!(String::decode(&mut input), Err(DecodeError::InvalidUtf8));
    }
}
