//! The in-tree synchronous AMQP 0-9-1 client (DESIGN.md decision 1).
//!
//! - [`types`]: the shared wire values (field values and tables, properties, deliveries);
//! - [`codec`]: frames, methods, content headers and field tables, with RabbitMQ's type codes;
//! - [`url`]: `amqp://` URL parsing and masking;
//! - [`transport`]: the socket and the frame reader;
//! - [`connection`]: [`Connection`], [`Channel`], [`Consumer`] (one reader thread per connection;
//!   handshake, reader thread, channels, consuming and publishing in files of their own).

pub mod codec;
pub mod connection;
pub mod transport;
pub mod types;
pub mod url;

pub use connection::{
    Channel, ConfirmStatus, ConnectOptions, Connection, Consumer, GetOk, QueueDeclareOk, Returned,
};
pub use types::{BasicProperties, Delivery, FieldTable, FieldValue, WireProperties};
pub use url::AmqpUrl;
