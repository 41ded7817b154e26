//! Read tracking of large files: what a full pass of `read_file` learned about a file (its
//! identity, stamp, line count and checkpoints), kept in the loop's context so that another
//! window of the same unchanged file reads only that window.

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::stamp::Stamp;

/// What identifies one version of a file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Size in bytes.
    pub len: u64,
    /// Modification time (seconds, nanoseconds).
    pub mtime: (i64, i64),
    /// Status change time (seconds, nanoseconds).
    pub ctime: (i64, i64),
}

impl FileIdentity {
    /// The identity `meta` describes.
    pub fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Whether the last change was at least `settle` before `time`.
    pub fn settled_before(&self, time: SystemTime, settle: Duration) -> bool {
        let Some(limit) = time.checked_sub(settle) else {
            return false;
        };
        let Ok(limit) = limit.duration_since(UNIX_EPOCH) else {
            return false;
        };
        let (secs, nanos) = self.ctime;
        let limit = (
            i64::try_from(limit.as_secs()).unwrap_or(i64::MAX),
            i64::from(limit.subsec_nanos()),
        );
        (secs, nanos) < limit
    }
}

/// What a full pass learned about a large text file (see the module docs): enough to show
/// any window of the same, unchanged file by reading only that window.
#[derive(Debug)]
pub struct ReadIndex {
    /// The version of the file the index describes.
    pub identity: FileIdentity,
    /// Its stamp.
    pub stamp: Stamp,
    /// `\n` bytes in the file.
    pub newlines: usize,
    /// The file's last byte.
    pub last: Option<u8>,
    /// (byte offset, `\n` bytes before it), ascending, starting with (0, 0).
    pub checkpoints: Vec<(u64, usize)>,
}

impl ReadIndex {
    /// The stamp of the file the index describes.
    pub fn stamp(&self) -> &Stamp {
        &self.stamp
    }

    /// Where to start reading for a window whose first line has 0-based number `first`:
    /// a line start, or a place inside a line before the window (skipped like any line
    /// before the window).
    pub fn start_for(&self, first: usize) -> (u64, usize) {
        let usable = self
            .checkpoints
            .partition_point(|&(offset, newlines)| offset == 0 || newlines < first);
        self.checkpoints[usable.saturating_sub(1)]
    }
}
