//! `warm:` — the build state a loop's new worktree is seeded with from the base checkout
//! (see `run::warm`): presets (`cargo`, `node`, `python`) and free paths relative to the
//! repository root. A loop's list wins over its type's, its type's over the run's; the
//! default is none (a worktree starts with what git checks out, nothing more).
//!
//! Every entry is checked when the file loads: a path that could name something outside the
//! repository, git's own data, the run record or the loops' artifacts is refused with the
//! line and column of the entry and what to write instead.

use std::path::{Component, Path, PathBuf};

use super::Problem;

/// The presets and the path each one names.
pub const PRESETS: [(&str, &str); 3] = [
    ("cargo", "target"),
    ("node", "node_modules"),
    ("python", ".venv"),
];

/// The path an entry names: a preset's, or the entry itself without trailing slashes.
fn path_of(entry: &str) -> PathBuf {
    match PRESETS.iter().find(|(name, _)| *name == entry) {
        Some((_, path)) => PathBuf::from(path),
        None => Path::new(entry)
            .components()
            .filter(|c| !matches!(c, Component::CurDir))
            .collect(),
    }
}

/// The paths of a checked `warm:` list, in its order, each once.
pub fn paths(list: &[String]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for entry in list {
        let path = path_of(entry);
        if !out.contains(&path) {
            out.push(path);
        }
    }
    out
}

/// The problems of the `warm:` list at YAML path `at` (`warm`, `loop-types.rust.warm`,
/// `loops[2].warm`), one per bad entry.
pub fn problems(list: &[String], at: &str) -> Vec<Problem> {
    list.iter()
        .enumerate()
        .filter_map(|(i, entry)| {
            why_refused(entry).map(|why| {
                Problem::new(format!("{at}[{i}]"), format!("{at}[{i}]: `{entry}` {why}"))
            })
        })
        .collect()
}

/// Why `entry` cannot be a warm path, or `None` when it can (also a worker host's check of
/// the paths a head sends: it takes no path from the head unchecked).
pub fn why_refused(entry: &str) -> Option<String> {
    const EXAMPLE: &str = "name a directory of the repository relative to its root, such as `target`, or a preset: cargo, node, python";
    if PRESETS.iter().any(|(name, _)| *name == entry) {
        return None;
    }
    if entry.contains('\0') {
        return Some(format!("holds a NUL byte; {EXAMPLE}"));
    }
    let path = Path::new(entry);
    if path.is_absolute() {
        return Some(format!(
            "is absolute: warm paths are inside the repository; {EXAMPLE}"
        ));
    }
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(name) => parts.push(name.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir => {
                return Some(format!("leaves the repository (`..`); {EXAMPLE}"));
            }
            Component::RootDir | Component::Prefix(_) => {
                return Some(format!("is absolute; {EXAMPLE}"));
            }
        }
    }
    let Some(first) = parts.first() else {
        return Some(format!(
            "names the whole checkout, not its build state; {EXAMPLE}"
        ));
    };
    if parts.iter().any(|p| p == ".git") {
        return Some(format!(
            "is git's own data, which every worktree has of its own; {EXAMPLE}"
        ));
    }
    if first == td_git::worktree::RUN_RECORD_DIR {
        return Some(format!(
            "is where run records and worktrees are kept, not build state; {EXAMPLE}"
        ));
    }
    if first == td_toolkit::artifact_files::ARTIFACT_DIR {
        return Some(format!(
            "holds the loops' plans, specs and phases (their work, which git carries), not build state; {EXAMPLE}"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn presets_name_their_directories_and_paths_are_taken_once() {
        let l = list(&[
            "cargo",
            "node",
            "python",
            "build/out/",
            "./target",
            "target",
        ]);
        assert!(problems(&l, "warm").is_empty());
        assert_eq!(
            paths(&l),
            vec![
                PathBuf::from("target"),
                PathBuf::from("node_modules"),
                PathBuf::from(".venv"),
                PathBuf::from("build/out"),
            ]
        );
        // A directory called like a preset is named with a slash.
        assert_eq!(paths(&list(&["cargo/"])), vec![PathBuf::from("cargo")]);
    }

    #[test]
    fn paths_outside_or_of_the_daemon_are_refused_with_what_to_write() {
        for (entry, needle) in [
            ("../target", "leaves the repository"),
            ("a/../../b", "leaves the repository"),
            ("/home/u/target", "is absolute"),
            (".", "whole checkout"),
            ("", "whole checkout"),
            (".git", "git's own data"),
            ("sub/.git/objects", "git's own data"),
            (".taskdaemon/runs", "run records"),
            ("taskdaemon-artifacts", "plans, specs and phases"),
            ("a\0b", "NUL"),
        ] {
            let p = problems(&list(&["cargo", entry]), "loops[0].warm");
            assert_eq!(p.len(), 1, "{entry:?}: {p:?}");
            assert_eq!(p[0].at, "loops[0].warm[1]");
            assert!(p[0].message.contains(needle), "{entry:?}: {}", p[0].message);
            assert!(
                p[0].message.contains("such as `target`"),
                "{}",
                p[0].message
            );
        }
    }
}
