// The management socket never stalls the loop (issue 19): re-advertising's requests go out on
// the socket and their answers are read when the loop polls it, each with a 2 s deadline. Here
// the kernel is played by the test on a SOCK_SEQPACKET socketpair (mgmt delivers one event per
// read, mgmt-api.txt), answering late or not at all, while the simulator's virtual controller
// keeps delivering advertisements over H4 and the loop keeps decoding them.
import BatonLibc
@testable import BatonGateway
import BatonHCI
import BatonKeys
import BatonMQTT
import BatonSim
import BatonTestSupport
import BatonWire
import CBlueZ  // its shim includes <sys/socket.h>: SOCK_SEQPACKET has one owner
import Foundation
import Glibc

import Testing

private let group = HallsDevice.group
private let deviceText = HallsDevice.deviceText
private func activity(seq: Int) -> [UInt8] { HallsDevice.activity(seq: seq) }

/// The kernel's end of the mgmt socket, played by the test (mgmt-api.txt "Packet Structures").
private struct ScriptedKernel {
    let fd: Int32

    /// The opcodes of the commands the gateway sent since the last call.
    func commands() -> [UInt16] {
        var out: [UInt16] = []
        var buffer = [UInt8](repeating: 0, count: 512)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            guard n >= 2 else { return out }
            out.append(UInt16(buffer[0]) | UInt16(buffer[1]) << 8)
        }
    }

    /// Command Complete (event 0x0001) for controller 0: opcode, status, return parameters.
    func complete(_ opcode: UInt16, status: UInt8 = 0, _ parameters: [UInt8] = []) {
        send(code: 0x0001, [UInt8(opcode & 0xFF), UInt8(opcode >> 8), status] + parameters)
    }

    /// Command Status (event 0x0002): how mgmt refuses.
    func refuse(_ opcode: UInt16, status: UInt8) {
        send(code: 0x0002, [UInt8(opcode & 0xFF), UInt8(opcode >> 8), status])
    }

    func send(code: UInt16, _ parameters: [UInt8]) {
        let packet = [UInt8(code & 0xFF), UInt8(code >> 8), 0x00, 0x00, UInt8(parameters.count), 0x00] + parameters
        _ = packet.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    }
}

@Suite(.serialized) struct ManagementLateTests {
    @Test("issue 19: the kernel answers Add Advertising 1.5 s late, then not at all; advertisements keep flowing through the loop, no turn waits for it, a late answer is taken, a missing one fails at its 2 s deadline and frees the slot")
    func lateAnswersDoNotStallTheLoop() throws {
        let broker = try MosquittoBroker()
        let config = try HallsDevice.officeConfig(broker: broker, radio: "sim:/run/baton/office.sock")
        try HallsDevice.hallPublishes(seq: 258, on: broker)

        // The kernel's socket. Read Advertising Features is answered before it is asked: the
        // gateway's start waits for it (before the loop runs): flags, 31/31 bytes, 5 instances, none used.
        var pair: [Int32] = [-1, -1]
        try #require(socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0)
        let kernel = ScriptedKernel(fd: pair[1])
        defer { close(pair[1]) }
        kernel.complete(0x003D, [0x3F, 0x00, 0x00, 0x00, 0x1F, 0x1F, 0x05, 0x00])
        let controller = try ReadvertiseRadio(mgmt: ManagementSocket(descriptor: pair[0], adapter: "hci0", index: 0), count: 2,
                                              listeners: [], psms: [0x0091, 0x0092], listenerFDs: [-1, -1])
        #expect(kernel.commands() == [0x003D])

        // The room's controller: the simulator's, over H4.
        let started = try StartedGateway(config, readvertising: controller)
        let room = started.room
        var gateway = started.gateway
        var traffic = CaptureGenerator(devices: 6, seed: 19)
        var longestTurn = Duration.zero
        /// Turns the loop (the room's controller sending an advertisement every turn) until
        /// `done` holds or `seconds` pass.
        func turn(for seconds: Double, until done: () -> Bool = { false }) -> Bool {
            let end = Instant.now + .milliseconds(Int(seconds * 1000))
            while Instant.now < end {
                room.poll()
                if room.scanning {
                    var report = traffic.next()
                    if report.data.count > 31 { report.data = [0x02, 0x01, 0x06] }
                    room.deliver(report)
                }
                let t0 = Instant.now
                _ = gateway.turn()
                longestTurn = max(longestTurn, Instant.now - t0)
                if done() { return true }
            }
            return false
        }

        // The retained activity is asked onto the air: Remove Advertising, then Add Advertising.
        var sent: [UInt16] = []
        try #require(turn(for: 10) { sent += kernel.commands(); return sent.count >= 2 }, "nothing was sent: \(sent)")
        #expect(sent == [0x003F, 0x003E])
        // The kernel takes 1.5 s to answer; the room goes on.
        let heardBefore = gateway.tally.reports
        longestTurn = .zero
        _ = turn(for: 1.5)
        let heardWhileWaiting = gateway.tally.reports - heardBefore
        #expect(heardWhileWaiting > 50, "advertisements flowed while the kernel was silent: \(heardWhileWaiting)")
        #expect(longestTurn < .milliseconds(250), "no turn waited for the kernel: the longest took \(longestTurn)")
        // Late, but inside the deadline: the remove finds nothing (Invalid Parameters), the add succeeds.
        kernel.refuse(0x003F, status: 0x0D)
        kernel.complete(0x003E, [0x05])
        _ = turn(for: 0.3)
        #expect(gateway.readvertiseErrors == 0, "a late answer is an answer")
        #expect(gateway.readvertiser?.slots[0]?.sequence == 258)

        // A save; this time the kernel never answers. The loop goes on, and at the 2 s deadline
        // the advertisement counts as failed: the slot is freed for the next message.
        try broker.publish(topic: "baton/activities/\(deviceText)", payload: activity(seq: 259), retain: true)
        sent = []
        try #require(turn(for: 5) { sent += kernel.commands(); return sent.count >= 2 }, "the save was not sent: \(sent)")
        let before = gateway.tally.reports
        longestTurn = .zero
        let failed = turn(for: 4) { gateway.readvertiseErrors > 0 }
        #expect(failed, "the unanswered request failed at its deadline")
        #expect(gateway.readvertiser?.slots[0] == nil, "the slot is free again")
        #expect(gateway.tally.reports - before > 50)
        #expect(longestTurn < .milliseconds(250), "the longest turn took \(longestTurn)")
        // The withdraw that follows goes out without waiting too.
        _ = turn(for: 0.2)
        #expect(kernel.commands().contains(0x003F))
    }
}
