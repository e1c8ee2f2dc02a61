// The BlueZ raw HCI socket (Linux net/bluetooth/hci_sock.c, HCI_CHANNEL_RAW) through
// libbluetooth: open the adapter, filter the events we want, set scan parameters, enable
// scanning. The kernel stays the controller's owner: it reset the controller and set its event
// masks when it brought the adapter up, it queues our commands behind its own (its cmd_q, with
// its own flow control), and its command handlers track what we changed. So this source sends
// no Reset and no event masks: CommandFlow with `ownsController: false` reads the version and
// features, disables scanning, sets parameters, enables scanning.
//
// What the socket delivers (checked in BlueZ lib/hci.c `hci_send_req`, which reads the event
// header at buf + 1, and the kernel's hci_send_to_sock, which pushes the packet type in front):
// one packet per read(), the H4 type byte first, then the event. Commands are written the same
// way, type byte first (lib/hci.c `hci_send_cmd`), i.e. exactly `HCICommand.encode(into:)`.
// The socket also shows the kernel's own Command Complete events (every raw socket sees every
// packet that passes its filter); CommandFlow matches opcodes and uses only their credits.
//
// The kernel also scans and connects on the same controller, and it does not put Baton's scan
// back. Seen on the real stack (docs/vm.md): to open an L2CAP link (the gateway's own fetch),
// the kernel disables scanning, runs its own accept-list scan, disables it again, creates the
// connection, and leaves scanning off; the gateway would hear nothing until its watchdog. So
// the socket also lets through command packets, which the kernel copies to every raw socket
// but the sender (hci_sock.c `hci_send_to_sock`): when another party (the kernel, for itself
// or bluetoothd) sends a scan command, the init sequence runs again once the kernel has been
// quiet for `rescanAfter`.
//
// Privileges: the raw socket passes LE Meta events and accepts LE scan commands only with
// CAP_NET_RAW (hci_sock.c `hci_sec_filter` limits everyone else to a few read-only commands
// and events); bringing a down adapter up (HCIDEVUP) needs CAP_NET_ADMIN.

import BatonLibc
import CLibc
import CBlueZ
import BatonWire

public struct RadioBlueZ: RadioSource, ~Copyable {
    public let fd: Int32
    /// The name it was opened with, e.g. "hci0", for messages.
    public let adapter: String
    private var flow: CommandFlow
    private let rx: UnsafeMutableRawBufferPointer
    private let tx: UnsafeMutableRawBufferPointer
    private var txCount = 0
    private var txSent = 0

    /// Events handed to `onEvent` since creation.
    public private(set) var eventsDelivered = 0
    /// Events dropped because their declared length did not match the packet (Core 5.4,
    /// Vol 4, Part E, §5.4.4), and packets that were not events.
    public private(set) var malformedEvents = 0
    public private(set) var nonEventPackets = 0
    /// Scan commands someone else sent (the kernel, for its own connections or bluetoothd);
    /// each burst of them is followed by setting Baton's scan again.
    public private(set) var scanCommandsSeen = 0
    /// Times Baton's scan was set again after someone else changed it.
    public private(set) var rescans = 0
    /// When the last scan command of someone else was seen; nil when none is pending.
    private var foreignScanAt: Instant? = nil

    /// How long the kernel must have sent no scan command before Baton sets its scan again.
    /// Its connect sequence (disable, accept list, parameters, enable, disable, LE Create
    /// Connection) takes tens of milliseconds once the device advertises; half a second lets it
    /// finish instead of racing it, and costs at most that much listening.
    public static let rescanAfter: Duration = .milliseconds(500)

    /// Packets per `poll` call, so the other descriptors of the loop get their turn. A socket
    /// read is one event, and the gateway's loop serves at most 100 turns a second while it
    /// gathers (`radio.gather`): 256 a turn keeps up with 25,000 reports a second.
    public static let maxReadsPerPoll = 256

    // Constants from the BlueZ headers that are restated here, each with its source.

    /// <bluetooth/hci.h>: `HCIDEVUP _IOW('H', 201, int)`. The function-like `_IOW` macro does
    /// not import into Swift. asm-generic/ioctl.h: dir WRITE (1) << 30 | size 4 << 16 |
    /// 'H' (0x48) << 8 | 201 (0xC9). The same on x86, arm and arm64 (not on powerpc/mips/sparc).
    static let hciDevUp: UInt = 0x4004_48C9
    /// <bluetooth/hci.h>: `HCI_EVENT_PKT 0x04`.
    static let eventPacketType: UInt8 = 0x04
    /// <bluetooth/hci.h>: `HCI_COMMAND_PKT 0x01`.
    static let commandPacketType: UInt8 = 0x01
    /// <bluetooth/hci.h>: the anonymous enum of device flags starts `HCI_UP` = bit 0.
    static let hciUpFlag: UInt32 = 1 << 0
    /// <bluetooth/hci.h>: `HCI_DEV_NONE 0xffff`, so device ids are 0…0xFFFE.
    static let hciDevNone = 0xFFFF
    /// <asm-generic/errno.h>: ERFKILL, "Operation not possible due to RF-kill".
    static let errRFKill: Int32 = 132

    /// Opens `adapter` ("hci0", or the adapter's address "AA:BB:CC:DD:EE:FF"), bringing it up
    /// if it is down, with a filter for the events a scanner needs. Call `start(now:)` next.
    public init(adapter: String = "hci0", config: RadioConfig = RadioConfig()) throws(RadioError) {
        let id = try Self.deviceID(for: adapter)
        var info = hci_dev_info()
        if hci_devinfo(id, &info) < 0 {
            throw Self.openError(errno, adapter: adapter, call: "ioctl(HCIGETDEVINFO)")
        }
        if info.flags & Self.hciUpFlag == 0 {
            try Self.bringUp(id, adapter: adapter)
        }
        let fd = hci_open_dev(id)
        if fd < 0 {
            throw Self.openError(errno, adapter: adapter, call: "hci_open_dev")
        }
        var filter = Self.eventFilter()
        // The kernel copies the filter with copy_safe_from_sockptr, which refuses an optlen
        // below sizeof(struct hci_ufilter) (16): pass the C size, i.e. the stride, not the
        // Swift size (14, without the tail padding).
        let set = setsockopt(fd, Int32(SOL_HCI), Int32(HCI_FILTER), &filter,
                             socklen_t(MemoryLayout<hci_filter>.stride))
        if set < 0 {
            let e = errno
            Syscall.close(fd)
            throw Self.openError(e, adapter: adapter, call: "setsockopt(HCI_FILTER)")
        }
        do {
            try Syscall.setNonBlocking(fd)
        } catch {
            Syscall.close(fd)
            throw .os(error)
        }
        self.init(descriptor: fd, adapter: adapter, config: config)
    }

    /// Takes an already-open descriptor that behaves like the raw socket (one packet per read,
    /// type byte first). Tests use a SOCK_SEQPACKET pair.
    init(descriptor fd: Int32, adapter: String, config: RadioConfig) {
        self.fd = fd
        self.adapter = adapter
        self.flow = CommandFlow(config: config, ownsController: false)
        // One packet per read: type byte + the largest event (2 + 255) fits; HCI_MAX_EVENT_SIZE
        // (260) + 1 matches what libbluetooth reads into.
        self.rx = .allocate(byteCount: 1 + 260, alignment: 8)
        self.tx = .allocate(byteCount: HCICommand.maxEncodedLength, alignment: 8)
    }

    deinit {
        rx.deallocate()
        tx.deallocate()
        Syscall.close(fd)
    }

    public var wantsWrite: Bool { txSent < txCount }
    public var state: RadioState { flow.state }
    public var nextDeadline: Instant? {
        guard let at = foreignScanAt else { return flow.deadline }
        let rescan = at + Self.rescanAfter
        return flow.deadline.map { min($0, rescan) } ?? rescan
    }
    public var localVersion: HCILocalVersion? { flow.localVersion }
    public var leFeatures: LEFeatures? { flow.leFeatures }
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

    public mutating func start(now: Instant) throws(RadioError) {
        // A datagram is written whole or not at all, so nothing is ever half sent here.
        txCount = 0
        txSent = 0
        foreignScanAt = nil
        flow.start(now: now)
        try pump(now: now)
    }

    public mutating func poll(now: Instant,
                              _ onEvent: (UnsafeRawBufferPointer) -> Void) throws(RadioError) -> Int {
        var firstError: RadioError? = nil
        var delivered = 0
        do {
            try flush()
        } catch {
            firstError = error
        }
        for _ in 0 ..< Self.maxReadsPerPoll {
            let n: Int
            do {
                guard let got = try Syscall.read(fd, into: rx) else { break }  // EAGAIN
                n = got
            } catch {
                if firstError == nil { firstError = mapIO(error) }
                break
            }
            if n == 0 { break }
            if rx[0] == Self.commandPacketType {
                // Someone else's command (ours are not copied back to us): §5.4.1 opcode.
                if n >= 3, Self.changesScan(HCIOpcode(rawValue: UInt16(rx[1]) | UInt16(rx[2]) << 8)) {
                    scanCommandsSeen &+= 1
                    foreignScanAt = now
                }
                continue
            }
            guard rx[0] == Self.eventPacketType else {
                nonEventPackets &+= 1
                continue
            }
            let event = UnsafeRawBufferPointer(rebasing: rx[1 ..< n])
            // §5.4.4: Event_Code, Parameter_Total_Length, parameters. The kernel hands over
            // whole packets; one whose length disagrees is dropped and counted, not fatal.
            guard event.count >= 2, Int(event[1]) == event.count &- 2 else {
                malformedEvents &+= 1
                continue
            }
            do {
                if try flow.handle(event: event, now: now) { continue }
            } catch {
                if firstError == nil { firstError = error }
                continue
            }
            delivered &+= 1
            onEvent(event)
        }
        eventsDelivered &+= delivered
        if firstError == nil, let at = foreignScanAt, now >= at + Self.rescanAfter, flow.state == .scanning {
            // The kernel is done with the controller's scan: set ours again, from the top.
            foreignScanAt = nil
            rescans &+= 1
            txCount = 0
            txSent = 0
            flow.start(now: now)
        }
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

    private mutating func flush() throws(RadioError) {
        guard txSent < txCount else { return }
        let bytes = UnsafeRawBufferPointer(rebasing: tx[txSent ..< txCount])
        do {
            // hci_sock_sendmsg takes the whole packet or fails; EAGAIN (socket buffer full)
            // leaves it for POLLOUT. It accepts MSG_NOSIGNAL, which `send` passes.
            if let written = try Syscall.send(fd, bytes) { txSent &+= written }
        } catch {
            throw mapIO(error)
        }
    }

    /// Errors while open: the adapter vanished or went down, or we may not send this command.
    private func mapIO(_ e: Errno) -> RadioError {
        switch e.code {
        case ENETDOWN, ENODEV, EPIPE:
            .adapterDown(adapter)
        case EPERM, EACCES:
            .permissionDenied(Self.rawPermissionText(adapter))
        default:
            .os(e)
        }
    }

    // MARK: - Opening

    /// The device id for "hciN" (N in 0…0xFFFE), or for an adapter address through
    /// libbluetooth's `hci_devid` (which only finds adapters that are up).
    static func deviceID(for adapter: String) throws(RadioError) -> Int32 {
        if let id = parseAdapterName(adapter) { return id }
        if isAddress(adapter) {
            let id = hci_devid(adapter)
            if id < 0 { throw openError(errno, adapter: adapter, call: "hci_devid") }
            return id
        }
        throw .invalidConfiguration("adapter \"\(adapter)\" is neither hciN (e.g. hci0) nor an adapter address (AA:BB:CC:DD:EE:FF)")
    }

    /// "hci0" → 0. Digits only, no sign, below HCI_DEV_NONE.
    static func parseAdapterName(_ name: String) -> Int32? {
        let utf8 = Array(name.utf8)
        guard utf8.count >= 4, utf8.count <= 8, utf8[0] == 0x68, utf8[1] == 0x63, utf8[2] == 0x69 else { return nil }
        var n = 0
        for c in utf8[3...] {
            guard c >= 0x30, c <= 0x39 else { return nil }
            n = n * 10 + Int(c - 0x30)
        }
        guard n < hciDevNone else { return nil }
        return Int32(n)
    }

    /// Six hex pairs separated by colons.
    static func isAddress(_ s: String) -> Bool {
        let u = Array(s.utf8)
        guard u.count == 17 else { return false }
        for (i, c) in u.enumerated() {
            if i % 3 == 2 {
                guard c == 0x3A else { return false }
            } else {
                let hex = (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66)
                guard hex else { return false }
            }
        }
        return true
    }

    /// HCIDEVUP on a control socket. EALREADY means someone else (bluetoothd) won the race.
    private static func bringUp(_ id: Int32, adapter: String) throws(RadioError) {
        let sk = socket(AF_BLUETOOTH, Int32(SOCK_RAW.rawValue) | Int32(SOCK_CLOEXEC.rawValue), BTPROTO_HCI)
        if sk < 0 { throw openError(errno, adapter: adapter, call: "socket(AF_BLUETOOTH)") }
        defer { Syscall.close(sk) }
        while ioctl(sk, hciDevUp, id) < 0 {
            let e = errno
            switch e {
            case EINTR:
                continue
            case EALREADY:
                return
            case EPERM, EACCES:
                throw .permissionDenied("Bluetooth adapter \(adapter) is down, and bringing it up needs CAP_NET_ADMIN (grant it, or power the adapter on first: `bluetoothctl power on`)")
            default:
                throw openError(e, adapter: adapter, call: "ioctl(HCIDEVUP)")
            }
        }
    }

    /// What an errno from opening means to the user.
    static func openError(_ e: Int32, adapter: String, call: StaticString) -> RadioError {
        switch e {
        case EAFNOSUPPORT:
            .noBluetoothSupport
        case ENODEV:
            .adapterNotFound(adapter)
        case EPERM, EACCES:
            .permissionDenied(rawPermissionText(adapter))
        case errRFKill:
            .adapterBlocked(adapter)
        case ENETDOWN:
            .adapterDown(adapter)
        default:
            .os(Errno(e, call: call))
        }
    }

    static func rawPermissionText(_ adapter: String) -> String {
        "scanning through \(adapter)'s raw HCI socket needs CAP_NET_RAW (run as root, or grant it: AmbientCapabilities=CAP_NET_RAW CAP_NET_ADMIN in the systemd unit, or `setcap cap_net_raw,cap_net_admin+ep` on the binary)"
    }

    /// Commands after which the controller no longer scans as Baton set it (§7.8.10, §7.8.11,
    /// §7.8.64, §7.8.65).
    static func changesScan(_ opcode: HCIOpcode) -> Bool {
        opcode == .leSetScanEnable || opcode == .leSetScanParameters
            || opcode == .leSetExtendedScanEnable || opcode == .leSetExtendedScanParameters
    }

    /// The socket filter (hci_sock.c `hci_sock_setsockopt`, HCI_FILTER): command packets (the
    /// kernel's own, see the top of this file) and event packets, and of the events Command
    /// Complete (0x0E), Command Status (0x0F), Hardware Error (0x10) and LE Meta (0x3E). Opcode 0: Command Complete/Status for every opcode pass, because
    /// CommandFlow matches opcodes itself and uses every credit.
    /// Bit layout as in <bluetooth/hci_lib.h>: `hci_filter_set_ptype` sets bit (type & 31) of
    /// type_mask; `hci_filter_set_event` sets bit (event & 63) of the 64-bit event_mask pair.
    static func eventFilter() -> hci_filter {
        var f = hci_filter()
        f.type_mask = 1 << UInt32(eventPacketType) | 1 << UInt32(commandPacketType)
        var low: UInt32 = 0
        var high: UInt32 = 0
        for code: UInt32 in [0x0E, 0x0F, UInt32(CommandFlow.hardwareErrorCode), 0x3E] {
            if code < 32 { low |= 1 << code } else { high |= 1 << (code - 32) }
        }
        f.event_mask = (low, high)
        f.opcode = 0
        return f
    }
}
