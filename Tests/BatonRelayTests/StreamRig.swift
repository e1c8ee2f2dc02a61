// What the two stream suites share (StreamRelayTests: this gateway carries a stream to its
// device; StreamBridgeTests: it bridges one for a phone in its room): the frames as the spec
// writes them, and the RelayRig (RelayHarness.swift) with a StreamRelay. Each suite's rig says
// what its clients subscribe and what a message means to them.

import BatonLibc
import Glibc
import Testing
import BatonMQTT
import BatonWire
import BatonTestSupport
import BatonRelay

// MARK: - Frames as the spec writes them

func utf8(_ text: String) -> [UInt8] { Array(text.utf8) }

/// An error frame (§5.1 `15`): reason `reason` (§5.4), then a detail of at most 100 bytes of
/// UTF-8 that says `text`.
func expectError(_ f: [UInt8]?, _ reason: StreamReason, saying text: String,
                 sourceLocation: SourceLocation = #_sourceLocation) {
    guard let f, f.count >= 2 else {
        Issue.record("expected error \(reason.name), got \(f.map(hexString) ?? "nothing")", sourceLocation: sourceLocation)
        return
    }
    #expect(Array(f.prefix(2)) == [0x15, reason.rawValue], "error \(reason.name): \(hexString(f))", sourceLocation: sourceLocation)
    let detail = String(decoding: f.dropFirst(2), as: UTF8.self)
    #expect(f.count - 2 <= 100, "a detail of at most 100 bytes (§5.1)", sourceLocation: sourceLocation)
    #expect(detail.contains(text), "detail: \(detail)", sourceLocation: sourceLocation)
}

/// docs/relay.md §7.1 under the prefix `baton`.
func topics(_ id: String) -> StreamTopics {
    StreamTopics(up: "baton/streams/\(id)/up", down: "baton/streams/\(id)/down", gateway: "baton/streams/\(id)/gateway")
}

/// Opens the relay refused for `reason` (stats `relay.streams.refused`).
func refused(_ relay: borrowing StreamRelay, _ reason: StreamReason) -> Int {
    relay.counters.refused[Int(reason.rawValue)]
}

// MARK: - The rig

/// The stream suites' RelayRig (RelayHarness.swift): its relay a StreamRelay on the devices'
/// links, on the test's clock, and the clients quick to reconnect.
class StreamRig: RelayRig {
    var relay: StreamRelay

    init(_ config: RelayConfig, gatewayID: String, peerID: String) throws {
        let devices = Devices()
        relay = StreamRelay(config: config, link: AnyDeviceLink(TestLink(devices: devices)), gatewayID: gatewayID)
        // A quick reconnect after the broker restart of the reconnect tests; the relay's
        // deadlines are on the test's clock, not the wall clock: its links are a part without a
        // deadline, it is served every turn, and a turn is at most 100 ms.
        try super.init(devices: devices, gatewayID: gatewayID, peerID: peerID,
                       reconnect: (.milliseconds(50), .milliseconds(500)), longestWait: .milliseconds(100))
    }

    override func addRelay(_ driver: inout PollLoop) -> LoopSlot {
        var relayLinks = DescriptorList()
        relay.pollDescriptors(into: &relayLinks.fds)
        return driver.add(&relayLinks)
    }

    override func serveRelay(_ ready: ArraySlice<pollfd>, after: Instant) { relay.serve(ready, now: now, mqtt: &gateway) }

    /// Drops counted under `reason` (stats `relay.streams.drops`).
    func drops(_ reason: String) -> Int { relay.drops.sorted.first { $0.reason == reason }?.count ?? 0 }

    /// Links the relay holds open (its descriptors to poll).
    var relayLinks: Int {
        var fds: [pollfd] = []
        relay.pollDescriptors(into: &fds)
        return fds.count
    }
}
