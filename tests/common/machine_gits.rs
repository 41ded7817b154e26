//! Every git on this machine (`/usr/local/bin` and `/usr/bin` hold different versions here),
//! and the daemon run with one of them first on `PATH`: for the tests of what the daemon's own
//! git does, which must hold with each.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The directories holding a distinct `git` executable, in `PATH` order of preference.
pub fn gits() -> Vec<PathBuf> {
    let mut seen = Vec::new();
    let mut dirs = Vec::new();
    for dir in ["/usr/local/bin", "/usr/bin", "/bin"] {
        let git = Path::new(dir).join("git");
        let Ok(real) = git.canonicalize() else {
            continue;
        };
        let executable =
            std::fs::metadata(&real).is_ok_and(|m| m.permissions().mode() & 0o111 != 0);
        if executable && !seen.contains(&real) {
            seen.push(real);
            dirs.push(PathBuf::from(dir));
        }
    }
    assert!(!dirs.is_empty(), "no git on this machine");
    dirs
}

/// What the git in `dir` says its version is (`git version 2.47.3`).
pub fn version(dir: &Path) -> String {
    let out = Command::new(dir.join("git"))
        .arg("--version")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `taskdaemon run -c CONFIG` with the git of `git_dir` first on `PATH`, `HOME` at `home`
/// (whose `.gitconfig` the daemon's git reads).
pub fn run(config: &Path, git_dir: &Path, home: &Path) -> Output {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![git_dir.to_path_buf()];
    dirs.extend(std::env::split_paths(&path));
    Command::new(env!("CARGO_BIN_EXE_taskdaemon"))
        .arg("run")
        .arg("-c")
        .arg(config)
        .env("PATH", std::env::join_paths(dirs).unwrap())
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// A fresh directory for one case (its path resolved) and a `HOME` in it (with `.config`),
/// whose `.gitconfig` the daemon's git reads when [`run`] is given it.
pub fn case_dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let home = root.join("home");
    std::fs::create_dir_all(home.join(".config")).unwrap();
    (tmp, root, home)
}

/// What to report when `out`, the run of `case`, failed; `None` when it succeeded.
pub fn run_failed(case: &str, out: &Output) -> Option<String> {
    (!out.status.success()).then(|| {
        format!(
            "{case}: the run failed\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}
