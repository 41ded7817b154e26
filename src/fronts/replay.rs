//! PLACEHOLDER: replay verification.

use std::path::Path;
use std::process::ExitCode;

/// `taskdaemon replay verify`.
pub async fn verify_command(
    _log: &Path,
    _worktree: &Path,
    _json: bool,
) -> Result<ExitCode, String> {
    Err("PLACEHOLDER: replay not implemented".to_string())
}
