//! The main job's memory grows with its workers, not with their square: 200 workers
//! (oversubscribed) used to take 1.7 GB, their network buffer pool alone 200 × 205
//! segments of 32 KiB. Alone in its test binary, so that the peak resident size of this
//! process's children is that one run's.

use std::process::Command;

#[test]
fn two_hundred_workers_fit_in_a_gigabyte() {
    let output = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "run",
            "--cores",
            "200",
            "--oversubscribe",
            "--records",
            "2000",
            "--timeout",
            "30s",
            "--driver",
            "epoll",
            "--quiet",
        ])
        .output()
        .expect("weir runs");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // SAFETY: getrusage writes one rusage into the zeroed struct we own.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage), 0);
        usage
    };
    let peak_mib = usage.ru_maxrss / 1024;
    assert!(peak_mib < 1024, "peak resident size {peak_mib} MiB");
}
