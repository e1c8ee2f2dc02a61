// The payload a simulated device answers fetches with (docs/simulator.md "Device links"), in
// process: padded to exactly `payload-bytes`, and following the device's script. The links
// themselves, `baton sim` with a client on `DIR/<room>.link`, are BatonCLITests'
// (DeviceLinkSimTests.swift).
import BatonSim
import BatonWire
import Testing

@Suite struct SimulatedPayloadTests {
    /// Every size from the smallest a device may ask for to 300 bytes past it (both places
    /// where a CBOR head grows), and large ones, at sequences of each head size.
    @Test func aPaddedPayloadIsExactlyPayloadBytes() throws {
        let base = Scenario.Device(id: 0x5A00_0000_0001, name: "reader", type: "com.example.reader.article",
                                   place: .room("hall"), title: "Chapter 3")
        let natural = ScenarioPlayer(Scenario(duration: 1, rooms: threeRooms, devices: [base]))
        let least = natural.payload(device: 0, sequence: .max).count + 9
        let limits = PayloadLimits(maxBytes: 65535)
        var arrays = 0
        for target in Array(least...(least + 300)) + [1000, 3072, 4096, 65535] {
            var device = base
            device.payloadBytes = target
            let player = ScenarioPlayer(Scenario(duration: 1, rooms: threeRooms, devices: [device]))
            for sequence: UInt16 in [1, 23, 24, 255, 256, .max] {
                let bytes = player.payload(device: 0, sequence: sequence)
                #expect(bytes.count == target, "payload-bytes \(target), sequence \(sequence)")
                let content = try bytes.withUnsafeBytes { ActivityPayloadContent(try ActivityPayload.validate($0, limits: limits)) }
                #expect(content.userInfo["position"] == .int(Int64(sequence)))
                #expect(content.title == "Chapter 3")
                if case .array = content.userInfo["padding"] { arrays += 1 }
            }
        }
        // The two sizes a data value's head skips were among them (docs/simulator.md).
        #expect(arrays > 0)
    }

    @Test func theNaturalPayloadFollowsTheDevice() throws {
        let s = Scenario(duration: 60, rooms: threeRooms, devices: [
            Scenario.Device(id: 1, name: "ann's phone", type: "com.example.reader.article", webURL: true, place: .room("hall"),
                            script: [Scenario.Step(at: 10, .becomeCurrent("com.example.video.watch"))]),
        ])
        let player = ScenarioPlayer(s)
        #expect(player.deviceIndex(id: 1) == 0 && player.deviceIndex(id: 2) == nil)
        func content() throws -> ActivityPayloadContent {
            let bytes = player.payload(device: 0, sequence: player.sequence(device: 0))
            return try bytes.withUnsafeBytes { ActivityPayloadContent(try ActivityPayload.validate($0)) }
        }
        // The title defaults to the name; the URL carries the name percent-encoded.
        #expect(try content() == ActivityPayloadContent(activityType: "com.example.reader.article", title: "ann's phone",
                                                       webpageURL: "https://example.com/ann%27s%20phone",
                                                       userInfo: ["position": .int(1)]))
        player.advance(to: 11_000_000, hear: { _, _ in }, event: { _ in })
        #expect(player.sequence(device: 0) == 2)
        #expect(try content().activityType == "com.example.video.watch")
        #expect(try content().userInfo["position"] == .int(2))
    }
}
