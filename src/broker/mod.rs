//! The broker side: everything that talks to RabbitMQ. AMQP 0-9-1 (`amqp`), AMQP 1.0
//! (`amqp10`), the stream protocol (`stream`), the management API (`management`), TLS
//! (`tls`), publishing back over either protocol (`publisher`), the broker's version (`version`), its nodes (`nodes`), which queues a run selects
//! (`selection`), definitions (`definitions`) and how a queue is read without taking a message
//! away (`reader`). Data flows from here into records (`crate::repository::record`).

pub mod amqp;
pub mod amqp10;
pub mod definitions;
pub mod management;
pub mod nodes;
pub mod permissions;
pub mod publisher;
pub mod reader;
pub mod selection;
pub mod stream;
pub mod tls;
pub mod version;

pub use version::*;
