//! A scripted project whose commands wait on flag files (see [`super::flagged_project`]),
//! with its run directory beside it: what the tests of crash recovery and run ownership
//! start, kill and resume.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The project, its flags folder, its config and its run directory.
pub struct FlaggedRun {
    _tmp: tempfile::TempDir,
    /// Where the script's commands leave and look for flags (`{f}` in the script).
    pub flags: PathBuf,
    /// `taskdaemon.yml`.
    pub config: PathBuf,
    /// The run directory (`--run-dir`).
    pub run_dir: PathBuf,
}

impl FlaggedRun {
    /// A project of `script` (the scripted provider's, `{f}` for the flags folder) and the
    /// `loops:` entries `loops`.
    pub fn new(script: &str, loops: &str) -> FlaggedRun {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let (config, flags) = super::flagged_project(&root, script, loops);
        FlaggedRun {
            _tmp: tmp,
            flags,
            config,
            run_dir: root.join("run"),
        }
    }

    /// `taskdaemon run -c CONFIG --run-dir RUN_DIR EXTRA`, stdin closed.
    pub fn command(&self, extra: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_taskdaemon"));
        c.args(["run", "-c"])
            .arg(&self.config)
            .arg("--run-dir")
            .arg(&self.run_dir)
            .args(extra)
            .stdin(std::process::Stdio::null());
        c
    }

    /// The flag file `name`.
    pub fn flag(&self, name: &str) -> PathBuf {
        self.flags.join(name)
    }

    /// The run's events (lines that do not parse are left out).
    pub fn events(&self) -> Vec<Value> {
        super::lines(&self.run_dir.join("events.jsonl"))
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// How many `event` events name `loop_name`.
    pub fn count(&self, event: &str, loop_name: &str) -> usize {
        self.events()
            .iter()
            .filter(|e| e["event"] == event && e["loop_name"] == loop_name)
            .count()
    }

    /// The run id its summary names.
    pub fn run_id(&self) -> String {
        summary(&self.run_dir)["run_id"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

/// `summary.json` of `run_dir`; `null` when it is missing or does not parse.
pub fn summary(run_dir: &Path) -> Value {
    std::fs::read_to_string(run_dir.join("summary.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}
