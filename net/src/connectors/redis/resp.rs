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
//!
//! The decoder recurses once per level of nesting, so a hostile server could overflow
//! the worker's stack with a reply like `*1\r\n*1\r\n...`. Every reply therefore passes
//! [`check_depth`] first: a loop over the frame headers (no recursion, no allocation)
//! that refuses aggregates nested deeper than [`REPLY_DEPTH_MAX`] before the decoder
//! sees them.

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

/// The deepest nesting of aggregates (arrays, maps, sets, pushes, attributes) a reply
/// may have; a deeper one fails the connection with
/// [`RedisError::TooDeep`](super::RedisError::TooDeep). An aggregate holding frames is
/// a level; an empty one is a frame like a string (the decoder goes no deeper for it).
///
/// Lookups need one level (an `MGET` or `HMGET` array) and the `HELLO 3` map two; the
/// replies of other Redis commands nest a handful. The bound is the decoder's stack:
/// `redis-protocol` 6.0.0 recurses through several functions per level, and decoding
/// `*1\r\n` nested N deep on a 2 MiB thread (a worker's default stack) overflowed
/// from N = 115 for RESP3 in a debug build (about 18 KiB a level; 2 KiB optimized)
/// and N = 826 for RESP2. At 32 levels the decoder takes under 600 KiB even
/// unoptimized, leaving the rest to the worker.
pub const REPLY_DEPTH_MAX: usize = 32;

/// Why server bytes are refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Not RESP: what is wrong, for the error message.
    Malformed(String),
    /// Aggregates nested deeper than [`REPLY_DEPTH_MAX`].
    TooDeep,
}

impl Refused {
    /// The error of a connection to `peer` that received such bytes.
    pub(crate) fn into_error(self, peer: &str) -> super::error::RedisError {
        use super::error::RedisError;
        match self {
            Refused::Malformed(reason) => RedisError::Malformed {
                addr: peer.to_string(),
                reason,
            },
            Refused::TooDeep => RedisError::TooDeep {
                addr: peer.to_string(),
                depth_max: REPLY_DEPTH_MAX,
            },
        }
    }
}

/// The error of a connection to `peer` whose unfinished reply passed `max` bytes.
pub(crate) fn reply_too_long(peer: &str, max: usize) -> super::error::RedisError {
    super::error::RedisError::Malformed {
        addr: peer.to_string(),
        reason: format!("a reply longer than {max} bytes (max_reply_bytes)"),
    }
}

/// Decodes the first reply in `bytes`: `Ok(Some((reply, consumed)))`, `Ok(None)` if it
/// is not complete yet. `resp3` selects the RESP3 grammar (used from the `HELLO 3`
/// on; it also reads the error with which a server without RESP3 refuses `HELLO`).
pub(crate) fn decode(bytes: &[u8], resp3: bool) -> Result<Option<(Parsed, usize)>, Refused> {
    // The decoder below recurses per level: bound the levels first.
    let whole = check_depth(bytes, resp3)?;
    let malformed = |error: redis_protocol::error::RedisProtocolError| {
        Refused::Malformed(error.details().to_string())
    };
    if resp3 {
        match decode_resp3(bytes) {
            Ok(Some((frame, used))) => {
                debug_assert_eq!(whole, Some(used), "the check frames replies as the decoder");
                Ok(Some((from_resp3(frame), used)))
            }
            Ok(None) => Ok(None),
            Err(error) => Err(malformed(error)),
        }
    } else {
        match decode_resp2(bytes) {
            Ok(Some((frame, used))) => {
                debug_assert_eq!(whole, Some(used), "the check frames replies as the decoder");
                Ok(Some((from_resp2(frame), used)))
            }
            Ok(None) => Ok(None),
            Err(error) => Err(malformed(error)),
        }
    }
}

/// Decodes the first RESP2 reply in `bytes` into an owned frame, after the same nesting
/// check as [`decode`]: for replies whose nested shape the caller walks itself (the
/// streams commands), where ranges into the buffer would have to be resolved anyway.
pub(crate) fn decode_owned(
    bytes: &[u8],
) -> Result<Option<(redis_protocol::resp2::types::OwnedFrame, usize)>, Refused> {
    check_depth(bytes, false)?;
    redis_protocol::resp2::decode::decode(bytes)
        .map_err(|error| Refused::Malformed(error.details().to_string()))
}

/// An aggregate being walked by [`check_depth`].
#[derive(Debug, Clone, Copy)]
struct Level {
    /// Frames still to come in it.
    remaining: u64,
    /// An attribute (RESP3 `|`): once its pairs are done, the frame it annotates follows
    /// and stands in its place in the enclosing aggregate.
    attribute: bool,
}

/// Checks that the first reply in `bytes` (or as much of it as has arrived) nests
/// aggregates at most [`REPLY_DEPTH_MAX`] deep, so that `redis-protocol`'s recursive
/// decoder, which walks the same bytes, stays within a bounded stack.
///
/// It follows the decoder's grammar (the same length parsing, the same frame kinds per
/// protocol) over the headers only: strings are skipped by their length, lines to their
/// CRLF, and each open aggregate is a count of the frames it still holds on a fixed
/// stack of `REPLY_DEPTH_MAX` entries. It stops at the end of the first reply, returning
/// its length, or at the end of the bytes, returning `None`; what it cannot walk (a bad
/// length, an unknown kind, a streamed aggregate, which the decoder refuses too) is
/// [`Refused::Malformed`].
pub(crate) fn check_depth(bytes: &[u8], resp3: bool) -> Result<Option<usize>, Refused> {
    let mut levels = [Level {
        remaining: 0,
        attribute: false,
    }; REPLY_DEPTH_MAX];
    let mut depth = 0;
    let mut at = 0;
    // Whether an attribute just ended: the decoder wants a frame, not another attribute.
    let mut after_attribute = false;
    loop {
        let Some(&kind) = bytes.get(at) else {
            return Ok(None);
        };
        // The header line: the kind byte, then text up to CRLF.
        let Some(end) = find_crlf(bytes, at + 1) else {
            return Ok(None);
        };
        let text = &bytes[at + 1..end];
        let next = end + 2;
        let opened = match (kind, resp3) {
            // Lines: simple strings, errors, integers; RESP3 doubles, booleans, big
            // numbers, nulls, stream ends, and the HELLO a server never sends.
            (b'+' | b'-' | b':', _) | (b',' | b'#' | b'(' | b'_' | b'.' | b'H', true) => {
                at = next;
                None
            }
            (b'$', _) => match signed_length(text, resp3)? {
                None => {
                    at = next;
                    None
                }
                Some(length) => match skip_payload(bytes, next, length) {
                    Some(after) => {
                        at = after;
                        None
                    }
                    None => return Ok(None),
                },
            },
            // Blob errors, verbatim strings (at least their 4-byte `txt:` prefix) and
            // chunks of streamed strings (`;0` ends the stream and has no payload).
            (b'!' | b'=' | b';', true) => {
                let length = unsigned_length(text)?;
                if kind == b'=' && length < 4 {
                    return Err(Refused::Malformed(
                        "a verbatim string shorter than its format prefix".into(),
                    ));
                }
                if kind == b';' && length == 0 {
                    at = next;
                    None
                } else {
                    match skip_payload(bytes, next, length) {
                        Some(after) => {
                            at = after;
                            None
                        }
                        None => return Ok(None),
                    }
                }
            }
            (b'*', _) | (b'~', true) => {
                at = next;
                signed_length(text, resp3)?.map(|n| (n as u64, false))
            }
            (b'%', true) => {
                at = next;
                signed_length(text, resp3)?.map(|n| ((n as u64).saturating_mul(2), false))
            }
            (b'>', true) => {
                at = next;
                Some((unsigned_length(text)? as u64, false))
            }
            (b'|', true) => {
                if after_attribute {
                    return Err(Refused::Malformed(
                        "an attribute annotating an attribute".into(),
                    ));
                }
                at = next;
                Some(((unsigned_length(text)? as u64).saturating_mul(2), true))
            }
            _ => {
                return Err(Refused::Malformed(format!(
                    "{:?} starts no {} frame",
                    char::from(kind),
                    if resp3 { "RESP3" } else { "RESP2" }
                )))
            }
        };
        after_attribute = false;
        match opened {
            Some((0, true)) => {
                // An empty attribute: the frame it annotates follows.
                after_attribute = true;
                continue;
            }
            Some((0, false)) => {}
            Some((remaining, attribute)) => {
                if depth == REPLY_DEPTH_MAX {
                    return Err(Refused::TooDeep);
                }
                levels[depth] = Level {
                    remaining,
                    attribute,
                };
                depth += 1;
                continue;
            }
            None => {}
        }
        // A frame ended: count it in the aggregates around it, closing those it
        // completes.
        loop {
            if depth == 0 {
                return Ok(Some(at));
            }
            let level = &mut levels[depth - 1];
            debug_assert!(level.remaining > 0, "open levels hold frames to come");
            level.remaining -= 1;
            if level.remaining > 0 {
                break;
            }
            depth -= 1;
            if level.attribute {
                // Not a frame of the enclosing aggregate: the one it annotates is.
                after_attribute = true;
                break;
            }
        }
    }
}

/// Where the first CRLF at or after `from` starts, if any.
fn find_crlf(bytes: &[u8], from: usize) -> Option<usize> {
    let rest = bytes.get(from..)?;
    rest.windows(2)
        .position(|pair| pair == b"\r\n")
        .map(|at| from + at)
}

/// Where a payload of `length` bytes and its CRLF starting at `from` end, if they have
/// arrived. (The decoder takes the two bytes after the payload without looking at them.)
fn skip_payload(bytes: &[u8], from: usize, length: usize) -> Option<usize> {
    let end = from.checked_add(length)?.checked_add(2)?;
    (end <= bytes.len()).then_some(end)
}

/// A length the decoder reads as `usize` (RESP3 pushes, attributes, blob errors...).
fn unsigned_length(text: &[u8]) -> Result<usize, Refused> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|text| text.parse::<usize>().ok())
        .ok_or_else(|| bad_length(text))
}

/// A length the decoder reads as `isize` (strings, arrays; RESP3 sets and maps):
/// `None` for RESP2's nil (`-1`). RESP3's streamed form (`?`, which it also reads from
/// `-1`) is refused, as the decoder of whole frames refuses it.
fn signed_length(text: &[u8], resp3: bool) -> Result<Option<usize>, Refused> {
    if resp3 && text == b"?" {
        return Err(Refused::Malformed("a streamed string or aggregate".into()));
    }
    let length = std::str::from_utf8(text)
        .ok()
        .and_then(|text| text.parse::<isize>().ok())
        .ok_or_else(|| bad_length(text))?;
    match length {
        -1 if resp3 => Err(Refused::Malformed("a streamed string or aggregate".into())),
        -1 => Ok(None),
        length => usize::try_from(length)
            .map(Some)
            .map_err(|_| bad_length(text)),
    }
}

fn bad_length(text: &[u8]) -> Refused {
    Refused::Malformed(format!(
        "bad length {:?} in a frame header",
        String::from_utf8_lossy(text)
    ))
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

    /// `open` repeated `depth` times around a bulk string, then `close` as often.
    fn nested(depth: usize, open: &[u8], close: &[u8]) -> Vec<u8> {
        let mut bytes = open.repeat(depth);
        bytes.extend_from_slice(b"$1\r\nx\r\n");
        bytes.extend_from_slice(&close.repeat(depth));
        bytes
    }

    /// Every kind of aggregate holding frames counts as a level: a reply nested exactly
    /// `REPLY_DEPTH_MAX` deep decodes, one level more is refused, and so is a reply
    /// nested 100,000 deep (whose decoding would overflow the stack), whole or cut
    /// anywhere after its first `REPLY_DEPTH_MAX + 1` headers.
    #[test]
    fn nesting_beyond_the_limit_is_refused_before_decoding() {
        let shapes: [(bool, &[u8], &[u8]); 6] = [
            (false, b"*1\r\n", b""),
            (true, b"*1\r\n", b""),
            (true, b"%1\r\n+key\r\n", b""),
            (true, b">1\r\n", b""),
            // An attribute's pairs nest; the frame it annotates follows it.
            (true, b"|1\r\n+key\r\n", b"+annotated\r\n"),
            // A set of sets does not decode (its members must hash), but still nests.
            (true, b"~1\r\n", b""),
        ];
        for (resp3, open, close) in shapes {
            let at_limit = nested(REPLY_DEPTH_MAX, open, close);
            assert_eq!(check_depth(&at_limit, resp3), Ok(Some(at_limit.len())));
            if open != b"~1\r\n" {
                let (_, used) = decode(&at_limit, resp3).unwrap().expect("whole");
                assert_eq!(used, at_limit.len());
            }
            for depth in [REPLY_DEPTH_MAX + 1, 100_000] {
                let too_deep = nested(depth, open, close);
                assert_eq!(decode(&too_deep, resp3), Err(Refused::TooDeep));
                let headers = open.len() * (REPLY_DEPTH_MAX + 1);
                for cut in [headers, headers + 3, too_deep.len() - 1] {
                    assert_eq!(check_depth(&too_deep[..cut], resp3), Err(Refused::TooDeep));
                }
                // Cut before the level too many is complete, it is only incomplete.
                let before = open.len() * REPLY_DEPTH_MAX + 3;
                assert_eq!(decode(&too_deep[..before], resp3), Ok(None));
            }
        }
        // Depth is nesting, not length: wide and sequential frames are fine.
        let mut wide = b"*1000\r\n".to_vec();
        for _ in 0..1000 {
            wide.extend_from_slice(b"*1\r\n:1\r\n");
        }
        assert_eq!(check_depth(&wide, false), Ok(Some(wide.len())));
        let empty_ones = b"*0\r\n".repeat(1000);
        assert_eq!(check_depth(&empty_ones, true), Ok(Some(4)));
    }

    /// What the decoder of whole frames refuses, the check refuses as malformed (it
    /// cannot walk it), never as too deep and never by panicking.
    #[test]
    fn the_check_refuses_what_it_cannot_walk() {
        for (bytes, resp3) in [
            (&b"!garbage\r\n"[..], false),
            (b"!garbage\r\n", true),
            (b"$x\r\n", false),
            (b"*-2\r\n", false),
            (b"*?\r\n", true),
            (b"$?\r\n", true),
            (b"*-1\r\n", true),
            (b"=2\r\nab\r\n", true),
            (b"|0\r\n|0\r\n+x\r\n", true),
            (b"%1\r\n", false),
        ] {
            assert!(
                matches!(check_depth(bytes, resp3), Err(Refused::Malformed(_))),
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
            assert!(matches!(decode(bytes, resp3), Err(Refused::Malformed(_))));
        }
        // RESP2's nils are frames.
        assert_eq!(check_depth(b"*-1\r\n", false), Ok(Some(5)));
        assert_eq!(check_depth(b"$-1\r\n", false), Ok(Some(5)));
    }

    /// A reply of random shape, as the check walks it.
    #[derive(Debug, Clone)]
    enum Shape {
        Bulk(Vec<u8>),
        Line(u8, String),
        Nil,
        Array(Vec<Shape>),
        /// RESP3 only.
        Map(Vec<(String, Shape)>),
        /// RESP3 only.
        Push(Vec<Shape>),
        /// RESP3 only: a map of attributes, then the frame they annotate.
        Attributed(Vec<(String, Shape)>, Box<Shape>),
    }

    impl Shape {
        /// Levels of aggregates holding frames (an empty one holds no level).
        fn depth(&self) -> usize {
            let levels = |items: &mut dyn Iterator<Item = &Shape>| {
                items.map(|item| item.depth() + 1).max().unwrap_or(0)
            };
            match self {
                Shape::Bulk(_) | Shape::Line(..) | Shape::Nil => 0,
                Shape::Array(items) | Shape::Push(items) => levels(&mut items.iter()),
                Shape::Map(pairs) => levels(&mut pairs.iter().map(|(_, v)| v)),
                Shape::Attributed(pairs, frame) => {
                    levels(&mut pairs.iter().map(|(_, v)| v)).max(frame.depth())
                }
            }
        }

        fn encode(&self, out: &mut Vec<u8>, resp3: bool) {
            let pairs = |out: &mut Vec<u8>, kind, pairs: &[(String, Shape)]| {
                push_header(out, kind, pairs.len());
                for (key, value) in pairs {
                    out.push(b'+');
                    out.extend_from_slice(key.as_bytes());
                    out.extend_from_slice(b"\r\n");
                    value.encode(out, resp3);
                }
            };
            match self {
                Shape::Bulk(bytes) => push_bulk(out, bytes),
                Shape::Line(kind, text) => {
                    out.push(*kind);
                    out.extend_from_slice(text.as_bytes());
                    out.extend_from_slice(b"\r\n");
                }
                Shape::Nil if resp3 => out.extend_from_slice(b"_\r\n"),
                Shape::Nil => out.extend_from_slice(b"$-1\r\n"),
                Shape::Array(items) | Shape::Push(items) => {
                    let kind = if matches!(self, Shape::Push(_)) {
                        b'>'
                    } else {
                        b'*'
                    };
                    push_header(out, kind, items.len());
                    for item in items {
                        item.encode(out, resp3);
                    }
                }
                Shape::Map(items) => pairs(out, b'%', items),
                Shape::Attributed(items, frame) => {
                    pairs(out, b'|', items);
                    frame.encode(out, resp3);
                }
            }
        }
    }

    fn shape(resp3: bool) -> impl Strategy<Value = Shape> {
        let leaf = prop_oneof![
            prop::collection::vec(any::<u8>(), 0..12).prop_map(Shape::Bulk),
            ("[a-z ]{0,8}", prop::sample::select(vec![b'+', b'-']))
                .prop_map(|(t, k)| Shape::Line(k, t)),
            any::<i32>().prop_map(|n| Shape::Line(b':', n.to_string())),
            Just(Shape::Nil),
        ];
        leaf.prop_recursive(6, 48, 4, move |inner| {
            let items = prop::collection::vec(inner.clone(), 0..4);
            let pairs = prop::collection::vec(("[a-z]{1,4}", inner.clone()), 0..3);
            if resp3 {
                prop_oneof![
                    items.clone().prop_map(Shape::Array),
                    items.prop_map(Shape::Push),
                    pairs.clone().prop_map(Shape::Map),
                    (pairs, inner).prop_map(|(p, f)| match f {
                        // The decoder wants no attribute right after an attribute,
                        // nor on a nil.
                        Shape::Attributed(..) | Shape::Nil => Shape::Array(vec![f]),
                        f => Shape::Attributed(p, Box::new(f)),
                    }),
                ]
                .boxed()
            } else {
                items.prop_map(Shape::Array).boxed()
            }
        })
    }

    proptest! {
        /// The check frames replies of any shape as the decoder does: at their end when
        /// whole, incomplete when cut, and it counts their nesting: wrapped to the limit
        /// they decode, one level more and they are refused.
        #[test]
        fn the_check_frames_replies_as_the_decoder(
            (resp3, reply) in any::<bool>().prop_flat_map(|resp3| (Just(resp3), shape(resp3))),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut bytes = Vec::new();
            reply.encode(&mut bytes, resp3);
            let end = bytes.len();
            bytes.extend_from_slice(b"+next\r\n");
            prop_assert_eq!(check_depth(&bytes, resp3), Ok(Some(end)));
            let (_, used) = decode(&bytes, resp3).unwrap().expect("whole");
            prop_assert_eq!(used, end);
            let cut = cut.index(end);
            prop_assert_eq!(check_depth(&bytes[..cut], resp3), Ok(None));
            prop_assert_eq!(decode(&bytes[..cut], resp3), Ok(None));

            let depth = reply.depth();
            prop_assume!(depth < REPLY_DEPTH_MAX);
            let to_limit = REPLY_DEPTH_MAX - depth;
            for (levels, refused) in [(to_limit, false), (to_limit + 1, true)] {
                let mut wrapped = b"*1\r\n".repeat(levels);
                reply.encode(&mut wrapped, resp3);
                let outcome = check_depth(&wrapped, resp3);
                if refused {
                    prop_assert_eq!(outcome, Err(Refused::TooDeep));
                } else {
                    prop_assert_eq!(outcome, Ok(Some(wrapped.len())));
                    prop_assert!(decode(&wrapped, resp3).unwrap().is_some());
                }
            }
        }

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
