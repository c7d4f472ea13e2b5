//! A scratch directory for the reader tests, removed when dropped.

use std::path::PathBuf;

pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `$TMP/synaptix-bundle-{tag}-{pid}`: the process id keeps parallel test binaries apart.
    pub fn new(tag: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("synaptix-bundle-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// Writes `bytes` to `name` inside the directory and returns its path.
    #[allow(dead_code)]
    pub fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
