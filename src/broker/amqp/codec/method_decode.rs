//! `Method::decode`: method arguments from the wire; unknown methods are kept as
//! `Method::Unknown`.

use super::*;
use crate::error::Result;

impl Method {
    /// Decodes a method frame payload. Unknown (class, method) pairs give [`Method::Unknown`];
    /// truncated arguments give an error. Bytes after the last argument are ignored.
    pub fn decode(payload: &[u8]) -> Result<Method> {
        use Method::*;
        let mut d = Decoder::new(payload);
        let class_id = d.u16("method class id")?;
        let method_id = d.u16("method id")?;
        let d = &mut d;
        let m = match (class_id, method_id) {
            (10, 10) => ConnectionStart {
                version_major: d.u8("version-major")?,
                version_minor: d.u8("version-minor")?,
                server_properties: d.table()?,
                mechanisms: d.long_bytes("mechanisms")?.to_vec(),
                locales: d.long_bytes("locales")?.to_vec(),
            },
            (10, 11) => ConnectionStartOk {
                client_properties: d.table()?,
                mechanism: d.short_str("mechanism")?,
                response: Secret(d.long_bytes("response")?.to_vec()),
                locale: d.short_str("locale")?,
            },
            (10, 20) => ConnectionSecure {
                challenge: d.long_bytes("challenge")?.to_vec(),
            },
            (10, 21) => ConnectionSecureOk {
                response: d.long_bytes("response")?.to_vec(),
            },
            (10, 30) => ConnectionTune {
                channel_max: d.u16("channel-max")?,
                frame_max: d.u32("frame-max")?,
                heartbeat: d.u16("heartbeat")?,
            },
            (10, 31) => ConnectionTuneOk {
                channel_max: d.u16("channel-max")?,
                frame_max: d.u32("frame-max")?,
                heartbeat: d.u16("heartbeat")?,
            },
            (10, 40) => {
                let vhost = d.short_str("vhost")?;
                d.short_bytes("reserved")?;
                d.u8("reserved")?;
                ConnectionOpen { vhost }
            }
            (10, 41) => ConnectionOpenOk,
            (10, 50) => ConnectionClose {
                reply_code: d.u16("reply code")?,
                reply_text: lossy(d.short_bytes("reply text")?),
                class_id: d.u16("class id")?,
                method_id: d.u16("method id")?,
            },
            (10, 51) => ConnectionCloseOk,
            (10, 60) => ConnectionBlocked {
                reason: lossy(d.short_bytes("reason")?),
            },
            (10, 61) => ConnectionUnblocked,
            (20, 10) => ChannelOpen,
            (20, 11) => ChannelOpenOk,
            (20, 20) => ChannelFlow {
                active: bit(d.u8("active")?, 0),
            },
            (20, 21) => ChannelFlowOk {
                active: bit(d.u8("active")?, 0),
            },
            (20, 40) => ChannelClose {
                reply_code: d.u16("reply code")?,
                reply_text: lossy(d.short_bytes("reply text")?),
                class_id: d.u16("class id")?,
                method_id: d.u16("method id")?,
            },
            (20, 41) => ChannelCloseOk,
            (40, 10) => {
                d.u16("reserved")?;
                let exchange = d.short_str("exchange name")?;
                let kind = d.short_str("exchange type")?;
                let b = d.u8("flags")?;
                ExchangeDeclare {
                    exchange,
                    kind,
                    passive: bit(b, 0),
                    durable: bit(b, 1),
                    auto_delete: bit(b, 2),
                    internal: bit(b, 3),
                    no_wait: bit(b, 4),
                    arguments: d.table()?,
                }
            }
            (40, 11) => ExchangeDeclareOk,
            (40, 20) => {
                d.u16("reserved")?;
                let exchange = d.short_str("exchange name")?;
                let b = d.u8("flags")?;
                ExchangeDelete {
                    exchange,
                    if_unused: bit(b, 0),
                    no_wait: bit(b, 1),
                }
            }
            (40, 21) => ExchangeDeleteOk,
            (40, 30) => {
                d.u16("reserved")?;
                ExchangeBind {
                    destination: d.short_str("exchange name")?,
                    source: d.short_str("exchange name")?,
                    routing_key: d.short_str("routing key")?,
                    no_wait: bit(d.u8("flags")?, 0),
                    arguments: d.table()?,
                }
            }
            (40, 31) => ExchangeBindOk,
            (50, 10) => {
                d.u16("reserved")?;
                let queue = d.short_str("queue name")?;
                let b = d.u8("flags")?;
                QueueDeclare {
                    queue,
                    passive: bit(b, 0),
                    durable: bit(b, 1),
                    exclusive: bit(b, 2),
                    auto_delete: bit(b, 3),
                    no_wait: bit(b, 4),
                    arguments: d.table()?,
                }
            }
            (50, 11) => QueueDeclareOk {
                queue: d.short_str("queue name")?,
                message_count: d.u32("message count")?,
                consumer_count: d.u32("consumer count")?,
            },
            (50, 20) => {
                d.u16("reserved")?;
                QueueBind {
                    queue: d.short_str("queue name")?,
                    exchange: d.short_str("exchange name")?,
                    routing_key: d.short_str("routing key")?,
                    no_wait: bit(d.u8("flags")?, 0),
                    arguments: d.table()?,
                }
            }
            (50, 21) => QueueBindOk,
            (50, 30) => {
                d.u16("reserved")?;
                QueuePurge {
                    queue: d.short_str("queue name")?,
                    no_wait: bit(d.u8("flags")?, 0),
                }
            }
            (50, 31) => QueuePurgeOk {
                message_count: d.u32("message count")?,
            },
            (50, 40) => {
                d.u16("reserved")?;
                let queue = d.short_str("queue name")?;
                let b = d.u8("flags")?;
                QueueDelete {
                    queue,
                    if_unused: bit(b, 0),
                    if_empty: bit(b, 1),
                    no_wait: bit(b, 2),
                }
            }
            (50, 41) => QueueDeleteOk {
                message_count: d.u32("message count")?,
            },
            (50, 50) => {
                d.u16("reserved")?;
                QueueUnbind {
                    queue: d.short_str("queue name")?,
                    exchange: d.short_str("exchange name")?,
                    routing_key: d.short_str("routing key")?,
                    arguments: d.table()?,
                }
            }
            (50, 51) => QueueUnbindOk,
            (60, 10) => BasicQos {
                prefetch_size: d.u32("prefetch size")?,
                prefetch_count: d.u16("prefetch count")?,
                global: bit(d.u8("flags")?, 0),
            },
            (60, 11) => BasicQosOk,
            (60, 20) => {
                d.u16("reserved")?;
                let queue = d.short_str("queue name")?;
                let consumer_tag = d.short_str("consumer tag")?;
                let b = d.u8("flags")?;
                BasicConsume {
                    queue,
                    consumer_tag,
                    no_local: bit(b, 0),
                    no_ack: bit(b, 1),
                    exclusive: bit(b, 2),
                    no_wait: bit(b, 3),
                    arguments: d.table()?,
                }
            }
            (60, 21) => BasicConsumeOk {
                consumer_tag: d.short_str("consumer tag")?,
            },
            (60, 30) => BasicCancel {
                consumer_tag: d.short_str("consumer tag")?,
                no_wait: bit(d.u8("flags")?, 0),
            },
            (60, 31) => BasicCancelOk {
                consumer_tag: d.short_str("consumer tag")?,
            },
            (60, 40) => {
                d.u16("reserved")?;
                let exchange = d.short_str("exchange name")?;
                let routing_key = d.short_str("routing key")?;
                let b = d.u8("flags")?;
                BasicPublish {
                    exchange,
                    routing_key,
                    mandatory: bit(b, 0),
                    immediate: bit(b, 1),
                }
            }
            (60, 50) => BasicReturn {
                reply_code: d.u16("reply code")?,
                reply_text: d.short_bytes("reply text")?.to_vec(),
                exchange: d.short_bytes("exchange name")?.to_vec(),
                routing_key: d.short_bytes("routing key")?.to_vec(),
            },
            (60, 60) => BasicDeliver {
                consumer_tag: d.short_str("consumer tag")?,
                delivery_tag: d.u64("delivery tag")?,
                redelivered: bit(d.u8("flags")?, 0),
                exchange: d.short_bytes("exchange name")?.to_vec(),
                routing_key: d.short_bytes("routing key")?.to_vec(),
            },
            (60, 70) => {
                d.u16("reserved")?;
                BasicGet {
                    queue: d.short_str("queue name")?,
                    no_ack: bit(d.u8("flags")?, 0),
                }
            }
            (60, 71) => BasicGetOk {
                delivery_tag: d.u64("delivery tag")?,
                redelivered: bit(d.u8("flags")?, 0),
                exchange: d.short_bytes("exchange name")?.to_vec(),
                routing_key: d.short_bytes("routing key")?.to_vec(),
                message_count: d.u32("message count")?,
            },
            (60, 72) => BasicGetEmpty,
            (60, 80) => BasicAck {
                delivery_tag: d.u64("delivery tag")?,
                multiple: bit(d.u8("flags")?, 0),
            },
            (60, 90) => BasicReject {
                delivery_tag: d.u64("delivery tag")?,
                requeue: bit(d.u8("flags")?, 0),
            },
            (60, 110) => BasicRecover {
                requeue: bit(d.u8("flags")?, 0),
            },
            (60, 111) => BasicRecoverOk,
            (60, 120) => {
                let delivery_tag = d.u64("delivery tag")?;
                let b = d.u8("flags")?;
                BasicNack {
                    delivery_tag,
                    multiple: bit(b, 0),
                    requeue: bit(b, 1),
                }
            }
            (85, 10) => ConfirmSelect {
                no_wait: bit(d.u8("flags")?, 0),
            },
            (85, 11) => ConfirmSelectOk,
            _ => Unknown {
                class_id,
                method_id,
            },
        };
        Ok(m)
    }
}
