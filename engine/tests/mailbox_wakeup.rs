//! Public behaviour of the mailbox: budgets, fairness between senders, and a stress run
//! in which senders race the receiver's park (a lost wake-up hangs the test; the park
//! timeout turns a hang into a counted failure instead).

use std::time::Duration;

use weir_engine::mailbox::Mailbox;
use weir_engine::park::{Parker, Wakeup};

/// `drain` stops at its budget and resumes where it stopped; local mail comes first.
#[test]
fn drain_respects_budget_and_order() {
    let mut mailbox = Mailbox::new(Parker::current());
    let mut wired = mailbox.connect(8);
    for i in 0..5 {
        wired.try_send(i).unwrap();
    }
    mailbox.send_local(100);
    let mut got = Vec::new();
    assert_eq!(mailbox.drain(3, |m| got.push(m)), 3);
    assert_eq!(got, vec![100, 0, 1]);
    assert_eq!(mailbox.drain(10, |m| got.push(m)), 3);
    assert_eq!(got, vec![100, 0, 1, 2, 3, 4]);
    assert!(mailbox.is_empty());
}

/// With a small budget, a busy sender cannot starve another: each drain starts at the
/// next ring.
#[test]
fn drain_rotates_between_senders() {
    let mut mailbox = Mailbox::new(Parker::current());
    let mut a = mailbox.connect(16);
    let mut b = mailbox.connect(16);
    for i in 0..16 {
        a.try_send(i).unwrap();
        b.try_send(100 + i).unwrap();
    }
    let mut got = Vec::new();
    mailbox.drain(4, |m| got.push(m));
    mailbox.drain(4, |m| got.push(m));
    assert!(
        got.iter().any(|&m| m < 100) && got.iter().any(|&m| m >= 100),
        "{got:?}"
    );
}

/// A full ring hands the mail back; a dropped sender is reported once its ring is empty.
#[test]
fn full_ring_and_disconnected_sender() {
    let mut mailbox = Mailbox::new(Parker::current());
    let mut wired = mailbox.connect(1);
    wired.try_send(1).unwrap();
    assert_eq!(wired.try_send(2), Err(2));
    drop(wired);
    assert_eq!(mailbox.disconnected_senders(), 0, "mail still queued");
    mailbox.drain(8, |_| {});
    assert_eq!(mailbox.disconnected_senders(), 1);
}

/// Parking with nothing pending times out; parking with mail pending returns at once.
#[test]
fn park_times_out_or_returns_ready() {
    let mut mailbox = Mailbox::<u8>::new(Parker::current());
    assert_eq!(
        mailbox.park(Some(Duration::from_millis(1))),
        Wakeup::TimedOut
    );
    mailbox.foreign_sender().send(1);
    assert_ne!(
        mailbox.park(Some(Duration::from_secs(10))),
        Wakeup::TimedOut
    );
}

/// Two wired senders and one foreign sender each send many mails with pauses that make
/// the receiver park often; every mail arrives once, per-sender in order, and the
/// receiver never sleeps through mail (a lost wake-up would show as a 1 s timeout).
#[test]
fn senders_race_the_parking_receiver() {
    let per_sender: u64 = if cfg!(miri) { 50 } else { 20_000 };
    let mut mailbox = Mailbox::new(Parker::current());
    let mut threads = Vec::new();
    for sender_id in 0..2u64 {
        let mut sender = mailbox.connect(8);
        threads.push(std::thread::spawn(move || {
            for i in 0..per_sender {
                let mut mail = (sender_id, i);
                while let Err(back) = sender.try_send(mail) {
                    mail = back;
                    std::thread::yield_now();
                }
                if i % 64 == 0 {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        }));
    }
    let foreign = mailbox.foreign_sender();
    threads.push(std::thread::spawn(move || {
        for i in 0..per_sender {
            foreign.send((2, i));
            if i % 64 == 0 {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }));
    let mut next = [0u64; 3];
    let mut timeouts = 0;
    while next.iter().any(|&n| n < per_sender) {
        mailbox.drain(256, |(sender, i)| {
            assert_eq!(i, next[sender as usize], "sender {sender} out of order");
            next[sender as usize] += 1;
        });
        if next.iter().all(|&n| n == per_sender) {
            break;
        }
        if mailbox.park(Some(Duration::from_secs(1))) == Wakeup::TimedOut {
            timeouts += 1;
            assert!(timeouts < 5, "receiver slept through mail: {next:?}");
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(timeouts, 0, "a wake-up was lost");
}
