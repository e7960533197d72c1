//! The in-tree synchronous AMQP 0-9-1 client (DESIGN.md decision 1).

pub mod types;

pub use types::{BasicProperties, Delivery, FieldTable, FieldValue};
