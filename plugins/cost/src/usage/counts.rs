//! The token counts: a `usage` object as a provider sends it ([`RawUsage`], every member
//! optional, each API's names), and normalised ([`Usage`]; the rules are the parent module's).

use serde::Deserialize;

/// A response's usage, normalised (all counts in tokens).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// The model reported by the response (or, when it lacks one, by the request).
    pub model: Option<String>,
    /// Every input token, including cache reads and cache creations.
    pub input_tokens: u64,
    /// Output tokens, including reasoning tokens.
    pub output_tokens: u64,
    /// Input tokens read from the prompt cache (part of `input_tokens`).
    pub cached_input_tokens: u64,
    /// Input tokens written to the prompt cache (part of `input_tokens`; Anthropic only).
    pub cache_creation_input_tokens: u64,
    /// Reasoning tokens (part of `output_tokens`; OpenAI only).
    pub reasoning_tokens: u64,
}

/// `{"cached_tokens": N}` / `{"reasoning_tokens": N}` (other members ignored).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Details {
    /// OpenAI `*_tokens_details.cached_tokens`.
    #[serde(default)]
    pub cached_tokens: Option<u64>,
    /// OpenAI `*_tokens_details.reasoning_tokens`.
    #[serde(default)]
    pub reasoning_tokens: Option<u64>,
}

/// The `usage` object of any supported API, every member optional (unknown members ignored;
/// `null` reads as absent). Negative or fractional counts fail to deserialize.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct RawUsage {
    /// OpenAI Chat/Embeddings.
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    /// OpenAI Chat.
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    /// OpenAI Responses, Anthropic.
    #[serde(default)]
    pub input_tokens: Option<u64>,
    /// OpenAI Responses, Anthropic.
    #[serde(default)]
    pub output_tokens: Option<u64>,
    /// OpenAI Chat.
    #[serde(default)]
    pub prompt_tokens_details: Option<Details>,
    /// OpenAI Chat.
    #[serde(default)]
    pub completion_tokens_details: Option<Details>,
    /// OpenAI Responses.
    #[serde(default)]
    pub input_tokens_details: Option<Details>,
    /// OpenAI Responses.
    #[serde(default)]
    pub output_tokens_details: Option<Details>,
    /// Anthropic.
    #[serde(default)]
    pub cache_read_input_tokens: Option<u64>,
    /// Anthropic.
    #[serde(default)]
    pub cache_creation_input_tokens: Option<u64>,
}

impl RawUsage {
    /// Overwrites the members present in `later` (Anthropic's `message_delta.usage` is
    /// cumulative: its counts replace those of `message_start`).
    pub fn merge(&mut self, later: &RawUsage) {
        fn take<T: Copy>(a: &mut Option<T>, b: Option<T>) {
            if b.is_some() {
                *a = b;
            }
        }
        take(&mut self.prompt_tokens, later.prompt_tokens);
        take(&mut self.completion_tokens, later.completion_tokens);
        take(&mut self.input_tokens, later.input_tokens);
        take(&mut self.output_tokens, later.output_tokens);
        take(&mut self.prompt_tokens_details, later.prompt_tokens_details);
        take(
            &mut self.completion_tokens_details,
            later.completion_tokens_details,
        );
        take(&mut self.input_tokens_details, later.input_tokens_details);
        take(&mut self.output_tokens_details, later.output_tokens_details);
        take(
            &mut self.cache_read_input_tokens,
            later.cache_read_input_tokens,
        );
        take(
            &mut self.cache_creation_input_tokens,
            later.cache_creation_input_tokens,
        );
    }

    /// Normalises (see the module docs). `anthropic`: the body said `"type":"message"` (or a
    /// `message_*` event). `None` when there is no input count at all, or counts overflow.
    pub fn normalise(&self, anthropic: bool, model: Option<String>) -> Option<Usage> {
        let anthropic = anthropic
            || self.cache_read_input_tokens.is_some()
            || self.cache_creation_input_tokens.is_some();
        let detail = |a: Option<Details>, b: Option<Details>, f: fn(&Details) -> Option<u64>| {
            a.as_ref().and_then(f).or_else(|| b.as_ref().and_then(f))
        };
        if anthropic {
            let read = self.cache_read_input_tokens.unwrap_or(0);
            let creation = self.cache_creation_input_tokens.unwrap_or(0);
            let input = self
                .input_tokens
                .or(self.prompt_tokens)?
                .checked_add(read)?
                .checked_add(creation)?;
            return Some(Usage {
                model,
                input_tokens: input,
                output_tokens: self.output_tokens.or(self.completion_tokens).unwrap_or(0),
                cached_input_tokens: read,
                cache_creation_input_tokens: creation,
                reasoning_tokens: 0,
            });
        }
        Some(Usage {
            model,
            input_tokens: self.prompt_tokens.or(self.input_tokens)?,
            output_tokens: self.completion_tokens.or(self.output_tokens).unwrap_or(0),
            cached_input_tokens: detail(
                self.prompt_tokens_details,
                self.input_tokens_details,
                |d| d.cached_tokens,
            )
            .unwrap_or(0),
            cache_creation_input_tokens: 0,
            reasoning_tokens: detail(
                self.completion_tokens_details,
                self.output_tokens_details,
                |d| d.reasoning_tokens,
            )
            .unwrap_or(0),
        })
    }
}
