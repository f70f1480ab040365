//! Choosing a driver (io_uring or epoll) for the engine's
//! [`Driver`] interface, and the eventfd both use to be
//! woken from another thread.

use std::time::Duration;

use weir_engine::park::ParkBackend;
use weir_engine::runtime::Driver;

use crate::error::NetError;

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
            other => Err(format!(
                "unknown driver {other:?}; use uring, epoll or auto"
            )),
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
            return Err(NetError::io(
                "creating an eventfd",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        let fd = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
        Ok(Wake { fd })
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
        let mut poll = libc::pollfd {
            fd: self.raw(),
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut poll, 1, millis) };
        self.drain();
    }

    fn wake(&self) {
        Wake::wake(self);
    }
}

/// Writes from the front of `outbox` until the socket would block, and removes what was
/// written. `Err` on a socket error (the connection is finished).
pub(crate) fn flush_outbox(
    stream: &mut impl std::io::Write,
    outbox: &mut Vec<u8>,
) -> std::io::Result<()> {
    let mut written = 0;
    let result = loop {
        if written == outbox.len() {
            break Ok(());
        }
        match stream.write(&outbox[written..]) {
            Ok(0) => break Ok(()),
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => break Err(e),
        }
    };
    outbox.drain(..written);
    result
}

/// A [`DriverFactory`](weir_engine::runtime::DriverFactory) making a driver of `kind`
/// for each worker, for [`RuntimeBuilder::driver`](weir_engine::runtime::RuntimeBuilder::driver).
pub fn factory(kind: DriverKind) -> weir_engine::runtime::DriverFactory {
    std::sync::Arc::new(move || build(kind).map_err(|e| std::io::Error::other(e.to_string())))
}
