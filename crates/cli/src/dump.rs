//! `--dump-tensors DIR`: writes every named intermediate of the forward pass as a `.npy` file
//! (`blk.3.attn_out.npy`, f32, `[rows, cols]`), for comparing a port with its reference.

use std::fs;
use std::io::Write;
use std::path::PathBuf;

use synaptix_models::Tap;

pub struct NpyDump {
    dir: PathBuf,
    filter: Option<String>,
    pub written: usize,
    pub error: Option<std::io::Error>,
}

impl NpyDump {
    pub fn new(dir: PathBuf, filter: Option<String>) -> std::io::Result<NpyDump> {
        fs::create_dir_all(&dir)?;
        Ok(NpyDump {
            dir,
            filter,
            written: 0,
            error: None,
        })
    }
}

impl Tap for NpyDump {
    fn wants(&self, name: &str) -> bool {
        self.error.is_none() && self.filter.as_deref().is_none_or(|f| name.contains(f))
    }

    fn record(&mut self, name: &str, rows: usize, cols: usize, data: &[f32]) {
        let path = self.dir.join(format!("{name}.npy"));
        match write_npy(&path, rows, cols, data) {
            Ok(()) => self.written += 1,
            Err(e) => self.error = Some(e),
        }
    }
}

/// NumPy format 1.0: magic, header length, a Python dict literal padded to 64 bytes, data.
fn write_npy(path: &PathBuf, rows: usize, cols: usize, data: &[f32]) -> std::io::Result<()> {
    let mut header =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len() * 4);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in data {
        out.extend_from_slice(&v.to_le_bytes());
    }
    fs::File::create(path)?.write_all(&out)
}
