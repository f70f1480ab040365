//! A `redis-server` child process on a loopback port, with no persistence, for tests,
//! benchmarks and examples: started pinned to a core if asked, killed when dropped (and
//! by the kernel if the thread that started it dies first).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::blocking::{is_status, BlockingConnection};
use super::error::RedisError;
use super::url::RedisUrl;

/// How to start a server.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// Core to pin the server to.
    pub core: Option<usize>,
    /// Working directory (where `SAVE` writes `dump.rdb` and a restart reads it); a
    /// fresh temporary one, removed on drop, if `None`.
    pub dir: Option<PathBuf>,
    /// More `--option value` arguments (e.g. `--requirepass`).
    pub args: Vec<String>,
}

/// A running `redis-server`; see the module docs.
pub struct RedisServer {
    child: Child,
    binary: PathBuf,
    options: ServerOptions,
    port: u16,
    dir: PathBuf,
    own_dir: bool,
}

impl RedisServer {
    /// The `redis-server` binary: `WEIR_REDIS_SERVER`, else the first on `PATH`, else
    /// Debian's `/usr/bin/redis-server`; `None` if there is none.
    pub fn binary() -> Option<PathBuf> {
        if let Some(path) = std::env::var_os("WEIR_REDIS_SERVER") {
            return Some(PathBuf::from(path));
        }
        let on_path = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("redis-server"))
                .find(|candidate| candidate.is_file())
        });
        on_path.or_else(|| {
            let debian = PathBuf::from("/usr/bin/redis-server");
            debian.is_file().then_some(debian)
        })
    }

    /// Starts a server and waits (up to 10 s) until it answers `PING`.
    pub fn start(options: ServerOptions) -> Result<Self, RedisError> {
        let binary = Self::binary().ok_or_else(|| {
            RedisError::Config(
                "redis-server not found: install it (scripts/redis.sh install) or set WEIR_REDIS_SERVER"
                    .into(),
            )
        })?;
        let port = match options.port {
            0 => free_port()?,
            port => port,
        };
        let (dir, own_dir) = match options.dir.clone() {
            Some(dir) => (dir, false),
            None => {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                let dir = std::env::temp_dir().join(format!(
                    "weir-redis-{}-{}-{}",
                    std::process::id(),
                    port,
                    NEXT.fetch_add(1, Ordering::Relaxed)
                ));
                (dir, true)
            }
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| RedisError::io(format!("creating {}", dir.display()), e))?;
        let mut server = RedisServer {
            child: spawn(&binary, port, &dir, &options)?,
            binary,
            options: ServerOptions {
                port,
                dir: Some(dir.clone()),
                ..options
            },
            port,
            dir,
            own_dir,
        };
        server.wait_ready(Duration::from_secs(10))?;
        Ok(server)
    }

    fn wait_ready(&mut self, within: Duration) -> Result<(), RedisError> {
        let started = Instant::now();
        let url = self.url();
        let mut last = String::from("no answer yet");
        while started.elapsed() < within {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(RedisError::Config(format!(
                    "redis-server exited at start ({status}): {}",
                    self.log_tail()
                )));
            }
            match BlockingConnection::connect(&url, Duration::from_millis(200))
                .and_then(|mut c| c.command(&[b"PING"]))
            {
                Ok(frame) if is_status(&frame, "PONG") => return Ok(()),
                // Up, and asking for credentials (`--requirepass`).
                Err(RedisError::Server { message, .. }) if message.starts_with("NOAUTH") => {
                    return Ok(())
                }
                Ok(frame) => last = format!("PING answered {frame:?}"),
                // Refused before it listens; LOADING while it reads a dump.
                Err(error) => last = error.to_string(),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(RedisError::Config(format!(
            "redis-server on port {} not ready within {within:?} ({last}): {}",
            self.port,
            self.log_tail()
        )))
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().rev().take(5).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its URL (no credentials, database 0).
    pub fn url(&self) -> RedisUrl {
        RedisUrl::new("127.0.0.1", self.port)
    }

    /// The server's process id (e.g. to read its CPU time in `/proc`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its working directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Kills it and starts it again on the same port and directory (it reads the
    /// `dump.rdb` a `SAVE` left there), waiting until it answers.
    pub fn restart(&mut self) -> Result<(), RedisError> {
        self.kill();
        self.child = spawn(&self.binary, self.port, &self.dir, &self.options)?;
        self.wait_ready(Duration::from_secs(10))
    }

    /// Kills it at once (`SIGKILL`, no shutdown), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        if self.own_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn spawn(
    binary: &Path,
    port: u16,
    dir: &Path,
    options: &ServerOptions,
) -> Result<Child, RedisError> {
    let mut command = Command::new(binary);
    command
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--dir")
        .arg(dir)
        .args(["--logfile", "redis.log", "--dbfilename", "dump.rdb"])
        .args(&options.args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let core = options.core;
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: it makes two system calls on stack data and
    // allocates nothing.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if let Some(core) = core {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(core, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
            Ok(())
        })
    };
    command
        .spawn()
        .map_err(|e| RedisError::io(format!("starting {}", binary.display()), e))
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> Result<u16, RedisError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| RedisError::io("finding a free port", e))
}
