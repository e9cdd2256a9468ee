//! CPU time read from /proc, for the benches that say what an event costs: one process's
//! or one thread's user and system time, and a Postgres cluster's (the postmaster's own and
//! its reaped children's, plus every live child's). Linux only; what is read must run on
//! this machine. Reads only.

/// Clock ticks a second in /proc's times (`USER_HZ`): 100 on every Linux architecture.
pub const TICKS_PER_SECOND: f64 = 100.0;

/// The fields of a /proc `stat` file the benches read, in clock ticks.
pub struct Stat {
    /// The parent's pid.
    pub ppid: u32,
    /// User time, in ticks.
    pub utime: u64,
    /// System time, in ticks.
    pub stime: u64,
    /// Reaped children's user time, in ticks.
    pub cutime: u64,
    /// Reaped children's system time, in ticks.
    pub cstime: u64,
}

/// Reads /proc/PID/stat; `None` for a process that is gone.
pub fn stat(pid: u32) -> Option<Stat> {
    stat_at(&format!("/proc/{pid}/stat"))
}

/// Reads a `stat` file (a process's, or a thread's: /proc/self/task/TID/stat,
/// /proc/thread-self/stat); `None` when it is gone.
pub fn stat_at(path: &str) -> Option<Stat> {
    let text = std::fs::read_to_string(path).ok()?;
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    // After the name: state (3), ppid (4), …, utime (14), stime (15), cutime (16), cstime (17).
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        ppid: u32::try_from(field(4)?).ok()?,
        utime: field(14)?,
        stime: field(15)?,
        cutime: field(16)?,
        cstime: field(17)?,
    })
}

/// The calling thread's user + system ticks so far (0 where /proc cannot say).
pub fn this_thread_ticks() -> u64 {
    stat_at("/proc/thread-self/stat").map_or(0, |s| s.utime + s.stime)
}

/// The calling thread's id, for reading its ticks from another thread later.
pub fn this_thread_id() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// A thread of this process: its user + system ticks so far (0 once it is gone).
pub fn thread_ticks(tid: u32) -> u64 {
    stat_at(&format!("/proc/self/task/{tid}/stat")).map_or(0, |s| s.utime + s.stime)
}

/// The cluster's ticks: the postmaster's own and reaped children's time, plus every live
/// child's. Panics if the postmaster is gone (the run's database died under it).
pub fn cluster_ticks(postmaster: u32) -> u64 {
    let Some(own) = stat(postmaster) else {
        panic!("the postmaster {postmaster} is gone");
    };
    let children: u64 = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(stat)
        .filter(|s| s.ppid == postmaster)
        .map(|s| s.utime + s.stime)
        .sum();
    own.utime + own.stime + own.cutime + own.cstime + children
}
