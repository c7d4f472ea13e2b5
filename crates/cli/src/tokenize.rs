use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use synaptix_tokenizer::Tokenizer;

#[derive(Args)]
#[command(
    after_help = "Examples:\n  synaptix tokenize model.gguf \"Hello, world!\"\n  \
    synaptix tokenize model.gguf \"<|im_start|>user\" --json"
)]
pub struct TokenizeArgs {
    /// GGUF model file, .syn bundle or fetched model name (its tokenizer is read from the metadata)
    pub model: PathBuf,
    /// Text to tokenize
    pub text: String,
    /// Do not add BOS/EOS even if the vocabulary asks for them
    #[arg(long)]
    pub no_special: bool,
    /// Treat special-token text (e.g. <|im_start|>) as plain text
    #[arg(long)]
    pub no_parse_special: bool,
    /// Print JSON: {"ids": [...], "pieces": [...]}
    #[arg(long)]
    pub json: bool,
}

pub fn run(mut a: TokenizeArgs) -> Result<()> {
    a.model = synaptix_bundle::cache::resolve_model(&a.model.to_string_lossy());
    let file = synaptix_models::open_model_file(&a.model)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let ids = tok.encode(&a.text, !a.no_special, !a.no_parse_special)?;
    let pieces: Vec<String> = ids
        .iter()
        .map(|&id| String::from_utf8_lossy(&tok.token_to_piece(id)).into_owned())
        .collect();
    if a.json {
        println!("{}", serde_json::json!({ "ids": ids, "pieces": pieces }));
    } else {
        for (id, piece) in ids.iter().zip(&pieces) {
            println!("{id:>8} -> {piece:?}");
        }
        eprintln!("{} tokens", ids.len());
    }
    Ok(())
}
