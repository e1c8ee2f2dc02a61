// Payload fetches (docs/relay.md §3–§5) through `FetchRelay`, against a real mosquitto
// (BatonTestSupport.MosquittoBroker) and devices the test plays byte for byte.
//
// The relay gets a `DeviceLink` whose `connect` makes a SOCK_SEQPACKET socketpair: the relay's
// end is a connecting `LinkChannel` (it opens on the first POLLOUT, as an L2CAP
// channel does), the test keeps the device's end. On it the test reads the fetch messages the
// relay sends and writes the device's answers as literal bytes (docs/protocol.md §5.1), or
// stays silent, or hangs up. Answers are read by a second MQTT client subscribed to the
// response topics, and checked as a requester would check them: v5 properties, or the v3.1.1
// JSON envelope.
//
// One real poll() loop drives both clients, the relay's links and its timer, as the gateway
// does. Every wait is bounded with a generous limit; no test asserts how long anything took.
// Every request gets exactly one answer: after the first one arrives, the loop runs a bounded
// extra moment so that a stray second answer would be seen.

import BatonLibc
import Foundation
import Glibc
import CBlueZ  // its shim includes <sys/socket.h>: import it so SOCK_SEQPACKET has one owner
import Testing
import BatonHCI
import BatonMQTT
import BatonWire
import BatonTestSupport
import BatonRelay

// The devices, played by the test: `Devices` and `TestLink` in RelayHarness.swift.

// MARK: - The rig: broker, gateway client, requester, relay, one poll loop

private let gatewayID = "hall"

/// A device as the gateway resolved it: its id (the activities topic's 12 hex digits) and its
/// link address from the beacon.
private struct Device {
    let id: UInt64
    let link: LinkAddress
    var hex: String { String(format: "%012llx", id) }
    func target(_ sequence: UInt16) -> FetchTarget { FetchTarget(device: id, sequence: sequence, link: link) }
}

private let reader = Device(id: 0x5A00_0000_0001, link: LinkAddress(address: 0xC0_FF_EE_00_00_01, addressType: 1, psm: 0x0080))
private let tablet = Device(id: 0x5A00_0000_0002, link: LinkAddress(address: 0xC0_FF_EE_00_00_02, addressType: 1, psm: 0x0080))
private let badge = Device(id: 0x5A00_0000_0003, link: LinkAddress(address: 0xC0_FF_EE_00_00_03, addressType: 0, psm: 0x00C1))

/// A requester that asked with MQTT v5 properties.
private func v5(_ name: String, correlation: [UInt8] = [0x0A, 0x1B], format: FetchFormat = .cbor) -> FetchRoute {
    FetchRoute(responseTopic: "answers/\(name)", correlation: correlation, format: format, usesProperties: true)
}

/// A requester that put its route in the body (the v3.1.1 fallback).
private func v3(_ name: String, correlation: [UInt8] = [0x0A, 0x1B], format: FetchFormat = .cbor) -> FetchRoute {
    FetchRoute(responseTopic: "answers/\(name)", correlation: correlation, format: format, usesProperties: false)
}

/// A valid v1 activity payload (docs/payload.md), made by the project's encoder.
private func activityPayload(_ title: String) throws -> [UInt8] {
    try ActivityPayloadContent(activityType: "com.example.reader.article", title: title,
                               webpageURL: "https://example.com/rivers", userInfo: ["scroll": .int(1234)]).encoded()
}

/// The RelayRig (RelayHarness.swift) with a FetchRelay on the devices' links (none without
/// `withLink`), on the wall clock, and a requester subscribed to `answers/#`.
private final class Rig: RelayRig {
    var relay: FetchRelay
    /// Everything the requester received on `answers/#`, in order.
    var messages: [MQTTMessage] = []

    init(_ config: RelayConfig = RelayConfig(), withLink: Bool = true) throws {
        let devices = Devices()
        relay = FetchRelay(config: config, link: withLink ? AnyDeviceLink(TestLink(devices: devices)) : nil, gatewayID: gatewayID)
        try super.init(devices: devices, gatewayID: gatewayID, peerID: "requester", longestWait: .seconds(1))
        try subscribe(gateway: [], peer: ["answers/#"])
    }

    override func peerMessage(_ m: MQTTMessage) { messages.append(m) }
    // The relay is a part of the gateway's driver with its own deadlines, on the wall clock.
    override func addRelay(_ driver: inout PollLoop) -> LoopSlot { driver.add(&relay) }
    override func serveRelay(_ ready: ArraySlice<pollfd>, after: Instant) { relay.serve(ready, now: after, mqtt: &gateway) }

    func fetch(_ device: Device, _ sequence: UInt16, _ route: FetchRoute, now: Instant = .now) {
        relay.fetch(device.target(sequence), route: route, now: now, mqtt: &gateway)
    }

    /// `fetch`, then runs until the relay has sent `count` records to `device` in all.
    func fetch(_ device: Device, _ sequence: UInt16, _ route: FetchRoute, now: Instant = .now, untilSent count: Int,
               sourceLocation: SourceLocation = #_sourceLocation) throws {
        fetch(device, sequence, route, now: now)
        try waitForFetches(device, count, sourceLocation: sourceLocation)
    }

    func answers(_ route: FetchRoute) -> [MQTTMessage] { messages.filter { $0.topic == route.responseTopic } }

    /// Runs until every route has an answer, then a bounded extra moment in which a stray
    /// second answer would arrive; expects exactly one each and returns them in `routes`' order.
    func onlyAnswers(_ routes: [FetchRoute], sourceLocation: SourceLocation = #_sourceLocation) throws -> [MQTTMessage] {
        let all = run { routes.allSatisfy { !answers($0).isEmpty } }
        try #require(all, "no answer on \(routes.filter { answers($0).isEmpty }.map(\.responseTopic)) within 10 s",
                     sourceLocation: sourceLocation)
        settle()
        for route in routes {
            #expect(answers(route).count == 1, "exactly one answer on \(route.responseTopic), got \(answers(route).count)",
                    sourceLocation: sourceLocation)
        }
        return routes.map { answers($0)[0] }
    }

    func onlyAnswer(_ route: FetchRoute, sourceLocation: SourceLocation = #_sourceLocation) throws -> MQTTMessage {
        try onlyAnswers([route], sourceLocation: sourceLocation)[0]
    }

    /// Runs until the relay has sent `count` records to `device` in all.
    func waitForFetches(_ device: Device, _ count: Int, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let got = run { devices.received(device.link).count >= count }
        try #require(got, "the device got \(devices.received(device.link).count) fetch message(s), not \(count)",
                     sourceLocation: sourceLocation)
    }
}

// MARK: - Reading answers as a requester does (docs/relay.md §3)

/// The answer's JSON body as an object.
private func json(_ m: MQTTMessage, sourceLocation: SourceLocation = #_sourceLocation) throws -> [String: Any] {
    let object = try JSONSerialization.jsonObject(with: Data(m.payload))
    return try #require(object as? [String: Any], "the answer is not one JSON object: \(String(decoding: m.payload, as: UTF8.self))",
                        sourceLocation: sourceLocation)
}

/// An answer's status, wherever its route puts it: the `status` user property (v5) or the
/// envelope's `status` (v3.1.1).
private func status(_ m: MQTTMessage, _ route: FetchRoute) throws -> String? {
    if route.usesProperties { return m.properties.userProperties.first { $0.name == "status" }?.value }
    return try json(m)["status"] as? String
}

/// A v5 `ok`: the device's bytes exactly, and in properties the correlation, status, gateway,
/// device and the payload's sequence.
private func expectV5OK(_ m: MQTTMessage, _ route: FetchRoute, device: Device, seq: UInt16, payload: [UInt8],
                        sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(m.properties.correlationData == route.correlation, sourceLocation: sourceLocation)
    #expect(m.properties.userProperties == [MQTTUserProperty("status", "ok"), MQTTUserProperty("gateway", gatewayID),
                                            MQTTUserProperty("device", device.hex), MQTTUserProperty("seq", String(seq))],
            sourceLocation: sourceLocation)
    #expect(m.properties.contentType == "application/cbor", sourceLocation: sourceLocation)
    #expect(m.payload == payload, "the payload's bytes as the device sent them", sourceLocation: sourceLocation)
    #expect(m.qos == 1 && !m.retained, sourceLocation: sourceLocation)
}

/// An error answer, v5 or v3.1.1: `status`, and the JSON body
/// `{"status":…,"device":…,"gateway":"hall",["correlation":…,]"detail":…}` whose detail says `detail`.
private func expectError(_ m: MQTTMessage, _ route: FetchRoute, _ expected: String, device: Device, detail: String,
                         sourceLocation: SourceLocation = #_sourceLocation) throws {
    let body = try json(m, sourceLocation: sourceLocation)
    #expect(body["status"] as? String == expected, "body: \(body)", sourceLocation: sourceLocation)
    #expect(body["device"] as? String == device.hex, sourceLocation: sourceLocation)
    #expect(body["gateway"] as? String == gatewayID, sourceLocation: sourceLocation)
    let text = body["detail"] as? String ?? ""
    #expect(text.contains(detail), "detail: \(text)", sourceLocation: sourceLocation)
    if route.usesProperties {
        #expect(m.properties.correlationData == route.correlation, sourceLocation: sourceLocation)
        #expect(m.properties.userProperties == [MQTTUserProperty("status", expected), MQTTUserProperty("gateway", gatewayID),
                                                MQTTUserProperty("device", device.hex)], sourceLocation: sourceLocation)
        #expect(m.properties.contentType == "application/json", sourceLocation: sourceLocation)
        #expect(body["correlation"] == nil, "v5: the correlation is in properties", sourceLocation: sourceLocation)
    } else {
        #expect(body["correlation"] as? String == hexString(route.correlation), sourceLocation: sourceLocation)
        #expect(body.count == 5, "status, device, gateway, correlation, detail: \(body.keys.sorted())",
                sourceLocation: sourceLocation)
    }
}

private func count(_ relay: borrowing FetchRelay, _ status: FetchStatus) -> Int { relay.counters.answers[status.rawValue] }

// MARK: - Tests

@Suite("Payload fetch relay (docs/relay.md §3–§5)")
struct FetchRelayTests {
    @Test("§5.2: a fetch opens a link and asks for the heard sequence; the answer is the device's bytes; the same sequence again comes from the cache; a newer one asks again")
    func fetchCacheAndNewerSequence() throws {
        let rig = try Rig()
        let first = try activityPayload("On rivers")
        let saved = try activityPayload("On rivers, chapter 2")

        let r1 = v5("phone", correlation: [0x0A, 0x1B])
        try rig.fetch(reader, 0x0102, r1, untilSent: 1)
        #expect(rig.devices.received(reader.link) == [[0x01, 0x02, 0x01]], "fetch, sequence 0x0102 little-endian (§5.1)")
        #expect(rig.relay.counters.linkOpens == 1)
        try rig.devices.send(reader.link, [0x02, 0x02, 0x01] + first)  // payload, sequence 0x0102
        expectV5OK(try rig.onlyAnswer(r1), r1, device: reader, seq: 0x0102, payload: first)

        // The same sequence, asked by a v3.1.1 requester: from the cache, no new fetch on the link.
        let r2 = v3("tv", correlation: [0x0A, 0x1B])
        rig.fetch(reader, 0x0102, r2)
        let cached = try json(rig.onlyAnswer(r2))
        #expect(cached["status"] as? String == "ok")
        #expect(cached["device"] as? String == "5a0000000001")
        #expect(cached["gateway"] as? String == gatewayID)
        #expect(cached["correlation"] as? String == "0a1b")
        #expect(cached["seq"] as? Int == 258)
        #expect((cached["cbor"] as? String).flatMap { Data(base64Encoded: $0) } == Data(first), "base64 of the device's bytes")
        #expect(cached.count == 6, "status, device, gateway, correlation, seq, cbor: \(cached.keys.sorted())")
        #expect(rig.devices.received(reader.link).count == 1, "served without asking the device")
        #expect(rig.relay.counters.cacheHits == 1)
        #expect(rig.relay.counters.linkOpens == 1)

        // The user saved: the beacon says 0x0103, the cached 0x0102 is stale.
        let r3 = v5("laptop", correlation: [0x03])
        try rig.fetch(reader, 0x0103, r3, untilSent: 2)
        #expect(rig.devices.received(reader.link).last == [0x01, 0x03, 0x01])
        try rig.devices.send(reader.link, [0x02, 0x03, 0x01] + saved)
        expectV5OK(try rig.onlyAnswer(r3), r3, device: reader, seq: 0x0103, payload: saved)
        #expect(rig.relay.counters.linkOpens == 1, "the link was still open: reused")
        #expect(rig.relay.counters.cacheHits == 1)
        #expect(count(rig.relay, .ok) == 3)
        #expect(rig.relay.pendingCount == 0)
    }

    @Test("§5.2: a device that answers with a newer sequence than asked: cached under it, the answer says it")
    func deviceAnswersNewerSequence() throws {
        let rig = try Rig()
        let payload = try activityPayload("Saved since")
        let r1 = v5("phone")
        try rig.fetch(reader, 0x0102, r1, untilSent: 1)
        try rig.devices.send(reader.link, [0x02, 0x05, 0x01] + payload)  // payload, sequence 0x0105
        expectV5OK(try rig.onlyAnswer(r1), r1, device: reader, seq: 0x0105, payload: payload)

        // A beacon at 0x0104 (heard late) is served by the cached 0x0105; at 0x0106 the device is asked.
        let r2 = v5("tv")
        rig.fetch(reader, 0x0104, r2)
        expectV5OK(try rig.onlyAnswer(r2), r2, device: reader, seq: 0x0105, payload: payload)
        #expect(rig.relay.counters.cacheHits == 1)
        let r3 = v5("laptop")
        try rig.fetch(reader, 0x0106, r3, untilSent: 2)
        #expect(rig.devices.received(reader.link) == [[0x01, 0x02, 0x01], [0x01, 0x06, 0x01]])
    }

    @Test("A payload older than what a waiting request heard answers only the requests it satisfies; the device is asked again for the rest")
    func olderPayloadAsksAgain() throws {
        let rig = try Rig()
        let old = try activityPayload("Before the save")
        let new = try activityPayload("After the save")
        let r1 = v5("phone")
        try rig.fetch(reader, 0x0001, r1, untilSent: 1)
        // The beacon moved on while the fetch was out: a second requester heard 0x0002.
        let r2 = v5("tv")
        rig.fetch(reader, 0x0002, r2)
        rig.settle()
        #expect(rig.devices.received(reader.link) == [[0x01, 0x01, 0x00]], "one fetch at a time on a link")
        try rig.devices.send(reader.link, [0x02, 0x01, 0x00] + old)
        expectV5OK(try rig.onlyAnswer(r1), r1, device: reader, seq: 0x0001, payload: old)
        try rig.waitForFetches(reader, 2)
        #expect(rig.devices.received(reader.link).last == [0x01, 0x02, 0x00])
        #expect(rig.answers(r2).isEmpty, "0x0001 is older than the 0x0002 this requester heard")
        try rig.devices.send(reader.link, [0x02, 0x02, 0x00] + new)
        expectV5OK(try rig.onlyAnswer(r2), r2, device: reader, seq: 0x0002, payload: new)
        #expect(rig.relay.counters.linkOpens == 1)
    }

    @Test("§5: two requesters waiting for the same device share one fetch on one link")
    func twoRequestersOneFetch() throws {
        let rig = try Rig()
        let payload = try activityPayload("Shared")
        let phone = v5("phone", correlation: [0x01])
        let tv = v3("tv", correlation: [0x02])
        rig.fetch(reader, 0x0102, phone)
        try rig.fetch(reader, 0x0102, tv, untilSent: 1)
        rig.settle()
        #expect(rig.devices.received(reader.link) == [[0x01, 0x02, 0x01]])
        #expect(rig.relay.pendingCount == 2)
        try rig.devices.send(reader.link, [0x02, 0x02, 0x01] + payload)
        let answers = try rig.onlyAnswers([phone, tv])
        expectV5OK(answers[0], phone, device: reader, seq: 0x0102, payload: payload)
        let envelope = try json(answers[1])
        #expect(envelope["status"] as? String == "ok")
        #expect(envelope["correlation"] as? String == "02")
        #expect((envelope["cbor"] as? String).flatMap { Data(base64Encoded: $0) } == Data(payload))
        #expect(rig.relay.counters.linkOpens == 1)
        #expect(rig.relay.counters.cacheHits == 0)
    }

    @Test("§4: a second request on the same response topic supersedes the first, which is answered cancelled")
    func supersedeCancelsTheFirst() throws {
        let rig = try Rig()
        let payload = try activityPayload("Again")
        let first = v5("tv", correlation: [0x01])
        try rig.fetch(reader, 0x0102, first, untilSent: 1)
        let second = v5("tv", correlation: [0x02])
        rig.relay.supersede(second, mqtt: &rig.gateway)
        rig.fetch(reader, 0x0102, second)
        try rig.devices.send(reader.link, [0x02, 0x02, 0x01] + payload)
        #expect(rig.run { rig.answers(second).count >= 2 })
        rig.settle()
        let both = rig.answers(second)
        try #require(both.count == 2, "one answer per request on the shared topic, got \(both.count)")
        try expectError(both[0], first, "cancelled", device: reader, detail: "a newer request from the same requester")
        expectV5OK(both[1], second, device: reader, seq: 0x0102, payload: payload)
        #expect(rig.devices.received(reader.link).count == 1, "the second request waited for the fetch already out")
        #expect(count(rig.relay, .cancelled) == 1)
    }

    @Test("§4: a silent device: timeout at relay.fetch-timeout; the next request asks again on a fresh link")
    func silentDeviceTimesOut() throws {
        let rig = try Rig(RelayConfig(fetchTimeout: .milliseconds(300)))
        let r1 = v5("phone")
        try rig.fetch(reader, 0x0102, r1, untilSent: 1)
        try expectError(rig.onlyAnswer(r1), r1, "timeout", device: reader, detail: "relay.fetch-timeout")
        #expect(count(rig.relay, .timeout) == 1)
        #expect(rig.relay.pendingCount == 0)
        #expect(rig.devices.isClosed(reader.link), "the link that let its request time out is closed")
        #expect(rig.relay.openLinks == 0)

        let payload = try activityPayload("Late")
        let r2 = v3("phone-again")
        try rig.fetch(reader, 0x0102, r2, untilSent: 2)
        #expect(rig.devices.links(reader.link) == 2)
        #expect(rig.devices.received(reader.link).last == [0x01, 0x02, 0x01])
        try rig.devices.send(reader.link, [0x02, 0x02, 0x01] + payload)
        #expect(try status(rig.onlyAnswer(r2), r2) == "ok")
        #expect(rig.relay.counters.linkOpens == 2)
    }

    @Test("A device that hangs up with a request waiting: unreachable")
    func deviceHangsUp() throws {
        let rig = try Rig()
        let r1 = v3("phone")
        try rig.fetch(reader, 0x0102, r1, untilSent: 1)
        try rig.devices.hangUp(reader.link)
        try expectError(rig.onlyAnswer(r1), r1, "unreachable", device: reader, detail: "the device closed the link")
        #expect(rig.relay.counters.linkFailures == 1)
        #expect(rig.relay.openLinks == 0)
        #expect(rig.relay.lastLinkError?.contains("5a0000000001") == true)
    }

    @Test("A link that cannot be opened: unreachable with the link's reason")
    func connectFails() throws {
        let rig = try Rig()
        rig.devices.refuse[reader.link.address] = .unreachable("C0:FF:EE:00:00:01 (random) did not answer")
        let r1 = v5("phone")
        rig.fetch(reader, 0x0102, r1)
        try expectError(rig.onlyAnswer(r1), r1, "unreachable", device: reader,
                        detail: "cannot reach the device: C0:FF:EE:00:00:01 (random) did not answer")
        #expect(rig.relay.counters.linkFailures == 1)
        #expect(rig.relay.counters.linkOpens == 0)
        #expect(rig.relay.pendingCount == 0)
    }

    @Test("A gateway without a device link (relay.link: none): unreachable")
    func noLink() throws {
        let rig = try Rig(withLink: false)
        let r1 = v3("phone")
        rig.fetch(reader, 0x0102, r1)
        try expectError(rig.onlyAnswer(r1), r1, "unreachable", device: reader, detail: "this gateway has no device link (relay.link)")
        #expect(rig.relay.pendingCount == 0)
        #expect(rig.devices.ends.isEmpty)
    }

    @Test("§5.1 fetch-refused: 01 unknown-device, 02 too-large, 03 unreachable",
          arguments: [(UInt8(0x01), "unknown-device", "no longer current"),
                      (UInt8(0x02), "too-large", "does not fit"),
                      (UInt8(0x03), "unreachable", "refused")])
    func fetchRefused(reason: UInt8, expected: String, detail: String) throws {
        let rig = try Rig()
        let r1 = v5("phone")
        try rig.fetch(reader, 0x0102, r1, untilSent: 1)
        try rig.devices.send(reader.link, [0x03, 0x02, 0x01, reason])  // fetch-refused, sequence 0x0102
        try expectError(rig.onlyAnswer(r1), r1, expected, device: reader, detail: detail)
        #expect(rig.relay.drops.total == 0)
        #expect(rig.relay.openLinks == 1, "a refusal is an answer: the link stays")
    }

    @Test("A payload of relay.payload-max bytes is relayed; one byte more is too-large")
    func payloadMax() throws {
        let rig = try Rig(RelayConfig(payloadMax: 64))
        let fits = [UInt8](repeating: 0xA5, count: 64)
        let r1 = v5("phone")
        try rig.fetch(reader, 0x0102, r1, untilSent: 1)
        try rig.devices.send(reader.link, [0x02, 0x02, 0x01] + fits)
        expectV5OK(try rig.onlyAnswer(r1), r1, device: reader, seq: 0x0102, payload: fits)

        let r2 = v5("tv")
        try rig.fetch(reader, 0x0103, r2, untilSent: 2)
        try rig.devices.send(reader.link, [0x02, 0x03, 0x01] + [UInt8](repeating: 0xA5, count: 65))
        try expectError(rig.onlyAnswer(r2), r2, "too-large", device: reader, detail: "relay.payload-max")
        #expect(count(rig.relay, .tooLarge) == 1)
    }

    @Test("A malformed link message: unreachable, and the drop counted by reason",
          arguments: [([UInt8]([0x02, 0x02, 0x01]), "link-empty"),
                      ([0x03, 0x02, 0x01, 0x09], "link-reason"),
                      ([0x02, 0x02], "truncated"),
                      ([0x7F, 0x02, 0x01], "unsupported")])
    func malformedMessage(message: [UInt8], reason: String) throws {
        let rig = try Rig()
        let r1 = v5("phone")
        try rig.fetch(reader, 0x0102, r1, untilSent: 1)
        try rig.devices.send(reader.link, message)
        try expectError(rig.onlyAnswer(r1), r1, "unreachable", device: reader, detail: "malformed")
        #expect(rig.relay.drops.sorted.map(\.reason) == [reason])
        #expect(rig.relay.drops.total == 1)
    }

    @Test("Capacity: relay.fetches waiting + 1 is answered busy at once")
    func fetchesPlusOne() throws {
        let rig = try Rig(RelayConfig(fetches: 2))
        let waiting = [v5("phone"), v5("tv")]
        rig.fetch(reader, 0x0102, waiting[0])
        rig.fetch(tablet, 0x0007, waiting[1])
        let extra = v3("laptop")
        rig.fetch(badge, 0x0001, extra)
        try expectError(rig.onlyAnswer(extra), extra, "busy", device: badge, detail: "relay.fetches")
        #expect(waiting.allSatisfy { rig.answers($0).isEmpty }, "the two waiting requests still wait")
        #expect(rig.relay.pendingCount == 2)
        #expect(rig.devices.links(badge.link) == 0)
        #expect(count(rig.relay, .busy) == 1)
    }

    @Test("Capacity: relay.links + 1 devices: the extra request waits, and gets the link when the busy one is answered")
    func linksPlusOneWaitsForAnswer() throws {
        let rig = try Rig(RelayConfig(links: 1))
        let p1 = try activityPayload("Reader")
        let p2 = try activityPayload("Tablet")
        let r1 = v5("phone")
        let r2 = v5("tv")
        try rig.fetch(reader, 0x0102, r1, untilSent: 1)
        rig.fetch(tablet, 0x0007, r2)
        rig.settle()
        #expect(rig.devices.links(tablet.link) == 0, "no free link: the request waits")
        #expect(rig.relay.openLinks == 1)
        #expect(rig.relay.pendingCount == 2)
        #expect(rig.answers(r2).isEmpty)

        try rig.devices.send(reader.link, [0x02, 0x02, 0x01] + p1)
        expectV5OK(try rig.onlyAnswer(r1), r1, device: reader, seq: 0x0102, payload: p1)
        try rig.waitForFetches(tablet, 1)
        #expect(rig.devices.received(tablet.link) == [[0x01, 0x07, 0x00]])
        #expect(rig.devices.isClosed(reader.link), "the reader's link had nothing left to do: closed for the tablet")
        #expect(rig.relay.openLinks == 1)
        try rig.devices.send(tablet.link, [0x02, 0x07, 0x00] + p2)
        expectV5OK(try rig.onlyAnswer(r2), r2, device: tablet, seq: 0x0007, payload: p2)
        #expect(rig.relay.counters.linkOpens == 2)
    }

    @Test("Capacity: relay.links + 1 devices: the extra request gets the link when the busy one times out")
    func linksPlusOneWaitsForTimeout() throws {
        let rig = try Rig(RelayConfig(fetchTimeout: .milliseconds(300), links: 1))
        let payload = try activityPayload("Tablet")
        let r1 = v5("phone")
        let r2 = v5("tv")
        let start = Instant.now
        try rig.fetch(reader, 0x0102, r1, now: start, untilSent: 1)
        // The relay's time is the caller's: the tablet's request is stamped 2 s after the
        // reader's, so its deadline falls well after the reader's however slow the machine.
        rig.fetch(tablet, 0x0007, r2, now: start + .seconds(2))
        #expect(rig.devices.links(tablet.link) == 0, "no free link: the request waits")
        try expectError(rig.onlyAnswer(r1), r1, "timeout", device: reader, detail: "relay.fetch-timeout")
        try rig.waitForFetches(tablet, 1)
        #expect(rig.devices.isClosed(reader.link))
        try rig.devices.send(tablet.link, [0x02, 0x07, 0x00] + payload)
        expectV5OK(try rig.onlyAnswer(r2), r2, device: tablet, seq: 0x0007, payload: payload)
    }

    @Test("§5: with every link in use, one with nothing to do is taken over at once for another device")
    func idleLinkTakenOver() throws {
        let rig = try Rig(RelayConfig(links: 1))  // link-idle stays 10 s: only the takeover can close it
        let payload = try activityPayload("Reader")
        let r1 = v5("phone")
        try rig.fetch(reader, 0x0102, r1, untilSent: 1)
        try rig.devices.send(reader.link, [0x02, 0x02, 0x01] + payload)
        _ = try rig.onlyAnswer(r1)
        #expect(rig.relay.openLinks == 1)
        #expect(!rig.devices.isClosed(reader.link))

        let r2 = v5("tv")
        rig.fetch(tablet, 0x0007, r2)
        #expect(rig.devices.links(tablet.link) == 1, "opened within the fetch, without waiting")
        #expect(rig.relay.openLinks == 1)
        try rig.waitForFetches(tablet, 1)
        #expect(rig.devices.isClosed(reader.link))
        try rig.devices.send(tablet.link, [0x02, 0x07, 0x00] + payload)
        expectV5OK(try rig.onlyAnswer(r2), r2, device: tablet, seq: 0x0007, payload: payload)
        #expect(rig.relay.counters.linkOpens == 2)
        #expect(rig.relay.counters.linkFailures == 0)
    }

    @Test("§5.2: a link with nothing to do closes after relay.link-idle")
    func idleLinkCloses() throws {
        let rig = try Rig(RelayConfig(linkIdle: .milliseconds(200)))
        let payload = try activityPayload("Reader")
        let r1 = v5("phone")
        try rig.fetch(reader, 0x0102, r1, untilSent: 1)
        try rig.devices.send(reader.link, [0x02, 0x02, 0x01] + payload)
        _ = try rig.onlyAnswer(r1)
        #expect(rig.run { rig.devices.isClosed(reader.link) }, "the idle link closes after relay.link-idle")
        #expect(rig.relay.openLinks == 0)
        #expect(rig.relay.nextDeadline == nil, "nothing left to wake up for")
        #expect(rig.relay.counters.linkFailures == 0)
    }

    @Test("Capacity: relay.cache + 1 devices: the least recently used payload is replaced")
    func cachePlusOne() throws {
        let rig = try Rig(RelayConfig(cache: 2))
        var payloads: [UInt64: [UInt8]] = [:]
        func fetchFromDevice(_ d: Device, _ name: String) throws {
            let payload = try activityPayload(name)
            payloads[d.id] = payload
            let route = v5(name)
            let before = rig.devices.received(d.link).count
            rig.fetch(d, 0x0010, route)
            try rig.waitForFetches(d, before + 1)
            try rig.devices.send(d.link, [0x02, 0x10, 0x00] + payload)
            expectV5OK(try rig.onlyAnswer(route), route, device: d, seq: 0x0010, payload: payload)
        }
        func fetchFromCache(_ d: Device, _ name: String) throws {
            let route = v5(name)
            rig.fetch(d, 0x0010, route)
            expectV5OK(try rig.onlyAnswer(route), route, device: d, seq: 0x0010, payload: payloads[d.id]!)
        }
        try fetchFromDevice(reader, "reader-1")
        try fetchFromDevice(tablet, "tablet-1")
        try fetchFromCache(reader, "reader-2")   // the reader is now the most recently used
        try fetchFromDevice(badge, "badge-1")    // a third payload: the tablet's is replaced
        #expect(rig.relay.counters.cacheHits == 1)

        try fetchFromCache(reader, "reader-3")
        #expect(rig.relay.counters.cacheHits == 2)
        #expect(rig.devices.received(reader.link).count == 1)
        try fetchFromDevice(tablet, "tablet-2")  // asks the device again
        #expect(rig.devices.received(tablet.link).count == 2)
        #expect(rig.relay.counters.cacheHits == 2)
    }

    @Test("§4: stop answers every waiting request unreachable and closes the links")
    func stopAnswersEveryone() throws {
        let rig = try Rig(RelayConfig(links: 1))
        let r1 = v5("phone")
        let r2 = v3("tv")
        try rig.fetch(reader, 0x0102, r1, untilSent: 1)
        rig.fetch(tablet, 0x0007, r2)  // waits for a link
        rig.relay.stop(mqtt: &rig.gateway)
        #expect(rig.relay.pendingCount == 0)
        #expect(rig.relay.openLinks == 0)
        let answers = try rig.onlyAnswers([r1, r2])
        try expectError(answers[0], r1, "unreachable", device: reader, detail: "the gateway is stopping")
        try expectError(answers[1], r2, "unreachable", device: tablet, detail: "the gateway is stopping")
        #expect(rig.devices.isClosed(reader.link))
    }

    @Test("format json: the payload rendered (docs/payload.md §4), in properties or in the v3.1.1 envelope")
    func formatJSON() throws {
        let rig = try Rig()
        let payload = try activityPayload("On rivers")
        let r5 = v5("phone", format: .json)
        let r3 = v3("tv", format: .json)
        rig.fetch(reader, 0x0102, r5)
        try rig.fetch(reader, 0x0102, r3, untilSent: 1)
        try rig.devices.send(reader.link, [0x02, 0x02, 0x01] + payload)
        let answers = try rig.onlyAnswers([r5, r3])

        #expect(answers[0].properties.contentType == "application/json")
        #expect(answers[0].properties.userProperties.contains(MQTTUserProperty("seq", "258")))
        let rendered = try json(answers[0])
        #expect(rendered["version"] as? Int == 1)
        #expect(rendered["activityType"] as? String == "com.example.reader.article")
        #expect(rendered["title"] as? String == "On rivers")

        let envelope = try json(answers[1])
        #expect(envelope["status"] as? String == "ok")
        #expect(envelope["seq"] as? Int == 258)
        #expect(envelope["cbor"] == nil)
        let inner = try #require(envelope["payload"] as? [String: Any])
        #expect(NSDictionary(dictionary: inner).isEqual(to: rendered), "the same rendering in both")
    }

    @Test("format json of a payload that is not a valid v1 payload: bad-request; cbor still gets the bytes")
    func formatJSONOfInvalidPayload() throws {
        let rig = try Rig()
        let notAPayload: [UInt8] = [0xA1, 0x61, 0x78, 0x01]  // {"x": 1}: no version, no activity type
        let asJSON = v5("phone", format: .json)
        let asCBOR = v5("tv", format: .cbor)
        rig.fetch(reader, 0x0102, asJSON)
        try rig.fetch(reader, 0x0102, asCBOR, untilSent: 1)
        try rig.devices.send(reader.link, [0x02, 0x02, 0x01] + notAPayload)
        let answers = try rig.onlyAnswers([asJSON, asCBOR])
        try expectError(answers[0], asJSON, "bad-request", device: reader, detail: "ask for cbor")
        expectV5OK(answers[1], asCBOR, device: reader, seq: 0x0102, payload: notAPayload)
    }
}

// MARK: - Reading requests (docs/relay.md §1–§2)

@Suite("Fetch requests read off the broker (docs/relay.md §1–§2)")
struct FetchIntakeTests {
    private func message(_ body: String, responseTopic: String? = nil, correlation: [UInt8]? = nil) -> MQTTMessage {
        MQTTMessage(topic: "baton/fetch/5a0000000001", payload: Array(body.utf8), qos: 1,
                    properties: MQTTProperties(responseTopic: responseTopic, correlationData: correlation))
    }

    @Test("v5 properties win over the body's route; the body's format still counts")
    func propertiesWin() {
        let intake = FetchIntake(message(#"{"format":"json","response_topic":"answers/body","correlation":"0a0b"}"#,
                                         responseTopic: "answers/props", correlation: [0x01, 0x02]))
        #expect(intake == .request(FetchRoute(responseTopic: "answers/props", correlation: [0x01, 0x02], format: .json,
                                              usesProperties: true), bodyError: nil))
    }

    @Test("No properties: the route comes from the body (the v3.1.1 fallback)")
    func bodyFallback() {
        let intake = FetchIntake(message(#"{ "response_topic": "answers/tv", "correlation": "0a1b", "format": "cbor" }"#))
        #expect(intake == .request(FetchRoute(responseTopic: "answers/tv", correlation: [0x0A, 0x1B], format: .cbor,
                                              usesProperties: false), bodyError: nil))
        let noCorrelation = FetchIntake(message(#"{"response_topic":"answers/tv"}"#))
        #expect(noCorrelation == .request(FetchRoute(responseTopic: "answers/tv", usesProperties: false), bodyError: nil))
    }

    @Test("A bad body with a v5 response topic: answerable, with the body's fault")
    func badBodyWithProperties() throws {
        let intake = FetchIntake(message(#"{"formt":"json"}"#, responseTopic: "answers/phone", correlation: [0x07]))
        guard case .request(let route, let error?) = intake else {
            Issue.record("expected a request with a body error, got \(intake)")
            return
        }
        #expect(route == FetchRoute(responseTopic: "answers/phone", correlation: [0x07], usesProperties: true))
        #expect(error.reason == "fetch-unknown-key")
    }

    @Test("A bad v3.1.1 body: answered at a route given before the mistake, else unanswerable")
    func badBodyWithoutProperties() throws {
        let routed = FetchIntake(message(#"{"response_topic":"answers/tv","correlation":"0a","format":"xml"}"#))
        guard case .request(let route, let error?) = routed else {
            Issue.record("expected a request with a body error, got \(routed)")
            return
        }
        #expect(route == FetchRoute(responseTopic: "answers/tv", correlation: [0x0A], usesProperties: false))
        #expect(error.reason == "fetch-format")
        let unrouted = FetchIntake(message(#"{"format":"xml","response_topic":"answers/tv"}"#))
        guard case .unanswerable(let late?) = unrouted else {
            Issue.record("expected unanswerable with a body error, got \(unrouted)")
            return
        }
        #expect(late.reason == "fetch-format")
    }

    @Test("No response topic anywhere: unanswerable")
    func noRoute() {
        #expect(FetchIntake(message("")) == .unanswerable(nil))
        #expect(FetchIntake(message(#"{"format":"json"}"#, correlation: [0x01])) == .unanswerable(nil))
    }

    @Test("MQTT 5.0 §3.3.2.3.5: a response topic with a wildcard is no route",
          arguments: ["answers/+", "answers/#", "+"])
    func wildcardResponseTopic(topic: String) {
        #expect(FetchIntake(message("", responseTopic: topic)) == .unanswerable(nil))
        // The body's route still serves (a bridge may have mangled the properties).
        #expect(FetchIntake(message(#"{"response_topic":"answers/tv"}"#, responseTopic: topic)) ==
            .request(FetchRoute(responseTopic: "answers/tv", usesProperties: false), bodyError: nil))
    }

    @Test("Correlation data is kept to 64 bytes (docs/relay.md §1), with a good body or a bad one")
    func correlationBound() throws {
        let long = [UInt8](0 ..< 65)
        let good = FetchIntake(message("", responseTopic: "answers/a", correlation: long))
        #expect(good == .request(FetchRoute(responseTopic: "answers/a", correlation: Array(long.prefix(64)), usesProperties: true),
                                 bodyError: nil))
        guard case .request(let route, _?) = FetchIntake(message("{", responseTopic: "answers/a", correlation: long)) else {
            Issue.record("a bad body with a response topic is answerable")
            return
        }
        #expect(route.correlation == Array(long.prefix(64)))
    }
}
