//! The line grammars of the `symbols` tool, one per language: regexes that name a symbol
//! on its defining line (compiled once per process), which kinds open a scope, and which
//! line starts are comments. `outline` applies them.

use std::path::Path;
use std::sync::LazyLock;

use regex::{Regex, RegexSet};

/// One line regex of a grammar.
pub(super) struct Rule {
    pub(super) kind: &'static str,
    pub(super) re: Regex,
    /// Whether the symbol opens a scope that later, more indented lines belong to.
    pub(super) scope: bool,
    /// When not empty, the rule applies only directly inside a scope of one of these kinds.
    pub(super) only_in: &'static [&'static str],
}

/// How to outline one language.
pub(super) struct Grammar {
    pub(super) set: RegexSet,
    pub(super) rules: Vec<Rule>,
    /// Scopes whose functions are methods.
    pub(super) method_scopes: &'static [&'static str],
    /// Line starts that mark a comment (such lines neither define nor close anything).
    pub(super) comments: &'static [&'static str],
    /// Line starts that may define a symbol but never close a scope, whatever their
    /// indentation (C preprocessor lines and C++ access labels sit at column 0 in bodies).
    pub(super) keep_scope: &'static [&'static str],
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

/// The grammar of `lang` (as `lang::guess` names it), if this tool has one.
pub(super) fn grammar_for(lang: &str) -> Option<&'static Grammar> {
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

/// The grammar of the file at `path`, by its name.
pub(super) fn grammar_for_path(path: &Path) -> Option<&'static Grammar> {
    crate::search::lang::guess(path).and_then(grammar_for)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::search::symbols::outline::{Filter, outline};

    /// `kind name` per symbol of `text` in `lang`.
    fn kinds(lang: &str, text: &str) -> Vec<String> {
        let g = grammar_for(lang).unwrap();
        let all = Filter {
            name: None,
            kind: None,
        };
        outline(text, g, &all)
            .into_iter()
            .map(|s| format!("{} {}", s.kind, s.name))
            .collect()
    }

    /// Rust source with one symbol of every kind (also the tool's test file).
    pub(in crate::search::symbols) const RUST_SRC: &str = r#"//! doc
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
}
