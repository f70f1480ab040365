//! One pipelined RESP2 connection on the worker's driver whose replies are handed to
//! its owner whole, as owned frames: the connection the streams source and sink share.
//!
//! The lookup client (`super::super::client`) matches flat replies to calls in place;
//! the streams commands answer nested arrays (`XREAD`: streams, entries, fields) that
//! their owner walks, so here each reply is decoded into a
//! [`OwnedFrame`](redis_protocol::resp2::types::OwnedFrame) (after the nesting check
//! every reply passes, see `super::super::resp`) and queued as a [`ConnEvent::Reply`],
//! in the order the commands were queued (Redis answers a connection's commands in
//! order). An error reply is a frame like any other: its owner decides what it means.
//!
//! Set-up: a non-blocking connect handed to the driver at once (a
//! `crate::connect::Link`), then `AUTH` and `SELECT` as the URL asks, pipelined ahead
//! of the owner's commands (the driver sends them all once the connect completes). Their
//! replies come first; a refusal loses the connection with [`RedisError::Auth`] or
//! [`RedisError::Select`], which are not transient: the owner fails rather than
//! reconnecting for ever.
//!
//! Timing: each command's reply must be whole within `response_timeout` of the command
//! being handed to the driver, plus the allowance the owner gave it
//! ([`StreamConn::command_with_timeout`]: an `XREAD ... BLOCK ms` is answered only after
//! up to `ms`); the set-up replies within `connect_timeout` of the connect's start. Only
//! the oldest reply due is checked: the ones after it cannot come before it.
//!
//! Loss: a reset or closed connection, a malformed reply (not RESP, nested deeper than
//! [`REPLY_DEPTH_MAX`](super::super::REPLY_DEPTH_MAX), longer than `max_reply_bytes`, or
//! a reply to no command), a timeout, or a refused set-up drops every command
//! outstanding or queued and queues one [`ConnEvent::Lost`]. The owner re-issues what it
//! still needs; the connection is made again once a command is queued: at once after a
//! connection that worked, then after a back-off doubling from `backoff.initial` to
//! `backoff.max` while attempts keep failing (as the lookup client does).
//!
//! Invariants:
//! 1. `due` lists the replies due in order: the set-up's first, then the commands sent,
//!    then those still in `outbox` (a suffix whose `sent_ns` is [`UNSENT`]).
//! 2. `link` is `Some` exactly while the state is not `Down`, except for a link in
//!    `closing`, which is kept until the next flush closes its id through the driver
//!    (see `crate::connect`, invariant 3).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use redis_protocol::resp2::types::OwnedFrame;
use weir_engine::runtime::{Driver, DriverEvent};

use super::super::client::Backoff;
use super::super::error::RedisError;
use super::super::resp;
use super::super::url::RedisUrl;
use crate::connect::Link;

/// Settings of a [`StreamConn`].
#[derive(Debug, Clone)]
pub(crate) struct ConnSettings {
    /// Connect plus `AUTH`/`SELECT` within this, or the attempt fails.
    pub connect_timeout: Duration,
    /// Each reply whole within this of its command being sent (plus the command's own
    /// allowance), or the connection is lost.
    pub response_timeout: Duration,
    /// Reconnection back-off.
    pub backoff: Backoff,
    /// Largest reply buffered (a longer one loses the connection).
    pub max_reply_bytes: usize,
}

/// What a [`StreamConn`] has for its owner, in order.
#[derive(Debug)]
pub(crate) enum ConnEvent {
    /// The reply to the oldest command outstanding (error replies included, as frames).
    Reply(OwnedFrame),
    /// The connection was lost (reset, malformed reply, timeout, refused set-up): every
    /// command outstanding or queued is dropped; the owner re-issues what it still
    /// needs. It reconnects (with back-off) once a command is queued again.
    Lost(RedisError),
}

/// [`Due::sent_ns`] of a command still in the outbox.
const UNSENT: u64 = u64::MAX;

/// What a reply due answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answers {
    Auth,
    Select,
    /// An owner's command, whose reply may take `allowance_ns` beyond the response
    /// timeout.
    Command {
        allowance_ns: u64,
    },
}

/// A reply due.
#[derive(Debug, Clone, Copy)]
struct Due {
    answers: Answers,
    /// When its command was handed to the driver; [`UNSENT`] while in the outbox.
    sent_ns: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No connection; one is made once a command is queued and `retry_at_ns` came.
    Down,
    /// Connecting, or waiting for the set-up replies, since `since_ns`.
    SettingUp { since_ns: u64 },
    /// Set up.
    Ready,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct StreamConn {
    url: RedisUrl,
    addr: SocketAddr,
    peer: String,
    settings: ConnSettings,
    state: State,
    link: Option<Link>,
    /// Links of failed connections, closed through the driver at the next flush.
    closing: Vec<Link>,
    /// Commands not yet handed to the driver (set-up commands first).
    outbox: Vec<u8>,
    /// See invariant 1.
    due: VecDeque<Due>,
    /// The tail of a reply not yet whole.
    inbox: Vec<u8>,
    events: VecDeque<ConnEvent>,
    /// Whether anything arrived on this connection.
    heard: bool,
    /// Failed attempts in a row.
    failures: u32,
    retry_at_ns: u64,
    now_ns: u64,
    connects: u64,
    received_bytes: u64,
}

impl StreamConn {
    /// A connection to `addr` (the URL's host, resolved already); it connects when the
    /// first command is flushed.
    pub(crate) fn new(url: RedisUrl, addr: SocketAddr, settings: ConnSettings) -> Self {
        StreamConn {
            url,
            addr,
            peer: addr.to_string(),
            settings,
            state: State::Down,
            link: None,
            closing: Vec::new(),
            outbox: Vec::new(),
            due: VecDeque::new(),
            inbox: Vec::new(),
            events: VecDeque::new(),
            heard: false,
            failures: 0,
            retry_at_ns: 0,
            now_ns: 0,
            connects: 0,
            received_bytes: 0,
        }
    }

    /// The server, for messages.
    pub(crate) fn peer(&self) -> &str {
        &self.peer
    }

    /// Queues a command; it is sent at the next flush once the connection is up
    /// (behind the set-up), and answered within the response timeout.
    pub(crate) fn command(&mut self, args: &[&[u8]]) {
        self.command_with_timeout(args, Duration::ZERO);
    }

    /// [`command`](Self::command) whose reply may take `allowance` longer than the
    /// response timeout (an `XREAD ... BLOCK ms` passes its block time).
    pub(crate) fn command_with_timeout(&mut self, args: &[&[u8]], allowance: Duration) {
        debug_assert!(!args.is_empty(), "a command has a name");
        resp::encode_command(&mut self.outbox, args);
        self.due.push_back(Due {
            answers: Answers::Command {
                allowance_ns: nanos(allowance),
            },
            sent_ns: UNSENT,
        });
    }

    /// The owner's commands whose replies are due (queued or sent).
    pub(crate) fn outstanding(&self) -> usize {
        self.due
            .iter()
            .filter(|due| matches!(due.answers, Answers::Command { .. }))
            .count()
    }

    /// The next reply or loss, in order.
    pub(crate) fn next_event(&mut self) -> Option<ConnEvent> {
        self.events.pop_front()
    }

    /// Connections started so far (the first, then each reconnection).
    pub(crate) fn connects(&self) -> u64 {
        self.connects
    }

    /// Bytes received so far.
    pub(crate) fn received_bytes(&self) -> u64 {
        self.received_bytes
    }

    /// Closes what failed, connects when commands wait, fails the connection past its
    /// timeouts, and hands the queued commands to the driver.
    pub(crate) fn flush(&mut self, driver: &mut dyn Driver, now_ns: u64) {
        self.now_ns = now_ns;
        for link in self.closing.drain(..) {
            link.close(driver);
        }
        match self.state {
            State::Down => {
                if !self.due.is_empty() && now_ns >= self.retry_at_ns {
                    self.connect(driver);
                }
            }
            State::SettingUp { .. } | State::Ready => {
                if let Some(error) = self.overdue(now_ns) {
                    self.fail(error, true);
                }
            }
        }
        if self.state != State::Down && !self.outbox.is_empty() {
            let link = self
                .link
                .as_ref()
                .expect("a connection that is not down has a link");
            driver.send(link.id(), &mut self.outbox);
            // The unsent replies are a suffix (invariant 1); their commands went now.
            for due in self.due.iter_mut().rev() {
                if due.sent_ns != UNSENT {
                    break;
                }
                due.sent_ns = now_ns;
            }
        }
        for link in self.closing.drain(..) {
            link.close(driver);
        }
    }

    /// The timeout the oldest reply due has passed at `now_ns`, if any.
    fn overdue(&self, now_ns: u64) -> Option<RedisError> {
        let oldest = self.due.front()?;
        if oldest.sent_ns == UNSENT {
            return None;
        }
        let late = now_ns > self.deadline(oldest)?;
        late.then(|| match oldest.answers {
            Answers::Auth | Answers::Select => RedisError::ConnectTimeout {
                addr: self.peer.clone(),
                timeout: self.settings.connect_timeout,
            },
            Answers::Command { .. } => RedisError::ResponseTimeout {
                addr: self.peer.clone(),
                timeout: self.settings.response_timeout,
            },
        })
    }

    /// The last instant `due`'s reply may arrive in.
    fn deadline(&self, due: &Due) -> Option<u64> {
        match due.answers {
            Answers::Auth | Answers::Select => match self.state {
                State::SettingUp { since_ns } => {
                    Some(since_ns.saturating_add(nanos(self.settings.connect_timeout)))
                }
                _ => None,
            },
            Answers::Command { allowance_ns } => Some(
                due.sent_ns
                    .saturating_add(nanos(self.settings.response_timeout))
                    .saturating_add(allowance_ns),
            ),
        }
    }

    /// When the connection next needs a flush without I/O: a reconnection attempt or
    /// the oldest reply's timeout.
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        match self.state {
            State::Down => (!self.due.is_empty()).then_some(self.retry_at_ns),
            State::SettingUp { .. } | State::Ready => {
                let oldest = self.due.front()?;
                if oldest.sent_ns == UNSENT {
                    // Sent at the next flush, which comes without a deadline.
                    return None;
                }
                self.deadline(oldest).map(|at| at.saturating_add(1))
            }
        }
    }

    /// Starts a connection: the connect handed to the driver, `AUTH` and `SELECT`
    /// queued ahead of the commands waiting.
    fn connect(&mut self, driver: &mut dyn Driver) {
        assert_eq!(self.state, State::Down);
        assert!(self.link.is_none(), "a failed connection drops its link");
        match Link::open(self.addr, driver, self.now_ns) {
            Ok(link) => self.link = Some(link),
            Err(source) => {
                let error = RedisError::Connect {
                    addr: self.peer.clone(),
                    source,
                };
                self.fail(error, false);
                return;
            }
        }
        self.connects += 1;
        self.heard = false;
        self.inbox.clear();
        let mut setup = Vec::new();
        if let Some(password) = &self.url.password {
            let mut args: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(user) = &self.url.user {
                args.push(user.as_bytes());
            }
            args.push(password.as_bytes());
            resp::encode_command(&mut setup, &args);
            self.due.push_front(Due {
                answers: Answers::Auth,
                sent_ns: 0,
            });
        }
        if self.url.db != 0 {
            let db = self.url.db.to_string();
            resp::encode_command(&mut setup, &[b"SELECT", db.as_bytes()]);
            // After AUTH's (pushed first, so it stays in front).
            let at = usize::from(self.url.password.is_some());
            self.due.insert(
                at,
                Due {
                    answers: Answers::Select,
                    sent_ns: 0,
                },
            );
        }
        if setup.is_empty() {
            self.set_up();
        } else {
            setup.append(&mut self.outbox);
            self.outbox = setup;
            self.state = State::SettingUp {
                since_ns: self.now_ns,
            };
        }
    }

    /// Ready for commands. The back-off is reset only once the server answers
    /// (`receive`): a connection whose TCP connect is still under way, or that the
    /// server accepts and closes at once, keeps backing off.
    fn set_up(&mut self) {
        self.state = State::Ready;
    }

    /// Takes a driver event if it is for this connection.
    pub(crate) fn on_event(&mut self, event: &DriverEvent<'_>) -> bool {
        let id = self.link.as_ref().map(Link::id);
        match event {
            DriverEvent::Received { conn, bytes } if Some(*conn) == id => {
                self.receive(bytes);
                true
            }
            DriverEvent::Closed { conn, error } if Some(*conn) == id => {
                let pending = self.outstanding();
                let error = RedisError::connection_closed(
                    &self.peer,
                    pending,
                    matches!(self.state, State::SettingUp { .. }),
                    self.heard,
                    error.as_ref(),
                );
                self.fail(error, false);
                true
            }
            _ => false,
        }
    }

    /// Decodes every whole reply in `bytes` (after any tail kept from before).
    fn receive(&mut self, bytes: &[u8]) {
        if !self.heard {
            self.heard = true;
            self.failures = 0;
        }
        self.received_bytes += bytes.len() as u64;
        let mut inbox = std::mem::take(&mut self.inbox);
        let buffered = !inbox.is_empty();
        if buffered {
            inbox.extend_from_slice(bytes);
        }
        let data: &[u8] = if buffered { &inbox } else { bytes };
        let mut offset = 0;
        let mut failure = None;
        while offset < data.len() {
            match resp::decode_owned(&data[offset..]) {
                Ok(Some((frame, used))) => {
                    offset += used;
                    if let Err(error) = self.on_reply(frame) {
                        failure = Some(error);
                        break;
                    }
                }
                Ok(None) => break,
                Err(refused) => {
                    failure = Some(refused.into_error(&self.peer));
                    break;
                }
            }
        }
        if failure.is_none() && data.len() - offset > self.settings.max_reply_bytes {
            failure = Some(resp::reply_too_long(
                &self.peer,
                self.settings.max_reply_bytes,
            ));
        }
        if let Some(error) = failure {
            self.fail(error, true);
            return;
        }
        if buffered {
            inbox.drain(..offset);
        } else {
            inbox.extend_from_slice(&bytes[offset..]);
        }
        self.inbox = inbox;
    }

    /// Applies one reply; an `Err` loses the connection with that error.
    fn on_reply(&mut self, frame: OwnedFrame) -> Result<(), RedisError> {
        let Some(due) = self.due.pop_front() else {
            return Err(self.malformed("a reply to no command".into()));
        };
        match (due.answers, frame) {
            (Answers::Command { .. }, frame) => {
                self.events.push_back(ConnEvent::Reply(frame));
            }
            (Answers::Auth, OwnedFrame::Error(message)) => {
                return Err(RedisError::Auth {
                    addr: self.peer.clone(),
                    message,
                });
            }
            (Answers::Select, OwnedFrame::Error(message)) => {
                return Err(RedisError::Select {
                    addr: self.peer.clone(),
                    db: self.url.db,
                    message,
                });
            }
            (Answers::Auth | Answers::Select, _) => {
                let set_up = !self
                    .due
                    .iter()
                    .any(|d| matches!(d.answers, Answers::Auth | Answers::Select));
                if set_up {
                    self.set_up();
                }
            }
        }
        Ok(())
    }

    fn malformed(&self, reason: String) -> RedisError {
        RedisError::Malformed {
            addr: self.peer.clone(),
            reason,
        }
    }

    /// Drops everything queued or due, queues [`ConnEvent::Lost`] and schedules the
    /// next attempt. `close`: this side closes the connection (the driver did not).
    fn fail(&mut self, error: RedisError, close: bool) {
        if let Some(link) = self.link.take() {
            if close {
                // Closed through the driver at the next flush, and only then shut down
                // (see `crate::connect`, invariant 3).
                self.closing.push(link);
            }
            // Otherwise the driver closed it: dropping the link now shuts the socket
            // down, so its second descriptor does not outlive the driver's.
        }
        let delay = match self.failures {
            0 => Duration::ZERO,
            n => self
                .settings
                .backoff
                .initial
                .saturating_mul(1u32 << (n - 1).min(20))
                .min(self.settings.backoff.max),
        };
        self.failures = self.failures.saturating_add(1);
        self.retry_at_ns = self.now_ns.saturating_add(nanos(delay));
        self.state = State::Down;
        self.outbox.clear();
        self.due.clear();
        self.inbox = Vec::new();
        self.events.push_back(ConnEvent::Lost(error));
    }
}

/// Connects a shared [`StreamConn`] to its task's worker driver (the source's or the
/// sink's I/O handler).
pub(crate) struct ConnIo(pub std::rc::Rc<std::cell::RefCell<StreamConn>>);

impl weir_engine::graph::IoHandler for ConnIo {
    fn flush(&mut self, driver: &mut dyn Driver, now_ns: u64) {
        self.0.borrow_mut().flush(driver, now_ns);
    }

    fn on_event(&mut self, event: &DriverEvent<'_>) -> bool {
        self.0.borrow_mut().on_event(event)
    }

    fn next_deadline(&self) -> Option<u64> {
        self.0.borrow().next_deadline()
    }
}

pub(crate) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(url: &str) -> StreamConn {
        let url: RedisUrl = url.parse().expect("url");
        StreamConn::new(
            url,
            "127.0.0.1:9".parse().expect("addr"),
            ConnSettings {
                connect_timeout: Duration::from_secs(1),
                response_timeout: Duration::from_secs(2),
                backoff: Backoff {
                    initial: Duration::from_millis(10),
                    max: Duration::from_millis(40),
                },
                max_reply_bytes: 1024,
            },
        )
    }

    /// A connection as `connect` leaves it, without a socket.
    fn up(conn: &mut StreamConn) {
        conn.state = State::Ready;
    }

    fn replies(conn: &mut StreamConn) -> Vec<OwnedFrame> {
        let mut out = Vec::new();
        while let Some(event) = conn.next_event() {
            match event {
                ConnEvent::Reply(frame) => out.push(frame),
                ConnEvent::Lost(error) => panic!("lost: {error}"),
            }
        }
        out
    }

    fn lost(conn: &mut StreamConn) -> RedisError {
        loop {
            match conn.next_event() {
                Some(ConnEvent::Lost(error)) => return error,
                Some(ConnEvent::Reply(_)) => {}
                None => panic!("not lost"),
            }
        }
    }

    /// Nested replies come whole, in order, at any split of the bytes; error replies
    /// are frames too.
    #[test]
    fn nested_replies_are_handed_out_whole_in_order_at_any_split() {
        let wire: &[u8] =
            b"*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n-ERR no\r\n*-1\r\n";
        for split in [1, 2, 7, 1000] {
            let mut conn = conn("redis://127.0.0.1:9");
            up(&mut conn);
            for _ in 0..3 {
                conn.command(&[b"PING"]);
            }
            assert_eq!(conn.outstanding(), 3);
            for chunk in wire.chunks(split) {
                conn.receive(chunk);
            }
            let frames = replies(&mut conn);
            assert_eq!(frames.len(), 3, "split {split}");
            assert!(matches!(&frames[0], OwnedFrame::Array(a) if a.len() == 1));
            assert_eq!(frames[1], OwnedFrame::Error("ERR no".into()));
            assert_eq!(frames[2], OwnedFrame::Null);
            assert_eq!(conn.outstanding(), 0);
        }
    }

    /// Garbage, a reply to no command, one nested too deep, and one longer than
    /// `max_reply_bytes` lose the connection with a typed error and drop what was due.
    #[test]
    fn malformed_replies_lose_the_connection() {
        let deep = b"*1\r\n".repeat(100);
        let long = b"$2000\r\n".to_vec();
        let cases: [(&[u8], &str); 4] = [
            (b"!x\r\n", "malformed"),
            (b"+OK\r\n+OK\r\n", "no command"),
            (&deep, "nests"),
            (&[&long[..], &[b'v'; 1100][..]].concat(), "max_reply_bytes"),
        ];
        for (bytes, hint) in cases {
            let mut conn = conn("redis://127.0.0.1:9");
            up(&mut conn);
            conn.command(&[b"PING"]);
            conn.receive(bytes);
            let error = lost(&mut conn);
            assert!(error.to_string().contains(hint), "{hint}: {error}");
            assert_eq!(conn.outstanding(), 0);
            assert_eq!(conn.state, State::Down);
        }
    }

    /// `AUTH` and `SELECT` go ahead of the commands, their replies are not handed out,
    /// and a refusal is a typed, non-transient loss.
    #[test]
    fn set_up_replies_come_first_and_refusals_are_typed() {
        let mut conn = conn("redis://u:p@127.0.0.1:9/3");
        conn.command(&[b"PING"]);
        // What `connect` queues, without a socket.
        conn.state = State::SettingUp { since_ns: 0 };
        conn.due.push_front(Due {
            answers: Answers::Select,
            sent_ns: 0,
        });
        conn.due.push_front(Due {
            answers: Answers::Auth,
            sent_ns: 0,
        });
        conn.receive(b"+OK\r\n");
        assert_eq!(conn.state, State::SettingUp { since_ns: 0 });
        conn.receive(b"+OK\r\n");
        assert_eq!(conn.state, State::Ready);
        conn.receive(b"+PONG\r\n");
        assert_eq!(
            replies(&mut conn),
            vec![OwnedFrame::SimpleString(b"PONG".to_vec())]
        );

        conn.command(&[b"PING"]);
        conn.state = State::SettingUp { since_ns: 0 };
        conn.due.push_front(Due {
            answers: Answers::Auth,
            sent_ns: 0,
        });
        conn.receive(b"-WRONGPASS invalid username-password pair\r\n");
        let error = lost(&mut conn);
        assert!(matches!(error, RedisError::Auth { .. }), "{error}");
        assert!(!error.is_transient());
    }

    /// The oldest command's reply is due within the response timeout plus its
    /// allowance from its send; a late one loses the connection, and attempts back off.
    #[test]
    fn replies_are_timed_with_their_allowance() {
        let mut driver = weir_engine::runtime::NoIo::new();
        let second = 1_000_000_000;
        let mut conn = conn("redis://127.0.0.1:9");
        up(&mut conn);
        conn.command_with_timeout(&[b"XREAD"], Duration::from_secs(1));
        // Unsent: no deadline until the flush sends it.
        assert_eq!(conn.next_deadline(), None);
        // As a flush at 1 s leaves it (this connection has no socket to send on).
        conn.outbox.clear();
        conn.due[0].sent_ns = second;
        assert_eq!(conn.next_deadline(), Some(4 * second + 1));
        conn.flush(&mut driver, 4 * second);
        assert!(conn.next_event().is_none(), "within the timeout");
        conn.flush(&mut driver, 4 * second + 1);
        let error = lost(&mut conn);
        assert!(
            matches!(error, RedisError::ResponseTimeout { .. }),
            "{error}"
        );
        assert_eq!(conn.outstanding(), 0);
        let mut delays = Vec::new();
        for _ in 0..4 {
            conn.fail(
                RedisError::Closed {
                    addr: "x".into(),
                    pending: 0,
                    reason: None,
                },
                false,
            );
            delays.push((conn.retry_at_ns - conn.now_ns) / 1_000_000);
        }
        assert_eq!(delays, [10, 20, 40, 40]);
    }
}
