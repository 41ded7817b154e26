//! `cargo bench --bench grep`: the `grep` tool as a loop calls it (through
//! `ToolSet::call`: schema check, search, formatting, output cap, receipt) against the `rg`
//! binary over a large real corpus, warm, alternating the two.
//!
//! rg runs with the options that make it search what our tool searches and print what it
//! prints: `-n --no-heading`, ignore files of the tree only (`--no-require-git
//! --no-ignore-global --no-ignore-parent`), long lines cut to 500 bytes (`-M 500
//! --max-columns-preview`). Our result cap (the first 200 matching lines in path order) has
//! no rg flag (`-m` is per file); its closest equivalents are `rg ... | head -n 200`, which
//! stops rg early but takes whichever 200 lines come first, and `rg --sort path ... | head -n
//! 200`, the same lines as ours (rg then searches on one thread). Both are measured.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::json;
use td_toolkit::context::ToolContext;

use common::{Report, alternate, rounds, run_all, run_head};

/// Rare: a handful of files, so the whole corpus is read.
const RARE: &str = "Rc::downgrade";
/// Common: the default cap of 200 matching lines is reached early.
const COMMON: &str = "fn ";
const CAP: usize = 200;
const TARGET: f64 = 1.2;

fn rg(corpus: &std::path::Path, pattern: &str, sorted: bool) -> Command {
    let mut c = Command::new("rg");
    c.current_dir(corpus).args([
        "-n",
        "--no-heading",
        "--color",
        "never",
        "--no-require-git",
        "--no-ignore-global",
        "--no-ignore-parent",
        "-M",
        "500",
        "--max-columns-preview",
    ]);
    if sorted {
        c.args(["--sort", "path"]);
    }
    c.args(["-e", pattern]);
    c
}

/// `path:line` of every matching line in grep-style output.
fn locations(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let path = parts.next()?;
            let line = parts.next()?;
            line.parse::<u64>().ok()?;
            Some(format!("{path}:{line}"))
        })
        .collect()
}

fn main() {
    let Some(corpus) = common::corpus() else {
        println!(
            "# no corpus: neither the Rust docs (rustup component add rust-docs) nor ~/.cargo/registry/src exist; set BENCH_CORPUS"
        );
        return;
    };
    corpus.describe();
    println!(
        "# nproc: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let have_rg = common::have("rg", "install ripgrep, e.g. apt-get install ripgrep");
    let rt = common::runtime();
    let set = td_tools::all_tools();
    let ctx = ToolContext::new(&corpus.path, "bench").expect("corpus context");
    let call = |input: serde_json::Value| {
        let out = rt.block_on(set.call(&ctx, None, "grep", input));
        assert!(!out.is_error, "grep failed: {}", out.content);
        out.content
    };

    if have_rg {
        // Same files, same lines: otherwise the timing compares different work.
        let check = common::uncapped_context(&corpus.path);
        let full = |input| rt.block_on(set.call(&check, None, "grep", input)).content;
        let ours = locations(&full(json!({"pattern": RARE, "max_results": 5000})));
        let theirs = locations(&String::from_utf8_lossy(&run_all(&mut rg(
            &corpus.path,
            RARE,
            false,
        ))));
        if ours == theirs {
            println!(
                "# check: ours and rg find the same {} lines for '{RARE}'",
                ours.len()
            );
        } else {
            println!(
                "# check FAILED for '{RARE}': ours {} lines, rg {}; only ours: {:?}; only rg: {:?}",
                ours.len(),
                theirs.len(),
                ours.difference(&theirs).take(5).collect::<Vec<_>>(),
                theirs.difference(&ours).take(5).collect::<Vec<_>>()
            );
        }
        let ours = full(json!({"pattern": COMMON}));
        let theirs: String = run_head(&mut rg(&corpus.path, COMMON, true), CAP).concat();
        let (ours, theirs) = (locations(&ours), locations(&theirs));
        if ours == theirs {
            println!(
                "# check: ours and rg --sort path agree on the first {CAP} lines of '{COMMON}'"
            );
        } else {
            println!(
                "# check: the first {CAP} lines of '{COMMON}' DIFFER between ours and rg --sort path; only ours: {:?}; only rg: {:?}",
                ours.difference(&theirs).take(5).collect::<Vec<_>>(),
                theirs.difference(&ours).take(5).collect::<Vec<_>>()
            );
        }
    }

    let mut report = Report::new("grep");
    let dir = &corpus.path;

    let metric = "rare_full_scan_ms";
    if common::selected(metric) {
        let mut ours = || {
            call(json!({"pattern": RARE}));
        };
        let mut base = || {
            run_all(&mut rg(dir, RARE, false));
        };
        let base = have_rg.then_some(&mut base as &mut dyn FnMut());
        let (o, b) = alternate(rounds(9), &mut ours, base);
        report.add(metric, o, b, TARGET);
    }

    let mut ours = || {
        call(json!({"pattern": COMMON}));
    };
    for (metric, sorted) in [
        ("common_capped_vs_rg_head_ms", false),
        ("common_capped_vs_rg_sorted_head_ms", true),
    ] {
        if !common::selected(metric) {
            continue;
        }
        let mut base = || {
            run_head(&mut rg(dir, COMMON, sorted), CAP);
        };
        let base = have_rg.then_some(&mut base as &mut dyn FnMut());
        let (o, b) = alternate(rounds(21), &mut ours, base);
        report.add(metric, o, b, TARGET);
    }

    report.finish();
}
