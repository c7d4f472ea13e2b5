//! `inspect` on a CTranslate2 model (Whisper base, `scripts/fetch-models.sh whisper-base`).

use std::process::Command;

#[test]
fn inspect_reads_a_ctranslate2_directory() {
    let dir = synaptix_bundle::cache::models_dir().join("whisper-base");
    if !dir.join("model.bin").is_file() {
        eprintln!("SKIPPED: whisper-base not fetched (scripts/fetch-models.sh whisper-base)");
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_synaptix"))
        .args(["inspect", dir.to_str().unwrap(), "--json"])
        .output()
        .expect("synaptix runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(j["format"], "ctranslate2");
    assert_eq!(j["spec"], "WhisperSpec");
    assert_eq!(j["variables"].as_array().unwrap().len(), 212);
    assert_eq!(j["n_params"], 72_603_145);
    assert_eq!(j["aliases"][0]["target"], "decoder/embeddings/weight");
    let emb = j["variables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "decoder/embeddings/weight")
        .expect("embedding");
    assert_eq!(emb["shape"], serde_json::json!([51865, 512]));
    assert_eq!(emb["type"], "float16");

    // The text form, through a pipe that closes early: no error message.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} inspect {} | head -1",
            env!("CARGO_BIN_EXE_synaptix"),
            dir.display()
        ))
        .output()
        .expect("sh runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("CTranslate2 model v6, spec WhisperSpec"),
        "{stdout}"
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
