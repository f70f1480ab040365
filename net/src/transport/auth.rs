//! Who may talk to a job: the handshake's proof of membership.
//!
//! Each side's handshake carries a fresh random nonce and the job's id (a hash of
//! whatever makes two processes run the same job: its plan and worker layout, as the
//! caller describes them, see [`JobId::of`]). Then each side proves it holds the cluster
//! [`Secret`] with an authentication frame: HMAC-SHA-256, keyed with the secret, over a
//! domain string, its [`Role`] (dialer or acceptor) and the connection's [`Transcript`]
//! (both process ids, both nonces, the job id). The dialer proves first; the acceptor
//! verifies that (in constant time) before it proves anything, and the dialer verifies
//! the acceptor's proof in turn. So a peer must hold the secret, answer this very
//! connection's nonces (a recorded exchange does not replay), claim the process id it
//! proves, and run the same job; and since a side proves only its own role on a
//! connection, neither side's proof can be relayed to a third process as the other's
//! (an attacker who dials two members cannot make one vouch for it to the other: the
//! acceptor proves nothing to an unproven dialer, and a member dials only the addresses
//! on its peer list).
//!
//! What it does not do: encrypt. Records travel in clear text, and an attacker on the
//! path can read them or hijack an authenticated connection (TCP without TLS). Run a
//! job over a private network, or through a TLS tunnel (stunnel, WireGuard, a service
//! mesh) between hosts. Without a secret the tag is keyed with nothing: it still
//! catches processes of another job or version, but proves no membership.

use std::path::Path;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::error::TransportError;

/// Bytes of a handshake nonce.
pub const NONCE_SIZE: usize = 16;
/// Bytes of a job id.
pub const JOB_ID_SIZE: usize = 32;
/// Bytes of an authentication tag (HMAC-SHA-256).
pub const TAG_SIZE: usize = 32;
/// Bytes of a handshake's payload: the nonce, then the job id.
pub const HELLO_SIZE: usize = NONCE_SIZE + JOB_ID_SIZE;
/// The shortest secret accepted: 128 bits.
pub const SECRET_SIZE_MIN: usize = 16;

/// Separates these tags from any other use of the secret.
const DOMAIN: &[u8] = b"weir transport v3 handshake";

type HmacSha256 = Hmac<Sha256>;

/// The cluster secret every process of a job shares. Its `Debug` shows no byte of it.
#[derive(Clone)]
pub struct Secret(Arc<[u8]>);

impl Secret {
    /// A secret of these bytes (at least [`SECRET_SIZE_MIN`]).
    pub fn new(bytes: &[u8]) -> Result<Self, TransportError> {
        if bytes.len() < SECRET_SIZE_MIN {
            return Err(TransportError::Config(format!(
                "the cluster secret has {} bytes; give it at least {SECRET_SIZE_MIN} \
                 (e.g. `head -c 32 /dev/urandom | xxd -p -c 64 > secret`)",
                bytes.len()
            )));
        }
        Ok(Secret(bytes.into()))
    }

    /// 32 random bytes from the operating system.
    pub fn generate() -> Result<Self, TransportError> {
        let mut bytes = [0u8; 32];
        getrandom::getrandom(&mut bytes).map_err(|e| {
            TransportError::Config(format!("no random bytes for a cluster secret: {e}"))
        })?;
        Secret::new(&bytes)
    }

    /// The secret in a file: its contents with surrounding whitespace trimmed (so a hex
    /// line or raw bytes both work). A file that others may read is refused.
    pub fn from_file(path: &Path) -> Result<Self, TransportError> {
        use std::os::unix::fs::PermissionsExt;
        let shown = path.display();
        let metadata = std::fs::metadata(path).map_err(|e| {
            TransportError::Config(format!("cannot read the secret file {shown}: {e}"))
        })?;
        if metadata.permissions().mode() & 0o077 != 0 {
            return Err(TransportError::Config(format!(
                "the secret file {shown} may be read by others (mode {:o}); chmod 600 it",
                metadata.permissions().mode() & 0o777
            )));
        }
        let bytes = std::fs::read(path).map_err(|e| {
            TransportError::Config(format!("cannot read the secret file {shown}: {e}"))
        })?;
        Secret::new(bytes.trim_ascii())
    }

    /// The secret as lowercase hex (to hand it to a child process).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn key(&self) -> &[u8] {
        &self.0
    }
}

/// Equal secrets (for settings that hold one; the handshake never compares secrets, it
/// verifies tags).
impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for Secret {}

impl core::fmt::Debug for Secret {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// What makes two processes run the same job: a SHA-256 of its description.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct JobId(pub [u8; JOB_ID_SIZE]);

impl JobId {
    /// The id of a job described by `description` (its plan, worker layout and the
    /// settings that shape its data; every process must describe it byte for byte the
    /// same).
    pub fn of(description: &[u8]) -> Self {
        JobId(Sha256::digest(description).into())
    }

    /// The first bytes in hex, for messages.
    pub fn short(&self) -> String {
        self.0[..6].iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl core::fmt::Debug for JobId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "JobId({}…)", self.short())
    }
}

/// A fresh nonce from the operating system's random numbers.
pub fn nonce() -> [u8; NONCE_SIZE] {
    let mut nonce = [0u8; NONCE_SIZE];
    if getrandom::getrandom(&mut nonce).is_err() {
        // No random source: a nonce from the clock and the process still differs per
        // connection, which is what replay protection needs; unpredictability is lost.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let mixed = Sha256::digest(
            [
                now.to_le_bytes(),
                u128::from(std::process::id()).to_le_bytes(),
            ]
            .concat(),
        );
        nonce.copy_from_slice(&mixed[..NONCE_SIZE]);
    }
    nonce
}

/// Which side of a connection a tag speaks for: the one that dialed, or the one that
/// accepted. A tag of one role never verifies as the other's, so neither side's answer
/// can be relayed to a third party as the other side's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that connected (the dialer proves first).
    Dialer,
    /// The side that accepted (it proves only after the dialer's proof verified).
    Acceptor,
}

/// What one connection's two handshakes said: who dialed whom, both nonces and the job.
/// Both sides build the same transcript, and every tag covers all of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transcript {
    /// The dialing process's id.
    pub dialer: u32,
    /// The accepting process's id.
    pub acceptor: u32,
    /// The dialer's nonce.
    pub dialer_nonce: [u8; NONCE_SIZE],
    /// The acceptor's nonce.
    pub acceptor_nonce: [u8; NONCE_SIZE],
    /// The job both claim to run.
    pub job: JobId,
}

fn mac(secret: Option<&Secret>, role: Role, transcript: &Transcript) -> HmacSha256 {
    let key = secret.map_or(&[][..], Secret::key);
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(DOMAIN);
    mac.update(&[match role {
        Role::Dialer => 1,
        Role::Acceptor => 2,
    }]);
    mac.update(&transcript.dialer.to_le_bytes());
    mac.update(&transcript.acceptor.to_le_bytes());
    mac.update(&transcript.dialer_nonce);
    mac.update(&transcript.acceptor_nonce);
    mac.update(&transcript.job.0);
    mac
}

/// The tag with which the side playing `role` proves the connection's `transcript`.
pub fn tag(secret: Option<&Secret>, role: Role, transcript: &Transcript) -> [u8; TAG_SIZE] {
    mac(secret, role, transcript).finalize().into_bytes().into()
}

/// Whether `tag` is the proof of the side playing `role` for `transcript` (constant
/// time).
pub fn verify(secret: Option<&Secret>, role: Role, transcript: &Transcript, tag: &[u8]) -> bool {
    mac(secret, role, transcript).verify_slice(tag).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript() -> Transcript {
        Transcript {
            dialer: 1,
            acceptor: 2,
            dialer_nonce: [1; NONCE_SIZE],
            acceptor_nonce: [2; NONCE_SIZE],
            job: JobId::of(b"job"),
        }
    }

    /// A tag verifies only for the same secret, role and transcript (ids, both nonces,
    /// job); one role's tag never passes as the other's.
    #[test]
    fn a_tag_binds_everything_it_covers() {
        let secret = Secret::new(&[7; 32]).expect("secret");
        let other = Secret::new(&[8; 32]).expect("secret");
        let t = transcript();
        let dialer = tag(Some(&secret), Role::Dialer, &t);
        assert!(verify(Some(&secret), Role::Dialer, &t, &dialer));
        assert!(!verify(Some(&secret), Role::Acceptor, &t, &dialer), "role");
        assert!(!verify(Some(&other), Role::Dialer, &t, &dialer));
        assert!(!verify(None, Role::Dialer, &t, &dialer));
        let changed = [
            Transcript { dialer: 3, ..t },
            Transcript { acceptor: 3, ..t },
            Transcript {
                dialer: 2,
                acceptor: 1,
                ..t
            },
            Transcript {
                dialer_nonce: [9; NONCE_SIZE],
                ..t
            },
            Transcript {
                acceptor_nonce: [9; NONCE_SIZE],
                ..t
            },
            Transcript {
                job: JobId::of(b"other"),
                ..t
            },
        ];
        for c in changed {
            assert!(!verify(Some(&secret), Role::Dialer, &c, &dialer), "{c:?}");
        }
        assert!(!verify(Some(&secret), Role::Dialer, &t, &dialer[..31]));
        assert!(Secret::new(&[0; 15]).is_err(), "too short");
        assert_ne!(nonce(), nonce());
        assert_eq!(format!("{secret:?}"), "Secret(32 bytes)");
    }
}
