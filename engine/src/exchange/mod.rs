//! Task data exchange: buffer segments and their pools (the record writer, result
//! partitions and input gates build on these).

pub(crate) mod free_list;
pub mod pool;

pub use pool::{Buffer, LocalBufferPool, LocalPoolConfig, NetworkBufferPool};
