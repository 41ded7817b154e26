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
//!   asked of git once per directory): git reads attributes from that tree only, so no
//!   `.gitattributes` anywhere counts; `$GIT_DIR/info/attributes` and `core.attributesFile`,
//!   the user's own and out of a loop's reach, still do. git passes it on to the git processes
//!   it starts (`GIT_ATTR_SOURCE`).
//! - older git cannot be told where to read attributes. Every driver the config defines is
//!   turned off for the command instead (`-c`, which wins over every config file and reaches
//!   git's own children): a filter passes content through unchanged (its commands empty, not
//!   `required`); a textconv is `cat` (the file as it is); an external diff and a merge driver
//!   are `false`, so a diff that would have used one fails and a merge that would have used
//!   one stops as a conflict, where running the user's program would have been the loop's
//!   choice. The config is asked again for a directory once a second has passed (one `git
//!   config` more then): a driver the user adds during a run is covered a second later.
//!
//! So the daemon's git treats every file as the plain bytes it holds, whatever attributes say:
//! no end-of-line conversion, no LFS pointer expanded, no custom merge. The loops' own git,
//! confined, reads attributes as usual.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

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
/// transfer quarantine is one);
/// past this the cache starts again.
const MAX_KNOWN_DIRS: usize = 1024;

/// How long the drivers a directory's config defines are taken as known (below git 2.42):
/// asking git for every command made a run of 20 small loops ~55% slower; a driver the user
/// adds to the config is turned off from at most this long after.
const DRIVERS_RECHECKED_AFTER: Duration = Duration::from_secs(1);

/// Longest `git config --get-regexp` output read.
const MAX_CONFIG_OUTPUT: usize = 1 << 20;

/// The arguments that keep a git command run in `dir` from reading any `.gitattributes`, or,
/// below git 2.42, from running any driver an attribute names (see the module docs). Goes
/// before the subcommand. Blocking: may run git once (off the async workers).
pub(crate) fn guard_args(dir: &Path) -> Vec<OsString> {
    match git_version() {
        Some(version) if version >= ATTR_SOURCE_SINCE => attr_source(dir),
        _ => drivers_off_cached(dir),
    }
}

/// When a directory's drivers were asked of git, and the overrides they gave.
type AskedDrivers = (Instant, Vec<OsString>);

/// [`drivers_off`] for `dir`, asked of git again once [`DRIVERS_RECHECKED_AFTER`] has passed.
fn drivers_off_cached(dir: &Path) -> Vec<OsString> {
    static KNOWN: OnceLock<Mutex<HashMap<PathBuf, AskedDrivers>>> = OnceLock::new();
    let known = KNOWN.get_or_init(Default::default);
    let now = Instant::now();
    let fresh = known.lock().ok().and_then(|known| {
        known
            .get(dir)
            .filter(|(asked, _)| now.duration_since(*asked) < DRIVERS_RECHECKED_AFTER)
            .map(|(_, args)| args.clone())
    });
    if let Some(args) = fresh {
        return args;
    }
    let args = crate::head::off_async_workers(|| drivers_off(dir));
    if let Ok(mut known) = known.lock() {
        if known.len() >= MAX_KNOWN_DIRS {
            known.clear();
        }
        known.insert(dir.to_path_buf(), (now, args.clone()));
    }
    args
}

/// `--attr-source=<empty tree>` for the repository holding `dir`; nothing outside a
/// repository (`git init`, `git check-ref-format`: no attributes to read).
fn attr_source(dir: &Path) -> Vec<OsString> {
    static FORMATS: OnceLock<Mutex<HashMap<PathBuf, String>>> = OnceLock::new();
    let formats = FORMATS.get_or_init(Default::default);
    let known = formats
        .lock()
        .ok()
        .and_then(|known| known.get(dir).cloned());
    let format = match known {
        Some(format) => format,
        None => {
            let Some(format) = crate::head::off_async_workers(|| object_format(dir)) else {
                return Vec::new();
            };
            if let Ok(mut known) = formats.lock() {
                if known.len() >= MAX_KNOWN_DIRS {
                    known.clear();
                }
                known.insert(dir.to_path_buf(), format.clone());
            }
            format
        }
    };
    let tree = EMPTY_TREES
        .iter()
        .find(|(name, _)| *name == format)
        .map_or(NO_TREE, |(_, tree)| tree);
    vec![OsString::from(format!("--attr-source={tree}"))]
}

/// `git rev-parse --show-object-format` in `dir`; `None` outside a repository or when git
/// cannot say.
fn object_format(dir: &Path) -> Option<String> {
    let out = crate::daemon_git::unguarded(dir)
        .args(["rev-parse", "--show-object-format"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let format = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!format.is_empty()).then_some(format)
}

/// `-c` overrides that turn off every filter, diff and merge driver the config seen from `dir`
/// defines.
fn drivers_off(dir: &Path) -> Vec<OsString> {
    let out = crate::daemon_git::unguarded(dir)
        .args(["config", "-z", "--get-regexp", r"^(filter|diff|merge)\."])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output();
    match out {
        // Exit 1: no such key. Any other failure is the config's (git will say so when the
        // command itself reads it) or git's.
        Ok(out) if out.status.success() => {
            let listed = &out.stdout[..out.stdout.len().min(MAX_CONFIG_OUTPUT)];
            overrides(listed)
        }
        _ => Vec::new(),
    }
}

/// The overrides for the drivers in `listed` (`git config -z --get-regexp` output: entries
/// ending in NUL, each a key, then a newline and the value when there is one).
fn overrides(listed: &[u8]) -> Vec<OsString> {
    let mut settings: Vec<String> = Vec::new();
    for entry in listed.split(|b| *b == 0) {
        let key = entry.split(|b| *b == b'\n').next().unwrap_or_default();
        let Ok(key) = std::str::from_utf8(key) else {
            continue;
        };
        let (Some(first), Some(last)) = (key.find('.'), key.rfind('.')) else {
            continue;
        };
        if last <= first {
            continue;
        }
        let (section, name, variable) = (&key[..first], &key[first + 1..last], &key[last + 1..]);
        let turned_off: &[(&str, &str)] = match (section, variable) {
            ("filter", _) => &[
                ("clean", ""),
                ("smudge", ""),
                ("process", ""),
                ("required", "false"),
            ],
            ("diff", "textconv") => &[("textconv", "cat")],
            ("diff", "command") => &[("command", "false")],
            ("merge", "driver") => &[("driver", "false")],
            _ => &[],
        };
        for (variable, value) in turned_off {
            let setting = format!("{section}.{name}.{variable}={value}");
            if !settings.contains(&setting) {
                settings.push(setting);
            }
        }
    }
    settings
        .into_iter()
        .flat_map(|setting| [OsString::from("-c"), OsString::from(setting)])
        .collect()
}

/// `(major, minor)` of the git on `PATH`, asked once per process; `None` when it cannot be
/// run or names no version (then the older git's way is taken, which needs no option).
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

    fn strings(args: Vec<OsString>) -> Vec<String> {
        args.into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn every_configured_driver_is_turned_off_and_nothing_else() {
        let listed = b"filter.lfs.clean\ngit-lfs clean -- %f\0filter.lfs.process\ngit-lfs filter-process\0\
filter.lfs.required\ntrue\0filter.a.b.smudge\nx\0diff.pdf.textconv\npdftotext\0diff.pdf.xfuncname\n^x\0\
diff.tool.command\nmeld\0merge.union2.driver\nu %A\0merge.union2.name\nunion\0diff.nocolor\0";
        let got = strings(overrides(listed));
        let want: Vec<String> = [
            "filter.lfs.clean=",
            "filter.lfs.smudge=",
            "filter.lfs.process=",
            "filter.lfs.required=false",
            "filter.a.b.clean=",
            "filter.a.b.smudge=",
            "filter.a.b.process=",
            "filter.a.b.required=false",
            "diff.pdf.textconv=cat",
            "diff.tool.command=false",
            "merge.union2.driver=false",
        ]
        .iter()
        .flat_map(|s| ["-c".to_string(), s.to_string()])
        .collect();
        assert_eq!(got, want);
        assert!(overrides(b"").is_empty());
        assert!(overrides(b"diff.noname\0merge.x.name\ny\0").is_empty());
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
        let setting = "filter.td-added.required=false";
        assert!(!strings(drivers_off_cached(repo)).contains(&setting.to_string()));
        git(&["config", "filter.td-added.clean", "touch /tmp/td-added"]);
        // Within the second the overrides are the ones asked before...
        assert!(!strings(drivers_off_cached(repo)).contains(&setting.to_string()));
        std::thread::sleep(DRIVERS_RECHECKED_AFTER + Duration::from_millis(50));
        // ...and then the new driver is off.
        assert!(strings(drivers_off_cached(repo)).contains(&setting.to_string()));
    }

    #[test]
    fn the_empty_tree_of_the_repositorys_format_is_the_attribute_source() {
        if git_version().is_none_or(|v| v < ATTR_SOURCE_SINCE) {
            // This machine's first git is older; the integration test runs every git.
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        for format in ["sha1", "sha256"] {
            let repo = tmp.path().join(format);
            std::fs::create_dir_all(&repo).unwrap();
            let out = Command::new("git")
                .args(["init", "-q", &format!("--object-format={format}")])
                .current_dir(&repo)
                .output()
                .unwrap();
            assert!(out.status.success());
            let want = EMPTY_TREES.iter().find(|(n, _)| *n == format).unwrap().1;
            assert_eq!(
                strings(attr_source(&repo)),
                [format!("--attr-source={want}")],
            );
        }
        // Outside any repository there is nothing to read attributes from.
        assert!(attr_source(Path::new("/")).is_empty());
    }
}
