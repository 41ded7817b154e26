//! `symbols`: a regex-based outline (functions, types, constants...) of a file or of every
//! source file of a recognised language under a directory.
//!
//! Each language has a small grammar: line regexes (compiled once, plus a `RegexSet` that
//! rejects most lines in one pass) and a scope stack driven by indentation. Indentation
//! stands in for nesting, which holds for formatted code: a function indented under a
//! `class`/`impl`/`trait` is a method, one under another function stays a function. It is
//! an outline for finding code, not a parser; odd formatting can mislabel a symbol.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use ignore::{DirEntry, WalkState};
use regex::{Regex, RegexSet};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::files::read_file::open_for_reading;
use crate::search::walk;
use td_base::text::{count, floor_char_boundary};
use td_toolkit::args;
use td_toolkit::context::ToolContext;
use td_toolkit::error::{ToolError, ToolResult, display_path};
use td_toolkit::tool::{Tool, ToolOutput};
use td_toolkit::worktree_fs::OpenedFile;

const TOOL: &str = "symbols";
const DEFAULT_MAX: u64 = 500;
const MAX_MAX: u64 = 5000;
/// Larger files are almost always generated or vendored; outlining them costs more than it
/// tells.
const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// Longest signature shown.
const MAX_SIGNATURE_BYTES: usize = 160;

/// Every kind a symbol can have, as accepted by the `kind` filter.
pub const KINDS: &[&str] = &[
    "function",
    "method",
    "struct",
    "class",
    "enum",
    "trait",
    "interface",
    "type",
    "const",
    "module",
    "macro",
    "impl",
];

/// The `symbols` tool.
pub struct Symbols;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SymbolsArgs {
    #[serde(default = "default_path")]
    path: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default = "default_max")]
    max_results: u64,
}

fn default_path() -> String {
    ".".to_string()
}

fn default_max() -> u64 {
    DEFAULT_MAX
}

/// One line regex of a grammar.
struct Rule {
    kind: &'static str,
    re: Regex,
    /// Whether the symbol opens a scope that later, more indented lines belong to.
    scope: bool,
    /// When not empty, the rule applies only directly inside a scope of one of these kinds.
    only_in: &'static [&'static str],
}

/// How to outline one language.
struct Grammar {
    set: RegexSet,
    rules: Vec<Rule>,
    /// Scopes whose functions are methods.
    method_scopes: &'static [&'static str],
    /// Line starts that mark a comment (such lines neither define nor close anything).
    comments: &'static [&'static str],
    /// Line starts that may define a symbol but never close a scope, whatever their
    /// indentation (C preprocessor lines and C++ access labels sit at column 0 in bodies).
    keep_scope: &'static [&'static str],
}

type RuleSpec = (&'static str, &'static str, bool, &'static [&'static str]);

fn grammar(
    specs: &[RuleSpec],
    method_scopes: &'static [&'static str],
    comments: &'static [&'static str],
) -> Grammar {
    // The patterns are constants of this file; `every_grammar_compiles` covers them all.
    let rules: Vec<Rule> = specs
        .iter()
        .map(|&(kind, pattern, scope, only_in)| Rule {
            kind,
            re: Regex::new(pattern).unwrap_or_else(|e| panic!("symbols regex {pattern}: {e}")),
            scope,
            only_in,
        })
        .collect();
    let set = RegexSet::new(specs.iter().map(|s| s.1))
        .unwrap_or_else(|e| panic!("symbols regex set: {e}"));
    Grammar {
        set,
        rules,
        method_scopes,
        comments,
        keep_scope: NONE,
    }
}

const C_COMMENTS: &[&str] = &["//", "/*", "*"];
const HASH_COMMENTS: &[&str] = &["#"];
const NONE: &[&str] = &[];

static RUST: LazyLock<Grammar> = LazyLock::new(|| {
    grammar(
        &[
            (
                "function",
                r#"^\s*(?:pub(?:\s*\([^)]*\))?\s+)?(?:default\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+(?:"[^"]*"\s+)?)?fn\s+(?P<name>[A-Za-z_]\w*)"#,
                true,
                NONE,
            ),
            (
                "struct",
                r"^\s*(?:pub(?:\s*\([^)]*\))?\s+)?struct\s+(?P<name>[A-Za-z_]\w*)",
                false,
                NONE,
            ),
            (
                "enum",
                r"^\s*(?:pub(?:\s*\([^)]*\))?\s+)?enum\s+(?P<name>[A-Za-z_]\w*)",
                false,
                NONE,
            ),
            (
                "type",
                r"^\s*(?:pub(?:\s*\([^)]*\))?\s+)?union\s+(?P<name>[A-Za-z_]\w*)\s*[<{]",
                false,
                NONE,
            ),
            (
                "trait",
                r"^\s*(?:pub(?:\s*\([^)]*\))?\s+)?(?:unsafe\s+)?(?:auto\s+)?trait\s+(?P<name>[A-Za-z_]\w*)",
                true,
                NONE,
            ),
            (
                "impl",
                r"^\s*(?:unsafe\s+)?impl\b(?:\s*<(?:[^<>]|<(?:[^<>]|<[^<>]*>)*>)*>)?\s+(?:!?[\w:]+(?:<(?:[^<>]|<(?:[^<>]|<[^<>]*>)*>)*>)?\s+for\s+)?(?:&\s*(?:'\w+\s+)?(?:mut\s+)?)?(?:dyn\s+)?(?P<name>[A-Za-z_][\w:]*)",
                true,
                NONE,
            ),
            (
                "type",
                r"^\s*(?:pub(?:\s*\([^)]*\))?\s+)?type\s+(?P<name>[A-Za-z_]\w*)",
                false,
                NONE,
            ),
            (
                "const",
                r"^\s*(?:pub(?:\s*\([^)]*\))?\s+)?(?:const|static)\s+(?:mut\s+)?(?P<name>[A-Za-z_]\w*)\s*:",
                false,
                NONE,
            ),
            (
                "module",
                r"^\s*(?:pub(?:\s*\([^)]*\))?\s+)?mod\s+(?P<name>[A-Za-z_]\w*)",
                true,
                NONE,
            ),
            (
                "macro",
                r"^\s*macro_rules!\s*(?P<name>[A-Za-z_]\w*)",
                false,
                NONE,
            ),
        ],
        &["impl", "trait"],
        C_COMMENTS,
    )
});

static PYTHON: LazyLock<Grammar> = LazyLock::new(|| {
    grammar(
        &[
            (
                "function",
                r"^\s*(?:async\s+)?def\s+(?P<name>[A-Za-z_]\w*)",
                true,
                NONE,
            ),
            ("class", r"^\s*class\s+(?P<name>[A-Za-z_]\w*)", true, NONE),
            (
                "const",
                r"^(?P<name>[A-Z][A-Z0-9_]*)\s*(?::[^=]*)?=(?:[^=]|$)",
                false,
                NONE,
            ),
        ],
        &["class"],
        HASH_COMMENTS,
    )
});

const JS_COMMON: &[RuleSpec] = &[
    (
        "function",
        r"^\s*(?:export\s+)?(?:default\s+)?(?:declare\s+)?(?:async\s+)?function\s*\*?\s*(?P<name>[A-Za-z_$][\w$]*)",
        true,
        NONE,
    ),
    (
        "class",
        r"^\s*(?:export\s+)?(?:default\s+)?(?:declare\s+)?(?:abstract\s+)?class\s+(?P<name>[A-Za-z_$][\w$]*)",
        true,
        NONE,
    ),
    (
        "function",
        r"^\s*(?:export\s+)?(?:const|let|var)\s+(?P<name>[A-Za-z_$][\w$]*)\s*(?::[^=]+)?=\s*(?:async\s+)?(?:function\b|(?:\([^)]*\)|[A-Za-z_$][\w$]*)\s*(?::[^=]+)?=>)",
        true,
        NONE,
    ),
    (
        "const",
        r"^(?:export\s+)?const\s+(?P<name>[A-Z][A-Z0-9_]*)\s*(?::[^=]+)?=",
        false,
        NONE,
    ),
    (
        "method",
        r"^\s+(?:(?:public|private|protected|static|async|readonly|override|abstract|get|set|declare)\s+)*\*?(?P<name>#?[A-Za-z_$][\w$]*)\s*(?:<[^>]*>)?\s*\((?:[^)]*\)\s*(?::\s*[^{;=]+)?\{.*|[^)]*)$",
        true,
        &["class"],
    ),
    (
        "method",
        r"^\s+(?:(?:public|private|protected|static|readonly|override)\s+)*(?P<name>#?[A-Za-z_$][\w$]*)\s*(?::[^=]+)?=\s*(?:async\s+)?(?:\([^)]*\)|[A-Za-z_$][\w$]*)\s*(?::[^=]+)?=>",
        true,
        &["class"],
    ),
];

static JAVASCRIPT: LazyLock<Grammar> = LazyLock::new(|| grammar(JS_COMMON, &["class"], C_COMMENTS));

static TYPESCRIPT: LazyLock<Grammar> = LazyLock::new(|| {
    let mut specs: Vec<RuleSpec> = JS_COMMON.to_vec();
    specs.extend_from_slice(&[
        (
            "interface",
            r"^\s*(?:export\s+)?(?:default\s+)?(?:declare\s+)?interface\s+(?P<name>[A-Za-z_$][\w$]*)",
            true,
            NONE,
        ),
        (
            "type",
            r"^\s*(?:export\s+)?(?:declare\s+)?type\s+(?P<name>[A-Za-z_$][\w$]*)\s*(?:<.*>)?\s*=",
            false,
            NONE,
        ),
        (
            "enum",
            r"^\s*(?:export\s+)?(?:declare\s+)?(?:const\s+)?enum\s+(?P<name>[A-Za-z_$][\w$]*)",
            true,
            NONE,
        ),
        (
            "module",
            r"^\s*(?:export\s+)?(?:declare\s+)?(?:namespace|module)\s+(?P<name>[A-Za-z_$][\w$.]*)",
            true,
            NONE,
        ),
    ]);
    grammar(&specs, &["class"], C_COMMENTS)
});

static GO: LazyLock<Grammar> = LazyLock::new(|| {
    grammar(
        &[
            (
                "method",
                r"^func\s*\([^)]*\)\s*(?P<name>[A-Za-z_]\w*)",
                false,
                NONE,
            ),
            ("function", r"^func\s+(?P<name>[A-Za-z_]\w*)", false, NONE),
            (
                "struct",
                r"^type\s+(?P<name>[A-Za-z_]\w*)(?:\[[^\]]*\])?\s+struct\b",
                false,
                NONE,
            ),
            (
                "interface",
                r"^type\s+(?P<name>[A-Za-z_]\w*)(?:\[[^\]]*\])?\s+interface\b",
                false,
                NONE,
            ),
            ("type", r"^type\s+(?P<name>[A-Za-z_]\w*)", false, NONE),
            ("const", r"^const\s+(?P<name>[A-Za-z_]\w*)", false, NONE),
        ],
        NONE,
        C_COMMENTS,
    )
});

const JAVA_MODS: &str = r"(?:@\w+(?:\([^)]*\))?\s+)*(?:(?:public|protected|private|static|final|abstract|sealed|non-sealed|strictfp|default|synchronized|native)\s+)*";

static JAVA: LazyLock<Grammar> = LazyLock::new(|| {
    let class = format!(r"^\s*{JAVA_MODS}(?:class|record)\s+(?P<name>[A-Za-z_$][\w$]*)");
    let interface = format!(r"^\s*{JAVA_MODS}@?interface\s+(?P<name>[A-Za-z_$][\w$]*)");
    let enumeration = format!(r"^\s*{JAVA_MODS}enum\s+(?P<name>[A-Za-z_$][\w$]*)");
    let method = format!(
        r"^\s+{JAVA_MODS}(?:<[^>]+>\s+)?(?:[\w$.\[\]<>,?]+\s+)?(?P<name>[A-Za-z_$][\w$]*)\s*\("
    );
    let specs: Vec<RuleSpec> = vec![
        ("class", leak(class), true, NONE),
        ("interface", leak(interface), true, NONE),
        ("enum", leak(enumeration), true, NONE),
        (
            "method",
            leak(method),
            true,
            &["class", "interface", "enum"],
        ),
    ];
    grammar(&specs, &["class", "interface", "enum"], C_COMMENTS)
});

const CS_MODS: &str = r"(?:\[[^\]]*\]\s*)*(?:(?:public|private|protected|internal|static|virtual|override|abstract|sealed|async|partial|readonly|extern|unsafe|new|ref)\s+)*";

static CSHARP: LazyLock<Grammar> = LazyLock::new(|| {
    let specs: Vec<RuleSpec> = vec![
        (
            "class",
            leak(format!(
                r"^\s*{CS_MODS}(?:class|record(?:\s+class)?)\s+(?P<name>[A-Za-z_]\w*)"
            )),
            true,
            NONE,
        ),
        (
            "struct",
            leak(format!(
                r"^\s*{CS_MODS}(?:record\s+)?struct\s+(?P<name>[A-Za-z_]\w*)"
            )),
            true,
            NONE,
        ),
        (
            "interface",
            leak(format!(r"^\s*{CS_MODS}interface\s+(?P<name>[A-Za-z_]\w*)")),
            true,
            NONE,
        ),
        (
            "enum",
            leak(format!(r"^\s*{CS_MODS}enum\s+(?P<name>[A-Za-z_]\w*)")),
            true,
            NONE,
        ),
        ("module", r"^\s*namespace\s+(?P<name>[\w.]+)", true, NONE),
        (
            "method",
            leak(format!(
                r"^\s+{CS_MODS}(?:[\w.\[\]<>,?]+\s+)?(?P<name>[A-Za-z_]\w*)\s*(?:<[^>]*>)?\s*\("
            )),
            true,
            &["class", "struct", "interface"],
        ),
    ];
    grammar(&specs, &["class", "struct", "interface"], C_COMMENTS)
});

const KT_MODS: &str = r"(?:@\w+(?:\([^)]*\))?\s+)*(?:(?:public|private|protected|internal|open|abstract|override|final|suspend|inline|data|sealed|annotation|inner|operator|infix|tailrec|external|value|expect|actual|lateinit)\s+)*";

static KOTLIN: LazyLock<Grammar> = LazyLock::new(|| {
    let specs: Vec<RuleSpec> = vec![
        (
            "function",
            leak(format!(
                r"^\s*{KT_MODS}fun\s+(?:<[^>]*>\s*)?(?:[\w.<>]+\.)?(?P<name>[A-Za-z_]\w*)"
            )),
            true,
            NONE,
        ),
        (
            "enum",
            leak(format!(
                r"^\s*{KT_MODS}enum\s+class\s+(?P<name>[A-Za-z_]\w*)"
            )),
            true,
            NONE,
        ),
        (
            "interface",
            leak(format!(
                r"^\s*{KT_MODS}(?:fun\s+)?interface\s+(?P<name>[A-Za-z_]\w*)"
            )),
            true,
            NONE,
        ),
        (
            "class",
            leak(format!(
                r"^\s*{KT_MODS}(?:class|(?:companion\s+)?object)\s+(?P<name>[A-Za-z_]\w*)"
            )),
            true,
            NONE,
        ),
        (
            "type",
            leak(format!(r"^\s*{KT_MODS}typealias\s+(?P<name>[A-Za-z_]\w*)")),
            false,
            NONE,
        ),
        (
            "const",
            leak(format!(
                r"^\s*{KT_MODS}const\s+val\s+(?P<name>[A-Za-z_]\w*)"
            )),
            false,
            NONE,
        ),
    ];
    grammar(&specs, &["class", "interface", "enum"], C_COMMENTS)
});

const SWIFT_MODS: &str = r"(?:@\w+(?:\([^)]*\))?\s+)*(?:(?:public|private|fileprivate|internal|open|static|class|final|override|mutating|nonmutating|convenience|required)\s+)*";

static SWIFT: LazyLock<Grammar> = LazyLock::new(|| {
    let specs: Vec<RuleSpec> = vec![
        (
            "function",
            leak(format!(r"^\s*{SWIFT_MODS}func\s+(?P<name>[^\s(<]+)")),
            true,
            NONE,
        ),
        (
            "class",
            leak(format!(
                r"^\s*{SWIFT_MODS}(?:class|actor)\s+(?P<name>[A-Za-z_]\w*)"
            )),
            true,
            NONE,
        ),
        (
            "struct",
            leak(format!(r"^\s*{SWIFT_MODS}struct\s+(?P<name>[A-Za-z_]\w*)")),
            true,
            NONE,
        ),
        (
            "enum",
            leak(format!(
                r"^\s*{SWIFT_MODS}(?:indirect\s+)?enum\s+(?P<name>[A-Za-z_]\w*)"
            )),
            true,
            NONE,
        ),
        (
            "interface",
            leak(format!(
                r"^\s*{SWIFT_MODS}protocol\s+(?P<name>[A-Za-z_]\w*)"
            )),
            true,
            NONE,
        ),
        (
            "impl",
            leak(format!(
                r"^\s*{SWIFT_MODS}extension\s+(?P<name>[A-Za-z_][\w.]*)"
            )),
            true,
            NONE,
        ),
        (
            "type",
            leak(format!(
                r"^\s*{SWIFT_MODS}typealias\s+(?P<name>[A-Za-z_]\w*)"
            )),
            false,
            NONE,
        ),
    ];
    grammar(
        &specs,
        &["class", "struct", "enum", "interface", "impl"],
        C_COMMENTS,
    )
});

const SCALA_MODS: &str = r"(?:@\w+(?:\([^)]*\))?\s+)*(?:(?:private|protected|final|sealed|abstract|implicit|override|lazy|case|inline|open)(?:\[[^\]]*\])?\s+)*";

static SCALA: LazyLock<Grammar> = LazyLock::new(|| {
    let specs: Vec<RuleSpec> = vec![
        (
            "function",
            leak(format!(r"^\s*{SCALA_MODS}def\s+(?P<name>[^\s(\[:=]+)")),
            true,
            NONE,
        ),
        (
            "class",
            leak(format!(r"^\s*{SCALA_MODS}class\s+(?P<name>[A-Za-z_]\w*)")),
            true,
            NONE,
        ),
        (
            "module",
            leak(format!(r"^\s*{SCALA_MODS}object\s+(?P<name>[A-Za-z_]\w*)")),
            true,
            NONE,
        ),
        (
            "trait",
            leak(format!(r"^\s*{SCALA_MODS}trait\s+(?P<name>[A-Za-z_]\w*)")),
            true,
            NONE,
        ),
        (
            "enum",
            leak(format!(r"^\s*{SCALA_MODS}enum\s+(?P<name>[A-Za-z_]\w*)")),
            true,
            NONE,
        ),
        (
            "type",
            leak(format!(r"^\s*{SCALA_MODS}type\s+(?P<name>[A-Za-z_]\w*)")),
            false,
            NONE,
        ),
    ];
    grammar(&specs, &["class", "module", "trait", "enum"], C_COMMENTS)
});

/// Rules shared by C and C++.
const C_RULES: &[RuleSpec] = &[
    (
        "macro",
        r"^\s*#\s*define\s+(?P<name>[A-Za-z_]\w*)",
        false,
        NONE,
    ),
    (
        "struct",
        r"^\s*(?:typedef\s+)?struct\s+(?P<name>[A-Za-z_]\w*)\s*(?:final\s*)?(?::[^;]*)?(?:\{.*)?$",
        true,
        NONE,
    ),
    (
        "enum",
        r"^\s*(?:typedef\s+)?enum\s+(?:class\s+|struct\s+)?(?P<name>[A-Za-z_]\w*)\s*(?::\s*[\w:]+\s*)?(?:\{.*)?$",
        false,
        NONE,
    ),
    (
        "type",
        r"^\s*(?:typedef\s+)?union\s+(?P<name>[A-Za-z_]\w*)\s*(?:\{.*)?$",
        false,
        NONE,
    ),
    (
        "type",
        r"^\s*typedef\s+[^;()]*?\b(?P<name>[A-Za-z_]\w*)\s*;",
        false,
        NONE,
    ),
    ("type", r"^\}\s*(?P<name>[A-Za-z_]\w*)\s*;", false, NONE),
    (
        "function",
        r"^[A-Za-z_][\w\s*&:<>,]*?[\s*&]+(?P<name>[A-Za-z_~][\w:~]*)\s*\([^;]*$",
        true,
        NONE,
    ),
];

/// C and C++ lines that stay inside the enclosing scope even at column 0.
const C_KEEP_SCOPE: &[&str] = &[
    "#",
    "public:",
    "private:",
    "protected:",
    "signals:",
    "slots:",
];

static C: LazyLock<Grammar> = LazyLock::new(|| Grammar {
    keep_scope: C_KEEP_SCOPE,
    ..grammar(C_RULES, NONE, C_COMMENTS)
});

static CPP: LazyLock<Grammar> = LazyLock::new(|| {
    let mut specs: Vec<RuleSpec> = vec![
        (
            "class",
            r"^\s*(?:template\s*<.*>\s*)?class\s+(?:[A-Z_][A-Z0-9_]*\s+)?(?P<name>[A-Za-z_]\w*)\s*(?:final\s*)?(?::[^;]*)?(?:\{.*)?$",
            true,
            NONE,
        ),
        (
            "module",
            r"^\s*(?:inline\s+)?namespace\s+(?P<name>[A-Za-z_][\w:]*)",
            true,
            NONE,
        ),
        (
            "method",
            r"^\s+(?:(?:virtual|static|inline|explicit|constexpr|friend)\s+)*(?:[\w:<>,*&]+[\s*&]+)?(?P<name>~?[A-Za-z_]\w*)\s*\(",
            true,
            &["class", "struct"],
        ),
    ];
    specs.extend_from_slice(C_RULES);
    Grammar {
        keep_scope: C_KEEP_SCOPE,
        ..grammar(&specs, &["class", "struct"], C_COMMENTS)
    }
});

static RUBY: LazyLock<Grammar> = LazyLock::new(|| {
    grammar(
        &[
            (
                "function",
                r"^\s*def\s+(?:self\.)?(?P<name>[A-Za-z_]\w*[?!=]?|\[\]=?|[-+*/%<>=!~^&|]+)",
                true,
                NONE,
            ),
            ("class", r"^\s*class\s+(?P<name>[A-Z][\w:]*)", true, NONE),
            ("module", r"^\s*module\s+(?P<name>[A-Z][\w:]*)", true, NONE),
            (
                "const",
                r"^\s*(?P<name>[A-Z][A-Z0-9_]*)\s*=(?:[^=]|$)",
                false,
                NONE,
            ),
        ],
        &["class", "module"],
        HASH_COMMENTS,
    )
});

static PHP: LazyLock<Grammar> = LazyLock::new(|| {
    grammar(
        &[
            (
                "function",
                r"^\s*(?:(?:public|private|protected|static|abstract|final)\s+)*function\s+&?(?P<name>[A-Za-z_]\w*)",
                true,
                NONE,
            ),
            (
                "class",
                r"^\s*(?:(?:abstract|final|readonly)\s+)*class\s+(?P<name>[A-Za-z_]\w*)",
                true,
                NONE,
            ),
            (
                "interface",
                r"^\s*interface\s+(?P<name>[A-Za-z_]\w*)",
                true,
                NONE,
            ),
            ("trait", r"^\s*trait\s+(?P<name>[A-Za-z_]\w*)", true, NONE),
            ("enum", r"^\s*enum\s+(?P<name>[A-Za-z_]\w*)", true, NONE),
            (
                "const",
                r"^\s*(?:(?:public|private|protected|final)\s+)*const\s+(?P<name>[A-Za-z_]\w*)",
                false,
                NONE,
            ),
        ],
        &["class", "interface", "trait", "enum"],
        &["//", "/*", "*", "#"],
    )
});

static LUA: LazyLock<Grammar> = LazyLock::new(|| {
    grammar(
        &[
            (
                "function",
                r"^\s*(?:local\s+)?function\s+(?P<name>[A-Za-z_][\w.:]*)",
                true,
                NONE,
            ),
            (
                "function",
                r"^\s*(?:local\s+)?(?P<name>[A-Za-z_][\w.]*)\s*=\s*function\b",
                true,
                NONE,
            ),
        ],
        NONE,
        &["--"],
    )
});

static SHELL: LazyLock<Grammar> = LazyLock::new(|| {
    grammar(
        &[
            (
                "function",
                r"^\s*function\s+(?P<name>[A-Za-z_][\w.:-]*)",
                false,
                NONE,
            ),
            (
                "function",
                r"^\s*(?P<name>[A-Za-z_][\w.:-]*)\s*\(\)",
                false,
                NONE,
            ),
        ],
        NONE,
        HASH_COMMENTS,
    )
});

static ELIXIR: LazyLock<Grammar> = LazyLock::new(|| {
    grammar(
        &[
            (
                "module",
                r"^\s*defmodule\s+(?P<name>[A-Z][\w.]*)",
                true,
                NONE,
            ),
            (
                "macro",
                r"^\s*defmacrop?\s+(?P<name>[A-Za-z_]\w*[?!]?)",
                true,
                NONE,
            ),
            (
                "function",
                r"^\s*defp?\s+(?P<name>[A-Za-z_]\w*[?!]?)",
                true,
                NONE,
            ),
        ],
        NONE,
        HASH_COMMENTS,
    )
});

/// Grammar patterns built with `format!` must live as long as the static grammar; they are
/// created once per process.
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Languages (as named by `lang::guess`) this tool can outline.
pub const LANGUAGES: &[&str] = &[
    "rust",
    "python",
    "javascript",
    "typescript",
    "go",
    "java",
    "csharp",
    "kotlin",
    "swift",
    "scala",
    "c",
    "cpp",
    "ruby",
    "php",
    "lua",
    "shell",
    "elixir",
];

fn grammar_for(lang: &str) -> Option<&'static Grammar> {
    Some(match lang {
        "rust" => &*RUST,
        "python" => &*PYTHON,
        "javascript" => &*JAVASCRIPT,
        "typescript" => &*TYPESCRIPT,
        "go" => &*GO,
        "java" => &*JAVA,
        "csharp" => &*CSHARP,
        "kotlin" => &*KOTLIN,
        "swift" => &*SWIFT,
        "scala" => &*SCALA,
        "c" => &*C,
        "cpp" => &*CPP,
        "ruby" => &*RUBY,
        "php" => &*PHP,
        "lua" => &*LUA,
        "shell" => &*SHELL,
        "elixir" => &*ELIXIR,
        _ => return None,
    })
}

fn grammar_for_path(path: &Path) -> Option<&'static Grammar> {
    crate::search::lang::guess(path).and_then(grammar_for)
}

/// Words that look like a call or a definition to a line regex but never name a symbol.
const KEYWORDS: &[&str] = &[
    "if", "else", "for", "while", "switch", "catch", "return", "do", "throw", "sizeof", "typeof",
    "case", "try", "foreach", "elif", "when", "using", "lock", "defined",
];

/// One symbol found.
#[derive(Debug, Clone, PartialEq)]
struct Symbol {
    line: usize,
    kind: &'static str,
    name: String,
    signature: String,
}

/// Filters applied while outlining.
struct Filter {
    name: Option<Regex>,
    kind: Option<String>,
}

impl Filter {
    fn keeps(&self, kind: &str, name: &str) -> bool {
        self.kind.as_deref().is_none_or(|k| k == kind)
            && self.name.as_ref().is_none_or(|re| re.is_match(name))
    }
}

fn indent_width(line: &str) -> usize {
    line.chars()
        .take_while(|c| c.is_whitespace())
        .map(|c| if c == '\t' { 4 } else { 1 })
        .sum()
}

fn signature(line: &str) -> String {
    let s = line.trim();
    let s = s.strip_suffix('{').unwrap_or(s).trim_end();
    if s.len() <= MAX_SIGNATURE_BYTES {
        s.to_string()
    } else {
        format!("{}...", &s[..floor_char_boundary(s, MAX_SIGNATURE_BYTES)])
    }
}

/// The symbols of `text` written in the language of `g`, in line order.
fn outline(text: &str, g: &Grammar, filter: &Filter) -> Vec<Symbol> {
    let mut out = Vec::new();
    let mut scopes: Vec<(usize, &'static str)> = Vec::new();
    for (idx, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || g.comments.iter().any(|c| trimmed.starts_with(c)) {
            continue;
        }
        let indent = indent_width(line);
        if !g.keep_scope.iter().any(|k| trimmed.starts_with(k)) {
            while scopes.last().is_some_and(|&(i, _)| i >= indent) {
                scopes.pop();
            }
        }
        if !g.set.is_match(line) {
            continue;
        }
        let inside = scopes.last().map(|&(_, k)| k);
        for rule_idx in g.set.matches(line).iter() {
            let Some(rule) = g.rules.get(rule_idx) else {
                continue;
            };
            if !rule.only_in.is_empty() && !inside.is_some_and(|k| rule.only_in.contains(&k)) {
                continue;
            }
            let Some(name) = rule
                .re
                .captures(line)
                .and_then(|c| c.name("name"))
                .map(|m| m.as_str())
            else {
                continue;
            };
            if KEYWORDS.contains(&name) {
                continue;
            }
            let kind = if rule.kind == "function"
                && (inside.is_some_and(|k| g.method_scopes.contains(&k)) || name.contains("::"))
            {
                "method"
            } else {
                rule.kind
            };
            if rule.scope {
                scopes.push((indent, kind));
            }
            if filter.keeps(kind, name) {
                out.push(Symbol {
                    line: idx + 1,
                    kind,
                    name: name.to_string(),
                    signature: signature(line),
                });
            }
            break;
        }
    }
    out
}

/// What reading one file gave.
enum FileOutcome {
    Symbols(Vec<Symbol>),
    TooLarge,
    Binary,
}

fn outline_file(opened: OpenedFile, g: &Grammar, filter: &Filter) -> std::io::Result<FileOutcome> {
    if opened.len > MAX_FILE_BYTES {
        return Ok(FileOutcome::TooLarge);
    }
    let mut bytes = Vec::new();
    // The limit holds even if the file grows after `fstat`.
    opened
        .file
        .take(MAX_FILE_BYTES.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Ok(FileOutcome::TooLarge);
    }
    if bytes[..bytes.len().min(8192)].contains(&0) {
        return Ok(FileOutcome::Binary);
    }
    let text = String::from_utf8_lossy(&bytes);
    Ok(FileOutcome::Symbols(outline(&text, g, filter)))
}

#[async_trait]
impl Tool for Symbols {
    fn name(&self) -> &'static str {
        TOOL
    }

    fn description(&self) -> &'static str {
        "Outline the symbols (functions, methods, classes, structs, enums, traits, interfaces, types, constants, modules, macros, impls) of a source file, or of every source file under a directory (gitignore-aware). Prints `path:line: kind name | signature` sorted by path and line. Regex-based, for Rust, Python, JavaScript/TypeScript, Go, Java, C#, Kotlin, Swift, Scala, C/C++, Ruby, PHP, Lua, shell and Elixir. Use it to find where things are defined, then read_file at that line."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "path": {
                    "type": "string",
                    "description": "Source file or directory to outline, relative to the worktree root. Default \".\" (every supported source file in the worktree)."
                },
                "name": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Regular expression the symbol name must match (unanchored; use ^...$ for an exact name, (?i) for any case). Default: every name."
                },
                "kind": {
                    "type": "string",
                    "enum": KINDS,
                    "description": "Only symbols of this kind. `function` is a free function, `method` one defined inside a class/impl/trait. Default: every kind."
                },
                "max_results": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_MAX,
                    "description": "Most symbols to list (the first ones by path and line). Default 500, at most 5000."
                }
            }
        })
    }

    fn read_only(&self) -> bool {
        true
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        let a: SymbolsArgs = args::parse(TOOL, input)?;
        let name_re = a
            .name
            .as_deref()
            .map(Regex::new)
            .transpose()
            .map_err(|e| ToolError::invalid(TOOL, "/name", e.to_string()))?;
        if let Some(k) = a.kind.as_deref()
            && !KINDS.contains(&k)
        {
            return Err(ToolError::invalid(
                TOOL,
                "/kind",
                format!("unknown kind '{k}'; use one of: {}", KINDS.join(", ")),
            ));
        }
        let filter = Filter {
            name: name_re,
            kind: a.kind.clone(),
        };
        let target = walk::target(ctx, TOOL, &a.path)?;
        let max = a.max_results.clamp(1, MAX_MAX) as usize;
        let root = ctx.root().to_path_buf();

        if !target.is_dir {
            let Some(g) = grammar_for_path(&target.path) else {
                return Err(ToolError::Unavailable {
                    message: format!(
                        "symbols cannot outline '{}': its language is not supported (supported: {}). Use read_file or grep on it instead.",
                        target.shown,
                        LANGUAGES.join(", ")
                    ),
                });
            };
            let path = target.path.clone();
            let shown = target.shown.clone();
            let files = Arc::clone(ctx.files());
            let outcome = walk::run_blocking(TOOL, move |_| {
                let opened = open_for_reading(&files, &path, &shown)?;
                outline_file(opened, g, &filter)
                    .map_err(|e| ToolError::from_io("reading", &shown, &e))
            })
            .await?;
            let symbols = match outcome {
                FileOutcome::Symbols(s) => s,
                FileOutcome::TooLarge => {
                    return Err(ToolError::LimitExceeded {
                        what: format!(
                            "'{}' is larger than {} MiB",
                            target.shown,
                            MAX_FILE_BYTES / (1024 * 1024)
                        ),
                        hint: "Use grep with a pattern to find definitions in it.".to_string(),
                    });
                }
                FileOutcome::Binary => {
                    return Ok(ToolOutput::text(format!(
                        "'{}' is a binary file; it has no symbols to outline.",
                        target.shown
                    )));
                }
            };
            let found = symbols
                .into_iter()
                .map(|s| (target.path.clone(), s))
                .collect();
            return Ok(ToolOutput::text(render(
                found,
                &root,
                max,
                &a,
                &target.shown,
                None,
            )));
        }

        let base = target.path.clone();
        let files = Arc::clone(ctx.files());
        let ignores = walk::WalkIgnores::new(Arc::clone(&files));
        let walk_ignores = Arc::clone(&ignores);
        let (found, stats) = walk::run_blocking(TOOL, move |cancel| {
            let scanned = AtomicUsize::new(0);
            let skipped = AtomicUsize::new(0);
            let walker = walk::builder(&walk_ignores, &base, false, |_| true);
            let found: Vec<(PathBuf, Symbol)> = walk::collect(&walker, cancel, || {
                let (filter, scanned, skipped, files) = (&filter, &scanned, &skipped, &files);
                move |e: DirEntry, out: &mut Vec<(PathBuf, Symbol)>| {
                    if !walk::is_file(&e) {
                        return WalkState::Continue;
                    }
                    let Some(g) = grammar_for_path(e.path()) else {
                        return WalkState::Continue;
                    };
                    scanned.fetch_add(1, Ordering::Relaxed);
                    // Opened beneath the root: the walk's path may have been swapped since.
                    let outcome = files
                        .open_file(e.path())
                        .map_err(|_| std::io::Error::other("refused"))
                        .and_then(|opened| outline_file(opened, g, filter));
                    match outcome {
                        Ok(FileOutcome::Symbols(symbols)) => {
                            out.extend(symbols.into_iter().map(|s| (e.path().to_path_buf(), s)));
                        }
                        Ok(FileOutcome::TooLarge) | Err(_) => {
                            skipped.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(FileOutcome::Binary) => {}
                    }
                    WalkState::Continue
                }
            });
            Ok((found, (scanned.into_inner(), skipped.into_inner())))
        })
        .await?;
        let mut text = if stats.0 == 0 {
            format!(
                "No source files of a supported language under '{}' (files ignored by .gitignore/.ignore and hidden files are skipped). Supported: {}.",
                target.shown,
                LANGUAGES.join(", ")
            )
        } else {
            render(found, &root, max, &a, &target.shown, Some(stats.1))
        };
        if let Some(note) = ignores.note() {
            if !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&note);
        }
        Ok(ToolOutput::text(text))
    }
}

/// Sorted, capped listing (or a plain "none found"), with notes on what was left out.
fn render(
    mut found: Vec<(PathBuf, Symbol)>,
    root: &Path,
    max: usize,
    a: &SymbolsArgs,
    shown: &str,
    skipped: Option<usize>,
) -> String {
    let mut out = String::new();
    if found.is_empty() {
        let _ = write!(out, "No symbols found in '{shown}'");
        if let Some(k) = &a.kind {
            let _ = write!(out, " of kind {k}");
        }
        if let Some(n) = &a.name {
            let _ = write!(out, " with a name matching '{n}'");
        }
        out.push('.');
    } else {
        found.sort_unstable_by(|(pa, sa), (pb, sb)| pa.cmp(pb).then(sa.line.cmp(&sb.line)));
        for (path, s) in found.iter().take(max) {
            let shown = display_path(root, path);
            let _ = writeln!(
                out,
                "{shown}:{}: {} {} | {}",
                s.line, s.kind, s.name, s.signature
            );
        }
        if found.len() > max {
            let _ = writeln!(
                out,
                "[{} more symbols not shown; narrow `path`, or filter with `name` or `kind`]",
                found.len() - max
            );
        }
    }
    if let Some(n) = skipped.filter(|&n| n > 0) {
        let _ = write!(
            out,
            "{}[skipped {}: unreadable or larger than {} MiB]",
            if out.ends_with('\n') { "" } else { "\n" },
            count(n as u64, "file"),
            MAX_FILE_BYTES / (1024 * 1024)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::test_support::{
        assert_escapes_refused, assert_schema_refuses, link_outside, run, tree,
    };

    fn all() -> Filter {
        Filter {
            name: None,
            kind: None,
        }
    }

    /// `kind name` per symbol of `text` in `lang`.
    fn kinds(lang: &str, text: &str) -> Vec<String> {
        let g = grammar_for(lang).unwrap();
        outline(text, g, &all())
            .into_iter()
            .map(|s| format!("{} {}", s.kind, s.name))
            .collect()
    }

    async fn symbols(wt: &Path, input: Value) -> String {
        run(&Symbols, wt, input).await.unwrap()
    }

    const RUST_SRC: &str = r#"//! doc
use std::fmt;

pub const LIMIT: usize = 3;
static mut COUNTER: u32 = 0;

/// A thing.
#[derive(Debug)]
pub struct Thing {
    n: u32,
}

pub(crate) enum Kind { A, B }

pub type Alias = Vec<u8>;

pub trait Shape {
    fn area(&self) -> f64;
}

impl<T: Into<String>> fmt::Display for Wrapper<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ok(())
    }
}

impl Thing {
    pub async fn new() -> Self {
        fn helper() {}
        Thing { n: 0 }
    }
}

pub unsafe extern "C" fn exported() {}

macro_rules! square {
    ($x:expr) => { $x * $x };
}

mod tests {
    fn check() {}
}
"#;

    #[test]
    fn rust_outline() {
        assert_eq!(
            kinds("rust", RUST_SRC),
            vec![
                "const LIMIT",
                "const COUNTER",
                "struct Thing",
                "enum Kind",
                "type Alias",
                "trait Shape",
                "method area",
                "impl Wrapper",
                "method fmt",
                "impl Thing",
                "method new",
                "function helper",
                "function exported",
                "macro square",
                "module tests",
                "function check",
            ]
        );
    }

    #[test]
    fn python_outline() {
        let src = "MAX_SIZE = 10\n\nclass Box(Base):\n    # comment at depth\n    def __init__(self):\n        def inner():\n            pass\n\n    async def fetch(self):\n        pass\n\ndef top(a, b):\n    return a == b\n";
        assert_eq!(
            kinds("python", src),
            vec![
                "const MAX_SIZE",
                "class Box",
                "method __init__",
                "function inner",
                "method fetch",
                "function top",
            ]
        );
    }

    #[test]
    fn javascript_and_typescript_outline() {
        let js = "export const API_URL = 'x';\nexport async function load(a) {\n  if (a) {\n  }\n}\nconst add = (a, b) => a + b;\nclass View extends Base {\n  constructor(props) {\n    super(props);\n  }\n  static async render() {\n    return 1;\n  }\n  onClick = () => {\n  };\n}\n";
        assert_eq!(
            kinds("javascript", js),
            vec![
                "const API_URL",
                "function load",
                "function add",
                "class View",
                "method constructor",
                "method render",
                "method onClick",
            ]
        );
        let ts = "export interface Props {\n  name: string;\n}\nexport type Id = string | number;\nexport enum Color { Red }\nnamespace NS {\n}\nexport default class App {\n  private handle(e: Event): void {\n  }\n}\n";
        assert_eq!(
            kinds("typescript", ts),
            vec![
                "interface Props",
                "type Id",
                "enum Color",
                "module NS",
                "class App",
                "method handle",
            ]
        );
    }

    #[test]
    fn go_java_c_cpp_ruby_outlines() {
        let go = "package x\n\nconst Max = 3\n\ntype Server struct {\n}\n\ntype Handler interface {\n}\n\ntype ID string\n\nfunc (s *Server) Serve() error {\n}\n\nfunc main() {\n}\n";
        assert_eq!(
            kinds("go", go),
            vec![
                "const Max",
                "struct Server",
                "interface Handler",
                "type ID",
                "method Serve",
                "function main",
            ]
        );
        let java = "public class Main {\n    private int x = compute(1);\n    @Override\n    public static void main(String[] args) {\n        if (x) { run(); }\n    }\n    public Main() {\n    }\n}\ninterface Api {\n    List<String> names();\n}\nenum E { A }\n";
        assert_eq!(
            kinds("java", java),
            vec![
                "class Main",
                "method main",
                "method Main",
                "interface Api",
                "method names",
                "enum E",
            ]
        );
        let c = "#define MAX 10\ntypedef struct node {\n    int v;\n} node_t;\nstatic int add(int a, int b) {\n    return a + b;\n}\nint proto(int);\nenum color { RED };\n";
        assert_eq!(
            kinds("c", c),
            vec![
                "macro MAX",
                "struct node",
                "type node_t",
                "function add",
                "enum color"
            ]
        );
        let cpp = "namespace app {\nclass Widget : public Base {\npublic:\n#ifdef X\n    Widget();\n    virtual ~Widget();\n    int size() const;\n};\n}\nvoid Widget::draw(int x) {\n}\n";
        assert_eq!(
            kinds("cpp", cpp),
            vec![
                "module app",
                "class Widget",
                "method Widget",
                "method ~Widget",
                "method size",
                "method Widget::draw",
            ]
        );
        let rb = "module Shop\n  VERSION = '1'\n  class Cart\n    def add(item)\n    end\n    def self.empty?\n    end\n  end\nend\ndef helper\nend\n";
        assert_eq!(
            kinds("ruby", rb),
            vec![
                "module Shop",
                "const VERSION",
                "class Cart",
                "method add",
                "method empty?",
                "function helper",
            ]
        );
    }

    #[test]
    fn every_grammar_compiles() {
        for lang in LANGUAGES {
            let g = grammar_for(lang).unwrap_or_else(|| panic!("{lang}"));
            assert_eq!(g.set.len(), g.rules.len(), "{lang}");
        }
        // Cheap smoke for the remaining languages.
        assert_eq!(
            kinds("kotlin", "data class User(val n: String)\nfun main() {}\n"),
            vec!["class User", "function main"]
        );
        assert_eq!(
            kinds("swift", "struct P {\n    func go() {}\n}\n"),
            vec!["struct P", "method go"]
        );
        assert_eq!(
            kinds("php", "<?php\nclass A {\n    public function b() {}\n}\n"),
            vec!["class A", "method b"]
        );
        assert_eq!(
            kinds("shell", "build() {\n}\nfunction clean {\n}\n"),
            vec!["function build", "function clean"]
        );
        assert_eq!(
            kinds("lua", "local function f()\nend\nM.g = function() end\n"),
            vec!["function f", "function M.g"]
        );
        assert_eq!(
            kinds("elixir", "defmodule A.B do\n  def run(x), do: x\nend\n"),
            vec!["module A.B", "function run"]
        );
        assert_eq!(
            kinds(
                "csharp",
                "namespace N {\n    public class C {\n        public async Task<int> Run(int x) {\n        }\n    }\n}\n"
            ),
            vec!["module N", "class C", "method Run"]
        );
        assert_eq!(
            kinds(
                "scala",
                "object Main {\n  def main(args: Array[String]): Unit = {}\n}\n"
            ),
            vec!["module Main", "method main"]
        );
    }

    #[tokio::test]
    async fn file_output_has_path_line_kind_name_and_signature() {
        let (_d, wt) = tree(&[("src/lib.rs", RUST_SRC)]);
        let out = symbols(&wt, json!({"path": "src/lib.rs"})).await;
        let first = out.lines().next().unwrap();
        assert_eq!(
            first,
            "src/lib.rs:4: const LIMIT | pub const LIMIT: usize = 3;"
        );
        assert!(
            out.contains("src/lib.rs:28: method new | pub async fn new() -> Self\n"),
            "{out}"
        );
    }

    #[tokio::test]
    async fn name_and_kind_filters() {
        let (_d, wt) = tree(&[("src/lib.rs", RUST_SRC)]);
        let out = symbols(&wt, json!({"path": "src", "kind": "method"})).await;
        let names: Vec<&str> = out.lines().map(|l| l.split(' ').nth(2).unwrap()).collect();
        assert_eq!(names, vec!["area", "fmt", "new"]);
        let out = symbols(&wt, json!({"name": "^(?i)thing$"})).await;
        assert_eq!(out.lines().count(), 2, "{out}");
        assert!(
            out.contains("struct Thing") && out.contains("impl Thing"),
            "{out}"
        );
        let out = symbols(&wt, json!({"name": "^nothing_like_this$", "kind": "enum"})).await;
        assert_eq!(
            out,
            "No symbols found in '.' of kind enum with a name matching '^nothing_like_this$'."
        );
    }

    #[tokio::test]
    async fn directory_walk_is_sorted_gitignore_aware_and_language_filtered() {
        let (_d, wt) = tree(&[
            (".gitignore", "gen/\n"),
            ("b.py", "def b():\n    pass\n"),
            ("a/z.go", "package a\nfunc Z() {}\nfunc A() {}\n"),
            ("gen/skip.rs", "fn skipped() {}\n"),
            ("notes.txt", "fn not_code() {}\n"),
            (".hidden/h.rs", "fn hidden() {}\n"),
        ]);
        let out = symbols(&wt, json!({})).await;
        assert_eq!(
            out,
            "a/z.go:2: function Z | func Z() {}\na/z.go:3: function A | func A() {}\nb.py:1: function b | def b():\n"
        );
        let out = symbols(&wt, json!({"path": "gen"})).await;
        assert!(out.contains("skipped"), "explicit path is searched: {out}");
    }

    #[tokio::test]
    async fn max_results_caps_with_a_note() {
        let (_d, wt) = tree(&[("a.rs", "fn a() {}\nfn b() {}\nfn c() {}\n")]);
        let out = symbols(&wt, json!({"max_results": 2})).await;
        assert_eq!(
            out,
            "a.rs:1: function a | fn a() {}\na.rs:2: function b | fn b() {}\n[1 more symbols not shown; narrow `path`, or filter with `name` or `kind`]\n"
        );
    }

    #[tokio::test]
    async fn errors_and_empty_results() {
        let (_d, wt) = tree(&[("notes.txt", "x\n"), ("a.rs", "fn a() {}\n")]);
        let err = run(&Symbols, &wt, json!({"path": "notes.txt"}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "unavailable");
        assert!(err.to_string().contains("read_file or grep"), "{err}");
        let err = run(&Symbols, &wt, json!({"name": "(unclosed"}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        let err = run(&Symbols, &wt, json!({"kind": "widget"}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        let err = run(&Symbols, &wt, json!({"path": "missing.rs"}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "not_found");
        let empty = tree(&[("notes.txt", "x\n")]);
        let out = symbols(&empty.1, json!({})).await;
        assert!(
            out.starts_with("No source files of a supported language"),
            "{out}"
        );
        let bad = [
            json!({"kind": "widget"}),
            json!({"max_results": 0}),
            json!({"max_results": 5001}),
            json!({"name": ""}),
            json!({"extra": 1}),
        ];
        assert_schema_refuses(Arc::new(Symbols), &wt, &bad).await;
    }

    #[tokio::test]
    async fn files_over_the_size_limit_are_skipped_with_a_note_or_refused_when_named() {
        let (_d, wt) = tree(&[("a.rs", "fn a() {}\n")]);
        let big = std::fs::File::create(wt.join("big.rs")).unwrap();
        big.set_len(MAX_FILE_BYTES + 1).unwrap();
        assert_eq!(
            symbols(&wt, json!({})).await,
            "a.rs:1: function a | fn a() {}\n[skipped 1 file: unreadable or larger than 4 MiB]"
        );
        let err = run(&Symbols, &wt, json!({"path": "big.rs"}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "limit_exceeded");
        assert!(err.to_string().contains("larger than 4 MiB"), "{err}");
        assert!(err.to_string().contains("Use grep"), "{err}");
    }

    #[tokio::test]
    async fn escapes_are_refused() {
        let (_d, wt) = tree(&[("a.rs", "fn a() {}\n")]);
        assert_escapes_refused(&Symbols, &wt, json!({})).await;
    }

    #[tokio::test]
    async fn symlinks_inside_the_tree_do_not_leak_outside_symbols() {
        let (_d, wt) = tree(&[("a.rs", "fn a() {}\n")]);
        link_outside(&wt);
        let out = symbols(&wt, json!({})).await;
        assert_eq!(out, "a.rs:1: function a | fn a() {}\n");
    }

    #[tokio::test]
    async fn output_is_deterministic_and_sorted() {
        let mut files = Vec::new();
        for i in 0..120 {
            files.push((
                format!("m{}/f{i}.rs", i % 5),
                format!("fn f{i}() {{}}\nstruct S{i};\n"),
            ));
        }
        let (_d, wt) = tree(&files);
        let first = symbols(&wt, json!({})).await;
        assert_eq!(symbols(&wt, json!({})).await, first);
        let keys: Vec<(PathBuf, usize)> = first
            .lines()
            .map(|l| {
                let mut it = l.split(':');
                (
                    PathBuf::from(it.next().unwrap()),
                    it.next().unwrap().parse().unwrap(),
                )
            })
            .collect();
        assert_eq!(keys.len(), 240);
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn declares_read_only_and_a_closed_schema() {
        assert!(Symbols.read_only());
        assert_eq!(Symbols.input_schema()["additionalProperties"], json!(false));
    }
}
