//! The spool directory of a killed process (issue 38, item 7): a copy killed with SIGKILL
//! leaves `rmq-backup-copy-<pid>-<ms>/` with its segments in it, among them the decrypted
//! `copy-N.seg.plain` of a re-encrypting copy; the next job that creates a spool directory in
//! the same place removes it (`src/repository/spool.rs`, `remove_stale`).

mod common;

use common::http_proxy::{Fault, HttpProxy};
use common::*;
use rmq_backup::broker::amqp::FieldTable;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn identity(dir: &Path, name: &str, secret: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("{secret}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.display().to_string()
}

/// The entries of `dir` (names), sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn the_spool_of_a_killed_copy_is_removed_by_the_next_run() {
    let vh = TestVhost::new("spool-kill");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "orders", "classic", FieldTable::new());
    publish(&ch, "orders", &diverse_messages(60, 38, false));
    let dir = TempDir::new("spool-kill");
    let (secret_a, public_a) = rmq_backup::repository::encryption::generate();
    let (_, public_b) = rmq_backup::repository::encryption::generate();
    let id_a = identity(dir.path(), "a.txt", &secret_a);
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(
            "sk",
            &vh.name,
            &store,
            &format!(
                "  segment_max_bytes: 4000\n  encryption:\n    recipients: [\"{public_a}\"]\n"
            ),
        ),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let fs_url = format!("file://{}", store.display());

    let spool = dir.path().join("spool");
    std::fs::create_dir(&spool).unwrap();
    let spool_env = spool.display().to_string();
    let bucket = S3Bucket::new("spoolkill");
    let proxy = HttpProxy::start("127.0.0.1:8333");
    let env = [
        ("AWS_ACCESS_KEY_ID", S3_ADMIN.0),
        ("AWS_SECRET_ACCESS_KEY", S3_ADMIN.1),
        ("RMQ_BACKUP_SPOOL_DIR", spool_env.as_str()),
    ];
    let s3_at = |endpoint: &str| {
        format!(
            "s3://{}/offsite?region=us-east-1&endpoint={endpoint}&path_style=true&allow_http=true",
            bucket.name()
        )
    };
    // The second segment upload is held back: the copy is killed while it waits, its
    // segment decrypted and sealed again in the spool.
    let seen = Arc::new(AtomicU32::new(0));
    let counter = seen.clone();
    proxy.inject(1, Fault::Delay(Duration::from_secs(600)), move |line| {
        line.starts_with("PUT ")
            && line.contains("/segment-")
            && counter.fetch_add(1, Ordering::SeqCst) == 1
    });
    let copy = |to: &str| {
        vec![
            "copy".to_string(),
            "--from".into(),
            fs_url.clone(),
            "--to".into(),
            to.to_string(),
            "--recipient".into(),
            public_b.clone(),
            "--identity-file".into(),
            id_a.clone(),
        ]
    };
    let args = copy(&s3_at(&proxy.url));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (mut child, _lines) = spawn_cli(&args, &env);
    while proxy.faults() == 0 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the copy ended before the held upload"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = child.id();
    child.kill().unwrap();
    child.wait().unwrap();
    let prefix = format!("rmq-backup-copy-{pid}-");
    let left: Vec<String> = names(&spool)
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert_eq!(left.len(), 1, "the killed copy's spool directory: {left:?}");
    let files = names(&spool.join(&left[0]));
    println!("left by the killed copy: {}/{files:?}", left[0]);
    assert!(
        files.iter().any(|f| f.ends_with(".seg.plain")),
        "a decrypted segment among {files:?}"
    );

    proxy.clear();
    let args = copy(&s3_at(S3_ENDPOINT));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_cli_env(&args, &env);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!(
            "removed the spool directory {} of process {pid}, no longer running",
            spool.join(&left[0]).display()
        )),
        "{stderr}"
    );
    assert_eq!(
        names(&spool),
        Vec::<String>::new(),
        "nothing left in the spool"
    );
}
