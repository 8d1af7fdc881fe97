//! Chat templates: the model's Jinja template rendered the way `transformers`'
//! `apply_chat_template(..., tokenize=False)` renders it. This module owns finding the template
//! (`chat_template.jinja`, `tokenizer_config.json`), the BOS/EOS strings it is given, the
//! Jinja environment that mimics Hugging Face's (block trimming, `raise_exception`, Python string
//! methods, a non-escaping `tojson`, `strftime_now`, the `{% generation %}` tag) and reading a
//! messages file for the command line. Tokenising the result is [`crate::tokenizer`]'s job.

use std::collections::BTreeMap;
use std::path::Path;

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Environment, ErrorKind, Value};

use crate::error::{Error, Result};

/// Name under which the template is registered in its environment.
const TEMPLATE_NAME: &str = "chat_template";

/// One chat message: a role (`system`, `user`, `assistant`, or anything the template accepts)
/// and its text.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Message {
    /// Who speaks: `system`, `user`, `assistant`, ...
    pub role: String,
    /// What they say.
    pub content: String,
}

impl Message {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message { role: role.into(), content: content.into() }
    }
}

/// A compiled chat template plus the special-token strings it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// Other entries of HF's `special_tokens_map` (`pad_token`, `unk_token`, ...): templates may
    /// refer to them, and `transformers` passes them all.
    other_tokens: BTreeMap<String, String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("other_tokens", &self.other_tokens)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; a syntax error is reported with its line.
    pub fn new(source: String, bos_token: String, eos_token: String) -> Result<Self> {
        let env = hf_environment(source)?;
        Ok(ChatTemplate { env, bos_token, eos_token, other_tokens: BTreeMap::new() })
    }

    /// Looks in `dir` for `chat_template.jinja`, then `tokenizer_config.json`'s `"chat_template"`
    /// (a string, or a list of `{name, template}` of which the one named `default` is used), then
    /// `chat_template.json` (processor format, `{"chat_template": ...}`). `Ok(None)` if none
    /// has a template. The BOS/EOS strings come from `tokenizer_config.json` (`bos_token` /
    /// `eos_token`, a string or `{"content": ...}`), defaulting to `<bos>` / `<eos>`.
    pub fn from_model_dir(dir: &Path) -> Result<Option<Self>> {
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg_text = read_optional(&cfg_path)?;
        let cfg = match &cfg_text {
            Some(text) => Some(parse_json_object(&cfg_path.display().to_string(), text)?),
            None => None,
        };

        let jinja_path = dir.join("chat_template.jinja");
        let (source, origin) = if let Some(src) = read_optional(&jinja_path)? {
            (src, jinja_path)
        } else if let Some(src) =
            cfg.as_ref().map(|c| template_from_config(&cfg_path.display().to_string(), c)).transpose()?.flatten()
        {
            (src, cfg_path)
        } else {
            let json_path = dir.join("chat_template.json");
            match read_optional(&json_path)? {
                Some(text) => {
                    let name = json_path.display().to_string();
                    let obj = parse_json_object(&name, &text)?;
                    match template_from_config(&name, &obj)? {
                        Some(src) => (src, json_path),
                        None => return Ok(None),
                    }
                }
                None => return Ok(None),
            }
        };

        Self::build(source, cfg.as_ref())
            .map(Some)
            .map_err(|e| Error::Template(format!("{}: {}", origin.display(), strip_prefix(e))))
    }

    /// Like [`ChatTemplate::from_model_dir`], from strings: the template source and optionally
    /// the text of `tokenizer_config.json` (for the BOS/EOS strings; its own `chat_template`, if
    /// any, is ignored in favour of `template`).
    pub fn from_sources(template: &str, tokenizer_config_json: Option<&str>) -> Result<Self> {
        let cfg = tokenizer_config_json.map(|text| parse_json_object("tokenizer_config.json", text)).transpose()?;
        Self::build(template.to_string(), cfg.as_ref())
    }

    fn build(source: String, cfg: Option<&serde_json::Map<String, serde_json::Value>>) -> Result<Self> {
        let token = |key: &str| cfg.and_then(|c| token_string(c.get(key)?));
        let mut t = ChatTemplate::new(
            source,
            token("bos_token").unwrap_or_else(|| "<bos>".into()),
            token("eos_token").unwrap_or_else(|| "<eos>".into()),
        )?;
        for key in ["unk_token", "pad_token", "mask_token", "sep_token", "cls_token"] {
            if let Some(v) = token(key) {
                t.other_tokens.insert(key.to_string(), v);
            }
        }
        Ok(t)
    }

    /// The BOS string the template is rendered with.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The EOS string the template is rendered with.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders `messages`. `add_generation_prompt` appends the header of the model's turn.
    /// `extra` is a JSON object of extra template kwargs (e.g. `{"enable_thinking": true}`,
    /// `{"tools": [...]}`); `Value::Null` for none.
    ///
    /// As in `transformers`, the template also sees `bos_token`, `eos_token` (and the other
    /// special tokens of `tokenizer_config.json`) and `tools`/`documents` (none unless given in
    /// `extra`).
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &serde_json::Value,
    ) -> Result<String> {
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        for (k, v) in &self.other_tokens {
            ctx.insert(k.clone(), Value::from(v.as_str()));
        }
        ctx.insert("bos_token".into(), Value::from(self.bos_token.as_str()));
        ctx.insert("eos_token".into(), Value::from(self.eos_token.as_str()));
        ctx.insert("tools".into(), Value::from(()));
        ctx.insert("documents".into(), Value::from(()));
        match extra {
            serde_json::Value::Null => {}
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    if k == "messages" || k == "add_generation_prompt" {
                        return Err(Error::Template(format!(
                            "extra template argument `{k}` would override the {k} parameter: \
                             pass it as the parameter instead"
                        )));
                    }
                    ctx.insert(k.clone(), Value::from_serialize(v));
                }
            }
            other => {
                return Err(Error::Template(format!(
                    "extra template arguments must be a JSON object such as \
                     {{\"enable_thinking\": true}}, got {other}"
                )))
            }
        }
        ctx.insert("messages".into(), Value::from_serialize(messages));
        ctx.insert("add_generation_prompt".into(), Value::from(add_generation_prompt));

        let tmpl = self.env.get_template(TEMPLATE_NAME).map_err(|e| Error::Template(describe(&e)))?;
        tmpl.render(ctx).map_err(|e| {
            if e.kind() == ErrorKind::InvalidOperation && is_raised(&e) {
                Error::Template(format!(
                    "the model's chat template rejected these messages: {}",
                    e.detail().unwrap_or("").trim_start_matches(RAISED_MARKER)
                ))
            } else {
                Error::Template(format!("rendering failed: {}", describe(&e)))
            }
        })
    }
}

/// Parse a messages file: a JSON list of `{"role": ..., "content": ...}`. Errors name the file
/// and the problem (not a list, missing role, content not a string); any role string is
/// accepted, the template decides what it allows.
pub fn read_messages(path: &Path) -> Result<Vec<Message>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let p = path.display();
    const SHAPE: &str = r#"[{"role": "user", "content": "Hello"}]"#;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Invalid(format!("{p}: not valid JSON ({e}): expected a list like {SHAPE}")))?;
    let serde_json::Value::Array(items) = value else {
        return Err(Error::Invalid(format!(
            "{p}: expected a JSON list of messages like {SHAPE}, found {}",
            json_kind(&value)
        )));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Some(obj) = item.as_object() else {
            return Err(Error::Invalid(format!(
                "{p}: message {i} is {}, expected an object like {{\"role\": \"user\", \"content\": \"Hello\"}}",
                json_kind(item)
            )));
        };
        let role = match obj.get("role") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(Error::Invalid(format!(
                    "{p}: message {i}: \"role\" must be a string such as \"user\", found {}",
                    json_kind(other)
                )))
            }
            None => {
                return Err(Error::Invalid(format!(
                    "{p}: message {i} has no \"role\": add one (\"system\", \"user\" or \"assistant\")"
                )))
            }
        };
        let content = match obj.get("content") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(Error::Invalid(format!(
                    "{p}: message {i}: \"content\" must be a string, found {} (lists of content \
                     parts are not supported: put the text in one string)",
                    json_kind(other)
                )))
            }
            None => return Err(Error::Invalid(format!("{p}: message {i} has no \"content\": add the message text"))),
        };
        out.push(Message { role, content });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Locating the template and token strings.

/// `Ok(None)` when the file does not exist; any other read failure is an error.
fn read_optional(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

fn parse_json_object(name: &str, text: &str) -> Result<serde_json::Map<String, serde_json::Value>> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(other) => Err(Error::Template(format!("{name}: expected a JSON object, found {}", json_kind(&other)))),
        Err(e) => Err(Error::Template(format!("{name}: not valid JSON ({e})"))),
    }
}

/// The `chat_template` entry: a string, or HF's list of named templates (the `default` one).
fn template_from_config(name: &str, cfg: &serde_json::Map<String, serde_json::Value>) -> Result<Option<String>> {
    match cfg.get("chat_template") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(serde_json::Value::Array(list)) => {
            let mut names = Vec::new();
            for entry in list {
                let n = entry.get("name").and_then(|v| v.as_str());
                let t = entry.get("template").and_then(|v| v.as_str());
                match (n, t) {
                    (Some("default"), Some(t)) => return Ok(Some(t.to_string())),
                    (Some(n), Some(_)) => names.push(n.to_string()),
                    _ => {
                        return Err(Error::Template(format!(
                            "{name}: every entry of the \"chat_template\" list needs string \
                             \"name\" and \"template\" fields"
                        )))
                    }
                }
            }
            Err(Error::Template(format!(
                "{name}: \"chat_template\" lists templates {names:?} but none named \"default\": \
                 put the one to use in chat_template.jinja"
            )))
        }
        Some(other) => Err(Error::Template(format!(
            "{name}: \"chat_template\" must be a string or a list of {{name, template}}, found {}",
            json_kind(other)
        ))),
    }
}

/// A special token in `tokenizer_config.json`: a string or an `AddedToken` object.
fn token_string(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Drops the `chat template: ` prefix of an [`Error::Template`] so it can be re-wrapped with
/// the file name without repeating it.
fn strip_prefix(e: Error) -> String {
    match e {
        Error::Template(s) => s,
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// The Hugging Face-compatible Jinja environment.

/// Marks errors raised by the template itself via `raise_exception`, to tell them apart from
/// engine errors when reporting.
const RAISED_MARKER: &str = "raise_exception: ";

fn is_raised(e: &minijinja::Error) -> bool {
    e.detail().is_some_and(|d| d.starts_with(RAISED_MARKER))
}

/// The error with its line and the chain of causes, on one line.
fn describe(e: &minijinja::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// An environment configured like `transformers`' `_compile_jinja_template`:
/// `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with `tojson`,
/// `raise_exception` and `strftime_now`, plus Python string/dict methods (which Jinja2 gets
/// from Python itself).
fn hf_environment(source: String) -> Result<Environment<'static>> {
    let mut env = Environment::new();
    // transformers sets both; templates written with explicit `-` markers are unaffected, others
    // depend on it for their newlines.
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, minijinja::Error> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, format!("{RAISED_MARKER}{msg}")))
    });
    env.add_function("strftime_now", |fmt: String| -> std::result::Result<String, minijinja::Error> {
        strftime_now(&fmt)
    });
    env.add_filter("tojson", tojson_filter);
    let source = rewrite_generation_tags(&source);
    env.add_template_owned(TEMPLATE_NAME, source).map_err(|e| {
        Error::Template(format!(
            "does not compile: {}: the template uses syntax this Jinja engine (minijinja) does \
             not support; fix it or supply a corrected chat_template.jinja",
            describe(&e)
        ))
    })?;
    Ok(env)
}

/// `transformers` defines `{% generation %}...{% endgeneration %}` (marks assistant tokens for
/// training masks; renders its body unchanged). minijinja has no such tag, so turn it into an
/// always-true `if`, keeping any `-`/`+` whitespace markers so trimming is identical.
fn rewrite_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(pos) = rest.find("{%") {
        out.push_str(&rest[..pos]);
        let tag = &rest[pos + 2..];
        let marker_len = usize::from(tag.starts_with('-') || tag.starts_with('+'));
        let after_marker = &tag[marker_len..];
        let body = after_marker.trim_start();
        let ws_len = after_marker.len() - body.len();
        let replaced = [("endgeneration", "endif"), ("generation", "if true")].iter().find_map(|(kw, repl)| {
            let tail = body.strip_prefix(kw)?;
            let t = tail.trim_start();
            let ends = t.starts_with("%}") || t.starts_with("-%}") || t.starts_with("+%}");
            ends.then_some((kw.len(), *repl))
        });
        out.push_str("{%");
        out.push_str(&tag[..marker_len + ws_len]);
        let mut consumed = pos + 2 + marker_len + ws_len;
        if let Some((kw_len, repl)) = replaced {
            out.push_str(repl);
            consumed += kw_len;
        }
        rest = &rest[consumed..];
    }
    out.push_str(rest);
    out
}

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`:
/// `json.dumps` without Jinja2's HTML escaping and with insertion-ordered keys.
fn tojson_filter(value: Value, args: Rest<Value>) -> std::result::Result<String, minijinja::Error> {
    let mut positional: Vec<Value> = args.0;
    let kwargs = match positional.last() {
        Some(last) if last.is_kwargs() => {
            let last = positional.pop().unwrap_or_default();
            Some(Kwargs::try_from(last)?)
        }
        _ => None,
    };
    let mut opts = JsonOpts::default();
    // Python's positional order after x: ensure_ascii, indent, separators, sort_keys.
    let get = |i: usize, key: &str| -> std::result::Result<Option<Value>, minijinja::Error> {
        if let Some(kw) = &kwargs {
            if kw.has(key) {
                return Ok(Some(kw.get::<Value>(key)?));
            }
        }
        Ok(positional.get(i).cloned())
    };
    if let Some(v) = get(0, "ensure_ascii")? {
        opts.ensure_ascii = v.is_true();
    }
    let indent = get(1, "indent")?;
    let separators = get(2, "separators")?;
    if let Some(v) = get(3, "sort_keys")? {
        opts.sort_keys = v.is_true();
    }
    if let Some(kw) = &kwargs {
        kw.assert_all_used()?;
    }
    opts.indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or("").to_string()),
        Some(v) => match v.as_i64() {
            // Python: a negative or zero indent still means "newlines, no indentation".
            Some(n) => Some(" ".repeat(n.max(0) as usize)),
            None => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: indent must be an integer or a string, got {v}"),
                ))
            }
        },
    };
    if opts.indent.is_some() {
        opts.item_sep = ",".into();
    }
    if let Some(sep) = separators.filter(|v| !v.is_none() && !v.is_undefined()) {
        let parts: Vec<Value> = sep.try_iter()?.collect();
        match parts.as_slice() {
            [a, b] if a.kind() == ValueKind::String && b.kind() == ValueKind::String => {
                opts.item_sep = a.as_str().unwrap_or_default().to_string();
                opts.key_sep = b.as_str().unwrap_or_default().to_string();
            }
            _ => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair of strings such as (',', ':')",
                ))
            }
        }
    }
    let mut out = String::new();
    write_json(&mut out, &value, &opts, 0)?;
    Ok(out)
}

struct JsonOpts {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl Default for JsonOpts {
    fn default() -> Self {
        JsonOpts { ensure_ascii: false, indent: None, item_sep: ", ".into(), key_sep: ": ".into(), sort_keys: false }
    }
}

/// Python's `json.dumps` output format for a template value.
fn write_json(out: &mut String, v: &Value, opts: &JsonOpts, level: usize) -> std::result::Result<(), minijinja::Error> {
    let not_serializable = |what: &str| {
        minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {what} is not JSON serializable"))
    };
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let f = f64::try_from(v.clone())?;
                out.push_str(&py_float_json(f));
            }
        }
        ValueKind::String => write_json_str(out, v.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, opts, level, '[', ']', &items, |out, item, lvl| write_json(out, item, opts, lvl))?;
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in v.try_iter()? {
                let val = v.get_item(&key)?;
                entries.push((json_key(&key).ok_or_else(|| not_serializable("a map key of this type"))?, val));
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, opts, level, '{', '}', &entries, |out, (k, val), lvl| {
                write_json_str(out, k, opts.ensure_ascii);
                out.push_str(&opts.key_sep);
                write_json(out, val, opts, lvl)
            })?;
        }
        ValueKind::Undefined => return Err(not_serializable("an undefined value")),
        _ => return Err(not_serializable(&format!("a value of kind {}", v.kind()))),
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    opts: &JsonOpts,
    level: usize,
    open: char,
    close: char,
    items: &[T],
    mut each: impl FnMut(&mut String, &T, usize) -> std::result::Result<(), minijinja::Error>,
) -> std::result::Result<(), minijinja::Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&opts.item_sep);
        }
        if let Some(ind) = &opts.indent {
            out.push('\n');
            out.push_str(&ind.repeat(level + 1));
        }
        each(out, item, level + 1)?;
    }
    if let Some(ind) = &opts.indent {
        out.push('\n');
        out.push_str(&ind.repeat(level));
    }
    out.push(close);
    Ok(())
}

/// Python converts str, int, float, bool and None keys to strings; anything else is a TypeError.
fn json_key(k: &Value) -> Option<String> {
    match k.kind() {
        ValueKind::String => k.as_str().map(str::to_string),
        ValueKind::None => Some("null".into()),
        ValueKind::Bool => Some(if k.is_true() { "true" } else { "false" }.into()),
        ValueKind::Number if k.is_integer() => Some(k.to_string()),
        ValueKind::Number => f64::try_from(k.clone()).ok().map(py_float_json),
        _ => None,
    }
}

/// A JSON string literal as Python's encoder writes it.
fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            // ensure_ascii escapes everything outside printable ASCII, DEL included.
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{:04x}", unit));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `float.__repr__` (as `json.dumps` writes floats): shortest round-trip digits,
/// positional for exponents in [-4, 16), else `1e-05` / `1.5e+16`; non-finite as `NaN`,
/// `Infinity`.
fn py_float_json(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // `{:e}` yields the shortest round-trip digits, e.g. "-1.2345e-5".
    let sci = format!("{:e}", f.abs());
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mant.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if f < 0.0 { "-" } else { "" };
    let n = digits.len() as i32;
    let body = if (-4..16).contains(&exp) {
        if exp >= 0 {
            if n <= exp + 1 {
                format!("{digits}{}.0", "0".repeat((exp + 1 - n) as usize))
            } else {
                let (a, b) = digits.split_at((exp + 1) as usize);
                format!("{a}.{b}")
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let (a, b) = digits.split_at(1);
        let frac = if b.is_empty() { String::new() } else { format!(".{b}") };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{a}{frac}e{esign}{:02}", exp.abs())
    };
    format!("{sign}{body}")
}

/// HF's `strftime_now(format)`, in UTC (no time-zone database here; templates use it for a
/// "today is" line). Supports the common directives: %Y %y %m %d %e %H %I %M %S %p %j %b %B %a
/// %A %%, and glibc's `%-d`-style no-padding flag.
fn strftime_now(fmt: &str) -> std::result::Result<String, minijinja::Error> {
    let secs =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    Ok(format_time_utc(secs, fmt))
}

fn format_time_utc(secs: i64, fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (sod / 3600, (sod / 60) % 60, sod % 60);
    // 1970-01-01 was a Thursday (index 3 with Monday = 0).
    let wday = (days + 3).rem_euclid(7) as usize;
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let h12 = if hh % 12 == 0 { 12 } else { hh % 12 };

    let mut out = String::new();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let no_pad = chars.peek() == Some(&'-');
        if no_pad {
            chars.next();
        }
        let num = |v: i64, w: usize| {
            if no_pad {
                v.to_string()
            } else {
                format!("{v:0w$}")
            }
        };
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&num(y.rem_euclid(100), 2)),
            Some('m') => out.push_str(&num(m, 2)),
            Some('d') => out.push_str(&num(d, 2)),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('H') => out.push_str(&num(hh, 2)),
            Some('I') => out.push_str(&num(h12, 2)),
            Some('M') => out.push_str(&num(mm, 2)),
            Some('S') => out.push_str(&num(ss, 2)),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('j') => out.push_str(&num(yday, 3)),
            Some('b') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('a') => out.push_str(&DAYS[wday][..3]),
            Some('A') => out.push_str(DAYS[wday]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if no_pad {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 → (year, month 1..=12, day 1..=31), proleptic Gregorian
/// (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render_one(src: &str, extra: serde_json::Value) -> Result<String> {
        let t = ChatTemplate::new(src.into(), "<bos>".into(), "<eos>".into())?;
        t.render(&[Message::new("user", "hi")], false, &extra)
    }

    #[test]
    fn blocks_are_trimmed_like_transformers() {
        // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before it.
        let src = "{% for m in messages %}\n  {% if true %}\n[{{ m.role }}]\n  {% endif %}\n{% endfor %}";
        assert_eq!(render_one(src, serde_json::Value::Null).unwrap(), "[user]\n");
    }

    #[test]
    fn python_string_methods_work() {
        let src = "{{ 'a,b'.split(',')[1] }}{{ ' x '.strip() }}{{ messages[0].content.startswith('h') }}";
        // Jinja2 prints booleans the Python way.
        assert_eq!(render_one(src, serde_json::Value::Null).unwrap(), "bxTrue");
    }

    #[test]
    fn raise_exception_reports_the_message() {
        let err =
            render_one("{{ raise_exception('only user turns') }}", serde_json::Value::Null).unwrap_err().to_string();
        assert!(err.contains("only user turns"), "{err}");
        assert!(!err.contains(RAISED_MARKER), "{err}");
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let extra = serde_json::json!({"x": {"b": [1, 2.5, "é<&>'"], "a": null, "c": true, "f": 1e-5, "g": 1e16}});
        let out = render_one("{{ x | tojson }}", extra.clone()).unwrap();
        // serde_json (without preserve_order) hands keys over sorted, hence a, b, c.
        assert_eq!(out, r#"{"a": null, "b": [1, 2.5, "é<&>'"], "c": true, "f": 1e-05, "g": 1e+16}"#);
        let out = render_one("{{ x.b | tojson(indent=2) }}", extra.clone()).unwrap();
        assert_eq!(out, "[\n  1,\n  2.5,\n  \"é<&>'\"\n]");
        let out = render_one("{{ x.b | tojson(ensure_ascii=true, separators=(',', ':')) }}", extra).unwrap();
        assert_eq!(out, r#"[1,2.5,"\u00e9<&>'"]"#);
    }

    #[test]
    fn py_float_repr_cases() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (123.456, "123.456"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e300, "1.5e+300"),
            (-2.5, "-2.5"),
        ] {
            assert_eq!(py_float_json(f), s);
        }
    }

    #[test]
    fn generation_tag_renders_its_body() {
        let src = "{%- generation -%} A {%- endgeneration %}B{% generation %}C{% endgeneration %}";
        assert_eq!(render_one(src, serde_json::Value::Null).unwrap(), "ABC");
    }

    #[test]
    fn extra_must_be_an_object_and_not_override_parameters() {
        assert!(render_one("x", serde_json::json!([1])).is_err());
        let err = render_one("x", serde_json::json!({"messages": []})).unwrap_err();
        assert!(err.to_string().contains("messages"));
    }

    #[test]
    fn syntax_error_is_reported() {
        let err = ChatTemplate::new("{% if %}".into(), "".into(), "".into()).unwrap_err();
        assert!(err.to_string().contains("does not compile"), "{err}");
    }

    #[test]
    fn config_list_form_and_token_objects() {
        let cfg = r#"{"bos_token": {"content": "<s>"}, "eos_token": "</s>",
                      "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#;
        let obj = parse_json_object("cfg", cfg).unwrap();
        assert_eq!(template_from_config("cfg", &obj).unwrap().as_deref(), Some("D"));
        let t = ChatTemplate::from_sources("{{ bos_token }}{{ eos_token }}", Some(cfg)).unwrap();
        assert_eq!(t.render(&[], false, &serde_json::Value::Null).unwrap(), "<s></s>");
    }

    #[test]
    fn utc_formatting() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(format_time_utc(t, "%d %b %Y"), "29 Feb 2024");
        assert_eq!(format_time_utc(t, "%A %-m/%-d %I:%M:%S %p %j %%"), "Thursday 2/29 01:05:09 PM 060 %");
    }
}
