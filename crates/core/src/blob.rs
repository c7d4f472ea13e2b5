use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// Shared, immutable bytes: a window into a memory-mapped file or an owned buffer.
///
/// Weights are borrowed zero-copy from the mapped model file; cloning a `Blob` clones an `Arc`.
#[derive(Clone)]
pub struct Blob {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl Blob {
    /// A window `range` of `owner`; `None` when the range lies outside it.
    pub fn window(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> Option<Blob> {
        let len = (*owner).as_ref().len();
        (range.start <= range.end && range.end <= len).then_some(Blob { owner, range })
    }

    /// The bytes `range` of this window (relative to it), sharing the owner; `None` when the
    /// range lies outside it.
    pub fn slice(&self, range: Range<usize>) -> Option<Blob> {
        (range.start <= range.end && range.end <= self.len()).then(|| Blob {
            owner: self.owner.clone(),
            range: self.range.start + range.start..self.range.start + range.end,
        })
    }

    pub fn from_vec(bytes: Vec<u8>) -> Blob {
        let len = bytes.len();
        Blob {
            owner: Arc::new(bytes),
            range: 0..len,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.range.clone()]
    }

    pub fn len(&self) -> usize {
        self.range.len()
    }

    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
}

impl std::ops::Deref for Blob {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Blob({} bytes)", self.len())
    }
}
