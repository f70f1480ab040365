//! Redis replies as the client reads them (the nesting check, then the protocol's
//! decoder), RESP2 and RESP3, on arbitrary server bytes: never a panic or a stack
//! overflow, never more bytes claimed than given, and a stream of replies decodes one
//! after the other. (Debug assertions, on in fuzz builds, check that the nesting check
//! frames each reply exactly as the decoder does.) The first byte picks the protocol.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_net::redis::check_reply;

fuzz_target!(|data: &[u8]| {
    let Some((&first, bytes)) = data.split_first() else {
        return;
    };
    let resp3 = first & 1 == 1;
    let mut offset = 0;
    while offset < bytes.len() {
        match check_reply(&bytes[offset..], resp3) {
            Ok(Some(used)) => {
                assert!(used > 0 && offset + used <= bytes.len());
                offset += used;
            }
            Ok(None) | Err(_) => return,
        }
    }
});
