//! rmq-backup: back up RabbitMQ queues and topology to storage and restore them.

pub mod amqp;
pub mod broker;
pub mod error;

pub use error::{Error, Result};
