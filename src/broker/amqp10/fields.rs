//! Reading the fields of AMQP 1.0 described lists (performatives, SASL frames, delivery
//! states, errors) with their types checked: a missing or `null` field is absent, a field of
//! another type an `Error::Amqp("malformed AMQP 1.0 frame: ...")`.

use super::codec::{type_name, Value};
use crate::error::{Error, Result};

fn malformed(detail: impl std::fmt::Display) -> Error {
    Error::Amqp(format!("malformed AMQP 1.0 frame: {detail}"))
}

/// The performatives' descriptor codes and names (part 2, 2.7).
pub(crate) const NAMES: [(u64, &str); 9] = [
    (0x10, "open"),
    (0x11, "begin"),
    (0x12, "attach"),
    (0x13, "flow"),
    (0x14, "transfer"),
    (0x15, "disposition"),
    (0x16, "detach"),
    (0x17, "end"),
    (0x18, "close"),
];

/// The descriptor code of a described value: its `ulong`, or the code of a symbolic name
/// `amqp:NAME:list` this client knows.
pub(crate) fn descriptor_code(d: &Value) -> Option<u64> {
    match d {
        Value::Ulong(c) => Some(*c),
        Value::Symbol(s) => {
            let name = s.strip_prefix("amqp:")?.strip_suffix(":list")?;
            const OTHERS: [(u64, &str); 13] = [
                (0x1d, "error"),
                (0x23, "received"),
                (0x24, "accepted"),
                (0x25, "rejected"),
                (0x26, "released"),
                (0x27, "modified"),
                (0x28, "source"),
                (0x29, "target"),
                (0x40, "sasl-mechanisms"),
                (0x41, "sasl-init"),
                (0x42, "sasl-challenge"),
                (0x43, "sasl-response"),
                (0x44, "sasl-outcome"),
            ];
            NAMES
                .iter()
                .chain(OTHERS.iter())
                .find(|(_, n)| *n == name)
                .map(|(c, _)| *c)
        }
        _ => None,
    }
}

/// The positional fields of a described list, read with their types checked.
pub(crate) struct Fields<'a> {
    what: &'static str,
    items: &'a [Value],
}

impl<'a> Fields<'a> {
    /// The fields of `v` when it is a list, for messages about `what`.
    pub(crate) fn of(what: &'static str, v: &'a Value) -> Result<Fields<'a>> {
        match v {
            Value::List(items) => Ok(Fields { what, items }),
            other => Err(malformed(format_args!(
                "{what} is a {}, not a list",
                type_name(other)
            ))),
        }
    }

    /// Field `i`, `None` when missing or null.
    pub(crate) fn get(&self, i: usize) -> Option<&'a Value> {
        self.items.get(i).filter(|v| !matches!(v, Value::Null))
    }

    fn wrong(&self, field: &str, v: &Value) -> Error {
        malformed(format_args!(
            "{} field {field} is a {}",
            self.what,
            type_name(v)
        ))
    }

    pub(crate) fn required<T>(&self, i: usize, field: &str, v: Option<T>) -> Result<T> {
        v.ok_or_else(|| {
            malformed(format_args!(
                "{} without its {field} (field {i})",
                self.what
            ))
        })
    }

    pub(crate) fn uint(&self, i: usize, field: &str) -> Result<Option<u32>> {
        match self.get(i) {
            None => Ok(None),
            Some(Value::Uint(n)) => Ok(Some(*n)),
            Some(Value::Ushort(n)) => Ok(Some(*n as u32)),
            Some(Value::Ubyte(n)) => Ok(Some(*n as u32)),
            Some(other) => Err(self.wrong(field, other)),
        }
    }

    pub(crate) fn ushort(&self, i: usize, field: &str) -> Result<Option<u16>> {
        match self.get(i) {
            None => Ok(None),
            Some(Value::Ushort(n)) => Ok(Some(*n)),
            Some(Value::Ubyte(n)) => Ok(Some(*n as u16)),
            Some(other) => Err(self.wrong(field, other)),
        }
    }

    pub(crate) fn ubyte(&self, i: usize, field: &str) -> Result<Option<u8>> {
        match self.get(i) {
            None => Ok(None),
            Some(Value::Ubyte(n)) => Ok(Some(*n)),
            Some(other) => Err(self.wrong(field, other)),
        }
    }

    pub(crate) fn ulong(&self, i: usize, field: &str) -> Result<Option<u64>> {
        match self.get(i) {
            None => Ok(None),
            Some(Value::Ulong(n)) => Ok(Some(*n)),
            Some(Value::Uint(n)) => Ok(Some(*n as u64)),
            Some(other) => Err(self.wrong(field, other)),
        }
    }

    pub(crate) fn boolean(&self, i: usize, field: &str) -> Result<Option<bool>> {
        match self.get(i) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.wrong(field, other)),
        }
    }

    pub(crate) fn string(&self, i: usize, field: &str) -> Result<Option<String>> {
        match self.get(i) {
            None => Ok(None),
            Some(Value::String(s)) | Some(Value::Symbol(s)) => Ok(Some(s.clone())),
            Some(Value::InvalidString(b)) => Ok(Some(String::from_utf8_lossy(b).into_owned())),
            Some(other) => Err(self.wrong(field, other)),
        }
    }

    pub(crate) fn binary(&self, i: usize, field: &str) -> Result<Option<Vec<u8>>> {
        match self.get(i) {
            None => Ok(None),
            Some(Value::Binary(b)) => Ok(Some(b.clone())),
            Some(other) => Err(self.wrong(field, other)),
        }
    }

    pub(crate) fn map(&self, i: usize, field: &str) -> Result<Vec<(Value, Value)>> {
        match self.get(i) {
            None => Ok(Vec::new()),
            Some(Value::Map(m)) => Ok(m.clone()),
            Some(other) => Err(self.wrong(field, other)),
        }
    }

    /// Field `i` as a described list with one of the descriptor codes in `codes`: the code
    /// and the list's value.
    pub(crate) fn described(&self, i: usize, field: &str) -> Result<Option<(u64, &'a Value)>> {
        match self.get(i) {
            None => Ok(None),
            Some(Value::Described(d, v)) => match descriptor_code(d) {
                Some(code) => Ok(Some((code, v))),
                None => Err(malformed(format_args!(
                    "{} field {field} has an unknown descriptor",
                    self.what
                ))),
            },
            Some(other) => Err(self.wrong(field, other)),
        }
    }
}
