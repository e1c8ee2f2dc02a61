// The firmware's log, the gateway's and its parts' alike (the ESPHome server's): one line per
// event on stderr, prefixed with its syslog priority the way sd-daemon(3) describes (`<6>`
// info, `<4>` warning, …), so journald files each line under its level and a terminal still
// reads it. Written with write(2) on descriptor 2: no buffering to lose on a crash, no
// Foundation, and it compiles in Embedded Swift like the rest of the daemon (docs/firmware.md).
// The level comes from `log.level` in the config (docs/config.md).
public struct Logger: Sendable {
    /// The levels `log.level` accepts, most verbose first, with their syslog priorities.
    public enum Level: String, CaseIterable, Sendable, Comparable {
        case trace, debug, info, notice, warning, error, critical

        /// The `<N>` prefix: syslog's priority (RFC 5424 §6.2.1); trace has none finer than debug.
        public var priority: Int {
            switch self {
            case .trace, .debug: 7
            case .info: 6
            case .notice: 5
            case .warning: 4
            case .error: 3
            case .critical: 2
            }
        }

        /// Most verbose first; a switch, not `allCases`, whose array every log call would build.
        var rank: Int {
            switch self {
            case .trace: 0
            case .debug: 1
            case .info: 2
            case .notice: 3
            case .warning: 4
            case .error: 5
            case .critical: 6
            }
        }
        public static func < (a: Level, b: Level) -> Bool { a.rank < b.rank }
    }

    /// Lines below this level are not written (nor their message built).
    public var level: Level
    /// Where the lines go: stderr, or a test's descriptor.
    public var descriptor: Int32

    public init(level: Level = .info, descriptor: Int32 = 2) {
        self.level = level
        self.descriptor = descriptor
    }

    /// Writes nothing: for a part whose caller keeps no log (a benchmark).
    public static var off: Logger { Logger(level: .critical, descriptor: -1) }

    public func log(level: Level, _ message: @autoclosure () -> String) {
        guard level >= self.level, descriptor >= 0 else { return }
        var line = "<\(level.priority)>"
        line += message()
        line += "\n"
        writeAll(descriptor, line)
    }

    public func trace(_ message: @autoclosure () -> String) { log(level: .trace, message()) }
    public func debug(_ message: @autoclosure () -> String) { log(level: .debug, message()) }
    public func info(_ message: @autoclosure () -> String) { log(level: .info, message()) }
    public func notice(_ message: @autoclosure () -> String) { log(level: .notice, message()) }
    public func warning(_ message: @autoclosure () -> String) { log(level: .warning, message()) }
    public func error(_ message: @autoclosure () -> String) { log(level: .error, message()) }
    public func critical(_ message: @autoclosure () -> String) { log(level: .critical, message()) }
}
