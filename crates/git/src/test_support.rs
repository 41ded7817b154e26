//! Helpers of td-git's unit tests.

use std::process::Command;

/// Runs `cmd`, a test's own git command, and returns its stdout, trimmed; panics with the
/// command and git's stderr when it fails, unless `may_fail`.
pub(crate) fn git_stdout(cmd: &mut Command, may_fail: bool) -> String {
    let out = cmd.output().unwrap();
    assert!(
        may_fail || out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
