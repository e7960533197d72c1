#!/usr/bin/env bash
# The book: renders docs/ (book.toml) into target/book with mdBook, installing mdBook 0.5.4 from
# crates.io into .tools/mdbook first when it is missing (without its `serve` and `watch`
# features: only `build` is used), as a debug build: it renders this book in about a second,
# and its build took 1m20s here (2 cores, quiet) where the release build took 11 minutes of a
# fresh CI machine (beside the tests' build). The links inside the book are checked by
# tests/docs_links.rs; this script fails when mdBook cannot build the book (a chapter named in
# docs/SUMMARY.md that is missing, an include that names no file).
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.5.4
mdbook=.tools/mdbook/bin/mdbook
if ! [[ -x $mdbook ]] || [[ $("$mdbook" --version) != "mdbook v$version" ]]; then
    echo "build-docs: installing mdbook $version into .tools/mdbook (cargo install)" >&2
    cargo install mdbook --version "$version" --locked --no-default-features --debug \
        --root .tools/mdbook --target-dir target/mdbook-build >&2
    rm -rf target/mdbook-build
fi
out=$("$mdbook" build 2>&1) || { echo "$out" >&2; exit 1; }
# mdBook reports a broken include as a WARN and exits 0: any warning or error fails the build.
if grep -qE "ERROR|WARN" <<<"$out"; then
    echo "$out" >&2
    exit 1
fi
echo "build-docs: the book is in target/book/index.html"
