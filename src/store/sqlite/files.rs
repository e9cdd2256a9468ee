//! The database file and the connections to it: created private to its owner, a writer
//! that may wait for another process's write lock, a read-only reader, a checkpointer.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::writer::sql_error;
use crate::store::StoreError;

/// How long a statement waits for another process's write lock before failing.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The reader thread's connection: read-only, so nothing it runs can write; it waits for
/// a busy file no longer than a read may take.
pub(super) fn open_reader(path: &Path, deadline: Duration) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(sql_error)?;
    conn.busy_timeout(BUSY_TIMEOUT.min(deadline))
        .map_err(sql_error)?;
    Ok(conn)
}

/// The checkpointer's connection: read-write (a checkpoint writes the database file),
/// never creating it (the writer's connection did).
pub(super) fn open_checkpointer(path: &Path) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(sql_error)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(sql_error)?;
    Ok(conn)
}

/// Creates the database file readable and writable by its owner only (it holds payloads
/// and request headers), unless it exists; SQLite gives its `-wal` and `-shm` files the
/// same permissions.
pub(super) fn create_private(path: &Path) -> Result<(), StoreError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(StoreError::Query(
            format!("creating {}: {e}", path.display()).into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;

    #[cfg(unix)]
    #[test]
    fn a_new_database_file_is_private_to_its_owner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("hookgate-perm-{}", fastrand::u64(..)));
        let path = dir.join("events.db");
        let store = SqliteStore::open(&path, Duration::from_secs(5)).expect("open");
        drop(store);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(mode & 0o077, 0, "mode {mode:o}");
    }
}
