//! The fast path for the rest of a record after its body: the compact form [`super::encode_record`]
//! writes (SPEC.md key order, no whitespace), parsed without serde. It is strict: anything
//! else (whitespace, another key order, an escaped string, a number serde_json would not take
//! as that integer type, nesting deeper than [`MAX_DEPTH`]) gives `None`, and the
//! caller has serde_json parse the record instead. So the language accepted and every value
//! read stay exactly serde_json's; this only skips its generic machinery for the common case.
//!
//! Measured on a restore of 100,000 x 1 KiB text records with 20 headers: serde_json's parse of
//! the tail was 27% of the restore's CPU samples (perf), and this path took the restore from
//! 1.89-1.92 to 1.60-1.68 CPU-s (three runs each, alternating, on the same backup).

use super::json::{f32_json, f64_json};
use super::{BackupHeaderValue, BackupProperties, BackupRecord, HeaderTable, MessageFormat};

/// Tables and arrays nested deeper than this go to serde_json (which refuses more than 128
/// levels of JSON nesting; each table or array level here is three).
const MAX_DEPTH: u32 = 20;

/// Parses `s`, the bytes after the body's value (`,"properties":{...},...,"source_vhost":"v"}`
/// and nothing after the closing brace), into a record with an empty body. `None` when `s` is
/// not in the compact form (see the module documentation).
pub(super) fn parse_tail(s: &[u8]) -> Option<BackupRecord> {
    parse_fields(s, b',')
}

/// Parses `s`, a version 2 record's metadata (`{"properties":{...},...,"source_vhost":"v"}`,
/// [`super::encode_meta`]'s compact form), into a record with an empty body. `None` when `s`
/// is not in that form.
pub(super) fn parse_meta(s: &[u8]) -> Option<BackupRecord> {
    parse_fields(s, b'{')
}

/// The fields after the body, the first key preceded by `lead` (`,` after a body, `{` at the
/// start of an object without one).
fn parse_fields(s: &[u8], lead: u8) -> Option<BackupRecord> {
    if s.first() != Some(&lead) {
        return None;
    }
    let mut c = Cursor { s, i: 1 };
    c.lit(b"\"properties\":{\"content_type\":")?;
    let content_type = c.opt(Cursor::string)?;
    c.lit(b",\"content_encoding\":")?;
    let content_encoding = c.opt(Cursor::string)?;
    c.lit(b",\"delivery_mode\":")?;
    let delivery_mode = c.opt(Cursor::uint_as::<u8>)?;
    c.lit(b",\"priority\":")?;
    let priority = c.opt(Cursor::uint_as::<u8>)?;
    c.lit(b",\"correlation_id\":")?;
    let correlation_id = c.opt(Cursor::string)?;
    c.lit(b",\"reply_to\":")?;
    let reply_to = c.opt(Cursor::string)?;
    c.lit(b",\"expiration\":")?;
    let expiration = c.opt(Cursor::string)?;
    c.lit(b",\"message_id\":")?;
    let message_id = c.opt(Cursor::string)?;
    c.lit(b",\"timestamp\":")?;
    let timestamp = c.opt(Cursor::int)?;
    c.lit(b",\"type_field\":")?;
    let type_field = c.opt(Cursor::string)?;
    c.lit(b",\"user_id\":")?;
    let user_id = c.opt(Cursor::string)?;
    c.lit(b",\"app_id\":")?;
    let app_id = c.opt(Cursor::string)?;
    c.lit(b",\"cluster_id\":")?;
    let cluster_id = c.opt(Cursor::string)?;
    c.lit(b"},\"headers\":")?;
    let headers = c.table(0)?;
    c.lit(b",\"exchange\":")?;
    let exchange = c.string()?;
    c.lit(b",\"routing_key\":")?;
    let routing_key = c.string()?;
    c.lit(b",\"delivery_tag\":")?;
    let delivery_tag = c.uint()?;
    c.lit(b",\"redelivered\":")?;
    let redelivered = c.boolean()?;
    c.lit(b",\"backed_up_at\":")?;
    let backed_up_at = c.int()?;
    c.lit(b",\"source_queue\":")?;
    let source_queue = c.string()?;
    c.lit(b",\"source_vhost\":")?;
    let source_vhost = c.string()?;
    // Version 2 metadata only: the record kind, written last when there is one.
    let message_format = if lead == b'{' && c.lit(b",\"message_format\":").is_some() {
        c.lit(b"\"amqp-1.0\"")?;
        Some(MessageFormat::Amqp10)
    } else {
        None
    };
    c.lit(b"}")?;
    if c.i != s.len() {
        return None;
    }
    Some(BackupRecord {
        body: Vec::new(),
        properties: BackupProperties {
            content_type,
            content_encoding,
            delivery_mode,
            priority,
            correlation_id,
            reply_to,
            expiration,
            message_id,
            timestamp,
            type_field,
            user_id,
            app_id,
            cluster_id,
        },
        headers,
        exchange,
        routing_key,
        delivery_tag,
        redelivered,
        backed_up_at,
        source_queue,
        source_vhost,
        message_format,
        wire: None,
    })
}

/// A position in the bytes being parsed. Every method returns `None` (leaving the position
/// anywhere) when the text there is not what it parses.
struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    /// Steps over `l` if the text continues with it.
    #[inline]
    fn lit(&mut self, l: &[u8]) -> Option<()> {
        if self.s.get(self.i..self.i + l.len())? == l {
            self.i += l.len();
            Some(())
        } else {
            None
        }
    }

    /// The raw bytes of a string without escapes or control characters (both of which
    /// serde_json handles: escapes it decodes, control characters it refuses).
    fn raw_string(&mut self) -> Option<&'a [u8]> {
        self.lit(b"\"")?;
        let start = self.i;
        loop {
            match *self.s.get(self.i)? {
                b'"' => break,
                b'\\' | 0..=0x1f => return None,
                _ => self.i += 1,
            }
        }
        self.i += 1;
        let s: &'a [u8] = self.s;
        Some(&s[start..self.i - 1])
    }

    /// A string, valid UTF-8 (serde_json refuses anything else).
    fn string(&mut self) -> Option<String> {
        let raw = self.raw_string()?;
        std::str::from_utf8(raw).ok().map(str::to_owned)
    }

    /// `null`, or what `read` reads (an `Option` field).
    fn opt<T>(&mut self, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.lit(b"null").is_some() {
            return Some(None);
        }
        read(self).map(Some)
    }

    /// A JSON integer without sign: `0` or digits without a leading zero, at most u64::MAX
    /// (serde_json reads larger ones as floats, which no integer field takes). What follows
    /// is checked by the caller's next literal: a `.` or `e` there fails it.
    fn uint(&mut self) -> Option<u64> {
        let first = self.s.get(self.i)?.wrapping_sub(b'0');
        if first > 9 {
            return None;
        }
        self.i += 1;
        let mut v = u64::from(first);
        while let Some(&c) = self.s.get(self.i) {
            let d = c.wrapping_sub(b'0');
            if d > 9 {
                break;
            }
            if first == 0 {
                return None; // a leading zero: serde_json refuses it
            }
            v = v.checked_mul(10)?.checked_add(u64::from(d))?;
            self.i += 1;
        }
        Some(v)
    }

    /// An unsigned integer that fits `T` (serde_json refuses one that does not).
    fn uint_as<T: TryFrom<u64>>(&mut self) -> Option<T> {
        T::try_from(self.uint()?).ok()
    }

    /// A signed integer. serde_json reads `-0` and negatives below i64::MIN as floats, which
    /// no integer field takes, so those are left to it.
    fn int(&mut self) -> Option<i64> {
        if self.lit(b"-").is_none() {
            return i64::try_from(self.uint()?).ok();
        }
        match self.uint()? {
            0 => None,
            m if m <= 1 << 63 => Some((m as i64).wrapping_neg()),
            _ => None,
        }
    }

    /// A signed integer that fits `T`.
    fn int_as<T: TryFrom<i64>>(&mut self) -> Option<T> {
        T::try_from(self.int()?).ok()
    }

    fn boolean(&mut self) -> Option<bool> {
        if self.lit(b"true").is_some() {
            Some(true)
        } else {
            self.lit(b"false").map(|_| false)
        }
    }

    /// `[]` or `[n,n,...]` of integers 0..=255 (a `Vec<u8>` in serde's form).
    fn bytes(&mut self) -> Option<Vec<u8>> {
        self.lit(b"[")?;
        let mut out = Vec::new();
        if self.lit(b"]").is_some() {
            return Some(out);
        }
        loop {
            out.push(self.uint_as::<u8>()?);
            if self.lit(b",").is_none() {
                self.lit(b"]")?;
                return Some(out);
            }
        }
    }

    /// Calls `item` for each element of a JSON array (`[]` or `[x,x,...]`).
    fn array(&mut self, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.lit(b"[")?;
        if self.lit(b"]").is_some() {
            return Some(());
        }
        loop {
            item(self)?;
            if self.lit(b",").is_none() {
                return self.lit(b"]");
            }
        }
    }

    /// A header table: `[["key",value],...]`.
    fn table(&mut self, depth: u32) -> Option<HeaderTable> {
        if depth > MAX_DEPTH {
            return None;
        }
        let mut table = Vec::new();
        self.array(|c| {
            c.lit(b"[")?;
            let key = c.string()?;
            c.lit(b",")?;
            let value = c.value(depth)?;
            c.lit(b"]")?;
            table.push((key, value));
            Some(())
        })?;
        Some(table)
    }

    /// A float header's payload, read by serde_json alone (its float parsing is the reference)
    /// with `read`, the variant's deserializer: the number, string or `null` here.
    fn float<T>(
        &mut self,
        read: impl FnOnce(
            &mut serde_json::Deserializer<serde_json::de::SliceRead<'a>>,
        ) -> serde_json::Result<T>,
    ) -> Option<T> {
        let start = self.i;
        if self.s.get(self.i) == Some(&b'"') {
            self.raw_string()?;
        } else if self.lit(b"null").is_none() {
            while let Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') = self.s.get(self.i) {
                self.i += 1;
            }
        }
        let s: &'a [u8] = self.s;
        let mut de = serde_json::Deserializer::from_slice(&s[start..self.i]);
        let value = read(&mut de).ok()?;
        de.end().ok()?;
        Some(value)
    }

    /// A header value: `"Void"` or `{"Variant":payload}` (SPEC.md BackupHeaderValue).
    fn value(&mut self, depth: u32) -> Option<BackupHeaderValue> {
        use BackupHeaderValue as V;
        if self.lit(b"\"Void\"").is_some() {
            return Some(V::Void);
        }
        self.lit(b"{")?;
        let variant = self.raw_string()?;
        self.lit(b":")?;
        let value = match variant {
            b"LongString" => V::LongString(self.string()?),
            b"LongStringBytes" => V::LongStringBytes(self.bytes()?),
            b"ShortString" => V::ShortString(self.string()?),
            b"Long" => V::Long(self.int()?),
            b"Short" => V::Short(self.int_as()?),
            b"ShortShortInt" => V::ShortShortInt(self.int_as()?),
            b"ShortShortUInt" => V::ShortShortUInt(self.uint_as()?),
            b"ShortInt" => V::ShortInt(self.int_as()?),
            b"ShortUInt" => V::ShortUInt(self.uint_as()?),
            b"LongInt" => V::LongInt(self.int_as()?),
            b"LongUInt" => V::LongUInt(self.uint_as()?),
            b"LongLongInt" => V::LongLongInt(self.int()?),
            b"Bool" => V::Bool(self.boolean()?),
            b"Bytes" => V::Bytes(self.bytes()?),
            b"Timestamp" => V::Timestamp(self.uint()?),
            b"Float" => V::Float(self.float(|de| f32_json::deserialize(de))?),
            b"Double" => V::Double(self.float(|de| f64_json::deserialize(de))?),
            b"Decimal" => {
                self.lit(b"{\"scale\":")?;
                let scale = self.uint_as()?;
                self.lit(b",\"value\":")?;
                let value = self.uint_as()?;
                self.lit(b"}")?;
                V::Decimal { scale, value }
            }
            b"Table" => V::Table(self.table(depth + 1)?),
            b"Array" => {
                if depth + 1 > MAX_DEPTH {
                    return None;
                }
                let mut items = Vec::new();
                self.array(|c| {
                    items.push(c.value(depth + 1)?);
                    Some(())
                })?;
                V::Array(items)
            }
            _ => return None,
        };
        self.lit(b"}")?;
        Some(value)
    }
}
