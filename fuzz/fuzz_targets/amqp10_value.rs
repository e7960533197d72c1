//! AMQP 1.0 values (`stream::amqp10::decode_value`): every fixed and variable width type,
//! lists, maps, arrays with and without descriptors, described values, nested.
//!
//! Invariants beyond "no panic": errors are `Serialization error: Invalid AMQP 1.0 message:`;
//! a value never takes more bytes than there are; a decoded value re-encodes
//! (`encode_value`) to bytes that decode to the same value, whole, and re-encode to the same
//! bytes (compared as bytes: a NaN is not equal to itself), but for arrays of nulls that
//! announce more elements than they have bytes, which the decoder refuses by design.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmq_backup::broker::stream::amqp10::{decode_value, encode_value, Value};
use rmq_backup::Error;

/// True when `v` holds an array of nulls. `encode_value` writes it as the AMQP 1.0 spec says,
/// a constructor and no bytes per element, but `decode_value` refuses, by design, a compound
/// announcing more elements than it has bytes (src/broker/stream/amqp10/tests.rs
/// `zero_width_elements_cannot_outnumber_the_bytes`): such an encoding may not read back.
fn has_null_array(v: &Value) -> bool {
    match v {
        Value::Array(d, items) => {
            items.first() == Some(&Value::Null)
                || d.as_deref().is_some_and(has_null_array)
                || items.iter().any(has_null_array)
        }
        Value::List(items) => items.iter().any(has_null_array),
        Value::Map(pairs) => pairs
            .iter()
            .any(|(k, v)| has_null_array(k) || has_null_array(v)),
        Value::Described(d, v) => has_null_array(d) || has_null_array(v),
        _ => false,
    }
}

fuzz_target!(|data: &[u8]| {
    let (v, taken) = match decode_value(data) {
        Ok(r) => r,
        Err(e) => {
            assert!(matches!(e, Error::Serialization(_)), "{e:?}");
            assert!(
                e.to_string()
                    .starts_with("Serialization error: Invalid AMQP 1.0 message: "),
                "{e}"
            );
            return;
        }
    };
    assert!(taken >= 1 && taken <= data.len());
    let mut once = Vec::new();
    encode_value(&v, &mut once);
    let (back, n) = match decode_value(&once) {
        Ok(r) => r,
        Err(e) if has_null_array(&v) && e.message().contains("elements announced in") => return,
        Err(e) => panic!("{v:?} re-encoded: {e}"),
    };
    assert_eq!(n, once.len(), "{v:?}: re-encoded bytes left over");
    let mut twice = Vec::new();
    encode_value(&back, &mut twice);
    assert_eq!(once, twice, "{v:?} vs {back:?}");
});
