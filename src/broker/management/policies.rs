//! The policies and operator policies of a broker (`GET /api/policies`,
//! `GET /api/operator-policies`), as the backup's listing without statistics needs them: the
//! definition of the user policy a queue names, and whether an operator policy could set a
//! key the listing does not show. Readable with the monitoring tag (checked on 3.10.8 and
//! 4.3.6).

use super::{encode_segment, ManagementClient, Method, REQUEST_TIMEOUT};
use crate::error::{Error, Result};
use serde::Deserialize;
use serde_json::{Map, Value};

/// One policy or operator policy (fields of the management API).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct PolicyInfo {
    /// Virtual host name.
    #[serde(default)]
    pub vhost: String,
    /// Policy name.
    #[serde(default)]
    pub name: String,
    /// The regular expression queue names are matched against.
    #[serde(default)]
    pub pattern: String,
    /// The keys it sets (`max-length`, `overflow`, `delivery-limit`, ...).
    #[serde(default)]
    pub definition: Map<String, Value>,
}

/// Which kind of policy to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// `GET /api/policies`: the users' policies.
    User,
    /// `GET /api/operator-policies`: the operators' (RabbitMQ "Operator Policies").
    Operator,
}

impl ManagementClient {
    /// The policies of `kind` in `vhosts` (exact names; empty: every vhost), one request per
    /// vhost (a vhost that does not exist has none: its 404 is not an error), or one for every
    /// vhost.
    ///
    /// Errors: the management API's (see the module documentation of the parent);
    /// `Management API error: invalid JSON ...` for an answer that is not a list of policies.
    pub fn list_policies(&self, kind: PolicyKind, vhosts: &[String]) -> Result<Vec<PolicyInfo>> {
        let base = match kind {
            PolicyKind::User => "/api/policies",
            PolicyKind::Operator => "/api/operator-policies",
        };
        let paths: Vec<String> = if vhosts.is_empty() {
            vec![base.to_string()]
        } else {
            vhosts
                .iter()
                .map(|v| format!("{base}/{}", encode_segment(v)))
                .collect()
        };
        let mut out = Vec::new();
        for path in paths {
            let (status, body) =
                self.request(Method::Get, &path, None, None, REQUEST_TIMEOUT, Some(404))?;
            if status == 404 {
                continue;
            }
            let listed: Vec<PolicyInfo> = serde_json::from_slice(&body).map_err(|e| {
                Error::Management(format!("invalid JSON in response to GET {path}: {e}"))
            })?;
            out.extend(listed);
        }
        Ok(out)
    }
}
