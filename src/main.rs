//! The `rmq-backup` binary: see `rmq-backup --help` and README.md.

fn main() {
    std::process::exit(rmq_backup::cli::main());
}
