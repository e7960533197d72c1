//! The small field checks every section of the configuration uses, and the error they give
//! (`Configuration error: <field> ...`, never quoting a value that may be a secret).

use crate::error::{Error, Result};

/// `Error::Config(msg)`.
pub(super) fn config_err(msg: impl Into<String>) -> Error {
    Error::Config(msg.into())
}

/// Checks that a URL starts with one of `schemes` (case-insensitive). The URL is not quoted in
/// the message: it may hold a password.
pub(super) fn check_scheme(url: &str, field: &str, schemes: &[&str]) -> Result<()> {
    let lower = url.to_ascii_lowercase();
    let ok = schemes
        .iter()
        .any(|s| lower.starts_with(s) && lower.len() > s.len());
    if ok {
        Ok(())
    } else {
        Err(config_err(format!(
            "{field} must start with {}",
            schemes.join(" or ")
        )))
    }
}

pub(super) fn check_positive(value: u64, field: &str) -> Result<()> {
    if value == 0 {
        Err(config_err(format!("{field} must be greater than 0")))
    } else {
        Ok(())
    }
}

pub(super) fn check_non_empty(value: &str, field: &str) -> Result<()> {
    if value.trim().is_empty() {
        Err(config_err(format!("{field} must not be empty")))
    } else {
        Ok(())
    }
}
