// A child process for tests, started with posix_spawn and a clean signal mask.
//
// Why not Foundation's Process: the test runner's threads block nearly every signal
// (SigBlk fffffffe3bfbea27 on a Swift Testing worker), a child inherits its parent thread's
// mask across exec (POSIX, posix_spawn(3)), and Process does not reset it. A mosquitto started
// that way keeps SIGTERM blocked for good, so `terminate()` never stops it; the same would hold
// for a gateway under test. POSIX_SPAWN_SETSIGMASK with an empty set gives the child the mask
// it would have had from a shell. The child is reaped with waitpid on its own pid, so
// Foundation's own bookkeeping of the processes it started is untouched.
//
// No child outlives the tests (issue 20). Each one leads a process group of its own, so a
// SIGKILL, and the deinit, take what it started with it (a `sh -c 'a | b'` pipeline). And each
// one is started through util-linux's `setpriv --pdeathsig SIGKILL`, which sets
// PR_SET_PDEATHSIG and execs the program (same pid): if the test process dies without running
// a deinit (a crash, a timeout, an object never released), the kernel kills the child.
// The parent-death signal follows the *thread* that started the child, and the test runner's
// worker threads come and go, so every child is started from one thread that lives as long as
// the process (`Spawner`). It inherits stdin, stdout and stderr only.
import Foundation
import Glibc

public final class ChildProcess: @unchecked Sendable {
    public let pid: pid_t
    public private(set) var exitStatus: Int32?

    /// Starts `path` with `arguments`; stdout and stderr go to the given files (created or
    /// truncated), or to /dev/null. stdin is /dev/null.
    public init(_ path: String, _ arguments: [String], stdout: String? = nil, stderr: String? = nil) throws {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, stdout ?? "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_addopen(&actions, 2, stderr ?? "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        // Nothing else of the test process: a socket a parallel test holds open would stay
        // open in the child (a broker lives as long as its test), and that test's close()
        // would never reach its peer.
        _ = Self.addCloseFrom?(&actions, 3)

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attributes, &empty)
        // Process group 0: the child's own, numbered by its pid.
        posix_spawnattr_setpgroup(&attributes, 0)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP))

        // setpriv execs the program only after it started, so a missing one is told here.
        guard access(path, X_OK) == 0 else {
            throw BrokerError("could not start \(path): \(String(cString: strerror(errno)))")
        }
        let wrapped = Self.setpriv.map { [$0, "--pdeathsig", "SIGKILL", "--", path] } ?? [path]
        let argv: [UnsafeMutablePointer<CChar>?] = (wrapped + arguments).map { strdup($0) } + [nil]
        defer { for a in argv { free(a) } }
        let rc = Spawner.shared.spawn(wrapped[0], actions: &actions, attributes: &attributes, argv: argv)
        guard rc.error == 0 else {
            throw BrokerError("could not start \(path): \(String(cString: strerror(rc.error)))")
        }
        pid = rc.pid
    }

    deinit {
        if isRunning {
            Glibc.kill(pid, SIGKILL)
            _ = wait(timeout: .seconds(5))
        }
        // Whatever it started and left behind (its process group outlives it).
        Glibc.kill(-pid, SIGKILL)
    }

    /// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34+; Debian bookworm has 2.36),
    /// looked up at run time: Swift's Glibc module declares it only under _GNU_SOURCE.
    typealias AddCloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    static let addCloseFrom: AddCloseFrom? = dlsym(nil, "posix_spawn_file_actions_addclosefrom_np")
        .map { unsafeBitCast($0, to: AddCloseFrom.self) }

    /// util-linux's setpriv (`--pdeathsig` since 2.33); without it children start directly.
    static let setpriv: String? = FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv") ? "/usr/bin/setpriv" : nil

    /// True until the child has exited (and been reaped here).
    public var isRunning: Bool {
        if exitStatus != nil { return false }
        var status: Int32 = 0
        let r = waitpid(pid, &status, WNOHANG)
        if r == pid {
            exitStatus = status
            return false
        }
        return r == 0
    }

    /// Sends `number` to the child; SIGKILL goes to its whole process group (what it started).
    public func signal(_ number: Int32) {
        if isRunning { Glibc.kill(number == SIGKILL ? -pid : pid, number) }
    }

    /// Waits up to `timeout` for the child to exit; its raw wait status, or nil if it still runs.
    @discardableResult
    public func wait(timeout: Duration) -> Int32? {
        let deadline = ContinuousClock.now + timeout
        while isRunning {
            if ContinuousClock.now >= deadline { return nil }
            usleep(5_000)
        }
        return exitStatus
    }

    /// Runs a tool to completion (bounded by `timeout`, then SIGKILL) and returns its exit code,
    /// or -1 if it was killed.
    public static func run(_ path: String, _ arguments: [String], stdout: String? = nil, stderr: String? = nil,
                           timeout: Duration = .seconds(10)) throws -> Int32 {
        let child = try ChildProcess(path, arguments, stdout: stdout, stderr: stderr)
        guard let status = child.wait(timeout: timeout) else {
            child.signal(SIGKILL)
            child.wait(timeout: .seconds(5))
            return -1
        }
        // WIFEXITED / WEXITSTATUS (sys/wait.h macros, not imported into Swift).
        return status & 0x7F == 0 ? (status >> 8) & 0xFF : -1
    }
}

/// The one thread every child is started from: it lives as long as the test process, so a
/// child's parent-death signal fires when the process dies, not when a worker thread retires.
private final class Spawner: @unchecked Sendable {
    static let shared = Spawner()

    private let condition = NSCondition()
    private var jobs: [() -> Void] = []

    private init() {
        let thread = Thread { [self] in
            while true {
                condition.lock()
                while jobs.isEmpty { condition.wait() }
                let job = jobs.removeFirst()
                condition.unlock()
                job()
            }
        }
        thread.name = "ChildProcess spawner"
        thread.start()
    }

    /// posix_spawn on the spawner thread; the caller waits for it.
    func spawn(_ path: String, actions: inout posix_spawn_file_actions_t, attributes: inout posix_spawnattr_t,
               argv: [UnsafeMutablePointer<CChar>?]) -> (pid: pid_t, error: Int32) {
        final class Result: @unchecked Sendable { var pid: pid_t = 0; var error: Int32 = 0 }
        let result = Result()
        let done = DispatchSemaphore(value: 0)
        withUnsafeMutablePointer(to: &actions) { actions in
            withUnsafeMutablePointer(to: &attributes) { attributes in
                condition.lock()
                jobs.append {
                    var child: pid_t = 0
                    result.error = posix_spawn(&child, path, actions, attributes, argv, environ)
                    result.pid = child
                    done.signal()
                }
                condition.signal()
                condition.unlock()
                done.wait()
            }
        }
        return (result.pid, result.error)
    }
}
