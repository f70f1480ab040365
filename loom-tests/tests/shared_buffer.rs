//! Loom model of the shared (broadcast) buffer's reference count: clones dropped on
//! different threads recycle the segment exactly once, after every reader is done.
#![cfg(loom)]

use loom::thread;
use weir_engine::exchange::{LocalBufferPool, LocalPoolConfig, NetworkBufferPool};

#[test]
fn last_clone_recycles_once() {
    loom::model(|| {
        let network = NetworkBufferPool::new(1, 64).unwrap();
        let mut pool = LocalBufferPool::new(&network, LocalPoolConfig::new(1, 1)).unwrap();
        let mut buffer = pool.request(0).unwrap();
        buffer.as_mut_slice()[0] = 42;
        buffer.set_len(1);
        let a = buffer.into_shared();
        let b = a.clone();
        let reader = thread::spawn(move || {
            assert_eq!(b.as_slice(), &[42]);
            drop(b);
        });
        assert_eq!(a.as_slice(), &[42]);
        drop(a);
        reader.join().unwrap();
        // The one segment is back: a request succeeds again.
        let again = pool.request(0).expect("segment recycled");
        drop(again);
        drop(pool);
        network.assert_whole();
    });
}
