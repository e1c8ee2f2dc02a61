// SIGTERM (systemd stop) and SIGINT (Ctrl-C) end the loop cleanly: the handler only writes
// one byte to a pipe that the loop polls (the self-pipe trick; write(2) is async-signal-safe,
// and Glibc's module has no signalfd). The loop then says `offline` itself and disconnects.
import BatonLibc
import CLibc

/// The pipe's write end, set once before the handlers are installed and never changed.
nonisolated(unsafe) private var signalPipeWriteEnd: Int32 = -1

public struct StopSignals: ~Copyable {
    /// Poll this for POLLIN: a stop was asked for.
    public let fd: Int32
    private let writeEnd: Int32

    public init() {
        var ends: (Int32, Int32) = (-1, -1)
        let ok = withUnsafeMutablePointer(to: &ends) {
            $0.withMemoryRebound(to: Int32.self, capacity: 2) { pipe($0) }
        }
        precondition(ok == 0, "pipe failed: errno \(errno)")
        for end in [ends.0, ends.1] {
            _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK)
            _ = fcntl(end, F_SETFD, FD_CLOEXEC)
        }
        fd = ends.0
        writeEnd = ends.1
        signalPipeWriteEnd = ends.1
        for sig in [SIGTERM, SIGINT] {
            signal(sig) { _ in
                var byte: UInt8 = 1
                _ = write(signalPipeWriteEnd, &byte, 1)
            }
        }
        // A parent may have blocked them (and the mask is inherited across exec): unblock, or
        // SIGTERM would wait forever and systemd would fall back to SIGKILL.
        var mask = sigset_t()
        sigemptyset(&mask)
        sigaddset(&mask, SIGTERM)
        sigaddset(&mask, SIGINT)
        pthread_sigmask(SIG_UNBLOCK, &mask, nil)
        // A broker or controller socket closing under us must be an error, not a kill.
        baton_signal_ignore(SIGPIPE)
    }

    deinit {
        baton_signal_default(SIGTERM)
        baton_signal_default(SIGINT)
        close(fd)
        close(writeEnd)
    }

    /// Drains the pipe; true if a stop was asked for.
    public func drain() -> Bool {
        var buffer: (UInt64, UInt64) = (0, 0)
        var any = false
        while withUnsafeMutableBytes(of: &buffer, { read(fd, $0.baseAddress, $0.count) }) > 0 { any = true }
        return any
    }
}
