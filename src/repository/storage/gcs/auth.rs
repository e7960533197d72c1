//! OAuth 2.0 access tokens for the GCS backend: fetched for the configured credentials,
//! cached until shortly before they expire, refreshed after a 401.

use super::*;
use crate::error::Error;
use crate::repository::storage::retry::{self, Attempt, Policy};
use serde::Deserialize;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use ureq::http;

/// An access token and when to fetch the next one.
pub(super) struct CachedToken {
    token: String,
    refresh_at: Instant,
}

/// The answer of a token endpoint or the metadata server.
#[derive(Deserialize)]
pub(super) struct TokenResponse {
    access_token: String,
    expires_in: Option<u64>,
}

/// Access tokens of one set of credentials, cached until shortly before they expire and shared
/// by all threads (one fetch at a time).
pub(super) struct TokenSource {
    credentials: Credentials,
    agent: ureq::Agent,
    metadata_agent: ureq::Agent,
    policy: Policy,
    cache: Mutex<Option<CachedToken>>,
    rng: ring::rand::SystemRandom,
}

impl TokenSource {
    pub(super) fn new(credentials: Credentials, agent: ureq::Agent, policy: Policy) -> TokenSource {
        TokenSource {
            credentials,
            agent,
            metadata_agent: new_agent(METADATA_CONNECT_TIMEOUT),
            policy,
            cache: Mutex::new(None),
            rng: ring::rand::SystemRandom::new(),
        }
    }

    /// The current token (`None` for anonymous access), fetched when missing or about to expire.
    /// The error is a reason for messages, without secrets.
    pub(super) fn bearer(&self) -> std::result::Result<Option<String>, String> {
        if matches!(self.credentials, Credentials::Anonymous) {
            return Ok(None);
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = cache.as_ref() {
            if Instant::now() < c.refresh_at {
                return Ok(Some(c.token.clone()));
            }
        }
        let fetched_at = Instant::now();
        let t = self.fetch()?;
        // Refresh 5 minutes before expiry, or at half the lifetime of a short-lived token.
        let life = Duration::from_secs(t.expires_in.unwrap_or(3600));
        let margin = (life / 2).min(Duration::from_secs(300));
        *cache = Some(CachedToken {
            token: t.access_token.clone(),
            refresh_at: fetched_at + life - margin,
        });
        Ok(Some(t.access_token))
    }

    /// Forgets the cached token (after a 401), so that the next request fetches a new one.
    pub(super) fn invalidate(&self) {
        *self.cache.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub(super) fn fetch(&self) -> std::result::Result<TokenResponse, String> {
        match &self.credentials {
            Credentials::Anonymous => Err("no credentials".into()),
            Credentials::ServiceAccount(sa) => {
                let jwt = sa.assertion(&self.rng, unix_now())?;
                let form = format!("grant_type={}&assertion={}", enc(JWT_GRANT), enc(&jwt));
                self.exchange(&sa.token_uri, &form)
            }
            Credentials::AuthorizedUser(u) => {
                let form = format!(
                    "grant_type=refresh_token&client_id={}&client_secret={}&refresh_token={}",
                    enc(&u.client_id),
                    enc(&u.client_secret),
                    enc(&u.refresh_token)
                );
                self.exchange(&u.token_uri, &form)
            }
            Credentials::Metadata { base_url, fallback } => {
                let url = format!("{base_url}{METADATA_TOKEN_PATH}");
                let policy = Policy {
                    attempts: self.policy.attempts.min(3),
                    ..self.policy
                };
                let result = run_token_request(policy, "metadata token request", || {
                    let req = http::Request::get(&url)
                        .header("metadata-flavor", "Google")
                        .body(());
                    match req {
                        Ok(r) => self.metadata_agent.run(r),
                        Err(e) => Err(ureq::Error::Http(e)),
                    }
                });
                result.map_err(|reason| {
                    // As the last resort of the default chain, a metadata server that cannot
                    // be reached (no such host off GCE, refused, timed out) means "nothing
                    // configured"; an HTTP answer is reported as it is.
                    let answered = reason.starts_with(|c: char| c.is_ascii_digit());
                    if *fallback && !answered {
                        format!(
                            "no credentials found (no service_account_path, \
                             GOOGLE_APPLICATION_CREDENTIALS or application default credentials) \
                             and the GCE metadata server is unreachable ({reason})"
                        )
                    } else {
                        format!("metadata server: {reason}")
                    }
                })
            }
        }
    }

    /// Posts an OAuth form to `token_uri` and reads the token from the answer.
    pub(super) fn exchange(
        &self,
        token_uri: &str,
        form: &str,
    ) -> std::result::Result<TokenResponse, String> {
        run_token_request(self.policy, "token request", || {
            let req = http::Request::post(token_uri)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(form.as_bytes());
            match req {
                Ok(r) => self.agent.run(r),
                Err(e) => Err(ureq::Error::Http(e)),
            }
        })
        .map_err(|reason| format!("token request failed: {reason}"))
    }
}

/// Runs one token request with retries; the error is a reason such as `400 invalid_grant` or
/// `token endpoint connection error`.
pub(super) fn run_token_request(
    policy: Policy,
    what: &str,
    mut send: impl FnMut() -> std::result::Result<http::Response<ureq::Body>, ureq::Error>,
) -> std::result::Result<TokenResponse, String> {
    let result = retry::run(policy, what, || {
        let mut resp = send().map_err(|e| {
            let (transient, reason) = classify(&e);
            let reason = if reason == "endpoint connection error" {
                "token endpoint connection error".to_string()
            } else {
                reason
            };
            to_attempt(transient, Error::Storage(reason))
        })?;
        let status = resp.status().as_u16();
        if status != 200 {
            let body = read_limited(&mut resp, ERROR_BODY_LIMIT);
            let code = oauth_error_code(&body)
                .or_else(|| api_reason(&body))
                .unwrap_or_else(|| canonical_reason(status));
            return Err(Attempt::from_status(
                status,
                Error::Storage(format!("{status} {code}")),
            ));
        }
        let body = read_limited(&mut resp, JSON_BODY_LIMIT);
        serde_json::from_slice::<TokenResponse>(&body)
            .map_err(|_| Attempt::Permanent(Error::Storage("answer holds no access_token".into())))
    });
    result.map_err(|e| e.message().to_string())
}

/// The `error` code of an OAuth error answer (`{"error":"invalid_grant",...}`), if short and plain.
pub(super) fn oauth_error_code(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    short_reason(v.get("error")?.as_str()?)
}

// ---------------------------------------------------------------------------------------------
// HTTP helpers
// ---------------------------------------------------------------------------------------------
