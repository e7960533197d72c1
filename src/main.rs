//! The `rmq-backup` binary: see `rmq-backup --help` and README.md.

fn main() {
    rmq_backup::install_tls_provider();
    std::process::exit(rmq_backup::cli::main());
}
