//! The per-worker I/O driver interface, and the choice between io_uring and epoll.
//!
//! A driver owns the worker's sockets. Tasks queue bytes with [`Driver::send`]; each
//! loop turn, [`Driver::turn`] submits every queued send at once (one `io_uring_enter`,
//! or one `write` per connection with epoll), reaps completions, and hands received
//! bytes and closed connections to the caller. Blocking happens only in `turn` with a
//! timeout, which is how an idle worker parks: another thread wakes it through the
//! driver's [`Wake`] handle (an eventfd).

use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use weir_engine::park::ParkBackend;

use crate::error::NetError;

/// A connection registered with a driver.
pub type ConnId = usize;

/// What a turn reports.
#[derive(Debug)]
pub enum DriverEvent<'a> {
    /// Bytes arrived on `conn`.
    Received {
        /// The connection.
        conn: ConnId,
        /// The bytes (valid during the callback).
        bytes: &'a [u8],
    },
    /// `conn` is closed (by the peer, an error, or [`Driver::close`]); it is forgotten.
    Closed {
        /// The connection.
        conn: ConnId,
        /// The error, if it did not close cleanly.
        error: Option<std::io::Error>,
    },
}

/// One worker's I/O.
pub trait Driver {
    /// `"uring"` or `"epoll"`.
    fn name(&self) -> &'static str;
    /// Takes ownership of a connected stream.
    fn register(&mut self, stream: TcpStream) -> Result<ConnId, NetError>;
    /// Queues `bytes` (drained from the vector) to be sent on `conn` at the next turn.
    fn send(&mut self, conn: ConnId, bytes: &mut Vec<u8>);
    /// Closes `conn`; a `Closed` event follows once the kernel has let go of its buffers.
    fn close(&mut self, conn: ConnId);
    /// Submits queued sends, waits up to `timeout` (`Some(ZERO)`: not at all) for
    /// something to happen, and reports what did.
    fn turn(&mut self, timeout: Option<Duration>, on_event: &mut dyn FnMut(DriverEvent<'_>)) -> Result<(), NetError>;
    /// A handle that wakes this driver's thread from `turn`, from any thread.
    fn wake_handle(&self) -> Arc<Wake>;
}

/// Which driver to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverKind {
    /// io_uring, falling back to epoll where the kernel refuses it.
    Auto,
    /// io_uring only.
    Uring,
    /// epoll (mio) only.
    Epoll,
}

impl std::str::FromStr for DriverKind {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(DriverKind::Auto),
            "uring" | "io_uring" => Ok(DriverKind::Uring),
            "epoll" | "mio" => Ok(DriverKind::Epoll),
            other => Err(format!("unknown driver {other:?}; use uring, epoll or auto")),
        }
    }
}

/// Builds a driver of `kind`; `Auto` tries io_uring and falls back to epoll, saying why.
pub fn build(kind: DriverKind) -> Result<Box<dyn Driver>, NetError> {
    match kind {
        DriverKind::Uring => Ok(Box::new(crate::uring::UringDriver::new()?)),
        DriverKind::Epoll => Ok(Box::new(crate::epoll::EpollDriver::new()?)),
        DriverKind::Auto => match crate::uring::UringDriver::new() {
            Ok(driver) => Ok(Box::new(driver)),
            Err(error) => {
                eprintln!("weir: io_uring unavailable ({error}); using epoll");
                Ok(Box::new(crate::epoll::EpollDriver::new()?))
            }
        },
    }
}

/// The driver `WEIR_DRIVER` names (`uring`, `epoll`, `auto`), or `Auto`.
pub fn kind_from_env() -> Result<DriverKind, String> {
    match std::env::var("WEIR_DRIVER") {
        Ok(value) => value.parse(),
        Err(_) => Ok(DriverKind::Auto),
    }
}

/// An eventfd that wakes a driver blocked in `turn`.
#[derive(Debug)]
pub struct Wake {
    fd: std::os::fd::OwnedFd,
}

impl Wake {
    pub(crate) fn new() -> Result<Self, NetError> {
        // SAFETY: eventfd has no memory-safety preconditions; we check the result.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(NetError::io("creating an eventfd", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        Ok(Wake { fd: unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) } })
    }

    pub(crate) fn raw(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.fd)
    }

    /// Makes the driver's current or next `turn` return.
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd. A full counter (EAGAIN)
        // already means a pending wake-up, so the result needs no handling.
        unsafe { libc::write(self.raw(), (&one as *const u64).cast(), 8) };
    }

    /// Clears pending wake-ups (epoll driver; io_uring reads it with an operation).
    pub(crate) fn drain(&self) {
        let mut value: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64; EAGAIN (nothing pending) is fine.
        unsafe { libc::read(self.raw(), (&mut value as *mut u64).cast(), 8) };
    }
}

impl ParkBackend for Wake {
    /// Blocks on the eventfd itself (for a thread that parks without its driver).
    fn wait(&self, timeout: Option<Duration>) {
        let mut poll = libc::pollfd { fd: self.raw(), events: libc::POLLIN, revents: 0 };
        let millis = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut poll, 1, millis) };
        self.drain();
    }

    fn wake(&self) {
        Wake::wake(self);
    }
}
