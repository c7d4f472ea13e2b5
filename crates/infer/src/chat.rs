//! Chat templates: the model's own Jinja template (GGUF `tokenizer.chat_template`) rendered
//! with minijinja.

use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde::Serialize;

use crate::{InferError, Result};

#[derive(Debug, Clone, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// Renders `messages` with `template`; `add_generation_prompt` opens the assistant's turn.
pub fn render_chat(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let mut env = Environment::new();
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<String, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
        },
    );
    env.add_template("chat", template)
        .map_err(|e| InferError::Template(e.to_string()))?;
    let tmpl = env
        .get_template("chat")
        .map_err(|e| InferError::Template(e.to_string()))?;
    tmpl.render(minijinja::context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token,
        eos_token => eos_token,
    })
    .map_err(|e| InferError::Template(e.to_string()))
}
