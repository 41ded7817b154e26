//! The receipts of a `tool exec` or `mcp` session (`--receipts LOG`): a chained log, its key
//! and, when the session ends, its session receipt.
//!
//! The key is `LOG.key` beside the log unless `--chain-key FILE` names another file; it is
//! made (random, mode 0600) when missing and used again by later sessions on the same log, so
//! the chain goes on across them. It must lie outside the worktree (the file tools could read
//! it there) and commands see it as an empty file. The session receipt is written to
//! `LOG.RECEIPT.json` when the session ends (end of input, client gone); a later session on
//! the same log replaces it with one that covers the longer log.
//!
//! The log itself must lie outside the worktree and the `sandbox.writable` paths, where
//! commands may write: a mount can keep a command from changing the log, but not from
//! taking the name `LOG.RECEIPT.json` before the session ends (a directory there, and the
//! session receipt can never be written), nor from emptying or locking the log's directory
//! for the daemon's temp file; a record the model's commands can shape is no record.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use td_confine::SandboxSettings;
use td_toolkit::receipts::ReceiptLog;
use td_toolkit::receipts::chain::{ChainKey, key_path_for_log};
use td_toolkit::receipts::session::{SessionEnd, SessionReceipt, session_path_for_log};

/// A session's chained receipt log.
pub struct ReceiptSession {
    log: Arc<ReceiptLog>,
    session_path: PathBuf,
    session_id: String,
    exec_id: String,
}

impl ReceiptSession {
    /// Opens `log` for chained receipts with the key at `chain_key` (default `LOG.key`),
    /// refusing a log where commands may write (`worktree`, `settings.writable`) and a key
    /// inside `worktree`, and hides the key from commands under `settings`.
    pub fn open(
        log: &Path,
        chain_key: Option<&Path>,
        worktree: &Path,
        exec_id: &str,
        settings: &mut SandboxSettings,
    ) -> Result<Self, String> {
        refuse_writable(log, worktree, &settings.writable)?;
        if let Some(parent) = log.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| {
                format!(
                    "cannot create the directory of the receipts log {}: {e}",
                    log.display()
                )
            })?;
        }
        let key_path = chain_key
            .map(Path::to_path_buf)
            .unwrap_or_else(|| key_path_for_log(log));
        refuse_inside(&key_path, worktree)?;
        let key = Arc::new(ChainKey::load_or_create(&key_path).map_err(|e| e.to_string())?);
        // Where the key really is (a relative path would name another file from a command's
        // working directory).
        let real = key_path.canonicalize().map_err(|e| {
            format!(
                "cannot resolve the receipt chain key {}: {e}",
                key_path.display()
            )
        })?;
        if let Err(why) = td_confine::hide_from_commands(settings, &real) {
            eprintln!(
                "taskdaemon: warning: {why}; a command that reads it could forge receipts of this log"
            );
        }
        let log = ReceiptLog::open_chained(log, key)
            .map_err(|e| format!("cannot open receipts log {}: {e}", log.display()))?;
        Ok(ReceiptSession {
            session_path: session_path_for_log(log.path()),
            log: Arc::new(log),
            session_id: uuid::Uuid::now_v7().to_string(),
            exec_id: exec_id.to_string(),
        })
    }

    /// The log.
    pub fn log(&self) -> &Arc<ReceiptLog> {
        &self.log
    }

    /// Where the session receipt goes.
    pub fn session_path(&self) -> &Path {
        &self.session_path
    }

    /// Writes the session receipt (the session ended).
    pub fn close(&self) -> Result<(), String> {
        let Some(key) = self.log.key() else {
            return Ok(());
        };
        let end = SessionEnd {
            session_id: self.session_id.clone(),
            exec_id: self.exec_id.clone(),
            status: "ended".to_string(),
            reason: None,
            validation: None,
            tool_set: self.log.tool_set(),
        };
        SessionReceipt::from_tally(end, &self.log.tally())
            .write(&self.session_path, key)
            .map_err(|e| e.to_string())
    }
}

/// An error when `log` (existing or not) lies where commands may write: inside `worktree` or
/// a `writable` path. Nothing is made before this check.
fn refuse_writable(log: &Path, worktree: &Path, writable: &[PathBuf]) -> Result<(), String> {
    let real = real_path(log)
        .map_err(|e| format!("cannot use {} as the receipts log: {e}", log.display()))?;
    let inside = std::iter::once((worktree, "the worktree"))
        .chain(
            writable
                .iter()
                .map(|w| (w.as_path(), "the sandbox.writable path")),
        )
        .find(|(dir, _)| dir.canonicalize().is_ok_and(|dir| real.starts_with(dir)));
    if let Some((dir, what)) = inside {
        return Err(format!(
            "the receipts log {} would lie inside {what} {}, where commands may write: a command could take the name of its session receipt ({}.RECEIPT.json) or move its directory, so the record would not be what the session did; put the log outside the worktree and the sandbox.writable paths",
            log.display(),
            dir.display(),
            log.file_name().unwrap_or_default().to_string_lossy()
        ));
    }
    Ok(())
}

/// Where `path` is (absolute, symlinks resolved), also when it or some of its directories do
/// not exist yet: its deepest existing ancestor resolved, and the rest appended (the missing
/// part holds no symlink; `..` there goes up lexically, as `create_dir_all` would).
fn real_path(path: &Path) -> std::io::Result<PathBuf> {
    let path = std::path::absolute(path)?;
    let mut rest = Vec::new();
    let mut base = path.as_path();
    let resolved = loop {
        match base.canonicalize() {
            Ok(real) => break real,
            Err(e) => {
                let (Some(parent), Some(name)) = (base.parent(), base.components().next_back())
                else {
                    return Err(e);
                };
                rest.push(name.as_os_str().to_os_string());
                base = parent;
            }
        }
    };
    let mut real = resolved;
    for name in rest.iter().rev() {
        if name == ".." {
            real.pop();
        } else if name != "." {
            real.push(name);
        }
    }
    Ok(real)
}

/// An error when `key` (existing or not) lies inside `worktree`.
fn refuse_inside(key: &Path, worktree: &Path) -> Result<(), String> {
    let root = worktree
        .canonicalize()
        .map_err(|e| format!("cannot open the worktree {}: {e}", worktree.display()))?;
    let real = match key.canonicalize() {
        Ok(real) => real,
        Err(_) => {
            let parent = key
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let parent = parent.canonicalize().map_err(|e| {
                format!(
                    "cannot use {} as the receipt chain key: its directory cannot be opened ({e})",
                    key.display()
                )
            })?;
            parent.join(key.file_name().unwrap_or_default())
        }
    };
    if real.starts_with(&root) {
        return Err(format!(
            "the receipt chain key {} would lie inside the worktree {}, where the tools could read it and forge receipts; put the receipts log outside the worktree or pass --chain-key FILE outside it",
            key.display(),
            worktree.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_inside_the_worktree_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let wt = dir.path().join("wt");
        std::fs::create_dir_all(wt.join("sub")).unwrap();
        let mut settings = SandboxSettings::default();
        let err = ReceiptSession::open(&wt.join("sub/r.jsonl"), None, &wt, "e", &mut settings)
            .err()
            .unwrap();
        assert!(err.contains("inside the worktree"), "{err}");
        assert!(!wt.join("sub/r.jsonl.key").exists());
        let err = ReceiptSession::open(
            &dir.path().join("r.jsonl"),
            Some(&wt.join("k")),
            &wt,
            "e",
            &mut settings,
        )
        .err()
        .unwrap();
        assert!(err.contains("--chain-key"), "{err}");
        let ok = ReceiptSession::open(&dir.path().join("r.jsonl"), None, &wt, "e", &mut settings)
            .unwrap();
        assert!(dir.path().join("r.jsonl.key").is_file());
        ok.close().unwrap();
        assert!(dir.path().join("r.jsonl.RECEIPT.json").is_file());
    }

    #[test]
    fn a_log_where_commands_may_write_is_refused_before_anything_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let wt = dir.path().join("wt");
        let shared = dir.path().join("shared");
        std::fs::create_dir_all(wt.join("sub")).unwrap();
        std::fs::create_dir_all(&shared).unwrap();
        std::os::unix::fs::symlink(&wt, dir.path().join("link")).unwrap();
        let key = dir.path().join("k");
        let mut settings = SandboxSettings {
            writable: vec![shared.clone()],
            ..SandboxSettings::default()
        };
        for log in [
            wt.join("logs/deeper/r.jsonl"),
            wt.join("sub/r.jsonl"),
            dir.path().join("link/logs/r.jsonl"),
            dir.path().join("elsewhere/../wt/r.jsonl"),
            shared.join("r.jsonl"),
        ] {
            let err = ReceiptSession::open(&log, Some(&key), &wt, "e", &mut settings)
                .err()
                .unwrap();
            assert!(err.contains("where commands may write"), "{err}");
        }
        assert!(!wt.join("logs").exists() && !key.exists());
        assert!(!dir.path().join("elsewhere").exists());
        assert_eq!(
            real_path(&dir.path().join("link/a/../b")).unwrap(),
            wt.canonicalize().unwrap().join("b")
        );
    }
}
