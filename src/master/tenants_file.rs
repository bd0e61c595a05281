//! The master's tenants file (`--tenants-file`): read at start-up, and again whenever it
//! changes (checked once a second by the housekeeper), so that tenants and quotas change
//! without a restart. A file that no longer parses keeps the tenants in force, with a warning.

use super::tenants::{Quotas, TenantError};
use crate::config::{file_stamp, FileStamp};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Largest tenants file read.
const MAX_FILE_BYTES: u64 = 4 << 20;
/// How often the file is looked at.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Why a tenants file was not taken (the tenants in force stay).
#[derive(Debug, thiserror::Error)]
pub enum TenantsFileError {
    #[error("tenants file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("tenants file {path}: larger than {MAX_FILE_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("tenants file {path}: {source}")]
    Parse { path: PathBuf, source: TenantError },
}

/// The file, and what it was when last read.
#[derive(Debug)]
pub struct TenantsFile {
    path: PathBuf,
    seen: Option<FileStamp>,
    checked: Option<Instant>,
}

impl TenantsFile {
    /// Reads `path` (an error stops the master: it would otherwise refuse every tenant's puts).
    pub fn load(path: &Path) -> Result<(TenantsFile, Quotas), TenantsFileError> {
        let seen = file_stamp(path).ok();
        let quotas = read(path)?;
        tracing::info!(path = %path.display(), tenants = quotas.len(), "tenants file read");
        let file = TenantsFile {
            path: path.to_path_buf(),
            seen,
            checked: None,
        };
        Ok((file, quotas))
    }

    /// The tenants as the file now says, if it changed since it was last read (at most once
    /// a second); `None` when it did not, or no longer parses (logged: the tenants in force
    /// stay).
    pub fn changed(&mut self, now: Instant) -> Option<Quotas> {
        if self.checked.is_some_and(|t| now < t + CHECK_EVERY) {
            return None;
        }
        self.checked = Some(now);
        let stamp = file_stamp(&self.path).ok();
        if stamp == self.seen {
            return None;
        }
        self.seen = stamp;
        match read(&self.path) {
            Ok(q) => {
                tracing::info!(path = %self.path.display(), tenants = q.len(), "tenants file read again");
                Some(q)
            }
            Err(e) => {
                tracing::warn!(error = %e, "the tenants file changed but cannot be taken; the tenants in force stay");
                None
            }
        }
    }
}

fn read(path: &Path) -> Result<Quotas, TenantsFileError> {
    let read = |source| TenantsFileError::Read {
        path: path.to_path_buf(),
        source,
    };
    if std::fs::metadata(path).map_err(read)?.len() > MAX_FILE_BYTES {
        return Err(TenantsFileError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    let text = std::fs::read_to_string(path).map_err(read)?;
    Quotas::parse(&text).map_err(|source| TenantsFileError::Parse {
        path: path.to_path_buf(),
        source,
    })
}
