//! Storage URLs of `list`, `describe` and `validate --path` (SPEC.md "Storage URLs for list,
//! describe and validate"):
//!
//! | scheme | format |
//! |---|---|
//! | `s3`, `s3a` | `s3://<bucket>[/<prefix>]?region=<region>&endpoint=<url>&path_style=true` (`allow_http=true` too) |
//! | `azure`, `az` | `azure://<account>.<blob host>/<container>[/<prefix>]`; emulator hosts (`127.0.0.1:10000`, `localhost`) take the account as first path segment |
//! | `gcs`, `gs` | `gcs://<bucket>[/<prefix>]` |
//! | `file` | `file:///<absolute path>` (percent-encoded, e.g. `%20` for a space) |
//! | `memory` | `memory://` (the store `default`) or `memory://<name>` |
//!
//! Errors: `Configuration error: Invalid storage URL: <detail>` and
//! `Configuration error: Unknown storage scheme: <scheme>`. Credentials in a URL are refused so
//! that they never reach a log or a message.

use super::{normalize_prefix, open_filesystem, open_memory, Storage};
use crate::error::{mask_url, Error, Result};
use percent_encoding::percent_decode_str;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// A parsed storage URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageUrl {
    /// `file:///<absolute path>`: filesystem storage at this base directory.
    File(PathBuf),
    /// `memory://[<name>]`: the process-wide memory store of this name (`default` when empty).
    Memory(String),
    /// `s3://` or `s3a://`.
    S3 {
        /// Bucket name.
        bucket: String,
        /// Key prefix from the URL path, normalised (no surrounding `/`), `None` when empty.
        prefix: Option<String>,
        /// `region` parameter.
        region: Option<String>,
        /// `endpoint` parameter: custom endpoint URL for S3-compatible services.
        endpoint: Option<String>,
        /// `path_style` parameter (default false).
        path_style: bool,
        /// `allow_http` parameter (default false): allow an `http://` endpoint.
        allow_http: bool,
    },
    /// `azure://` or `az://`.
    Azure {
        /// Storage account name.
        account: String,
        /// Blob container name.
        container: String,
        /// Key prefix (blob name prefix), `None` when empty.
        prefix: Option<String>,
        /// Blob service endpoint when not the public cloud's
        /// `https://<account>.blob.core.windows.net`: `https://<host>` for other clouds, or
        /// `http://<host>/<account>` for an emulator addressed by IP or `localhost`.
        endpoint: Option<String>,
    },
    /// `gcs://` or `gs://`.
    Gcs {
        /// Bucket name.
        bucket: String,
        /// Key prefix, `None` when empty.
        prefix: Option<String>,
    },
}

/// Public Azure blob host suffix.
const AZURE_PUBLIC_SUFFIX: &str = ".blob.core.windows.net";

fn invalid(detail: impl fmt::Display) -> Error {
    Error::Config(format!("Invalid storage URL: {detail}"))
}

/// Percent-decodes `s` into UTF-8 text.
fn decode(s: &str, url: &str) -> Result<String> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| {
            invalid(format!(
                "{}: not valid UTF-8 after percent-decoding",
                mask_url(url)
            ))
        })
}

/// Bucket names of S3 and GCS: 1 to 222 characters of `a-z A-Z 0-9 . - _`.
fn check_bucket(bucket: &str, url: &str) -> Result<()> {
    if bucket.is_empty() {
        return Err(invalid(format!("{}: missing bucket name", mask_url(url))));
    }
    if bucket.len() > 222
        || !bucket
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
    {
        return Err(invalid(format!(
            "{}: invalid bucket name {bucket:?}",
            mask_url(url)
        )));
    }
    Ok(())
}

/// The key prefix of an object-store URL from its path (`/a/b/` gives `a/b`).
fn prefix_from_path(path: &str, url: &str) -> Result<Option<String>> {
    let decoded = decode(path, url)?;
    normalize_prefix(Some(&decoded))
        .map_err(|_| invalid(format!("{}: invalid key prefix {decoded:?}", mask_url(url))))
}

fn parse_bool(name: &str, value: &str, url: &str) -> Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(invalid(format!(
            "{}: parameter {name} must be true or false, got {value:?}",
            mask_url(url)
        ))),
    }
}

/// Parses a storage URL of SPEC.md's table.
///
/// Errors: `Configuration error: Unknown storage scheme: <scheme>` for a scheme outside
/// s3, s3a, azure, az, gcs, gs, file, memory; `Configuration error: Invalid storage URL: <detail>`
/// for anything else that is wrong (no `://`, credentials in the URL, missing bucket or container,
/// relative file path, unknown query parameter, ...).
pub fn parse_storage_url(url: &str) -> Result<StorageUrl> {
    let trimmed = url.trim();
    let Some((scheme, rest)) = trimmed.split_once("://") else {
        return Err(invalid(format!(
            "{}: expected <scheme>://... (s3, s3a, azure, az, gcs, gs, file, memory)",
            mask_url(trimmed)
        )));
    };
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
    {
        return Err(invalid(format!("{}: malformed scheme", mask_url(trimmed))));
    }
    let scheme = scheme.to_ascii_lowercase();
    if rest.contains('#') {
        return Err(invalid(format!(
            "{}: fragments are not supported",
            mask_url(trimmed)
        )));
    }
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(i) => (&before_query[..i], &before_query[i..]),
        None => (before_query, ""),
    };
    if authority.contains('@') {
        return Err(invalid(format!(
            "{}: credentials are not allowed in a storage URL; use the configuration or the environment",
            mask_url(trimmed)
        )));
    }
    let no_query = |scheme: &str| -> Result<()> {
        match query {
            Some(q) if !q.is_empty() => Err(invalid(format!(
                "{}: query parameters are not supported for {scheme}",
                mask_url(trimmed)
            ))),
            _ => Ok(()),
        }
    };
    match scheme.as_str() {
        "s3" | "s3a" => {
            check_bucket(authority, trimmed)?;
            let prefix = prefix_from_path(path, trimmed)?;
            let (mut region, mut endpoint, mut path_style, mut allow_http) =
                (None, None, None, None);
            for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                let k = decode(k, trimmed)?;
                let v = decode(v, trimmed)?;
                let duplicate = match k.as_str() {
                    "region" => region.replace(v).is_some(),
                    "endpoint" => endpoint.replace(v).is_some(),
                    "path_style" => path_style
                        .replace(parse_bool(&k, &v, trimmed)?)
                        .is_some(),
                    "allow_http" => allow_http
                        .replace(parse_bool(&k, &v, trimmed)?)
                        .is_some(),
                    _ => {
                        return Err(invalid(format!(
                            "{}: unknown parameter {k:?} (known: region, endpoint, path_style, allow_http)",
                            mask_url(trimmed)
                        )))
                    }
                };
                if duplicate {
                    return Err(invalid(format!(
                        "{}: parameter {k} given twice",
                        mask_url(trimmed)
                    )));
                }
            }
            let region = region.filter(|r| !r.is_empty());
            let endpoint = endpoint.filter(|e| !e.is_empty());
            if let Some(e) = &endpoint {
                let lower = e.to_ascii_lowercase();
                if !(lower.starts_with("http://") || lower.starts_with("https://")) {
                    return Err(invalid(format!(
                        "{}: endpoint must start with http:// or https://",
                        mask_url(trimmed)
                    )));
                }
            }
            Ok(StorageUrl::S3 {
                bucket: authority.to_string(),
                prefix,
                region,
                endpoint,
                path_style: path_style.unwrap_or(false),
                allow_http: allow_http.unwrap_or(false),
            })
        }
        "azure" | "az" => {
            no_query(&scheme)?;
            if authority.is_empty() {
                return Err(invalid(format!(
                    "{}: expected azure://<account>.<blob host>/<container>",
                    mask_url(trimmed)
                )));
            }
            let host_only = authority
                .rsplit_once(':')
                .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
                .map(|(h, _)| h)
                .unwrap_or(authority);
            let host_only = host_only.trim_start_matches('[').trim_end_matches(']');
            let emulator =
                host_only.eq_ignore_ascii_case("localhost") || host_only.parse::<IpAddr>().is_ok();
            // account (emulator only) / container / prefix
            let parts = if emulator { 3 } else { 2 };
            let mut segments = path.trim_start_matches('/').splitn(parts, '/');
            let (account, endpoint) = if emulator {
                let account = decode(segments.next().unwrap_or(""), trimmed)?;
                let endpoint = format!("http://{authority}/{account}");
                (account, Some(endpoint))
            } else {
                let account = match authority.split_once('.') {
                    Some((a, _)) => a.to_string(),
                    None => authority.to_string(),
                };
                let public = authority
                    .eq_ignore_ascii_case(&format!("{account}{AZURE_PUBLIC_SUFFIX}"))
                    || !authority.contains('.');
                let endpoint = (!public).then(|| format!("https://{authority}"));
                (account, endpoint)
            };
            if account.is_empty()
                || !account
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            {
                return Err(invalid(format!(
                    "{}: invalid account name {account:?}",
                    mask_url(trimmed)
                )));
            }
            let container = decode(segments.next().unwrap_or(""), trimmed)?;
            if container.is_empty()
                || !container
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'$')
            {
                return Err(invalid(format!(
                    "{}: missing or invalid container name",
                    mask_url(trimmed)
                )));
            }
            let prefix = prefix_from_path(segments.next().unwrap_or(""), trimmed)?;
            Ok(StorageUrl::Azure {
                account,
                container,
                prefix,
                endpoint,
            })
        }
        "gcs" | "gs" => {
            no_query(&scheme)?;
            check_bucket(authority, trimmed)?;
            Ok(StorageUrl::Gcs {
                bucket: authority.to_string(),
                prefix: prefix_from_path(path, trimmed)?,
            })
        }
        "file" => {
            no_query(&scheme)?;
            if !(authority.is_empty() || authority.eq_ignore_ascii_case("localhost"))
                || !path.starts_with('/')
            {
                return Err(invalid(format!(
                    "{}: expected file:///<absolute path>",
                    mask_url(trimmed)
                )));
            }
            let bytes: Vec<u8> = percent_decode_str(path).collect();
            if bytes.contains(&0) {
                return Err(invalid(format!("{}: NUL in path", mask_url(trimmed))));
            }
            Ok(StorageUrl::File(path_from_bytes(bytes, trimmed)?))
        }
        "memory" => {
            no_query(&scheme)?;
            if !(path.is_empty() || path == "/") {
                return Err(invalid(format!(
                    "{}: expected memory:// or memory://<name>",
                    mask_url(trimmed)
                )));
            }
            let name = decode(authority, trimmed)?;
            Ok(StorageUrl::Memory(if name.is_empty() {
                super::memory::DEFAULT_NAME.to_string()
            } else {
                name
            }))
        }
        _ => Err(Error::Config(format!("Unknown storage scheme: {scheme}"))),
    }
}

#[cfg(unix)]
fn path_from_bytes(bytes: Vec<u8>, _url: &str) -> Result<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    Ok(PathBuf::from(std::ffi::OsString::from_vec(bytes)))
}

#[cfg(not(unix))]
fn path_from_bytes(bytes: Vec<u8>, url: &str) -> Result<PathBuf> {
    String::from_utf8(bytes)
        .map(PathBuf::from)
        .map_err(|_| invalid(format!("{}: path is not valid UTF-8", mask_url(url))))
}

impl fmt::Display for StorageUrl {
    /// The canonical URL (no secrets are ever held).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let with_prefix = |p: &Option<String>| match p {
            Some(p) => format!("/{p}"),
            None => String::new(),
        };
        match self {
            StorageUrl::File(p) => write!(f, "file://{}", p.display()),
            StorageUrl::Memory(n) => write!(f, "memory://{n}"),
            StorageUrl::S3 {
                bucket,
                prefix,
                region,
                endpoint,
                path_style,
                allow_http,
            } => {
                write!(f, "s3://{bucket}{}", with_prefix(prefix))?;
                let mut params = Vec::new();
                if let Some(r) = region {
                    params.push(format!("region={r}"));
                }
                if let Some(e) = endpoint {
                    params.push(format!("endpoint={e}"));
                }
                if *path_style {
                    params.push("path_style=true".to_string());
                }
                if *allow_http {
                    params.push("allow_http=true".to_string());
                }
                if !params.is_empty() {
                    write!(f, "?{}", params.join("&"))?;
                }
                Ok(())
            }
            StorageUrl::Azure {
                account,
                container,
                prefix,
                endpoint,
            } => match endpoint {
                Some(e) => write!(f, "{e}/{container}{}", with_prefix(prefix)),
                None => write!(
                    f,
                    "azure://{account}{AZURE_PUBLIC_SUFFIX}/{container}{}",
                    with_prefix(prefix)
                ),
            },
            StorageUrl::Gcs { bucket, prefix } => {
                write!(f, "gcs://{bucket}{}", with_prefix(prefix))
            }
        }
    }
}

/// Opens the storage a URL names, with its key prefix, wrapped in [`super::Traced`]. Object
/// stores take their credentials from the environment (never from the URL) and probe their
/// endpoint here.
pub fn open_url(url: &StorageUrl) -> Result<Arc<dyn Storage>> {
    Ok(super::Traced::wrap(open_untraced(url)?))
}

fn open_untraced(url: &StorageUrl) -> Result<Arc<dyn Storage>> {
    match url {
        StorageUrl::File(path) => open_filesystem(path, None),
        StorageUrl::Memory(name) => open_memory(name, None),
        StorageUrl::S3 {
            bucket,
            prefix,
            region,
            endpoint,
            path_style,
            allow_http,
        } => {
            // Credentials come from the environment chain (never from the URL).
            let opts = super::s3::S3Options {
                bucket: bucket.clone(),
                region: region.clone(),
                endpoint: endpoint.clone(),
                path_style: *path_style,
                allow_http: *allow_http,
                ..Default::default()
            };
            let storage: Arc<dyn Storage> = Arc::new(super::s3::S3Storage::open(opts)?);
            super::with_prefix(storage, prefix.as_deref())
        }
        StorageUrl::Azure {
            account,
            container,
            prefix,
            endpoint,
        } => {
            // Credentials come from the AZURE_* environment variables or the default chain.
            let cfg = crate::config::AzureStorage {
                account_name: account.clone(),
                container_name: container.clone(),
                account_key: None,
                prefix: None,
                endpoint: endpoint.clone(),
                use_workload_identity: None,
                client_id: None,
                tenant_id: None,
                client_secret: None,
                sas_token: None,
                account_key_file: None,
                client_secret_file: None,
                sas_token_file: None,
                object_lock: None,
            };
            super::with_prefix(super::azure::open(&cfg)?, prefix.as_deref())
        }
        StorageUrl::Gcs { bucket, prefix } => {
            // Credentials come from GOOGLE_APPLICATION_CREDENTIALS or the default chain.
            let cfg = crate::config::GcsStorage {
                bucket: bucket.clone(),
                service_account_path: None,
                prefix: None,
                object_lock: None,
            };
            super::with_prefix(super::gcs::open(&cfg)?, prefix.as_deref())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(url: &str) -> StorageUrl {
        parse_storage_url(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn err(url: &str) -> String {
        parse_storage_url(url).expect_err(url).to_string()
    }

    #[test]
    fn s3_urls() {
        assert_eq!(
            ok("s3://my-bucket"),
            StorageUrl::S3 {
                bucket: "my-bucket".into(),
                prefix: None,
                region: None,
                endpoint: None,
                path_style: false,
                allow_http: false,
            }
        );
        let u = ok("s3a://b/team/prod/?region=eu-west-1&endpoint=http%3A%2F%2F127.0.0.1%3A8333&path_style=true&allow_http=true");
        assert_eq!(
            u,
            StorageUrl::S3 {
                bucket: "b".into(),
                prefix: Some("team/prod".into()),
                region: Some("eu-west-1".into()),
                endpoint: Some("http://127.0.0.1:8333".into()),
                path_style: true,
                allow_http: true,
            }
        );
        assert_eq!(
            u.to_string(),
            "s3://b/team/prod?region=eu-west-1&endpoint=http://127.0.0.1:8333&path_style=true&allow_http=true"
        );
        // An unencoded endpoint works too.
        assert!(matches!(
            ok("S3://b?endpoint=http://127.0.0.1:8333&path_style=false"),
            StorageUrl::S3 { endpoint: Some(e), path_style: false, .. } if e == "http://127.0.0.1:8333"
        ));
        assert!(err("s3://").starts_with("Configuration error: Invalid storage URL: "));
        assert!(err("s3://b?regoin=x").contains("unknown parameter \"regoin\""));
        assert!(err("s3://b?path_style=maybe").contains("path_style"));
        assert!(err("s3://b?region=a&region=b").contains("given twice"));
        assert!(err("s3://b?endpoint=ftp://x").contains("endpoint must start"));
        assert!(err("s3://my bucket").contains("invalid bucket name"));
        let e = err("s3://AKIA:supersecret@bucket");
        assert!(
            e.starts_with("Configuration error: Invalid storage URL: "),
            "{e}"
        );
        assert!(!e.contains("supersecret"), "{e}");
        assert!(err("s3://b/../x").contains("invalid key prefix"));
    }

    #[test]
    fn azure_urls() {
        let u = ok("azure://acct.blob.core.windows.net/backups");
        assert_eq!(
            u,
            StorageUrl::Azure {
                account: "acct".into(),
                container: "backups".into(),
                prefix: None,
                endpoint: None,
            }
        );
        assert_eq!(u.to_string(), "azure://acct.blob.core.windows.net/backups");
        assert_eq!(
            ok("az://acct.blob.core.chinacloudapi.cn/c/pre/fix"),
            StorageUrl::Azure {
                account: "acct".into(),
                container: "c".into(),
                prefix: Some("pre/fix".into()),
                endpoint: Some("https://acct.blob.core.chinacloudapi.cn".into()),
            }
        );
        assert_eq!(
            ok("azure://127.0.0.1:10000/devstoreaccount1/c"),
            StorageUrl::Azure {
                account: "devstoreaccount1".into(),
                container: "c".into(),
                prefix: None,
                endpoint: Some("http://127.0.0.1:10000/devstoreaccount1".into()),
            }
        );
        assert_eq!(
            ok("az://localhost:10000/devstoreaccount1/c/team/prod/"),
            StorageUrl::Azure {
                account: "devstoreaccount1".into(),
                container: "c".into(),
                prefix: Some("team/prod".into()),
                endpoint: Some("http://localhost:10000/devstoreaccount1".into()),
            }
        );
        assert!(err("azure://acct.blob.core.windows.net").contains("container"));
        assert!(err("azure://acct.blob.core.windows.net/").contains("container"));
        assert!(err("azure://").starts_with("Configuration error: Invalid storage URL: "));
        assert!(err("azure://a.blob.core.windows.net/c?sig=secret").contains("sig=****"));
    }

    #[test]
    fn gcs_file_memory_urls() {
        assert_eq!(
            ok("gs://bkt/p"),
            StorageUrl::Gcs {
                bucket: "bkt".into(),
                prefix: Some("p".into())
            }
        );
        assert_eq!(
            ok("gcs://bkt"),
            StorageUrl::Gcs {
                bucket: "bkt".into(),
                prefix: None
            }
        );
        assert_eq!(
            ok("file:///var/backups"),
            StorageUrl::File(PathBuf::from("/var/backups"))
        );
        assert_eq!(
            ok("file:///tmp/with%20space/%C3%BC"),
            StorageUrl::File(PathBuf::from("/tmp/with space/ü"))
        );
        assert_eq!(
            ok("file://localhost/x"),
            StorageUrl::File(PathBuf::from("/x"))
        );
        assert!(err("file://relative/path").contains("expected file:///<absolute path>"));
        assert!(err("file://").contains("expected file:///<absolute path>"));
        assert!(err("file:///x?y=1").contains("query parameters"));
        assert_eq!(ok("memory://"), StorageUrl::Memory("default".into()));
        assert_eq!(ok("memory:///"), StorageUrl::Memory("default".into()));
        assert_eq!(ok("memory://t1"), StorageUrl::Memory("t1".into()));
        assert!(err("memory://a/b").starts_with("Configuration error: Invalid storage URL: "));
    }

    #[test]
    fn bad_urls_and_schemes() {
        assert_eq!(
            parse_storage_url("ftp://host/x"),
            Err(Error::Config("Unknown storage scheme: ftp".into()))
        );
        assert_eq!(
            parse_storage_url("HDFS://x"),
            Err(Error::Config("Unknown storage scheme: hdfs".into()))
        );
        for bad in ["/var/backups", "", "s3:bucket", "://x", "a b://x"] {
            let e = err(bad);
            assert!(
                e.starts_with("Configuration error: Invalid storage URL: "),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn open_file_and_memory() {
        let dir = crate::repository::storage::conformance::TempDir::new("url-open");
        let url = format!("file://{}/sub%20dir", dir.0.display());
        let s = open_url(&ok(&url)).expect("open file");
        s.put_bytes("b1/manifest.json", b"{}").expect("put");
        assert!(dir.0.join("sub dir/b1/manifest.json").is_file());
        assert_eq!(s.location(), format!("file://{}/sub dir", dir.0.display()));

        let m = open_url(&ok("memory://")).expect("open memory");
        assert_eq!(m.location(), "memory://default");
        let key = format!("url-test-{}/manifest.json", std::process::id());
        m.put_bytes(&key, b"x").expect("put");
        let again = open_url(&StorageUrl::Memory("default".into())).expect("again");
        assert_eq!(again.get_bytes(&key).expect("shared"), b"x");
        again.delete(&key).expect("delete");
    }
}
