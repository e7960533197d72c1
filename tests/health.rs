//! `/health` answers 503 with the reason once the broker connection is really lost (SPEC.md
//! "Endpoints"): a backup runs in this process with the metrics server up, the broker closes
//! the backup's connection (management API `DELETE /api/connections/{name}`), and the server
//! says so until something recovers. In a binary of its own: the metrics are process-wide.

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::config::{Config, MetricsConfig};
use rmq_backup::metrics::server::MetricsServer;
use std::time::{Duration, Instant};

const AUTH: &str = MANAGEMENT_AUTH;

fn health(addr: &str) -> (u16, String) {
    match ureq::get(&format!("http://{addr}/health")).call() {
        Ok(mut r) => (200, r.body_mut().read_to_string().unwrap_or_default()),
        Err(ureq::Error::StatusCode(code)) => {
            // ureq 3 turns 4xx/5xx into errors; ask again without that to read the body.
            let mut r = ureq::get(&format!("http://{addr}/health"))
                .config()
                .http_status_as_error(false)
                .build()
                .call()
                .expect("health");
            (code, r.body_mut().read_to_string().unwrap_or_default())
        }
        Err(e) => panic!("health: {e}"),
    }
}

#[test]
fn health_is_503_with_the_reason_after_a_real_connection_loss() {
    let vh = TestVhost::new("health");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "slow", "classic", FieldTable::new());
    // Deep enough that basic.get, even at the broker's fast speed (~15,000 msg/s), reads for
    // well over the time the management API takes to list the connection (its stats interval,
    // 5 s): with 30,000 the backup sometimes ended first, and 90,000 (~6 s) left no margin.
    const DEPTH: u32 = 250_000;
    publish_bulk(&ch, "slow", DEPTH as usize, 32);
    let dir = TempDir::new("health");
    let store = dir.path().join("store");
    let cfg = Config::from_yaml_str(&backup_yaml(
        "h",
        &vh.name,
        &store,
        // No retry: the lost connection ends the run (a retried one would read it again).
        "  requeue_strategy: get\n  connection_retries: 0\n",
    ))
    .unwrap();
    let server = MetricsServer::start(&MetricsConfig {
        port: 0,
        bind_address: "127.0.0.1".into(),
        ..Default::default()
    })
    .unwrap();
    let addr = server.local_addr().to_string();
    assert_eq!(health(&addr).0, 200);

    let storage = rmq_backup::repository::storage::open_config(&cfg.storage).unwrap();
    let run = std::thread::spawn(move || rmq_backup::backup::run(&cfg, storage));
    // The broker closes the backup's connection while it reads.
    let prefix = format!("rmq-backup h {} ", vh.name);
    // The management API lists a connection within its stats interval; under the load of
    // the whole suite that has taken more than 30 s.
    let deadline = Instant::now() + Duration::from_secs(90);
    let name = loop {
        if let Some(n) = connection_names(&prefix).into_iter().next() {
            break n;
        }
        if run.is_finished() {
            let r = run.join().expect("backup thread");
            panic!(
                "the backup ended before its connection was seen: {:?}",
                r.map(|_| ())
            );
        }
        assert!(Instant::now() < deadline, "no connection named {prefix}");
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(300));
    let url = format!(
        "{}/api/connections/{}",
        management_url(),
        rmq_backup::broker::management::encode_segment(&name)
    );
    ureq::delete(&url)
        .header("authorization", AUTH)
        .header("x-reason", "health test")
        .call()
        .expect("close the connection");
    let e = run
        .join()
        .unwrap()
        .expect_err("the backup lost its connection");
    assert!(e.to_string().contains("CONNECTION_FORCED"), "{e}");

    let (code, body) = health(&addr);
    assert_eq!(code, 503, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "error");
    assert!(
        v["reason"].as_str().unwrap().contains("CONNECTION_FORCED"),
        "{body}"
    );
    // A connection opened since recovers it.
    drop(rmq_backup::broker::amqp::Connection::open(
        &rmq_backup::broker::amqp::ConnectOptions::new(
            rmq_backup::broker::amqp::AmqpUrl::parse(&amqp_url(&vh.name)).unwrap(),
        ),
    ));
    assert_eq!(health(&addr).0, 200);
    wait_ready(&ch, "slow", DEPTH);
}
