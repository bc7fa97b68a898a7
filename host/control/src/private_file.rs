//! Files only their owner may read: the CLI's state, journal, credentials and leases, which
//! hold cloud-init and live proxy passwords. Every one of them is written through here.
//!
//! A whole file is replaced through a temporary file of a fresh name beside it, created with
//! `O_CREAT | O_EXCL | O_NOFOLLOW` and mode 0600 from the start (set again with fchmod, whatever
//! the umask), written, synced and renamed over the file; the directory is synced so the
//! rename survives a crash. A leftover temporary file of an earlier run is never opened again,
//! whatever its mode, and a symlink planted at any name here is never followed: `O_EXCL`
//! refuses an existing name and `O_NOFOLLOW` a link, and the rename replaces a link at the
//! file's own path instead of writing through it.
//!
//! A file appended to (the journal, the lock) is opened with `O_NOFOLLOW` and set to 0600 on
//! every open, so one an earlier version created readable by others is closed before a byte
//! is added to it.

use std::fs::{File, OpenOptions, Permissions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Owner read and write, nothing for anyone else.
const MODE: u32 = 0o600;

/// Names tried for a temporary file before giving up: a clash needs another process to have
/// drawn the same 64 random bits.
const ATTEMPTS: u32 = 8;

/// Replaces `path` with `bytes`: a reader sees the old file or the new one, never half of
/// one, and no one but the owner can read either.
pub fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let (tmp, mut file) = create_temporary(path)?;
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    sync_directory(path);
    Ok(())
}

/// Opens `path` to append to it, creating it if need be; a symlink there is refused rather
/// than followed, and the file is its owner's only whatever mode it had.
pub fn open_append(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.set_permissions(Permissions::from_mode(MODE))?;
    Ok(file)
}

/// A new file beside `path`, of a name no one has used, open for writing.
fn create_temporary(path: &Path) -> std::io::Result<(PathBuf, File)> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let tmp = path.with_file_name(format!(".{name}.{:016x}.tmp", random()));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(MODE)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
        {
            Ok(file) => {
                // The umask may have taken bits off the mode; none are added to it here.
                if let Err(e) = file.set_permissions(Permissions::from_mode(MODE)) {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e);
                }
                return Ok((tmp, file));
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::from(ErrorKind::AlreadyExists)))
}

/// 64 bits from the OS, or from the clock and the process should it give none (a name only
/// has to be new: `O_EXCL` refuses one that is not).
fn random() -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_ok() {
        return u64::from_le_bytes(bytes);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}

/// Syncs the directory holding `path`, so a rename into it is durable; best effort (some
/// filesystems refuse to sync a directory, and the file itself is synced already).
fn sync_directory(path: &Path) {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_replaced_file_is_the_owners_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        replace(&path, b"one").unwrap();
        replace(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(mode(&path), 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["f"]);
    }

    #[test]
    fn a_symlink_at_the_path_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "untouched").unwrap();
        let path = dir.path().join("f");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        replace(&path, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");
        assert!(!std::fs::symlink_metadata(&path).unwrap().is_symlink());
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
    }

    #[test]
    fn an_appended_file_is_closed_to_others_and_a_symlink_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        std::fs::write(&path, "a\n").unwrap();
        std::fs::set_permissions(&path, Permissions::from_mode(0o644)).unwrap();
        let mut f = open_append(&path).unwrap();
        assert_eq!(mode(&path), 0o600);
        f.write_all(b"b\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a\nb\n");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(open_append(&link).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a\nb\n");
    }
}
