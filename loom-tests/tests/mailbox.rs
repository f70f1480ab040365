//! Loom models of the mailbox's check-then-park against send-then-notify: in every
//! interleaving the receiver wakes for mail sent while it was deciding to sleep. A lost
//! wake-up shows up as a loom deadlock.
#![cfg(loom)]

use loom::thread;
use weir_engine::mailbox::Mailbox;
use weir_engine::park::Parker;

fn receive(mailbox: &mut Mailbox<u32>, expected: usize) -> Vec<u32> {
    let mut got = Vec::new();
    while got.len() < expected {
        mailbox.drain(16, |mail| got.push(mail));
        if got.len() < expected {
            mailbox.park(None);
        }
    }
    got
}

/// One wired sender through its SPSC ring.
#[test]
fn no_lost_wakeup_through_a_ring() {
    loom::model(|| {
        let mut mailbox = Mailbox::new(Parker::current());
        let mut sender = mailbox.connect(2);
        let t = thread::spawn(move || {
            sender.try_send(1).unwrap();
        });
        assert_eq!(receive(&mut mailbox, 1), vec![1]);
        t.join().unwrap();
    });
}

/// A thread that is not wired, through the multi-producer inbox.
#[test]
fn no_lost_wakeup_through_the_foreign_inbox() {
    loom::model(|| {
        let mut mailbox = Mailbox::new(Parker::current());
        let sender = mailbox.foreign_sender();
        let t = thread::spawn(move || sender.send(5));
        assert_eq!(receive(&mut mailbox, 1), vec![5]);
        t.join().unwrap();
    });
}

/// Two senders racing each other and the receiver's park; both mails arrive.
#[test]
fn no_lost_wakeup_with_two_senders() {
    loom::model(|| {
        let mut mailbox = Mailbox::new(Parker::current());
        let mut wired = mailbox.connect(1);
        let foreign = mailbox.foreign_sender();
        let a = thread::spawn(move || {
            wired.try_send(1).unwrap();
        });
        let b = thread::spawn(move || foreign.send(2));
        let mut got = receive(&mut mailbox, 2);
        got.sort_unstable();
        assert_eq!(got, vec![1, 2]);
        a.join().unwrap();
        b.join().unwrap();
    });
}

/// Two mails from one sender with a single wake-up between them (quiet send, then
/// notify): the receiver still sees both.
#[test]
fn batched_notify_covers_the_batch() {
    loom::model(|| {
        let mut mailbox = Mailbox::new(Parker::current());
        let mut sender = mailbox.connect(2);
        let t = thread::spawn(move || {
            sender.try_send_quiet(1).unwrap();
            sender.try_send_quiet(2).unwrap();
            sender.notify();
        });
        assert_eq!(receive(&mut mailbox, 2), vec![1, 2]);
        t.join().unwrap();
    });
}
