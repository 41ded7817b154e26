//! `cargo bench --bench glob`: the `glob` tool as a loop calls it (through `ToolSet::call`,
//! default cap of 1000 paths, sorted) against `rg --files -g PATTERN` (all matching paths,
//! unsorted, read to the end), warm, alternating the two.
//!
//! rg gets the ignore options that match ours (`--no-require-git --no-ignore-global
//! --no-ignore-parent`). Both must walk the whole tree: ours lists the first 1000 paths in
//! sorted order, so it cannot stop early either.
//!
//! Corpora: `**/*.html` over the Rust docs and `**/*.rs` over the cargo registry sources,
//! each when present (`BENCH_CORPUS` replaces the first).

mod common;

use std::process::Command;

use serde_json::json;
use td_toolkit::context::ToolContext;

use common::{Corpus, Report, alternate, rounds, run_all};

const TARGET: f64 = 1.2;

fn rg_files(corpus: &std::path::Path, pattern: &str) -> Command {
    let mut c = Command::new("rg");
    c.current_dir(corpus).args([
        "--files",
        "--no-require-git",
        "--no-ignore-global",
        "--no-ignore-parent",
        "-g",
        pattern,
    ]);
    c
}

/// How many paths a glob answer stands for: the listed ones plus the "N more" note.
fn total(content: &str) -> usize {
    let listed = content.lines().filter(|l| !l.starts_with('[')).count();
    let more = content
        .lines()
        .find_map(|l| {
            l.strip_prefix('[')?
                .split(' ')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .unwrap_or(0);
    listed + more
}

fn bench(report: &mut Report, corpus: &Corpus, pattern: &str, metric: &str, have_rg: bool) {
    if !common::selected(metric) {
        return;
    }
    corpus.describe();
    let rt = common::runtime();
    let set = td_tools::all_tools();
    let ctx = ToolContext::new(&corpus.path, "bench").expect("corpus context");
    let call = || {
        let out = rt.block_on(set.call(&ctx, None, "glob", json!({"pattern": pattern})));
        assert!(!out.is_error, "glob failed: {}", out.content);
        out.content
    };
    if have_rg {
        let check = common::uncapped_context(&corpus.path);
        let input = json!({"pattern": pattern, "max_results": 10_000});
        let out = rt.block_on(set.call(&check, None, "glob", input));
        let ours = total(&out.content);
        let theirs = run_all(&mut rg_files(&corpus.path, pattern))
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        println!(
            "# check '{pattern}': ours {ours} files, rg {theirs} files{}",
            if ours == theirs { "" } else { " (DIFFER)" }
        );
    }
    let dir = &corpus.path;
    let mut ours = || {
        call();
    };
    let mut base = || {
        run_all(&mut rg_files(dir, pattern));
    };
    let (o, b) = alternate(
        rounds(11),
        &mut ours,
        have_rg.then_some(&mut base as &mut dyn FnMut()),
    );
    report.add(metric, o, b, TARGET);
}

fn main() {
    println!(
        "# nproc: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let have_rg = common::have("rg", "install ripgrep, e.g. apt-get install ripgrep");
    let mut report = Report::new("glob");
    let mut any = false;
    if let Some(c) = std::env::var_os("BENCH_CORPUS").and_then(|_| common::corpus()) {
        bench(
            &mut report,
            &c,
            "**/*.html",
            "html_in_bench_corpus_ms",
            have_rg,
        );
        any = true;
    } else if let Some(c) = common::rust_docs() {
        bench(&mut report, &c, "**/*.html", "html_in_docs_ms", have_rg);
        any = true;
    }
    if let Some(c) = common::cargo_registry() {
        bench(
            &mut report,
            &c,
            "**/*.rs",
            "rs_in_cargo_registry_ms",
            have_rg,
        );
        any = true;
    }
    if !any {
        println!(
            "# no corpus: neither the Rust docs (rustup component add rust-docs) nor ~/.cargo/registry/src exist; set BENCH_CORPUS"
        );
        return;
    }
    report.finish();
}
