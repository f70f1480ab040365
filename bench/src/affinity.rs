//! Pinning benchmark threads to cores, degrading gracefully where pinning is refused
//! or the machine has a single core.

use std::sync::atomic::{AtomicU64, Ordering};
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

/// Held by each test that runs a workload pinning threads to the bench cores: two such
/// workloads side by side (the test harness runs tests in parallel) put two spinning
/// threads on one core and slow each other down by orders of magnitude, which says
/// nothing about either.
#[cfg(test)]
pub(crate) fn exclusive_cores() -> std::sync::MutexGuard<'static, ()> {
    static CORES: std::sync::Mutex<()> = std::sync::Mutex::new(());
    CORES.lock().unwrap_or_else(|e| e.into_inner())
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

/// The start of a timed run, shared by the run's threads: each waits at the line, then
/// notes when it left; the run starts at the earliest of those instants. The spawning
/// thread does not take the start itself: with two pinned, spinning threads on two
/// cores it is often descheduled right after the barrier, and a start read then would
/// come late and understate the time (a turn could even read as zero).
#[derive(Debug)]
pub struct StartLine {
    barrier: Barrier,
    epoch: Instant,
    first_ns: AtomicU64,
}

impl StartLine {
    /// A line for `threads` threads.
    pub fn new(threads: usize) -> Arc<StartLine> {
        Arc::new(StartLine {
            barrier: Barrier::new(threads),
            epoch: Instant::now(),
            first_ns: AtomicU64::new(u64::MAX),
        })
    }

    /// Waits for every thread, then notes this thread's start.
    pub fn wait(&self) {
        self.barrier.wait();
        let ns = self.epoch.elapsed().as_nanos() as u64;
        // Relaxed: read after the threads are joined, which orders it.
        self.first_ns.fetch_min(ns, Ordering::Relaxed);
    }

    /// The earliest start noted (call after joining the threads).
    pub fn start(&self) -> Instant {
        match self.first_ns.load(Ordering::Relaxed) {
            u64::MAX => Instant::now(),
            ns => self.epoch + Duration::from_nanos(ns),
        }
    }
}

/// Runs `producer` and `consumer` on the two bench cores, timing from their start line
/// until the consumer returns.
pub fn run_pair(
    producer: impl FnOnce() + Send + 'static,
    consumer: impl FnOnce() + Send + 'static,
) -> Duration {
    let (core_a, core_b) = bench_cores();
    let line = StartLine::new(2);
    let start_line = Arc::clone(&line);
    let receiver = thread::spawn(move || {
        pin(core_b);
        start_line.wait();
        consumer();
        Instant::now()
    });
    let start_line = Arc::clone(&line);
    let sender = thread::spawn(move || {
        pin(core_a);
        start_line.wait();
        producer();
    });
    sender.join().expect("producer thread panicked");
    let end = receiver.join().expect("consumer thread panicked");
    end.saturating_duration_since(line.start())
}
