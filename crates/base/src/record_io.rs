//! Writes of record files (run records, receipt logs) that a crash, a power loss or a full
//! disk cannot leave half done:
//!
//! - [`append`] adds bytes at the end of an append-only file in one write; when the write
//!   fails (a full disk cuts it short), the file is cut back to where it was, so that no torn
//!   line is left for the next line to be glued to. With `sync`, the data is on the disk
//!   (`fdatasync`) before it returns, and so is every earlier append to the file.
//! - [`replace`] swaps a whole file: a temporary file in the same directory is written and
//!   synced, renamed over the old one, and the directory synced, so a reader sees the old or
//!   the new content and a power loss keeps one of them.
//! - [`sync_dir`] makes a directory's entries durable (a file just created in it).

use std::fs::File;
use std::io::Write;
use std::path::Path;

/// Appends `bytes` to `file` (opened for appending) in one write; on failure the file is cut
/// back to its length before, and the write's error is returned. With `sync`, the data
/// reaches the disk before this returns (an error the disk reports only then is returned
/// too, and the append is undone). The file has one appender at a time (its caller holds the
/// file's lock): the length before is the length after less what this call wrote, so it is
/// read only when a write fails (a `statx` per record line otherwise).
pub fn append(file: &mut File, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    let mut written: u64 = 0;
    let done = write_counted(file, bytes, &mut written)
        .and_then(|()| if sync { file.sync_data() } else { Ok(()) });
    if let Err(e) = done {
        // Cutting back needs no space; if even that fails the reader still reports the torn
        // line, so the write's own error is what the caller needs to hear.
        if let Ok(meta) = file.metadata() {
            let _ = file.set_len(meta.len().saturating_sub(written));
        }
        return Err(e);
    }
    Ok(())
}

/// Writes all of `bytes`, counting in `written` what reached the file (also when a later
/// write fails: a full disk cuts a write short, then refuses the next).
fn write_counted(file: &mut File, bytes: &[u8], written: &mut u64) -> std::io::Result<()> {
    let mut rest = bytes;
    while !rest.is_empty() {
        match file.write(rest) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                *written = written.saturating_add(n as u64);
                rest = rest.get(n..).unwrap_or_default();
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Replaces `path` with `bytes` atomically and durably: `<name>.tmp` beside it is written,
/// synced and renamed over `path`, then the directory is synced. On failure the old file is
/// left as it was and the temporary file removed.
pub fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    let tmp = dir.join(name);
    let written = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(dir)
}

/// Makes the entries of directory `dir` durable (`fsync` on the directory).
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_add_and_replacements_swap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        append(&mut f, b"one\n", false).unwrap();
        append(&mut f, b"two\n", true).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\ntwo\n");

        let summary = dir.path().join("summary.json");
        replace(&summary, b"{}\n").unwrap();
        replace(&summary, b"{\"a\": 1}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&summary).unwrap(), "{\"a\": 1}\n");
        assert!(!dir.path().join("summary.json.tmp").exists());
    }

    #[test]
    fn a_failed_append_leaves_the_file_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        std::fs::write(&path, "kept\n").unwrap();
        // A handle that cannot write stands in for a full disk: the write fails and the
        // length is what it was.
        let mut read_only = File::open(&path).unwrap();
        assert!(append(&mut read_only, b"lost\n", true).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "kept\n");
    }

    #[test]
    fn a_failed_replacement_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("summary.json");
        std::fs::write(&path, "old\n").unwrap();
        // The temporary file's name is taken by a directory: it cannot be created.
        std::fs::create_dir(dir.path().join("summary.json.tmp")).unwrap();
        assert!(replace(&path, b"new\n").is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old\n");
    }
}
