//! The io_uring plumbing every io_uring loop here shares (the workers' driver and the
//! transport's network thread): a ring whose kernel has timed waits, pushes that submit
//! when the queue is full, one submit-and-wait per turn that tells a timeout or an
//! interruption from a failure, and the read of a wake-up eventfd kept in flight.
//!
//! Buffer ownership is the owner's rule (each module's docs say it): what an operation
//! points to belongs to the kernel from the push until its completion is reaped. The
//! one buffer this module owns, the eventfd read's, lives as long as the ring; an owner
//! whose operations do not complete at shutdown calls [`Ring::leak`], which forgets it
//! with the ring rather than free memory the kernel may still write.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use io_uring::{opcode, types, IoUring};

/// How [`Ring::enter`] waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Submits and returns at once.
    No,
    /// Submits and waits for a completion, at most this long.
    For(Duration),
    /// Submits and waits for a completion, however long.
    Forever,
}

/// See the module docs.
pub(crate) struct Ring {
    ring: IoUring,
    /// The completions of the last [`enter`](Self::enter): (user data, result).
    pub(crate) completions: Vec<(u64, i32)>,
    /// The eventfd read's 8 bytes (boxed: the kernel writes them while `self` may move).
    wake_buffer: Box<u64>,
    wake_in_flight: bool,
    /// Pushes that succeed before every further one fails (tests of the error paths).
    #[cfg(test)]
    pub(crate) pushes_before_failure: Option<u32>,
}

impl Ring {
    /// A ring of `entries`; fails where the kernel refuses io_uring or lacks timed waits
    /// (`IORING_FEAT_EXT_ARG`, Linux 5.11).
    pub(crate) fn new(entries: u32) -> io::Result<Self> {
        let ring = IoUring::new(entries)?;
        if !ring.params().is_feature_ext_arg() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "kernel lacks IORING_FEAT_EXT_ARG (Linux 5.11)",
            ));
        }
        Ok(Ring {
            ring,
            completions: Vec::with_capacity(entries as usize),
            wake_buffer: Box::new(0),
            wake_in_flight: false,
            #[cfg(test)]
            pushes_before_failure: None,
        })
    }

    /// Pushes `entry`, submitting first if the queue is full.
    ///
    /// # Safety
    /// Every buffer `entry` points to must stay valid and untouched until its completion
    /// is reaped (module docs).
    pub(crate) unsafe fn push(&mut self, entry: &io_uring::squeue::Entry) -> io::Result<()> {
        #[cfg(test)]
        if let Some(left) = self.pushes_before_failure {
            if left == 0 {
                return Err(io::Error::other("injected submission failure"));
            }
            self.pushes_before_failure = Some(left - 1);
        }
        // SAFETY: the caller guarantees the buffers outlive the operation.
        while unsafe { self.ring.submission().push(entry) }.is_err() {
            self.ring.submit()?;
        }
        Ok(())
    }

    /// Keeps a read of `eventfd` in flight (tagged `user_data`), so that a write to it
    /// from another thread completes a wait in [`enter`](Self::enter). Marked in flight
    /// only once the push succeeded: a failed push leaves nothing to wait for.
    pub(crate) fn arm_wake(&mut self, eventfd: RawFd, user_data: u64) -> io::Result<()> {
        if self.wake_in_flight {
            return Ok(());
        }
        let entry = opcode::Read::new(
            types::Fd(eventfd),
            (&mut *self.wake_buffer as *mut u64).cast(),
            8,
        )
        .build()
        .user_data(user_data);
        // SAFETY: `wake_buffer` is boxed in the ring, which its owner drops only after
        // every completion is reaped, or leaks (`leak`).
        unsafe { self.push(&entry)? };
        self.wake_in_flight = true;
        Ok(())
    }

    /// Whether the eventfd read is in flight.
    pub(crate) fn wake_in_flight(&self) -> bool {
        self.wake_in_flight
    }

    /// Marks the eventfd read in flight without pushing it (tests of completions).
    #[cfg(test)]
    pub(crate) fn set_wake_in_flight(&mut self, in_flight: bool) {
        self.wake_in_flight = in_flight;
    }

    /// Takes the eventfd read's completion (`result`): the next turn reads again. A
    /// failed or short read is an error: the loop's wake-ups could no longer be trusted.
    pub(crate) fn wake_done(&mut self, result: i32) -> io::Result<()> {
        self.wake_in_flight = false;
        match result {
            8 => Ok(()),
            // Interrupted or cancelled: simply read again next turn.
            r if r == -libc::EINTR || r == -libc::ECANCELED || r == -libc::EAGAIN => Ok(()),
            r if r < 0 => {
                let error = io::Error::from_raw_os_error(-r);
                Err(io::Error::new(
                    error.kind(),
                    format!("reading the wake-up eventfd failed: {error}"),
                ))
            }
            r => Err(io::Error::other(format!(
                "short read of the wake-up eventfd: {r} of 8 bytes"
            ))),
        }
    }

    /// Submits what was pushed, waits as `wait` says, and collects the completions into
    /// [`completions`](Self::completions) (replacing the last turn's). A wait that ends
    /// by its timeout, a signal or a full completion queue is not an error.
    pub(crate) fn enter(&mut self, wait: Wait) -> io::Result<()> {
        let result = match wait {
            Wait::No => self.ring.submit(),
            Wait::For(timeout) if timeout.is_zero() => self.ring.submit(),
            Wait::For(timeout) => {
                let ts = types::Timespec::from(timeout);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
            Wait::Forever => self.ring.submit_and_wait(1),
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

    /// Forgets the ring and its eventfd buffer instead of freeing them: for an owner
    /// whose operations did not complete at shutdown (module docs).
    pub(crate) fn leak(self) {
        std::mem::forget(self);
    }

    /// Forgets the eventfd buffer (the ring itself is closed when dropped, and the
    /// kernel then cancels what is in flight): for an owner that cannot give up the
    /// ring by value.
    pub(crate) fn leak_wake_buffer(&mut self) {
        std::mem::forget(std::mem::replace(&mut self.wake_buffer, Box::new(0)));
    }
}
