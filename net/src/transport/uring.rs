//! The network thread's io_uring: one submit-and-wait per loop turn for every
//! connection's read and write, the listener's readiness and the wake-up eventfd.
//!
//! Each connection has at most one read (a `Readv` into its receive segment and header
//! slot), one write (a `Writev` over its queued frames) and, while it connects, one
//! `PollAdd` in flight. Buffer ownership, which every `unsafe` push relies on: what an
//! operation points to belongs to the kernel from the push until its completion is
//! reaped. The network thread keeps a connection (its boxed header slot, discard buffer
//! and iovec arrays, the segment its read fills, the frames its write sends) unchanged
//! and alive while an operation of it is in flight: a failed connection is shut down and
//! kept, marked dead, until its last completion arrives.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use io_uring::{opcode, types};

use crate::uring::ring::{Ring, Wait};

/// A connection's read.
pub(super) const OP_RECV: u64 = 1;
/// A connection's write.
pub(super) const OP_SEND: u64 = 2;
/// A connecting socket's readiness for writing (the connect finished).
pub(super) const OP_POLL: u64 = 3;
/// The wake-up eventfd's read.
pub(super) const OP_WAKE: u64 = 4;
/// The listener's readiness.
pub(super) const OP_LISTEN: u64 = 5;
const OP_BITS: u64 = 3;
const RING_ENTRIES: u32 = 512;

/// `user_data` of an operation of `op` for connection `slot`.
pub(super) fn user_data(slot: usize, op: u64) -> u64 {
    ((slot as u64) << OP_BITS) | op
}

/// The connection slot and operation of a completion.
pub(super) fn parse(user_data: u64) -> (usize, u64) {
    (
        (user_data >> OP_BITS) as usize,
        user_data & ((1 << OP_BITS) - 1),
    )
}

/// What a connection has in flight, and the iovec arrays its operations point to.
pub(super) struct UringOps {
    pub(super) read: bool,
    pub(super) write: bool,
    pub(super) poll: bool,
    pub(super) read_iov: Box<[libc::iovec; 2]>,
    /// Bytes the read in flight asked for.
    pub(super) read_len: usize,
    /// Never grown while a write is in flight (its capacity is fixed at creation).
    pub(super) write_iov: Vec<libc::iovec>,
}

// SAFETY: the iovecs are addresses for the kernel, into memory the same connection owns;
// Rust never dereferences them, and the connection moves between threads only as a
// whole, before its network thread starts.
unsafe impl Send for UringOps {}

impl UringOps {
    pub(super) fn new(write_slices_max: usize) -> Self {
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        UringOps {
            read: false,
            write: false,
            poll: false,
            read_iov: Box::new([empty; 2]),
            read_len: 0,
            write_iov: Vec::with_capacity(write_slices_max),
        }
    }

    pub(super) fn in_flight(&self) -> bool {
        self.read || self.write || self.poll
    }
}

/// The ring, and the operations that are the thread's own.
pub(super) struct Uring {
    /// The ring, its completions and the wake-up eventfd's read (shared with the
    /// workers' driver: `crate::uring::ring`).
    pub(super) ring: Ring,
    pub(super) listen_in_flight: bool,
}

impl Uring {
    /// A ring; fails where the kernel refuses io_uring or lacks timed waits (5.11).
    pub(super) fn new() -> io::Result<Self> {
        Ok(Uring {
            ring: Ring::new(RING_ENTRIES)?,
            listen_in_flight: false,
        })
    }

    /// Pushes `entry`, submitting first if the queue is full.
    ///
    /// # Safety
    /// Every buffer `entry` points to must stay valid and untouched until its completion
    /// is reaped (module docs).
    pub(super) unsafe fn push(&mut self, entry: &io_uring::squeue::Entry) -> io::Result<()> {
        // SAFETY: the caller's guarantee, passed on.
        unsafe { self.ring.push(entry) }
    }

    /// Keeps a read of the wake-up eventfd and a poll of the listener (when given) in
    /// flight.
    pub(super) fn arm(&mut self, wake: RawFd, listener: Option<RawFd>) -> io::Result<()> {
        self.ring.arm_wake(wake, user_data(0, OP_WAKE))?;
        if let (false, Some(listener)) = (self.listen_in_flight, listener) {
            let entry = opcode::PollAdd::new(types::Fd(listener), libc::POLLIN as u32)
                .build()
                .user_data(user_data(0, OP_LISTEN));
            // SAFETY: a poll points to no memory.
            unsafe { self.push(&entry)? };
            self.listen_in_flight = true;
        }
        Ok(())
    }

    /// Submits what was pushed, waits up to `timeout` for a completion (zero: not at
    /// all), and collects the completions (in `ring.completions`).
    pub(super) fn wait(&mut self, timeout: Duration) -> io::Result<()> {
        self.ring.enter(Wait::For(timeout))
    }
}
