//! What the dashboard knows of a run beyond its record, from the run's `taskdaemon.yml` when
//! it can still be read: each loop's dependencies and base, the repository its branches are
//! in, and the config's text.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::Config;

/// Longest config text the dashboard shows.
const MAX_CONFIG_BYTES: u64 = 256 * 1024;

/// One loop as the config describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoopInfo {
    /// The loops it waits on.
    pub depends_on: Vec<String>,
    /// Its base branch, when the config names one.
    pub base: Option<String>,
    /// Its type's iteration limit, when the config's types resolve.
    pub max_iterations: Option<u32>,
}

/// What the config of a run says, as far as it could be read.
#[derive(Debug, Clone, Default)]
pub struct Project {
    /// The repository holding the loops' branches.
    pub repo: Option<PathBuf>,
    /// The config's loops.
    pub loops: BTreeMap<String, LoopInfo>,
    /// The config's text (redacted), when readable.
    pub config_text: Option<String>,
}

impl Project {
    /// Reads the config `recorded` (the path the run recorded, relative to where it was
    /// started) of the run in `run_dir`. A run whose config is gone still has its record:
    /// what cannot be read stays empty.
    pub fn load(run_dir: &Path, recorded: Option<&str>) -> Project {
        let copy = run_dir.join("repo");
        let mut project = Project::default();
        if copy.join(".git").exists() {
            project.repo = Some(copy);
        }
        let Some(path) = recorded.and_then(|r| find_config(run_dir, Path::new(r))) else {
            return project;
        };
        let config = Config::load(&path).ok();
        // The variables the config names as secret are redacted from every answer (a diff
        // may hold one), as the run redacts them from its record.
        if let Some(config) = &config {
            td_base::secrets::register_environment(&config.sandbox.env.secret);
        }
        project.config_text = read_text(&path);
        let Some(config) = config else {
            return project;
        };
        let base_dir = path
            .canonicalize()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_default();
        if project.repo.is_none() && !config.copy_repo {
            project.repo = Some(base_dir.join(config.repo.clone().unwrap_or_else(|| ".".into())));
        }
        let types = config.loop_types().unwrap_or_default();
        project.loops = config
            .loops
            .iter()
            .map(|l| {
                (
                    l.name.clone(),
                    LoopInfo {
                        depends_on: l.depends_on.clone(),
                        base: l.base.clone(),
                        max_iterations: types.get(&l.loop_type).map(|t| t.max_iterations),
                    },
                )
            })
            .collect();
        project
    }
}

/// The config file a run recorded: as recorded (absolute, or relative to this process's
/// directory), else relative to the project the run directory is in
/// (`PROJECT/.taskdaemon/runs/RUN`).
fn find_config(run_dir: &Path, recorded: &Path) -> Option<PathBuf> {
    if recorded.is_file() {
        return Some(recorded.to_path_buf());
    }
    let project = run_dir.parent()?.parent()?.parent()?;
    let beside = project.join(recorded);
    beside.is_file().then_some(beside)
}

fn read_text(path: &Path) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES).read_to_string(&mut text).ok()?;
    Some(td_base::secrets::redact(&text).into_owned())
}
