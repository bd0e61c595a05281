//! Files the unit tests write: each in a temporary directory of its own, gone when dropped.

use std::path::{Path, PathBuf};

/// A file written into a new temporary directory; the directory goes when this is dropped.
pub struct ScratchFile {
    dir: tempfile::TempDir,
    path: PathBuf,
}

impl ScratchFile {
    /// Writes `contents` to a file called `name` in a new temporary directory.
    pub fn new(name: &str, contents: impl AsRef<[u8]>) -> ScratchFile {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join(name);
        std::fs::write(&path, contents).expect("the scratch file written");
        ScratchFile { dir, path }
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its path as text, for a flag's value.
    pub fn arg(&self) -> String {
        self.path.display().to_string()
    }

    /// Writes `contents` over the file.
    pub fn rewrite(&self, contents: impl AsRef<[u8]>) {
        std::fs::write(&self.path, contents).expect("the scratch file rewritten");
    }

    /// Another path in the same directory (not created).
    pub fn sibling(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}
