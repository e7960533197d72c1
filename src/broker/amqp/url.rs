//! Parsing of `amqp://` / `amqps://` URLs (SPEC.md `amqp_url`; the RabbitMQ URI specification,
//! <https://www.rabbitmq.com/uri-spec.html>), and their masked form for messages and logs.

use crate::error::{mask_url, Error, Result};
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};

/// Default port of `amqp://`.
pub const DEFAULT_PORT: u16 = 5672;
/// Default port of `amqps://`.
pub const DEFAULT_TLS_PORT: u16 = 5671;

/// Characters percent-encoded in the user and vhost parts of [`AmqpUrl::masked`].
const COMPONENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b':')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'@')
    .add(b'[')
    .add(b']')
    .add(b'\\')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// A parsed AMQP URL. Strings are percent-decoded.
#[derive(Clone, PartialEq, Eq)]
pub struct AmqpUrl {
    /// True for `amqps://`.
    pub tls: bool,
    /// Host name or IP address (IPv6 without brackets). `localhost` when absent.
    pub host: String,
    /// TCP port: 5672 by default, 5671 for `amqps`.
    pub port: u16,
    /// Virtual host; `/` when the path is empty (`/` is written `%2f` in the URL).
    pub vhost: String,
    /// User name; `guest` when absent.
    pub user: String,
    /// Password; `guest` when absent. Never printed: see [`AmqpUrl::masked`].
    pub password: String,
    /// `heartbeat` query parameter, seconds (0 disables heartbeats).
    pub heartbeat: Option<u16>,
    /// `connection_timeout` query parameter, milliseconds.
    pub connection_timeout_ms: Option<u64>,
}

impl std::fmt::Debug for AmqpUrl {
    /// Prints the masked URL: the password never reaches logs through `{:?}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AmqpUrl({})", self.masked())
    }
}

impl std::fmt::Display for AmqpUrl {
    /// The masked URL, as [`AmqpUrl::masked`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.masked())
    }
}

fn decode(part: &str, what: &str) -> std::result::Result<String, String> {
    percent_decode_str(part)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| format!("the {what} is not valid UTF-8 once percent-decoded"))
}

/// Masks the password of a URL that may not even have a scheme: [`mask_url`], and when no
/// `://` is present, everything before the last `@` is replaced by `****`.
fn mask_any(url: &str) -> String {
    if url.contains("://") {
        mask_url(url)
    } else if let Some(at) = url.rfind('@') {
        format!("****{}", &url[at..])
    } else {
        url.to_string()
    }
}

impl AmqpUrl {
    /// Parses `amqp://user:pass@host:port/vhost?heartbeat=N&connection_timeout=MS`.
    ///
    /// Defaults: port 5672 (5671 for `amqps`), user and password `guest`, host `localhost`,
    /// vhost `/` when the path is empty or `/`. The vhost, user and password are
    /// percent-decoded (`%2f` gives `/`); the vhost must be a single path segment. Other
    /// query parameters of the RabbitMQ URI spec are accepted and ignored.
    ///
    /// Errors: `Error::Config("Invalid AMQP URL <url, password masked>: <detail>")`.
    pub fn parse(url: &str) -> Result<AmqpUrl> {
        Self::parse_inner(url.trim()).map_err(|detail| {
            Error::Config(format!("Invalid AMQP URL {}: {detail}", mask_any(url)))
        })
    }

    fn parse_inner(url: &str) -> std::result::Result<AmqpUrl, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| "expected amqp://host or amqps://host".to_string())?;
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "amqp" => false,
            "amqps" => true,
            other => {
                return Err(format!(
                    "unsupported scheme '{other}' (expected amqp or amqps)"
                ))
            }
        };
        // Drop a fragment, split off the query.
        let rest = rest.split('#').next().unwrap_or("");
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        // Userinfo ends at the last '@' of the authority (as `mask_url` reads it).
        let (userinfo, hostport) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            Some(ui) => {
                let (u, p) = match ui.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (ui, None),
                };
                let user = decode(u, "user")?;
                let password = match p {
                    Some(p) => decode(p, "password")?,
                    None => "guest".to_string(),
                };
                let user = if user.is_empty() && p.is_none() {
                    "guest".to_string()
                } else {
                    user
                };
                (user, password)
            }
            None => ("guest".to_string(), "guest".to_string()),
        };
        let default_port = if tls { DEFAULT_TLS_PORT } else { DEFAULT_PORT };
        let (host, port) = if let Some(after) = hostport.strip_prefix('[') {
            let end = after
                .find(']')
                .ok_or_else(|| "unterminated IPv6 address (missing ']')".to_string())?;
            let host = &after[..end];
            let tail = &after[end + 1..];
            let port = match tail {
                "" => None,
                t => Some(
                    t.strip_prefix(':')
                        .ok_or_else(|| format!("unexpected '{t}' after the IPv6 address"))?,
                ),
            };
            (host.to_string(), port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (decode(h, "host")?, Some(p)),
                None => (decode(hostport, "host")?, None),
            }
        };
        let port = match port {
            None | Some("") => default_port,
            Some(p) => match p.parse::<u16>() {
                Ok(0) | Err(_) => return Err(format!("invalid port '{p}'")),
                Ok(n) => n,
            },
        };
        let host = if host.is_empty() {
            "localhost".to_string()
        } else {
            host
        };
        if path.contains('/') {
            return Err(
                "the vhost must be a single path segment (write '/' in a vhost name as %2f)"
                    .to_string(),
            );
        }
        let vhost = if path.is_empty() {
            "/".to_string()
        } else {
            decode(path, "vhost")?
        };
        let mut heartbeat = None;
        let mut connection_timeout_ms = None;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "heartbeat" => {
                    heartbeat =
                        Some(v.parse::<u16>().map_err(|_| {
                            format!("heartbeat must be 0..65535 seconds, got '{v}'")
                        })?)
                }
                "connection_timeout" => {
                    connection_timeout_ms = Some(v.parse::<u64>().map_err(|_| {
                        format!("connection_timeout must be milliseconds, got '{v}'")
                    })?)
                }
                other => log::debug!("ignoring AMQP URL query parameter '{other}'"),
            }
        }
        Ok(AmqpUrl {
            tls,
            host,
            port,
            vhost,
            user,
            password,
            heartbeat,
            connection_timeout_ms,
        })
    }

    /// `host:port` (IPv6 hosts in brackets), for messages.
    pub fn host_port(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The URL with the password replaced by `****`, in canonical form
    /// (`amqp://user:****@host:port/vhost[?heartbeat=N&connection_timeout=MS]`, user and vhost
    /// percent-encoded). Use it in every message and log line.
    pub fn masked(&self) -> String {
        let scheme = if self.tls { "amqps" } else { "amqp" };
        let mut s = format!(
            "{scheme}://{}:****@{}/{}",
            utf8_percent_encode(&self.user, COMPONENT),
            self.host_port(),
            utf8_percent_encode(&self.vhost, COMPONENT)
        );
        let mut sep = '?';
        if let Some(h) = self.heartbeat {
            s.push_str(&format!("{sep}heartbeat={h}"));
            sep = '&';
        }
        if let Some(t) = self.connection_timeout_ms {
            s.push_str(&format!("{sep}connection_timeout={t}"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_url() {
        let u = AmqpUrl::parse(
            "amqp://us%40er:p%40ss%3Aw@rabbit.example:5673/my%2fvhost?heartbeat=15&connection_timeout=2500",
        )
        .unwrap();
        assert!(!u.tls);
        assert_eq!(u.user, "us@er");
        assert_eq!(u.password, "p@ss:w");
        assert_eq!(u.host, "rabbit.example");
        assert_eq!(u.port, 5673);
        assert_eq!(u.vhost, "my/vhost");
        assert_eq!(u.heartbeat, Some(15));
        assert_eq!(u.connection_timeout_ms, Some(2500));
        assert_eq!(
            u.masked(),
            "amqp://us%40er:****@rabbit.example:5673/my%2Fvhost?heartbeat=15&connection_timeout=2500"
        );
        assert!(!format!("{u:?}").contains("p@ss"));
    }

    #[test]
    fn defaults() {
        let u = AmqpUrl::parse("amqp://localhost").unwrap();
        assert_eq!(
            (
                u.user.as_str(),
                u.password.as_str(),
                u.port,
                u.vhost.as_str()
            ),
            ("guest", "guest", 5672, "/")
        );
        assert_eq!(u.heartbeat, None);
        let u = AmqpUrl::parse("amqps://h/").unwrap();
        assert!(u.tls);
        assert_eq!(u.port, 5671);
        assert_eq!(u.vhost, "/");
        let u = AmqpUrl::parse("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap();
        assert_eq!(u.vhost, "/");
        assert_eq!(u.host, "127.0.0.1");
        assert_eq!(u.masked(), "amqp://guest:****@127.0.0.1:5672/%2F");
        let u = AmqpUrl::parse("amqp://").unwrap();
        assert_eq!(u.host, "localhost");
        let u = AmqpUrl::parse("AMQP://bob@h:1/v").unwrap();
        assert_eq!((u.user.as_str(), u.password.as_str()), ("bob", "guest"));
    }

    #[test]
    fn ipv6_and_at_in_password() {
        let u = AmqpUrl::parse("amqp://u:p@ss@[::1]:5999/v").unwrap();
        assert_eq!(u.host, "::1");
        assert_eq!(u.port, 5999);
        assert_eq!(u.user, "u");
        assert_eq!(u.password, "p@ss");
        assert_eq!(u.host_port(), "[::1]:5999");
        let u = AmqpUrl::parse("amqp://[::1]").unwrap();
        assert_eq!(u.port, 5672);
    }

    #[test]
    fn errors_are_config_with_masked_password() {
        for (url, detail) in [
            ("http://u:secret@h/v", "unsupported scheme 'http'"),
            ("amqp://u:secret@h:99999/v", "invalid port '99999'"),
            ("amqp://u:secret@h:0/v", "invalid port '0'"),
            ("amqp://u:secret@h/a/b", "single path segment"),
            ("amqp://u:secret@h/v?heartbeat=x", "heartbeat"),
            (
                "amqp://u:secret@h/v?connection_timeout=-1",
                "connection_timeout",
            ),
            ("amqp://u:secret@h/%ff", "not valid UTF-8"),
            ("amqp://u:secret@[::1/v", "IPv6"),
            ("u:secret@h", "expected amqp://"),
        ] {
            let err = AmqpUrl::parse(url).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, Error::Config(_)), "{url}: {msg}");
            assert!(
                msg.starts_with("Configuration error: Invalid AMQP URL "),
                "{msg}"
            );
            assert!(msg.contains(detail), "{url}: {msg}");
            assert!(!msg.contains("secret"), "{msg}");
        }
    }
}
