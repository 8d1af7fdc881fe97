//! The MSL → C++ pre-pass of the emulator. It is line-preserving (every rewrite stays on its line,
//! and each file starts with `#line 1 "<file>"`), so compiler diagnostics and the runtime's fault
//! reports point at `.metal` lines.
//!
//! A header alone cannot express what it rewrites:
//! - `[[buffer(i)]]`, `[[threadgroup(i)]]` and builtin attributes become default arguments that read
//!   the running GPU thread, so kernels and helpers keep their MSL signatures;
//! - `threadgroup T name[dims];` in a function body becomes one allocation per threadgroup (as a
//!   plain declaration it would be per-thread, silently wrong);
//! - `float4(a, b)` becomes `make<float4>(a, b)`: clang's vector casts bitcast or take one argument;
//! - `1.5h` becomes `half(1.5f)`; a bare `coherent` (MSL 3.2 spelling without a space) is dropped;
//! - every `kernel void name(` / `[[kernel]] void name(` is registered in a table looked up by name.

/// A kernel entry point found by the pre-pass.
#[derive(Debug, Clone)]
pub struct KernelDecl {
    pub name: String,
    pub file: String,
    pub line: u32,
}

pub struct Prepassed {
    pub text: String,
    pub kernels: Vec<KernelDecl>,
}

const BUILTINS: &[&str] = &[
    "thread_position_in_grid",
    "thread_position_in_threadgroup",
    "threadgroup_position_in_grid",
    "threads_per_threadgroup",
    "threadgroups_per_grid",
    "threads_per_grid",
    "thread_index_in_threadgroup",
    "thread_index_in_simdgroup",
    "simdgroup_index_in_threadgroup",
    "simdgroups_per_threadgroup",
];

const VEC_ELEMS: &[&str] = &["float", "int", "uint", "short", "ushort", "char", "uchar", "long", "ulong"];

fn is_vec_type(id: &str) -> bool {
    let Some(last) = id.chars().last() else { return false };
    matches!(last, '2' | '3' | '4') && VEC_ELEMS.contains(&&id[..id.len() - 1])
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}
fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// C string literal for a `#line` file name.
pub fn c_string(s: &str) -> String {
    let mut o = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// Turns the files (name, MSL text), in order, into one C++ translation unit.
pub fn prepass(files: &[(&str, &str)]) -> Prepassed {
    let mut out = String::new();
    let mut kernels: Vec<KernelDecl> = Vec::new();
    for (name, text) in files {
        out.push_str(&format!("#line 1 {}\n", c_string(name)));
        one_file(name, text, &mut out, &mut kernels);
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    // The table the host reads: a lambda per kernel calls it with every argument defaulted, i.e.
    // bound to the dispatch's buffers and the running thread's builtins.
    out.push_str("#line 1 \"<msl-emu kernel table>\"\n");
    out.push_str(
        "extern \"C\" __attribute__((visibility(\"default\"))) const msl_emu_kernel msl_emu_kernel_table[] = {\n",
    );
    for k in &kernels {
        out.push_str(&format!(
            "  {{{}, []() {{ {}(); }}, {}, {}}},\n",
            c_string(&k.name),
            k.name,
            c_string(&k.file),
            k.line
        ));
    }
    out.push_str("  {nullptr, nullptr, nullptr, 0}};\n");
    Prepassed { text: out, kernels }
}

fn one_file(file: &str, src: &str, out: &mut String, kernels: &mut Vec<KernelDecl>) {
    let b = src.as_bytes();
    let n = b.len();
    let mut i = 0;
    let mut line: u32 = 1;
    let mut braces: i32 = 0;
    let mut parens: i32 = 0;
    let mut at_line_start = true;
    let mut pending_kernel = false; // saw `[[kernel]]` or `kernel`: the next `void name(` is one
    let mut last_ident = String::new();
    while i < n {
        let c = b[i];
        // Comments, strings and preprocessor lines are copied verbatim.
        if c == b'/' && i + 1 < n && b[i + 1] == b'/' {
            let e = src[i..].find('\n').map_or(n, |k| i + k);
            out.push_str(&src[i..e]);
            i = e;
            continue;
        }
        if c == b'/' && i + 1 < n && b[i + 1] == b'*' {
            let e = src[i + 2..].find("*/").map_or(n, |k| i + 2 + k + 2);
            line += src[i..e].matches('\n').count() as u32;
            out.push_str(&src[i..e]);
            i = e;
            continue;
        }
        if c == b'"' || c == b'\'' {
            let mut j = i + 1;
            while j < n && b[j] != c && b[j] != b'\n' {
                if b[j] == b'\\' {
                    j += 1;
                }
                j += 1;
            }
            let e = (j + 1).min(n);
            out.push_str(&src[i..e]);
            i = e;
            continue;
        }
        if c == b'#' && at_line_start {
            let rest = src[i + 1..].trim_start();
            if rest.starts_with("include") {
                let e = src[i..].find('\n').map_or(n, |k| i + k);
                out.push_str(&src[i..e]);
                i = e;
                continue;
            }
        }
        if c == b'\n' {
            line += 1;
            at_line_start = true;
            out.push('\n');
            i += 1;
            continue;
        }
        if !c.is_ascii_whitespace() {
            at_line_start = false;
        }
        // Attributes.
        if c == b'[' && i + 1 < n && b[i + 1] == b'[' {
            if let Some(k) = src[i + 2..].find("]]") {
                let inner = src[i + 2..i + 2 + k].trim();
                if !inner.contains('\n') {
                    if let Some(rep) = attribute(inner, &mut pending_kernel) {
                        out.push_str(&rep);
                        i = i + 2 + k + 2;
                        continue;
                    }
                }
            }
        }
        if is_ident_start(c) && (i == 0 || !is_ident(b[i - 1])) {
            let mut j = i;
            while j < n && is_ident(b[j]) {
                j += 1;
            }
            let id = &src[i..j];
            let prev = src[..i].trim_end().as_bytes().last().copied();
            match id {
                "kernel" => pending_kernel = true,
                "void" if pending_kernel => {
                    // `void name (` registers `name`.
                    let rest = &src[j..];
                    let t = rest.trim_start();
                    let nl = rest.len() - t.len();
                    let id_len = t.bytes().take_while(|&c| is_ident(c)).count();
                    if id_len > 0 && t[id_len..].trim_start().starts_with('(') {
                        let skipped = src[j..j + nl].matches('\n').count() as u32;
                        let k = t[..id_len].to_string();
                        if !kernels.iter().any(|x| x.name == k) {
                            kernels.push(KernelDecl { name: k, file: file.to_string(), line: line + skipped });
                        }
                    }
                    pending_kernel = false;
                }
                "threadgroup" if braces > 0 && parens == 0 => {
                    if let Some((rep, len)) = tg_decl(&src[j..]) {
                        out.push_str(&rep);
                        i = j + len;
                        last_ident.clear();
                        continue;
                    }
                }
                "coherent" if !src[j..].trim_start().starts_with('(') => {
                    i = j;
                    continue;
                }
                _ if is_vec_type(id)
                    && src[j..].trim_start().starts_with('(')
                    && !matches!(prev, Some(b'.') | Some(b':') | Some(b'>'))
                    && last_ident != "operator" =>
                {
                    out.push_str(&format!("::metal::make<::metal::{id}>"));
                    i = j;
                    last_ident = id.to_string();
                    continue;
                }
                _ => {}
            }
            out.push_str(id);
            last_ident = id.to_string();
            i = j;
            continue;
        }
        // Numbers: a `h` suffix makes a half literal.
        if c.is_ascii_digit() || (c == b'.' && i + 1 < n && b[i + 1].is_ascii_digit()) {
            if i > 0 && is_ident(b[i - 1]) {
                out.push(c as char);
                i += 1;
                continue;
            }
            let mut j = i;
            let hex = src[i..].starts_with("0x") || src[i..].starts_with("0X");
            while j < n {
                let d = b[j];
                // A number continues through digits, letters (suffixes, hex), the point and an
                // exponent's sign.
                let exponent_sign = (d == b'+' || d == b'-') && !hex && j > i && matches!(b[j - 1], b'e' | b'E');
                if !(is_ident(d) || d == b'.' || exponent_sign) {
                    break;
                }
                j += 1;
            }
            let tok = &src[i..j];
            if !hex && (tok.ends_with('h') || tok.ends_with('H')) {
                let body = &tok[..tok.len() - 1];
                if body.contains('.') || body.contains('e') || body.contains('E') {
                    out.push_str(&format!("half({body}f)"));
                } else {
                    out.push_str(&format!("half({body})"));
                }
            } else {
                out.push_str(tok);
            }
            i = j;
            continue;
        }
        match c {
            b'{' => braces += 1,
            b'}' => braces -= 1,
            b'(' => parens += 1,
            b')' => parens -= 1,
            _ => {}
        }
        // Copy one character (may be multi-byte UTF-8).
        let ch = src[i..].chars().next().unwrap();
        out.push(ch);
        i += ch.len_utf8();
    }
}

/// The replacement for `[[inner]]`, or None to leave it for the compiler (an unknown attribute is
/// a build error there, so unsupported inputs such as `[[texture(0)]]` fail loudly).
fn attribute(inner: &str, pending_kernel: &mut bool) -> Option<String> {
    let (name, arg) = match inner.find('(') {
        Some(p) if inner.ends_with(')') => {
            let a = inner[p + 1..inner.len() - 1].trim();
            (inner[..p].trim(), Some(a))
        }
        _ => (inner, None),
    };
    match (name, arg) {
        ("kernel", None) => {
            *pending_kernel = true;
            Some(String::new())
        }
        ("buffer", Some(a)) if a.parse::<u32>().is_ok() => Some(format!("= ::metal_emu::buffer({a})")),
        ("threadgroup", Some(a)) if a.parse::<u32>().is_ok() => Some(format!("= ::metal_emu::tg_arg({a})")),
        (b, None) if BUILTINS.contains(&b) => Some(format!("= MSL_EMU_BUILTIN_{b}")),
        _ => None,
    }
}

/// `T name[dims];` after `threadgroup` (on one line, no pointer or initialiser): returns the
/// replacement for `threadgroup T name[dims]` and how many bytes after `threadgroup` it covers
/// (the `;` is left in place).
fn tg_decl(rest: &str) -> Option<(String, usize)> {
    let semi = rest.find(';')?;
    let decl = &rest[..semi];
    // Pointers, references, initialisers and multi-line declarations are left alone; a `,` is
    // only accepted inside a template argument list (not several declarators).
    if decl.contains(['*', '&', '=', '(', ')', '{', '}', '\n']) || (decl.contains(',') && !decl.contains('<')) {
        return None;
    }
    let mut d = decl.trim_end();
    let mut dims = String::new();
    while d.ends_with(']') {
        let open = d.rfind('[')?;
        dims.insert_str(0, &d[open..]);
        d = d[..open].trim_end();
    }
    let name_len = d.bytes().rev().take_while(|&c| is_ident(c)).count();
    if name_len == 0 {
        return None;
    }
    let name = &d[d.len() - name_len..];
    let ty = d[..d.len() - name_len].trim();
    if ty.is_empty() || !name.as_bytes()[0].is_ascii_alphabetic() && name.as_bytes()[0] != b'_' {
        return None;
    }
    Some((format!("MSL_EMU_TG_VAR({name}, {dims}, {ty})"), semi))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_keep_lines() {
        let src = "#include <metal_stdlib>\nusing namespace metal;\nkernel void k(device float* x [[buffer(0)]],\n uint t [[thread_position_in_grid]]) {\n  threadgroup float s[32];\n  float4 v = float4(1.5h, 2, 3, 4);\n}\n";
        let p = prepass(&[("a.metal", src)]);
        assert_eq!(p.kernels.len(), 1);
        assert_eq!(p.kernels[0].name, "k");
        assert_eq!(p.kernels[0].line, 3);
        assert!(p.text.contains("MSL_EMU_TG_VAR(s, [32], float);"));
        assert!(p.text.contains("::metal::make<::metal::float4>(half(1.5f), 2, 3, 4)"));
        assert!(p.text.contains("= ::metal_emu::buffer(0)"));
        let body: Vec<&str> = p.text.lines().collect();
        assert_eq!(body[0], "#line 1 \"a.metal\"");
        assert!(body[1 + 4].trim_start().starts_with("MSL_EMU_TG_VAR"));
    }
}
