//! Enriching a stream of orders with user profiles from Redis, on a Weir worker.
//!
//! One runtime worker runs a task that generates orders and sends each through the
//! async operator, whose function is an `HMGET user:<id> name country` on the
//! worker's own driver (io_uring, or epoll where the kernel refuses it): the lookups of
//! a loop turn leave in one send, the replies are parsed in bulk and complete the
//! calls on the same thread. Orders of unknown users come out with no profile: a
//! missing key is a value, not an error. Lost connections fail their calls, which the
//! operator retries.
//!
//! ```text
//! scripts/redis.sh start          # or any Redis 6+
//! cargo run --release -p weir-net --example redis_enrich -- redis://127.0.0.1:6399
//! ```

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir_engine::async_io::{
    AsyncConfig, AsyncError, AsyncWaitOperator, OutputMode, RetryStrategy,
};
use weir_engine::element::StreamElement;
use weir_engine::runtime::{
    signal, Cores, DriverEvent, Progress, Runtime, Task, TaskContext, TaskError,
};
use weir_net::redis::{
    encode_command, Args, BlockingConnection, Lookup, RedisClient, RedisConfig, RedisError,
    RedisFunction, RedisRequest, RedisUrl, Reply,
};
use weir_net::DriverKind;

/// Users with a profile; orders also name users beyond them.
const USERS: u64 = 1_000;
const ORDERS: u64 = 20_000;

/// An order on its way to the lookup.
#[derive(Debug, Clone, Copy)]
struct Order {
    id: u64,
    user: u64,
    cents: u64,
}

/// An order with its user's profile.
#[derive(Debug, Clone)]
struct EnrichedOrder {
    order: Order,
    name: Option<String>,
    country: Option<String>,
}

impl RedisRequest for Order {
    type Out = EnrichedOrder;

    fn lookup(&self, args: &mut Args) -> Lookup {
        args.push_fmt(format_args!("user:{}", self.user));
        args.push(b"name");
        args.push(b"country");
        Lookup::HMGet
    }

    fn complete(self, reply: Reply<'_>) -> EnrichedOrder {
        let text = |value: Option<&[u8]>| value.map(|v| String::from_utf8_lossy(v).into_owned());
        let (name, country) = match reply {
            Reply::Fields(fields) => (text(fields.get(0)), text(fields.get(1))),
            Reply::Value(value) => (text(value), None),
        };
        EnrichedOrder {
            order: self,
            name,
            country,
        }
    }
}

/// Generates the orders, runs them through the operator, keeps what comes out.
struct EnrichTask {
    operator: AsyncWaitOperator<RedisFunction<Order>>,
    client: Rc<RefCell<RedisClient<Order>>>,
    next: u64,
    out: Vec<StreamElement<EnrichedOrder>>,
    results: Arc<Mutex<Vec<EnrichedOrder>>>,
}

impl Task for EnrichTask {
    fn poll(&mut self, cx: &mut TaskContext<'_>) -> Result<Progress, TaskError> {
        let now = cx.now_ns;
        let mut busy = self.operator.drain(now, &mut self.out)? > 0;
        while self.operator.fire_due_timer(now, &mut self.out)?.is_some() {
            busy = true;
        }
        while self.next < ORDERS && !self.operator.is_full() {
            let order = Order {
                id: self.next,
                user: (self.next * 7919) % (USERS + USERS / 10),
                cents: 100 + self.next % 9_900,
            };
            self.operator
                .process_record(order, None, now, &mut self.out)?;
            self.next += 1;
            busy = true;
        }
        // The turn's lookups go to the driver together.
        self.client.borrow_mut().flush(cx.driver, now);
        if !self.out.is_empty() {
            let mut results = self.results.lock().unwrap_or_else(|e| e.into_inner());
            results.extend(self.out.drain(..).filter_map(|e| match e {
                StreamElement::Record(record) => Some(record.value),
                StreamElement::Watermark(_) => None,
            }));
        }
        if self.next == ORDERS && self.operator.in_flight() == 0 {
            return Ok(Progress::Done);
        }
        Ok(if busy { Progress::Busy } else { Progress::Idle })
    }

    fn on_io(&mut self, event: &DriverEvent<'_>) -> bool {
        self.client.borrow_mut().on_event(event)
    }

    fn next_deadline(&self) -> Option<u64> {
        let operator = self.operator.next_timer_deadline();
        let client = self.client.borrow().next_deadline();
        operator.into_iter().chain(client).min()
    }
}

/// Writes the user profiles, pipelined in one round trip.
fn seed(url: &RedisUrl) -> Result<(), RedisError> {
    let mut connection = BlockingConnection::connect(url, Duration::from_secs(2))?;
    let countries = ["NL", "FR", "JP", "BR", "KE"];
    connection.pipeline(USERS as usize, |out| {
        for user in 0..USERS {
            let key = format!("user:{user}");
            let name = format!("user-{user}");
            let country = countries[(user % 5) as usize];
            encode_command(
                out,
                &[
                    b"HSET",
                    key.as_bytes(),
                    b"name",
                    name.as_bytes(),
                    b"country",
                    country.as_bytes(),
                ],
            );
        }
    })
}

fn main() {
    let text = std::env::args()
        .nth(1)
        .or_else(|| std::env::var(weir_net::redis::TEST_URL_VAR).ok())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let url: RedisUrl = match text.parse() {
        Ok(url) => url,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::exit(2);
        }
    };
    if let Err(error) = seed(&url) {
        eprintln!("error: seeding the user profiles: {error}");
        std::process::exit(1);
    }
    let mut config = RedisConfig::new(url.clone());
    config.capacity = 1024;
    let addr = match config.check() {
        Ok(addr) => addr,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::exit(2);
        }
    };
    let runtime = Runtime::builder()
        .cores(Cores::Count(1))
        .pin(false)
        .driver(Arc::new(|| {
            weir_net::build_driver(DriverKind::Auto)
                .map_err(|e| std::io::Error::other(e.to_string()))
        }))
        .build();
    let mut runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::exit(1);
        }
    };
    let results = Arc::new(Mutex::new(Vec::new()));
    // The operator wakes this task (rings its doorbell) for completions off its thread.
    let task = runtime.add_task(0);
    let unparker = runtime.task_unparker(task, signal::COMPLETION);
    let task_results = Arc::clone(&results);
    runtime.set_task(
        task,
        Box::new(move |_driver| -> Result<Box<dyn Task>, TaskError> {
            let client = Rc::new(RefCell::new(RedisClient::with_addr(config, addr)?));
            // Retry lookups whose connection failed; a wrong type or bad credentials
            // fail the job.
            let retry = RetryStrategy::fixed_delay(5, Duration::from_millis(20)).retry_on_error(
                |error: &AsyncError| match error {
                    AsyncError::Call(inner) => inner
                        .downcast_ref::<RedisError>()
                        .is_some_and(RedisError::is_transient),
                    _ => false,
                },
            );
            let operator = AsyncWaitOperator::new(
                RedisFunction::new(Rc::clone(&client)),
                AsyncConfig::new(OutputMode::Ordered, 256)
                    .with_timeout(Duration::from_secs(2))
                    .with_retry(retry),
                unparker,
            )?;
            Ok(Box::new(EnrichTask {
                operator,
                client,
                next: 0,
                out: Vec::new(),
                results: task_results,
            }))
        }),
    );
    let started = Instant::now();
    let report = match runtime.run() {
        Ok(report) => report,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::exit(1);
        }
    };
    let elapsed = started.elapsed();
    let results = results.lock().unwrap_or_else(|e| e.into_inner());
    for enriched in results.iter().take(5) {
        println!(
            "order {:>5}  user {:>4}  {:>7.2} €  {} / {}",
            enriched.order.id,
            enriched.order.user,
            enriched.order.cents as f64 / 100.0,
            enriched.name.as_deref().unwrap_or("(no profile)"),
            enriched.country.as_deref().unwrap_or("-"),
        );
    }
    let unknown = results.iter().filter(|e| e.name.is_none()).count();
    println!(
        "{} orders enriched from {} on the {} driver in {:.0} ms ({:.0} orders/s); {} for users without a profile",
        results.len(),
        url,
        report.drivers.first().copied().unwrap_or("?"),
        elapsed.as_secs_f64() * 1e3,
        results.len() as f64 / elapsed.as_secs_f64(),
        unknown
    );
    let in_order = results.windows(2).all(|w| w[0].order.id < w[1].order.id);
    println!("ordered output: {in_order}");
}
