//! The methods of AMQP 0-9-1 this client speaks (`Method`), their ids and names.

use crate::broker::amqp::types::FieldTable;

/// Bytes that must never be printed (the SASL response of connection.start-ok holds the
/// password): `Debug` shows `****`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("****")
    }
}

/// The AMQP 0-9-1 methods this client sends or receives, with their arguments (reserved
/// arguments are written as zero/empty and skipped when read).
///
/// The exchange and routing key of `basic.deliver`, `basic.get-ok` and `basic.return` are kept
/// as raw bytes: a routing key that is not UTF-8 then fails that one message, not the connection.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Method {
    ConnectionStart {
        version_major: u8,
        version_minor: u8,
        server_properties: FieldTable,
        mechanisms: Vec<u8>,
        locales: Vec<u8>,
    },
    ConnectionStartOk {
        client_properties: FieldTable,
        mechanism: String,
        /// The SASL response: it holds the password, and its Debug prints `****`.
        response: Secret,
        locale: String,
    },
    ConnectionSecure {
        challenge: Vec<u8>,
    },
    ConnectionSecureOk {
        response: Vec<u8>,
    },
    ConnectionTune {
        channel_max: u16,
        frame_max: u32,
        heartbeat: u16,
    },
    ConnectionTuneOk {
        channel_max: u16,
        frame_max: u32,
        heartbeat: u16,
    },
    ConnectionOpen {
        vhost: String,
    },
    ConnectionOpenOk,
    ConnectionClose {
        reply_code: u16,
        reply_text: String,
        class_id: u16,
        method_id: u16,
    },
    ConnectionCloseOk,
    ConnectionBlocked {
        reason: String,
    },
    ConnectionUnblocked,
    ChannelOpen,
    ChannelOpenOk,
    ChannelFlow {
        active: bool,
    },
    ChannelFlowOk {
        active: bool,
    },
    ChannelClose {
        reply_code: u16,
        reply_text: String,
        class_id: u16,
        method_id: u16,
    },
    ChannelCloseOk,
    ExchangeDeclare {
        exchange: String,
        kind: String,
        passive: bool,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        no_wait: bool,
        arguments: FieldTable,
    },
    ExchangeDeclareOk,
    ExchangeDelete {
        exchange: String,
        if_unused: bool,
        no_wait: bool,
    },
    ExchangeDeleteOk,
    ExchangeBind {
        destination: String,
        source: String,
        routing_key: String,
        no_wait: bool,
        arguments: FieldTable,
    },
    ExchangeBindOk,
    QueueDeclare {
        queue: String,
        passive: bool,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        no_wait: bool,
        arguments: FieldTable,
    },
    QueueDeclareOk {
        queue: String,
        message_count: u32,
        consumer_count: u32,
    },
    QueueBind {
        queue: String,
        exchange: String,
        routing_key: String,
        no_wait: bool,
        arguments: FieldTable,
    },
    QueueBindOk,
    QueuePurge {
        queue: String,
        no_wait: bool,
    },
    QueuePurgeOk {
        message_count: u32,
    },
    QueueDelete {
        queue: String,
        if_unused: bool,
        if_empty: bool,
        no_wait: bool,
    },
    QueueDeleteOk {
        message_count: u32,
    },
    QueueUnbind {
        queue: String,
        exchange: String,
        routing_key: String,
        arguments: FieldTable,
    },
    QueueUnbindOk,
    BasicQos {
        prefetch_size: u32,
        prefetch_count: u16,
        global: bool,
    },
    BasicQosOk,
    BasicConsume {
        queue: String,
        consumer_tag: String,
        no_local: bool,
        no_ack: bool,
        exclusive: bool,
        no_wait: bool,
        arguments: FieldTable,
    },
    BasicConsumeOk {
        consumer_tag: String,
    },
    BasicCancel {
        consumer_tag: String,
        no_wait: bool,
    },
    BasicCancelOk {
        consumer_tag: String,
    },
    BasicPublish {
        exchange: String,
        routing_key: String,
        mandatory: bool,
        immediate: bool,
    },
    BasicReturn {
        reply_code: u16,
        reply_text: Vec<u8>,
        exchange: Vec<u8>,
        routing_key: Vec<u8>,
    },
    BasicDeliver {
        consumer_tag: String,
        delivery_tag: u64,
        redelivered: bool,
        exchange: Vec<u8>,
        routing_key: Vec<u8>,
    },
    BasicGet {
        queue: String,
        no_ack: bool,
    },
    BasicGetOk {
        delivery_tag: u64,
        redelivered: bool,
        exchange: Vec<u8>,
        routing_key: Vec<u8>,
        message_count: u32,
    },
    BasicGetEmpty,
    BasicAck {
        delivery_tag: u64,
        multiple: bool,
    },
    BasicReject {
        delivery_tag: u64,
        requeue: bool,
    },
    BasicRecover {
        requeue: bool,
    },
    BasicRecoverOk,
    BasicNack {
        delivery_tag: u64,
        multiple: bool,
        requeue: bool,
    },
    ConfirmSelect {
        no_wait: bool,
    },
    ConfirmSelectOk,
    /// A method this client does not know; logged and ignored.
    Unknown {
        class_id: u16,
        method_id: u16,
    },
}

impl Method {
    /// (class-id, method-id) of the method.
    pub fn ids(&self) -> (u16, u16) {
        use Method::*;
        match self {
            ConnectionStart { .. } => (10, 10),
            ConnectionStartOk { .. } => (10, 11),
            ConnectionSecure { .. } => (10, 20),
            ConnectionSecureOk { .. } => (10, 21),
            ConnectionTune { .. } => (10, 30),
            ConnectionTuneOk { .. } => (10, 31),
            ConnectionOpen { .. } => (10, 40),
            ConnectionOpenOk => (10, 41),
            ConnectionClose { .. } => (10, 50),
            ConnectionCloseOk => (10, 51),
            ConnectionBlocked { .. } => (10, 60),
            ConnectionUnblocked => (10, 61),
            ChannelOpen => (20, 10),
            ChannelOpenOk => (20, 11),
            ChannelFlow { .. } => (20, 20),
            ChannelFlowOk { .. } => (20, 21),
            ChannelClose { .. } => (20, 40),
            ChannelCloseOk => (20, 41),
            ExchangeDeclare { .. } => (40, 10),
            ExchangeDeclareOk => (40, 11),
            ExchangeDelete { .. } => (40, 20),
            ExchangeDeleteOk => (40, 21),
            ExchangeBind { .. } => (40, 30),
            ExchangeBindOk => (40, 31),
            QueueDeclare { .. } => (50, 10),
            QueueDeclareOk { .. } => (50, 11),
            QueueBind { .. } => (50, 20),
            QueueBindOk => (50, 21),
            QueuePurge { .. } => (50, 30),
            QueuePurgeOk { .. } => (50, 31),
            QueueDelete { .. } => (50, 40),
            QueueDeleteOk { .. } => (50, 41),
            QueueUnbind { .. } => (50, 50),
            QueueUnbindOk => (50, 51),
            BasicQos { .. } => (60, 10),
            BasicQosOk => (60, 11),
            BasicConsume { .. } => (60, 20),
            BasicConsumeOk { .. } => (60, 21),
            BasicCancel { .. } => (60, 30),
            BasicCancelOk { .. } => (60, 31),
            BasicPublish { .. } => (60, 40),
            BasicReturn { .. } => (60, 50),
            BasicDeliver { .. } => (60, 60),
            BasicGet { .. } => (60, 70),
            BasicGetOk { .. } => (60, 71),
            BasicGetEmpty => (60, 72),
            BasicAck { .. } => (60, 80),
            BasicReject { .. } => (60, 90),
            BasicRecover { .. } => (60, 110),
            BasicRecoverOk => (60, 111),
            BasicNack { .. } => (60, 120),
            ConfirmSelect { .. } => (85, 10),
            ConfirmSelectOk => (85, 11),
            Unknown {
                class_id,
                method_id,
            } => (*class_id, *method_id),
        }
    }

    /// The method's name as in the specification (`basic.deliver`), for logs and errors.
    pub fn name(&self) -> &'static str {
        method_name(self.ids())
    }

    /// True for methods followed by a content header and body (publish, return, deliver, get-ok).
    pub fn has_content(&self) -> bool {
        matches!(
            self,
            Method::BasicPublish { .. }
                | Method::BasicReturn { .. }
                | Method::BasicDeliver { .. }
                | Method::BasicGetOk { .. }
        )
    }
}

/// Texts written by the broker for people (reply texts, blocked reasons): invalid UTF-8 is
/// replaced rather than failing, since no message data is involved.
pub(super) fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The specification name of a method, from its (class-id, method-id).
pub fn method_name(ids: (u16, u16)) -> &'static str {
    match ids {
        (10, 10) => "connection.start",
        (10, 11) => "connection.start-ok",
        (10, 20) => "connection.secure",
        (10, 21) => "connection.secure-ok",
        (10, 30) => "connection.tune",
        (10, 31) => "connection.tune-ok",
        (10, 40) => "connection.open",
        (10, 41) => "connection.open-ok",
        (10, 50) => "connection.close",
        (10, 51) => "connection.close-ok",
        (10, 60) => "connection.blocked",
        (10, 61) => "connection.unblocked",
        (20, 10) => "channel.open",
        (20, 11) => "channel.open-ok",
        (20, 20) => "channel.flow",
        (20, 21) => "channel.flow-ok",
        (20, 40) => "channel.close",
        (20, 41) => "channel.close-ok",
        (40, 10) => "exchange.declare",
        (40, 11) => "exchange.declare-ok",
        (40, 20) => "exchange.delete",
        (40, 21) => "exchange.delete-ok",
        (40, 30) => "exchange.bind",
        (40, 31) => "exchange.bind-ok",
        (50, 10) => "queue.declare",
        (50, 11) => "queue.declare-ok",
        (50, 20) => "queue.bind",
        (50, 21) => "queue.bind-ok",
        (50, 30) => "queue.purge",
        (50, 31) => "queue.purge-ok",
        (50, 40) => "queue.delete",
        (50, 41) => "queue.delete-ok",
        (50, 50) => "queue.unbind",
        (50, 51) => "queue.unbind-ok",
        (60, 10) => "basic.qos",
        (60, 11) => "basic.qos-ok",
        (60, 20) => "basic.consume",
        (60, 21) => "basic.consume-ok",
        (60, 30) => "basic.cancel",
        (60, 31) => "basic.cancel-ok",
        (60, 40) => "basic.publish",
        (60, 50) => "basic.return",
        (60, 60) => "basic.deliver",
        (60, 70) => "basic.get",
        (60, 71) => "basic.get-ok",
        (60, 72) => "basic.get-empty",
        (60, 80) => "basic.ack",
        (60, 90) => "basic.reject",
        (60, 110) => "basic.recover",
        (60, 111) => "basic.recover-ok",
        (60, 120) => "basic.nack",
        (85, 10) => "confirm.select",
        (85, 11) => "confirm.select-ok",
        _ => "unknown method",
    }
}
