//! Hidden and protected paths that stay put: what each was when the daemon took it on, the
//! check that it still is, and the directories to pin above it.
//!
//! The mounts that hide a path (`sandbox.hide`, `SandboxSettings::secret_files`) or make it
//! read-only (`SandboxSettings::protected`) are made per command, by path, in the command's
//! own mount namespace. A command cannot rename or remove a mount point of its namespace
//! (`EBUSY`), but without more it could rename a directory above one; the next command's
//! mounts, made at the old path, would then find nothing, and the path's content would be
//! readable (or writable) under its new name. So:
//!
//! - every directory between the outermost writable path that holds a guarded path and that
//!   path (exclusive of the writable path, inclusive of the path's parent) is bound onto
//!   itself first ([`pins`]): a mount point in the command's namespace, which no command can
//!   rename, exchange (`renameat2(RENAME_EXCHANGE)`) or remove. The writable path itself
//!   cannot be renamed: its parent is not writable (Landlock). Without Landlock every path
//!   the user owns is writable, so the pins start at `/`;
//! - each guarded path's identity (device, inode) is recorded when the daemon takes it on
//!   ([`Seal`]); before each command it must still be there with that identity, else no
//!   command runs ([`check`]). Whatever moved it (the user, a program, git), the command
//!   would otherwise read it under its new name;
//! - a hidden file with more names than are hidden would be readable under another one: no
//!   command runs either. A command cannot make a new name for it (`link` across the mount
//!   fails with `EXDEV`), nor reach it through a symlink (that resolves to the covered
//!   dentry), nor by handle (`open_by_handle_at` needs a capability).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::ConfineError;

/// What a guarded path was when the daemon took it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seal {
    /// Where it really is: canonical when it existed, else its canonical directory joined
    /// with its name (or the path as given). Mounts go here, never through a symlink that a
    /// command could later change.
    pub real: PathBuf,
    /// Device and inode, when it existed.
    pub identity: Option<(u64, u64)>,
}

impl Seal {
    /// `path` as it is now.
    pub fn now(path: &Path) -> Seal {
        let real = std::fs::canonicalize(path)
            .ok()
            .or_else(|| {
                let dir = std::fs::canonicalize(path.parent()?).ok()?;
                Some(dir.join(path.file_name()?))
            })
            .unwrap_or_else(|| path.to_path_buf());
        let identity = std::fs::symlink_metadata(&real)
            .ok()
            .filter(|m| !m.file_type().is_symlink())
            .map(|m| (m.dev(), m.ino()));
        Seal { real, identity }
    }
}

/// The seals of the guarded paths, by the path as the settings hold it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seals(BTreeMap<PathBuf, Seal>);

impl Seals {
    /// Records `path` as it is now, unless it was recorded before (the first record stands:
    /// it is the one from when the daemon started).
    pub fn record(&mut self, path: &Path) {
        if !self.0.contains_key(path) {
            self.0.insert(path.to_path_buf(), Seal::now(path));
        }
    }

    /// The seal of `path`; one made now for a path never recorded (settings made by hand).
    pub fn of(&self, path: &Path) -> Seal {
        self.0.get(path).cloned().unwrap_or_else(|| Seal::now(path))
    }
}

/// Why a path is guarded, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `sandbox.hide` (and the model's `api-key-file`).
    Hidden,
    /// A file the daemon keeps for itself (the receipt chain key).
    Secret,
    /// The daemon's record, read-only to commands.
    Protected,
}

impl Role {
    fn what(self) -> &'static str {
        match self {
            Role::Hidden => "hidden from commands by sandbox.hide",
            Role::Secret => "the receipt chain key, hidden from commands",
            Role::Protected => "part of the daemon's record, read-only to commands",
        }
    }

    fn risk(self) -> &'static str {
        match self {
            Role::Hidden | Role::Secret => "read",
            Role::Protected => "change",
        }
    }
}

/// A guarded path as it is now, checked against its seal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Where it is (the seal's real path).
    pub real: PathBuf,
    /// Device and inode now (the same as the seal's, when it had one).
    pub identity: (u64, u64),
    /// A directory (else a file of any other type).
    pub is_dir: bool,
    /// Its link count.
    pub links: u64,
}

/// The path sealed as `seal` (guarded as `role`) now: `Ok(None)` when there is nothing to
/// mount (it did not exist when sealed and does not now, or is a symlink a command may have
/// put there), an error naming it when it is not what was sealed.
pub fn check(seal: &Seal, role: Role) -> Result<Option<Target>, ConfineError> {
    let meta = match std::fs::symlink_metadata(&seal.real) {
        Ok(meta) => meta,
        Err(e) => {
            if seal.identity.is_none() {
                return Ok(None);
            }
            let why = match e.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory => {
                    "is no longer there: it was moved or removed since taskdaemon started"
                        .to_string()
                }
                _ => format!("cannot be checked ({e})"),
            };
            return Err(changed(&seal.real, role, &why));
        }
    };
    let identity = (meta.dev(), meta.ino());
    if meta.file_type().is_symlink() || seal.identity.is_some_and(|sealed| sealed != identity) {
        if seal.identity.is_none() {
            // Made since (perhaps by a command): nothing of ours is there to guard.
            return Ok(None);
        }
        return Err(changed(
            &seal.real,
            role,
            "was moved or replaced since taskdaemon started: what is there now is not the file or directory it was",
        ));
    }
    Ok(Some(Target {
        real: seal.real.clone(),
        identity,
        is_dir: meta.is_dir(),
        links: meta.nlink(),
    }))
}

fn changed(path: &Path, role: Role, why: &str) -> ConfineError {
    ConfineError::Changed(format!(
        "{} ({}) {why}, so no command runs: one could {} it under another name. Put it back, or restart taskdaemon to guard what is there now; tell the user",
        path.display(),
        role.what(),
        role.risk()
    ))
}

/// An error when the file `target` (guarded as `role`) has more links than it has guarded
/// names (`names`): a command could reach it under another one.
pub fn check_links(target: &Target, names: u64, role: Role) -> Result<(), ConfineError> {
    if target.is_dir || target.links <= names {
        return Ok(());
    }
    let hint = match role {
        Role::Hidden => {
            "give it a single name (copy it, then remove the other links) or list every name in sandbox.hide"
        }
        Role::Secret | Role::Protected => {
            "give it a single name (copy it, then remove the other links)"
        }
    };
    Err(ConfineError::Changed(format!(
        "{} ({}) has {} hard links, so no command runs: one could {} it under another name; {hint}, and tell the user",
        target.real.display(),
        role.what(),
        target.links,
        role.risk()
    )))
}

/// The directories to bind onto themselves before the guarded `targets` are mounted, so that
/// no command can move them: for each target beneath a path of `roots` (the writable paths,
/// canonical), every directory strictly between the outermost such root and the target.
/// Directories within a `read_only` path are left out: that mount already keeps them in
/// place (read-only), and a pin inside it would become a writable copy when the read-only
/// mount is bound (recursively) over it. Sorted, so a directory comes before those in it.
pub fn pins(targets: &[&Path], read_only: &[&Path], roots: &[PathBuf]) -> Vec<PathBuf> {
    let mut pins = BTreeSet::new();
    for target in targets {
        let Some(root) = roots
            .iter()
            .filter(|r| target.starts_with(r) && target != r)
            .min_by_key(|r| r.components().count())
        else {
            continue;
        };
        for dir in target.ancestors().skip(1) {
            if !dir.starts_with(root) || dir == root.as_path() {
                break;
            }
            if !read_only.iter().any(|r| dir.starts_with(r)) {
                pins.insert(dir.to_path_buf());
            }
        }
    }
    pins.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn pins_are_the_directories_between_the_outermost_writable_root_and_each_target() {
        let roots = [p("/w"), p("/w/cache"), p("/tmp/t")];
        let pins = pins(
            &[
                Path::new("/w/conf/secrets"),
                Path::new("/w/a/b/c/deep.txt"),
                Path::new("/w/cache/x/key"),
                Path::new("/w/top.txt"),
                Path::new("/outside/key"),
                Path::new("/w"),
            ],
            &[],
            &roots,
        );
        assert_eq!(
            pins,
            [
                p("/w/a"),
                p("/w/a/b"),
                p("/w/a/b/c"),
                p("/w/cache"),
                p("/w/cache/x"),
                p("/w/conf")
            ]
        );
    }

    #[test]
    fn nothing_is_pinned_by_default_nor_inside_a_read_only_path() {
        let roots = [p("/w"), p("/tmp/t")];
        // The run record beside the worktrees, a key outside, .git at the root.
        let none = pins(
            &[
                Path::new("/runs/r1"),
                Path::new("/runs/r1/receipt-chain.key"),
                Path::new("/w/.git"),
            ],
            &[Path::new("/w/.git")],
            &roots,
        );
        assert!(none.is_empty(), "{none:?}");
        // A record under `.taskdaemon` (read-only): only what lies above that mount.
        let pins = pins(
            &[
                Path::new("/w/sub/.taskdaemon/runs/r1"),
                Path::new("/w/sub/.taskdaemon/runs/r1/receipt-chain.key"),
            ],
            &[
                Path::new("/w/sub/.taskdaemon"),
                Path::new("/w/sub/.taskdaemon/runs/r1"),
            ],
            &roots,
        );
        assert_eq!(pins, [p("/w/sub")]);
    }

    #[test]
    fn without_landlock_everything_above_a_target_is_pinned() {
        let pins = pins(&[Path::new("/home/u/.aws")], &[], &[p("/")]);
        assert_eq!(pins, [p("/home"), p("/home/u")]);
    }

    #[test]
    fn a_sealed_path_moved_replaced_or_gone_is_named_and_a_new_one_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let file = root.join("conf/key.txt");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "k").unwrap();
        let mut seals = Seals::default();
        seals.record(&file);
        let later = root.join("later.txt");
        seals.record(&later);
        let target = check(&seals.of(&file), Role::Hidden).unwrap().unwrap();
        assert!(!target.is_dir);
        assert_eq!(target.links, 1);
        assert_eq!(check(&seals.of(&later), Role::Hidden).unwrap(), None);

        // Replaced (a new inode at the same name).
        std::fs::rename(&file, root.join("old.txt")).unwrap();
        std::fs::write(&file, "decoy").unwrap();
        let err = check(&seals.of(&file), Role::Hidden)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("conf/key.txt") && err.contains("moved or replaced"),
            "{err}"
        );
        // Gone, also with its directory.
        std::fs::rename(root.join("conf"), root.join("conf2")).unwrap();
        let err = check(&seals.of(&file), Role::Protected)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no longer there") && err.contains("change it"),
            "{err}"
        );
        // A symlink put at a name that did not exist: not followed, not mounted.
        std::os::unix::fs::symlink("/etc/passwd", &later).unwrap();
        assert_eq!(check(&seals.of(&later), Role::Hidden).unwrap(), None);
        // The first record stands.
        seals.record(&file);
        assert!(check(&seals.of(&file), Role::Hidden).is_err());
    }

    #[test]
    fn a_file_with_more_links_than_guarded_names_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        std::fs::write(&file, "k").unwrap();
        std::fs::hard_link(&file, dir.path().join("other")).unwrap();
        let target = check(&Seal::now(&file), Role::Secret).unwrap().unwrap();
        let err = check_links(&target, 1, Role::Secret)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("2 hard links") && err.contains("read it"),
            "{err}"
        );
        assert!(check_links(&target, 2, Role::Secret).is_ok());
    }
}
