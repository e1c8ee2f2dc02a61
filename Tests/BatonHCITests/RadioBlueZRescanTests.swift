// RadioBlueZ sets its scan again after the kernel changed it. Seen on the real stack
// (docs/vm.md, docs/radio.md "Living with the kernel"): to open an L2CAP link the kernel
// disables scanning, runs its own accept-list scan, disables it again, connects, and leaves
// scanning off. The raw socket shows the kernel's commands as command packets (H4 type 0x01,
// hci_sock.c `hci_send_to_sock` copies them to every raw socket but the sender); here the test
// plays the kernel over a SOCK_SEQPACKET pair that behaves like the raw socket.

import BatonLibc
import Glibc
import Testing
import BatonTestSupport
import BatonWire
@testable import BatonHCI
import CBlueZ

/// A SOCK_SEQPACKET pair, which behaves like the raw HCI socket: one packet per read.
func seqpacketPair() -> (Int32, Int32) {
    var fds: [Int32] = [-1, -1]
    precondition(socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue), 0, &fds) == 0, "socketpair failed")
    return (fds[0], fds[1])
}

/// A RadioBlueZ for hci0 on `ctl`'s raw socket stand-in (`RadioFakeController(rawSocket: true)`),
/// started at `now`.
func startedBlueZ(_ ctl: RadioFakeController, _ config: RadioConfig = RadioConfig(), now: Instant) throws -> RadioBlueZ {
    var radio = RadioBlueZ(descriptor: ctl.radioEnd, adapter: "hci0", config: config)
    try radio.start(now: now)
    return radio
}

/// Answers commands (a legacy controller) until the radio scans; returns the frames.
func scan(_ radio: inout RadioBlueZ, _ ctl: RadioFakeController, now: Instant) throws -> [String] {
    var frames: [String] = []
    while radio.state != .scanning, frames.count < 8 {
        let frame = try #require(ctl.nextCommand())
        frames.append(spacedHex(frame))
        ctl.answer(frame, features: 0x003F)
        _ = try radio.poll(now: now) { _ in Issue.record("an event leaked out during init") }
    }
    return frames
}

private let initSequence = [
    "01 01 10 00", "01 03 20 00", "01 0C 20 02 00 00", "01 0B 20 07 00 60 00 60 00 00 00", "01 0C 20 02 01 00",
]

@Suite("RadioBlueZ: setting the scan again after the kernel changed it")
struct RadioBlueZRescanTests {
    let t0 = Instant.now

    @Test("The kernel's connect sequence: a rescan rescanAfter after its last scan command, not before")
    func kernelConnectSequence() throws {
        let ctl = try RadioFakeController(rawSocket: true)
        var radio = try startedBlueZ(ctl, now: t0)
        #expect(try scan(&radio, ctl, now: t0) == initSequence)
        #expect(radio.nextDeadline == nil)

        // What btmon showed the kernel sending for an L2CAP connect (docs/vm.md): scan off,
        // accept list, its own parameters, scan on, scan off, LE Create Connection. Each
        // arrives on the raw socket as a command packet, with its Command Complete.
        let kernel = ["01 0C 20 02 00 00", "01 11 20 07 00 01 00 01 01 AA 00", "01 0B 20 07 00 60 00 30 00 00 01",
                      "01 0C 20 02 01 01", "01 0C 20 02 00 00"]
        let t1 = t0 + .milliseconds(100)
        for command in kernel { ctl.send(hx(command)) }
        ctl.send(hx("01 0D 20 19 60 00 60 00 00 00 01 00 01 01 AA 00 00 18 00 28 00 00 00 2A 00 00 00 00 00"))
        _ = try radio.poll(now: t1) { _ in }
        #expect(radio.scanCommandsSeen == 4)  // the accept list and the connection change no scan
        #expect(radio.nextDeadline == t1 + RadioBlueZ.rescanAfter)

        // Not before the kernel has been quiet for rescanAfter.
        _ = try radio.poll(now: t1 + RadioBlueZ.rescanAfter - .milliseconds(1)) { _ in }
        #expect(ctl.nextCommand(timeoutMs: 100) == nil)
        #expect(radio.rescans == 0)

        // Then the whole init again, ending with Baton's own scan enabled.
        let t2 = t1 + RadioBlueZ.rescanAfter
        _ = try radio.poll(now: t2) { _ in }
        #expect(radio.rescans == 1)
        #expect(radio.state == .initialising)
        #expect(try scan(&radio, ctl, now: t2) == initSequence)
        #expect(radio.nextDeadline == nil)
        // Reports flow again.
        ctl.send([0x04] + radioLegacyReport)
        var got = 0
        _ = try radio.poll(now: t2) { _ in got += 1 }
        #expect(got == 1)
    }

    @Test("Every further kernel scan command moves the rescan later; one rescan per burst")
    func quietPeriodMoves() throws {
        let ctl = try RadioFakeController(rawSocket: true)
        var radio = try startedBlueZ(ctl, now: t0)
        _ = try scan(&radio, ctl, now: t0)
        ctl.send(hx("01 0C 20 02 00 00"))
        _ = try radio.poll(now: t0) { _ in }
        let later = t0 + .milliseconds(400)
        ctl.send(hx("01 42 20 06 00 00 00 00 00 00"))  // the extended disable counts too
        _ = try radio.poll(now: later) { _ in }
        #expect(radio.nextDeadline == later + RadioBlueZ.rescanAfter)
        _ = try radio.poll(now: t0 + RadioBlueZ.rescanAfter) { _ in }
        #expect(radio.rescans == 0)
        _ = try radio.poll(now: later + RadioBlueZ.rescanAfter) { _ in }
        #expect(radio.rescans == 1)
        #expect(radio.scanCommandsSeen == 2)
    }

    @Test("A kernel scan command during Baton's own init waits for the init to finish, then rescans")
    func duringInit() throws {
        let ctl = try RadioFakeController(rawSocket: true)
        var radio = try startedBlueZ(ctl, now: t0)
        let first = try #require(ctl.nextCommand())
        ctl.send(hx("01 0C 20 02 00 00"))  // bluetoothd's discovery stops, say
        _ = try radio.poll(now: t0) { _ in }
        ctl.answer(first, features: 0x003F)
        let late = t0 + .seconds(1)
        _ = try radio.poll(now: late) { _ in }
        #expect(radio.state == .initialising)
        #expect(radio.rescans == 0)  // past rescanAfter, but Baton's init is still running
        // The init finishes, and at once (the kernel has been quiet long enough) runs again.
        var frames = [spacedHex(first)]
        while frames.count < 12, !(radio.state == .scanning && radio.rescans == 1) {
            let frame = try #require(ctl.nextCommand())
            frames.append(spacedHex(frame))
            ctl.answer(frame, features: 0x003F)
            _ = try radio.poll(now: late) { _ in }
        }
        #expect(frames == initSequence + initSequence)
        #expect(radio.rescans == 1)
    }

    @Test("start(now:) forgets a pending rescan: the init it runs sets the scan anyway")
    func startForgets() throws {
        let ctl = try RadioFakeController(rawSocket: true)
        var radio = try startedBlueZ(ctl, now: t0)
        _ = try scan(&radio, ctl, now: t0)
        ctl.send(hx("01 0B 20 07 00 60 00 30 00 00 01"))
        _ = try radio.poll(now: t0) { _ in }
        #expect(radio.nextDeadline != nil)
        try radio.start(now: t0)
        _ = try scan(&radio, ctl, now: t0)
        #expect(radio.nextDeadline == nil)
        _ = try radio.poll(now: t0 + .seconds(5)) { _ in }
        #expect(radio.rescans == 0)
    }

    @Test("Short or foreign command packets are not scan commands")
    func otherCommands() throws {
        #expect(RadioBlueZ.changesScan(.leSetScanEnable))
        #expect(RadioBlueZ.changesScan(.leSetExtendedScanParameters))
        #expect(!RadioBlueZ.changesScan(.readLocalVersionInformation))
        #expect(!RadioBlueZ.changesScan(HCIOpcode(rawValue: 0x200D)))  // LE Create Connection
        let ctl = try RadioFakeController(rawSocket: true)
        var radio = try startedBlueZ(ctl, now: t0)
        _ = try scan(&radio, ctl, now: t0)
        ctl.send([0x01, 0x0C])  // cut short: no opcode
        ctl.send(hx("01 03 0C 00"))  // someone's HCI_Reset
        _ = try radio.poll(now: t0) { _ in Issue.record("a command packet came out as an event") }
        #expect(radio.scanCommandsSeen == 0)
        #expect(radio.nonEventPackets == 0)
        #expect(radio.nextDeadline == nil)
    }
}
