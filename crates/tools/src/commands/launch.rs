//! What every command tool shares (`run_command`, `run_command_isolated`, `build`, `test`,
//! `validate`): their input schemas, timeout checks against the catalog, the working
//! directory through the sandbox, the environment and confinement of the command, and the
//! rendering of its result. The process handling itself lives in `td_confine::process`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use td_confine::process::{CommandOptions, RunError, RunOutput, StreamCapture};
use td_confine::{CommandPolicy, ConfineError};
use td_toolkit::args;
use td_toolkit::context::ToolContext;
use td_toolkit::error::{ToolError, ToolResult};
use td_toolkit::receipts::SideEffect;
use td_toolkit::tool::ToolOutput;

/// Bytes of the output cap kept back for the headline and section headers, so the rendered
/// result fits the catalog cap and the registry never has to cut it a second time.
const HEADER_ROOM: usize = 512;

/// Input of `run_command` and `run_command_isolated`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandArgs {
    command: String,
    timeout_ms: Option<u64>,
    cwd: Option<String>,
}

/// The input schema of `run_command` and `run_command_isolated`.
pub(crate) fn command_schema(tool: &str) -> Value {
    json!({
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "minLength": 1,
                "description": "Shell command line, run by `sh -c` (pipes, `&&` and redirections work). Required; no default."
            },
            "timeout_ms": timeout_property(tool),
            "cwd": {
                "type": "string",
                "description": "Directory to run in, relative to the worktree root; it must exist inside the worktree. Default: \".\" (the worktree root)."
            }
        },
        "required": ["command"],
        "additionalProperties": false
    })
}

/// The `timeout_ms` property shared by every command tool. Its maximum is the catalog
/// timeout, which a config may change, so it is checked at call time rather than here.
pub(crate) fn timeout_property(tool: &str) -> Value {
    let default = td_toolkit::catalog::Catalog::default()
        .spec(tool)
        .timeout_ms;
    json!({
        "type": "integer",
        "minimum": 1,
        "description": format!(
            "Kill the command and everything it started after this many milliseconds. Default and maximum: the catalog timeout of {tool} ({default} unless the configuration changes it)."
        )
    })
}

/// Runs `run_command` / `run_command_isolated`.
pub(crate) async fn execute_command(
    tool: &'static str,
    input: Value,
    ctx: &ToolContext,
    isolate_network: bool,
) -> ToolResult<ToolOutput> {
    let args: CommandArgs = args::parse(tool, input)?;
    if args.command.trim().is_empty() {
        return Err(ToolError::invalid(
            tool,
            "/command",
            "the command is empty; pass the shell command line to run",
        ));
    }
    let timeout_ms = checked_timeout(tool, ctx, args.timeout_ms)?;
    let cwd = working_directory(tool, ctx, args.cwd.as_deref().unwrap_or("."))?;
    let network = if isolate_network {
        CommandNetwork::Isolated
    } else {
        CommandNetwork::Host
    };
    let out = run_in_worktree(tool, ctx, &args.command, &cwd, timeout_ms, network).await?;
    let headline = match (out.timed_out, out.exit_code, out.signal) {
        (true, _, _) => format!(
            "timed out after {timeout_ms} ms, process group killed. Pass a larger timeout_ms (at most {}) or run less at once.",
            ctx.spec(tool).timeout_ms
        ),
        (false, Some(code), _) => format!("exit code: {code}"),
        (false, None, Some(signal)) => format!("killed by signal {signal}"),
        (false, None, None) => "exit status unknown (the command could not be reaped)".to_string(),
    };
    Ok(command_output(headline, &args.command, out))
}

/// Input of `build`, `test` and `validate`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfiguredArgs {
    timeout_ms: Option<u64>,
}

/// The input schema of `build`, `test` and `validate`.
pub(crate) fn configured_schema(tool: &str) -> Value {
    json!({
        "type": "object",
        "properties": {"timeout_ms": timeout_property(tool)},
        "additionalProperties": false
    })
}

/// Runs the loop's configured command for `build`, `test` or `validate` in the worktree
/// root. `noun` names what ran in the headline ("build passed", "tests failed ...").
pub(crate) async fn execute_configured(
    tool: &'static str,
    noun: &str,
    command: Option<&str>,
    input: Value,
    ctx: &ToolContext,
) -> ToolResult<ToolOutput> {
    let args: ConfiguredArgs = args::parse(tool, input)?;
    let Some(command) = command.filter(|c| !c.trim().is_empty()) else {
        return Err(ToolError::Unavailable {
            message: format!(
                "no {tool} command is configured for this loop, so {tool} cannot run; use run_command with the project's {tool} command instead"
            ),
        });
    };
    let timeout_ms = checked_timeout(tool, ctx, args.timeout_ms)?;
    let out = run_in_worktree(
        tool,
        ctx,
        command,
        ctx.root(),
        timeout_ms,
        CommandNetwork::Build,
    )
    .await?;
    let offline_hint = if ctx.compiler_cache().is_some() && !out.success() {
        "\n(compiler-cache is on, so this ran without network, reaching only the loop's cache server: if a dependency is missing, fetch it with run_command `cargo fetch`, then run this again)"
    } else {
        ""
    };
    let status = match (out.timed_out, out.exit_code, out.signal) {
        (true, _, _) => format!(
            "{noun} timed out after {timeout_ms} ms, process group killed. Pass a larger timeout_ms (at most {}) if it needs longer.",
            ctx.spec(tool).timeout_ms
        ),
        (false, Some(0), _) => format!("{noun} passed"),
        (false, Some(code), _) => format!("{noun} failed (exit code {code})"),
        (false, None, Some(signal)) => format!("{noun} failed (killed by signal {signal})"),
        (false, None, None) => {
            format!("{noun} failed (exit status unknown: the command could not be reaped)")
        }
    };
    Ok(command_output(
        format!("{status}\ncommand: {command}{offline_hint}"),
        command,
        out,
    ))
}

/// The timeout to use: `requested` when given and within the catalog limit of `tool`,
/// else the catalog timeout.
pub(crate) fn checked_timeout(
    tool: &str,
    ctx: &ToolContext,
    requested: Option<u64>,
) -> ToolResult<u64> {
    let max = ctx.spec(tool).timeout_ms;
    match requested {
        None => Ok(max),
        Some(0) => Err(ToolError::invalid(
            tool,
            "/timeout_ms",
            format!("timeout_ms must be at least 1; omit it for the default of {max} ms"),
        )),
        Some(t) if t > max => Err(ToolError::invalid(
            tool,
            "/timeout_ms",
            format!(
                "timeout_ms {t} is above the maximum of {max} ms for {tool}; pass at most {max}, or omit it for that default"
            ),
        )),
        Some(t) => Ok(t),
    }
}

/// Resolves `cwd` through the sandbox and checks that it is a directory.
fn working_directory(tool: &str, ctx: &ToolContext, cwd: &str) -> ToolResult<PathBuf> {
    let path = ctx.resolve(cwd)?;
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_dir() => Ok(path),
        Ok(_) => Err(ToolError::invalid(
            tool,
            "/cwd",
            format!(
                "'{}' is a file, not a directory; pass a directory of the worktree (default \".\")",
                ctx.display(&path)
            ),
        )),
        Err(e) => Err(ToolError::from_io(
            "using as working directory",
            &ctx.display(&path),
            &e,
        )),
    }
}

/// The network a command tool's command gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CommandNetwork {
    /// The host's (`run_command`).
    Host,
    /// None (`run_command_isolated`).
    Isolated,
    /// A configured build, test or validation: the host's, or, when the loop has a compiler
    /// cache server, that server's private network and nothing else (see
    /// [`td_toolkit::context::CompilerCacheAccess`]).
    Build,
}

/// Runs `command` in `cwd` with the loop's environment and the output cap of `tool`.
pub(crate) async fn run_in_worktree(
    tool: &str,
    ctx: &ToolContext,
    command: &str,
    cwd: &Path,
    timeout_ms: u64,
    network: CommandNetwork,
) -> ToolResult<RunOutput> {
    let temp_dir = ctx.command_temp_dir().map_err(|e| {
        ToolError::failed(
            "making the loop's temp dir",
            e,
            "The system temp directory must be writable by taskdaemon; free space or fix its permissions, then try again.",
        )
    })?;
    let mut launcher_env: Vec<(std::ffi::OsString, std::ffi::OsString)> = vec![
        ("TASKDAEMON_WORKTREE".into(), ctx.root().into()),
        ("TASKDAEMON_EXEC_ID".into(), ctx.exec_id().into()),
        // No terminal is attached: a credential prompt would only wait for the timeout.
        ("GIT_TERMINAL_PROMPT".into(), "0".into()),
        ("TMPDIR".into(), temp_dir.clone().into()),
    ];
    let cache = ctx
        .compiler_cache()
        .filter(|_| network == CommandNetwork::Build);
    let network = match (network, cache) {
        (CommandNetwork::Build, Some(cache)) => {
            launcher_env.extend(
                cache
                    .env
                    .iter()
                    .map(|(k, v)| (k.as_str().into(), v.as_str().into())),
            );
            td_confine::Network::Join(&cache.namespaces)
        }
        (CommandNetwork::Isolated, _) => td_confine::Network::Isolated,
        _ => td_confine::Network::Host,
    };
    let prepared = td_confine::prepare(&CommandPolicy {
        settings: ctx.sandbox_settings(),
        worktree: ctx.root(),
        cwd,
        temp_dir: &temp_dir,
        network,
        launcher_env,
    })
    .map_err(|e| match e {
        ConfineError::NoNetworkIsolation => ToolError::Unavailable {
            message: format!(
                "{e}; {tool} cannot run here. Use run_command if network access is acceptable."
            ),
        },
        other => ToolError::Unavailable {
            message: other.to_string(),
        },
    })?;
    let options = CommandOptions::new(command, cwd)
        .timeout(Duration::from_millis(timeout_ms))
        .max_bytes_per_stream(stream_cap(ctx.spec(tool).max_output_bytes))
        .confined(prepared);
    td_confine::process::run(options).await.map_err(|e| match e {
        RunError::InvalidCommand => ToolError::invalid(
            tool,
            "/command",
            "the command contains a NUL byte; remove it",
        ),
        RunError::Confinement(detail) => ToolError::Unavailable {
            message: format!(
                "the command could not be confined, so it was not run: {detail}. The sandbox settings (sandbox: in taskdaemon.yml) or the machine must change; tell the user."
            ),
        },
        RunError::Io { action, source } => ToolError::failed(
            action,
            source,
            "The shell could not be started; check that /bin/sh exists and that the working directory is accessible, then try again.",
        ),
    })
}

/// Per-stream cap for a tool whose whole result may be `max_output_bytes`: both streams and
/// the headers must fit, so each stream gets half of what the headers leave.
pub(crate) fn stream_cap(max_output_bytes: usize) -> usize {
    (max_output_bytes.saturating_sub(HEADER_ROOM) / 2).max(1)
}

/// The result the model sees: `headline`, then the non-empty streams, plus the receipt's
/// side effect. `is_error` unless the command exited 0 within its timeout.
pub(crate) fn command_output(headline: String, command: &str, out: RunOutput) -> ToolOutput {
    let mut content = headline;
    content.push('\n');
    push_stream(&mut content, "stdout", &out.stdout);
    push_stream(&mut content, "stderr", &out.stderr);
    if out.stdout.total_bytes == 0 && out.stderr.total_bytes == 0 {
        content.push_str("(no output)\n");
    }
    ToolOutput {
        content,
        is_error: !out.success(),
        effects: vec![SideEffect::CommandRun {
            command: command.to_string(),
            exit_code: out.exit_code,
            timed_out: out.timed_out,
        }],
    }
}

fn push_stream(content: &mut String, name: &str, stream: &StreamCapture) {
    if stream.total_bytes == 0 {
        return;
    }
    if stream.truncated {
        content.push_str(&format!(
            "--- {name} ({} bytes in all; the middle is omitted) ---\n",
            stream.total_bytes
        ));
    } else {
        content.push_str(&format!("--- {name} ---\n"));
    }
    content.push_str(&stream.text);
    if !stream.text.ends_with('\n') {
        content.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_cap_leaves_room_for_headers() {
        assert_eq!(stream_cap(100_000), 49_744);
        assert_eq!(stream_cap(10), 1);
    }
}
