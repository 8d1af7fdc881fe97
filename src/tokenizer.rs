//! Text ↔ token ids. This module owns the Hugging Face `tokenizer.json` wrapper ([`Tokenizer`])
//! and the streaming detokeniser ([`StreamDecoder`]) that turns generated ids into text as they
//! arrive without ever printing half a UTF-8 character. Chat formatting lives in
//! [`crate::chat`]; this module only maps strings to ids and back, exactly as `transformers` does.

use std::path::Path;

use crate::error::{Error, Result};

/// The U+FFFD replacement character: what byte-fallback decoding yields for an incomplete
/// (or invalid) UTF-8 sequence.
const REPLACEMENT: char = '\u{FFFD}';

/// A valid UTF-8 character spans at most 4 bytes, hence at most 4 byte-fallback tokens. Output
/// still ending in U+FFFD after this many held-back byte tokens is a genuinely invalid sequence,
/// not an incomplete one, and is released rather than held forever.
const MAX_HELD_BYTES: usize = 4;

/// Held-back ids of any kind (e.g. skipped control tokens inside a byte run) beyond which the
/// text is released anyway, so a pathological stream cannot grow the window without bound.
const MAX_HELD_IDS: usize = 64;

/// A Hugging Face tokenizer (`tokenizer.json`), plus the names of its BOS and EOS tokens.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<String>,
    eos: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json`. If a `tokenizer_config.json` sits beside it, its `bos_token` and
    /// `eos_token` name the BOS/EOS tokens; otherwise `<bos>`/`<eos>` are used when the
    /// vocabulary has them.
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let mut tok = Self::parse(&bytes).map_err(|e| {
            Error::Tokenizer(format!(
                "{}: not a valid Hugging Face tokenizer.json ({e}): use the tokenizer.json that \
                 ships with the model",
                path.display()
            ))
        })?;
        // The config only refines names; a missing one is normal (not every export has it).
        if let Some(dir) = path.parent() {
            let cfg_path = dir.join("tokenizer_config.json");
            match std::fs::read_to_string(&cfg_path) {
                Ok(text) => tok.apply_config(&cfg_path, &text)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(cfg_path, e)),
            }
        }
        Ok(tok)
    }

    /// Parses the contents of a `tokenizer.json` (e.g. one embedded in the binary).
    pub fn from_bytes(json: &[u8]) -> Result<Self> {
        Self::parse(json).map_err(|e| {
            Error::Tokenizer(format!(
                "not a valid Hugging Face tokenizer.json ({e}): use the tokenizer.json that ships \
                 with the model"
            ))
        })
    }

    fn parse(json: &[u8]) -> std::result::Result<Self, tokenizers::Error> {
        let inner = tokenizers::Tokenizer::from_bytes(json)?;
        let known = |t: &str| inner.token_to_id(t).map(|_| t.to_string());
        let bos = known("<bos>");
        let eos = known("<eos>");
        Ok(Tokenizer { inner, bos, eos })
    }

    /// Takes BOS/EOS names from `tokenizer_config.json` when they are tokens of this vocabulary.
    fn apply_config(&mut self, cfg_path: &Path, text: &str) -> Result<()> {
        let cfg: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            Error::Tokenizer(format!("{}: not valid JSON ({e}): fix or remove the file", cfg_path.display()))
        })?;
        let name = |key: &str| -> Option<String> {
            match cfg.get(key)? {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
                _ => None,
            }
        };
        // A name the vocabulary lacks would make encode() split it into pieces: keep the default.
        if let Some(b) = name("bos_token").filter(|t| self.inner.token_to_id(t).is_some()) {
            self.bos = Some(b);
        }
        if let Some(e) = name("eos_token").filter(|t| self.inner.token_to_id(t).is_some()) {
            self.eos = Some(e);
        }
        Ok(())
    }

    /// Encodes `text`. `add_special_tokens` runs the post-processor (for Gemma: prepend `<bos>`),
    /// like `tokenizer.encode(text, add_special_tokens=...)` in `transformers`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| Error::Tokenizer(format!("cannot encode text: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes `ids` to text. `skip_special_tokens` drops control tokens such as `<|turn>`.
    ///
    /// An id outside the vocabulary is an error (the underlying library would silently drop it,
    /// which hides a tokenizer/model mismatch).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        if let Some(&bad) = ids.iter().find(|&&id| self.inner.id_to_token(id).is_none()) {
            return Err(Error::Tokenizer(format!(
                "id {bad} is not in the vocabulary of {} tokens: does tokenizer.json belong to \
                 this model?",
                self.vocab_size()
            )));
        }
        self.inner.decode(ids, skip_special_tokens).map_err(|e| Error::Tokenizer(format!("cannot decode ids: {e}")))
    }

    /// The id of a single token given by its exact vocabulary string (e.g. `"<turn|>"`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// A SentencePiece byte-fallback token such as `<0xE2>`.
    fn is_byte_token(&self, id: u32) -> bool {
        self.inner.id_to_token(id).is_some_and(|t| {
            let b = t.as_bytes();
            b.len() == 6 && t.starts_with("<0x") && b[5] == b'>' && b[3..5].iter().all(u8::is_ascii_hexdigit)
        })
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The BOS token's string (`tokenizer_config.json`'s `bos_token`, else `<bos>`), if the
    /// vocabulary has it.
    pub fn bos_token(&self) -> Option<String> {
        self.bos.clone()
    }

    /// The EOS token's string (`tokenizer_config.json`'s `eos_token`, else `<eos>`), if the
    /// vocabulary has it.
    pub fn eos_token(&self) -> Option<String> {
        self.eos.clone()
    }
}

/// Streaming detokeniser: feed ids one at a time, get the newly completed text.
///
/// Decoding one id at a time is wrong twice over: a character split across byte-fallback
/// tokens (`<0xE2><0x82><0xAC>` = `€`) decodes to U+FFFD pieces, and decoders that strip a
/// leading SentencePiece `▁` lose spaces at the start of a fragment. So this keeps a window of
/// ids starting at the previous emission point, decodes the window both without and with the new
/// ids, and emits the difference; output that ends in U+FFFD is held back until the character
/// completes. The concatenation of every `push` and the final `finish` equals
/// `Tokenizer::decode` of all the ids for well-formed output.
#[derive(Debug, Clone)]
pub struct StreamDecoder {
    skip_special_tokens: bool,
    ids: Vec<u32>,
    /// Start of the context window: ids before it are never decoded again.
    prefix_offset: usize,
    /// End of the text already emitted, in ids.
    read_offset: usize,
}

impl StreamDecoder {
    /// A decoder with nothing emitted yet.
    pub fn new(skip_special_tokens: bool) -> Self {
        StreamDecoder { skip_special_tokens, ids: Vec::new(), prefix_offset: 0, read_offset: 0 }
    }

    /// Adds one id; returns the text it completes (often empty while a character is pending).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let (prefix_text, new_text) = self.window_texts(tok)?;
        let held = &self.ids[self.read_offset..];
        let held_bytes = held.iter().filter(|&&i| tok.is_byte_token(i)).count();
        let incomplete = new_text.ends_with(REPLACEMENT) && held_bytes < MAX_HELD_BYTES && held.len() < MAX_HELD_IDS;
        if new_text.len() <= prefix_text.len() || incomplete {
            return Ok(String::new());
        }
        let out = self.new_part(tok, &prefix_text, new_text)?;
        self.advance();
        Ok(out)
    }

    /// Flushes whatever is held back (an incomplete character comes out as U+FFFD) and resets
    /// the decoder for a new stream.
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String> {
        let (prefix_text, new_text) = self.window_texts(tok)?;
        let out = if new_text.len() > prefix_text.len() {
            self.new_part(tok, &prefix_text, new_text)?
        } else {
            String::new()
        };
        *self = StreamDecoder::new(self.skip_special_tokens);
        Ok(out)
    }

    fn window_texts(&self, tok: &Tokenizer) -> Result<(String, String)> {
        let skip = self.skip_special_tokens;
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], skip)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], skip)?;
        Ok((prefix, full))
    }

    /// The text the ids after `read_offset` add. Decoding is prefix-stable except when a run of
    /// byte-fallback tokens continues across the emission point: the run is then decoded as a
    /// whole and an invalid tail turns the emitted bytes into U+FFFD too. Text already emitted
    /// cannot be taken back, so decode the new ids on their own instead.
    fn new_part(&self, tok: &Tokenizer, prefix_text: &str, full: String) -> Result<String> {
        match full.strip_prefix(prefix_text) {
            Some(rest) => Ok(rest.to_string()),
            None => tok.decode(&self.ids[self.read_offset..], self.skip_special_tokens),
        }
    }

    fn advance(&mut self) {
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        // Ids before the window are never looked at again: drop them so memory stays bounded.
        if self.prefix_offset > 0 {
            self.ids.drain(..self.prefix_offset);
            self.read_offset -= self.prefix_offset;
            self.prefix_offset = 0;
        }
    }
}
