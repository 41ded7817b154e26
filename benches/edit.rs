//! `cargo bench --bench edit`: `edit_file` and `read_file` on a 10 MB text file, as a loop
//! calls them (through `ToolSet::call`), against `sed -i` and `tail -n 100` doing the same
//! work on an identical file, alternating the two.
//!
//! - edit: replace a unique string near the end (ALPHA -> BETA, then back, so every round
//!   edits the same 10 MB). The edit refreshes its own read stamp, as a loop's would.
//!   Baseline: `sed -i s/OLD/NEW/ FILE`.
//! - read: the last 100 lines (`offset` = lines - 99, `limit` = 100). Baseline: `tail -n 100
//!   FILE`. Two cases:
//!   - `read_last_100_lines_10mb_ms`: the loop reads a file it has read before and that did
//!     not change (paging, or reading again): read_file goes through the file's read index
//!     and reads only the window;
//!   - `..._first_read_...`: a loop that never read the file (a new context per call, made
//!     before the timing): read_file must read and hash the whole file for its read stamp
//!     (edit_file refuses edits of text the loop has not seen), which tail never does. This
//!     case is also compared with the floor of its contract: the file read and hashed in
//!     this process with the stamp's hash (XXH3-128), then `tail -n 100 FILE`.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::json;
use td_toolkit::context::ToolContext;
use td_toolkit::stamp::Stamp;

use common::{Report, alternate, rounds, run_all};

const TARGET: f64 = 2.0;
const SIZE: usize = 10 * 1024 * 1024;
const A: &str = "UNIQUE_MARKER_ALPHA";
const B: &str = "UNIQUE_MARKER_BETA";

/// About `SIZE` bytes of ordinary text lines, the marker 50 lines before the end.
fn corpus_text() -> (String, usize) {
    let line = |i: usize| {
        format!("{i:>8} let value = compute(alpha, beta, gamma); // lorem ipsum dolor sit amet\n")
    };
    let per = line(0).len();
    let lines = SIZE / per;
    let mut s = String::with_capacity(SIZE + per);
    for i in 0..lines {
        if i == lines - 50 {
            s.push_str(&format!("    {A} = {i};\n"));
        } else {
            s.push_str(&line(i));
        }
    }
    (s, lines)
}

/// A baseline to time against read_file.
type Baseline<'a> = Box<dyn FnMut() + 'a>;

fn sed(file: &Path, from: &str, to: &str) {
    let status = Command::new("sed")
        .arg("-i")
        .arg(format!("s/{from}/{to}/"))
        .arg(file)
        .status()
        .expect("run sed");
    assert!(status.success());
}

fn tail(file: &Path) -> Vec<u8> {
    run_all(Command::new("tail").args(["-n", "100"]).arg(file))
}

fn main() {
    println!(
        "# nproc: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let have_sed = common::have("sed", "install GNU sed");
    let have_tail = common::have("tail", "install coreutils");
    let dir = tempfile::tempdir().expect("temp dir");
    let (text, lines) = corpus_text();
    let ours_file = dir.path().join("ours.txt");
    let sed_file = dir.path().join("sed.txt");
    std::fs::write(&ours_file, &text).expect("write ours.txt");
    std::fs::write(&sed_file, &text).expect("write sed.txt");
    println!(
        "# file: {} bytes, {lines} lines, in {}",
        text.len(),
        dir.path().display()
    );
    drop(text);

    let rt = common::runtime();
    let set = td_tools::all_tools();
    let ctx = ToolContext::new(dir.path(), "bench").expect("context");
    let call = |name: &str, input: serde_json::Value| {
        let out = rt.block_on(set.call(&ctx, None, name, input));
        assert!(!out.is_error, "{name} failed: {}", out.content);
        out.content
    };
    let offset = lines - 99;
    let read = || {
        call(
            "read_file",
            json!({"path": "ours.txt", "offset": offset, "limit": 100}),
        )
    };

    // The read stamps the file, so the edits that follow are allowed.
    let shown = read();
    if have_tail {
        let tailed = String::from_utf8_lossy(&tail(&ours_file)).into_owned();
        let ours: Vec<&str> = shown
            .lines()
            .filter_map(|l| l.split_once('\t').map(|(_, t)| t))
            .collect();
        let theirs: Vec<&str> = tailed.lines().collect();
        println!(
            "# check: read_file and tail show {}the same {} lines",
            if ours == theirs { "" } else { "NOT " },
            theirs.len()
        );
    }

    let mut report = Report::new("edit");
    let n = rounds(15);

    let metric = "edit_10mb_ms";
    if common::selected(metric) {
        let mut ours_forward = true;
        let mut ours = || {
            let (from, to) = if ours_forward { (A, B) } else { (B, A) };
            ours_forward = !ours_forward;
            call(
                "edit_file",
                json!({"path": "ours.txt", "old_string": from, "new_string": to}),
            );
        };
        let mut sed_forward = true;
        let mut base = || {
            let (from, to) = if sed_forward { (A, B) } else { (B, A) };
            sed_forward = !sed_forward;
            sed(&sed_file, from, to);
        };
        let base = have_sed.then_some(&mut base as &mut dyn FnMut());
        let (o, b) = alternate(n, &mut ours, base);
        report.add(metric, o, b, TARGET);
        if have_sed {
            let same = std::fs::read(&ours_file).ok() == std::fs::read(&sed_file).ok();
            println!(
                "# check: after the edits ours.txt and sed.txt are {}identical",
                if same { "" } else { "NOT " }
            );
        }
    }

    // A file gets a read index only once it has been still for a moment (see read_file).
    std::thread::sleep(std::time::Duration::from_millis(250));
    read();
    let mut again = || {
        read();
    };
    // A loop that has not read the file yet: one new context per call, made beforehand.
    // A loop's context has long looked up its worktree's commit (the receipts' `commit`,
    // cached from its first call on), so that lookup is done here, untimed.
    let unread_context = || {
        let ctx = ToolContext::new(dir.path(), "bench-first").expect("context");
        ctx.worktree_commit();
        ctx
    };
    // Two metrics time first reads, each `n` rounds plus a warm-up call.
    let mut unread: Vec<ToolContext> = (0..2 * (n + 1)).map(|_| unread_context()).collect();
    let mut first = || {
        let fresh = unread.pop().unwrap_or_else(unread_context);
        let out = rt.block_on(set.call(
            &fresh,
            None,
            "read_file",
            json!({"path": "ours.txt", "offset": offset, "limit": 100}),
        ));
        assert!(!out.is_error, "read_file failed: {}", out.content);
    };
    let tail_only = || {
        tail(&sed_file);
    };
    // The least work read_file's contract allows: every byte read and hashed for the stamp
    // (with the same hash as ours), then the lines shown.
    let read_hash_tail = || {
        let bytes = std::fs::read(&sed_file).expect("read sed.txt");
        std::hint::black_box(Stamp::of(&bytes));
        tail(&sed_file);
    };
    let reads: [(&str, bool, Baseline); 3] = [
        (
            "read_last_100_lines_10mb_ms",
            have_tail,
            Box::new(tail_only),
        ),
        (
            "read_last_100_lines_first_read_10mb_ms",
            have_tail,
            Box::new(tail_only),
        ),
        (
            "read_last_100_lines_first_read_vs_read_hash_tail_ms",
            have_tail,
            Box::new(read_hash_tail),
        ),
    ];
    for (metric, available, mut base) in reads {
        if !common::selected(metric) {
            continue;
        }
        let base = available.then_some(&mut *base as &mut dyn FnMut());
        let ours: &mut dyn FnMut() = if metric.contains("first_read") {
            &mut first
        } else {
            &mut again
        };
        let (o, b) = alternate(n, ours, base);
        report.add(metric, o, b, TARGET);
    }

    report.finish();
}
