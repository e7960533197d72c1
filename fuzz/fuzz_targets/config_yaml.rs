//! Configuration files: `Config::from_yaml_str` (YAML parse, `${ENV}` interpolation,
//! validation), then `Config::validate` and `Config::check_supported` again on what it
//! accepted.
//!
//! Invariants beyond "no panic": errors are `Serialization error:` (YAML and schema) or
//! `Configuration error:` (interpolation and validation); a configuration that loads
//! validates again (validation is a pure check); its `Debug` form, what a log would show, is
//! the same whatever its secrets (passwords, keys, tokens) hold.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmq_backup::config::{Config, Secret, StorageConfig};
use rmq_backup::Error;

/// `config` with every `Secret` replaced by another value.
fn other_secrets(config: &Config) -> Config {
    let mut c = config.clone();
    let other = |s: &mut Secret| *s = Secret::new(format!("other-{}", s.expose()));
    let other_opt = |s: &mut Option<Secret>| {
        if let Some(s) = s {
            *s = Secret::new(format!("other-{}", s.expose()));
        }
    };
    if let Some(src) = c.source.as_mut() {
        other(&mut src.management_password);
    }
    if let Some(t) = c.target.as_mut() {
        other_opt(&mut t.management_password);
    }
    match &mut c.storage {
        StorageConfig::S3(s) => {
            other_opt(&mut s.access_key);
            other_opt(&mut s.secret_key);
        }
        StorageConfig::Azure(a) => {
            other_opt(&mut a.account_key);
            other_opt(&mut a.client_secret);
            other_opt(&mut a.sas_token);
        }
        _ => {}
    }
    c
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_yaml_str(text) {
        Ok(config) => {
            config
                .validate()
                .unwrap_or_else(|e| panic!("a loaded configuration fails validation: {e}"));
            if let Err(e) = config.check_supported() {
                assert!(matches!(e, Error::Config(_)), "{e:?}");
            }
            assert_eq!(
                format!("{config:?}"),
                format!("{:?}", other_secrets(&config)),
                "Debug shows a secret"
            );
        }
        Err(e) => {
            assert!(
                matches!(e, Error::Serialization(_) | Error::Config(_)),
                "{e:?}"
            );
        }
    }
});
