//! Criterion settings shared by the suites: `WEIR_BENCH_QUICK=1` for fewer, shorter
//! samples (the whole `cargo bench` in a few minutes).

use std::time::Duration;

use criterion::Criterion;

/// The suites' criterion configuration, `samples` per benchmark at most.
pub fn config(samples: usize) -> Criterion {
    let quick = std::env::var_os("WEIR_BENCH_QUICK").is_some();
    let base = Criterion::default()
        .configure_from_args()
        .sample_size(samples.max(10));
    if quick {
        base.sample_size(10)
            .warm_up_time(Duration::from_millis(200))
            .measurement_time(Duration::from_millis(600))
    } else {
        base.warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2))
    }
}
