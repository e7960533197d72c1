use super::*;
use crate::repository::storage::conformance::{self, TempDir};
use base64::Engine as _;
use ring::signature::RsaKeyPair;
use ring::signature::{UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};
use std::collections::HashMap;
use std::io;
use std::io::BufRead;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::sync::OnceLock;

/// fake-gcs-server, started by scripts/setup-storage.sh.
const EMULATOR: &str = "http://127.0.0.1:4443";

fn fast() -> Policy {
    Policy {
        attempts: 3,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        backend: "gcs",
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[2] ^ seed)
        .collect()
}

fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "rmqb-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A bucket on fake-gcs-server unique to this call; emptied and deleted on drop.
struct TestBucket(String);

impl TestBucket {
    fn new(tag: &str) -> TestBucket {
        let name = unique(tag);
        let resp = new_agent(CONNECT_TIMEOUT)
            .post(format!("{EMULATOR}/storage/v1/b?project=test"))
            .send_json(serde_json::json!({ "name": name }))
            .expect("create bucket (is fake-gcs-server running?)");
        assert_eq!(resp.status().as_u16(), 200, "create bucket {name}");
        TestBucket(name)
    }
}

impl Drop for TestBucket {
    fn drop(&mut self) {
        if let Ok(s) = GcsBackend::new(emulator_options(&self.0)) {
            for k in s.list("").unwrap_or_default() {
                let _ = s.delete(&k);
            }
        }
        let _ = new_agent(CONNECT_TIMEOUT)
            .delete(format!("{EMULATOR}/storage/v1/b/{}", self.0))
            .call();
    }
}

fn emulator_options(bucket: &str) -> GcsOptions {
    let mut o = GcsOptions::new(bucket, Credentials::Anonymous);
    o.endpoint = Some(EMULATOR.into());
    o.policy = fast();
    o
}

fn emulator_backend(bucket: &str, threshold: u64, chunk: u64) -> GcsBackend {
    let mut o = emulator_options(bucket);
    o.upload_threshold = threshold;
    o.chunk_size = chunk;
    GcsBackend::new(o).expect("open")
}

#[test]
fn conforms_on_fake_gcs_server() {
    let b = TestBucket::new("conf");
    // Defaults: the suite's 20 MiB file goes through a resumable upload in 8 MiB chunks.
    let s = emulator_backend(&b.0, DEFAULT_UPLOAD_THRESHOLD, DEFAULT_CHUNK_SIZE);
    conformance::run(&s);
    assert_eq!(s.location(), format!("gcs://{}", b.0));
}

#[test]
fn resumable_uploads_with_small_chunks() {
    let b = TestBucket::new("chunks");
    let s = emulator_backend(&b.0, 300_000, 256 * 1024);
    assert_eq!(s.chunk_size, CHUNK_ALIGN);
    conformance::run(&s);
    let tmp = TempDir::new("gcs-chunks");
    // A last chunk shorter than the others, one exactly full, and a file of one chunk + 1 byte.
    for (i, size) in [1_000_000usize, 2 * 262_144, 262_145, 300_001]
        .into_iter()
        .enumerate()
    {
        let data = pattern(size, i as u8);
        let src = tmp.0.join(format!("src{i}"));
        std::fs::write(&src, &data).expect("write");
        let key = format!("big/file {i}");
        s.put_file(&key, &src).expect("put_file");
        assert_eq!(s.head(&key).expect("head"), Some(size as u64));
        let dst = tmp.0.join(format!("dst{i}"));
        assert_eq!(s.get_to_file(&key, &dst).expect("get"), size as u64);
        assert!(std::fs::read(&dst).expect("read") == data, "size {size}");
        let bytes_key = format!("big/bytes {i}");
        s.put_bytes(&bytes_key, &data).expect("put_bytes");
        assert!(s.get_bytes(&bytes_key).expect("get") == data, "size {size}");
    }
    assert_eq!(s.list("big/").expect("list").len(), 8);
    // Overwrite a chunked object with a small one.
    s.put_bytes("big/file 0", b"small").expect("overwrite");
    assert_eq!(s.get_bytes("big/file 0").expect("get"), b"small");
}

#[test]
fn open_uses_storage_emulator_host() {
    let b = TestBucket::new("env");
    let cfg = crate::config::GcsStorage {
        bucket: b.0.clone(),
        service_account_path: Some(PathBuf::from("/nonexistent/ignored-with-emulator.json")),
        prefix: None,
        object_lock: None,
    };
    // No scheme means http, as in Google's client libraries.
    let env = |name: &str| (name == "STORAGE_EMULATOR_HOST").then(|| "127.0.0.1:4443".into());
    let s = open_with_env(&cfg, &env).expect("open");
    assert_eq!(s.base, EMULATOR);
    s.put_bytes("b1/manifest.json", b"{}").expect("put");
    assert_eq!(s.list_backup_ids().expect("ids"), ["b1"]);
    assert_eq!(s.location(), format!("gcs://{}", b.0));
}

#[test]
fn missing_bucket_fails_on_put_not_on_open() {
    let bucket = unique("absent");
    let s = emulator_backend(&bucket, 300_000, 256 * 1024);
    assert_eq!(
        s.put_bytes("b/manifest.json", b"{}")
            .expect_err("no bucket"),
        Error::Storage("Failed to put b/manifest.json: NoSuchBucket".into())
    );
    // The resumable path reports the same.
    let tmp = TempDir::new("gcs-absent");
    let src = tmp.0.join("big");
    std::fs::write(&src, pattern(400_000, 3)).expect("write");
    assert_eq!(
        s.put_file("b/queues/q/segment-0001", &src)
            .expect_err("no bucket")
            .to_string(),
        "Storage error: Failed to put b/queues/q/segment-0001: NoSuchBucket"
    );
    assert_eq!(
        s.get_bytes("b/manifest.json").expect_err("absent"),
        Error::Storage("Key not found: b/manifest.json".into())
    );
}

#[test]
fn missing_keys() {
    let b = TestBucket::new("missing");
    let s = emulator_backend(&b.0, DEFAULT_UPLOAD_THRESHOLD, DEFAULT_CHUNK_SIZE);
    let tmp = TempDir::new("gcs-missing");
    let key = "nope/manifest.json";
    let want = Error::Storage(format!("Key not found: {key}"));
    assert_eq!(s.get_bytes(key).expect_err("missing"), want);
    assert_eq!(
        s.get_to_file(key, &tmp.0.join("out")).expect_err("missing"),
        want
    );
    assert_eq!(s.head(key).expect("head"), None);
    s.delete(key).expect("delete of a missing key succeeds");
    assert!(s.list("nope/").expect("list").is_empty());
}

#[test]
fn unreachable_endpoint() {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let mut o = GcsOptions::new("bucket", Credentials::Anonymous);
    o.endpoint = Some(format!("http://127.0.0.1:{port}"));
    o.policy = fast();
    assert_eq!(
        GcsBackend::new(o).err().expect("unreachable").to_string(),
        "Storage error: Failed to create GCS backend: endpoint connection error"
    );
}

#[test]
fn object_names_are_one_path_segment() {
    assert_eq!(enc("a/b c+%41~x.y_z-"), "a%2Fb%20c%2B%2541~x.y_z-");
    assert_eq!(enc("ünï"), "%C3%BCn%C3%AF");
    assert_eq!(
        normalize_endpoint("127.0.0.1:4443/"),
        "http://127.0.0.1:4443"
    );
    assert_eq!(
        normalize_endpoint("https://storage.example"),
        "https://storage.example"
    );
}

// ----- A tiny HTTP server playing token endpoints, the metadata server and GCS. -----

#[derive(Clone, Debug)]
struct Seen {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
    fn form(&self) -> HashMap<String, String> {
        String::from_utf8_lossy(&self.body)
            .split('&')
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| {
                let v = percent_encoding::percent_decode_str(v).decode_utf8_lossy();
                (k.to_string(), v.into_owned())
            })
            .collect()
    }
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn reply(status: u16, body: &str) -> Reply {
    Reply {
        status,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
    }
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// Serves `handler` on 127.0.0.1:<free port>, one request per connection; returns the base
/// URL and the log of requests received.
fn serve(handler: impl Fn(&Seen) -> Reply + Send + 'static) -> (String, Log) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let seen_log = log.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let Some(seen) = read_request(&stream) else {
                continue;
            };
            seen_log.lock().expect("log").push(seen.clone());
            let r = handler(&seen);
            let mut out = format!(
                "HTTP/1.1 {} {}\r\ncontent-length: {}\r\nconnection: close\r\n",
                r.status,
                canonical_reason(r.status),
                r.body.len()
            );
            for (k, v) in &r.headers {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            out.push_str("\r\n");
            let mut w = &stream;
            let _ = w
                .write_all(out.as_bytes())
                .and_then(|_| w.write_all(&r.body));
        }
    });
    (base, log)
}

fn read_request(stream: &TcpStream) -> Option<Seen> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut r = io::BufReader::new(stream);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let len = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).ok()?;
    Some(Seen {
        method,
        target,
        headers,
        body,
    })
}

/// A throwaway 2048-bit RSA key (PKCS#8 PEM) made by the `openssl` CLI.
fn throwaway_key() -> String {
    let out = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .expect("the openssl CLI generates the test's throwaway RSA key");
    assert!(out.status.success(), "openssl genpkey failed");
    String::from_utf8(out.stdout).expect("PEM")
}

/// Checks a JWT bearer grant: signature (with the public key), header and claims.
fn check_jwt(
    form: &HashMap<String, String>,
    public_der: &[u8],
    token_uri: &str,
) -> std::result::Result<(), &'static str> {
    if form.get("grant_type").map(String::as_str) != Some(JWT_GRANT) {
        return Err("grant_type");
    }
    let jwt = form.get("assertion").ok_or("assertion")?;
    let (signed, sig) = jwt.rsplit_once('.').ok_or("jwt shape")?;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let sig = b64.decode(sig).map_err(|_| "signature base64")?;
    UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, public_der)
        .verify(signed.as_bytes(), &sig)
        .map_err(|_| "signature")?;
    let (h, c) = signed.split_once('.').ok_or("jwt shape")?;
    let decode = |s: &str| -> std::result::Result<serde_json::Value, &'static str> {
        let raw = b64.decode(s).map_err(|_| "base64")?;
        serde_json::from_slice(&raw).map_err(|_| "json")
    };
    let header = decode(h)?;
    let claims = decode(c)?;
    if header != serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": "kid-1"}) {
        return Err("header");
    }
    let iat = claims["iat"].as_u64().ok_or("iat")?;
    let ok = claims["iss"] == "backup@test.iam.gserviceaccount.com"
        && claims["scope"] == SCOPE
        && claims["aud"] == token_uri
        && claims["exp"].as_u64() == Some(iat + 3600)
        && unix_now().abs_diff(iat) < 120;
    ok.then_some(()).ok_or("claims")
}

const TOKEN: &str = "ya29.test-access-token-SECRET";

fn write_service_account(dir: &Path, name: &str, pem: &str, token_uri: &str) -> PathBuf {
    let path = dir.join(name);
    let json = serde_json::json!({
        "type": "service_account",
        "project_id": "test",
        "private_key_id": "kid-1",
        "private_key": pem,
        "client_email": "backup@test.iam.gserviceaccount.com",
        "client_id": "123",
        "token_uri": token_uri,
    });
    std::fs::write(&path, json.to_string()).expect("write key file");
    path
}

fn listener_options(bucket: &str, endpoint: &str, credentials: Credentials) -> GcsOptions {
    let mut o = GcsOptions::new(bucket, credentials);
    o.endpoint = Some(endpoint.into());
    o.policy = fast();
    o
}

/// Asserts that no error text holds a secret.
fn assert_no_secret(errors: &[String], secrets: &[&str]) {
    for e in errors {
        for s in secrets {
            assert!(!e.contains(s), "secret {s:?} in error {e:?}");
        }
    }
}

#[test]
fn service_account_jwt_reaches_storage_as_bearer_token() {
    let pem = throwaway_key();
    let der = base64::engine::general_purpose::STANDARD
        .decode(
            pem.lines()
                .filter(|l| !l.starts_with("-----"))
                .collect::<String>(),
        )
        .expect("der");
    let public_der = RsaKeyPair::from_pkcs8(&der)
        .expect("key")
        .public()
        .as_ref()
        .to_vec();
    let token_uri: Arc<OnceLock<String>> = Arc::new(OnceLock::new());
    let uri = token_uri.clone();
    let (token_base, token_log) = serve(move |seen| {
        let want = uri.get().cloned().unwrap_or_default();
        match check_jwt(&seen.form(), &public_der, &want) {
            Ok(()) if seen.method == "POST" && seen.path() == "/token" => reply(
                200,
                &format!(r#"{{"access_token":"{TOKEN}","expires_in":3600,"token_type":"Bearer"}}"#),
            ),
            Ok(()) => reply(404, "{}"),
            Err(what) => reply(400, &format!(r#"{{"error":"bad_{what}"}}"#)),
        }
    });
    token_uri.set(format!("{token_base}/token")).expect("once");
    let (storage, storage_log) = serve(|seen| {
        if seen.header("authorization") != Some(&format!("Bearer {TOKEN}")) {
            return reply(401, r#"{"error":{"code":401,"message":"Login Required"}}"#);
        }
        match (seen.method.as_str(), seen.path()) {
            ("GET", "/storage/v1/b/bkt/o") => reply(200, r#"{"kind":"storage#objects"}"#),
            ("GET", "/storage/v1/b/bkt/o/x%2Fy") => reply(200, "hello"),
            ("POST", "/upload/storage/v1/b/bkt/o") => reply(
                403,
                r#"{"error":{"code":403,"message":"backup@test does not have storage.objects.create access","errors":[{"reason":"forbidden"}]}}"#,
            ),
            _ => reply(404, "{}"),
        }
    });
    let tmp = TempDir::new("gcs-sa");
    let key_file = write_service_account(&tmp.0, "sa.json", &pem, &format!("{token_base}/token"));
    let mut errors = Vec::new();

    let creds = Credentials::resolve(Some(&key_file), &|_| None).expect("key file");
    assert!(format!("{creds:?}").starts_with("ServiceAccount("));
    let s = GcsBackend::new(listener_options("bkt", &storage, creds)).expect("open");
    let err = s.put_bytes("a/b", b"data").expect_err("denied");
    assert_eq!(
        err.to_string(),
        "Storage error: Failed to put a/b: 403 Forbidden"
    );
    errors.push(err.to_string());
    assert_eq!(s.get_bytes("x/y").expect("get"), b"hello");
    {
        let seen = storage_log.lock().expect("log");
        assert_eq!(seen.len(), 3);
        for r in seen.iter() {
            assert_eq!(
                r.header("authorization"),
                Some(format!("Bearer {TOKEN}").as_str())
            );
        }
    }
    // One token for all requests (cached), fetched with a valid JWT (else: 400 bad_...).
    assert_eq!(token_log.lock().expect("log").len(), 1);

    // A 403 on the probe fails the creation.
    let (denied, _) = serve(|_| reply(403, r#"{"error":{"code":403,"message":"denied"}}"#));
    let creds = Credentials::from_file(&key_file).expect("key file");
    let err = GcsBackend::new(listener_options("bkt", &denied, creds))
        .err()
        .expect("denied");
    assert_eq!(
        err.to_string(),
        "Storage error: Failed to create GCS backend: 403 Forbidden"
    );
    errors.push(err.to_string());

    // A token endpoint refusing the grant.
    let (refusing, _) = serve(|_| {
        reply(
            400,
            r#"{"error":"invalid_grant","error_description":"Invalid JWT Signature."}"#,
        )
    });
    let bad = write_service_account(&tmp.0, "bad.json", &pem, &format!("{refusing}/token"));
    let creds = Credentials::from_file(&bad).expect("key file");
    let err = GcsBackend::new(listener_options("bkt", &storage, creds))
        .err()
        .expect("refused");
    assert_eq!(
        err.to_string(),
        "Storage error: Failed to create GCS backend: token request failed: 400 invalid_grant"
    );
    errors.push(err.to_string());

    // An unreachable token endpoint.
    let dead = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    let gone = write_service_account(&tmp.0, "gone.json", &pem, &format!("http://{dead}/token"));
    let creds = Credentials::from_file(&gone).expect("key file");
    let err = GcsBackend::new(listener_options("bkt", &storage, creds))
        .err()
        .expect("unreachable");
    assert_eq!(
            err.to_string(),
            "Storage error: Failed to create GCS backend: token request failed: token endpoint connection error"
        );
    errors.push(err.to_string());

    let key_lines: Vec<&str> = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let mut secrets = vec![TOKEN];
    secrets.extend(key_lines.iter().copied());
    assert_no_secret(&errors, &secrets);
}

#[test]
fn authorized_user_tokens_are_refreshed_before_expiry_and_after_401() {
    let fetches = Arc::new(AtomicU32::new(0));
    let n = fetches.clone();
    let (token_base, _) = serve(move |seen| {
        let f = seen.form();
        let ok = seen.method == "POST"
            && f.get("grant_type").map(String::as_str) == Some("refresh_token")
            && f.get("client_id").map(String::as_str) == Some("cid.apps")
            && f.get("client_secret").map(String::as_str) == Some("CLIENT-SECRET+/=")
            && f.get("refresh_token").map(String::as_str) == Some("1//REFRESH-SECRET");
        if !ok {
            return reply(400, r#"{"error":"invalid_request"}"#);
        }
        let i = n.fetch_add(1, Ordering::SeqCst) + 1;
        // Lives 2 s: refreshed after 1 s (half its life).
        reply(
            200,
            &format!(r#"{{"access_token":"tok-{i}","expires_in":2,"token_type":"Bearer"}}"#),
        )
    });
    let reject_next = Arc::new(AtomicU32::new(0));
    let reject = reject_next.clone();
    let (storage, storage_log) = serve(move |seen| {
        if reject.swap(0, Ordering::SeqCst) == 1 {
            return reply(
                401,
                r#"{"error":{"code":401,"message":"Invalid Credentials"}}"#,
            );
        }
        match seen.path() {
            "/storage/v1/b/bkt/o" => reply(200, r#"{"kind":"storage#objects"}"#),
            _ => reply(200, r#"{"size":"42"}"#),
        }
    });
    let tmp = TempDir::new("gcs-user");
    let file = tmp.0.join("adc.json");
    let json = serde_json::json!({
        "type": "authorized_user",
        "client_id": "cid.apps",
        "client_secret": "CLIENT-SECRET+/=",
        "refresh_token": "1//REFRESH-SECRET",
        "token_uri": format!("{token_base}/token"),
    });
    std::fs::write(&file, json.to_string()).expect("write");
    // Found as application default credentials below CLOUDSDK_CONFIG.
    let adc_dir = tmp.0.join("gcloud");
    std::fs::create_dir_all(&adc_dir).expect("mkdir");
    std::fs::copy(&file, adc_dir.join(ADC_FILE)).expect("copy");
    let dir = adc_dir.to_string_lossy().into_owned();
    let env = move |name: &str| (name == "CLOUDSDK_CONFIG").then(|| dir.clone());
    let creds = Credentials::resolve(None, &env).expect("adc");
    let s = GcsBackend::new(listener_options("bkt", &storage, creds)).expect("open");
    assert_eq!(s.head("k").expect("head"), Some(42));
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "cached");
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(s.head("k").expect("head"), Some(42));
    assert_eq!(fetches.load(Ordering::SeqCst), 2, "refreshed");
    // A 401 is not retried but drops the token.
    reject_next.store(1, Ordering::SeqCst);
    let err = s.head("k").expect_err("401");
    assert_eq!(
        err.to_string(),
        "Storage error: Failed to head k: 401 Unauthorized"
    );
    assert_eq!(s.head("k").expect("head"), Some(42));
    assert_eq!(fetches.load(Ordering::SeqCst), 3, "fetched again after 401");
    let auth: Vec<String> = storage_log
        .lock()
        .expect("log")
        .iter()
        .map(|r| r.header("authorization").unwrap_or("").to_string())
        .collect();
    assert_eq!(
        auth,
        [
            "Bearer tok-1",
            "Bearer tok-1",
            "Bearer tok-2",
            "Bearer tok-2",
            "Bearer tok-3"
        ]
    );
    assert_no_secret(
        &[err.to_string()],
        &["tok-", "CLIENT-SECRET", "REFRESH-SECRET"],
    );
}

#[test]
fn metadata_server_tokens() {
    let (meta, meta_log) = serve(|seen| {
        if seen.path() == METADATA_TOKEN_PATH && seen.header("metadata-flavor") == Some("Google") {
            reply(
                200,
                r#"{"access_token":"meta-token","expires_in":3599,"token_type":"Bearer"}"#,
            )
        } else {
            reply(404, "{}")
        }
    });
    let (storage, storage_log) = serve(|_| reply(200, r#"{"kind":"storage#objects"}"#));
    // GCE_METADATA_HOST names the server when no credentials file is found.
    let host = meta.trim_start_matches("http://").to_string();
    let env = move |name: &str| match name {
        "GCE_METADATA_HOST" => Some(host.clone()),
        "HOME" => Some("/nonexistent-home".into()),
        _ => None,
    };
    let creds = Credentials::resolve(None, &env).expect("metadata");
    GcsBackend::new(listener_options("bkt", &storage, creds)).expect("open");
    assert_eq!(meta_log.lock().expect("log").len(), 1);
    assert_eq!(
        storage_log.lock().expect("log")[0].header("authorization"),
        Some("Bearer meta-token")
    );
    // No credentials anywhere and no metadata server.
    let dead = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    let creds = Credentials::Metadata {
        base_url: format!("http://{dead}"),
        fallback: true,
    };
    let err = GcsBackend::new(listener_options("bkt", &storage, creds))
        .err()
        .expect("no credentials");
    assert!(
        err.to_string()
            .starts_with("Storage error: Failed to create GCS backend: no credentials found"),
        "{err}"
    );
}

#[test]
fn credentials_are_resolved_in_order() {
    let tmp = TempDir::new("gcs-resolve");
    let user = |name: &str| {
        let p = tmp.0.join(format!("{name}.json"));
        let json = serde_json::json!({
            "type": "authorized_user", "client_id": name,
            "client_secret": "s", "refresh_token": "r",
        });
        std::fs::write(&p, json.to_string()).expect("write");
        p
    };
    let explicit = user("explicit");
    let gac = user("gac");
    let sdk = tmp.0.join("sdk");
    std::fs::create_dir_all(&sdk).expect("mkdir");
    std::fs::rename(user("sdk"), sdk.join(ADC_FILE)).expect("mv");
    let home = tmp.0.join("home");
    std::fs::create_dir_all(home.join(".config/gcloud")).expect("mkdir");
    std::fs::rename(user("home"), home.join(".config/gcloud").join(ADC_FILE)).expect("mv");
    let vars: HashMap<&str, String> = [
        ("GOOGLE_APPLICATION_CREDENTIALS", gac.display().to_string()),
        ("CLOUDSDK_CONFIG", sdk.display().to_string()),
        ("HOME", home.display().to_string()),
    ]
    .into_iter()
    .collect();
    let kind = |path: Option<&Path>, skip: &[&str]| -> String {
        let env = |n: &str| vars.get(n).filter(|_| !skip.contains(&n)).cloned();
        format!("{:?}", Credentials::resolve(path, &env).expect("resolve"))
    };
    assert_eq!(kind(Some(&explicit), &[]), "AuthorizedUser(explicit)");
    assert_eq!(kind(None, &[]), "AuthorizedUser(gac)");
    assert_eq!(
        kind(None, &["GOOGLE_APPLICATION_CREDENTIALS"]),
        "AuthorizedUser(sdk)"
    );
    assert_eq!(
        kind(None, &["GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG"]),
        "AuthorizedUser(home)"
    );
    assert_eq!(
        kind(
            None,
            &["GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG", "HOME"]
        ),
        "Metadata(http://metadata.google.internal)"
    );
    // A named file that is missing is an error, not a fall-through.
    let err = Credentials::resolve(None, &|n| {
        (n == "GOOGLE_APPLICATION_CREDENTIALS").then(|| "/nonexistent/key.json".into())
    })
    .expect_err("missing file");
    assert_eq!(
        err.to_string(),
        "Storage error: Failed to create GCS backend: invalid credentials file \
             /nonexistent/key.json: No such file or directory"
    );
}

#[test]
fn credentials_file_errors_hide_key_material() {
    let tmp = TempDir::new("gcs-badkey");
    let cases = [
        r#"{"type":"service_account","client_email":"a@b","private_key":"-----BEGIN PRIVATE KEY-----\nU0VDUkVUS0VZTUFURVJJQUw=\n-----END PRIVATE KEY-----\n"}"#,
        r#"{"type":"service_account","client_email":"a@b","private_key":["SECRETKEYMATERIAL"]}"#,
        r#"{"type":"service_account","private_key":"SECRETKEYMATERIAL" "#,
        r#"{"type":"authorized_user","client_secret":"SECRETKEYMATERIAL"}"#,
        r#"{"type":"SECRETKEYMATERIAL/with/slashes?x=1"}"#,
    ];
    for (i, text) in cases.iter().enumerate() {
        let p = tmp.0.join(format!("k{i}.json"));
        std::fs::write(&p, text).expect("write");
        let err = Credentials::from_file(&p).expect_err(text).to_string();
        assert!(
            err.starts_with(&format!(
                "Storage error: Failed to create GCS backend: invalid credentials file {}: ",
                p.display()
            )),
            "{err}"
        );
        assert_no_secret(&[err], &["SECRETKEYMATERIAL", "U0VDUkVUS0VZTUFURVJJQUw"]);
    }
}

#[test]
fn resumable_upload_resumes_from_the_offset_gcs_reports() {
    /// The object being assembled, and how many chunk PUTs arrived.
    #[derive(Default)]
    struct Session {
        stored: Vec<u8>,
        chunk_puts: u32,
        done: bool,
    }
    let state = Arc::new(Mutex::new(Session::default()));
    let st = state.clone();
    let base: Arc<OnceLock<String>> = Arc::new(OnceLock::new());
    let b = base.clone();
    let (url, log) = serve(move |seen| {
        let mut s = st.lock().expect("state");
        let persisted = |s: &Session| {
            let mut r = reply(308, "");
            if !s.stored.is_empty() {
                r.headers
                    .push(("range".into(), format!("bytes=0-{}", s.stored.len() - 1)));
            }
            r
        };
        match (seen.method.as_str(), seen.path()) {
            ("GET", "/storage/v1/b/bkt/o") => reply(200, "{}"),
            ("POST", "/upload/storage/v1/b/bkt/o") => {
                let mut r = reply(200, "");
                let loc = format!(
                    "{}/session/s1?upload_id=SESSION-SECRET",
                    b.get().expect("base")
                );
                r.headers.push(("location".into(), loc));
                r
            }
            ("PUT", "/session/s1") if seen.target.contains("upload_id=SESSION-SECRET") => {
                let range = seen.header("content-range").unwrap_or("").to_string();
                if let Some(total) = range.strip_prefix("bytes */") {
                    if s.done {
                        return reply(200, &format!(r#"{{"size":"{total}"}}"#));
                    }
                    return persisted(&s);
                }
                let Some((span, total)) =
                    range.strip_prefix("bytes ").and_then(|r| r.split_once('/'))
                else {
                    return reply(400, "{}");
                };
                let first: usize = span
                    .split('-')
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(usize::MAX);
                if first != s.stored.len() {
                    return reply(
                        400,
                        r#"{"error":{"code":400,"errors":[{"reason":"wrongOffset"}]}}"#,
                    );
                }
                s.chunk_puts += 1;
                if s.chunk_puts == 2 {
                    // Keep half of the second chunk, then fail.
                    let keep = seen.body.len() / 2;
                    s.stored.extend_from_slice(&seen.body[..keep]);
                    return reply(
                        503,
                        r#"{"error":{"code":503,"errors":[{"reason":"backendError"}]}}"#,
                    );
                }
                if s.chunk_puts == 10 {
                    return reply(410, r#"{"error":{"code":410,"message":"Gone"}}"#);
                }
                s.stored.extend_from_slice(&seen.body);
                if total != "*" && s.stored.len().to_string() == total {
                    s.done = true;
                    return reply(200, &format!(r#"{{"name":"big","size":"{total}"}}"#));
                }
                persisted(&s)
            }
            _ => reply(404, "{}"),
        }
    });
    base.set(url.clone()).expect("once");
    let mut o = listener_options("bkt", &url, Credentials::Anonymous);
    o.upload_threshold = 256 * 1024;
    o.chunk_size = 512 * 1024;
    let s = GcsBackend::new(o).expect("open");
    let data = pattern(1536 * 1024 + 1000, 9);
    s.put_bytes("big", &data).expect("resumable put");
    assert!(
        state.lock().expect("state").stored == data,
        "object assembled"
    );
    let ranges: Vec<String> = log
        .lock()
        .expect("log")
        .iter()
        .filter(|r| r.method == "PUT")
        .map(|r| r.header("content-range").unwrap_or("").to_string())
        .collect();
    let total = data.len();
    assert_eq!(
        ranges,
        [
            "bytes 0-524287/*".to_string(),
            "bytes 524288-1048575/*".into(),
            format!("bytes */{total}"),
            "bytes 786432-1310719/*".into(),
            format!("bytes 1310720-{}/{total}", total - 1),
        ]
    );
    // A session that expires: the error names the key, never the session URL.
    {
        let mut st = state.lock().expect("state");
        *st = Session::default();
        st.chunk_puts = 8;
    }
    let err = s.put_bytes("big", &data).expect_err("gone");
    assert_eq!(
        err.to_string(),
        "Storage error: Failed to put big: 410 Gone"
    );
    assert_no_secret(&[err.to_string()], &["SESSION-SECRET", "session/s1"]);
}

/// Conditional writes above the threshold go through resumable uploads. fake-gcs-server 1.54
/// ignores `ifGenerationMatch` there, so on it only the written paths and the existence check
/// before a create-only upload of a file can be seen; the refusals are below, from a fake GCS.
#[test]
fn conditional_resumable_uploads_on_fake_gcs_server() {
    let b = TestBucket::new("condres");
    let s = emulator_backend(&b.0, 300_000, 256 * 1024);
    let tmp = TempDir::new("gcs-cond-res");
    let data = pattern(700_000, 4);
    let src = tmp.0.join("src");
    std::fs::write(&src, &data).expect("write");
    let v1 = s
        .put_file_new("seg/big", &src)
        .expect("put file new")
        .written()
        .expect("created");
    assert_eq!(
        s.get_with_version("seg/big").expect("get"),
        Some((data.clone(), v1.clone()))
    );
    assert_eq!(
        s.put_file_new("seg/big", &src).expect("again"),
        Conditional::Refused
    );
    assert!(src.exists());
    let bigger = pattern(900_000, 5);
    let v2 = s
        .put_bytes_if("seg/big", &bigger, &v1)
        .expect("replace")
        .written()
        .expect("replaced");
    assert_ne!(v1, v2);
    assert_eq!(
        s.get_with_version("seg/big").expect("get"),
        Some((bigger, v2))
    );
    assert_eq!(
        s.put_bytes_if("seg/big", b"x", &ObjectVersion("0".into()))
            .expect("generation 0"),
        Conditional::Refused
    );
    assert_eq!(
        s.put_bytes_if("seg/big", b"x", &ObjectVersion("etag".into()))
            .expect_err("not a generation"),
        Error::Storage("Failed to put seg/big: invalid object version".into())
    );
}

/// What real GCS does with a resumable upload's `ifGenerationMatch` (fake-gcs-server 1.54
/// ignores it): the precondition is sent when the session starts, and a 412 then, or for the
/// last chunk, is a refusal.
#[test]
fn resumable_preconditions_are_sent_and_refusals_understood() {
    let refuse_at_start = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let r = refuse_at_start.clone();
    let base: Arc<OnceLock<String>> = Arc::new(OnceLock::new());
    let b = base.clone();
    let (url, log) = serve(move |seen| match (seen.method.as_str(), seen.path()) {
        ("GET", "/storage/v1/b/bkt/o") => reply(200, "{}"),
        ("GET", "/storage/v1/b/bkt/o/big") => reply(404, "{}"),
        ("POST", "/upload/storage/v1/b/bkt/o") if r.load(Ordering::SeqCst) => reply(
            412,
            r#"{"error":{"code":412,"errors":[{"reason":"conditionNotMet"}]}}"#,
        ),
        ("POST", "/upload/storage/v1/b/bkt/o") => {
            let mut rep = reply(200, "");
            let loc = format!("{}/session/s1?upload_id=x", b.get().expect("base"));
            rep.headers.push(("location".into(), loc));
            rep
        }
        ("PUT", "/session/s1") => {
            let range = seen.header("content-range").unwrap_or("");
            if range.ends_with("/*") {
                let end = seen.body.len() - 1;
                let mut rep = reply(308, "");
                rep.headers.push(("range".into(), format!("bytes=0-{end}")));
                rep
            } else {
                reply(
                    412,
                    r#"{"error":{"code":412,"errors":[{"reason":"conditionNotMet"}]}}"#,
                )
            }
        }
        _ => reply(404, "{}"),
    });
    base.set(url.clone()).expect("once");
    let mut o = listener_options("bkt", &url, Credentials::Anonymous);
    o.upload_threshold = 256 * 1024;
    o.chunk_size = 256 * 1024;
    let s = GcsBackend::new(o).expect("open");
    let tmp = TempDir::new("gcs-cond-fake");
    let src = tmp.0.join("src");
    std::fs::write(&src, pattern(400_000, 1)).expect("write");
    assert_eq!(
        s.put_file_new("big", &src).expect("refused at start"),
        Conditional::Refused
    );
    refuse_at_start.store(false, Ordering::SeqCst);
    assert_eq!(
        s.put_file_new("big", &src).expect("refused at the end"),
        Conditional::Refused
    );
    assert_eq!(
        s.put_bytes_if("big", &pattern(400_000, 2), &ObjectVersion("17".into()))
            .expect("replace refused"),
        Conditional::Refused
    );
    let starts: Vec<String> = log
        .lock()
        .expect("log")
        .iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.target.clone())
        .collect();
    assert_eq!(starts.len(), 3, "{starts:?}");
    assert!(starts[..2]
        .iter()
        .all(|t| t.contains("uploadType=resumable") && t.ends_with("&ifGenerationMatch=0")));
    assert!(starts[2].ends_with("&ifGenerationMatch=17"), "{starts:?}");
}

/// A multipart upload that reached fake-gcs-server but whose answer was lost: the retry's 412
/// meets our own object, which counts as written.
#[test]
fn a_retry_that_meets_its_own_write_counts_as_written() {
    let b = TestBucket::new("condretry");
    // Lost: the answers of the first and the third multipart upload.
    let uploads = AtomicU32::new(0);
    let proxy = crate::repository::storage::s3::lossy_proxy::start("127.0.0.1:4443", move |line| {
        line.starts_with("POST ")
            && line.contains("uploadType=multipart")
            && [0, 2].contains(&uploads.fetch_add(1, Ordering::SeqCst))
    });
    let mut o = emulator_options(&b.0);
    o.endpoint = Some(proxy.url.clone());
    let s = GcsBackend::new(o).expect("open");
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
}

#[test]
fn listing_follows_page_tokens() {
    let (url, log) = serve(|seen| {
        if seen.path() != "/storage/v1/b/bkt/o" {
            return reply(404, "{}");
        }
        if !seen.target.contains("prefix=") {
            return reply(200, r#"{"kind":"storage#objects"}"#);
        }
        if seen.target.contains("pageToken=t%2F1%2Bx") {
            reply(200, r#"{"items":[{"name":"p q/c"},{"name":"p q/a//bad"}]}"#)
        } else {
            reply(
                200,
                r#"{"items":[{"name":"p q/b"},{"name":"p q/a"}],"nextPageToken":"t/1+x"}"#,
            )
        }
    });
    let s = GcsBackend::new(listener_options("bkt", &url, Credentials::Anonymous)).expect("open");
    assert_eq!(s.list("p q/").expect("list"), ["p q/a", "p q/b", "p q/c"]);
    let targets: Vec<String> = log
        .lock()
        .expect("log")
        .iter()
        .map(|r| r.target.clone())
        .collect();
    assert!(targets[1].contains("&prefix=p%20q%2F"), "{targets:?}");
    assert!(targets[2].contains("&pageToken=t%2F1%2Bx"), "{targets:?}");
}
