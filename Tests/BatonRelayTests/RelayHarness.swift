// The far ends of the relays' device links, played by the tests byte for byte, and the rig
// every relay suite turns (FetchRelayTests, ContinuingLinksTests and the stream suites).
//
// A relay gets a `DeviceLink` whose `connect` makes a SOCK_SEQPACKET socketpair: the relay's
// end is a connecting `LinkChannel` (it opens on the first POLLOUT, as an L2CAP
// channel does), the test keeps the device's end. On it the test reads the link messages the
// relay sends and writes the device's as literal bytes (docs/protocol.md §5.1), or stays
// silent, or hangs up.

import BatonLibc
import Glibc
import CBlueZ  // its shim includes <sys/socket.h>: import it so SOCK_SEQPACKET has one owner
import Testing
import BatonHCI
import BatonMQTT
import BatonRelay
import BatonTestSupport

// MARK: - The devices, played by the test

/// The far ends of the relay's links. Each `connect` makes a socketpair; the device's end is
/// non-blocking and close-on-exec (tests in parallel spawn brokers: a child holding a copy of
/// a descriptor would keep a link open), and hangs up with shutdown() at the end.
final class Devices {
    struct End {
        let address: UInt64
        let fd: Int32
        /// Every record the relay sent on this link, in order.
        var received: [[UInt8]] = []
        /// The relay closed its end (EOF), or the test hung up this one.
        var closed = false
    }
    private(set) var ends: [End] = []
    /// `connect` throws this for an address, as a device out of range makes a link fail.
    var refuse: [UInt64: LinkError] = [:]
    /// While true the devices read nothing: the relay's sends fill the link until it refuses
    /// them, as an L2CAP channel without credits does.
    var paused = false
    /// SO_SNDBUF of the relay's end of new links: a connected Unix pair is bounded only by the
    /// sender's buffer, so a small one makes the link refuse after a few frames.
    var sendBuffer: Int32?

    deinit {
        for e in ends {
            shutdown(e.fd, Int32(SHUT_RDWR))
            close(e.fd)
        }
    }

    func connect(_ device: LinkAddress) throws(LinkError) -> LinkChannel {
        if let error = refuse[device.address] { throw error }
        let pair = try makePair(device)
        // The channel makes its end non-blocking itself (LinkChannel.init).
        return LinkChannel(fd: pair[0], sendMTU: 65_535)
    }

    /// A socketpair for a link to `address`: the far end kept here (non-blocking), the near
    /// end returned with `sendBuffer` applied.
    func makePair(_ address: LinkAddress) throws(LinkError) -> [Int32] {
        var pair: [Int32] = [-1, -1]
        let type = Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        guard socketpair(AF_UNIX, type, 0, &pair) == 0 else { throw .os(Errno(Glibc.errno, call: "socketpair")) }
        _ = Glibc.fcntl(pair[1], F_SETFL, Glibc.fcntl(pair[1], F_GETFL) | O_NONBLOCK)
        if var size = sendBuffer {
            _ = setsockopt(pair[0], SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        ends.append(End(address: address.address, fd: pair[1]))
        return pair
    }

    /// Reads whatever the relay sent on every open link; never blocks.
    func pump() {
        guard !paused else { return }
        var buffer = [UInt8](repeating: 0, count: 70_000)
        for i in ends.indices where !ends[i].closed {
            while true {
                let n = buffer.withUnsafeMutableBytes { recv(ends[i].fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
                if n > 0 {
                    ends[i].received.append(Array(buffer[..<n]))
                } else {
                    if n == 0 || (Glibc.errno != EAGAIN && Glibc.errno != EWOULDBLOCK) { ends[i].closed = true }
                    break
                }
            }
        }
    }

    /// The descriptors to wake the loop for: a record from the relay, or its hang-up.
    var pollDescriptors: [pollfd] {
        ends.filter { !$0.closed }.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
    }

    /// Every record the relay sent to `device`, over all its links.
    func received(_ device: LinkAddress) -> [[UInt8]] {
        ends.filter { $0.address == device.address }.flatMap(\.received)
    }

    /// Links the relay opened to `device`.
    func links(_ device: LinkAddress) -> Int { ends.count(where: { $0.address == device.address }) }

    /// The device's newest link has been closed by the relay.
    func isClosed(_ device: LinkAddress) -> Bool {
        ends.last { $0.address == device.address }?.closed ?? false
    }

    /// The device writes one link message on its newest link.
    func send(_ device: LinkAddress, _ message: [UInt8]) throws {
        let end = try #require(ends.last { $0.address == device.address }, "the relay opened no link to \(device)")
        let n = message.withUnsafeBytes { Glibc.send(end.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        try #require(n == message.count, "the device's send: \(String(cString: strerror(Glibc.errno)))")
    }

    /// The device hangs up its newest link.
    func hangUp(_ device: LinkAddress) throws {
        let i = try #require(ends.lastIndex { $0.address == device.address })
        shutdown(ends[i].fd, Int32(SHUT_RDWR))
        ends[i].closed = true
    }
}

struct TestLink: DeviceLink {
    let devices: Devices
    func connect(to device: LinkAddress) throws(LinkError) -> LinkChannel { try devices.connect(device) }
    var description: String { "test socketpair" }
}



// MARK: - Phones that open links to the gateway (docs/relay.md §7.5)

extension Devices {
    /// A phone in the gateway's room opens a link to a re-advertised activity: the gateway's
    /// listener accepted it, so the gateway's end is open at once (`LinkChannel(accepted:)`).
    /// The phone's end is kept like a device's: `received`, `send`, `hangUp`, `paused` and
    /// `sendBuffer` (SO_SNDBUF of the gateway's end) work on it by the phone's address.
    func accept(_ phone: LinkAddress) throws(LinkError) -> LinkChannel {
        let pair = try makePair(phone)
        return LinkChannel(accepted: pair[0], peer: phone, l2cap: false)
    }
}

// MARK: - The rig: broker, gateway client, the other side's client, the far ends, one poll loop

/// A real mosquitto, the gateway's client and the other side's (`peer`: the requester, the
/// owner, the endpoint or the carrier), the far ends of the links (`devices`), the relay's clock
/// and the loop that turns them as Gateway.swift does. A suite's rig adds its relay to the loop
/// (`addRelay`, `serveRelay`) and says what its clients subscribe and what a message means.
///
/// The clock is the test's: `now` moves only when a test says `advance`, so a retry or an idle
/// timeout happens exactly when the test moves time past it, however slow the machine.
class RelayRig {
    let broker: MosquittoBroker
    /// The far ends: the links the relay opens to devices, or the phones' (RelayHarness.swift).
    let devices: Devices
    var gateway: MQTTClient
    var peer: MQTTClient
    /// The relay's time: moves only by `advance`.
    private(set) var now: Instant
    /// The longest a turn of the loop waits.
    private let longestWait: Duration
    /// Probes that came back (a subscription is in place once a message published after it
    /// comes back: there is no SUBACK event).
    private var probes: Set<String> = []
    private(set) var lateProbes = 0
    private(set) var gatewayConnects = 0
    private(set) var peerConnects = 0

    /// Both clients speak MQTT v5; `reconnect` is their backoff (min, max), the library's when nil.
    init(devices: Devices, gatewayID: String, peerID: String, reconnect: (min: Duration, max: Duration)? = nil,
         longestWait: Duration) throws {
        self.devices = devices
        self.longestWait = longestWait
        let broker = try MosquittoBroker()
        self.broker = broker
        func config(_ id: String) -> MQTTConfig {
            var c = MQTTConfig(port: broker.port, clientID: id, protocolVersion: .v5)
            if let reconnect { (c.reconnectMin, c.reconnectMax) = reconnect }
            return c
        }
        gateway = try MQTTClient(config: config(gatewayID))
        peer = try MQTTClient(config: config(peerID))
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
                   sourceLocation: SourceLocation = #_sourceLocation) throws {
        try #require(run { gateway.isConnected && peer.isConnected }, "the clients did not connect to mosquitto",
                     sourceLocation: sourceLocation)
        probes.removeAll()
        for (topic, rap) in gatewayTopics { try gateway.subscribe(topic, qos: 1, retainAsPublished: rap) }
        try gateway.subscribe("probe/gateway", qos: 1)
        for topic in peerTopics { try peer.subscribe(topic, qos: 1) }
        try peer.subscribe("probe/peer", qos: 1)
        try Array("probe".utf8).withUnsafeBytes {
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
        try Array("late".utf8).withUnsafeBytes { try peer.publish(topic: "probe/gateway", payload: $0, qos: 1) }
        try #require(run { lateProbes > before }, "the probe did not come back")
    }

    // MARK: what a suite says

    /// A message on a topic the gateway subscribed, probes aside.
    func gatewayMessage(_ m: MQTTMessage) {}
    /// A message on a topic the peer subscribed, probes aside.
    func peerMessage(_ m: MQTTMessage) {}
    /// The far ends the loop wakes for besides the relay's own links.
    func linkEnds() -> [pollfd] { devices.pollDescriptors }
    /// Reads what the relay sent on those ends; never blocks.
    func pump() { devices.pump() }
    /// Adds the relay to the loop's driver.
    func addRelay(_ driver: inout PollLoop) -> LoopSlot { driver.add(deadline: nil) }
    /// Serves the relay what its part got; `after` is when the wait ended.
    func serveRelay(_ ready: ArraySlice<pollfd>, after: Instant) {}

    // MARK: the loop

    /// Turns as Gateway.swift does (TestLoop); returns whether `done()` held within `limit`.
    @discardableResult
    func run(limit: Duration = .seconds(10), until done: () -> Bool) -> Bool {
        var loop = TestLoop(parts: 4, longestWait: longestWait)
        return loop.run(limit: limit, before: { pump() }, until: done) { driver in
            let g = driver.add(&gateway)
            let p = driver.add(&peer)
            let relay = addRelay(&driver)
            var ends = DescriptorList(linkEnds())
            driver.add(&ends)
            let after = driver.wait()
            // Each client's events are handled once its poll is done: a peer that answers a
            // message publishes on its own client.
            var gatewayEvents: [MQTTEvent] = [], peerEvents: [MQTTEvent] = []
            gateway.poll(now: after, ready: driver.ready(g)) { gatewayEvents.append($0) }
            peer.poll(now: after, ready: driver.ready(p)) { peerEvents.append($0) }
            for e in peerEvents { peerEvent(e) }
            // As Gateway.swift: the broker's messages, then the links and what is due.
            for e in gatewayEvents { gatewayEvent(e) }
            serveRelay(driver.ready(relay), after: after)
        }
    }

    private func gatewayEvent(_ event: MQTTEvent) {
        switch event {
        case .connected:
            gatewayConnects += 1
        case .message(let m) where m.topic == "probe/gateway":
            if m.payload == Array("late".utf8) { lateProbes += 1 } else { probes.insert(m.topic) }
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

    /// A bounded moment of the loop with nothing to wait for: a stray frame or answer would come now.
    func settle() { run(limit: .milliseconds(300)) { false } }
}
