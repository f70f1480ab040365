//! The I/O driver interface a worker runs on; `weir-net` implements it with io_uring
//! and with epoll.
//!
//! A driver owns its worker's sockets. Tasks queue bytes with [`Driver::send`]; each
//! loop turn, [`Driver::turn`] submits every queued send at once, reaps completions, and
//! hands received bytes and closed connections to the caller. Blocking happens only in
//! `turn` with a timeout, which is how an idle worker parks: other threads wake it
//! through [`Driver::wake_handle`].

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use crate::park::ParkBackend;

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
    /// `conn` is closed (by the peer, an error, or [`Driver::close`]) and forgotten.
    Closed {
        /// The connection.
        conn: ConnId,
        /// The error, if it did not close cleanly.
        error: Option<io::Error>,
    },
}

/// One worker's I/O.
pub trait Driver: Send {
    /// A short name for reports: `"uring"`, `"epoll"`.
    fn name(&self) -> &'static str;
    /// Takes ownership of a stream socket, connected or with a non-blocking connect in
    /// progress (the engine names no socket type: sockets are the driver's business).
    fn register(&mut self, socket: OwnedFd) -> io::Result<ConnId>;
    /// Queues `bytes` (drained from the vector) to be sent on `conn` at the next turn.
    fn send(&mut self, conn: ConnId, bytes: &mut Vec<u8>);
    /// Closes `conn`; a `Closed` event follows once the kernel let go of its buffers.
    fn close(&mut self, conn: ConnId);
    /// Submits queued sends, waits up to `timeout` (`Some(ZERO)`: not at all), and
    /// reports what happened.
    fn turn(
        &mut self,
        timeout: Option<Duration>,
        on_event: &mut dyn FnMut(DriverEvent<'_>),
    ) -> io::Result<()>;
    /// Wakes this driver's thread from `turn`, from any thread.
    fn wake_handle(&self) -> Arc<dyn ParkBackend>;
}

/// A driver with no sockets, for workers whose tasks do no I/O: `turn` sleeps on a
/// condition variable.
pub struct NoIo {
    park: Arc<crate::park::CondvarPark>,
}

impl NoIo {
    /// A driver (for any thread).
    pub fn new() -> Self {
        NoIo {
            park: Arc::new(crate::park::CondvarPark::default()),
        }
    }
}

impl Default for NoIo {
    fn default() -> Self {
        Self::new()
    }
}

impl Driver for NoIo {
    fn name(&self) -> &'static str {
        "none"
    }
    fn register(&mut self, _socket: OwnedFd) -> io::Result<ConnId> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this worker has no I/O driver",
        ))
    }
    fn send(&mut self, _conn: ConnId, bytes: &mut Vec<u8>) {
        bytes.clear();
    }
    fn close(&mut self, _conn: ConnId) {}
    fn turn(
        &mut self,
        timeout: Option<Duration>,
        _on_event: &mut dyn FnMut(DriverEvent<'_>),
    ) -> io::Result<()> {
        if timeout != Some(Duration::ZERO) {
            self.park.wait(timeout);
        }
        Ok(())
    }
    fn wake_handle(&self) -> Arc<dyn ParkBackend> {
        Arc::clone(&self.park) as Arc<dyn ParkBackend>
    }
}
