//! Encodes texts with a GGUF model's tokenizer, for comparing against other tokenizers in bulk.
//!
//!     cargo run --release -p synaptix-tokenizer --example encode_json -- MODEL.gguf TEXTS.json
//!
//! TEXTS.json is a JSON array of strings. Prints a JSON array with, for each text, the ids with
//! special-token parsing and without (`{"ids": [...], "ids_no_parse_special": [...]}`), BOS/EOS
//! added as the vocabulary asks.

use synaptix_tokenizer::Tokenizer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, model, texts] = &args[..] else {
        eprintln!("usage: encode_json MODEL.gguf TEXTS.json");
        std::process::exit(2);
    };
    let tok = Tokenizer::from_gguf_path(model)?;
    let texts: Vec<String> = serde_json::from_str(&std::fs::read_to_string(texts)?)?;
    let mut out = Vec::with_capacity(texts.len());
    for text in &texts {
        let ids = tok.encode(text, tok.add_bos(), true)?;
        let plain = tok.encode(text, tok.add_bos(), false)?;
        out.push(serde_json::json!({ "ids": ids, "ids_no_parse_special": plain }));
    }
    println!("{}", serde_json::Value::Array(out));
    Ok(())
}
