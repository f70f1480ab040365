//! The transport's frame decoder on arbitrary bytes: it must never panic, never claim
//! more bytes than it was given, and whatever it accepts must re-encode to exactly the
//! bytes it came from. The first input byte picks the largest buffer payload accepted,
//! so the limit checks are exercised too.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_net::transport::{Frame, Header, HEADER_SIZE};

fuzz_target!(|data: &[u8]| {
    let Some((&limit, bytes)) = data.split_first() else {
        return;
    };
    let buffer_max = usize::from(limit) * 129;
    let mut offset = 0;
    loop {
        match Frame::decode(&bytes[offset..], buffer_max) {
            Ok(Some((frame, used))) => {
                assert!(used >= HEADER_SIZE && offset + used <= bytes.len());
                let mut again = Vec::with_capacity(used);
                frame.encode(&mut again);
                assert_eq!(&again[..], &bytes[offset..offset + used]);
                let header = Header::decode(
                    bytes[offset..offset + HEADER_SIZE].try_into().expect("a header"),
                    buffer_max,
                )
                .expect("the header of an accepted frame");
                assert_eq!(header, frame.header());
                offset += used;
            }
            Ok(None) => return,
            Err(error) => {
                assert!(!error.to_string().is_empty());
                return;
            }
        }
    }
});
