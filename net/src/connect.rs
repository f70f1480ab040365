//! A client's connection on its worker's driver, for both the lookup client and the
//! Redis client: connected without blocking the worker, given up when the connect
//! takes too long, and shut down when it is dropped.
//!
//! A blocking `TcpStream::connect` waits for the handshake to end: against an address
//! that drops connection attempts that is minutes (the kernel retransmits the SYN
//! `tcp_syn_retries` times, 6 by default: about 127 s), during which the worker runs
//! nothing else. A [`Link`] starts a non-blocking connect instead and hands the socket
//! to the driver at once (drivers take a socket whose connect is in progress, and send
//! what is queued on it once the connect completes); its owner asks
//! [`Link::poll_connect`] each turn whether the handshake ended, and closes the link
//! when the connect timeout passed first.
//!
//! How each client times its connect: the lookup client polls the connect against its
//! `connect_timeout` as above. The Redis client times its set-up (the connect, then
//! `HELLO`, `AUTH`, `SELECT`) against its `connect_timeout` from the moment it opened
//! the link, and a connection with no set-up command against its request timeout, as
//! it does with commands; it does not poll the connect, so [`Link::is_connecting`]
//! means nothing to it.
//!
//! The link keeps a second descriptor of the socket (a `dup`) that the driver does not
//! know, for two things the driver interface does not offer: seeing whether the
//! connect completed (`getpeername`), and shutting the socket down when the link is
//! dropped. A client dropped with its task has no driver to close through; without
//! the shutdown the driver would keep the connection open, and its peer would wait on
//! it, until the worker stops. The shutdown ends the connection for both: the peer
//! reads the end of the stream, and the driver sees it too and lets its descriptor go
//! (a connect still in progress is abandoned).
//!
//! Invariants:
//! 1. `socket` and the driver's connection `id` are the same socket.
//! 2. The owner drops the link as soon as the connection ends: when it closes it or
//!    the driver reports it closed. So the extra descriptor never outlives the
//!    driver's, and an ended connection is not kept open by it.
//! 3. An owner that closes a connection closes it with [`Link::close`], or closes its
//!    id through the driver first and drops the link after (the Redis client, which
//!    fails a connection while it handles a driver event, keeps the link until its next
//!    flush closes the id). Never the other way round: the link's shutdown lets the
//!    driver see the end (on epoll within the same turn), forget the id and give it to
//!    a new connection, which a later close of the id would then close.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::OwnedFd;

use weir_engine::runtime::{ConnId, Driver};

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Link {
    id: ConnId,
    /// A second descriptor of the socket the driver holds as `id`.
    socket: TcpStream,
    /// While the connect is in progress: when it started, by the owner's clock.
    connecting_since_ns: Option<u64>,
}

/// Where a link's connect stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Connect {
    /// The handshake completed.
    Done,
    /// Still under way, within the timeout.
    InProgress,
    /// Still under way past the timeout: the owner closes the link.
    TimedOut,
}

impl Link {
    /// Starts a non-blocking connect to `addr` and registers the socket with `driver`;
    /// `now_ns` (the owner's clock) starts the connect timeout.
    pub(crate) fn open(addr: SocketAddr, driver: &mut dyn Driver, now_ns: u64) -> io::Result<Link> {
        let socket = OwnedFd::from(mio::net::TcpStream::connect(addr)?);
        let own = TcpStream::from(socket.try_clone()?);
        let id = driver.register(socket)?;
        Ok(Link {
            id,
            socket: own,
            connecting_since_ns: Some(now_ns),
        })
    }

    /// The driver's connection.
    pub(crate) fn id(&self) -> ConnId {
        self.id
    }

    /// Whether the connect was not yet seen complete (by
    /// [`poll_connect`](Self::poll_connect)): a failure now is a failed connect.
    pub(crate) fn is_connecting(&self) -> bool {
        self.connecting_since_ns.is_some()
    }

    /// Whether the connect completed, at `now_ns`, given `timeout_ns`. A connect that
    /// failed (refused, reset) reads as in progress here: the driver reports the
    /// connection closed.
    pub(crate) fn poll_connect(&mut self, now_ns: u64, timeout_ns: u64) -> Connect {
        let Some(since_ns) = self.connecting_since_ns else {
            return Connect::Done;
        };
        // `getpeername` succeeds once the handshake completed; before, it fails with
        // `ENOTCONN` (as it does after a failed connect).
        if self.socket.peer_addr().is_ok() {
            self.connecting_since_ns = None;
            return Connect::Done;
        }
        if now_ns.saturating_sub(since_ns) > timeout_ns {
            Connect::TimedOut
        } else {
            Connect::InProgress
        }
    }

    /// When a connect in progress times out (the first `now_ns` at which
    /// [`poll_connect`](Self::poll_connect) says so); `None` once connected.
    pub(crate) fn connect_deadline_ns(&self, timeout_ns: u64) -> Option<u64> {
        self.connecting_since_ns
            .map(|since_ns| since_ns.saturating_add(timeout_ns).saturating_add(1))
    }

    /// Closes the connection through `driver` (which also abandons a connect in
    /// progress).
    pub(crate) fn close(self, driver: &mut dyn Driver) {
        driver.close(self.id);
    }
}

impl Drop for Link {
    /// Ends the connection for the peer and the driver (see the module docs). The
    /// driver may have closed it already, making this a no-op; its error says no more
    /// than that, so it is ignored.
    fn drop(&mut self) {
        let _ = self.socket.shutdown(Shutdown::Both);
    }
}
