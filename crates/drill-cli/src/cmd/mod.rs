//! One module per subcommand: its arguments and a `run` that calls the libraries.

pub mod bench;
pub mod comm_bench;
pub mod env;
pub mod eval;
pub mod export;
pub mod launch;
pub mod plot;
pub mod train;
