//! Loom model of the async operator's completion path: a `ResultFuture` completed on
//! another thread while the operator drains (it must arrive once and wake the
//! operator), or while the operator is dropped (nothing may panic or be used after it
//! is freed).
#![cfg(loom)]

use std::cell::RefCell;
use std::rc::Rc;

use loom::thread;
use weir_engine::async_io::{
    AsyncConfig, AsyncFunction, AsyncWaitOperator, OutputMode, ResultFuture,
};
use weir_engine::element::StreamElement;
use weir_engine::park::Parker;

struct Hand(Rc<RefCell<Option<ResultFuture<u32>>>>);

impl AsyncFunction for Hand {
    type In = u32;
    type Out = u32;
    fn invoke(&mut self, _input: &u32, result: ResultFuture<u32>) {
        *self.0.borrow_mut() = Some(result);
    }
}

fn operator() -> (AsyncWaitOperator<Hand>, Parker, ResultFuture<u32>) {
    let slot = Rc::new(RefCell::new(None));
    let parker = Parker::current();
    let mut operator = AsyncWaitOperator::new(
        Hand(Rc::clone(&slot)),
        AsyncConfig::new(OutputMode::Ordered, 1),
        parker.unparker(),
    )
    .unwrap();
    let mut out: Vec<StreamElement<u32>> = Vec::new();
    operator.process_record(7, None, 0, &mut out).unwrap();
    let handle = slot.borrow_mut().take().expect("invoked");
    (operator, parker, handle)
}

#[test]
fn foreign_completion_arrives_and_wakes() {
    loom::model(|| {
        let (mut operator, parker, handle) = operator();
        let completer = thread::spawn(move || handle.complete([70]));
        let mut out: Vec<StreamElement<u32>> = Vec::new();
        while operator.in_flight() > 0 {
            if operator.drain(0, &mut out).unwrap() == 0 {
                parker.park(None, || operator.has_completions());
            }
        }
        completer.join().unwrap();
        assert_eq!(out, vec![StreamElement::record(70, None)]);
    });
}

#[test]
fn completion_racing_the_operator_drop_is_harmless() {
    loom::model(|| {
        let (operator, _parker, handle) = operator();
        let completer = thread::spawn(move || handle.complete([70]));
        drop(operator);
        completer.join().unwrap();
    });
}
