//! Language guess from a file name, shared by `list_directory` and `symbols`.

use std::path::Path;

/// The language of `path` by extension (or well-known file name), if recognised.
pub fn guess(path: &Path) -> Option<&'static str> {
    let name = path.file_name()?.to_str()?;
    match name {
        "Makefile" | "makefile" | "GNUmakefile" => return Some("make"),
        "Dockerfile" => return Some("dockerfile"),
        "CMakeLists.txt" => return Some("cmake"),
        _ => {}
    }
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    Some(match ext.as_str() {
        "rs" => "rust",
        "py" | "pyi" => "python",
        "js" | "mjs" | "cjs" | "jsx" => "javascript",
        "ts" | "mts" | "cts" | "tsx" => "typescript",
        "go" => "go",
        "java" => "java",
        "c" | "h" => "c",
        "cc" | "cpp" | "cxx" | "hpp" | "hh" | "hxx" => "cpp",
        "rb" => "ruby",
        "php" => "php",
        "swift" => "swift",
        "kt" | "kts" => "kotlin",
        "scala" => "scala",
        "cs" => "csharp",
        "fs" | "fsx" => "fsharp",
        "hs" => "haskell",
        "ml" | "mli" => "ocaml",
        "ex" | "exs" => "elixir",
        "erl" | "hrl" => "erlang",
        "clj" | "cljs" => "clojure",
        "lua" => "lua",
        "r" => "r",
        "jl" => "julia",
        "dart" => "dart",
        "zig" => "zig",
        "nim" => "nim",
        "cr" => "crystal",
        "sh" | "bash" | "zsh" => "shell",
        "ps1" => "powershell",
        "sql" => "sql",
        "html" | "htm" => "html",
        "css" | "scss" => "css",
        "json" => "json",
        "yaml" | "yml" => "yaml",
        "toml" => "toml",
        "xml" => "xml",
        "md" | "markdown" => "markdown",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_extensions_and_names() {
        assert_eq!(guess(Path::new("src/main.rs")), Some("rust"));
        assert_eq!(guess(Path::new("a/b.TSX")), Some("typescript"));
        assert_eq!(guess(Path::new("Makefile")), Some("make"));
        assert_eq!(guess(Path::new("x.unknownext")), None);
        assert_eq!(guess(Path::new("noext")), None);
    }
}
