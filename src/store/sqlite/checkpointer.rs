//! The embedded store's checkpointer: a thread with a connection of its own that copies
//! the WAL's frames back into the database file (SQLite's PASSIVE checkpoint), so that the
//! writer thread does not. SQLite's automatic checkpoint is off: it would run in the
//! connection that commits — the writer, between a batch's commit and its answers — every
//! 1,000 frames, which a full ingest writes several times a second.
//!
//! The WAL starts over (is overwritten from its first frame) only when a write begins
//! with every frame copied back and the file synced; a checkpointer beside a busy writer
//! never sees that, since the writer appends while it copies. So once the WAL holds
//! [`RESTART_FRAMES`], the writer copies back the few frames the last pass left, between
//! two batches ([`WalWatch::catch_up`]), and its next write starts the WAL over.
//!
//! Nothing here takes a lock a write waits for: a PASSIVE checkpoint copies only what no
//! reader still needs and never waits. Nothing sleeps: the checkpointer runs when the
//! writer's WAL hook tells it [`PASS_FRAMES`] more frames were written.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;

use rusqlite::Connection;

use super::writer::{sql_error, BetweenBatches};
use crate::store::StoreError;

/// Frames written between two checkpointer passes: SQLite's own automatic checkpoint
/// interval (4 MiB of 4 KiB pages), so a pass copies as much as SQLite's default did.
pub(crate) const PASS_FRAMES: u32 = 1000;

/// Frames after which the writer lets the WAL start over (16 MiB of 4 KiB pages). Each
/// start costs the writer one sync of the database file, whose time grows with the pages
/// the passes copied since the last: at 5,000 first runs a second (10,000 frames) about
/// two a second, of 3 ms (median), where SQLite's checkpoint every 1,000 frames cost the
/// writer ten a second of 3 to 6 ms.
pub(crate) const RESTART_FRAMES: u32 = 4096;

/// Frames the writer copies back itself at most when the WAL is due to start over: about
/// what a full ingest appends while a pass runs. More are left to the checkpointer —
/// unless the WAL reaches twice [`RESTART_FRAMES`] (the checkpointer is behind or has
/// stopped), when the writer copies them all rather than let the WAL grow.
pub(crate) const CATCH_UP_FRAMES: u32 = 250;

/// Largest WAL file kept once the WAL starts over, in bytes: twice the frames of a normal
/// cycle. A WAL that grew past it (a long read kept frames from being copied back) is cut
/// back to it, instead of keeping its largest size on disk for good.
pub(crate) const WAL_SIZE_LIMIT: i64 = 2 * RESTART_FRAMES as i64 * (4096 + 24);

/// One checkpoint pass's result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pass {
    /// Frames in the WAL when it ran.
    pub(crate) frames: u32,
    /// Frames of those copied back into the database file by its end (all: the WAL may
    /// start over).
    pub(crate) copied: u32,
}

impl Pass {
    /// Frames not yet copied back when the WAL holds `frames`, as far as this pass knows:
    /// all of them if the WAL started over since (it then holds fewer frames than the pass
    /// saw).
    pub(crate) fn left(self, frames: u32) -> u32 {
        if frames < self.frames {
            frames
        } else {
            frames - self.copied.min(frames)
        }
    }

    fn pack(self) -> u64 {
        u64::from(self.frames) << 32 | u64::from(self.copied)
    }

    fn unpack(packed: u64) -> Self {
        Self {
            frames: (packed >> 32) as u32,
            copied: packed as u32,
        }
    }
}

/// Whether the writer, between two batches, copies back what the last pass left while
/// the WAL holds `frames`: once the WAL is due to start over and little is left — or at
/// twice that length whatever is left, so that the WAL stays bounded.
pub(crate) fn catch_up_due(frames: u32, last: Pass) -> bool {
    frames >= RESTART_FRAMES
        && (last.left(frames) <= CATCH_UP_FRAMES || frames >= 2 * RESTART_FRAMES)
}

/// What the writer and the checkpointer know of the WAL. Atomics, since the writer's WAL
/// hook, the writer loop and the checkpointer thread read and write it; a stale value
/// only makes one catch-up copy more or less than intended (SQLite keeps the file right).
#[derive(Debug, Default)]
struct WalState {
    /// Frames in the WAL after the writer's last commit.
    frames: AtomicU32,
    /// The latest pass, either thread's, packed (see [`Pass::pack`]): one atomic, so the
    /// two numbers are never read from different passes.
    last: AtomicU64,
}

impl WalState {
    fn passed(&self, pass: Pass) {
        self.last.store(pass.pack(), Ordering::Relaxed);
    }

    fn last(&self) -> Pass {
        Pass::unpack(self.last.load(Ordering::Relaxed))
    }
}

/// The writer's side: its WAL hook counts frames and wakes the checkpointer; between
/// batches [`WalWatch::catch_up`] lets the WAL start over.
#[derive(Debug, Clone)]
pub(crate) struct WalWatch {
    state: Arc<WalState>,
}

impl WalWatch {
    /// Frames in the WAL after the writer's last commit.
    pub(crate) fn frames(&self) -> u32 {
        self.state.frames.load(Ordering::Relaxed)
    }

    /// Between two batches, on the writer's connection: when [`catch_up_due`], copies
    /// back what is left (a PASSIVE checkpoint, which reaches the WAL's end, so SQLite
    /// syncs the database file) and answers the pass; the next write starts the WAL over
    /// if no reader still reads from it.
    pub(crate) fn catch_up(&self, conn: &Connection) -> Result<Option<Pass>, StoreError> {
        if !catch_up_due(self.frames(), self.state.last()) {
            return Ok(None);
        }
        let pass = passive(conn)?;
        if let Some(pass) = pass {
            self.state.passed(pass);
        }
        Ok(pass)
    }
}

/// The checkpointer: its own connection to the writer's database.
pub(crate) struct Checkpointer {
    conn: Connection,
    state: Arc<WalState>,
}

impl Checkpointer {
    /// One pass: copies back every frame no reader still needs, and answers how far it
    /// got (`None`: another checkpoint was running).
    pub(crate) fn run_once(&self) -> Result<Option<Pass>, StoreError> {
        let pass = passive(&self.conn)?;
        if let Some(pass) = pass {
            self.state.passed(pass);
        }
        Ok(pass)
    }
}

/// Turns SQLite's automatic checkpoint off on `writer` and gives the work to `conn`, a
/// second read-write connection to the same file: answers the writer's side, the
/// checkpointer, and where the writer's hook asks for a pass (every [`PASS_FRAMES`]
/// frames; asks that find a pass already asked for are dropped).
pub(crate) fn attach(
    writer: &mut Connection,
    conn: Connection,
) -> Result<(WalWatch, Checkpointer, mpsc::Receiver<()>), StoreError> {
    // Durable like the writer's: a checkpoint syncs as its own connection says, and the
    // WAL must not start over before the copied pages are on disk.
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(sql_error)?;
    writer
        .pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)
        .map_err(sql_error)?;
    let state = Arc::new(WalState::default());
    let (ask, asks) = mpsc::sync_channel(1);
    let hooked = Arc::clone(&state);
    let mut asked_at = 0;
    // Replaces SQLite's automatic checkpoint, itself a WAL hook.
    writer
        .wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, frames| {
            let frames = u32::try_from(frames).unwrap_or(0);
            hooked.frames.store(frames, Ordering::Relaxed);
            if frames < asked_at {
                asked_at = 0;
            }
            if frames >= asked_at + PASS_FRAMES {
                asked_at = frames;
                let _ = ask.try_send(());
            }
            Ok(())
        }))
        .map_err(sql_error)?;
    Ok((
        WalWatch {
            state: Arc::clone(&state),
        },
        Checkpointer { conn, state },
        asks,
    ))
}

/// [`attach`], with the checkpointer on a thread of its own; it ends with the writer's
/// connection (which holds the hook that asks for passes). Answers the writer's catch-up,
/// to run between its batches.
pub(crate) fn start(
    writer: &mut Connection,
    conn: Connection,
) -> Result<BetweenBatches, StoreError> {
    let (watch, checkpointer, asks) = attach(writer, conn)?;
    thread::Builder::new()
        .name("hookgate-sqlite-checkpoint".into())
        .spawn(move || {
            // A failed pass is tried again at the next ask; meanwhile the writer's catch-up
            // keeps the WAL bounded.
            for () in asks {
                let _ = checkpointer.run_once();
            }
        })
        .map_err(|e| {
            StoreError::Unavailable(format!("starting the SQLite checkpointer: {e}").into())
        })?;
    Ok(Box::new(move |conn: &Connection| {
        // A failed catch-up is tried again after the next batch; the WAL only grows
        // meanwhile.
        let _ = watch.catch_up(conn);
    }))
}

/// A PASSIVE checkpoint on `conn`; `None` when another connection's was running.
fn passive(conn: &Connection) -> Result<Option<Pass>, StoreError> {
    let (busy, frames, copied): (i64, i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .map_err(sql_error)?;
    if busy != 0 || frames < 0 {
        return Ok(None);
    }
    let frames = u32::try_from(frames).unwrap_or(u32::MAX);
    Ok(Some(Pass {
        frames,
        copied: u32::try_from(copied).unwrap_or(0).min(frames),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database file in a directory of its own, removed when dropped.
    struct TempDb(std::path::PathBuf);

    impl TempDb {
        fn new() -> Self {
            let dir = std::env::temp_dir().join(format!("hookgate-wal-{}", fastrand::u64(..)));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn path(&self) -> std::path::PathBuf {
            self.0.join("wal.db")
        }

        /// The writer's connection (WAL, a table of page-sized rows) and a second one for
        /// the checkpointer, attached.
        fn attached(&self) -> (Connection, WalWatch, Checkpointer, mpsc::Receiver<()>) {
            let mut writer = Connection::open(self.path()).unwrap();
            writer.pragma_update(None, "journal_mode", "WAL").unwrap();
            writer
                .execute_batch("CREATE TABLE t (x INTEGER PRIMARY KEY, b BLOB)")
                .unwrap();
            let conn = Connection::open(self.path()).unwrap();
            let (watch, checkpointer, asks) = attach(&mut writer, conn).unwrap();
            (writer, watch, checkpointer, asks)
        }

        fn wal_bytes(&self) -> u64 {
            let wal = self.0.join("wal.db-wal");
            std::fs::metadata(wal).map_or(0, |m| m.len())
        }
    }

    impl Drop for TempDb {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Rows one write adds: one page each, so about as many WAL frames.
    const ROWS: u32 = 40;

    /// Write number `n`: `ROWS` page-sized rows in one transaction.
    fn write(conn: &Connection, n: u32) {
        let tx = conn.unchecked_transaction().unwrap();
        for i in 0..ROWS {
            tx.execute(
                "INSERT INTO t (x, b) VALUES (?1, zeroblob(4000))",
                [i64::from(n * ROWS + i)],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }

    /// The bytes of a WAL of `frames` frames of 4 KiB pages.
    fn wal_of(frames: u32) -> u64 {
        32 + u64::from(frames) * (4096 + 24)
    }

    #[test]
    fn without_passes_the_wal_only_grows_sqlites_own_checkpoint_is_off() {
        let db = TempDb::new();
        let (writer, watch, _checkpointer, asks) = db.attached();
        let writes = 3 * RESTART_FRAMES / ROWS;
        for n in 0..writes {
            write(&writer, n);
        }
        assert!(asks.try_recv().is_ok(), "the hook asked for a pass");
        assert!(watch.frames() >= writes * ROWS, "{} frames", watch.frames());
        assert!(
            db.wal_bytes() >= wal_of(writes * ROWS),
            "nothing started the WAL over: {} bytes",
            db.wal_bytes()
        );
    }

    #[test]
    fn the_checkpointers_passes_and_the_writers_catch_up_keep_the_wal_bounded() {
        let db = TempDb::new();
        let (writer, watch, checkpointer, asks) = db.attached();
        let reader = Connection::open(db.path()).unwrap();
        let (mut passes, mut catch_ups, mut starts, mut largest) = (0, 0, 0, 0);
        let (mut n, mut before) = (0, 0);
        while n < 10 * RESTART_FRAMES / ROWS {
            write(&writer, n);
            n += 1;
            if asks.try_recv().is_ok() {
                // A pass beside a busy writer: the writer appends while it copies. A
                // reader's snapshot holds the pass to the frames before that write.
                reader.execute_batch("BEGIN").unwrap();
                let _: i64 = reader
                    .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
                    .unwrap();
                write(&writer, n);
                n += 1;
                let pass = checkpointer
                    .run_once()
                    .unwrap()
                    .expect("no other checkpoint");
                reader.execute_batch("COMMIT").unwrap();
                assert!(pass.copied < pass.frames, "{pass:?}");
                passes += 1;
            }
            if watch.frames() < before {
                starts += 1;
            }
            before = watch.frames();
            let left = watch.state.last().left(watch.frames());
            if let Some(pass) = watch.catch_up(&writer).unwrap() {
                catch_ups += 1;
                assert!(left <= CATCH_UP_FRAMES, "the writer copied {left} frames");
                assert_eq!(pass.copied, pass.frames, "no reader: all copied back");
            }
            largest = largest.max(db.wal_bytes());
        }
        assert!(
            passes >= 9 * RESTART_FRAMES / PASS_FRAMES,
            "{passes} passes"
        );
        assert!(starts >= 8, "the WAL started over {starts} times");
        assert!(catch_ups >= starts, "{catch_ups} catch-ups");
        assert!(
            largest <= wal_of(RESTART_FRAMES + PASS_FRAMES + 2 * ROWS),
            "the WAL file reached {largest} bytes"
        );
    }

    #[test]
    fn a_wal_the_checkpointer_leaves_behind_is_copied_by_the_writer_at_twice_its_length() {
        let db = TempDb::new();
        let (writer, watch, _checkpointer, _asks) = db.attached();
        let mut copied = None;
        for n in 0..(3 * RESTART_FRAMES / ROWS) {
            write(&writer, n);
            if let Some(pass) = watch.catch_up(&writer).unwrap() {
                copied = Some(pass);
                break;
            }
        }
        let pass = copied.expect("the writer caught up");
        assert!(pass.frames >= 2 * RESTART_FRAMES, "{pass:?}");
        assert_eq!(pass.copied, pass.frames);
        write(&writer, 10_000);
        assert!(
            watch.frames() <= 2 * ROWS,
            "started over: {}",
            watch.frames()
        );
    }

    #[test]
    fn the_writer_catches_up_only_on_a_long_wal_with_little_left() {
        let after = |frames, copied| Pass { frames, copied };
        let r = RESTART_FRAMES;
        assert!(!catch_up_due(r - 1, after(r - 1, r - 1)), "too short");
        assert!(catch_up_due(r, after(r - 100, r - 100)), "100 left");
        assert!(!catch_up_due(r, after(r - 1000, r - 1000)), "1000 left");
        assert!(
            catch_up_due(2 * r, after(0, 0)),
            "the WAL must stay bounded"
        );
        // The WAL started over since that pass: none of its frames is copied back.
        assert_eq!(after(3 * r, 3 * r).left(r), r);
        assert!(!catch_up_due(r, after(3 * r, 3 * r)));
    }
}
