// One admission check for fetches and streams (docs/relay.md §4 "Admission"), and each relay's
// members of the stats topic (docs/mqtt.md "Stats"), byte for byte.
//
// No broker: the relays are handed a client that never connected, so what they publish is
// lost (and counted as lost where the relay counts that); the counters are the point here.

import BatonLibc
import Testing
import BatonMQTT
import BatonWire
import BatonTestSupport
import BatonRelay

private let reader = AdmittedActivity(address: 0xC0_FF_EE_00_00_01, addressType: 1, psm: 0x0080, sequence: 7,
                                      supportsStreams: true)

@Suite("Admission: one check for fetches and streams (docs/relay.md §4)")
struct AdmissionTests {
    @Test("Taken: the owner's current activity with a link; the target is its beacon's address, PSM and sequence")
    func taken() throws {
        for kind in [RequestKind.fetch, .stream] {
            let admitted = Admission.check(kind, device: 0x5A00_0000_0001, owns: true, follows: true, activity: reader)
            #expect(admitted == .success(FetchTarget(device: 0x5A00_0000_0001, sequence: 7,
                                                     link: LinkAddress(address: 0xC0_FF_EE_00_00_01, addressType: 1, psm: 0x0080))))
        }
    }

    @Test("Refused, in order: topic, body, owner, activity, streams flag (streams only), link")
    func refusedInOrder() {
        var noStreams = reader
        noStreams.supportsStreams = false
        var noLink = noStreams
        noLink.psm = 0
        func check(_ kind: RequestKind, device: UInt64? = 1, body: WireError? = nil, owns: Bool = true,
                   follows: Bool = true, activity: AdmittedActivity? = reader) -> Refusal? {
            if case .failure(let r) = Admission.check(kind, device: device, bodyError: body, owns: owns, follows: follows,
                                                      activity: activity) { return r }
            return nil
        }
        let body = WireError.truncated(at: 0, need: 1)
        #expect(check(.fetch, device: nil, body: body, owns: false) == .badTopic)
        #expect(check(.fetch, body: body, owns: false) == .badBody(body))
        #expect(check(.fetch, owns: false, follows: true) == .settling)
        #expect(check(.stream, owns: false, follows: false) == .unknownDevice)
        #expect(check(.stream, activity: nil) == .noActivity)
        #expect(check(.stream, activity: noLink) == .noStreams)
        #expect(check(.fetch, activity: noLink) == .deviceHasNoLink)
        #expect(check(.fetch, activity: noStreams) == nil, "a fetch does not need the streams flag")
    }

    @Test("One set of words: each refusal's fetch status, stream reason and detail")
    func words() {
        let table: [(Refusal, FetchStatus, StreamReason, String)] = [
            (.badTopic, .badRequest, .unreachable, "the topic's device level must be a device id: 12 lowercase hex digits"),
            (.settling, .notOwner, .unreachable,
             "no gateway owns this device at the moment (it just arrived, or its gateway went offline); ask again in a second"),
            (.unknownDevice, .unknownDevice, .unreachable, "no gateway of this building hears this device"),
            (.noActivity, .unknownDevice, .unreachable, "the device has no current activity"),
            (.noStreams, .unreachable, .unreachable, "the activity does not offer continuation streams"),
            (.deviceHasNoLink, .unreachable, .unreachable, "the device offers no link (PSM 0 in its beacon)"),
            (.gatewayHasNoLink, .unreachable, .unreachable, "this gateway has no device link (relay.link)"),
            (.full(.fetch, capacity: 32), .busy, .busy, "32 fetches are waiting (relay.fetches)"),
            (.full(.stream, capacity: 16), .busy, .busy, "16 streams are open (relay.streams)"),
        ]
        for (refusal, status, reason, detail) in table {
            #expect(refusal.fetchStatus == status, "\(refusal)")
            #expect(refusal.streamReason == reason, "\(refusal)")
            #expect(refusal.description == detail)
        }
    }
}

/// What `write` puts between `{` and `}`, as text.
private func members(_ write: (inout JSONWriter) throws(WireError) -> Void) throws -> String {
    let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 4096, alignment: 8)
    defer { buffer.deallocate() }
    var w = JSONWriter(buffer)
    try w.beginObject()
    try write(&w)
    try w.endObject()
    return String(decoding: w.written, as: UTF8.self)
}

/// A client that never connects: every publish is refused, as with the broker gone.
private func offline() throws -> MQTTClient {
    try MQTTClient(config: MQTTConfig(port: 1, clientID: "offline", protocolVersion: .v5))
}

@Suite("Each relay writes its own stats members (docs/mqtt.md \"Stats\")")
struct RelayStatsTests {
    @Test("FetchRelay: relay.{link … drops}; a request refused for want of a link is an unreachable answer, lost")
    func fetchRelay() throws {
        var relay = FetchRelay(config: RelayConfig(), link: nil, gatewayID: "hall")
        var mqtt = try offline()
        relay.fetch(FetchTarget(device: 1, sequence: 7, link: LinkAddress(address: 1, addressType: 1, psm: 0x80)),
                    route: FetchRoute(responseTopic: "answers/a", usesProperties: true), now: .now, mqtt: &mqtt)
        relay.dropped("fetch-topic")
        #expect(try members { w throws(WireError) in try relay.writeStats(into: &w) } ==
            #"{"link":"none","pending":0,"links_open":0,"link_opens":0,"link_failures":0,"cache_hits":0,"#
            + #""answers":{"ok":0,"unknown-device":0,"not-owner":0,"unreachable":1,"too-large":0,"timeout":0,"#
            + #""bad-request":0,"cancelled":0,"busy":0},"answers_lost":1,"continued":0,"continued_told":0,"#
            + #""drops":{"fetch-topic":1}}"#)
    }

    @Test("StreamRelay: relay.streams.{open … drops}; a refused open counts under refused")
    func streamRelay() throws {
        var relay = StreamRelay(config: RelayConfig(streams: 3), link: nil, gatewayID: "hall")
        var mqtt = try offline()
        relay.open(id: "s1", topics: StreamTopics(up: "u", down: "d", gateway: "g"), frame: hx("10 0800 0004"),
                   admitted: .failure(.noStreams), now: .now, mqtt: &mqtt)
        relay.dropped("stream-unknown")
        #expect(try members { w throws(WireError) in try relay.writeStats(into: &w) } ==
            #"{"open":0,"capacity":3,"opened":0,"refused":1,"finished":0,"aborted":0,"frames_up":0,"frames_down":0,"#
            + #""frames_queued":0,"resent":0,"gone_for_others":0,"bridged":0,"unanswered":0,"#
            + #""drops":{"stream-unknown":1}}"#)
    }

    @Test("ContinuingLinks: relay.readvertise.{phone_links … phone_streams}, and its drops for relay.readvertise.drops")
    func continuingLinks() throws {
        var links = ContinuingLinks(config: RelayConfig(), topics: Topics(prefix: "baton"), room: "Office")
        links.refusedGone()
        #expect(try members { w throws(WireError) in try links.writeStats(into: &w) } ==
            #"{"phone_links":0,"phone_links_open":0,"phone_links_refused":1,"phone_fetches":0,"phone_payloads":0,"#
            + #""phone_refusals":0,"phone_streams":0}"#)
        #expect(try members { w throws(WireError) in try links.writeDrops(into: &w) } == #"{"continuing-gone":1}"#)
    }
}
