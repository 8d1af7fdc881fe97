//! Tokenizer, streaming decoder and chat template against the outputs `transformers` produced
//! for the fixture tokenizer (`tests/fixtures/tokenizer/tokenizer_tests.json`).

use std::path::{Path, PathBuf};

use kestrel::chat::{read_messages, ChatTemplate, Message};
use kestrel::tokenizer::{StreamDecoder, Tokenizer};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn tok_dir() -> PathBuf {
    fixtures().join("tokenizer")
}

fn load_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn tests_json() -> Value {
    load_json(&tok_dir().join("tokenizer_tests.json"))
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(&tok_dir().join("tokenizer.json")).expect("fixture tokenizer loads")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id list").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> String {
    let mut dec = StreamDecoder::new(skip_special);
    let mut out = String::new();
    for &id in ids {
        out.push_str(&dec.push(tok, id).expect("push"));
    }
    out.push_str(&dec.finish(tok).expect("finish"));
    out
}

#[test]
fn vocabulary_and_special_tokens() {
    let t = tokenizer();
    let j = tests_json();
    assert_eq!(t.vocab_size() as u64, j["vocab_size"].as_u64().unwrap());
    for (name, id) in j["special_tokens"].as_object().unwrap() {
        assert_eq!(t.token_id(name), Some(id.as_u64().unwrap() as u32), "{name}");
    }
    assert_eq!(t.token_id("\n"), Some(j["newline_id"].as_u64().unwrap() as u32));
    assert_eq!(t.bos_token().as_deref(), Some("<bos>"));
    assert_eq!(t.eos_token().as_deref(), Some("<eos>"));
}

#[test]
fn encode_cases_match_transformers() {
    let t = tokenizer();
    let j = tests_json();
    let cases = j["encode_cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        assert_eq!(t.encode(text, false).unwrap(), want, "ids of {text:?}");
        assert_eq!(
            t.encode(text, true).unwrap(),
            ids(&case["ids_with_special_tokens"]),
            "ids_with_special_tokens of {text:?}"
        );
        let decoded = case["decoded"].as_str().unwrap();
        assert_eq!(t.decode(&want, false).unwrap(), decoded, "decoded of {text:?}");
        assert_eq!(
            t.decode(&want, true).unwrap(),
            case["decoded_skip_special"].as_str().unwrap(),
            "decoded_skip_special of {text:?}"
        );
        assert_eq!(stream(&t, &want, false), decoded, "streamed decode of {text:?}");
        assert_eq!(
            stream(&t, &want, true),
            case["decoded_skip_special"].as_str().unwrap(),
            "streamed decode (skip special) of {text:?}"
        );
    }
}

#[test]
fn stream_decoder_holds_back_partial_characters() {
    let t = tokenizer();
    // "€" is three byte-fallback tokens: nothing may come out before the third.
    let bytes: Vec<u32> = ["<0xE2>", "<0x82>", "<0xAC>"].iter().map(|b| t.token_id(b).expect("byte token")).collect();
    let mut dec = StreamDecoder::new(false);
    assert_eq!(dec.push(&t, bytes[0]).unwrap(), "");
    assert_eq!(dec.push(&t, bytes[1]).unwrap(), "");
    assert_eq!(dec.push(&t, bytes[2]).unwrap(), "€");
    // An unfinished character is flushed (as U+FFFD) by finish().
    assert_eq!(dec.push(&t, bytes[0]).unwrap(), "");
    assert_eq!(dec.finish(&t).unwrap(), "\u{FFFD}");
}

#[test]
fn stream_decoder_matches_decode_on_random_ids() {
    // Random id sequences mix byte-fallback runs, pieces with "▁" and control tokens. Wherever
    // the full decode is well-formed, the streamed text must equal it exactly.
    let t = tokenizer();
    let n = t.vocab_size() as u64;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut checked = 0;
    for _ in 0..2000 {
        let len = 1 + (next() % 24) as usize;
        let ids: Vec<u32> = (0..len).map(|_| (next() % n) as u32).collect();
        for skip in [false, true] {
            let want = t.decode(&ids, skip).unwrap();
            if want.contains('\u{FFFD}') {
                continue;
            }
            assert_eq!(stream(&t, &ids, skip), want, "ids {ids:?} skip {skip}");
            checked += 1;
        }
    }
    assert!(checked > 500, "only {checked} well-formed sequences");

    // Encoded text is full of multi-byte characters split over byte tokens.
    let pieces = ["é", "日本", "😀", "—", " ", "  ", "\n", "a", "ab", "<|turn>", "<channel|>", "Z", "ü"];
    for _ in 0..500 {
        let len = 1 + (next() % 12) as usize;
        let text: String = (0..len).map(|_| pieces[(next() % pieces.len() as u64) as usize]).collect();
        let ids = t.encode(&text, true).unwrap();
        let want = t.decode(&ids, false).unwrap();
        assert_eq!(want, format!("<bos>{text}"));
        assert_eq!(stream(&t, &ids, false), want, "text {text:?}");
        assert_eq!(stream(&t, &ids, true), t.decode(&ids, true).unwrap(), "text {text:?}");
    }
}

#[test]
fn decode_rejects_ids_outside_the_vocabulary() {
    let t = tokenizer();
    let err = t.decode(&[2, 100_000], false).unwrap_err().to_string();
    assert!(err.contains("100000"), "{err}");
}

/// One chat case of the fixture: its messages, `add_generation_prompt`, and the other template
/// arguments.
fn chat_case(case: &Value) -> (Vec<Message>, bool, Value) {
    let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
    let mut kwargs = case["kwargs"].as_object().cloned().unwrap_or_default();
    let add_gen = kwargs.remove("add_generation_prompt").and_then(|v| v.as_bool()).unwrap_or(false);
    (messages, add_gen, Value::Object(kwargs))
}

#[test]
fn chat_cases_match_transformers() {
    let t = tokenizer();
    let tmpl = ChatTemplate::from_model_dir(&tok_dir()).expect("template loads").expect("fixture dir has a template");
    let j = tests_json();
    let cases = j["chat_cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for (i, case) in cases.iter().enumerate() {
        let (messages, add_gen, kwargs) = chat_case(case);
        let rendered = tmpl.render(&messages, add_gen, &kwargs).unwrap_or_else(|e| panic!("chat case {i}: {e}"));
        assert_eq!(rendered, case["rendered"].as_str().unwrap(), "chat case {i}");
        assert_eq!(t.encode(&rendered, false).unwrap(), ids(&case["ids"]), "chat case {i} ids");
    }
}

/// A model folder may carry its template in `chat_template.jinja` or only as
/// `tokenizer_config.json`'s `"chat_template"`; the fixture tokenizer carries both, and both
/// must render every chat case identically (and as transformers did). The config side is
/// loaded from a folder without the `.jinja` file, so `from_model_dir` has to take the
/// template from the config: a config template that drifted from the file, or a lookup that
/// silently fell back to the file, fails here.
#[test]
fn config_template_equals_jinja_file() {
    let dir = tok_dir();
    let src = std::fs::read_to_string(dir.join("chat_template.jinja")).unwrap();
    let cfg = std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap();
    let from_file = ChatTemplate::from_sources(&src, Some(&cfg)).unwrap();

    let only_cfg = std::env::temp_dir().join(format!("kestrel-tokenizer-config-only-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&only_cfg);
    std::fs::create_dir_all(&only_cfg).unwrap();
    std::fs::write(only_cfg.join("tokenizer_config.json"), &cfg).unwrap();
    let from_cfg = ChatTemplate::from_model_dir(&only_cfg);
    std::fs::remove_dir_all(&only_cfg).unwrap();
    let from_cfg = from_cfg.unwrap().expect("tokenizer_config.json carries a chat_template");

    let j = tests_json();
    let cases = j["chat_cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for (i, case) in cases.iter().enumerate() {
        let (messages, add_gen, kwargs) = chat_case(case);
        let a = from_file.render(&messages, add_gen, &kwargs).unwrap();
        let b = from_cfg.render(&messages, add_gen, &kwargs).unwrap();
        assert_eq!(b, a, "chat case {i}: tokenizer_config.json's template renders differently from the .jinja file");
        assert_eq!(a, case["rendered"].as_str().unwrap(), "chat case {i}");
    }
}

#[test]
fn fixture_chat_prompt_encodes_to_its_ids() {
    let t = tokenizer();
    let prompts = load_json(&fixtures().join("prompts.json"));
    let chat =
        prompts.as_array().unwrap().iter().find(|p| p["name"] == "chat").expect("prompts.json has a \"chat\" entry");
    let text = chat["text"].as_str().unwrap();
    assert_eq!(t.encode(text, false).unwrap(), ids(&chat["ids"]));
    assert_eq!(t.decode(&ids(&chat["ids"]), false).unwrap(), text);
}

#[test]
fn read_messages_accepts_a_list_and_rejects_bad_shapes() {
    let dir = std::env::temp_dir().join(format!("kestrel-tokenizer-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    };

    let good = write("good.json", r#"[{"role": "user", "content": "hi"}, {"role": "narrator", "content": "x"}]"#);
    assert_eq!(read_messages(&good).unwrap(), vec![Message::new("user", "hi"), Message::new("narrator", "x")]);

    let not_list = write("not_a_list.json", r#"{"role": "user", "content": "hi"}"#);
    let err = read_messages(&not_list).unwrap_err().to_string();
    assert!(err.contains("not_a_list.json") && err.contains("list"), "{err}");

    let no_role = write("no_role.json", r#"[{"content": "hi"}]"#);
    let err = read_messages(&no_role).unwrap_err().to_string();
    assert!(err.contains("no_role.json") && err.contains("role"), "{err}");

    let bad_content = write("bad_content.json", r#"[{"role": "user", "content": [1]}]"#);
    let err = read_messages(&bad_content).unwrap_err().to_string();
    assert!(err.contains("bad_content.json") && err.contains("content"), "{err}");

    let missing = dir.join("missing.json");
    let err = read_messages(&missing).unwrap_err().to_string();
    assert!(err.contains("missing.json"), "{err}");

    std::fs::remove_dir_all(&dir).ok();
}
