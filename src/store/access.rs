//! Who may open a store's files. By default only the user the store runs as: the directory is
//! `0700`, every file `0600`, so another local user can neither read a tenant's bytes nor key
//! names nor take the store's lock. With `shm_group`, same-host clients running as another user
//! that is a member of the group may map the segment: the directory becomes `0710` (enter, not
//! list), the segment file `0660` and its token `0640`, both of that group; the durable index
//! and the lock stay the owner's alone.

use super::segment::SegmentError;
use nix::unistd::{Gid, Group, Uid};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

/// The store's file modes, and the group that shares its segment, if any.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Access {
    group: Option<Gid>,
}

/// What a store's file is for: who may open it follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// The segment's bytes: mapped by same-host clients.
    Segment,
    /// The token beside it: read by same-host clients.
    Token,
    /// The durable index and the lock: the store's alone.
    Private,
}

impl Access {
    /// `group`: a group name or number whose members may map the segment; `None` for the
    /// store's user alone.
    pub fn new(group: Option<&str>) -> Result<Access, crate::config::ConfigError> {
        let Some(group) = group.filter(|g| !g.is_empty()) else {
            return Ok(Access::default());
        };
        let gid = match group.parse::<u32>() {
            Ok(n) => Gid::from_raw(n),
            Err(_) => match Group::from_name(group) {
                Ok(Some(g)) => g.gid,
                Ok(None) => {
                    return Err(crate::config::ConfigError::invalid(
                        "store.shm_group",
                        format!("no group named {group:?} on this host (see /etc/group)"),
                    ))
                }
                Err(e) => {
                    return Err(crate::config::ConfigError::invalid(
                        "store.shm_group",
                        format!("cannot look up group {group:?}: {e}"),
                    ))
                }
            },
        };
        Ok(Access { group: Some(gid) })
    }

    /// The group also given access, if any.
    pub fn group(&self) -> Option<Gid> {
        self.group
    }

    /// The mode of the store's directories: the owner's, and the group's to enter.
    pub fn dir_mode(&self) -> u32 {
        match self.group {
            Some(_) => 0o710,
            None => 0o700,
        }
    }

    /// The mode of a file of `kind`: the owner's, and the group's as the kind allows.
    pub fn file_mode(&self, kind: FileKind) -> u32 {
        match (kind, self.group) {
            (FileKind::Segment, Some(_)) => 0o660,
            (FileKind::Token, Some(_)) => 0o640,
            _ => 0o600,
        }
    }

    /// Creates `dir` with the directory mode, or brings one this user owns to it. A directory
    /// of another user's (a volume's mount point, `/dev/shm` itself) is left as it is: the
    /// files' own modes protect them.
    pub fn prepare_dir(&self, dir: &Path) -> Result<(), SegmentError> {
        let err = |source| SegmentError::Dir {
            dir: dir.to_path_buf(),
            source,
        };
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {
                if m.uid() == Uid::effective().as_raw() && m.mode() & 0o777 != self.dir_mode() {
                    tracing::info!(dir = %dir.display(), was = format!("{:o}", m.mode() & 0o777),
                        now = format!("{:o}", self.dir_mode()), "segment directory mode tightened");
                    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(self.dir_mode()))
                        .map_err(err)?;
                }
            }
            Ok(_) => {
                return Err(err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "exists and is not a directory",
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new()
                    .mode(self.dir_mode())
                    .create(dir)
                    .map_err(|e| {
                        if e.kind() == std::io::ErrorKind::NotFound {
                            err(std::io::Error::new(
                                e.kind(),
                                "parent directory does not exist (is the volume mounted?)",
                            ))
                        } else {
                            err(e)
                        }
                    })?;
                // The umask may have taken bits the mode asked for (group traversal).
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(self.dir_mode()))
                    .map_err(err)?;
                self.chown(dir).map_err(err)?;
            }
            Err(e) => return Err(err(e)),
        }
        nix::unistd::access(
            dir,
            nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
        )
        .map_err(|e| {
            let owner = std::fs::metadata(dir).map(|m| m.uid()).unwrap_or(0);
            err(std::io::Error::new(
                std::io::Error::from(e).kind(),
                format!(
                    "{e}: this user (uid {}) cannot create files there (owned by uid {owner}); \
                     give each user a shm_dir of their own",
                    Uid::effective()
                ),
            ))
        })
    }

    /// Gives an existing file of the store the mode (and group) its kind calls for: files a
    /// store of an earlier release left readable are closed too.
    pub fn apply(&self, path: &Path, kind: FileKind) -> Result<(), SegmentError> {
        let err = |source| SegmentError::File {
            path: path.to_path_buf(),
            source,
        };
        let m = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(err(e)),
        };
        if kind != FileKind::Private {
            self.chown(path).map_err(err)?;
        }
        let mode = self.file_mode(kind);
        if m.mode() & 0o777 != mode {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(err)?;
        }
        Ok(())
    }

    /// Applies the modes to every file of the segment `stem` in `dir` (segment, token, index,
    /// lock).
    pub fn apply_all(&self, dir: &Path, stem: &str) -> Result<(), SegmentError> {
        for (ext, kind) in [
            ("seg", FileKind::Segment),
            ("token", FileKind::Token),
            ("idx", FileKind::Private),
            ("lock", FileKind::Private),
        ] {
            self.apply(&dir.join(format!("{stem}.{ext}")), kind)?;
        }
        Ok(())
    }

    fn chown(&self, path: &Path) -> std::io::Result<()> {
        if let Some(gid) = self.group {
            nix::unistd::chown(path, None, Some(gid))?;
        }
        Ok(())
    }
}

/// Files the store creates are its user's alone from their first moment: nothing it writes is
/// ever readable by another user, whatever the umask it was started with.
pub fn private_umask() {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_by_default_and_shared_with_a_group_only_where_clients_need_it() {
        let a = Access::default();
        assert_eq!(a.dir_mode(), 0o700);
        for k in [FileKind::Segment, FileKind::Token, FileKind::Private] {
            assert_eq!(a.file_mode(k), 0o600);
        }
        let g = Access::new(Some("0")).unwrap();
        assert_eq!(g.dir_mode(), 0o710);
        assert_eq!(g.file_mode(FileKind::Segment), 0o660);
        assert_eq!(g.file_mode(FileKind::Token), 0o640);
        assert_eq!(g.file_mode(FileKind::Private), 0o600);
        let e = Access::new(Some("no-such-group-rbgctl")).unwrap_err();
        assert!(e.to_string().contains("store.shm_group"), "{e}");
        assert_eq!(Access::new(Some("")).unwrap(), Access::default());
    }

    #[test]
    fn an_existing_directory_and_files_are_tightened() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("shm");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let seg = d.join("s.seg");
        std::fs::write(&seg, b"x").unwrap();
        std::fs::set_permissions(&seg, std::fs::Permissions::from_mode(0o644)).unwrap();
        let a = Access::default();
        a.prepare_dir(&d).unwrap();
        a.apply_all(&d, "s").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&d), 0o700);
        assert_eq!(mode(&seg), 0o600);
        let fresh = dir.path().join("fresh");
        a.prepare_dir(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o700);
    }
}
