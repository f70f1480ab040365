//! A graph spread over two "processes" (two runtimes in this test process), whose
//! crossing channels go through an in-memory `RemoteChannels`: every process builds the
//! same graph, runs only its subtasks, and the records still arrive exactly once with
//! keys on the subtask Flink's key groups name.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use weir_engine::exchange::{InputChannel, LocalInputChannel, NetworkBufferPool, SharedBuffer};
use weir_engine::graph::keys::subtask_for_key;
use weir_engine::graph::{Cluster, Graph, GraphError, RemoteChannels, SubtaskInfo};
use weir_engine::park::Notify;
use weir_engine::runtime::{Cores, Runtime, TaskError};

/// Served channels by id, shared by both "processes".
#[derive(Default)]
struct Registry {
    served: Mutex<HashMap<u32, LocalInputChannel>>,
    /// Each served channel's consumer-side notify, once the consumer asked for it.
    notifies: Mutex<HashMap<u32, Arc<dyn Notify>>>,
}

/// The producer side notifies this; it forwards to every consumer that registered.
struct Forward(Arc<Registry>);

impl Notify for Forward {
    fn notify(&self) {
        for notify in self.0.notifies.lock().unwrap().values() {
            notify.notify();
        }
    }
}

struct InMemory(Arc<Registry>);

/// A consumer's channel: found in the registry once its producer served it.
struct Lazy {
    id: u32,
    registry: Arc<Registry>,
    channel: Option<LocalInputChannel>,
}

impl InputChannel for Lazy {
    fn poll_buffer(&mut self) -> Option<SharedBuffer> {
        if self.channel.is_none() {
            self.channel = self.registry.served.lock().unwrap().remove(&self.id);
        }
        self.channel.as_mut()?.poll_buffer()
    }

    fn is_disconnected(&self) -> bool {
        self.channel.as_ref().is_some_and(|c| c.is_disconnected())
    }
}

impl RemoteChannels for InMemory {
    fn producer_notify(&self) -> Arc<dyn Notify> {
        Arc::new(Forward(Arc::clone(&self.0)))
    }

    fn serve(&self, channel: u32, _consumer: usize, input: LocalInputChannel) {
        self.0.served.lock().unwrap().insert(channel, input);
        Forward(Arc::clone(&self.0)).notify();
    }

    fn consume(
        &self,
        _process: usize,
        channels: &[u32],
        _network: &NetworkBufferPool,
        notify: Arc<dyn Notify>,
    ) -> Result<Vec<Box<dyn InputChannel>>, TaskError> {
        let mut notifies = self.0.notifies.lock().unwrap();
        Ok(channels
            .iter()
            .map(|&id| {
                notifies.insert(id, Arc::clone(&notify));
                Box::new(Lazy {
                    id,
                    registry: Arc::clone(&self.0),
                    channel: None,
                }) as Box<dyn InputChannel>
            })
            .collect())
    }

    fn receive_segments(&self, _channels: usize) -> usize {
        0
    }
}

fn runtime() -> Runtime {
    Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .build()
        .expect("runtime")
}

#[test]
fn a_keyed_exchange_across_two_processes_delivers_each_record_once() {
    const PER: u64 = 5_000;
    let registry = Arc::new(Registry::default());
    let runs: Vec<_> = (0..2)
        .map(|process| {
            let registry = Arc::clone(&registry);
            std::thread::spawn(move || {
                let cluster = Cluster {
                    checkpoints: None,
                    processes: 2,
                    process,
                    remote: Arc::new(InMemory(registry)),
                };
                // Four subtasks per stage over 2 processes × 2 workers.
                let graph = Graph::new().with_parallelism(4).with_cluster(cluster);
                let out = graph
                    .from_iter(|info: &SubtaskInfo| {
                        let base = info.index as u64 * PER;
                        base..base + PER
                    })
                    .key_by(|v: &u64| *v)
                    .collect();
                let (_, failure) = graph.execute_to_end(runtime()).expect("starts");
                assert!(failure.is_none(), "process {process}: {failure:?}");
                out.by_subtask()
                    .into_iter()
                    .map(|s| {
                        s.iter()
                            .filter_map(|e| e.as_record().map(|r| r.value))
                            .collect::<Vec<u64>>()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut all = Vec::new();
    for run in runs {
        for (subtask, records) in run.join().unwrap().into_iter().enumerate() {
            for v in &records {
                assert_eq!(
                    subtask_for_key(v, 128, 4),
                    subtask,
                    "key {v} reached subtask {subtask}"
                );
            }
            all.extend(records);
        }
    }
    all.sort_unstable();
    assert_eq!(all, (0..4 * PER).collect::<Vec<_>>());
}

#[test]
fn a_process_index_past_the_count_is_refused() {
    let cluster = Cluster {
        checkpoints: None,
        processes: 2,
        process: 2,
        remote: Arc::new(InMemory(Arc::default())),
    };
    let graph = Graph::new().with_cluster(cluster);
    let _ = graph.from_iter(|_: &SubtaskInfo| 0..1u64).collect();
    match graph.start(runtime()) {
        Err(GraphError::BadCluster {
            processes: 2,
            process: 2,
        }) => {}
        other => panic!("expected BadCluster, got {:?}", other.err()),
    }
}
