//! The `taskdaemon` binary: a thin command-line layer over the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};

use taskdaemon::config::Config;
use taskdaemon::formats::{DefinitionFormat, render};
use taskdaemon::fronts::policy::SessionPolicy;
use taskdaemon::fronts::receipt_session::ReceiptSession;
use taskdaemon::fronts::ui::process::DashboardProcess;
use td_base::secrets::{self, RedactingWriter};
use td_toolkit::call_path::{CallPath, InCallerTask};
use td_toolkit::catalog::{Catalog, default_tool_set};
use td_toolkit::context::{LoopCommands, ToolContext};
use td_toolkit::registry::ToolSet;

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
    /// Run the loops of a taskdaemon.yml until each completed, failed or was blocked.
    Run(RunArgs),
    /// Show a run's loops (default: the newest run).
    Status {
        /// Run id (default: the newest).
        run: Option<String>,
        /// The project directory holding `.taskdaemon/runs`, a runs directory or a run directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Print summary.json instead of a table.
        #[arg(long)]
        json: bool,
        /// List the plans, specs and phases the loops kept in the run record instead (with
        /// --json: as a JSON array).
        #[arg(long)]
        artifacts: bool,
    },
    /// Integrate completed (or merge-blocked) loops of a run by hand, as the merge queue
    /// does (scratch worktree, merged validation, then the target advances); no model is
    /// called. Exit 0 when every loop named is integrated, 1 otherwise, 75 when a live
    /// process owns the run.
    Merge {
        /// Run id.
        run: String,
        /// Only these loops (default: every completed or merge-blocked loop not merged yet).
        #[arg(name = "LOOP")]
        loops: Vec<String>,
        /// The project directory holding `.taskdaemon/runs`, a runs directory or a run directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// The run's taskdaemon.yml (default: the one its record names).
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
    /// Print a loop's transcript readably.
    Logs {
        /// Run id (`latest` for the newest).
        run: String,
        /// Loop name.
        #[arg(name = "LOOP")]
        loop_name: String,
        /// The project directory holding `.taskdaemon/runs`, a runs directory or a run directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Only this iteration (0: the loop's answers to other loops' questions).
        #[arg(long)]
        iteration: Option<u32>,
        /// Show messages and tool results in full instead of cutting them at 2 kB.
        #[arg(long)]
        full: bool,
        /// Show each iteration's system prompt.
        #[arg(long)]
        system: bool,
    },
    /// Serve a local web dashboard of a run (the live one or a finished one) until Ctrl-C:
    /// its loops, the messages between them, transcripts, receipts, diffs, and stop buttons
    /// for a live run.
    Ui {
        /// Run id (`latest`, the default: the newest).
        run: Option<String>,
        /// The project directory holding `.taskdaemon/runs`, a runs directory or a run directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// The port (0: any free one).
        #[arg(long, default_value_t = taskdaemon::fronts::ui::DEFAULT_PORT)]
        port: u16,
        /// The address to listen on; any but a loopback address needs the token printed
        /// with the page's address.
        #[arg(long, default_value = "127.0.0.1")]
        bind: std::net::IpAddr,
        /// Used by `run --ui`: take the run directory from standard input (one line) and
        /// end when standard input closes.
        #[arg(long = "run-dir-from-stdin", hide = true, conflicts_with_all = ["run", "dir"])]
        run_dir_from_stdin: bool,
    },
    /// Run a worker host: join the head of a run (a `taskdaemon run` whose config has a
    /// `hosts:` section) with the shared secret, and stay until the run ends (exit 0), the
    /// head is lost or refuses this host (exit 1), or Ctrl-C. Loops do not run on hosts
    /// yet: a joined host waits.
    Host(HostArgs),
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
    /// Check a receipt log (input hashes, the receipt chain, the session receipt), then re-run
    /// its trusted calls on a copy of a worktree and report differing outputs.
    Verify {
        /// The receipts JSONL log.
        log: PathBuf,
        /// The worktree as it was before the recorded calls (it is copied, never changed).
        #[arg(long)]
        worktree: PathBuf,
        /// The chain key (default: LOG.key beside the log, or the run directory's
        /// receipt-chain.key for a log of a run).
        #[arg(long, value_name = "FILE")]
        chain_key: Option<PathBuf>,
        /// The session receipt (default: LOG.RECEIPT.json, or RECEIPT.json beside a run's log).
        #[arg(long, value_name = "FILE", conflicts_with = "no_session")]
        session: Option<PathBuf>,
        /// Check the log without a session receipt (a session that never ended: receipts
        /// dropped from the end of the log then go unnoticed).
        #[arg(long)]
        no_session: bool,
        /// taskdaemon.yml of the recorded session or run: replayed commands are confined by
        /// its `sandbox:` and limited by its catalog, as they were when recorded.
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Replay the calls of a log whose chain cannot be checked (no chain, or no key),
        /// confined as ever; the report still says the log is not verified (exit 1).
        #[arg(long)]
        unverified: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Options of `taskdaemon run`.
#[derive(Args, Clone)]
struct RunArgs {
    /// The run description.
    #[arg(short, long, default_value = "taskdaemon.yml")]
    config: PathBuf,
    /// Only this loop (and the loops it depends on); repeat for several.
    #[arg(long = "loop", value_name = "NAME")]
    loops: Vec<String>,
    /// Where to write the run record (default: .taskdaemon/runs/<run-id> beside the config).
    #[arg(long)]
    run_dir: Option<PathBuf>,
    /// Stream events as JSON lines instead of the progress display.
    #[arg(long)]
    json: bool,
    /// Continue an earlier run (its id under .taskdaemon/runs, or with --run-dir its
    /// directory) after a crash, Ctrl-C or SIGTERM: completed loops are not run again, the
    /// others go on at their next iteration with their progress and their unseen messages.
    #[arg(long, value_name = "RUN")]
    resume: Option<String>,
    /// Serve the run's web dashboard on 127.0.0.1 (its address is printed before the loops
    /// start); after the run it stays until Ctrl-C.
    #[arg(long)]
    ui: bool,
    /// The dashboard's port (0: any free one).
    #[arg(long, value_name = "N", requires = "ui", default_value_t = taskdaemon::fronts::ui::DEFAULT_PORT)]
    ui_port: u16,
}

/// Options of `taskdaemon host`.
#[derive(Args, Clone)]
struct HostArgs {
    /// The head's address: the host (name or IP) of the machine running `taskdaemon run`,
    /// and the port of its `hosts.listen`.
    #[arg(long, value_name = "HEAD:PORT")]
    join: String,
    /// This host's name, unique among the run's hosts (default: this machine's host name).
    #[arg(long)]
    name: Option<String>,
    /// Where this host keeps its worktrees; one host process per directory (default:
    /// .taskdaemon/host-NAME in the current directory).
    #[arg(long, value_name = "DIR")]
    workdir: Option<PathBuf>,
    /// Loops this host runs at once (default: the head's `hosts.slots`).
    #[arg(long, value_name = "N")]
    slots: Option<u32>,
    /// The file holding the head's shared secret (only its owner may read it: chmod 600).
    #[arg(long, value_name = "FILE", conflicts_with = "secret_env")]
    secret_file: Option<PathBuf>,
    /// The environment variable holding the head's shared secret.
    #[arg(long, value_name = "NAME")]
    secret_env: Option<String>,
    /// How long connecting, the handshake and joining may each take, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    timeout_ms: u64,
    /// The least confinement this host runs loops' commands under, whatever the head's
    /// `sandbox.mode` says: `required` refuses to run a loop's commands on a machine that
    /// lacks a protection, even when the head asks for `best-effort`.
    #[arg(long, value_name = "MODE", default_value = "best-effort", value_parser = ["best-effort", "required"])]
    sandbox_floor: String,
    /// The most of this machine's files loops' commands may read: `strict` holds them to the
    /// system and toolchain paths and their worktree, whatever the head's `sandbox.read`
    /// says; `all` lets the head's `read` decide (this host's work directory and secret file
    /// stay hidden either way).
    #[arg(long, value_name = "SCOPE", default_value = "all", value_parser = ["all", "strict"])]
    sandbox_read: String,
    /// A file or directory of this machine that loops' commands read as empty (an empty
    /// directory), whatever the head's policy says: its owner's keys, its cloud credentials
    /// (repeat for more; relative to the current directory, `~/` is `$HOME`; it must exist).
    #[arg(long, value_name = "PATH")]
    sandbox_hide: Vec<PathBuf>,
    /// Honour a head's `sandbox.unix-sockets: host`: without it no loop's command reaches
    /// this machine's Unix sockets (its Docker socket, its agents), whatever the head asks.
    #[arg(long)]
    allow_unix_sockets: bool,
    /// A host name or IP address of this machine's network a loop's `web_fetch` may reach
    /// when the run's `web.allow-private` allows it too (repeat for more). Without it (nor
    /// `--web-allow-private-all`) loops here reach public internet addresses only, whatever
    /// the head allows: its private network is not this machine's.
    #[arg(long, value_name = "HOST", conflicts_with = "web_allow_private_all")]
    web_allow_private: Vec<String>,
    /// Let the run's `web.allow-private` decide alone, private addresses of this machine's
    /// network included (its loopback, its cloud metadata address).
    #[arg(long)]
    web_allow_private_all: bool,
    /// The sccache binary of this machine, for the runs that build through a compiler
    /// cache (`compiler-cache: sccache`); default: the sccache on PATH. The cache is in the
    /// work directory (`compiler-cache/sccache`), shared by the host's loops and runs.
    #[arg(long, value_name = "PATH")]
    sccache: Option<PathBuf>,
    /// A checkout of the run's repository on this machine whose build state (the run's
    /// `warm:` paths: `target/`, `node_modules/`...) each new worktree here is seeded with,
    /// as the head seeds its own loops' from its checkout. Without it a loop's `warm:` is
    /// not seeded here, and its record says so.
    #[arg(long, value_name = "DIR")]
    warm_from: Option<PathBuf>,
}

impl HostArgs {
    /// `--sccache`, absolute; one that is not an executable file is refused (a typo would
    /// fail every loop of a run that asks for the cache).
    fn sccache(&self) -> Result<Option<PathBuf>, String> {
        let Some(path) = &self.sccache else {
            return Ok(None);
        };
        let here = std::env::current_dir().map_err(|e| format!("--sccache: {e}"))?;
        let path = td_confine::absolute(path, &here);
        if !taskdaemon::run::compiler_cache::is_executable(&path) {
            return Err(format!(
                "--sccache {}: not an executable file; name this machine's sccache binary",
                path.display()
            ));
        }
        Ok(Some(path))
    }

    /// `--warm-from`, absolute and canonical; one that is not a directory is refused.
    fn warm_from(&self) -> Result<Option<PathBuf>, String> {
        let Some(dir) = &self.warm_from else {
            return Ok(None);
        };
        let here = std::env::current_dir().map_err(|e| format!("--warm-from: {e}"))?;
        let real = td_confine::absolute(dir, &here)
            .canonicalize()
            .map_err(|e| format!("--warm-from {}: {e}", dir.display()))?;
        if !real.is_dir() {
            return Err(format!(
                "--warm-from {}: not a directory; name a checkout of the repository",
                dir.display()
            ));
        }
        Ok(Some(real))
    }

    /// `--sandbox-hide`'s paths, absolute and canonical; one that does not exist is refused
    /// (a path hidden by a typo would hide nothing, without a word).
    fn hidden(&self) -> Result<Vec<PathBuf>, String> {
        if self.sandbox_hide.is_empty() {
            return Ok(Vec::new());
        }
        let here = std::env::current_dir().map_err(|e| format!("--sandbox-hide: {e}"))?;
        let mut hidden = Vec::with_capacity(self.sandbox_hide.len());
        for path in &self.sandbox_hide {
            let real = td_confine::absolute(path, &here)
                .canonicalize()
                .map_err(|e| format!("--sandbox-hide {}: {e}", path.display()))?;
            hidden.push(real);
        }
        Ok(hidden)
    }

    /// What this host allows a loop's `web_fetch` at most (`--web-allow-private`,
    /// `--web-allow-private-all`); an entry that is not a host name or an address is
    /// refused with how to write it.
    fn web_floor(&self) -> Result<td_toolkit::web_access::WebAccess, String> {
        use td_toolkit::web_access::{AllowedHost, WebAccess};
        if self.web_allow_private_all {
            return Ok(WebAccess::Any);
        }
        if self.web_allow_private.is_empty() {
            return Ok(WebAccess::PublicOnly);
        }
        let mut hosts = Vec::with_capacity(self.web_allow_private.len());
        for entry in &self.web_allow_private {
            hosts.push(AllowedHost::parse(entry).map_err(|e| format!("--web-allow-private: {e}"))?);
        }
        Ok(WebAccess::PublicAnd(hosts))
    }
}

/// Options shared by every front that holds one ToolContext.
#[derive(Args, Clone)]
struct SessionArgs {
    /// The worktree the tools are confined to.
    #[arg(long)]
    worktree: PathBuf,
    /// taskdaemon.yml whose `catalog` overrides tool timeouts, caps and lanes, and whose
    /// `web` section says what web_fetch may reach besides the public internet.
    #[arg(short, long)]
    config: Option<PathBuf>,
    /// Only these tools (comma-separated); an unknown name is an error.
    #[arg(long, value_delimiter = ',')]
    tools: Option<Vec<String>>,
    /// Append a receipt per call to this JSONL file (chained; the session receipt goes to
    /// LOG.RECEIPT.json when the session ends).
    #[arg(long)]
    receipts: Option<PathBuf>,
    /// The receipt chain key (default: LOG.key beside the receipts log; made when missing).
    /// It must lie outside the worktree; commands see it as an empty file.
    #[arg(long, value_name = "FILE", requires = "receipts")]
    chain_key: Option<PathBuf>,
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
    receipts: Option<ReceiptSession>,
}

impl SessionArgs {
    fn open(&self) -> Result<Session, String> {
        let tools = match &self.tools {
            Some(names) => td_tools::tool_set(names).map_err(|e| e.to_string())?,
            None => td_tools::all_tools(),
        };
        let mut policy = SessionPolicy::load(self.config.as_deref())?;
        // Before the first call: every secret of our environment (and the config's named
        // ones) is redacted from results, receipts and messages.
        policy.start()?;
        let receipts = match &self.receipts {
            Some(log) => Some(ReceiptSession::open(
                log,
                self.chain_key.as_deref(),
                &self.worktree,
                &self.exec_id,
                &mut policy.sandbox,
            )?),
            None => None,
        };
        if let Some(r) = &receipts {
            r.log().set_tool_set(tools.names());
            // The session's record, not the model's file: neither the file tools nor
            // commands may change it (it lies outside every writable path: `open` refuses
            // others; protected all the same, should a path above it be made writable).
            policy.sandbox = std::mem::take(&mut policy.sandbox)
                .protecting(r.log().path())
                .protecting(r.session_path());
        }
        let ctx = policy
            .context(&self.worktree, self.exec_id.clone())?
            .with_commands(LoopCommands {
                build: self.build_cmd.clone(),
                test: self.test_cmd.clone(),
                validate: self.validate_cmd.clone(),
            });
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

async fn run_command(args: RunArgs) -> Result<ExitCode, String> {
    use std::io::IsTerminal;
    use taskdaemon::run::progress::ProgressMode;
    let progress = if args.json {
        ProgressMode::Json
    } else if std::io::stdout().is_terminal() {
        ProgressMode::Live
    } else {
        ProgressMode::Plain
    };
    // The dashboard (a process of its own: `fronts/ui/process.rs`) listens before anything
    // else, so that its address is printed before the loops start; it serves once the run's
    // record exists.
    let mut dashboard = None;
    let mut record_ready = None;
    if args.ui {
        let process = match DashboardProcess::start(args.ui_port).await {
            Ok(p) => p,
            Err(e) => {
                eprintln!("taskdaemon: {e}");
                return Ok(ExitCode::from(1));
            }
        };
        let url = process.url().to_string();
        say(args.json, &format!("dashboard: {url}"));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<PathBuf>();
        record_ready = Some(tx);
        // Gives the process the run once there is one; hands it back for the end.
        let task = tokio::spawn(async move {
            let mut process = process;
            if let Some(run_dir) = rx.recv().await
                && let Err(e) = process.serve(&run_dir).await
            {
                eprintln!("taskdaemon: {}", secrets::redact(&e));
            }
            process
        });
        dashboard = Some((url, task));
    }
    let run = taskdaemon::run::orchestrator::run(taskdaemon::run::orchestrator::RunOptions {
        config: args.config,
        only: args.loops,
        run_dir: args.run_dir,
        progress,
        resume: args.resume,
        record_ready,
    })
    .await;
    let report = match run {
        Ok(report) => report,
        // 2 for a startup error; another code when another process holds the run.
        Err(e) => {
            eprintln!("taskdaemon: {}", secrets::redact(&e.message));
            return Ok(ExitCode::from(e.exit_code));
        }
    };
    let code = ExitCode::from(report.exit_code());
    if !args.json {
        println!();
        match taskdaemon::run::status::status_command(&report.run_dir, None, false) {
            Ok(status) => {
                print_notes(&status.notes);
                print!("{}", secrets::redact(&status.text));
            }
            Err(e) => eprintln!(
                "taskdaemon: cannot read the run summary: {}",
                secrets::redact(&e)
            ),
        }
        println!("run record: {}", report.run_dir.display());
        for branch in &report.integrated {
            println!(
                "merged result: branch {branch}; look at it with: git -C {} log --graph {branch}",
                report.repo.display()
            );
        }
    }
    if let Some((url, task)) = dashboard {
        // A finished run stays inspectable until the user is done with it. Listening before
        // saying so: a signal sent on seeing the line must not be missed.
        let mut signals = taskdaemon::run::signals::StopSignals::install();
        say(
            args.json,
            &format!("run finished; the dashboard stays at {url} until Ctrl-C"),
        );
        signals.next().await;
        if let Ok(process) = task.await {
            process.stop().await;
        }
    }
    Ok(code)
}

/// Prints a line for the user: on stdout, or on stderr when stdout carries JSON lines.
fn say(json: bool, line: &str) {
    if json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

/// `taskdaemon ui`: serves the dashboard of a run until SIGINT or SIGTERM.
async fn ui_command(
    run: Option<String>,
    dir: PathBuf,
    port: u16,
    bind: std::net::IpAddr,
) -> Result<ExitCode, String> {
    // Secrets of this environment are redacted from every answer, as from every record.
    secrets::register_environment(&[]);
    let run = run.filter(|r| r != "latest");
    let run_dir = taskdaemon::run::status::resolve_run_dir(&dir, run.as_deref())?;
    let bound = match bind_dashboard(bind, port).await {
        Ok(b) => b,
        Err(code) => return Ok(code),
    };
    println!("dashboard: {}", bound.url());
    // Installed before serving: from here a signal ends the server, not the process.
    let mut signals = taskdaemon::run::signals::StopSignals::install();
    bound
        .serve(&run_dir, async move {
            signals.next().await;
        })
        .await?;
    Ok(ExitCode::SUCCESS)
}

/// Binds the dashboard's socket, or says why not on stderr and gives the exit code (1).
async fn bind_dashboard(
    bind: std::net::IpAddr,
    port: u16,
) -> Result<taskdaemon::fronts::ui::Bound, ExitCode> {
    taskdaemon::fronts::ui::bind(bind, port).await.map_err(|e| {
        eprintln!("taskdaemon: {}", e.0);
        ExitCode::from(1)
    })
}

/// `taskdaemon ui --run-dir-from-stdin`, the dashboard process of `run --ui`: listens,
/// prints its address, serves the run directory it is then given on standard input, and ends
/// when that input closes or on SIGTERM (see `fronts/ui/process.rs`).
async fn ui_child_command(port: u16, bind: std::net::IpAddr) -> Result<ExitCode, String> {
    use std::io::Write;
    secrets::register_environment(&[]);
    let bound = match bind_dashboard(bind, port).await {
        Ok(b) => b,
        Err(code) => return Ok(code),
    };
    let mut stdout = std::io::stdout();
    writeln!(stdout, "dashboard: {}", bound.url())
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("cannot print the dashboard's address: {e}"))?;
    let mut signals = taskdaemon::run::signals::StopSignals::install();
    let Some((run_dir, closed)) = taskdaemon::fronts::ui::process::run_dir_from_stdin().await
    else {
        return Ok(ExitCode::SUCCESS);
    };
    if !run_dir.is_dir() {
        return Err(format!(
            "the run directory {} does not exist",
            run_dir.display()
        ));
    }
    bound
        .serve(&run_dir, async move {
            tokio::select! {
                _ = closed => {}
                _ = signals.next() => {}
            }
        })
        .await?;
    Ok(ExitCode::SUCCESS)
}

/// How a `tool exec` or `mcp` session ends: 0, or 1 with the reason on stderr when a receipt
/// could not be written (its call and every later one were answered as errors).
/// The exit of a `tool exec`/`mcp` session: `unrecorded` says why receipts stopped being
/// written (exit 1), `closed` whether its session receipt was written. When receipts failed
/// already, a session receipt that fails too (the same full disk) is only reported.
fn end_session(unrecorded: Option<String>, closed: Result<(), String>) -> Result<ExitCode, String> {
    match closed {
        Err(e) if unrecorded.is_none() => Err(e),
        Err(e) => {
            eprintln!("taskdaemon: {}", secrets::redact(&e));
            Ok(receipts_exit(unrecorded))
        }
        Ok(()) => Ok(receipts_exit(unrecorded)),
    }
}

fn receipts_exit(unrecorded: Option<String>) -> ExitCode {
    match unrecorded {
        None => ExitCode::SUCCESS,
        Some(why) => {
            eprintln!(
                "taskdaemon: {}; that call was answered as an error and no later call ran. \
                 Free space (or fix the disk), then start a new session.",
                secrets::redact(&why)
            );
            ExitCode::from(1)
        }
    }
}

/// Notes about a run record (a rebuilt summary, unreadable lines), one line each on stderr.
fn print_notes(notes: &[String]) {
    for note in notes {
        eprintln!("taskdaemon: {}", secrets::redact(note));
    }
}

/// Whether log lines on stderr may carry colour codes: only when stderr is a terminal, and
/// not when `NO_COLOR` is set to anything but the empty string (<https://no-color.org>).
/// A pipe or a file gets plain text.
fn stderr_colours(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

fn main() -> ExitCode {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        // Log lines quote errors and outputs: they leave the process redacted like the rest.
        .with_writer(|| RedactingWriter(std::io::stderr()))
        .with_ansi(stderr_colours(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TASKDAEMON_LOG")
                // ractor_cluster warns of every closed session; `taskdaemon host` and the
                // run's record say what happened to a host in words of their own.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("warn,ractor_cluster=error")
                }),
        )
        .init();
    let cli = Cli::parse();
    // The dashboard is a few streams and requests: one thread serves them without handing
    // every event from one worker thread to another (its file reads have threads of their
    // own). Everything else runs loops and tools on every core.
    let mut builder = if matches!(cli.command, Command::Ui { .. }) {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("taskdaemon: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = match runtime.block_on(dispatch(cli.command)) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("taskdaemon: {}", secrets::redact(&message));
            ExitCode::from(2)
        }
    };
    // The work is done. A blocking thread still running belongs to a call that was given up
    // (its timeout answered already); dropping the runtime would wait for it without bound,
    // so the process waits a moment and then exits without it.
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    code
}

/// How long the process waits at exit for blocking threads of abandoned calls.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

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
                (Some(names), _) => td_tools::tool_set(&names).map_err(|e| e.to_string())?,
                (None, Some(t)) => {
                    let names = default_tool_set(&t).ok_or_else(|| {
                        format!(
                            "unknown loop type '{t}'; built-in types: {}",
                            td_toolkit::catalog::BUILTIN_LOOP_TYPES.join(", ")
                        )
                    })?;
                    td_tools::tool_set(&names).map_err(|e| e.to_string())?
                }
                (None, None) => td_tools::all_tools(),
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
            let Session {
                ctx,
                tools,
                receipts,
            } = args.open()?;
            let stdin = tokio::io::BufReader::with_capacity(
                taskdaemon::fronts::lines::READ_BUFFER_BYTES,
                tokio::io::stdin(),
            );
            let stdout = tokio::io::stdout();
            let calls = CallPath::new(
                Arc::new(ctx),
                Arc::new(tools),
                Arc::new(InCallerTask),
                receipts.as_ref().map(|r| r.log().clone()),
            );
            let served = taskdaemon::fronts::exec::serve(stdin, stdout, &calls)
                .await
                .map_err(|e| format!("exec stream failed: {e}"));
            // The session ended either way: what its log holds is sealed.
            let closed = receipts.as_ref().map_or(Ok(()), |r| r.close());
            end_session(served?, closed)
        }
        Command::Run(args) => run_command(args).await,
        Command::Host(args) => {
            let web = args.web_floor()?;
            let hide = args.hidden()?;
            let sccache = args.sccache()?;
            let warm_from = args.warm_from()?;
            taskdaemon::run::hosts::host_loops::set_floor(
                taskdaemon::run::hosts::host_loops::HostFloor {
                    mode: if args.sandbox_floor == "required" {
                        td_confine::SandboxMode::Required
                    } else {
                        td_confine::SandboxMode::BestEffort
                    },
                    secret_env: args.secret_env.clone(),
                    read: if args.sandbox_read == "strict" {
                        td_confine::ReadScope::Strict
                    } else {
                        td_confine::ReadScope::All
                    },
                    allow_unix_sockets: args.allow_unix_sockets,
                    web,
                    hide,
                },
            );
            let code = taskdaemon::run::hosts::worker::run(
                taskdaemon::run::hosts::worker::WorkerOptions {
                    join: args.join,
                    name: args.name,
                    workdir: args.workdir,
                    slots: args.slots,
                    secret_file: args.secret_file,
                    secret_env: args.secret_env,
                    timeout: std::time::Duration::from_millis(args.timeout_ms),
                    sccache,
                    warm_from,
                },
            )
            .await;
            Ok(ExitCode::from(code))
        }
        Command::Status {
            run,
            dir,
            json,
            artifacts,
        } => {
            let status = if artifacts {
                taskdaemon::run::status::artifacts_command(&dir, run.as_deref(), json)?
            } else {
                taskdaemon::run::status::status_command(&dir, run.as_deref(), json)?
            };
            print_notes(&status.notes);
            print!("{}", status.text);
            Ok(ExitCode::SUCCESS)
        }
        Command::Merge {
            run,
            loops,
            dir,
            config,
        } => {
            let (text, code) = taskdaemon::run::merge_cmd::merge_command(
                taskdaemon::run::merge_cmd::MergeOptions {
                    run,
                    loops,
                    dir,
                    config,
                },
            )
            .await;
            print!("{}", secrets::redact(&text));
            Ok(ExitCode::from(code))
        }
        Command::Logs {
            run,
            loop_name,
            dir,
            iteration,
            full,
            system,
        } => {
            let mut options = taskdaemon::run::status::LogsOptions {
                iteration,
                system,
                ..Default::default()
            };
            if full {
                options.max_content_bytes = None;
            }
            let run = (run != "latest").then_some(run);
            let text =
                taskdaemon::run::status::logs_command(&dir, run.as_deref(), &loop_name, &options)?;
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Ui {
            run,
            dir,
            port,
            bind,
            run_dir_from_stdin,
        } => {
            if run_dir_from_stdin {
                ui_child_command(port, bind).await
            } else {
                ui_command(run, dir, port, bind).await
            }
        }
        Command::Mcp(args) => {
            let Session {
                ctx,
                tools,
                receipts,
            } = args.open()?;
            let served = taskdaemon::fronts::mcp::serve_stdio(
                Arc::new(ctx),
                Arc::new(tools),
                receipts.as_ref().map(|r| r.log().clone()),
            )
            .await
            .map_err(|e| format!("MCP server failed: {e}"));
            let closed = receipts.as_ref().map_or(Ok(()), |r| r.close());
            end_session(served?, closed)
        }
        Command::Replay {
            command:
                ReplayCommand::Verify {
                    log,
                    worktree,
                    chain_key,
                    session,
                    no_session,
                    config,
                    unverified,
                    json,
                },
        } => {
            let policy = SessionPolicy::load(config.as_deref())?;
            // The recorded outputs were hashed redacted; the replayed ones must be too.
            policy.start()?;
            let options = taskdaemon::fronts::replay::VerifyOptions {
                log,
                worktree,
                chain_key,
                session,
                no_session,
                unverified,
                policy,
            };
            taskdaemon::fronts::replay::verify_command(&options, json).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::stderr_colours;

    #[test]
    fn colours_only_on_a_terminal_without_no_color() {
        assert!(stderr_colours(true, None));
        assert!(stderr_colours(true, Some("".into())));
        assert!(!stderr_colours(true, Some("1".into())));
        assert!(!stderr_colours(false, None));
        assert!(!stderr_colours(false, Some("".into())));
    }
}
