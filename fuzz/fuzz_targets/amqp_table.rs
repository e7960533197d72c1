//! AMQP 0-9-1 field tables and field values (`Decoder::table`, `Decoder::field_value`), with
//! RabbitMQ's type codes, nested as deep as the decoder allows.
//!
//! Also the input as a content header's property list: `WireProperties::new` (the check of
//! properties kept as the broker sent them) accepts exactly what `decode_properties` reads
//! whole, and decodes to what it reads; a record holding such bytes encodes (version 1 JSON,
//! written from the bytes' borrowed view) exactly as the record of the decoded properties.
//!
//! Invariants beyond "no panic": every error is an `AMQP error:`; a decoded table or value
//! re-encodes (`put_table`, `put_field_value`) to exactly the bytes it took, except where the
//! wire allows several spellings of one value (a boolean octet other than 0 or 1), and those
//! bytes decode and re-encode to themselves.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmq_backup::broker::amqp::codec::{
    decode_properties, put_field_value, put_properties, put_table, Decoder,
};
use rmq_backup::broker::amqp::types::{BasicProperties, Delivery, FieldValue, WireProperties};
use rmq_backup::repository::record::{encode_record, BackupRecord};
use rmq_backup::Error;

fn amqp(e: &Error) {
    assert!(matches!(e, Error::Amqp(_)), "not an AMQP error: {e:?}");
    assert!(e.to_string().starts_with("AMQP error: "), "{e}");
}

/// True when `v` holds a boolean (whose octet may have been any non-zero value).
fn has_bool(v: &FieldValue) -> bool {
    match v {
        FieldValue::Bool(_) => true,
        FieldValue::Array(a) => a.iter().any(has_bool),
        FieldValue::Table(t) => t.iter().any(|(_, v)| has_bool(v)),
        _ => false,
    }
}

fuzz_target!(|data: &[u8]| {
    // A property list kept as bytes: the checker and the decoder agree.
    let mut d = Decoder::new(data);
    let whole = decode_properties(&mut d).ok().filter(|_| d.is_empty());
    match (WireProperties::new(data.to_vec()), whole) {
        (Ok(w), Some(p)) => {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            put_properties(&mut a, &w.decode().expect("checked bytes decode")).unwrap();
            put_properties(&mut b, &p).unwrap();
            assert_eq!(a, b);
            let delivery = |properties, wire| Delivery {
                delivery_tag: 1,
                redelivered: false,
                exchange: String::new(),
                routing_key: "q".into(),
                properties,
                wire,
                body: b"b".to_vec(),
            };
            let decoded = BackupRecord::from_delivery(delivery(p, None), "q", "/", 1);
            let kept = delivery(BasicProperties::default(), Some(w));
            let kept = BackupRecord::from_delivery(kept, "q", "/", 1);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            encode_record(&decoded, &mut a);
            encode_record(&kept, &mut b);
            assert_eq!(a, b);
        }
        (Err(e), None) => amqp(&e),
        (w, p) => panic!("checker {:?}, decoder {:?}", w.is_ok(), p.is_some()),
    }
    // A table, as in method arguments and the headers property.
    let mut d = Decoder::new(data);
    match d.table() {
        Ok(table) => {
            let taken = &data[..data.len() - d.remaining()];
            let mut once = Vec::new();
            put_table(&mut once, &table).unwrap_or_else(|e| panic!("{table:?}: {e}"));
            let exact = !table.iter().any(|(_, v)| has_bool(v));
            if exact {
                assert_eq!(once, taken, "{table:?}");
            }
            let back = Decoder::new(&once)
                .table()
                .unwrap_or_else(|e| panic!("{table:?} re-encoded: {e}"));
            let mut twice = Vec::new();
            put_table(&mut twice, &back).unwrap();
            assert_eq!(once, twice);
        }
        Err(e) => amqp(&e),
    }
    // Values one after another, as in a field array.
    let mut d = Decoder::new(data);
    while !d.is_empty() {
        let before = d.remaining();
        match d.field_value() {
            Ok(v) => {
                let taken = &data[data.len() - before..data.len() - d.remaining()];
                let mut once = Vec::new();
                put_field_value(&mut once, &v).unwrap_or_else(|e| panic!("{v:?}: {e}"));
                if !has_bool(&v) {
                    assert_eq!(once, taken, "{v:?}");
                }
                let back = Decoder::new(&once)
                    .field_value()
                    .unwrap_or_else(|e| panic!("{v:?} re-encoded: {e}"));
                let mut twice = Vec::new();
                put_field_value(&mut twice, &back).unwrap();
                assert_eq!(once, twice);
            }
            Err(e) => {
                amqp(&e);
                break;
            }
        }
    }
});
