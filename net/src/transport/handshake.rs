//! The handshake on the network thread: who a peer claims to be, whether it runs this
//! job, the proofs each way (the dialer's first; see `auth` for the protocol and what it
//! protects).

use std::sync::atomic::Ordering;

use super::auth::{self, JobId, Role, Transcript, HELLO_SIZE, NONCE_SIZE, TAG_SIZE};
use super::conn::{Conn, Ending, Payload};
use super::error::TransportError;
use super::frame::{FrameKind, Header};
use super::network::Net;

/// Words of the refusal of a second connection from a process: a transient state (an
/// old connection not yet seen gone), which a caller waiting for the peer should not
/// take for a final refusal.
pub(super) const ALREADY_CONNECTED: &str = "is connected already";

impl Net {
    /// The peer's handshake: checks who it claims to be and that it runs this job; a
    /// dialing side then proves itself (see `auth`). The peer is accepted once its own
    /// proof verifies.
    pub(super) fn hello(
        &mut self,
        conn: &mut Conn,
        process: u32,
        bytes: &[u8],
    ) -> Result<(), Ending> {
        let refuse = |conn: &Conn, reason: String| {
            Ending::Rejected(TransportError::Refused {
                peer: conn.name(),
                reason,
            })
        };
        debug_assert_eq!(bytes.len(), HELLO_SIZE, "checked by Header::decode");
        if let Some(expected) = conn.expected {
            if expected != process {
                return Err(refuse(
                    conn,
                    format!(
                        "it is process {process}, not process {expected} as asked for: check \
                         the peer list (addresses and process ids)"
                    ),
                ));
            }
        }
        if process == self.config.process {
            return Err(refuse(
                conn,
                format!("it claims this process's own id {process}: give every process its own"),
            ));
        }
        if let Some(processes) = self.config.processes {
            if process >= processes {
                return Err(refuse(
                    conn,
                    format!(
                        "process id {process} is not one of this job's {processes} processes: \
                         check the peer list"
                    ),
                ));
            }
        }
        if self.is_live(process) {
            return Err(refuse(
                conn,
                format!(
                    "process {process} {ALREADY_CONNECTED}: two processes share an id, or an \
                     old one still runs"
                ),
            ));
        }
        let job = JobId(bytes[NONCE_SIZE..].try_into().expect("checked size"));
        if job != self.config.job {
            return Err(refuse(
                conn,
                format!(
                    "it runs another job (id {}…, this process {}…): start every process of a \
                     job with the same graph, worker layout and settings",
                    job.short(),
                    self.config.job.short()
                ),
            ));
        }
        conn.peer_nonce = bytes[..NONCE_SIZE].try_into().expect("checked size");
        conn.claimed = Some(process);
        if conn.expected.is_some() {
            // The dialer proves first.
            self.prove(conn, Role::Dialer);
        }
        Ok(())
    }

    /// What this connection's two handshakes said, with the peer as `process`.
    fn transcript(&self, conn: &Conn, process: u32) -> Transcript {
        let (me, peer) = (self.config.process, process);
        if conn.expected.is_some() {
            Transcript {
                dialer: me,
                acceptor: peer,
                dialer_nonce: conn.nonce,
                acceptor_nonce: conn.peer_nonce,
                job: self.config.job,
            }
        } else {
            Transcript {
                dialer: peer,
                acceptor: me,
                dialer_nonce: conn.peer_nonce,
                acceptor_nonce: conn.nonce,
                job: self.config.job,
            }
        }
    }

    /// Sends this side's proof, then what was held for after it.
    fn prove(&mut self, conn: &mut Conn, role: Role) {
        let process = conn.claimed.expect("a proof follows the peer's handshake");
        let tag = auth::tag(
            self.config.secret.as_ref(),
            role,
            &self.transcript(conn, process),
        );
        let header = Header {
            kind: FrameKind::Auth,
            len: TAG_SIZE as u32,
            channel: 0,
            arg0: 0,
            arg1: 0,
        };
        conn.queue(header, Some(Payload::Bytes(tag.to_vec())));
        conn.proved = true;
        // What was queued before (partition requests) goes after the proof.
        let held = std::mem::take(&mut conn.held);
        conn.staged.extend(held);
    }

    /// The peer's proof: once it verifies, the peer is the process it claimed and a
    /// member of this job, and its other frames are accepted. The acceptor proves
    /// itself only now, to a dialer that proved itself.
    pub(super) fn authenticate(&mut self, conn: &mut Conn, tag: &[u8]) -> Result<(), Ending> {
        let process = conn
            .claimed
            .expect("an authentication frame follows a handshake");
        let dialed = conn.expected.is_some();
        let peer_role = if dialed { Role::Acceptor } else { Role::Dialer };
        let verified = auth::verify(
            self.config.secret.as_ref(),
            peer_role,
            &self.transcript(conn, process),
            tag,
        );
        if !verified {
            return Err(Ending::Rejected(TransportError::Refused {
                peer: conn.name(),
                reason: "its authentication does not verify: it does not hold this job's \
                         cluster secret (give every process the same --secret-file)"
                    .into(),
            }));
        }
        if self.is_live(process) {
            return Err(Ending::Rejected(TransportError::Refused {
                peer: conn.name(),
                reason: format!("process {process} {ALREADY_CONNECTED}"),
            }));
        }
        if !dialed {
            self.prove(conn, Role::Acceptor);
        }
        conn.process = Some(process);
        conn.handshake_deadline = None;
        // Checkpoint messages sent before the connection was there go first.
        for bytes in self
            .checkpoints_waiting
            .remove(&process)
            .unwrap_or_default()
        {
            super::network::queue_checkpoint(conn, bytes);
        }
        self.control
            .connected
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(process);
        self.control.opened.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether another live connection belongs to authenticated process `process` (the
    /// connection being driven is out of `conns` meanwhile).
    pub(super) fn is_live(&self, process: u32) -> bool {
        self.conns
            .iter()
            .flatten()
            .any(|c| !c.dead && c.process == Some(process))
    }
}
