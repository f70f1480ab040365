//! Errors of the engine's control plane.
//!
//! Hot-path refusals (a full ring, an exhausted pool) are not errors: they hand the
//! value back or return `None`. What lives here is what a user must fix.

/// A configuration value was rejected when a structure was built.
///
/// Every message names the setting and what to change it to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A capacity that must be positive was zero.
    #[error("{what} must be at least 1, got 0")]
    ZeroCapacity {
        /// The setting, e.g. "mail ring capacity".
        what: &'static str,
    },
    /// A capacity above the engine's limit.
    #[error("{what} of {requested} exceeds the limit of {limit}; lower it")]
    TooLarge {
        /// The setting.
        what: &'static str,
        /// What was asked for.
        requested: usize,
        /// The largest accepted value.
        limit: usize,
    },
    /// Segment size outside the accepted range.
    #[error(
        "segment size of {size} bytes is outside {min}..={max} bytes; \
         use a size in that range (the default is 32 KiB)"
    )]
    SegmentSize {
        /// What was asked for.
        size: usize,
        /// Smallest accepted size.
        min: usize,
        /// Largest accepted size.
        max: usize,
    },
    /// The global pool cannot back a local pool's reservation.
    #[error(
        "local buffer pool needs {requested} segments but the network buffer pool has only \
         {available} free; give the network pool more segments or the local pool fewer"
    )]
    NotEnoughSegments {
        /// Segments the local pool wanted to reserve.
        requested: usize,
        /// Segments free in the global pool at that moment.
        available: usize,
    },
    /// A local pool too small to give every subpartition a segment.
    #[error(
        "local buffer pool of {size} segments cannot serve {subpartitions} subpartitions; \
         it needs at least one segment per subpartition"
    )]
    FewerSegmentsThanSubpartitions {
        /// The local pool's size.
        size: usize,
        /// The number of subpartitions.
        subpartitions: usize,
    },
    /// Two related settings contradict each other.
    #[error("{0}")]
    Inconsistent(&'static str),
}

/// Why the data exchange refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExchangeError {
    /// A record larger than the writer's maximum (nothing of it was written).
    #[error(
        "record of {size} bytes exceeds the maximum record size of {max} bytes; \
         raise max_record_size or split the record"
    )]
    RecordTooLarge {
        /// The record's serialized size.
        size: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The consumer of a subpartition is gone: what is written to it cannot be delivered.
    #[error(
        "the consumer of subpartition {subpartition} disconnected; its records cannot be delivered"
    )]
    ConsumerGone {
        /// The subpartition.
        subpartition: usize,
    },
    /// The producer of an input channel went away before its end-of-partition event.
    #[error(
        "the producer of input channel {channel} disconnected before the end of its partition"
    )]
    ProducerGone {
        /// The channel.
        channel: usize,
    },
    /// An input channel broke (a remote channel's connection was lost or refused); the
    /// source names the peer and says what to fix.
    #[error("input channel {channel} failed: {source}")]
    ChannelFailed {
        /// The channel (its index in the gate).
        channel: usize,
        /// Why, as the channel reported it.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Bytes on a channel that do not frame a record or event.
    #[error("input channel {channel} carried a malformed frame: {reason}")]
    Malformed {
        /// The channel.
        channel: usize,
        /// What was wrong.
        reason: String,
    },
    /// A record's bytes did not decode as the gate's record type.
    #[error("decoding a record from input channel {channel} failed: {source}")]
    Decode {
        /// The channel.
        channel: usize,
        /// The decoder's complaint.
        #[source]
        source: crate::exchange::codec::DecodeError,
    },
    /// The writer still holds part of an earlier record or event (back-pressure): call
    /// `resume` until it reports done before writing more.
    #[error("the record writer is back-pressured with output pending; call resume until it returns true")]
    Pending,
    /// Writing after the end-of-partition event.
    #[error("the partition has ended; nothing can be written after finish")]
    Finished,
}

/// Why buffer-debloating settings were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DebloatError {
    /// A target of 0 would ask for empty buffers.
    #[error("the debloat target must be above 0 (Flink's default is 1 s)")]
    ZeroTarget,
    /// A period of 0 would recompute on every poll.
    #[error("the debloat period must be above 0 (Flink's default is 200 ms)")]
    ZeroPeriod,
    /// Smoothing over no samples.
    #[error("the debloat samples must be at least 1 (Flink's default is 20)")]
    ZeroSamples,
    /// No buffers to spread the target over.
    #[error("buffers per channel must be at least 1")]
    ZeroBuffers,
    /// Buffers of 0 bytes hold nothing.
    #[error("the debloat minimum buffer size must be at least 1 byte (Flink's default is 256)")]
    ZeroMinSize,
    /// The bounds contradict each other.
    #[error("the debloat minimum buffer size {min} exceeds the maximum {max} (the segment size)")]
    MinAboveMax {
        /// The minimum.
        min: usize,
        /// The maximum.
        max: usize,
    },
    /// A starting size outside the bounds.
    #[error(
        "the debloat starting buffer size {starting} is outside [{min}, {max}] (Flink's default \
         is 1024 bytes, within the minimum and the segment size)"
    )]
    StartingOutside {
        /// The starting size.
        starting: usize,
        /// The minimum.
        min: usize,
        /// The maximum.
        max: usize,
    },
    /// A maximum beyond what a channel can announce.
    #[error("the debloat maximum buffer size {max} exceeds 4 GiB")]
    MaxTooLarge {
        /// The maximum.
        max: usize,
    },
    /// A threshold of 100 % or more would never announce a change.
    #[error("the debloat threshold must be below 100 %, got {percent} %")]
    Threshold {
        /// The threshold.
        percent: u32,
    },
}
