//! Loom models of Weir's lock-free structures.
//!
//! The models live in `tests/` and compile only under `--cfg loom`:
//!
//! ```text
//! RUSTFLAGS="--cfg loom -C debug-assertions" LOOM_MAX_PREEMPTIONS=2 \
//!     cargo test -p weir-loom-tests --release
//! ```
//!
//! (`scripts/loom.sh` runs exactly that.) Without the flag they compile to nothing, so
//! `cargo test --workspace` stays fast.
