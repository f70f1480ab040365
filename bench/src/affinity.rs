//! Pinning benchmark threads to cores, degrading gracefully where pinning is refused
//! or the machine has a single core.

use std::sync::{Arc, Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// The cores benchmark threads are placed on: the first two available, or the same one
/// twice on a single-core machine.
pub fn bench_cores() -> (Option<core_affinity::CoreId>, Option<core_affinity::CoreId>) {
    static CORES: OnceLock<Vec<core_affinity::CoreId>> = OnceLock::new();
    let cores = CORES.get_or_init(|| core_affinity::get_core_ids().unwrap_or_default());
    match cores.as_slice() {
        [] => (None, None),
        [only] => (Some(*only), Some(*only)),
        [first, second, ..] => (Some(*first), Some(*second)),
    }
}

/// Pins the calling thread to `core` if given; returns whether pinning took effect.
pub fn pin(core: Option<core_affinity::CoreId>) -> bool {
    core.is_some_and(core_affinity::set_for_current)
}

/// Backs off in a spin-wait: a few spins, then yields, so that a benchmark whose two
/// threads share one core still makes progress.
#[derive(Debug, Default)]
pub struct Backoff(u32);

impl Backoff {
    /// Waits a little longer each call.
    #[inline]
    pub fn snooze(&mut self) {
        if self.0 < 64 {
            std::hint::spin_loop();
            self.0 += 1;
        } else {
            std::thread::yield_now();
        }
    }

    /// Progress was made: start spinning again.
    #[inline]
    pub fn reset(&mut self) {
        self.0 = 0;
    }
}

/// Runs `producer` and `consumer` on the two bench cores, timing from a shared start
/// barrier until the consumer returns.
pub fn run_pair(
    producer: impl FnOnce() + Send + 'static,
    consumer: impl FnOnce() + Send + 'static,
) -> Duration {
    let (core_a, core_b) = bench_cores();
    let barrier = Arc::new(Barrier::new(3));
    let start_gate = Arc::clone(&barrier);
    let receiver = thread::spawn(move || {
        pin(core_b);
        start_gate.wait();
        consumer();
        Instant::now()
    });
    let start_gate = Arc::clone(&barrier);
    let sender = thread::spawn(move || {
        pin(core_a);
        start_gate.wait();
        producer();
    });
    barrier.wait();
    let start = Instant::now();
    sender.join().expect("producer thread panicked");
    let end = receiver.join().expect("consumer thread panicked");
    end.saturating_duration_since(start)
}
