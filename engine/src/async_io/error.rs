//! Errors of async calls and of the operator.

/// Why an async call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AsyncError {
    /// The call did not complete within the configured timeout.
    #[error("async call timed out")]
    Timeout,
    /// The external call failed.
    #[error("async call failed: {0}")]
    Call(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The function dropped its `ResultFuture` without completing it.
    #[error(
        "the async function dropped its ResultFuture without completing it; \
         call complete or complete_err on every handle"
    )]
    Dropped,
}

impl AsyncError {
    /// An [`AsyncError::Call`] from any error (or message).
    pub fn call(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        AsyncError::Call(error.into())
    }
}

/// Why the operator stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OperatorError {
    /// An element failed for good (no retry applied); the operator is failed.
    #[error("async operator failed: {0}")]
    Async(#[source] AsyncError),
    /// The operator failed earlier; every call after the failure returns this.
    #[error("async operator already failed: {cause}")]
    Failed {
        /// The first failure's message.
        cause: String,
    },
    /// Capacity is full and nothing can complete: no handle is outstanding and no timer
    /// is pending (only a harness reports this; a runtime task would wait).
    #[error(
        "async operator stalled with {in_flight} elements in flight: no call can complete \
         and no timer is pending"
    )]
    Stalled {
        /// Elements held.
        in_flight: usize,
    },
    /// Restoring from a snapshot failed because the configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::error::ConfigError),
}
