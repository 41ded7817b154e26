//! A throwaway copy of a project made a git repository of its own, so a run on it leaves the
//! original untouched.

use std::path::{Path, PathBuf};

/// Why a fresh copy could not be made; each message names the directory.
#[derive(Debug, thiserror::Error)]
pub enum FreshCopyError {
    /// The project could not be copied.
    #[error("cannot copy {} to {}: {source}", src.display(), dest.display())]
    Copy {
        /// The project.
        src: PathBuf,
        /// Where the copy was to go.
        dest: PathBuf,
        /// What the copy met.
        source: std::io::Error,
    },
    /// The `git` program could not be started.
    #[error("cannot run git: {0}")]
    GitUnavailable(#[source] std::io::Error),
    /// A git command failed.
    #[error("git {command} failed in {}: {stderr}", dir.display())]
    Git {
        /// Its arguments, joined by spaces.
        command: String,
        /// Where it ran (the copy).
        dir: PathBuf,
        /// What git printed on stderr, trimmed.
        stderr: String,
    },
}

/// Copies `src` (without its `.git`) to `dest` and makes the copy a git repository with one
/// commit on `main`, so a run on it leaves the original untouched.
pub async fn fresh_copy(src: &Path, dest: &Path) -> Result<PathBuf, FreshCopyError> {
    td_base::tree_copy::copy_tree(src, dest).map_err(|source| FreshCopyError::Copy {
        src: src.to_path_buf(),
        dest: dest.to_path_buf(),
        source,
    })?;
    let _ = std::fs::remove_dir_all(dest.join(".git"));
    // The daemon's own git (no hooks, no fsmonitor, GIT_DIR and the like scrubbed: with
    // GIT_DIR set, `git init` here would act on another repository).
    let git = |args: &[&str]| {
        let mut c = tokio::process::Command::from(crate::daemon_git::command(dest));
        c.args([
            "-c",
            "user.name=TaskDaemon",
            "-c",
            "user.email=taskdaemon@localhost",
        ])
        .args(args);
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
            .map_err(FreshCopyError::GitUnavailable)?;
        if !out.status.success() {
            return Err(FreshCopyError::Git {
                command: args.join(" "),
                dir: dest.to_path_buf(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
    }
    Ok(dest.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_copy_is_a_repository_of_its_own_with_one_commit() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join(".git")).unwrap();
        std::fs::write(src.join(".git/HEAD"), "not the copy's\n").unwrap();
        std::fs::write(src.join("a.txt"), "a\n").unwrap();
        let dest = dir.path().join("copy");
        assert_eq!(fresh_copy(&src, &dest).await.unwrap(), dest);
        assert_eq!(
            std::fs::read_to_string(dest.join(".git/HEAD")).unwrap(),
            "ref: refs/heads/main\n"
        );
        assert!(crate::head::head_commit(&dest).is_some());
        assert_eq!(
            std::fs::read_to_string(src.join(".git/HEAD")).unwrap(),
            "not the copy's\n"
        );
    }

    #[tokio::test]
    async fn a_project_that_cannot_be_copied_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("missing");
        let err = fresh_copy(&src, &dir.path().join("copy"))
            .await
            .unwrap_err();
        assert!(matches!(err, FreshCopyError::Copy { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with(&format!("cannot copy {} to ", src.display())),
            "{err}"
        );
    }
}
