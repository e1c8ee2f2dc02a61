// Continuation streams through the gateway that carries them (docs/relay.md §7), against a
// real mosquitto (BatonTestSupport.MosquittoBroker), an endpoint and a device that the test
// plays byte for byte (docs/protocol.md §5.1, §5.3, §5.4).
//
//   endpoint (MQTT client) --…/S/up-->   gateway client + StreamRelay --link--> device (the test)
//   endpoint               <--…/S/down--                               <--link--
//
// The gateway's part of the loop is played as Gateway.swift plays it: an open on
// `baton/stream/<device>/S` goes to `open` (the test decides the target or the refusal, as the
// ownership rules would), `…/S/up` to `fromEndpoint`, `…/S/gateway` to `carried`; then the
// relay's links are polled and its timer ticks. The device's end of each link is a socketpair
// (RelayHarness.swift).
//
// The relay's clock is the test's: `now` moves only when a test says `advance`, so a retry or
// an idle timeout happens exactly when the test moves time past it, however slow the machine.
// Waits for the broker and the links are bounded with generous limits; after what a test
// waits for arrives, the loop runs a bounded extra moment (`settle`) in which a stray frame
// would arrive, and then every frame on the endpoint's `…/S/down` and on the device's link is
// compared exactly.

import BatonLibc
import Foundation
import Glibc
import Testing
import BatonMQTT
import BatonWire
import BatonTestSupport
import BatonRelay

// MARK: - The rig: broker, gateway client, endpoint, relay, one poll loop (StreamRig.swift)

private let gatewayID = "hall"

/// A device as the gateway resolved it from its beacon: the activities topic's 12 hex digits
/// and its link address.
private struct Device {
    let hex: String
    let link: LinkAddress
}

private let reader = Device(hex: "5a0000000001", link: LinkAddress(address: 0xC0_FF_EE_00_00_01, addressType: 1, psm: 0x0080))
private let tablet = Device(hex: "5a0000000002", link: LinkAddress(address: 0xC0_FF_EE_00_00_02, addressType: 1, psm: 0x0080))
private let badge = Device(hex: "5a0000000003", link: LinkAddress(address: 0xC0_FF_EE_00_00_03, addressType: 0, psm: 0x00C1))
private let known = [reader, tablet, badge]

/// The peer is the endpoint.
private final class Rig: StreamRig {
    /// What the gateway's ownership rules say about the next opens (docs/relay.md §7.2):
    /// nil, the device is this gateway's to reach (`Admission.check`'s answer).
    var refusal: Refusal?
    /// The gateways whose status is online, as the ownership rules would say (docs/rooms.md §4).
    var online: Set<String> = [gatewayID, "kitchen"]
    /// Everything the endpoint received on `baton/streams/+/down`, in order.
    private(set) var downMessages: [MQTTMessage] = []
    /// What the endpoint saw on each stream's `…/gateway`, in order ("" = cleared).
    private(set) var carriers: [String: [String]] = [:]

    init(_ config: RelayConfig = RelayConfig()) throws {
        try super.init(config, gatewayID: gatewayID, peerID: "endpoint")
        try subscribe()
    }

    /// Both clients subscribed as a gateway and an endpoint are.
    func subscribe(sourceLocation: SourceLocation = #_sourceLocation) throws {
        try subscribe(gateway: [("baton/stream/+/+", false), ("baton/streams/+/gateway", true)],
                      peer: ["baton/streams/+/down", "baton/streams/+/gateway"], sourceLocation: sourceLocation)
    }

    // MARK: the endpoint

    /// The endpoint publishes its open (docs/relay.md §7.2 step 1).
    func open(_ id: String, _ device: Device, _ bytes: [UInt8]) throws {
        try publish("baton/stream/\(device.hex)/\(id)", bytes)
    }

    /// The endpoint publishes frames on `…/S/up`, in order.
    func up(_ id: String, _ frames: [UInt8]...) throws {
        for f in frames { try publish(topics(id).up, f) }
    }

    private func publish(_ topic: String, _ payload: [UInt8]) throws {
        try payload.withUnsafeBytes { try peer.publish(topic: topic, payload: $0, qos: 1) }
    }

    /// Every frame the endpoint received on `…/S/down`, in order.
    func down(_ id: String) -> [[UInt8]] { downMessages.filter { $0.topic == topics(id).down }.map(\.payload) }

    /// The retained `…/S/gateway` of every stream, as a fresh subscriber reads them.
    func retainedCarriers() throws -> [String: String] {
        try broker.retained("baton/streams/+/gateway").mapValues { String(decoding: $0, as: UTF8.self) }
    }

    // MARK: the device

    /// Every link message the relay sent the device, over all its links.
    func toDevice(_ d: Device) -> [[UInt8]] { devices.received(d.link) }

    func fromDevice(_ d: Device, _ messages: [UInt8]...) throws {
        for m in messages { try devices.send(d.link, m) }
    }

    // MARK: what a message means here

    override func gatewayMessage(_ m: MQTTMessage) {
        let level = m.topic.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        if level.count == 4, level[1] == "stream" {
            let target = known.first { $0.hex == level[2] }?.link
            let admitted: Result<LinkAddress, Refusal> = if let refusal { .failure(refusal) }
                else if let target { .success(target) } else { .failure(.unknownDevice) }
            relay.open(id: level[3], topics: topics(level[3]), frame: m.payload, admitted: admitted, now: now,
                       mqtt: &gateway)
        } else if level.count == 4, level[1] == "streams", level[3] == "up" {
            if !relay.fromEndpoint(id: level[2], m.payload, now: now, mqtt: &gateway) { relay.dropped("stream-unknown") }
        } else if level.count == 4, level[1] == "streams", level[3] == "gateway" {
            _ = relay.carried(stream: level[2], payload: m.payload, retained: m.retained,
                              isOnline: { online.contains(String($0)) }, now: now)
        }
    }

    override func peerMessage(_ m: MQTTMessage) {
        let level = m.topic.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        if level.count == 4, level[3] == "down" {
            downMessages.append(m)
        } else if level.count == 4, level[3] == "gateway" {
            carriers[level[2], default: []].append(String(decoding: m.payload, as: UTF8.self))
        }
    }

    // MARK: waiting

    func waitDown(_ id: String, _ count: Int, sourceLocation: SourceLocation = #_sourceLocation) throws {
        try #require(run { down(id).count >= count },
                     "the endpoint got \(down(id).count) frame(s) on \(topics(id).down), not \(count): \(down(id).map(hexString))",
                     sourceLocation: sourceLocation)
    }

    func waitDevice(_ d: Device, _ count: Int, sourceLocation: SourceLocation = #_sourceLocation) throws {
        try #require(run { toDevice(d).count >= count },
                     "the device got \(toDevice(d).count) link message(s), not \(count): \(toDevice(d).map(hexString))",
                     sourceLocation: sourceLocation)
    }

    /// Runs until the relay has closed the device's newest link (the device reads EOF).
    func waitLinkClosed(_ d: Device, sourceLocation: SourceLocation = #_sourceLocation) throws {
        try #require(run { devices.isClosed(d.link) }, "the relay did not close the link to \(d.hex)",
                     sourceLocation: sourceLocation)
    }

    /// docs/relay.md §7.2: the endpoint's open reaches the device as `toDevice`; the device
    /// answers `deviceOpen`, which reaches the endpoint. Afterwards the endpoint's `…/S/up` is
    /// subscribed (the open on `…/S/down` was published after the subscription).
    func openStream(_ id: String, _ device: Device, endpointOpen: [UInt8] = hx("10 0800 0004"),
                    deviceOpen: [UInt8] = hx("10 0800 0004"), sourceLocation: SourceLocation = #_sourceLocation) throws {
        let (sent, told) = (toDevice(device).count, down(id).count)
        try open(id, device, endpointOpen)
        try waitDevice(device, sent + 1, sourceLocation: sourceLocation)
        try fromDevice(device, deviceOpen)
        try waitDown(id, told + 1, sourceLocation: sourceLocation)
    }
}


// MARK: - Tests

@Suite("Continuation streams through the carrying gateway (docs/relay.md §7)")
struct StreamRelayTests {

    // MARK: §7.2 opening

    @Test("§7.2: the device is told open(min(We, Wg), min(Me, Mg)); …/S/gateway says who carries it; the device's open reaches the endpoint with its max data clamped to Mg",
          arguments: [("10 0200 0002", "10 0200 0002"),   // window 2, max data 512: as it is
                      ("10 0200 0008", "10 0200 0002")])  // max data 2048: the gateway keeps 512
    func open(deviceOpen: String, endpointSees: String) throws {
        let rig = try Rig(RelayConfig(streamWindow: 4, streamMaxData: 512))
        try rig.open("s1", reader, hx("10 0800 0004"))  // window 8, max data 1024
        try rig.waitDevice(reader, 1)
        #expect(rig.toDevice(reader) == [hx("10 0400 0002")], "open: window 4, max data 512")
        #expect(rig.devices.links(reader.link) == 1)
        #expect(try rig.retainedCarriers() == ["baton/streams/s1/gateway": "hall"])

        try rig.fromDevice(reader, hx(deviceOpen))
        try rig.waitDown("s1", 1)
        rig.settle()
        #expect(rig.down("s1") == [hx(endpointSees)])
        #expect(rig.downMessages.allSatisfy { $0.qos == 1 && !$0.retained }, "§7.1: QoS 1, not retained")
        #expect(rig.carriers["s1"] == ["hall"])
        #expect(rig.toDevice(reader).count == 1)
        #expect(rig.relay.openCount == 1)
        #expect(rig.relay.counters.opened == 1)
    }

    // MARK: §7.3 flowing

    @Test("§7.3 endpoint → device: in order only; a duplicate gets the device's last ack again; a frame after a gap is dropped and counted")
    func upInOrderOnly() throws {
        let rig = try Rig()
        try rig.openStream("s1", reader)
        try rig.up("s1", hx("11 00000000 61"), hx("11 01000000 62"))
        try rig.waitDevice(reader, 3)
        #expect(rig.toDevice(reader) == [hx("10 0800 0004"), hx("11 00000000 61"), hx("11 01000000 62")])
        try rig.fromDevice(reader, hx("12 02000000 0800"))  // ack: frames 0 and 1 consumed, window 8
        try rig.waitDown("s1", 2)
        #expect(rig.down("s1") == [hx("10 0800 0004"), hx("12 02000000 0800")], "the device's ack, as it is")

        // A resend of frame 0 (the endpoint did not see the ack in time).
        try rig.up("s1", hx("11 00000000 61"))
        try rig.waitDown("s1", 3)
        rig.settle()
        #expect(rig.down("s1") == [hx("10 0800 0004"), hx("12 02000000 0800"), hx("12 02000000 0800")])
        #expect(rig.toDevice(reader).count == 3, "the duplicate does not reach the device")
        #expect(rig.drops("stream-duplicate") == 1)

        // Frame 3 while 2 is expected (2 was lost with the broker).
        try rig.up("s1", hx("11 03000000 64"))
        try #require(rig.run { rig.drops("stream-gap") == 1 })
        rig.settle()
        #expect(rig.toDevice(reader).count == 3, "dropped: not on the link")
        #expect(rig.down("s1").count == 3, "and nothing said to the endpoint: it resends from the gap")

        // The endpoint goes back to 2: both arrive, in order.
        try rig.up("s1", hx("11 02000000 63"), hx("11 03000000 64"))
        try rig.waitDevice(reader, 5)
        rig.settle()
        #expect(Array(rig.toDevice(reader).dropFirst(3)) == [hx("11 02000000 63"), hx("11 03000000 64")])
        #expect(rig.relay.openCount == 1)
        #expect(rig.relay.drops.total == 2)
    }

    @Test("§7.2, §7.3: the device's open and its acks reach the endpoint with their window capped at Wg")
    func theEndpointsWindowStaysWithinTheQueue() throws {
        let rig = try Rig(RelayConfig(streamWindow: 4))
        try rig.openStream("s1", reader, endpointOpen: hx("10 4000 0004"), deviceOpen: hx("10 4000 0004"))
        #expect(rig.down("s1").last == hx("10 0400 0004"), "open: window 64 offered, 4 told")
        try rig.up("s1", hx("11 00000000 61"))
        try rig.waitDevice(reader, 2)
        try rig.fromDevice(reader, hx("12 01000000 4000"))  // ack 1, window 64
        try rig.waitDown("s1", 2)
        #expect(rig.down("s1").last == hx("12 01000000 0400"), "ack: window 64 from the device, 4 told")
    }

    @Test("§7.3 endpoint → device: frames the link has no room for wait in the stream's queue and go in order on POLLOUT, close last; none is dropped, none waits for a resend")
    func upWaitsForTheLinksCredits() throws {
        let rig = try Rig(RelayConfig(streamWindow: 32))
        rig.devices.sendBuffer = 4096
        // Window 32, max data 1024, both ways: the endpoint may have 32 frames in flight.
        try rig.openStream("s1", reader, endpointOpen: hx("10 2000 0004"), deviceOpen: hx("10 2000 0004"))
        #expect(rig.down("s1").last == hx("10 2000 0004"), "the endpoint is told the window the queue holds")
        rig.devices.paused = true
        var sent: [[UInt8]] = []
        for n in 0..<32 {
            var f: [UInt8] = [0x11, UInt8(n), 0, 0, 0]
            f += [UInt8](repeating: UInt8(n), count: 1000)
            sent.append(f)
            try rig.up("s1", f)
        }
        try rig.up("s1", hx("13 20000000"))  // close at 32
        // Every frame is taken: what the link refused waits in the queue.
        try #require(rig.run { rig.relay.counters.framesUp == 32 }, "the relay took \(rig.relay.counters.framesUp) frames")
        rig.settle()
        #expect(rig.relay.counters.framesQueued > 0, "the link never refused a frame: the test shows nothing")
        #expect(rig.drops("stream-link-full") == 0)
        // The device reads again: all 32 in order, then the close, each exactly once.
        rig.devices.paused = false
        try rig.waitDevice(reader, 1 + 32 + 1)
        rig.settle()
        #expect(Array(rig.toDevice(reader).dropFirst()) == sent + [hx("13 20000000")])
        #expect(rig.relay.drops.total == 0)
    }

    @Test("§7.3 device → endpoint: every frame kept until acknowledged; no ack for relay.stream-retry: go-back-N from the first unacknowledged; acks go on to the device")
    func downKeptAndResent() throws {
        let rig = try Rig(RelayConfig(streamRetry: .milliseconds(200)))
        try rig.openStream("s1", reader)
        let open = hx("10 0800 0004")
        let d0 = hx("11 00000000 41"), d1 = hx("11 01000000 4242"), d2 = hx("11 02000000 434343")
        try rig.fromDevice(reader, d0, d1, d2)
        try rig.waitDown("s1", 4)
        rig.settle()
        #expect(rig.down("s1") == [open, d0, d1, d2], "once each: the relay's clock has not moved")

        rig.advance(.milliseconds(200))
        try rig.waitDown("s1", 7)
        rig.settle()
        #expect(rig.down("s1") == [open, d0, d1, d2, d0, d1, d2])
        #expect(rig.relay.counters.resent == 3)

        // The endpoint has frame 0: the ack goes on to the device; the next retry starts at 1.
        try rig.up("s1", hx("12 01000000 0800"))
        try rig.waitDevice(reader, 2)
        #expect(rig.toDevice(reader) == [open, hx("12 01000000 0800")])
        rig.advance(.milliseconds(200))
        try rig.waitDown("s1", 9)
        rig.settle()
        #expect(Array(rig.down("s1").dropFirst(7)) == [d1, d2])
        #expect(rig.relay.counters.resent == 5)

        // Everything acknowledged: nothing more is resent, however long the endpoint is quiet.
        try rig.up("s1", hx("12 03000000 0800"))
        try rig.waitDevice(reader, 3)
        #expect(rig.toDevice(reader).last == hx("12 03000000 0800"))
        rig.advance(.seconds(1))
        rig.settle()
        #expect(rig.down("s1").count == 9)
        #expect(rig.relay.counters.resent == 5)
        #expect(rig.relay.counters.framesDown == 3)
    }

    @Test("§5.3: the device keeps the endpoint's window; one frame beyond it is error protocol to both ends, and the stream ends")
    func deviceBeyondWindow() throws {
        let rig = try Rig()
        try rig.openStream("s1", reader, endpointOpen: hx("10 0200 0004"))  // window 2
        #expect(rig.toDevice(reader) == [hx("10 0200 0004")])
        let d = (0 ..< 5).map { hx("11 0\($0)000000 7\($0)") }
        try rig.fromDevice(reader, d[0], d[1])
        try rig.waitDown("s1", 3)
        // The endpoint consumed both: the window slides by two.
        try rig.up("s1", hx("12 02000000 0200"))
        try rig.waitDevice(reader, 2)
        try rig.fromDevice(reader, d[2], d[3], d[4])
        try rig.waitDown("s1", 6)
        try rig.waitLinkClosed(reader)
        rig.settle()

        let down = rig.down("s1")
        #expect(Array(down.prefix(5)) == [hx("10 0800 0004"), d[0], d[1], d[2], d[3]])
        #expect(down.count == 6)
        expectError(down.last, .protocolError, saying: "frame 4 outside the window")
        let toDevice = rig.toDevice(reader)
        #expect(Array(toDevice.prefix(2)) == [hx("10 0200 0004"), hx("12 02000000 0200")])
        #expect(toDevice.count == 3)
        expectError(toDevice.last, .protocolError, saying: "frame 4 outside the window")
        #expect(rig.relay.openCount == 0)
        #expect(rig.relay.counters.aborted == 1)
        #expect(try rig.retainedCarriers().isEmpty)
    }

    @Test("§5.3: a device frame that breaks §5.3 is error protocol to both ends, and the stream ends",
          arguments: [(["11 01000000 61"], "frame 1 outside the window"),                 // frame 1 before 0
                      (["13 02000000"], "closed at 2 after sending 0 frames"),           // close says more than sent
                      (["13 00000000", "11 00000000 61"], "frame 0 outside the window"), // data after its close
                      (["11 00000000"], "malformed")])                                   // data without bytes
    func deviceBreaksProtocol(frames: [String], detail: String) throws {
        let rig = try Rig()
        try rig.openStream("s1", reader)
        for f in frames { try rig.fromDevice(reader, hx(f)) }
        try rig.waitLinkClosed(reader)
        rig.settle()
        let down = rig.down("s1")
        #expect(down.count == frames.count + 1, "the open, the frames published before the bad one, the error")
        expectError(down.last, .protocolError, saying: detail)
        #expect(rig.toDevice(reader).count == 2)
        expectError(rig.toDevice(reader).last, .protocolError, saying: detail)
        #expect(rig.relay.counters.aborted == 1)
        #expect(rig.relay.openCount == 0)
        #expect(try rig.retainedCarriers().isEmpty)
    }

    @Test("§5.3: an endpoint frame that breaks §5.3 is error protocol to both ends, and the stream ends",
          arguments: [(["12 05000000 0800"], "an ack for frame 5"),                        // ack for frames never sent
                      (["13 01000000", "11 01000000 61"], "after its close"),             // data after its close
                      (["13 01000000", "13 02000000"], "close at 2 after close at 1"),     // two different closes
                      (["12 0000"], "malformed")])                                         // a cut ack
    func endpointBreaksProtocol(frames: [String], detail: String) throws {
        let rig = try Rig()
        try rig.openStream("s1", reader)
        try rig.up("s1", hx("11 00000000 61"))
        try rig.waitDevice(reader, 2)
        for f in frames { try rig.up("s1", hx(f)) }
        try rig.waitLinkClosed(reader)
        try rig.waitDown("s1", 2)
        rig.settle()
        #expect(rig.down("s1").count == 2)
        expectError(rig.down("s1").last, .protocolError, saying: detail)
        expectError(rig.toDevice(reader).last, .protocolError, saying: detail)
        #expect(rig.relay.counters.aborted == 1)
        #expect(rig.relay.openCount == 0)
    }

    @Test("relay.stream-max-data 1: the device's acks and an error with 100 bytes of detail still reach the endpoint")
    func smallestMaxData() throws {
        let rig = try Rig(RelayConfig(streamMaxData: 1))
        try rig.openStream("s1", reader, endpointOpen: hx("10 0800 0004"), deviceOpen: hx("10 0800 0100"))
        #expect(rig.toDevice(reader) == [hx("10 0800 0100")], "max data 1")
        try rig.up("s1", hx("11 00000000 61"))
        try rig.waitDevice(reader, 2)
        try rig.fromDevice(reader, hx("12 01000000 0800"))
        try rig.waitDown("s1", 2)
        #expect(rig.down("s1").last == hx("12 01000000 0800"))
        let error = hx("15 06") + utf8(String(repeating: "x", count: 100))
        try rig.fromDevice(reader, error)
        try rig.waitDown("s1", 3)
        try rig.waitLinkClosed(reader)
        rig.settle()
        #expect(rig.down("s1") == [hx("10 0800 0100"), hx("12 01000000 0800"), error])
    }

    // MARK: §7.3 ending

    @Test("§7.3 ending: both closes said and acknowledged: the link is hung up, …/S/gateway cleared, the slot free")
    func cleanEnd() throws {
        let rig = try Rig()
        try rig.openStream("s1", reader)
        try rig.up("s1", hx("11 00000000 71"), hx("13 01000000"))  // data 0, close at 1
        try rig.waitDevice(reader, 3)
        #expect(rig.toDevice(reader) == [hx("10 0800 0004"), hx("11 00000000 71"), hx("13 01000000")])

        try rig.fromDevice(reader, hx("12 01000000 0800"), hx("11 00000000 72"), hx("13 01000000"))
        try rig.waitDown("s1", 4)
        #expect(rig.down("s1") == [hx("10 0800 0004"), hx("12 01000000 0800"), hx("11 00000000 72"),
                                   hx("13 01000000")])
        #expect(rig.relay.openCount == 1, "the endpoint has not acknowledged the device's frame and close yet")

        try rig.up("s1", hx("12 01000000 0800"))
        try rig.waitLinkClosed(reader)
        rig.settle()
        #expect(rig.toDevice(reader).last == hx("12 01000000 0800"), "the endpoint's ack reaches the device before the hang-up")
        #expect(rig.toDevice(reader).count == 4)
        #expect(rig.down("s1").count == 4)
        #expect(rig.relay.counters.finished == 1)
        #expect(rig.relay.counters.aborted == 0)
        #expect(rig.relay.openCount == 0)
        #expect(rig.relay.nextDeadline == nil, "nothing left to wake up for")
        #expect(rig.carriers["s1"] == ["hall", ""])
        #expect(try rig.retainedCarriers().isEmpty, "…/S/gateway cleared")
    }

    @Test("§7.3 ending: the device's ack is the last word: the stream ends on it")
    func cleanEndOnDeviceAck() throws {
        let rig = try Rig()
        try rig.openStream("s1", reader)
        try rig.fromDevice(reader, hx("11 00000000 72"), hx("13 01000000"))
        try rig.waitDown("s1", 3)
        try rig.up("s1", hx("12 01000000 0800"), hx("11 00000000 71"), hx("13 01000000"))
        try rig.waitDevice(reader, 4)
        #expect(rig.toDevice(reader) == [hx("10 0800 0004"), hx("12 01000000 0800"), hx("11 00000000 71"),
                                         hx("13 01000000")])
        #expect(rig.relay.openCount == 1, "the device has not acknowledged the endpoint's frame and close yet")

        try rig.fromDevice(reader, hx("12 01000000 0800"))
        try rig.waitDown("s1", 4)
        try rig.waitLinkClosed(reader)
        rig.settle()
        #expect(rig.down("s1") == [hx("10 0800 0004"), hx("11 00000000 72"), hx("13 01000000"),
                                   hx("12 01000000 0800")])
        #expect(rig.toDevice(reader).count == 4)
        #expect(rig.relay.counters.finished == 1)
        #expect(rig.relay.counters.aborted == 0)
        #expect(rig.relay.openCount == 0)
        #expect(try rig.retainedCarriers().isEmpty)
    }

    @Test("§7.3 ending: a device that hangs up once both closes are said: its frames are still resent until the endpoint acknowledges them; then finished")
    func deviceHangsUpAfterBothCloses() throws {
        let rig = try Rig(RelayConfig(streamRetry: .milliseconds(200)))
        try rig.openStream("s1", reader)
        try rig.up("s1", hx("13 00000000"))  // the endpoint sends nothing: close at 0
        try rig.waitDevice(reader, 2)
        #expect(rig.toDevice(reader).last == hx("13 00000000"))
        try rig.waitDown("s1", 2)  // ack 0, said for a device that acknowledged nothing (closeAckRule)
        try rig.fromDevice(reader, hx("11 00000000 72"), hx("13 01000000"))
        try rig.waitDown("s1", 4)
        try rig.devices.hangUp(reader.link)
        try #require(rig.run { rig.relayLinks == 0 }, "the relay saw the hang-up")
        rig.settle()
        #expect(rig.down("s1").count == 4, "no error: a hang-up after both closes is the device's end")
        #expect(rig.relay.openCount == 1)

        rig.advance(.milliseconds(200))
        try rig.waitDown("s1", 6)
        #expect(Array(rig.down("s1").suffix(2)) == [hx("11 00000000 72"), hx("13 01000000")], "resent, close included")
        try rig.up("s1", hx("12 01000000 0800"))
        try #require(rig.run { rig.relay.openCount == 0 })
        rig.settle()
        #expect(rig.down("s1").count == 6)
        #expect(rig.relay.counters.finished == 1)
        #expect(rig.relay.counters.aborted == 0)
        #expect(try rig.retainedCarriers().isEmpty)
    }

    @Test("§7.3 ending: an endpoint's close whose frames the device already acknowledged gets that ack again (ack 0 for an empty direction)")
    func closeAckRule() throws {
        let rig = try Rig()
        try rig.openStream("s1", reader)
        try rig.up("s1", hx("11 00000000 61"), hx("11 01000000 62"))
        try rig.waitDevice(reader, 3)
        try rig.fromDevice(reader, hx("12 02000000 0800"))
        try rig.waitDown("s1", 2)
        try rig.up("s1", hx("13 02000000"))
        try rig.waitDevice(reader, 4)
        try rig.waitDown("s1", 3)
        rig.settle()
        #expect(rig.toDevice(reader).last == hx("13 02000000"))
        #expect(rig.down("s1") == [hx("10 0800 0004"), hx("12 02000000 0800"), hx("12 02000000 0800")],
                "the ack after the close tells the endpoint its close arrived")
        // The endpoint resends its close (it missed that ack): said again, the link sees one close.
        try rig.up("s1", hx("13 02000000"))
        try rig.waitDown("s1", 4)
        rig.settle()
        #expect(rig.down("s1").last == hx("12 02000000 0800"))
        #expect(rig.toDevice(reader).count == 4)

        // An empty direction: the endpoint closes at 0 before the device acknowledged anything.
        try rig.openStream("s2", tablet, deviceOpen: hx("10 0300 0004"))
        try rig.up("s2", hx("13 00000000"))
        try rig.waitDevice(tablet, 2)
        try rig.waitDown("s2", 2)
        rig.settle()
        #expect(rig.toDevice(tablet) == [hx("10 0800 0004"), hx("13 00000000")])
        #expect(rig.down("s2") == [hx("10 0300 0004"), hx("12 00000000 0300")], "ack 0 with the device's window")
    }

    // MARK: §7.3 aborting

    @Test("§7.3 aborting: the endpoint's reset goes to the device and the stream ends")
    func endpointReset() throws {
        let rig = try Rig()
        try rig.openStream("s1", reader)
        try rig.up("s1", hx("14 01"))  // reset: cancelled
        try rig.waitDevice(reader, 2)
        try rig.waitLinkClosed(reader)
        rig.settle()
        #expect(rig.toDevice(reader) == [hx("10 0800 0004"), hx("14 01")])
        #expect(rig.down("s1") == [hx("10 0800 0004")])
        #expect(rig.relay.counters.aborted == 1)
        #expect(rig.relay.openCount == 0)
        #expect(try rig.retainedCarriers().isEmpty)
    }

    @Test("§7.3 aborting: the device's error goes to the endpoint as it is, and the stream ends")
    func deviceError() throws {
        let rig = try Rig()
        try rig.openStream("s1", reader)
        let error = hx("15 06") + utf8("the article was closed")
        try rig.fromDevice(reader, error)
        try rig.waitDown("s1", 2)
        try rig.waitLinkClosed(reader)
        rig.settle()
        #expect(rig.down("s1") == [hx("10 0800 0004"), error])
        #expect(rig.toDevice(reader) == [hx("10 0800 0004")])
        #expect(rig.relay.counters.aborted == 1)
        #expect(rig.relay.openCount == 0)
        #expect(try rig.retainedCarriers().isEmpty)
    }

    @Test("§7.3 aborting: the link drops mid-stream: error unreachable to the endpoint")
    func linkDrops() throws {
        let rig = try Rig()
        try rig.openStream("s1", reader)
        try rig.up("s1", hx("11 00000000 61"))
        try rig.waitDevice(reader, 2)
        try rig.devices.hangUp(reader.link)
        try rig.waitDown("s1", 2)
        rig.settle()
        let down = rig.down("s1")
        #expect(down.count == 2)
        expectError(down.last, .unreachable, saying: "the link to the device dropped")
        #expect(rig.relay.counters.aborted == 1)
        #expect(rig.relay.openCount == 0)
        #expect(try rig.retainedCarriers().isEmpty)
    }

    @Test("§7.3 aborting: nothing moved for relay.stream-idle: error idle both ways")
    func idle() throws {
        let rig = try Rig(RelayConfig(streamIdle: .milliseconds(300)))
        try rig.openStream("s1", reader)
        rig.advance(.milliseconds(200))
        try rig.up("s1", hx("11 00000000 61"))  // something moves at 200 ms
        try rig.waitDevice(reader, 2)
        rig.advance(.milliseconds(200))            // 400 ms: 200 ms after the last frame
        rig.settle()
        #expect(rig.down("s1").count == 1, "not idle yet")
        #expect(rig.relay.openCount == 1)

        rig.advance(.milliseconds(100))            // 500 ms: 300 ms after the last frame
        try rig.waitDown("s1", 2)
        try rig.waitLinkClosed(reader)
        rig.settle()
        #expect(rig.down("s1").count == 2)
        expectError(rig.down("s1").last, .idle, saying: "relay.stream-idle")
        #expect(rig.toDevice(reader).count == 3)
        expectError(rig.toDevice(reader).last, .idle, saying: "relay.stream-idle")
        #expect(rig.relay.counters.aborted == 1)
        #expect(rig.relay.openCount == 0)
        #expect(try rig.retainedCarriers().isEmpty)
    }

    @Test("§7.3 aborting: the gateway stops: error gone to the endpoint and the device")
    func stop() throws {
        let rig = try Rig()
        try rig.openStream("s1", reader)
        rig.relay.stop(mqtt: &rig.gateway)
        #expect(rig.relay.openCount == 0)
        try rig.waitDown("s1", 2)
        try rig.waitLinkClosed(reader)
        rig.settle()
        #expect(rig.down("s1").count == 2)
        expectError(rig.down("s1").last, .gone, saying: "the gateway is stopping")
        #expect(rig.toDevice(reader).count == 2)
        expectError(rig.toDevice(reader).last, .gone, saying: "the gateway is stopping")
        #expect(try rig.retainedCarriers().isEmpty)
    }

    // MARK: §7.2 refusals

    @Test("Capacity: relay.streams + 1 is refused busy; a slot freed takes the next open")
    func streamsPlusOne() throws {
        let rig = try Rig(RelayConfig(streams: 2))
        try rig.openStream("s1", reader)
        try rig.openStream("s2", tablet)
        try rig.open("s3", badge, hx("10 0800 0004"))
        try rig.waitDown("s3", 1)
        rig.settle()
        #expect(rig.down("s3").count == 1)
        expectError(rig.down("s3").first, .busy, saying: "relay.streams")
        #expect(rig.devices.links(badge.link) == 0)
        #expect(refused(rig.relay, .busy) == 1)
        #expect(rig.relay.openCount == 2)
        #expect(try rig.retainedCarriers() == ["baton/streams/s1/gateway": "hall", "baton/streams/s2/gateway": "hall"])

        try rig.up("s1", hx("14 01"))
        try rig.waitLinkClosed(reader)
        try rig.openStream("s3", badge)
        #expect(rig.toDevice(badge) == [hx("10 0800 0004")])
        #expect(rig.down("s3").last == hx("10 0800 0004"))
        #expect(rig.relay.openCount == 2)
    }

    @Test("§7.2: an open the gateway must refuse: error unreachable with the reason as its detail; no link")
    func refusal() throws {
        let rig = try Rig()
        rig.refusal = .noStreams
        try rig.open("s1", reader, hx("10 0800 0004"))
        try rig.waitDown("s1", 1)
        rig.settle()
        #expect(rig.down("s1") == [hx("15 03") + utf8("the activity does not offer continuation streams")])
        #expect(rig.devices.links(reader.link) == 0)
        #expect(refused(rig.relay, .unreachable) == 1)
        #expect(rig.relay.openCount == 0)
        #expect(try rig.retainedCarriers().isEmpty)
    }

    @Test("§7.3 garbage: an open that is not an open frame is refused with error protocol and counted",
          arguments: [("68656c6c6f", "unsupported", "malformed"),        // "hello": type 0x68
                      ("11 00000000 61", "stream-not-open", "must be open"), // a data frame
                      ("10 0000 0004", "link-window", "malformed")])         // window 0
    func malformedOpen(open: String, drop: String, detail: String) throws {
        let rig = try Rig()
        try rig.open("s1", reader, hx(open))
        try rig.waitDown("s1", 1)
        rig.settle()
        #expect(rig.down("s1").count == 1)
        expectError(rig.down("s1").first, .protocolError, saying: detail)
        #expect(rig.drops(drop) == 1)
        #expect(refused(rig.relay, .protocolError) == 1)
        #expect(rig.devices.links(reader.link) == 0)
        #expect(rig.relay.openCount == 0)
    }

    @Test("§7.2: an open the endpoint repeats gets the device's open again, on the same link")
    func repeatedOpen() throws {
        let rig = try Rig()
        try rig.openStream("s1", reader, deviceOpen: hx("10 0400 0001"))
        try rig.open("s1", reader, hx("10 0800 0004"))
        try rig.waitDown("s1", 2)
        rig.settle()
        #expect(rig.down("s1") == [hx("10 0400 0001"), hx("10 0400 0001")])
        #expect(rig.devices.links(reader.link) == 1, "no second link")
        #expect(rig.toDevice(reader) == [hx("10 0800 0004")], "the device is not asked again")
        #expect(rig.relay.counters.opened == 1)
        #expect(rig.relay.openCount == 1)
    }

    // MARK: §7.3 a broker restart

    @Test("§7.3: after a reconnect the device's open, its last ack and every unacknowledged frame are published again, …/S/gateway too")
    func reconnect() throws {
        let rig = try Rig()
        try rig.openStream("s1", reader)
        try rig.up("s1", hx("11 00000000 61"))
        try rig.waitDevice(reader, 2)
        try rig.fromDevice(reader, hx("12 01000000 0800"), hx("11 00000000 41"), hx("11 01000000 42"))
        try rig.waitDown("s1", 4)
        try rig.up("s1", hx("12 01000000 0800"))  // the endpoint has frame 0, not yet 1
        try rig.waitDevice(reader, 3)

        // mosquitto restarts without persistence: no session, nothing retained.
        try rig.broker.restart()
        try #require(rig.run { rig.gatewayConnects == 2 && rig.peerConnects == 2 }, "both clients reconnect")
        try rig.subscribe()
        #expect(try rig.retainedCarriers().isEmpty, "the new broker retains nothing")
        // Gateway.swift calls this on `.connected`; here after the endpoint subscribed again, so
        // what it publishes has someone to reach.
        let before = rig.down("s1").count
        rig.relay.reconnected(now: rig.now, mqtt: &rig.gateway)
        try rig.waitDown("s1", before + 3)
        rig.settle()
        #expect(Array(rig.down("s1").dropFirst(before)) == [hx("10 0800 0004"), hx("12 01000000 0800"),
                                                             hx("11 01000000 42")])
        #expect(try rig.retainedCarriers() == ["baton/streams/s1/gateway": "hall"])
        #expect(rig.relay.counters.resent == 1)

        // …/S/up is subscribed again: the stream goes on.
        try rig.up("s1", hx("11 01000000 62"))
        try rig.waitDevice(reader, 4)
        #expect(rig.toDevice(reader).last == hx("11 01000000 62"))
    }

    // MARK: §7.3 a gateway that dies

    @Test("§7.3: a gateway goes offline: its streams' endpoints get error gone and their …/gateway is cleared; this gateway's own are untouched")
    func gatewayOffline() throws {
        let rig = try Rig()
        try rig.openStream("h1", reader)
        // kitchen's streams, as its retained messages say.
        try rig.broker.publish(topic: "baton/streams/k1/gateway", payload: utf8("kitchen"), retain: true)
        try rig.broker.publish(topic: "baton/streams/k2/gateway", payload: utf8("kitchen"), retain: true)
        // Junk on the directory's topic (§7.3 "The stream directory"): not retained, and retained
        // but naming a gateway that is not online. Neither is taken.
        try rig.broker.publish(topic: "baton/streams/j1/gateway", payload: utf8("kitchen"), retain: false)
        try rig.broker.publish(topic: "baton/streams/j2/gateway", payload: utf8("ghost"), retain: true)
        try #require(rig.run { rig.relay.directory == ["h1": "hall", "k1": "kitchen", "k2": "kitchen"] },
                     "directory: \(rig.relay.directory)")
        rig.settle()
        #expect(rig.relay.directory == ["h1": "hall", "k1": "kitchen", "k2": "kitchen"])
        #expect(rig.drops("stream-carrier-not-retained") == 1 && rig.drops("stream-carrier-offline") == 1)
        // A stale entry naming kitchen for a stream this gateway carries now.
        _ = rig.relay.carried(stream: "h1", payload: utf8("kitchen"), retained: true, isOnline: { _ in true }, now: rig.now)

        rig.relay.gatewayWentOffline("kitchen", topics: Topics(prefix: "baton"),
                                     mqtt: &rig.gateway)
        try rig.waitDown("k1", 1)
        try rig.waitDown("k2", 1)
        rig.settle()
        for id in ["k1", "k2"] {
            #expect(rig.down(id) == [hx("15 06") + utf8("gateway kitchen went offline")])
        }
        // The retained junk stays on the broker, untaken.
        #expect(try rig.retainedCarriers() == ["baton/streams/h1/gateway": "hall", "baton/streams/j2/gateway": "ghost"])
        #expect(rig.relay.counters.goneForOthers == 2)
        #expect(rig.relay.directory["k1"] == nil && rig.relay.directory["k2"] == nil)
        // h1 goes on.
        #expect(rig.down("h1") == [hx("10 0800 0004")])
        #expect(rig.relay.openCount == 1)
        #expect(!rig.devices.isClosed(reader.link))
    }

    // MARK: §7.3 the stream directory

    @Test("§7.3 the stream directory: only a retained claim naming an online gateway is taken; junk is dropped by reason; an empty retained claim removes the entry")
    func directoryTakesOnlyWhatGatewaysWrite() {
        var relay = StreamRelay(config: RelayConfig(streams: 2), link: nil, gatewayID: gatewayID)
        let online: (Substring) -> Bool = { $0 == "kitchen" || $0 == "hall" }
        let now = Instant.now
        func claim(_ id: String, _ payload: [UInt8], retained: Bool? = true) {
            #expect(relay.carried(stream: id, payload: payload, retained: retained, isOnline: online, now: now) == nil)
        }
        claim("n1", utf8("kitchen"), retained: false)           // not retained
        claim("m1", utf8("Kitchen"))                            // upper case
        claim("m2", utf8("kitchen "))                           // a space
        claim("m3", utf8("kit/chen"))                           // a topic level
        claim("m4", [0xFF, 0x00])                               // not UTF-8
        claim("m5", Array(repeating: 0x61, count: 65))          // 65 characters
        claim("o1", utf8("office"))                             // unknown here
        claim("o2", utf8("ghost"))                              // or offline: the same
        #expect(relay.directory.isEmpty)
        #expect(relay.drops.sorted.map { "\($0.reason)=\($0.count)" }
                == ["stream-carrier-malformed=5", "stream-carrier-not-retained=1", "stream-carrier-offline=2"])

        claim("k1", utf8("kitchen"))
        claim("h1", utf8("hall"), retained: nil)                // MQTT 3.1.1: the flag cannot say
        claim("x1", Array(repeating: 0x61, count: 64))          // 64 characters, but not online
        #expect(relay.directory == ["k1": "kitchen", "h1": "hall"])
        // An empty claim ends the entry only when retained; a stream nobody knows is no drop.
        claim("k1", [], retained: false)
        #expect(relay.directory["k1"] == "kitchen")
        claim("k1", [])
        claim("zz", [])
        #expect(relay.directory == ["h1": "hall"])
        #expect(relay.drops.total == 10)
    }

    @Test("Capacity: relay.streams entries per carrier; + 1 forgets that carrier's oldest, counted and logged naming relay.streams; other carriers keep theirs")
    func directoryPerCarrierPlusOne() {
        var relay = StreamRelay(config: RelayConfig(streams: 3), link: nil, gatewayID: gatewayID)
        #expect(relay.directoryPerCarrier == 3)
        var now = Instant.now
        func claim(_ id: String, _ carrier: String) -> String? {
            relay.carried(stream: id, payload: utf8(carrier), retained: true, isOnline: { _ in true }, now: now)
        }
        for i in 0 ..< 3 { #expect(claim("k\(i)", "kitchen") == nil) }
        #expect(claim("h0", "hall") == nil)
        // At capacity: nothing dropped. A carrier's claim said again refreshes it (k0 is now
        // kitchen's newest), and takes no room.
        #expect(relay.drops.total == 0)
        #expect(claim("k0", "kitchen") == nil)
        #expect(relay.directory.count == 4)

        // Capacity + 1: kitchen's oldest, k1, goes; hall's entry stays.
        let line = claim("k3", "kitchen")
        #expect(line?.contains("relay.streams (3)") == true, "\(line ?? "no log line")")
        #expect(relay.directory == ["k0": "kitchen", "k2": "kitchen", "k3": "kitchen", "h0": "hall"])
        #expect(relay.drops.sorted.map(\.reason) == ["stream-directory-full"])
        // Again within a minute: counted, not logged; then k2 goes.
        #expect(claim("k4", "kitchen") == nil)
        #expect(relay.directory["k2"] == nil && relay.directory.count == 4)
        #expect(relay.drops.total == 2)
        now += .seconds(61)
        #expect(claim("k5", "kitchen") != nil)

        // A stream that moves to another carrier leaves kitchen's count: room for one more.
        #expect(claim("k3", "hall") == nil)
        #expect(claim("k6", "kitchen") == nil)
        #expect(relay.drops.total == 3)
        // 200 claims from one carrier: the directory stays at relay.streams for it.
        for i in 0 ..< 200 { _ = claim("j\(i)", "kitchen") }
        #expect(relay.directory.filter { $0.value == "kitchen" }.count == 3)
        #expect(relay.directory.filter { $0.value == "hall" }.count == 2)
        #expect(relay.drops.total == 203)
    }
}
