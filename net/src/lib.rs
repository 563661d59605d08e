//! Data exchange between servers.
//!
//! This crate will carry network segments between workers over QUIC with credit-based flow
//! control. Weir currently runs in local mode only (one worker, exchange between shards through
//! `weir-engine`'s local exchange), so the crate holds no code yet.
#![warn(missing_docs)]
