//! A run of loops: its on-disk record and the commands that read it back.

pub mod record;
pub mod status;
