//! Backup throughput per storage backend (issue #3): the same queue of N x S-byte messages backed
//! up to the filesystem, S3 (SeaweedFS), Azure Blob (Azurite) and GCS (fake-gcs-server), each
//! beside a raw read of the same queue in the same run. Start the emulators first
//! (`scripts/setup-storage.sh`); run with `scripts/bench.sh storage` (release build).
//!
//! ```text
//! storage_bench <path to rmq-backup> [messages=100000] [body bytes=1024] [random|text]
//! ```
//!
//! Each backend runs three rounds, a raw read (to the queue whole again) before each backup;
//! medians are printed.

mod bench_common;

use bench_common::*;
use rmq_backup::broker::management::ManagementClient;
use std::time::Duration;

const ROUNDS: usize = 3;
const S3_ENDPOINT: &str = "http://127.0.0.1:8333";
const S3_ADMIN: (&str, &str) = ("rmqbackup-admin", "rmqbackup-admin-secret");
const AZ_ENDPOINT: &str = "http://127.0.0.1:10000/devstoreaccount1";
const AZ_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
const GCS_ENDPOINT: &str = "http://127.0.0.1:4443";

/// Creates the bucket or container `name` on each emulator.
fn create_buckets(name: &str) {
    let creds = s3::creds::Credentials::new(Some(S3_ADMIN.0), Some(S3_ADMIN.1), None, None, None)
        .expect("credentials");
    let region = s3::Region::Custom {
        region: "us-east-1".into(),
        endpoint: S3_ENDPOINT.into(),
    };
    s3::Bucket::create_with_path_style(name, region, creds, s3::BucketConfiguration::default())
        .expect("S3 bucket (scripts/setup-storage.sh)");
    let cfg = rmq_backup::config::AzureStorage {
        account_name: "devstoreaccount1".into(),
        container_name: name.into(),
        account_key: Some(rmq_backup::config::Secret::new(AZ_KEY)),
        prefix: None,
        endpoint: Some(AZ_ENDPOINT.into()),
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
    let opts = rmq_backup::repository::storage::azure::AzureOptions::from_config(&cfg, &|_| None)
        .expect("azure options");
    rmq_backup::repository::storage::azure::AzureBlobStorage::new(opts)
        .and_then(|s| s.create_container())
        .expect("Azure container");
    ureq::post(&format!("{GCS_ENDPOINT}/storage/v1/b?project=bench"))
        .send_json(serde_json::json!({ "name": name }))
        .expect("GCS bucket");
}

fn main() {
    rmq_backup::install_tls_provider();
    let a = Args::parse();
    let (bin, n, size, kind) = (a.bin.clone(), a.n, a.size, a.kind());
    let mgmt = ManagementClient::new(MGMT, "guest", "guest", None).expect("management");
    let src = "rmqb-storage-bench";
    fresh_vhost(&mgmt, src);
    let work = std::env::temp_dir().join(format!("rmqb-storage-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("work dir");
    let bucket = format!("rmqb-bench-{}", std::process::id());
    create_buckets(&bucket);
    let conn = seed(src, &a, &Messages::generate(n, a.size, a.text));

    type Backend<'a> = (&'a str, String, Vec<(&'a str, &'a str)>);
    let backends: [Backend; 4] = [
        (
            "filesystem",
            format!("  backend: filesystem\n  path: \"{}\"\n", work.join("fs").display()),
            vec![],
        ),
        (
            "s3 (SeaweedFS)",
            format!("  backend: s3\n  bucket: {bucket}\n  endpoint: \"{S3_ENDPOINT}\"\n  path_style: true\n  allow_http: true\n  access_key: {}\n  secret_key: {}\n", S3_ADMIN.0, S3_ADMIN.1),
            vec![],
        ),
        (
            "azure (Azurite)",
            format!("  backend: azure\n  account_name: devstoreaccount1\n  container_name: {bucket}\n  endpoint: \"{AZ_ENDPOINT}\"\n  account_key: \"{AZ_KEY}\"\n"),
            vec![],
        ),
        (
            "gcs (fake-gcs-server)",
            format!("  backend: gcs\n  bucket: {bucket}\n"),
            vec![("STORAGE_EMULATOR_HOST", GCS_ENDPOINT)],
        ),
    ];
    let mut rows = Vec::new();
    for (name, storage, env) in &backends {
        let (mut raws, mut backups, mut cpu, mut rss) = (Vec::new(), Vec::new(), Vec::new(), 0);
        for round in 0..ROUNDS {
            std::thread::sleep(Duration::from_secs(1));
            raws.push(rate(n, raw_read(&conn, "bench", n).whole));
            std::thread::sleep(Duration::from_secs(1));
            let cfg = work.join("backup.yaml");
            std::fs::write(
                &cfg,
                format!(
                    "mode: backup\nbackup_id: bench-{round}-{}\nsource:\n  amqp_url: \"{AMQP}/{src}\"\n  management_url: \"{MGMT}\"\n  management_username: guest\n  management_password: guest\n  queues:\n    vhosts: [\"{src}\"]\nstorage:\n{storage}backup:\n  compression: zstd\n  compression_level: 3\n  include_definitions: false\n",
                    name.split(' ').next().unwrap_or(name)
                ),
            )
            .expect("config");
            let run = run_tool_measured(&bin, &["backup", "--config", cfg.to_str().unwrap()], env);
            backups.push(rate(n, run.wall));
            cpu.push(run.cpu_secs * 100_000.0 / n as f64);
            rss = rss.max(run.peak_kib);
            println!(
                "{name} round {}: raw read {:.0} msg/s, backup {:.0} msg/s",
                round + 1,
                raws[round],
                backups[round]
            );
        }
        rows.push((name, median(raws), median(backups), median(cpu), rss));
    }
    drop(conn);
    println!();
    println!("{n} x {size} B {kind} bodies, classic queue, zstd-3; medians of {ROUNDS} rounds");
    println!("raw read: the raw client's read to the queue whole again (every message read and given back)");
    println!(
        "{:<24} {:>14} {:>14} {:>16} {:>11} {:>14}",
        "backend",
        "raw read msg/s",
        "backup msg/s",
        "backup/raw read",
        "CPU-s/100k",
        "peak RSS KiB"
    );
    for (name, raw, backup, cpu, rss) in rows {
        println!(
            "{name:<24} {raw:>14.0} {backup:>14.0} {:>16.2} {cpu:>11.2} {rss:>14}",
            backup / raw
        );
    }
    let _ = mgmt.delete_vhost(src);
    let _ = std::fs::remove_dir_all(&work);
}
