//! Search tools: `glob`, `grep`, `symbols`, and the directory walk (with its ignore-file reader) they share.

pub mod glob;
pub mod grep;
pub mod lang;
pub mod symbols;
pub mod walk;
pub mod walk_ignores;
