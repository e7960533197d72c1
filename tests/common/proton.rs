//! Qpid Proton, the AMQP 1.0 client that is not ours (Debian's python3-qpid-proton, run by
//! `/usr/bin/python3`): the scripts of `tests/amqp10_support/` against the broker under test.

use super::broker;
use std::process::Command;

/// Runs `tests/amqp10_support/{script} {args[0]} amqp://guest:guest@127.0.0.1:{port}
/// {args[1..]}` and returns its stdout's lines; panics with its stderr when it fails.
pub fn run_script(script: &str, args: &[&str]) -> Vec<String> {
    let path = format!(
        "{}/tests/amqp10_support/{script}",
        env!("CARGO_MANIFEST_DIR")
    );
    let base = format!("amqp://guest:guest@127.0.0.1:{}", broker().amqp_port);
    let out = Command::new("/usr/bin/python3")
        .arg(&path)
        .arg(args[0])
        .arg(&base)
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    assert!(
        out.status.success(),
        "{script} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(String::from)
        .collect()
}

/// [`run_script`] of `proton_oracle.py` (publish, receive).
pub fn proton(args: &[&str]) -> Vec<String> {
    run_script("proton_oracle.py", args)
}
