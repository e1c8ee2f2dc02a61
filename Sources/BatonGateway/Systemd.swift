// systemd's notify protocol (sd_notify(3)): datagrams like "READY=1" to the socket named in
// $NOTIFY_SOCKET. The unit in board/ is Type=notify with WatchdogSec: the loop pings the
// watchdog every half period, so a loop that hangs gets the service restarted. Without
// $NOTIFY_SOCKET (not under systemd) every call does nothing.
import BatonLibc
import BatonHCI
import CLibc

public struct SystemdNotifier: ~Copyable {
    private let fd: Int32
    private var address = sockaddr_un()
    private var addressLength: socklen_t = 0
    /// Half of $WATCHDOG_USEC, when systemd asked for pings.
    public let watchdogInterval: Duration?
    private var nextPing: Instant?

    public init(environment: [String: String]) {
        var fd: Int32 = -1
        if let path = environment["NOTIFY_SOCKET"], let unix = Syscall.unixAddress(path) {
            fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            address = unix.address
            addressLength = unix.length
        }
        self.fd = fd
        if fd >= 0, let text = environment["WATCHDOG_USEC"], let usec = Int64(text), usec > 0 {
            watchdogInterval = .microseconds(usec / 2)
        } else {
            watchdogInterval = nil
        }
    }

    deinit { if fd >= 0 { close(fd) } }

    public var isActive: Bool { fd >= 0 }

    public mutating func send(_ text: String) {
        guard fd >= 0 else { return }
        var message = text
        message.withUTF8 { bytes in
            withUnsafePointer(to: &address) { p in
                p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                    // A lost notification is not worth stopping for; systemd times out visibly.
                    _ = sendto(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL), sa, addressLength)
                }
            }
        }
    }

    /// When the loop must wake to ping the watchdog next.
    public var nextDeadline: Instant? { nextPing }

    public mutating func pingIfDue(now: Instant) {
        guard let interval = watchdogInterval else { return }
        if let due = nextPing, now < due { return }
        send("WATCHDOG=1")
        nextPing = now + interval
    }
}
