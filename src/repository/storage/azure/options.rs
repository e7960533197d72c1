//! The options of the Azure backend: the configured credential (shared key, SAS, service
//! principal, workload or managed identity) and how `storage` fields and the standard
//! environment variables fill them.

use super::*;
use crate::config::{AzureStorage as AzureConfig, Secret};
use crate::error::{Error, Result};
use crate::repository::storage::retry::Policy;
use std::path::PathBuf;

/// How requests are authorized (SPEC.md "storage": Azure authentication priority).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// Shared Key: the account key, base64 as the portal shows it.
    SharedKey(Secret),
    /// A SAS token: a query string without a leading `?`.
    Sas(Secret),
    /// Service principal with a client secret (OAuth 2.0 client credentials).
    ServicePrincipal {
        /// Directory (tenant) id or domain.
        tenant_id: String,
        /// Application (client) id.
        client_id: String,
        /// Client secret.
        client_secret: Secret,
    },
    /// Workload identity: a federated token file exchanged for an access token.
    WorkloadIdentity {
        /// Directory (tenant) id.
        tenant_id: String,
        /// Application (client) id.
        client_id: String,
        /// File holding the federated JWT (`AZURE_FEDERATED_TOKEN_FILE`), re-read per refresh.
        token_file: PathBuf,
    },
    /// Managed identity through IMDS; `client_id` selects a user-assigned identity.
    ManagedIdentity {
        /// Client id of a user-assigned identity, `None` for the system-assigned one.
        client_id: Option<String>,
    },
}

/// Everything [`AzureBlobStorage::new`] needs, resolved from the configuration and environment by
/// [`AzureOptions::from_config`], or built directly (tests, other clouds).
#[derive(Debug, Clone)]
pub struct AzureOptions {
    /// Storage account name.
    pub account: String,
    /// Blob container name.
    pub container: String,
    /// Blob service endpoint (`https://host[:port][/path]`); `None` for the public cloud.
    pub endpoint: Option<String>,
    /// How requests are authorized.
    pub credential: Credential,
    /// Entra ID authority for token requests, e.g. `https://login.microsoftonline.com`.
    pub authority_host: String,
    /// IMDS token endpoint for managed identity.
    pub imds_endpoint: String,
    /// Largest object written with a single Put Blob, in bytes.
    pub put_threshold: usize,
    /// Block size of block uploads, in bytes (raised when a file would need > 50,000 blocks).
    pub block_size: usize,
    /// Retry policy of every request.
    pub retry: Policy,
    /// `storage.object_lock`: the immutability policy of every put of a locked key.
    pub object_lock: Option<crate::repository::storage::object_lock::ObjectLock>,
}

/// Reads a variable from `env`, treating an empty value as unset.
pub(super) fn env_var(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    env(name).filter(|v| !v.trim().is_empty())
}

impl AzureOptions {
    /// Resolves the `storage` section (SPEC.md "storage", backend `azure`) and the environment,
    /// read through `env` (pass `|k| std::env::var(k).ok()`), into options with the default
    /// threshold, block size and retry policy. Variables read: `AZURE_STORAGE_ACCOUNT_KEY`,
    /// `AZURE_STORAGE_KEY`, `AZURE_STORAGE_SAS_TOKEN`, `AZURE_CLIENT_ID`, `AZURE_TENANT_ID`,
    /// `AZURE_CLIENT_SECRET`, `AZURE_FEDERATED_TOKEN_FILE`, `AZURE_AUTHORITY_HOST`.
    ///
    /// Errors (`Configuration error: ...`): an empty or malformed account or container name, an
    /// endpoint that is not `http(s)://host[/path]`, an account key that is not base64, a
    /// `client_secret` without client and tenant ids, `use_workload_identity: true` without a
    /// federated token file, client id and tenant id.
    pub fn from_config(
        cfg: &AzureConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<AzureOptions> {
        let client_id = cfg
            .client_id
            .clone()
            .filter(|v| !v.trim().is_empty())
            .or_else(|| env_var(env, "AZURE_CLIENT_ID"));
        let tenant_id = cfg
            .tenant_id
            .clone()
            .filter(|v| !v.trim().is_empty())
            .or_else(|| env_var(env, "AZURE_TENANT_ID"));
        let secret = |field: &Option<Secret>, vars: &[&str]| -> Option<Secret> {
            field
                .clone()
                .filter(|s| !s.expose().trim().is_empty())
                .or_else(|| vars.iter().find_map(|v| env_var(env, v)).map(Secret::new))
        };
        let account_key = secret(
            &cfg.account_key,
            &["AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_KEY"],
        );
        let sas = secret(&cfg.sas_token, &["AZURE_STORAGE_SAS_TOKEN"]);
        let client_secret = secret(&cfg.client_secret, &["AZURE_CLIENT_SECRET"]);
        let token_file = env_var(env, "AZURE_FEDERATED_TOKEN_FILE");

        let credential =
            if let Some(key) = account_key {
                Credential::SharedKey(key)
            } else if let Some(sas) = sas {
                let text = sas.expose().trim();
                Credential::Sas(Secret::new(text.strip_prefix('?').unwrap_or(text)))
            } else if let (Some(t), Some(c), Some(s)) = (&tenant_id, &client_id, &client_secret) {
                Credential::ServicePrincipal {
                    tenant_id: t.clone(),
                    client_id: c.clone(),
                    client_secret: s.clone(),
                }
            } else if cfg.client_secret.is_some() {
                return Err(Error::Config(
                    "Azure service principal needs client_id, tenant_id and client_secret".into(),
                ));
            } else if cfg.use_workload_identity == Some(true)
                || (cfg.use_workload_identity.is_none() && token_file.is_some())
            {
                match (&tenant_id, &client_id, &token_file) {
                    (Some(t), Some(c), Some(f)) => Credential::WorkloadIdentity {
                        tenant_id: t.clone(),
                        client_id: c.clone(),
                        token_file: PathBuf::from(f),
                    },
                    _ => return Err(Error::Config(
                        "Azure workload identity needs AZURE_FEDERATED_TOKEN_FILE, client_id and \
                         tenant_id"
                            .into(),
                    )),
                }
            } else {
                Credential::ManagedIdentity { client_id }
            };
        Ok(AzureOptions {
            account: cfg.account_name.clone(),
            container: cfg.container_name.clone(),
            endpoint: cfg.endpoint.clone().filter(|e| !e.trim().is_empty()),
            credential,
            authority_host: env_var(env, "AZURE_AUTHORITY_HOST")
                .unwrap_or_else(|| DEFAULT_AUTHORITY_HOST.to_string()),
            imds_endpoint: DEFAULT_IMDS_ENDPOINT.to_string(),
            put_threshold: DEFAULT_PUT_THRESHOLD,
            block_size: DEFAULT_BLOCK_SIZE,
            retry: Policy::for_backend("azure"),
            object_lock: cfg.object_lock.as_ref().map(|l| {
                crate::repository::storage::object_lock::ObjectLock::new(l, cfg.prefix.as_deref())
            }),
        })
    }
}
