//! `synaptix`: run neural networks from one binary.

mod bench;
mod chat;
mod convert;
mod device;
mod devices;
mod dump;
mod embed;
mod http;
mod imatrix;
mod inspect;
mod perplexity;
mod quantize;
mod run;
mod serve;
mod speak;
mod threads;
mod tokenize;
mod transcribe;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "synaptix",
    version,
    about = "Run LLMs from GGUF files (CPU or NVIDIA GPU), Whisper speech recognition, sentence embeddings and Piper voices, from one binary",
    long_about = "synaptix loads GGUF model files as they are (memory-mapped, any ggml quantization \
                  it supports) and runs them with its own kernels, on the CPU or an NVIDIA GPU. \
                  It also transcribes speech with Whisper models (CTranslate2 directories), \
                  embeds sentences with BERT models and speaks with Piper voices.\n\n\
                  Quick start:\n  scripts/fetch-models.sh gemma3-270m\n  \
                  synaptix run gemma3-270m \"The capital of France is\"\n  \
                  scripts/fetch-models.sh whisper-base\n  \
                  synaptix transcribe whisper-base speech.wav\n  \
                  scripts/fetch-models.sh piper-en-us-joe-medium\n  \
                  synaptix speak piper-en-us-joe-medium \"Hello there.\" -o hello.wav"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout
    Run(run::RunArgs),
    /// Talk with a model: multi-turn, its chat template, the KV cache reused across turns
    Chat(chat::ChatArgs),
    /// Show a model file's metadata and tensor table (GGUF, .syn, CTranslate2, safetensors, ONNX)
    Inspect(inspect::InspectArgs),
    /// Show how a model's tokenizer splits a text
    Tokenize(tokenize::TokenizeArgs),
    /// Measure prompt processing and generation speed (llama-bench's table)
    Bench(bench::BenchArgs),
    /// List the compute devices and the kernel paths synaptix will use
    Devices(devices::DevicesArgs),
    /// Serve a model over HTTP with OpenAI's API (chat and text completions, streaming; embeddings; speech; transcriptions)
    Serve(serve::ServeArgs),
    /// Convert a GGUF file's weight matrices to another type (q8_0, q4_0, f16, ...)
    Quantize(quantize::QuantizeArgs),
    /// Compute an importance matrix from a text, for quantize --imatrix (llama-imatrix's file)
    Imatrix(imatrix::ImatrixArgs),
    /// Measure a model's perplexity over a text (llama-perplexity's figures)
    Perplexity(perplexity::PerplexityArgs),
    /// Rewrite a model file in another container: GGUF to synaptix's .syn bundle and back
    Convert(convert::ConvertArgs),
    /// Turn speech into text with a Whisper model (WAV, FLAC, MP3 or Ogg in; timestamped segments out)
    Transcribe(transcribe::TranscribeArgs),
    /// Turn sentences into embedding vectors (BERT sentence-transformers models)
    Embed(embed::EmbedArgs),
    /// Turn text into speech with a Piper voice (VITS; WAV out)
    Speak(speak::SpeakArgs),
}

/// mimalloc instead of the system allocator: a step allocates and frees many large activation
/// buffers on the calling thread, and glibc's free-chunk consolidation and page faults for
/// them showed up in prefill profiles (about 20% of the calling thread's samples). Prefill
/// measured 5-20% faster with it. mimalloc is built without transparent huge pages
/// (`no_thp`): with them its arenas cost Gemma 3 270M 389 MB of peak memory instead of 359.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        // A closed pipe on stdout (`synaptix inspect m.gguf | head`): end quietly, as a
        // program killed by SIGPIPE would.
        if msg.contains("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("error: internal error{at}: {msg} (please report this)");
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let result = match cli.command {
        Command::Run(a) => run::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Devices(a) => devices::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Imatrix(a) => imatrix::run(a),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Convert(a) => convert::run(a),
        Command::Transcribe(a) => transcribe::run(a),
        Command::Embed(a) => embed::run(a),
        Command::Speak(a) => speak::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// Help and version go to stdout as clap renders them; a usage mistake is one line on stderr.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            ExitCode::SUCCESS
        }
        _ => {
            let rendered = e.render().to_string();
            let first = rendered
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ");
            eprintln!("error: {first} (try 'synaptix --help')");
            ExitCode::from(2)
        }
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
