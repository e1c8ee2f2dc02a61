// A Bluetooth 5 controller in a room: the simulator's virtual controller reports LE Extended
// Advertising, the gateway scans with the extended commands, and long advertisements arrive as
// chains of LE Extended Advertising Reports interleaved with other advertisers' (Core 5.4,
// Vol 4, Part E, §7.7.65.13). BlueZ's btvirt cannot show this in the VM (docs/vm.md: its
// emulated controller sends every extended advertisement as one report), so it is shown here,
// through the gateway's own H4 path and a real mosquitto.
import BatonLibc
@testable import BatonGateway
import BatonHCI
import BatonMQTT
import BatonSim
import BatonTestSupport
import BatonWire
import Foundation
import Glibc

import Testing

@Suite(.serialized) struct FragmentedAdvertisingTests {
    @Test("§7.7.65.13 through the loop: a Baton device whose beacon comes in the last fragment of a long extended advertisement is heard whole and published; nothing is dropped")
    func longAdvertisementsAreHeardWhole() throws {
        let broker = try MosquittoBroker()
        let config = try hallConfig(broker)
        let started = try StartedGateway(config, extended: true)
        let room = started.room
        var gateway = started.gateway
        // 12 devices: device 9 is a Baton device (i % 3 == 0) that advertises extended (i % 5 == 4),
        // so its beacon follows 199–668 bytes of other data.
        var traffic = CaptureGenerator(devices: 12, seed: 19)
        traffic.longAdvertisements = true
        guard case .baton(let long) = traffic.devices[9].kind else { Issue.record("device 9 is not a Baton device"); return }
        let topic = "baton/activities/\(ActivityBeacon.deviceIDText(long.deviceID))"
        var published = false
        let end = Instant.now + .seconds(15)
        var delivered = 0
        while Instant.now < end, !published {
            room.poll()
            if room.scanning {
                room.deliver(traffic.next())
                delivered += 1
            }
            _ = gateway.turn()
            if delivered % 200 == 199 { published = try broker.retained(topic)[topic]?.isEmpty == false }
        }
        #expect(room.opcodes.contains(0x2042), "the gateway chose extended scanning (LE Set Extended Scan Enable)")
        #expect(published, "the long advertiser's activity was published")
        let t = gateway.tally
        #expect(t.assembled > 0 && t.extendedReports > t.assembled)
        #expect(t.drops.total == 0, "\(t.drops.sorted)")
    }
}
