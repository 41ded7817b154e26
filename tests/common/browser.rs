//! A real browser for the dashboard's test and bench: Debian's headless Chromium driven
//! through its chromedriver (WebDriver) with fantoccini, and `taskdaemon run --ui` started
//! with its dashboard address read from its output.
//!
//! Every process started here is ended when its guard drops, the test having passed or not:
//! chromedriver runs in a process group of its own (Chromium and its helpers are in it), and
//! the group is killed, so no browser outlives a failed test.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

/// Debian's Chromium binary (package `chromium`).
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// Debian's chromedriver (package `chromium-driver`).
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// What to tell a user whose machine lacks the browser.
pub const INSTALL_HINT: &str = "the dashboard's browser test needs Debian's Chromium and its WebDriver: \
     install them with `apt-get install chromium chromium-driver` (the test does it itself when it runs as root or with passwordless sudo; .ci/run does it in CI)";

/// Makes sure Chromium and chromedriver are there: when one is missing and this process may
/// install Debian packages (root, or passwordless `sudo`), it installs them with apt-get (one
/// test process at a time, under a lock), as the MCP test makes its own Python environment;
/// otherwise it fails (never skips), saying what to install.
pub fn require_browser() {
    let present = || {
        [CHROMIUM, CHROMEDRIVER]
            .iter()
            .all(|p| Path::new(p).exists())
    };
    if !present() {
        install_browser();
    }
    for path in [CHROMIUM, CHROMEDRIVER] {
        assert!(
            Path::new(path).exists(),
            "{path} is missing: {INSTALL_HINT}"
        );
    }
}

/// `apt-get install chromium chromium-driver` where this process may; a failure is left to
/// [`require_browser`]'s message (with apt's output above it).
fn install_browser() {
    super::debian_packages::install(
        &["chromium", "chromium-driver"],
        &[CHROMIUM, CHROMEDRIVER],
        "the dashboard's browser test",
    );
}

/// A chromedriver process (and the Chromium it starts), killed with its process group on drop.
pub struct Driver {
    child: Child,
    /// Where chromedriver listens (`http://127.0.0.1:PORT`).
    pub url: String,
    profile: tempfile::TempDir,
}

impl Driver {
    /// Starts chromedriver on a free loopback port and waits until it says where.
    pub fn start() -> Driver {
        Driver::start_on(None)
    }

    /// As [`Driver::start`], with chromedriver and the browsers it starts kept to the CPUs
    /// `cpus` (a `taskset -c` list) when given: a bench keeps the browser off the CPU of
    /// the process it measures.
    pub fn start_on(cpus: Option<&str>) -> Driver {
        require_browser();
        let profile = tempfile::tempdir().expect("a temp dir for the browser profile");
        let mut cmd = match cpus {
            Some(cpus) => {
                let mut cmd = Command::new("taskset");
                cmd.args(["-c", cpus, CHROMEDRIVER]);
                cmd
            }
            None => Command::new(CHROMEDRIVER),
        };
        cmd.arg("--port=0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {CHROMEDRIVER}: {e}; {INSTALL_HINT}"));
        let lines = line_channel(child.stdout.take());
        let port = wait_line(&lines, Duration::from_secs(30), |l| {
            // "ChromeDriver was started successfully on port 43565."
            l.split("started successfully on port ")
                .nth(1)
                .map(|p| p.trim_end_matches('.').trim().to_string())
        })
        .unwrap_or_else(|| {
            let _ = child.kill();
            panic!("chromedriver did not say which port it listens on within 30 s")
        });
        Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            profile,
        }
    }

    /// A new headless Chromium session with a fresh profile and a 1440×900 window.
    pub async fn session(&self) -> Client {
        self.session_sized(1440, 900).await
    }

    /// A new headless Chromium session with a `width`×`height` window.
    pub async fn session_sized(&self, width: u32, height: u32) -> Client {
        let args = vec![
            "--headless".to_string(),
            "--no-sandbox".to_string(),
            "--disable-gpu".to_string(),
            "--disable-quic".to_string(),
            "--no-first-run".to_string(),
            "--disable-background-networking".to_string(),
            "--disable-component-update".to_string(),
            "--disable-sync".to_string(),
            "--disable-dev-shm-usage".to_string(),
            "--hide-scrollbars".to_string(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", self.profile.path().display()),
        ];
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        });
        let Value::Object(caps) = caps else {
            unreachable!("a JSON object literal")
        };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("cannot open a Chromium session through chromedriver: {e}"))
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        kill_group(&mut self.child);
    }
}

/// Kills `child`'s process group (it leads one) and reaps it.
pub fn kill_group(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) on a process group we created; no memory is touched.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Lines of a child's pipe, read on a thread so that the child never blocks on a full pipe.
pub fn line_channel(pipe: Option<impl std::io::Read + Send + 'static>) -> Receiver<String> {
    let (tx, rx) = channel();
    if let Some(pipe) = pipe {
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    rx
}

/// The first `pick(line)` that is `Some`, among the lines received within `limit`.
pub fn wait_line<T>(
    lines: &Receiver<String>,
    limit: Duration,
    mut pick: impl FnMut(&str) -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        match lines.recv_timeout(left) {
            Ok(line) => {
                if let Some(found) = pick(&line) {
                    return Some(found);
                }
            }
            Err(_) => return None,
        }
    }
}

/// The address in a `dashboard: URL` line.
pub fn dashboard_url(line: &str) -> Option<String> {
    line.strip_prefix("dashboard: ")
        .map(|u| u.trim().to_string())
        .filter(|u| u.starts_with("http://"))
}

/// A `taskdaemon run --ui` process in its own process group, killed on drop.
pub struct UiRun {
    /// The run process.
    pub child: Child,
    /// Its stdout, line by line (the dashboard line already taken).
    pub stdout: Receiver<String>,
    /// Its stderr, line by line.
    pub stderr: Receiver<String>,
    /// The dashboard's address.
    pub url: String,
}

impl UiRun {
    /// Spawns `cmd` (a `taskdaemon run ... --ui` command) and waits for its `dashboard:` line.
    pub fn start(mut cmd: Command, limit: Duration) -> UiRun {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().expect("taskdaemon starts");
        let stdout = line_channel(child.stdout.take());
        let stderr = line_channel(child.stderr.take());
        let Some(url) = wait_line(&stdout, limit, dashboard_url) else {
            kill_group(&mut child);
            let err: Vec<String> = stderr.try_iter().collect();
            panic!(
                "`taskdaemon run --ui` printed no `dashboard: URL` line within {limit:?}; stderr:\n{}",
                err.join("\n")
            );
        };
        UiRun {
            child,
            stdout,
            stderr,
            url,
        }
    }

    /// The run's process id.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("a pid fits an i32")
    }

    /// Sends SIGTERM and waits (up to `limit`) for the process to exit; its exit code.
    pub fn terminate(&mut self, limit: Duration) -> Option<i32> {
        // SAFETY: kill(2) with a valid signal on our own child; no memory is touched.
        unsafe {
            libc::kill(self.pid(), libc::SIGTERM);
        }
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("taskdaemon did not exit within {limit:?} of SIGTERM")
    }
}

impl Drop for UiRun {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            kill_group(&mut self.child);
        }
    }
}

/// Polls `check` every 100 ms until it returns `Some`; panics naming `what` after `limit`.
pub async fn until<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The text of the first element matching `css`, once it exists and its text satisfies `ok`.
pub async fn text_of(
    client: &Client,
    css: &str,
    limit: Duration,
    ok: impl Fn(&str) -> bool,
) -> String {
    until(&format!("`{css}` on the page"), limit, || async {
        let el = client.find(Locator::Css(css)).await.ok()?;
        let text = el.text().await.ok()?;
        ok(&text).then_some(text)
    })
    .await
}

/// Errors the page caught (`window.tdErrors`: uncaught exceptions and rejections).
pub async fn page_errors(client: &Client) -> Vec<String> {
    let v = client
        .execute("return window.tdErrors || [];", vec![])
        .await
        .unwrap_or(Value::Null);
    v.as_array()
        .map(|a| a.iter().map(|e| e.to_string()).collect())
        .unwrap_or_default()
}

/// Where a test may put a file it wants to keep (under the target directory).
pub fn out_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}
