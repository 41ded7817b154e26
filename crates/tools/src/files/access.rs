//! How the file tools open worktree files and say why they could not: the open with
//! `read_file`'s messages (also used by `grep` and `symbols`), an I/O error mapped for the
//! model (a missing file names close matches in its directory), and the error of a replace
//! that did not happen (`write_file`, `edit_file`, the artifact tools).

use std::path::Path;

use td_toolkit::error::{ToolError, ToolResult};
use td_toolkit::worktree_fs::replace::ReplaceError;
use td_toolkit::worktree_fs::{OpenedFile, WorktreeFs};

/// Opens `real` beneath the worktree root for reading (a regular file, all of whose hard
/// links are inside), with read_file's messages.
pub(crate) fn open_for_reading(
    files: &WorktreeFs,
    real: &Path,
    shown: &str,
) -> ToolResult<OpenedFile> {
    files.open_named_file(real).map_err(|refusal| {
        refusal.into_tool_error(
            "reading",
            shown,
            "Use list_directory to see its entries, then read_file on one of the files.",
            |e| io_error(files, "reading", real, shown, &e),
        )
    })
}

/// Maps an I/O error on a file tool's path; a missing file names close matches in its
/// directory, or says that the directory itself is missing.
pub(crate) fn io_error(
    files: &WorktreeFs,
    action: &str,
    real: &Path,
    shown: &str,
    err: &std::io::Error,
) -> ToolError {
    if err.kind() == std::io::ErrorKind::NotFound {
        return not_found(
            files,
            real,
            shown,
            "Use list_directory or glob to find the right path.",
        );
    }
    ToolError::from_io(action, shown, err)
}

/// A `NotFound` error for `real` with a "did you mean" from its directory, then `advice`.
pub(crate) fn not_found(files: &WorktreeFs, real: &Path, shown: &str, advice: &str) -> ToolError {
    let hint = match (real.parent(), real.file_name()) {
        // Listed beneath the root: a parent swapped for a symlink shows nothing from outside.
        (Some(parent), Some(name)) => match files.entry_names(parent) {
            Some(entries) => {
                // Compared and shown as a model sees names (escaped where not plain).
                let mut names: Vec<String> = entries
                    .iter()
                    .map(|n| td_base::shown_path::show(n).into_owned())
                    .collect();
                // Sorted so that ties between equally close names resolve the same way.
                names.sort_unstable();
                let name = td_base::shown_path::show(name);
                match td_base::suggest::closest(&name, names.iter().map(String::as_str)) {
                    Some(close) => {
                        format!("Did you mean '{}'? {advice}", sibling_display(shown, close))
                    }
                    None => advice.to_string(),
                }
            }
            None => format!(
                "Its directory '{}' does not exist either. {advice}",
                parent_display(shown)
            ),
        },
        _ => advice.to_string(),
    };
    ToolError::NotFound {
        path: shown.to_string(),
        hint,
    }
}

/// How a file named `name` (as shown) next to `shown` is displayed.
fn sibling_display(shown: &str, name: &str) -> String {
    match shown.rsplit_once('/') {
        Some((parent, _)) if !parent.is_empty() => format!("{parent}/{name}"),
        _ => name.to_string(),
    }
}

fn parent_display(shown: &str) -> String {
    match shown.rsplit_once('/') {
        Some((parent, _)) if !parent.is_empty() => parent.to_string(),
        _ => ".".to_string(),
    }
}

/// The tool error for a replace that did not happen (the old file is as it was). Shared by
/// `write_file`, `edit_file` and the artifact tools.
pub(crate) fn replace_error(
    files: &WorktreeFs,
    err: ReplaceError,
    action: &str,
    real: &Path,
    shown: &str,
) -> ToolError {
    match err {
        ReplaceError::Open(refusal) => refusal.into_tool_error(
            action,
            shown,
            &format!(
                "Choose a file path, e.g. '{}/name.ext', or use list_directory to see what is inside.",
                shown.trim_end_matches('/')
            ),
            |e| match e.raw_os_error() {
                Some(libc::ENOTDIR) => ToolError::failed(
                    format!("{action} '{shown}'"),
                    "a part of the path before the file name is a file, not a directory",
                    "Choose another path, or check the parts with list_directory.",
                ),
                _ => io_error(files, action, real, shown, &e),
            },
        ),
        ReplaceError::Write(e) if e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT) => {
            ToolError::failed(
                format!("{action} '{shown}'"),
                e,
                "The disk is full; the file was left as it was. Free space (e.g. remove build output you made) and try again.",
            )
        }
        ReplaceError::Write(e) => ToolError::failed(
            format!("{action} '{shown}'"),
            e,
            "The file was left as it was; check the path and try again.",
        ),
        ReplaceError::Stale => ToolError::StaleRead {
            path: shown.to_string(),
        },
        ReplaceError::StaleWithLostWrite => ToolError::failed(
            format!("{action} '{shown}'"),
            "it changed on disk since you last read it, and another process wrote to it while the edit was being put in place: what it wrote then is lost",
            "Read it again with read_file, check what the other process needed there, then redo the edit.",
        ),
    }
}
