//! Seeding a new worktree with build state from the base checkout (`warm:`, issue 16): each
//! named path of the base (`target`, `node_modules`, ...) is copied into the worktree before
//! its loop starts, so that the loop's first build does not start from nothing.
//!
//! The copy must never let the loop change the base's files: a build rewrites its outputs in
//! place, so hard links are never used. Each file is a reflink (`FICLONE`: the filesystem
//! shares the blocks copy-on-write, nearly free) where the filesystem offers it, else a real
//! copy (`copy_file_range`, in the kernel, or read/write where that is refused). Modification
//! times are kept (cargo judges freshness by them) and so are permission bits without
//! set-id bits (executables stay executable). Symlinks are copied as symlinks, never
//! followed; FIFOs, sockets and devices are left out and named in the report.
//!
//! Every open is `openat` of one name with `O_NOFOLLOW` in a directory already opened the
//! same way, starting from the roots' handles: a symlink planted anywhere in the base's tree
//! (or swapped in during the copy) is never followed out of it, and nothing is written
//! outside the worktree. New files are created with `O_EXCL`, so nothing is written through
//! a file that is already there.

use std::ffi::{CStr, OsStr, OsString};
use std::fs::{File, FileTimes};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// How deep a seeded tree may go; deeper directories are left out (and named in the
/// report), so that a pathological tree cannot exhaust the stack.
pub const MAX_DEPTH: usize = 256;

/// How many left-out entries the report names one by one (the count is always complete).
pub const MAX_NAMED_SKIPS: usize = 20;

/// What a seeding did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeedReport {
    /// The paths copied (relative to the roots).
    pub seeded: Vec<String>,
    /// What was not copied and why, one line each: paths the base has not, and (up to
    /// [`MAX_NAMED_SKIPS`]) entries left out of a copied tree.
    pub skipped: Vec<String>,
    /// Entries left out of copied trees (FIFOs, sockets, devices, too deep), all counted.
    pub skipped_entries: u64,
    /// Regular files copied.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Files copied as reflinks (the rest were copied block by block).
    pub reflinked: u64,
    /// Symlinks copied as symlinks.
    pub symlinks: u64,
    /// How long it took.
    pub elapsed: Duration,
}

impl SeedReport {
    /// `reflink`, `copy`, `reflink+copy` (some of each), or `none` (no file copied).
    pub fn method(&self) -> &'static str {
        match (self.reflinked, self.files - self.reflinked.min(self.files)) {
            (0, 0) => "none",
            (_, 0) => "reflink",
            (0, _) => "copy",
            _ => "reflink+copy",
        }
    }

    fn skip(&mut self, line: String) {
        self.skipped_entries = self.skipped_entries.saturating_add(1);
        if self.skipped.len() < MAX_NAMED_SKIPS {
            self.skipped.push(line);
        } else if self.skipped.len() == MAX_NAMED_SKIPS {
            self.skipped
                .push("more entries left out (see skipped_entries)".to_string());
        }
    }
}

/// Copies each of `paths` (relative, checked by the config) that exists in `base` into
/// `worktree`, which must not hold it yet. A path the base has not, or that is a symlink
/// there, or that the worktree's checkout already holds, is skipped and named in the report;
/// a path whose copy fails half way is removed from the worktree again (a half-copied build
/// directory with fresh mtimes could look up to date) and named too. Errors only when a root
/// cannot be opened.
pub fn seed(base: &Path, worktree: &Path, paths: &[PathBuf]) -> std::io::Result<SeedReport> {
    let started = Instant::now();
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let base_fd = rustix::fs::open(base, dir_flags, Mode::empty())?;
    let wt_fd = rustix::fs::open(worktree, dir_flags, Mode::empty())?;
    let wt_stat = rustix::fs::fstat(&wt_fd)?;
    let mut copier = Copier {
        report: SeedReport::default(),
        try_reflink: true,
        try_kernel_copy: true,
        created: false,
        exclude: (wt_stat.st_dev, wt_stat.st_ino),
    };
    for rel in paths {
        let shown = rel.display().to_string();
        let parts = match plain_parts(rel) {
            Some(p) if !p.is_empty() => p,
            _ => {
                copier
                    .report
                    .skipped
                    .push(format!("{shown}: not a plain relative path"));
                continue;
            }
        };
        copier.created = false;
        match copier.seed_one(&base_fd, &wt_fd, &parts) {
            Ok(Outcome::Copied) => copier.report.seeded.push(shown),
            Ok(Outcome::Skipped(why)) => copier.report.skipped.push(format!("{shown}: {why}")),
            Err(e) => {
                // Take out what was copied of it: the worktree starts as without `warm:`
                // (only what this copy made: the parents it walked are real directories).
                if copier.created {
                    let _ = std::fs::remove_dir_all(worktree.join(rel))
                        .or_else(|_| std::fs::remove_file(worktree.join(rel)));
                }
                copier
                    .report
                    .skipped
                    .push(format!("{shown}: not seeded, the copy failed: {e}"));
            }
        }
    }
    copier.report.elapsed = started.elapsed();
    Ok(copier.report)
}

enum Outcome {
    Copied,
    Skipped(String),
}

/// The names of `rel`, or `None` if it holds anything but plain names.
fn plain_parts(rel: &Path) -> Option<Vec<&OsStr>> {
    rel.components()
        .filter(|c| !matches!(c, Component::CurDir))
        .map(|c| match c {
            Component::Normal(n) if !n.as_bytes().contains(&0) => Some(n),
            _ => None,
        })
        .collect()
}

struct Copier {
    report: SeedReport,
    /// Cleared at the first file the filesystem will not reflink: the rest are copied.
    try_reflink: bool,
    /// Cleared when the kernel refuses `copy_file_range` across these files: read/write.
    try_kernel_copy: bool,
    /// Whether the current path's copy was begun in the worktree (so a failure removes it).
    created: bool,
    /// The worktree's own directory (device, inode): never copied into itself when it lies
    /// inside a seeded tree.
    exclude: (u64, u64),
}

impl Copier {
    fn seed_one(
        &mut self,
        base: &OwnedFd,
        wt: &OwnedFd,
        parts: &[&OsStr],
    ) -> std::io::Result<Outcome> {
        let Some((last, dirs)) = parts.split_last() else {
            return Ok(Outcome::Skipped("names no path".into()));
        };
        // The source's parents, never through a symlink.
        let mut src_dir: Option<OwnedFd> = None;
        for d in dirs {
            let from = src_dir.as_ref().unwrap_or(base);
            match open_dir(from, d) {
                Ok(fd) => src_dir = Some(fd),
                Err(Errno::NOENT | Errno::NOTDIR) => {
                    return Ok(Outcome::Skipped("not in the base checkout".into()));
                }
                Err(Errno::LOOP) => {
                    return Ok(Outcome::Skipped(
                        "goes through a symlink in the base checkout; not followed".into(),
                    ));
                }
                Err(e) => return Err(e.into()),
            }
        }
        let src_parent = src_dir.as_ref().unwrap_or(base);
        let stat = match rustix::fs::statat(src_parent, *last, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(s) => s,
            Err(Errno::NOENT) => return Ok(Outcome::Skipped("not in the base checkout".into())),
            Err(e) => return Err(e.into()),
        };
        let kind = FileType::from_raw_mode(stat.st_mode);
        if !matches!(kind, FileType::Directory | FileType::RegularFile) {
            return Ok(Outcome::Skipped(format!(
                "is a {} in the base checkout, not a directory or file; not copied",
                kind_name(kind)
            )));
        }
        // The destination's parents, made where missing, never through a symlink.
        let mut dst_dir: Option<OwnedFd> = None;
        for d in dirs {
            let from = dst_dir.as_ref().unwrap_or(wt);
            match rustix::fs::mkdirat(from, *d, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
            dst_dir = Some(open_dir(from, d).map_err(|e| {
                std::io::Error::other(format!(
                    "{} in the worktree is not a plain directory ({e})",
                    d.to_string_lossy()
                ))
            })?);
        }
        let dst_parent = dst_dir.as_ref().unwrap_or(wt);
        if rustix::fs::statat(dst_parent, *last, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
            return Ok(Outcome::Skipped(
                "the worktree's checkout already has it (tracked by git); left as checked out"
                    .into(),
            ));
        }
        let shown = PathBuf::from_iter(parts.iter());
        self.created = true;
        self.copy_entry(src_parent, dst_parent, last, &shown, 0)?;
        Ok(Outcome::Copied)
    }

    /// Copies `name` of `src` into `dst` (where it does not exist), whatever it is.
    fn copy_entry(
        &mut self,
        src: &OwnedFd,
        dst: &OwnedFd,
        name: &OsStr,
        shown: &Path,
        depth: usize,
    ) -> std::io::Result<()> {
        let stat = rustix::fs::statat(src, name, AtFlags::SYMLINK_NOFOLLOW)?;
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => self.copy_file(src, dst, name),
            FileType::Directory => {
                if depth >= MAX_DEPTH {
                    self.report.skip(format!(
                        "{}: deeper than {MAX_DEPTH} directories; left out",
                        shown.display()
                    ));
                    return Ok(());
                }
                if (stat.st_dev, stat.st_ino) == self.exclude {
                    self.report.skip(format!(
                        "{}: the new worktree itself; left out",
                        shown.display()
                    ));
                    return Ok(());
                }
                self.copy_dir(src, dst, name, shown, depth)
            }
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(src, name, Vec::new())?;
                rustix::fs::symlinkat(target.as_c_str(), dst, name)?;
                self.report.symlinks = self.report.symlinks.saturating_add(1);
                Ok(())
            }
            other => {
                self.report.skip(format!(
                    "{}: a {}; left out",
                    shown.display(),
                    kind_name(other)
                ));
                Ok(())
            }
        }
    }

    fn copy_dir(
        &mut self,
        src: &OwnedFd,
        dst: &OwnedFd,
        name: &OsStr,
        shown: &Path,
        depth: usize,
    ) -> std::io::Result<()> {
        let from = open_dir(src, name)?;
        // Owner-only while it fills; its own mode and times are set once it is full (adding
        // entries would change the time again).
        rustix::fs::mkdirat(dst, name, Mode::from_raw_mode(0o700))?;
        let to = open_dir(dst, name)?;
        let mut names: Vec<OsString> = Vec::new();
        for entry in rustix::fs::Dir::read_from(&from)? {
            let entry = entry?;
            let n: &CStr = entry.file_name();
            if n.to_bytes() != b"." && n.to_bytes() != b".." {
                names.push(OsStr::from_bytes(n.to_bytes()).to_os_string());
            }
        }
        for n in &names {
            self.copy_entry(&from, &to, n, &shown.join(n), depth + 1)?;
        }
        let meta = File::from(from.try_clone()?).metadata()?;
        let to = File::from(to);
        to.set_permissions(std::fs::Permissions::from_mode(
            meta.permissions().mode() & 0o777,
        ))?;
        to.set_times(times(&meta)?)?;
        Ok(())
    }

    fn copy_file(&mut self, src: &OwnedFd, dst: &OwnedFd, name: &OsStr) -> std::io::Result<()> {
        // NONBLOCK: a FIFO swapped in since the stat must not hang the copy (and is refused
        // below, as everything that is not a regular file).
        let from = rustix::fs::openat(
            src,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let from = File::from(from);
        let meta = from.metadata()?;
        if !meta.is_file() {
            return Err(std::io::Error::other(format!(
                "{} changed into something other than a file during the copy",
                name.to_string_lossy()
            )));
        }
        let to = rustix::fs::openat(
            dst,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        let mut to = File::from(to);
        let len = meta.len();
        if self.try_reflink {
            match rustix::fs::ioctl_ficlone(&to, &from) {
                Ok(()) => {
                    self.report.reflinked = self.report.reflinked.saturating_add(1);
                    return self.finish_file(to, &meta, len);
                }
                // Not this filesystem (or not across these two): copy from now on.
                Err(_) => self.try_reflink = false,
            }
        }
        self.copy_bytes(&from, &mut to, len)?;
        self.finish_file(to, &meta, len)
    }

    fn copy_bytes(&mut self, from: &File, to: &mut File, len: u64) -> std::io::Result<()> {
        let mut done: u64 = 0;
        if self.try_kernel_copy {
            while done < len {
                let chunk = usize::try_from(len - done)
                    .unwrap_or(usize::MAX)
                    .min(1 << 30);
                match rustix::fs::copy_file_range(from.as_fd(), None, to.as_fd(), None, chunk) {
                    Ok(0) => break,
                    Ok(n) => done = done.saturating_add(n as u64),
                    Err(Errno::XDEV | Errno::NOSYS | Errno::INVAL | Errno::OPNOTSUPP)
                        if done == 0 =>
                    {
                        self.try_kernel_copy = false;
                        break;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if done >= len {
                return Ok(());
            }
        }
        // The rest (all of it when the kernel would not copy) through user space; the
        // offsets of both files are where `copy_file_range` left them.
        let mut from = from;
        std::io::copy(&mut from, to)?;
        Ok(())
    }

    fn finish_file(&mut self, to: File, meta: &std::fs::Metadata, len: u64) -> std::io::Result<()> {
        to.set_permissions(std::fs::Permissions::from_mode(
            meta.permissions().mode() & 0o777,
        ))?;
        to.set_times(times(meta)?)?;
        self.report.files = self.report.files.saturating_add(1);
        self.report.bytes = self.report.bytes.saturating_add(len);
        Ok(())
    }
}

/// The access and modification times of `meta`, to give a copy.
fn times(meta: &std::fs::Metadata) -> std::io::Result<FileTimes> {
    Ok(FileTimes::new()
        .set_accessed(meta.accessed()?)
        .set_modified(meta.modified()?))
}

/// Opens directory `name` of `dir` for reading its entries, never through a symlink
/// (`ELOOP`, or `ENOTDIR` told apart as `ELOOP` when `name` is a symlink).
fn open_dir(dir: &OwnedFd, name: &OsStr) -> Result<OwnedFd, Errno> {
    match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Err(Errno::NOTDIR)
            if rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Symlink) =>
        {
            Err(Errno::LOOP)
        }
        other => other,
    }
}

fn kind_name(kind: FileType) -> &'static str {
    match kind {
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharacterDevice | FileType::BlockDevice => "device",
        FileType::Symlink => "symlink",
        _ => "special file",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::time::SystemTime;

    fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().join("base");
        let wt = d.path().join("wt");
        std::fs::create_dir_all(&base).unwrap();
        std::fs::create_dir_all(&wt).unwrap();
        (d, base, wt)
    }

    fn set_mtime(path: &Path, secs: u64) -> SystemTime {
        let t = SystemTime::UNIX_EPOCH + Duration::new(secs, 123_456_789);
        File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(t)
            .unwrap();
        t
    }

    #[test]
    fn a_tree_is_copied_with_mtimes_modes_and_symlinks_as_links() {
        let (_d, base, wt) = dirs();
        let t = base.join("target/debug/deps");
        std::fs::create_dir_all(&t).unwrap();
        std::fs::write(t.join("libx.rlib"), vec![7u8; 100_000]).unwrap();
        std::fs::write(base.join("target/debug/app"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            base.join("target/debug/app"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        let mtime = set_mtime(&t.join("libx.rlib"), 1_600_000_000);
        symlink("/etc/passwd", base.join("target/out")).unwrap();
        symlink("deps/libx.rlib", base.join("target/debug/rel")).unwrap();

        let r = seed(&base, &wt, &[PathBuf::from("target")]).unwrap();
        assert_eq!(r.seeded, vec!["target"]);
        assert!(r.skipped.is_empty(), "{r:?}");
        assert_eq!((r.files, r.symlinks, r.bytes), (2, 2, 100_010));
        assert!(matches!(r.method(), "copy" | "reflink"), "{r:?}");
        let copied = wt.join("target/debug/deps/libx.rlib");
        assert_eq!(std::fs::read(&copied).unwrap(), vec![7u8; 100_000]);
        assert_eq!(
            std::fs::metadata(&copied).unwrap().modified().unwrap(),
            mtime
        );
        let app = std::fs::metadata(wt.join("target/debug/app")).unwrap();
        assert_eq!(app.permissions().mode() & 0o777, 0o755);
        assert_eq!(
            std::fs::read_link(wt.join("target/out")).unwrap(),
            PathBuf::from("/etc/passwd")
        );
        assert_eq!(
            std::fs::read_link(wt.join("target/debug/rel")).unwrap(),
            PathBuf::from("deps/libx.rlib")
        );
        // Its own file: changing the copy leaves the base's.
        std::fs::write(&copied, "rebuilt").unwrap();
        assert_eq!(
            std::fs::read(t.join("libx.rlib")).unwrap(),
            vec![7u8; 100_000]
        );
        use std::os::unix::fs::MetadataExt as _;
        assert_ne!(
            std::fs::metadata(&copied).unwrap().ino(),
            std::fs::metadata(t.join("libx.rlib")).unwrap().ino(),
            "never a hard link"
        );
    }

    #[test]
    fn missing_symlinked_and_checked_out_paths_are_skipped_with_reasons() {
        let (d, base, wt) = dirs();
        let outside = d.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "s").unwrap();
        symlink(&outside, base.join("node_modules")).unwrap();
        symlink(&outside, base.join("via")).unwrap();
        std::fs::create_dir_all(base.join(".venv")).unwrap();
        std::fs::create_dir_all(wt.join(".venv")).unwrap();
        let r = seed(
            &base,
            &wt,
            &[
                PathBuf::from("target"),
                PathBuf::from("node_modules"),
                PathBuf::from("via/secret"),
                PathBuf::from(".venv"),
            ],
        )
        .unwrap();
        assert!(r.seeded.is_empty(), "{r:?}");
        assert_eq!(r.skipped.len(), 4, "{r:?}");
        assert!(r.skipped[0].contains("not in the base checkout"), "{r:?}");
        assert!(r.skipped[1].contains("symlink"), "{r:?}");
        assert!(r.skipped[2].contains("through a symlink"), "{r:?}");
        assert!(r.skipped[3].contains("already has it"), "{r:?}");
        assert!(!wt.join("node_modules").exists());
        assert!(!wt.join("via").exists());
        assert_eq!(r.method(), "none");
    }

    #[test]
    fn fifos_are_left_out_and_named_and_parents_are_made() {
        let (_d, base, wt) = dirs();
        let out = base.join("build/out");
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("f"), "x").unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            out.join("pipe"),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let r = seed(&base, &wt, &[PathBuf::from("build/out")]).unwrap();
        assert_eq!(r.seeded, vec!["build/out"]);
        assert_eq!(r.skipped_entries, 1);
        assert!(r.skipped[0].contains("build/out/pipe: a FIFO"), "{r:?}");
        assert_eq!(
            std::fs::read_to_string(wt.join("build/out/f")).unwrap(),
            "x"
        );
        assert!(!wt.join("build/out/pipe").exists());
    }

    #[test]
    fn a_worktree_inside_the_seeded_tree_is_not_copied_into_itself() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().to_path_buf();
        let wt = base.join("build/runs/wt");
        std::fs::create_dir_all(&wt).unwrap();
        std::fs::write(base.join("build/f"), "x").unwrap();
        // `build` in the worktree is new, so the copy goes ahead, leaving out `wt`.
        let r = seed(&base, &wt, &[PathBuf::from("build")]).unwrap();
        assert_eq!(r.seeded, vec!["build"]);
        assert!(
            r.skipped
                .iter()
                .any(|s| s.contains("the new worktree itself")),
            "{r:?}"
        );
        assert!(wt.join("build/f").is_file());
        assert!(!wt.join("build/runs/wt").exists());
    }

    #[test]
    fn a_single_file_can_be_seeded() {
        let (_d, base, wt) = dirs();
        std::fs::write(base.join(".env.local"), "A=1").unwrap();
        let r = seed(&base, &wt, &[PathBuf::from(".env.local")]).unwrap();
        assert_eq!((r.files, r.bytes), (1, 3));
        assert_eq!(
            std::fs::read_to_string(wt.join(".env.local")).unwrap(),
            "A=1"
        );
    }
}
