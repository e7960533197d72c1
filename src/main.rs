//! The `rmq-backup` binary: see `rmq-backup --help` and README.md.

/// The static (musl) binary allocates with mimalloc: musl's malloc costs up to 70% more CPU
/// per message (see Cargo.toml and docs/install.md "Building and installing").
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    rmq_backup::install_tls_provider();
    std::process::exit(rmq_backup::cli::main());
}
