//! Pieces of kernel files: a family file's sections and a file's source variants.

use crate::error::{invalid, Result};

/// The body `name` of a kernel family file: the lines after `// ---- kernel NAME ----` up to the
/// next such line. Panics if the section is missing (the files are compiled in).
pub(crate) fn kernel_section(file: &'static str, name: &str) -> &'static str {
    let marker = format!("// ---- kernel {name} ----\n");
    let start = file.find(&marker).unwrap_or_else(|| panic!("kernel file has no section {name}")) + marker.len();
    let rest = &file[start..];
    &rest[..rest.find("// ---- kernel ").unwrap_or(rest.len())]
}

/// `text` with the sections of one variant: the lines between `#if FLAG` and its `#else` or
/// `#endif` are kept where `on`, those between `#if !FLAG` and its `#else` or `#endif` where not,
/// and the other branch the other way; the flag's own directives and the lines cut become empty
/// lines, so every line keeps its number (compaction drops them). Other conditionals pass
/// through as written (and nest). `FLAG` is never defined for a compiler: registering each
/// variant as its own text keeps out of it what the variant never compiles (MLX's CUDA back-end
/// hashes a kernel's whole source at every launch).
///
/// Lines are read one by one, with no comment state, so the text must keep to a plain form, and
/// anything else is an error naming the line: no carriage returns or line continuations, no
/// directive after a block comment on its line, the flag named only by `#if FLAG` or
/// `#if !FLAG` (or in a `//` comment), one plain `#else` at most and a matching `#endif` for
/// each. A directive inside a block comment counts, and a block comment must not span a
/// section's edge.
pub(crate) fn source_variant(text: &str, flag: &str, on: bool) -> Result<String> {
    /// An open conditional: the flag's (and whether its current branch is kept), or another.
    enum Open {
        Flag { keep: bool, seen_else: bool },
        Other,
    }
    let mut open: Vec<Open> = Vec::new();
    let mut out = String::with_capacity(text.len());
    for (n, line) in text.split('\n').enumerate() {
        let at = || format!("line {}: {line:?}", n + 1);
        if line.contains('\r') || line.trim_end_matches([' ', '\t']).ends_with('\\') {
            invalid!("{flag}: carriage returns and line continuations are not read ({})", at());
        }
        let code = line.split("//").next().unwrap_or("").trim();
        if code.starts_with("/*") && code.split_once("*/").is_some_and(|(_, rest)| rest.trim_start().starts_with('#')) {
            invalid!("{flag}: a directive after a comment is not read ({})", at());
        }
        // Other conditionals never decide what is kept: only the flag's.
        let kept = open.iter().all(|o| !matches!(o, Open::Flag { keep: false, .. }));
        let keep_line = |out: &mut String, kept: bool| {
            out.push_str(if kept { line } else { "" });
            out.push('\n');
        };
        let Some(directive) = code.strip_prefix('#') else {
            if code.contains(flag) {
                invalid!("{flag}: named outside a directive ({})", at());
            }
            keep_line(&mut out, kept);
            continue;
        };
        // The directive's keyword (`#if!X` is `if` and `!X`) and its other words.
        let directive = directive.trim_start();
        let split = directive.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(directive.len());
        let (keyword, rest) = directive.split_at(split);
        let words: Vec<&str> = std::iter::once(keyword).chain(rest.split_whitespace()).collect();
        let names_flag = words.iter().any(|w| w.contains(flag));
        match keyword {
            "if" if words.len() == 2 && (words[1] == flag || words[1].strip_prefix('!') == Some(flag)) => {
                open.push(Open::Flag { keep: (words[1] == flag) == on, seen_else: false });
                out.push('\n');
                continue;
            }
            kw @ ("else" | "elif" | "elifdef" | "elifndef" | "endif") => match open.last_mut() {
                None => invalid!("{flag}: #{kw} without #if at {}", at()),
                Some(Open::Flag { keep, seen_else }) => {
                    match (kw, words.len(), *seen_else) {
                        ("else", 1, false) => (*keep, *seen_else) = (!*keep, true),
                        ("endif", 1, _) => {
                            open.pop();
                        }
                        _ => invalid!("{flag}: only one plain #else, then #endif, close `#if {flag}` ({})", at()),
                    }
                    out.push('\n');
                    continue;
                }
                Some(Open::Other) if kw == "endif" => {
                    open.pop();
                }
                Some(Open::Other) => {}
            },
            "if" | "ifdef" | "ifndef" => open.push(Open::Other),
            _ => {}
        }
        if names_flag {
            invalid!("{flag}: only `#if {flag}`, `#if !{flag}`, `#else` and `#endif` select a variant ({})", at());
        }
        keep_line(&mut out, kept);
    }
    if !open.is_empty() {
        invalid!("{flag}: {} conditional(s) left open at the end of the text", open.len());
    }
    // `split` saw one line more than the text's newlines: drop the newline added after it.
    out.pop();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAG: &str = "VARIANT_B";

    #[test]
    fn a_source_variant_keeps_its_sections_and_other_conditionals() {
        let text = "common 1\n\
                    #if VARIANT_B\n\
                    b only\n\
                    #ifdef OTHER\n\
                    b and other\n\
                    #else\n\
                    b not other\n\
                    #endif\n\
                    #else  // VARIANT_B\n\
                    a only\n\
                    #if !VARIANT_B\n\
                    a again\n\
                    #endif\n\
                    #endif\n\
                    #if !VARIANT_B\n\
                    \x20 a, indented\n\
                    #endif  // !VARIANT_B\n\
                    common 2\n";
        // Cut lines stay as empty lines: every kept line keeps its number.
        let b = source_variant(text, FLAG, true).unwrap();
        let a = source_variant(text, FLAG, false).unwrap();
        assert_eq!((b.lines().count(), a.lines().count()), (text.lines().count(), text.lines().count()));
        let non_empty = |t: &str| t.lines().filter(|l| !l.is_empty()).collect::<Vec<_>>().join("\n");
        assert_eq!(non_empty(&b), "common 1\nb only\n#ifdef OTHER\nb and other\n#else\nb not other\n#endif\ncommon 2");
        assert_eq!(non_empty(&a), "common 1\na only\na again\n  a, indented\ncommon 2");
        assert_eq!(b.lines().nth(2), Some("b only"));
        assert_eq!(a.lines().nth(15), Some("  a, indented"));
        // A flag section nested in the other variant's section is never kept.
        let nested = "#if VARIANT_B\n#if !VARIANT_B\nnever\n#endif\nb\n#endif\n";
        assert_eq!(source_variant(nested, FLAG, true).unwrap(), "\n\n\n\nb\n\n");
        assert_eq!(source_variant(nested, FLAG, false).unwrap(), "\n".repeat(6));
    }

    #[test]
    fn a_malformed_variant_section_is_an_error_naming_the_line() {
        for (text, needle) in [
            ("#if VARIANT_B\n#elif X\n#endif\n", "line 2"),
            ("#if VARIANT_B\n#else\n#else\n#endif\n", "line 3"),
            ("#if VARIANT_B && X\n#endif\n", "line 1"),
            ("#ifdef VARIANT_B\n#endif\n", "line 1"),
            ("#if X\n#elif VARIANT_B\n#endif\n", "line 2"),
            ("#define VARIANT_B 1\n", "line 1"),
            ("#endif\n", "line 1"),
            ("#if VARIANT_B\nx\n", "left open"),
            ("#if X\n", "left open"),
            ("#if!VARIANT_B && X\n#endif\n", "line 1"),
            ("#if(VARIANT_B)\n#endif\n", "line 1"),
            ("#if X \\\n || VARIANT_B\n#endif\n", "line 1"),
            ("#if VARIANT_B\r\n#endif\n", "line 1"),
            ("#if VARIANT_B\n/* c */ #endif\n", "line 2"),
            ("int x = VARIANT_B;\n", "line 1"),
        ] {
            let err = source_variant(text, FLAG, true).unwrap_err().to_string();
            assert!(err.contains(FLAG) && err.contains(needle), "{text:?}: {err}");
        }
    }
}
