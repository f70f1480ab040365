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
