//! What every layer of TaskDaemon uses and none owns: cutting text, "did you mean",
//! writing paths for a model, crash-safe record writes and the tolerant JSONL reader, secret
//! redaction, hashing, locks and time. Depends on no other crate of the workspace.

pub mod hash;
pub mod jsonl;
pub mod record_io;
pub mod secrets;
pub mod shown_path;
pub mod suggest;
pub mod sync;
pub mod text;
pub mod time;
pub mod tree_copy;
