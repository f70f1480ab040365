//! The one place that names atomics, cells, `Arc`, thread parking and spin hints.
//!
//! Under `--cfg loom` every name here resolves to its `loom` counterpart, so the
//! models in `loom-tests/` explore every interleaving of the real code. Nothing
//! else in the engine may import `core::sync::atomic`, `std::cell::UnsafeCell` or
//! `std::thread::park` directly.

#[cfg(loom)]
pub(crate) use loom::{
    cell::UnsafeCell,
    sync::{
        atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering},
        Arc, Mutex,
    },
};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub(crate) use std::sync::Arc;

#[cfg(not(loom))]
pub(crate) use cell::UnsafeCell;

/// Lets the CPU know we are in a spin loop (under loom: yields to the scheduler).
#[allow(dead_code)]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}

/// Thread handles and parking, switched like the atomics.
pub(crate) mod thread {
    #[cfg(loom)]
    pub(crate) use loom::thread::{current, park, Thread};
    #[cfg(not(loom))]
    pub(crate) use std::thread::{current, park, park_timeout, Thread};

    /// Loom has no clock: a timed park is an untimed one, which the models never rely on
    /// returning by itself.
    #[cfg(loom)]
    pub(crate) fn park_timeout(_timeout: std::time::Duration) {
        park();
    }
}

#[cfg(not(loom))]
mod cell {
    /// `std::cell::UnsafeCell` with loom's closure-based access API, so the same code
    /// compiles against both.
    #[derive(Debug)]
    #[repr(transparent)]
    pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            Self(core::cell::UnsafeCell::new(value))
        }

        /// Calls `f` with a shared raw pointer to the contents.
        #[inline(always)]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        /// Calls `f` with a mutable raw pointer to the contents.
        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

/// A number unique to the calling thread for the life of the process (never reused,
/// unlike thread-local addresses), for same-thread fast paths.
#[inline]
pub(crate) fn thread_token() -> u64 {
    use std::cell::Cell;
    // A std atomic on purpose: it only hands out ids and is not part of any protocol.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    #[cfg(not(loom))]
    std::thread_local!(static TOKEN: Cell<u64> = const { Cell::new(0) });
    #[cfg(loom)]
    loom::thread_local!(static TOKEN: Cell<u64> = Cell::new(0));
    TOKEN.with(|token| {
        let mut value = token.get();
        if value == 0 {
            value = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            token.set(value);
        }
        value
    })
}
