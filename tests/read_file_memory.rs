//! read_file keeps memory bounded on huge files: it streams the file for the stamp and the
//! line count and keeps only the window it shows. Alone in its own test binary, because
//! peak memory (`VmHWM`) is per process and other tests would disturb it.

use std::io::Write as _;
use std::os::unix::fs::FileExt as _;

use serde_json::json;
use td_toolkit::context::ToolContext;
use td_toolkit::stamp::StampHasher;
use td_toolkit::tool::Tool;
use td_tools::files::read_file::ReadFile;

/// Size of the test file: far beyond any cap, yet quick to create as a sparse file.
const FILE_BYTES: u64 = 200 * 1024 * 1024;

/// Distance between the line breaks written into the sparse part.
const LINE_EVERY: u64 = 1024 * 1024;

/// A memory figure of this process from /proc/self/status, in KiB: `VmRSS` (resident now)
/// or `VmHWM` (peak resident).
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Resets the peak to what is resident now (Linux 4.0+), so that the next `VmHWM` is the
/// peak of what runs from here on, not of whatever came before. Returns the resident size
/// the peak starts from: if the reset is refused, measuring against the current size still
/// bounds the growth from above.
fn reset_peak_kib() -> u64 {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    status_kib("VmRSS:")
}

/// A 200 MiB file made in milliseconds: 20 KiB of numbered text lines, then a hole (read
/// back as NUL characters, valid UTF-8 after the first 8 KiB) cut into 1 MiB lines.
/// Returns how many text lines come before the hole.
fn sparse_text_file(path: &std::path::Path) -> usize {
    let mut f = std::fs::File::create(path).unwrap();
    let mut head = String::new();
    let mut i = 1;
    while head.len() < 20 * 1024 {
        head.push_str(&format!("line {i}: some text to read\n"));
        i += 1;
    }
    f.write_all(head.as_bytes()).unwrap();
    f.set_len(FILE_BYTES).unwrap();
    let mut at = LINE_EVERY;
    while at < FILE_BYTES {
        f.write_all_at(b"\n", at).unwrap();
        at += LINE_EVERY;
    }
    f.write_all_at(b"\nthe end\n", FILE_BYTES - 9).unwrap();
    i - 1
}

#[test]
fn reading_a_200_mb_file_keeps_peak_memory_near_the_output_cap() {
    // One blocking thread, reused by every call: a fresh thread (its stack, its allocator
    // arena) would show up in the peak without being the tool's memory.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(measure());
}

async fn measure() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = ToolContext::new(dir.path(), "memory").unwrap();
    let cap = ctx.spec("read_file").max_output_bytes as u64;
    std::fs::write(dir.path().join("small.txt"), "warm up\n").unwrap();
    let big = dir.path().join("big.txt");
    let text_lines = sparse_text_file(&big) as u64;

    // The first call sets up the runtime's blocking thread and the allocator's arenas,
    // which are not what is measured.
    ReadFile
        .execute(json!({"path": "small.txt"}), &ctx)
        .await
        .unwrap();
    let before = reset_peak_kib();
    let out = ReadFile
        .execute(json!({"path": "big.txt"}), &ctx)
        .await
        .unwrap();
    let after = status_kib("VmHWM:");
    let grown = after.saturating_sub(before);
    eprintln!("peak RSS {before} KiB -> {after} KiB (+{grown} KiB); output cap {cap} bytes");

    let c = &out.content;
    assert!(
        c.starts_with("     1\tline 1: some text to read\n"),
        "{}",
        &c[..200]
    );
    // The 1 MiB lines after the text are cut as they stream by, never held whole.
    let cut = format!("[... line cut: {} more characters]", LINE_EVERY - 1 - 2000);
    assert!(
        c.contains(&format!("{:>6}\t", text_lines + 2)),
        "{}",
        &c[c.len() - 300..]
    );
    assert!(c.contains(&cut), "{}", &c[c.len() - 300..]);
    let note = format!("[Output limit of {cap} bytes reached: showing lines 1-");
    assert!(c.contains(&note), "{}", &c[c.len() - 300..]);
    assert!(c.len() as u64 <= cap);
    // The stamp covers all 200 MiB, so an edit can trust it.
    let mut expected = StampHasher::default();
    let mut file = std::fs::File::open(&big).unwrap();
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = std::io::Read::read(&mut file, &mut chunk).unwrap();
        if n == 0 {
            break;
        }
        expected.update(&chunk[..n]);
    }
    let stamp = ctx.stamp(&big.canonicalize().unwrap()).expect("a stamp");
    assert_eq!(stamp, expected.finish());
    assert!(
        grown * 1024 < 2 * cap,
        "reading {FILE_BYTES} bytes raised peak memory by {grown} KiB; the bound is twice the {cap}-byte cap"
    );
}
