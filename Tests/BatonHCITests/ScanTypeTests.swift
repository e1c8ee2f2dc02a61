// Active scanning on request (docs/esphome.md "Active scanning", issue 32 item 2). A controller
// refuses new scan parameters while it scans (Core 5.4, Vol 4, Part E, §7.8.10: Command
// Disallowed), so a change is three commands: LE Set Scan Enable off, LE Set Scan Parameters
// with the new LE_Scan_Type, LE Set Scan Enable on. Nothing is reset and the version and
// features the init read stay. Played over the SOCK_SEQPACKET pair of the rescan tests (`startedBlueZ`, `scan`).

import BatonLibc
import Glibc
import Testing
import BatonTestSupport
import BatonWire
@testable import BatonHCI

//                         H4 opcode   len type  interval window own  filter
private let passiveParameters = "01 0B 20 07 00 60 00 60 00 00 00"
private let activeParameters = "01 0B 20 07 01 60 00 60 00 00 00"
private let disable = "01 0C 20 02 00 00", enable = "01 0C 20 02 01 00"

@Suite("Scan type: passive, active on request, and back")
struct ScanTypeTests {
    let t0 = Instant.now

    @Test("A scanning controller is changed with disable, parameters with LE_Scan_Type 1, enable")
    func activeThenPassive() throws {
        let ctl = try RadioFakeController(rawSocket: true)
        var radio = try startedBlueZ(ctl, now: t0)
        #expect(try scan(&radio, ctl, now: t0) == ["01 01 10 00", "01 03 20 00", disable, passiveParameters, enable])
        #expect(radio.scanType == .passive)
        let version = radio.localVersion

        try radio.setScanType(.active, now: t0)
        #expect(radio.state == .initialising)
        #expect(try scan(&radio, ctl, now: t0) == [disable, activeParameters, enable])
        #expect(radio.scanType == .active)
        #expect(radio.localVersion == version)

        // Asking for what it has sends nothing.
        try radio.setScanType(.active, now: t0)
        #expect(radio.state == .scanning)
        #expect(ctl.nextCommand(timeoutMs: 50) == nil)

        try radio.setScanType(.passive, now: t0)
        #expect(try scan(&radio, ctl, now: t0) == [disable, passiveParameters, enable])
        #expect(radio.scanType == .passive)
    }

    @Test("Asked during the init, before its parameters: the init sends active ones")
    func beforeTheParameters() throws {
        let ctl = try RadioFakeController(rawSocket: true)
        var radio = try startedBlueZ(ctl, now: t0)
        try radio.setScanType(.active, now: t0)
        #expect(try scan(&radio, ctl, now: t0) == ["01 01 10 00", "01 03 20 00", disable, activeParameters, enable])
        #expect(radio.scanType == .active)
    }

    @Test("Asked while the passive parameters are in flight: the init ends, then the change follows")
    func whileTheParametersAreInFlight() throws {
        let ctl = try RadioFakeController(rawSocket: true)
        var radio = try startedBlueZ(ctl, now: t0)
        var frames: [String] = []
        for _ in 0..<3 {
            let frame = try #require(ctl.nextCommand())
            frames.append(spacedHex(frame))
            ctl.answer(frame, features: 0x003F)
            _ = try radio.poll(now: t0) { _ in }
        }
        let parameters = try #require(ctl.nextCommand())
        #expect(spacedHex(parameters) == passiveParameters)
        try radio.setScanType(.active, now: t0)  // too late for these
        ctl.answer(parameters, features: 0x003F)
        _ = try radio.poll(now: t0) { _ in }
        #expect(radio.scanType == .passive)
        #expect(try scan(&radio, ctl, now: t0) == [enable, disable, activeParameters, enable])
        #expect(radio.scanType == .active)
    }

    @Test("A controller that refuses the change: the radio stops with the error, and its restart scans actively")
    func aRefusal() throws {
        let ctl = try RadioFakeController(rawSocket: true)
        var radio = try startedBlueZ(ctl, now: t0)
        _ = try scan(&radio, ctl, now: t0)
        try radio.setScanType(.active, now: t0)
        let off = try #require(ctl.nextCommand())
        ctl.answer(off, features: 0x003F)
        _ = try radio.poll(now: t0) { _ in }
        let parameters = try #require(ctl.nextCommand())
        #expect(spacedHex(parameters) == activeParameters)
        // Command Complete, one credit, LE Set Scan Parameters, status 0x12 Invalid HCI Command Parameters.
        ctl.send(hx("04 0E 04 01 0B 20 12"))
        #expect(throws: RadioError.self) { _ = try radio.poll(now: t0) { _ in } }
        #expect(radio.state == .stopped)
        #expect(radio.scanType == nil)
        try radio.start(now: t0)
        #expect(try scan(&radio, ctl, now: t0) == ["01 01 10 00", "01 03 20 00", disable, activeParameters, enable])
    }
}
