//! What the control crate's tests share.

pub mod postgres;
