//! The README's two-host walkthrough ("Two hosts on one machine"), run as written: the
//! commands the README shows (each checked to be there, word for word), on a copy of
//! `examples/two-hosts` and `examples/quickstart/project` laid out as in the checkout, with
//! the real binary in place of `cargo run -q --`. The head and the host share one network
//! namespace made by the test (tests/common/netns.rs), so that `127.0.0.1:7070` is theirs
//! alone whatever else listens on this machine; root and `ip` are needed, else the test
//! fails saying so. What the README says the user sees is checked against what they print.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::netns::Net;

/// The commands of the walkthrough, as the README shows them.
const SECRET: &str = "head -c 32 /dev/urandom | base64 > examples/two-hosts/hosts.secret";
const CHMOD: &str = "chmod 600 examples/two-hosts/hosts.secret";
const HEAD: &str = "cargo run -q -- run -c examples/two-hosts/taskdaemon.yml";
const HOST: &str = "cargo run -q -- host --join 127.0.0.1:7070 --name h1 --secret-file examples/two-hosts/hosts.secret --workdir examples/two-hosts/.taskdaemon/host-h1";
const STATUS: &str = "cargo run -q -- status --dir examples/two-hosts";

const WAIT: Duration = Duration::from_secs(120);

fn checkout() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The README's walkthrough section.
fn section() -> String {
    let readme = std::fs::read_to_string(checkout().join("README.md")).unwrap();
    let start = readme
        .find("### Two hosts on one machine")
        .expect("the README has the walkthrough");
    let rest = &readme[start..];
    // To the next heading of this level or above (the config's comments start with `#`).
    let end = rest[4..].find("\n### ").map_or(rest.len(), |i| i + 4);
    rest[..end].to_string()
}

/// Copies the files of `from` (not its subdirectories) into `to`.
fn copy_files(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// `cargo run -q -- ARGS` as the binary with `ARGS`, in namespace `ns` of `net`, in `dir`;
/// its stdout and stderr into `NAME.out` and `NAME.err` there.
fn start(net: &Net, dir: &Path, name: &str, command: &str) -> Child {
    let args: Vec<&str> = command
        .strip_prefix("cargo run -q -- ")
        .unwrap()
        .split_whitespace()
        .collect();
    Command::new("ip")
        .args([
            "netns",
            "exec",
            &net.ns("head"),
            env!("CARGO_BIN_EXE_taskdaemon"),
        ])
        .args(&args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join(format!("{name}.out"))).unwrap())
        .stderr(std::fs::File::create(dir.join(format!("{name}.err"))).unwrap())
        .spawn()
        .unwrap()
}

fn output(dir: &Path, name: &str) -> String {
    let read = |ext: &str| std::fs::read_to_string(dir.join(format!("{name}.{ext}")));
    format!(
        "{}{}",
        read("out").unwrap_or_default(),
        read("err").unwrap_or_default()
    )
}

fn wait_exit(child: &mut Child, what: &str, context: impl Fn() -> String) -> i32 {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        if start.elapsed() > WAIT {
            let _ = child.kill();
            panic!("{what} did not end within {WAIT:?}:\n{}", context());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The table row of `first` (a loop or a host) in `text`.
fn row<'a>(text: &'a str, first: &str) -> &'a str {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(first))
        .unwrap_or_else(|| panic!("no row {first} in:\n{text}"))
}

#[test]
fn the_readmes_two_host_walkthrough_runs_as_written() {
    let readme = section();
    for command in [SECRET, CHMOD, HEAD, HOST, STATUS] {
        assert!(
            readme.contains(command),
            "the README's walkthrough no longer shows `{command}`"
        );
    }
    // The config the README shows is the example's, word for word.
    let config =
        std::fs::read_to_string(checkout().join("examples/two-hosts/taskdaemon.yml")).unwrap();
    assert!(
        readme.contains(&config),
        "README and examples/two-hosts/taskdaemon.yml differ"
    );

    // The secret and the run's record stay out of git in the checkout.
    let ignored =
        std::fs::read_to_string(checkout().join("examples/two-hosts/.gitignore")).unwrap();
    for name in ["hosts.secret", ".taskdaemon/"] {
        assert!(ignored.lines().any(|l| l == name), "{ignored}");
    }

    let net = Net::new("walkthrough");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().canonicalize().unwrap();
    copy_files(
        &checkout().join("examples/two-hosts"),
        &dir.join("examples/two-hosts"),
    );
    copy_files(
        &checkout().join("examples/quickstart/project"),
        &dir.join("examples/quickstart/project"),
    );
    for command in [SECRET, CHMOD] {
        let ok = Command::new("sh")
            .args(["-c", command])
            .current_dir(&dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "{command}");
    }

    // Terminal 1: the head. It listens, runs `api` and holds `client` for h1.
    let mut head = start(&net, &dir, "head", HEAD);
    let head_says = |what: &str| output(&dir, "head").contains(what);
    let wait_for = |what: &str| {
        let start = Instant::now();
        while !head_says(what) {
            assert!(
                start.elapsed() < WAIT,
                "the head never said `{what}`:\n{}",
                output(&dir, "head")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for("taskdaemon: hosts join at 127.0.0.1:7070");
    wait_for("client: pending: waiting for host h1");
    wait_for("api: completed: merged into");

    // Terminal 2: the host joins, runs `client`, and leaves when the run ends.
    let mut host = start(&net, &dir, "host", HOST);
    let code = wait_exit(&mut host, "the host", || output(&dir, "host"));
    let host_out = output(&dir, "host");
    assert_eq!(code, 0, "{host_out}");
    // The README writes the checkout's own path as `/…`.
    let workdir = dir.join("examples/two-hosts/.taskdaemon/host-h1");
    for line in [
        "taskdaemon host: joined the head at 127.0.0.1:7070 as h1 (1 slots; work directory /…/examples/two-hosts/.taskdaemon/host-h1); running the loops it sends until the run ends",
        "taskdaemon host: the head at 127.0.0.1:7070 says: the run ended; leaving",
    ] {
        let printed = line.replace(
            "/…/examples/two-hosts/.taskdaemon/host-h1",
            &workdir.display().to_string(),
        );
        assert!(
            host_out.contains(&printed),
            "{printed}\nnot in:\n{host_out}"
        );
        assert!(readme.contains(line), "the README does not show: {line}");
    }
    let code = wait_exit(&mut head, "the head", || output(&dir, "head"));
    let head_out = output(&dir, "head");
    assert_eq!(code, 0, "{head_out}");
    assert!(head_out.contains("taskdaemon: placement: loops client on h1"));
    // What the README shows of terminal 1's progress (stdout), in this order.
    let progress = std::fs::read_to_string(dir.join("head.out")).unwrap();
    // (`client: started` may come before or after its question.)
    assert!(progress.contains("client: started") && readme.contains("client: started"));
    let mut at = 0;
    for line in [
        "client: pending: waiting for host h1",
        "api: completed: server listens on 8080",
        "client -> api: query: Which port will the server listen on?",
        "api -> client: answer: 8080",
        "client: completed: client points at http://localhost:8080/v1",
    ] {
        let found = progress[at..]
            .find(line)
            .unwrap_or_else(|| panic!("`{line}` missing or out of order:\n{progress}"));
        at += found + line.len();
        assert!(readme.contains(line), "the README does not show: {line}");
    }

    // `status`: each loop's host, and the host's row.
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &net.ns("head"),
            env!("CARGO_BIN_EXE_taskdaemon"),
        ])
        .args(STATUS.strip_prefix("cargo run -q -- ").unwrap().split(' '))
        .current_dir(&dir)
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{status}");
    for (lp, host) in [("api", "head"), ("client", "h1")] {
        let r = row(&status, lp);
        assert!(
            r.contains(" completed ")
                && r.contains("passed (0)")
                && r.ends_with(&format!(" {host}")),
            "{status}"
        );
    }
    let h1 = row(&status, "h1");
    assert!(
        h1.contains("127.0.0.1:")
            && h1.contains(" 1 ")
            && h1.contains(" left ")
            && h1.ends_with(&workdir.display().to_string()),
        "{status}"
    );
    assert!(status.contains(": the run ended"), "{status}");
    for header in ["LOOP", "HOST  ADDRESS"] {
        assert!(
            status.contains(header) && readme.contains(header),
            "{status}"
        );
    }

    // The host's work came back and was merged on the head: the integration branch of the
    // run's copy holds both loops' files.
    let runs = dir.join("examples/two-hosts/.taskdaemon/runs");
    let run = std::fs::read_dir(&runs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let id = run.file_name().unwrap().to_str().unwrap().to_string();
    let show = |path: &str| {
        let out = Command::new("git")
            .arg("-C")
            .arg(run.join("repo"))
            .args(["show", &format!("taskdaemon/{id}/integration:{path}")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(show("client.conf"), "endpoint=http://localhost:8080/v1\n");
    assert_eq!(show("server.conf"), "port=8080\n");
}
