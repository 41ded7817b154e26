//! A loop's artifacts (plans, specs, phases) kept with its run.
//!
//! `create_plan`, `create_spec` and `create_phase` write into `taskdaemon-artifacts/` of the
//! loop's worktree, which the loop's end commit puts on its branch. When the loop ends, the
//! daemon also copies that folder into the run record, `loops/<loop>/artifacts/`, because
//! the worktree is deleted at the end of the run and a branch can be deleted by anyone;
//! `summary.json` lists what was kept per loop (`artifacts: [{kind, name, path, bytes}]`),
//! and `taskdaemon status` shows it.
//!
//! The folder is the loop's, and the loop (or a command it ran) may have put anything there:
//! it is read beneath the worktree's root handle ([`WorktreeFs`]), so a symlink (the folder
//! itself, or an entry) is never followed; only regular files whose names are artifact
//! names are copied (a FIFO, socket or device is never opened for reading); a file with a
//! hard link outside the worktree, or hidden from loops (`sandbox.hide`), is not copied;
//! [`MAX_FILE_BYTES`], [`MAX_LOOP_BYTES`] and [`MAX_FILES`] cap what one loop adds to the
//! record. Everything left out is said, one line each, in the loop's summary
//! (`artifacts_skipped`) and in `loops/<loop>/artifacts-skipped.txt`.
//!
//! The copy replaces what an earlier end of the same loop kept (a resumed loop ends again):
//! it is made in a fresh directory beside it and renamed into place. `summary.json` is a view
//! of these files: [`kept_in_record`] lists them again for a rebuilt summary.
//!
//! A loop whose tools write artifacts (a `plan`, `spec` or `phase` loop, or a type extending
//! one) that completes without any in its folder gets a warning in its reason and progress
//! line: the next stage has nothing to start from.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::run::record::{RunRecord, loop_dir};
use td_base::shown_path::show;
use td_toolkit::artifact_files::{self, ARTIFACT_DIR, EntryKind};
use td_toolkit::worktree_fs::{OpenError, WorktreeFs};

/// The folder of a loop's record (`loops/<loop>/`) the artifacts are copied into.
pub const RECORD_DIR: &str = "artifacts";

/// The file (in `loops/<loop>/`) that says what was not copied, one line each.
pub const SKIPPED_FILE: &str = "artifacts-skipped.txt";

/// Largest artifact file copied into the record (an artifact is a page of JSON or Markdown).
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Most bytes one loop's artifacts add to the record.
pub const MAX_LOOP_BYTES: u64 = 8 * 1024 * 1024;

/// Most artifact files one loop keeps.
pub const MAX_FILES: usize = 256;

/// Longest `artifacts-skipped.txt` read back for a rebuilt summary.
const MAX_SKIPPED_READ: u64 = 64 * 1024;

/// The tools whose output is an artifact: a loop that has one of them is a stage whose
/// output the next stage needs.
const ARTIFACT_TOOLS: [&str; 3] = ["create_plan", "create_spec", "create_phase"];

/// One artifact file kept in the run record, as `summary.json` lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptArtifact {
    /// `plan`, `spec` or `phase`.
    pub kind: String,
    /// The artifact's name.
    pub name: String,
    /// The copy, relative to the run directory (`loops/<loop>/artifacts/<kind>-<name>.<ext>`).
    pub path: String,
    /// Its size.
    pub bytes: u64,
}

/// What a copy kept and left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kept {
    /// The files copied, by file name.
    pub files: Vec<KeptArtifact>,
    /// What was not copied and why, one line each (`plan-x.md: a symlink (not followed)`).
    pub skipped: Vec<String>,
}

impl Kept {
    /// How many artifacts (a kind and a name: its `.json` and `.md` count once).
    pub fn count(files: &[KeptArtifact]) -> usize {
        let mut pairs: Vec<(&str, &str)> = files
            .iter()
            .map(|f| (f.kind.as_str(), f.name.as_str()))
            .collect();
        pairs.sort_unstable();
        pairs.dedup();
        pairs.len()
    }
}

/// Copies the artifacts in `worktree`'s `taskdaemon-artifacts/` into the record of loop
/// `loop_name` in `run_dir`, replacing an earlier copy, and writes or removes
/// `artifacts-skipped.txt`. `hidden` are the paths loops may not read (`sandbox.hide`).
/// An error only when the record could not be written.
pub fn copy_into_record(
    run_dir: &Path,
    loop_name: &str,
    worktree: &Path,
    hidden: &[PathBuf],
) -> Result<Kept, String> {
    let record = loop_dir(run_dir, loop_name)?;
    let rel_base = format!("{}/{loop_name}/{RECORD_DIR}", crate::run::record::LOOPS_DIR);
    let fresh = record.join(format!(".{RECORD_DIR}.new"));
    let failed = |what: &str, path: &Path, e: std::io::Error| {
        format!("cannot {what} {}: {e}", path.display())
    };
    std::fs::create_dir_all(&record).map_err(|e| failed("create", &record, e))?;
    if fresh.exists() {
        std::fs::remove_dir_all(&fresh).map_err(|e| failed("remove", &fresh, e))?;
    }
    let mut kept = Kept::default();
    match WorktreeFs::new(worktree) {
        Ok(files) => {
            files.set_hidden(hidden);
            copy_folder(&files, &fresh, &rel_base, &mut kept)?;
        }
        Err(e) => kept
            .skipped
            .push(format!("the worktree cannot be opened: {e}")),
    }
    // Replace what an earlier end of the loop kept.
    let dest = record.join(RECORD_DIR);
    if dest.exists() {
        std::fs::remove_dir_all(&dest).map_err(|e| failed("remove", &dest, e))?;
    }
    if fresh.exists() {
        std::fs::rename(&fresh, &dest).map_err(|e| failed("rename into place", &fresh, e))?;
    }
    let skipped = record.join(SKIPPED_FILE);
    if kept.skipped.is_empty() {
        match std::fs::remove_file(&skipped) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(failed("remove", &skipped, e)),
        }
    } else {
        let text: String = kept.skipped.iter().map(|l| format!("{l}\n")).collect();
        td_base::record_io::replace(&skipped, text.as_bytes())
            .map_err(|e| failed("write", &skipped, e))?;
    }
    td_base::record_io::sync_dir(&record).map_err(|e| failed("sync", &record, e))?;
    Ok(kept)
}

/// Copies the artifact files of `files`' folder into `fresh` (made on the first one).
fn copy_folder(
    files: &WorktreeFs,
    fresh: &Path,
    rel_base: &str,
    kept: &mut Kept,
) -> Result<(), String> {
    let folder = match artifact_files::read_folder(files) {
        Ok(Some(folder)) => folder,
        Ok(None) => return Ok(()),
        Err(problem) => {
            kept.skipped.push(problem.to_string());
            return Ok(());
        }
    };
    if folder.truncated {
        kept.skipped.push(format!(
            "{ARTIFACT_DIR} holds more than {} entries: only the first {} by name were looked at",
            artifact_files::MAX_ENTRIES,
            artifact_files::MAX_ENTRIES
        ));
    }
    let base = artifact_files::folder_path(files);
    let mut total: u64 = 0;
    for entry in &folder.names {
        let read = if kept.files.len() >= MAX_FILES {
            Err(format!("over the {MAX_FILES} files one loop keeps"))
        } else {
            read_entry(files, &base, entry, total)
        };
        let (kind, name, ext, bytes) = match read {
            Ok(found) => found,
            Err(why) => {
                kept.skipped.push(format!("{}: {why}", show(entry)));
                continue;
            }
        };
        let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        total = total.saturating_add(len);
        if !fresh.exists() {
            std::fs::create_dir_all(fresh)
                .map_err(|e| format!("cannot create {}: {e}", fresh.display()))?;
        }
        // Made from a checked kind and name: a plain file name.
        let file = artifact_files::file_name(kind, name, ext);
        let target = fresh.join(&file);
        td_base::record_io::replace(&target, &bytes)
            .map_err(|e| format!("cannot write {}: {e}", target.display()))?;
        kept.files.push(KeptArtifact {
            kind: kind.to_string(),
            name: name.to_string(),
            path: format!("{rel_base}/{file}"),
            bytes: len,
        });
    }
    Ok(())
}

/// Reads the folder's entry `entry` if it is an artifact file that may be kept, with `total`
/// bytes kept so far: its kind, name, extension and content; otherwise why not.
fn read_entry<'a>(
    files: &WorktreeFs,
    base: &Path,
    entry: &'a std::ffi::OsStr,
    total: u64,
) -> Result<(&'static str, &'a str, &'static str, Vec<u8>), String> {
    let file = entry.to_str();
    let Some((kind, name)) = file.and_then(artifact_files::parse_file_name) else {
        return Err("not an artifact name (plan-, spec- or phase-<name>.json or .md)".into());
    };
    let ext = match file {
        Some(f) if f.ends_with(".json") => "json",
        _ => "md",
    };
    let path = base.join(entry);
    // Looked at first without opening anything: a FIFO or device is never opened.
    match artifact_files::entry_kind(files, &path) {
        Some(EntryKind::Regular) => {}
        Some(EntryKind::Symlink) => return Err("a symlink (not followed)".into()),
        Some(EntryKind::Directory) => return Err("a directory".into()),
        Some(EntryKind::Special) => {
            return Err("not a regular file (a FIFO, socket or device: never opened)".into());
        }
        None => return Err("went away while it was being copied".into()),
    }
    let opened = files.open_named_file(&path).map_err(open_refusal)?;
    // At most one byte past the cap: the size seen at opening may grow meanwhile.
    let mut bytes = Vec::new();
    opened
        .file
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot be read: {e}"))?;
    let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if len > MAX_FILE_BYTES {
        return Err(format!(
            "larger than {MAX_FILE_BYTES} bytes, the most one artifact file may have"
        ));
    }
    if total.checked_add(len).is_none_or(|t| t > MAX_LOOP_BYTES) {
        return Err(format!(
            "over the {MAX_LOOP_BYTES} bytes one loop's artifacts may take together"
        ));
    }
    Ok((kind, name, ext, bytes))
}

/// Why an entry that looked like a regular file could not be opened as one.
fn open_refusal(e: OpenError) -> String {
    match e {
        OpenError::Swapped => {
            "replaced by a symlink while it was being copied (not followed)".into()
        }
        OpenError::Directory => "a directory".into(),
        OpenError::NotRegular => {
            "not a regular file (a FIFO, socket or device: never opened)".into()
        }
        OpenError::Hidden => "hidden from loops (sandbox.hide)".into(),
        OpenError::LinkedOutside { .. } => {
            "a hard link to a file outside the worktree (not copied)".into()
        }
        OpenError::LinksChanging => {
            "its hard links could not be counted (they changed, or a directory cannot be read)"
                .into()
        }
        OpenError::Io(e) => format!("cannot be opened: {e}"),
    }
}

/// The artifacts kept in the record of loop `loop_name` (read back from
/// `loops/<loop>/artifacts/` and `artifacts-skipped.txt`), for a rebuilt summary: regular
/// files with artifact names only, by file name; nothing when the loop kept none.
pub fn kept_in_record(run_dir: &Path, loop_name: &str) -> Kept {
    let mut kept = Kept::default();
    let Ok(record) = loop_dir(run_dir, loop_name) else {
        return kept;
    };
    let rel_base = format!("{}/{loop_name}/{RECORD_DIR}", crate::run::record::LOOPS_DIR);
    if let Ok(entries) = std::fs::read_dir(record.join(RECORD_DIR)) {
        let mut names: Vec<(String, u64)> = entries
            .flatten()
            .take(MAX_FILES)
            .filter_map(|e| {
                // `DirEntry::metadata` does not follow a symlink.
                let meta = e.metadata().ok().filter(std::fs::Metadata::is_file)?;
                Some((e.file_name().to_str()?.to_string(), meta.len()))
            })
            .collect();
        names.sort();
        for (file, bytes) in names {
            if let Some((kind, name)) = artifact_files::parse_file_name(&file) {
                kept.files.push(KeptArtifact {
                    kind: kind.to_string(),
                    name: name.to_string(),
                    path: format!("{rel_base}/{file}"),
                    bytes,
                });
            }
        }
    }
    if let Ok(file) = std::fs::File::open(record.join(SKIPPED_FILE)) {
        let mut text = String::new();
        if file
            .take(MAX_SKIPPED_READ)
            .read_to_string(&mut text)
            .is_ok()
        {
            kept.skipped = text.lines().map(str::to_string).collect();
        }
    }
    kept
}

/// The warning for a loop with `tools` that completed with `files` kept: `Some` when the
/// loop is a stage that writes artifacts (it has `create_plan`, `create_spec` or
/// `create_phase`) and its folder held none.
pub fn missing_warning(tools: &[String], files: &[KeptArtifact]) -> Option<String> {
    let writers: Vec<&str> = ARTIFACT_TOOLS
        .iter()
        .copied()
        .filter(|t| tools.iter().any(|have| have == t))
        .collect();
    if writers.is_empty() || !files.is_empty() {
        return None;
    }
    Some(format!(
        "warning: it completed without writing any artifact ({} was never called, or its \
         files are gone): {ARTIFACT_DIR}/ is empty, so the stage after it has nothing to \
         start from",
        writers.join(" / ")
    ))
}

/// What the orchestrator does when a loop ended: copies its artifacts into the record (off
/// the async threads), lists them in its summary entry, and warns when a stage that writes
/// artifacts completed without any. `worktree` is where the loop worked (`None`: it never
/// got a place). A record that cannot be written is said on stderr; the run goes on.
pub async fn keep_at_end(
    record: &RunRecord,
    progress: &crate::run::progress::ProgressDisplay,
    name: &str,
    worktree: Option<&Path>,
    tools: &[String],
    completed: bool,
    sandbox: &td_confine::SandboxSettings,
) {
    let Some(worktree) = worktree else {
        return;
    };
    let hidden: Vec<PathBuf> = sandbox
        .hide
        .iter()
        .chain(&sandbox.secret_files)
        .cloned()
        .collect();
    let job = {
        let (run_dir, name, worktree) = (
            record.dir().to_path_buf(),
            name.to_string(),
            worktree.to_path_buf(),
        );
        tokio::task::spawn_blocking(move || copy_into_record(&run_dir, &name, &worktree, &hidden))
    };
    let kept = match job.await {
        Ok(Ok(kept)) => kept,
        Ok(Err(why)) => {
            record.note_failure(format!(
                "loop `{name}`: its artifacts could not be kept: {why}"
            ));
            return;
        }
        Err(e) => {
            eprintln!("taskdaemon: loop {name}: copying its artifacts failed: {e}");
            return;
        }
    };
    let warning = completed
        .then(|| missing_warning(tools, &kept.files))
        .flatten();
    // What the loop's end made of it (completed, or blocked by its merge) stays shown.
    let mut status = crate::run::record::LoopStatus::Completed;
    let _ = record.update_loop(name, |s| {
        s.artifacts = kept.files;
        s.artifacts_skipped = kept.skipped;
        if let Some(warning) = &warning {
            s.reason = Some(match s.reason.take() {
                Some(earlier) => format!("{earlier}; {warning}"),
                None => warning.clone(),
            });
        }
        status = s.status;
    });
    if let Some(warning) = warning {
        progress.set_status(name, status.as_str(), &warning);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use td_toolkit::artifact_files::FolderProblem;

    fn worktree_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join(ARTIFACT_DIR);
        std::fs::create_dir(&folder).unwrap();
        for (name, content) in files {
            std::fs::write(folder.join(name), content).unwrap();
        }
        dir
    }

    fn copy(run: &Path, worktree: &Path) -> Kept {
        copy_into_record(run, "p", &worktree.canonicalize().unwrap(), &[]).unwrap()
    }

    #[test]
    fn artifacts_are_copied_and_listed_and_other_names_said() {
        let wt = worktree_with(&[
            ("plan-x.json", "{}\n"),
            ("plan-x.md", "# X\n"),
            ("notes.txt", "n"),
        ]);
        let run = tempfile::tempdir().unwrap();
        let kept = copy(run.path(), wt.path());
        assert_eq!(
            kept.files,
            vec![
                KeptArtifact {
                    kind: "plan".into(),
                    name: "x".into(),
                    path: "loops/p/artifacts/plan-x.json".into(),
                    bytes: 3
                },
                KeptArtifact {
                    kind: "plan".into(),
                    name: "x".into(),
                    path: "loops/p/artifacts/plan-x.md".into(),
                    bytes: 4
                },
            ]
        );
        assert_eq!(Kept::count(&kept.files), 1);
        assert_eq!(
            std::fs::read_to_string(run.path().join("loops/p/artifacts/plan-x.md")).unwrap(),
            "# X\n"
        );
        assert_eq!(kept.skipped.len(), 1);
        assert!(kept.skipped[0].starts_with("notes.txt: not an artifact name"));
        assert_eq!(
            kept_in_record(run.path(), "p"),
            kept,
            "the record lists the same"
        );
    }

    #[test]
    fn links_fifos_and_oversized_files_are_not_copied() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "secret\n").unwrap();
        let big = "x".repeat(usize::try_from(MAX_FILE_BYTES).unwrap() + 1);
        let wt = worktree_with(&[("spec-big.md", &big), ("spec-ok.md", "ok\n")]);
        let folder = wt.path().join(ARTIFACT_DIR);
        std::os::unix::fs::symlink(outside.path().join("secret"), folder.join("plan-link.md"))
            .unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            folder.join("plan-fifo.json"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // On another filesystem there is no hard link to test; the rest still is.
        let _ = std::fs::hard_link(outside.path().join("secret"), folder.join("phase-hard.md"));
        let run = tempfile::tempdir().unwrap();
        let kept = copy(run.path(), wt.path());
        let names: Vec<&str> = kept.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["loops/p/artifacts/spec-ok.md"]);
        let said = kept.skipped.join("\n");
        assert!(
            said.contains("plan-link.md: a symlink (not followed)"),
            "{said}"
        );
        assert!(
            said.contains("plan-fifo.json: not a regular file"),
            "{said}"
        );
        assert!(
            said.contains("spec-big.md: larger than 1048576 bytes"),
            "{said}"
        );
        if folder.join("phase-hard.md").exists() {
            assert!(
                said.contains("phase-hard.md: a hard link to a file outside"),
                "{said}"
            );
        }
        let skipped = std::fs::read_to_string(run.path().join("loops/p").join(SKIPPED_FILE));
        assert_eq!(skipped.unwrap(), format!("{said}\n"));
        let copied: Vec<_> = std::fs::read_dir(run.path().join("loops/p/artifacts"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(copied, ["spec-ok.md"]);
    }

    #[test]
    fn a_folder_that_is_a_link_is_not_followed_and_a_second_copy_replaces_the_first() {
        let run = tempfile::tempdir().unwrap();
        let wt = worktree_with(&[("plan-a.md", "a")]);
        assert_eq!(copy(run.path(), wt.path()).files.len(), 1);
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("plan-o.md"), "o").unwrap();
        let folder = wt.path().join(ARTIFACT_DIR);
        std::fs::remove_dir_all(&folder).unwrap();
        std::os::unix::fs::symlink(outside.path(), &folder).unwrap();
        let kept = copy(run.path(), wt.path());
        assert!(kept.files.is_empty());
        assert_eq!(kept.skipped, [FolderProblem::Symlink.to_string()]);
        assert!(!run.path().join("loops/p/artifacts").exists(), "replaced");
        // No folder at all: nothing kept, nothing said.
        std::fs::remove_file(&folder).unwrap();
        assert_eq!(copy(run.path(), wt.path()), Kept::default());
        assert!(!run.path().join("loops/p").join(SKIPPED_FILE).exists());
    }

    #[test]
    fn the_per_loop_cap_holds() {
        let chunk = "y".repeat(usize::try_from(MAX_FILE_BYTES).unwrap());
        let names: Vec<String> = (0..10).map(|i| format!("phase-p{i}.md")).collect();
        let files: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), chunk.as_str())).collect();
        let wt = worktree_with(&files);
        let run = tempfile::tempdir().unwrap();
        let kept = copy(run.path(), wt.path());
        let total: u64 = kept.files.iter().map(|f| f.bytes).sum();
        assert_eq!(total, MAX_LOOP_BYTES);
        assert_eq!(kept.skipped.len(), 2, "{:?}", kept.skipped);
        assert!(kept.skipped[0].contains("one loop's artifacts may take together"));
    }

    #[test]
    fn only_stages_that_write_artifacts_are_warned() {
        let plan = vec!["read_file".to_string(), "create_plan".to_string()];
        let code = vec!["read_file".to_string()];
        let warning = missing_warning(&plan, &[]).unwrap();
        assert!(
            warning.contains("create_plan was never called"),
            "{warning}"
        );
        assert_eq!(missing_warning(&code, &[]), None);
        let one = KeptArtifact::default();
        assert_eq!(missing_warning(&plan, &[one]), None);
    }
}
