//! Google credentials: service-account and authorized-user JSON files, Application Default
//! Credentials, the metadata server, and the RS256 JWT a service account signs.

use super::*;
use crate::error::{Error, Result};
use crate::repository::storage::io_reason;
use base64::Engine;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Where access tokens come from.
pub enum Credentials {
    /// No `Authorization` header (emulators).
    Anonymous,
    /// A service-account key: a self-signed RS256 JWT exchanged at the key's `token_uri`
    /// (Google doc "Using OAuth 2.0 for Server to Server Applications").
    ServiceAccount(Box<ServiceAccount>),
    /// A user's refresh token from `gcloud auth application-default login`.
    AuthorizedUser(AuthorizedUser),
    /// The GCE metadata server at `base_url` (e.g. `http://metadata.google.internal`).
    /// `fallback` is true when nothing else was configured (it shapes the error message).
    Metadata {
        /// Scheme and host, no trailing `/`.
        base_url: String,
        /// Chosen because no other credentials were found.
        fallback: bool,
    },
}

/// The parts of a service-account JSON key file that are used.
pub struct ServiceAccount {
    pub(super) client_email: String,
    pub(super) private_key_id: Option<String>,
    pub(super) key: RsaKeyPair,
    pub(super) token_uri: String,
}

/// The parts of an `authorized_user` credentials file that are used.
pub struct AuthorizedUser {
    pub(super) client_id: String,
    pub(super) client_secret: String,
    pub(super) refresh_token: String,
    pub(super) token_uri: String,
}

impl std::fmt::Debug for Credentials {
    /// Names the kind and the account only: never the key, secret or token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Anonymous => write!(f, "Anonymous"),
            Credentials::ServiceAccount(sa) => write!(f, "ServiceAccount({})", sa.client_email),
            Credentials::AuthorizedUser(u) => write!(f, "AuthorizedUser({})", u.client_id),
            Credentials::Metadata { base_url, .. } => write!(f, "Metadata({base_url})"),
        }
    }
}

/// A credentials file as Google writes them (both kinds in one shape).
#[derive(Deserialize)]
pub(super) struct CredentialsFile {
    #[serde(rename = "type")]
    kind: Option<String>,
    client_email: Option<String>,
    private_key: Option<String>,
    pub(super) private_key_id: Option<String>,
    token_uri: Option<String>,
    client_id: Option<String>,
    client_secret: Option<String>,
    refresh_token: Option<String>,
}

impl Credentials {
    /// Finds credentials in SPEC.md "Authentication" order: `service_account_path`, then the file
    /// named by `GOOGLE_APPLICATION_CREDENTIALS`, then the application default credentials file
    /// (`$CLOUDSDK_CONFIG/application_default_credentials.json` or
    /// `$HOME/.config/gcloud/application_default_credentials.json`, when it exists), then the GCE
    /// metadata server (`http://$GCE_METADATA_HOST`, default `metadata.google.internal`; it is
    /// only contacted when a token is needed). `env` looks up an environment variable.
    /// Errors: `Storage error: Failed to create GCS backend: invalid credentials file <path>: <reason>`.
    pub fn resolve(
        service_account_path: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Credentials> {
        if let Some(p) = service_account_path {
            return Credentials::from_file(p);
        }
        if let Some(p) = env("GOOGLE_APPLICATION_CREDENTIALS") {
            return Credentials::from_file(Path::new(&p));
        }
        let adc = match env("CLOUDSDK_CONFIG") {
            Some(dir) => Some(PathBuf::from(dir).join(ADC_FILE)),
            None => env("HOME").map(|h| PathBuf::from(h).join(".config/gcloud").join(ADC_FILE)),
        };
        if let Some(p) = adc.filter(|p| p.is_file()) {
            return Credentials::from_file(&p);
        }
        let host = env("GCE_METADATA_HOST").unwrap_or_else(|| METADATA_DEFAULT_HOST.to_string());
        Ok(Credentials::Metadata {
            base_url: normalize_endpoint(&host),
            fallback: true,
        })
    }

    /// Reads a JSON credentials file of type `service_account` or `authorized_user`.
    /// Errors: `Storage error: Failed to create GCS backend: invalid credentials file <path>:
    /// <reason>` (the reason never quotes the file's content).
    pub fn from_file(path: &Path) -> Result<Credentials> {
        let fail = |reason: &str| {
            Error::Storage(format!(
                "{CREATE_CTX}: invalid credentials file {}: {reason}",
                path.display()
            ))
        };
        let data = std::fs::read(path).map_err(|e| fail(&io_reason(&e)))?;
        Credentials::from_json(&data).map_err(|r| fail(&r))
    }

    /// Parses a credentials file; the error is a reason without any of the file's content.
    pub(super) fn from_json(data: &[u8]) -> std::result::Result<Credentials, String> {
        let f: CredentialsFile = serde_json::from_slice(data)
            .map_err(|e| format!("not valid JSON (line {}, column {})", e.line(), e.column()))?;
        let need = |v: Option<String>, name: &str| v.ok_or_else(|| format!("{name} missing"));
        match f.kind.as_deref() {
            Some("service_account") => {
                let pem = need(f.private_key, "private_key")?;
                let key = parse_rsa_pem(&pem)?;
                Ok(Credentials::ServiceAccount(Box::new(ServiceAccount {
                    client_email: need(f.client_email, "client_email")?,
                    private_key_id: f.private_key_id,
                    key,
                    token_uri: f.token_uri.unwrap_or_else(|| GOOGLE_TOKEN_URI.to_string()),
                })))
            }
            Some("authorized_user") => Ok(Credentials::AuthorizedUser(AuthorizedUser {
                client_id: need(f.client_id, "client_id")?,
                client_secret: need(f.client_secret, "client_secret")?,
                refresh_token: need(f.refresh_token, "refresh_token")?,
                token_uri: f.token_uri.unwrap_or_else(|| GOOGLE_TOKEN_URI.to_string()),
            })),
            Some(other) => Err(format!(
                "credentials type {} is not supported (service_account or authorized_user)",
                short_reason(other).unwrap_or_else(|| "?".into())
            )),
            None => Err("type missing".into()),
        }
    }
}

/// Decodes a PEM RSA private key: PKCS#8 (`BEGIN PRIVATE KEY`, what Google issues) or PKCS#1
/// (`BEGIN RSA PRIVATE KEY`). Errors never quote the key.
pub(super) fn parse_rsa_pem(pem: &str) -> std::result::Result<RsaKeyPair, String> {
    let pkcs8 = pem.contains("-----BEGIN PRIVATE KEY-----");
    let pkcs1 = pem.contains("-----BEGIN RSA PRIVATE KEY-----");
    if !pkcs8 && !pkcs1 {
        return Err("private_key is not a PEM private key".into());
    }
    let b64: String = pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64.as_bytes())
        .map_err(|_| "private_key is not valid base64".to_string())?;
    let key = if pkcs8 {
        RsaKeyPair::from_pkcs8(&der)
    } else {
        RsaKeyPair::from_der(&der)
    };
    key.map_err(|e| format!("private_key rejected: {e}"))
}

/// Seconds since the Unix epoch.
pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl ServiceAccount {
    /// The signed JWT assertion for the token request, issued at `iat` (seconds since epoch).
    pub(super) fn assertion(
        &self,
        rng: &ring::rand::SystemRandom,
        iat: u64,
    ) -> std::result::Result<String, String> {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut header = serde_json::json!({"alg": "RS256", "typ": "JWT"});
        if let Some(kid) = &self.private_key_id {
            header["kid"] = serde_json::Value::String(kid.clone());
        }
        let claims = serde_json::json!({
            "iss": self.client_email,
            "scope": SCOPE,
            "aud": self.token_uri,
            "iat": iat,
            "exp": iat + 3600,
        });
        let input = format!(
            "{}.{}",
            b64.encode(header.to_string()),
            b64.encode(claims.to_string())
        );
        let mut sig = vec![0u8; self.key.public().modulus_len()];
        self.key
            .sign(&RSA_PKCS1_SHA256, rng, input.as_bytes(), &mut sig)
            .map_err(|_| "signing the token request failed".to_string())?;
        Ok(format!("{input}.{}", b64.encode(sig)))
    }
}
