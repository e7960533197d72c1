//! Storage URLs of `list`, `describe` and `validate --path` (`storage::parse_storage_url`).
//!
//! Each input is parsed as it is and again with credentials written into it (`user:PASSWORD@`
//! after its `://`, and as `?secret_key=PASSWORD` parameters).
//!
//! Invariants beyond "no panic": errors are `Configuration error: Invalid storage URL:` or
//! `Configuration error: Unknown storage scheme:`; a parsed URL prints (`Display`); no error
//! message and no parsed URL ever shows a password written into the URL.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmq_backup::repository::storage::parse_storage_url;
use rmq_backup::Error;

const PASSWORD: &str = "Pa55w0rdXYZZY";

fn parse(url: &str, secret: bool) {
    match parse_storage_url(url) {
        Ok(u) => {
            let shown = format!("{u} {u:?}");
            if secret {
                assert!(!shown.contains(PASSWORD), "{url:?} parsed to {shown}");
            }
        }
        Err(e) => {
            assert!(matches!(e, Error::Config(_)), "{e:?}");
            let text = e.to_string();
            assert!(
                text.starts_with("Configuration error: Invalid storage URL: ")
                    || text.starts_with("Configuration error: Unknown storage scheme: "),
                "{text}"
            );
            if secret {
                assert!(!text.contains(PASSWORD), "{url:?} gave {text}");
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(url) = std::str::from_utf8(data) else {
        return;
    };
    parse(url, false);
    if url.contains(PASSWORD) {
        return;
    }
    if let Some(at) = url.find("://") {
        let (scheme, rest) = url.split_at(at + 3);
        parse(&format!("{scheme}user:{PASSWORD}@{rest}"), true);
        let sep = if url.contains('?') { '&' } else { '?' };
        parse(&format!("{url}{sep}secret_key={PASSWORD}"), true);
    }
});
