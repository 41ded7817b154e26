//! Debian packages a test needs, installed by the test itself where the machine lets it (as
//! the MCP test makes its own Python environment): as root or through passwordless `sudo`,
//! one test process at a time; otherwise the test fails saying what to install.

use std::path::Path;
use std::process::{Command, Stdio};

/// `apt-get install PACKAGES` (after `apt-get update`), as root or through `sudo -n`, when
/// apt-get is there and one of `paths` is missing; `why` is printed. A failure is left to the
/// caller, which checks `paths` and says what to install.
pub fn install(packages: &[&str], paths: &[&str], why: &str) {
    let present = || paths.iter().all(|p| Path::new(p).exists());
    if present() || !Path::new("/usr/bin/apt-get").exists() {
        return;
    }
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let sudo = !root
        && Command::new("sudo")
            .args(["-n", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !root && !sudo {
        return;
    }
    // One apt-get at a time across the test processes (apt holds its own lock and fails the
    // second one).
    let lock_path = std::env::temp_dir().join("taskdaemon-tests-apt.lock");
    let Ok(lock) = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
    else {
        return;
    };
    if rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).is_err() {
        return;
    }
    if present() {
        return;
    }
    eprintln!("installing Debian's {} for {why}", packages.join(" and "));
    let apt = |args: &[&str]| {
        let mut command = if root {
            Command::new("apt-get")
        } else {
            let mut c = Command::new("sudo");
            c.args(["-n", "apt-get"]);
            c
        };
        let status = command
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .status();
        status.is_ok_and(|s| s.success())
    };
    if apt(&["update", "-qq"]) {
        let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
        args.extend_from_slice(packages);
        apt(&args);
    }
    drop(lock);
}
