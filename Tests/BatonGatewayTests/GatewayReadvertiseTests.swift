// Re-advertising through the gateway's own loop (docs/relay.md §9), in process, on a real
// mosquitto: the office gateway follows the hall's activity messages and puts them on its
// controller, and a phone's link fetches through the hall. The controller is the test's
// (`AdvertisingController`): it records what the gateway puts on the air, and hands it the
// phone's end of a socketpair as a listener would; BlueZ's own is exercised in the VM
// (docs/vm.md step 12).
import BatonLibc
@testable import BatonGateway
import BatonHCI
import BatonKeys
import BatonMQTT
import BatonRelay
import BatonTestSupport
import BatonWire
import CBlueZ  // its shim includes <sys/socket.h>: import it so SOCK_SEQPACKET has one owner
import Foundation
import Glibc
import Testing

/// The building both re-advertising tests play (this file's and ManagementLateTests): a keyed
/// group, its device 4 owned by the hall, and the office gateway that re-advertises it.
enum HallsDevice {
    static let secret = "BATON-GROUP-V1:AAAQEAYEAUDAOCAJBIFQYDIOB4QL"
    static let group = try! GroupKeys.derive(secret: try! GroupSecret(text: secret))
    static let device = DeviceIdentity.id(groupHash: group.groupHash, number: 4)
    static let deviceText = ActivityBeacon.deviceIDText(device)

    /// The hall's activity message for device 4 (docs/mqtt.md §2).
    static func activity(seq: Int) -> [UInt8] {
        Array("""
        {"device":"\(deviceText)","state":"current","change":"saved","seq":\(seq),"type_hash":"be9b4bb7",\
        "group":"\(String(format: "%08x", group.groupHash))","supports_streams":true,"has_web_url":false,"relayed":false,\
        "psm":128,"verified":true,"identity":4,"room":"Hall","gateway":"hall","rssi":-61,\
        "first_seen":"2026-11-23T09:14:03.512204Z","changed":"2026-11-23T09:20:41.004318Z"}
        """.utf8)
    }

    /// The office gateway: two re-advertising slots, the group's beacon key, no device link.
    static func officeConfig(broker: MosquittoBroker, radio: String) throws -> GatewayConfig {
        var config = GatewayConfig.defaults(hostName: "office")
        try config.apply(GatewayOverrides(broker: "mqtt://127.0.0.1:\(broker.port)", radio: radio, room: "Office", id: "office"))
        config.readvertise = 2
        config.security.beaconKey = group.beaconKey
        config.relayLink = .none
        return config
    }

    /// The hall is online and has published device 4's activity before the office starts.
    static func hallPublishes(seq: Int, on broker: MosquittoBroker) throws {
        try broker.publish(topic: "baton/gateways/hall/status", payload: Array("online".utf8), retain: true)
        try broker.publish(topic: "baton/activities/\(deviceText)", payload: activity(seq: seq), retain: true)
    }
}

private let group = HallsDevice.group
private let device = HallsDevice.device
private let deviceText = HallsDevice.deviceText
private func activity(seq: Int) -> [UInt8] { HallsDevice.activity(seq: seq) }

/// The controller the office gateway re-advertises through, played by the test.
private final class TestController: AdvertisingController {
    let adapter = "test"
    let psms: [UInt16] = [0x0091, 0x0092]
    /// Per slot, a pipe the test makes readable when a phone is waiting.
    let wakes: [(read: Int32, write: Int32)]
    var waiting: [Int: Int32] = [:]
    /// What is on the air, per slot, and every call in order.
    var air: [Int: [UInt8]] = [:]
    var calls: [String] = []
    var withdrewAll = false
    /// While true the kernel refuses every advertisement.
    var refusing = false
    /// Slots someone else removed, told through `events` (as mgmt's Advertising Removed).
    var removed: [Int] = []
    let events: (read: Int32, write: Int32)

    init() {
        let pipes: [(read: Int32, write: Int32)] = (0..<3).map { _ in
            var ends: [Int32] = [-1, -1]
            precondition(pipe(&ends) == 0)
            _ = Glibc.fcntl(ends[0], F_SETFL, Glibc.fcntl(ends[0], F_GETFL) | O_NONBLOCK)
            return (ends[0], ends[1])
        }
        wakes = Array(pipes[0..<2])
        events = pipes[2]
    }
    deinit { for w in wakes + [events] { close(w.read); close(w.write) } }

    var listenerFDs: [Int32] { wakes.map(\.read) }  // a test: allocating here is fine
    var eventFD: Int32 { events.read }
    var acceptsL2CAP: Bool { false }
    func advertise(_ k: Int, _ data: [UInt8]) throws(ManagementError) {
        calls.append("advertise \(k)")
        if refusing { throw .refused(adapter: adapter, command: "Add Advertising", status: ManagementStatus(rawValue: 0x0C)) }
        air[k] = data
    }
    func withdraw(_ k: Int) throws(ManagementError) { air[k] = nil; calls.append("withdraw \(k)") }
    func withdrawAll() { air.removeAll(); withdrewAll = true }
    var removalsPending: Bool { false }
    func removedSlots(_ body: (Int) -> Void) {
        var byte: UInt8 = 0
        while read(events.read, &byte, 1) == 1 {}
        for k in removed { body(k) }
        removed.removeAll()
    }
    /// bluetoothd (say) removes slot k's advertisement.
    func removedBySomeoneElse(_ k: Int) {
        air[k] = nil
        removed.append(k)
        var byte: UInt8 = 1
        _ = write(events.write, &byte, 1)
    }
    func accept(_ k: Int) throws(LinkError) -> (fd: Int32, peer: LinkAddress)? {
        var byte: UInt8 = 0
        _ = read(wakes[k].read, &byte, 1)
        guard let fd = waiting.removeValue(forKey: k) else { return nil }
        return (fd, LinkAddress(address: 0xC0FFEE, addressType: 1, psm: psms[k]))
    }

    /// A phone connects to slot k: the test keeps the returned end.
    func phoneConnects(_ k: Int) -> Int32 {
        var pair: [Int32] = [-1, -1]
        precondition(socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0)
        waiting[k] = pair[0]
        var byte: UInt8 = 1
        _ = write(wakes[k].write, &byte, 1)
        return pair[1]
    }

    /// The beacon on the air in whichever slot holds it.
    var onAir: ActivityBeacon? { air.keys.sorted().lazy.compactMap { self.beacon($0) }.first }

    /// Slot k's beacon as a phone decodes it.
    func beacon(_ k: Int) -> ActivityBeacon? {
        air[k].flatMap { data in data.withUnsafeBytes { try? ActivityBeacon.find(inAdvertisingData: $0, companyID: 0xFFFF) } }
    }
}

/// An empty btsnoop capture (datalink 1002): a radio with nothing to say.
private let emptyCapture: [UInt8] = Array("btsnoop\0".utf8) + [0, 0, 0, 1, 0, 0, 0x03, 0xEA]

@Suite(.serialized) struct GatewayReadvertiseTests {
    @Test("§9 through the loop: the hall's retained activity goes on the office's air, a save follows live, a phone's fetch is answered by the hall, a removed slot is put back, a refused one retried, an offline owner's and a cleared activity taken off, and a clean stop leaves nothing on the air")
    func throughTheLoop() throws {
        let broker = try MosquittoBroker()
        let config = try HallsDevice.officeConfig(broker: broker, radio: "capture:empty.btsnoop")
        try HallsDevice.hallPublishes(seq: 258, on: broker)

        let controller = TestController()
        var radio = try RadioCapture(file: emptyCapture, pace: .asFastAsPossible)
        var mqtt = try MQTTClient(config: GatewayLauncher.mqttConfig(config))
        let start = Instant.now
        mqtt.start(now: start)
        try radio.start(now: start)
        var gateway = Gateway(config: config, radio: radio, mqtt: mqtt, keys: try GatewayKeys.make(config),
                              readvertising: controller, log: Logger(), environment: [:], now: start,
                              unixMicroseconds: 1_790_000_000_000_000)
        /// Turns the loop until `done` holds, for at most `seconds`.
        func turn(within seconds: Int = 10, until done: () -> Bool) -> Bool {
            let end = Instant.now + .seconds(seconds)
            while Instant.now < end {
                _ = gateway.turn()
                if done() { return true }
            }
            return false
        }

        try #require(turn { controller.air[0] != nil }, "the retained activity did not go on the air: \(controller.calls)")
        // The loop was sized from the configuration alone, before the parts existed: it holds
        // what they say they poll (two listeners and the management socket among them).
        #expect(gateway.partsDescriptorLimit == gateway.loop.descriptorLimit)
        #expect(gateway.loop.parts == gateway.loop.partLimit - 2, "every part but the ESPHome server and its connections, re-advertising included")
        let first = try #require(controller.beacon(0))
        #expect(first.deviceID == device && first.sequence == 258 && first.psm == 0x0091)
        #expect(first.flags.contains(.relayed) && first.flags.contains(.supportsStreams))
        #expect(first.verify(companyID: 0xFFFF, authenticator: try BeaconTagger(key: group.beaconKey)))

        // Past the retained scan (5 s), the subscription stays: a save goes on the air at once.
        _ = turn(within: 6) { false }
        try broker.publish(topic: "baton/activities/\(deviceText)", payload: activity(seq: 259), retain: true)
        try #require(turn { controller.beacon(0)?.sequence == 259 }, "the save did not follow: \(controller.calls)")

        // A phone connects to slot 0 and fetches; the hall (the test) answers on its route.
        var owner = try MQTTClient(config: MQTTConfig(port: broker.port, clientID: "hall", protocolVersion: .v5))
        owner.start(now: .now)
        var requests: [MQTTMessage] = []
        func pumpOwner() {
            var p = pollfd(fd: owner.socket, events: Int16(POLLIN) | (owner.wantsWrite ? Int16(POLLOUT) : 0), revents: 0)
            if p.fd >= 0 { _ = poll(&p, 1, 0) }
            owner.poll(now: .now, readable: p.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0,
                       writable: p.revents & Int16(POLLOUT) != 0) { event in
                if case .message(let m) = event { requests.append(m) }
            }
        }
        try #require(turn { pumpOwner(); return owner.isConnected }, "the hall's client did not connect")
        try owner.subscribe("baton/fetch/+", qos: 1)
        // The subscription is in place once a probe published after it comes back.
        try owner.subscribe("probe/hall", qos: 1)
        try Array("probe".utf8).withUnsafeBytes { try owner.publish(topic: "probe/hall", payload: $0, qos: 1) }
        try #require(turn { pumpOwner(); return requests.contains { $0.topic == "probe/hall" } })
        requests.removeAll()
        let phone = controller.phoneConnects(0)
        defer { close(phone) }
        let fetch: [UInt8] = [0x01, 0x03, 0x01]  // fetch, seq 259
        #expect(fetch.withUnsafeBytes { send(phone, $0.baseAddress, $0.count, 0) } == 3)
        try #require(turn { pumpOwner(); return !requests.isEmpty }, "the phone's fetch did not reach the hall")
        let route = requests[0]
        #expect(route.topic == "baton/fetch/\(deviceText)")
        let body = try #require(JSONSerialization.jsonObject(with: Data(route.payload)) as? [String: String])
        #expect(body["continue"] == "Office", "the phone continues it in the office: \(body)")
        let payload: [UInt8] = [0xA1, 0x61, 0x76, 0x01]
        try payload.withUnsafeBytes {
            try owner.publish(topic: route.properties.responseTopic ?? "", payload: $0, qos: 1, retain: false,
                              properties: MQTTProperties(correlationData: route.properties.correlationData,
                                                         userProperties: [MQTTUserProperty("status", "ok"), MQTTUserProperty("seq", "259")]))
        }
        var answer = [UInt8](repeating: 0, count: 64)
        var got = -1
        try #require(turn {
            pumpOwner()
            got = answer.withUnsafeMutableBytes { recv(phone, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            return got > 0
        }, "the phone got no answer")
        #expect(Array(answer[..<got]) == [0x02, 0x03, 0x01] + payload, "payload(seq 259, the bytes)")
        owner.disconnect()

        // bluetoothd restarts and resets every instance: the slot goes back on the air.
        let before = controller.calls.count
        controller.removedBySomeoneElse(0)
        try #require(turn { controller.air[0] != nil }, "a removed slot was not put back: \(controller.calls)")
        #expect(controller.calls[before...] == ["advertise 0"])

        // The kernel refuses a save's advertisement: the old one is taken off, the slot freed,
        // and the next message of the activity tries again.
        controller.refusing = true
        try broker.publish(topic: "baton/activities/\(deviceText)", payload: activity(seq: 300), retain: true)
        try #require(turn { controller.calls.last == "withdraw 0" }, "a refused advertisement: \(controller.calls)")
        #expect(controller.air.isEmpty)
        controller.refusing = false
        try broker.publish(topic: "baton/activities/\(deviceText)", payload: activity(seq: 300), retain: true)
        // In the other slot: the one just freed is taken last.
        try #require(turn { controller.beacon(1)?.sequence == 300 }, "the same message did not try again: \(controller.calls)")

        // The hall's status turns offline (its will): its activity is nobody's to continue.
        try broker.publish(topic: "baton/gateways/hall/status", payload: Array("offline".utf8), retain: true)
        try #require(turn { controller.air.isEmpty }, "an offline gateway's activity stayed on the air: \(controller.calls)")
        try broker.publish(topic: "baton/gateways/hall/status", payload: Array("online".utf8), retain: true)
        try broker.publish(topic: "baton/activities/\(deviceText)", payload: activity(seq: 301), retain: true)
        try #require(turn { controller.onAir?.sequence == 301 })

        // The hall clears the topic (the activity ended): off the air.
        try broker.publish(topic: "baton/activities/\(deviceText)", payload: [], retain: true)
        try #require(turn { controller.air[0] == nil }, "the clear did not take it off: \(controller.calls)")

        // On again, then a broker restart without persistence: nothing is retained any more,
        // so when the retained scan ends the slot leaves the air.
        try broker.publish(topic: "baton/activities/\(deviceText)", payload: activity(seq: 260), retain: true)
        try #require(turn { controller.air.values.contains { _ in true } })
        try broker.restart()
        try broker.publish(topic: "baton/gateways/hall/status", payload: Array("online".utf8), retain: true)
        try #require(turn(within: 20) { controller.air.isEmpty }, "a slot cleared while away stayed on the air: \(controller.calls)")

        try broker.publish(topic: "baton/activities/\(deviceText)", payload: activity(seq: 261), retain: true)
        try #require(turn { !controller.air.isEmpty })
        #expect(gateway.loop.oversizedTurns == 0, "a broker restart, phones, refusals: no turn outgrew the loop")
        gateway.shutdown()
        #expect(controller.withdrewAll, "a clean stop leaves nothing on the air")
    }
}
