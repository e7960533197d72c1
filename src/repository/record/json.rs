//! serde helpers of the record format: the body as a JSON number array (`null` when empty), and
//! `Float`/`Double` header values that JSON cannot hold as numbers (NaN, infinities) written as
//! strings. Used by the derived serde implementations in the parent module.

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serializer};
use std::fmt;

// ---------------------------------------------------------------------------------------------
// serde helpers
// ---------------------------------------------------------------------------------------------

#[allow(clippy::ptr_arg)] // signature imposed by serialize_with on a Vec<u8> field
pub(super) fn ser_body<S: Serializer>(
    body: &Vec<u8>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    if body.is_empty() {
        s.serialize_none()
    } else {
        s.collect_seq(body.iter())
    }
}

pub(super) fn de_body<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Vec<u8>, D::Error> {
    Ok(Option::<Vec<u8>>::deserialize(d)?.unwrap_or_default())
}

fn non_finite_name(v: f64) -> &'static str {
    if v.is_nan() {
        "NaN"
    } else if v > 0.0 {
        "Infinity"
    } else {
        "-Infinity"
    }
}

/// Accepts a JSON number, `"NaN"`, `"Infinity"`, `"-Infinity"` or `null` (NaN).
struct FloatVisitor;

impl<'de> Visitor<'de> for FloatVisitor {
    type Value = f64;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number, \"NaN\", \"Infinity\", \"-Infinity\" or null")
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<f64, E> {
        Ok(v)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<f64, E> {
        Ok(v as f64)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<f64, E> {
        Ok(v as f64)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<f64, E> {
        match v {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
        }
    }
    fn visit_unit<E: de::Error>(self) -> std::result::Result<f64, E> {
        Ok(f64::NAN)
    }
    fn visit_none<E: de::Error>(self) -> std::result::Result<f64, E> {
        Ok(f64::NAN)
    }
}

pub(super) mod f32_json {
    use super::{non_finite_name, FloatVisitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f32, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f32(*v)
        } else {
            s.serialize_str(non_finite_name(f64::from(*v)))
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
        // The f32 text is its shortest decimal form; the correctly rounded f64 of it narrows
        // back to the same f32.
        d.deserialize_any(FloatVisitor).map(|v| v as f32)
    }
}

pub(super) mod f64_json {
    use super::{non_finite_name, FloatVisitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else {
            s.serialize_str(non_finite_name(*v))
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        d.deserialize_any(FloatVisitor)
    }
}
