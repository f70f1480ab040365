//! The handshake's checks on the network thread: who a peer claims to be, whether it
//! runs this job, and whether its answer to this side's nonce verifies (see `auth` for
//! the protocol and what it protects).

use std::sync::atomic::Ordering;

use super::auth::{self, JobId, HELLO_SIZE, NONCE_SIZE, TAG_SIZE};
use super::conn::{Conn, Ending, Payload};
use super::error::TransportError;
use super::frame::{FrameKind, Header};
use super::network::Net;

impl Net {
    /// The peer's handshake: checks who it claims to be and that it runs this job, then
    /// answers its nonce (see `auth`). It is accepted once its own answer verifies.
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
                    "process {process} is connected already: two processes share an id, or an \
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
        let nonce: [u8; NONCE_SIZE] = bytes[..NONCE_SIZE].try_into().expect("checked size");
        let tag = auth::tag(
            self.config.secret.as_ref(),
            &nonce,
            self.config.process,
            process,
            &self.config.job,
        );
        let header = Header {
            kind: FrameKind::Auth,
            len: TAG_SIZE as u32,
            channel: 0,
            arg0: 0,
            arg1: 0,
        };
        conn.queue(header, Some(Payload::Bytes(tag.to_vec())));
        conn.claimed = Some(process);
        // What was queued before (partition requests) goes after the answer.
        let held = std::mem::take(&mut conn.held);
        conn.staged.extend(held);
        Ok(())
    }

    /// The peer's answer to our nonce: once it verifies, the peer is the process it
    /// claimed and a member of this job, and its other frames are accepted.
    pub(super) fn authenticate(&mut self, conn: &mut Conn, tag: &[u8]) -> Result<(), Ending> {
        let process = conn
            .claimed
            .expect("an authentication frame follows a handshake");
        let verified = auth::verify(
            self.config.secret.as_ref(),
            &conn.nonce,
            process,
            self.config.process,
            &self.config.job,
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
                reason: format!("process {process} is connected already"),
            }));
        }
        conn.process = Some(process);
        conn.handshake_deadline = None;
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
