//! Path resolution inside a worktree: the one place that decides whether a path the model
//! gave stays inside the loop's worktree.
//!
//! Resolution walks the path one component at a time from the canonical worktree root,
//! following every symlink it meets (also a dangling one, and also a link whose target does
//! not exist yet), applying `..` to the already-resolved prefix as the kernel does. The
//! result is the real path a file operation would touch; it must lie under the root by
//! whole components, so `/work/tree-evil` is not inside `/work/tree`.
//!
//! The result is a name, not a permission: a symlink swapped in between resolution and use
//! would redirect a plain `open` of it. So tools never open it by name; they hand it to
//! `crate::worktree_fs`, which opens it beneath the root's handle in the kernel and refuses
//! any symlink met on the way.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use crate::error::ToolError;

/// How many symlinks one resolution may follow before it is treated as a loop.
const MAX_SYMLINK_HOPS: usize = 40;

/// Resolves `input` (relative to `root`, or absolute) to the real path it designates. An
/// input in double quotes is an escaped name (`td_base::shown_path`), as listings show names
/// with newlines or bytes that are not UTF-8.
///
/// `root` must already be canonical. Returns `SandboxViolation` for NUL bytes, symlink
/// loops and anything that ends outside `root`.
pub fn resolve_in(root: &Path, input: &str) -> Result<PathBuf, ToolError> {
    match td_base::shown_path::parse(input) {
        None => resolve_bytes(root, Path::new(input), input),
        Some(Ok(bytes)) => resolve_bytes(root, Path::new(&bytes), input),
        Some(Err(why)) => Err(ToolError::failed(
            format!("reading the path {input}"),
            format!("a path in double quotes is an escaped name, and this one is broken: {why}"),
            "Pass the path exactly as a listing showed it, or without the quotes.",
        )),
    }
}

/// [`resolve_in`] of the path `requested` (any bytes), which the model wrote as `input`.
fn resolve_bytes(root: &Path, requested: &Path, input: &str) -> Result<PathBuf, ToolError> {
    let violation = |detail: &str| ToolError::SandboxViolation {
        path: input.to_string(),
        detail: detail.to_string(),
    };
    if requested.as_os_str().as_bytes().contains(&0) {
        return Err(violation(" (it contains a NUL byte)"));
    }
    let mut queue: VecDeque<OsString> = VecDeque::new();
    let mut current = if requested.is_absolute() {
        PathBuf::from("/")
    } else {
        root.to_path_buf()
    };
    push_front_components(&mut queue, requested);

    let mut hops = 0usize;
    let mut via_link: Option<PathBuf> = None;
    while let Some(part) = queue.pop_front() {
        match part.to_str() {
            Some("/") => current = PathBuf::from("/"),
            Some(".") => {}
            Some("..") => {
                current.pop();
            }
            _ => {
                let next = current.join(&part);
                match std::fs::symlink_metadata(&next) {
                    Ok(meta) if meta.file_type().is_symlink() => {
                        hops += 1;
                        if hops > MAX_SYMLINK_HOPS {
                            return Err(violation(" (too many levels of symbolic links)"));
                        }
                        let target = std::fs::read_link(&next).map_err(|e| {
                            ToolError::failed(
                                format!("reading symlink '{}'", next.display()),
                                e,
                                "Use a different path.",
                            )
                        })?;
                        if via_link.is_none() {
                            via_link = Some(next.clone());
                        }
                        if target.is_absolute() {
                            current = PathBuf::from("/");
                        }
                        push_front_components(&mut queue, &target);
                    }
                    _ => current = next,
                }
            }
        }
    }

    if current.starts_with(root) {
        Ok(current)
    } else {
        let detail = match via_link {
            Some(link) => format!(
                " (through the symlink '{}')",
                crate::error::display_path(root, &link)
            ),
            None => String::new(),
        };
        Err(violation(&detail))
    }
}

/// Puts the components of `path` at the front of `queue`, keeping their order.
fn push_front_components(queue: &mut VecDeque<OsString>, path: &Path) {
    let parts: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::RootDir => Some(OsString::from("/")),
            Component::CurDir => None,
            Component::ParentDir => Some(OsString::from("..")),
            Component::Normal(n) => Some(n.to_os_string()),
            Component::Prefix(_) => None,
        })
        .collect();
    for part in parts.into_iter().rev() {
        queue.push_front(part);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("wt");
        std::fs::create_dir_all(root.join("src")).expect("mkdir");
        let root = root.canonicalize().expect("canon");
        (dir, root)
    }

    #[test]
    fn plain_relative_paths_resolve_inside() {
        let (_d, root) = setup();
        assert_eq!(
            resolve_in(&root, "src/a.rs").unwrap(),
            root.join("src/a.rs")
        );
        assert_eq!(resolve_in(&root, ".").unwrap(), root);
        assert_eq!(resolve_in(&root, "src/../b").unwrap(), root.join("b"));
        assert_eq!(
            resolve_in(&root, "new/dir/file").unwrap(),
            root.join("new/dir/file")
        );
    }

    #[test]
    fn lexical_escape_is_refused() {
        let (_d, root) = setup();
        let err = resolve_in(&root, "../outside").unwrap_err();
        assert_eq!(err.kind(), "sandbox_violation");
        assert!(resolve_in(&root, "src/../../x").is_err());
        assert!(resolve_in(&root, "nope/../../x").is_err());
    }

    #[test]
    fn absolute_paths_only_inside() {
        let (_d, root) = setup();
        assert!(resolve_in(&root, "/etc/passwd").is_err());
        let inside = root.join("src/a.rs");
        assert_eq!(resolve_in(&root, inside.to_str().unwrap()).unwrap(), inside);
    }

    #[test]
    fn sibling_with_same_prefix_is_outside() {
        let (_d, root) = setup();
        let sibling = format!("{}-evil", root.display());
        std::fs::create_dir_all(&sibling).unwrap();
        assert!(resolve_in(&root, &format!("{sibling}/x")).is_err());
        assert!(resolve_in(&root, "../wt-evil/x").is_err());
    }

    #[test]
    fn symlinks_out_are_refused_even_when_dangling_or_nested() {
        let (d, root) = setup();
        let outside = d.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        symlink(&outside, root.join("dirlink")).unwrap();
        symlink(outside.join("missing.txt"), root.join("dangling")).unwrap();
        symlink("../../outside/x", root.join("src/rel")).unwrap();
        assert!(resolve_in(&root, "dirlink").is_err());
        assert!(resolve_in(&root, "dirlink/new/file.txt").is_err());
        assert!(resolve_in(&root, "dangling").is_err());
        assert!(resolve_in(&root, "src/rel").is_err());
        let err = resolve_in(&root, "dirlink/f").unwrap_err().to_string();
        assert!(err.contains("through the symlink 'dirlink'"), "{err}");
    }

    #[test]
    fn symlinks_inside_are_followed() {
        let (_d, root) = setup();
        symlink(root.join("src"), root.join("srclink")).unwrap();
        symlink("src", root.join("rel")).unwrap();
        assert_eq!(resolve_in(&root, "srclink/a").unwrap(), root.join("src/a"));
        assert_eq!(resolve_in(&root, "rel/a").unwrap(), root.join("src/a"));
    }

    #[test]
    fn symlink_loops_and_nul_are_refused() {
        let (_d, root) = setup();
        symlink("b", root.join("a")).unwrap();
        symlink("a", root.join("b")).unwrap();
        assert!(resolve_in(&root, "a").is_err());
        assert!(resolve_in(&root, "src/\0x").is_err());
    }

    #[test]
    fn dotdot_after_symlink_applies_to_its_target() {
        let (d, root) = setup();
        let deep = d.path().join("outside/deep");
        std::fs::create_dir_all(&deep).unwrap();
        symlink(&deep, root.join("l")).unwrap();
        // l/.. is outside/, not the worktree root.
        assert!(resolve_in(&root, "l/../x").is_err());
    }
}
