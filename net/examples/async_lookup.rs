//! The lookup written as an `async` block: each record's call awaits the lookup
//! client's `get` (and could await more), run through the async operator's futures
//! adapter on the worker's thread.
//!
//! `cargo run --release -p weir-net --example async_lookup -- 100000`

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use weir_engine::async_io::{AsyncConfig, OutputMode};
use weir_engine::graph::{Graph, IoHandler};
use weir_engine::runtime::{Cores, Runtime};
use weir_net::lookup::{ClientConfig, ClientIo, LookupClient, LookupServer, ServerConfig};
use weir_net::DriverKind;

/// `get` needs no request type: the key alone is the request.
type Client = LookupClient<u64>;

fn run(keys: u64) -> Result<Vec<(u64, u64)>, Box<dyn std::error::Error>> {
    let service = LookupServer::start(ServerConfig::default())?;
    let config = ClientConfig {
        addr: service.addr(),
        connections: 1,
        capacity: 512,
        request_timeout: Duration::from_secs(1),
        connect_timeout: ClientConfig::CONNECT_TIMEOUT_DEFAULT,
    };
    Client::new(config.clone())?;
    let runtime = Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .driver(weir_net::driver_factory(DriverKind::Epoll))
        .build()?;

    let graph = Graph::new().with_parallelism(2);
    let sums = graph
        .from_generator(keys, None, |key| key)
        .async_wait_futures(
            move |_subtask| {
                let client = Rc::new(RefCell::new(Client::new(config.clone()).expect("checked")));
                let lookups = Rc::clone(&client);
                let call = move |key: &u64| {
                    let key = *key;
                    let value = lookups.borrow_mut().get(key);
                    async move {
                        let value = value.await?;
                        // The sum of the value's bytes, as a stand-in for real work.
                        Ok(vec![(
                            key,
                            value.iter().map(|&b| u64::from(b)).sum::<u64>(),
                        )])
                    }
                };
                let io: Box<dyn IoHandler> = Box::new(ClientIo(client));
                (call, Some(io))
            },
            AsyncConfig::new(OutputMode::Ordered, 64).with_timeout(Duration::from_secs(5)),
        )
        .rebalance()
        .collect();
    graph.execute(runtime)?;
    Ok(sums.records())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let keys = std::env::args().nth(1).map_or(Ok(10_000), |n| n.parse())?;
    let sums = run(keys)?;
    println!("{} lookups, the first: {:?}", sums.len(), sums.iter().min());
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_key_is_looked_up_once() {
        let mut sums = super::run(1_000).expect("runs");
        sums.sort_unstable();
        assert_eq!(
            sums.iter().map(|s| s.0).collect::<Vec<_>>(),
            (0..1_000).collect::<Vec<_>>()
        );
        // The value starts with the key's bytes: its byte sum is at least theirs.
        assert!(sums
            .iter()
            .all(|&(key, sum)| sum >= key.to_le_bytes().iter().map(|&b| u64::from(b)).sum()));
    }
}
