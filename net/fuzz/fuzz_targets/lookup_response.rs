//! The lookup client's response decoder on arbitrary service bytes: it must never
//! panic, never claim more bytes than it was given, agree with the size check the
//! client makes first, and decode a stream of responses frame after frame.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_net::lookup::protocol::{decode_response, response_size};

fuzz_target!(|data: &[u8]| {
    let mut offset = 0;
    while offset < data.len() {
        let rest = &data[offset..];
        let size = response_size(rest);
        match decode_response(rest) {
            Ok(Some((_response, used))) => {
                assert!(used > 0 && used <= rest.len());
                assert_eq!(size.ok().flatten(), Some(used), "the size check agrees");
                offset += used;
            }
            Ok(None) => {
                assert!(!matches!(size, Ok(Some(n)) if n <= rest.len()));
                return;
            }
            Err(_) => return,
        }
    }
});
