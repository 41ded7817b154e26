//! Which `.gitattributes` the daemon's own git reads: those of a commit the user made, never
//! what a loop wrote to a tree, an index or a worktree.
//!
//! Attributes name drivers (`filter=x`, `diff=x`, `merge=x`) and git runs the programs the
//! config gives those names (`filter.x.clean`, `diff.x.textconv`, `merge.x.driver`, git-lfs's
//! `filter.lfs.process`). The daemon's git is unconfined and works on what loops wrote: it adds
//! a loop's worktree for its checkpoint commits, checks a loop's commits out, merges and diffs
//! them. A loop that writes `* filter=lfs` beside a `.lfsconfig` of its own would have the
//! daemon's git-lfs fetch from a URL the loop chose, with the user's credentials, outside every
//! sandbox; any other driver the user configured runs on files the loop picked.
//!
//! - git 2.42 and newer: `--attr-source=<commit>`, git reads attributes from that commit's
//!   tree only, so no `.gitattributes` a loop wrote counts. The commit is the one [`trust`]ed
//!   for the repository (the run's base, a commit the user made: their end-of-line rules, LFS
//!   clean filter and merge drivers keep applying to what loops write), else the empty tree
//!   of the repository's object format (a transfer's quarantine, a repository nobody trusted a
//!   commit of: no attributes at all). The repository's format and common directory are known
//!   once per directory: read from its files where they say them, else asked of git as it
//!   discovers the repository and then with the directory as its `--git-dir`, for a bare
//!   mirror under `safe.bareRepository=explicit`. `$GIT_DIR/info/attributes` and
//!   `core.attributesFile`, the user's own and out of a loop's reach, still count. git passes
//!   the source on to the git processes it starts (`GIT_ATTR_SOURCE`). Where git names no
//!   format, the source is a name no tree has: git refuses any command that would read
//!   attributes, and runs the rest (`git init`, `check-ref-format`).
//! - older git cannot be told where to read attributes. Every driver the config defines is
//!   turned off for the command instead (`--config-env`, which wins over every config file,
//!   reaches git's own children, and takes a driver's name whatever its bytes): a filter passes
//!   content through unchanged (its commands empty, not `required`); a textconv is `cat` (the
//!   file as it is); an external diff and a merge driver are `false`, so a diff that would
//!   have used one fails and a merge that would have used one stops as a conflict, where
//!   running the user's program would have been the loop's choice. The config is asked again
//!   for a directory once a second has passed (one `git config` more then): a driver the user
//!   adds during a run is covered a second later. When the config cannot be listed, the
//!   command gets a `-c` git refuses, so it does not run. Attributes that name no driver
//!   (`text`, `eol`) still come from wherever git reads them.
//!
//! git-lfs fetches nothing for the daemon's git (`NO_LFS_FETCH`, see [`crate::daemon_git`]):
//! its smudge fills checkouts from the repository's own LFS objects and leaves the pointer
//! of one it lacks. The loops' own git, confined, reads attributes as usual.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use crate::head::FormatByFiles;

/// The first git that takes `--attr-source`.
pub const ATTR_SOURCE_SINCE: (u32, u32) = (2, 42);

/// The empty tree's id in each object format git knows.
const EMPTY_TREES: [(&str, &str); 2] = [
    ("sha1", "4b825dc642cb6eb9a060e54bf8d69288fbee4904"),
    (
        "sha256",
        "6ef19b41225c5369f1c104d45d8d85efa9b057b53b14b4b9b939dd74decc5321",
    ),
];

/// What `--attr-source` gets in a repository whose object format the daemon does not know:
/// no tree has this name, so git refuses the command ("bad --attr-source") rather than read
/// the worktree's attributes.
const NO_TREE: &str = "taskdaemon-knows-no-empty-tree-of-this-object-format";

/// Directories whose object format (or, below git 2.42, drivers) are kept (each worktree and
/// transfer quarantine is one); past this the cache starts again.
const MAX_KNOWN_DIRS: usize = 1024;

/// How long the drivers a directory's config defines are taken as known (below git 2.42):
/// asking git for every command made a run of 20 small loops ~55% slower; a driver the user
/// adds to the config is turned off from at most this long after.
const DRIVERS_RECHECKED_AFTER: Duration = Duration::from_secs(1);

/// Longest `git config --get-regexp` output taken; past it the drivers count as unlisted (the
/// command is refused).
const MAX_CONFIG_OUTPUT: usize = 1 << 20;

/// Makes `cmd`, a git command run in `dir`, read no `.gitattributes`, or, below git 2.42, run
/// no driver an attribute names (see the module docs): options before the subcommand, and the
/// environment they name. When git cannot answer what the guard needs, the command gets
/// options that make git refuse it where it would read attributes. Blocking: may run git once
/// (off the async workers).
pub(crate) fn guard(cmd: &mut Command, dir: &Path) {
    match git_version() {
        Some(version) if version >= ATTR_SOURCE_SINCE => {
            cmd.arg(attr_source(dir));
        }
        _ => match drivers_off_cached(dir) {
            Some(overrides) => apply(cmd, &overrides),
            None => {
                cmd.args(["-c", CONFIG_UNREADABLE]);
            }
        },
    }
}

/// Gives `cmd` the `overrides`: a `--config-env` each, and the variables they name.
fn apply(cmd: &mut Command, overrides: &Overrides) {
    for (key, value) in overrides {
        let mut option = OsString::from("--config-env=");
        option.push(OsStr::from_bytes(key));
        option.push("=");
        option.push(value.variable());
        cmd.arg(option);
    }
    for value in [Value::Empty, Value::False, Value::Cat] {
        cmd.env(value.variable(), value.text());
    }
}

/// A `-c` git refuses for every command ("key does not contain a section"), given when the
/// config's drivers could not be listed: no driver can then be turned off, so nothing runs.
const CONFIG_UNREADABLE: &str = "taskdaemon-could-not-list-the-drivers-of-the-git-config=1";

/// What a driver's setting is overridden with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    /// No command: a filter passes content through.
    Empty,
    /// `false`: a program that fails, so git stops where it would have run the driver.
    False,
    /// `cat`: a textconv that shows the file as it is.
    Cat,
}

impl Value {
    /// The environment variable `--config-env` reads it from (the value cannot go on the
    /// command line as `-c key=value`: git splits that at the first `=`, and a driver's name
    /// may hold one; `--config-env` splits at the last).
    fn variable(self) -> &'static str {
        match self {
            Value::Empty => "TASKDAEMON_GIT_DRIVER_OFF",
            Value::False => "TASKDAEMON_GIT_DRIVER_FAILS",
            Value::Cat => "TASKDAEMON_GIT_TEXTCONV_AS_IS",
        }
    }

    fn text(self) -> &'static str {
        match self {
            Value::Empty => "",
            Value::False => "false",
            Value::Cat => "cat",
        }
    }
}

/// Overrides: `(config key, value)`; a key is bytes as git printed it (a driver's name may be
/// any bytes but a newline).
type Overrides = Vec<(Vec<u8>, Value)>;

/// When a directory's drivers were asked of git, and the overrides they gave.
type AskedDrivers = (Instant, Arc<Overrides>);

/// [`drivers_off`] for `dir`, asked of git again once [`DRIVERS_RECHECKED_AFTER`] has passed;
/// a failure to ask is not kept.
fn drivers_off_cached(dir: &Path) -> Option<Arc<Overrides>> {
    static KNOWN: OnceLock<Mutex<HashMap<PathBuf, AskedDrivers>>> = OnceLock::new();
    let known = KNOWN.get_or_init(Default::default);
    let now = Instant::now();
    let fresh = known.lock().ok().and_then(|known| {
        known
            .get(dir)
            .filter(|(asked, _)| now.duration_since(*asked) < DRIVERS_RECHECKED_AFTER)
            .map(|(_, overrides)| Arc::clone(overrides))
    });
    if let Some(overrides) = fresh {
        return Some(overrides);
    }
    let overrides = Arc::new(crate::head::off_async_workers(|| drivers_off(dir))?);
    keep(known, dir, (now, Arc::clone(&overrides)));
    Some(overrides)
}

/// Keeps `value` for `dir` in `known`, which starts again past [`MAX_KNOWN_DIRS`].
fn keep<V>(known: &Mutex<HashMap<PathBuf, V>>, dir: &Path, value: V) {
    if let Ok(mut known) = known.lock() {
        if known.len() >= MAX_KNOWN_DIRS {
            known.clear();
        }
        known.insert(dir.to_path_buf(), value);
    }
}

/// What the guard knows of the repository a directory is in, or is (git 2.42 and newer).
#[derive(Debug, Clone)]
struct Seen {
    /// Its object format, as git names it.
    format: String,
    /// Its common directory (shared refs and objects), resolved; `None` when it could not be
    /// resolved (then no commit of it is trusted).
    common_dir: Option<PathBuf>,
}

/// A commit [`trust`]ed in a repository.
#[derive(Debug, Clone)]
struct Trusted {
    /// Its id.
    commit: String,
    /// Whether its tree holds a `.gitattributes` anywhere: without one it says what the empty
    /// tree says, which git reads without looking up an object (naming the commit made 40
    /// loops over 4 hosts ~4% slower, most repositories having none).
    has_attributes: bool,
}

/// The commit whose `.gitattributes` the daemon's git reads in each repository, by its
/// resolved common directory (see [`trust`]).
fn trusted() -> &'static RwLock<HashMap<PathBuf, Trusted>> {
    static TRUSTED: OnceLock<RwLock<HashMap<PathBuf, Trusted>>> = OnceLock::new();
    TRUSTED.get_or_init(Default::default)
}

/// Why [`trust`] refused a commit.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TrustError {
    /// Not a full object id in lowercase hex.
    #[error("{0:?} is not a full commit id")]
    NotAnId(String),
    /// No repository (or none whose common directory git names) holds the directory.
    #[error("{0} is in no repository git names")]
    NoRepository(PathBuf),
    /// The id's length is not the repository's object format's.
    #[error("{id} is not an id of the {format} repository at {dir}")]
    OtherFormat {
        /// The id given.
        id: String,
        /// The repository's format.
        format: String,
        /// The directory given.
        dir: PathBuf,
    },
    /// The repository has no such commit.
    #[error("the repository at {dir} has no commit {id}")]
    NoSuchCommit {
        /// The id given.
        id: String,
        /// The directory given.
        dir: PathBuf,
    },
}

/// From now on, the daemon's git (2.42 and newer) reads `.gitattributes` from `commit` in the
/// repository `dir` is in, or is, and in all of its worktrees: the attributes of a commit the
/// user made (the run's base), which a loop cannot change, so the user's end-of-line rules,
/// LFS clean filter and merge drivers keep working on what loops wrote, while what a loop
/// commits to `.gitattributes` names nothing the daemon's git runs. A later call for the same
/// repository replaces the commit; a refused one leaves the repository with no commit
/// trusted (no attributes read). Below git 2.42 this changes nothing (every driver stays off:
/// such a git cannot be told where to read attributes). Blocking: may run git twice.
pub fn trust(dir: &Path, commit: &str) -> Result<(), TrustError> {
    let trusted_now = trust_checked(dir, commit);
    if trusted_now.is_err() {
        distrust(dir);
    }
    trusted_now
}

/// From now on the daemon's git reads no `.gitattributes` in the repository `dir` is in, or
/// is (the commit [`trust`]ed there is forgotten). Blocking: may run git once.
pub fn distrust(dir: &Path) {
    if let Some(common_dir) = seen_cached(dir).and_then(|s| s.common_dir)
        && let Ok(mut trusted) = trusted().write()
    {
        trusted.remove(&common_dir);
    }
}

/// [`trust`], without forgetting what was trusted before when it refuses.
fn trust_checked(dir: &Path, commit: &str) -> Result<(), TrustError> {
    let is_id = matches!(commit.len(), 40 | 64)
        && commit
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !is_id {
        return Err(TrustError::NotAnId(commit.to_string()));
    }
    let seen = seen_cached(dir);
    let Some((format, common_dir)) = seen.and_then(|s| Some((s.format, s.common_dir?))) else {
        return Err(TrustError::NoRepository(dir.to_path_buf()));
    };
    let length = match format.as_str() {
        "sha1" => 40,
        "sha256" => 64,
        _ => 0,
    };
    if commit.len() != length {
        return Err(TrustError::OtherFormat {
            id: commit.to_string(),
            format,
            dir: dir.to_path_buf(),
        });
    }
    // Trusted already (a host is told it with each loop's start): checked then, and a
    // repository keeps its commits (a git per start made a host's loops ~2.5 ms dearer).
    let known = trusted()
        .read()
        .ok()
        .is_some_and(|t| t.get(&common_dir).is_some_and(|t| t.commit == commit));
    if known {
        return Ok(());
    }
    // A commit the repository lacks would make git refuse every command that reads
    // attributes there.
    let has_attributes =
        crate::head::off_async_workers(|| has_attributes(dir, &common_dir, commit)).ok_or_else(
            || TrustError::NoSuchCommit {
                id: commit.to_string(),
                dir: dir.to_path_buf(),
            },
        )?;
    if let Ok(mut trusted) = trusted().write() {
        trusted.insert(
            common_dir,
            Trusted {
                commit: commit.to_string(),
                has_attributes,
            },
        );
    }
    Ok(())
}

/// Whether `commit`'s tree holds a `.gitattributes` at any depth (read as git lists it, a
/// name at a time, stopping at the first); `None` when the repository at `common_dir` has no
/// such commit or git cannot list it. Blocking: runs git.
fn has_attributes(dir: &Path, common_dir: &Path, commit: &str) -> Option<bool> {
    use std::io::BufRead;
    let mut git_dir = OsString::from("--git-dir=");
    git_dir.push(common_dir);
    let mut child = crate::daemon_git::unguarded(dir)
        .arg(git_dir)
        .args([
            "ls-tree",
            "-r",
            "-z",
            "--name-only",
            &format!("{commit}^{{commit}}"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut found = false;
    if let Some(out) = child.stdout.take() {
        let mut names = std::io::BufReader::new(out);
        let mut name = Vec::new();
        while names.read_until(0, &mut name).ok()? > 0 {
            let path = name.strip_suffix(b"\0").unwrap_or(&name);
            let base = path.rsplit(|b| *b == b'/').next().unwrap_or_default();
            if base == b".gitattributes" {
                found = true;
                break;
            }
            name.clear();
        }
    }
    if found {
        // The rest of the list is not needed.
        let _ = child.kill();
        let _ = child.wait();
        return Some(true);
    }
    child.wait().ok()?.success().then_some(false)
}

/// `--attr-source=` for the repository `dir` is in, or is (a bare repository or a git
/// directory, which the transfer code names with `--git-dir`): the commit [`trust`]ed there,
/// else the empty tree of its object format. Where git names no object format for it, an
/// attribute source git refuses (outside a repository, `git init` and `git check-ref-format`
/// read no attributes and run as usual).
fn attr_source(dir: &Path) -> OsString {
    let source = match seen_cached(dir) {
        Some(seen) => seen
            .common_dir
            .and_then(|common| {
                let trusted = trusted().read().ok()?.get(&common)?.clone();
                trusted.has_attributes.then_some(trusted.commit)
            })
            .or_else(|| {
                EMPTY_TREES
                    .iter()
                    .find(|(name, _)| *name == seen.format)
                    .map(|(_, tree)| tree.to_string())
            })
            .unwrap_or_else(|| NO_TREE.to_string()),
        None => NO_TREE.to_string(),
    };
    OsString::from(format!("--attr-source={source}"))
}

/// [`seen`] for `dir`, kept once known (a directory's repository does not change under it).
fn seen_cached(dir: &Path) -> Option<Seen> {
    static KNOWN: OnceLock<Mutex<HashMap<PathBuf, Seen>>> = OnceLock::new();
    let known = KNOWN.get_or_init(Default::default);
    if let Some(seen) = known.lock().ok().and_then(|k| k.get(dir).cloned()) {
        return Some(seen);
    }
    let seen = crate::head::off_async_workers(|| seen(dir))?;
    keep(known, dir, seen.clone());
    Some(seen)
}

/// The object format and common directory of `dir`'s repository: from its files where they
/// answer, else asked of git as it discovers the repository from `dir`, then with `dir` as
/// the git directory (a bare repository under `safe.bareRepository=explicit` is not
/// discovered); `None` when neither answers.
fn seen(dir: &Path) -> Option<Seen> {
    // Most repositories, and directories in none: a few small files answer, and no git has to
    // start (git asked for each worktree, transfer quarantine and `git init` made a run of 40
    // loops over 4 hosts ~15% slower).
    match crate::head::format_by_files(dir) {
        FormatByFiles::Sha1 { common_dir } => {
            return Some(Seen {
                format: "sha1".to_string(),
                common_dir: common_dir.canonicalize().ok(),
            });
        }
        FormatByFiles::NoRepository => return None,
        FormatByFiles::AskGit => {}
    }
    let mut git_dir = OsString::from("--git-dir=");
    git_dir.push(dir);
    for explicit in [None, Some(git_dir)] {
        let mut cmd = crate::daemon_git::unguarded(dir);
        cmd.args(explicit);
        let Ok(out) = cmd
            .args([
                "rev-parse",
                "--show-object-format",
                "--path-format=absolute",
                "--git-common-dir",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .output()
        else {
            continue;
        };
        // The format's line, then the common directory's (which may hold any byte).
        let Some((format, common)) = format_and_common_dir(&out.stdout) else {
            continue;
        };
        let format = String::from_utf8_lossy(format).trim().to_string();
        if out.status.success() && !format.is_empty() {
            return Some(Seen {
                format,
                common_dir: (!common.is_empty())
                    .then(|| Path::new(OsStr::from_bytes(common)).canonicalize().ok())
                    .flatten(),
            });
        }
    }
    None
}

/// Splits `rev-parse --show-object-format --git-common-dir` output: the format's line, then
/// the common directory's (which may hold any byte but ends with a newline).
fn format_and_common_dir(out: &[u8]) -> Option<(&[u8], &[u8])> {
    let at = out.iter().position(|b| *b == b'\n')?;
    let (format, rest) = out.split_at(at);
    Some((format, rest.get(1..)?.strip_suffix(b"\n")?))
}

/// The overrides that turn off every filter, diff and merge driver the config seen from `dir`
/// defines; `None` when the config cannot be listed.
fn drivers_off(dir: &Path) -> Option<Overrides> {
    let out = crate::daemon_git::unguarded(dir)
        .args(["config", "-z", "--get-regexp", r"^(filter|diff|merge)\."])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    match out.status.code() {
        Some(0) if out.stdout.len() <= MAX_CONFIG_OUTPUT => Some(overrides(&out.stdout)),
        // No such key.
        Some(1) => Some(Vec::new()),
        _ => None,
    }
}

/// The overrides for the drivers in `listed` (`git config -z --get-regexp` output: entries
/// ending in NUL, each a key, then a newline and the value when there is one).
fn overrides(listed: &[u8]) -> Overrides {
    let mut settings: Overrides = Vec::new();
    let lfs_is_git_lfs = git_lfs_filter_only(listed);
    for entry in listed.split(|b| *b == 0) {
        let key = entry.split(|b| *b == b'\n').next().unwrap_or_default();
        if lfs_is_git_lfs && key.starts_with(b"filter.lfs.") {
            continue;
        }
        let (Some(first), Some(last)) = (
            key.iter().position(|b| *b == b'.'),
            key.iter().rposition(|b| *b == b'.'),
        ) else {
            continue;
        };
        if last <= first {
            continue;
        }
        let (section, name, variable) = (&key[..first], &key[first + 1..last], &key[last + 1..]);
        let turned_off: &[(&str, Value)] = match (section, variable) {
            (b"filter", _) => &[
                ("clean", Value::Empty),
                ("smudge", Value::Empty),
                ("process", Value::Empty),
                ("required", Value::False),
            ],
            (b"diff", b"textconv") => &[("textconv", Value::Cat)],
            (b"diff", b"command") => &[("command", Value::False)],
            (b"merge", b"driver") => &[("driver", Value::False)],
            _ => &[],
        };
        for (variable, value) in turned_off {
            let mut setting = section.to_vec();
            setting.push(b'.');
            setting.extend_from_slice(name);
            setting.push(b'.');
            setting.extend_from_slice(variable.as_bytes());
            if !settings.iter().any(|(known, _)| *known == setting) {
                settings.push((setting, *value));
            }
        }
    }
    settings
}

/// Whether the config's `filter.lfs` is git-lfs's own, as `git lfs install` writes it (every
/// command `git-lfs` with plain options, `required` a boolean): that filter is left on below
/// git 2.42. Its clean step stores content under the repository's `lfs/objects` and fetches
/// nothing (`.lfsconfig`, which a loop can write, can name no storage or program), and its
/// smudge reads only the repository's own objects (`NO_LFS_FETCH`, [`crate::daemon_git`]);
/// turned off, the user's LFS checkout looked changed to the daemon's git (its files against
/// the pointers committed), which refused to merge into it.
fn git_lfs_filter_only(listed: &[u8]) -> bool {
    let plain = |value: &[u8]| {
        value.starts_with(b"git-lfs ")
            && value
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b' ' | b'-' | b'%'))
    };
    let mut found = false;
    for entry in listed.split(|b| *b == 0) {
        let mut lines = entry.splitn(2, |b| *b == b'\n');
        let key = lines.next().unwrap_or_default();
        let Some(variable) = key.strip_prefix(b"filter.lfs.") else {
            continue;
        };
        found = true;
        let value = lines.next().unwrap_or_default();
        let own = match variable {
            b"clean" | b"smudge" | b"process" => plain(value),
            b"required" => matches!(value, b"true" | b"false"),
            _ => false,
        };
        if !own {
            return false;
        }
    }
    found
}

/// `(major, minor)` of the git on `PATH`, asked once per process; `None` when it cannot be
/// run or names no version (then the older git's way is taken: its `git config` cannot run
/// either, so every command is refused, as it would fail anyway).
pub fn git_version() -> Option<(u32, u32)> {
    static VERSION: OnceLock<Option<(u32, u32)>> = OnceLock::new();
    *VERSION.get_or_init(|| {
        crate::head::off_async_workers(|| {
            let out = Command::new("git")
                .arg("version")
                .current_dir(std::env::temp_dir())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .output()
                .ok()?;
            crate::merge_tree::parse_version(&String::from_utf8_lossy(&out.stdout))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn keys(overrides: &Overrides) -> Vec<(String, Value)> {
        overrides
            .iter()
            .map(|(key, value)| (String::from_utf8_lossy(key).into_owned(), *value))
            .collect()
    }

    #[test]
    fn every_configured_driver_is_turned_off_and_nothing_else() {
        let listed = b"filter.lfs.clean\ngit-lfs clean -- %f\0filter.lfs.process\ngit-lfs filter-process\0\
filter.lfs.required\ntrue\0filter.a.b.smudge\nx\0diff.pdf.textconv\npdftotext\0diff.pdf.xfuncname\n^x\0\
diff.tool.command\nmeld\0merge.union2.driver\nu %A\0merge.union2.name\nunion\0diff.nocolor\0";
        let filter = |name: &str| {
            [
                (format!("filter.{name}.clean"), Value::Empty),
                (format!("filter.{name}.smudge"), Value::Empty),
                (format!("filter.{name}.process"), Value::Empty),
                (format!("filter.{name}.required"), Value::False),
            ]
        };
        // git-lfs's own filter, as `git lfs install` writes it, stays on.
        let mut want: Vec<(String, Value)> = Vec::new();
        want.extend(filter("a.b"));
        want.push(("diff.pdf.textconv".into(), Value::Cat));
        want.push(("diff.tool.command".into(), Value::False));
        want.push(("merge.union2.driver".into(), Value::False));
        assert_eq!(keys(&overrides(listed)), want);
        // Any other command under the name `lfs` turns all of it off.
        for other in [
            &b"filter.lfs.clean\ngit-lfs clean -- %f; touch /tmp/x\0"[..],
            b"filter.lfs.clean\n/usr/local/bin/git-lfs clean -- %f\0",
            b"filter.lfs.smudge\nsh -c x\0filter.lfs.process\ngit-lfs filter-process\0",
            b"filter.lfs.required\nyes\0",
            b"filter.lfs.other\ngit-lfs x\0",
        ] {
            let mut listed = listed.to_vec();
            listed.extend_from_slice(other);
            let off = keys(&overrides(&listed));
            assert!(
                filter("lfs").iter().all(|f| off.contains(f)),
                "{}",
                String::from_utf8_lossy(other)
            );
        }
        assert!(overrides(b"").is_empty());
        assert!(overrides(b"diff.noname\0merge.x.name\ny\0").is_empty());
        // A name with `=` or bytes that are not UTF-8 is kept as git printed it.
        let odd = overrides(b"filter.lfs=x.clean\nc\0merge.caf\xe9.driver\nd\0");
        assert_eq!(odd[0].0, b"filter.lfs=x.clean");
        assert_eq!(odd[4], (b"merge.caf\xe9.driver".to_vec(), Value::False));
    }

    /// Every distinct `git` executable on this machine.
    fn gits() -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = Vec::new();
        for dir in ["/usr/local/bin", "/usr/bin", "/bin"] {
            if let Ok(real) = Path::new(dir).join("git").canonicalize()
                && !found.contains(&real)
            {
                found.push(real);
            }
        }
        found
    }

    #[test]
    fn turned_off_drivers_run_nothing_whatever_their_names_with_every_git() {
        let tmp = tempfile::tempdir().unwrap();
        let flag = tmp.path().join("ran");
        let script = tmp.path().join("driver");
        std::fs::write(
            &script,
            format!("#!/bin/sh\necho ran >> '{}'\nexec cat\n", flag.display()),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        for git in gits() {
            let repo = tmp.path().join("repo");
            let _ = std::fs::remove_dir_all(&repo);
            std::fs::create_dir_all(&repo).unwrap();
            let run = |args: &[&[u8]]| {
                let out = Command::new(&git)
                    .args(args.iter().map(|a| OsStr::from_bytes(a)))
                    .current_dir(&repo)
                    .env("GIT_CONFIG_NOSYSTEM", "1")
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{git:?} {:?}", out);
            };
            run(&[b"init", b"-q"]);
            let mut attributes = Vec::new();
            for (i, name) in [&b"td-evil"[..], b"td=evil", b"caf\xe9", b"a.b"]
                .iter()
                .enumerate()
            {
                for variable in [&b"clean"[..], b"smudge"] {
                    let key = [&b"filter."[..], name, b".", variable].concat();
                    run(&[b"config", &key, script.as_os_str().as_bytes()]);
                }
                let key = [&b"filter."[..], name, b".required"].concat();
                run(&[b"config", &key, b"true"]);
                attributes.extend_from_slice(format!("f{i}.txt filter=").as_bytes());
                attributes.extend_from_slice(name);
                attributes.push(b'\n');
                std::fs::write(repo.join(format!("f{i}.txt")), "x\n").unwrap();
            }
            std::fs::write(repo.join(".gitattributes"), &attributes).unwrap();
            let overrides = drivers_off(&repo).unwrap();
            let mut add = Command::new(&git);
            add.current_dir(&repo).env("GIT_CONFIG_NOSYSTEM", "1");
            apply(&mut add, &overrides);
            let out = add.args(["add", "-A"]).output().unwrap();
            assert!(out.status.success(), "{git:?}: {out:?}");
            assert!(!flag.exists(), "{git:?}: a driver ran");
            // The same add without the overrides runs them: the test can fail.
            run(&[b"rm", b"-q", b"--cached", b"f0.txt"]);
            run(&[b"add", b"f0.txt"]);
            assert!(flag.exists(), "{git:?}: the driver never runs");
            std::fs::remove_file(&flag).unwrap();
        }
    }

    #[test]
    fn a_driver_added_to_the_config_is_turned_off_once_the_cache_is_stale() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path();
        let git = |args: &[&str]| {
            let out = Command::new("git")
                .args(args)
                .current_dir(repo)
                .output()
                .unwrap();
            assert!(out.status.success(), "{args:?}");
        };
        git(&["init", "-q"]);
        let off = |repo: &Path| {
            keys(&drivers_off_cached(repo).unwrap())
                .contains(&("filter.td-added.required".to_string(), Value::False))
        };
        assert!(!off(repo));
        git(&["config", "filter.td-added.clean", "touch /tmp/td-added"]);
        // Within the second the overrides are the ones asked before...
        assert!(!off(repo));
        std::thread::sleep(DRIVERS_RECHECKED_AFTER + Duration::from_millis(50));
        // ...and then the new driver is off.
        assert!(off(repo));
    }

    /// A SHA-1 repository at `repo` with one commit holding `attributes` as `.gitattributes`
    /// (and `a.txt`); returns the commit.
    fn repo_with_attributes(repo: &Path, attributes: &str) -> String {
        repo_with_file(repo, ".gitattributes", attributes)
    }

    /// A SHA-1 repository at `repo` with one commit holding `content` at `path` (and
    /// `a.txt`); returns the commit.
    fn repo_with_file(repo: &Path, path: &str, content: &str) -> String {
        std::fs::create_dir_all(repo).unwrap();
        let git = |args: &[&str]| {
            let out = crate::daemon_git::unguarded(repo)
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "{args:?}");
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        git(&["init", "-q"]);
        let file = repo.join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, content).unwrap();
        std::fs::write(repo.join("a.txt"), "a\n").unwrap();
        git(&["add", "-A"]);
        git(&[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "-m",
            "attributes",
        ]);
        git(&["rev-parse", "HEAD"])
    }

    #[test]
    fn a_trusted_commits_attributes_are_the_source_and_a_refused_one_leaves_none() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        let commit = repo_with_attributes(&repo, "*.up filter=x\n");
        let empty = format!("--attr-source={}", EMPTY_TREES[0].1);
        assert_eq!(attr_source(&repo), empty.as_str());
        trust(&repo, &commit).unwrap();
        let trusted = format!("--attr-source={commit}");
        // In the repository, a directory of it, and a worktree of it (one common directory).
        let linked = tmp.path().join("linked");
        let out = crate::daemon_git::unguarded(&repo)
            .args(["worktree", "add", "-q", "--detach"])
            .arg(&linked)
            .output()
            .unwrap();
        assert!(out.status.success());
        std::fs::create_dir_all(repo.join("sub")).unwrap();
        for at in [&repo, &repo.join("sub"), &linked] {
            assert_eq!(attr_source(at), trusted.as_str(), "{at:?}");
        }
        // Another repository is not covered.
        let other = tmp.path().join("other");
        repo_with_attributes(&other, "");
        assert_eq!(attr_source(&other), empty.as_str());
        // A commit with attributes only deeper down is the source; one with none at all says
        // what the empty tree says, which is named instead.
        let deep = tmp.path().join("deep");
        let deep_commit = repo_with_file(&deep, "x/y/.gitattributes", "*.z filter=x\n");
        trust(&deep, &deep_commit).unwrap();
        assert_eq!(
            attr_source(&deep),
            format!("--attr-source={deep_commit}").as_str()
        );
        let none = tmp.path().join("none");
        let none_commit = repo_with_file(&none, "x/gitattributes", "not them\n");
        trust(&none, &none_commit).unwrap();
        assert_eq!(attr_source(&none), empty.as_str());
        // Trusted all the same: a commit it lacks is refused there.
        assert!(trust(&none, &"0".repeat(40)).is_err());
        // What is refused, and why; each refusal forgets the commit trusted before.
        let refusals = [
            ("HEAD".to_string(), "is not a full commit id"),
            (commit.to_uppercase(), "is not a full commit id"),
            ("ab".repeat(32), "is not an id of the sha1 repository"),
            ("0".repeat(40), "has no commit"),
        ];
        for (id, why) in refusals {
            trust(&repo, &commit).unwrap();
            let refused = trust(&repo, &id).unwrap_err();
            assert!(refused.to_string().contains(why), "{id}: {refused}");
            assert_eq!(attr_source(&linked), empty.as_str(), "{id}");
        }
        let nowhere = tmp.path().join("nowhere");
        std::fs::create_dir_all(&nowhere).unwrap();
        assert_eq!(
            trust(&nowhere, &commit),
            Err(TrustError::NoRepository(nowhere.clone()))
        );
        // Trusted again, then forgotten.
        trust(&repo, &commit).unwrap();
        assert_eq!(attr_source(&linked), trusted.as_str());
        distrust(&linked);
        assert_eq!(attr_source(&repo), empty.as_str());
    }

    #[test]
    fn git_reads_the_trusted_commits_attributes_not_the_worktrees() {
        if git_version().is_none_or(|v| v < ATTR_SOURCE_SINCE) {
            // Below 2.42 git takes no source (the drivers are off instead: tested above).
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        let commit = repo_with_attributes(&repo, "*.up filter=upper\n");
        let git = |args: &[&str]| {
            let out = crate::daemon_git::command(&repo)
                .args(["-c", "filter.upper.clean=tr a-z A-Z"])
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "{args:?}");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        // The worktree's own attributes (as a loop writes them) name the filter for `*.txt`.
        std::fs::write(
            repo.join(".gitattributes"),
            "*.up filter=upper\n*.txt filter=upper\n",
        )
        .unwrap();
        std::fs::write(repo.join("a.up"), "a\n").unwrap();
        std::fs::write(repo.join("a.txt"), "a\n").unwrap();
        let staged = |git: &dyn Fn(&[&str]) -> String| {
            git(&["add", "-A"]);
            [git(&["show", ":a.up"]), git(&["show", ":a.txt"])]
        };
        // Nothing trusted: no attributes at all.
        assert_eq!(staged(&git), ["a\n", "a\n"]);
        git(&["rm", "-q", "--cached", "a.up", "a.txt"]);
        trust(&repo, &commit).unwrap();
        // The commit's attributes, not the worktree's.
        assert_eq!(staged(&git), ["A\n", "a\n"]);
        distrust(&repo);
    }

    #[test]
    fn the_empty_tree_of_the_repositorys_format_is_the_attribute_source() {
        let tmp = tempfile::tempdir().unwrap();
        for format in ["sha1", "sha256"] {
            for bare in [false, true] {
                let repo = tmp.path().join(format!("{format}-{bare}"));
                std::fs::create_dir_all(&repo).unwrap();
                let out = Command::new("git")
                    .args(["init", "-q", &format!("--object-format={format}")])
                    .args(bare.then_some("--bare"))
                    .current_dir(&repo)
                    .output()
                    .unwrap();
                assert!(out.status.success());
                let want = EMPTY_TREES.iter().find(|(n, _)| *n == format).unwrap().1;
                assert_eq!(attr_source(&repo), format!("--attr-source={want}").as_str());
            }
        }
        // Where git names no format, a source git refuses.
        let nowhere = tmp.path().join("not-a-repository");
        std::fs::create_dir_all(&nowhere).unwrap();
        assert_eq!(
            attr_source(&nowhere),
            format!("--attr-source={NO_TREE}").as_str()
        );
    }
}
