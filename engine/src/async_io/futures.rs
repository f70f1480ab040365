//! Writing the call as an `async` block instead of a callback: [`FutureFunction`]
//! spawns each call's future on a per-worker [`LocalExecutor`], and completes the
//! call's [`ResultFuture`] with what the future returns.
//!
//! The executor is single-threaded (futures need not be `Send`) and polled by the
//! task that owns the operator (the job's I/O hook, or [`LocalExecutor::run_ready`]),
//! so a future woken by its worker's driver resumes on the same thread. Wakers are
//! `Send` (a future may be woken from anywhere): waking pushes the task's key on a
//! lock-free queue and unparks the worker. Each spawned call allocates its future and
//! its waker: this is the convenience path; the callback [`AsyncFunction`] is the
//! allocation-free one.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Wake, Waker};

use super::{AsyncError, AsyncFunction, ResultFuture};
use crate::park::Unparker;
use crate::slab::{Key, Slab};

type LocalFuture = Pin<Box<dyn Future<Output = ()>>>;

struct Ready {
    queue: crossbeam_queue::SegQueue<u64>,
    unparker: Option<Unparker>,
}

struct TaskWaker {
    key: u64,
    ready: Arc<Ready>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.ready.queue.push(self.key);
        if let Some(unparker) = &self.ready.unparker {
            unparker.unpark();
        }
    }
}

/// A single-threaded executor of `!Send` futures, polled by its owner.
pub struct LocalExecutor {
    tasks: Slab<LocalFuture>,
    ready: Arc<Ready>,
}

impl LocalExecutor {
    /// An executor for up to `capacity` futures at once; `unparker` wakes its worker
    /// when a future is woken from another thread.
    pub fn new(capacity: usize, unparker: Option<Unparker>) -> Result<Self, crate::ConfigError> {
        Ok(LocalExecutor {
            tasks: Slab::new(capacity)?,
            ready: Arc::new(Ready {
                queue: crossbeam_queue::SegQueue::new(),
                unparker,
            }),
        })
    }

    /// Queues `future` to be polled; hands it back if the executor is full.
    pub fn spawn(&mut self, future: impl Future<Output = ()> + 'static) -> Result<(), LocalFuture> {
        let key = self.tasks.try_insert(Box::pin(future))?;
        self.ready.queue.push(key.to_u64());
        Ok(())
    }

    /// Polls every woken future once (and those woken while doing so); returns how many
    /// polls ran.
    pub fn run_ready(&mut self) -> usize {
        let mut polls = 0;
        while let Some(raw) = self.ready.queue.pop() {
            let key = Key::from_u64(raw);
            let Some(future) = self.tasks.get_mut(key) else {
                continue;
            };
            let waker = Waker::from(Arc::new(TaskWaker {
                key: raw,
                ready: Arc::clone(&self.ready),
            }));
            polls += 1;
            if future
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_ready()
            {
                self.tasks.remove(key);
            }
        }
        polls
    }

    /// Futures not yet finished.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether every future has finished.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }
}

/// An answer known without a call, given to a future-returning function
/// ([`FutureFunction::with_ready`], [`FutureBatchFunction::with_ready`]).
type ReadyFn<In, Out> = Box<dyn FnMut(&In) -> Option<Out>>;

/// An [`AsyncFunction`] written as a function returning a future.
pub struct FutureFunction<In, Out, F> {
    executor: Rc<RefCell<LocalExecutor>>,
    call: F,
    ready: Option<ReadyFn<In, Out>>,
    _types: std::marker::PhantomData<fn(&In) -> Out>,
}

impl<In, Out, F> FutureFunction<In, Out, F> {
    /// Calls run as `call(input)`'s future on `executor`.
    pub fn new(executor: Rc<RefCell<LocalExecutor>>, call: F) -> Self {
        FutureFunction {
            executor,
            call,
            ready: None,
            _types: std::marker::PhantomData,
        }
    }

    /// Answers known without a call ([`AsyncFunction::ready`]): where `ready` returns
    /// `Some(result)` and the record may leave at once, no future is made. It must give
    /// the one result the call's future would.
    pub fn with_ready(mut self, ready: impl FnMut(&In) -> Option<Out> + 'static) -> Self {
        self.ready = Some(Box::new(ready));
        self
    }
}

impl<In, Out, F, Fut> AsyncFunction for FutureFunction<In, Out, F>
where
    In: 'static,
    Out: Send + 'static,
    F: FnMut(&In) -> Fut + 'static,
    Fut: Future<Output = Result<Vec<Out>, AsyncError>> + 'static,
{
    type In = In;
    type Out = Out;

    #[inline]
    fn ready(&mut self, input: &In) -> Option<Out> {
        self.ready.as_mut().and_then(|ready| ready(input))
    }

    fn invoke(&mut self, input: &In, result: ResultFuture<Out>) {
        let call = (self.call)(input);
        let spawned = self.executor.borrow_mut().spawn(async move {
            match call.await {
                Ok(values) => result.complete(values),
                Err(error) => result.complete_err(error),
            }
        });
        // Full: dropping the refused future drops its handle, which fails the call with
        // `AsyncError::Dropped` (retries apply). Size the executor to the capacity.
        drop(spawned);
    }
}

/// An [`AsyncBatchFunction`](super::AsyncBatchFunction) written as a function returning
/// a future of one result list per input (in input order); see
/// [`Batched`](super::Batched) for how batches are cut.
pub struct FutureBatchFunction<In, Out, F> {
    executor: Rc<RefCell<LocalExecutor>>,
    call: F,
    ready: Option<ReadyFn<In, Out>>,
    _types: std::marker::PhantomData<fn(&In) -> Out>,
}

impl<In, Out, F> FutureBatchFunction<In, Out, F> {
    /// Batches run as `call(inputs)`'s future on `executor`.
    pub fn new(executor: Rc<RefCell<LocalExecutor>>, call: F) -> Self {
        FutureBatchFunction {
            executor,
            call,
            ready: None,
            _types: std::marker::PhantomData,
        }
    }

    /// Answers known without a call
    /// ([`AsyncBatchFunction::ready`](super::AsyncBatchFunction::ready)): where `ready`
    /// returns `Some(result)` and the record may leave at once, it joins no batch. It
    /// must give the one result the batch's future would give that input.
    pub fn with_ready(mut self, ready: impl FnMut(&In) -> Option<Out> + 'static) -> Self {
        self.ready = Some(Box::new(ready));
        self
    }
}

impl<In, Out, F, Fut> super::AsyncBatchFunction for FutureBatchFunction<In, Out, F>
where
    In: Clone + 'static,
    Out: Send + 'static,
    F: FnMut(&[In]) -> Fut + 'static,
    Fut: Future<Output = Result<Vec<Vec<Out>>, AsyncError>> + 'static,
{
    type In = In;
    type Out = Out;

    #[inline]
    fn ready(&mut self, input: &In) -> Option<Out> {
        self.ready.as_mut().and_then(|ready| ready(input))
    }

    fn invoke_batch(&mut self, inputs: &[In], result: super::BatchResult<Out>) {
        let call = (self.call)(inputs);
        let spawned = self.executor.borrow_mut().spawn(async move {
            match call.await {
                Ok(lists) => result.complete(lists),
                Err(error) => result.complete_err(error),
            }
        });
        // Full: the refused future drops its batch, failing its records with
        // `AsyncError::Dropped` (retries apply).
        drop(spawned);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::task::Poll;

    use crate::async_io::{AsyncConfig, AsyncHarness, OutputMode};
    use crate::element::StreamElement;

    /// A value slot and the waker of the future waiting on it.
    type Shared = Rc<RefCell<(Option<u32>, Option<Waker>)>>;

    /// A future that is pending until the test sets its slot, like an I/O completion.
    struct Slot(Shared);

    impl Future for Slot {
        type Output = u32;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u32> {
            let mut slot = self.0.borrow_mut();
            match slot.0.take() {
                Some(value) => Poll::Ready(value),
                None => {
                    slot.1 = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        }
    }

    #[test]
    fn async_blocks_complete_calls_in_order() {
        let executor = Rc::new(RefCell::new(LocalExecutor::new(8, None).unwrap()));
        let slots: Rc<RefCell<Vec<Shared>>> = Rc::default();
        let made = Rc::clone(&slots);
        let function = FutureFunction::new(Rc::clone(&executor), move |input: &u32| {
            let slot = Rc::new(RefCell::new((None, None)));
            made.borrow_mut().push(Rc::clone(&slot));
            let input = *input;
            async move {
                let looked_up = Slot(slot).await;
                if looked_up == 0 {
                    return Err(AsyncError::call("zero"));
                }
                Ok(vec![input * 100 + looked_up])
            }
        });
        let mut harness =
            AsyncHarness::new(function, AsyncConfig::new(OutputMode::Ordered, 4)).unwrap();
        harness.process_record(1, None).unwrap();
        harness.process_record(2, None).unwrap();
        assert_eq!(
            executor.borrow_mut().run_ready(),
            2,
            "both futures polled once, both pending"
        );
        // Complete the second first; wake it like a driver would.
        for (index, value) in [(1, 7), (0, 5)] {
            let slot = Rc::clone(&slots.borrow()[index]);
            let waker = {
                let mut s = slot.borrow_mut();
                s.0 = Some(value);
                s.1.take().expect("pending future left its waker")
            };
            waker.wake();
            executor.borrow_mut().run_ready();
        }
        harness.run_mailbox().unwrap();
        assert_eq!(
            harness.take_output(),
            vec![
                StreamElement::record(105, None),
                StreamElement::record(207, None)
            ]
        );
        assert!(executor.borrow().is_empty());
        harness.process_record(3, None).unwrap();
        executor.borrow_mut().run_ready();
        let slot = Rc::clone(&slots.borrow()[2]);
        slot.borrow_mut().0 = Some(0);
        let waker = slot.borrow_mut().1.take().unwrap();
        waker.wake();
        executor.borrow_mut().run_ready();
        assert!(harness
            .run_mailbox()
            .unwrap_err()
            .to_string()
            .contains("zero"));
    }

    /// `with_ready` answers what it knows without making a future; the rest are called.
    #[test]
    fn answers_known_without_a_call_make_no_future() {
        let executor = Rc::new(RefCell::new(LocalExecutor::new(8, None).unwrap()));
        let function = FutureFunction::new(Rc::clone(&executor), |input: &u32| {
            let input = *input;
            async move { Ok(vec![input * 10]) }
        })
        .with_ready(|input: &u32| (input % 2 == 0).then_some(input * 10));
        let mut harness =
            AsyncHarness::new(function, AsyncConfig::new(OutputMode::Unordered, 4)).unwrap();
        harness.process_record(2, None).unwrap();
        assert!(executor.borrow().is_empty(), "no future for a ready answer");
        assert_eq!(harness.take_output(), vec![StreamElement::record(20, None)]);
        harness.process_record(3, None).unwrap();
        assert_eq!(executor.borrow().len(), 1);
        executor.borrow_mut().run_ready();
        harness.run_mailbox().unwrap();
        assert_eq!(harness.take_output(), vec![StreamElement::record(30, None)]);
        assert_eq!(harness.operator().metrics().ready, 1);
    }
}
