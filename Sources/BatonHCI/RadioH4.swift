// H4 over a file descriptor (Core 5.4, Vol 4, Part A, "UART Transport Layer"): a serial
// controller running HCI-UART firmware (Zephyr's hci_uart, nRF Connect's hci_uart, an ESP32
// with the BT controller in HCI mode), or a stream socket to the simulator's virtual
// controller. Nothing stands between Baton and the controller, so Baton owns it: Reset, event
// masks, features, scan parameters, scan enable (CommandFlow in RadioSource.swift).
//
// One thread, no blocking (architecture.md §5.7): the descriptor is non-blocking; `poll(now:_:)`
// reads what is there, frames it (H4Framer), answers the init sequence and writes at most one
// command, and returns. A short write keeps the rest of the command and asks for POLLOUT.

import BatonLibc
import CLibc
import BatonWire

public struct RadioH4: RadioSource, ~Copyable {
    public let fd: Int32
    private let ownsDescriptor: Bool
    /// Sockets are written with send(MSG_NOSIGNAL) so a closed peer is an error, not SIGPIPE.
    private let isSocket: Bool
    private var flow: CommandFlow
    private var framer: H4Framer
    /// Read buffer, allocated once.
    private let rx: UnsafeMutableRawBufferPointer
    /// The one command in flight, encoded; `txSent` of its `txCount` bytes are written.
    private let tx: UnsafeMutableRawBufferPointer
    private var txCount = 0
    private var txSent = 0

    /// Packets that were not events (ACL, SCO, ISO, or a command echoed back); a scanner
    /// expects none.
    public private(set) var nonEventPackets = 0
    /// Events handed to `onEvent` since creation.
    public private(set) var eventsDelivered = 0

    /// Reads per `poll` call, so a chatty controller cannot starve the other descriptors of
    /// the caller's loop; the rest stays readable for the next turn. 64 KiB a turn: at the
    /// 100 turns a second of a gathering loop (`radio.gather`), 140,000 reports a second.
    public static let maxReadsPerPoll = 64

    /// Test seam: caps the bytes offered to each write(), so tests drive real partial writes
    /// through a socket. Production leaves it at `Int.max`.
    var maxWriteChunk = Int.max

    /// Takes `fd` (already open, any stream: tty, socket, pipe pair) and makes it non-blocking.
    /// With `ownsDescriptor` the source closes it when it goes away.
    public init(fd: Int32, config: RadioConfig = RadioConfig(), ownsDescriptor: Bool = true,
                readBufferSize: Int = 1024) throws(RadioError) {
        precondition(fd >= 0, "RadioH4 needs an open descriptor")
        precondition(readBufferSize >= 1, "readBufferSize must be positive")
        do {
            try Syscall.setNonBlocking(fd)
        } catch {
            throw .os(error)
        }
        self.fd = fd
        self.ownsDescriptor = ownsDescriptor
        self.isSocket = Syscall.isSocket(fd)
        self.flow = CommandFlow(config: config, ownsController: true)
        // Events are at most 2 + 255 bytes; ACL the gateway never expects is skipped by
        // length, so the framer's default data limit only bounds how much of it is held.
        self.framer = H4Framer()
        self.rx = .allocate(byteCount: readBufferSize, alignment: 8)
        self.tx = .allocate(byteCount: HCICommand.maxEncodedLength, alignment: 8)
    }

    deinit {
        rx.deallocate()
        tx.deallocate()
        if ownsDescriptor { Syscall.close(fd) }
    }

    public var wantsWrite: Bool { txSent < txCount }
    public var state: RadioState { flow.state }
    public var nextDeadline: Instant? { flow.deadline }
    /// What Read_Local_Version_Information returned during the last init.
    public var localVersion: HCILocalVersion? { flow.localVersion }
    /// What LE_Read_Local_Supported_Features returned during the last init.
    public var leFeatures: LEFeatures? { flow.leFeatures }
    /// Whether the last init chose extended scanning (§7.8.64/§7.8.65).
    public var usesExtendedScanning: Bool { flow.usesExtendedScanning }
    public var scanType: ScanType? { flow.appliedScanType }

    public mutating func setScanType(_ type: ScanType, now: Instant) throws(RadioError) {
        flow.setScanType(type, now: now)
        do {
            try pump(now: now)
        } catch {
            flow.fail()
            throw error
        }
    }
    /// Framing counters (garbage bytes skipped while hunting for an indicator).
    public var framerStats: H4FramerStats { framer.stats }

    public mutating func start(now: Instant) throws(RadioError) {
        // A command half written must still be finished: H4 cannot abandon a packet
        // mid-stream, the controller would read the next command as its tail. Its answer will
        // not match the new sequence's opcodes and only its credits are used.
        if txSent == 0 { txCount = 0 }
        flow.start(now: now)
        try flush()
        try pump(now: now)
    }

    public mutating func poll(now: Instant,
                              _ onEvent: (UnsafeRawBufferPointer) -> Void) throws(RadioError) -> Int {
        var firstError: RadioError? = nil
        var delivered = 0
        var others = 0
        do {
            try flush()
        } catch {
            firstError = error
        }
        reading: for _ in 0 ..< Self.maxReadsPerPoll {
            let n: Int
            do {
                guard let got = try Syscall.read(fd, into: rx) else { break reading }  // EAGAIN
                n = got
            } catch {
                if firstError == nil { firstError = Self.map(error) }
                break reading
            }
            if n == 0 {
                if firstError == nil { firstError = .closed }
                break reading
            }
            let chunk = UnsafeRawBufferPointer(rebasing: rx[..<n])
            // The framer's callback must not touch `self` while `self.framer` is being mutated
            // (exclusivity), so the flow is worked on as a local copy (a few dozen bytes, no
            // allocation) and stored back.
            var flow = self.flow
            framer.push(chunk) { packet in
                guard packet.type == .event else {
                    others &+= 1
                    return
                }
                do throws(RadioError) {
                    if try flow.handle(event: packet.bytes, now: now) { return }
                } catch {
                    // Keep framing the rest of the chunk so the stream stays in sync; report
                    // the first error when the chunk is done.
                    if firstError == nil { firstError = error }
                    return
                }
                delivered &+= 1
                onEvent(packet.bytes)
            }
            self.flow = flow
            if n < rx.count { break reading }  // drained
        }
        nonEventPackets &+= others
        eventsDelivered &+= delivered
        if firstError == nil {
            do {
                try flow.checkDeadline(now: now)
                try pump(now: now)
            } catch {
                firstError = error
            }
        }
        if let e = firstError {
            flow.fail()
            throw e
        }
        return delivered
    }

    /// Once the command in flight is fully written and flow control allows, encodes the next
    /// one and makes its first write attempt.
    private mutating func pump(now: Instant) throws(RadioError) {
        guard txSent == txCount, let command = flow.nextCommand(now: now) else { return }
        var w = ByteWriter(tx)
        do {
            try command.encode(into: &w)
        } catch {
            preconditionFailure("tx is sized for HCICommand.maxEncodedLength: \(error)")
        }
        txCount = w.count
        txSent = 0
        try flush()
    }

    /// One write attempt for the rest of the command in flight. A short write means the
    /// descriptor is full: the rest waits for POLLOUT (`wantsWrite`).
    private mutating func flush() throws(RadioError) {
        guard txSent < txCount else { return }
        let count = min(txCount &- txSent, maxWriteChunk)
        let bytes = UnsafeRawBufferPointer(rebasing: tx[txSent ..< txSent &+ count])
        do {
            let written = isSocket ? try Syscall.send(fd, bytes) : try Syscall.write(fd, bytes)
            if let written { txSent &+= written }
        } catch {
            throw Self.map(error)
        }
    }

    /// A peer that hung up is `.closed`; anything else is the OS's.
    private static func map(_ e: Errno) -> RadioError {
        switch e.code {
        case EPIPE, ECONNRESET: .closed
        default: .os(e)
        }
    }

    // MARK: - Serial ports

    /// Opens a serial controller for H4: raw 8N1, the given baud rate, RTS/CTS hardware flow
    /// control (Vol 4, Part A, §3.1 asks for it), non-blocking, close-on-exec. The returned
    /// descriptor is for `init(fd:…)`.
    public static func openSerial(path: String, baud: Int = 115_200, hardwareFlowControl: Bool = true) throws(RadioError) -> Int32 {
        guard let speed = speed(for: baud) else {
            throw .invalidConfiguration("baud rate \(baud) is not one of 9600, 19200, 38400, 57600, 115200, 230400, 460800, 921600, 1000000, 1500000, 2000000, 3000000")
        }
        let fd = BatonLibc.open(path, O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC)
        if fd < 0 {
            let e = errno
            switch e {
            case ENOENT, ENODEV, ENXIO:
                throw .adapterNotFound(path)
            case EACCES:
                throw .permissionDenied("opening \(path) needs read/write access to it (usually membership of the dialout group)")
            case EPERM:
                // A device cgroup refuses with EPERM, file permissions with EACCES: under
                // baton.service that is its DevicePolicy=closed (docs/install.md §2).
                throw .permissionDenied("opening \(path) was refused by a device policy, not by its file permissions (EPERM): under baton.service, allow its driver with a DeviceAllow=char-<driver> rw line (docs/install.md \"The unit's sandbox\")")
            default:
                throw .os(Errno(e, call: "open(serial)"))
            }
        }
        var t = termios()
        do {
            _ = try Syscall.call("tcgetattr") { Int(tcgetattr(fd, &t)) }
            cfmakeraw(&t)
            t.c_cflag |= tcflag_t(CLOCAL | CREAD)
            if hardwareFlowControl {
                t.c_cflag |= crtscts
            } else {
                t.c_cflag &= ~crtscts
            }
            _ = try Syscall.call("cfsetspeed") { Int(cfsetspeed(&t, speed)) }
            _ = try Syscall.call("tcsetattr") { Int(tcsetattr(fd, TCSANOW, &t)) }
            // Drop whatever the controller sent before we were listening: a partial packet
            // would desynchronise the framer before the Reset.
            _ = try Syscall.call("tcflush") { Int(tcflush(fd, TCIOFLUSH)) }
        } catch {
            Syscall.close(fd)
            throw .os(error)
        }
        return fd
    }

    /// CRTSCTS from <bits/termios-c_cflag.h> (0x80000000); the macro does not import because
    /// its octal value overflows Int32.
    private static let crtscts = tcflag_t(0x8000_0000)

    private static func speed(for baud: Int) -> speed_t? {
        switch baud {
        case 9600: speed_t(B9600)
        case 19200: speed_t(B19200)
        case 38400: speed_t(B38400)
        case 57600: speed_t(B57600)
        case 115_200: speed_t(B115200)
        case 230_400: speed_t(B230400)
        case 460_800: speed_t(B460800)
        case 921_600: speed_t(B921600)
        case 1_000_000: speed_t(B1000000)
        case 1_500_000: speed_t(B1500000)
        case 2_000_000: speed_t(B2000000)
        case 3_000_000: speed_t(B3000000)
        default: nil
        }
    }
}
