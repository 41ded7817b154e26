//! The official Python MCP SDK for tests/mcp.rs, so that `cargo test` passes on a fresh
//! machine: the `python3` on PATH when it can already `import mcp`, else a virtual
//! environment of the tests' own under the cargo target directory, made once
//! (`python3 -m venv`, then pip installs [`SDK_REQUIREMENT`]) and reused by later runs.
//!
//! The environment is made by `super::pip_env` (one maker at a time, complete or made again).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::pip_env::{PipEnv, target_dir};

/// The SDK version the environment gets (the one CI used to install by hand).
pub const SDK_REQUIREMENT: &str = "mcp==2.3.0";

/// A Python interpreter that can `import mcp`. Panics, saying what to do, when the SDK is
/// missing and no environment with it can be made (no `venv` module, no network...).
pub fn python_with_sdk() -> PathBuf {
    let system = PathBuf::from("python3");
    if imports_mcp(&system) {
        return system;
    }
    let env = PipEnv {
        dir: target_dir().join("python-mcp-sdk"),
        requirement: SDK_REQUIREMENT,
        works: &|venv: &Path| imports_mcp(&venv.join("bin").join("python3")),
        needed_by: "The MCP round-trip test needs the official Python MCP SDK. Either install it for the python3 on PATH (`python3 -m pip install 'mcp==2.3.0'`, Python 3.10 or later), or let this test make its own environment",
    };
    env.ensure().join("bin").join("python3")
}

/// Whether `python` runs and can import the SDK.
fn imports_mcp(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import mcp"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
