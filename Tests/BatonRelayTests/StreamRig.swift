// What the two stream suites share (StreamRelayTests: this gateway carries a stream to its
// device; StreamBridgeTests: it bridges one for a phone in its room): the frames as the spec
// writes them, and one rig of a real mosquitto, the gateway's client with its StreamRelay, the
// other side's client, the devices' link ends, the relay's clock and the loop that turns them
// as Gateway.swift does. Each suite's rig says what its clients subscribe and what a message
// means to them.

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

/// The relay's clock is the test's: `now` moves only when a test says `advance`, so a retry or
/// an idle timeout happens exactly when the test moves time past it, however slow the machine.
class StreamRig {
    let broker: MosquittoBroker
    /// The links the relay opens to devices (RelayHarness.swift).
    let devices = Devices()
    var relay: StreamRelay
    var gateway: MQTTClient
    /// The other side's client: the endpoint (StreamRelayTests) or the carrier (StreamBridgeTests).
    var peer: MQTTClient
    /// The relay's time: moves only by `advance`.
    private(set) var now: Instant
    /// Probes that came back (a subscription is in place once a message published after it
    /// comes back: there is no SUBACK event).
    private var probes: Set<String> = []
    private(set) var lateProbes = 0
    private(set) var gatewayConnects = 0
    private(set) var peerConnects = 0

    init(_ config: RelayConfig, gatewayID: String, peerID: String) throws {
        broker = try MosquittoBroker()
        relay = StreamRelay(config: config, link: AnyDeviceLink(TestLink(devices: devices)), gatewayID: gatewayID)
        // A quick reconnect after the broker restart of the reconnect tests.
        gateway = try MQTTClient(config: MQTTConfig(port: broker.port, clientID: gatewayID, protocolVersion: .v5,
                                                    reconnectMin: .milliseconds(50), reconnectMax: .milliseconds(500)))
        peer = try MQTTClient(config: MQTTConfig(port: broker.port, clientID: peerID, protocolVersion: .v5,
                                                 reconnectMin: .milliseconds(50), reconnectMax: .milliseconds(500)))
        now = .now
        gateway.start(now: .now)
        peer.start(now: .now)
    }

    deinit {
        gateway.disconnect()
        peer.disconnect()
    }

    /// Both clients connected and subscribed, the gateway to `gatewayTopics` (each with
    /// retain-as-published or not) and the peer to `peerTopics`, with QoS 1 (the session is
    /// clean: again after every reconnect).
    func subscribe(gateway gatewayTopics: [(String, retainAsPublished: Bool)], peer peerTopics: [String],
                   sourceLocation: SourceLocation) throws {
        try #require(run { gateway.isConnected && peer.isConnected }, "the clients did not connect to mosquitto",
                     sourceLocation: sourceLocation)
        probes.removeAll()
        for (topic, rap) in gatewayTopics { try gateway.subscribe(topic, qos: 1, retainAsPublished: rap) }
        try gateway.subscribe("probe/gateway", qos: 1)
        for topic in peerTopics { try peer.subscribe(topic, qos: 1) }
        try peer.subscribe("probe/peer", qos: 1)
        try utf8("probe").withUnsafeBytes {
            try gateway.publish(topic: "probe/gateway", payload: $0, qos: 1)
            try peer.publish(topic: "probe/peer", payload: $0, qos: 1)
        }
        try #require(run { probes.count == 2 }, "the subscriptions did not take effect", sourceLocation: sourceLocation)
    }

    /// The relay's clock moves on; the next turn of the loop ticks at the new time.
    func advance(_ d: Duration) { now += d }

    /// The peer publishes on `probe/gateway`; once it arrives, whatever the peer published
    /// before it to a topic the gateway subscribes has arrived too.
    func lateProbe() throws {
        let before = lateProbes
        try utf8("late").withUnsafeBytes { try peer.publish(topic: "probe/gateway", payload: $0, qos: 1) }
        try #require(run { lateProbes > before }, "the probe did not come back")
    }

    // MARK: what a suite says

    /// A message on a topic the gateway subscribed, probes aside.
    func gatewayMessage(_ m: MQTTMessage) {}
    /// A message on a topic the peer subscribed, probes aside.
    func peerMessage(_ m: MQTTMessage) {}
    /// The link ends the loop wakes for besides the relay's own links.
    func linkEnds() -> [pollfd] { devices.pollDescriptors }
    /// Reads what the relay sent on those ends; never blocks.
    func pump() { devices.pump() }

    // MARK: the loop

    /// Turns as Gateway.swift does (TestLoop); returns whether `done()` held within `limit`.
    @discardableResult
    func run(limit: Duration = .seconds(10), until done: () -> Bool) -> Bool {
        // The gateway's driver. The relay's deadlines are on the test's clock, not the wall
        // clock: its links are a part without a deadline, it is served every turn, and a turn
        // is at most 100 ms.
        var loop = TestLoop(parts: 4, longestWait: .milliseconds(100))
        return loop.run(limit: limit, before: { pump() }, until: done) { driver in
            let g = driver.add(&gateway)
            let p = driver.add(&peer)
            var relayLinks = DescriptorList()
            relay.pollDescriptors(into: &relayLinks.fds)
            let links = driver.add(&relayLinks)
            var ends = DescriptorList(linkEnds())
            driver.add(&ends)
            let after = driver.wait()
            var events: [MQTTEvent] = []
            gateway.poll(now: after, ready: driver.ready(g)) { events.append($0) }
            peer.poll(now: after, ready: driver.ready(p)) { peerEvent($0) }
            // As Gateway.swift: the broker's messages, then the links and what is due.
            for e in events { gatewayEvent(e) }
            relay.serve(driver.ready(links), now: now, mqtt: &gateway)
        }
    }

    private func gatewayEvent(_ event: MQTTEvent) {
        switch event {
        case .connected:
            gatewayConnects += 1
        case .message(let m) where m.topic == "probe/gateway":
            if m.payload == utf8("late") { lateProbes += 1 } else { probes.insert(m.topic) }
        case .message(let m):
            gatewayMessage(m)
        default:
            break
        }
    }

    private func peerEvent(_ event: MQTTEvent) {
        switch event {
        case .connected:
            peerConnects += 1
        case .message(let m) where m.topic == "probe/peer":
            probes.insert(m.topic)
        case .message(let m):
            peerMessage(m)
        default:
            break
        }
    }

    // MARK: waiting

    /// A bounded moment of the loop with nothing to wait for: a stray frame would come now.
    func settle() { run(limit: .milliseconds(300)) { false } }

    /// Drops counted under `reason` (stats `relay.streams.drops`).
    func drops(_ reason: String) -> Int { relay.drops.sorted.first { $0.reason == reason }?.count ?? 0 }

    /// Links the relay holds open (its descriptors to poll).
    var relayLinks: Int {
        var fds: [pollfd] = []
        relay.pollDescriptors(into: &fds)
        return fds.count
    }
}
