//! Which `.gitattributes` the daemon's own git reads: none from a tree, an index or a
//! worktree.
//!
//! Attributes name drivers (`filter=x`, `diff=x`, `merge=x`) and git runs the programs the
//! config gives those names (`filter.x.clean`, `diff.x.textconv`, `merge.x.driver`, git-lfs's
//! `filter.lfs.process`). The daemon's git is unconfined and works on what loops wrote: it adds
//! a loop's worktree for its checkpoint commits, checks a loop's commits out, merges and diffs
//! them. A loop that writes `* filter=lfs` beside a `.lfsconfig` of its own would have the
//! daemon's git-lfs fetch from a URL the loop chose, with the user's credentials, outside every
//! sandbox; any other driver the user configured runs on files the loop picked.
//!
//! - git 2.42 and newer: `--attr-source=<the empty tree>` (in the repository's object format,
//!   known once per directory: read from the repository's files where they say it, else asked
//!   of git as it discovers the repository and then with the directory as its `--git-dir`,
//!   for a bare mirror under `safe.bareRepository=explicit`): git
//!   reads attributes from that tree only, so no `.gitattributes` anywhere counts;
//!   `$GIT_DIR/info/attributes` and `core.attributesFile`, the user's own and out of a loop's
//!   reach, still do. git passes it on to the git processes it starts (`GIT_ATTR_SOURCE`).
//!   Where git names no format, the source is a name no tree has: git refuses any command that
//!   would read attributes, and runs the rest (`git init`, `check-ref-format`).
//! - older git cannot be told where to read attributes. Every driver the config defines is
//!   turned off for the command instead (`--config-env`, which wins over every config file,
//!   reaches git's own children, and takes a driver's name whatever its bytes): a filter passes
//!   content through unchanged (its commands empty, not `required`); a textconv is `cat` (the
//!   file as it is); an external diff and a merge driver are `false`, so a diff that would
//!   have used one fails and a merge that would have used one stops as a conflict, where
//!   running the user's program would have been the loop's choice. The config is asked again
//!   for a directory once a second has passed (one `git config` more then): a driver the user
//!   adds during a run is covered a second later. When the config cannot be listed, the
//!   command gets a `-c` git refuses, so it does not run.
//!
//! So the daemon's git treats every file as the plain bytes it holds, whatever attributes say:
//! no end-of-line conversion, no LFS pointer expanded, no custom merge. The loops' own git,
//! confined, reads attributes as usual.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
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

/// `--attr-source=<empty tree>` for the repository `dir` is in, or is (a bare repository or a
/// git directory, which the transfer code names with `--git-dir`). Where git names no object
/// format for it, an attribute source git refuses (outside a repository, `git init` and `git
/// check-ref-format` read no attributes and run as usual).
fn attr_source(dir: &Path) -> OsString {
    static FORMATS: OnceLock<Mutex<HashMap<PathBuf, String>>> = OnceLock::new();
    let formats = FORMATS.get_or_init(Default::default);
    let known = formats
        .lock()
        .ok()
        .and_then(|known| known.get(dir).cloned());
    let format = match known {
        Some(format) => Some(format),
        None => {
            let format = crate::head::off_async_workers(|| object_format(dir));
            if let Some(format) = &format {
                keep(formats, dir, format.clone());
            }
            format
        }
    };
    let tree = format
        .and_then(|format| EMPTY_TREES.iter().find(|(name, _)| *name == format))
        .map_or(NO_TREE, |(_, tree)| tree);
    OsString::from(format!("--attr-source={tree}"))
}

/// The object format of `dir`'s repository: from its files where they answer, else asked of
/// git as it discovers the repository from `dir`, then with `dir` as the git directory (a
/// bare repository under `safe.bareRepository=explicit` is not discovered); `None` when
/// neither answers.
fn object_format(dir: &Path) -> Option<String> {
    // Most repositories, and directories in none: a few small files answer, and no git has to
    // start (git asked for each worktree, transfer quarantine and `git init` made a run of 40
    // loops over 4 hosts ~15% slower).
    match crate::head::format_by_files(dir) {
        FormatByFiles::Sha1 => return Some("sha1".to_string()),
        FormatByFiles::NoRepository => return None,
        FormatByFiles::AskGit => {}
    }
    let mut git_dir = OsString::from("--git-dir=");
    git_dir.push(dir);
    for explicit in [None, Some(git_dir)] {
        let mut cmd = crate::daemon_git::unguarded(dir);
        cmd.args(explicit);
        let Ok(out) = cmd
            .args(["rev-parse", "--show-object-format"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .output()
        else {
            continue;
        };
        let format = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && !format.is_empty() {
            return Some(format);
        }
    }
    None
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
    for entry in listed.split(|b| *b == 0) {
        let key = entry.split(|b| *b == b'\n').next().unwrap_or_default();
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
        let mut want: Vec<(String, Value)> = Vec::new();
        want.extend(filter("lfs"));
        want.extend(filter("a.b"));
        want.push(("diff.pdf.textconv".into(), Value::Cat));
        want.push(("diff.tool.command".into(), Value::False));
        want.push(("merge.union2.driver".into(), Value::False));
        assert_eq!(keys(&overrides(listed)), want);
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
