// The open-file limit (RLIMIT_NOFILE) against what the loop polls. poll(2) refuses a set of
// more entries than the soft limit with EINVAL (poll(2), ERRORS), idle entries included, so a
// gateway whose relay capacities reserve more than the limit would wake for nothing every turn.
// systemd starts services with a soft limit of 1024 and a hard limit of 524288 (systemd.exec(5),
// LimitNOFILE=): the soft limit is raised at start, up to the hard one, to what the config needs.
public import CLibc

public enum OpenFileLimit {
    public enum Outcome: Equatable, Sendable {
        /// The soft limit already allows `needed`.
        case enough(soft: Int)
        /// The soft limit was raised from `from` to `to`.
        case raised(from: Int, to: Int)
        /// Even the hard limit is below what is needed: the config must ask for less, or the
        /// service be given more (LimitNOFILE=).
        case short(hard: Int)
        /// getrlimit or setrlimit failed, with this errno.
        case failed(Errno)
    }

    /// The soft and hard limits now; `Int.max` for unlimited.
    public static func current() -> (soft: Int, hard: Int)? {
        var soft: UInt64 = 0, hard: UInt64 = 0
        guard baton_open_file_limit(&soft, &hard) == 0 else { return nil }
        return (Int(clamping: soft), Int(clamping: hard))
    }

    /// Makes the soft limit at least `needed`, raising it no further than that.
    public static func ensure(_ needed: Int) -> Outcome {
        guard let (soft, hard) = current() else { return .failed(Errno(errno, call: "getrlimit(RLIMIT_NOFILE)")) }
        if soft >= needed { return .enough(soft: soft) }
        guard hard >= needed else { return .short(hard: hard) }
        guard baton_set_open_file_soft_limit(UInt64(needed)) == 0 else { return .failed(Errno(errno, call: "setrlimit(RLIMIT_NOFILE)")) }
        return .raised(from: soft, to: needed)
    }

    /// Sets the soft limit (tests lower it to show the raise).
    @discardableResult
    public static func setSoft(_ soft: Int) -> Bool { baton_set_open_file_soft_limit(UInt64(soft)) == 0 }
}
