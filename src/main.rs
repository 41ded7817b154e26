//! The `taskdaemon` binary: a thin command-line layer over the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};

use taskdaemon::catalog::{Catalog, default_tool_set};
use taskdaemon::config::Config;
use taskdaemon::context::{LoopCommands, ToolContext};
use taskdaemon::formats::{DefinitionFormat, render};
use taskdaemon::receipts::ReceiptLog;
use taskdaemon::registry::ToolSet;

#[derive(Parser)]
#[command(
    name = "taskdaemon",
    version,
    about = "Runs many LLM coding loops in parallel git worktrees"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Tool definitions.
    Tools {
        #[command(subcommand)]
        command: ToolsCommand,
    },
    /// Run tools directly.
    Tool {
        #[command(subcommand)]
        command: ToolCommand,
    },
    /// Serve the tools over MCP on stdio.
    Mcp(SessionArgs),
    /// Re-run recorded tool calls.
    Replay {
        #[command(subcommand)]
        command: ReplayCommand,
    },
}

#[derive(Subcommand)]
enum ToolsCommand {
    /// Print the tool definitions.
    List {
        /// Output format.
        #[arg(long, value_enum, default_value = "json")]
        format: DefinitionFormat,
        /// Only these tools (comma-separated).
        #[arg(long, value_delimiter = ',', conflicts_with = "loop_type")]
        tools: Option<Vec<String>>,
        /// Only the default tools of this built-in loop type (plan, spec, phase, code, ralph).
        #[arg(long)]
        loop_type: Option<String>,
        /// taskdaemon.yml whose catalog overrides the limits shown by `--format json`.
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum ToolCommand {
    /// Read JSON calls from stdin, one per line; write one JSON answer per line.
    Exec(SessionArgs),
}

#[derive(Subcommand)]
enum ReplayCommand {
    /// Re-run the calls of a receipt log on a copy of a worktree and report differing outputs.
    Verify {
        /// The receipts JSONL log.
        log: PathBuf,
        /// The worktree as it was before the recorded calls (it is copied, never changed).
        #[arg(long)]
        worktree: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Options shared by every front that holds one ToolContext.
#[derive(Args, Clone)]
struct SessionArgs {
    /// The worktree the tools are confined to.
    #[arg(long)]
    worktree: PathBuf,
    /// taskdaemon.yml whose `catalog` overrides tool timeouts, caps and lanes.
    #[arg(short, long)]
    config: Option<PathBuf>,
    /// Only these tools (comma-separated); an unknown name is an error.
    #[arg(long, value_delimiter = ',')]
    tools: Option<Vec<String>>,
    /// Append a receipt per call to this JSONL file.
    #[arg(long)]
    receipts: Option<PathBuf>,
    /// The exec id recorded in receipts.
    #[arg(long, default_value = "exec")]
    exec_id: String,
    /// Shell command of the `build` tool.
    #[arg(long)]
    build_cmd: Option<String>,
    /// Shell command of the `test` tool.
    #[arg(long)]
    test_cmd: Option<String>,
    /// Shell command of the `validate` tool.
    #[arg(long)]
    validate_cmd: Option<String>,
}

struct Session {
    ctx: ToolContext,
    tools: ToolSet,
    receipts: Option<ReceiptLog>,
}

impl SessionArgs {
    fn open(&self) -> Result<Session, String> {
        let tools = match &self.tools {
            Some(names) => ToolSet::from_names(names)?,
            None => ToolSet::all(),
        };
        let catalog = load_catalog(self.config.as_deref())?;
        let ctx = ToolContext::new(&self.worktree, self.exec_id.clone())
            .map_err(|e| e.to_string())?
            .with_catalog(Arc::new(catalog))
            .with_commands(LoopCommands {
                build: self.build_cmd.clone(),
                test: self.test_cmd.clone(),
                validate: self.validate_cmd.clone(),
            });
        let receipts = match &self.receipts {
            Some(p) => Some(
                ReceiptLog::open(p)
                    .map_err(|e| format!("cannot open receipts log {}: {e}", p.display()))?,
            ),
            None => None,
        };
        Ok(Session {
            ctx,
            tools,
            receipts,
        })
    }
}

/// The default catalog, with the overrides of `config` when given.
fn load_catalog(config: Option<&std::path::Path>) -> Result<Catalog, String> {
    match config {
        Some(path) => Config::load(path)?.catalog(),
        None => Ok(Catalog::default()),
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TASKDAEMON_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("taskdaemon: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(dispatch(cli.command)) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("taskdaemon: {message}");
            ExitCode::from(2)
        }
    }
}

async fn dispatch(command: Command) -> Result<ExitCode, String> {
    match command {
        Command::Tools {
            command:
                ToolsCommand::List {
                    format,
                    tools,
                    loop_type,
                    config,
                },
        } => {
            let set = match (tools, loop_type) {
                (Some(names), _) => ToolSet::from_names(&names)?,
                (None, Some(t)) => {
                    let names = default_tool_set(&t).ok_or_else(|| {
                        format!(
                            "unknown loop type '{t}'; built-in types: {}",
                            taskdaemon::catalog::BUILTIN_LOOP_TYPES.join(", ")
                        )
                    })?;
                    ToolSet::from_names(&names)?
                }
                (None, None) => ToolSet::all(),
            };
            let catalog = load_catalog(config.as_deref())?;
            let value = render(&set.definitions(), format, &catalog);
            let text = serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?;
            println!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Tool {
            command: ToolCommand::Exec(args),
        } => {
            let session = args.open()?;
            let stdin = tokio::io::BufReader::new(tokio::io::stdin());
            let stdout = tokio::io::stdout();
            taskdaemon::fronts::exec::serve(
                stdin,
                stdout,
                &session.ctx,
                &session.tools,
                session.receipts.as_ref(),
            )
            .await
            .map_err(|e| format!("exec stream failed: {e}"))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Mcp(args) => {
            let session = args.open()?;
            taskdaemon::fronts::mcp::serve_stdio(
                Arc::new(session.ctx),
                Arc::new(session.tools),
                session.receipts.map(Arc::new),
            )
            .await
            .map_err(|e| format!("MCP server failed: {e}"))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Replay {
            command:
                ReplayCommand::Verify {
                    log,
                    worktree,
                    json,
                },
        } => taskdaemon::fronts::replay::verify_command(&log, &worktree, json).await,
    }
}
