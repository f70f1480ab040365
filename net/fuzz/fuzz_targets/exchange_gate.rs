//! An input gate reading arbitrary bytes from a channel, as it reads what a remote
//! producer sent: length prefixes, watermark and end tags, records spanning buffers,
//! and the record codec of `Record<(u64, Vec<u8>)>`. It must never panic: every input
//! is records, events, or a typed error. The first byte picks where the bytes are cut
//! into buffers.

#![no_main]

use std::collections::VecDeque;

use libfuzzer_sys::fuzz_target;
use weir_engine::element::Record;
use weir_engine::exchange::{
    GateEvent, InputChannel, InputGate, LocalBufferPool, LocalPoolConfig, NetworkBufferPool,
    SharedBuffer,
};

/// A channel that hands out prepared buffers, then says its producer is gone.
struct Replay(VecDeque<SharedBuffer>);

impl InputChannel for Replay {
    fn poll_buffer(&mut self) -> Option<SharedBuffer> {
        self.0.pop_front()
    }
    fn is_disconnected(&self) -> bool {
        self.0.is_empty()
    }
}

const SEGMENT: usize = 256;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, bytes)) = data.split_first() else {
        return;
    };
    let piece = usize::from(cut).clamp(1, SEGMENT);
    let count = bytes.len().div_ceil(piece);
    if count > 256 {
        return;
    }
    let network = NetworkBufferPool::new(count.max(1), SEGMENT).expect("pool");
    let config = LocalPoolConfig::new(count.max(1), 1);
    let mut pool = LocalBufferPool::new(&network, config).expect("local pool");
    let mut buffers = VecDeque::new();
    for chunk in bytes.chunks(piece) {
        let mut buffer = pool.request(0).expect("sized for every piece");
        buffer.as_mut_slice()[..chunk.len()].copy_from_slice(chunk);
        buffer.set_len(chunk.len());
        buffers.push_back(buffer.into_shared());
    }
    let mut gate = InputGate::<Record<(u64, Vec<u8>)>>::with_max_record_size(
        vec![Box::new(Replay(buffers))],
        1 << 16,
    )
    .expect("gate");
    for _ in 0..=bytes.len() {
        match gate.poll_next() {
            Ok(Some(GateEvent::End)) | Ok(None) | Err(_) => break,
            Ok(Some(GateEvent::Record { .. } | GateEvent::Watermark(_) | GateEvent::Barrier { .. } | GateEvent::CheckpointAborted { .. })) => {}
        }
    }
});
