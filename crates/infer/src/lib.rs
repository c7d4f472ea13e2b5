//! synaptix-infer: from a model file to streamed text.
//!
//! [`Engine::load`] maps a GGUF file, builds its model and tokenizer; [`Engine::generate`]
//! evaluates a prompt into a KV cache and samples tokens one at a time, handing each decoded
//! piece to a callback as soon as it forms valid UTF-8, and reports timings.
//!
//! [`transcribe`] decodes speech with Whisper: greedy and beam search, timestamps, segments
//! and faster-whisper's seeking over a whole recording.

mod chat;
mod engine;
mod session;
pub mod speak;
pub mod transcribe;
pub mod vad;
pub mod words;

pub use chat::{render_chat, render_chat_at, ChatMessage};
pub use engine::{Engine, GenerateOptions, Generation, InferError, Result, StopReason, Timings};
pub use session::{ChatSession, ChatTemplate, ContextOverflow, Reply, Transcript, TurnStats};
