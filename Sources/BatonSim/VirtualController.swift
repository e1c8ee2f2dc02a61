// A virtual controller speaking H4 over a stream socket: the room end of `sim:SOCKET`
// (docs/simulator.md "A room's controller"). The gateway's H4 path runs byte for byte as with
// a serial controller: it answers the init sequence with Command Complete (Core 5.4, Vol 4,
// Part E, §7.7.14), honours LE Set Scan Enable (§7.8.11), and delivers LE Advertising Report
// events (§7.7.65.2) only while scanning is on, as a controller does.
//
// By default it reports only legacy LE features, so the gateway chooses legacy scanning
// (§3.1.1) and every advertisement arrives as a legacy report; adverts longer than 31 bytes
// cannot be sent that way and are counted, not delivered. Made `extended`, it reports LE
// Extended Advertising (Vol 6, Part B, §4.6, bit 12) as Bluetooth 5 controllers do, the gateway
// scans with the extended commands, and every advertisement arrives as an LE Extended
// Advertising Report (§7.7.65.13): one longer than 229 bytes as a chain of reports.
//
// Active scanning (LE_Scan_Type 1 in §7.8.10 or §7.8.64): a device given a scan response in
// `scanResponses` advertises scannably (ADV_IND stays, anything else becomes ADV_SCAN_IND), and
// while the gateway scans actively each of its advertisements is followed by a SCAN_RSP report
// (Event_Type 0x04), as the scan request a real controller sends would bring. Legacy reports only.
import BatonLibc
import BatonHCI
import BatonWire
import CLibc

public final class VirtualController {
    public let fd: Int32
    private var framer = H4Framer()
    private let rx: UnsafeMutableRawBufferPointer
    /// Answers and reports not yet taken by the socket (the gateway reads in its own time).
    private var outbox: [UInt8] = []
    public private(set) var scanning = false
    /// LE_Scan_Type of the last scan parameters: true for active.
    public private(set) var activeScanning = false
    /// Scan parameters commands received, by LE_Scan_Type (counts, not a list: a simulator
    /// runs for days while Home Assistant opens active windows).
    public private(set) var passiveParametersSent = 0
    public private(set) var activeParametersSent = 0
    /// Scan response data by device address (at most 31 bytes each).
    public var scanResponses: [UInt64: [UInt8]] = [:]
    /// SCAN_RSP reports delivered.
    public private(set) var scanResponsesDelivered = 0
    /// Opcodes of the commands received, in order (commands are few: the init sequence).
    public private(set) var opcodes: [UInt16] = []
    public private(set) var resets = 0
    public private(set) var reportsDelivered = 0
    /// Reports offered while the gateway had scanning off (what a real radio would not hear).
    public private(set) var reportsWhileNotScanning = 0
    /// Adverts too long for a legacy report.
    public private(set) var reportsTooLong = 0
    /// The gateway hung up.
    public private(set) var closed = false

    /// Bytes queued beyond this are dropped with the report (a gateway that stopped reading).
    public static let outboxLimit = 1 << 20

    /// Reports LE Extended Advertising, and delivers extended reports.
    public let extended: Bool

    /// Takes a connected stream socket and makes it non-blocking; closes it when done.
    public init(fd: Int32, extended: Bool = false) {
        self.fd = fd
        self.extended = extended
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        rx = .allocate(byteCount: 4096, alignment: 8)
    }

    deinit {
        rx.deallocate()
        // shutdown hangs up even when a copy of the descriptor lives on in a child process.
        shutdown(fd, Int32(SHUT_RDWR))
        close(fd)
    }

    public var wantsWrite: Bool { !outbox.isEmpty }

    /// Reads commands and answers them; writes what is queued. Call when the socket is ready.
    public func poll() {
        while !closed {
            let n = read(fd, rx.baseAddress, rx.count)
            if n == 0 { closed = true; break }
            if n < 0 { if errno == EINTR { continue }; if errno != EAGAIN { closed = true }; break }
            var answers: [UInt16] = []
            var enables: [Bool?] = []
            var scanTypes: [Bool] = []
            framer.push(UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(rx)[..<n])) { packet in
                guard packet.type == .command, packet.bytes.count >= 3 else { return }
                let opcode = UInt16(packet.bytes[0]) | UInt16(packet.bytes[1]) << 8
                answers.append(opcode)
                // LE Set Scan Enable (§7.8.11) / LE Set Extended Scan Enable (§7.8.65): first
                // parameter is Enable.
                if (opcode == 0x200C || opcode == 0x2042), packet.bytes.count >= 4 {
                    enables.append(packet.bytes[3] != 0)
                } else {
                    enables.append(nil)
                }
                // LE Set Scan Parameters: LE_Scan_Type first; LE Set Extended Scan Parameters:
                // Own_Address_Type, Scanning_Filter_Policy, Scanning_PHYs, then Scan_Type[0].
                if opcode == 0x200B, packet.bytes.count >= 4 { scanTypes.append(packet.bytes[3] == 1) }
                if opcode == 0x2041, packet.bytes.count >= 7 { scanTypes.append(packet.bytes[6] == 1) }
            }
            if let last = scanTypes.last { activeScanning = last }
            for active in scanTypes {
                if active { activeParametersSent += 1 } else { passiveParametersSent += 1 }
            }
            for (opcode, enable) in zip(answers, enables) {
                opcodes.append(opcode)
                if opcode == 0x0C03 { resets += 1; scanning = false }
                if let enable { scanning = enable }
                answer(opcode)
            }
        }
        flush()
    }

    /// §7.7.14 Command Complete, one credit, success, with the return parameters a 4.2
    /// controller gives for the commands that have them.
    private func answer(_ opcode: UInt16) {
        var extra: [UInt8] = []
        switch opcode {
        case 0x1001: extra = [0x08, 0x00, 0x01, 0x08, 0xFF, 0xFF, 0x00, 0x00]  // HCI/LMP 4.2, company 0xFFFF
        case 0x2003:
            // LE features (Vol 6, Part B, §4.6): bits 0–5; bit 12 LE Extended Advertising when extended.
            extra = [0x3F, extended ? 0x10 : 0x00, 0, 0, 0, 0, 0, 0]
        default: break
        }
        outbox += [0x04, 0x0E, UInt8(4 + extra.count), 0x01, UInt8(opcode & 0xFF), UInt8(opcode >> 8), 0x00] + extra
    }

    /// Delivers one advertisement heard in this room, if scanning is on: an LE Advertising
    /// Report event with one report.
    public func deliver(_ report: GeneratedReport) {
        queue(report)
        flush()
    }

    /// `deliver` without the write: `flush` sends what is queued. The building queues a turn's
    /// reports and flushes each room once, so they go in one write, not one each.
    public func queue(_ report: GeneratedReport) {
        guard scanning else { reportsWhileNotScanning += 1; return }
        if extended {
            // An LE Extended Advertising Report per fragment (a report already a fragment, as
            // the generator's long advertisements are, goes as it is).
            guard outbox.count < Self.outboxLimit else { return }
            var r = report
            r.extended = true
            for f in AdvertisingEvents.fragments(r) {
                outbox += [0x04] + AdvertisingEvents.event([f][...])
                reportsDelivered += 1
            }
            return
        }
        guard report.data.count <= 31 else { reportsTooLong += 1; return }
        guard outbox.count < Self.outboxLimit else { return }
        var legacy = report
        legacy.extended = false
        let response = scanResponses[report.address]
        if response != nil, legacy.legacyEventType == nil, AdvertisingEvents.legacyEventType(report.kind) != 0x00 {
            legacy.legacyEventType = 0x02  // ADV_SCAN_IND
        }
        outbox += [0x04] + AdvertisingEvents.event([legacy][...])
        reportsDelivered += 1
        if activeScanning, let response {
            var answer = legacy
            answer.legacyEventType = 0x04  // SCAN_RSP
            answer.data = Array(response.prefix(31))
            outbox += [0x04] + AdvertisingEvents.event([answer][...])
            scanResponsesDelivered += 1
        }
    }

    /// Sends one H4 packet as is (a test's own event, a report outside the generator).
    public func send(h4 bytes: [UInt8]) {
        outbox += bytes
        flush()
    }

    /// Closes the connection, as a controller unplugged or a simulator that exits would.
    public func hangUp() {
        shutdown(fd, Int32(SHUT_RDWR))
        closed = true
        outbox.removeAll()
    }

    public func flush() {
        while !outbox.isEmpty, !closed {
            let n = outbox.withUnsafeBytes { CLibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n > 0 { outbox.removeFirst(n); continue }
            if n < 0, errno == EINTR { continue }
            if n < 0, errno != EAGAIN { closed = true }
            break
        }
    }
}
