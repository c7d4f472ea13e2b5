//! Helpers shared by the binary's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs the built `synaptix` binary.
pub fn synaptix(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_synaptix"))
        .args(args)
        .output()
        .expect("synaptix runs")
}

/// A scratch directory under the system temp dir, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("synaptix-cli-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    /// Writes `bytes` to `name` inside the directory.
    pub fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    /// The path of `name` inside the directory, as a string for arguments.
    pub fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs synaptix and checks the failure contract: a non-zero exit, no panic, exactly one line on
/// stderr, starting with `error: ` and containing `expect`. Returns stderr.
pub fn fails(args: &[&str], expect: &str) -> String {
    let out = synaptix(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "{args:?} succeeded; stderr: {stderr}"
    );
    assert_ne!(out.status.code(), Some(101), "{args:?} panicked: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?}: expected one line, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{args:?}: {stderr}");
    assert!(
        lines[0].contains(expect),
        "{args:?}: message lacks {expect:?}: {stderr}"
    );
    stderr
}

/// The path of a fetched model file (`scripts/fetch-models.sh` fetches them).
pub fn model(file: &str) -> String {
    let path = synaptix_bundle::cache::models_dir().join(file);
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        path.display()
    );
    path.display().to_string()
}

/// Runs synaptix, expects success, and parses its stdout as JSON.
pub fn json_ok(args: &[&str]) -> serde_json::Value {
    let out = synaptix(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

/// A JSON array of token ids.
pub fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_u64().expect("an id"))
        .collect()
}

/// The goldens' first prompt for a model: (prompt, llama.cpp's prompt ids, greedy tokens).
pub fn golden(name: &str) -> (String, Vec<u64>, Vec<u64>) {
    let path = format!(
        "{}/../../tests/fixtures/goldens/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let p = &g["prompts"][0];
    (
        p["prompt"].as_str().unwrap().to_string(),
        ids(&p["prompt_ids"]),
        ids(&p["generated"]),
    )
}

/// `tests/fixtures/<kind>` of the workspace.
pub fn fixtures(kind: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(kind)
}

/// A path as the `&str` an argument list takes.
pub fn p(path: &std::path::Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// `run --json` greedy on the CPU: (prompt ids, generated ids).
pub fn greedy_run(model: &str, prompt: &str, n: usize) -> (Vec<u64>, Vec<u64>) {
    let n = n.to_string();
    let v = json_ok(&[
        "run", model, prompt, "-n", &n, "--temp", "0", "--json", "--device", "cpu",
    ]);
    (ids(&v["prompt_tokens"]), ids(&v["tokens"]))
}
