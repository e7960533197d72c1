//! The pure parts of `crate::broker::tls`: which connections use TLS, what a TLS record looks like,
//! and the words of each failure. Handshakes are tested against real brokers in tests/tls*.rs.

use super::*;
use rustls::{AlertDescription as A, CertificateError as C, Error as E};

/// A CA certificate (scripts/setup-rabbitmq-tls.sh's test CA; public, no key).
const CA_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBnjCCAUWgAwIBAgIULgtgrLwWPc2dA5ZbezOca9+NjnswCgYIKoZIzj0EAwIw
HTEbMBkGA1UEAwwScm1xLWJhY2t1cCB0ZXN0IGNhMB4XDTI2MTEyNTAyMTk1M1oX
DTM2MTEyMjAyMTk1M1owHTEbMBkGA1UEAwwScm1xLWJhY2t1cCB0ZXN0IGNhMFkw
EwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEmjbzpX2J0Jq5RiIoSJiw28t9la+LUA8L
RM6JCuSMbzJXhZBwLXbwDAM4pXorqVQ6fUo13XCBm+XKmZ3aObKGEKNjMGEwHQYD
VR0OBBYEFDzcg8kAAaUN3KoKJMJD8ZFuX0W0MB8GA1UdIwQYMBaAFDzcg8kAAaUN
3KoKJMJD8ZFuX0W0MA8GA1UdEwEB/wQFMAMBAf8wDgYDVR0PAQH/BAQDAgEGMAoG
CCqGSM49BAMCA0cAMEQCIGB4XAV3cWonoaKFMsRX4A7DFbgV8+0E3QE70xG1Eapx
AiA+u2t+dBaEHAIR75AACfuQTKyjZUv63DkQphJErvzV0A==
-----END CERTIFICATE-----
";

/// A `tls` section with the CA above, written to a file of its own.
fn with_ca(enabled: bool) -> (TlsConfig, PathBuf) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let path = std::env::temp_dir().join(format!(
        "rmqb-tls-unit-{}-{}.pem",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::write(&path, CA_PEM).expect("write CA");
    let cfg = TlsConfig {
        enabled,
        ca_cert: Some(path.clone()),
        ..Default::default()
    };
    (cfg, path)
}

use std::path::PathBuf;

#[test]
fn resolve_decides_which_connections_use_tls() {
    // Plain AMQP and http management: nothing is loaded.
    let r = resolve(
        &"amqp://u:p@h/v".into(),
        Some(&"http://h:15672".into()),
        None,
        "source.tls",
    )
    .expect("resolve");
    assert!(
        !r.urls[0].tls && r.urls[0].port == 5672 && r.broker.is_none() && r.management.is_none()
    );
    // amqps: TLS on 5671, even with enabled: false; the http management stays plain.
    let (cfg, path) = with_ca(false);
    let r = resolve(
        &"amqps://u:p@h/v".into(),
        Some(&"http://h".into()),
        Some(&cfg),
        "source.tls",
    )
    .expect("resolve");
    assert!(
        r.urls[0].tls && r.urls[0].port == 5671 && r.broker.is_some() && r.management.is_none()
    );
    // enabled turns amqp:// into TLS: default port 5671, a given port kept.
    let cfg = TlsConfig {
        enabled: true,
        ..cfg
    };
    let r = resolve(&"AMQP://u:p@h/v".into(), None, Some(&cfg), "source.tls").expect("resolve");
    assert!(
        r.urls[0].tls && r.urls[0].port == 5671 && r.urls[0].host == "h" && r.urls[0].vhost == "v"
    );
    let r = resolve(
        &" amqp://u:p@h:5699/v".into(),
        None,
        Some(&cfg),
        "source.tls",
    )
    .expect("resolve");
    assert!(r.urls[0].tls && r.urls[0].port == 5699);
    // https management alone: TLS for it, not for the AMQP and stream connections.
    let cfg = TlsConfig {
        enabled: false,
        ..cfg
    };
    let r = resolve(
        &"amqp://h".into(),
        Some(&"HTTPS://h:15671".into()),
        Some(&cfg),
        "x.tls",
    )
    .expect("resolve");
    assert!(!r.urls[0].tls && r.broker.is_none());
    let tls = r
        .management
        .expect("TLS settings for an https management URL");
    assert_eq!(tls.context().field, "x.tls");
    assert!(
        tls.context().trust.starts_with("x.tls.ca_cert ("),
        "{:?}",
        tls.context()
    );
    assert!(!tls.context().client_cert);
    // Certificate files that nothing would use are refused, not ignored.
    let e = resolve(
        &"amqp://h".into(),
        Some(&"http://h".into()),
        Some(&cfg),
        "source.tls",
    )
    .err()
    .expect("unused TLS files");
    assert_eq!(e.exit_code(), 2);
    assert_eq!(
        e.to_string(),
        "Configuration error: source.tls sets ca_cert but no connection uses TLS (an amqp:// URL, source.tls.enabled false, an http:// management URL): use amqps:// or set source.tls.enabled: true, or remove the files"
    );
    // enabled: false without files is no TLS, and no error.
    let off = TlsConfig::default();
    assert!(resolve(&"amqp://h".into(), None, Some(&off), "source.tls").is_ok());
    let _ = std::fs::remove_file(path);
}

#[test]
fn resolve_reports_bad_settings_as_configuration_errors() {
    let cfg = TlsConfig {
        enabled: true,
        ca_cert: Some("/nonexistent/ca.pem".into()),
        ..Default::default()
    };
    let e = resolve(&"amqp://h".into(), None, Some(&cfg), "target.tls")
        .err()
        .expect("bad TLS settings");
    assert_eq!(e.exit_code(), 2);
    assert!(
        e.to_string().starts_with(
            "Configuration error: target.tls.ca_cert: cannot read /nonexistent/ca.pem: "
        ),
        "{e}"
    );
    let (mut cfg, path) = with_ca(true);
    cfg.client_cert = Some(path.clone());
    let e = TlsClient::load(Some(&cfg), "source.tls").expect_err("bad TLS settings");
    assert_eq!(
        e.to_string(),
        "Configuration error: source.tls.client_cert and source.tls.client_key must be given together"
    );
    cfg.client_key = Some(path.clone());
    let e = TlsClient::load(Some(&cfg), "source.tls").expect_err("bad TLS settings");
    assert!(
        e.to_string()
            .contains("source.tls.client_key: no private key"),
        "{e}"
    );
    std::fs::write(
        &path,
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n",
    )
    .expect("write the test PEM file");
    cfg.client_cert = None;
    cfg.client_key = None;
    let e = TlsClient::load(Some(&cfg), "source.tls").expect_err("bad TLS settings");
    assert!(
        e.to_string().contains("no certificate (BEGIN CERTIFICATE)"),
        "{e}"
    );
    let (mut cfg2, cert) = with_ca(true);
    cfg2.client_cert = Some(cert.clone());
    cfg2.client_key = Some(path.clone());
    let e = TlsClient::load(Some(&cfg2), "source.tls").expect_err("bad TLS settings");
    assert!(
        e.to_string().contains("is encrypted with a passphrase"),
        "{e}"
    );
    std::fs::write(
        &path,
        "-----BEGIN CERTIFICATE-----\nnot base64 ***\n-----END CERTIFICATE-----\n",
    )
    .expect("write the test PEM file");
    let e = TlsClient::load(
        Some(&TlsConfig {
            ca_cert: Some(path.clone()),
            ..Default::default()
        }),
        "source.tls",
    )
    .expect_err("bad TLS settings");
    assert!(
        e.to_string()
            .contains("is not a valid PEM file: a block is not valid base64"),
        "{e}"
    );
    assert!(!e.to_string().contains("***"));
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(cert);
}

#[test]
fn tls_records_are_recognised() {
    assert!(looks_like_tls(&[0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x0a]));
    assert!(looks_like_tls(&[0x16, 0x03, 0x03]));
    assert!(!looks_like_tls(b"AMQP\x00\x00\x09\x01"));
    assert!(!looks_like_tls(&[0x00, 0x00, 0x00, 0x10]));
    assert!(!looks_like_tls(&[0x15]));
    assert!(!looks_like_tls(&[]));
}

#[test]
fn each_failure_has_its_words() {
    let ctx = |client_cert| Context {
        trust: "source.tls.ca_cert (/ca.pem)".into(),
        field: "source.tls".into(),
        client_cert,
    };
    let cases: Vec<(E, bool, &str)> = vec![
        (
            E::InvalidCertificate(C::UnknownIssuer),
            false,
            "the broker's certificate is not signed by a CA in source.tls.ca_cert (/ca.pem)",
        ),
        (
            E::InvalidCertificate(C::NotValidForName),
            false,
            "the broker's certificate is not valid for the host name of the URL",
        ),
        (E::InvalidCertificate(C::Expired), false, "the broker's certificate expired"),
        (E::InvalidCertificate(C::Revoked), false, "the broker's certificate was refused: "),
        (
            E::AlertReceived(A::CertificateRequired),
            false,
            "the broker requires a client certificate: set source.tls.client_cert and source.tls.client_key",
        ),
        (E::AlertReceived(A::HandshakeFailure), false, "it may require a client certificate"),
        (
            E::AlertReceived(A::CertificateExpired),
            true,
            "the broker refused our client certificate (alert CertificateExpired)",
        ),
        (E::AlertReceived(A::UnknownCA), true, "the broker refused our client certificate"),
        (E::AlertReceived(A::InternalError), true, "ended the handshake with alert InternalError"),
        (
            E::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
            false,
            "does not speak TLS on this port",
        ),
    ];
    for (e, client_cert, want) in cases {
        let got = ctx(client_cert).describe(&e);
        assert!(got.contains(want), "{e:?}: {got}");
    }
    assert!(ctx(true)
        .closed_early()
        .contains("refused our client certificate"));
    assert!(ctx(false)
        .closed_early()
        .contains("set source.tls.client_cert and source.tls.client_key"));
}

#[test]
fn the_x509_version_is_read_from_the_certificate() {
    // SEQUENCE { SEQUENCE { [0] { INTEGER 2 }, INTEGER 5 } }: v3.
    let v3 = [
        0x30, 0x09, 0x30, 0x07, 0xa0, 0x03, 0x02, 0x01, 0x02, 0x02, 0x01,
    ];
    assert_eq!(super::x509_version(&[&v3[..], &[5]].concat()), Some(3));
    // No version field: v1. Long-form lengths are read too.
    let v1 = [0x30, 0x81, 0x05, 0x30, 0x03, 0x02, 0x01, 0x05];
    assert_eq!(super::x509_version(&v1), Some(1));
    // Not a certificate.
    assert_eq!(super::x509_version(&[0x02, 0x01, 0x00]), None);
    assert_eq!(super::x509_version(&[]), None);
    assert_eq!(
        super::x509_version(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]),
        None
    );
}
