//! Reading a price file a slice at a time ([`IncrementalParse`]): a byte scanner finds each
//! top-level member, which is then loaded as a whole file's would be.

use tollgate_common::config::ConfigError;
// (IncrementalParse's scanner works on bytes; entries are read by serde_json.)

use super::load::{read_object, Loaded};

/// JSON's whitespace (RFC 8259 section 2: space, tab, LF, CR; not form feed).
fn json_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Deepest nesting of a price file read by [`IncrementalParse`] (serde_json's own limit).
const MAX_DEPTH: u32 = 128;

/// A price file read a slice at a time, so that no single proxy-wasm callback reads megabytes
/// (nginx bounds each callback by `tollgate_guest_deadline`, 100 ms by default; LiteLLM's 3.2 MB
/// file takes 50-130 ms in one go there). A byte scanner (strings, escapes, depth) finds each
/// top-level member; each member is then read as [`PriceTable::parse`] reads it, with the same
/// rules and errors. The result is the same as [`PriceTable::parse`]'s on any document.
///
/// [`PriceTable::parse`]: super::PriceTable::parse
#[derive(Debug)]
pub struct IncrementalParse {
    doc: Vec<u8>,
    label: String,
    pos: usize,
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// Where the current top-level member starts (after `{` or `,`).
    member: usize,
    opened: bool,
    had_comma: bool,
    /// The open brackets, innermost last (at most MAX_DEPTH).
    open: Vec<u8>,
    loaded: Loaded,
}

/// What [`IncrementalParse::step`] got to.
#[derive(Debug)]
pub enum Step {
    /// More to read.
    More,
    /// Read whole: the table, or why it is refused.
    Done(Result<Loaded, ConfigError>),
}

impl IncrementalParse {
    /// Starts reading `doc`; errors will name `label`.
    pub fn new(doc: Vec<u8>, label: &str) -> Self {
        IncrementalParse {
            doc,
            label: label.to_string(),
            pos: 0,
            depth: 0,
            in_string: false,
            escaped: false,
            member: 0,
            opened: false,
            had_comma: false,
            open: Vec::new(),
            loaded: Loaded::default(),
        }
    }

    /// The document (bytes).
    pub fn document(&self) -> &[u8] {
        &self.doc
    }

    /// Reads at least `budget` more bytes of the document (up to the end of the member they end
    /// in).
    pub fn step(&mut self, budget: usize) -> Step {
        match self.scan(budget) {
            Ok(false) => Step::More,
            Ok(true) => {
                let mut loaded = std::mem::take(&mut self.loaded);
                loaded.follow_aliases();
                Step::Done(Ok(loaded))
            }
            Err(e) => Step::Done(Err(e)),
        }
    }

    fn error(&self, message: &str) -> ConfigError {
        ConfigError::new(
            self.label.clone(),
            format!("{message} at byte {}", self.pos),
        )
    }

    /// `Ok(true)` when the document has been read whole.
    fn scan(&mut self, budget: usize) -> Result<bool, ConfigError> {
        let stop = self.pos.saturating_add(budget);
        while let Some(&b) = self.doc.get(self.pos) {
            let at = self.pos;
            self.pos = self.pos.saturating_add(1);
            if !self.opened {
                match b {
                    b if json_whitespace(b) => continue,
                    b'{' => {
                        self.opened = true;
                        self.depth = 1;
                        self.open.push(b'{');
                        self.member = self.pos;
                        continue;
                    }
                    _ => return Err(self.error("expected a JSON object of price entries")),
                }
            }
            if self.depth == 0 {
                if json_whitespace(b) {
                    continue;
                }
                return Err(self.error("trailing characters after the object"));
            }
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => {
                    self.depth = self.depth.saturating_add(1);
                    if self.depth > MAX_DEPTH {
                        return Err(self.error("nested too deeply"));
                    }
                    self.open.push(b);
                }
                b'}' | b']' => {
                    let opener = if b == b'}' { b'{' } else { b'[' };
                    if self.open.pop() != Some(opener) {
                        return Err(self.error("mismatched brackets"));
                    }
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        self.member_done(at, true)?;
                    }
                }
                b',' if self.depth == 1 => {
                    self.member_done(at, false)?;
                    self.had_comma = true;
                    self.member = self.pos;
                    if self.pos >= stop {
                        return Ok(false);
                    }
                }
                _ => {}
            }
        }
        if !self.opened || self.depth != 0 || self.in_string {
            return Err(self.error("the document ends early"));
        }
        Ok(true)
    }

    /// Reads the member `doc[member..end]` (`"model": {...}`) into the table.
    fn member_done(&mut self, end: usize, closing: bool) -> Result<(), ConfigError> {
        let text = self.doc.get(self.member..end).unwrap_or_default();
        if text.iter().copied().all(json_whitespace) {
            // `{}` is an empty table; a member missing before or after a comma is an error.
            if closing && !self.had_comma {
                return Ok(());
            }
            return Err(self.error("a member is missing around a comma"));
        }
        let mut wrapped = Vec::with_capacity(text.len().saturating_add(2));
        wrapped.push(b'{');
        wrapped.extend_from_slice(text);
        wrapped.push(b'}');
        read_object(&wrapped, &self.label, &mut self.loaded)
    }
}
