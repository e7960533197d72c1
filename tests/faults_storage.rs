//! Storage that fails under a backup and a restore (issue "Faults", promise 3), on every
//! object-storage backend, through an HTTP fault proxy in front of its emulator: 503 / SlowDown
//! answers and reset connections are retried (counted in `broker_storage_retries`), in the
//! middle of a multipart upload too; a segment upload that keeps failing fails the backup with
//! an error naming the key and the last status, and leaves nothing that `list` or `validate`
//! calls good; a download cut in its middle is retried.

mod common;

use common::buckets::*;
use common::http_proxy::{Fault, HttpProxy};
use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::config::Config;
use rmq_backup::repository::storage::Storage;
use std::sync::Arc;

/// One backend behind a fault proxy: its `storage:` block, through the proxy and direct.
struct Store {
    name: &'static str,
    proxy: HttpProxy,
    via_proxy: String,
    direct: String,
    _keep: Box<dyn std::any::Any>,
}

fn s3(tag: &str) -> Store {
    let b = S3Bucket::new(tag);
    let proxy = HttpProxy::start("127.0.0.1:8333");
    let block = |endpoint: &str| {
        format!(
            "storage:\n  backend: s3\n  bucket: {}\n  region: us-east-1\n  endpoint: \"{endpoint}\"\n  path_style: true\n  allow_http: true\n  access_key: {}\n  secret_key: {}\n",
            b.name(),
            S3_ADMIN.0,
            S3_ADMIN.1
        )
    };
    Store {
        name: "s3",
        via_proxy: block(&proxy.url),
        direct: block(S3_ENDPOINT),
        proxy,
        _keep: Box::new(b),
    }
}

fn azure(tag: &str) -> Store {
    let c = AzContainer::new(tag);
    let proxy = HttpProxy::start("127.0.0.1:10000");
    let block = |endpoint: &str| {
        format!(
            "storage:\n  backend: azure\n  account_name: {AZ_ACCOUNT}\n  container_name: {}\n  endpoint: \"{endpoint}\"\n  account_key: \"{AZ_KEY}\"\n",
            c.1
        )
    };
    Store {
        name: "azure",
        via_proxy: block(&format!("{}/{AZ_ACCOUNT}", proxy.url)),
        direct: block(AZ_ENDPOINT),
        proxy,
        _keep: Box::new(c),
    }
}

fn gcs(tag: &str) -> Store {
    let b = GcsBucket::new(tag);
    let proxy = HttpProxy::start("127.0.0.1:4443");
    let block = format!("storage:\n  backend: gcs\n  bucket: {}\n", b.0);
    Store {
        name: "gcs",
        via_proxy: block.clone(),
        direct: block,
        proxy,
        _keep: Box::new(b),
    }
}

/// The storage of `store_block`; GCS's endpoint is `endpoint` (the proxy or the emulator).
fn open(store: &Store, via_proxy: bool) -> Arc<dyn Storage> {
    if store.name == "gcs" {
        use rmq_backup::repository::storage::gcs::{Credentials, GcsBackend, GcsOptions};
        let bucket = store
            .direct
            .lines()
            .find_map(|l| l.trim().strip_prefix("bucket: "))
            .unwrap()
            .to_string();
        let mut opts = GcsOptions::new(&bucket, Credentials::Anonymous);
        opts.endpoint = Some(if via_proxy {
            store.proxy.url.clone()
        } else {
            GCS_ENDPOINT.into()
        });
        return Arc::new(GcsBackend::new(opts).expect("fake-gcs-server"));
    }
    let block = if via_proxy {
        &store.via_proxy
    } else {
        &store.direct
    };
    let cfg = Config::from_yaml_str(&format!(
        "mode: backup\nbackup_id: x\nsource:\n  amqp_url: amqp://h\n  management_url: http://h\n  management_username: u\n  management_password: p\n{block}"
    ))
    .expect("config");
    rmq_backup::repository::storage::open_config(&cfg.storage).expect("storage")
}

/// A backup config for `vhost` (its storage is passed to `backup::run` apart).
fn backup_config(id: &str, vhost: &str, extra: &str) -> Config {
    Config::from_yaml_str(&backup_yaml(
        id,
        vhost,
        std::path::Path::new("/unused"),
        extra,
    ))
    .expect("config")
}

/// The value of `broker_storage_retries{backend=..,outcome=..}` in this process.
fn retries(backend: &str, outcome: &str) -> u64 {
    let series = format!("broker_storage_retries{{backend=\"{backend}\",outcome=\"{outcome}\"}} ");
    rmq_backup::metrics::global()
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
        .unwrap_or(0)
}

/// True for a request line that writes a segment (any backend's form of it).
fn segment_write(line: &str) -> bool {
    (line.starts_with("PUT ") || line.starts_with("POST ")) && line.contains("segment-")
}

fn seeded(tag: &str, n: usize, size: usize) -> TestVhost {
    let vh = TestVhost::new(tag);
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    publish_bulk(&ch, "q", n, size);
    vh
}

#[test]
fn transient_failures_are_retried_on_every_backend() {
    let vh = seeded("storage-transient", 3_000, 512);
    for store in [s3("transient"), azure("transient"), gcs("transient")] {
        let p = &store.proxy;
        // Two SlowDown answers to segment writes, one reset, one slow answer.
        p.inject(
            2,
            Fault::Status(
                503,
                "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>".into(),
            ),
            segment_write,
        );
        p.inject(1, Fault::Reset, |l| {
            l.starts_with("PUT ") || l.starts_with("POST ")
        });
        p.inject(1, Fault::Status(500, String::new()), |l| {
            l.starts_with("GET ")
        });
        let before = retries(store.name, "succeeded");
        let id = format!("transient-{}", store.name);
        let s = rmq_backup::backup::run(
            &backup_config(&id, &vh.name, "  segment_max_bytes: 200000\n"),
            open(&store, true),
        )
        .unwrap_or_else(|e| panic!("{}: {e}\n{:?}", store.name, p.log()));
        assert_eq!(s.messages, 3_000, "{}", store.name);
        assert!(p.faults() >= 3, "{}: {:?}", store.name, p.log());
        assert!(
            retries(store.name, "succeeded") >= before + 3,
            "{}: retries counted",
            store.name
        );
        let report = rmq_backup::inspect::validate(open(&store, false).as_ref(), &id, true)
            .expect("validate");
        assert!(
            report.is_valid() && report.completed,
            "{}: {report:?}",
            store.name
        );
    }
}

#[test]
fn a_segment_upload_that_keeps_failing_fails_the_backup_and_leaves_nothing_good() {
    let vh = seeded("storage-down", 500, 256);
    for store in [s3("down"), azure("down"), gcs("down")] {
        let p = &store.proxy;
        p.inject(1000, Fault::Status(503, String::new()), segment_write);
        let id = format!("down-{}", store.name);
        let before = retries(store.name, "failed");
        let e = rmq_backup::backup::run(&backup_config(&id, &vh.name, ""), open(&store, true))
            .expect_err("the segment is never stored")
            .to_string();
        assert!(
            e.starts_with("Storage error: ") && e.contains("segment-0001") && e.contains("503"),
            "{}: {e}",
            store.name
        );
        assert!(retries(store.name, "failed") > before, "{}", store.name);
        let direct = open(&store, false);
        let m = rmq_backup::repository::manifest::Manifest::read(direct.as_ref(), &id)
            .expect("manifest");
        assert!(m.completed_at.is_none(), "{}: never complete", store.name);
        assert!(
            m.queues.iter().all(|q| q.segments.is_empty()),
            "{}",
            store.name
        );
        let list = rmq_backup::inspect::list(direct.as_ref()).expect("list");
        let rendered = list.render(rmq_backup::inspect::Format::Table).unwrap();
        assert!(
            rendered.contains("interrupted"),
            "{}: {rendered}",
            store.name
        );
        // Nothing it tried to store is there as a segment.
        let keys = direct.list(&format!("{id}/queues/")).unwrap();
        assert!(keys.is_empty(), "{}: {keys:?}", store.name);
    }
}

#[test]
fn a_multipart_upload_failing_in_its_middle_is_retried() {
    // ~12 MiB of incompressible bodies in one segment: uploaded in 8 MiB parts / blocks /
    // chunks; the second part fails once.
    let vh = seeded("storage-parts", 12, 1 << 20);
    for store in [s3("parts"), azure("parts"), gcs("parts")] {
        let p = &store.proxy;
        let second_part = |l: &str| {
            l.contains("partNumber=2")
                || (l.contains("comp=block") && !l.contains("blocklist")) && l.contains("blockid=")
                || l.starts_with("PUT /upload/") && l.contains("upload_id")
        };
        p.inject(1, Fault::Status(503, String::new()), second_part);
        let id = format!("parts-{}", store.name);
        let s = rmq_backup::backup::run(
            &backup_config(&id, &vh.name, "  compression: none\n"),
            open(&store, true),
        )
        .unwrap_or_else(|e| panic!("{}: {e}\n{:?}", store.name, p.log()));
        assert_eq!(s.messages, 12);
        assert_eq!(
            p.faults(),
            1,
            "{}: a part failed once: {:?}",
            store.name,
            p.log()
        );
        let report = rmq_backup::inspect::validate(open(&store, false).as_ref(), &id, true)
            .expect("validate");
        assert!(report.is_valid(), "{}: {report:?}", store.name);
    }
}

#[test]
fn a_download_cut_in_its_middle_is_retried_by_the_restore() {
    let vh = seeded("storage-cut", 2_000, 1024);
    for store in [s3("cut"), azure("cut"), gcs("cut")] {
        let id = format!("cut-{}", store.name);
        rmq_backup::backup::run(&backup_config(&id, &vh.name, ""), open(&store, false))
            .expect("backup");
        let p = &store.proxy;
        p.inject(1, Fault::CutBody(50_000), |l| {
            l.starts_with("GET ") && l.contains("segment-0001")
        });
        let target = vh.sibling(&format!("cut-{}", store.name));
        management().create_vhost(&target).unwrap();
        management().set_permissions(&target, "guest").unwrap();
        let cfg = Config::from_yaml_str(&restore_yaml(
            &id,
            std::path::Path::new("/unused"),
            &format!(
                "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{}\": \"{target}\"\n",
                vh.name
            ),
        ))
        .unwrap();
        let s = rmq_backup::restore::run(&cfg, open(&store, true))
            .unwrap_or_else(|e| panic!("{}: {e}\n{:?}", store.name, p.log()));
        assert_eq!(s.published(), 2_000, "{}", store.name);
        assert_eq!(p.faults(), 1, "{}: {:?}", store.name, p.log());
        let conn = connect(&target);
        assert_eq!(
            seqs(&peek(&conn, "q", 2_000)),
            (0..2_000).collect::<Vec<_>>()
        );
        management().delete_vhost(&target).unwrap();
    }
}
