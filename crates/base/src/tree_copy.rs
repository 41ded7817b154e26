//! Copying a directory tree without following a symlink out of it or blocking on a FIFO.

use std::path::{Path, PathBuf};

/// Copies a directory tree, keeping symlinks as symlinks (never following them out).
pub fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    copy_tree_except(from, to, &[])
}

/// [`copy_tree`], leaving out the paths of `except` (canonical) and every file that is not
/// a regular file, a directory or a symlink: opening a FIFO would block the copy forever,
/// and sockets and devices have no content to copy.
pub fn copy_tree_except(from: &Path, to: &Path, except: &[PathBuf]) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    let from = from.canonicalize()?;
    let mut stack: Vec<(PathBuf, PathBuf)> = vec![(from, to.to_path_buf())];
    while let Some((src, dst)) = stack.pop() {
        for entry in std::fs::read_dir(&src)? {
            let entry = entry?;
            if except.iter().any(|p| *p == entry.path()) {
                continue;
            }
            let kind = entry.file_type()?;
            let target = dst.join(entry.file_name());
            if kind.is_symlink() {
                std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
            } else if kind.is_dir() {
                std::fs::create_dir_all(&target)?;
                stack.push((entry.path(), target));
            } else if kind.is_file() {
                std::fs::copy(entry.path(), &target)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_tree_keeps_symlinks_and_content() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a");
        std::fs::create_dir_all(a.join("sub")).unwrap();
        std::fs::write(a.join("sub/f"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", a.join("l")).unwrap();
        copy_tree(&a, &d.path().join("b")).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join("b/sub/f")).unwrap(),
            "x"
        );
        assert_eq!(
            std::fs::read_link(d.path().join("b/l")).unwrap(),
            PathBuf::from("/etc/passwd")
        );
    }

    #[test]
    fn copy_tree_leaves_out_fifos_and_excluded_paths() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a");
        std::fs::create_dir_all(&a).unwrap();
        std::fs::write(a.join("f"), "x").unwrap();
        std::fs::write(a.join("key"), "k").unwrap();
        let fifo =
            std::ffi::CString::new(a.join("pipe").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let key = a.join("key").canonicalize().unwrap();
        copy_tree_except(&a, &d.path().join("b"), &[key]).unwrap();
        assert!(d.path().join("b/f").is_file());
        assert!(!d.path().join("b/pipe").exists());
        assert!(!d.path().join("b/key").exists());
    }
}
