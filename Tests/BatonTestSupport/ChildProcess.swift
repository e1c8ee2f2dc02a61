// A child process for tests, started with posix_spawn and a clean signal mask.
//
// Why not Foundation's Process: the test runner's threads block nearly every signal
// (SigBlk fffffffe3bfbea27 on a Swift Testing worker), a child inherits its parent thread's
// mask across exec (POSIX, posix_spawn(3)), and Process does not reset it. A mosquitto started
// that way keeps SIGTERM blocked for good, so `terminate()` never stops it; the same would hold
// for a gateway under test. POSIX_SPAWN_SETSIGMASK with an empty set gives the child the mask
// it would have had from a shell. The child is reaped with waitpid on its own pid, so
// Foundation's own bookkeeping of the processes it started is untouched.
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

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attributes, &empty)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK))

        let argv: [UnsafeMutablePointer<CChar>?] = ([path] + arguments).map { strdup($0) } + [nil]
        defer { for a in argv { free(a) } }
        var child: pid_t = 0
        let rc = posix_spawn(&child, path, &actions, &attributes, argv, environ)
        guard rc == 0 else {
            throw BrokerError("could not start \(path): \(String(cString: strerror(rc)))")
        }
        pid = child
    }

    deinit {
        if isRunning {
            Glibc.kill(pid, SIGKILL)
            _ = wait(timeout: .seconds(5))
        }
    }

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

    public func signal(_ number: Int32) {
        if isRunning { Glibc.kill(pid, number) }
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
