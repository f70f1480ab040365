//! Criterion settings shared by the suites: `WEIR_BENCH_QUICK=1` for fewer, shorter
//! samples (the whole `cargo bench` in a few minutes), and the groups that draw curves.

use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{AxisScale, BenchmarkGroup, Criterion, PlotConfiguration, PlottingBackend};

/// A group whose benchmarks are `BenchmarkId::new(implementation, parameter)` with a
/// numeric parameter (capacity, latency, record size, requests in flight): criterion's
/// HTML report draws it as one line per implementation over the parameter, on log
/// axes, in `target/criterion/<group>/report/index.html` (linked from
/// `target/criterion/report/index.html`). The y axis is the time per record.
///
/// Such a group sets no `Throughput`: criterion takes a throughput as the x value of
/// the line chart, and one per record is the same for every point, so it would draw
/// no line at all.
#[allow(dead_code)] // not every suite has a curve
pub fn curve<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group.plot_config(PlotConfiguration::default().summary_scale(AxisScale::Logarithmic));
    group
}

/// The suites' criterion configuration, `samples` per benchmark at most.
pub fn config(samples: usize) -> Criterion {
    let quick = std::env::var_os("WEIR_BENCH_QUICK").is_some();
    // The HTML report's charts are drawn in-process by plotters, gnuplot installed or not.
    let base = Criterion::default()
        .plotting_backend(PlottingBackend::Plotters)
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
