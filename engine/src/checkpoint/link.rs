//! How the checkpoint services of a job over several processes talk: one
//! [`CheckpointLink`] per process, and the messages it carries.
//!
//! Process 0's service is the job's coordinator (Flink's `CheckpointCoordinator` on the
//! JobManager): it alone triggers, times out, completes and aborts checkpoints, over
//! every task of every process. Each other process's service is a participant (a
//! TaskManager's side): it forwards its tasks' acknowledgements, declines and requests
//! to the coordinator, and passes on what the coordinator decides. The messages:
//!
//! | message | from → to | meaning |
//! |---|---|---|
//! | `Hello` | participant → coordinator | ready, with the checkpoint it restored and the job's task count, both checked against the coordinator's |
//! | `Trigger(id)` | coordinator → participants | inject barrier `id` at this process's sources |
//! | `Ack` | participant → coordinator | a task's state file for checkpoint `id` is written (its name, size, CRC, alignment, bytes of channel state) |
//! | `Decline` | participant → coordinator | a task could not snapshot checkpoint `id` |
//! | `TriggerNow` | participant → coordinator | a finished task waits for a checkpoint to commit its last output |
//! | `Complete` | coordinator → participants | checkpoint `id` is durable: commit (with its duration, longest alignment and channel state) |
//! | `Abort(id)` | coordinator → participants | checkpoint `id` failed |
//! | `Done` | participant → coordinator | every task here ended; this process stays until released |
//! | `Release` | coordinator → participants | every process's tasks ended: the services stop |
//!
//! A process stays until it is released because its finished tasks still acknowledge
//! later checkpoints with their final state, and a committing sink anywhere in the job
//! may still wait for one (Flink keeps finished tasks' state until the job ends).
//!
//! The engine names no socket: `weir-net`'s transport implements the link over the
//! connections that already join the processes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::coordinator::AckFigures;
use super::storage::TaskFile;
use super::CheckpointError;

/// What arrives over a [`CheckpointLink`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// A message from process `from`.
    Message {
        /// The sender.
        from: usize,
        /// Its bytes, as sent.
        bytes: Vec<u8>,
    },
    /// Process `process` cannot be reached any more (its connection ended).
    Lost {
        /// The process.
        process: usize,
        /// Why, for the error that fails the job.
        reason: String,
    },
}

/// Carries the checkpoint services' messages between the processes of one job.
pub trait CheckpointLink: Send + Sync {
    /// From now on, hands every message that arrives, and every process lost, to
    /// `inbox`; what arrived before the call first, in order. Called once per run.
    fn open(&self, inbox: Box<dyn Fn(LinkEvent) + Send + Sync>);

    /// Sends `bytes` to process `to`, after everything sent to it before. A process
    /// that cannot be reached is reported to the inbox as [`LinkEvent::Lost`].
    fn send(&self, to: usize, bytes: Vec<u8>);
}

/// Links between "processes" in one address space, each an index into one hub: for
/// tests of a job over several processes run as threads, beside an in-memory
/// [`RemoteChannels`](crate::graph::RemoteChannels).
///
/// ```
/// use std::sync::mpsc;
/// use weir_engine::checkpoint::{CheckpointLink, LinkEvent, LocalLinks};
///
/// let links = LocalLinks::new(2);
/// let (tx, rx) = mpsc::channel();
/// links.link(1).send(0, b"early".to_vec()); // held until process 0 opens
/// links.link(0).open(Box::new(move |event| {
///     let _ = tx.send(event);
/// }));
/// assert_eq!(rx.recv()?, LinkEvent::Message { from: 1, bytes: b"early".to_vec() });
/// links.lose(1, "killed");
/// assert!(matches!(rx.recv()?, LinkEvent::Lost { process: 1, .. }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct LocalLinks {
    hub: Arc<Hub>,
}

type Inbox = Box<dyn Fn(LinkEvent) + Send + Sync>;

struct Hub {
    /// By process: its inbox once open, or what waits for it.
    places: Mutex<Vec<(Option<Inbox>, Vec<LinkEvent>)>>,
}

impl LocalLinks {
    /// A hub for `processes` processes.
    pub fn new(processes: usize) -> Self {
        LocalLinks {
            hub: Arc::new(Hub {
                places: Mutex::new((0..processes).map(|_| (None, Vec::new())).collect()),
            }),
        }
    }

    /// Process `process`'s link.
    pub fn link(&self, process: usize) -> Arc<dyn CheckpointLink> {
        Arc::new(LocalLink {
            hub: Arc::clone(&self.hub),
            me: process,
        })
    }

    /// Process `process` is lost: every other process hears it, with `reason`, and what
    /// is sent to it from now on is dropped.
    pub fn lose(&self, process: usize, reason: &str) {
        let processes = self
            .hub
            .places
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        for other in (0..processes).filter(|&p| p != process) {
            self.hub.deliver(
                other,
                LinkEvent::Lost {
                    process,
                    reason: reason.to_string(),
                },
            );
        }
        let mut places = self.hub.places.lock().unwrap_or_else(|e| e.into_inner());
        places[process] = (Some(Box::new(|_| {})), Vec::new());
    }
}

impl Hub {
    fn deliver(&self, to: usize, event: LinkEvent) {
        let mut places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        let Some((inbox, waiting)) = places.get_mut(to) else {
            return;
        };
        match inbox {
            Some(inbox) => inbox(event),
            None => waiting.push(event),
        }
    }
}

struct LocalLink {
    hub: Arc<Hub>,
    me: usize,
}

impl CheckpointLink for LocalLink {
    fn open(&self, inbox: Box<dyn Fn(LinkEvent) + Send + Sync>) {
        let mut places = self.hub.places.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((slot, waiting)) = places.get_mut(self.me) {
            for event in waiting.drain(..) {
                inbox(event);
            }
            *slot = Some(inbox);
        }
    }

    fn send(&self, to: usize, bytes: Vec<u8>) {
        self.hub.deliver(
            to,
            LinkEvent::Message {
                from: self.me,
                bytes,
            },
        );
    }
}

/// The messages themselves (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wire {
    Hello {
        restored: u64,
        tasks: u32,
    },
    Trigger(u64),
    Ack {
        id: u64,
        task: u32,
        file: TaskFile,
        figures: AckFigures,
    },
    Decline {
        id: u64,
        task: u32,
        reason: String,
    },
    TriggerNow,
    Complete {
        id: u64,
        duration: Duration,
        alignment: Duration,
        channel_state: u64,
    },
    Abort {
        id: u64,
        reason: String,
    },
    Done,
    Release,
}

impl Wire {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32);
        let u64s = |out: &mut Vec<u8>, values: &[u64]| {
            for value in values {
                out.extend_from_slice(&value.to_le_bytes());
            }
        };
        let text = |out: &mut Vec<u8>, text: &str| {
            out.extend_from_slice(&(text.len() as u32).to_le_bytes());
            out.extend_from_slice(text.as_bytes());
        };
        match self {
            Wire::Hello { restored, tasks } => {
                out.push(1);
                u64s(&mut out, &[*restored, u64::from(*tasks)]);
            }
            Wire::Trigger(id) => {
                out.push(2);
                u64s(&mut out, &[*id]);
            }
            Wire::Ack {
                id,
                task,
                file,
                figures,
            } => {
                out.push(3);
                u64s(
                    &mut out,
                    &[
                        *id,
                        u64::from(*task),
                        file.size,
                        u64::from(file.crc),
                        nanos(&figures.alignment),
                        figures.channel_state,
                    ],
                );
                text(&mut out, &file.name);
            }
            Wire::Decline { id, task, reason } => {
                out.push(4);
                u64s(&mut out, &[*id, u64::from(*task)]);
                text(&mut out, reason);
            }
            Wire::TriggerNow => out.push(5),
            Wire::Complete {
                id,
                duration,
                alignment,
                channel_state,
            } => {
                out.push(6);
                u64s(
                    &mut out,
                    &[*id, nanos(duration), nanos(alignment), *channel_state],
                );
            }
            Wire::Abort { id, reason } => {
                out.push(7);
                u64s(&mut out, &[*id]);
                text(&mut out, reason);
            }
            Wire::Done => out.push(8),
            Wire::Release => out.push(9),
        }
        out
    }

    /// Decodes a message from process `from`; anything else is an error naming it.
    pub(crate) fn decode(from: usize, bytes: &[u8]) -> Result<Wire, CheckpointError> {
        let mut reader = Reader { bytes, at: 0 };
        let malformed = |why: &str| CheckpointError::Link {
            process: from,
            reason: format!("sent a malformed checkpoint message ({why})"),
        };
        let kind = reader.u8().ok_or_else(|| malformed("empty"))?;
        let short = || malformed("cut short");
        let u32_of = |value: u64| u32::try_from(value).map_err(|_| malformed("a task past u32"));
        let wire = match kind {
            1 => Wire::Hello {
                restored: reader.u64().ok_or_else(short)?,
                tasks: u32_of(reader.u64().ok_or_else(short)?)?,
            },
            2 => Wire::Trigger(reader.u64().ok_or_else(short)?),
            3 => {
                let id = reader.u64().ok_or_else(short)?;
                let task = u32_of(reader.u64().ok_or_else(short)?)?;
                let size = reader.u64().ok_or_else(short)?;
                let crc = u32::try_from(reader.u64().ok_or_else(short)?)
                    .map_err(|_| malformed("a CRC past u32"))?;
                let alignment = Duration::from_nanos(reader.u64().ok_or_else(short)?);
                let channel_state = reader.u64().ok_or_else(short)?;
                let name = reader.text().ok_or_else(short)?;
                Wire::Ack {
                    id,
                    task,
                    file: TaskFile { name, size, crc },
                    figures: AckFigures {
                        alignment,
                        channel_state,
                    },
                }
            }
            4 => Wire::Decline {
                id: reader.u64().ok_or_else(short)?,
                task: u32_of(reader.u64().ok_or_else(short)?)?,
                reason: reader.text().ok_or_else(short)?,
            },
            5 => Wire::TriggerNow,
            6 => Wire::Complete {
                id: reader.u64().ok_or_else(short)?,
                duration: Duration::from_nanos(reader.u64().ok_or_else(short)?),
                alignment: Duration::from_nanos(reader.u64().ok_or_else(short)?),
                channel_state: reader.u64().ok_or_else(short)?,
            },
            7 => Wire::Abort {
                id: reader.u64().ok_or_else(short)?,
                reason: reader.text().ok_or_else(short)?,
            },
            8 => Wire::Done,
            9 => Wire::Release,
            other => return Err(malformed(&format!("unknown type {other}"))),
        };
        if reader.at != bytes.len() {
            return Err(malformed("trailing bytes"));
        }
        Ok(wire)
    }
}

fn nanos(duration: &Duration) -> u64 {
    duration.as_nanos().min(u128::from(u64::MAX)) as u64
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.at.checked_add(n)?;
        let slice = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(slice)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn text(&mut self) -> Option<String> {
        let len = u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")) as usize;
        let bytes = self.take(len)?;
        Some(String::from_utf8_lossy(bytes).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Wire> {
        vec![
            Wire::Hello {
                restored: 7,
                tasks: 12,
            },
            Wire::Trigger(8),
            Wire::Ack {
                id: 8,
                task: 11,
                file: TaskFile {
                    name: "s1-3-of-4".into(),
                    size: 1 << 40,
                    crc: u32::MAX,
                },
                figures: AckFigures {
                    alignment: Duration::from_micros(1234),
                    channel_state: 1 << 33,
                },
            },
            Wire::Decline {
                id: 8,
                task: 0,
                reason: "ended before the channel state was whole".into(),
            },
            Wire::TriggerNow,
            Wire::Complete {
                id: 8,
                duration: Duration::from_millis(12),
                alignment: Duration::from_micros(7),
                channel_state: 654_321,
            },
            Wire::Abort {
                id: 9,
                reason: "expired: ünïcode".into(),
            },
            Wire::Done,
            Wire::Release,
        ]
    }

    /// Every message reads back as it was written.
    #[test]
    fn messages_read_back_as_written() {
        for wire in all() {
            assert_eq!(Wire::decode(1, &wire.encode()).expect("decodes"), wire);
        }
    }

    /// Every prefix of every message, trailing bytes, an unknown type: an error naming
    /// the sender, never a panic.
    #[test]
    fn malformed_messages_are_errors_naming_the_sender() {
        for wire in all() {
            let bytes = wire.encode();
            for cut in 0..bytes.len() {
                let error = Wire::decode(3, &bytes[..cut]).expect_err("cut short");
                assert!(error.to_string().contains("process 3"), "{error}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            let error = Wire::decode(3, &longer).expect_err("trailing");
            assert!(error.to_string().contains("trailing"), "{error}");
        }
        let error = Wire::decode(2, &[200]).expect_err("unknown");
        assert!(error.to_string().contains("unknown type 200"), "{error}");
        // A text length past the message.
        let mut bytes = vec![7];
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Wire::decode(2, &bytes).is_err());
    }
}
