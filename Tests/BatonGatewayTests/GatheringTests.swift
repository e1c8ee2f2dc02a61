// The loop's gathering (docs/architecture.md §2 "Gathering"), through the gateway's own H4 path
// and a real mosquitto: a read that finds two reports or more waiting holds the radio back for
// `radio.gather`, so a busy room's reports are read together; a read that finds one (a quiet
// room: nothing came meanwhile) does not, so the next report is read, and its change
// published, as it arrives (issue 33: one device changing at a time waited 10 ms a report).
import BatonLibc
@testable import BatonGateway
import BatonHCI
import BatonMQTT
import BatonSim
import BatonTestSupport
import Foundation
import CBlueZ  // its shim includes <sys/socket.h>: the socket types have one owner
import Glibc

import Testing

@Suite(.serialized) struct GatheringTests {
    @Test func aQuietRoomIsReadAsReportsComeAndABusyOneIsGathered() throws {
        let broker = try MosquittoBroker()
        let config = try hallConfig(broker)
        let started = try StartedGateway(config, extended: false)
        let room = started.room
        var gateway = started.gateway
        var traffic = CaptureGenerator(devices: 8, seed: 33)
        let end = Instant.now + .seconds(10)
        while Instant.now < end, !room.scanning {
            room.poll()
            _ = gateway.turn()
        }
        try #require(room.scanning, "the gateway never started scanning")

        /// Delivers `n` reports at once, then turns the loop until the gateway has read them.
        func deliver(_ n: Int) -> Int {
            let before = gateway.tally.reports
            for _ in 0 ..< n { room.deliver(traffic.next()) }
            let until = Instant.now + .seconds(5)
            while Instant.now < until, gateway.tally.reports < before + n { _ = gateway.turn() }
            return gateway.tally.reports - before
        }
        // One report at a time: each read finds one, and nothing is held back.
        for i in 0 ..< 5 {
            #expect(deliver(1) == 1)
            let gathering = gateway.radio.gathering
            #expect(!gathering, "report \(i) of a quiet room held the next read back")
        }
        // Ten at once: the read finds them all waiting, and the next one is held back.
        #expect(deliver(10) == 10)
        let busy = gateway.radio.gathering
        #expect(busy, "a read that found ten reports waiting did not start gathering")
        // Quiet again: the held read finds the one report, and gathering ends.
        #expect(deliver(1) == 1)
        let quiet = gateway.radio.gathering
        #expect(!quiet, "a read that found one report kept gathering")
    }
}
