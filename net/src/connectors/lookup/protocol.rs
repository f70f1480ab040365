//! The lookup service's wire protocol: compact binary frames, little-endian.
//!
//! ```text
//! request:        len: u32 = 16      | request_id: u64 | key: u64
//! batch request:  len: u32 = 12 + 8n | request_id: u64 | n: u32 | n × key: u64
//! response:       len: u32 | request_id: u64 | status: u8 | value: len - 9 bytes
//! batch response: len: u32 | request_id: u64 | status: u8 = 2 | n: u32
//!                 | n × (status: u8 | value_len: u32 | value)
//! ```
//! `status` 0 is a value; 1 is an error whose `value` is a UTF-8 message. Responses
//! may come in any order; the request id matches them. A batch request (1 ≤ n ≤
//! [`BATCH_KEYS_MAX`]; its length, 12 + 8n, is never a single request's 16) asks for
//! n keys in one frame, as a batch API does: it is answered by one batch response with
//! the n outcomes in key order, each a value or an error of its own, or by one error
//! response for the whole batch. A length outside the protocol's bounds is a malformed
//! frame: the receiver closes the connection.

/// Bytes of a request frame, prefix included.
pub const REQUEST_LEN: usize = 20;
/// Largest value a response may carry (1 MiB): bounds what a reader buffers.
pub const VALUE_LEN_MAX: usize = 1 << 20;
/// Status of a successful response.
pub const STATUS_OK: u8 = 0;
/// Status of an error response.
pub const STATUS_ERROR: u8 = 1;
/// Status of a batch response (its value holds the outcomes of a batch request).
pub const STATUS_BATCH: u8 = 2;
/// Most keys one batch request may ask for.
pub const BATCH_KEYS_MAX: usize = 4096;
/// Longest response frame, prefix excluded (16 MiB): a single value's response is at
/// most `9 + VALUE_LEN_MAX`; a batch response's outcomes together at most this. It
/// bounds what a reader buffers for one frame.
pub const RESPONSE_LEN_MAX: usize = 16 << 20;

/// Appends a request frame.
#[inline]
pub fn encode_request(out: &mut Vec<u8>, request_id: u64, key: u64) {
    // One append of the whole frame: one capacity check, not three.
    let mut frame = [0u8; REQUEST_LEN];
    frame[..4].copy_from_slice(&16u32.to_le_bytes());
    frame[4..12].copy_from_slice(&request_id.to_le_bytes());
    frame[12..].copy_from_slice(&key.to_le_bytes());
    out.extend_from_slice(&frame);
}

/// Appends a response frame.
#[inline]
pub fn encode_response(out: &mut Vec<u8>, request_id: u64, status: u8, value: &[u8]) {
    let mut head = [0u8; 13];
    head[..4].copy_from_slice(&((9 + value.len()) as u32).to_le_bytes());
    head[4..12].copy_from_slice(&request_id.to_le_bytes());
    head[12] = status;
    out.reserve(head.len() + value.len());
    out.extend_from_slice(&head);
    out.extend_from_slice(value);
}

/// Appends a batch request frame for `keys` (1 to [`BATCH_KEYS_MAX`] of them).
#[inline]
pub fn encode_batch_request(out: &mut Vec<u8>, request_id: u64, keys: &[u64]) {
    debug_assert!((1..=BATCH_KEYS_MAX).contains(&keys.len()));
    out.reserve(16 + 8 * keys.len());
    out.extend_from_slice(&((12 + 8 * keys.len()) as u32).to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
    out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
    for key in keys {
        out.extend_from_slice(&key.to_le_bytes());
    }
}

/// Starts a batch response of `n` outcomes; returns where it starts, for
/// [`finish_batch_response`] (after `n` [`push_batch_outcome`]s).
#[inline]
pub fn begin_batch_response(out: &mut Vec<u8>, request_id: u64, n: usize) -> usize {
    let start = out.len();
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
    out.push(STATUS_BATCH);
    out.extend_from_slice(&(n as u32).to_le_bytes());
    start
}

/// Appends one outcome (`STATUS_OK` and a value, or `STATUS_ERROR` and a message) to
/// the batch response being written.
#[inline]
pub fn push_batch_outcome(out: &mut Vec<u8>, status: u8, value: &[u8]) {
    out.push(status);
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(value);
}

/// Writes the length of the batch response that starts at `start` (the caller keeps
/// it within [`RESPONSE_LEN_MAX`]: see [`batch_response_len`]).
#[inline]
pub fn finish_batch_response(out: &mut [u8], start: usize) {
    let len = out.len() - start - 4;
    debug_assert!(len <= RESPONSE_LEN_MAX, "a batch response of {len} bytes");
    let len = u32::try_from(len).expect("a batch response within RESPONSE_LEN_MAX");
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// The length (prefix excluded) of a batch response of `n` values of `value_len` bytes
/// each: a service must answer a batch whose response would exceed
/// [`RESPONSE_LEN_MAX`] with one error response instead.
pub fn batch_response_len(n: usize, value_len: usize) -> usize {
    13usize.saturating_add(n.saturating_mul(value_len.saturating_add(5)))
}

/// A decoded request frame: one key, or a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFrame<'a> {
    /// One key.
    One(Request),
    /// A batch request: its id, and its keys (8 bytes each, little-endian; see
    /// [`batch_keys`]).
    Batch {
        /// Chosen by the client; echoed in the response.
        request_id: u64,
        /// The keys' bytes.
        keys: &'a [u8],
    },
}

/// The keys of a batch request's `keys` bytes.
pub fn batch_keys(keys: &[u8]) -> impl ExactSizeIterator<Item = u64> + '_ {
    keys.chunks_exact(8)
        .map(|k| u64::from_le_bytes(k.try_into().expect("8 bytes")))
}

/// The size of the request frame that `bytes` begins, prefix included, once its length
/// prefix is there: `Ok(None)` if fewer than 4 bytes; an error if the length is neither
/// a request's nor a batch request's.
#[inline]
pub fn request_size(bytes: &[u8]) -> Result<Option<usize>, Malformed> {
    if bytes.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
    if len == 16 || (len >= 20 && (len - 12) % 8 == 0 && (len - 12) / 8 <= BATCH_KEYS_MAX) {
        Ok(Some(4 + len))
    } else {
        Err(Malformed(format!(
            "request length {len}, expected 16 (one key) or 12 + 8n (a batch of n keys, 1 ≤ n ≤ {BATCH_KEYS_MAX})"
        )))
    }
}

/// Decodes the first request frame in `bytes`, one key or a batch, as
/// [`decode_request`] does.
pub fn decode_request_frame(bytes: &[u8]) -> Result<Option<(RequestFrame<'_>, usize)>, Malformed> {
    let Some(size) = request_size(bytes)? else {
        return Ok(None);
    };
    if bytes.len() < size {
        return Ok(None);
    }
    let request_id = u64::from_le_bytes(bytes[4..12].try_into().expect("8 bytes"));
    if size == REQUEST_LEN {
        let key = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
        return Ok(Some((RequestFrame::One(Request { request_id, key }), size)));
    }
    let n = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes")) as usize;
    if 16 + 8 * n != size {
        return Err(Malformed(format!(
            "batch request of {n} keys in a frame of {size} bytes"
        )));
    }
    Ok(Some((
        RequestFrame::Batch {
            request_id,
            keys: &bytes[16..size],
        },
        size,
    )))
}

/// The outcomes of a batch response (its `value`), in key order: `(status, value)`.
/// Checked whole first (see [`batch_outcomes`]).
#[derive(Debug, Clone)]
pub struct BatchOutcomes<'a> {
    rest: &'a [u8],
    left: usize,
}

impl<'a> Iterator for BatchOutcomes<'a> {
    type Item = (u8, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let status = self.rest[0];
        let len = u32::from_le_bytes(self.rest[1..5].try_into().expect("4 bytes")) as usize;
        let value = &self.rest[5..5 + len];
        self.rest = &self.rest[5 + len..];
        Some((status, value))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for BatchOutcomes<'_> {}

/// Checks a batch response's `value` (count, each outcome's status and length, nothing
/// left over) and returns its outcomes.
pub fn batch_outcomes(value: &[u8]) -> Result<BatchOutcomes<'_>, Malformed> {
    if value.len() < 4 {
        return Err(Malformed("batch response without its count".into()));
    }
    let n = u32::from_le_bytes(value[..4].try_into().expect("4 bytes")) as usize;
    if n == 0 || n > BATCH_KEYS_MAX {
        return Err(Malformed(format!("batch response of {n} outcomes")));
    }
    let mut rest = &value[4..];
    for i in 0..n {
        if rest.len() < 5 {
            return Err(Malformed(format!(
                "batch response cut at outcome {i} of {n}"
            )));
        }
        let status = rest[0];
        let len = u32::from_le_bytes(rest[1..5].try_into().expect("4 bytes")) as usize;
        if status != STATUS_OK && status != STATUS_ERROR {
            return Err(Malformed(format!(
                "unknown status {status} in a batch response"
            )));
        }
        if len > VALUE_LEN_MAX || rest.len() < 5 + len {
            return Err(Malformed(format!(
                "batch response outcome {i} of {len} bytes, with {} left",
                rest.len() - 5
            )));
        }
        rest = &rest[5 + len..];
    }
    if !rest.is_empty() {
        return Err(Malformed(format!(
            "{} bytes after a batch response's {n} outcomes",
            rest.len()
        )));
    }
    Ok(BatchOutcomes {
        rest: &value[4..],
        left: n,
    })
}

/// A decoded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Chosen by the client; echoed in the response.
    pub request_id: u64,
    /// The key to look up.
    pub key: u64,
}

/// A decoded response, borrowing its value from the read buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response<'a> {
    /// The request it answers.
    pub request_id: u64,
    /// `STATUS_OK` or `STATUS_ERROR`.
    pub status: u8,
    /// The value, or the error message.
    pub value: &'a [u8],
}

/// Why bytes are not a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

/// Decodes the first request in `bytes`: `Ok(Some((request, consumed)))`, `Ok(None)`
/// if more bytes are needed.
pub fn decode_request(bytes: &[u8]) -> Result<Option<(Request, usize)>, Malformed> {
    if bytes.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
    if len != 16 {
        return Err(Malformed(format!("request length {len}, expected 16")));
    }
    if bytes.len() < REQUEST_LEN {
        return Ok(None);
    }
    let request_id = u64::from_le_bytes(bytes[4..12].try_into().expect("8 bytes"));
    let key = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
    Ok(Some((Request { request_id, key }, REQUEST_LEN)))
}

/// The size of the response frame that `bytes` begins, prefix included, once its
/// length prefix is there: `Ok(None)` if fewer than 4 bytes; an error if the length is
/// outside the protocol's bounds.
#[inline]
pub fn response_size(bytes: &[u8]) -> Result<Option<usize>, Malformed> {
    if bytes.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
    if !(9..=RESPONSE_LEN_MAX).contains(&len) {
        return Err(Malformed(format!(
            "response length {len} outside 9..={RESPONSE_LEN_MAX}"
        )));
    }
    Ok(Some(4 + len))
}

/// Decodes the first response in `bytes`, as [`decode_request`] does.
#[inline]
pub fn decode_response(bytes: &[u8]) -> Result<Option<(Response<'_>, usize)>, Malformed> {
    let Some(size) = response_size(bytes)? else {
        return Ok(None);
    };
    if bytes.len() < size {
        return Ok(None);
    }
    let len = size - 4;
    let request_id = u64::from_le_bytes(bytes[4..12].try_into().expect("8 bytes"));
    let status = bytes[12];
    if status != STATUS_OK && status != STATUS_ERROR && status != STATUS_BATCH {
        return Err(Malformed(format!("unknown status {status}")));
    }
    if status != STATUS_BATCH && len > 9 + VALUE_LEN_MAX {
        return Err(Malformed(format!(
            "response length {len} above a single value's {}",
            9 + VALUE_LEN_MAX
        )));
    }
    Ok(Some((
        Response {
            request_id,
            status,
            value: &bytes[13..4 + len],
        },
        4 + len,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Frames split at any point decode only once whole, to what was encoded.
        #[test]
        fn responses_round_trip_at_any_split(id in any::<u64>(), value in prop::collection::vec(any::<u8>(), 0..64), split in 0usize..100) {
            let mut bytes = Vec::new();
            encode_response(&mut bytes, id, STATUS_OK, &value);
            let split = split.min(bytes.len());
            if split < bytes.len() {
                prop_assert_eq!(decode_response(&bytes[..split]).unwrap(), None);
            }
            let (response, used) = decode_response(&bytes).unwrap().unwrap();
            prop_assert_eq!(used, bytes.len());
            prop_assert_eq!(response.request_id, id);
            prop_assert_eq!(response.value, &value[..]);
        }

        /// Arbitrary bytes never panic the decoders.
        #[test]
        fn garbage_is_an_error_not_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_response(&bytes);
            let _ = decode_request(&bytes);
        }
    }

    proptest! {
        /// Batch requests and responses split at any point decode only once whole, to
        /// what was encoded.
        #[test]
        fn batches_round_trip_at_any_split(
            id in any::<u64>(),
            keys in prop::collection::vec(any::<u64>(), 1..40),
            outcomes in prop::collection::vec((any::<bool>(), prop::collection::vec(any::<u8>(), 0..24)), 1..40),
            split in 0usize..1000,
        ) {
            let mut bytes = Vec::new();
            encode_batch_request(&mut bytes, id, &keys);
            let cut = split.min(bytes.len());
            if cut < bytes.len() {
                prop_assert_eq!(decode_request_frame(&bytes[..cut]).unwrap(), None);
            }
            let (frame, used) = decode_request_frame(&bytes).unwrap().unwrap();
            prop_assert_eq!(used, bytes.len());
            match frame {
                RequestFrame::Batch { request_id, keys: raw } => {
                    prop_assert_eq!(request_id, id);
                    prop_assert_eq!(batch_keys(raw).collect::<Vec<_>>(), keys);
                }
                RequestFrame::One(_) => prop_assert!(false, "a batch decoded as one key"),
            }

            let mut bytes = Vec::new();
            let start = begin_batch_response(&mut bytes, id, outcomes.len());
            for (ok, value) in &outcomes {
                push_batch_outcome(&mut bytes, if *ok { STATUS_OK } else { STATUS_ERROR }, value);
            }
            finish_batch_response(&mut bytes, start);
            let cut = split.min(bytes.len());
            if cut < bytes.len() {
                prop_assert_eq!(decode_response(&bytes[..cut]).unwrap(), None);
            }
            let (response, used) = decode_response(&bytes).unwrap().unwrap();
            prop_assert_eq!(used, bytes.len());
            prop_assert_eq!(response.status, STATUS_BATCH);
            let decoded: Vec<(bool, Vec<u8>)> = batch_outcomes(response.value)
                .unwrap()
                .map(|(status, value)| (status == STATUS_OK, value.to_vec()))
                .collect();
            prop_assert_eq!(decoded, outcomes);
        }

        /// Arbitrary bytes never panic the batch decoders.
        #[test]
        fn batch_garbage_is_an_error_not_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..96)) {
            let _ = decode_request_frame(&bytes);
            if let Ok(outcomes) = batch_outcomes(&bytes) {
                outcomes.for_each(drop);
            }
        }
    }

    #[test]
    fn batch_lengths_that_are_not_frames_are_malformed() {
        // 12 + 8n for n = 0, a length between, and one key past the most.
        for len in [12u32, 25, 12 + 8 * (BATCH_KEYS_MAX as u32 + 1)] {
            assert!(request_size(&len.to_le_bytes()).is_err(), "{len}");
        }
        // A count that disagrees with the length.
        let mut bytes = Vec::new();
        encode_batch_request(&mut bytes, 1, &[5, 6]);
        bytes[12] = 3;
        assert!(decode_request_frame(&bytes).is_err());
        // One outcome too many, too few, and a wrong status.
        let mut value = Vec::new();
        value.extend_from_slice(&1u32.to_le_bytes());
        push_batch_outcome(&mut value, STATUS_OK, b"v");
        assert!(batch_outcomes(&value).is_ok());
        let mut extra = value.clone();
        push_batch_outcome(&mut extra, STATUS_OK, b"w");
        assert!(batch_outcomes(&extra).is_err());
        assert!(batch_outcomes(&value[..value.len() - 1]).is_err());
        value[4] = 7;
        assert!(batch_outcomes(&value).is_err());
    }

    #[test]
    fn requests_round_trip() {
        let mut bytes = Vec::new();
        encode_request(&mut bytes, 7, 42);
        assert_eq!(
            decode_request(&bytes).unwrap(),
            Some((
                Request {
                    request_id: 7,
                    key: 42
                },
                REQUEST_LEN
            ))
        );
        assert!(decode_request(&[1, 0, 0, 0]).is_err());
    }
}
