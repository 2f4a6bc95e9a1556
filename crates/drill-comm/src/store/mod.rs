//! The rendezvous store: a TCP key-value server (hosted by rank 0 or by the launcher) and its
//! client. Rendezvous, the NCCL unique-id exchange and barriers build on it.

mod client;
mod proto;
mod server;

pub use client::Store;
pub use server::StoreServer;
