//! The epoll driver (through `mio`): readiness-based, the fallback where io_uring is
//! unavailable and the comparison point where it is.
//!
//! A turn writes every queued outbox (non-blocking, until `WouldBlock`), waits in
//! `epoll_wait`, then reads every readable connection until `WouldBlock`.

use std::io::{self, Read};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use weir_engine::park::ParkBackend;
use weir_engine::runtime::{ConnId, Driver, DriverEvent};

use crate::conns::Conns;
use crate::driver::Wake;
use crate::error::NetError;

const WAKE: Token = Token(usize::MAX);

struct Connection {
    stream: mio::net::TcpStream,
    outbox: Vec<u8>,
    closing: bool,
}

/// See the module docs.
pub struct EpollDriver {
    poll: Poll,
    events: Events,
    wake: Arc<Wake>,
    connections: Conns<Connection>,
    buffer: Box<[u8]>,
    closed: Vec<(ConnId, Option<io::Error>)>,
    /// Scratch lists reused every turn (no allocation per turn).
    scratch_ids: Vec<ConnId>,
    scratch_ready: Vec<(Token, bool, bool)>,
}

impl EpollDriver {
    /// A driver with its own epoll instance and eventfd.
    pub fn new() -> Result<Self, NetError> {
        let setup = |source| NetError::DriverSetup {
            driver: "epoll",
            source,
        };
        let poll = Poll::new().map_err(setup)?;
        let wake = Arc::new(Wake::new()?);
        poll.registry()
            .register(&mut SourceFd(&wake.raw()), WAKE, Interest::READABLE)
            .map_err(setup)?;
        Ok(EpollDriver {
            poll,
            events: Events::with_capacity(1024),
            wake,
            connections: Conns::new(),
            buffer: vec![0; 256 * 1024].into_boxed_slice(),
            closed: Vec::new(),
            scratch_ids: Vec::new(),
            scratch_ready: Vec::new(),
        })
    }

    fn flush(&mut self, conn: ConnId) {
        let Some(connection) = self.connections.get_mut(conn) else {
            return;
        };
        if let Err(error) =
            crate::driver::flush_outbox(&mut connection.stream, &mut connection.outbox)
        {
            self.closed.push((conn, Some(error)));
        }
    }
}

impl Driver for EpollDriver {
    fn name(&self) -> &'static str {
        "epoll"
    }

    fn register(&mut self, socket: std::os::fd::OwnedFd) -> io::Result<ConnId> {
        let stream = TcpStream::from(socket);
        stream.set_nonblocking(true)?;
        let _ = stream.set_nodelay(true);
        let id = self.connections.insert(Connection {
            stream: mio::net::TcpStream::from_std(stream),
            outbox: Vec::new(),
            closing: false,
        });
        let connection = self.connections.get_mut(id).expect("inserted above");
        if let Err(error) = self.poll.registry().register(
            &mut connection.stream,
            Token(id),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            self.connections.remove(id);
            return Err(error);
        }
        Ok(id)
    }

    fn send(&mut self, conn: ConnId, bytes: &mut Vec<u8>) {
        match self.connections.get_mut(conn) {
            Some(connection) if connection.outbox.is_empty() => {
                std::mem::swap(&mut connection.outbox, bytes)
            }
            Some(connection) => connection.outbox.append(bytes),
            None => bytes.clear(),
        }
    }

    fn close(&mut self, conn: ConnId) {
        if let Some(connection) = self.connections.get_mut(conn) {
            if !connection.closing {
                connection.closing = true;
                self.closed.push((conn, None));
            }
        }
    }

    fn turn(
        &mut self,
        timeout: Option<Duration>,
        on_event: &mut dyn FnMut(DriverEvent<'_>),
    ) -> io::Result<()> {
        let mut pending = std::mem::take(&mut self.scratch_ids);
        pending.clear();
        pending.extend(
            self.connections
                .iter()
                .filter(|(_, c)| !c.outbox.is_empty())
                .map(|(id, _)| id),
        );
        for &conn in &pending {
            self.flush(conn);
        }
        self.scratch_ids = pending;
        let timeout = if self.closed.is_empty() {
            timeout
        } else {
            Some(Duration::ZERO)
        };
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        let mut ready = std::mem::take(&mut self.scratch_ready);
        ready.clear();
        ready.extend(self.events.iter().map(|e| {
            (
                e.token(),
                e.is_readable() || e.is_read_closed() || e.is_error(),
                e.is_writable(),
            )
        }));
        for &(token, readable, writable) in &ready {
            if token == WAKE {
                self.wake.drain();
                continue;
            }
            let conn = token.0;
            if writable {
                self.flush(conn);
            }
            if !readable {
                continue;
            }
            while let Some(connection) = self.connections.get_mut(conn) {
                if connection.closing {
                    break;
                }
                match connection.stream.read(&mut self.buffer) {
                    Ok(0) => {
                        self.closed.push((conn, None));
                        break;
                    }
                    Ok(n) => on_event(DriverEvent::Received {
                        conn,
                        bytes: &self.buffer[..n],
                    }),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        self.closed.push((conn, Some(e)));
                        break;
                    }
                }
            }
        }
        self.scratch_ready = ready;
        for (conn, error) in std::mem::take(&mut self.closed) {
            if let Some(mut connection) = self.connections.remove(conn) {
                let _ = self.poll.registry().deregister(&mut connection.stream);
                let _ = connection.stream.shutdown(std::net::Shutdown::Both);
                on_event(DriverEvent::Closed { conn, error });
            }
        }
        Ok(())
    }

    fn wake_handle(&self) -> Arc<dyn ParkBackend> {
        Arc::clone(&self.wake) as Arc<dyn ParkBackend>
    }
}
