//! The rendezvous store: a TCP key-value server (hosted by rank 0 or by the launcher) and its
//! client. Rendezvous, the NCCL unique-id exchange, barriers and the
//! store [`Heartbeat`] build on it.

mod client;
mod heartbeat;
pub(crate) mod proto;
mod server;

pub use client::Store;
pub use heartbeat::{HEARTBEAT_DEAD, HEARTBEAT_EVERY, Heartbeat, Liveness};
pub use server::StoreServer;
