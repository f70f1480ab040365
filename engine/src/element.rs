//! The elements that flow between operators: records and watermarks.

/// One element of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamElement<T> {
    /// A data record.
    Record(Record<T>),
    /// Event time has reached the watermark's timestamp.
    Watermark(Watermark),
}

/// A data record with its optional event timestamp. Outputs derived from a record carry
/// the input record's timestamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<T> {
    /// The payload.
    pub value: T,
    /// Event time in milliseconds, if the stream has one.
    pub timestamp: Option<i64>,
}

/// A watermark: no record with a timestamp at or below it is expected any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Watermark(pub i64);

/// The watermark value that marks a stream *idle* (Flink's `WatermarkStatus.IDLE`): a
/// source with nothing to read for a while emits it, and an input gate leaves an idle
/// channel out of its minimum until that channel sends a watermark again, so one quiet
/// stream does not hold back event time for the others. A gate whose live channels are
/// all idle passes the mark on. It is below every real watermark, so an operator that
/// only fences on watermarks or compares them treats it as no progress.
pub const IDLE_WATERMARK: i64 = i64::MIN + 1;

impl<T> StreamElement<T> {
    /// A record element.
    pub fn record(value: T, timestamp: Option<i64>) -> Self {
        StreamElement::Record(Record { value, timestamp })
    }

    /// A watermark element.
    pub fn watermark(timestamp: i64) -> Self {
        StreamElement::Watermark(Watermark(timestamp))
    }

    /// The record's value, if this is a record.
    pub fn as_record(&self) -> Option<&Record<T>> {
        match self {
            StreamElement::Record(record) => Some(record),
            StreamElement::Watermark(_) => None,
        }
    }

    /// Whether this is a watermark.
    pub fn is_watermark(&self) -> bool {
        matches!(self, StreamElement::Watermark(_))
    }
}

/// Where an operator puts what it emits.
pub trait Collector<T> {
    /// Takes one element.
    fn collect(&mut self, element: StreamElement<T>);
}

impl<T> Collector<T> for Vec<StreamElement<T>> {
    #[inline]
    fn collect(&mut self, element: StreamElement<T>) {
        self.push(element);
    }
}

impl<T> Collector<T> for std::collections::VecDeque<StreamElement<T>> {
    #[inline]
    fn collect(&mut self, element: StreamElement<T>) {
        self.push_back(element);
    }
}
