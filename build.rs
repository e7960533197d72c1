//! Build script: records the git commit the binary is built from (`rmq-backup --version`).
//! Outside a git checkout (a source tarball), or without git, the commit reads `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    // --no-optional-locks: `git status` must not refresh and rewrite the index, which this
    // script watches: on a fresh checkout that write made the next cargo command build the
    // crate again (each test group of scripts/test.sh did, 2 minutes apiece).
    let out = Command::new("git")
        .arg("--no-optional-locks")
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    let commit = if dirty {
        format!("{commit}-modified")
    } else {
        commit
    };
    println!("cargo:rustc-env=RMQ_BACKUP_GIT_COMMIT={commit}");
    // A new commit moves HEAD or the branch it points to. In a worktree HEAD and the index
    // are in its own git directory, the branches in the common one; a path that does not
    // exist would rebuild the crate every time, so only those that do are watched.
    let dir = git(&["rev-parse", "--git-dir"]);
    let common = git(&["rev-parse", "--git-common-dir"]);
    let watched = [
        (&dir, "HEAD"),
        (&dir, "index"),
        (&common, "refs/heads"),
        (&common, "packed-refs"),
    ];
    for (base, name) in watched {
        if let Some(base) = base {
            let path = std::path::Path::new(base).join(name);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    if dir.is_none() {
        println!("cargo:rerun-if-changed=build.rs");
    }
}
