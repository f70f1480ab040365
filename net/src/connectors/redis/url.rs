//! `redis://[user:password@]host:port[/db][?protocol=resp2|resp3|auto]` URLs.

use std::net::{SocketAddr, ToSocketAddrs};
use std::str::FromStr;

use super::error::UrlError;

/// Which RESP version a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// RESP2 only (no `HELLO`).
    Resp2,
    /// RESP3, negotiated with `HELLO 3`; a server that refuses it is an error.
    Resp3,
    /// `HELLO 3`, falling back to RESP2 where the server does not offer RESP3 (before
    /// Redis 6).
    Auto,
}

/// A parsed Redis URL.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    /// Host name or address.
    pub host: String,
    /// Port (6379 when the URL names none).
    pub port: u16,
    /// ACL user (`AUTH user password`); `None` with a password: the default user.
    pub user: Option<String>,
    /// Password.
    pub password: Option<String>,
    /// Database (`SELECT`), 0 by default.
    pub db: u32,
    /// RESP version.
    pub protocol: Protocol,
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password never reaches a log.
        f.debug_struct("RedisUrl")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .field("protocol", &self.protocol)
            .finish()
    }
}

impl std::fmt::Display for RedisUrl {
    /// The URL without its password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "redis://")?;
        match (&self.user, &self.password) {
            (Some(user), Some(_)) => write!(f, "{user}:***@")?,
            (None, Some(_)) => write!(f, ":***@")?,
            (Some(user), None) => write!(f, "{user}@")?,
            (None, None) => {}
        }
        if self.host.contains(':') {
            write!(f, "[{}]:{}/{}", self.host, self.port, self.db)
        } else {
            write!(f, "{}:{}/{}", self.host, self.port, self.db)
        }
    }
}

impl RedisUrl {
    /// `redis://host:port` with no credentials, database 0, protocol `Auto`.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        RedisUrl {
            host: host.into(),
            port,
            user: None,
            password: None,
            db: 0,
            protocol: Protocol::Auto,
        }
    }

    /// The server's address: the host resolved (blocking, once), its first address.
    pub fn resolve(&self) -> Result<SocketAddr, UrlError> {
        let resolve = |reason: String| UrlError::Resolve {
            host: self.host.clone(),
            port: self.port,
            reason,
        };
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| resolve(e.to_string()))?
            .next()
            .ok_or_else(|| resolve("no address".into()))
    }
}

fn unescape(text: &str, url: &str) -> Result<String, UrlError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| UrlError::Escape { url: url.into() })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| UrlError::Escape { url: url.into() })
}

impl FromStr for RedisUrl {
    type Err = UrlError;

    fn from_str(url: &str) -> Result<Self, UrlError> {
        let rest = url
            .strip_prefix("redis://")
            .ok_or_else(|| UrlError::Scheme { url: url.into() })?;
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = match rest.split_once('/') {
            Some((authority, path)) => (authority, path),
            None => (rest, ""),
        };
        let (credentials, hostport) = match authority.rsplit_once('@') {
            Some((credentials, hostport)) => (Some(credentials), hostport),
            None => (None, authority),
        };
        let (user, password) = match credentials {
            None => (None, None),
            Some(credentials) => {
                let (user, password) = match credentials.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    None => (credentials, None),
                };
                let user = (!user.is_empty())
                    .then(|| unescape(user, url))
                    .transpose()?;
                let password = password.map(|p| unescape(p, url)).transpose()?;
                (user, password)
            }
        };
        let (host, port) = if let Some(bracketed) = hostport.strip_prefix('[') {
            let (host, after) = bracketed
                .split_once(']')
                .ok_or_else(|| UrlError::MissingHost { url: url.into() })?;
            (host, after.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(UrlError::MissingHost { url: url.into() });
        }
        let port = match port {
            None => 6379,
            Some(text) => match text.parse::<u16>() {
                Ok(port) if port > 0 => port,
                _ => {
                    return Err(UrlError::Port {
                        url: url.into(),
                        port: text.into(),
                    })
                }
            },
        };
        let db = if path.is_empty() {
            0
        } else {
            path.parse::<u32>().map_err(|_| UrlError::Database {
                url: url.into(),
                db: path.into(),
            })?
        };
        let mut protocol = Protocol::Auto;
        for option in query.into_iter().flat_map(|q| q.split('&')) {
            protocol = match option {
                "" => protocol,
                "protocol=resp2" => Protocol::Resp2,
                "protocol=resp3" => Protocol::Resp3,
                "protocol=auto" => Protocol::Auto,
                other => {
                    return Err(UrlError::Option {
                        url: url.into(),
                        option: other.into(),
                    })
                }
            };
        }
        Ok(RedisUrl {
            host: host.into(),
            port,
            user,
            password,
            db,
            protocol,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn full_and_minimal_urls_parse() {
        let url: RedisUrl = "redis://app:s%40cret@cache.local:6380/3?protocol=resp2"
            .parse()
            .expect("valid");
        assert_eq!(url.host, "cache.local");
        assert_eq!(url.port, 6380);
        assert_eq!(url.user.as_deref(), Some("app"));
        assert_eq!(url.password.as_deref(), Some("s@cret"));
        assert_eq!(url.db, 3);
        assert_eq!(url.protocol, Protocol::Resp2);
        assert_eq!(url.to_string(), "redis://app:***@cache.local:6380/3");
        assert!(!format!("{url:?}").contains("cret"));

        let url: RedisUrl = "redis://127.0.0.1".parse().expect("valid");
        assert_eq!(
            (url.port, url.db, url.user, url.password),
            (6379, 0, None, None)
        );
        assert_eq!(url.protocol, Protocol::Auto);

        let url: RedisUrl = "redis://:pw@[::1]:7000/".parse().expect("valid");
        assert_eq!(url.host, "::1");
        assert_eq!(url.port, 7000);
        assert_eq!(url.user, None);
        assert_eq!(url.password.as_deref(), Some("pw"));
        assert_eq!(url.to_string(), "redis://:***@[::1]:7000/0");
    }

    #[test]
    fn bad_urls_are_typed_errors_that_say_what_to_write() {
        let cases = [
            ("http://x:1", "write redis://"),
            ("redis://:6379", "names no host"),
            ("redis://host:0", "1..=65535"),
            ("redis://host:99999", "1..=65535"),
            ("redis://host:port", "1..=65535"),
            ("redis://host:6379/x", "write /0"),
            ("redis://u:%zz@host", "percent-escape"),
            ("redis://host?proto=3", "protocol=resp2"),
        ];
        for (text, hint) in cases {
            let error = text.parse::<RedisUrl>().expect_err(text);
            assert!(error.to_string().contains(hint), "{text}: {error}");
        }
    }

    proptest! {
        /// Any text parses to a URL or a typed error, never a panic.
        #[test]
        fn any_text_is_a_url_or_an_error(text in ".{0,40}") {
            let _ = text.parse::<RedisUrl>();
            let _ = format!("redis://{text}").parse::<RedisUrl>();
        }

        /// Credentials survive escaping.
        #[test]
        fn escaped_credentials_round_trip(user in "[a-z]{1,8}", password in "[ -~]{1,16}") {
            let escaped: String = password
                .bytes()
                .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
                .collect();
            let url: RedisUrl = format!("redis://{user}:{escaped}@h:1/2").parse().unwrap();
            prop_assert_eq!(url.user.as_deref(), Some(user.as_str()));
            prop_assert_eq!(url.password.as_deref(), Some(password.as_str()));
        }
    }
}
