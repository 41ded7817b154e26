//! Artifact tools: plans, specs and phases a loop writes as its output.

pub mod create_phase;
pub mod create_plan;
pub mod create_spec;
pub mod store;
