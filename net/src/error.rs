//! Errors of the kernel-facing half.

use std::io;
use std::time::Duration;

/// Why a driver, a connection or the lookup service failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// Setting up a driver failed (e.g. io_uring refused by the kernel).
    #[error("cannot set up the {driver} driver: {source}")]
    DriverSetup {
        /// "uring" or "epoll".
        driver: &'static str,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// A socket operation failed.
    #[error("{what} failed: {source}")]
    Io {
        /// What was attempted.
        what: &'static str,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// The peer sent bytes that are not a frame of the protocol.
    #[error("malformed frame from {peer}: {reason}; closing the connection")]
    Malformed {
        /// Who sent it.
        peer: String,
        /// What was wrong.
        reason: String,
    },
    /// The peer closed the connection with requests outstanding.
    #[error("connection to {peer} closed with {pending} requests outstanding")]
    Closed {
        /// The peer.
        peer: String,
        /// Requests that will get no answer on it.
        pending: usize,
    },
    /// The service answered a request with an error.
    #[error("lookup of key {key} failed at the service: {message}")]
    Service {
        /// The key looked up.
        key: u64,
        /// The service's message.
        message: String,
    },
    /// A connect did not complete in time (the address drops connection attempts, or
    /// nothing answers there).
    #[error(
        "connecting to {addr} did not complete within {timeout:?}; check that the service \
         listens there and is reachable, or raise connect_timeout"
    )]
    ConnectTimeout {
        /// The address connected to.
        addr: String,
        /// The connect timeout.
        timeout: Duration,
    },
    /// A request went unanswered for the request timeout, and no request sent after it
    /// was answered: the peer may not be reading, so the connection is closed (which
    /// drops what is queued for it) and made again by the next request.
    #[error(
        "no answer from {peer} within {timeout:?} and none to later requests; closed the \
         connection, which the next request makes again"
    )]
    Unanswered {
        /// The peer.
        peer: String,
        /// The request timeout.
        timeout: Duration,
    },
    /// An invalid setting.
    #[error("invalid setting: {0}")]
    Config(String),
}

impl NetError {
    pub(crate) fn io(what: &'static str, source: io::Error) -> Self {
        NetError::Io { what, source }
    }

    /// A copy, for each of the several requests one connection failure fails (an
    /// `io::Error` cannot be cloned: the copy keeps its kind and message).
    pub(crate) fn duplicate(&self) -> NetError {
        let io = |e: &io::Error| io::Error::new(e.kind(), e.to_string());
        match self {
            NetError::DriverSetup { driver, source } => NetError::DriverSetup {
                driver,
                source: io(source),
            },
            NetError::Io { what, source } => NetError::Io {
                what,
                source: io(source),
            },
            NetError::Malformed { peer, reason } => NetError::Malformed {
                peer: peer.clone(),
                reason: reason.clone(),
            },
            NetError::Closed { peer, pending } => NetError::Closed {
                peer: peer.clone(),
                pending: *pending,
            },
            NetError::Service { key, message } => NetError::Service {
                key: *key,
                message: message.clone(),
            },
            NetError::ConnectTimeout { addr, timeout } => NetError::ConnectTimeout {
                addr: addr.clone(),
                timeout: *timeout,
            },
            NetError::Unanswered { peer, timeout } => NetError::Unanswered {
                peer: peer.clone(),
                timeout: *timeout,
            },
            NetError::Config(message) => NetError::Config(message.clone()),
        }
    }
}
