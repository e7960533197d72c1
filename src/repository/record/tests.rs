use super::*;
use crate::error::Error;

/// splitmix64: small deterministic PRNG for generated cases.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    fn string(&mut self) -> String {
        const POOL: &[char] = &[
            'a',
            'Z',
            '0',
            ' ',
            '"',
            '\\',
            '/',
            '\u{0}',
            '\u{1}',
            '\u{8}',
            '\u{c}',
            '\n',
            '\r',
            '\t',
            '\u{1f}',
            '\u{7f}',
            '\u{80}',
            '\u{9f}',
            'é',
            'ß',
            '中',
            '文',
            '🎉',
            '\u{2028}',
            '\u{2029}',
            '\u{feff}',
            '\u{ffff}',
            '\u{10ffff}',
            '<',
            '>',
            '&',
            '\'',
            '%',
            '.',
            '{',
            '}',
            '[',
            ']',
            ',',
            ':',
        ];
        let len = match self.below(10) {
            0 => 0,
            1..=7 => self.below(12) as usize,
            _ => self.below(300) as usize,
        };
        (0..len)
            .map(|_| POOL[self.below(POOL.len() as u64) as usize])
            .collect()
    }
    fn opt_string(&mut self) -> Option<String> {
        if self.chance(40) {
            None
        } else {
            Some(self.string())
        }
    }
    fn f64_finite(&mut self) -> f64 {
        loop {
            let f = f64::from_bits(self.next());
            if f.is_finite() {
                return f;
            }
        }
    }
    fn f32_finite(&mut self) -> f32 {
        loop {
            let f = f32::from_bits(self.next() as u32);
            if f.is_finite() {
                return f;
            }
        }
    }
    fn header_value(&mut self, depth: u32) -> BackupHeaderValue {
        let kinds = if depth >= 3 { 19 } else { 21 };
        match self.below(kinds) {
            0 => BackupHeaderValue::LongString(self.string()),
            1 => {
                let n = 1 + self.below(20) as usize;
                let mut b = self.bytes(n);
                b[0] = 0xff; // never valid UTF-8
                BackupHeaderValue::LongStringBytes(b)
            }
            2 => BackupHeaderValue::ShortString(self.string()),
            3 => BackupHeaderValue::Long(self.next() as i64),
            4 => BackupHeaderValue::Short(self.next() as i16),
            5 => BackupHeaderValue::ShortShortInt(self.next() as i8),
            6 => BackupHeaderValue::ShortShortUInt(self.next() as u8),
            7 => BackupHeaderValue::ShortInt(self.next() as i16),
            8 => BackupHeaderValue::ShortUInt(self.next() as u16),
            9 => BackupHeaderValue::LongInt(self.next() as i32),
            10 => BackupHeaderValue::LongUInt(self.next() as u32),
            11 => BackupHeaderValue::LongLongInt(self.next() as i64),
            12 => BackupHeaderValue::Bool(self.chance(50)),
            13 => {
                let n = self.below(40) as usize;
                BackupHeaderValue::Bytes(self.bytes(n))
            }
            14 => BackupHeaderValue::Timestamp(self.next()),
            15 => BackupHeaderValue::Float(self.f32_finite()),
            16 => BackupHeaderValue::Double(self.f64_finite()),
            17 => BackupHeaderValue::Decimal {
                scale: self.next() as u8,
                value: self.next() as u32,
            },
            18 => BackupHeaderValue::Void,
            19 => BackupHeaderValue::Table(self.table(depth + 1)),
            _ => {
                let n = self.below(5) as usize;
                BackupHeaderValue::Array((0..n).map(|_| self.header_value(depth + 1)).collect())
            }
        }
    }
    fn table(&mut self, depth: u32) -> HeaderTable {
        let n = self.below(if depth == 0 { 25 } else { 5 }) as usize;
        (0..n)
            .map(|_| (self.string(), self.header_value(depth)))
            .collect()
    }
    fn record(&mut self) -> BackupRecord {
        let body_len = match self.below(10) {
            0 => 0,
            1 => 1,
            2..=7 => self.below(300) as usize,
            8 => self.below(5000) as usize,
            _ => 65536,
        };
        BackupRecord {
            body: self.bytes(body_len),
            properties: BackupProperties {
                content_type: self.opt_string(),
                content_encoding: self.opt_string(),
                delivery_mode: self.chance(50).then(|| self.next() as u8),
                priority: self.chance(50).then(|| self.next() as u8),
                correlation_id: self.opt_string(),
                reply_to: self.opt_string(),
                expiration: self.opt_string(),
                message_id: self.opt_string(),
                timestamp: self.chance(50).then(|| self.next() as i64),
                type_field: self.opt_string(),
                user_id: self.opt_string(),
                app_id: self.opt_string(),
                cluster_id: self.opt_string(),
            },
            headers: self.table(0),
            exchange: self.string(),
            routing_key: self.string(),
            delivery_tag: self.next(),
            redelivered: self.chance(50),
            backed_up_at: self.next() as i64,
            source_queue: self.string(),
            source_vhost: self.string(),
            message_format: None,
            wire: None,
        }
    }
}

fn encode(rec: &BackupRecord) -> Vec<u8> {
    let mut out = Vec::new();
    encode_record(rec, &mut out);
    out
}

fn sample_record() -> BackupRecord {
    BackupRecord {
        body: b"hi".to_vec(),
        properties: BackupProperties {
            content_type: Some("text/plain".into()),
            delivery_mode: Some(2),
            timestamp: Some(1_700_000_000),
            type_field: Some("t".into()),
            ..Default::default()
        },
        headers: vec![
            ("x-count".into(), BackupHeaderValue::LongInt(3)),
            ("flag".into(), BackupHeaderValue::Void),
            (
                "d".into(),
                BackupHeaderValue::Decimal {
                    scale: 2,
                    value: 314,
                },
            ),
        ],
        exchange: "ex".into(),
        routing_key: "rk".into(),
        delivery_tag: 1,
        redelivered: false,
        backed_up_at: 1_700_000_000_000,
        source_queue: "q".into(),
        source_vhost: "/".into(),
        message_format: None,
        wire: None,
    }
}

#[test]
fn json_shape_is_exactly_spec() {
    let json = String::from_utf8(encode(&sample_record())).unwrap();
    assert_eq!(
        json,
        concat!(
            r#"{"body":[104,105],"properties":{"content_type":"text/plain","#,
            r#""content_encoding":null,"delivery_mode":2,"priority":null,"#,
            r#""correlation_id":null,"reply_to":null,"expiration":null,"message_id":null,"#,
            r#""timestamp":1700000000,"type_field":"t","user_id":null,"app_id":null,"#,
            r#""cluster_id":null},"headers":[["x-count",{"LongInt":3}],["flag","Void"],"#,
            r#"["d",{"Decimal":{"scale":2,"value":314}}]],"exchange":"ex","routing_key":"rk","#,
            r#""delivery_tag":1,"redelivered":false,"backed_up_at":1700000000000,"#,
            r#""source_queue":"q","source_vhost":"/"}"#
        )
    );
    let mut empty = sample_record();
    empty.body.clear();
    let json = String::from_utf8(encode(&empty)).unwrap();
    assert!(json.starts_with(r#"{"body":null,"properties":"#), "{json}");
    assert_eq!(decode_record(json.as_bytes()).unwrap(), empty);
}

#[test]
fn every_variant_json_form() {
    let cases: Vec<(BackupHeaderValue, &str)> = vec![
        (
            BackupHeaderValue::LongString("a".into()),
            r#"{"LongString":"a"}"#,
        ),
        (
            BackupHeaderValue::LongStringBytes(vec![255, 0]),
            r#"{"LongStringBytes":[255,0]}"#,
        ),
        (
            BackupHeaderValue::ShortString("s".into()),
            r#"{"ShortString":"s"}"#,
        ),
        (BackupHeaderValue::Long(-1), r#"{"Long":-1}"#),
        (BackupHeaderValue::Short(-2), r#"{"Short":-2}"#),
        (
            BackupHeaderValue::ShortShortInt(-3),
            r#"{"ShortShortInt":-3}"#,
        ),
        (
            BackupHeaderValue::ShortShortUInt(250),
            r#"{"ShortShortUInt":250}"#,
        ),
        (BackupHeaderValue::ShortInt(-4), r#"{"ShortInt":-4}"#),
        (
            BackupHeaderValue::ShortUInt(65535),
            r#"{"ShortUInt":65535}"#,
        ),
        (BackupHeaderValue::LongInt(-5), r#"{"LongInt":-5}"#),
        (
            BackupHeaderValue::LongUInt(4294967295),
            r#"{"LongUInt":4294967295}"#,
        ),
        (
            BackupHeaderValue::LongLongInt(i64::MIN),
            r#"{"LongLongInt":-9223372036854775808}"#,
        ),
        (BackupHeaderValue::Bool(true), r#"{"Bool":true}"#),
        (BackupHeaderValue::Bytes(vec![]), r#"{"Bytes":[]}"#),
        (
            BackupHeaderValue::Timestamp(u64::MAX),
            r#"{"Timestamp":18446744073709551615}"#,
        ),
        (BackupHeaderValue::Float(1.5), r#"{"Float":1.5}"#),
        (BackupHeaderValue::Double(-0.25), r#"{"Double":-0.25}"#),
        (
            BackupHeaderValue::Decimal { scale: 1, value: 7 },
            r#"{"Decimal":{"scale":1,"value":7}}"#,
        ),
        (BackupHeaderValue::Void, r#""Void""#),
        (
            BackupHeaderValue::Table(vec![("k".into(), BackupHeaderValue::Void)]),
            r#"{"Table":[["k","Void"]]}"#,
        ),
        (
            BackupHeaderValue::Array(vec![BackupHeaderValue::Bool(false)]),
            r#"{"Array":[{"Bool":false}]}"#,
        ),
    ];
    for (v, expected) in cases {
        assert_eq!(serde_json::to_string(&v).unwrap(), expected);
        let back: BackupHeaderValue = serde_json::from_str(expected).unwrap();
        assert_eq!(back, v);
    }
}

#[test]
fn non_finite_floats_round_trip() {
    for (f, text) in [
        (f64::NAN, r#"{"Double":"NaN"}"#),
        (f64::INFINITY, r#"{"Double":"Infinity"}"#),
        (f64::NEG_INFINITY, r#"{"Double":"-Infinity"}"#),
    ] {
        let v = BackupHeaderValue::Double(f);
        assert_eq!(serde_json::to_string(&v).unwrap(), text);
        let BackupHeaderValue::Double(back) = serde_json::from_str(text).unwrap() else {
            panic!("wrong variant");
        };
        assert_eq!(back.is_nan(), f.is_nan());
        if !f.is_nan() {
            assert_eq!(back, f);
        }
        let v32 = BackupHeaderValue::Float(f as f32);
        let t32 = serde_json::to_string(&v32).unwrap();
        let BackupHeaderValue::Float(b32) = serde_json::from_str(&t32).unwrap() else {
            panic!("wrong variant");
        };
        assert_eq!(b32.is_nan(), f.is_nan());
        if !f.is_nan() {
            assert_eq!(b32, f as f32);
        }
    }
    // Written by a tool that let serde_json turn NaN into null.
    let v: BackupHeaderValue = serde_json::from_str(r#"{"Double":null}"#).unwrap();
    assert!(matches!(v, BackupHeaderValue::Double(f) if f.is_nan()));
    let v: BackupHeaderValue = serde_json::from_str(r#"{"Float":3}"#).unwrap();
    assert_eq!(v, BackupHeaderValue::Float(3.0));
    assert!(serde_json::from_str::<BackupHeaderValue>(r#"{"Double":"nan"}"#).is_err());
}

#[test]
fn floats_are_bit_exact() {
    let mut rng = Rng(7);
    for _ in 0..20_000 {
        let d = rng.f64_finite();
        let f = rng.f32_finite();
        let vals = vec![
            ("d".to_string(), BackupHeaderValue::Double(d)),
            ("f".to_string(), BackupHeaderValue::Float(f)),
        ];
        let text = serde_json::to_vec(&vals).unwrap();
        let back: HeaderTable = serde_json::from_slice(&text).unwrap();
        match (&back[0].1, &back[1].1) {
            (BackupHeaderValue::Double(d2), BackupHeaderValue::Float(f2)) => {
                assert_eq!(
                    d2.to_bits(),
                    d.to_bits(),
                    "double {d:e}: needs serde_json's float_roundtrip feature"
                );
                assert_eq!(f2.to_bits(), f.to_bits(), "float {f:e}");
            }
            other => panic!("wrong variants {other:?}"),
        }
    }
}

#[test]
fn encode_is_identical_to_serde_json_and_decodes_back() {
    let mut rng = Rng(0xC0DEC);
    let mut buf = Vec::new();
    for n in 0..1500 {
        let rec = rng.record();
        buf.clear();
        encode_record(&rec, &mut buf);
        let reference = serde_json::to_vec(&rec).unwrap();
        assert!(buf == reference, "record {n} differs from serde_json");
        let back = decode_record(&buf).unwrap();
        assert_eq!(back, rec, "record {n}");
        // The generic derived path agrees too.
        assert_eq!(serde_json::from_slice::<BackupRecord>(&buf).unwrap(), rec);
    }
}

#[test]
fn encode_appends_to_existing_buffer() {
    let rec = sample_record();
    let mut out = b"prefix".to_vec();
    encode_record(&rec, &mut out);
    assert_eq!(&out[..6], b"prefix");
    assert_eq!(&out[6..], &serde_json::to_vec(&rec).unwrap()[..]);
}

/// Version 2 metadata (`encode_meta`, written without serde) is serde_json's record without
/// its body, byte for byte: random records, with non-finite floats among the headers and
/// with and without the AMQP 1.0 kind.
#[test]
fn metadata_is_serde_jsons_record_without_the_body() {
    let mut rng = Rng(0x3E7A);
    let mut meta = Vec::new();
    for n in 0..600 {
        let mut rec = rng.record();
        rec.body.clear();
        if n % 3 == 0 {
            rec.headers
                .push(("nan".into(), BackupHeaderValue::Double(f64::NAN)));
            rec.headers
                .push(("inf".into(), BackupHeaderValue::Float(f32::NEG_INFINITY)));
        }
        if n % 2 == 0 {
            rec.message_format = Some(MessageFormat::Amqp10);
        }
        meta.clear();
        encode_meta(&rec, &mut meta);
        let reference = serde_json::to_vec(&rec).unwrap();
        let rest = reference.strip_prefix(b"{\"body\":null,").unwrap();
        assert!(
            meta[0] == b'{' && meta[1..] == *rest,
            "record {n} differs from serde_json"
        );
        if n % 3 != 0 {
            // (NaN is not equal to itself: those records are compared as bytes only.)
            assert_eq!(decode_meta(&meta, Vec::new()).unwrap(), rec, "record {n}");
        }
    }
}

#[test]
fn every_byte_value_encodes_and_decodes() {
    let mut rec = sample_record();
    rec.body = (0..=255u8).chain((0..=255u8).rev()).collect();
    let json = encode(&rec);
    assert_eq!(json, serde_json::to_vec(&rec).unwrap());
    assert_eq!(decode_record(&json).unwrap(), rec);
    // Bodies whose last numbers fall in the slow tail path.
    for len in 1..8 {
        for v in [0u8, 9, 10, 99, 100, 255] {
            rec.body = vec![v; len];
            let json = encode(&rec);
            assert_eq!(decode_record(&json).unwrap(), rec);
        }
    }
}

/// Moves `"body":...` from the front of compact output to the end.
fn body_last(json: &[u8]) -> Vec<u8> {
    let s = std::str::from_utf8(json).unwrap();
    let after = s.find(",\"properties\"").unwrap();
    let body = &s[1..after];
    format!("{{{},{}}}", &s[after + 1..s.len() - 1], body).into_bytes()
}

#[test]
fn decode_accepts_other_layouts() {
    let mut rng = Rng(42);
    for n in 0..300 {
        let rec = rng.record();
        let compact = serde_json::to_vec(&rec).unwrap();
        let pretty = serde_json::to_vec_pretty(&rec).unwrap();
        assert_eq!(decode_record(&pretty).unwrap(), rec, "pretty {n}");
        // serde_json::Value sorts keys: body comes second.
        let value: serde_json::Value = serde_json::from_slice(&compact).unwrap();
        let sorted = serde_json::to_vec(&value).unwrap();
        assert_eq!(decode_record(&sorted).unwrap(), rec, "sorted {n}");
        let last = body_last(&compact);
        assert_eq!(decode_record(&last).unwrap(), rec, "body last {n}");
    }
    let spaced = b" \n{ \"body\" :\t[ 1 ,2,\r\n 255 ] , \"properties\":{},\"headers\":[],\"exchange\":\"\",\"routing_key\":\"\",\"delivery_tag\":0,\"redelivered\":true,\"backed_up_at\":-5,\"source_queue\":\"q\",\"source_vhost\":\"v\"}\n ";
    let rec = decode_record(spaced).unwrap();
    assert_eq!(rec.body, vec![1, 2, 255]);
    assert_eq!(rec.properties, BackupProperties::default());
    assert_eq!(rec.backed_up_at, -5);
    let empty_array = b"{\"body\":[],\"properties\":{},\"headers\":[],\"exchange\":\"\",\"routing_key\":\"\",\"delivery_tag\":0,\"redelivered\":true,\"backed_up_at\":0,\"source_queue\":\"q\",\"source_vhost\":\"v\"}";
    assert!(decode_record(empty_array).unwrap().body.is_empty());
}

#[test]
fn decode_rejects_what_serde_json_rejects() {
    let base = serde_json::to_string(&sample_record()).unwrap();
    let bodies = [
        "[256]",
        "[01]",
        "[-0]",
        "[-1]",
        "[1.0]",
        "[1e2]",
        "[1,]",
        "[,1]",
        "[1 2]",
        "[1",
        "[1000]",
        "[2550]",
        "[ 7 ]",
        "[0,0,0]",
        "nul",
        "true",
        "\"ab\"",
        "[1]x",
        "{}",
        "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,300]",
        "[00]",
        "[0]",
    ];
    for body in bodies {
        let json = base.replacen("[104,105]", body, 1);
        let ours = decode_record(json.as_bytes());
        let reference = serde_json::from_str::<BackupRecord>(&json);
        assert_eq!(
            ours.is_ok(),
            reference.is_ok(),
            "body {body}: ours {ours:?} vs serde_json {reference:?}"
        );
        if let (Ok(a), Ok(b)) = (&ours, &reference) {
            assert_eq!(a, b);
        }
        if let Err(e) = ours {
            assert!(matches!(e, Error::Serialization(_)), "{e:?}");
            assert!(e
                .to_string()
                .starts_with("Serialization error: Invalid backup record: "));
        }
    }
    let dup = base.replacen("\"properties\"", "\"body\":[1],\"properties\"", 1);
    assert!(decode_record(dup.as_bytes()).is_err());
    // A second body after the first, spelled with an escape: serde_json's duplicate still.
    let dup = base.replacen("\"properties\"", "\"b\\u006fdy\":[1],\"properties\"", 1);
    assert!(serde_json::from_str::<BackupRecord>(&dup).is_err());
    assert!(decode_record(dup.as_bytes()).is_err());
    for bad in [
        "",
        "{",
        "[]",
        "null",
        "{\"body\":null}",
        &base[..base.len() - 1],
    ] {
        assert!(decode_record(bad.as_bytes()).is_err(), "{bad}");
    }
    let trailing = format!("{base} x");
    assert!(decode_record(trailing.as_bytes()).is_err());
    // A key spelled with an escape still works through the fallback.
    let escaped = base.replacen("\"body\"", "\"b\\u006fdy\"", 1);
    assert_eq!(decode_record(escaped.as_bytes()).unwrap(), sample_record());
}

/// Differential test: mutate the body text of valid records (digits, separators, signs,
/// whitespace, brackets) and check that decode_record accepts exactly what serde_json
/// accepts, with the same result. Long bodies exercise both halves of the split parser.
#[test]
fn mutated_bodies_agree_with_serde_json() {
    const ALPHABET: &[u8] = b"0123456789012345678901234567890123456789,,,,,, \n\t]-.e[\"x";
    let mut rng = Rng(0xF022);
    let mut accepted = 0;
    for n in 0..4000 {
        let mut rec = sample_record();
        let len = match n % 4 {
            0 => rng.below(8) as usize,
            1 => 20 + rng.below(40) as usize,
            _ => 100 + rng.below(400) as usize,
        };
        rec.body = rng.bytes(len);
        let mut json = encode(&rec);
        let body_end = json.iter().position(|&c| c == b']').unwrap_or(12);
        let mutations = 1 + rng.below(3);
        for _ in 0..mutations {
            let pos = 8 + rng.below((body_end - 8 + 2) as u64) as usize;
            let c = ALPHABET[rng.below(ALPHABET.len() as u64) as usize];
            match rng.below(3) {
                0 => json[pos] = c,
                1 => json.insert(pos, c),
                _ => {
                    json.remove(pos);
                }
            }
        }
        let ours = decode_record(&json);
        let reference = serde_json::from_slice::<BackupRecord>(&json);
        match (&ours, &reference) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a, b, "case {n}: {}", String::from_utf8_lossy(&json));
                accepted += 1;
            }
            (Err(_), Err(_)) => {}
            _ => panic!(
                "case {n}: ours {:?} vs serde_json {:?} for {}",
                ours.is_ok(),
                reference.is_ok(),
                String::from_utf8_lossy(&json)
            ),
        }
    }
    assert!(
        accepted > 200,
        "mutations should leave some valid records: {accepted}"
    );
}

#[test]
fn long_bodies_with_whitespace_or_errors_in_either_half() {
    let mut rec = sample_record();
    rec.body = (0..400u32).map(|i| (i * 37 % 256) as u8).collect();
    let compact = String::from_utf8(encode(&rec)).unwrap();
    let items: Vec<String> = rec.body.iter().map(|b| b.to_string()).collect();
    for at in [0usize, 1, 150, 199, 200, 201, 350, 399] {
        // Whitespace at one place in the array: valid, general path.
        let mut spaced = items.clone();
        spaced[at] = format!(" {}\n", spaced[at]);
        let json = compact.replacen(&items.join(","), &spaced.join(","), 1);
        assert_eq!(
            decode_record(json.as_bytes()).unwrap(),
            rec,
            "space at {at}"
        );
        // Invalid numbers at one place: rejected, as serde_json does.
        for bad in ["256", "01", "-1", "1.5", "", "1e1", "999", "2555"] {
            let mut broken = items.clone();
            broken[at] = bad.to_string();
            let json = compact.replacen(&items.join(","), &broken.join(","), 1);
            assert!(decode_record(json.as_bytes()).is_err(), "{bad} at {at}");
            assert!(serde_json::from_str::<BackupRecord>(&json).is_err());
        }
    }
}

fn delivery_with(headers: Option<FieldTable>, body: Vec<u8>) -> Delivery {
    Delivery {
        delivery_tag: 9,
        redelivered: true,
        exchange: "amq.topic".into(),
        routing_key: "a.b".into(),
        properties: BasicProperties {
            content_type: Some("application/json".into()),
            content_encoding: Some("gzip".into()),
            headers,
            delivery_mode: Some(2),
            priority: Some(7),
            correlation_id: Some("c".into()),
            reply_to: Some("r".into()),
            expiration: Some("60000".into()),
            message_id: Some("m".into()),
            timestamp: Some(u64::MAX - 1),
            kind: Some("k".into()),
            user_id: Some("guest".into()),
            app_id: Some("app".into()),
            cluster_id: Some("cl".into()),
        },
        wire: None,
        body,
    }
}

fn all_wire_values() -> FieldTable {
    vec![
        ("t".into(), FieldValue::Bool(true)),
        ("b".into(), FieldValue::I8(-8)),
        ("B".into(), FieldValue::U8(200)),
        ("s".into(), FieldValue::I16(-16)),
        ("u".into(), FieldValue::U16(60000)),
        ("I".into(), FieldValue::I32(-32)),
        ("i".into(), FieldValue::U32(4_000_000_000)),
        ("l".into(), FieldValue::I64(-64)),
        ("f".into(), FieldValue::F32(1.25)),
        ("d".into(), FieldValue::F64(-2.5e300)),
        (
            "D".into(),
            FieldValue::Decimal {
                scale: 3,
                value: 12345,
            },
        ),
        ("S".into(), FieldValue::LongString(b"caf\xc3\xa9".to_vec())),
        ("S-bin".into(), FieldValue::LongString(vec![0xff, 0xfe, 0])),
        (
            "A".into(),
            FieldValue::Array(vec![FieldValue::Void, FieldValue::I32(1)]),
        ),
        ("T".into(), FieldValue::Timestamp(1_700_000_000)),
        (
            "F".into(),
            FieldValue::Table(vec![(
                "inner".into(),
                FieldValue::Table(vec![("x".into(), FieldValue::Bytes(vec![1, 2]))]),
            )]),
        ),
        ("V".into(), FieldValue::Void),
        ("x".into(), FieldValue::Bytes(vec![0, 255])),
    ]
}

#[test]
fn wire_to_record_keeps_types_and_back() {
    let table = all_wire_values();
    let body = vec![1u8, 2, 3];
    let body_ptr = body.as_ptr();
    let d = delivery_with(Some(table.clone()), body);
    let original_props = d.properties.clone();
    let rec = BackupRecord::from_delivery(d, "q1", "/", 123);
    assert_eq!(rec.body.as_ptr(), body_ptr, "body moved, not copied");
    assert_eq!(rec.body(), &[1, 2, 3]);
    assert_eq!(rec.source_queue, "q1");
    assert_eq!(rec.source_vhost, "/");
    assert_eq!(rec.backed_up_at, 123);
    assert_eq!(rec.delivery_tag, 9);
    assert!(rec.redelivered);
    assert_eq!(rec.exchange, "amq.topic");
    assert_eq!(rec.routing_key, "a.b");
    assert_eq!(rec.properties.type_field.as_deref(), Some("k"));
    assert_eq!(rec.properties.timestamp, Some((u64::MAX - 1) as i64));
    let kinds: Vec<&str> = rec
        .headers
        .iter()
        .map(|(_, v)| match v {
            BackupHeaderValue::Bool(_) => "Bool",
            BackupHeaderValue::ShortShortInt(_) => "ShortShortInt",
            BackupHeaderValue::ShortShortUInt(_) => "ShortShortUInt",
            BackupHeaderValue::ShortInt(_) => "ShortInt",
            BackupHeaderValue::ShortUInt(_) => "ShortUInt",
            BackupHeaderValue::LongInt(_) => "LongInt",
            BackupHeaderValue::LongUInt(_) => "LongUInt",
            BackupHeaderValue::LongLongInt(_) => "LongLongInt",
            BackupHeaderValue::Float(_) => "Float",
            BackupHeaderValue::Double(_) => "Double",
            BackupHeaderValue::Decimal { .. } => "Decimal",
            BackupHeaderValue::LongString(_) => "LongString",
            BackupHeaderValue::LongStringBytes(_) => "LongStringBytes",
            BackupHeaderValue::Array(_) => "Array",
            BackupHeaderValue::Timestamp(_) => "Timestamp",
            BackupHeaderValue::Table(_) => "Table",
            BackupHeaderValue::Void => "Void",
            BackupHeaderValue::Bytes(_) => "Bytes",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "Bool",
            "ShortShortInt",
            "ShortShortUInt",
            "ShortInt",
            "ShortUInt",
            "LongInt",
            "LongUInt",
            "LongLongInt",
            "Float",
            "Double",
            "Decimal",
            "LongString",
            "LongStringBytes",
            "Array",
            "Timestamp",
            "Table",
            "Void",
            "Bytes"
        ]
    );
    assert_eq!(
        rec.headers[11].1,
        BackupHeaderValue::LongString("café".into())
    );
    // Back to the wire: identical properties, through JSON too.
    assert_eq!(rec.to_amqp(), original_props);
    let decoded = decode_record(&encode(&rec)).unwrap();
    assert_eq!(decoded.to_amqp(), original_props);
    let (props, body) = decoded.into_amqp();
    assert_eq!(props, original_props);
    assert_eq!(body, vec![1, 2, 3]);
}

#[test]
fn other_tool_variants_map_to_wire() {
    let cases = [
        (
            BackupHeaderValue::ShortString("s".into()),
            FieldValue::LongString(b"s".to_vec()),
        ),
        (BackupHeaderValue::Long(5), FieldValue::I64(5)),
        (BackupHeaderValue::Short(-5), FieldValue::I16(-5)),
    ];
    for (v, wire) in cases {
        assert_eq!(v.to_field_value(), wire);
        assert_eq!(FieldValue::from(v), wire);
    }
}

#[test]
fn absent_and_empty_headers_restore_as_absent() {
    for headers in [None, Some(Vec::new())] {
        let d = delivery_with(headers, Vec::new());
        let rec = BackupRecord::from_delivery(d, "q", "v", 0);
        assert!(rec.headers.is_empty());
        assert!(rec.body.is_empty());
        assert_eq!(rec.to_amqp().headers, None);
    }
    let p = BasicProperties {
        headers: Some(vec![("a".into(), FieldValue::Void)]),
        ..Default::default()
    };
    let d = Delivery {
        delivery_tag: 1,
        redelivered: false,
        exchange: String::new(),
        routing_key: String::new(),
        properties: p.clone(),
        wire: None,
        body: vec![],
    };
    let rec = BackupRecord::from_delivery(d, "q", "v", 0);
    let json = encode(&rec);
    assert!(json.starts_with(b"{\"body\":null,"));
    assert_eq!(decode_record(&json).unwrap().to_amqp(), p);
}

/// Bodies for the property tests: random lengths up to 70,000 with every byte value, and runs
/// that make every element the same length (1, 2 or 3 digits) or mix them in long stretches.
fn property_body(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(8) {
        0 => rng.below(40) as usize,
        1..=3 => rng.below(2000) as usize,
        _ => rng.below(70_001) as usize,
    };
    let kind = rng.below(6);
    (0..len)
        .map(|_| {
            let x = rng.next() as u8;
            match kind {
                0 => x % 10,
                1 => 10 + x % 90,
                2 => 100 + x % 156,
                3 => [0, 9, 10, 99, 100, 255][x as usize % 6],
                _ => x,
            }
        })
        .collect()
}

/// Property test: random records (random headers and properties, bodies from
/// [`property_body`]) encode to exactly `serde_json::to_vec` and decode to exactly
/// `serde_json::from_slice`; the scalar and SIMD body paths agree.
#[test]
fn random_records_agree_with_serde_json() {
    let mut rng = Rng(0x5EED_C0DE);
    let mut buf = Vec::new();
    for n in 0..160 {
        let mut rec = rng.record();
        rec.body = property_body(&mut rng);
        buf.clear();
        encode_record(&rec, &mut buf);
        let reference = serde_json::to_vec(&rec).unwrap();
        assert!(buf == reference, "record {n} differs from serde_json");
        for simd in [false, true] {
            let mut body = Vec::new();
            body::write_body_with(&rec.body, &mut body, simd);
            assert!(reference[8..].starts_with(&body), "record {n}, simd {simd}");
            if !rec.body.is_empty() {
                let (parsed, end) = body::parse_compact_with(&reference, 9, simd).unwrap();
                assert!(parsed == rec.body, "record {n}, simd {simd}");
                assert_eq!(end, 8 + body.len());
            }
        }
        let back = decode_record(&buf).unwrap();
        assert_eq!(back, serde_json::from_slice::<BackupRecord>(&buf).unwrap());
        assert_eq!(back, rec, "record {n}");
    }
}

/// Hostile bodies: the compact text of a long random body with one element replaced by
/// something serde_json may or may not accept (whitespace, out-of-range or non-integer
/// numbers, leading zeros, nested arrays, missing or extra separators), or the record cut
/// short. `decode_record` and both body paths must accept exactly what serde_json accepts.
#[test]
fn hostile_bodies_agree_with_serde_json() {
    const SUBSTITUTES: &[&str] = &[
        " 7", "7 ", "\n1\t", "256", "999", "1000", "2555", "-0", "-1", "1e2", "1E0", "1.0", "0.5",
        "01", "00", "007", "0", "255", "", "[1]", "[]", "[", "]", "1,", ",1", "1 ,2", "null",
        "\"1\"", "+1", "0x1", "١",
    ];
    let mut rng = Rng(0xBAD_B0D1);
    let mut accepted = 0;
    for n in 0..600 {
        let mut rec = sample_record();
        let len = 1 + rng.below(if n % 3 == 0 { 70_000 } else { 3000 }) as usize;
        rec.body = rng.bytes(len);
        let mut items: Vec<String> = rec.body.iter().map(|b| b.to_string()).collect();
        let at = rng.below(len as u64) as usize;
        let sub = SUBSTITUTES[rng.below(SUBSTITUTES.len() as u64) as usize];
        items[at] = sub.to_string();
        let body_text = if rng.chance(3) {
            "[]".to_string()
        } else {
            format!("[{}]", items.join(","))
        };
        let compact = String::from_utf8(encode(&rec)).unwrap();
        let body_end = compact.find(",\"properties\"").unwrap();
        let mut json = format!("{{\"body\":{}{}", body_text, &compact[body_end..]).into_bytes();
        if rng.chance(5) {
            json.truncate(rng.below(json.len() as u64) as usize);
        }
        let ours = decode_record(&json);
        let reference = serde_json::from_slice::<BackupRecord>(&json);
        match (&ours, &reference) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a, b, "case {n}: {sub:?} at {at} of {len}");
                accepted += 1;
            }
            (Err(_), Err(_)) => {}
            _ => panic!(
                "case {n}: {sub:?} at {at} of {len}: ours {:?} vs serde_json {:?}",
                ours.is_ok(),
                reference.is_ok()
            ),
        }
        if json.len() > 9 {
            let scalar = body::parse_compact_with(&json, 9, false);
            let simd = body::parse_compact_with(&json, 9, true);
            assert_eq!(scalar, simd, "case {n}: {sub:?} at {at} of {len}");
            if let (Some((bytes, _)), Ok(b)) = (&scalar, &reference) {
                assert_eq!(bytes, &b.body, "case {n}");
            }
        }
    }
    assert!(accepted > 50, "some substitutes are valid: {accepted}");
}

/// Every hostile substitute at the places the SIMD decoder treats differently: the first and
/// last elements, around each quarter (where the array is split into chains), and inside the
/// long stretches parsed without end tests. Both body paths and `decode_record` must agree with
/// serde_json.
#[test]
fn hostile_elements_at_chain_edges_agree_with_serde_json() {
    const SUBSTITUTES: &[&str] = &[
        " 7",
        "7 ",
        "256",
        "1000",
        "-1",
        "1.0",
        "01",
        "00",
        "",
        "[1]",
        "1 ,2",
        "null",
        "x",
        "0",
        "255",
        ",,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,",
    ];
    let mut rng = Rng(0xED6E);
    let len = 4000;
    let base = rng.bytes(len);
    let mut places: Vec<usize> = vec![
        0,
        1,
        2,
        3,
        4,
        5,
        len - 5,
        len - 4,
        len - 3,
        len - 2,
        len - 1,
    ];
    for q in 1..4 {
        places.extend((len * q / 4 - 3)..(len * q / 4 + 4));
    }
    places.extend((0..40).map(|_| rng.below(len as u64) as usize));
    let mut rec = sample_record();
    rec.body = base.clone();
    let compact = String::from_utf8(encode(&rec)).unwrap();
    let body_end = compact.find(",\"properties\"").unwrap();
    for &at in &places {
        for sub in SUBSTITUTES {
            let mut items: Vec<String> = base.iter().map(|b| b.to_string()).collect();
            items[at] = sub.to_string();
            let json = format!("{{\"body\":[{}]{}", items.join(","), &compact[body_end..]);
            let json = json.as_bytes();
            let reference = serde_json::from_slice::<BackupRecord>(json);
            let ours = decode_record(json);
            match (&ours, &reference) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{sub:?} at {at}"),
                (Err(_), Err(_)) => {}
                _ => panic!(
                    "{sub:?} at {at}: ours {:?}, serde_json {:?}",
                    ours.is_ok(),
                    reference.is_ok()
                ),
            }
            let scalar = body::parse_compact_with(json, 9, false);
            let simd = body::parse_compact_with(json, 9, true);
            assert_eq!(scalar, simd, "{sub:?} at {at}");
            if let (Some((bytes, _)), Ok(b)) = (&scalar, &reference) {
                assert_eq!(bytes, &b.body, "{sub:?} at {at}");
            }
        }
    }
    // Arrays that are mostly commas: more elements than the chains' outputs have room for.
    for text in [
        format!("[1,{}1]", ",".repeat(4000)),
        format!("[{}]", ",".repeat(4000)),
        format!("[{}1]", "1,,,,".repeat(800)),
    ] {
        let json = format!("{{\"body\":{text}{}", &compact[body_end..]);
        let json = json.as_bytes();
        assert!(serde_json::from_slice::<BackupRecord>(json).is_err());
        assert!(decode_record(json).is_err());
        assert_eq!(body::parse_compact_with(json, 9, false), None);
        assert_eq!(body::parse_compact_with(json, 9, true), None);
    }
}

/// Small cases of the body codec on both paths, cheap enough for Miri (`cargo +nightly miri
/// test --lib record::tests::body_codec`; with `RUSTFLAGS=-Ctarget-feature=+ssse3` Miri also
/// runs the SSSE3 path, which it otherwise sees as absent).
#[test]
fn body_codec_small_cases_both_paths() {
    let mut rng = Rng(0x3141);
    for len in (0..80).chain([150, 300]) {
        let body: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let reference = if body.is_empty() {
            "null".to_string()
        } else {
            let items: Vec<String> = body.iter().map(|b| b.to_string()).collect();
            format!("[{}]", items.join(","))
        };
        for simd in [false, true] {
            let mut out = b"{\"body\":".to_vec();
            body::write_body_with(&body, &mut out, simd);
            assert_eq!(&out[8..], reference.as_bytes(), "len {len}, simd {simd}");
            out.extend_from_slice(b",\"x\":0}");
            let parsed = body::parse_compact_with(&out, 9, simd);
            if body.is_empty() {
                continue;
            }
            assert_eq!(parsed, Some((body.clone(), 8 + reference.len())));
            // One element made invalid: both paths refuse the compact form.
            let at = 9 + rng.below(reference.len() as u64 - 2) as usize;
            let mut bad = out.clone();
            bad[at] = b"x -.e0"[rng.below(6) as usize];
            let (scalar, fast) = (
                body::parse_compact_with(&bad, 9, false),
                body::parse_compact_with(&bad, 9, true),
            );
            assert_eq!(scalar, fast, "len {len}: {}", String::from_utf8_lossy(&bad));
        }
    }
}

/// True when `v` holds a float anywhere (the tail's fast path leaves those to serde_json).
fn has_float(v: &BackupHeaderValue) -> bool {
    match v {
        BackupHeaderValue::Float(_) | BackupHeaderValue::Double(_) => true,
        BackupHeaderValue::Table(t) => t.iter().any(|(_, v)| has_float(v)),
        BackupHeaderValue::Array(a) => a.iter().any(has_float),
        _ => false,
    }
}

/// Where the tail of `json` after its body starts (the bytes `tail::parse_tail` takes).
fn tail_start(json: &[u8]) -> Option<usize> {
    json.windows(14).position(|w| w == b",\"properties\":")
}

/// Random record `n` of a tail test: a `body_len`-byte body at most, and every other record
/// without the characters JSON escapes.
fn tail_record(rng: &mut Rng, n: usize, body_len: usize) -> BackupRecord {
    let mut rec = rng.record();
    rec.body.truncate(body_len);
    if n.is_multiple_of(2) {
        rec = without_escapes(&rec);
    }
    rec
}

/// Checks one mutated or crafted record: `decode_record` gives what serde_json gives (both
/// errors, or equal records), and whatever the tail's fast path accepts serde_json accepts as
/// the same record.
fn tail_agrees(json: &[u8], case: &str) -> bool {
    let ours = decode_record(json);
    let reference = serde_json::from_slice::<BackupRecord>(json);
    match (&ours, &reference) {
        // Compared by their encoding: a NaN header is not equal to itself.
        (Ok(a), Ok(b)) => assert!(
            encode(a) == encode(b),
            "{case}: {}",
            String::from_utf8_lossy(json)
        ),
        (Err(_), Err(_)) => {}
        _ => panic!(
            "{case}: ours {:?} vs serde_json {:?} for {}",
            ours.is_ok(),
            reference.is_ok(),
            String::from_utf8_lossy(json)
        ),
    }
    if let Some(at) = tail_start(json) {
        if let Some(mut fast) = tail::parse_tail(&json[at..]) {
            let reference = reference.as_ref().unwrap_or_else(|e| {
                panic!(
                    "{case}: the fast path took what serde_json refuses ({e}): {}",
                    String::from_utf8_lossy(json)
                )
            });
            fast.body = reference.body.clone();
            assert!(encode(&fast) == encode(reference), "{case}");
            return true;
        }
    }
    false
}

/// `rec` with every character of its strings that JSON escapes (`"`, `\\`, controls)
/// replaced by `_`.
fn without_escapes(rec: &BackupRecord) -> BackupRecord {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::String(s) => {
                *s = s
                    .chars()
                    .map(|c| {
                        if matches!(c, '"' | '\\' | '\0'..='\u{1f}') {
                            '_'
                        } else {
                            c
                        }
                    })
                    .collect();
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(walk),
            serde_json::Value::Object(o) => o.values_mut().for_each(walk),
            _ => {}
        }
    }
    let mut v = serde_json::to_value(rec).unwrap();
    walk(&mut v);
    serde_json::from_value(v).unwrap()
}

/// Random records (every header variant, nested tables and arrays, strings with escapes and
/// non-ASCII text, half of them with the escaped characters replaced): the tail's fast path
/// takes every one without escaped strings and gives serde_json's record; the others go to
/// serde_json.
#[test]
fn record_tails_agree_with_serde_json() {
    let mut rng = Rng(0x7A11);
    let (mut fast, mut with_float) = (0, 0);
    for n in 0..2000 {
        let rec = tail_record(&mut rng, n, 8);
        let json = encode(&rec);
        let took_fast = tail_agrees(&json, &format!("record {n}"));
        let floats = rec.headers.iter().any(|(_, v)| has_float(v));
        let escapes = json[tail_start(&json).unwrap()..].contains(&b'\\');
        assert_eq!(took_fast, !escapes, "record {n}");
        fast += usize::from(took_fast);
        with_float += usize::from(floats);
    }
    assert!(
        fast > 100 && with_float > 100,
        "{fast} fast, {with_float} with floats"
    );
}

/// Mutated tails: one to three bytes of a valid record's tail replaced, inserted or removed
/// (JSON punctuation, digits, signs, letters, invalid UTF-8). `decode_record` must accept exactly
/// what serde_json accepts, with the same record, and the fast path must take nothing
/// serde_json refuses.
#[test]
fn mutated_tails_agree_with_serde_json() {
    const ALPHABET: &[u8] = b"0123456789-+.eE\"\\{}[],: \nnulltruefalsxVoidLong\xc3\xa9\xff\x00";
    let mut rng = Rng(0x7A12);
    let (mut accepted, mut fast) = (0, 0);
    for n in 0..6000 {
        let mut json = encode(&tail_record(&mut rng, n, 4));
        let start = tail_start(&json).unwrap();
        for _ in 0..1 + rng.below(3) {
            let pos = start + rng.below((json.len() - start) as u64) as usize;
            let c = ALPHABET[rng.below(ALPHABET.len() as u64) as usize];
            match rng.below(3) {
                0 => json[pos] = c,
                1 => json.insert(pos, c),
                _ => {
                    json.remove(pos);
                }
            }
        }
        fast += usize::from(tail_agrees(&json, &format!("case {n}")));
        accepted += usize::from(serde_json::from_slice::<BackupRecord>(&json).is_ok());
    }
    assert!(
        accepted > 500 && fast > 300,
        "{accepted} valid, {fast} fast"
    );
}

/// Integers at every header type's limits, and number spellings serde_json refuses or reads
/// as floats (`-0`, leading zeros, fractions, exponents, past u64): the same result both ways.
#[test]
fn tail_integers_at_their_limits_agree_with_serde_json() {
    let base = String::from_utf8(encode(&sample_record())).unwrap();
    let numbers = [
        "0",
        "1",
        "-1",
        "-0",
        "00",
        "01",
        "1.0",
        "1e2",
        "1E2",
        "-",
        "+1",
        "127",
        "128",
        "-128",
        "-129",
        "255",
        "256",
        "32767",
        "32768",
        "-32768",
        "-32769",
        "65535",
        "65536",
        "2147483647",
        "2147483648",
        "-2147483648",
        "-2147483649",
        "4294967295",
        "4294967296",
        "9223372036854775807",
        "9223372036854775808",
        "-9223372036854775808",
        "-9223372036854775809",
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999999",
        "null",
        "true",
        "\"1\"",
    ];
    let variants = [
        "Long",
        "Short",
        "ShortShortInt",
        "ShortShortUInt",
        "ShortInt",
        "ShortUInt",
        "LongInt",
        "LongUInt",
        "LongLongInt",
        "Timestamp",
        "Bool",
        "Bytes",
        "Float",
    ];
    let mut fast = 0;
    for variant in variants {
        for number in numbers {
            let json = base.replacen("{\"LongInt\":3}", &format!("{{\"{variant}\":{number}}}"), 1);
            fast += usize::from(tail_agrees(json.as_bytes(), &format!("{variant} {number}")));
            let bytes = base.replacen(
                "{\"LongInt\":3}",
                &format!("{{\"{variant}\":[{number}]}}"),
                1,
            );
            tail_agrees(bytes.as_bytes(), &format!("{variant} [{number}]"));
        }
    }
    for field in [
        "delivery_tag",
        "backed_up_at",
        "delivery_mode",
        "priority",
        "timestamp",
    ] {
        for number in numbers {
            let at = base.find(&format!("\"{field}\":")).unwrap() + field.len() + 3;
            let end = at + base[at..].find([',', '}']).unwrap();
            let json = format!("{}{number}{}", &base[..at], &base[end..]);
            fast += usize::from(tail_agrees(json.as_bytes(), &format!("{field} {number}")));
        }
    }
    for decimal in [
        "{\"scale\":255,\"value\":4294967295}",
        "{\"scale\":256,\"value\":1}",
        "{\"value\":1,\"scale\":2}",
        "{\"scale\":2}",
        "{\"scale\":-1,\"value\":1}",
    ] {
        let json = base.replacen("{\"scale\":2,\"value\":314}", decimal, 1);
        tail_agrees(json.as_bytes(), decimal);
    }
    assert!(fast > 100, "{fast}");
}

/// Deep nesting: the fast path takes tables and arrays up to its depth limit and leaves deeper
/// ones to serde_json, which reads them up to its own limit and refuses the rest.
#[test]
fn nested_tails_agree_with_serde_json() {
    for depth in 0..50 {
        for kind in ["Table", "Array"] {
            let mut value = BackupHeaderValue::LongInt(1);
            for _ in 0..depth {
                value = if kind == "Table" {
                    BackupHeaderValue::Table(vec![("k".into(), value)])
                } else {
                    BackupHeaderValue::Array(vec![value])
                };
            }
            let mut rec = sample_record();
            rec.headers = vec![("deep".into(), value)];
            let json = encode(&rec);
            let took_fast = tail_agrees(&json, &format!("{kind} {depth}"));
            assert_eq!(took_fast, depth <= 20, "{kind} {depth}");
        }
    }
}

/// An AMQP 1.0 record: version 2 metadata ends with the kind; a 0-9-1 record's bytes do not
/// change; version 1 refuses the kind both ways; a reader that does not know the key (one
/// whose metadata has no such field) refuses it rather than misreading it.
#[test]
fn message_format_is_version_2_only_and_last() {
    let plain = sample_record();
    let mut meta = Vec::new();
    encode_meta(&plain, &mut meta);
    assert!(meta.ends_with(b",\"source_queue\":\"q\",\"source_vhost\":\"/\"}"));
    let rec = BackupRecord {
        message_format: Some(MessageFormat::Amqp10),
        properties: BackupProperties::default(),
        headers: Vec::new(),
        ..sample_record()
    };
    let mut meta10 = Vec::new();
    encode_meta(&rec, &mut meta10);
    let plain_props = {
        let mut m = Vec::new();
        encode_meta(
            &BackupRecord {
                properties: BackupProperties::default(),
                headers: Vec::new(),
                ..sample_record()
            },
            &mut m,
        );
        m
    };
    assert_eq!(
        meta10,
        [
            &plain_props[..plain_props.len() - 1],
            b",\"message_format\":\"amqp-1.0\"}".as_slice()
        ]
        .concat()
    );
    // Fast path and serde_json agree, and both keep the kind.
    let back = decode_meta(&meta10, rec.body.clone()).unwrap();
    assert_eq!(back, rec);
    let v: serde_json::Value = serde_json::from_slice(&meta10).unwrap();
    let pretty = serde_json::to_vec_pretty(&v).unwrap();
    assert_eq!(decode_meta(&pretty, rec.body.clone()).unwrap(), rec);
    // Another value of the key is refused, never read as 0-9-1.
    let other = String::from_utf8(meta10.clone())
        .unwrap()
        .replace("amqp-1.0", "amqp-2.0");
    assert!(decode_meta(other.as_bytes(), Vec::new()).is_err());
    // Version 1: refused when writing and when reading.
    let e = check_version_1(&rec).unwrap_err().to_string();
    assert!(
        e.starts_with("Serialization error: A amqp-1.0 record (queue 'q' in vhost '/')"),
        "{e}"
    );
    assert!(check_version_1(&plain).is_ok());
    let v1 = serde_json::to_vec(&rec).unwrap();
    let e = decode_record(&v1).unwrap_err().to_string();
    assert!(e.contains("message_format \"amqp-1.0\""), "{e}");
    // A 0-9-1 record's version 1 bytes are serde_json's, without the key.
    assert!(!encode(&plain).windows(14).any(|w| w == b"message_format"));
    // A reader without the key: its metadata type denies unknown fields, and its compact
    // path wants `}` after source_vhost (the same parser given a version 1 lead, which does
    // not take the key, stands for it here).
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct OldMeta {
        properties: BackupProperties,
        headers: HeaderTable,
        exchange: String,
        routing_key: String,
        delivery_tag: u64,
        redelivered: bool,
        backed_up_at: i64,
        source_queue: String,
        source_vhost: String,
    }
    let e = serde_json::from_slice::<OldMeta>(&meta10)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("unknown field `message_format`"), "{e}");
    let mut as_tail = meta10.clone();
    as_tail[0] = b',';
    assert!(tail::parse_tail(&as_tail).is_none());
}

// ---------------------------------------------------------------------------------------------
// Version 3: binary metadata (binary.rs)
// ---------------------------------------------------------------------------------------------

/// `d` as a channel that keeps properties as bytes delivers it.
fn as_wire(mut d: Delivery) -> Delivery {
    d.wire = Some(WireProperties::encode(&d.properties).unwrap());
    d.properties = BasicProperties::default();
    d
}

#[test]
fn binary_metadata_reads_back_as_the_decoded_delivery_would() {
    for headers in [Some(all_wire_values()), Some(Vec::new()), None] {
        let d = delivery_with(headers, vec![7, 0, 255]);
        let decoded = BackupRecord::from_delivery(d.clone(), "q/é", "vh", 1_700_000_000_123);
        let wired = BackupRecord::from_delivery(as_wire(d), "q/é", "vh", 1_700_000_000_123);
        assert!(wired.headers.is_empty() && wired.properties == BackupProperties::default());
        let mut meta = Vec::new();
        encode_meta_v3(&wired, &mut meta);
        assert_eq!(meta[0], 0x00, "binary");
        let back = decode_meta(&meta, wired.body.clone()).unwrap();
        assert_eq!(back, decoded);
        assert_eq!(wired.clone().decode_wire().unwrap(), decoded);
        // The JSON encodings of a record with kept bytes are those of the decoded record.
        let mut v2 = Vec::new();
        encode_meta(&decoded, &mut v2);
        let mut v3_json = Vec::new();
        encode_meta_v3(&decoded, &mut v3_json);
        assert_eq!(v3_json, v2, "a record without kept bytes: version 2's JSON");
    }
}

#[test]
fn binary_metadata_is_laid_out_as_the_book_says() {
    let d = Delivery {
        delivery_tag: 5,
        redelivered: true,
        exchange: "ex".into(),
        routing_key: "rk".into(),
        properties: BasicProperties {
            delivery_mode: Some(2),
            headers: Some(vec![("n".into(), FieldValue::I32(7))]),
            ..Default::default()
        },
        wire: None,
        body: b"hi".to_vec(),
    };
    let rec = BackupRecord::from_delivery(as_wire(d), "q", "/", 1_700_000_000_000);
    let mut meta = Vec::new();
    encode_meta_v3(&rec, &mut meta);
    let mut want = vec![0x00, 0x01];
    want.extend_from_slice(&5u64.to_le_bytes());
    want.extend_from_slice(&1_700_000_000_000i64.to_le_bytes());
    for s in ["ex", "rk", "q", "/"] {
        want.extend_from_slice(&(s.len() as u16).to_le_bytes());
        want.extend_from_slice(s.as_bytes());
    }
    // Flags: headers (bit 13) and delivery-mode (bit 12); the table: its length, key `n`,
    // type `I`, 7; then delivery-mode 2.
    want.extend_from_slice(&[0x30, 0x00, 0, 0, 0, 7, 1, b'n', b'I', 0, 0, 0, 7, 2]);
    assert_eq!(meta, want);
}

#[test]
fn damaged_binary_metadata_is_an_error_never_a_panic() {
    let d = as_wire(delivery_with(Some(all_wire_values()), vec![1]));
    let rec = BackupRecord::from_delivery(d, "q", "v", 1);
    let mut meta = Vec::new();
    encode_meta_v3(&rec, &mut meta);
    for cut in 1..meta.len() {
        let e = decode_meta(&meta[..cut], Vec::new()).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("Serialization error: Invalid backup record metadata: "),
            "cut {cut}: {e}"
        );
    }
    let mut flags = meta.clone();
    flags[1] = 0x02;
    let e = decode_meta(&flags, Vec::new()).unwrap_err();
    assert!(e.to_string().contains("unknown flags 0x02"), "{e}");
    let mut long = meta.clone();
    long.push(0);
    let e = decode_meta(&long, Vec::new()).unwrap_err();
    assert!(
        e.to_string().contains("1 bytes after the last property"),
        "{e}"
    );
    // The exchange's bytes (after its length at 18) not UTF-8.
    let mut bad = meta.clone();
    bad[20] = 0xff;
    let e = decode_meta(&bad, Vec::new()).unwrap_err();
    assert!(e.to_string().contains("exchange is not valid UTF-8"), "{e}");
    for i in 0..meta.len() {
        for v in [0x00, 0x7f, 0xff] {
            let mut c = meta.clone();
            c[i] = v;
            let _ = decode_meta(&c, Vec::new());
        }
    }
}

#[test]
fn a_string_too_long_for_binary_metadata_is_written_as_json() {
    let d = as_wire(delivery_with(Some(all_wire_values()), vec![1]));
    let queue = "q".repeat(70_000);
    let rec = BackupRecord::from_delivery(d.clone(), &queue, "v", 1);
    let mut meta = Vec::new();
    encode_meta_v3(&rec, &mut meta);
    assert_eq!(meta[0], b'{');
    let mut plain = d;
    plain.properties = plain.wire.take().unwrap().decode().unwrap();
    assert_eq!(
        decode_meta(&meta, vec![1]).unwrap(),
        BackupRecord::from_delivery(plain, &queue, "v", 1)
    );
}

// ---------------------------------------------------------------------------------------------
// Versions 1 and 2 from kept property bytes (write.rs `kept`)
// ---------------------------------------------------------------------------------------------

/// A random string of 0-40 bytes: ASCII, control characters, quotes and backslashes, and
/// multi-byte UTF-8.
fn wire_string(rng: &mut Rng) -> String {
    const PARTS: [&str; 9] = ["a", "Z", "\"", "\\", "\u{1}", "\n", "\u{7f}", "é", "✓"];
    (0..rng.below(14))
        .map(|_| PARTS[rng.below(PARTS.len() as u64) as usize])
        .collect()
}

fn wire_value(rng: &mut Rng, depth: u32) -> FieldValue {
    let max = if depth >= 3 { 15 } else { 17 };
    match rng.below(max) {
        0 => FieldValue::Bool(rng.chance(50)),
        1 => FieldValue::I8(rng.next() as i8),
        2 => FieldValue::U8(rng.next() as u8),
        3 => FieldValue::I16(rng.next() as i16),
        4 => FieldValue::U16(rng.next() as u16),
        5 => FieldValue::I32(rng.next() as i32),
        6 => FieldValue::U32(rng.next() as u32),
        7 => FieldValue::I64(rng.next() as i64),
        8 => FieldValue::F32(f32::from_bits(rng.next() as u32)),
        9 => FieldValue::F64(f64::from_bits(rng.next())),
        10 => FieldValue::Decimal {
            scale: rng.next() as u8,
            value: rng.next() as u32,
        },
        11 if rng.chance(50) => FieldValue::LongString(wire_string(rng).into_bytes()),
        11 => FieldValue::LongString((0..rng.below(6)).map(|_| rng.next() as u8).collect()),
        12 => FieldValue::Timestamp(rng.next()),
        13 => FieldValue::Void,
        14 => FieldValue::Bytes((0..rng.below(6)).map(|_| rng.next() as u8).collect()),
        15 => FieldValue::Table(wire_table(rng, depth + 1)),
        _ => FieldValue::Array(
            (0..rng.below(4))
                .map(|_| wire_value(rng, depth + 1))
                .collect(),
        ),
    }
}

fn wire_table(rng: &mut Rng, depth: u32) -> FieldTable {
    (0..rng.below(6))
        .map(|_| (wire_string(rng), wire_value(rng, depth)))
        .collect()
}

fn random_properties(rng: &mut Rng) -> BasicProperties {
    let s = |rng: &mut Rng| rng.chance(50).then(|| wire_string(rng));
    BasicProperties {
        content_type: s(rng),
        content_encoding: s(rng),
        headers: rng.chance(70).then(|| wire_table(rng, 0)),
        delivery_mode: rng.chance(50).then(|| rng.next() as u8),
        priority: rng.chance(50).then(|| rng.next() as u8),
        correlation_id: s(rng),
        reply_to: s(rng),
        expiration: s(rng),
        message_id: s(rng),
        timestamp: rng.chance(50).then(|| rng.next()),
        kind: s(rng),
        user_id: s(rng),
        app_id: s(rng),
        cluster_id: s(rng),
    }
}

#[test]
fn kept_property_bytes_encode_as_the_decoded_record_in_versions_1_and_2() {
    let mut rng = Rng(17);
    for i in 0..3000 {
        let mut d = delivery_with(None, property_body(&mut rng));
        d.properties = random_properties(&mut rng);
        if i == 0 {
            d.properties.headers = Some(all_wire_values());
        }
        let decoded = BackupRecord::from_delivery(d.clone(), "q", "v", i);
        let wired = BackupRecord::from_delivery(as_wire(d), "q", "v", i);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        encode_record(&decoded, &mut a);
        encode_record(&wired, &mut b);
        assert_eq!(
            String::from_utf8_lossy(&b),
            String::from_utf8_lossy(&a),
            "version 1, record {i}"
        );
        a.clear();
        b.clear();
        encode_meta(&decoded, &mut a);
        encode_meta(&wired, &mut b);
        assert_eq!(a, b, "version 2, record {i}");
    }
}
