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

use io_uring::{opcode, types, IoUring};

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
    ring: IoUring,
    pub(super) completions: Vec<(u64, i32)>,
    wake_buffer: Box<u64>,
    pub(super) wake_in_flight: bool,
    pub(super) listen_in_flight: bool,
}

impl Uring {
    /// A ring; fails where the kernel refuses io_uring or lacks timed waits (5.11).
    pub(super) fn new() -> io::Result<Self> {
        let ring = IoUring::new(RING_ENTRIES)?;
        if !ring.params().is_feature_ext_arg() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "kernel lacks IORING_FEAT_EXT_ARG (Linux 5.11)",
            ));
        }
        Ok(Uring {
            ring,
            completions: Vec::with_capacity(RING_ENTRIES as usize),
            wake_buffer: Box::new(0),
            wake_in_flight: false,
            listen_in_flight: false,
        })
    }

    /// Pushes `entry`, submitting first if the queue is full.
    ///
    /// # Safety
    /// Every buffer `entry` points to must stay valid and untouched until its completion
    /// is reaped (module docs).
    pub(super) unsafe fn push(&mut self, entry: &io_uring::squeue::Entry) -> io::Result<()> {
        // SAFETY: the caller guarantees the buffers outlive the operation.
        while unsafe { self.ring.submission().push(entry) }.is_err() {
            self.ring.submit()?;
        }
        Ok(())
    }

    /// Keeps a read of the wake-up eventfd and a poll of the listener in flight.
    pub(super) fn arm(&mut self, wake: RawFd, listener: RawFd) -> io::Result<()> {
        if !self.wake_in_flight {
            let entry = opcode::Read::new(
                types::Fd(wake),
                (&mut *self.wake_buffer as *mut u64).cast(),
                8,
            )
            .build()
            .user_data(user_data(0, OP_WAKE));
            // SAFETY: `wake_buffer` is boxed in the ring's owner, which is dropped only
            // after every completion is reaped (`Net::shutdown`).
            unsafe { self.push(&entry)? };
            self.wake_in_flight = true;
        }
        if !self.listen_in_flight {
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
    /// all), and collects the completions.
    pub(super) fn wait(&mut self, timeout: Duration) -> io::Result<()> {
        let result = if timeout.is_zero() {
            self.ring.submit()
        } else {
            let ts = types::Timespec::from(timeout);
            let args = types::SubmitArgs::new().timespec(&ts);
            self.ring.submitter().submit_with_args(1, &args)
        };
        match result {
            Ok(_) => {}
            Err(e)
                if e.raw_os_error() == Some(libc::ETIME)
                    || e.raw_os_error() == Some(libc::EINTR)
                    || e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => return Err(e),
        }
        self.completions.clear();
        for cqe in self.ring.completion() {
            self.completions.push((cqe.user_data(), cqe.result()));
        }
        Ok(())
    }
}
