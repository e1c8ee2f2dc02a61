// RadioH4 against a scripted fake controller on the far end of a real socketpair(AF_UNIX,
// SOCK_STREAM): the init sequence byte for byte, command flow control (Core 5.4, Vol 4,
// Part E, §4.4), error statuses, timeouts as deadlines, re-init, partial reads and writes.

import BatonLibc
import Glibc
import CBlueZ  // its shim includes <sys/socket.h>: import it so SOCK_STREAM has one owner
import Testing
import BatonTestSupport
import BatonWire
@testable import BatonHCI

// MARK: - Helpers shared with RadioBlueZTests

/// The controller's end of the connection: reads H4 command frames, writes H4 event frames.
/// Works over a byte stream (H4) and over datagrams (the BlueZ raw socket stand-in) alike.
final class RadioFakeController {
    let fd: Int32
    /// The other end of the pair `init(rawSocket:)` made, for the radio under test (it closes it).
    let radioEnd: Int32
    private var pending: [UInt8] = []

    init(fd: Int32, radioEnd: Int32 = -1) {
        self.fd = fd
        self.radioEnd = radioEnd
        let flags = Glibc.fcntl(fd, F_GETFL)
        _ = Glibc.fcntl(fd, F_SETFL, flags | O_NONBLOCK)
    }

    /// The controller on one end of a fresh pair, the radio's end `radioEnd`: H4's byte stream,
    /// or with `rawSocket` the raw HCI socket's stand-in (`seqpacketPair`; its end made
    /// non-blocking, as RadioBlueZ opens the kernel's).
    convenience init(rawSocket: Bool = false) throws {
        let (a, b) = rawSocket ? seqpacketPair() : socketPair()
        if rawSocket { try Syscall.setNonBlocking(a) }
        self.init(fd: b, radioEnd: a)
    }

    deinit { if fd >= 0 { Glibc.close(fd) } }

    /// Reads whatever has arrived within `timeoutMs` (0: only what is there now).
    @discardableResult
    func receive(timeoutMs: Int32) -> Int {
        var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard Glibc.poll(&p, 1, timeoutMs) > 0 else { return 0 }
        var total = 0
        var buf = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = buf.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            pending.append(contentsOf: buf[..<n])
            total += n
        }
        return total
    }

    /// Bytes received and not yet taken as a command.
    var buffered: [UInt8] { pending }

    /// Drops `count` bytes the test put in the stream itself (filler).
    func discard(_ count: Int) {
        pending.removeFirst(count)
    }

    /// The next complete command frame (indicator 0x01, opcode, length, parameters), waiting
    /// up to `timeoutMs` for it; `nil` if none arrives.
    func nextCommand(timeoutMs: Int32 = 2000) -> [UInt8]? {
        var waited: Int32 = 0
        while true {
            if pending.count >= 4 {
                #expect(pending[0] == 0x01, "expected an H4 command indicator, got \(spacedHex(pending.prefix(8)))")
                let total = 4 + Int(pending[3])
                if pending.count >= total {
                    let frame = Array(pending[..<total])
                    pending.removeFirst(total)
                    return frame
                }
            }
            if waited >= timeoutMs { return nil }
            receive(timeoutMs: 50)
            waited += 50
        }
    }

    func send(_ bytes: [UInt8]) {
        let n = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        #expect(n == bytes.count)
    }

    /// Sends an H4 event frame: 0x04, code, length, parameters.
    func sendEvent(_ code: UInt8, _ params: [UInt8]) {
        send([0x04, code, UInt8(params.count)] + params)
    }

    /// §7.7.14 Command Complete: Num_HCI_Command_Packets, opcode, Status, return parameters.
    func complete(_ opcode: UInt16, credits: UInt8 = 1, status: UInt8 = 0x00, returning extra: [UInt8] = []) {
        sendEvent(0x0E, [credits, UInt8(opcode & 0xFF), UInt8(opcode >> 8), status] + extra)
    }

    /// §7.7.15 Command Status.
    func status(_ opcode: UInt16, credits: UInt8 = 1, status: UInt8) {
        sendEvent(0x0F, [status, credits, UInt8(opcode & 0xFF), UInt8(opcode >> 8)])
    }

    /// A controller's answer to each init command; `features` are the LE features it reports.
    func answer(_ frame: [UInt8], features: UInt64) {
        let opcode = UInt16(frame[1]) | UInt16(frame[2]) << 8
        switch opcode {
        case 0x1001:
            // HCI 5.2, subversion 0x0100, LMP 5.2, company 0x0002, LMP subversion 0x2209.
            complete(opcode, returning: [0x0B, 0x00, 0x01, 0x0B, 0x02, 0x00, 0x09, 0x22])
        case 0x2003:
            complete(opcode, returning: (0 ..< 8).map { UInt8(truncatingIfNeeded: features >> (8 * UInt64($0))) })
        default:
            complete(opcode)
        }
    }
}

func radioOpcode(_ frame: [UInt8]) -> UInt16 { UInt16(frame[1]) | UInt16(frame[2]) << 8 }

/// An LE Advertising Report (§7.7.65.2): ADV_IND, public 11:22:33:44:55:66, flags + Apple
/// manufacturer data, RSSI -59. Event bytes without the H4 indicator.
let radioLegacyReport = hx("3E 17 02 01 00 00 66 55 44 33 22 11 0B 02 01 06 07 FF 4C 00 10 02 0B 00 C5")
/// An LE Extended Advertising Report (§7.7.65.13): one legacy ADV_IND (event type 0x0013),
/// random address, 1M/none PHYs, SID 0xFF, TX power 127, RSSI -60, no periodic interval,
/// flags only.
let radioExtendedReport = hx(
    "3E 1D 0D 01 13 00 01 66 55 44 33 22 C1 01 00 FF 7F C4 00 00 00 00 00 00 00 00 00 03 02 01 06")

private func socketPair(_ type: Int32 = Int32(SOCK_STREAM.rawValue)) -> (Int32, Int32) {
    var fds: [Int32] = [-1, -1]
    let r = socketpair(AF_UNIX, type, 0, &fds)
    precondition(r == 0, "socketpair failed")
    return (fds[0], fds[1])
}

/// A RadioH4 on `ctl`'s far end (`RadioFakeController()`), started at `now`.
private func startedH4(_ ctl: RadioFakeController, _ config: RadioConfig = RadioConfig(), now: Instant) throws -> RadioH4 {
    var radio = try RadioH4(fd: ctl.radioEnd, config: config)
    try radio.start(now: now)
    return radio
}

/// LE features of a 5.x controller (bit 12 LE Extended Advertising) and of a 4.2 one.
private let featuresExtended: UInt64 = 0x19FF
private let featuresLegacy: UInt64 = 0x003F

/// Runs the init sequence with a well-behaved controller; returns the frames it received.
private func runInit(_ radio: inout RadioH4, _ ctl: RadioFakeController, now: Instant,
                     features: UInt64) throws -> [[UInt8]] {
    var frames: [[UInt8]] = []
    while radio.state == .initialising {
        guard let frame = ctl.nextCommand() else {
            Issue.record("controller received no command; state \(radio.state)")
            break
        }
        frames.append(frame)
        ctl.answer(frame, features: features)
        _ = try radio.poll(now: now) { _ in Issue.record("an event leaked out during init") }
        if frames.count > 16 { break }
    }
    return frames
}

@Suite("RadioH4: init sequence and flow control over a socketpair")
struct RadioH4Tests {
    let t0 = Instant.now

    @Test("Init on a 5.x controller: Reset, version, features, masks, extended scan params/enable; reports flow")
    func initExtended() throws {
        let ctl = try RadioFakeController()
        var radio = try RadioH4(fd: ctl.radioEnd)
        do { let v = radio.state; #expect(v == .stopped) }
        try radio.start(now: t0)
        do { let v = radio.state; #expect(v == .initialising) }
        let frames = try runInit(&radio, ctl, now: t0, features: featuresExtended)
        #expect(frames.map(radioOpcode) == [0x0C03, 0x1001, 0x2003, 0x0C01, 0x2001, 0x2041, 0x2042])
        #expect(frames.map(spacedHex) == [
            "01 03 0C 00",                                // §7.3.2 Reset
            "01 01 10 00",                                // §7.4.1 Read_Local_Version_Information
            "01 03 20 00",                                // §7.8.3 LE_Read_Local_Supported_Features
            "01 01 0C 08 00 80 00 00 00 00 00 20",        // §7.3.1 Hardware Error + LE Meta
            "01 01 20 08 02 10 00 00 00 00 00 00",        // §7.8.1 adv report + ext adv report
            "01 41 20 08 00 00 01 00 60 00 60 00",        // §7.8.64 1M, passive, 60 ms = 60 ms
            "01 42 20 06 01 00 00 00 00 00",              // §7.8.65 enable, duplicates not filtered
        ])
        do { let v = radio.state; #expect(v == .scanning) }
        do { let v = radio.nextDeadline; #expect(v == nil) }
        do { let v = radio.usesExtendedScanning; #expect(v) }
        do { let v = radio.localVersion?.coreVersion; #expect(v == "5.2") }
        do { let v = radio.localVersion?.companyIdentifier; #expect(v == 0x0002) }
        do { let v = radio.leFeatures; #expect(v == LEFeatures(rawValue: featuresExtended)) }

        // Reports now come out exactly as the controller sent them, without the H4 byte.
        ctl.send([0x04] + radioLegacyReport + [0x04] + radioExtendedReport)
        var got: [[UInt8]] = []
        let n = try radio.poll(now: t0) { got.append(Array($0)) }
        #expect(n == 2)
        #expect(got == [radioLegacyReport, radioExtendedReport])
        do { let v = radio.eventsDelivered; #expect(v == 2) }
        // Nothing more was sent to the controller.
        #expect(ctl.nextCommand(timeoutMs: 100) == nil)
    }

    @Test("Init on a 4.2 controller: legacy §7.8.10/§7.8.11, LE mask without the extended report bit")
    func initLegacy() throws {
        let ctl = try RadioFakeController()
        var radio = try startedH4(ctl, now: t0)
        let frames = try runInit(&radio, ctl, now: t0, features: featuresLegacy)
        #expect(frames.map(spacedHex) == [
            "01 03 0C 00",
            "01 01 10 00",
            "01 03 20 00",
            "01 01 0C 08 00 80 00 00 00 00 00 20",
            "01 01 20 08 02 00 00 00 00 00 00 00",
            "01 0B 20 07 00 60 00 60 00 00 00",           // §7.8.10 passive, window = interval
            "01 0C 20 02 01 00",                          // §7.8.11 enable, Filter_Duplicates 0
        ])
        do { let v = radio.state; #expect(v == .scanning) }
        do { let v = radio.usesExtendedScanning; #expect(!v) }
    }

    @Test("Forced legacy mode on a 5.x controller and active scanning from the config")
    func forcedLegacyActive() throws {
        let ctl = try RadioFakeController()
        let config = RadioConfig(scan: try ScanParameters(type: .active, interval: 0x0020), mode: .legacy)
        var radio = try startedH4(ctl, config, now: t0)
        let frames = try runInit(&radio, ctl, now: t0, features: featuresExtended)
        #expect(frames.suffix(2).map(spacedHex) == ["01 0B 20 07 01 20 00 20 00 00 00", "01 0C 20 02 01 00"])
        do { let v = radio.usesExtendedScanning; #expect(!v) }
    }

    @Test("An error status stops init with a ControllerError naming command and status; re-init recovers")
    func errorStatus() throws {
        let ctl = try RadioFakeController()
        var radio = try startedH4(ctl, now: t0)
        var seen: [UInt16] = []
        var thrown: RadioError? = nil
        while thrown == nil, let frame = ctl.nextCommand() {
            seen.append(radioOpcode(frame))
            if radioOpcode(frame) == 0x2041 {
                ctl.complete(0x2041, status: 0x12)  // Invalid HCI Command Parameters
            } else {
                ctl.answer(frame, features: featuresExtended)
            }
            do {
                _ = try radio.poll(now: t0) { _ in }
            } catch {
                thrown = error
            }
        }
        #expect(seen.last == 0x2041)
        #expect(thrown == .controller(.commandFailed(.leSetExtendedScanParameters, .invalidCommandParameters)))
        #expect(thrown?.description ==
            "the Bluetooth controller refused HCI_LE_Set_Extended_Scan_Parameters (0x2041): Invalid HCI Command Parameters (0x12)")
        do { let v = radio.state; #expect(v == .stopped) }
        do { let v = radio.nextDeadline; #expect(v == nil) }
        // Nothing further is sent after the failure.
        _ = try radio.poll(now: t0 + .seconds(10)) { _ in }
        #expect(ctl.nextCommand(timeoutMs: 100) == nil)

        // The watchdog's re-init runs the whole sequence again from Reset.
        try radio.start(now: t0)
        let frames = try runInit(&radio, ctl, now: t0, features: featuresExtended)
        #expect(frames.first.map(radioOpcode) == 0x0C03)
        #expect(frames.count == 7)
        do { let v = radio.state; #expect(v == .scanning) }
    }

    @Test("A Command Status with an error status fails the same way")
    func commandStatusError() throws {
        let ctl = try RadioFakeController()
        var radio = try startedH4(ctl, now: t0)
        let reset = try #require(ctl.nextCommand())
        #expect(radioOpcode(reset) == 0x0C03)
        ctl.status(0x0C03, status: 0x03)  // Hardware Failure
        #expect(throws: RadioError.controller(.commandFailed(.reset, .hardwareFailure))) {
            try radio.poll(now: t0) { _ in }
        }
    }

    @Test("§4.4 flow control: 0 credits hold the next command until a NOP Command Complete grants one")
    func flowControl() throws {
        let ctl = try RadioFakeController()
        var radio = try RadioH4(fd: ctl.radioEnd)
        let t1 = t0 + .milliseconds(500)
        try radio.start(now: t0)
        #expect(radio.nextDeadline == t0 + .seconds(2))  // Reset's answer is due
        let reset = try #require(ctl.nextCommand())
        #expect(spacedHex(reset) == "01 03 0C 00")
        ctl.complete(0x0C03, credits: 0)
        _ = try radio.poll(now: t1) { _ in }
        // Reset is answered but no credit was granted: nothing may be sent.
        #expect(ctl.nextCommand(timeoutMs: 150) == nil)
        do { let v = radio.state; #expect(v == .initialising) }
        #expect(radio.nextDeadline == t1 + .seconds(2))  // now waiting for a credit
        // Still nothing at t1 + 1 s.
        _ = try radio.poll(now: t1 + .seconds(1)) { _ in }
        #expect(ctl.nextCommand(timeoutMs: 50) == nil)
        // The controller reopens flow control with a NOP (opcode 0x0000, 1 credit).
        ctl.send(hx("04 0E 03 01 00 00"))
        _ = try radio.poll(now: t1 + .seconds(1)) { _ in }
        let next = try #require(ctl.nextCommand())
        #expect(spacedHex(next) == "01 01 10 00")
        do { let v = radio.nextDeadline; #expect(v == t1 + .seconds(3)) }
    }

    @Test("A credit withheld past the timeout is reported as such")
    func creditTimeout() throws {
        let ctl = try RadioFakeController()
        var radio = try startedH4(ctl, now: t0)
        _ = try #require(ctl.nextCommand())
        ctl.complete(0x0C03, credits: 0)
        _ = try radio.poll(now: t0) { _ in }
        do {
            _ = try radio.poll(now: t0 + .seconds(2)) { _ in }
            Issue.record("no error")
        } catch {
            #expect(error == .controller(.noCommandCredit(.readLocalVersionInformation, after: .seconds(2))))
            #expect(error.description ==
                "the Bluetooth controller granted no command credit for 2.0 seconds, so HCI_Read_Local_Version_Information (0x1001) could not be sent")
        }
        do { let v = radio.state; #expect(v == .stopped) }
    }

    @Test("A silent controller: the command timeout is a deadline the loop checks; re-init resends Reset")
    func commandTimeoutAndReinit() throws {
        let ctl = try RadioFakeController()
        var radio = try startedH4(ctl, now: t0)
        _ = try #require(ctl.nextCommand())
        do { let v = radio.nextDeadline; #expect(v == t0 + .seconds(2)) }
        // Before the deadline nothing happens.
        _ = try radio.poll(now: t0 + .milliseconds(1999)) { _ in }
        do { let v = radio.state; #expect(v == .initialising) }
        do {
            _ = try radio.poll(now: t0 + .seconds(2)) { _ in }
            Issue.record("no timeout")
        } catch {
            #expect(error == .controller(.commandTimeout(.reset, after: .seconds(2))))
            #expect(error.description == "the Bluetooth controller did not answer HCI_Reset (0x0C03) within 2.0 seconds")
        }
        do { let v = radio.state; #expect(v == .stopped) }

        // Re-init: Reset goes out again even though the old one was never answered.
        let t1 = t0 + .seconds(5)
        try radio.start(now: t1)
        do { let v = radio.nextDeadline; #expect(v == t1 + .seconds(2)) }
        let again = try #require(ctl.nextCommand())
        #expect(spacedHex(again) == "01 03 0C 00")
        ctl.answer(again, features: featuresExtended)
        _ = try radio.poll(now: t1) { _ in }
        let frames = try runInit(&radio, ctl, now: t1, features: featuresExtended)
        #expect(frames.count == 6)
        do { let v = radio.state; #expect(v == .scanning) }
    }

    @Test("A shorter configured timeout applies")
    func configuredTimeout() throws {
        let ctl = try RadioFakeController()
        var radio = try startedH4(ctl, RadioConfig(commandTimeout: .milliseconds(250)), now: t0)
        _ = try #require(ctl.nextCommand())
        do { let v = radio.nextDeadline; #expect(v == t0 + .milliseconds(250)) }
        #expect(throws: RadioError.controller(.commandTimeout(.reset, after: .milliseconds(250)))) {
            try radio.poll(now: t0 + .milliseconds(250)) { _ in }
        }
    }

    @Test("Partial reads: every answer and report drip-fed byte by byte between guard bytes")
    func dripFed() throws {
        let ctl = try RadioFakeController()
        var radio = try startedH4(ctl, now: t0)
        var opcodes: [UInt16] = []
        var delivered: [[UInt8]] = []
        while radio.state == .initialising, let frame = ctl.nextCommand() {
            opcodes.append(radioOpcode(frame))
            // Capture what the controller would answer, then send it one byte per poll.
            let (x, y) = socketPair()
            let scratch = RadioFakeController(fd: x)
            scratch.answer(frame, features: featuresExtended)
            var answer = [UInt8](repeating: 0, count: 64)
            let n = answer.withUnsafeMutableBytes { Glibc.read(y, $0.baseAddress, $0.count) }
            Glibc.close(y)
            for byte in answer[..<n] {
                ctl.send([byte])
                _ = try radio.poll(now: t0) { delivered.append(Array($0)) }
            }
        }
        #expect(opcodes == [0x0C03, 0x1001, 0x2003, 0x0C01, 0x2001, 0x2041, 0x2042])
        do { let v = radio.state; #expect(v == .scanning) }
        // A guard byte (0x00 is no H4 indicator), the report byte by byte, another guard byte.
        for byte in [0x00] + [0x04] + radioLegacyReport + [0x00] {
            ctl.send([byte])
            _ = try radio.poll(now: t0) { delivered.append(Array($0)) }
        }
        #expect(delivered == [radioLegacyReport])
        do { let v = radio.framerStats.garbageBytes; #expect(v == 2) }
    }

    @Test("Partial writes: a command written 1 byte per turn keeps wantsWrite until done")
    func partialWrites() throws {
        let ctl = try RadioFakeController()
        var radio = try RadioH4(fd: ctl.radioEnd)
        radio.maxWriteChunk = 1
        try radio.start(now: t0)
        var received: [String] = []
        for _ in 0 ..< 4 {
            ctl.receive(timeoutMs: 200)
            received.append(spacedHex(ctl.buffered))
            _ = try radio.poll(now: t0) { _ in }
        }
        #expect(received == ["01", "01 03", "01 03 0C", "01 03 0C 00"])
        do { let v = radio.wantsWrite; #expect(!v) }
        // The next command waits for Reset's answer, then also goes out a byte at a time.
        ctl.discard(4)
        ctl.complete(0x0C03)
        _ = try radio.poll(now: t0) { _ in }
        do { let v = radio.wantsWrite; #expect(v) }
        for _ in 0 ..< 3 { _ = try radio.poll(now: t0) { _ in } }
        do { let v = radio.wantsWrite; #expect(!v) }
        #expect(spacedHex(try #require(ctl.nextCommand())) == "01 01 10 00")
    }

    @Test("EAGAIN on write: the command waits for POLLOUT and then goes out whole")
    func writeWouldBlock() throws {
        let ctl = try RadioFakeController()
        var radio = try RadioH4(fd: ctl.radioEnd)
        // Fill the socket until it refuses more (the radio made its end non-blocking).
        var filler = 0
        let block = [UInt8](repeating: 0xAA, count: 4096)
        while true {
            let n = block.withUnsafeBytes { Glibc.send(ctl.radioEnd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { break }
            filler += n
        }
        #expect(Glibc.errno == EAGAIN)
        try radio.start(now: t0)
        do { let v = radio.wantsWrite; #expect(v) }
        // The controller drains the filler; the radio's fd becomes writable.
        while ctl.buffered.count < filler { ctl.receive(timeoutMs: 200) }
        ctl.discard(filler)
        var p = pollfd(fd: radio.fd, events: Int16(POLLOUT), revents: 0)
        #expect(Glibc.poll(&p, 1, 1000) == 1)
        _ = try radio.poll(now: t0) { _ in }
        do { let v = radio.wantsWrite; #expect(!v) }
        #expect(spacedHex(try #require(ctl.nextCommand())) == "01 03 0C 00")
    }

    @Test("Hardware Error event (§7.7.16) while scanning stops the source")
    func hardwareError() throws {
        let ctl = try RadioFakeController()
        var radio = try startedH4(ctl, now: t0)
        _ = try runInit(&radio, ctl, now: t0, features: featuresLegacy)
        do { let v = radio.state; #expect(v == .scanning) }
        ctl.sendEvent(0x10, [0x05])
        #expect(throws: RadioError.controller(.hardwareError(code: 0x05))) {
            try radio.poll(now: t0) { _ in }
        }
        do { let v = radio.state; #expect(v == .stopped) }
    }

    @Test("A malformed Command Complete is a WireError from the controller")
    func malformedCommandComplete() throws {
        let ctl = try RadioFakeController()
        var radio = try startedH4(ctl, now: t0)
        _ = try #require(ctl.nextCommand())
        ctl.send(hx("04 0E 03 01 03 0C"))  // no Status
        #expect(throws: RadioError.wire(.malformed(at: 5, .commandCompleteWithoutStatus))) {
            try radio.poll(now: t0) { _ in }
        }
    }

    @Test("The controller hanging up is .closed")
    func peerClosed() throws {
        let (a, b) = socketPair()
        var radio = try RadioH4(fd: a)
        Glibc.close(b)
        #expect(throws: RadioError.closed) {
            try radio.poll(now: t0) { _ in }
        }
        // Writing to it is .closed too, not a SIGPIPE.
        #expect(throws: RadioError.closed) {
            try radio.start(now: t0)
        }
    }

    @Test("Non-event packets (ACL) are skipped and counted, events around them still flow")
    func nonEventPackets() throws {
        let ctl = try RadioFakeController()
        var radio = try RadioH4(fd: ctl.radioEnd)
        // §5.4.2 ACL: handle 0x0001, length 3.
        ctl.send(hx("02 01 00 03 00 AA BB CC") + [0x04] + radioLegacyReport)
        var got: [[UInt8]] = []
        #expect(try radio.poll(now: t0) { got.append(Array($0)) } == 1)
        #expect(got == [radioLegacyReport])
        do { let v = radio.nonEventPackets; #expect(v == 1) }
    }

    @Test("A serial controller on a pty: openSerial sets raw mode, init runs over it")
    func serialPty() throws {
        // posix_openpt/ptsname are not in the Glibc module; open /dev/ptmx and ask the kernel
        // (TIOCSPTLCK = _IOW('T', 0x31, int), TIOCGPTN = _IOR('T', 0x30, unsigned int)).
        let master = Glibc.open("/dev/ptmx", O_RDWR | O_NOCTTY)
        try #require(master >= 0)
        var unlock: Int32 = 0
        var number: UInt32 = 0
        #expect(ioctl(master, UInt(0x4004_5431), &unlock) == 0)
        #expect(ioctl(master, UInt(0x8004_5430), &number) == 0)
        let path = "/dev/pts/\(number)"
        let ctl = RadioFakeController(fd: master)
        let fd = try RadioH4.openSerial(path: path, baud: 1_000_000)
        var radio = try RadioH4(fd: fd)
        try radio.start(now: t0)
        let frames = try runInit(&radio, ctl, now: t0, features: featuresLegacy)
        #expect(frames.count == 7)
        do { let v = radio.state; #expect(v == .scanning) }
        // Raw mode: bytes a line discipline would mangle (0x0D, 0x03, 0x11) pass untouched.
        let report = hx("3E 0C 02 01 00 00 0D 03 11 13 0A 7F 00 C5")
        ctl.send([0x04] + report)
        var got: [[UInt8]] = []
        var p = pollfd(fd: radio.fd, events: Int16(POLLIN), revents: 0)
        #expect(Glibc.poll(&p, 1, 1000) == 1)
        _ = try radio.poll(now: t0) { got.append(Array($0)) }
        #expect(got == [report])
    }

    @Test("openSerial: a missing device and an unsupported baud rate say so")
    func serialErrors() {
        #expect(throws: RadioError.adapterNotFound("/dev/baton-no-such-tty")) {
            try RadioH4.openSerial(path: "/dev/baton-no-such-tty")
        }
        #expect(throws: RadioError.self) {
            try RadioH4.openSerial(path: "/dev/null", baud: 12345)
        }
    }
}

@Suite("RadioH4: the syscall wrapper (habit 7)")
struct RadioH4SyscallTests {
    @Test("EAGAIN is nil, end of stream is 0, other errors throw Errno naming the call")
    func results() throws {
        var fds: [Int32] = [-1, -1]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        try Syscall.setNonBlocking(fds[0])
        var buf = [UInt8](repeating: 0, count: 8)
        let empty = try buf.withUnsafeMutableBytes { try Syscall.read(fds[0], into: $0) }
        #expect(empty == nil)
        Glibc.close(fds[1])
        let eof = try buf.withUnsafeMutableBytes { try Syscall.read(fds[0], into: $0) }
        #expect(eof == 0)
        do {
            _ = try [UInt8](repeating: 1, count: 4).withUnsafeBytes { try Syscall.send(fds[0], $0) }
            Issue.record("send to a closed peer succeeded")
        } catch let error as Errno {
            #expect(error == Errno(EPIPE, call: "send"))
            #expect(error.description == "send: Broken pipe (errno \(EPIPE))")
        } catch {
            Issue.record("unexpected \(error)")
        }
        Syscall.close(fds[0])
    }

    @Test("EBADF is our bug: a precondition, not an error")
    func badDescriptorTraps() async {
        await #expect(processExitsWith: .failure) {
            var buf = [UInt8](repeating: 0, count: 4)
            _ = buf.withUnsafeMutableBytes { try? Syscall.read(-1, into: $0) }
        }
    }
}
