// BlueZ's management interface ("mgmt", BlueZ doc/mgmt-api.txt; Linux net/bluetooth/mgmt.c):
// the kernel's own API for configuring an adapter, on a raw HCI socket bound to
// HCI_CHANNEL_CONTROL. `baton device` advertises through it (docs/radio.md "Advertising"):
// mgmt's Add Advertising hands the advertisement to the kernel, which owns the controller,
// chooses legacy or extended advertising commands itself, shares the advertising set with
// bluetoothd's instances, and re-enables advertising after a connection or a power cycle. Raw
// HCI advertising commands would do none of that, and on a controller the kernel drives with
// extended commands they are refused with Command Disallowed (Core 5.4, Vol 4, Part E, §3.1.1).
//
// Packets (mgmt-api.txt "Packet Structures"): every command and event is
//   Opcode or Event Code (2) | Controller Index (2) | Parameter Length (2) | Parameters
// all little-endian. Answers are Command Complete (event 0x0001: opcode, status, return
// parameters) or Command Status (0x0002: opcode, status). One read() is one event.
//
// Privileges: mgmt.c lets an untrusted socket (no CAP_NET_ADMIN) run only read commands; Add
// Advertising, Remove Advertising and Set Powered need CAP_NET_ADMIN (status 0x14 otherwise).

import BatonLibc
import CLibc
import CBlueZ
import BatonWire

// MARK: - Commands (encoders)

/// mgmt command opcodes Baton sends (mgmt-api.txt).
public enum ManagementOpcode: UInt16, Sendable {
    case readControllerInformation = 0x0004
    case setPowered = 0x0005
    case readAdvertisingFeatures = 0x003D
    case addAdvertising = 0x003E
    case removeAdvertising = 0x003F

    /// The command's name as mgmt-api.txt and btmon print it.
    public var name: String {
        switch self {
        case .readControllerInformation: "Read Controller Information"
        case .setPowered: "Set Powered"
        case .readAdvertisingFeatures: "Read Advertising Features"
        case .addAdvertising: "Add Advertising"
        case .removeAdvertising: "Remove Advertising"
        }
    }
}

/// Add Advertising's Flags (mgmt-api.txt, Add Advertising Command).
public struct AdvertisingFlags: OptionSet, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    /// Bit 0: "Switch into Connectable mode": ADV_IND instead of ADV_NONCONN_IND.
    public static let connectable = AdvertisingFlags(rawValue: 1 << 0)
    /// Bit 1: the kernel adds a Flags AD with LE General Discoverable. Baton writes its own
    /// Flags AD (docs/protocol.md §2.1), and the kernel refuses data with a Flags AD when any of
    /// bits 1, 2 or 3 is set (mgmt.c `tlv_data_is_valid`), so Baton never sets it.
    public static let generalDiscoverable = AdvertisingFlags(rawValue: 1 << 1)
}

/// Encoders for the mgmt commands Baton sends. Each writes the whole packet (header and
/// parameters) into the caller's buffer, or throws `.noRoom` and writes nothing.
public enum ManagementCommand {
    /// The header: opcode, controller index, parameter length (mgmt-api.txt).
    public static let headerLength = 6
    /// mgmt-api.txt: "Controller Index … 0xFFFF" for commands that name no controller.
    public static let noController: UInt16 = 0xFFFF
    /// Core 5.4, Vol 3, Part C, §11: a legacy advertisement carries at most 31 bytes of data,
    /// and so does a scan response. Extended advertising allows more, but a beacon fits 31.
    public static let maxLegacyDataLength = 31
    /// The largest packet these encoders write (Add Advertising with 31 + 31 bytes).
    public static let maxEncodedLength = headerLength + 11 + 2 * maxLegacyDataLength

    /// Read Controller Information (0x0004): no parameters.
    public static func readControllerInformation(index: UInt16, into w: inout ByteWriter) throws(WireError) {
        try header(.readControllerInformation, index: index, parameters: 0, into: &w)
    }

    /// Set Powered (0x0005): Powered (1).
    public static func setPowered(index: UInt16, _ on: Bool, into w: inout ByteWriter) throws(WireError) {
        try header(.setPowered, index: index, parameters: 1, into: &w)
        w.write(on ? 0x01 : 0x00)
    }

    /// Read Advertising Features (0x003D): no parameters.
    public static func readAdvertisingFeatures(index: UInt16, into w: inout ByteWriter) throws(WireError) {
        try header(.readAdvertisingFeatures, index: index, parameters: 0, into: &w)
    }

    /// Add Advertising (0x003E): Instance (1), Flags (4), Duration (2), Timeout (2),
    /// Adv_Data_Len (1), Scan_Rsp_Len (1), Adv_Data, Scan_Rsp. Duration 0 is the kernel's
    /// default rotation slot (2 s, only matters among several instances); Timeout 0 advertises
    /// until removed. An instance that exists already is replaced.
    public static func addAdvertising(index: UInt16, instance: UInt8, flags: AdvertisingFlags,
                                      duration: UInt16 = 0, timeout: UInt16 = 0,
                                      advertisingData: UnsafeRawBufferPointer,
                                      scanResponse: UnsafeRawBufferPointer = UnsafeRawBufferPointer(start: nil, count: 0),
                                      into w: inout ByteWriter) throws(WireError) {
        // mgmt-api.txt: instances are 1 … the controller's Max_Instances (0 is not one).
        precondition(instance >= 1, "advertising instance 0 does not exist (mgmt-api.txt: 1 … Max_Instances)")
        precondition(advertisingData.count <= maxLegacyDataLength && scanResponse.count <= maxLegacyDataLength,
                     "legacy advertising data is at most 31 bytes (Core 5.4, Vol 3, Part C, §11)")
        try header(.addAdvertising, index: index, parameters: 11 + advertisingData.count + scanResponse.count, into: &w)
        w.write(instance)
        w.writeU32LE(flags.rawValue)
        w.writeU16LE(duration)
        w.writeU16LE(timeout)
        // Proof: both counts are at most 31 (the precondition above).
        w.write(UInt8(truncatingIfNeeded: advertisingData.count))
        w.write(UInt8(truncatingIfNeeded: scanResponse.count))
        w.write(advertisingData)
        w.write(scanResponse)
    }

    /// Remove Advertising (0x003F): Instance (1); 0 removes every instance.
    public static func removeAdvertising(index: UInt16, instance: UInt8, into w: inout ByteWriter) throws(WireError) {
        try header(.removeAdvertising, index: index, parameters: 1, into: &w)
        w.write(instance)
    }

    private static func header(_ opcode: ManagementOpcode, index: UInt16, parameters: Int,
                               into w: inout ByteWriter) throws(WireError) {
        try w.reserve(headerLength + parameters)
        w.writeU16LE(opcode.rawValue)
        w.writeU16LE(index)
        // Proof: parameters ≤ 11 + 62, far below 65536.
        w.writeU16LE(UInt16(truncatingIfNeeded: parameters))
    }
}

// MARK: - Events (decoders)

/// mgmt status codes (mgmt-api.txt "Error Codes").
public struct ManagementStatus: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }
    public static let success = ManagementStatus(rawValue: 0x00)
    public static let busy = ManagementStatus(rawValue: 0x0A)
    public static let rejected = ManagementStatus(rawValue: 0x0B)
    public static let notSupported = ManagementStatus(rawValue: 0x0C)
    public static let invalidParameters = ManagementStatus(rawValue: 0x0D)
    public static let notPowered = ManagementStatus(rawValue: 0x0F)
    public static let invalidIndex = ManagementStatus(rawValue: 0x11)
    public static let rfkilled = ManagementStatus(rawValue: 0x12)
    public static let permissionDenied = ManagementStatus(rawValue: 0x14)

    public var description: String {
        let names = ["Success", "Unknown Command", "Not Connected", "Failed", "Connect Failed",
                     "Authentication Failed", "Not Paired", "No Resources", "Timeout", "Already Connected",
                     "Busy", "Rejected", "Not Supported", "Invalid Parameters", "Disconnected", "Not Powered",
                     "Cancelled", "Invalid Index", "RFKilled", "Already Paired", "Permission Denied"]
        let hex = "0x" + Hex.text(rawValue, digits: 2, uppercase: true)
        return Int(rawValue) < names.count ? "\(names[Int(rawValue)]) (\(hex))" : "status \(hex)"
    }
}

/// A parsed mgmt event: Command Complete (0x0001), Command Status (0x0002), or any other event
/// (`opcode` nil). The return parameters are borrowed as an offset range into the event.
public struct ManagementEvent: Sendable, Equatable {
    public static let commandCompleteCode: UInt16 = 0x0001
    public static let commandStatusCode: UInt16 = 0x0002

    public let code: UInt16
    public let index: UInt16
    /// The command answered (Command Complete / Status only).
    public let opcode: UInt16?
    public let status: ManagementStatus
    /// Offsets, in the event, of the return parameters (Command Complete only).
    public let returnParameters: Range<Int>

    /// Checks the header against the bytes (the length must match exactly), then decodes.
    public static func parse(_ event: UnsafeRawBufferPointer) throws(WireError) -> ManagementEvent {
        var r = ByteReader(event)
        let code = try r.readU16LE()
        let index = try r.readU16LE()
        let length = Int(try r.readU16LE())
        var params = try r.readSubReader(length)
        try r.requireEnd()
        guard code == commandCompleteCode || code == commandStatusCode else {
            return ManagementEvent(code: code, index: index, opcode: nil, status: .success,
                                   returnParameters: params.offset ..< params.offset)
        }
        // Both: Command_Opcode (2), Status (1); Command Complete then its return parameters.
        let opcode = try params.readU16LE()
        let status = ManagementStatus(rawValue: try params.readU8())
        if code == commandStatusCode { try params.requireEnd() }
        return ManagementEvent(code: code, index: index, opcode: opcode, status: status,
                               returnParameters: params.offset ..< event.count)
    }
}

/// The return parameters of Read Controller Information (mgmt-api.txt): Address (6),
/// Bluetooth_Version (1), Manufacturer (2), Supported_Settings (4), Current_Settings (4),
/// Class_Of_Device (3), Name (249), Short_Name (11). Only the first five are kept.
public struct ControllerInformation: Sendable, Equatable {
    /// The public address, least significant byte first as HCI carries it; all zero when the
    /// controller has none (it then advertises from its static random address).
    public let address: UInt64
    public let bluetoothVersion: UInt8
    public let manufacturer: UInt16
    public let supportedSettings: ControllerSettings
    public let currentSettings: ControllerSettings

    public static func parse(_ params: UnsafeRawBufferPointer) throws(WireError) -> ControllerInformation {
        var r = ByteReader(params)
        let low = UInt64(try r.readU32LE())
        let high = UInt64(try r.readU16LE())
        return ControllerInformation(address: low | high << 32, bluetoothVersion: try r.readU8(),
                                     manufacturer: try r.readU16LE(),
                                     supportedSettings: ControllerSettings(rawValue: try r.readU32LE()),
                                     currentSettings: ControllerSettings(rawValue: try r.readU32LE()))
    }

    /// Whether the controller advertises from a random static address instead of its public
    /// one (mgmt.c: no public address, or Set Static Address with the setting on).
    public var usesStaticAddress: Bool { address == 0 || currentSettings.contains(.staticAddress) }
}

/// The return parameters of Read Advertising Features (mgmt-api.txt): Supported_Flags (4),
/// Max_Adv_Data_Len (1), Max_Scan_Rsp_Len (1), Max_Instances (1), Num_Instances (1), then
/// Num_Instances instance numbers: the sets in use, by bluetoothd or anyone else.
public struct AdvertisingFeatures: Sendable, Equatable {
    public let supportedFlags: UInt32
    public let maxDataLength: UInt8
    public let maxInstances: UInt8
    /// Bit n set: instance n is in use (instances are 1…255).
    public let inUse: (UInt64, UInt64, UInt64, UInt64)

    public static func parse(_ params: UnsafeRawBufferPointer) throws(WireError) -> AdvertisingFeatures {
        var r = ByteReader(params)
        let flags = try r.readU32LE()
        let maxData = try r.readU8()
        _ = try r.readU8()
        let maxInstances = try r.readU8()
        let count = Int(try r.readU8())
        var used: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)
        for _ in 0 ..< count {
            let n = try r.readU8()
            let bit = UInt64(1) << UInt64(n & 63)
            switch n >> 6 {
            case 0: used.0 |= bit
            case 1: used.1 |= bit
            case 2: used.2 |= bit
            default: used.3 |= bit
            }
        }
        try r.requireEnd()
        return AdvertisingFeatures(supportedFlags: flags, maxDataLength: maxData, maxInstances: maxInstances, inUse: used)
    }

    public func isInUse(_ instance: UInt8) -> Bool {
        let word = switch instance >> 6 { case 0: inUse.0; case 1: inUse.1; case 2: inUse.2; default: inUse.3 }
        return word & (UInt64(1) << UInt64(instance & 63)) != 0
    }

    /// The highest instance nobody uses: bluetoothd numbers its own from 1 up, so taking from
    /// the top keeps out of its way. Nil when every instance is taken.
    public var freeInstance: UInt8? {
        guard maxInstances > 0 else { return nil }
        for n in stride(from: maxInstances, through: 1, by: -1) where !isInUse(n) { return n }
        return nil
    }

    public static func == (a: Self, b: Self) -> Bool {
        a.supportedFlags == b.supportedFlags && a.maxDataLength == b.maxDataLength && a.maxInstances == b.maxInstances
            && a.inUse.0 == b.inUse.0 && a.inUse.1 == b.inUse.1 && a.inUse.2 == b.inUse.2 && a.inUse.3 == b.inUse.3
    }
}

/// Supported_Settings / Current_Settings bits (mgmt-api.txt, Read Controller Information).
public struct ControllerSettings: OptionSet, Sendable, Equatable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    public static let powered = ControllerSettings(rawValue: 1 << 0)
    public static let lowEnergy = ControllerSettings(rawValue: 1 << 9)
    public static let advertising = ControllerSettings(rawValue: 1 << 10)
    public static let staticAddress = ControllerSettings(rawValue: 1 << 15)
}

// MARK: - The socket

/// Why a mgmt command did not do what was asked. Says whose fault it is.
public enum ManagementError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The kernel has no Bluetooth (EAFNOSUPPORT).
    case noBluetoothSupport
    /// No adapter by that name, or the kernel answered Invalid Index.
    case adapterNotFound(String)
    /// The command needs CAP_NET_ADMIN.
    case permissionDenied(adapter: String, command: String)
    /// rfkill blocks the adapter.
    case adapterBlocked(String)
    /// The kernel refused the command (any other status).
    case refused(adapter: String, command: String, status: ManagementStatus)
    /// No answer within the deadline.
    case timeout(adapter: String, command: String)
    /// As many requests are waiting for their answers as the socket keeps (16).
    case busy(adapter: String, command: String)
    /// The kernel's answer did not parse.
    case wire(WireError)
    case os(Errno)

    public var description: String {
        switch self {
        case .noBluetoothSupport:
            "this kernel has no Bluetooth support, or a sandbox denies it (AF_BLUETOOTH unavailable; a systemd unit needs AF_BLUETOOTH in RestrictAddressFamilies=): run on a machine with BlueZ"
        case .adapterNotFound(let name):
            "no Bluetooth adapter named \(name) (`btmgmt info` or `bluetoothctl list` shows the adapters this machine has)"
        case .permissionDenied(let adapter, let command):
            "\(command) on \(adapter) needs CAP_NET_ADMIN (run as root, or grant it: AmbientCapabilities=CAP_NET_ADMIN in a systemd unit, or `setcap cap_net_admin+ep` on the binary)"
        case .adapterBlocked(let name):
            "Bluetooth adapter \(name) is blocked by rfkill (`rfkill unblock bluetooth`)"
        case .refused(let adapter, let command, let status):
            "the kernel refused \(command) on \(adapter): \(status)"
        case .timeout(let adapter, let command):
            "the kernel did not answer \(command) on \(adapter) within 2 seconds"
        case .busy(let adapter, let command):
            "\(command) on \(adapter) not sent: \(ManagementSocket.maxPending) requests are still waiting for the kernel's answers"
        case .wire(let e):
            "the kernel sent a malformed management event: \(e)"
        case .os(let e):
            "management socket: \(e)"
        }
    }
}

/// One request sent and not yet answered (see `ManagementSocket`).
struct PendingRequest {
    var opcode: ManagementOpcode
    var tag: Int
    var deadline: Instant
    /// Its deadline passed and its failure was handed out: a late answer is absorbed here,
    /// not taken for a later request with the same opcode.
    var abandoned: Bool
}

/// The kernel's answer to one request, borrowed for the duration of the call it is handed to.
public struct ManagementAnswer {
    /// What the sender passed to `send`.
    public let tag: Int
    public let opcode: ManagementOpcode
    /// nil: success; else why not (a refusal, or `.timeout` when the deadline passed first).
    public let error: ManagementError?
    /// Command Complete's return parameters (empty for a failure or a Command Status).
    public let parameters: UnsafeRawBufferPointer
}

/// A socket on HCI_CHANNEL_CONTROL for one adapter, driven by the caller's poll() loop
/// (one thread, architecture.md §2): `send` writes a request and returns at once; the answers are read
/// by `poll(now:_:)` when the descriptor is readable, and a request whose answer has not come
/// by its deadline is answered `.timeout` by the `poll` after it. Nothing here waits, except
/// `request`, the synchronous wrapper for `baton device` and for the gateway's start and stop,
/// which runs the same machinery under its own bounded poll().
///
/// Matching answers to requests (mgmt-api.txt: each command gets exactly one Command Complete
/// or Command Status): the kernel answers a socket's commands of one opcode in the order they
/// were sent, but not across opcodes (Add Advertising on a powered adapter completes after its
/// HCI commands, a Read answers inside write()), so an answer goes to the oldest request of its
/// opcode. A request that passed its deadline stays in the queue, abandoned, until its late
/// answer comes (or until its room is needed), so that answer is not taken for a newer one.
public struct ManagementSocket: ~Copyable {
    public let fd: Int32
    /// The adapter as the user named it, for messages.
    public let adapter: String
    /// The controller index ("hci1" → 1).
    public let index: UInt16
    private let buffer: UnsafeMutableRawBufferPointer
    /// How long a request may wait for its answer.
    public var timeout: Duration = .seconds(2)
    /// Requests sent and not answered, oldest first. Fixed: `send` refuses past it.
    private var pending = InlineArray<16, PendingRequest?>(repeating: nil)
    private var pendingCount = 0
    public static let maxPending = 16
    /// Advertising Removed events for this controller read by `poll`: kept for
    /// `takeRemovedInstances`, since the socket will not deliver them again.
    private var removed: [UInt8] = []
    private var nextTag = Int.min

    /// <bluetooth/hci.h>: `HCI_CHANNEL_CONTROL 3`.
    static let controlChannel: UInt16 = 3

    /// Opens the control channel for `adapter` ("hci1" or its address).
    public init(adapter: String) throws(ManagementError) {
        let id: Int32
        do throws(RadioError) { id = try RadioBlueZ.deviceID(for: adapter) } catch {
            switch error {
            case .noBluetoothSupport: throw .noBluetoothSupport
            case .os(let e): throw .os(e)
            default: throw .adapterNotFound(adapter)
            }
        }
        let type = Int32(SOCK_RAW.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue)
        let fd = socket(AF_BLUETOOTH, type, BTPROTO_HCI)
        if fd < 0 {
            throw errno == EAFNOSUPPORT ? .noBluetoothSupport : .os(Errno(errno, call: "socket(AF_BLUETOOTH)"))
        }
        var address = sockaddr_hci()
        address.hci_family = sa_family_t(AF_BLUETOOTH)
        address.hci_dev = 0xFFFF  // HCI_DEV_NONE: the control channel is not bound to one adapter
        address.hci_channel = Self.controlChannel
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_hci>.size))
            }
        }
        if bound < 0 {
            let e = errno
            Syscall.close(fd)
            throw .os(Errno(e, call: "bind(HCI_CHANNEL_CONTROL)"))
        }
        self.init(descriptor: fd, adapter: adapter, index: UInt16(truncatingIfNeeded: id))
    }

    /// Takes a descriptor that speaks mgmt packets, one per read (a test's SOCK_SEQPACKET
    /// socketpair playing the kernel), makes it non-blocking, and closes it when done.
    public init(descriptor fd: Int32, adapter: String, index: UInt16) {
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        self.fd = fd
        self.adapter = adapter
        self.index = index
        // One event per read: the header and at most 65535 parameter bytes. mgmt events for an
        // advertiser are small; Read Controller Information's answer is the largest (283).
        self.buffer = .allocate(byteCount: 6 + 65_535, alignment: 8)
    }

    deinit {
        buffer.deallocate()
        Syscall.close(fd)
    }

    /// Requests sent and not yet answered (abandoned ones included).
    public var pendingRequests: Int { pendingCount }

    /// The earliest deadline of a request still waiting: the loop's poll() wakes for it.
    public var nextDeadline: Instant? {
        var next: Instant? = nil
        for i in 0 ..< pendingCount {
            guard let p = pending[i], !p.abandoned else { continue }
            if next.map({ p.deadline < $0 }) ?? true { next = p.deadline }
        }
        return next
    }

    /// Sends the command `encode` writes and returns without waiting: its answer is handed to
    /// `poll`'s callback with `tag`. Throws only what is known at once: the queue is full
    /// (`.busy`), or the write failed.
    public mutating func send(_ opcode: ManagementOpcode, tag: Int, now: Instant,
                              _ encode: (inout ByteWriter) throws(WireError) -> Void) throws(ManagementError) {
        if pendingCount == Self.maxPending {
            // Full: the oldest abandoned request gives up its place (its answer is long overdue).
            guard let oldest = firstIndex(where: { $0.abandoned }) else {
                throw .busy(adapter: adapter, command: opcode.name)
            }
            remove(at: oldest)
        }
        var w = ByteWriter(buffer)
        do throws(WireError) { try encode(&w) } catch { preconditionFailure("a mgmt command fits 64 KiB") }
        let sent: Int?
        do throws(Errno) { sent = try Syscall.write(fd, w.written) } catch { throw map(error, opcode) }
        // The kernel handles the command inside write() and queues its answer. write() returns
        // the length, or 0 when the kernel answered with an error status already (hci_sock.c
        // `hci_mgmt_cmd` returns mgmt_cmd_status's 0 for an unknown index, seen in the VM);
        // either way the answer is on the socket. EAGAIN would be a full socket buffer.
        guard sent != nil else { throw .os(Errno(EAGAIN, call: "write(mgmt)")) }
        pending[pendingCount] = PendingRequest(opcode: opcode, tag: tag, deadline: now + timeout, abandoned: false)
        pendingCount &+= 1
    }

    /// Reads every event queued on the socket without waiting, hands each answer to `answer`
    /// (borrowed), keeps Advertising Removed events for `takeRemovedInstances`, then answers
    /// `.timeout` for every request whose deadline passed. Stops reading at a malformed event
    /// or a read error (counted in `malformedEvents`; the deadlines still run).
    public mutating func poll(now: Instant, _ answer: (ManagementAnswer) -> Void) {
        while true {
            let got: Int?
            do throws(Errno) { got = try Syscall.read(fd, into: buffer) } catch { malformedEvents &+= 1; break }
            guard let got else { break }
            let bytes = UnsafeRawBufferPointer(rebasing: buffer[..<got])
            let event: ManagementEvent
            do throws(WireError) { event = try ManagementEvent.parse(bytes) } catch { malformedEvents &+= 1; break }
            guard event.index == index else { continue }
            guard let opcode = event.opcode else {
                if event.code == Self.advertisingRemovedCode, bytes.count == 7, !removed.contains(bytes[6]) {
                    removed.append(bytes[6])
                }
                continue
            }
            guard let i = firstIndex(where: { $0.opcode.rawValue == opcode }), let p = pending[i] else { continue }
            remove(at: i)
            guard !p.abandoned else { continue }
            let error = failure(event.status, p.opcode)
            let parameters = error == nil ? UnsafeRawBufferPointer(rebasing: bytes[event.returnParameters])
                                          : UnsafeRawBufferPointer(start: nil, count: 0)
            answer(ManagementAnswer(tag: p.tag, opcode: p.opcode, error: error, parameters: parameters))
        }
        for i in 0 ..< pendingCount {
            guard var p = pending[i], !p.abandoned, now >= p.deadline else { continue }
            p.abandoned = true
            pending[i] = p
            answer(ManagementAnswer(tag: p.tag, opcode: p.opcode, error: .timeout(adapter: adapter, command: p.opcode.name),
                                    parameters: UnsafeRawBufferPointer(start: nil, count: 0)))
        }
    }

    /// Events that did not parse, and read errors, since open.
    public private(set) var malformedEvents = 0

    private func firstIndex(where match: (PendingRequest) -> Bool) -> Int? {
        for i in 0 ..< pendingCount { if let p = pending[i], match(p) { return i } }
        return nil
    }

    private mutating func remove(at i: Int) {
        var j = i
        while j &+ 1 < pendingCount { pending[j] = pending[j &+ 1]; j &+= 1 }
        pendingCount &-= 1
        pending[pendingCount] = nil
    }

    private func failure(_ status: ManagementStatus, _ opcode: ManagementOpcode) -> ManagementError? {
        switch status {
        case .success: nil
        case .permissionDenied: .permissionDenied(adapter: adapter, command: opcode.name)
        case .invalidIndex: .adapterNotFound(adapter)
        case .rfkilled: .adapterBlocked(adapter)
        default: .refused(adapter: adapter, command: opcode.name, status: status)
        }
    }

    /// Sends the command `encode` writes and waits for its answer, at most `timeout`: for
    /// `baton device` and the gateway's start and stop, never inside the loop. Returns the
    /// return parameters (copied: the socket's buffer is reused). Answers to requests sent with
    /// `send` that arrive meanwhile are dropped: call it with none outstanding.
    public mutating func request(_ opcode: ManagementOpcode,
                                 _ encode: (inout ByteWriter) throws(WireError) -> Void) throws(ManagementError) -> [UInt8] {
        let tag = nextTag
        nextTag &+= 1
        try send(opcode, tag: tag, now: .now, encode)
        var result: Result<[UInt8], ManagementError>? = nil
        while result == nil {
            let now = Instant.now
            poll(now: now) { a in
                guard a.tag == tag else { return }
                if let e = a.error { result = .failure(e) } else { result = .success(Array(a.parameters)) }
            }
            guard result == nil, let due = nextDeadline else { break }
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            _ = CLibc.poll(&p, 1, (due - now).pollMilliseconds(atMost: 2_000))
        }
        switch result {
        case .success(let bytes): return bytes
        case .failure(let error): throw error
        case nil: throw .timeout(adapter: adapter, command: opcode.name)
        }
    }

    /// mgmt-api.txt "Advertising Removed Event": Instance (1). Sent to every control socket but
    /// the one whose command removed it: bluetoothd resetting the instances when it starts,
    /// another program, or the controller going away.
    public static let advertisingRemovedCode: UInt16 = 0x0024

    /// Whether `poll` set aside Advertising Removed events (`takeRemovedInstances`).
    public var removedInstancesPending: Bool { !removed.isEmpty }

    /// The instances whose Advertising Removed `poll` read, once each.
    public mutating func takeRemovedInstances() -> [UInt8] {
        defer { removed.removeAll() }
        return removed
    }

    /// Reads the events queued on the socket without waiting (its descriptor is for poll):
    /// `body` gets each one's code, controller index and parameters. Stops at the first
    /// malformed event or read error; what was read before is handed over.
    public mutating func readEvents(_ body: (_ code: UInt16, _ index: UInt16, _ parameters: UnsafeRawBufferPointer) -> Void) {
        while true {
            let got: Int?
            do throws(Errno) { got = try Syscall.read(fd, into: buffer) } catch { return }
            guard let got else { return }
            let bytes = UnsafeRawBufferPointer(rebasing: buffer[..<got])
            do throws(WireError) { _ = try ManagementEvent.parse(bytes) } catch { return }
            // Proof: parse checked the 6-byte header and that the length matches the read.
            let code = UInt16(bytes[0]) | UInt16(bytes[1]) << 8
            let index = UInt16(bytes[2]) | UInt16(bytes[3]) << 8
            body(code, index, UnsafeRawBufferPointer(rebasing: bytes[6...]))
        }
    }

    private func map(_ e: Errno, _ opcode: ManagementOpcode) -> ManagementError {
        switch e.code {
        case EPERM, EACCES: .permissionDenied(adapter: adapter, command: opcode.name)
        case ENODEV: .adapterNotFound(adapter)
        default: .os(e)
        }
    }

    // MARK: What an advertiser asks

    /// Read Controller Information.
    public mutating func controllerInformation() throws(ManagementError) -> ControllerInformation {
        let index = index
        let params = try request(.readControllerInformation) { w throws(WireError) in
            try ManagementCommand.readControllerInformation(index: index, into: &w)
        }
        // Array.withUnsafeBytes rethrows untyped: the typed error is carried out as a Result.
        let parsed = params.withUnsafeBytes { p in
            Result { () throws(WireError) -> ControllerInformation in try ControllerInformation.parse(p) }
        }
        switch parsed {
        case .success(let info): return info
        case .failure(let error): throw .wire(error)
        }
    }

    /// Read Advertising Features.
    public mutating func advertisingFeatures() throws(ManagementError) -> AdvertisingFeatures {
        let index = index
        let params = try request(.readAdvertisingFeatures) { w throws(WireError) in
            try ManagementCommand.readAdvertisingFeatures(index: index, into: &w)
        }
        let parsed = params.withUnsafeBytes { p in
            Result { () throws(WireError) -> AdvertisingFeatures in try AdvertisingFeatures.parse(p) }
        }
        switch parsed {
        case .success(let features): return features
        case .failure(let error): throw .wire(error)
        }
    }

    /// Set Powered on or off.
    public mutating func setPowered(_ on: Bool) throws(ManagementError) {
        let index = index
        _ = try request(.setPowered) { w throws(WireError) in try ManagementCommand.setPowered(index: index, on, into: &w) }
    }

    /// Add Advertising: `data` (at most 31 bytes) as instance `instance`, replacing it if it exists.
    public mutating func addAdvertising(instance: UInt8, flags: AdvertisingFlags,
                                        data: UnsafeRawBufferPointer) throws(ManagementError) {
        let index = index
        _ = try request(.addAdvertising) { w throws(WireError) in
            try ManagementCommand.addAdvertising(index: index, instance: instance, flags: flags,
                                                 advertisingData: data, into: &w)
        }
    }

    /// Remove Advertising. An instance that does not exist is not an error here (Invalid
    /// Parameters from the kernel): the caller wants it gone, and it is.
    public mutating func removeAdvertising(instance: UInt8) throws(ManagementError) {
        let index = index
        do {
            _ = try request(.removeAdvertising) { w throws(WireError) in
                try ManagementCommand.removeAdvertising(index: index, instance: instance, into: &w)
            }
        } catch .refused(_, _, .invalidParameters) {
            return
        }
    }
}
