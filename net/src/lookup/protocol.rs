//! The lookup service's wire protocol: compact binary frames, little-endian.
//!
//! ```text
//! request:  len: u32 = 16 | request_id: u64 | key: u64
//! response: len: u32      | request_id: u64 | status: u8 | value: len - 9 bytes
//! ```
//! `status` 0 is a value; 1 is an error whose `value` is a UTF-8 message. Responses
//! may come in any order; the request id matches them. A length outside the protocol's
//! bounds is a malformed frame: the receiver closes the connection.

/// Bytes of a request frame, prefix included.
pub const REQUEST_LEN: usize = 20;
/// Largest value a response may carry (1 MiB): bounds what a reader buffers.
pub const VALUE_LEN_MAX: usize = 1 << 20;
/// Status of a successful response.
pub const STATUS_OK: u8 = 0;
/// Status of an error response.
pub const STATUS_ERROR: u8 = 1;

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
    if !(9..=9 + VALUE_LEN_MAX).contains(&len) {
        return Err(Malformed(format!(
            "response length {len} outside 9..={}",
            9 + VALUE_LEN_MAX
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
    if status != STATUS_OK && status != STATUS_ERROR {
        return Err(Malformed(format!("unknown status {status}")));
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
