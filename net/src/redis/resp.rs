//! RESP framing: commands out, replies in.
//!
//! Commands are arrays of bulk strings, written straight into a connection's outbox
//! (`*3\r\n$4\r\nHGET\r\n...`): the encoding is a few lines and needs no frame
//! values built first, so no crate is used for it.
//!
//! Replies are parsed with the `redis-protocol` crate, maintained with the `fred`
//! client and used in production by it, covering RESP2 and RESP3 alike. It was chosen
//! over writing a parser for two reasons: its `decode_range` functions parse *in
//! place*, returning byte ranges into our own receive buffer instead of copies (no
//! allocation per reply except an array's list of ranges), and it reports a frame cut
//! short by the end of a read as "incomplete" rather than an error, which is exactly
//! what bulk parsing of a pipelined stream needs. `redis-rs` has no public parser of
//! borrowed data, and a hand-written one would have to earn the trust that one gets
//! from its test suite and use.

use std::fmt::Write as _;

use redis_protocol::resp2::decode::decode_range as decode_resp2;
use redis_protocol::resp2::types::RangeFrame as Frame2;
use redis_protocol::resp3::decode::complete::decode_range as decode_resp3;
use redis_protocol::resp3::types::RangeFrame as Frame3;

/// Appends the RESP array of bulk strings `args` to `out`.
pub fn encode_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    push_header(out, b'*', args.len());
    for arg in args {
        push_bulk(out, arg);
    }
}

/// Appends `*n\r\n` (or `$n\r\n`).
#[inline]
pub(crate) fn push_header(out: &mut Vec<u8>, kind: u8, n: usize) {
    out.push(kind);
    push_decimal(out, n);
    out.extend_from_slice(b"\r\n");
}

/// Appends one bulk string.
#[inline]
pub(crate) fn push_bulk(out: &mut Vec<u8>, arg: &[u8]) {
    push_header(out, b'$', arg.len());
    out.extend_from_slice(arg);
    out.extend_from_slice(b"\r\n");
}

#[inline]
fn push_decimal(out: &mut Vec<u8>, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// A byte range of the receive buffer.
pub(crate) type Span = (usize, usize);

/// A reply, as ranges into the buffer it was parsed from (the shapes lookups need;
/// anything else is `Other`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Parsed {
    /// A bulk (or simple, or verbatim) string.
    Bytes(Span),
    /// Nil: a missing key or field.
    Nil,
    /// An error reply.
    Error(Span),
    /// An array (MGET, HMGET): each element, `None` for nil. An element of another
    /// shape makes the whole array `Other`.
    Array(Vec<Option<Span>>),
    /// A map (the `HELLO 3` reply).
    Map,
    /// An out-of-band push (RESP3): not the reply to any command.
    Push,
    /// Integers, booleans, doubles, nested arrays...: no lookup expects them.
    Other(&'static str),
}

/// Why bytes are not RESP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Malformed(pub String);

/// Decodes the first reply in `bytes`: `Ok(Some((reply, consumed)))`, `Ok(None)` if it
/// is not complete yet. `resp3` selects the RESP3 grammar (used from the `HELLO 3`
/// on; it also reads the error with which a server without RESP3 refuses `HELLO`).
pub(crate) fn decode(bytes: &[u8], resp3: bool) -> Result<Option<(Parsed, usize)>, Malformed> {
    if resp3 {
        match decode_resp3(bytes) {
            Ok(Some((frame, used))) => Ok(Some((from_resp3(frame), used))),
            Ok(None) => Ok(None),
            Err(error) => Err(Malformed(error.details().to_string())),
        }
    } else {
        match decode_resp2(bytes) {
            Ok(Some((frame, used))) => Ok(Some((from_resp2(frame), used))),
            Ok(None) => Ok(None),
            Err(error) => Err(Malformed(error.details().to_string())),
        }
    }
}

fn from_resp2(frame: Frame2) -> Parsed {
    match frame {
        Frame2::BulkString(span) | Frame2::SimpleString(span) => Parsed::Bytes(span),
        Frame2::Null => Parsed::Nil,
        Frame2::Error(span) => Parsed::Error(span),
        Frame2::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Frame2::BulkString(span) | Frame2::SimpleString(span) => out.push(Some(span)),
                    Frame2::Null => out.push(None),
                    _ => return Parsed::Other("an array holding a non-string"),
                }
            }
            Parsed::Array(out)
        }
        Frame2::Integer(_) => Parsed::Other("an integer"),
    }
}

fn from_resp3(frame: Frame3) -> Parsed {
    match frame {
        Frame3::BlobString { data, .. }
        | Frame3::SimpleString { data, .. }
        | Frame3::VerbatimString { data, .. } => Parsed::Bytes(data),
        Frame3::Null => Parsed::Nil,
        Frame3::SimpleError { data, .. } | Frame3::BlobError { data, .. } => Parsed::Error(data),
        Frame3::Array { data, .. } => {
            let mut out = Vec::with_capacity(data.len());
            for item in data {
                match item {
                    Frame3::BlobString { data, .. }
                    | Frame3::SimpleString { data, .. }
                    | Frame3::VerbatimString { data, .. } => out.push(Some(data)),
                    Frame3::Null => out.push(None),
                    _ => return Parsed::Other("an array holding a non-string"),
                }
            }
            Parsed::Array(out)
        }
        Frame3::Map { .. } => Parsed::Map,
        Frame3::Push { .. } => Parsed::Push,
        Frame3::Number { .. } => Parsed::Other("a number"),
        Frame3::Boolean { .. } => Parsed::Other("a boolean"),
        Frame3::Double { .. } => Parsed::Other("a double"),
        Frame3::BigNumber { .. } => Parsed::Other("a big number"),
        Frame3::Set { .. } => Parsed::Other("a set"),
        Frame3::Hello { .. } => Parsed::Other("a HELLO frame"),
        Frame3::ChunkedString(_) => Parsed::Other("a streamed string"),
    }
}

/// The text of an error reply (lossy UTF-8), for messages.
pub(crate) fn text(buffer: &[u8], span: Span) -> String {
    let mut out = String::new();
    let bytes = buffer.get(span.0..span.1).unwrap_or_default();
    let _ = write!(out, "{}", String::from_utf8_lossy(bytes));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode_command(&mut out, &[b"HMGET", b"user:1", b"", b"name"]);
        assert_eq!(
            out,
            b"*4\r\n$5\r\nHMGET\r\n$6\r\nuser:1\r\n$0\r\n\r\n$4\r\nname\r\n"
        );
        out.clear();
        push_decimal(&mut out, 0);
        push_decimal(&mut out, 1234567890);
        assert_eq!(out, b"01234567890");
    }

    #[test]
    fn replies_decode_in_both_protocols() {
        for resp3 in [false, true] {
            let (reply, used) = decode(b"$3\r\nabc\r\n+OK", resp3).unwrap().unwrap();
            assert_eq!((reply, used), (Parsed::Bytes((4, 7)), 9));
            assert_eq!(decode(b"$3\r\nab", resp3).unwrap(), None);
            let (reply, _) = decode(b"-ERR wrong\r\n", resp3).unwrap().unwrap();
            assert_eq!(reply, Parsed::Error((1, 10)));
            let nil: &[u8] = if resp3 { b"_" } else { b"$-1" };
            let array = [&b"*3\r\n$1\r\na\r\n"[..], nil, b"\r\n$0\r\n\r\n"].concat();
            let (reply, _) = decode(&array, resp3).unwrap().unwrap();
            let empty = array.len() - 2;
            assert_eq!(
                reply,
                Parsed::Array(vec![Some((8, 9)), None, Some((empty, empty))])
            );
            let (reply, _) = decode(b":12\r\n", resp3).unwrap().unwrap();
            assert!(matches!(reply, Parsed::Other(_)));
            assert!(decode(b"!garbage\r\n", resp3).is_err());
        }
        assert_eq!(decode(b"$-1\r\n", false).unwrap(), Some((Parsed::Nil, 5)));
        assert_eq!(decode(b"_\r\n", true).unwrap(), Some((Parsed::Nil, 3)));
        let (reply, _) = decode(b"%1\r\n+a\r\n:1\r\n", true).unwrap().unwrap();
        assert_eq!(reply, Parsed::Map);
        let (reply, _) = decode(b"*2\r\n$1\r\na\r\n_\r\n", true).unwrap().unwrap();
        assert_eq!(reply, Parsed::Array(vec![Some((8, 9)), None]));
    }

    proptest! {
        /// A bulk reply split at any point decodes only once whole, to its bytes.
        #[test]
        fn bulk_replies_decode_only_when_whole(value in prop::collection::vec(any::<u8>(), 0..300), split in 0usize..320, resp3 in any::<bool>()) {
            let mut bytes = Vec::new();
            push_bulk(&mut bytes, &value);
            let split = split.min(bytes.len());
            if split < bytes.len() {
                prop_assert_eq!(decode(&bytes[..split], resp3).unwrap(), None);
            }
            let (reply, used) = decode(&bytes, resp3).unwrap().unwrap();
            prop_assert_eq!(used, bytes.len());
            let Parsed::Bytes((start, end)) = reply else { panic!("a bulk string") };
            prop_assert_eq!(&bytes[start..end], &value[..]);
        }

        /// Arbitrary bytes never panic the decoder.
        #[test]
        fn garbage_is_an_error_not_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..64), resp3 in any::<bool>()) {
            let _ = decode(&bytes, resp3);
        }
    }
}
