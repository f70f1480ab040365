//! Who may talk to a job: the handshake's proof of membership.
//!
//! Each side's handshake carries a fresh random nonce and the job's id (a hash of
//! whatever makes two processes run the same job: its plan and worker layout, as the
//! caller describes them, see [`JobId::of`]). Each side then answers the other's nonce
//! with an authentication frame: HMAC-SHA-256, keyed with the cluster [`Secret`], over
//! a domain string, the nonce it answers, the prover's and the verifier's process ids
//! and the job id. A side accepts the peer only once its answer verifies (compared in
//! constant time), so a peer must hold the secret, answer this connection's nonce (a
//! recorded exchange does not replay), claim the process id it proves, and run the
//! same job.
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

fn mac(
    secret: Option<&Secret>,
    nonce: &[u8; NONCE_SIZE],
    prover: u32,
    verifier: u32,
    job: &JobId,
) -> HmacSha256 {
    let key = secret.map_or(&[][..], Secret::key);
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(DOMAIN);
    mac.update(nonce);
    mac.update(&prover.to_le_bytes());
    mac.update(&verifier.to_le_bytes());
    mac.update(&job.0);
    mac
}

/// The tag with which process `prover` answers process `verifier`'s `nonce`.
pub fn tag(
    secret: Option<&Secret>,
    nonce: &[u8; NONCE_SIZE],
    prover: u32,
    verifier: u32,
    job: &JobId,
) -> [u8; TAG_SIZE] {
    mac(secret, nonce, prover, verifier, job)
        .finalize()
        .into_bytes()
        .into()
}

/// Whether `tag` is `prover`'s answer to `verifier`'s `nonce` (constant time).
pub fn verify(
    secret: Option<&Secret>,
    nonce: &[u8; NONCE_SIZE],
    prover: u32,
    verifier: u32,
    job: &JobId,
    tag: &[u8],
) -> bool {
    mac(secret, nonce, prover, verifier, job)
        .verify_slice(tag)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tag verifies only for the same secret, nonce, direction, ids and job.
    #[test]
    fn a_tag_binds_everything_it_covers() {
        let secret = Secret::new(&[7; 32]).expect("secret");
        let other = Secret::new(&[8; 32]).expect("secret");
        let nonce = [1; NONCE_SIZE];
        let job = JobId::of(b"job");
        let t = tag(Some(&secret), &nonce, 1, 2, &job);
        assert!(verify(Some(&secret), &nonce, 1, 2, &job, &t));
        assert!(!verify(Some(&other), &nonce, 1, 2, &job, &t));
        assert!(!verify(None, &nonce, 1, 2, &job, &t));
        assert!(!verify(Some(&secret), &[2; NONCE_SIZE], 1, 2, &job, &t));
        assert!(!verify(Some(&secret), &nonce, 2, 1, &job, &t), "direction");
        assert!(!verify(Some(&secret), &nonce, 3, 2, &job, &t), "claimed id");
        assert!(!verify(
            Some(&secret),
            &nonce,
            1,
            2,
            &JobId::of(b"other"),
            &t
        ));
        assert!(!verify(Some(&secret), &nonce, 1, 2, &job, &t[..31]));
        assert!(Secret::new(&[0; 15]).is_err(), "too short");
        assert_ne!(nonce_pair().0, nonce_pair().1);
        assert_eq!(format!("{secret:?}"), "Secret(32 bytes)");
    }

    fn nonce_pair() -> ([u8; NONCE_SIZE], [u8; NONCE_SIZE]) {
        (nonce(), nonce())
    }
}
