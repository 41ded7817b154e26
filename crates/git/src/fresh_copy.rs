//! A throwaway copy of a project made a git repository of its own, so a run on it leaves the
//! original untouched.

use std::path::{Path, PathBuf};

/// Copies `src` (without its `.git`) to `dest` and makes the copy a git repository with one
/// commit on `main`, so a run on it leaves the original untouched.
pub async fn fresh_copy(src: &Path, dest: &Path) -> Result<PathBuf, String> {
    td_base::tree_copy::copy_tree(src, dest)
        .map_err(|e| format!("cannot copy {} to {}: {e}", src.display(), dest.display()))?;
    let _ = std::fs::remove_dir_all(dest.join(".git"));
    let git = |args: &[&str]| {
        let mut c = tokio::process::Command::new("git");
        c.args([
            "-c",
            "user.name=TaskDaemon",
            "-c",
            "user.email=taskdaemon@localhost",
        ])
        // A global `core.hooksPath` would otherwise run hooks on the copy's first commit.
        .args(crate::daemon_git::NO_HOOKS)
        .args(args)
        .current_dir(dest)
        .stdin(std::process::Stdio::null());
        c
    };
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["add", "-A"][..],
        &["commit", "-q", "-m", "sample project"][..],
    ] {
        let out = git(args)
            .output()
            .await
            .map_err(|e| format!("cannot run git: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "git {} failed in {}: {}",
                args.join(" "),
                dest.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    Ok(dest.to_path_buf())
}
