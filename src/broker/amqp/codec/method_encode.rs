//! `Method::encode`: method arguments to the wire.

use super::*;
use crate::error::{Error, Result};

impl Method {
    /// Appends the method payload (class-id, method-id, arguments) to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) -> Result<()> {
        use Method::*;
        let (class_id, method_id) = self.ids();
        buf.extend_from_slice(&class_id.to_be_bytes());
        buf.extend_from_slice(&method_id.to_be_bytes());
        let u16_ = |buf: &mut Vec<u8>, v: u16| buf.extend_from_slice(&v.to_be_bytes());
        let u32_ = |buf: &mut Vec<u8>, v: u32| buf.extend_from_slice(&v.to_be_bytes());
        let u64_ = |buf: &mut Vec<u8>, v: u64| buf.extend_from_slice(&v.to_be_bytes());
        match self {
            ConnectionStart {
                version_major,
                version_minor,
                server_properties,
                mechanisms,
                locales,
            } => {
                buf.push(*version_major);
                buf.push(*version_minor);
                put_table(buf, server_properties)?;
                put_long_bytes(buf, mechanisms, "mechanisms")?;
                put_long_bytes(buf, locales, "locales")?;
            }
            ConnectionStartOk {
                client_properties,
                mechanism,
                response,
                locale,
            } => {
                put_table(buf, client_properties)?;
                put_short_str(buf, mechanism, "mechanism")?;
                put_long_bytes(buf, &response.0, "response")?;
                put_short_str(buf, locale, "locale")?;
            }
            ConnectionSecure { challenge } => put_long_bytes(buf, challenge, "challenge")?,
            ConnectionSecureOk { response } => put_long_bytes(buf, response, "response")?,
            ConnectionTune {
                channel_max,
                frame_max,
                heartbeat,
            }
            | ConnectionTuneOk {
                channel_max,
                frame_max,
                heartbeat,
            } => {
                u16_(buf, *channel_max);
                u32_(buf, *frame_max);
                u16_(buf, *heartbeat);
            }
            ConnectionOpen { vhost } => {
                put_short_str(buf, vhost, "vhost")?;
                buf.push(0); // reserved-1 (capabilities), empty short string
                buf.push(0); // reserved-2 (insist)
            }
            ConnectionOpenOk => buf.push(0),
            ConnectionClose {
                reply_code,
                reply_text,
                class_id,
                method_id,
            }
            | ChannelClose {
                reply_code,
                reply_text,
                class_id,
                method_id,
            } => {
                u16_(buf, *reply_code);
                put_short_str(buf, reply_text, "reply text")?;
                u16_(buf, *class_id);
                u16_(buf, *method_id);
            }
            ConnectionCloseOk | ConnectionUnblocked | ChannelCloseOk | ExchangeDeclareOk
            | ExchangeDeleteOk | ExchangeBindOk | QueueBindOk | QueueUnbindOk | BasicQosOk
            | BasicRecoverOk | ConfirmSelectOk => {}
            ConnectionBlocked { reason } => put_short_str(buf, reason, "reason")?,
            ChannelOpen => buf.push(0),
            ChannelOpenOk => u32_(buf, 0),
            ChannelFlow { active } | ChannelFlowOk { active } => buf.push(*active as u8),
            ExchangeDeclare {
                exchange,
                kind,
                passive,
                durable,
                auto_delete,
                internal,
                no_wait,
                arguments,
            } => {
                u16_(buf, 0);
                put_short_str(buf, exchange, "exchange name")?;
                put_short_str(buf, kind, "exchange type")?;
                buf.push(bits(&[
                    *passive,
                    *durable,
                    *auto_delete,
                    *internal,
                    *no_wait,
                ]));
                put_table(buf, arguments)?;
            }
            ExchangeDelete {
                exchange,
                if_unused,
                no_wait,
            } => {
                u16_(buf, 0);
                put_short_str(buf, exchange, "exchange name")?;
                buf.push(bits(&[*if_unused, *no_wait]));
            }
            ExchangeBind {
                destination,
                source,
                routing_key,
                no_wait,
                arguments,
            } => {
                u16_(buf, 0);
                put_short_str(buf, destination, "exchange name")?;
                put_short_str(buf, source, "exchange name")?;
                put_short_str(buf, routing_key, "routing key")?;
                buf.push(bits(&[*no_wait]));
                put_table(buf, arguments)?;
            }
            QueueDeclare {
                queue,
                passive,
                durable,
                exclusive,
                auto_delete,
                no_wait,
                arguments,
            } => {
                u16_(buf, 0);
                put_short_str(buf, queue, "queue name")?;
                buf.push(bits(&[
                    *passive,
                    *durable,
                    *exclusive,
                    *auto_delete,
                    *no_wait,
                ]));
                put_table(buf, arguments)?;
            }
            QueueDeclareOk {
                queue,
                message_count,
                consumer_count,
            } => {
                put_short_str(buf, queue, "queue name")?;
                u32_(buf, *message_count);
                u32_(buf, *consumer_count);
            }
            QueueBind {
                queue,
                exchange,
                routing_key,
                no_wait,
                arguments,
            } => {
                u16_(buf, 0);
                put_short_str(buf, queue, "queue name")?;
                put_short_str(buf, exchange, "exchange name")?;
                put_short_str(buf, routing_key, "routing key")?;
                buf.push(bits(&[*no_wait]));
                put_table(buf, arguments)?;
            }
            QueuePurge { queue, no_wait } => {
                u16_(buf, 0);
                put_short_str(buf, queue, "queue name")?;
                buf.push(bits(&[*no_wait]));
            }
            QueuePurgeOk { message_count } | QueueDeleteOk { message_count } => {
                u32_(buf, *message_count)
            }
            QueueDelete {
                queue,
                if_unused,
                if_empty,
                no_wait,
            } => {
                u16_(buf, 0);
                put_short_str(buf, queue, "queue name")?;
                buf.push(bits(&[*if_unused, *if_empty, *no_wait]));
            }
            QueueUnbind {
                queue,
                exchange,
                routing_key,
                arguments,
            } => {
                u16_(buf, 0);
                put_short_str(buf, queue, "queue name")?;
                put_short_str(buf, exchange, "exchange name")?;
                put_short_str(buf, routing_key, "routing key")?;
                put_table(buf, arguments)?;
            }
            BasicQos {
                prefetch_size,
                prefetch_count,
                global,
            } => {
                u32_(buf, *prefetch_size);
                u16_(buf, *prefetch_count);
                buf.push(bits(&[*global]));
            }
            BasicConsume {
                queue,
                consumer_tag,
                no_local,
                no_ack,
                exclusive,
                no_wait,
                arguments,
            } => {
                u16_(buf, 0);
                put_short_str(buf, queue, "queue name")?;
                put_short_str(buf, consumer_tag, "consumer tag")?;
                buf.push(bits(&[*no_local, *no_ack, *exclusive, *no_wait]));
                put_table(buf, arguments)?;
            }
            BasicConsumeOk { consumer_tag } | BasicCancelOk { consumer_tag } => {
                put_short_str(buf, consumer_tag, "consumer tag")?
            }
            BasicCancel {
                consumer_tag,
                no_wait,
            } => {
                put_short_str(buf, consumer_tag, "consumer tag")?;
                buf.push(bits(&[*no_wait]));
            }
            BasicPublish {
                exchange,
                routing_key,
                mandatory,
                immediate,
            } => {
                u16_(buf, 0);
                put_short_str(buf, exchange, "exchange name")?;
                put_short_str(buf, routing_key, "routing key")?;
                buf.push(bits(&[*mandatory, *immediate]));
            }
            BasicReturn {
                reply_code,
                reply_text,
                exchange,
                routing_key,
            } => {
                u16_(buf, *reply_code);
                put_short_bytes(buf, reply_text, "reply text")?;
                put_short_bytes(buf, exchange, "exchange name")?;
                put_short_bytes(buf, routing_key, "routing key")?;
            }
            BasicDeliver {
                consumer_tag,
                delivery_tag,
                redelivered,
                exchange,
                routing_key,
            } => {
                put_short_str(buf, consumer_tag, "consumer tag")?;
                u64_(buf, *delivery_tag);
                buf.push(bits(&[*redelivered]));
                put_short_bytes(buf, exchange, "exchange name")?;
                put_short_bytes(buf, routing_key, "routing key")?;
            }
            BasicGet { queue, no_ack } => {
                u16_(buf, 0);
                put_short_str(buf, queue, "queue name")?;
                buf.push(bits(&[*no_ack]));
            }
            BasicGetOk {
                delivery_tag,
                redelivered,
                exchange,
                routing_key,
                message_count,
            } => {
                u64_(buf, *delivery_tag);
                buf.push(bits(&[*redelivered]));
                put_short_bytes(buf, exchange, "exchange name")?;
                put_short_bytes(buf, routing_key, "routing key")?;
                u32_(buf, *message_count);
            }
            BasicGetEmpty => buf.push(0),
            BasicAck {
                delivery_tag,
                multiple,
            } => {
                u64_(buf, *delivery_tag);
                buf.push(bits(&[*multiple]));
            }
            BasicReject {
                delivery_tag,
                requeue,
            } => {
                u64_(buf, *delivery_tag);
                buf.push(bits(&[*requeue]));
            }
            BasicRecover { requeue } => buf.push(bits(&[*requeue])),
            BasicNack {
                delivery_tag,
                multiple,
                requeue,
            } => {
                u64_(buf, *delivery_tag);
                buf.push(bits(&[*multiple, *requeue]));
            }
            ConfirmSelect { no_wait } => buf.push(bits(&[*no_wait])),
            Unknown { .. } => {
                return Err(Error::Amqp(format!(
                    "cannot encode unknown method {class_id}.{method_id}"
                )))
            }
        }
        Ok(())
    }
}
