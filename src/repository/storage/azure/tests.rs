use super::*;
use crate::config::Secret;
use crate::repository::storage::conformance::{self, TempDir};
use base64::Engine as _;
use percent_encoding::{percent_decode_str, utf8_percent_encode};
use std::collections::HashMap;
use std::io::Read;
use std::io::Write;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::UNIX_EPOCH;

const ACCOUNT: &str = "devstoreaccount1";
const KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
const ENDPOINT: &str = "http://127.0.0.1:10000/devstoreaccount1";

fn fast_retry() -> Policy {
    Policy {
        attempts: 3,
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(50),
        backend: "azure",
    }
}

fn options(container: &str, credential: Credential) -> AzureOptions {
    AzureOptions {
        account: ACCOUNT.into(),
        container: container.into(),
        endpoint: Some(ENDPOINT.into()),
        credential,
        authority_host: DEFAULT_AUTHORITY_HOST.into(),
        imds_endpoint: DEFAULT_IMDS_ENDPOINT.into(),
        put_threshold: DEFAULT_PUT_THRESHOLD,
        block_size: DEFAULT_BLOCK_SIZE,
        retry: fast_retry(),
        object_lock: None,
    }
}

fn key_cred() -> Credential {
    Credential::SharedKey(Secret::new(KEY))
}

fn unique_container(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "rmqb-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh container in Azurite, deleted on drop.
struct Container {
    name: String,
    admin: AzureBlobStorage,
}

impl Container {
    fn new(tag: &str) -> Container {
        let name = unique_container(tag);
        let admin = AzureBlobStorage::new(options(&name, key_cred())).expect("open admin");
        admin.create_container().expect("create container");
        Container { name, admin }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.admin.delete_container();
    }
}

/// Service SAS for a whole container with every permission (Azure "Create a service SAS",
/// version 2020-12-06+).
fn container_sas(container: &str, key_b64: &str) -> String {
    container_sas_with(container, key_b64, "racwdl")
}

/// Service SAS for a whole container with the permissions `sp` (`rl`: read and list only).
fn container_sas_with(container: &str, key_b64: &str, sp: &str) -> String {
    let (se, sv, sr) = ("2099-01-01T00:00:00Z", API_VERSION, "c");
    let to_sign =
        format!("{sp}\n\n{se}\n/blob/{ACCOUNT}/{container}\n\n\n\n{sv}\n{sr}\n\n\n\n\n\n\n");
    let raw = base64::engine::general_purpose::STANDARD
        .decode(key_b64)
        .expect("key");
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &raw);
    let sig = base64::engine::general_purpose::STANDARD
        .encode(ring::hmac::sign(&key, to_sign.as_bytes()).as_ref());
    format!(
        "sv={sv}&sr={sr}&sp={sp}&se={}&sig={}",
        utf8_percent_encode(se, QUERY_SET),
        utf8_percent_encode(&sig, QUERY_SET)
    )
}

#[test]
fn conforms_with_shared_key() {
    let c = Container::new("key");
    let s = AzureBlobStorage::new(options(&c.name, key_cred())).expect("open");
    conformance::run(&s);
    assert_eq!(
        s.location(),
        format!("azure://127.0.0.1:10000/devstoreaccount1/{}", c.name)
    );
    // The 20 MiB file of the suite went up in blocks; check the block path on its own too.
    let data: Vec<u8> = (0..9 * 1024 * 1024 + 17).map(|i| (i % 251) as u8).collect();
    s.put_bytes("big/blocks", &data).expect("put big");
    assert_eq!(s.committed_blocks("big/blocks").expect("blocks"), 2);
    assert!(s.get_bytes("big/blocks").expect("get") == data);
}

/// A read-only identity (a SAS with read and list only): reads work, a write is
/// `Failed to put <key>: 403 Forbidden`, and the signature never shows.
#[test]
fn read_only_sas_cannot_write() {
    let c = Container::new("rosas");
    let admin = AzureBlobStorage::new(options(&c.name, key_cred())).expect("open");
    admin.put_bytes("b/manifest.json", b"{}").expect("seed");
    let sas = container_sas_with(&c.name, KEY, "rl");
    let sig = sas.split("sig=").nth(1).expect("sig").to_string();
    let mut o = options(&c.name, Credential::Sas(Secret::new(sas)));
    o.retry = fast_retry();
    let ro = AzureBlobStorage::new(o).expect("open read-only");
    assert_eq!(ro.get_bytes("b/manifest.json").expect("read"), b"{}");
    assert_eq!(ro.list("b/").expect("list"), ["b/manifest.json"]);
    let err = ro.put_bytes("b/other.json", b"{}").expect_err("denied");
    assert_eq!(
        err,
        Error::Storage("Failed to put b/other.json: 403 Forbidden".into())
    );
    assert!(!format!("{err} {err:?}").contains(&sig));
}

#[test]
fn conforms_with_sas_token() {
    let c = Container::new("sas");
    let sas = container_sas(&c.name, KEY);
    // With a leading '?', as portals copy it.
    let cfg = AzureConfig {
        account_name: ACCOUNT.into(),
        container_name: c.name.clone(),
        account_key: None,
        prefix: None,
        endpoint: Some(ENDPOINT.into()),
        use_workload_identity: None,
        client_id: None,
        tenant_id: None,
        client_secret: None,
        sas_token: Some(Secret::new(format!("?{sas}"))),
        account_key_file: None,
        client_secret_file: None,
        sas_token_file: None,
        object_lock: None,
    };
    let mut o = AzureOptions::from_config(&cfg, &|_| None).expect("options");
    assert_eq!(o.credential, Credential::Sas(Secret::new(sas.clone())));
    o.retry = fast_retry();
    let s = AzureBlobStorage::new(o).expect("open");
    conformance::run(&s);
    // A tampered signature is refused, and the message holds no part of the token.
    let bad = sas.replace("sig=", "sig=AAAA");
    let s =
        AzureBlobStorage::new(options(&c.name, Credential::Sas(Secret::new(bad)))).expect("open");
    let err = s.put_bytes("x", b"x").expect_err("bad sas");
    assert_eq!(err, Error::Storage("Failed to put x: 403 Forbidden".into()));
    assert!(!err.to_string().contains("sig"), "{err}");
}

#[test]
fn block_uploads_with_a_small_threshold() {
    let c = Container::new("blocks");
    let mut o = options(&c.name, key_cred());
    o.put_threshold = 100_000;
    o.block_size = 64 * 1024;
    let s = AzureBlobStorage::new(o).expect("open");
    let tmp = TempDir::new("azure-blocks");
    let data: Vec<u8> = (0..300_001u32).map(|i| (i * 7 % 256) as u8).collect();
    let src = tmp.0.join("src.bin");
    std::fs::write(&src, &data).expect("write");
    s.put_file("seg/one", &src).expect("put_file");
    assert_eq!(s.committed_blocks("seg/one").expect("blocks"), 5);
    assert_eq!(s.head("seg/one").expect("head"), Some(300_001));
    let dst = tmp.0.join("dst.bin");
    assert_eq!(s.get_to_file("seg/one", &dst).expect("get"), 300_001);
    assert!(std::fs::read(&dst).expect("read") == data);
    // Exactly the threshold: one Put Blob (a block blob without committed blocks).
    s.put_bytes("seg/two", &data[..100_000]).expect("put");
    assert_eq!(s.committed_blocks("seg/two").expect("blocks"), 0);
    s.put_bytes("seg/two", &data[..100_001]).expect("put");
    assert_eq!(s.committed_blocks("seg/two").expect("blocks"), 2);
    assert!(s.get_bytes("seg/two").expect("get") == data[..100_001]);
    // Overwriting a block blob with a smaller one replaces it whole.
    s.put_file("seg/one", &tmp.0.join("src.bin"))
        .expect("again");
    std::fs::write(&src, b"tiny").expect("write");
    s.put_file("seg/one", &src).expect("small");
    assert_eq!(s.get_bytes("seg/one").expect("get"), b"tiny");
    assert_eq!(s.list("seg/").expect("list"), ["seg/one", "seg/two"]);
}

/// Conditional writes above the put threshold: blocks committed with `If-None-Match: *` or
/// `If-Match`; the commit's own precondition refuses a blob that appeared meanwhile.
#[test]
fn conditional_block_uploads() {
    let c = Container::new("condblocks");
    let mut o = options(&c.name, key_cred());
    o.put_threshold = 100_000;
    o.block_size = 64 * 1024;
    let s = AzureBlobStorage::new(o).expect("open");
    let tmp = TempDir::new("azure-cond-blocks");
    let data: Vec<u8> = (0..300_001u32).map(|i| (i * 7 % 256) as u8).collect();
    let src = tmp.0.join("src.bin");
    std::fs::write(&src, &data).expect("write");
    let v = s
        .put_file_new("seg/one", &src)
        .expect("put file new")
        .written()
        .expect("created");
    assert_eq!(s.committed_blocks("seg/one").expect("blocks"), 5);
    assert_eq!(
        s.get_with_version("seg/one").expect("get"),
        Some((data.clone(), v))
    );
    assert_eq!(
        s.put_file_new("seg/one", &src).expect("again"),
        Conditional::Refused
    );
    assert!(src.exists());
    // The commit's own precondition: the blob appears while the blocks go up.
    let mut from = &data[..];
    let ids = s
        .upload_blocks("seg/raced", Vec::new(), &mut from, 64 * 1024, &|e| {
            Error::Io(e.to_string())
        })
        .expect("blocks");
    s.put_bytes("seg/raced", b"first").expect("put");
    assert_eq!(
        s.commit_conditional(
            "seg/raced",
            &ids,
            Precondition::Absent,
            conditional::Ours::File(&src)
        )
        .expect("commit"),
        Conditional::Refused
    );
    assert_eq!(s.get_bytes("seg/raced").expect("get"), b"first");
    // Replacing a version with more than the threshold.
    let (_, v1) = s
        .get_with_version("seg/raced")
        .expect("get")
        .expect("there");
    let v2 = s
        .put_bytes_if("seg/raced", &data, &v1)
        .expect("replace")
        .written()
        .expect("replaced");
    assert!(s.get_bytes("seg/raced").expect("get") == data);
    assert_eq!(
        s.put_bytes_if("seg/raced", &data[..5], &v1).expect("stale"),
        Conditional::Refused
    );
    s.delete("seg/raced").expect("delete");
    assert_eq!(
        s.put_bytes_if("seg/raced", b"x", &v2).expect("gone"),
        Conditional::Refused
    );
}

/// A write that reached Azurite but whose answer was lost: the retry meets the blob and
/// compares it with its own data.
#[test]
fn a_retry_that_meets_its_own_write_counts_as_written() {
    let c = Container::new("condretry");
    // Lost: the answers of the first and third Put Blob and of the first Put Block List.
    let (puts, commits) = (AtomicU32::new(0), AtomicU32::new(0));
    let proxy =
        crate::repository::storage::s3::lossy_proxy::start("127.0.0.1:10000", move |line| {
            if line.starts_with("PUT ") && line.contains("comp=blocklist") {
                commits.fetch_add(1, Ordering::SeqCst) == 0
            } else {
                line.starts_with("PUT ")
                    && !line.contains("comp=")
                    && [0, 2].contains(&puts.fetch_add(1, Ordering::SeqCst))
            }
        });
    let mut o = options(&c.name, key_cred());
    o.endpoint = Some(format!("{}/{ACCOUNT}", proxy.url));
    o.put_threshold = 100_000;
    o.block_size = 64 * 1024;
    let s = AzureBlobStorage::new(o).expect("open");
    let v1 = s
        .put_bytes_new("lock", b"mine")
        .expect("create")
        .written()
        .expect("written despite the lost answer");
    let v2 = s
        .put_bytes_if("lock", b"mine, updated", &v1)
        .expect("replace")
        .written()
        .expect("replaced despite the lost answer");
    assert_eq!(proxy.lost.load(Ordering::SeqCst), 2);
    assert_eq!(
        s.get_with_version("lock").expect("get"),
        Some((b"mine, updated".to_vec(), v2))
    );
    assert_eq!(
        s.put_bytes_new("lock", b"theirs").expect("create"),
        Conditional::Refused
    );
    let tmp = TempDir::new("azure-cond-retry");
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 11 % 256) as u8).collect();
    let src = tmp.0.join("src.bin");
    std::fs::write(&src, &data).expect("write");
    let v = s
        .put_file_new("seg/big", &src)
        .expect("put file new")
        .written()
        .expect("written despite the lost answer");
    assert_eq!(proxy.lost.load(Ordering::SeqCst), 3);
    assert_eq!(s.get_with_version("seg/big").expect("get"), Some((data, v)));
}

#[test]
fn listing_follows_markers() {
    let c = Container::new("pages");
    let mut s = AzureBlobStorage::new(options(&c.name, key_cred())).expect("open");
    // 4 blobs per page: 23 keys take 6 pages; names need XML escaping in the answer.
    s.page_size = 4;
    let mut want: Vec<String> = (0..23).map(|i| format!("p/k{i:02} &<>'\"")).collect();
    for k in &want {
        s.put_bytes(k, b"").expect("put");
    }
    s.put_bytes("q", b"").expect("put");
    want.sort();
    assert_eq!(s.list("p/").expect("list"), want);
    assert_eq!(s.list("p/k1").expect("list").len(), 10);
    assert_eq!(s.list("").expect("list").len(), 24);
}

#[test]
fn missing_container_is_reported_on_use() {
    let name = unique_container("absent");
    let mut o = options(&name, key_cred());
    o.put_threshold = 10;
    o.block_size = 10;
    let s = AzureBlobStorage::new(o).expect("a missing container is not a creation error");
    let msg = |e: Error| e.to_string();
    assert_eq!(
        msg(s.put_bytes("b/manifest.json", b"{}").expect_err("put")),
        "Storage error: Failed to put b/manifest.json: ContainerNotFound"
    );
    assert_eq!(
        msg(s.put_bytes("b/big", &[1u8; 25]).expect_err("put blocks")),
        "Storage error: Failed to put b/big: ContainerNotFound"
    );
    assert_eq!(
        msg(s.get_bytes("b/x").expect_err("get")),
        "Storage error: Failed to get b/x: ContainerNotFound"
    );
    assert_eq!(s.head("b/x").expect("head"), None, "as on S3");
    assert_eq!(
        msg(s.list("").expect_err("list")),
        "Storage error: Failed to list /: ContainerNotFound"
    );
    s.delete("b/x").expect("delete of a missing blob succeeds");
}

#[test]
fn wrong_key_is_403_forbidden_without_the_key() {
    let c = Container::new("badkey");
    let wrong = base64::engine::general_purpose::STANDARD.encode([7u8; 64]);
    let s = AzureBlobStorage::new(options(
        &c.name,
        Credential::SharedKey(Secret::new(wrong.clone())),
    ))
    .expect("open");
    let err = s.put_bytes("b/manifest.json", b"{}").expect_err("denied");
    assert_eq!(
        err.to_string(),
        "Storage error: Failed to put b/manifest.json: 403 Forbidden"
    );
    let tmp = TempDir::new("azure-badkey");
    std::fs::write(tmp.0.join("f"), b"data").expect("write");
    for e in [
        err,
        s.put_file("k", &tmp.0.join("f")).expect_err("put_file"),
        s.get_bytes("k").expect_err("get"),
        s.list("").expect_err("list"),
        s.head("k").expect_err("head"),
        s.delete("k").expect_err("delete"),
    ] {
        let text = e.to_string();
        assert!(text.contains("403 Forbidden"), "{text}");
        assert!(!text.contains(&wrong) && !text.contains(KEY), "{text}");
    }
    assert!(!format!("{s:?}").contains(&wrong));
}

#[test]
fn unreachable_endpoint_fails_fast() {
    let started = Instant::now();
    let mut o = options("c1", key_cred());
    o.endpoint = Some("http://127.0.0.1:1/devstoreaccount1".into());
    o.retry = Policy::default();
    let err = AzureBlobStorage::new(o).expect_err("unreachable");
    assert_eq!(
        err.to_string(),
        "Storage error: Failed to create Azure backend: endpoint connection error"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

fn cfg(container: &str) -> AzureConfig {
    AzureConfig {
        account_name: ACCOUNT.into(),
        container_name: container.into(),
        account_key: None,
        prefix: None,
        endpoint: Some(ENDPOINT.into()),
        use_workload_identity: None,
        client_id: None,
        tenant_id: None,
        client_secret: None,
        sas_token: None,
        account_key_file: None,
        client_secret_file: None,
        sas_token_file: None,
        object_lock: None,
    }
}

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

#[test]
fn missing_credentials_fail_at_creation() {
    let mut o = AzureOptions::from_config(&cfg("c1"), &env_of(&[])).expect("options");
    assert_eq!(
        o.credential,
        Credential::ManagedIdentity { client_id: None }
    );
    // Nothing listens there: managed identity is unavailable, as off Azure.
    o.imds_endpoint = "http://127.0.0.1:1/metadata/identity/oauth2/token".into();
    let started = Instant::now();
    let err = AzureBlobStorage::new(o).expect_err("no credentials");
    let text = err.to_string();
    assert!(
        text.starts_with("Storage error: Failed to create Azure backend: no credentials found"),
        "{text}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    // An account key that is not base64 is a configuration error that does not echo it.
    let err = AzureBlobStorage::new(options(
        "c1",
        Credential::SharedKey(Secret::new("not*base64*secret")),
    ))
    .expect_err("bad key");
    assert_eq!(
        err,
        Error::Config("Invalid Azure account key: not base64".into())
    );
}

#[test]
fn credentials_follow_the_priority_order_and_env_fallbacks() {
    let sp_env = [
        ("AZURE_CLIENT_ID", "cid"),
        ("AZURE_TENANT_ID", "tid"),
        ("AZURE_CLIENT_SECRET", "csecret"),
    ];
    // Account key first, from the field or either variable.
    let mut c = cfg("c1");
    c.account_key = Some(Secret::new("k1"));
    c.sas_token = Some(Secret::new("sv=1&sig=x"));
    let o = AzureOptions::from_config(&c, &env_of(&sp_env)).expect("o");
    assert_eq!(o.credential, Credential::SharedKey(Secret::new("k1")));
    assert!(!format!("{o:?}").contains("k1"), "{o:?}");
    for var in ["AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_KEY"] {
        let o = AzureOptions::from_config(&cfg("c1"), &env_of(&[(var, "k2")])).expect("o");
        assert_eq!(o.credential, Credential::SharedKey(Secret::new("k2")));
    }
    // Then the SAS token, with or without '?'.
    let mut c = cfg("c1");
    c.sas_token = Some(Secret::new("sv=1&sig=x"));
    let o = AzureOptions::from_config(&c, &env_of(&sp_env)).expect("o");
    assert_eq!(o.credential, Credential::Sas(Secret::new("sv=1&sig=x")));
    let o = AzureOptions::from_config(
        &cfg("c1"),
        &env_of(&[("AZURE_STORAGE_SAS_TOKEN", "?sv=2&sig=y")]),
    )
    .expect("o");
    assert_eq!(o.credential, Credential::Sas(Secret::new("sv=2&sig=y")));
    // Then the service principal, before workload identity.
    let mut env = sp_env.to_vec();
    env.push(("AZURE_FEDERATED_TOKEN_FILE", "/var/run/token"));
    env.push(("AZURE_AUTHORITY_HOST", "https://login.example.us/"));
    let o = AzureOptions::from_config(&cfg("c1"), &env_of(&env)).expect("o");
    assert_eq!(
        o.credential,
        Credential::ServicePrincipal {
            tenant_id: "tid".into(),
            client_id: "cid".into(),
            client_secret: Secret::new("csecret")
        }
    );
    assert_eq!(o.authority_host, "https://login.example.us/");
    // Fields win over variables.
    let mut c = cfg("c1");
    c.client_id = Some("field-cid".into());
    c.tenant_id = Some("field-tid".into());
    c.client_secret = Some(Secret::new("field-secret"));
    let o = AzureOptions::from_config(&c, &env_of(&env)).expect("o");
    assert_eq!(
        o.credential,
        Credential::ServicePrincipal {
            tenant_id: "field-tid".into(),
            client_id: "field-cid".into(),
            client_secret: Secret::new("field-secret")
        }
    );
    // Workload identity is auto-detected from the token file variable...
    let wi_env = [
        ("AZURE_CLIENT_ID", "cid"),
        ("AZURE_TENANT_ID", "tid"),
        ("AZURE_FEDERATED_TOKEN_FILE", "/var/run/token"),
    ];
    let wi = Credential::WorkloadIdentity {
        tenant_id: "tid".into(),
        client_id: "cid".into(),
        token_file: PathBuf::from("/var/run/token"),
    };
    let o = AzureOptions::from_config(&cfg("c1"), &env_of(&wi_env)).expect("o");
    assert_eq!(o.credential, wi);
    // ...unless switched off, which leaves managed identity (user-assigned by client id).
    let mut c = cfg("c1");
    c.use_workload_identity = Some(false);
    let o = AzureOptions::from_config(&c, &env_of(&wi_env)).expect("o");
    assert_eq!(
        o.credential,
        Credential::ManagedIdentity {
            client_id: Some("cid".into())
        }
    );
    // Asked for but incomplete: a configuration error.
    let mut c = cfg("c1");
    c.use_workload_identity = Some(true);
    let err = AzureOptions::from_config(&c, &env_of(&[])).expect_err("incomplete");
    assert!(matches!(err, Error::Config(_)), "{err}");
    // A client secret without ids is a configuration error that does not show it.
    let mut c = cfg("c1");
    c.client_secret = Some(Secret::new("lonely-secret"));
    let err = AzureOptions::from_config(&c, &env_of(&[])).expect_err("incomplete");
    assert!(!err.to_string().contains("lonely-secret"));
    // Empty values count as unset.
    let o =
        AzureOptions::from_config(&cfg("c1"), &env_of(&[("AZURE_STORAGE_KEY", " ")])).expect("o");
    assert_eq!(
        o.credential,
        Credential::ManagedIdentity { client_id: None }
    );
}

#[test]
fn endpoints_and_locations() {
    let s = AzureBlobStorage {
        agent: ureq::Agent::new_with_defaults(),
        account: "acct".into(),
        container: "c".into(),
        base_url: String::new(),
        base_path: String::new(),
        location: String::new(),
        auth: Auth::Sas(String::new()),
        put_threshold: 1,
        block_size: 1,
        retry: fast_retry(),
        page_size: 1,
        lock: None,
    };
    assert_eq!(s.url_path(Some("a b/ü+%/x~y")), "/c/a%20b/%C3%BC%2B%25/x~y");
    assert_eq!(
        parse_endpoint("https://acct.blob.core.usgovcloudapi.net/").expect("ok"),
        (
            "https://acct.blob.core.usgovcloudapi.net".into(),
            String::new()
        )
    );
    assert_eq!(
        parse_endpoint(ENDPOINT).expect("ok"),
        (ENDPOINT.into(), "/devstoreaccount1".into())
    );
    for bad in [
        "ftp://x",
        "https://",
        "https://u:p@host",
        "https://host/?sig=abc",
        "host",
    ] {
        let err = parse_endpoint(bad).expect_err(bad);
        assert!(!err.to_string().contains("sig=abc"), "{err}");
    }
    // Public cloud, sovereign cloud and emulator locations (SPEC.md "Storage URLs").
    assert_eq!(
        location_of("https://acct.blob.core.windows.net", "backups"),
        "azure://acct.blob.core.windows.net/backups"
    );
    assert_eq!(
        location_of("https://acct.blob.core.usgovcloudapi.net", "backups"),
        "azure://acct.blob.core.usgovcloudapi.net/backups"
    );
    assert_eq!(
        location_of(ENDPOINT, "backups"),
        "azure://127.0.0.1:10000/devstoreaccount1/backups"
    );
    let mut o = options("Bad_Name", key_cred());
    o.endpoint = None;
    assert!(matches!(AzureBlobStorage::new(o), Err(Error::Config(_))));
}

#[test]
fn shared_key_string_to_sign_is_canonical() {
    let headers = vec![
        ("x-ms-version", "2021-08-06".to_string()),
        ("x-ms-date", "Mon, 01 Jan 2024 00:00:00 GMT".to_string()),
        ("x-ms-blob-type", "BlockBlob".to_string()),
        ("content-type", "application/xml".to_string()),
    ];
    let query = vec![
        ("restype", "container".to_string()),
        ("comp", "list".to_string()),
        ("prefix", "a b/&".to_string()),
    ];
    let s = string_to_sign(
        "PUT",
        5,
        &headers,
        "devstoreaccount1",
        "/devstoreaccount1/c/a%20b",
        &query,
    );
    assert_eq!(
            s,
            "PUT\n\n\n5\n\napplication/xml\n\n\n\n\n\n\n\
             x-ms-blob-type:BlockBlob\nx-ms-date:Mon, 01 Jan 2024 00:00:00 GMT\n\
             x-ms-version:2021-08-06\n\
             /devstoreaccount1/devstoreaccount1/c/a%20b\ncomp:list\nprefix:a b/&\nrestype:container"
        );
    // Content-Length 0 is signed as empty.
    assert!(string_to_sign("GET", 0, &[], "a", "/c", &[]).starts_with("GET\n\n\n\n"));
}

#[test]
fn dates_are_rfc1123() {
    assert_eq!(http_date(UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 GMT");
    assert_eq!(
        http_date(UNIX_EPOCH + Duration::from_secs(784_111_777)),
        "Sun, 06 Nov 1994 08:49:37 GMT"
    );
    assert_eq!(
        http_date(UNIX_EPOCH + Duration::from_secs(1_709_210_096)),
        "Thu, 29 Feb 2024 12:34:56 GMT"
    );
}

#[test]
fn list_pages_are_parsed() {
    let xml = "<?xml version=\"1.0\" encoding=\"utf-8\"?><EnumerationResults \
            ServiceEndpoint=\"http://x/\" ContainerName=\"c\"><Prefix>a</Prefix><MaxResults>2\
            </MaxResults><Blobs><Blob><Name>a/one &amp; &lt;two&gt; &#233;&#x4E2D;</Name>\
            <Properties><Last-Modified>Thu, 29 Feb 2024 12:34:56 GMT</Last-Modified>\
            <Content-Length>3</Content-Length></Properties></Blob>\
            <Blob><Name Encoded=\"true\">a/%EF%BF%BE</Name><Properties/></Blob></Blobs>\
            <NextMarker>2!8!&quot;x&quot;</NextMarker></EnumerationResults>";
    let (names, next) = parse_list_page(xml).expect("parse");
    assert_eq!(
        names,
        [
            ("a/one & <two> é中".to_string(), Some(1_709_210_096_000)),
            ("a/\u{FFFE}".to_string(), None)
        ]
    );
    assert_eq!(next.as_deref(), Some("2!8!\"x\""));
    for end in [
        "<NextMarker />",
        "<NextMarker/>",
        "<NextMarker></NextMarker>",
        "",
    ] {
        let xml = format!(
                "<EnumerationResults><Blobs><Blob><Name>k</Name></Blob></Blobs>{end}</EnumerationResults>"
            );
        assert_eq!(
            parse_list_page(&xml).expect("parse"),
            (vec![("k".into(), None)], None)
        );
    }
    let empty = "<EnumerationResults><Blobs /><NextMarker /></EnumerationResults>";
    assert_eq!(parse_list_page(empty).expect("parse"), (vec![], None));
    assert!(parse_list_page("<Error><Code>X</Code></Error>").is_err());
    assert!(decode_entities("a &bogus; b").is_err());
    assert_eq!(
        parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
        Some(784_111_777_000)
    );
    assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 CET"), None);
    assert_eq!(parse_http_date("yesterday"), None);
    assert_eq!(
        clean_code(" ContainerNotFound\r\n").as_deref(),
        Some("ContainerNotFound")
    );
    assert_eq!(strip_queries("http://h/p?sig=abc def"), "http://h/p def");
}

// ---- Identity flows against local listeners (Entra ID, IMDS, a blob endpoint) ----

/// One request as a local listener saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    target: String,
    headers: HashMap<String, String>,
    body: String,
}

type Handler = dyn Fn(&Seen) -> (u16, Vec<(String, String)>, String) + Send + Sync;

/// Serves HTTP/1.1 on 127.0.0.1:<any>, one request per connection; records every request.
fn serve(handler: Arc<Handler>) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let handler = Arc::clone(&handler);
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                let mut parts = line.split_whitespace();
                let method = parts.next().unwrap_or_default().to_string();
                let target = parts.next().unwrap_or_default().to_string();
                let mut headers = HashMap::new();
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                        break;
                    }
                    if let Some((k, v)) = h.split_once(':') {
                        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                    }
                }
                let len: usize = headers
                    .get("content-length")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let mut body = vec![0u8; len];
                reader.read_exact(&mut body).expect("body");
                let req = Seen {
                    method,
                    target,
                    headers,
                    body: String::from_utf8_lossy(&body).into_owned(),
                };
                log.lock().expect("log").push(req.clone());
                let (status, extra, body) = handler(&req);
                let mut out = format!("HTTP/1.1 {status} X\r\nConnection: close\r\n");
                for (k, v) in extra {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                if req.method == "HEAD" {
                    out.push_str("Content-Length: 0\r\n\r\n");
                } else {
                    out.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
                }
                let _ = stream.write_all(out.as_bytes());
            });
        }
    });
    (url, seen)
}

/// A blob endpoint that accepts everything and records the Authorization header.
fn fake_blob_endpoint() -> (String, Arc<Mutex<Vec<Seen>>>) {
    let (url, seen) = serve(Arc::new(|req: &Seen| {
        let status = match req.method.as_str() {
            "PUT" => 201,
            "DELETE" => 202,
            _ => 200,
        };
        (status, vec![], String::new())
    }));
    (format!("{url}/{ACCOUNT}"), seen)
}

fn form(body: &str) -> HashMap<String, String> {
    body.split('&')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| {
            (
                k.to_string(),
                percent_decode_str(&v.replace('+', " "))
                    .decode_utf8_lossy()
                    .into_owned(),
            )
        })
        .collect()
}

/// An Entra ID token endpoint answering `tok-<n>` valid for `lifetime` seconds.
fn fake_entra(lifetime: u64) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let n = Arc::new(AtomicU32::new(0));
    serve(Arc::new(move |req: &Seen| {
        let f = form(&req.body);
        if req.method != "POST" || f.get("scope").map(String::as_str) != Some(STORAGE_SCOPE) {
            return (400, vec![], "{\"error\":\"invalid_request\"}".into());
        }
        if f.get("client_secret").map(String::as_str) == Some("wrong-secret") {
            return (
                401,
                vec![],
                "{\"error\":\"invalid_client\",\"error_description\":\"AADSTS7000215: \
                     Invalid client secret provided.\"}"
                    .into(),
            );
        }
        let i = n.fetch_add(1, Ordering::SeqCst) + 1;
        (
                200,
                vec![("Content-Type".into(), "application/json".into())],
                format!(
                    "{{\"token_type\":\"Bearer\",\"expires_in\":{lifetime},\"access_token\":\"tok-{i}\"}}"
                ),
            )
    }))
}

fn bearer_options(blob_url: &str, authority: &str, credential: Credential) -> AzureOptions {
    let mut o = options("backups", credential);
    o.endpoint = Some(blob_url.into());
    o.authority_host = authority.into();
    o
}

#[test]
fn service_principal_token_reaches_the_blob_request() {
    let (authority, token_requests) = fake_entra(3599);
    let (blob, blob_requests) = fake_blob_endpoint();
    // Through from_config, with AZURE_AUTHORITY_HOST from the (fake) environment.
    let env = env_of(&[
        ("AZURE_CLIENT_ID", "app-1"),
        ("AZURE_TENANT_ID", "tenant-1"),
        ("AZURE_CLIENT_SECRET", "sp-secret-value"),
        ("AZURE_AUTHORITY_HOST", &authority),
    ]);
    let mut c = cfg("backups");
    c.endpoint = Some(blob.clone());
    let mut o = AzureOptions::from_config(&c, &env).expect("options");
    o.retry = fast_retry();
    let s = AzureBlobStorage::new(o).expect("open");
    s.put_bytes("b/manifest.json", b"{}").expect("put");
    s.delete("b/manifest.json").expect("delete");

    let tokens = token_requests.lock().expect("log").clone();
    assert_eq!(tokens.len(), 1, "one token, cached: {tokens:?}");
    assert_eq!(tokens[0].target, "/tenant-1/oauth2/v2.0/token");
    assert_eq!(
        tokens[0].headers.get("content-type").map(String::as_str),
        Some("application/x-www-form-urlencoded")
    );
    let f = form(&tokens[0].body);
    assert_eq!(f["grant_type"], "client_credentials");
    assert_eq!(f["client_id"], "app-1");
    assert_eq!(f["client_secret"], "sp-secret-value");
    assert_eq!(f["scope"], "https://storage.azure.com/.default");

    let blobs = blob_requests.lock().expect("log").clone();
    assert_eq!(blobs.len(), 3, "probe, put, delete: {blobs:?}");
    for r in &blobs {
        assert_eq!(r.headers["authorization"], "Bearer tok-1");
        assert_eq!(r.headers["x-ms-version"], API_VERSION);
    }
    assert_eq!(blobs[1].method, "PUT");
    assert_eq!(blobs[1].target, "/devstoreaccount1/backups/b/manifest.json");
    assert_eq!(blobs[1].headers["x-ms-blob-type"], "BlockBlob");
    assert_eq!(blobs[1].body, "{}");
}

#[test]
fn bearer_tokens_are_refreshed_before_expiry() {
    // A 2 s token is refreshed after half its lifetime.
    let (authority, token_requests) = fake_entra(2);
    let (blob, blob_requests) = fake_blob_endpoint();
    let s = AzureBlobStorage::new(bearer_options(
        &blob,
        &authority,
        Credential::ServicePrincipal {
            tenant_id: "t".into(),
            client_id: "c".into(),
            client_secret: Secret::new("s"),
        },
    ))
    .expect("open");
    s.head("k").expect("head");
    std::thread::sleep(Duration::from_millis(1100));
    // Concurrent users share one refresh.
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| s.head("k").expect("head"));
        }
    });
    assert_eq!(token_requests.lock().expect("log").len(), 2);
    let blobs = blob_requests.lock().expect("log").clone();
    assert_eq!(blobs[1].headers["authorization"], "Bearer tok-1");
    assert!(blobs[2..]
        .iter()
        .all(|r| r.headers["authorization"] == "Bearer tok-2"));
}

#[test]
fn a_refused_token_is_replaced() {
    let (authority, token_requests) = fake_entra(3599);
    let refused = Arc::new(AtomicU32::new(0));
    let r = Arc::clone(&refused);
    let (blob, _) = serve(Arc::new(move |req: &Seen| {
        if req.method == "PUT" && r.fetch_add(1, Ordering::SeqCst) == 0 {
            let code = (
                "x-ms-error-code".to_string(),
                "InvalidAuthenticationInfo".into(),
            );
            return (401, vec![code], String::new());
        }
        (201, vec![], String::new())
    }));
    let s = AzureBlobStorage::new(bearer_options(
        &format!("{blob}/{ACCOUNT}"),
        &authority,
        Credential::ServicePrincipal {
            tenant_id: "t".into(),
            client_id: "c".into(),
            client_secret: Secret::new("s"),
        },
    ))
    .expect("open");
    assert_eq!(
        s.put_bytes("k", b"v").expect_err("401").to_string(),
        "Storage error: Failed to put k: 401 InvalidAuthenticationInfo"
    );
    s.put_bytes("k", b"v").expect("new token");
    assert_eq!(token_requests.lock().expect("log").len(), 2);
}

#[test]
fn token_failures_name_the_code_and_hide_the_secret() {
    let (authority, _) = fake_entra(3599);
    let (blob, blob_requests) = fake_blob_endpoint();
    let err = AzureBlobStorage::new(bearer_options(
        &blob,
        &authority,
        Credential::ServicePrincipal {
            tenant_id: "t".into(),
            client_id: "c".into(),
            client_secret: Secret::new("wrong-secret"),
        },
    ))
    .expect_err("refused");
    assert_eq!(
        err.to_string(),
        "Storage error: Failed to create Azure backend: token request failed: 401 invalid_client"
    );
    assert!(blob_requests.lock().expect("log").is_empty());
    // An unreachable token endpoint.
    let err = AzureBlobStorage::new(bearer_options(
        &blob,
        "http://127.0.0.1:1",
        Credential::ServicePrincipal {
            tenant_id: "t".into(),
            client_id: "c".into(),
            client_secret: Secret::new("wrong-secret"),
        },
    ))
    .expect_err("unreachable");
    let text = err.to_string();
    assert!(
        text.starts_with(
            "Storage error: Failed to create Azure backend: token request failed: connection error"
        ),
        "{text}"
    );
    assert!(!text.contains("wrong-secret"));
}

#[test]
fn workload_identity_sends_the_federated_token() {
    let (authority, token_requests) = fake_entra(3599);
    let (blob, blob_requests) = fake_blob_endpoint();
    let tmp = TempDir::new("azure-wi");
    let file = tmp.0.join("token");
    std::fs::write(&file, "eyJhbGciOi.federated.jwt\n").expect("write");
    let env = env_of(&[
        ("AZURE_CLIENT_ID", "wi-app"),
        ("AZURE_TENANT_ID", "wi-tenant"),
        ("AZURE_FEDERATED_TOKEN_FILE", file.to_str().expect("utf8")),
        ("AZURE_AUTHORITY_HOST", &authority),
    ]);
    let mut c = cfg("backups");
    c.endpoint = Some(blob.clone());
    let mut o = AzureOptions::from_config(&c, &env).expect("options");
    assert!(matches!(o.credential, Credential::WorkloadIdentity { .. }));
    o.retry = fast_retry();
    let s = AzureBlobStorage::new(o).expect("open");
    s.put_bytes("k", b"v").expect("put");
    let tokens = token_requests.lock().expect("log").clone();
    assert_eq!(tokens.len(), 1);
    assert_eq!(tokens[0].target, "/wi-tenant/oauth2/v2.0/token");
    let f = form(&tokens[0].body);
    assert_eq!(f["grant_type"], "client_credentials");
    assert_eq!(f["client_id"], "wi-app");
    assert_eq!(
        f["client_assertion_type"],
        "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
    );
    assert_eq!(f["client_assertion"], "eyJhbGciOi.federated.jwt");
    assert_eq!(f["scope"], STORAGE_SCOPE);
    assert!(!f.contains_key("client_secret"));
    let blobs = blob_requests.lock().expect("log").clone();
    assert!(blobs
        .iter()
        .all(|r| r.headers["authorization"] == "Bearer tok-1"));
    // A missing token file fails creation and names the file.
    let mut o = bearer_options(
        &blob,
        &authority,
        Credential::WorkloadIdentity {
            tenant_id: "t".into(),
            client_id: "c".into(),
            token_file: tmp.0.join("absent"),
        },
    );
    o.retry = fast_retry();
    let err = AzureBlobStorage::new(o).expect_err("no file");
    assert!(
        err.to_string().contains("cannot read federated token file"),
        "{err}"
    );
}

#[test]
fn managed_identity_asks_imds() {
    let (imds, imds_requests) = serve(Arc::new(|req: &Seen| {
        if req.headers.get("metadata").map(String::as_str) != Some("true") {
            return (400, vec![], "{\"error\":\"invalid_request\"}".into());
        }
        (
            200,
            vec![],
            "{\"access_token\":\"mi-token\",\"expires_in\":\"86399\",\"token_type\":\"Bearer\"}"
                .into(),
        )
    }));
    let (blob, blob_requests) = fake_blob_endpoint();
    let mut o = options(
        "backups",
        Credential::ManagedIdentity {
            client_id: Some("uami-1".into()),
        },
    );
    o.endpoint = Some(blob);
    o.imds_endpoint = format!("{imds}/metadata/identity/oauth2/token");
    let s = AzureBlobStorage::new(o).expect("open");
    s.put_bytes("k", b"v").expect("put");
    let reqs = imds_requests.lock().expect("log").clone();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].method, "GET");
    assert_eq!(
            reqs[0].target,
            "/metadata/identity/oauth2/token?api-version=2018-02-01&resource=https%3A%2F%2Fstorage.azure.com%2F&client_id=uami-1"
        );
    assert!(blob_requests
        .lock()
        .expect("log")
        .iter()
        .all(|r| r.headers["authorization"] == "Bearer mi-token"));
}

#[test]
fn no_secret_in_transport_errors() {
    // A blob endpoint that hangs up without answering: the SAS token must not show.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for s in listener.incoming() {
            drop(s);
        }
    });
    let sas = "sv=2021-08-06&sr=c&sp=rw&se=2099-01-01&sig=SUPERSECRETSIG%3D";
    let mut o = options("c1", Credential::Sas(Secret::new(sas)));
    o.endpoint = Some(format!("http://{addr}/devstoreaccount1"));
    let err = AzureBlobStorage::new(o).expect_err("hang-up");
    let text = err.to_string();
    assert_eq!(
        text,
        "Storage error: Failed to create Azure backend: endpoint connection error"
    );
    let e = transport_failure(
        "put",
        "k",
        &ureq::Error::BadUri(format!("http://h/c/k?{sas}")),
    );
    let (Attempt::Permanent(e) | Attempt::Transient(e)) = e;
    assert!(!e.to_string().contains("SUPERSECRET"), "{e}");
}
