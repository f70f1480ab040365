//! An enrichment join: orders (your record type) are joined with customer profiles
//! held by an external service, through the async I/O operator, then keyed by
//! customer. The embedded lookup service stands in for your database.
//!
//! `cargo run --release -p weir-net --example enrichment -- 100000`

use std::time::Duration;

use weir_engine::async_io::{AsyncConfig, OutputMode};
use weir_engine::exchange::codec::{Codec, DecodeError, Decoder, Encoder};
use weir_engine::graph::Graph;
use weir_engine::runtime::{Cores, Runtime};
use weir_net::lookup::{lookup_function, ClientConfig, LookupRequest, LookupServer, ServerConfig};
use weir_net::DriverKind;

/// An order, as the source makes it.
#[derive(Debug, Clone)]
struct Order {
    id: u64,
    customer: u64,
    cents: u64,
}

/// An order with its customer's profile.
#[derive(Debug, Clone)]
struct EnrichedOrder {
    id: u64,
    customer: u64,
    cents: u64,
    profile: Vec<u8>,
}

/// The lookup of an order: by customer id, completed with the profile.
impl LookupRequest for Order {
    type Out = EnrichedOrder;
    fn key(&self) -> u64 {
        self.customer
    }
    fn complete(self, profile: &[u8]) -> EnrichedOrder {
        let Order {
            id,
            customer,
            cents,
        } = self;
        EnrichedOrder {
            id,
            customer,
            cents,
            profile: profile.to_vec(),
        }
    }
}

/// How an order is stored when a checkpoint finds it in flight in the async operator.
impl Codec for Order {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        (self.id, self.customer, self.cents).encode(out);
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        let (id, customer, cents) = <(u64, u64, u64)>::decode(input)?;
        Ok(Order {
            id,
            customer,
            cents,
        })
    }
}

/// How enriched orders cross the exchange.
impl Codec for EnrichedOrder {
    fn encode<E: Encoder + ?Sized>(&self, out: &mut E) {
        (self.id, self.customer, self.cents).encode(out);
        self.profile.encode(out);
    }
    fn decode<D: Decoder + ?Sized>(input: &mut D) -> Result<Self, DecodeError> {
        let (id, customer, cents) = <(u64, u64, u64)>::decode(input)?;
        Ok(EnrichedOrder {
            id,
            customer,
            cents,
            profile: Vec::decode(input)?,
        })
    }
}

fn run(orders: u64) -> Result<Vec<EnrichedOrder>, Box<dyn std::error::Error>> {
    let service = LookupServer::start(ServerConfig::default())?;
    let runtime = Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .driver(weir_net::driver_factory(DriverKind::Epoll))
        .build()?;
    let lookups = lookup_function::<Order>(ClientConfig {
        addr: service.addr(),
        connections: 1,
        capacity: 512,
        request_timeout: Duration::from_secs(1),
        connect_timeout: ClientConfig::CONNECT_TIMEOUT_DEFAULT,
    })?;

    let graph = Graph::new().with_parallelism(2);
    let enriched = graph
        .from_generator(orders, None, |n| Order {
            id: n,
            customer: n % 1000,
            cents: 100 + n % 900,
        })
        .async_wait_io(
            lookups,
            AsyncConfig::new(OutputMode::Unordered, 128).with_timeout(Duration::from_secs(5)),
        )
        .key_by(|order: &EnrichedOrder| order.customer)
        .filter(|order: &EnrichedOrder| order.cents >= 500)
        .collect();
    graph.execute(runtime)?;
    Ok(enriched.records())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let orders = std::env::args().nth(1).map_or(Ok(10_000), |n| n.parse())?;
    let enriched = run(orders)?;
    let total: u64 = enriched.iter().map(|o| o.cents).sum();
    println!(
        "{} orders of 500 cents or more, {total} cents in all",
        enriched.len()
    );
    if let Some(order) = enriched.first() {
        println!(
            "e.g. order {} of customer {}: profile {:02x?}",
            order.id,
            order.customer,
            &order.profile[..8]
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_order_is_joined_with_its_customer() {
        let enriched = super::run(2_000).expect("runs");
        assert_eq!(
            enriched.len(),
            (0..2_000u64).filter(|n| 100 + n % 900 >= 500).count()
        );
        for order in &enriched {
            // The service's value for a key starts with the key's bytes.
            assert_eq!(order.profile[..8], order.customer.to_le_bytes());
        }
    }
}
