//! Errors of the kernel-facing half.

use std::io;

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
    /// An invalid setting.
    #[error("invalid setting: {0}")]
    Config(String),
}

impl NetError {
    pub(crate) fn io(what: &'static str, source: io::Error) -> Self {
        NetError::Io { what, source }
    }
}
