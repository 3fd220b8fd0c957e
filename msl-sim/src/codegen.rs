//! Generation of the C++ translation unit for one kernel instantiation.
//!
//! The kernel is wrapped the way MLX's `mx.fast.metal_kernel` wraps it (same
//! parameter list, names, types and order; see [`msl_kernel_text`]); the
//! result is then made compilable as C++ by the prelude (address-space
//! qualifiers become empty macros, `[[...]]` attributes are ignored) plus two
//! textual rewrites of the header and body (see [`rewrite_source`]).

use crate::tensor::HostTensor;
use crate::{KernelDesc, Launch, TemplateArg};

/// Metal thread attributes MLX adds as kernel parameters when the body text
/// contains their name (a plain substring test), in MLX's order, with types.
const METAL_ATTRIBUTES: &[(&str, &str)] = &[
    ("dispatch_quadgroups_per_threadgroup", "uint"),
    ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"),
    ("grid_origin", "uint3"),
    ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"),
    ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"),
    ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"),
    ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"),
    ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"),
    ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"),
    ("threadgroups_per_grid", "uint3"),
    ("threads_per_grid", "uint3"),
    ("threads_per_simdgroup", "uint"),
    ("threads_per_threadgroup", "uint3"),
];

/// Inputs with fewer elements than this are bound in the `constant` address space.
const MAX_CONSTANT_ARRAY_SIZE: usize = 8;

/// File names that compiler messages and runtime errors use for the kernel text.
pub(crate) const HEADER_FILE: &str = "kernel-header";
pub(crate) const BODY_FILE: &str = "kernel-body";

/// Everything generated for one kernel instantiation.
pub(crate) struct Generated {
    /// Kernel function name (`custom_kernel_<name>[_<template args>]`), as MLX names it.
    pub kernel_name: String,
    /// The MSL source MLX would compile (header + wrapped kernel + instantiation).
    pub msl_source: String,
    /// The C++ translation unit (without the prelude, which the compiler step prepends).
    pub cpp_source: String,
}

/// Which of `name_shape`, `name_strides`, `name_ndim` an input gets.
#[derive(Clone, Copy)]
struct ShapeInfo {
    shape: bool,
    strides: bool,
    ndim: bool,
}

/// Template parameter list and argument lists, e.g. (`int N, bool B`, `4, 1`, `4, true`):
/// MLX prints bools as 1/0, while C++ needs `true`/`false` for a bool parameter.
fn template_lists(args: &[(String, TemplateArg)]) -> (String, String, String) {
    let (mut params, mut msl, mut cpp) = (Vec::new(), Vec::new(), Vec::new());
    for (name, arg) in args {
        let (kind, msl_value, cpp_value) = match arg {
            TemplateArg::Int(v) => ("int", v.to_string(), v.to_string()),
            TemplateArg::Bool(b) => ("bool", u8::from(*b).to_string(), b.to_string()),
            TemplateArg::Dtype(d) => ("typename", d.msl_name().to_string(), d.msl_name().to_string()),
        };
        params.push(format!("{kind} {name}"));
        msl.push(msl_value);
        cpp.push(cpp_value);
    }
    (params.join(", "), msl.join(", "), cpp.join(", "))
}

/// Generates the kernel for `desc` instantiated for these inputs and launch
/// (the arguments have passed `crate::validate`).
pub(crate) fn generate(desc: &KernelDesc, inputs: &[HostTensor], launch: &Launch) -> Generated {
    let shape_infos: Vec<ShapeInfo> = desc
        .input_names
        .iter()
        .map(|n| ShapeInfo {
            shape: desc.source.contains(&format!("{n}_shape")),
            strides: desc.source.contains(&format!("{n}_strides")),
            ndim: desc.source.contains(&format!("{n}_ndim")),
        })
        .collect();
    let attributes: Vec<(&str, &str)> =
        METAL_ATTRIBUTES.iter().copied().filter(|(a, _)| desc.source.contains(a)).collect();

    let mut kernel_name = format!("custom_kernel_{}", desc.name);
    let (tparams, tvalues_msl, tvalues_cpp) = template_lists(&launch.template_args);
    if !launch.template_args.is_empty() {
        // MLX: "<a, b>" with '<', '>' and ", " replaced by '_', last '_' dropped.
        kernel_name.push('_');
        kernel_name.push('_');
        kernel_name.push_str(&tvalues_msl.replace(", ", "_"));
    }
    // Element type of each output parameter.
    let output_type = |t: &str| if desc.atomic_outputs { format!("atomic<{t}>") } else { t.to_string() };
    let output_types: Vec<String> = launch.outputs.iter().map(|(_, dtype)| output_type(dtype.msl_name())).collect();

    let signature = |body_prefix: &str, body: &str, body_suffix: &str| -> String {
        let mut k = String::new();
        if !launch.template_args.is_empty() {
            k += &format!("template <{tparams}>\n");
        }
        k += &format!("[[kernel]] void {kernel_name}(\n");
        let mut params: Vec<String> = Vec::new();
        let mut index = 0;
        for ((name, arr), info) in desc.input_names.iter().zip(inputs).zip(&shape_infos) {
            let location = if arr.numel() < MAX_CONSTANT_ARRAY_SIZE { "constant" } else { "device" };
            let reference = if arr.shape.is_empty() { "&" } else { "*" };
            params.push(format!("  const {location} {}{reference} {name} [[buffer({index})]]", arr.dtype.msl_name()));
            index += 1;
            if !arr.shape.is_empty() {
                if info.shape {
                    params.push(format!("  const constant int* {name}_shape [[buffer({index})]]"));
                    index += 1;
                }
                if info.strides {
                    params.push(format!("  const constant int64_t* {name}_strides [[buffer({index})]]"));
                    index += 1;
                }
                if info.ndim {
                    params.push(format!("  const constant int& {name}_ndim [[buffer({index})]]"));
                    index += 1;
                }
            }
        }
        for (name, ty) in desc.output_names.iter().zip(&output_types) {
            params.push(format!("  device {ty}* {name} [[buffer({index})]]"));
            index += 1;
        }
        for (attr, ty) in &attributes {
            params.push(format!("  {ty} {attr} [[{attr}]]"));
        }
        k += &params.join(",\n");
        k += ") {\n";
        k += body_prefix;
        k += body;
        k += "\n";
        k += body_suffix;
        k += "}\n";
        k
    };

    // What MLX compiles (for `verbose`).
    let mut msl_source = desc.header.clone();
    msl_source += &signature("", &desc.source, "");
    if !launch.template_args.is_empty() {
        let def = format!("{kernel_name}<{tvalues_msl}>");
        msl_source += &format!("\ntemplate [[host_name(\"{kernel_name}\")]] [[kernel]] decltype({def}) {def};\n");
    }

    // The C++ unit: header and kernel inside a namespace that sees `metal`,
    // with #line directives so diagnostics point into the header and body.
    let header = rewrite_source(&desc.header);
    let body = rewrite_source(&desc.source);
    let mut cpp = String::new();
    cpp += "\n// ---- kernel (generated by msl-sim) ----\n";
    cpp += "#define device\n#define constant\n#define thread\n";
    // Every `threadgroup` outside preprocessor lines was rewritten; one left
    // in a macro body would otherwise silently lose its sharing semantics.
    cpp += "#define threadgroup msl_sim_threadgroup_inside_a_preprocessor_macro_is_not_supported\n";
    cpp += "namespace msl_sim_user {\nusing namespace metal;\n";
    cpp += &format!("#line 1 \"{HEADER_FILE}\"\n");
    cpp += &header;
    cpp += "\n#line 1 \"msl-sim-wrapper\"\n";
    cpp += &signature(&format!("#line 1 \"{BODY_FILE}\"\n"), &body, "#line 1 \"msl-sim-wrapper\"\n");

    // Glue: call the kernel for one simulated thread.
    let kernel_ref =
        if launch.template_args.is_empty() { kernel_name.clone() } else { format!("{kernel_name}<{tvalues_cpp}>") };
    let mut args: Vec<String> = Vec::new();
    let n_in = inputs.len();
    for (i, (arr, info)) in inputs.iter().zip(&shape_infos).enumerate() {
        let ty = arr.dtype.msl_name();
        if arr.shape.is_empty() {
            args.push(format!("*(const {ty}*)msl_sim_b[{i}]"));
        } else {
            args.push(format!("(const {ty}*)msl_sim_b[{i}]"));
            if info.shape {
                args.push(format!("msl_sim_m[{i}].shape"));
            }
            if info.strides {
                args.push(format!("msl_sim_m[{i}].strides"));
            }
            if info.ndim {
                args.push(format!("msl_sim_m[{i}].ndim"));
            }
        }
    }
    for (j, ty) in output_types.iter().enumerate() {
        args.push(format!("({ty}*)msl_sim_b[{}]", n_in + j));
    }
    for (attr, _) in &attributes {
        args.push(format!("msl_sim_t.{attr}"));
    }
    cpp += "static void msl_sim_invoke(const msl_sim_rt::ThreadInfo& msl_sim_t, \
            void* const* msl_sim_b, const msl_sim_rt::ArgMeta* msl_sim_m) {\n";
    cpp += "  (void)msl_sim_t; (void)msl_sim_b; (void)msl_sim_m;\n";
    cpp += &format!("  {kernel_ref}(\n    {});\n}}\n", args.join(",\n    "));
    cpp += "} // namespace msl_sim_user\n";
    let names =
        desc.input_names.iter().chain(&desc.output_names).map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", ");
    cpp += &format!("static const char* const msl_sim_buffer_names[] = {{{names}}};\n");
    cpp += &format!(
        "const msl_sim_rt::KernelInfo msl_sim_rt::kernel_info = {{\"{kernel_name}\", {}, {}, \
         msl_sim_buffer_names, &msl_sim_user::msl_sim_invoke}};\n",
        n_in,
        desc.output_names.len()
    );

    Generated { kernel_name, msl_source, cpp_source: cpp }
}

/// The standard Metal headers a kernel header may include; the prelude
/// provides their (supported) contents.
const METAL_HEADERS: &[&str] = &[
    "metal_stdlib",
    "metal_simdgroup",
    "metal_simdgroup_matrix",
    "metal_math",
    "metal_atomic",
    "metal_integer",
    "metal_common",
    "metal_compute",
    "metal_relational",
];

/// Makes kernel text compilable as C++ while keeping line numbers:
/// * `#include <metal_stdlib>` (and the other standard Metal headers) become comments;
/// * every `threadgroup` keyword outside preprocessor lines is resolved: a
///   declaration of a threadgroup variable (`threadgroup float buf[64];`)
///   becomes `static thread_local`, giving one instance per worker OS thread,
///   shared by all fibers of the threadgroup it runs; in pointer and
///   reference types, parameters and casts the qualifier is dropped.
pub(crate) fn rewrite_source(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len() + 64);
    let mut i = 0;
    let mut paren_depth = 0i32;
    let mut at_line_start = true;
    while i < b.len() {
        let c = b[i];
        // Preprocessor directive: copied verbatim (with continuation lines),
        // except includes of the standard Metal headers.
        if at_line_start && c == b'#' {
            let start = i;
            while i < b.len() && b[i] != b'\n' {
                if b[i] == b'\\' && i + 1 < b.len() && b[i + 1] == b'\n' {
                    i += 1;
                }
                i += 1;
            }
            let line = &src[start..i];
            let compact: String = line.chars().filter(|c| !c.is_whitespace()).collect();
            let is_metal_include = METAL_HEADERS
                .iter()
                .any(|h| compact == format!("#include<{h}>") || compact == format!("#include\"{h}\""));
            if is_metal_include {
                out += "// ";
                out += line;
                out += " (provided by the msl-sim prelude)";
            } else {
                out += line;
            }
            continue;
        }
        if c == b'\n' {
            at_line_start = true;
            out.push('\n');
            i += 1;
            continue;
        }
        if c == b' ' || c == b'\t' || c == b'\r' {
            out.push(c as char);
            i += 1;
            continue;
        }
        at_line_start = false;
        // Comments and literals are copied untouched.
        if let Some(end) = skip_comment_or_literal(b, i) {
            out += &src[i..end];
            i = end;
            continue;
        }
        if c == b'_' || c.is_ascii_alphabetic() {
            let start = i;
            while i < b.len() && (b[i] == b'_' || b[i].is_ascii_alphanumeric()) {
                i += 1;
            }
            let word = &src[start..i];
            if word == "threadgroup" {
                if paren_depth == 0 && declares_threadgroup_variable(b, i) {
                    out += "static thread_local";
                } else {
                    // Keep the columns of the rest of the line.
                    out += &" ".repeat(word.len());
                }
            } else {
                out += word;
            }
            continue;
        }
        match c {
            b'(' => paren_depth += 1,
            b')' => paren_depth -= 1,
            _ => {}
        }
        // Copy one UTF-8 character.
        let len = utf8_len(c);
        out += &src[i..(i + len).min(b.len())];
        i += len;
    }
    out
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xF0..=0xFF => 4,
        0xE0..=0xEF => 3,
        0xC0..=0xDF => 2,
        _ => 1,
    }
}

/// End of the comment or string/char literal starting at `i`, if any.
fn skip_comment_or_literal(b: &[u8], i: usize) -> Option<usize> {
    let c = b[i];
    let next = b.get(i + 1).copied();
    if c == b'/' && next == Some(b'/') {
        let mut j = i;
        while j < b.len() && b[j] != b'\n' {
            j += 1;
        }
        return Some(j);
    }
    if c == b'/' && next == Some(b'*') {
        let mut j = i + 2;
        while j + 1 < b.len() && !(b[j] == b'*' && b[j + 1] == b'/') {
            j += 1;
        }
        return Some((j + 2).min(b.len()));
    }
    if c == b'"' || c == b'\'' {
        let mut j = i + 1;
        while j < b.len() && b[j] != c && b[j] != b'\n' {
            if b[j] == b'\\' {
                j += 1;
            }
            j += 1;
        }
        return Some((j + 1).min(b.len()));
    }
    None
}

/// Whether the `threadgroup` keyword that ends at `i` (outside parentheses)
/// starts a variable declaration rather than a pointer or reference type:
/// scanning forward, the first `*` or `&` means a pointer/reference, while
/// `[`, `;`, `,`, `=` or `{` first means a variable. Template argument lists
/// (`atomic<uint>`) are skipped.
fn declares_threadgroup_variable(b: &[u8], mut i: usize) -> bool {
    let mut prev_ident = false;
    while i < b.len() {
        if let Some(end) = skip_comment_or_literal(b, i) {
            i = end;
            continue;
        }
        let c = b[i];
        match c {
            b'*' | b'&' | b'(' | b')' => return false,
            b'[' | b';' | b',' | b'=' | b'{' => return true,
            b'<' if prev_ident => {
                let mut depth = 0i32;
                while i < b.len() {
                    match b[i] {
                        b'<' => depth += 1,
                        b'>' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        b';' | b'{' => return true,
                        _ => {}
                    }
                    i += 1;
                }
                i += 1;
                prev_ident = false;
                continue;
            }
            _ => {}
        }
        if c == b'_' || c.is_ascii_alphanumeric() {
            while i < b.len() && (b[i] == b'_' || b[i].is_ascii_alphanumeric()) {
                i += 1;
            }
            prev_ident = true;
            continue;
        }
        if !c.is_ascii_whitespace() {
            prev_ident = c == b':'; // `metal::atomic<...>`
        }
        i += 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ScalarType;

    #[test]
    fn signature_matches_mlx_wrapping() {
        let desc = KernelDesc::new("k", &["x", "s"], &["out"], "out[thread_position_in_grid.x] = s * x[x_shape[0]];");
        let inputs = [HostTensor::from_f32(&[4, 4], &[0.0; 16]), HostTensor::from_f32(&[], &[1.0])];
        let launch = Launch::new(vec![(vec![4], ScalarType::F32)], [4, 1, 1], [4, 1, 1])
            .template("N", TemplateArg::Int(3))
            .template("T", TemplateArg::Dtype(ScalarType::F16))
            .template("B", TemplateArg::Bool(true));
        let g = generate(&desc, &inputs, &launch);
        assert_eq!(g.kernel_name, "custom_kernel_k__3_float16_t_1");
        let want = "template <int N, typename T, bool B>\n\
            [[kernel]] void custom_kernel_k__3_float16_t_1(\n\
            \x20 const device float* x [[buffer(0)]],\n\
            \x20 const constant int* x_shape [[buffer(1)]],\n\
            \x20 const constant float& s [[buffer(2)]],\n\
            \x20 device float* out [[buffer(3)]],\n\
            \x20 uint3 thread_position_in_grid [[thread_position_in_grid]]) {\n\
            out[thread_position_in_grid.x] = s * x[x_shape[0]];\n\
            }\n\n\
            template [[host_name(\"custom_kernel_k__3_float16_t_1\")]] [[kernel]] \
            decltype(custom_kernel_k__3_float16_t_1<3, float16_t, 1>) \
            custom_kernel_k__3_float16_t_1<3, float16_t, 1>;\n";
        assert_eq!(g.msl_source, want);
        // The C++ call instantiates with `true` and passes the shape metadata.
        assert!(g.cpp_source.contains("custom_kernel_k__3_float16_t_1<3, float16_t, true>("));
        assert!(g.cpp_source.contains("msl_sim_m[0].shape"));
        assert!(g.cpp_source.contains("*(const float*)msl_sim_b[1]"));
    }

    #[test]
    fn threadgroup_declarations_become_thread_local() {
        let src = "threadgroup float buf[64];\n  threadgroup half cb[1 << L]; threadgroup atomic<uint> n;";
        let out = rewrite_source(src);
        assert_eq!(
            out,
            "static thread_local float buf[64];\n  static thread_local half cb[1 << L]; \
             static thread_local atomic<uint> n;"
        );
    }

    #[test]
    fn threadgroup_pointers_lose_the_qualifier() {
        let src = "threadgroup float* p = buf; f((threadgroup float*)x); void g(threadgroup half& r);\n\
                   threadgroup_barrier(mem_flags::mem_threadgroup);";
        let out = rewrite_source(src);
        assert!(!out.contains("static"), "{out}");
        assert!(out.contains("threadgroup_barrier(mem_flags::mem_threadgroup)"), "{out}");
        assert_eq!(out.lines().count(), src.lines().count());
    }

    #[test]
    fn comments_strings_and_metal_includes() {
        let src = "#include <metal_stdlib>\n// threadgroup float x[2];\nconst char* s = \"threadgroup\";\n";
        let out = rewrite_source(src);
        assert!(out.starts_with("// #include <metal_stdlib>"), "{out}");
        assert!(out.contains("// threadgroup float x[2];"));
        assert!(out.contains("\"threadgroup\""));
        assert_eq!(out.lines().count(), 3);
    }
}
