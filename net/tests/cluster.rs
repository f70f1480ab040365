//! A job graph over two processes on loopback (two runtimes and two transports in this
//! test process): the keyed exchange crosses the transport, every record arrives once on
//! the subtask its key group names, a producer's drain waits for its consumers, and the
//! two processes share one connection.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use weir_engine::graph::keys::subtask_for_key;
use weir_engine::graph::{Graph, SubtaskInfo};
use weir_engine::runtime::{Cores, Runtime};
use weir_net::cluster::TransportChannels;

fn free_addrs(n: usize) -> Vec<SocketAddr> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    listeners.iter().map(|l| l.local_addr().unwrap()).collect()
}

fn run_process(process: usize, peers: Vec<SocketAddr>, per: u64) -> Vec<Vec<u64>> {
    let channels = Arc::new(TransportChannels::start(process, &peers).expect("transport"));
    channels
        .wait_for_peers(Duration::from_secs(20))
        .expect("peers listen");
    let graph = Graph::new()
        .with_parallelism(4)
        .with_cluster(channels.cluster());
    let out = graph
        .from_iter(move |info: &SubtaskInfo| {
            let base = info.index as u64 * per;
            base..base + per
        })
        .map(|v| v * 3)
        .key_by(|v: &u64| *v)
        .collect();
    let runtime = Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .build()
        .expect("runtime");
    let (_, failure) = graph.execute_to_end(runtime).expect("starts");
    assert!(failure.is_none(), "process {process}: {failure:?}");
    channels
        .drain(Duration::from_secs(20))
        .expect("consumers took everything");
    // Both ways, every channel between the two processes on one connection.
    assert_eq!(channels.connections_opened(), 1, "process {process}");
    out.by_subtask()
        .into_iter()
        .map(|s| {
            s.iter()
                .filter_map(|e| e.as_record().map(|r| r.value))
                .collect()
        })
        .collect()
}

#[test]
fn a_keyed_job_over_two_processes_delivers_each_record_once() {
    const PER: u64 = 20_000;
    let peers = free_addrs(2);
    let runs: Vec<_> = (0..2)
        .map(|process| {
            let peers = peers.clone();
            std::thread::spawn(move || run_process(process, peers, PER))
        })
        .collect();
    let mut all = Vec::new();
    for run in runs {
        for (subtask, records) in run.join().expect("process ran").into_iter().enumerate() {
            for v in &records {
                assert_eq!(subtask_for_key(v, 128, 4), subtask);
            }
            all.extend(records);
        }
    }
    all.sort_unstable();
    assert_eq!(all, (0..4 * PER).map(|v| v * 3).collect::<Vec<_>>());
}

#[test]
fn a_peer_that_never_starts_is_named_after_the_wait() {
    let peers = free_addrs(2);
    let channels = TransportChannels::start(0, &peers).expect("transport");
    let error = channels
        .wait_for_peers(Duration::from_millis(300))
        .expect_err("process 1 never listens");
    let text = error.to_string();
    assert!(text.contains("process 1"), "{text}");
}
