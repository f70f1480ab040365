//! The io_uring driver: completion-based, one `io_uring_enter` per loop turn.
//!
//! Every open connection keeps one `Recv` in flight into its receive buffer, and at
//! most one `Send` of its pending bytes; the worker's eventfd keeps one `Read` in flight
//! so another thread can wake a turn blocked in the kernel. All queued operations go to
//! the kernel with the turn's single submit-and-wait.
//!
//! Buffer ownership (the invariant every `unsafe` push relies on): a connection's
//! receive buffer and send buffer belong to the kernel from the push of their operation
//! until its completion is reaped; the connection (and so the buffers) is dropped only
//! when it has no operation in flight, even after `close` (the socket is shut down so
//! its operations complete). The wake buffer lives in the driver, which on drop shuts
//! everything down and reaps all completions before freeing anything, and leaks the
//! buffers instead if the kernel does not let go in time.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{opcode, types};

use weir_engine::park::ParkBackend;
use weir_engine::runtime::{ConnId, Driver, DriverEvent};

use crate::conns::Conns;
use crate::driver::Wake;
use crate::error::NetError;

pub(crate) mod ring;
use ring::{Ring, Wait};

const KIND_RECV: u64 = 1;
const KIND_SEND: u64 = 2;
const KIND_WAKE: u64 = 3;
const KIND_BITS: u64 = 2;
const RECV_BUFFER: usize = 256 * 1024;
const RING_ENTRIES: u32 = 1024;

struct Connection {
    stream: TcpStream,
    recv_buffer: Box<[u8]>,
    recv_in_flight: bool,
    /// Bytes owned by the in-flight send (from `send_offset`); not touched meanwhile.
    send_buffer: Vec<u8>,
    send_offset: usize,
    send_in_flight: bool,
    /// Bytes queued for the next send.
    outbox: Vec<u8>,
    closing: bool,
    error: Option<io::Error>,
}

impl Connection {
    fn in_flight(&self) -> bool {
        self.recv_in_flight || self.send_in_flight
    }
}

/// See the module docs.
pub struct UringDriver {
    ring: Ring,
    wake: Arc<Wake>,
    connections: Conns<Connection>,
    /// Connection ids, reused every turn (no allocation per turn).
    scratch_ids: Vec<ConnId>,
}

impl UringDriver {
    /// A ring of 1024 entries. Fails where the kernel refuses io_uring or lacks the
    /// features used (timed waits, `IORING_FEAT_EXT_ARG`, Linux 5.11).
    pub fn new() -> Result<Self, NetError> {
        let setup = |source| NetError::DriverSetup {
            driver: "uring",
            source,
        };
        let ring = Ring::new(RING_ENTRIES).map_err(setup)?;
        Ok(UringDriver {
            ring,
            wake: Arc::new(Wake::new()?),
            connections: Conns::new(),
            scratch_ids: Vec::new(),
        })
    }

    /// Pushes `entry`, submitting first if the queue is full.
    ///
    /// # Safety
    /// Every buffer `entry` points to must stay valid and untouched until its
    /// completion is reaped (see the module docs).
    unsafe fn push(&mut self, entry: &io_uring::squeue::Entry) -> io::Result<()> {
        // SAFETY: the caller's guarantee, passed on.
        unsafe { self.ring.push(entry) }
    }

    fn prepare(&mut self) -> io::Result<()> {
        // Each operation is marked in flight only once its push succeeded: a failed push
        // leaves nothing for `Drop` to wait for.
        self.ring.arm_wake(self.wake.raw(), KIND_WAKE)?;
        let mut ids = std::mem::take(&mut self.scratch_ids);
        ids.clear();
        ids.extend(self.connections.iter().map(|(id, _)| id));
        let pushed = self.prepare_connections(&ids);
        self.scratch_ids = ids;
        pushed
    }

    fn prepare_connections(&mut self, ids: &[ConnId]) -> io::Result<()> {
        for &id in ids {
            let connection = self.connections.get_mut(id).expect("listed above");
            if connection.closing {
                continue;
            }
            let fd = types::Fd(connection.stream.as_raw_fd());
            if !connection.recv_in_flight {
                let buffer = &mut connection.recv_buffer;
                let entry = opcode::Recv::new(fd, buffer.as_mut_ptr(), buffer.len() as u32)
                    .build()
                    .user_data(((id as u64) << KIND_BITS) | KIND_RECV);
                // SAFETY: the receive buffer belongs to the connection, which is kept
                // while its receive is in flight (flag set just below).
                unsafe { self.push(&entry)? };
                self.connections
                    .get_mut(id)
                    .expect("listed above")
                    .recv_in_flight = true;
            }
            let connection = self.connections.get_mut(id).expect("listed above");
            if !connection.send_in_flight {
                if connection.send_offset >= connection.send_buffer.len() {
                    connection.send_buffer.clear();
                    connection.send_offset = 0;
                    std::mem::swap(&mut connection.send_buffer, &mut connection.outbox);
                }
                let remaining = &connection.send_buffer[connection.send_offset..];
                if !remaining.is_empty() {
                    let entry = opcode::Send::new(fd, remaining.as_ptr(), remaining.len() as u32)
                        .build()
                        .user_data(((id as u64) << KIND_BITS) | KIND_SEND);
                    // SAFETY: the send buffer belongs to the connection, which is kept and
                    // leaves the buffer untouched while its send is in flight (flag set
                    // just below).
                    unsafe { self.push(&entry)? };
                    self.connections
                        .get_mut(id)
                        .expect("listed above")
                        .send_in_flight = true;
                }
            }
        }
        Ok(())
    }

    /// Applies one completion. Every result is checked: a failed receive or send
    /// closes its connection with the error; a failed or short read of the wake-up
    /// eventfd is the driver's own error (its wake-ups could no longer be trusted).
    fn complete(
        &mut self,
        user_data: u64,
        result: i32,
        on_event: &mut dyn FnMut(DriverEvent<'_>),
    ) -> io::Result<()> {
        let kind = user_data & ((1 << KIND_BITS) - 1);
        let id = (user_data >> KIND_BITS) as ConnId;
        match kind {
            KIND_WAKE => self.ring.wake_done(result).map_err(|error| {
                io::Error::new(error.kind(), format!("the worker's driver: {error}"))
            })?,
            KIND_RECV => {
                let Some(connection) = self.connections.get_mut(id) else {
                    return Ok(());
                };
                connection.recv_in_flight = false;
                if connection.closing {
                    return Ok(());
                }
                if result > 0 {
                    on_event(DriverEvent::Received {
                        conn: id,
                        bytes: &connection.recv_buffer[..result as usize],
                    });
                } else if result == 0 {
                    self.begin_close(id, None);
                } else {
                    self.begin_close(id, Some(io::Error::from_raw_os_error(-result)));
                }
            }
            KIND_SEND => {
                let Some(connection) = self.connections.get_mut(id) else {
                    return Ok(());
                };
                connection.send_in_flight = false;
                if result >= 0 {
                    connection.send_offset += result as usize;
                } else if !connection.closing {
                    self.begin_close(id, Some(io::Error::from_raw_os_error(-result)));
                }
            }
            _ => {
                return Err(io::Error::other(format!(
                    "io_uring completion with unknown user data {user_data:#x}"
                )))
            }
        }
        Ok(())
    }

    fn begin_close(&mut self, id: ConnId, error: Option<io::Error>) {
        if let Some(connection) = self.connections.get_mut(id) {
            if !connection.closing {
                connection.closing = true;
                connection.error = error;
                // Completes the connection's in-flight operations.
                let _ = connection.stream.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

impl Driver for UringDriver {
    fn name(&self) -> &'static str {
        "uring"
    }

    fn register(&mut self, socket: std::os::fd::OwnedFd) -> io::Result<ConnId> {
        let stream = TcpStream::from(socket);
        let _ = stream.set_nodelay(true);
        let id = self.connections.insert(Connection {
            stream,
            recv_buffer: vec![0; RECV_BUFFER].into_boxed_slice(),
            recv_in_flight: false,
            send_buffer: Vec::new(),
            send_offset: 0,
            send_in_flight: false,
            outbox: Vec::new(),
            closing: false,
            error: None,
        });
        Ok(id)
    }

    fn send(&mut self, conn: ConnId, bytes: &mut Vec<u8>) {
        match self.connections.get_mut(conn) {
            Some(connection) if !connection.closing => {
                if connection.outbox.is_empty() {
                    std::mem::swap(&mut connection.outbox, bytes);
                } else {
                    connection.outbox.append(bytes);
                }
            }
            _ => bytes.clear(),
        }
    }

    fn close(&mut self, conn: ConnId) {
        self.begin_close(conn, None);
    }

    fn turn(
        &mut self,
        timeout: Option<Duration>,
        on_event: &mut dyn FnMut(DriverEvent<'_>),
    ) -> io::Result<()> {
        self.prepare()?;
        let closing_pending = self
            .connections
            .values()
            .any(|c| c.closing && !c.in_flight());
        // A connection closing with nothing in flight is reported this turn: no wait.
        let wait = match (timeout, closing_pending) {
            (_, true) => Wait::No,
            (Some(t), false) => Wait::For(t),
            (None, false) => Wait::Forever,
        };
        self.ring.enter(wait)?;
        let completions = std::mem::take(&mut self.ring.completions);
        let mut failure = None;
        for &(user_data, result) in &completions {
            if let Err(error) = self.complete(user_data, result, on_event) {
                failure.get_or_insert(error);
            }
        }
        self.ring.completions = completions;
        let mut finished = std::mem::take(&mut self.scratch_ids);
        finished.clear();
        finished.extend(
            self.connections
                .iter()
                .filter(|(_, c)| c.closing && !c.in_flight())
                .map(|(id, _)| id),
        );
        for &id in &finished {
            // No operation is in flight: the kernel holds none of its buffers.
            let connection = self.connections.remove(id).expect("listed above");
            on_event(DriverEvent::Closed {
                conn: id,
                error: connection.error,
            });
        }
        self.scratch_ids = finished;
        match failure {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    fn wake_handle(&self) -> Arc<dyn ParkBackend> {
        Arc::clone(&self.wake) as Arc<dyn ParkBackend>
    }
}

impl Drop for UringDriver {
    fn drop(&mut self) {
        let ids: Vec<ConnId> = self.connections.iter().map(|(id, _)| id).collect();
        for id in ids {
            self.begin_close(id, None);
        }
        self.wake.wake();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let busy =
                self.ring.wake_in_flight() || self.connections.values().any(Connection::in_flight);
            if !busy {
                return;
            }
            if Instant::now() > deadline {
                // The kernel still owns buffers: leak them rather than free memory it may
                // write into.
                eprintln!(
                    "weir: io_uring operations did not complete at shutdown; leaking their buffers"
                );
                std::mem::forget(std::mem::replace(&mut self.connections, Conns::new()));
                self.ring.leak_wake_buffer();
                return;
            }
            let _ = self.ring.enter(Wait::For(Duration::from_millis(10)));
            let completions = std::mem::take(&mut self.ring.completions);
            for &(user_data, result) in &completions {
                let kind = user_data & ((1 << KIND_BITS) - 1);
                let id = (user_data >> KIND_BITS) as ConnId;
                match kind {
                    KIND_WAKE => {
                        let _ = self.ring.wake_done(result);
                    }
                    KIND_RECV => {
                        if let Some(c) = self.connections.get_mut(id) {
                            c.recv_in_flight = false;
                        }
                    }
                    KIND_SEND => {
                        if let Some(c) = self.connections.get_mut(id) {
                            c.send_in_flight = false;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn driver_with_connection() -> Option<(UringDriver, ConnId, TcpStream)> {
        let mut driver = match UringDriver::new() {
            Ok(driver) => driver,
            Err(error) => {
                eprintln!("io_uring unavailable here, test skipped: {error}");
                return None;
            }
        };
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        let id = driver.register(client.into()).expect("register");
        Some((driver, id, server))
    }

    /// A push that fails leaves no operation marked in flight, so shutdown has nothing
    /// to wait for (it used to wait 5 s and leak the buffers).
    #[test]
    fn a_failed_push_marks_nothing_in_flight() {
        let Some((mut driver, id, _server)) = driver_with_connection() else {
            return;
        };
        let mut bytes = b"hello".to_vec();
        driver.send(id, &mut bytes);
        // The wake-up read goes in; the connection's receive is refused.
        driver.ring.pushes_before_failure = Some(1);
        let error = driver
            .turn(Some(Duration::ZERO), &mut |_| {})
            .expect_err("the push fails");
        assert!(error.to_string().contains("injected"), "{error}");
        assert!(driver.ring.wake_in_flight());
        assert!(driver.connections.values().all(|c| !c.in_flight()));
        // Then the receive goes in and the send is refused.
        driver.ring.pushes_before_failure = Some(1);
        assert!(driver.turn(Some(Duration::ZERO), &mut |_| {}).is_err());
        let connection = driver.connections.get_mut(id).expect("open");
        assert!(connection.recv_in_flight && !connection.send_in_flight);
        driver.ring.pushes_before_failure = None;
        let started = Instant::now();
        drop(driver);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "drop did not wait out"
        );
    }

    /// The wake-up read's result is checked: an error is the driver's error, a normal
    /// read re-arms.
    #[test]
    fn a_failed_wake_read_is_an_error() {
        let Some((mut driver, _id, _server)) = driver_with_connection() else {
            return;
        };
        let mut events = |_: DriverEvent<'_>| {};
        driver.ring.set_wake_in_flight(true);
        assert!(driver.complete(KIND_WAKE, 8, &mut events).is_ok());
        assert!(!driver.ring.wake_in_flight());
        let error = driver
            .complete(KIND_WAKE, -libc::EBADF, &mut events)
            .expect_err("a failed wake read");
        assert!(error.to_string().contains("wake-up eventfd"), "{error}");
        assert!(driver.complete(KIND_WAKE, 3, &mut events).is_err());
        assert!(driver
            .complete(KIND_WAKE, -libc::EINTR, &mut events)
            .is_ok());
    }
}
