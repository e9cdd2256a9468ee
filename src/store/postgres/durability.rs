//! When a commit hookgate was told of may still be lost: the server's settings and its
//! standbys, judged once at start (`Store::durability_risks`); `serve` refuses or warns.

/// The physical standbys streaming from a server.
pub(super) struct Standbys {
    pub(super) streaming: i64,
    /// Those whose `sync_state` this role may read.
    pub(super) with_state: i64,
    /// Those confirming commits (`sync` or `quorum`).
    pub(super) synchronous: i64,
}

/// The settings under which a commit hookgate was told of may be lost, as `(name, value
/// and why)`: a crash loses it (`fsync`, `synchronous_commit` off), or a failover to a
/// standby that never had it (standbys stream, none synchronously, or the commit does not
/// wait for them: `synchronous_commit = local`). A lost done row lets a redelivery run the
/// target twice. Also a synchronous standby named but not connected: every commit waits.
pub(super) fn risks(
    synchronous_commit: &str,
    fsync: &str,
    standby_names: &str,
    standbys: &Standbys,
) -> Vec<(String, String)> {
    let mut risks = Vec::new();
    let streaming = standbys.streaming;
    if synchronous_commit == "off" || (synchronous_commit == "local" && streaming > 0) {
        risks.push((
            "synchronous_commit".to_owned(),
            synchronous_commit.to_owned(),
        ));
    }
    if fsync == "off" {
        risks.push(("fsync".to_owned(), fsync.to_owned()));
    }
    let named = !standby_names.trim().is_empty();
    if streaming > 0 && !named {
        risks.push((
            "synchronous_standby_names".to_owned(),
            format!(
                "'' while {streaming} standby(s) stream asynchronously (a failover loses the \
                 commits they had not received yet)"
            ),
        ));
    }
    let commits_wait = !matches!(synchronous_commit, "off" | "local");
    let none_confirms =
        streaming == 0 || (standbys.with_state == streaming && standbys.synchronous == 0);
    if named && commits_wait && none_confirms {
        risks.push((
            "synchronous_standby_names".to_owned(),
            format!(
                "'{standby_names}' while none of them is connected: every commit waits for \
                 one (hookgate answers 503 store_unavailable meanwhile)"
            ),
        ));
    }
    risks
}

#[cfg(test)]
mod tests {
    use super::{risks, Standbys};

    #[test]
    fn standbys_that_no_commit_waits_for_are_a_risk_a_synchronous_one_is_not() {
        let names = |r: Vec<(String, String)>| r.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        let none = Standbys {
            streaming: 0,
            with_state: 0,
            synchronous: 0,
        };
        let one_sync = Standbys {
            streaming: 1,
            with_state: 1,
            synchronous: 1,
        };
        let one_async = Standbys {
            synchronous: 0,
            ..one_sync
        };
        let one_unseen = Standbys {
            with_state: 0,
            ..one_async
        };
        assert!(
            risks("on", "on", "", &none).is_empty(),
            "no standby: nothing to lose"
        );
        assert!(risks("on", "on", "standby1", &one_sync).is_empty());
        assert!(risks("remote_apply", "on", "FIRST 1 (a, b)", &one_sync).is_empty());
        assert!(
            risks("on", "on", "standby1", &one_unseen).is_empty(),
            "whether it confirms is not visible to this role"
        );
        assert_eq!(
            names(risks("on", "on", "", &one_async)),
            ["synchronous_standby_names"]
        );
        assert_eq!(
            names(risks("local", "on", "standby1", &one_async)),
            ["synchronous_commit"]
        );
        assert!(
            risks("local", "on", "", &none).is_empty(),
            "local alone loses nothing"
        );
        assert_eq!(
            names(risks("off", "off", "", &none)),
            ["synchronous_commit", "fsync"]
        );
        // Named, but not there: every commit waits.
        assert_eq!(
            names(risks("on", "on", "ghost", &one_async)),
            ["synchronous_standby_names"]
        );
        assert_eq!(
            names(risks("remote_write", "on", "ghost", &none)),
            ["synchronous_standby_names"]
        );
        assert!(risks("local", "on", "ghost", &none).is_empty());
    }
}
