//! TLS failures give one clear line, exit 1 or 2, print no secret, and never hang (issue 15,
//! "Clear errors"): against the TLS nodes of `scripts/setup-rabbitmq-tls.sh` (see tests/tls.rs),
//! the plain main broker, and an `openssl s_server` presenting an expired certificate.

mod common;
mod tls_support;

use common::*;
use rmq_backup::broker::amqp::{AmqpUrl, ConnectOptions, Connection};
use rmq_backup::broker::management::ManagementClient;
use rmq_backup::broker::stream::{StreamConnection, StreamOptions};
use rmq_backup::broker::tls::TlsClient;
use rmq_backup::config::TlsConfig;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tls_support::{file, settings, tls_client};

/// The error of opening an AMQP connection to `url` with `tls`.
fn amqp_error(url: &str, tls: Option<&TlsConfig>) -> String {
    let mut o = ConnectOptions::new(AmqpUrl::parse(url).expect("url"));
    o.connect_timeout = Duration::from_secs(5);
    o.rpc_timeout = Duration::from_secs(5);
    o.tls = tls.map(tls_client);
    match Connection::open(&o) {
        Ok(_) => panic!("{url}: connected, but an error was expected"),
        Err(e) => e.to_string(),
    }
}

/// The error of opening a stream connection to localhost:`port` with `tls`.
fn stream_error(port: u16, tls: Option<&TlsConfig>) -> String {
    let url = AmqpUrl::parse("amqp://guest:guest@localhost/").expect("url");
    let mut o = StreamOptions::from_amqp_url(&url, port);
    o.connect_timeout = Duration::from_secs(5);
    o.rpc_timeout = Duration::from_secs(5);
    o.tls = tls.map(tls_client);
    match StreamConnection::open(&o) {
        Ok(_) => panic!("stream port {port}: connected, but an error was expected"),
        Err(e) => e.to_string(),
    }
}

fn assert_has(message: &str, parts: &[&str]) {
    println!("{message}");
    for p in parts {
        assert!(message.contains(p), "{p:?} missing from: {message}");
    }
    assert!(!message.contains('\n'), "one line expected: {message}");
    assert!(
        !message.contains("guest:guest"),
        "a password was printed: {message}"
    );
}

#[test]
fn a_wrong_ca_is_named() {
    let e = amqp_error(
        "amqps://guest:guest@localhost:5671/",
        Some(&settings("other-ca.pem", None)),
    );
    assert_has(
        &e,
        &[
            "Connection error: ",
            "TLS handshake with localhost:5671 failed: ",
            "not signed by a CA in source.tls.ca_cert (",
            "other-ca.pem",
        ],
    );
}

#[test]
fn a_host_name_the_certificate_does_not_hold_is_refused() {
    let e = amqp_error(
        "amqps://guest:guest@127.0.0.1:5671/",
        Some(&settings("ca.pem", None)),
    );
    assert_has(
        &e,
        &[
            "TLS handshake with 127.0.0.1:5671 failed: ",
            "certificate not valid for name \"127.0.0.1\"",
            "localhost",
        ],
    );
}

/// An `openssl s_server` on a free local port presenting `cert` (key server.key); killed on
/// drop.
struct OpensslServer(Child, u16);

impl OpensslServer {
    fn start(cert: &str) -> OpensslServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let child = Command::new("openssl")
            .args(["s_server", "-quiet", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(file(cert))
            .arg("-key")
            .arg(file("server.key"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl s_server (scripts/setup-rabbitmq-tls.sh installs openssl)");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "s_server did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        OpensslServer(child, port)
    }
}

impl Drop for OpensslServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn an_expired_server_certificate_is_refused() {
    let server = OpensslServer::start("server-expired.pem");
    let e = amqp_error(
        &format!("amqps://guest:guest@localhost:{}/", server.1),
        Some(&settings("ca.pem", None)),
    );
    assert_has(
        &e,
        &[
            "TLS handshake with localhost:",
            "the broker's certificate expired",
        ],
    );
}

#[test]
fn a_broker_that_requires_a_client_certificate_says_so() {
    let e = amqp_error(
        "amqps://guest:guest@localhost:5681/",
        Some(&settings("ca.pem", None)),
    );
    assert_has(
        &e,
        &[
            "TLS handshake with localhost:5681 failed: ",
            // The alert (certificate_required) when it arrives before the broker's reset,
            // else the hint.
            "require",
            "a client certificate: set source.tls.client_cert and source.tls.client_key",
        ],
    );
    let e = stream_error(5561, Some(&settings("ca.pem", None)));
    assert_has(&e, &["Connection error: ", "requires a client certificate"]);
}

#[test]
fn an_expired_client_certificate_is_refused_by_the_broker() {
    let e = amqp_error(
        "amqps://guest:guest@localhost:5681/",
        Some(&settings(
            "ca.pem",
            Some(("client-expired.pem", "client.pkcs8.key")),
        )),
    );
    assert_has(
        &e,
        &[
            "TLS handshake with localhost:5681 failed: ",
            "client certificate",
        ],
    );
}

#[test]
fn tls_to_a_plain_port_and_plain_to_a_tls_port() {
    let tls = settings("ca.pem", None);
    let e = amqp_error("amqps://guest:guest@localhost:5672/", Some(&tls));
    assert_has(
        &e,
        &[
            "TLS handshake with localhost:5672 failed: ",
            "does not speak TLS",
        ],
    );
    let e = amqp_error("amqp://guest:guest@localhost:5671/", None);
    assert_has(&e, &["Connection error: ", "TLS port", "amqps://"]);
    let e = stream_error(5552, Some(&tls));
    assert_has(
        &e,
        &["TLS handshake with localhost:5552 failed: ", "non-TLS port"],
    );
    let e = stream_error(5551, None);
    assert_has(&e, &["localhost:5551", "TLS port"]);
    // The management API over https to its plain port.
    let client = tls_client(&tls);
    let m = ManagementClient::new("https://localhost:15672", "guest", "guest", Some(&client))
        .expect("client");
    let e = m.overview().expect_err("https to a plain port").to_string();
    assert_has(
        &e,
        &[
            "Management API error: TLS handshake with https://localhost:15672 failed: ",
            "does not speak TLS",
        ],
    );
}

#[test]
fn bad_files_fail_before_any_connection() {
    let dir = TempDir::new("tls-files");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").expect("write");
    let key = std::fs::read_to_string(file("client.pkcs8.key")).expect("key");
    let cases: Vec<(TlsConfig, Vec<&str>)> = vec![
        (
            TlsConfig {
                ca_cert: Some(dir.path().join("missing-ca.pem")),
                ..Default::default()
            },
            vec![
                "Configuration error: source.tls.ca_cert: cannot read ",
                "missing-ca.pem",
            ],
        ),
        (
            TlsConfig {
                ca_cert: Some(dir.path().to_path_buf()),
                ..Default::default()
            },
            vec!["source.tls.ca_cert: cannot read "],
        ),
        (
            TlsConfig {
                ca_cert: Some(garbage.clone()),
                ..Default::default()
            },
            vec![
                "source.tls.ca_cert: no certificate (BEGIN CERTIFICATE) in ",
                "garbage.pem",
            ],
        ),
        (
            TlsConfig {
                ca_cert: Some(file("ca.pem")),
                client_cert: Some(file("client.pem")),
                client_key: Some(garbage.clone()),
                ..Default::default()
            },
            vec!["source.tls.client_key: no private key", "garbage.pem"],
        ),
        (
            TlsConfig {
                ca_cert: Some(file("ca.pem")),
                client_cert: Some(file("client.pem")),
                client_key: Some(file("client-ec.pkcs8.key")),
                ..Default::default()
            },
            vec![
                "source.tls.client_key (",
                "client-ec.pkcs8.key) does not match the certificate in source.tls.client_cert (",
            ],
        ),
        // Issue 20: a client certificate signed the common way (`openssl x509 -req` without
        // an extension file) is X.509 v1: said in plain words, with how to re-issue it.
        (
            TlsConfig {
                ca_cert: Some(file("ca.pem")),
                client_cert: Some(file("client-v1.pem")),
                client_key: Some(file("client.pkcs8.key")),
                ..Default::default()
            },
            vec![
                "Configuration error: source.tls.client_cert (",
                "client-v1.pem) is an X.509 v1 certificate (what `openssl x509 -req` makes without an extension file), which TLS clients do not accept: re-issue it as v3 with extendedKeyUsage=clientAuth, e.g. `openssl x509 -req",
            ],
        ),
    ];
    // The same key with the v3 certificate is accepted.
    TlsClient::load(
        Some(&TlsConfig {
            ca_cert: Some(file("ca.pem")),
            client_cert: Some(file("client.pem")),
            client_key: Some(file("client.pkcs8.key")),
            ..Default::default()
        }),
        "source.tls",
    )
    .expect("a v3 client certificate");
    for (c, parts) in cases {
        let e = TlsClient::load(Some(&c), "source.tls")
            .expect_err("bad TLS files")
            .to_string();
        assert_has(&e, &parts);
        for line in key.lines().filter(|l| !l.starts_with("-----")) {
            assert!(!e.contains(line), "key material printed: {e}");
        }
    }
}

/// The command line: one line on stderr, exit 2 for a bad file, exit 1 for a refused handshake.
#[test]
fn the_cli_prints_one_line_and_exits_1_or_2() {
    let dir = TempDir::new("tls-cli");
    let run = |name: &str, tls: &str, url: &str| {
        let yaml = format!(
            r#"mode: backup
backup_id: "tls-cli"
source:
  amqp_url: "{url}"
  management_url: "https://localhost:15681"
  management_username: guest
  management_password: "s3cret-pw"
  tls:
{tls}
storage:
  backend: filesystem
  path: "{}"
"#,
            dir.path().join("store").display()
        );
        let cfg = write_config(dir.path(), name, &yaml);
        let out = run_cli(&["backup", "--config", &cfg]);
        let (_, stderr) = text(&out);
        assert!(!stderr.contains("s3cret-pw"), "password printed: {stderr}");
        let last = stderr.lines().last().unwrap_or_default().to_string();
        (out.status.code(), last)
    };
    let (code, line) = run(
        "missing.yaml",
        &format!("    ca_cert: \"{}\"", dir.path().join("nope.pem").display()),
        "amqps://guest:s3cret-pw@localhost:5681/",
    );
    assert_eq!(code, Some(2), "{line}");
    assert!(
        line.starts_with("Configuration error: source.tls.ca_cert: cannot read "),
        "{line}"
    );
    // The management API (https) is the first connection of a backup: without a client
    // certificate the mutual-TLS node refuses it.
    let (code, line) = run(
        "nocert.yaml",
        &format!("    ca_cert: \"{}\"", file("ca.pem").display()),
        "amqps://guest:s3cret-pw@localhost:5681/",
    );
    assert_eq!(code, Some(1), "{line}");
    assert!(
        line.starts_with("Management API error: TLS handshake with https://localhost:15681 failed: the broker requires a client certificate: set source.tls.client_cert and source.tls.client_key"),
        "{line}"
    );
}
