//! Multi-turn chat over one KV cache: each turn renders the whole conversation with the model's
//! template, keeps the cached positions that the new rendering shares with what the cache
//! holds, and evaluates only the rest.

use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use synaptix_models::{Cache, NoTap};

use crate::chat::{render_chat, ChatMessage};
use crate::{Engine, GenerateOptions, Generation, InferError, Result, StopReason};

/// A chat template and the tokens it is rendered with.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    pub text: String,
    bos: String,
    eos: String,
    /// The template has no system role (a system message opens the first user turn).
    fold_system: bool,
    /// The tokenizer adds BOS itself: a leading BOS written by the template is dropped.
    strip_bos: bool,
}

/// Chat formats for architectures whose GGUF files often carry no template.
fn builtin_template(arch: &str) -> Option<&'static str> {
    match arch {
        "gemma3" => Some(
            "{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n\
             {{ m.content }}<end_of_turn>\n{% endfor %}\
             {% if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
        ),
        _ => None,
    }
}

impl ChatTemplate {
    /// `custom` (a `--chat-template` file's text), else the model's `tokenizer.chat_template`,
    /// else a built-in one for the architecture; an error when there is none.
    pub fn for_engine(engine: &Engine, custom: Option<String>) -> Result<ChatTemplate> {
        let piece = |id: Option<u32>| {
            id.map(|id| String::from_utf8_lossy(&engine.tokenizer.token_to_piece(id)).into_owned())
                .unwrap_or_default()
        };
        let (text, fold_system) =
            match custom.or_else(|| engine.tokenizer.chat_template().map(str::to_string)) {
                Some(t) => (t, false),
                None => {
                    let arch = &engine.model.info().architecture;
                    let t = builtin_template(arch).ok_or_else(|| {
                        InferError::Template(format!(
                        "the model file has no chat template (tokenizer.chat_template) and {arch} \
                         has no built-in one: pass --chat-template FILE"
                    ))
                    })?;
                    (t.to_string(), true)
                }
            };
        // Syntax errors show now, not at the first message.
        minijinja::Environment::new()
            .template_from_str(&text)
            .map_err(|e| InferError::Template(e.to_string()))?;
        let bos = piece(engine.tokenizer.bos());
        Ok(ChatTemplate {
            text,
            strip_bos: engine.tokenizer.add_bos() && !bos.is_empty(),
            bos,
            eos: piece(engine.tokenizer.eos()),
            fold_system,
        })
    }

    /// The conversation as the model reads it: `system` (if any) then `messages`, with the
    /// assistant's turn opened when `add_generation_prompt`.
    pub fn render(
        &self,
        system: Option<&str>,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let mut all = Vec::with_capacity(messages.len() + 1);
        match (system, self.fold_system) {
            (Some(s), false) => all.push(ChatMessage {
                role: "system".into(),
                content: s.into(),
            }),
            (Some(s), true) => {
                // Gemma-style: the system text opens the first user turn.
                let mut rest = messages.iter();
                if let Some(first) = rest.next() {
                    all.push(ChatMessage {
                        role: first.role.clone(),
                        content: format!("{s}\n\n{}", first.content),
                    });
                }
                all.extend(rest.cloned());
            }
            (None, _) => {}
        }
        if !(system.is_some() && self.fold_system) {
            all.extend(messages.iter().cloned());
        }
        let text = render_chat(
            &self.text,
            &all,
            add_generation_prompt,
            &self.bos,
            &self.eos,
        )?;
        Ok(match text.strip_prefix(self.bos.as_str()) {
            Some(rest) if self.strip_bos => rest.to_string(),
            _ => text,
        })
    }
}

/// What to do when a turn does not fit the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextOverflow {
    /// Refuse the turn with an error (the conversation is kept).
    Error,
    /// Drop the oldest turns (never the system message) until it fits, and say so.
    Shift,
}

/// Figures of one turn.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TurnStats {
    /// Tokens of the rendered conversation.
    pub context_tokens: usize,
    /// Of those, cached positions reused from earlier turns.
    pub reused_tokens: usize,
    /// Newly evaluated.
    pub evaluated_tokens: usize,
    /// From the start of the turn to the first generated token.
    pub time_to_first_token: f64,
    pub generated_tokens: usize,
    pub generation_tps: f64,
    /// Oldest messages dropped to fit the context (`ContextOverflow::Shift`).
    pub dropped_messages: usize,
}

/// One answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub text: String,
    pub stop: StopReason,
    pub stats: TurnStats,
}

/// A saved conversation (`/save`, `/load`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Transcript {
    pub system: Option<String>,
    pub messages: Vec<ChatMessage>,
}

/// A conversation with a model, its KV cache reused from turn to turn.
pub struct ChatSession<'e> {
    engine: &'e Engine,
    template: ChatTemplate,
    system: Option<String>,
    messages: Vec<ChatMessage>,
    cache: Box<dyn Cache>,
    /// The tokens whose keys and values the cache holds, in order.
    cached: Vec<u32>,
    opts: GenerateOptions,
    overflow: ContextOverflow,
    pub turns: Vec<TurnStats>,
}

/// Tokens the context must keep free for an answer before a turn is accepted.
const ANSWER_ROOM: usize = 16;

impl<'e> ChatSession<'e> {
    pub fn new(
        engine: &'e Engine,
        template: ChatTemplate,
        system: Option<String>,
        opts: GenerateOptions,
        overflow: ContextOverflow,
    ) -> Result<ChatSession<'e>> {
        Ok(ChatSession {
            cache: engine.new_cache(opts.n_ctx)?,
            engine,
            template,
            system,
            messages: Vec::new(),
            cached: Vec::new(),
            opts,
            overflow,
            turns: Vec::new(),
        })
    }

    pub fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// Positions the cache holds.
    pub fn cached_tokens(&self) -> usize {
        self.cached.len()
    }

    pub fn capacity(&self) -> usize {
        self.opts.n_ctx
    }

    /// Forgets the conversation (the system message stays).
    pub fn reset(&mut self) {
        self.messages.clear();
        self.cached.clear();
        self.cache.truncate(0);
        self.turns.clear();
    }

    /// Writes the conversation as JSON.
    pub fn save(&self, path: &Path) -> Result<()> {
        let t = Transcript {
            system: self.system.clone(),
            messages: self.messages.clone(),
        };
        let json = serde_json::to_string_pretty(&t).map_err(|e| InferError::Io {
            path: path.display().to_string(),
            detail: e.to_string(),
        })?;
        std::fs::write(path, json).map_err(|e| InferError::Io {
            path: path.display().to_string(),
            detail: e.to_string(),
        })
    }

    /// Replaces the conversation by a saved one. The cache is kept: the next turn reuses
    /// whatever prefix the loaded conversation shares with it.
    pub fn load(&mut self, path: &Path) -> Result<()> {
        let io = |detail: String| InferError::Io {
            path: path.display().to_string(),
            detail,
        };
        let text = std::fs::read_to_string(path).map_err(|e| io(e.to_string()))?;
        let t: Transcript = serde_json::from_str(&text).map_err(|e| io(e.to_string()))?;
        self.system = t.system;
        self.messages = t.messages;
        self.turns.clear();
        Ok(())
    }

    /// The conversation so far plus a new user message, rendered and tokenized with the
    /// assistant's turn open.
    fn tokens_with(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        let text = self
            .template
            .render(self.system.as_deref(), messages, true)?;
        Ok(self.engine.tokenizer.encode(&text, true, true)?)
    }

    /// Sends `user` and streams the answer to `on_piece` (which returns `false` to stop it).
    pub fn send(&mut self, user: &str, on_piece: impl FnMut(&str) -> bool) -> Result<Reply> {
        let start = Instant::now();
        let mut messages = self.messages.clone();
        messages.push(ChatMessage {
            role: "user".into(),
            content: user.into(),
        });
        let mut dropped = 0;
        let tokens = loop {
            let tokens = self.tokens_with(&messages)?;
            if tokens.len() + ANSWER_ROOM <= self.opts.n_ctx {
                break tokens;
            }
            // Only the new message left, or no shifting: the turn cannot be taken.
            if self.overflow == ContextOverflow::Error || messages.len() == 1 {
                return Err(InferError::ContextOverflow {
                    needed: tokens.len() + ANSWER_ROOM,
                    n_ctx: self.opts.n_ctx,
                    policy: match self.overflow {
                        ContextOverflow::Error => "error",
                        ContextOverflow::Shift => "shift",
                    },
                });
            }
            // Drop the oldest exchange (a user message and the answer after it).
            let n = if messages.len() >= 3 && messages[1].role == "assistant" {
                2
            } else {
                1
            };
            messages.drain(..n);
            dropped += n;
        };
        // Reuse the cached prefix; evaluate at least one token to get logits.
        let mut keep = self
            .cached
            .iter()
            .zip(&tokens)
            .take_while(|(a, b)| a == b)
            .count();
        keep = keep.min(tokens.len() - 1);
        self.cache.truncate(keep);
        self.cached.truncate(keep);
        let before_eval = start.elapsed().as_secs_f64();
        let gen: Generation = self.engine.generate_in(
            self.cache.as_mut(),
            &self.cached,
            &tokens[keep..],
            &self.opts,
            false,
            &mut NoTap,
            on_piece,
        )?;
        // The cache holds the prompt and every generated token but the last one.
        self.cached.extend_from_slice(&tokens[keep..]);
        if let Some((_, evaluated)) = gen.tokens.split_last() {
            self.cached.extend_from_slice(evaluated);
        }
        debug_assert_eq!(self.cached.len(), self.cache.len());
        messages.push(ChatMessage {
            role: "assistant".into(),
            content: gen.text.clone(),
        });
        self.messages = messages;
        let stats = TurnStats {
            context_tokens: tokens.len(),
            reused_tokens: keep,
            evaluated_tokens: tokens.len() - keep,
            time_to_first_token: before_eval + gen.timings.prompt_seconds,
            generated_tokens: gen.timings.generated_tokens,
            generation_tps: gen.timings.generation_tps(),
            dropped_messages: dropped,
        };
        self.turns.push(stats.clone());
        Ok(Reply {
            text: gen.text,
            stop: gen.stop,
            stats,
        })
    }
}
