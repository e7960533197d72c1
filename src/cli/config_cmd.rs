//! `rmq-backup config check --config FILE`: the file loaded as a run loads it
//! (`crate::config::check`), then what a run would only find out when it connects: the syntax
//! of every URL (AMQP, management, storage endpoint, Pushgateway) and the TLS files (read and
//! parsed as the run reads them). Variables unset here and secret files not here are listed
//! with their keys: a run needs them where it runs, and the rest of the file is still checked.

use crate::config::check;
use crate::config::lenient::{Absent, Missing, PLACEHOLDER};
use crate::config::{Config, StorageConfig};
use crate::error::{Error, Result};
use std::path::Path;

/// Runs the check of the file at `path`, prints its outcome, and returns the exit code: 0
/// when the file is valid (the unset variables and absent files listed on stdout), 2 with the
/// error on stderr when not.
pub(super) fn check(path: &Path) -> i32 {
    let result = check::check(path).and_then(|(cfg, absent)| {
        connections(&cfg)?;
        Ok((cfg, absent))
    });
    let (cfg, absent) = match result {
        Ok(r) => r,
        Err(e) => return super::config_failure(&e),
    };
    crate::out!(
        "{}: a valid configuration (mode {}, backup_id {}, storage {})",
        path.display(),
        cfg.mode,
        cfg.backup_id.replace(PLACEHOLDER, "${...}"),
        cfg.storage.backend_name()
    );
    if !absent.is_empty() {
        crate::out!("A run needs these where it runs (not set here):");
        for line in absent_lines(&absent) {
            crate::out!("  {line}");
        }
    }
    0
}

/// One line per variable or file: `RABBITMQ_PASSWORD (environment variable): source.amqp_url,
/// source.management_password`.
fn absent_lines(absent: &[Absent]) -> Vec<String> {
    let mut lines: Vec<(String, Vec<&str>)> = Vec::new();
    for a in absent {
        let what = match &a.missing {
            Missing::Variable(name) => format!("{name} (environment variable)"),
            Missing::File(path) => format!("{} (secret file)", path.display()),
        };
        match lines.iter_mut().find(|(w, _)| *w == what) {
            Some((_, keys)) => keys.push(&a.key),
            None => lines.push((what, vec![&a.key])),
        }
    }
    lines
        .into_iter()
        .map(|(what, keys)| format!("{what}: {}", keys.join(", ")))
        .collect()
}

/// The URLs' syntax and the TLS files of `cfg`; a URL that holds a placeholder for a variable
/// not set here is left to the run.
fn connections(cfg: &Config) -> Result<()> {
    let unknown = |url: &str| url.contains(PLACEHOLDER);
    if let Some(source) = &cfg.source {
        for url in source.amqp_url.all().iter().filter(|u| !unknown(u)) {
            amqp(url, "source.amqp_url")?;
        }
        for url in source.management_url.all() {
            http(url, "source.management_url")?;
        }
        if source.tls.is_some() {
            crate::broker::tls::TlsClient::load(source.tls.as_ref(), "source.tls")?;
        }
    }
    if let Some(target) = &cfg.target {
        for url in target.amqp_url.all().iter().filter(|u| !unknown(u)) {
            amqp(url, "target.amqp_url")?;
        }
        for url in target.management_url.iter().flat_map(|u| u.all()) {
            http(url, "target.management_url")?;
        }
        if target.tls.is_some() {
            crate::broker::tls::TlsClient::load(target.tls.as_ref(), "target.tls")?;
        }
    }
    let endpoint = match &cfg.storage {
        StorageConfig::S3(s3) => s3.endpoint.as_deref(),
        StorageConfig::Azure(az) => az.endpoint.as_deref(),
        _ => None,
    };
    if let Some(url) = endpoint {
        http(url, "storage.endpoint")?;
    }
    if let Some(url) = cfg
        .metrics
        .as_ref()
        .and_then(|m| m.pushgateway_url.as_deref())
    {
        if !unknown(url) {
            http(url, "metrics.pushgateway_url")?;
        }
    }
    Ok(())
}

/// `url` parses as the AMQP client parses it.
fn amqp(url: &str, key: &str) -> Result<()> {
    crate::broker::amqp::url::AmqpUrl::parse(url)
        .map(|_| ())
        .map_err(|e| Error::Config(format!("{key}: {}", strip_category(&e))))
}

/// `url` is `http(s)://host[:port][/path]` with a port from 1 to 65535. The URL is named
/// without its user information (it may hold a password).
fn http(url: &str, key: &str) -> Result<()> {
    let bad = |why: &str| {
        Error::Config(format!(
            "{key}: invalid URL {}: {why}",
            crate::error::mask_url(url)
        ))
    };
    let lower = url.to_ascii_lowercase();
    let rest = ["http://", "https://"]
        .iter()
        .find_map(|s| lower.strip_prefix(s).map(|_| &url[s.len()..]))
        .ok_or_else(|| bad("expected http:// or https://"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let hostport = authority.rsplit('@').next().unwrap_or("");
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| bad("unclosed [ in the host"))?;
        (h, after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    if let Some(port) = port {
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => {
                return Err(bad(&format!(
                    "the port {port:?} is not a number from 1 to 65535"
                )))
            }
        }
    }
    Ok(())
}

/// An error's message without its `Configuration error: ` prefix, for a message that adds
/// its key first.
fn strip_category(e: &Error) -> String {
    let text = e.to_string();
    text.split_once(": ")
        .filter(|(c, _)| c.ends_with("error"))
        .map_or(text.clone(), |(_, m)| m.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_urls_are_checked_without_showing_a_password() {
        assert!(http("http://127.0.0.1:15672", "k").is_ok());
        assert!(http("https://[::1]:443/api", "k").is_ok());
        assert!(http("http://rabbit", "k").is_ok());
        let e = http("http://u:secret@h:notaport", "source.management_url").unwrap_err();
        let m = e.to_string();
        assert!(
            m.starts_with("Configuration error: source.management_url"),
            "{m}"
        );
        assert!(m.contains("notaport") && !m.contains("secret"), "{m}");
        assert!(http("ftp://h", "k").is_err());
        assert!(http("http://:80", "k").is_err());
        assert!(http("http://h:0", "k").is_err());
    }

    #[test]
    fn amqp_urls_name_their_key() {
        let e = amqp("amqp://h:notaport", "source.amqp_url").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("Configuration error: source.amqp_url: Invalid AMQP URL"),
            "{e}"
        );
        assert!(amqp("amqp://u:p@h:5672/%2f", "k").is_ok());
    }

    #[test]
    fn absent_things_are_listed_once_with_their_keys() {
        let a = |m: Missing, k: &str| Absent {
            missing: m,
            key: k.into(),
        };
        let lines = absent_lines(&[
            a(Missing::Variable("PW".into()), "source.amqp_url"),
            a(Missing::Variable("DATE".into()), "backup_id"),
            a(Missing::Variable("PW".into()), "source.management_password"),
        ]);
        assert_eq!(
            lines,
            [
                "PW (environment variable): source.amqp_url, source.management_password",
                "DATE (environment variable): backup_id"
            ]
        );
    }
}
