//! Checked conversions of AMQP 1.0 values into the fields of a 0-9-1 record, shared by the
//! mapping of a stream message (`record`) and of a 4.x container's header section
//! (`container`): a value that does not fit says why, and the message is then stored whole.

use super::{type_name, Value};

/// A mapped field, or why it does not fit.
pub(super) type Mapped<T> = std::result::Result<T, String>;

/// A string of at most 255 bytes (a 0-9-1 short string).
pub(super) fn short_string(v: &Value, what: &str) -> Mapped<String> {
    match v {
        Value::String(s) if s.len() <= 255 => Ok(s.clone()),
        other => Err(format!(
            "{what} is a {} a 0-9-1 short string cannot hold",
            describe(other)
        )),
    }
}

/// A symbol of at most 255 bytes.
pub(super) fn symbol(v: &Value, what: &str) -> Mapped<String> {
    match v {
        Value::Symbol(s) if s.len() <= 255 => Ok(s.clone()),
        other => Err(format!(
            "{what} is a {}, not a symbol of at most 255 bytes",
            describe(other)
        )),
    }
}

/// A value's type, with its length when a string is too long.
pub(super) fn describe(v: &Value) -> String {
    match v {
        Value::String(s) | Value::Symbol(s) if s.len() > 255 => {
            format!("{} of {} bytes", type_name(v), s.len())
        }
        other => type_name(other).to_string(),
    }
}

/// Epoch ms as 0-9-1 seconds, when no precision is lost.
pub(super) fn whole_seconds(ms: i64, what: &str) -> Mapped<i64> {
    if ms >= 0 && ms % 1000 == 0 {
        Ok(ms / 1000)
    } else {
        Err(format!("{what} {ms} ms is not whole seconds since 1970"))
    }
}
