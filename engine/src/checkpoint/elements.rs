//! Stream elements as checkpoint bytes: what an async operator holds at a barrier
//! ([`AsyncWaitOperator::snapshot`](crate::async_io::AsyncWaitOperator::snapshot): the
//! records not yet emitted and the watermarks between them, in input order) written into
//! its task's state, and read back on restore to be processed again before new input.

use crate::element::StreamElement;
use crate::exchange::codec::{Codec, DecodeError};

/// Format version of encoded elements.
const ELEMENTS_VERSION: u8 = 1;
const RECORD: u8 = 0;
const RECORD_WITH_TIME: u8 = 1;
const WATERMARK: u8 = 2;

/// `elements` as bytes, in order.
pub fn encode_elements<T: Codec>(elements: &[StreamElement<T>]) -> Vec<u8> {
    let mut out = Vec::new();
    ELEMENTS_VERSION.encode(&mut out);
    (elements.len() as u64).encode(&mut out);
    for element in elements {
        match element {
            StreamElement::Record(record) => match record.timestamp {
                Some(timestamp) => {
                    RECORD_WITH_TIME.encode(&mut out);
                    timestamp.encode(&mut out);
                    record.value.encode(&mut out);
                }
                None => {
                    RECORD.encode(&mut out);
                    record.value.encode(&mut out);
                }
            },
            StreamElement::Watermark(watermark) => {
                WATERMARK.encode(&mut out);
                watermark.0.encode(&mut out);
            }
        }
    }
    out
}

/// The elements [`encode_elements`] wrote, in order; an error for anything else.
pub fn decode_elements<T: Codec>(mut bytes: &[u8]) -> Result<Vec<StreamElement<T>>, DecodeError> {
    let input = &mut bytes;
    let version = u8::decode(input)?;
    if version != ELEMENTS_VERSION {
        return Err(DecodeError::InvalidTag(version));
    }
    let count = u64::decode(input)?;
    // Each element takes at least a byte: a count beyond the bytes left is corrupt.
    if count > input.len() as u64 {
        return Err(DecodeError::Truncated {
            needed: count as usize,
            remaining: input.len(),
        });
    }
    let mut elements = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let element = match u8::decode(input)? {
            RECORD => StreamElement::record(T::decode(input)?, None),
            RECORD_WITH_TIME => {
                let timestamp = i64::decode(input)?;
                StreamElement::record(T::decode(input)?, Some(timestamp))
            }
            WATERMARK => StreamElement::watermark(i64::decode(input)?),
            tag => return Err(DecodeError::InvalidTag(tag)),
        };
        elements.push(element);
    }
    if !input.is_empty() {
        return Err(DecodeError::Trailing(input.len()));
    }
    Ok(elements)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::async_io::{
        AsyncConfig, AsyncFunction, AsyncWaitOperator, OutputMode, ResultFuture,
    };
    use crate::park::Parker;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// Calls made and not yet answered, with their inputs.
    type Calls = Rc<RefCell<Vec<(u64, ResultFuture<u64>)>>>;

    /// Keeps each call's handle for the test to complete.
    struct Held(Calls);

    impl AsyncFunction for Held {
        type In = u64;
        type Out = u64;
        fn invoke(&mut self, input: &u64, result: ResultFuture<u64>) {
            self.0.borrow_mut().push((*input, result));
        }
        fn key(&self, input: &u64) -> u64 {
            *input % 3
        }
    }

    /// In every mode, with calls in flight and some completed but not emitted: the
    /// operator's snapshot, through bytes, makes a new operator emit exactly what the
    /// first had not emitted yet, and nothing it had.
    #[test]
    fn an_operator_restored_from_bytes_emits_what_was_held() {
        for mode in [
            OutputMode::Ordered,
            OutputMode::Unordered,
            OutputMode::KeyedOrdered,
        ] {
            let calls = Rc::new(RefCell::new(Vec::new()));
            let parker = Parker::current();
            let mut first = AsyncWaitOperator::new(
                Held(Rc::clone(&calls)),
                AsyncConfig::new(mode, 16),
                parker.unparker(),
            )
            .expect("operator");
            let mut emitted: Vec<StreamElement<u64>> = Vec::new();
            for i in 0..10u64 {
                first
                    .process_record(i, Some(i as i64), 0, &mut emitted)
                    .expect("record");
                if i == 4 {
                    first
                        .process_watermark(4, 0, &mut emitted)
                        .expect("watermark");
                }
            }
            // Complete the calls of 0, 1, 5 and 7; 0 and 1 come out in every mode. The
            // others stay in flight (a handle dropped unanswered is a failed call).
            let mut in_flight = Vec::new();
            for (input, result) in calls.borrow_mut().drain(..) {
                if [0, 1, 5, 7].contains(&input) {
                    result.complete_one(input * 10);
                } else {
                    in_flight.push(result);
                }
            }
            first.drain(0, &mut emitted).expect("drain");
            let bytes = encode_elements(&first.snapshot());
            // The crash: the operator and its calls in flight are gone.
            drop(first);
            drop(in_flight);
            let held: Vec<StreamElement<u64>> = decode_elements(&bytes).expect("decode");
            let calls = Rc::new(RefCell::new(Vec::new()));
            let mut second = AsyncWaitOperator::new(
                Held(Rc::clone(&calls)),
                AsyncConfig::new(mode, 16),
                parker.unparker(),
            )
            .expect("operator");
            for element in held {
                match element {
                    StreamElement::Record(r) => second
                        .process_record(r.value, r.timestamp, 0, &mut emitted)
                        .expect("record"),
                    StreamElement::Watermark(w) => second
                        .process_watermark(w.0, 0, &mut emitted)
                        .expect("watermark"),
                }
            }
            for (input, result) in calls.borrow_mut().drain(..) {
                result.complete_one(input * 10);
            }
            second.drain(0, &mut emitted).expect("drain");
            assert_eq!(second.in_flight(), 0, "{mode:?}");
            let mut values: Vec<u64> = emitted
                .iter()
                .filter_map(|e| e.as_record().map(|r| r.value))
                .collect();
            values.sort_unstable();
            assert_eq!(
                values,
                (0..10).map(|i| i * 10).collect::<Vec<_>>(),
                "{mode:?}"
            );
            assert!(emitted.iter().any(StreamElement::is_watermark), "{mode:?}");
        }
    }

    #[test]
    fn every_cut_of_encoded_elements_is_refused() {
        let elements = vec![
            StreamElement::record(7u64, None),
            StreamElement::watermark(3),
            StreamElement::record(9u64, Some(-4)),
        ];
        let bytes = encode_elements(&elements);
        assert_eq!(decode_elements::<u64>(&bytes).expect("whole"), elements);
        for cut in 0..bytes.len() {
            assert!(
                decode_elements::<u64>(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(decode_elements::<u64>(&extra).is_err());
    }
}
