// A phone's link to an activity this gateway re-advertises (docs/relay.md §9), against a real
// mosquitto. The phone is the test's end of a SOCK_SEQPACKET socketpair and writes link
// messages in bytes (docs/protocol.md §5.1); the owning gateway is an MQTT client the test
// plays: it reads the fetch requests on `baton/fetch/+` and answers them as relay.md §3 says.
//
//   phone --fetch(seq)--> ContinuingLinks (gateway "office") --baton/fetch/<device>--> owner (test)
//   phone <--payload / fetch-refused--                       <--baton/answers/office/<link>--
//
// The links' clock is the test's: it moves only by `advance`, so a deadline passes exactly
// when the test says, however slow the machine.

import BatonLibc
import CBlueZ  // its shim includes <sys/socket.h>: import it so SOCK_SEQPACKET has one owner
import Foundation
import Glibc
import Testing
import BatonMQTT
import BatonWire
import BatonTestSupport
import BatonRelay

/// Dave's phone's activity, as the owner publishes it: `7cec72260004`.
private let device: UInt64 = 0x7CEC_7226_0004

/// The RelayRig (RelayHarness.swift) as the office: its ContinuingLinks (and the StreamRelay a
/// stream link goes to) on the test's clock, the owner as the peer, the phones as the far ends.
private final class Rig: RelayRig {
    var links: ContinuingLinks
    var streams: StreamRelay
    var owner: MQTTClient {
        _read { yield peer }
        _modify { yield &peer }
    }
    /// The phones' ends (the rig's `devices`), in the order they connected: phone i at address i.
    private var phoneEnds: Devices { devices }
    var phones: [Int32] { phoneEnds.ends.map(\.fd) }
    /// What each phone received, in order; whether the gateway hung up on it.
    var received: [[[UInt8]]] { phoneEnds.ends.map(\.received) }
    var hungUp: [Bool] { phoneEnds.ends.map(\.closed) }
    /// While true the phones read nothing.
    var paused: Bool {
        get { phoneEnds.paused }
        set { phoneEnds.paused = newValue }
    }
    /// The fetch requests the owner saw.
    private(set) var requests: [MQTTMessage] = []
    /// What the owner answers each request with (nil: it stays silent).
    var answer: ((MQTTMessage) -> (status: String, seq: UInt16?, payload: [UInt8])?)?
    /// Every stream open the owner saw (`baton/stream/<device>/<id>`).
    private(set) var opens: [MQTTMessage] = []
    let topics = Topics(prefix: "baton", discoveryPrefix: "homeassistant", gatewayID: "office")

    init(_ config: RelayConfig = RelayConfig()) throws {
        links = ContinuingLinks(config: config, topics: topics, room: #"Dave's "office""#)
        streams = StreamRelay(config: config, link: nil, gatewayID: "office")
        // The links' deadlines are on the test's clock, so their descriptors are a part
        // without one, and a turn waits at most 50 ms.
        try super.init(devices: Devices(), gatewayID: "office", peerID: "hall", longestWait: .milliseconds(50))
        try subscribe(gateway: [(links.answerPattern, false)], peer: ["baton/fetch/+", "baton/stream/+/+"])
    }

    /// A phone connects to the re-advertised activity; the gateway's end of the link is adopted
    /// as a listener's accept would hand it over. `mtu`: what the gateway may send the phone.
    @discardableResult
    func connectPhone(mtu: Int = 65_535, sendBuffer: Int32? = nil) throws -> (index: Int, adopted: Bool) {
        // A connected Unix pair is bounded by the sender's buffer: a small one makes the link
        // refuse after a few answers, as an L2CAP channel out of credits does.
        phoneEnds.sendBuffer = sendBuffer
        let pair = try phoneEnds.makePair(LinkAddress(address: UInt64(phones.count), addressType: 1, psm: 0))
        let adopted = links.adopt(LinkChannel(accepted: pair[0], peer: nil, l2cap: false, sendMTU: mtu), device: device, now: now)
        return (phones.count - 1, adopted)
    }

    func phoneSends(_ phone: Int, _ message: [UInt8]) throws {
        let n = message.withUnsafeBytes { send(phones[phone], $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        try #require(n == message.count)
    }

    override func addRelay(_ driver: inout PollLoop) -> LoopSlot {
        var phoneLinks = DescriptorList()
        links.pollDescriptors(into: &phoneLinks.fds)
        return driver.add(&phoneLinks)
    }

    override func serveRelay(_ ready: ArraySlice<pollfd>, after: Instant) {
        links.serve(ready, now: now, mqtt: &gateway, streams: &streams)
    }

    /// An answer to one of the links' requests.
    override func gatewayMessage(_ m: MQTTMessage) {
        let p = m.properties
        guard case .answer(let link) = topics.classify(m.topic) else { return }
        links.answered(link: link, correlation: p.correlationData ?? [],
                       status: p.userProperties.first { $0.name == "status" }?.value ?? "?",
                       sequence: p.userProperties.first { $0.name == "seq" }.flatMap { UInt16($0.value) },
                       payload: m.payload, now: now)
    }

    /// The owner answers as FetchRelay would (docs/relay.md §3, the v5 form).
    override func peerMessage(_ m: MQTTMessage) {
        if m.topic.hasPrefix("baton/stream/") { opens.append(m); return }
        requests.append(m)
        guard let a = answer?(m), let topic = m.properties.responseTopic else { return }
        var user = [MQTTUserProperty("status", a.status), MQTTUserProperty("gateway", "hall")]
        if let seq = a.seq { user.append(MQTTUserProperty("seq", String(seq))) }
        let body = a.status == "ok" ? a.payload : Array(#"{"status":"\#(a.status)","detail":"x"}"#.utf8)
        _ = try? body.withUnsafeBytes {
            try owner.publish(topic: topic, payload: $0, qos: 1, retain: false,
                              properties: MQTTProperties(contentType: a.status == "ok" ? "application/cbor" : "application/json",
                                                         correlationData: m.properties.correlationData, userProperties: user))
        }
    }

    func waitPhone(_ phone: Int, _ count: Int, sourceLocation: SourceLocation = #_sourceLocation) throws {
        try #require(run { received[phone].count >= count },
                     "the phone got \(received[phone].map(hexString)), not \(count) message(s)", sourceLocation: sourceLocation)
    }

    func drops(_ reason: String) -> Int { links.drops.sorted.first { $0.reason == reason }?.count ?? 0 }
}

@Suite("A phone continues a re-advertised activity through this gateway (docs/relay.md §9)")
struct ContinuingLinksTests {
    @Test("§9: the phone's fetch(seq) becomes a request to the owner, routed both ways and saying it continues here; the owner's payload reaches the phone as payload(seq, bytes)")
    func fetchThroughTheBroker() throws {
        let rig = try Rig()
        let payload = hx("A3 01 01 02 78 1A") + Array("com.example.notes.edit".utf8)  // any bytes: relayed as they are
        rig.answer = { _ in ("ok", 0x0103, payload) }
        let phone = try rig.connectPhone()
        try rig.phoneSends(phone.index, hx("01 0201"))  // fetch, seq 0x0102
        try rig.waitPhone(phone.index, 1)
        #expect(rig.received[phone.index] == [hx("02 0301") + payload], "payload, the owner's seq 0x0103, the bytes")

        let request = try #require(rig.requests.first)
        #expect(request.topic == "baton/fetch/7cec72260004")
        // The link's own response topic: this gateway's answers, then a number of the link's.
        let topic = try #require(request.properties.responseTopic)
        #expect(topic.hasPrefix("baton/answers/office/") && UInt64(topic.dropFirst("baton/answers/office/".count)) != nil, "\(topic)")
        let correlation = try #require(request.properties.correlationData)
        #expect(correlation.count == 8)
        let body = try #require(JSONSerialization.jsonObject(with: Data(request.payload)) as? [String: String])
        // The v3.1.1 route too, and the room without the characters the body may not escape.
        #expect(body == ["response_topic": topic, "correlation": hexString(correlation),
                         "format": "cbor", "continue": "Dave's office"])
        #expect(rig.links.counters.fetches == 1 && rig.links.counters.payloads == 1)

        // The same link fetches again: a new correlation, the same response topic.
        try rig.phoneSends(phone.index, hx("01 0301"))
        try rig.waitPhone(phone.index, 2)
        #expect(rig.requests.count == 2)
        #expect(rig.requests[1].properties.correlationData != correlation)
        #expect(rig.requests[1].properties.responseTopic == topic)
        // A second phone has a topic of its own: the owner must not take it for a retry of the
        // first phone's request and answer that one `cancelled` (docs/relay.md §4).
        let other = try rig.connectPhone()
        try rig.phoneSends(other.index, hx("01 0201"))
        try rig.waitPhone(other.index, 1)
        #expect(rig.requests[2].properties.responseTopic != topic)
    }

    @Test("§9: the owner's refusals in the device's words: unknown-device → not current (01), too-large → too large (02), anything else → refused (03)")
    func refusals() throws {
        let rig = try Rig()
        let statuses = ["unknown-device", "too-large", "not-owner", "unreachable", "timeout", "busy"]
        var next = 0
        rig.answer = { _ in defer { next += 1 }; return (statuses[next], nil, []) }
        let phone = try rig.connectPhone()
        for (i, _) in statuses.enumerated() {
            try rig.phoneSends(phone.index, hx("01 0201"))
            try rig.waitPhone(phone.index, i + 1)
        }
        #expect(rig.received[phone.index] == [hx("03 0201 01"), hx("03 0201 02"), hx("03 0201 03"),
                                               hx("03 0201 03"), hx("03 0201 03"), hx("03 0201 03")])
        #expect(rig.links.counters.refusals == 6)
    }

    @Test("§9: a payload larger than the phone's MTU is refused as too large (02), as the device itself would")
    func largerThanThePhonesMTU() throws {
        let rig = try Rig()
        rig.answer = { _ in ("ok", 0x0102, [UInt8](repeating: 0xAB, count: 200)) }
        let phone = try rig.connectPhone(mtu: 100)
        try rig.phoneSends(phone.index, hx("01 0201"))
        try rig.waitPhone(phone.index, 1)
        #expect(rig.received[phone.index] == [hx("03 0201 02")])
    }

    @Test("§9: a phone that does not read: the answer the link has no room for waits and goes when it reads (POLLOUT); a newer answer replaces it; none is called too large")
    func phoneNotReading() throws {
        let rig = try Rig()
        // Unowned: the rig keeps this closure, and a closure keeping the rig would keep its
        // mosquitto running after the suite (issue 20).
        rig.answer = { [unowned rig] m in
            let seq = UInt16(rig.requests.count)
            return ("ok", seq, [UInt8](repeating: UInt8(truncatingIfNeeded: seq), count: 2_000))
        }
        let phone = try rig.connectPhone(sendBuffer: 4_096)
        rig.paused = true
        for i in 1...8 {
            try rig.phoneSends(phone.index, hx("01 0201"))
            try #require(rig.run { rig.links.counters.payloads == i }, "answer \(i) was not taken")
        }
        #expect(rig.links.counters.refusals == 0)
        rig.paused = false
        try #require(rig.run { rig.received[phone.index].last?.prefix(3) == [0x02, 0x08, 0x00] }, "the newest answer (seq 8) did not arrive")
        let seqs = rig.received[phone.index].map { Int($0[1]) | Int($0[2]) << 8 }
        #expect(rig.received[phone.index].allSatisfy { $0.first == 0x02 && $0.count == 2_003 })
        #expect(seqs == seqs.sorted() && Set(seqs).count == seqs.count, "in order, none twice: \(seqs)")
        #expect(seqs.count < 8, "the link filled up: some answer waited and was replaced (\(seqs))")
    }

    @Test("§9: an owner that never answers: the phone is told refused (03) once relay.fetch-timeout + 1 s have passed, not before; a late answer is dropped")
    func noAnswer() throws {
        let rig = try Rig(RelayConfig(fetchTimeout: .seconds(2)))
        let phone = try rig.connectPhone()
        try rig.phoneSends(phone.index, hx("01 0201"))
        try #require(rig.run { rig.requests.count == 1 })
        rig.advance(.milliseconds(2_900))
        rig.run(limit: .milliseconds(300)) { false }
        #expect(rig.received[phone.index].isEmpty, "nothing before the deadline")
        rig.advance(.milliseconds(200))
        try rig.waitPhone(phone.index, 1)
        #expect(rig.received[phone.index] == [hx("03 0201 03")])
        #expect(rig.drops("continuing-timeout") == 1)
        // The owner answers after all: not the phone's any more.
        let request = rig.requests[0]
        try Array("late".utf8).withUnsafeBytes {
            try rig.owner.publish(topic: request.properties.responseTopic!, payload: $0, qos: 1, retain: false,
                                  properties: MQTTProperties(correlationData: request.properties.correlationData,
                                                             userProperties: [MQTTUserProperty("status", "ok"), MQTTUserProperty("seq", "258")]))
        }
        try #require(rig.run { rig.drops("continuing-answer-unknown") == 1 })
        #expect(rig.received[phone.index].count == 1)
    }

    @Test("§9: a phone that sends what a phone never sends (a payload, a malformed message) is hung up and counted; the others are served")
    func garbage() throws {
        let rig = try Rig()
        rig.answer = { _ in ("ok", 0x0102, [0xA0]) }
        let bad = try rig.connectPhone()
        let malformed = try rig.connectPhone()
        let good = try rig.connectPhone()
        try rig.phoneSends(bad.index, hx("02 0201 A0"))
        try rig.phoneSends(malformed.index, hx("01 02"))
        try rig.phoneSends(good.index, hx("01 0201"))
        try #require(rig.run { rig.hungUp[bad.index] && rig.hungUp[malformed.index] && rig.received[good.index].count == 1 })
        #expect(rig.received[good.index] == [hx("02 0201 A0")])
        #expect(rig.drops("continuing-unexpected") == 1)
        #expect(rig.drops("truncated") == 1)
        #expect(rig.links.openLinks == 1)
    }

    @Test("§9, §7.5: a link whose first message is open is a stream link: the stream relay takes it and asks the owner on baton/stream/<device>/<id>; an open after a fetch is not a stream and hangs up")
    func streamLink() throws {
        let rig = try Rig()
        let phone = try rig.connectPhone()
        try rig.phoneSends(phone.index, hx("10 0800 0004"))  // open: window 8, max data 1024
        try #require(rig.run { rig.opens.count == 1 }, "no stream open reached the owner")
        let open = rig.opens[0]
        let levels = open.topic.split(separator: "/").map(String.init)
        #expect(levels.count == 4 && levels[1] == "stream" && levels[2] == "7cec72260004")
        #expect(levels[3].count == 16 && levels[3].allSatisfy(\.isHexDigit), "a stream id of 16 hex digits: \(levels[3])")
        #expect(open.payload == hx("10 0800 0004"))
        #expect(rig.links.counters.streams == 1)
        #expect(rig.links.openLinks == 0, "the link is the stream relay's now")
        #expect(rig.streams.openCount == 1)

        let fetchFirst = try rig.connectPhone()
        rig.answer = { _ in ("ok", 0x0102, [0xA0]) }
        try rig.phoneSends(fetchFirst.index, hx("01 0201"))
        try rig.waitPhone(fetchFirst.index, 1)
        try rig.phoneSends(fetchFirst.index, hx("10 0800 0004"))
        try #require(rig.run { rig.hungUp[fetchFirst.index] })
        #expect(rig.drops("continuing-unexpected") == 1)
        #expect(rig.opens.count == 1)
    }

    @Test("§9: a phone that says open and hangs up in the same breath starts no stream: nothing is asked of the owner")
    func openAndGone() throws {
        let rig = try Rig()
        let phone = try rig.connectPhone()
        try rig.phoneSends(phone.index, hx("10 0800 0004"))
        shutdown(rig.phones[phone.index], Int32(SHUT_RDWR))
        try #require(rig.run { rig.links.openLinks == 0 })
        rig.run(limit: .milliseconds(300)) { false }
        #expect(rig.opens.isEmpty, "the owner was asked to open a stream for a phone that left")
        #expect(rig.streams.openCount == 0)
        #expect(rig.drops("continuing-gone-before-open") == 1)
    }

    @Test("Capacity: relay.links phone links at once; one more is hung up and counted, and a freed slot takes the next")
    func capacity() throws {
        let rig = try Rig(RelayConfig(links: 2))
        #expect(try rig.connectPhone().adopted)
        #expect(try rig.connectPhone().adopted)
        let third = try rig.connectPhone()
        #expect(!third.adopted)
        try #require(rig.run { rig.hungUp[third.index] })
        #expect(rig.drops("continuing-full") == 1)
        #expect(rig.links.counters.refused == 1)
        // The first phone goes idle past relay.link-idle: hung up, and its slot is free again.
        rig.advance(.seconds(11))
        try #require(rig.run { rig.hungUp[0] && rig.hungUp[1] })
        #expect(try rig.connectPhone().adopted)
    }
}
