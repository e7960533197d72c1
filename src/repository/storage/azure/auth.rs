//! Authentication of Azure requests: Shared Key signatures (string to sign, RFC 1123 dates)
//! and bearer tokens (client secret, workload identity, managed identity) with their cache.

use super::*;
use crate::repository::storage::io_reason;
use crate::repository::storage::retry::{self};
use percent_encoding::utf8_percent_encode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Shared Key string-to-sign for service version 2015-02-21 and later (Azure "Authorize with
/// Shared Key"): verb, the standard headers (Content-Length empty when 0), canonicalized
/// `x-ms-` headers, canonicalized resource `/<account><encoded path>` plus each query parameter
/// as `\n<name>:<value>` sorted by name.
pub(super) fn string_to_sign(
    method: &str,
    content_length: usize,
    headers: &[(&str, String)],
    account: &str,
    encoded_path: &str,
    query: &[(&str, String)],
) -> String {
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    let length = if content_length == 0 {
        String::new()
    } else {
        content_length.to_string()
    };
    let mut s = format!(
        "{method}\n{}\n{}\n{length}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n",
        header("content-encoding"),
        header("content-language"),
        header("content-md5"),
        header("content-type"),
        header("date"),
        header("if-modified-since"),
        header("if-match"),
        header("if-none-match"),
        header("if-unmodified-since"),
        header("range"),
    );
    let mut ms: Vec<(String, String)> = headers
        .iter()
        .filter(|(k, _)| k.to_ascii_lowercase().starts_with("x-ms-"))
        .map(|(k, v)| {
            (
                k.to_ascii_lowercase(),
                v.split_whitespace().collect::<Vec<_>>().join(" "),
            )
        })
        .collect();
    ms.sort();
    for (k, v) in ms {
        s.push_str(&format!("{k}:{v}\n"));
    }
    s.push('/');
    s.push_str(account);
    s.push_str(encoded_path);
    let mut q: Vec<(String, &str)> = query
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_str()))
        .collect();
    q.sort();
    for (k, v) in q {
        s.push_str(&format!("\n{k}:{v}"));
    }
    s
}

/// RFC 1123 date (`Sun, 06 Nov 1994 08:49:37 GMT`) for `x-ms-date`.
pub(super) fn http_date(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = crate::run::units::civil_from_days(days);
    pub(super) const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    pub(super) const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{}, {d:02} {} {y} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[days.rem_euclid(7) as usize],
        MONTHS[(m - 1) as usize],
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

impl TokenSource {
    /// A valid bearer token: the cached one, or a new one. Error: (detail, transient).
    pub(super) fn token(&self, agent: &ureq::Agent) -> std::result::Result<String, (String, bool)> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cache.as_ref() {
            if Instant::now() < c.refresh_at {
                return Ok(c.token.clone());
            }
        }
        let (token, lifetime) = self.fetch(agent)?;
        let margin = Duration::from_secs(300).min(lifetime / 2);
        *cache = Some(CachedToken {
            token: token.clone(),
            refresh_at: Instant::now() + lifetime - margin,
        });
        Ok(token)
    }

    /// Drops the cached token.
    pub(super) fn invalidate(&self) {
        *self.cache.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// One token request. Returns the token and its lifetime.
    pub(super) fn fetch(
        &self,
        agent: &ureq::Agent,
    ) -> std::result::Result<(String, Duration), (String, bool)> {
        let form = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| format!("{k}={}", utf8_percent_encode(v, QUERY_SET)))
                .collect::<Vec<_>>()
                .join("&")
        };
        let (what, result) = match &self.kind {
            TokenKind::ClientSecret {
                client_id,
                client_secret,
            } => {
                let body = form(&[
                    ("grant_type", "client_credentials"),
                    ("client_id", client_id),
                    ("client_secret", client_secret),
                    ("scope", STORAGE_SCOPE),
                ]);
                ("token request", self.post(agent, body))
            }
            TokenKind::Federated {
                client_id,
                token_file,
            } => {
                let assertion = std::fs::read_to_string(token_file).map_err(|e| {
                    (
                        format!(
                            "cannot read federated token file {}: {}",
                            token_file.display(),
                            io_reason(&e)
                        ),
                        false,
                    )
                })?;
                let body = form(&[
                    ("grant_type", "client_credentials"),
                    ("client_id", client_id),
                    (
                        "client_assertion_type",
                        "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
                    ),
                    ("client_assertion", assertion.trim()),
                    ("scope", STORAGE_SCOPE),
                ]);
                ("token request", self.post(agent, body))
            }
            TokenKind::Imds => {
                let request = ureq::http::Request::builder()
                    .method("GET")
                    .uri(self.url.as_str())
                    .header("Metadata", "true")
                    .body(());
                let result = match request {
                    Ok(r) => {
                        let r = agent
                            .configure_request(r)
                            .timeout_connect(Some(IMDS_TIMEOUT))
                            .timeout_recv_response(Some(IMDS_TIMEOUT))
                            .build();
                        agent.run(r)
                    }
                    Err(e) => Err(ureq::Error::Http(e)),
                };
                ("managed identity token request", result)
            }
        };
        let mut resp = result.map_err(|e| {
            let (d, t) = describe_transport(&e);
            (format!("{what} failed: {d}"), t)
        })?;
        let status = resp.status().as_u16();
        let body = read_small(&mut resp).map_err(|e| {
            let (d, t) = describe_transport(&e);
            (format!("{what} failed: {d}"), t)
        })?;
        let json: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
        if !(200..300).contains(&status) {
            let code = json
                .as_ref()
                .and_then(|j| j.get("error"))
                .and_then(|e| e.as_str().or_else(|| e.get("code")?.as_str()))
                .and_then(clean_code)
                .unwrap_or_default();
            return Err((
                format!("{what} failed: {status} {code}")
                    .trim_end()
                    .to_string(),
                retry::is_transient_status(status),
            ));
        }
        let json = json.ok_or_else(|| (format!("{what} failed: answer is not JSON"), false))?;
        let token = json
            .get("access_token")
            .and_then(|t| t.as_str())
            .filter(|t| !t.is_empty())
            .ok_or_else(|| (format!("{what} failed: no access_token in answer"), false))?;
        // expires_in is a number (Entra ID) or a string (IMDS).
        let secs = json
            .get("expires_in")
            .and_then(|v| v.as_u64().or_else(|| v.as_str()?.trim().parse().ok()))
            .unwrap_or(3600);
        Ok((token.to_string(), Duration::from_secs(secs.max(1))))
    }

    pub(super) fn post(
        &self,
        agent: &ureq::Agent,
        body: String,
    ) -> std::result::Result<Response, ureq::Error> {
        let request = ureq::http::Request::builder()
            .method("POST")
            .uri(self.url.as_str())
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json")
            .body(body)
            .map_err(ureq::Error::Http)?;
        agent.run(request)
    }
}
