//! TLS to the broker: AMQP (`amqps://`), the stream protocol and the management API over https
//! (issue 15; DESIGN.md decision 2: one TLS stack, rustls, no OpenSSL).
//!
//! - this file: [`TlsClient`], the trust anchors and client certificate of one broker, loaded
//!   once per run from `source.tls` / `target.tls` (SPEC.md `source.tls`), and the plain-words
//!   descriptions of handshake failures;
//! - `stream`: [`TlsStream`], a TLS session over a `TcpStream` that a reader thread and writers
//!   share, under `crate::broker::amqp::transport::Transport`.
//!
//! The server name is always checked against the broker's certificate; there is no switch that
//! turns verification off. Without `ca_cert` the system store is used (`SSL_CERT_FILE` /
//! `SSL_CERT_DIR` honoured, as for object storage).

mod stream;

pub use stream::TlsStream;

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::config::{TlsConfig, Urls};
use crate::error::{Error, Result};

/// Default TLS port of the stream protocol (RabbitMQ's `stream.listeners.ssl`).
pub const DEFAULT_STREAM_TLS_PORT: u16 = 5551;

/// The TLS settings of one broker (source or target): the CAs its certificate must chain to and
/// the optional client certificate (mutual TLS). Cheap to share (`Arc`); loading reads every
/// file once, so a missing or bad file fails the run before any connection.
pub struct TlsClient {
    config: Arc<ClientConfig>,
    /// The same roots and client certificate for the management API's HTTP client (ureq).
    http: ureq::tls::TlsConfig,
    /// What messages about this broker's TLS name.
    context: Context,
}

/// What a failed handshake's message names: where the trust anchors come from, the settings'
/// section, and whether a client certificate was offered. Cheap to clone into each connection.
#[derive(Debug, Clone)]
pub struct Context {
    /// `source.tls.ca_cert (/path)` or `the system CA store`.
    trust: String,
    /// `source.tls` or `target.tls`.
    field: String,
    client_cert: bool,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient")
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

impl TlsClient {
    /// Loads the settings of `cfg` (`None` = no `tls` section: the system store, no client
    /// certificate); `field` names the section in messages (`source.tls`, `target.tls`).
    ///
    /// Errors (`Configuration error: ...`, exit 2), each naming the field and the file, never a
    /// key's content: a file that cannot be read; no `CERTIFICATE` block in `ca_cert` or
    /// `client_cert`; no private key (PKCS#8 `PRIVATE KEY`, PKCS#1 `RSA PRIVATE KEY` or SEC1
    /// `EC PRIVATE KEY`) in `client_key`, or an encrypted one; a key that does not match its
    /// certificate; no `ca_cert` and an empty system store.
    pub fn load(cfg: Option<&TlsConfig>, field: &str) -> Result<TlsClient> {
        let default = TlsConfig::default();
        let cfg = cfg.unwrap_or(&default);
        let (roots, trust) = match &cfg.ca_cert {
            Some(path) => {
                let name = format!("{field}.ca_cert");
                (
                    read_certs(path, &name)?,
                    format!("{name} ({})", path.display()),
                )
            }
            None => (system_roots(field)?, "the system CA store".to_string()),
        };
        let mut store = RootCertStore::empty();
        for cert in &roots {
            store.add(cert.clone()).map_err(|e| {
                config_error(format!(
                    "{field}.ca_cert: a certificate cannot be used as a CA: {e}"
                ))
            })?;
        }
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| config_error(format!("{field}: {e}")))?
                .with_root_certificates(store);
        let mut http = ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::Rustls)
            .root_certs(ureq::tls::RootCerts::new_with_certs(&for_ureq(&roots)));
        let (config, has_client_cert) = match (&cfg.client_cert, &cfg.client_key) {
            (Some(cert_path), Some(key_path)) => {
                let chain = read_certs(cert_path, &format!("{field}.client_cert"))?;
                if let Some(v) = chain
                    .first()
                    .and_then(|c| x509_version(c))
                    .filter(|v| *v < 3)
                {
                    return Err(config_error(format!(
                        "{field}.client_cert ({}) is an X.509 v{v} certificate (what `openssl x509 -req` makes without an extension file), which TLS clients do not accept: re-issue it as v3 with extendedKeyUsage=clientAuth, e.g. `openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -days 365 -extfile <(printf 'extendedKeyUsage=clientAuth') -out client.pem`",
                        cert_path.display()
                    )));
                }
                let (key, http_key) = read_key(key_path, &format!("{field}.client_key"))?;
                http = http.client_cert(Some(ureq::tls::ClientCert::new_with_certs(
                    &for_ureq(&chain),
                    http_key,
                )));
                let config = builder.with_client_auth_cert(chain, key).map_err(|e| {
                    config_error(match e {
                        rustls::Error::InconsistentKeys(_) => format!(
                            "{field}.client_key ({}) does not match the certificate in {field}.client_cert ({})",
                            key_path.display(),
                            cert_path.display()
                        ),
                        e => format!(
                            "{field}.client_cert / client_key ({}, {}) cannot be used: {e}",
                            cert_path.display(),
                            key_path.display()
                        ),
                    })
                })?;
                (config, true)
            }
            (None, None) => (builder.with_no_client_auth(), false),
            _ => {
                return Err(config_error(format!(
                    "{field}.client_cert and {field}.client_key must be given together"
                )))
            }
        };
        Ok(TlsClient {
            config: Arc::new(config),
            http: http.build(),
            context: Context {
                trust,
                field: field.to_string(),
                client_cert: has_client_cert,
            },
        })
    }

    /// The rustls configuration of AMQP and stream connections.
    pub fn rustls_config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }

    /// The same trust anchors and client certificate for ureq (management API over https).
    pub fn http_config(&self) -> ureq::tls::TlsConfig {
        self.http.clone()
    }

    /// What messages about this broker's TLS name.
    pub fn context(&self) -> &Context {
        &self.context
    }
}

/// A broker's connections with their TLS settings ([`resolve`]).
#[derive(Clone)]
pub struct Resolved {
    /// The AMQP URLs (one per node given, in order; never empty), `tls.enabled` applied.
    pub urls: Vec<crate::broker::amqp::AmqpUrl>,
    /// The settings of the AMQP and stream connections: `Some` exactly when the AMQP URL uses
    /// TLS (the stream port then speaks TLS too, 5551 by default).
    pub broker: Option<Arc<TlsClient>>,
    /// The settings of the management API connection: `Some` exactly when its URL is https.
    pub management: Option<Arc<TlsClient>>,
}

/// Which of a broker's connections use TLS, each from its own URL (the first of a list: every
/// URL of a list has the same scheme, `crate::config::Urls`): the AMQP and stream
/// connections when the AMQP URL does (`amqps://`, or `amqp://` with `tls.enabled`, which
/// makes it `amqps://` on port 5671 unless the URL gives one), the management API when its
/// URL is `https://`. The settings are loaded (files read once) when one of them does.
///
/// Errors: `Configuration error: ...` for a bad URL or TLS file (see [`TlsClient::load`]), and
/// for certificate files in `field` that no connection would use (a plain AMQP URL, `enabled`
/// false and an http management URL): rather than a connection in plain text that was meant
/// to be encrypted.
pub fn resolve(
    amqp_url: &Urls,
    management_url: Option<&Urls>,
    cfg: Option<&TlsConfig>,
    field: &str,
) -> Result<Resolved> {
    let enabled = cfg.is_some_and(|c| c.enabled);
    let parse = |amqp_url: &str| {
        let trimmed = amqp_url.trim();
        match trimmed.get(..7) {
            Some(scheme) if enabled && scheme.eq_ignore_ascii_case("amqp://") => {
                crate::broker::amqp::AmqpUrl::parse(&format!("amqps://{}", &trimmed[7..]))
            }
            _ => crate::broker::amqp::AmqpUrl::parse(amqp_url),
        }
    };
    let urls = amqp_url
        .all()
        .iter()
        .map(|u| parse(u))
        .collect::<Result<Vec<_>>>()?;
    let url = urls
        .first()
        .cloned()
        .ok_or_else(|| config_error(format!("{field}: no AMQP URL")))?;
    let https = management_url.is_some_and(|u| {
        u.first()
            .trim()
            .get(..8)
            .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
    });
    if !url.tls && !https {
        if let Some(c) =
            cfg.filter(|c| c.ca_cert.is_some() || c.client_cert.is_some() || c.client_key.is_some())
        {
            let files: Vec<&str> = [
                c.ca_cert.as_ref().map(|_| "ca_cert"),
                c.client_cert.as_ref().map(|_| "client_cert"),
                c.client_key.as_ref().map(|_| "client_key"),
            ]
            .into_iter()
            .flatten()
            .collect();
            return Err(config_error(format!(
                "{field} sets {} but no connection uses TLS (an amqp:// URL, {field}.enabled false, an http:// management URL): use amqps:// or set {field}.enabled: true, or remove the files",
                files.join(", ")
            )));
        }
    }
    let loaded = if url.tls || https {
        Some(Arc::new(TlsClient::load(cfg, field)?))
    } else {
        None
    };
    Ok(Resolved {
        broker: loaded.clone().filter(|_| url.tls),
        management: loaded.filter(|_| https),
        urls,
    })
}

/// The same certificates as ureq takes them.
fn for_ureq(certs: &[CertificateDer<'static>]) -> Vec<ureq::tls::Certificate<'static>> {
    certs
        .iter()
        .map(|c| ureq::tls::Certificate::from_der(c).to_owned())
        .collect()
}

fn config_error(message: String) -> Error {
    Error::Config(message)
}

fn read_pem_file(path: &Path, field: &str) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| config_error(format!("{field}: cannot read {}: {e}", path.display())))
}

/// The X.509 version (1, 2 or 3) of a DER certificate: `Certificate ::= SEQUENCE {
/// tbsCertificate SEQUENCE { version [0] EXPLICIT INTEGER DEFAULT v1, ... } ... }` (RFC 5280
/// 4.1). `None` when the bytes are not shaped so (the TLS library then says why).
fn x509_version(der: &[u8]) -> Option<u8> {
    /// The content of the DER value of tag `tag` at the start of `b`.
    fn content(b: &[u8], tag: u8) -> Option<&[u8]> {
        if *b.first()? != tag {
            return None;
        }
        let first = *b.get(1)?;
        let (len, start) = if first < 0x80 {
            (usize::from(first), 2)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 {
                return None;
            }
            let len = b
                .get(2..2 + n)?
                .iter()
                .fold(0usize, |acc, byte| (acc << 8) | usize::from(*byte));
            (len, 2 + n)
        };
        b.get(start..start.checked_add(len)?)
    }
    let tbs = content(content(der, 0x30)?, 0x30)?;
    match content(tbs, 0xa0) {
        // No version field: the default, v1.
        None => Some(1),
        Some(explicit) => {
            let v = content(explicit, 0x02)?;
            match v {
                [n] if *n <= 2 => Some(n + 1),
                _ => None,
            }
        }
    }
}

/// Every `CERTIFICATE` block of the PEM file at `path`, in order.
fn read_certs(path: &Path, field: &str) -> Result<Vec<CertificateDer<'static>>> {
    let pem = read_pem_file(path, field)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| {
            config_error(format!(
                "{field}: {} is not a valid PEM file: {}",
                path.display(),
                pem_error(&e)
            ))
        })?;
    if certs.is_empty() {
        return Err(config_error(format!(
            "{field}: no certificate (BEGIN CERTIFICATE) in {}",
            path.display()
        )));
    }
    Ok(certs)
}

/// The private key of the PEM file at `path` (PKCS#8, PKCS#1 or SEC1), for rustls and ureq.
fn read_key(
    path: &Path,
    field: &str,
) -> Result<(PrivateKeyDer<'static>, ureq::tls::PrivateKey<'static>)> {
    let pem = read_pem_file(path, field)?;
    if pem
        .windows(b"ENCRYPTED PRIVATE KEY".len())
        .any(|w| w == b"ENCRYPTED PRIVATE KEY")
    {
        return Err(config_error(format!(
            "{field}: the key in {} is encrypted with a passphrase, which is not supported; write it unencrypted (openssl pkey -in KEY -out KEY.plain) and protect the file instead",
            path.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        config_error(match e {
            rustls::pki_types::pem::Error::NoItemsFound => format!(
                "{field}: no private key (BEGIN PRIVATE KEY, BEGIN RSA PRIVATE KEY or BEGIN EC PRIVATE KEY) in {}",
                path.display()
            ),
            e => format!(
                "{field}: {} is not a valid PEM file: {}",
                path.display(),
                pem_error(&e)
            ),
        })
    })?;
    let http = ureq::tls::PrivateKey::from_pem(&pem).map_err(|_| {
        config_error(format!(
            "{field}: the key in {} cannot be read",
            path.display()
        ))
    })?;
    Ok((key, http))
}

/// A PEM parse error in words that never quote the file's content.
fn pem_error(e: &rustls::pki_types::pem::Error) -> &'static str {
    use rustls::pki_types::pem::Error as E;
    match e {
        E::MissingSectionEnd { .. } => "a BEGIN line has no matching END line",
        E::IllegalSectionStart { .. } => "a BEGIN line is malformed",
        E::Base64Decode(_) => "a block is not valid base64",
        E::NoItemsFound => "no PEM block found",
        _ => "the file cannot be parsed",
    }
}

/// The system's CA certificates (`SSL_CERT_FILE`, `SSL_CERT_DIR`, else the distribution's
/// bundle), as rustls-native-certs finds them.
fn system_roots(field: &str) -> Result<Vec<CertificateDer<'static>>> {
    let found = rustls_native_certs::load_native_certs();
    if found.certs.is_empty() {
        let why = found
            .errors
            .first()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default();
        return Err(config_error(format!(
            "{field}.ca_cert is not set and the system CA store is empty{why}: set {field}.ca_cert to the broker's CA file, or SSL_CERT_FILE"
        )));
    }
    Ok(found.certs)
}

/// True when `bytes` (the first ones a server sent) start like a TLS record: an alert (21) or
/// a handshake (22) of TLS 1.x. A plain AMQP or stream client that sees this spoke to a TLS
/// port.
pub fn looks_like_tls(bytes: &[u8]) -> bool {
    matches!(bytes, [0x15 | 0x16, 0x03, ..])
}

impl Context {
    /// Why a broker may close the connection right after a (TLS 1.3) handshake, before its
    /// alert can be read.
    pub fn closed_early(&self) -> String {
        if self.client_cert {
            "it may have refused our client certificate (expired, or not signed by a CA it trusts)"
                .to_string()
        } else {
            format!(
                "it may require a client certificate: set {0}.client_cert and {0}.client_key",
                self.field
            )
        }
    }

    /// Plain words for a failed TLS handshake or session: what went wrong and what to check.
    pub fn describe(&self, e: &rustls::Error) -> String {
        let Context {
            trust,
            field,
            client_cert,
        } = self;
        let client_cert = *client_cert;
        use rustls::{AlertDescription as A, CertificateError as C, Error as E};
        match e {
            E::InvalidCertificate(C::UnknownIssuer) => format!(
                "the broker's certificate is not signed by a CA in {trust} (is it the CA that signed the broker's certificate?)"
            ),
            E::InvalidCertificate(c @ C::NotValidForNameContext { .. }) => {
                format!("{c} (connect with a name the certificate holds)")
            }
            E::InvalidCertificate(C::NotValidForName) => {
                "the broker's certificate is not valid for the host name of the URL (connect with a name the certificate holds)".to_string()
            }
            E::InvalidCertificate(c @ C::ExpiredContext { .. }) => format!("the broker's {c}"),
            E::InvalidCertificate(C::Expired) => "the broker's certificate expired".to_string(),
            E::InvalidCertificate(c) => format!("the broker's certificate was refused: {c}"),
            E::AlertReceived(A::CertificateRequired) => {
                format!("the broker requires a client certificate: set {field}.client_cert and {field}.client_key")
            }
            E::AlertReceived(A::HandshakeFailure) if !client_cert => {
                format!("the broker refused the handshake (alert handshake_failure); it may require a client certificate: set {field}.client_cert and {field}.client_key")
            }
            E::AlertReceived(a @ (A::BadCertificate | A::UnknownCA | A::CertificateExpired
            | A::CertificateUnknown | A::UnsupportedCertificate | A::CertificateRevoked
            | A::AccessDenied | A::DecryptError)) => format!(
                "the broker refused our client certificate (alert {a:?}): is it signed by a CA the broker trusts, valid today, and meant for client authentication?"
            ),
            E::AlertReceived(a) => format!("the broker ended the handshake with alert {a:?}"),
            E::InvalidMessage(_) | E::InappropriateMessage { .. } => {
                "the server does not speak TLS on this port (a plain, non-TLS port?)".to_string()
            }
            e => e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests;
