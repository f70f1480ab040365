//! Records aimed at a subpartition, shared by the exchange tests.

use weir_engine::exchange::codec::{Codec, DecodeError, Decoder, Encoder};
use weir_engine::exchange::{ChannelSelector, Target};

/// A record aimed at one subpartition, with a sequence number and a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rec {
    pub target: u32,
    pub seq: u64,
    pub payload: Vec<u8>,
}

impl Codec for Rec {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        self.target.encode(out);
        self.seq.encode(out);
        self.payload.encode(out);
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        Ok(Rec {
            target: u32::decode(input)?,
            seq: u64::decode(input)?,
            payload: Vec::decode(input)?,
        })
    }
}

/// Routes each record to the subpartition it names, counting how often it was asked
/// (a writer asks once per record it writes, never ahead).
#[derive(Debug, Default)]
pub struct ByTarget {
    pub calls: u64,
}

impl ChannelSelector<Rec> for ByTarget {
    fn select(&mut self, record: &Rec, subpartitions: usize) -> Target {
        self.calls += 1;
        Target::One(record.target as usize % subpartitions)
    }
}
