// systemd's notify protocol (sd_notify(3)), as the unit in board/ uses it: READY=1 once the
// loop runs, WATCHDOG=1 every half of $WATCHDOG_USEC.
import BatonLibc
@testable import BatonGateway
import BatonHCI
import Foundation
import CBlueZ  // its shim includes <sys/socket.h>: the socket types have one owner
import Glibc
import Testing

struct SystemdTests {
    /// A datagram socket standing in for systemd's notify socket.
    func listener(_ path: String) throws -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        var unix = try #require(Syscall.unixAddress(path))
        let r = withUnsafePointer(to: &unix.address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, unix.length) }
        }
        try #require(r == 0, "bind \(path): errno \(Glibc.errno)")
        return fd
    }

    func receive(_ fd: Int32) -> String? {
        var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&p, 1, 2000) > 0 else { return nil }
        var buf = [UInt8](repeating: 0, count: 256)
        let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        return n > 0 ? String(decoding: buf[..<n], as: UTF8.self) : nil
    }

    @Test(arguments: ["file", "@abstract"])
    func readyAndWatchdogReachTheNotifySocket(_ kind: String) throws {
        let path = kind == "file" ? try scratchDirectory("notify").appendingPathComponent("notify.sock").path
                                  : "@baton-test-notify-\(getpid())"
        let fd = try listener(path)
        defer { close(fd) }
        var notifier = SystemdNotifier(environment: ["NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"])
        let active = notifier.isActive, interval = notifier.watchdogInterval
        #expect(active)
        #expect(interval == .seconds(1))
        notifier.send("READY=1")
        #expect(receive(fd) == "READY=1")
        let start = Instant.now
        notifier.pingIfDue(now: start)
        #expect(receive(fd) == "WATCHDOG=1")
        // Not again before half the watchdog period.
        notifier.pingIfDue(now: start + .milliseconds(500))
        let next = notifier.nextDeadline
        #expect(next == start + .seconds(1))
        notifier.pingIfDue(now: start + .seconds(1))
        #expect(receive(fd) == "WATCHDOG=1")
    }

    @Test func withoutSystemdNothingIsSent() {
        let notifier = SystemdNotifier(environment: [:])
        let active = notifier.isActive, interval = notifier.watchdogInterval, next = notifier.nextDeadline
        #expect(!active)
        #expect(interval == nil)
        #expect(next == nil)
    }
}
