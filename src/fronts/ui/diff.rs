//! A loop's diff against its base, for the dashboard: the work in its worktree while that
//! exists (committed or not, against the merge base of its base and its HEAD), otherwise its
//! branch against that merge base. Git runs as the daemon's own git (`td_git::daemon_git`:
//! no hooks, no fsmonitor, scrubbed environment), with no external diff or text conversion.

use std::io::Read;
use std::path::Path;
use std::process::Stdio;

/// Most bytes of diff returned.
pub const MAX_DIFF_BYTES: usize = 1024 * 1024;

/// A diff as the API returns it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Diff {
    /// What it is compared with.
    pub base: String,
    /// The loop's branch.
    pub branch: String,
    /// Unified diff text (cut at [`MAX_DIFF_BYTES`]).
    pub diff: String,
    /// Whether it was cut.
    pub truncated: bool,
}

/// Whether `name` can be given to git as a revision without being taken for an option or a
/// range.
pub fn plain_ref(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('-')
        && !name.contains("..")
        && !name.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// The diff of `branch` (or of the worktree at `worktree`, when given) against its merge
/// base with `base`, run in `dir`.
pub fn diff(dir: &Path, base: &str, branch: &str, worktree: bool) -> Result<Diff, String> {
    if !plain_ref(base) || !plain_ref(branch) {
        return Err("the loop's base or branch is not a plain git name".to_string());
    }
    let mut cmd = td_git::daemon_git::command(dir);
    cmd.args(["diff", "--no-color", "--no-ext-diff", "--no-textconv"]);
    let range = format!("{base}...{branch}");
    if worktree {
        cmd.args(["--merge-base", base]);
    } else {
        cmd.arg(&range);
    }
    cmd.arg("--").stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("cannot run git: {e}"))?;
    let mut out = Vec::new();
    let cap = u64::try_from(MAX_DIFF_BYTES)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    if let Some(stdout) = child.stdout.take() {
        stdout
            .take(cap)
            .read_to_end(&mut out)
            .map_err(|e| format!("cannot read git's output: {e}"))?;
    }
    let truncated = out.len() > MAX_DIFF_BYTES;
    if truncated {
        // The rest is not wanted: git ends on the closed pipe, or here.
        let _ = child.kill();
    }
    let mut err = Vec::new();
    if let Some(stderr) = child.stderr.take() {
        let _ = stderr.take(4096).read_to_end(&mut err);
    }
    let status = child.wait().map_err(|e| format!("git failed: {e}"))?;
    if !truncated && !status.success() {
        return Err(format!(
            "git diff failed: {}",
            String::from_utf8_lossy(&err).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out);
    let text = &text[..td_base::text::floor_char_boundary(&text, MAX_DIFF_BYTES)];
    Ok(Diff {
        base: base.to_string(),
        branch: branch.to_string(),
        diff: td_base::secrets::redact(text).into_owned(),
        truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_reach_git() {
        assert!(plain_ref("main") && plain_ref("taskdaemon/r/a"));
        for bad in ["", "-x", "--output=/tmp/x", "a..b", "a b", "a\nb"] {
            assert!(!plain_ref(bad), "{bad:?}");
        }
    }
}
