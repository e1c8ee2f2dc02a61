// Streams bridged for a phone in another room (docs/relay.md §7.5), against a real mosquitto
// (BatonTestSupport.MosquittoBroker), a phone and a carrier that the test plays byte for byte
// (docs/protocol.md §5.1, §5.3, §5.4).
//
//   phone --link--> StreamRelay.bridge + gateway client --…/S/up, open topic-->  carrier (MQTT client)
//   phone <--link--                                      <--…/S/down--           carrier
//
// The gateway's part of the loop is played as Gateway.swift plays it: a phone's link whose
// first message was an open goes to `bridge` (the test says the phone's open), `…/S/down` and
// `…/S/up` go to `fromBroker`; then the relay's links are polled and its timer ticks. The
// phone's end of its link is a socketpair (RelayHarness.swift, `Devices.accept`).
//
// The relay's clock is the test's, as in StreamRelayTests: `now` moves only when a test says
// `advance`. After what a test waits for arrives, the loop runs a bounded extra moment
// (`settle`) in which a stray frame would arrive, and then the frames are compared exactly.
//
// The last test runs both roles end to end: a carrier (with a device) and a bridge (with a
// phone), two gateways on one broker.

import BatonLibc
import Foundation
import Glibc
import Testing
import BatonMQTT
import BatonWire
import BatonTestSupport
import BatonRelay

// MARK: - Frames as the spec writes them (the rest in StreamRig.swift)

/// A data frame (§5.1 `11`) numbered `n` carrying `bytes`.
private func data(_ n: UInt32, _ bytes: [UInt8]) -> [UInt8] {
    [0x11, UInt8(truncatingIfNeeded: n), UInt8(truncatingIfNeeded: n >> 8), UInt8(truncatingIfNeeded: n >> 16),
     UInt8(truncatingIfNeeded: n >> 24)] + bytes
}

// MARK: - Who is where

/// The activity's device, in another room: the open topic's 12 hex digits. For the tests that
/// also carry a stream, its link address.
private let deviceHex = "5a0000000001"
private let deviceID: UInt64 = 0x5A_00_00_00_00_01
private let reader = LinkAddress(address: 0xC0_FF_EE_00_00_01, addressType: 1, psm: 0x0080)

/// Phones in this gateway's room, by the address their link came from.
private let pixel = LinkAddress(address: 0x6E_00_00_00_00_01, addressType: 1, psm: 0)
private let galaxy = LinkAddress(address: 0x6E_00_00_00_00_02, addressType: 1, psm: 0)
private let fairphone = LinkAddress(address: 0x6E_00_00_00_00_03, addressType: 1, psm: 0)

private func openTopic(_ id: String) -> String { "baton/stream/\(deviceHex)/\(id)" }

// MARK: - The rig: broker, gateway client, carrier, relay, phones, one poll loop (StreamRig.swift)

/// The peer is the carrier.
private final class Rig: StreamRig {
    let phones = Devices()
    /// Everything the carrier received: opens on `baton/stream/+/+`, frames on
    /// `baton/streams/+/up` and `…/down`, in order.
    private(set) var carrierGot: [MQTTMessage] = []
    /// Every stream frame the gateway's client received (it subscribes only through the relay).
    private(set) var gatewayGot: [MQTTMessage] = []

    init(_ config: RelayConfig = RelayConfig()) throws {
        try super.init(config, gatewayID: "study", peerID: "hall")
        try subscribe()
    }

    /// The carrier subscribed as the test's carrier listens; the gateway's client only through the relay.
    func subscribe(sourceLocation: SourceLocation = #_sourceLocation) throws {
        try subscribe(gateway: [], peer: ["baton/stream/+/+", "baton/streams/+/up", "baton/streams/+/down"],
                      sourceLocation: sourceLocation)
    }

    // MARK: the phone

    /// A phone opens a stream link to the re-advertised activity; its first message was
    /// open(`window`, `maxData`), which the gateway read and hands on (docs/relay.md §7.5).
    func phoneOpens(_ phone: LinkAddress, _ id: String, window: UInt16 = 8, maxData: UInt16 = 1024) throws {
        let channel = try phones.accept(phone)
        relay.bridge(channel: channel, device: deviceID, id: id, topics: topics(id), openTopic: openTopic(id),
                     window: window, maxData: maxData, now: now, mqtt: &gateway)
    }

    /// Every link message the gateway sent the phone.
    func toPhone(_ phone: LinkAddress) -> [[UInt8]] { phones.received(phone) }

    func fromPhone(_ phone: LinkAddress, _ messages: [UInt8]...) throws {
        for m in messages { try phones.send(phone, m) }
    }

    // MARK: the carrier

    /// The opens the carrier saw for stream `id`, in order.
    func opens(_ id: String) -> [[UInt8]] { carrierGot.filter { $0.topic == openTopic(id) }.map(\.payload) }
    /// Every frame on `…/S/up`, in order.
    func up(_ id: String) -> [[UInt8]] { carrierGot.filter { $0.topic == topics(id).up }.map(\.payload) }
    /// Every frame on `…/S/down` (the carrier's own included), in order.
    func downSeen(_ id: String) -> [[UInt8]] { carrierGot.filter { $0.topic == topics(id).down }.map(\.payload) }
    /// Frames on `…/S/down` that reached the gateway's client.
    func gatewayGotDown(_ id: String) -> Int { gatewayGot.count { $0.topic == topics(id).down } }

    /// The carrier publishes frames on `…/S/down`, in order.
    func down(_ id: String, _ frames: [UInt8]...) throws {
        for f in frames { try f.withUnsafeBytes { try peer.publish(topic: topics(id).down, payload: $0, qos: 1) } }
    }

    // MARK: the loop: the phones' ends too, and what a message means here

    /// A paused phone has unread records: polling its end would spin.
    override func linkEnds() -> [pollfd] { (phones.paused ? [] : phones.pollDescriptors) + devices.pollDescriptors }
    override func pump() { phones.pump(); devices.pump() }

    override func gatewayMessage(_ m: MQTTMessage) {
        let level = m.topic.split(separator: "/", omittingEmptySubsequences: false)
        guard level.count == 4, level[1] == "streams", level[3] == "up" || level[3] == "down" else { return }
        gatewayGot.append(m)
        if !relay.fromBroker(id: String(level[2]), level[3] == "up" ? .up : .down, m.payload, now: now, mqtt: &gateway) {
            relay.dropped("stream-unknown")
        }
    }

    override func peerMessage(_ m: MQTTMessage) { carrierGot.append(m) }

    // MARK: waiting

    func waitOpens(_ id: String, _ count: Int, sourceLocation: SourceLocation = #_sourceLocation) throws {
        try #require(run { opens(id).count >= count }, "the carrier saw \(opens(id).count) open(s) for \(id), not \(count)",
                     sourceLocation: sourceLocation)
    }

    func waitUp(_ id: String, _ count: Int, sourceLocation: SourceLocation = #_sourceLocation) throws {
        try #require(run { up(id).count >= count },
                     "the carrier got \(up(id).count) frame(s) on \(topics(id).up), not \(count): \(up(id).map(hexString))",
                     sourceLocation: sourceLocation)
    }

    func waitPhone(_ phone: LinkAddress, _ count: Int, sourceLocation: SourceLocation = #_sourceLocation) throws {
        try #require(run { toPhone(phone).count >= count },
                     "the phone got \(toPhone(phone).count) link message(s), not \(count): \(toPhone(phone).map(hexString))",
                     sourceLocation: sourceLocation)
    }

    /// Runs until the gateway has closed the phone's link (the phone reads EOF).
    func waitPhoneClosed(_ phone: LinkAddress, sourceLocation: SourceLocation = #_sourceLocation) throws {
        try #require(run { phones.isClosed(phone) }, "the gateway did not close the phone's link", sourceLocation: sourceLocation)
    }

    /// docs/relay.md §7.5: the phone's open goes out on the open topic; the carrier answers
    /// `carrierOpen` on `…/S/down`, which reaches the phone.
    func openBridge(_ id: String, _ phone: LinkAddress, window: UInt16 = 8, maxData: UInt16 = 1024,
                    carrierOpen: [UInt8] = hx("10 0800 0004"), sourceLocation: SourceLocation = #_sourceLocation) throws {
        let (asked, told) = (opens(id).count, toPhone(phone).count)
        try phoneOpens(phone, id, window: window, maxData: maxData)
        try waitOpens(id, asked + 1, sourceLocation: sourceLocation)
        try down(id, carrierOpen)
        try waitPhone(phone, told + 1, sourceLocation: sourceLocation)
    }
}

// MARK: - Tests

@Suite("Continuation streams bridged for a phone in another room (docs/relay.md §7.5)")
struct StreamBridgeTests {

    // MARK: opening

    @Test("§7.5: the phone's open goes out clamped to (Wg, Mg), again every relay.stream-retry until the carrier's open, which reaches the phone clamped; no …/S/gateway")
    func open() throws {
        let rig = try Rig(RelayConfig(fetchTimeout: .seconds(60), streamWindow: 4, streamMaxData: 512,
                                      streamRetry: .milliseconds(200)))
        try rig.phoneOpens(pixel, "s1", window: 8, maxData: 1024)
        try rig.waitOpens("s1", 1)
        rig.settle()
        #expect(rig.opens("s1") == [hx("10 0400 0002")], "window 4, max data 512")
        #expect(rig.carrierGot.allSatisfy { $0.qos == 1 && !$0.retained }, "§7.1: QoS 1, not retained")
        #expect(rig.relay.nextDeadline == rig.now + .milliseconds(200), "the open's next repeat")

        rig.advance(.milliseconds(200))
        try rig.waitOpens("s1", 2)
        rig.advance(.milliseconds(200))
        try rig.waitOpens("s1", 3)
        rig.settle()
        #expect(rig.opens("s1") == Array(repeating: hx("10 0400 0002"), count: 3))
        #expect(rig.toPhone(pixel).isEmpty, "the phone hears nothing until a carrier answers")

        // The carrier offers window 16 and max data 2048; the gateway keeps 4 of 512.
        try rig.down("s1", hx("10 1000 0008"))
        try rig.waitPhone(pixel, 1)
        #expect(rig.relay.nextDeadline == rig.now + .seconds(60), "now only relay.stream-idle")
        rig.advance(.milliseconds(400))
        rig.settle()
        #expect(rig.toPhone(pixel) == [hx("10 0400 0002")])
        #expect(rig.opens("s1").count == 3, "answered: not asked again")
        #expect(rig.up("s1").isEmpty)
        #expect(try rig.broker.retained("baton/streams/+/gateway").isEmpty, "…/S/gateway is the carrier's to say")
        #expect(rig.relay.counters.bridged == 1)
        #expect(rig.relay.counters.opened == 0)
        #expect(rig.relay.openCount == 1)
    }

    @Test("§7.5: the carrier's open said again (its answer to a repeated open) changes nothing")
    func carrierOpenAgain() throws {
        let rig = try Rig()
        try rig.openBridge("s1", pixel, carrierOpen: hx("10 0400 0002"))
        try rig.down("s1", hx("10 0800 0004"))
        try rig.lateProbe()
        rig.settle()
        #expect(rig.toPhone(pixel) == [hx("10 0400 0002")])
        #expect(rig.relay.drops.total == 0)
        // The window the phone was told holds: frame 4 is beyond it.
        try rig.fromPhone(pixel, data(0, [1]), data(1, [2]), data(2, [3]), data(3, [4]))
        try rig.waitUp("s1", 4)
        try rig.fromPhone(pixel, data(4, [5]))
        try rig.waitPhoneClosed(pixel)
        expectError(rig.toPhone(pixel).last, .protocolError, saying: "the phone sent frame 4 outside the window")
    }

    // MARK: flowing

    @Test("§7.5 phone → broker: every frame kept until acknowledged; no ack for relay.stream-retry: go-back-N; acks reach the phone with their window capped")
    func phoneFramesKeptAndResent() throws {
        let rig = try Rig(RelayConfig(streamWindow: 4, streamRetry: .milliseconds(200)))
        try rig.openBridge("s1", pixel, carrierOpen: hx("10 0800 0004"))
        #expect(rig.toPhone(pixel) == [hx("10 0400 0004")], "window 8 offered, 4 told")
        let d0 = hx("11 00000000 41"), d1 = hx("11 01000000 4242"), d2 = hx("11 02000000 434343")
        try rig.fromPhone(pixel, d0, d1, d2)
        try rig.waitUp("s1", 3)
        rig.settle()
        #expect(rig.up("s1") == [d0, d1, d2], "once each: the relay's clock has not moved")

        rig.advance(.milliseconds(200))
        try rig.waitUp("s1", 6)
        rig.settle()
        #expect(rig.up("s1") == [d0, d1, d2, d0, d1, d2])
        #expect(rig.relay.counters.resent == 3)

        // The device has frame 0: the ack reaches the phone; the next retry starts at 1.
        try rig.down("s1", hx("12 01000000 0800"))
        try rig.waitPhone(pixel, 2)
        #expect(rig.toPhone(pixel).last == hx("12 01000000 0400"), "window 8 from the device, 4 told")
        rig.advance(.milliseconds(200))
        try rig.waitUp("s1", 8)
        rig.settle()
        #expect(Array(rig.up("s1").dropFirst(6)) == [d1, d2])
        #expect(rig.relay.counters.resent == 5)

        // Everything acknowledged: nothing more is resent.
        try rig.down("s1", hx("12 03000000 0800"))
        try rig.waitPhone(pixel, 3)
        rig.advance(.seconds(1))
        rig.settle()
        #expect(rig.up("s1").count == 8)
        #expect(rig.relay.counters.resent == 5)
        #expect(rig.relay.counters.framesUp == 3, "the phone's frames go towards the device: up")
        #expect(rig.relay.counters.framesDown == 0)
    }

    @Test("§7.5 broker → phone: in order only; a duplicate gets the phone's last ack again on …/S/up; a frame after a gap is dropped and counted")
    func carrierFramesInOrderOnly() throws {
        let rig = try Rig()
        try rig.openBridge("s1", pixel)
        try rig.down("s1", hx("11 00000000 61"), hx("11 01000000 62"))
        try rig.waitPhone(pixel, 3)
        #expect(rig.toPhone(pixel) == [hx("10 0800 0004"), hx("11 00000000 61"), hx("11 01000000 62")])
        try rig.fromPhone(pixel, hx("12 02000000 4000"))  // ack 2, window 64
        try rig.waitUp("s1", 1)
        #expect(rig.up("s1") == [hx("12 02000000 1000")], "the phone's ack, window capped at Wg = 16")

        try rig.down("s1", hx("11 00000000 61"))  // a resend
        try rig.waitUp("s1", 2)
        rig.settle()
        #expect(rig.up("s1") == [hx("12 02000000 1000"), hx("12 02000000 1000")])
        #expect(rig.toPhone(pixel).count == 3, "the duplicate does not reach the phone")
        #expect(rig.drops("stream-duplicate") == 1)

        try rig.down("s1", hx("11 03000000 64"))  // 2 was lost with the broker
        try #require(rig.run { rig.drops("stream-gap") == 1 })
        rig.settle()
        #expect(rig.toPhone(pixel).count == 3)
        #expect(rig.up("s1").count == 2, "nothing said: the carrier resends from the gap")

        try rig.down("s1", hx("11 02000000 63"), hx("11 03000000 64"))
        try rig.waitPhone(pixel, 5)
        rig.settle()
        #expect(Array(rig.toPhone(pixel).dropFirst(3)) == [hx("11 02000000 63"), hx("11 03000000 64")])
        #expect(rig.relay.counters.framesDown == 6, "towards the phone: down, the duplicate and the gap included")
        #expect(rig.relay.drops.total == 2)
    }

    @Test("§7.5 broker → phone: frames the phone's link has no room for wait in the queue and go in order on POLLOUT, close last; an ack that found no room goes too")
    func phoneNotReading() throws {
        let rig = try Rig(RelayConfig(streamWindow: 32))
        rig.phones.sendBuffer = 4096
        try rig.openBridge("s1", pixel, window: 32, maxData: 1024, carrierOpen: hx("10 2000 0004"))
        #expect(rig.opens("s1") == [hx("10 2000 0004")], "the carrier is told the window the queue holds")
        try rig.fromPhone(pixel, hx("11 00000000 70"))
        try rig.waitUp("s1", 1)
        rig.phones.paused = true
        var sent: [[UInt8]] = []
        for n in 0 ..< 32 {
            let f = data(UInt32(n), [UInt8](repeating: UInt8(n), count: 1000))
            sent.append(f)
            try rig.down("s1", f)
        }
        try rig.down("s1", hx("13 20000000"))
        try rig.down("s1", hx("12 01000000 2000"))  // the device has the phone's frame 0
        try #require(rig.run { rig.gatewayGotDown("s1") == 1 + 32 + 2 }, "the gateway got the carrier's frames")
        rig.settle()
        #expect(rig.relay.counters.framesQueued > 0, "the link never refused a frame: the test shows nothing")
        #expect(rig.drops("stream-link-full") == 0)

        rig.phones.paused = false
        try rig.waitPhone(pixel, 1 + 32 + 1 + 1)
        rig.settle()
        let got = Array(rig.toPhone(pixel).dropFirst())
        #expect(got.filter { $0.first == 0x11 } == sent, "all 32, in order, once each")
        #expect(got.filter { $0.first == 0x12 } == [hx("12 01000000 2000")], "the ack, once")
        #expect(got.last == hx("13 20000000"), "the close after every frame")
        #expect(got.count == 34)
        #expect(rig.relay.drops.total == 0)
    }

    // MARK: ending

    @Test("§7.5 ending: both closes said and acknowledged: the phone's link is hung up, the slot free, …/S/down unsubscribed")
    func cleanEnd() throws {
        let rig = try Rig()
        try rig.openBridge("s1", pixel)
        try rig.fromPhone(pixel, hx("11 00000000 71"), hx("13 01000000"))
        try rig.waitUp("s1", 2)
        #expect(rig.up("s1") == [hx("11 00000000 71"), hx("13 01000000")])

        try rig.down("s1", hx("12 01000000 0800"), hx("11 00000000 72"), hx("13 01000000"))
        try rig.waitPhone(pixel, 4)
        #expect(Array(rig.toPhone(pixel).dropFirst()) == [hx("12 01000000 0800"), hx("11 00000000 72"),
                                                           hx("13 01000000")])
        #expect(rig.relay.openCount == 1, "the phone has not acknowledged the device's frame and close yet")

        try rig.fromPhone(pixel, hx("12 01000000 0800"))
        try rig.waitPhoneClosed(pixel)
        try rig.waitUp("s1", 3)
        rig.settle()
        #expect(rig.up("s1").last == hx("12 01000000 0800"), "the phone's last ack reaches the carrier")
        #expect(rig.up("s1").count == 3)
        #expect(rig.toPhone(pixel).count == 4)
        #expect(rig.relay.counters.finished == 1)
        #expect(rig.relay.counters.aborted == 0)
        #expect(rig.relay.openCount == 0)
        #expect(rig.relay.nextDeadline == nil)
        #expect(try rig.broker.retained("baton/streams/+/gateway").isEmpty)

        // A late resend of the carrier's no longer reaches this gateway.
        let got = rig.gatewayGotDown("s1")
        try rig.down("s1", hx("13 01000000"))
        try rig.lateProbe()
        #expect(rig.gatewayGotDown("s1") == got, "…/S/down is unsubscribed")
        #expect(rig.drops("stream-unknown") == 0)
    }

    @Test("§7.5: the carrier's error or reset before its open reaches the phone, and the stream ends",
          arguments: ["15 06 676f6e65", "15 05 6275737921", "14 01"])  // error gone "gone", error busy "busy!", reset cancelled
    func refusedByTheCarrier(refusal: String) throws {
        let rig = try Rig(RelayConfig(streamRetry: .milliseconds(200)))
        try rig.phoneOpens(pixel, "s1")
        try rig.waitOpens("s1", 1)
        try rig.down("s1", hx(refusal))
        try rig.waitPhoneClosed(pixel)
        rig.advance(.seconds(1))
        rig.settle()
        #expect(rig.toPhone(pixel) == [hx(refusal)])
        #expect(rig.opens("s1").count == 1, "not asked again")
        #expect(rig.up("s1").isEmpty)
        #expect(rig.relay.counters.aborted == 1)
        #expect(rig.relay.openCount == 0)
    }

    @Test("§7.5: no carrier answers for 2 × relay.fetch-timeout: error unreachable to the phone, reset cancelled on …/S/up")
    func unanswered() throws {
        let rig = try Rig(RelayConfig(fetchTimeout: .milliseconds(500), streamRetry: .milliseconds(200),
                                      streamIdle: .milliseconds(300)))
        try rig.phoneOpens(pixel, "s1")
        try rig.waitOpens("s1", 1)
        for n in 2 ... 5 {  // 200, 400, 600, 800 ms: said again each time; past relay.stream-idle, yet not idle
            rig.advance(.milliseconds(200))
            try rig.waitOpens("s1", n)
        }
        rig.settle()
        #expect(rig.relay.openCount == 1)
        #expect(rig.toPhone(pixel).isEmpty)
        #expect(rig.relay.nextDeadline == rig.now + .milliseconds(200), "at 1 s: the repeat and the give-up")

        rig.advance(.milliseconds(200))  // 1 s = 2 × relay.fetch-timeout
        try rig.waitPhoneClosed(pixel)
        try rig.waitUp("s1", 1)
        rig.settle()
        #expect(rig.toPhone(pixel).count == 1)
        expectError(rig.toPhone(pixel).first, .unreachable, saying: "no gateway answered the stream open")
        #expect(rig.up("s1") == [hx("14 01")])
        #expect(rig.opens("s1").count == 5)
        #expect(rig.relay.counters.unanswered == 1)
        #expect(rig.relay.counters.aborted == 1)
        #expect(rig.relay.openCount == 0)
    }

    @Test("§7.5 aborting: the phone hangs up mid-stream: error unreachable on …/S/up")
    func phoneHangsUp() throws {
        let rig = try Rig()
        try rig.openBridge("s1", pixel)
        try rig.fromPhone(pixel, hx("11 00000000 61"))
        try rig.waitUp("s1", 1)
        try rig.phones.hangUp(pixel)
        try rig.waitUp("s1", 2)
        rig.settle()
        #expect(rig.up("s1").count == 2)
        expectError(rig.up("s1").last, .unreachable, saying: "the phone's link dropped")
        #expect(rig.relay.counters.aborted == 1)
        #expect(rig.relay.openCount == 0)
    }

    @Test("§7.5 aborting: the phone's reset goes to the carrier and the stream ends")
    func phoneResets() throws {
        let rig = try Rig()
        try rig.openBridge("s1", pixel)
        try rig.fromPhone(pixel, hx("14 01"))
        try rig.waitUp("s1", 1)
        try rig.waitPhoneClosed(pixel)
        rig.settle()
        #expect(rig.up("s1") == [hx("14 01")])
        #expect(rig.relay.openCount == 0)
    }

    @Test("§5.3: a phone frame that breaks §5.3 is error protocol to the phone and on …/S/up",
          arguments: [(false, ["11 00000000 61"], "the phone sent frame 0 outside the window"),  // data before the carrier's open
                      (true, ["11 01000000 61"], "the phone sent frame 1 outside the window"),   // frame 1 before 0
                      (true, ["13 02000000"], "the phone closed at 2 after sending 0 frames"),
                      (true, ["11 00000000"], "the phone sent a malformed frame")])
    func phoneBreaksProtocol(answered: Bool, frames: [String], detail: String) throws {
        let rig = try Rig()
        if answered { try rig.openBridge("s1", pixel) } else {
            try rig.phoneOpens(pixel, "s1")
            try rig.waitOpens("s1", 1)
        }
        for f in frames { try rig.fromPhone(pixel, hx(f)) }
        try rig.waitPhoneClosed(pixel)
        try rig.waitUp("s1", 1)
        rig.settle()
        #expect(rig.up("s1").count == 1)
        expectError(rig.up("s1").last, .protocolError, saying: detail)
        expectError(rig.toPhone(pixel).last, .protocolError, saying: detail)
        #expect(rig.relay.openCount == 0)
    }

    @Test("§7.5 aborting: nothing moved for relay.stream-idle after the carrier answered: error idle both ways")
    func idle() throws {
        let rig = try Rig(RelayConfig(streamIdle: .milliseconds(300)))
        try rig.openBridge("s1", pixel)
        rig.advance(.milliseconds(200))
        rig.settle()
        #expect(rig.relay.openCount == 1)
        rig.advance(.milliseconds(100))
        try rig.waitPhoneClosed(pixel)
        try rig.waitUp("s1", 1)
        rig.settle()
        expectError(rig.up("s1").last, .idle, saying: "relay.stream-idle")
        expectError(rig.toPhone(pixel).last, .idle, saying: "relay.stream-idle")
    }

    @Test("§7.5: the gateway stops: error gone to the phone and on …/S/up")
    func stop() throws {
        let rig = try Rig()
        try rig.openBridge("s1", pixel)
        rig.relay.stop(mqtt: &rig.gateway)
        #expect(rig.relay.openCount == 0)
        try rig.waitUp("s1", 1)
        try rig.waitPhoneClosed(pixel)
        rig.settle()
        expectError(rig.up("s1").last, .gone, saying: "the gateway is stopping")
        #expect(rig.toPhone(pixel).count == 2)
        expectError(rig.toPhone(pixel).last, .gone, saying: "the gateway is stopping")
    }

    @Test("§7.3, §7.5: the carrier of a bridged stream goes offline: the first online gateway's gone reaches the phone, even when that is this gateway")
    func carrierOffline() throws {
        let rig = try Rig()
        try rig.openBridge("s1", pixel)
        _ = rig.relay.carried(stream: "s1", payload: Array("hall".utf8), retained: true, isOnline: { _ in true }, now: .now)
        rig.relay.gatewayWentOffline("hall", topics: Topics(prefix: "baton"),
                                     mqtt: &rig.gateway)
        try rig.waitPhoneClosed(pixel)
        rig.settle()
        #expect(rig.toPhone(pixel).last == hx("15 06") + utf8("gateway hall went offline"))
        #expect(rig.relay.counters.goneForOthers == 1)
        #expect(rig.relay.openCount == 0)
    }

    // MARK: capacity and roles

    @Test("Capacity: relay.streams + 1, carried and bridged together: a phone is told busy and hung up, an endpoint too; a freed slot takes the next")
    func streamsPlusOne() throws {
        let rig = try Rig(RelayConfig(streams: 2))
        rig.relay.open(id: "k1", topics: topics("k1"), frame: hx("10 0800 0004"), admitted: .success(reader),
                       now: rig.now, mqtt: &rig.gateway)
        try rig.openBridge("s1", pixel)
        #expect(rig.relay.openCount == 2)

        try rig.phoneOpens(galaxy, "s2")
        try rig.waitPhoneClosed(galaxy)
        rig.relay.open(id: "k2", topics: topics("k2"), frame: hx("10 0800 0004"), admitted: .success(reader),
                       now: rig.now, mqtt: &rig.gateway)
        try #require(rig.run { rig.downSeen("k2").count == 1 })
        rig.settle()
        #expect(rig.toPhone(galaxy).count == 1)
        expectError(rig.toPhone(galaxy).first, .busy, saying: "2 streams are open (relay.streams)")
        expectError(rig.downSeen("k2").first, .busy, saying: "relay.streams")
        #expect(rig.opens("s2").isEmpty, "no open for a phone refused")
        #expect(refused(rig.relay, .busy) == 2)
        #expect(rig.relay.counters.bridged == 1)
        #expect(rig.relay.openCount == 2)

        try rig.down("s1", hx("14 01"))  // the bridged stream ends
        try rig.waitPhoneClosed(pixel)
        try rig.openBridge("s3", fairphone)
        #expect(rig.toPhone(fairphone) == [hx("10 0800 0004")])
        #expect(rig.relay.counters.bridged == 2)
        #expect(rig.relay.openCount == 2)
    }

    @Test("§7.5: …/up frames reach only carried streams and …/down frames only bridged ones, even under one stream id")
    func rolesKeepTheirTopics() throws {
        let rig = try Rig()
        try rig.openBridge("b1", pixel)
        rig.relay.open(id: "c1", topics: topics("c1"), frame: hx("10 0800 0004"), admitted: .success(reader),
                       now: rig.now, mqtt: &rig.gateway)
        try #require(rig.run { rig.devices.received(reader).count == 1 }, "the carried stream's open reached the device")

        #expect(!rig.relay.fromBroker(id: "b1", .up, hx("11 00000000 61"), now: rig.now, mqtt: &rig.gateway))
        #expect(!rig.relay.fromEndpoint(id: "b1", hx("11 00000000 61"), now: rig.now, mqtt: &rig.gateway))
        #expect(!rig.relay.fromBroker(id: "c1", .down, hx("11 00000000 61"), now: rig.now, mqtt: &rig.gateway))

        // One id in both roles, as an ownership flip could make it.
        try rig.openBridge("s1", galaxy)
        rig.relay.open(id: "s1", topics: topics("s1"), frame: hx("10 0800 0004"), admitted: .success(reader),
                       now: rig.now, mqtt: &rig.gateway)
        try #require(rig.run { rig.devices.received(reader).count == 2 }, "the second carried stream's open reached the device")
        #expect(rig.relay.fromBroker(id: "s1", .up, hx("11 00000000 75"), now: rig.now, mqtt: &rig.gateway))
        #expect(rig.relay.fromBroker(id: "s1", .down, hx("11 00000000 64"), now: rig.now, mqtt: &rig.gateway))
        try #require(rig.run { rig.devices.received(reader).count == 3 && rig.toPhone(galaxy).count == 2 })
        rig.settle()
        #expect(rig.devices.received(reader).last == hx("11 00000000 75"), "up: to the carried stream's device")
        #expect(rig.toPhone(galaxy).last == hx("11 00000000 64"), "down: to the bridged stream's phone")
        #expect(rig.toPhone(pixel) == [hx("10 0800 0004")], "b1's phone got nothing")
        #expect(rig.relay.openCount == 4)
    }

    // MARK: a broker restart

    @Test("§7.5: after a reconnect the open is said again if no carrier answered; an answered stream republishes the phone's last ack and every unacknowledged frame")
    func reconnect() throws {
        let rig = try Rig()
        try rig.phoneOpens(pixel, "s1")
        try rig.waitOpens("s1", 1)

        try rig.openBridge("s2", galaxy)
        let p0 = hx("11 00000000 50"), p1 = hx("11 01000000 51")
        try rig.fromPhone(galaxy, p0, p1)
        try rig.waitUp("s2", 2)
        try rig.down("s2", hx("12 01000000 0800"), hx("11 00000000 43"))  // the device has p0; its frame 0
        try rig.waitPhone(galaxy, 3)
        try rig.fromPhone(galaxy, hx("12 01000000 0800"))
        try rig.waitUp("s2", 3)

        try rig.broker.restart()
        try #require(rig.run { rig.gatewayConnects == 2 && rig.peerConnects == 2 }, "both clients reconnect")
        try rig.subscribe()
        let (asked1, asked2, ups) = (rig.opens("s1").count, rig.opens("s2").count, rig.up("s2").count)
        rig.relay.reconnected(now: rig.now, mqtt: &rig.gateway)
        try rig.waitOpens("s1", asked1 + 1)
        try rig.waitUp("s2", ups + 2)
        rig.settle()
        #expect(rig.opens("s1").last == hx("10 0800 0004"))
        #expect(rig.opens("s2").count == asked2, "s2 was answered: not asked again")
        #expect(Array(rig.up("s2").dropFirst(ups)) == [hx("12 01000000 0800"), p1])
        #expect(rig.relay.counters.resent == 1)

        // …/S/down is subscribed again: the carrier's answer and frames get through.
        try rig.down("s1", hx("10 0800 0004"))
        try rig.waitPhone(pixel, 1)
        try rig.down("s2", hx("11 01000000 44"))
        try rig.waitPhone(galaxy, 4)
        #expect(rig.toPhone(galaxy).last == hx("11 01000000 44"))
    }

    // MARK: end to end

    @Test("§7.5 end to end: a phone in the study streams 64 KiB each way with a device in the hall, reading slowly; the bytes arrive intact both ways")
    func endToEnd() throws {
        let rooms = try TwoRooms()
        let phoneBytes = (0 ..< 65_536).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) }
        let deviceBytes = (0 ..< 65_536).map { UInt8(truncatingIfNeeded: ($0 >> 8) ^ ($0 &* 13)) }
        // The phone takes 16 frames of 700 bytes; the device 6 of 1000.
        let phone = Peer(rooms.phones, pixel, answer: nil, window: 16, outgoing: phoneBytes)
        let device = Peer(rooms.devices, reader, answer: hx("10 0600 e803"), window: 6, outgoing: deviceBytes)
        try rooms.phoneOpens(window: 16, maxData: 700)
        try #require(try rooms.run(phone: phone, device: device) {
            phone.incoming.count == deviceBytes.count && device.incoming.count == phoneBytes.count
                && rooms.phones.isClosed(pixel) && rooms.devices.isClosed(reader)
                && rooms.hall.openCount == 0 && rooms.study.openCount == 0
        }, """
            phone got \(phone.incoming.count), device \(device.incoming.count); faults: \(phone.fault ?? "-"), \(device.fault ?? "-"); \
            closed: phone \(rooms.phones.isClosed(pixel)), device \(rooms.devices.isClosed(reader)); \
            close acknowledged: phone \(phone.closeAcknowledged), device \(device.closeAcknowledged); \
            open: hall \(rooms.hall.openCount), study \(rooms.study.openCount); \
            hall \(rooms.hall.counters), drops \(rooms.hall.drops.sorted.map { "\($0.reason) \($0.count)" }); \
            study \(rooms.study.counters), drops \(rooms.study.drops.sorted.map { "\($0.reason) \($0.count)" })
            """)

        #expect(phone.fault == nil && device.fault == nil)
        #expect(phone.incoming == deviceBytes)
        #expect(device.incoming == phoneBytes)
        // Clamped on the way: the study keeps 16 frames of 512 bytes, the hall 8 of 1024.
        #expect(device.told == hx("10 0800 0002"), "the phone's open (16, 700), as the study and the hall clamped it")
        #expect(phone.told == hx("10 0600 0002"), "the device's open (6, 1000), as the hall and the study clamped it")
        #expect(phone.closeAcknowledged && device.closeAcknowledged)
        #expect(rooms.study.counters.framesQueued > 0, "the phone never fell behind: the test shows nothing")
        #expect(rooms.study.counters.framesUp == phone.framesSent)
        #expect(rooms.study.counters.framesDown == device.framesSent)
        #expect(rooms.hall.counters.framesUp == phone.framesSent)
        #expect(rooms.hall.counters.framesDown == device.framesSent)
        for (name, c) in [("hall", rooms.hall.counters), ("study", rooms.study.counters)] {
            #expect(c.finished == 1 && c.aborted == 0, "\(name): \(c)")
            #expect(c.resent == 0, "\(name): a lossless broker needs no resend")
        }
        #expect(rooms.hall.drops.total == 0 && rooms.study.drops.total == 0)
        #expect(try rooms.broker.retained("baton/streams/+/gateway").isEmpty)
    }
}

// MARK: - Two rooms for the end-to-end test

/// One end of a stream link played by the test: it sends `outgoing` in data frames within the
/// window and max data it was told, acknowledges what it has read (docs/protocol.md §5.3), and
/// closes once all is sent. A device answers the gateway's open with `answer`; a phone's open
/// went before (the gateway read it).
private final class Peer {
    let ends: Devices
    let address: LinkAddress
    let answer: [UInt8]?
    let window: UInt16
    let outgoing: [UInt8]
    private(set) var incoming: [UInt8] = []
    /// The open this end was told.
    private(set) var told: [UInt8]?
    private(set) var fault: String?
    private(set) var framesSent = 0
    private(set) var closeAcknowledged = false
    private var peerWindow = 0
    private var peerMaxData = 0
    private var sent = 0
    private var next: UInt32 = 0
    private var acked: UInt32 = 0
    private var closeSaid = false
    private var expected: UInt32 = 0
    private var ackSaid: UInt32 = 0
    private var read = 0

    init(_ ends: Devices, _ address: LinkAddress, answer: [UInt8]?, window: UInt16, outgoing: [UInt8]) {
        self.ends = ends; self.address = address; self.answer = answer; self.window = window; self.outgoing = outgoing
    }

    private static func u16(_ m: [UInt8], _ at: Int) -> Int { Int(m[at]) | Int(m[at + 1]) << 8 }
    private static func u32(_ m: [UInt8], _ at: Int) -> UInt32 {
        UInt32(m[at]) | UInt32(m[at + 1]) << 8 | UInt32(m[at + 2]) << 16 | UInt32(m[at + 3]) << 24
    }

    /// Takes what arrived, acknowledges it, sends what the window allows.
    func step() throws {
        let got = ends.received(address)
        while read < got.count {
            let m = got[read]
            read += 1
            switch m.first {
            case 0x10 where m.count == 5 && told == nil:
                told = m
                peerWindow = Self.u16(m, 1)
                peerMaxData = Self.u16(m, 3)
                if let answer { try ends.send(address, answer) }
            case 0x11 where m.count > 5 && Self.u32(m, 1) == expected:
                incoming += m.dropFirst(5)
                expected += 1
            case 0x12 where m.count == 7:
                acked = Self.u32(m, 1)
                peerWindow = Self.u16(m, 5)
                if closeSaid, acked == next { closeAcknowledged = true }
            case 0x13 where m.count == 5:
                break
            default:
                fault = fault ?? "unexpected \(hexString(m))"
            }
        }
        if expected != ackSaid {
            try ends.send(address, [0x12, UInt8(truncatingIfNeeded: expected), UInt8(truncatingIfNeeded: expected >> 8),
                                    UInt8(truncatingIfNeeded: expected >> 16), UInt8(truncatingIfNeeded: expected >> 24),
                                    UInt8(truncatingIfNeeded: window), UInt8(window >> 8)])
            ackSaid = expected
        }
        guard told != nil, !closeSaid else { return }
        while sent < outgoing.count, Int(next &- acked) < peerWindow {
            // Sizes vary: full frames, and a short one now and then.
            let size = min(next % 5 == 3 ? 37 : peerMaxData, outgoing.count - sent)
            try ends.send(address, data(next, Array(outgoing[sent ..< sent + size])))
            sent += size
            next += 1
            framesSent += 1
        }
        if sent == outgoing.count {
            try ends.send(address, [0x13, UInt8(truncatingIfNeeded: next), UInt8(truncatingIfNeeded: next >> 8),
                                    UInt8(truncatingIfNeeded: next >> 16), UInt8(truncatingIfNeeded: next >> 24)])
            closeSaid = true
        }
    }
}

/// The hall carries (its gateway owns the device, over a link it dials); the study bridges
/// (a phone in its room opened a link to the re-advertised activity). Two gateways, one broker.
private final class TwoRooms {
    let broker: MosquittoBroker
    let devices = Devices()
    let phones = Devices()
    var hall: StreamRelay
    var study: StreamRelay
    var hallClient: MQTTClient
    var studyClient: MQTTClient
    /// Both relays' time: it never moves, so nothing is resent or idle; the stream must go
    /// through on what the broker delivers.
    let now: Instant = .now
    private var probes: Set<String> = []

    init() throws {
        broker = try MosquittoBroker()
        hall = StreamRelay(config: RelayConfig(streamWindow: 8, streamMaxData: 1024), link: AnyDeviceLink(TestLink(devices: devices)),
                           gatewayID: "hall")
        study = StreamRelay(config: RelayConfig(streamWindow: 16, streamMaxData: 512), link: nil, gatewayID: "study")
        hallClient = try MQTTClient(config: MQTTConfig(port: broker.port, clientID: "hall", protocolVersion: .v5))
        studyClient = try MQTTClient(config: MQTTConfig(port: broker.port, clientID: "study", protocolVersion: .v5))
        hallClient.start(now: .now)
        studyClient.start(now: .now)
        // The study's end of the phone's link has little room (Linux's least, about 4 KiB: fewer
        // than the 8 frames of 517 bytes the device may have in flight): a phone that reads
        // slowly fills it.
        phones.sendBuffer = 2048
        try #require(try run { hallClient.isConnected && studyClient.isConnected }, "the clients did not connect")
        try hallClient.subscribe("baton/stream/+/+", qos: 1)
        try hallClient.subscribe("probe/hall", qos: 1)
        try utf8("probe").withUnsafeBytes { try hallClient.publish(topic: "probe/hall", payload: $0, qos: 1) }
        try #require(try run { probes.contains("probe/hall") }, "the hall's subscription did not take effect")
    }

    deinit {
        hallClient.disconnect()
        studyClient.disconnect()
    }

    func phoneOpens(window: UInt16, maxData: UInt16) throws {
        let channel = try phones.accept(pixel)
        study.bridge(channel: channel, device: deviceID, id: "e2e", topics: topics("e2e"), openTopic: openTopic("e2e"),
                     window: window, maxData: maxData, now: now, mqtt: &studyClient)
    }

    /// Both gateways' loops in one; the phone reads on one turn in four (its end is not even
    /// polled on the others), the device on every turn.
    @discardableResult
    func run(phone: Peer? = nil, device: Peer? = nil, limit: Duration = .seconds(60), until done: () -> Bool) throws -> Bool {
        var turn = 0
        // The two gateways' parts on one driver; the relays' deadlines are on the test's clock.
        var loop = TestLoop(parts: 5)
        return try loop.run(limit: limit, before: {
            turn += 1
            phones.paused = turn % 4 != 0
            phones.pump()
            devices.pump()
            try phone?.step()
            try device?.step()
        }, until: done) { driver in
            let hallPart = driver.add(&hallClient)
            let studyPart = driver.add(&studyClient)
            var hallLinks = DescriptorList(), studyLinks = DescriptorList()
            hall.pollDescriptors(into: &hallLinks.fds)
            study.pollDescriptors(into: &studyLinks.fds)
            let hallFDs = driver.add(&hallLinks)
            let studyFDs = driver.add(&studyLinks)
            var ends = DescriptorList(devices.pollDescriptors + (phones.paused ? [] : phones.pollDescriptors))
            driver.add(&ends)
            // A paused phone is read again within a millisecond.
            driver.add(deadline: driver.now + (phones.paused ? .milliseconds(1) : .milliseconds(100)))
            let after = driver.wait()
            var hallEvents: [MQTTEvent] = [], studyEvents: [MQTTEvent] = []
            hallClient.poll(now: after, ready: driver.ready(hallPart)) { hallEvents.append($0) }
            studyClient.poll(now: after, ready: driver.ready(studyPart)) { studyEvents.append($0) }
            for e in hallEvents {
                guard case .message(let m) = e else { continue }
                let level = m.topic.split(separator: "/", omittingEmptySubsequences: false)
                if m.topic == "probe/hall" {
                    probes.insert(m.topic)
                } else if level.count == 4, level[1] == "stream" {
                    // The hall owns the device (docs/relay.md §4): it takes the open.
                    hall.open(id: String(level[3]), topics: topics(String(level[3])), frame: m.payload,
                              admitted: .success(reader), now: now, mqtt: &hallClient)
                } else if level.count == 4, level[1] == "streams" {
                    if !hall.fromBroker(id: String(level[2]), level[3] == "up" ? .up : .down, m.payload, now: now, mqtt: &hallClient) {
                        hall.dropped("stream-unknown")
                    }
                }
            }
            for e in studyEvents {
                guard case .message(let m) = e else { continue }
                let level = m.topic.split(separator: "/", omittingEmptySubsequences: false)
                if level.count == 4, level[1] == "streams" {
                    if !study.fromBroker(id: String(level[2]), level[3] == "up" ? .up : .down, m.payload, now: now, mqtt: &studyClient) {
                        study.dropped("stream-unknown")
                    }
                }
            }
            hall.serve(driver.ready(hallFDs), now: now, mqtt: &hallClient)
            study.serve(driver.ready(studyFDs), now: now, mqtt: &studyClient)
        }
    }
}
