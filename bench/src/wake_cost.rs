//! What sleeping and waking cost a thread on this machine (`weir wake-cost`): the
//! yardstick of the low-load figures, whose CPU per record is mostly wake-ups.
//!
//! Two measurements, each the calling threads' own CPU time (user + system,
//! `CLOCK_THREAD_CPUTIME_ID`) divided by the events:
//! - **a timer that runs out**: a thread sleeps a short time (20 µs, timer slack 1 ns as
//!   a worker sets it) again and again: what a worker pays for a timer-slack sleep, a
//!   deadline it wakes for, or a lookup service's answer timer;
//! - **a wake-up by another thread**: two threads pinned to two cores wake each other in
//!   turn with `thread::unpark` (a futex) and park between: each round trip is two
//!   wake-ups, each paid by a sender and a receiver, as an arrival that unparks a worker.
//!   A hand-over that finds the other thread not yet asleep costs less and is counted
//!   all the same, one more reason the figure is a lower bound.
//!
//! Both are the measuring threads' own CPU: what the kernel and the hypervisor spend
//! outside them (an idle core leaving its halt, the interrupt that wakes it) is not
//! counted, so the figures are lower bounds of a wake-up's cost. The threads are pinned
//! where the machine lets them be (as the benchmarks' threads are).
//!
//! Nothing else runs meanwhile. In a VM both go through the hypervisor (a timer
//! interrupt, an inter-processor interrupt), which is why they cost far more than on bare
//! metal; the figures say how many records a wake-up must be shared by for a CPU per
//! record target to be reachable at all.

use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The short sleep of the timer measurement.
pub const SLEEP: Duration = Duration::from_micros(20);

/// The two figures, in ns of CPU per event.
#[derive(Debug, Clone, Copy)]
pub struct WakeCost {
    /// CPU of the sleeping thread per timed sleep of [`SLEEP`] that ran out.
    pub timer_cpu_ns: f64,
    /// Wall time per such sleep (the sleep and the way back).
    pub timer_elapsed_ns: f64,
    /// CPU of both threads per wake-up by the other thread (sender and receiver).
    pub wake_cpu_ns: f64,
    /// Wall time per wake-up (half a round trip).
    pub wake_elapsed_ns: f64,
}

impl WakeCost {
    /// The figures as the report reads them.
    pub fn to_json(self, sleeps: u64, round_trips: u64) -> Value {
        json!({
            "sleep_us": SLEEP.as_secs_f64() * 1e6,
            "sleeps": sleeps,
            "timer_cpu_ns": self.timer_cpu_ns,
            "timer_elapsed_ns": self.timer_elapsed_ns,
            "round_trips": round_trips,
            "wake_cpu_ns": self.wake_cpu_ns,
            "wake_elapsed_ns": self.wake_elapsed_ns,
        })
    }
}

/// Nanoseconds on `clock` (0 where the kernel refuses it, which a difference of two
/// readings absorbs).
pub(crate) fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime writes only it.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The calling thread's CPU time so far, in ns.
fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Measures both: `sleeps` timed sleeps, `round_trips` wake-up round trips.
pub fn measure(sleeps: u64, round_trips: u64) -> WakeCost {
    let (first, second) = crate::affinity::bench_cores();
    let (timer_cpu_ns, timer_elapsed_ns) = thread::scope(|s| {
        s.spawn(|| {
            crate::affinity::pin(first);
            // Timed waits end at their deadline, as a worker's do.
            weir_engine::runtime::exact_timers();
            let (cpu, start) = (thread_cpu_ns(), Instant::now());
            for _ in 0..sleeps {
                thread::sleep(SLEEP);
            }
            let n = sleeps.max(1) as f64;
            (
                (thread_cpu_ns() - cpu) as f64 / n,
                start.elapsed().as_nanos() as f64 / n,
            )
        })
        .join()
        .expect("the sleeping thread does not panic")
    });
    // Ping-pong: `turn` counts the goes; a thread's goes are those of its parity (the
    // first thread's even). Each passes the turn on, wakes the other, and parks until
    // its next go comes.
    let turn = AtomicU64::new(0);
    let cpu = AtomicU64::new(0);
    let start = Instant::now();
    let play = |parity: u64, core, other: &dyn Fn() -> thread::Thread| {
        crate::affinity::pin(core);
        let begin = thread_cpu_ns();
        let mut go = parity;
        while go < 2 * round_trips {
            while turn.load(Ordering::Acquire) != go {
                thread::park();
            }
            go += 2;
            turn.store(go - 1, Ordering::Release);
            other().unpark();
        }
        cpu.fetch_add(thread_cpu_ns() - begin, Ordering::Relaxed);
    };
    let first_thread = std::sync::OnceLock::new();
    let first_thread = &first_thread;
    thread::scope(|s| {
        let second_thread = s.spawn(move || {
            // Its first go (1) is passed only after the first thread named itself.
            play(1, second, &|| {
                first_thread
                    .get()
                    .cloned()
                    .expect("named before the first go")
            })
        });
        let second_handle = second_thread.thread().clone();
        s.spawn(move || {
            let _ = first_thread.set(thread::current());
            play(0, first, &|| second_handle.clone())
        });
    });
    let wakeups = (2 * round_trips).max(1) as f64;
    WakeCost {
        timer_cpu_ns,
        timer_elapsed_ns,
        wake_cpu_ns: cpu.load(Ordering::Relaxed) as f64 / wakeups,
        wake_elapsed_ns: start.elapsed().as_nanos() as f64 / wakeups,
    }
}
