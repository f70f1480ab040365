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

use std::collections::HashMap;
use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};

use weir_engine::park::ParkBackend;
use weir_engine::runtime::{ConnId, Driver, DriverEvent};

use crate::driver::Wake;
use crate::error::NetError;

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
    ring: IoUring,
    wake: Arc<Wake>,
    wake_buffer: Box<u64>,
    wake_in_flight: bool,
    connections: HashMap<ConnId, Connection>,
    next_id: ConnId,
    completions: Vec<(u64, i32)>,
}

impl UringDriver {
    /// A ring of 1024 entries. Fails where the kernel refuses io_uring or lacks the
    /// features used (timed waits, `IORING_FEAT_EXT_ARG`, Linux 5.11).
    pub fn new() -> Result<Self, NetError> {
        let setup = |source| NetError::DriverSetup {
            driver: "uring",
            source,
        };
        let ring = IoUring::new(RING_ENTRIES).map_err(setup)?;
        if !ring.params().is_feature_ext_arg() {
            return Err(setup(io::Error::new(
                io::ErrorKind::Unsupported,
                "kernel lacks IORING_FEAT_EXT_ARG",
            )));
        }
        Ok(UringDriver {
            ring,
            wake: Arc::new(Wake::new()?),
            wake_buffer: Box::new(0),
            wake_in_flight: false,
            connections: HashMap::new(),
            next_id: 0,
            completions: Vec::with_capacity(RING_ENTRIES as usize),
        })
    }

    /// Pushes `entry`, submitting first if the queue is full.
    ///
    /// # Safety
    /// Every buffer `entry` points to must stay valid and untouched until its
    /// completion is reaped (see the module docs).
    unsafe fn push(&mut self, entry: &io_uring::squeue::Entry) -> io::Result<()> {
        // SAFETY: the caller guarantees the buffers outlive the operation.
        while unsafe { self.ring.submission().push(entry) }.is_err() {
            self.ring.submit()?;
        }
        Ok(())
    }

    fn prepare(&mut self) -> io::Result<()> {
        if !self.wake_in_flight {
            let entry = opcode::Read::new(
                types::Fd(self.wake.raw()),
                (&mut *self.wake_buffer as *mut u64).cast(),
                8,
            )
            .build()
            .user_data(KIND_WAKE);
            // SAFETY: `wake_buffer` is a Box owned by the driver, freed only after every
            // completion is reaped (Drop).
            unsafe { self.push(&entry)? };
            self.wake_in_flight = true;
        }
        let ids: Vec<ConnId> = self.connections.keys().copied().collect();
        for id in ids {
            let connection = self.connections.get_mut(&id).expect("listed above");
            if connection.closing {
                continue;
            }
            let fd = types::Fd(connection.stream.as_raw_fd());
            let mut entries = Vec::with_capacity(2);
            if !connection.recv_in_flight {
                let buffer = &mut connection.recv_buffer;
                entries.push(
                    opcode::Recv::new(fd, buffer.as_mut_ptr(), buffer.len() as u32)
                        .build()
                        .user_data(((id as u64) << KIND_BITS) | KIND_RECV),
                );
                connection.recv_in_flight = true;
            }
            if !connection.send_in_flight {
                if connection.send_offset >= connection.send_buffer.len() {
                    connection.send_buffer.clear();
                    connection.send_offset = 0;
                    std::mem::swap(&mut connection.send_buffer, &mut connection.outbox);
                }
                let remaining = &connection.send_buffer[connection.send_offset..];
                if !remaining.is_empty() {
                    entries.push(
                        opcode::Send::new(fd, remaining.as_ptr(), remaining.len() as u32)
                            .build()
                            .user_data(((id as u64) << KIND_BITS) | KIND_SEND),
                    );
                    connection.send_in_flight = true;
                }
            }
            for entry in entries {
                // SAFETY: the receive buffer and the send buffer belong to the connection,
                // which is kept (and the send buffer left untouched) while their
                // operations are in flight.
                unsafe { self.push(&entry)? };
            }
        }
        Ok(())
    }

    fn reap(&mut self) {
        self.completions.clear();
        for cqe in self.ring.completion() {
            self.completions.push((cqe.user_data(), cqe.result()));
        }
    }

    fn begin_close(&mut self, id: ConnId, error: Option<io::Error>) {
        if let Some(connection) = self.connections.get_mut(&id) {
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

    fn register(&mut self, stream: TcpStream) -> io::Result<ConnId> {
        let _ = stream.set_nodelay(true);
        let id = self.next_id;
        self.next_id += 1;
        self.connections.insert(
            id,
            Connection {
                stream,
                recv_buffer: vec![0; RECV_BUFFER].into_boxed_slice(),
                recv_in_flight: false,
                send_buffer: Vec::new(),
                send_offset: 0,
                send_in_flight: false,
                outbox: Vec::new(),
                closing: false,
                error: None,
            },
        );
        Ok(id)
    }

    fn send(&mut self, conn: ConnId, bytes: &mut Vec<u8>) {
        match self.connections.get_mut(&conn) {
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
        let result = match (timeout, closing_pending) {
            (Some(t), false) if t.is_zero() => self.ring.submit(),
            (_, true) => self.ring.submit(),
            (Some(t), false) => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
            (None, false) => self.ring.submit_and_wait(1),
        };
        match result {
            Ok(_) => {}
            Err(e)
                if e.raw_os_error() == Some(libc::ETIME)
                    || e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => return Err(e),
        }
        self.reap();
        let completions = std::mem::take(&mut self.completions);
        for &(user_data, result) in &completions {
            let kind = user_data & ((1 << KIND_BITS) - 1);
            let id = (user_data >> KIND_BITS) as ConnId;
            match kind {
                KIND_WAKE => self.wake_in_flight = false,
                KIND_RECV => {
                    let Some(connection) = self.connections.get_mut(&id) else {
                        continue;
                    };
                    connection.recv_in_flight = false;
                    if connection.closing {
                        continue;
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
                    let Some(connection) = self.connections.get_mut(&id) else {
                        continue;
                    };
                    connection.send_in_flight = false;
                    if result >= 0 {
                        connection.send_offset += result as usize;
                    } else if !connection.closing {
                        self.begin_close(id, Some(io::Error::from_raw_os_error(-result)));
                    }
                }
                _ => unreachable!("unknown io_uring user data {user_data:#x}"),
            }
        }
        self.completions = completions;
        let finished: Vec<ConnId> = self
            .connections
            .iter()
            .filter(|(_, c)| c.closing && !c.in_flight())
            .map(|(id, _)| *id)
            .collect();
        for id in finished {
            // No operation is in flight: the kernel holds none of its buffers.
            let connection = self.connections.remove(&id).expect("listed above");
            on_event(DriverEvent::Closed {
                conn: id,
                error: connection.error,
            });
        }
        Ok(())
    }

    fn wake_handle(&self) -> Arc<dyn ParkBackend> {
        Arc::clone(&self.wake) as Arc<dyn ParkBackend>
    }
}

impl Drop for UringDriver {
    fn drop(&mut self) {
        let ids: Vec<ConnId> = self.connections.keys().copied().collect();
        for id in ids {
            self.begin_close(id, None);
        }
        self.wake.wake();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let busy = self.wake_in_flight || self.connections.values().any(Connection::in_flight);
            if !busy {
                return;
            }
            if Instant::now() > deadline {
                // The kernel still owns buffers: leak them rather than free memory it may
                // write into.
                eprintln!(
                    "weir: io_uring operations did not complete at shutdown; leaking their buffers"
                );
                std::mem::forget(std::mem::take(&mut self.connections));
                std::mem::forget(std::mem::replace(&mut self.wake_buffer, Box::new(0)));
                return;
            }
            let ts = types::Timespec::from(Duration::from_millis(10));
            let args = types::SubmitArgs::new().timespec(&ts);
            let _ = self.ring.submitter().submit_with_args(1, &args);
            self.reap();
            for &(user_data, _) in &self.completions {
                let kind = user_data & ((1 << KIND_BITS) - 1);
                let id = (user_data >> KIND_BITS) as ConnId;
                match kind {
                    KIND_WAKE => self.wake_in_flight = false,
                    KIND_RECV => {
                        if let Some(c) = self.connections.get_mut(&id) {
                            c.recv_in_flight = false;
                        }
                    }
                    KIND_SEND => {
                        if let Some(c) = self.connections.get_mut(&id) {
                            c.send_in_flight = false;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}
