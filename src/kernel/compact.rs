//! CUDA sources without comments or indentation, for text handed to MLX inline (where no
//! include file can be written, see `include.rs`): MLX's CUDA back-end hashes a kernel's whole
//! generated source at every evaluation (its module cache key) and copies it at every
//! application, so the text registered is the text paid for on each call.

/// CUDA C++ text without comments, indentation or blank lines, for the same tokens and
/// directives. Only text in a plain subset of C++ is compacted; anything else is returned as
/// written: line continuations (a backslash at the end of a line, which NVRTC and GCC read
/// differently when spaces follow it), carriage returns, raw string literals, `__LINE__` (whose
/// values would change), comments or literals left open, and `#include` lines with a comment
/// marker. A block comment becomes one space (the standard's translation phase 3, before
/// directives are read), a `'` after a number or an identifier other than a character-literal
/// prefix is a digit separator, and only ASCII blanks are trimmed.
pub(crate) fn compact_cuda_source(text: &str) -> String {
    if std::env::var_os(KEEP_CUDA_SOURCE).is_some_and(|v| v == "1") {
        return text.to_string();
    }
    compact_plain_cpp(text).unwrap_or_else(|| text.to_string())
}

/// The environment variable that, set to `1`, registers CUDA sources as written (kernel compile
/// errors then name the lines of the files under `kernels/`).
const KEEP_CUDA_SOURCE: &str = "MLX_TRELLIS_KEEP_CUDA_SOURCE";

/// [`compact_cuda_source`]'s work: `None` where the text leaves the plain subset.
pub(crate) fn compact_plain_cpp(text: &str) -> Option<String> {
    let ends_with_backslash = |line: &str| line.trim_end_matches([' ', '\t', '\x0b', '\x0c']).ends_with('\\');
    if text.contains('\r') || text.contains("R\"") || text.contains("__LINE__") || text.lines().any(ends_with_backslash)
    {
        return None;
    }
    let bytes = text.as_bytes();
    let mut code = Vec::with_capacity(bytes.len());
    let mut line_start = true; // only blanks since the last newline
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if line_start && b == b'#' {
            let line_end = text[i..].find('\n').map_or(bytes.len(), |e| i + e);
            let directive = &text[i + 1..line_end];
            if directive.trim_start_matches([' ', '\t']).starts_with("include") {
                // `<a//b.h>` is a header name, not a comment: keep the line as written.
                if directive.contains("/*") || directive.contains("//") {
                    return None;
                }
                code.extend_from_slice(&bytes[i..line_end]);
                i = line_end;
                continue;
            }
        }
        // Comments and blanks leave `line_start` as it was: a directive may follow them.
        match b {
            b'\n' => {
                line_start = true;
                code.push(b);
                i += 1;
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                i = text[i..].find('\n').map_or(bytes.len(), |e| i + e);
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += 2 + text[i + 2..].find("*/")? + 2;
                code.push(b' ');
            }
            b' ' | b'\t' | b'\x0b' | b'\x0c' => {
                code.push(b);
                i += 1;
            }
            b'"' => {
                line_start = false;
                i = copy_literal(bytes, i, b'"', &mut code)?;
            }
            b'\'' if !is_digit_separator(&bytes[..i]) => {
                line_start = false;
                i = copy_literal(bytes, i, b'\'', &mut code)?;
            }
            _ => {
                line_start = false;
                code.push(b);
                i += 1;
            }
        }
    }
    // Only ASCII bytes were removed or added, at ASCII positions, so the text is still UTF-8.
    let code = String::from_utf8(code).ok()?;
    let mut out = String::with_capacity(code.len());
    for line in code.lines() {
        let line = line.trim_matches([' ', '\t', '\x0b', '\x0c']);
        if line.ends_with('\\') {
            // A backslash that only blanks or a comment followed: NVRTC and GCC disagree there.
            return None;
        }
        if !line.is_empty() {
            out.push_str(line);
            out.push('\n');
        }
    }
    Some(out)
}

/// Copies the string or character literal that opens at `bytes[start]` into `out`; returns the
/// index after it, or `None` if the line ends first.
fn copy_literal(bytes: &[u8], start: usize, quote: u8, out: &mut Vec<u8>) -> Option<usize> {
    let mut i = start + 1;
    while *bytes.get(i)? != quote {
        if bytes[i] == b'\n' {
            return None;
        }
        i += if bytes[i] == b'\\' { 2 } else { 1 };
    }
    out.extend_from_slice(&bytes[start..=i]);
    Some(i + 1)
}

/// Whether a `'` after `before` separates digits (`1'000`, `0x1'ff`: the letters and digits
/// before it start with a digit) rather than opening a character literal (`'a'`, `u8'a'`).
fn is_digit_separator(before: &[u8]) -> bool {
    let word_len = before.iter().rev().take_while(|b| b.is_ascii_alphanumeric() || **b == b'_').count();
    before.get(before.len() - word_len).is_some_and(u8::is_ascii_digit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compacted_cuda_source_keeps_tokens_literals_and_directives() {
        let text = "#pragma once // the header\n\
                    /* a block\n   comment */ int x = 1; // one\n\
                    \n\
                    \t  const char* s = \"// not a comment /* nor this */\"; char c = '\\''; char d = u8'/';\n\
                    #define A 1 /* a comment over\n   two lines */ + 2\n\
                    /* before a directive */ #define B 3\n\
                    int n = 1'000'000, h = 0x1'ff; const char* t = \"'//'\"; // digit separators\n\
                    float/**/z;\u{a0}\n";
        let want = "#pragma once\n\
                    int x = 1;\n\
                    const char* s = \"// not a comment /* nor this */\"; char c = '\\''; char d = u8'/';\n\
                    #define A 1   + 2\n\
                    #define B 3\n\
                    int n = 1'000'000, h = 0x1'ff; const char* t = \"'//'\";\n\
                    float z;\u{a0}\n";
        assert_eq!(compact_plain_cpp(text).as_deref(), Some(want));
        // Compacting twice changes nothing.
        assert_eq!(compact_plain_cpp(want).as_deref(), Some(want));
    }

    #[test]
    fn text_outside_the_plain_subset_is_kept_as_written() {
        for text in [
            "#define TWO(a) \\\n    ((a) + (a))\n",                   // a line continuation
            "int y; // a comment that goes on \\\nhere\n",            // a continued comment
            "#define X 1 \\ // NVRTC: no splice; GCC: one\nint y;\n", // backslash, then blanks
            "int y; // c\r\nint z;\r\n",                              // carriage returns
            "auto s = R\"(// kept)\"; // kept too\n",                 // a raw string literal
            "int line = __LINE__; // which would change\n",
            "#include <a//b.h>\n", // a header name, not a comment
            "int x; /* never closed\n",
            "const char* s = \"never closed\n;\n",
            "#error don't\n", // a lone quote
        ] {
            assert_eq!(compact_plain_cpp(text), None, "{text:?}");
            assert_eq!(compact_cuda_source(text), text, "{text:?}");
        }
    }

    /// Bytes inside the string and character literals of compacted text (no comments left to
    /// hold a stray quote), their quotes included.
    fn string_literal_bytes(compact: &str) -> usize {
        let (mut bytes, mut open, mut escaped) = (0, None, false);
        for c in compact.chars() {
            match open {
                Some(quote) => {
                    bytes += c.len_utf8();
                    if escaped {
                        escaped = false;
                    } else if c == '\\' {
                        escaped = true;
                    } else if c == quote {
                        open = None;
                    }
                }
                None if c == '"' || c == '\'' => {
                    bytes += 1;
                    open = Some(c);
                }
                None => {}
            }
        }
        bytes
    }

    /// The shipped kernels are in the plain subset, and their compacted text has the same tokens
    /// for the system's C++ preprocessor (`c++ -fpreprocessed -E`, which removes comments and
    /// nothing else).
    #[test]
    fn compacted_kernel_sources_keep_their_tokens_and_halve() {
        let cxx = std::env::var("MSL_SIM_CXX").unwrap_or_else(|_| "c++".to_string());
        let tokens = |text: &str| -> Option<Vec<String>> {
            use std::io::Write as _;
            let mut child = std::process::Command::new(&cxx)
                .args(["-fpreprocessed", "-E", "-P", "-dD", "-x", "c++", "-"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .ok()?;
            child.stdin.take()?.write_all(text.as_bytes()).ok()?;
            let out = child.wait_with_output().ok()?;
            let text = String::from_utf8(out.stdout).ok()?;
            Some(text.split_whitespace().map(str::to_string).collect())
        };
        for &(name, text) in super::super::sources::ALL.iter().filter(|(path, _)| path.starts_with("cuda/")) {
            let compact = compact_plain_cpp(text).unwrap_or_else(|| panic!("{name} left the plain subset"));
            let directives = |t: &str| t.lines().map(str::trim).filter(|l| l.starts_with('#')).count();
            assert_eq!(directives(&compact), directives(text), "{name}");
            assert!(!compact.contains("//") && !compact.contains("/*"), "{name}");
            // What compaction can shrink: everything but the string literals (PTX text), which it
            // keeps byte for byte.
            let strings = string_literal_bytes(&compact);
            let (shrunk, was) = (compact.len() - strings, text.len() - strings);
            assert!(shrunk < was * 7 / 10, "{name}: {shrunk} of {was} bytes outside string literals");
            assert_eq!(compact_plain_cpp(&compact).as_deref(), Some(compact.as_str()), "{name}");
            // The test suite needs a C++ compiler anyway (the Metal simulator's).
            let (Some(a), Some(b)) = (tokens(text), tokens(&compact)) else {
                panic!("no C++ preprocessor at {cxx:?} (set MSL_SIM_CXX)");
            };
            assert!(!a.is_empty(), "{name}: the preprocessor gave no tokens");
            assert_eq!(a, b, "{name}: tokens differ");
        }
    }
}
