//! What a host checks of the head's requests before it acts on them: a host trusts its head
//! with the loop's work, not with its own machine. Every name that becomes a path here is
//! checked, and every path a loop's files go to is one directory beneath the host's work
//! directory, named after the loop.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use td_base::secrets::{is_secret_name, is_secret_value};
use td_cluster::protocol::StartLoop;
use td_confine::{ReadScope, SandboxMode, SandboxSettings, UnixSockets};
use td_git::transfer::Mirror;
use td_git::worktree::Worktree;
use td_toolkit::catalog::{Catalog, ToolSpecOverride};

/// Where one loop's files go on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LoopDirs {
    /// Its worktree.
    pub worktree: PathBuf,
    /// Its own records (its receipt log).
    pub records: PathBuf,
}

/// The longest branch name a host takes from the head.
const MAX_BRANCH_LEN: usize = 255;

/// Refuses a `StartLoop` whose names this host does not take: a loop name that is not one
/// plain path component, a branch git refuses (or that has an empty, `.` or `..` part, or
/// would read as an option), a base that is not a commit id, a `warm:` path the config's
/// check refuses (absolute, climbing out, git's or the daemon's own).
pub(super) async fn check_start(start: &StartLoop) -> Result<(), String> {
    if !super::plain(&start.loop_name) {
        return Err(format!(
            "{:?} is not a loop name this host takes ({})",
            start.loop_name,
            td_cluster::protocol::HOST_NAME_RULE
        ));
    }
    check_branch(&start.branch).await?;
    catalog_of(start)?;
    if let Some((path, why)) = start
        .warm
        .iter()
        .find_map(|p| crate::config::warm::why_refused(p).map(|why| (p, why)))
    {
        return Err(format!(
            "the warm: path `{path}` the head gave loop {} {why}",
            start.loop_name
        ));
    }
    let id = &start.base_commit;
    if !matches!(id.len(), 40 | 64) || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "the base {id:?} of loop {} is not a commit id",
            start.loop_name
        ));
    }
    Ok(())
}

/// The catalog loop `start`'s tools run under: the default one with the run's overrides,
/// read and checked as the head reads and checks its `catalog:` (an unknown tool or field,
/// a zero limit or a lane for a coordination tool is refused, naming it).
pub(super) fn catalog_of(start: &StartLoop) -> Result<Catalog, String> {
    let refused = |why: String| {
        format!(
            "the catalog the head gave loop {} is refused: {why}",
            start.loop_name
        )
    };
    let overrides: BTreeMap<String, ToolSpecOverride> = match &start.catalog {
        Value::Null => BTreeMap::new(),
        other => serde_json::from_value(other.clone()).map_err(|e| refused(e.to_string()))?,
    };
    let mut catalog = Catalog::default();
    catalog
        .apply_overrides(&overrides)
        .map_err(|e| refused(e.to_string()))?;
    Ok(catalog)
}

/// Refuses `branch` unless `git check-ref-format --branch` takes it as it is and it has no
/// part git would resolve or this host would take for a path step.
async fn check_branch(branch: &str) -> Result<(), String> {
    let refuse = |why: &str| {
        Err(format!(
            "the branch {branch:?} the head gave this loop is refused: {why}; a loop's branch is letters, digits, '-', '_', '.' and '/' between non-empty parts"
        ))
    };
    if branch.is_empty() || branch.len() > MAX_BRANCH_LEN {
        return refuse("it is empty or longer than 255 bytes");
    }
    if branch.starts_with('-') {
        return refuse("git would read it as an option");
    }
    if branch.chars().any(char::is_control) {
        return refuse("it holds a control character");
    }
    if branch
        .split('/')
        .any(|part| part.is_empty() || part.starts_with('.') || part == "@")
    {
        return refuse(
            "it has an empty part, one starting with '.' ('.', '..') or '@' (git's HEAD)",
        );
    }
    let mut command = tokio::process::Command::from(td_git::daemon_git::command(Path::new("/")));
    command
        .args(["check-ref-format", "--branch", branch])
        .stdin(std::process::Stdio::null());
    let out = command
        .output()
        .await
        .map_err(|e| format!("cannot run git to check the branch {branch:?}: {e}"))?;
    // `--branch` expands `@{-1}`-like names; only the literal name is acceptable.
    let said = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && said.strip_suffix('\n').unwrap_or(&said) == branch {
        return Ok(());
    }
    refuse("git does not take it as a branch name (`git check-ref-format --branch`)")
}

/// The directories of loop `start` under `workdir`: named after the loop (checked to be one
/// plain path component), never after anything else the head sends.
pub(super) fn loop_dirs(workdir: &Path, start: &StartLoop) -> Result<LoopDirs, String> {
    let name = &start.loop_name;
    if !super::plain(name) {
        return Err(format!("{name:?} is not a loop name this host takes"));
    }
    Ok(LoopDirs {
        worktree: workdir.join("worktrees").join(name),
        records: workdir.join("records").join(name),
    })
}

/// Removes what a loop left at `dir` (a worktree of an earlier start of the same loop):
/// only a directory directly beneath `root` whose name is a plain loop name; a symbolic link
/// there is removed, not followed. Nothing there is fine.
pub(super) fn remove_left(root: &Path, dir: &Path) -> Result<(), String> {
    let named = dir
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(super::plain);
    if dir.parent() != Some(root) || !named {
        return Err(format!(
            "{} is not a loop's directory beneath {}; it is left alone",
            dir.display(),
            root.display()
        ));
    }
    let meta = match dir.symlink_metadata() {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot look at {}: {e}", dir.display())),
    };
    let removed = if meta.is_dir() {
        std::fs::remove_dir_all(dir)
    } else {
        std::fs::remove_file(dir)
    };
    removed.map_err(|e| format!("cannot remove what was left at {}: {e}", dir.display()))
}

/// What this host holds loops to, whatever the head's policy says: `taskdaemon host
/// --sandbox-floor`, `--sandbox-read`, `--sandbox-hide`, `--allow-unix-sockets`,
/// `--web-allow-private`, the host's own secret variable (`--secret-env`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFloor {
    /// The least confinement mode this host runs commands under.
    pub mode: SandboxMode,
    /// The variable that holds this host's shared secret, when it came from one.
    pub secret_env: Option<String>,
    /// The most of this host's files commands may read: `Strict` holds every loop to the
    /// system and toolchain paths and its worktree, whatever the head's `read` says.
    pub read: ReadScope,
    /// Whether a head's `unix-sockets: host` is honoured: off, no loop's command reaches
    /// this host's Unix sockets (its Docker socket, its agents), whatever the head asks.
    pub allow_unix_sockets: bool,
    /// The most a head's `web.allow-private` may open to a loop's `web_fetch` here
    /// (`--web-allow-private`): by default public internet addresses only, whatever the
    /// head allows (its private network is not this machine's).
    pub web: td_toolkit::web_access::WebAccess,
    /// Paths of this machine that loops' commands read as empty (files) or as empty
    /// directories, whatever the head's policy says (`--sandbox-hide`; absolute).
    pub hide: Vec<PathBuf>,
}

/// The head's `sandbox:` policy as this host applies it: only its `mode`, `read`,
/// `unix-sockets` and `env` (paths name the head's machine; this host allows a loop to
/// write only its worktree and hides its own files), `mode` never below the host's floor,
/// and `env.pass` never passing a variable that is secret here: one whose name looks
/// secret, the host's secret variable, one the head's own `env.secret` names, or one whose
/// value this host's redaction knows. The host's secret variable is always withheld.
/// Returns the settings and a sentence for each thing of the head's left out.
pub(super) fn host_policy(
    policy: &Value,
    floor: &HostFloor,
) -> Result<(SandboxSettings, Vec<String>), String> {
    let mut dropped = Vec::new();
    let kept = match policy {
        Value::String(_) | Value::Null => policy.clone(),
        Value::Object(map) => {
            let mut kept = serde_json::Map::new();
            for (key, value) in map {
                if matches!(key.as_str(), "mode" | "read" | "unix-sockets" | "env") {
                    kept.insert(key.clone(), value.clone());
                } else {
                    dropped.push(format!(
                        "sandbox.{key} (a host takes no paths of the head's; commands write only beneath their worktree here)"
                    ));
                }
            }
            Value::Object(kept)
        }
        other => {
            return Err(format!(
                "the run's sandbox settings are not a mode or a map: {other}"
            ));
        }
    };
    let mut settings: SandboxSettings = if kept.is_null() {
        SandboxSettings::default()
    } else {
        serde_json::from_value(kept)
            .map_err(|e| format!("the run's sandbox settings cannot be read: {e}"))?
    };
    if settings.unix_sockets == UnixSockets::Host && !floor.allow_unix_sockets {
        settings.unix_sockets = UnixSockets::Refuse;
        dropped.push(
            "sandbox.unix-sockets host (this host keeps its Unix sockets from loops' commands; \
             its owner opens them with taskdaemon host --allow-unix-sockets)"
                .to_string(),
        );
    }
    if settings.read == ReadScope::All && floor.read == ReadScope::Strict {
        settings.read = ReadScope::Strict;
        dropped.push(
            "sandbox.read all (this host lets commands read only system and toolchain paths \
             and their worktree: taskdaemon host --sandbox-read strict)"
                .to_string(),
        );
    }
    if settings.mode == SandboxMode::BestEffort && floor.mode == SandboxMode::Required {
        settings.mode = SandboxMode::Required;
        dropped.push(
            "sandbox.mode best-effort (this host requires every protection: --sandbox-floor required)"
                .to_string(),
        );
    }
    let env = &mut settings.env;
    let head_secret = env.secret.clone();
    env.pass.retain(|name| {
        let secret = is_secret_name(name)
            || floor.secret_env.as_deref() == Some(name.as_str())
            || head_secret.contains(name)
            || std::env::var(name).is_ok_and(|value| is_secret_value(&value));
        if secret {
            dropped.push(format!(
                "sandbox.env.pass {name} (a secret on this host; its commands never get it)"
            ));
        }
        !secret
    });
    if let Some(name) = &floor.secret_env
        && !env.secret.contains(name)
    {
        env.secret.push(name.clone());
    }
    Ok((settings, dropped))
}

/// One lock per loop name. A loop's end holds it from before its slot is freed until its
/// worktree and branch are removed from the mirror, and a start of the same loop holds it
/// while it makes its worktree: the head may hand a loop back as soon as it has its end,
/// and without the lock that end's cleanup could remove the new start's worktree and
/// branch (same directory, same branch). A lock is kept per loop name the host ran (a
/// run's loops are few; the host's process ends with the run).
#[derive(Default)]
pub(super) struct LoopLocks(Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl LoopLocks {
    /// Waits for loop `name`'s lock.
    pub(super) async fn hold(&self, name: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = td_base::sync::lock(&self.0)
            .entry(name.to_string())
            .or_default()
            .clone();
        lock.lock_owned().await
    }
}

/// Makes loop `start`'s worktree in `mirror` under `workdir`, at its base on its branch,
/// removing what an earlier start of the same loop left there first (it starts again from
/// the head's commit, which is the loop's truth).
pub(super) async fn make_worktree(
    mirror: &Mirror,
    workdir: &Path,
    start: &StartLoop,
) -> Result<Worktree, String> {
    let dir = loop_dirs(workdir, start)?.worktree;
    if dir.symlink_metadata().is_ok() {
        if let Ok(stale) = mirror
            .add_worktree(&dir, &start.branch, &start.base_commit)
            .await
        {
            let _ = mirror.remove_worktree(&stale, false).await;
        }
        remove_left(&workdir.join("worktrees"), &dir)?;
    }
    mirror
        .add_worktree(&dir, &start.branch, &start.base_commit)
        .await
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use td_cluster::protocol::{HostLimits, WirePricing};

    fn start(loop_name: &str, branch: &str) -> StartLoop {
        StartLoop {
            attempt: 1,
            loop_name: loop_name.to_string(),
            loop_type: "code".into(),
            task: "t".into(),
            max_iterations: 1,
            max_turns: 1,
            iteration_timeout_ms: None,
            success_code: 0,
            system_template: String::new(),
            iteration_template: String::new(),
            peers: Vec::new(),
            first_iteration: 1,
            tools: Vec::new(),
            build: None,
            test: None,
            validate: None,
            subscriptions: None,
            initial_inbox: Vec::new(),
            initial_progress: Vec::new(),
            announced: false,
            limits: HostLimits::default(),
            pricing: WirePricing::default(),
            base_commit: "0123456789abcdef0123456789abcdef01234567".into(),
            attributes_from: None,
            branch: branch.to_string(),
            sandbox: serde_json::json!({}),
            catalog: serde_json::json!({}),
            web_allow_private: Value::Null,
            compiler_cache: false,
            warm: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_loops_tools_run_under_the_runs_catalog_and_a_bad_one_is_refused() {
        let mut s = start("l", "b");
        assert_eq!(catalog_of(&s).unwrap(), Catalog::default());
        s.catalog = Value::Null;
        assert_eq!(catalog_of(&s).unwrap(), Catalog::default());
        s.catalog = serde_json::json!({"grep": {"timeout-ms": 5, "lane": "heavy"}});
        let c = catalog_of(&s).unwrap();
        assert_eq!(c.spec("grep").timeout_ms, 5);
        assert_eq!(
            c.spec("grep").lane,
            td_toolkit::catalog::Route::Lane(td_toolkit::catalog::Lane::Heavy)
        );
        assert_eq!(c.spec("read_file"), Catalog::default().spec("read_file"));
        for (bad, says) in [
            (serde_json::json!({"grpe": {}}), "unknown tool 'grpe'"),
            (serde_json::json!({"grep": {"timeout-ms": 0}}), "timeout-ms"),
            (serde_json::json!({"grep": {"timeout": 5}}), "unknown field"),
            (
                serde_json::json!({"query_loop": {"lane": "net"}}),
                "query_loop",
            ),
            (serde_json::json!(["grep"]), "refused"),
        ] {
            s.catalog = bad.clone();
            let err = catalog_of(&s).unwrap_err();
            assert!(
                err.starts_with("the catalog the head gave loop l is refused: ")
                    && err.contains(says),
                "{bad}: {err}"
            );
            // Refused before anything of the loop is made.
            let err = check_start(&s).await.unwrap_err();
            assert!(err.contains("catalog"), "{bad}: {err}");
        }
    }

    /// Branches a hostile head might send: what git refuses, what climbs out of a
    /// directory, what git would take for an option.
    const BAD_BRANCHES: &[&str] = &[
        "",
        ".",
        "..",
        "../..",
        "../mirror",
        "a/../../mirror",
        "a/./b",
        "/abs",
        "a//b",
        "a..b",
        "a b",
        "a~1",
        "a^",
        "a:b",
        "a?b",
        "a*b",
        "a[b",
        "a\\b",
        "x.lock",
        "x.",
        "@",
        "@{-1}",
        "-d",
        "--force",
        "a\0b",
        "a\nb",
        "ok/",
        ".hidden",
    ];

    #[tokio::test]
    async fn a_branch_git_refuses_or_that_climbs_out_is_refused() {
        for bad in BAD_BRANCHES {
            let err = check_start(&start("api", bad))
                .await
                .expect_err(&format!("branch {bad:?} was taken"));
            assert!(err.contains("branch"), "{bad:?}: {err}");
        }
        for good in ["taskdaemon/api", "feature/x-1", "a.b_c"] {
            check_start(&start("api", good))
                .await
                .unwrap_or_else(|e| panic!("{good:?}: {e}"));
        }
    }

    #[tokio::test]
    async fn a_warm_path_that_climbs_out_or_names_gits_data_is_refused() {
        for bad in ["../x", "/etc", "a/../../x", ".git", ".taskdaemon", "x\0y"] {
            let mut s = start("api", "taskdaemon/ok");
            s.warm = vec!["target".into(), bad.into()];
            let err = check_start(&s)
                .await
                .expect_err(&format!("warm path {bad:?} was taken"));
            assert!(err.contains("the warm: path"), "{bad:?}: {err}");
        }
        let mut s = start("api", "taskdaemon/ok");
        s.warm = vec!["target".into(), "node_modules".into(), "cargo".into()];
        check_start(&s).await.unwrap();
    }

    #[tokio::test]
    async fn a_bad_loop_name_is_refused() {
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "-x",
            ".x",
            "a b",
            &"x".repeat(64),
        ] {
            assert!(
                check_start(&start(bad, "taskdaemon/ok")).await.is_err(),
                "{bad:?} was taken"
            );
        }
    }

    #[test]
    fn a_loops_directories_are_named_after_the_loop_whatever_its_branch() {
        let workdir = Path::new("/w");
        for branch in BAD_BRANCHES.iter().chain(&["taskdaemon/api", "x"]) {
            let dirs = loop_dirs(workdir, &start("api", branch)).expect("the loop's dirs");
            assert_eq!(dirs.worktree, Path::new("/w/worktrees/api"), "{branch:?}");
            assert_eq!(dirs.records, Path::new("/w/records/api"), "{branch:?}");
        }
        assert!(loop_dirs(workdir, &start("..", "x")).is_err());
    }

    #[test]
    fn removing_what_a_loop_left_cannot_reach_the_mirror_or_another_loop() {
        let tmp = tempfile::tempdir().expect("a temp dir");
        let workdir = tmp.path();
        let root = workdir.join("worktrees");
        std::fs::create_dir_all(workdir.join("mirror/refs")).expect("mkdir");
        std::fs::create_dir_all(root.join("other")).expect("mkdir");
        std::fs::write(root.join("other/work.rs"), "x").expect("write");
        std::fs::create_dir_all(root.join("api/src")).expect("mkdir");
        // A hostile branch decides nothing about the directory.
        for branch in BAD_BRANCHES {
            if let Ok(dirs) = loop_dirs(workdir, &start("api", branch)) {
                let _ = remove_left(&root, &dirs.worktree);
            }
            assert!(
                workdir.join("mirror/refs").is_dir(),
                "{branch:?} reached the mirror"
            );
            assert!(
                root.join("other/work.rs").is_file(),
                "{branch:?} reached another loop"
            );
        }
        std::fs::create_dir_all(root.join("api/src")).expect("mkdir");
        // Only a directory directly beneath the root, never the root or above it.
        for outside in [
            workdir.to_path_buf(),
            root.clone(),
            root.join(".."),
            root.join("api/.."),
            workdir.join("mirror"),
            root.join("api/src"),
        ] {
            assert!(
                remove_left(&root, &outside).is_err(),
                "{}",
                outside.display()
            );
        }
        assert!(workdir.join("mirror/refs").is_dir());
        assert!(root.join("other/work.rs").is_file());
        assert!(root.join("api/src").is_dir());
        // A symbolic link there goes, not what it points at.
        std::os::unix::fs::symlink(workdir.join("mirror"), root.join("linked")).expect("link");
        remove_left(&root, &root.join("linked")).expect("the link removed");
        assert!(!root.join("linked").exists() && workdir.join("mirror/refs").is_dir());
        remove_left(&root, &root.join("api")).expect("its own dir removed");
        assert!(!root.join("api").exists());
        remove_left(&root, &root.join("gone")).expect("a missing dir is fine");
    }

    fn floor(mode: SandboxMode, secret_env: Option<&str>) -> HostFloor {
        HostFloor {
            mode,
            secret_env: secret_env.map(str::to_string),
            ..HostFloor::default()
        }
    }

    #[test]
    fn the_hosts_unix_sockets_and_files_are_opened_only_when_the_host_allows_it() {
        let asks = serde_json::json!({"unix-sockets": "host", "read": "all"});
        // By default a host keeps its Unix sockets (its Docker socket, its agents) from the
        // head's loops, and lets them read what the head's `read` says.
        let (settings, dropped) = host_policy(&asks, &HostFloor::default()).expect("read");
        assert_eq!(settings.unix_sockets, td_confine::UnixSockets::Refuse);
        assert_eq!(settings.read, td_confine::ReadScope::All);
        assert_eq!(dropped.len(), 1, "{dropped:?}");
        assert!(dropped[0].contains("--allow-unix-sockets"), "{dropped:?}");
        // A host that reads strictly holds the head to it, whatever it asks (`all` is also
        // what a head that says nothing gets).
        let strict = HostFloor {
            read: td_confine::ReadScope::Strict,
            ..HostFloor::default()
        };
        for policy in [asks.clone(), serde_json::json!({}), Value::Null] {
            let (settings, _) = host_policy(&policy, &strict).expect("read");
            assert_eq!(settings.read, td_confine::ReadScope::Strict, "{policy}");
        }
        let (_, dropped) = host_policy(&asks, &strict).expect("read");
        assert!(
            dropped.iter().any(|d| d.contains("--sandbox-read strict")),
            "{dropped:?}"
        );
        // One that opens its sockets lets a head that asks have them, and no head that
        // does not.
        let open = HostFloor {
            allow_unix_sockets: true,
            ..HostFloor::default()
        };
        let (settings, dropped) = host_policy(&asks, &open).expect("read");
        assert_eq!(settings.unix_sockets, td_confine::UnixSockets::Host);
        assert!(dropped.is_empty(), "{dropped:?}");
        let (settings, _) = host_policy(&serde_json::json!({}), &open).expect("read");
        assert_eq!(settings.unix_sockets, td_confine::UnixSockets::Refuse);
    }

    #[test]
    fn the_heads_paths_never_reach_the_hosts_policy() {
        let hostile = serde_json::json!({
            "mode": "required", "writable": ["/", "/root"], "readable": ["/root/.ssh"],
            "hide": ["/usr/bin", "/etc"], "read": "strict"
        });
        let (settings, dropped) =
            host_policy(&hostile, &HostFloor::default()).expect("the policy read");
        assert!(settings.writable.is_empty(), "{:?}", settings.writable);
        assert!(settings.readable.is_empty(), "{:?}", settings.readable);
        assert!(settings.hide.is_empty(), "{:?}", settings.hide);
        assert_eq!(settings.mode, SandboxMode::Required);
        assert_eq!(settings.read, td_confine::ReadScope::Strict);
        for key in ["writable", "readable", "hide"] {
            assert!(
                dropped.iter().any(|d| d.contains(key)),
                "{key}: {dropped:?}"
            );
        }
        // Keys the config file never has (what the daemon sets itself) are not taken either.
        let (settings, _) = host_policy(
            &serde_json::json!({"protected": [], "secret_files": [], "mode": "best-effort"}),
            &HostFloor::default(),
        )
        .expect("unknown keys left out");
        assert_eq!(settings, SandboxSettings::default());
        assert!(host_policy(&serde_json::json!(7), &HostFloor::default()).is_err());
        assert!(host_policy(&serde_json::json!("wide-open"), &HostFloor::default()).is_err());
    }

    #[test]
    fn env_pass_never_passes_a_secret_of_the_host_and_its_secret_variable_is_withheld() {
        const COOKIE: &str = "TD_GUARDTEST_HOSTS_COOKIE";
        const COPY: &str = "TD_GUARDTEST_INNOCENT_COPY";
        // SAFETY: these names are read by this test only.
        unsafe {
            std::env::set_var(COOKIE, "guard-test-hosts-secret-0123456789");
            std::env::set_var(COPY, "x guard-test-hosts-secret-0123456789 y");
            std::env::set_var("TD_GUARDTEST_PLAIN", "plain");
            std::env::set_var("TD_GUARDTEST_SERVICE_TOKEN", "t-guard-test-987654321");
        }
        // What `taskdaemon host` registers before it joins.
        td_base::secrets::register("hosts secret", "guard-test-hosts-secret-0123456789");
        let hostile = serde_json::json!({"env": {
            "pass": [COOKIE, COPY, "TD_GUARDTEST_SERVICE_TOKEN", "OPENAI_API_KEY",
                     "TD_GUARDTEST_NAMED", "TD_GUARDTEST_PLAIN"],
            "secret": ["TD_GUARDTEST_NAMED"]
        }});
        let (settings, dropped) =
            host_policy(&hostile, &floor(SandboxMode::BestEffort, Some(COOKIE)))
                .expect("the policy read");
        assert_eq!(settings.env.pass, vec!["TD_GUARDTEST_PLAIN".to_string()]);
        assert!(settings.env.secret.contains(&COOKIE.to_string()));
        assert_eq!(dropped.len(), 5, "{dropped:?}");
        let env = td_confine::environment::command_environment(&settings.env, &[]);
        let names: Vec<String> = env
            .iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        for secret in [COOKIE, COPY, "TD_GUARDTEST_SERVICE_TOKEN"] {
            assert!(
                !names.contains(&secret.to_string()),
                "{secret} reached commands"
            );
        }
        assert!(names.contains(&"TD_GUARDTEST_PLAIN".to_string()));
    }

    #[test]
    fn the_head_cannot_lower_the_hosts_floor() {
        let required = floor(SandboxMode::Required, None);
        for lower in [
            serde_json::json!("best-effort"),
            serde_json::json!({"mode": "best-effort"}),
            serde_json::json!({}),
            Value::Null,
        ] {
            let (settings, _) = host_policy(&lower, &required).expect("the policy read");
            assert_eq!(settings.mode, SandboxMode::Required, "{lower}");
        }
        // A head that asks for more than the floor gets it.
        let (settings, dropped) =
            host_policy(&serde_json::json!("required"), &HostFloor::default()).expect("read");
        assert_eq!(settings.mode, SandboxMode::Required);
        assert!(dropped.is_empty(), "{dropped:?}");
    }

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .expect("git runs");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    #[tokio::test]
    async fn an_ended_loops_cleanup_never_removes_the_worktree_of_its_next_start() {
        let tmp = tempfile::tempdir().expect("a temp dir");
        let repo_dir = tmp.path().join("repo");
        std::fs::create_dir_all(&repo_dir).expect("mkdir");
        git(&repo_dir, &["init", "-q"]);
        std::fs::write(repo_dir.join("README"), "hello\n").expect("write");
        git(&repo_dir, &["add", "README"]);
        git(&repo_dir, &["commit", "-q", "-m", "base"]);
        let tip = git(&repo_dir, &["rev-parse", "HEAD"]);
        let repo = td_git::worktree::Repo::open(&repo_dir)
            .await
            .expect("the repo");
        let bundle = tmp.path().join("base.bundle");
        td_git::transfer::bundle_commits(&repo, &tip, &[], &bundle)
            .await
            .expect("bundled");
        let workdir = tmp.path().join("host");
        let mirror = Mirror::open(&workdir.join("mirror")).await.expect("mirror");
        mirror
            .receive(&bundle, &tip, 1 << 30)
            .await
            .expect("received");
        let mut start = start("api", "taskdaemon/api");
        start.base_commit = tip;
        let locks = Arc::new(LoopLocks::default());
        let first = make_worktree(&mirror, &workdir, &start)
            .await
            .expect("the first worktree");
        // The loop ends: its end holds the loop's lock from before its slot is freed...
        let ending = locks.hold("api").await;
        // ...and the head hands the loop back at once: its next start makes its worktree...
        let next = tokio::spawn({
            let (locks, mirror, workdir, start) = (
                locks.clone(),
                mirror.clone(),
                workdir.clone(),
                start.clone(),
            );
            async move {
                let _held = locks.hold("api").await;
                make_worktree(&mirror, &workdir, &start).await
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        // ...while the end removes the first worktree and its branch.
        mirror
            .remove_worktree(&first, false)
            .await
            .expect("the end's cleanup");
        drop(ending);
        let next = next.await.expect("joined").expect("the next worktree");
        assert!(
            next.path().join("README").is_file(),
            "the next start's worktree was removed by the end before it"
        );
        let branch = git(
            &workdir.join("mirror"),
            &["rev-parse", "--verify", "refs/heads/taskdaemon/api"],
        );
        assert_eq!(branch, start.base_commit);
    }
}
