//! Content headers: the basic-class property flags, encoding and decoding of
//! `BasicProperties`.

use super::*;
use crate::broker::amqp::types::BasicProperties;
use crate::error::Result;

pub(super) const FLAG_CONTENT_TYPE: u16 = 1 << 15;
pub(super) const FLAG_CONTENT_ENCODING: u16 = 1 << 14;
pub(super) const FLAG_HEADERS: u16 = 1 << 13;
pub(super) const FLAG_DELIVERY_MODE: u16 = 1 << 12;
pub(super) const FLAG_PRIORITY: u16 = 1 << 11;
pub(super) const FLAG_CORRELATION_ID: u16 = 1 << 10;
pub(super) const FLAG_REPLY_TO: u16 = 1 << 9;
pub(super) const FLAG_EXPIRATION: u16 = 1 << 8;
pub(super) const FLAG_MESSAGE_ID: u16 = 1 << 7;
pub(super) const FLAG_TIMESTAMP: u16 = 1 << 6;
pub(super) const FLAG_TYPE: u16 = 1 << 5;
pub(super) const FLAG_USER_ID: u16 = 1 << 4;
pub(super) const FLAG_APP_ID: u16 = 1 << 3;
pub(super) const FLAG_CLUSTER_ID: u16 = 1 << 2;

/// The property-flags word of `p` (bit 15 = content-type ... bit 2 = cluster-id).
pub fn property_flags(p: &BasicProperties) -> u16 {
    let mut f = 0;
    let mut set = |present: bool, flag: u16| {
        if present {
            f |= flag
        }
    };
    set(p.content_type.is_some(), FLAG_CONTENT_TYPE);
    set(p.content_encoding.is_some(), FLAG_CONTENT_ENCODING);
    set(p.headers.is_some(), FLAG_HEADERS);
    set(p.delivery_mode.is_some(), FLAG_DELIVERY_MODE);
    set(p.priority.is_some(), FLAG_PRIORITY);
    set(p.correlation_id.is_some(), FLAG_CORRELATION_ID);
    set(p.reply_to.is_some(), FLAG_REPLY_TO);
    set(p.expiration.is_some(), FLAG_EXPIRATION);
    set(p.message_id.is_some(), FLAG_MESSAGE_ID);
    set(p.timestamp.is_some(), FLAG_TIMESTAMP);
    set(p.kind.is_some(), FLAG_TYPE);
    set(p.user_id.is_some(), FLAG_USER_ID);
    set(p.app_id.is_some(), FLAG_APP_ID);
    set(p.cluster_id.is_some(), FLAG_CLUSTER_ID);
    f
}

/// What a content header carries after the body size: the property flags and the present
/// property values (AMQP 0-9-1 section 4.2.6.1), from the properties or encoded already.
pub trait PutProperties {
    /// Appends the flags and values. Errors: `Error::Amqp` when a value cannot be encoded (a
    /// short string over 255 bytes, a table over 4 GiB).
    fn put_properties(&self, buf: &mut Vec<u8>) -> Result<()>;
}

impl PutProperties for BasicProperties {
    fn put_properties(&self, buf: &mut Vec<u8>) -> Result<()> {
        put_properties(buf, self)
    }
}

/// Properties encoded once, before publishing (a restore encodes them on its decode threads, so
/// the publishing thread only copies bytes): the output of [`put_properties`].
#[derive(Debug)]
pub struct EncodedProperties(Vec<u8>);

impl EncodedProperties {
    /// Encodes `p`. Errors: as [`put_properties`].
    pub fn new(p: &BasicProperties) -> Result<EncodedProperties> {
        let mut buf = Vec::new();
        put_properties(&mut buf, p)?;
        Ok(EncodedProperties(buf))
    }

    /// The encoded bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl PutProperties for EncodedProperties {
    fn put_properties(&self, buf: &mut Vec<u8>) -> Result<()> {
        buf.extend_from_slice(&self.0);
        Ok(())
    }
}

/// Appends the property flags and the present property values of `p`.
pub fn put_properties(buf: &mut Vec<u8>, p: &BasicProperties) -> Result<()> {
    buf.extend_from_slice(&property_flags(p).to_be_bytes());
    pub(super) fn s(buf: &mut Vec<u8>, v: &Option<String>, what: &str) -> Result<()> {
        match v {
            Some(v) => put_short_str(buf, v, what),
            None => Ok(()),
        }
    }
    s(buf, &p.content_type, "content_type property")?;
    s(buf, &p.content_encoding, "content_encoding property")?;
    if let Some(h) = &p.headers {
        put_table(buf, h)?;
    }
    if let Some(v) = p.delivery_mode {
        buf.push(v);
    }
    if let Some(v) = p.priority {
        buf.push(v);
    }
    s(buf, &p.correlation_id, "correlation_id property")?;
    s(buf, &p.reply_to, "reply_to property")?;
    s(buf, &p.expiration, "expiration property")?;
    s(buf, &p.message_id, "message_id property")?;
    if let Some(v) = p.timestamp {
        buf.extend_from_slice(&v.to_be_bytes());
    }
    s(buf, &p.kind, "type property")?;
    s(buf, &p.user_id, "user_id property")?;
    s(buf, &p.app_id, "app_id property")?;
    s(buf, &p.cluster_id, "cluster_id property")?;
    Ok(())
}

/// Reads property flags and values (the part of a content header after body-size).
pub fn decode_properties(d: &mut Decoder<'_>) -> Result<BasicProperties> {
    let flags = super::wire::flag_words(d)?;
    let has = |flag: u16| flags & flag != 0;
    let mut p = BasicProperties::default();
    if has(FLAG_CONTENT_TYPE) {
        p.content_type = Some(d.short_str("content_type property")?);
    }
    if has(FLAG_CONTENT_ENCODING) {
        p.content_encoding = Some(d.short_str("content_encoding property")?);
    }
    if has(FLAG_HEADERS) {
        p.headers = Some(d.table()?);
    }
    if has(FLAG_DELIVERY_MODE) {
        p.delivery_mode = Some(d.u8("delivery_mode property")?);
    }
    if has(FLAG_PRIORITY) {
        p.priority = Some(d.u8("priority property")?);
    }
    if has(FLAG_CORRELATION_ID) {
        p.correlation_id = Some(d.short_str("correlation_id property")?);
    }
    if has(FLAG_REPLY_TO) {
        p.reply_to = Some(d.short_str("reply_to property")?);
    }
    if has(FLAG_EXPIRATION) {
        p.expiration = Some(d.short_str("expiration property")?);
    }
    if has(FLAG_MESSAGE_ID) {
        p.message_id = Some(d.short_str("message_id property")?);
    }
    if has(FLAG_TIMESTAMP) {
        p.timestamp = Some(d.u64("timestamp property")?);
    }
    if has(FLAG_TYPE) {
        p.kind = Some(d.short_str("type property")?);
    }
    if has(FLAG_USER_ID) {
        p.user_id = Some(d.short_str("user_id property")?);
    }
    if has(FLAG_APP_ID) {
        p.app_id = Some(d.short_str("app_id property")?);
    }
    if has(FLAG_CLUSTER_ID) {
        p.cluster_id = Some(d.short_str("cluster_id property")?);
    }
    Ok(p)
}

/// A decoded content header frame payload.
#[derive(Debug, Clone, PartialEq)]
pub struct ContentHeader {
    pub class_id: u16,
    /// Total body size in bytes, split over the following body frames.
    pub body_size: u64,
    /// The properties, or the reason they could not be read (e.g. a value not valid UTF-8).
    /// Kept apart from the frame structure so that one bad message does not end the connection.
    pub properties: Result<BasicProperties>,
}

/// The fixed 12 bytes a content header frame's payload begins with: its class-id and body size
/// (the weight, always 0, skipped).
pub(super) fn content_header_prefix(d: &mut Decoder<'_>) -> Result<(u16, u64)> {
    let class_id = d.u16("content header class")?;
    let _weight = d.u16("content header weight")?;
    Ok((class_id, d.u64("content body size")?))
}

/// Decodes a content header frame payload: class-id, weight, body-size, then the properties.
/// An error in the fixed 12-byte prefix is returned as the outer error.
pub fn decode_content_header(payload: &[u8]) -> Result<ContentHeader> {
    let mut d = Decoder::new(payload);
    let (class_id, body_size) = content_header_prefix(&mut d)?;
    let properties = decode_properties(&mut d);
    Ok(ContentHeader {
        class_id,
        body_size,
        properties,
    })
}

// ---------------------------------------------------------------------------------------------
// Frames
// ---------------------------------------------------------------------------------------------
