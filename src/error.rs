//! The one error type of rmq-backup.
//!
//! Every variant is one category of SPEC.md "Errors"; `Display` prints the category prefix
//! (`Storage error: ...`) followed by the message. Messages never hold a password, key or
//! token: build them with [`mask_url`] when a URL is involved.

use std::fmt;

/// Result alias used across the crate.
pub type Result<T> = std::result::Result<T, Error>;

/// An error, by SPEC.md category. The `String` is the message after the prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// `AMQP error:` AMQP 0-9-1 protocol errors (channel/connection exceptions from the broker).
    Amqp(String),
    /// `Stream protocol error:` stream protocol errors.
    Stream(String),
    /// `Management API error:` HTTP errors of the management API.
    Management(String),
    /// `Storage error:` storage read, write or list failures.
    Storage(String),
    /// `Configuration error:` invalid or missing configuration, bad usage.
    Config(String),
    /// `Serialization error:` JSON/YAML parse errors and segment format errors.
    Serialization(String),
    /// `Checkpoint error:` offset store database errors.
    Checkpoint(String),
    /// `Compression error:` zstd or lz4 failures.
    Compression(String),
    /// `IO error:` low-level filesystem I/O errors.
    Io(String),
    /// `Connection error:` TCP connection failures and lost connections.
    Connection(String),
    /// `Authentication error:` AMQP or management API authentication failures.
    Authentication(String),
    /// `Manifest error:` manifest parsing or validation errors.
    Manifest(String),
    /// `Encryption error:` an encrypted backup that cannot be written or read: no identity,
    /// a wrong identity, an age file that does not authenticate (`crate::repository::encryption`). A
    /// category of this tool, beside SPEC.md's.
    Encryption(String),
}

impl Error {
    /// The category prefix of SPEC.md, including the trailing colon.
    pub fn prefix(&self) -> &'static str {
        match self {
            Error::Amqp(_) => "AMQP error:",
            Error::Stream(_) => "Stream protocol error:",
            Error::Management(_) => "Management API error:",
            Error::Storage(_) => "Storage error:",
            Error::Config(_) => "Configuration error:",
            Error::Serialization(_) => "Serialization error:",
            Error::Checkpoint(_) => "Checkpoint error:",
            Error::Compression(_) => "Compression error:",
            Error::Io(_) => "IO error:",
            Error::Connection(_) => "Connection error:",
            Error::Authentication(_) => "Authentication error:",
            Error::Manifest(_) => "Manifest error:",
            Error::Encryption(_) => "Encryption error:",
        }
    }

    /// The message without its prefix.
    pub fn message(&self) -> &str {
        match self {
            Error::Amqp(m)
            | Error::Stream(m)
            | Error::Management(m)
            | Error::Storage(m)
            | Error::Config(m)
            | Error::Serialization(m)
            | Error::Checkpoint(m)
            | Error::Compression(m)
            | Error::Io(m)
            | Error::Connection(m)
            | Error::Authentication(m)
            | Error::Manifest(m)
            | Error::Encryption(m) => m,
        }
    }

    /// The `error_type` label value of SPEC.md "Metrics HTTP server" for this error:
    /// `amqp`, `stream`, `storage`, `serialization`, `connection`, `authentication`, and
    /// `configuration` for configuration errors (a value SPEC.md's list lacks; a bad
    /// configuration is neither a broker nor a data fault), and `encryption` for encryption
    /// errors (likewise this tool's own: `crate::repository::encryption`). A management API refusal (HTTP 401
    /// or 403) is `authentication` (SPEC.md: "AMQP or management API authentication
    /// failures"); its other failures (unreachable, 5xx) are `connection`.
    pub fn error_type(&self) -> &'static str {
        match self {
            Error::Amqp(_) => "amqp",
            Error::Stream(_) => "stream",
            Error::Storage(_) | Error::Io(_) | Error::Checkpoint(_) => "storage",
            Error::Serialization(_) | Error::Compression(_) | Error::Manifest(_) => "serialization",
            Error::Management(m) if m.starts_with("HTTP 401 ") || m.starts_with("HTTP 403 ") => {
                "authentication"
            }
            Error::Connection(_) | Error::Management(_) => "connection",
            Error::Authentication(_) => "authentication",
            Error::Config(_) => "configuration",
            Error::Encryption(_) => "encryption",
        }
    }

    /// Process exit code (DESIGN.md decision 8): 2 for bad usage or configuration, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Config(_) => 2,
            // A checkpoint database that cannot be created or opened is a path to fix in the
            // configuration (SPEC.md "Errors", Checkpoint database).
            Error::Checkpoint(m) if m.starts_with("unable to open database file") => 2,
            _ => 1,
        }
    }

    /// True for errors worth retrying (lost connections, timeouts), false for the rest.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Connection(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.prefix(), self.message())
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string())
    }
}

/// Masks the password of a URL of shape `scheme://user:password@host...`, giving
/// `scheme://user:****@host...`. A URL without a password is returned unchanged. Also masks
/// query parameters whose names suggest a secret (`sig`, `password`, `secret`, `token`, `key`).
pub fn mask_url(url: &str) -> String {
    let mut out = url.to_string();
    if let Some(scheme_end) = out.find("://") {
        let rest_start = scheme_end + 3;
        let authority_end = out[rest_start..]
            .find(['/', '?', '#'])
            .map(|i| rest_start + i)
            .unwrap_or(out.len());
        if let Some(at) = out[rest_start..authority_end].rfind('@') {
            let at = rest_start + at;
            if let Some(colon) = out[rest_start..at].find(':') {
                let colon = rest_start + colon;
                out.replace_range(colon + 1..at, "****");
            }
        }
    }
    if let Some(q) = out.find('?') {
        let (base, query) = out.split_at(q + 1);
        let masked: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, _)) if is_secret_name(k) => format!("{k}=****"),
                _ => pair.to_string(),
            })
            .collect();
        out = format!("{base}{}", masked.join("&"));
    }
    out
}

fn is_secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "sig",
        "password",
        "secret",
        "token",
        "key",
        "signature",
        "credential",
    ]
    .iter()
    .any(|s| n.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_has_prefix() {
        assert_eq!(
            Error::Storage("Key not found: a/b".into()).to_string(),
            "Storage error: Key not found: a/b"
        );
        assert_eq!(
            Error::Stream("x".into()).to_string(),
            "Stream protocol error: x"
        );
        assert_eq!(Error::Config("x".into()).exit_code(), 2);
        assert_eq!(Error::Amqp("x".into()).exit_code(), 1);
    }

    #[test]
    fn error_types_follow_the_spec_categories() {
        let cases = [
            (
                Error::Management("HTTP 401 for GET /api/overview".into()),
                "authentication",
            ),
            (
                Error::Management("HTTP 403 for POST /api/definitions: Access refused.".into()),
                "authentication",
            ),
            (
                Error::Management("HTTP 500 for POST /api/definitions".into()),
                "connection",
            ),
            (
                Error::Management("error sending request for url http://x/api/overview".into()),
                "connection",
            ),
            (
                Error::Config("target.management_url is required".into()),
                "configuration",
            ),
            (
                Error::Authentication("AMQP authentication failed for user u".into()),
                "authentication",
            ),
            (
                Error::Connection("Failed to connect to amqp://u:****@h".into()),
                "connection",
            ),
            (
                Error::Storage("Failed to put k: 403 Forbidden".into()),
                "storage",
            ),
            (
                Error::Checkpoint("unable to open database file: /x".into()),
                "storage",
            ),
            (
                Error::Serialization("CRC32 mismatch: expected 1, got 2".into()),
                "serialization",
            ),
            (
                Error::Amqp("NOT_FOUND - no queue 'q' in vhost 'v'".into()),
                "amqp",
            ),
            (Error::Stream("Failed to connect: refused".into()), "stream"),
            (Error::Encryption("k: wrong identity".into()), "encryption"),
        ];
        for (e, want) in cases {
            assert_eq!(e.error_type(), want, "{e}");
        }
    }

    #[test]
    fn masks_passwords() {
        assert_eq!(
            mask_url("amqp://guest:s3cret@localhost:5672/%2f"),
            "amqp://guest:****@localhost:5672/%2f"
        );
        assert_eq!(
            mask_url("amqp://guest@localhost:5672/%2f"),
            "amqp://guest@localhost:5672/%2f"
        );
        assert_eq!(mask_url("amqp://localhost"), "amqp://localhost");
        assert_eq!(
            mask_url("amqp://u:p@ss@h/v"),
            "amqp://u:****@h/v",
            "last @ of the authority ends the userinfo"
        );
        assert_eq!(
            mask_url("https://a.blob/c?sv=1&sig=abc"),
            "https://a.blob/c?sv=1&sig=****"
        );
    }
}
