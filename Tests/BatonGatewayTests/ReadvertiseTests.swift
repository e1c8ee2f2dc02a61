// Re-advertising (docs/relay.md §9): which of the building's activities a gateway puts on its
// room's air, and the exact bytes it sends. The owner's retained JSON goes in; the relayed
// beacon comes out, in bytes, verified the way a phone holding the group key checks it.
@testable import BatonGateway
import BatonKeys
import BatonMQTT
import BatonWire
import Foundation
import Testing

private let keys = try! GroupKeys.derive(secret: try! GroupSecret(text: "BATON-GROUP-V1:AAAQEAYEAUDAOCAJBIFQYDIOB4QL"))
private let group = String(format: "%08x", keys.groupHash)
/// Device 4 of the group (docs/security.md §3.1): its topic id.
private let daveID = DeviceIdentity.id(groupHash: keys.groupHash, number: 4)

/// The owner's activity message, as docs/mqtt.md §2 spells it.
private func activity(seq: Int = 258, gateway: String = "hall", verified: Bool = true, group g: String = group,
                      psm: Int = 0x81, streams: Bool = true, relayed: Bool = false, state: String = "current") -> [UInt8] {
    Array("""
    {"device":"\(ActivityBeacon.deviceIDText(daveID))","state":"\(state)","change":"saved","seq":\(seq),\
    "type_hash":"be9b4bb7","group":"\(g)","supports_streams":\(streams),"has_web_url":true,\
    "relayed":\(relayed),"psm":\(psm),"verified":\(verified),"identity":4,"room":"Hall","gateway":"\(gateway)",\
    "rssi":-61,"first_seen":"2026-11-23T09:14:03.512204Z","changed":"2026-11-23T09:20:41.004318Z"}
    """.utf8)
}

@Suite("Re-advertising other rooms' activities (docs/relay.md §9)")
struct ReadvertiseTests {
    @Test("§9: another room's verified activity of the keyed group goes on the air, flagged relayed, under its topic id and this gateway's PSM, tagged with the beacon key")
    func relayedBeaconBytes() throws {
        var r = Readvertiser(groupHash: keys.groupHash, selfID: "office", psms: [0x0091, 0x0092])
        #expect(r.activity(device: daveID, payload: activity()) == .advertise(0))
        let tagger = try BeaconTagger(key: keys.beaconKey)
        let bytes = r.advertisement(0, companyID: 0xFFFF, tagger: tagger)
        let groupBytes: [UInt8] = (0..<4).map { UInt8(truncatingIfNeeded: keys.groupHash >> (8 * UInt32($0))) }
        let idBytes: [UInt8] = (0..<6).map { UInt8(truncatingIfNeeded: daveID >> (8 * UInt64($0))) }
        var expected: [UInt8] = [
            0x02, 0x01, 0x06,                    // Flags AD (protocol.md §2.1)
            0x1B, 0xFF, 0xFF, 0xFF,              // manufacturer data, company 0xFFFF
            0x01,                                // version 1
            0x0B,                                // streams | web URL | relayed (bit 3)
            0x02, 0x01,                          // sequence 258
            0xB7, 0x4B, 0x9B, 0xBE,              // type hash be9b4bb7
        ]
        expected += groupBytes                   // the keyed group
        expected += idBytes                      // the topic id (group ‖ 4), least significant byte first
        expected += [0x91, 0x00]                 // this gateway's listener, not the device's PSM
        #expect(Array(bytes[0..<27]) == expected)
        // The tag is what a phone with the group key computes; any flipped bit breaks it.
        let found: ActivityBeacon? = try bytes.withUnsafeBytes { b in try ActivityBeacon.find(inAdvertisingData: b, companyID: 0xFFFF) }
        let beacon = try #require(found)
        #expect(beacon.flags.contains(.relayed))
        #expect(beacon.verify(companyID: 0xFFFF, authenticator: tagger))
        var forged = beacon
        forged.sequence &+= 1
        #expect(!forged.verify(companyID: 0xFFFF, authenticator: tagger))
    }

    @Test("§9: only what a phone can continue here: not this room's own, not unverified, not another group's, not a relayed copy, not one without a link, not an ended one")
    func eligibility() {
        var r = Readvertiser(groupHash: keys.groupHash, selfID: "office", psms: [0x0091])
        #expect(r.activity(device: daveID, payload: activity(gateway: "office")) == nil)
        #expect(r.activity(device: daveID, payload: activity(verified: false)) == nil)
        #expect(r.activity(device: daveID, payload: activity(group: "a1b2c3d4")) == nil)
        #expect(r.activity(device: daveID, payload: activity(relayed: true)) == nil)
        #expect(r.activity(device: daveID, payload: activity(psm: 0)) == nil)
        #expect(r.activity(device: daveID, payload: activity(state: "invalidated")) == nil)
        #expect(r.activity(device: daveID, payload: Array("not json".utf8)) == nil)
        #expect(r.activity(device: daveID, payload: Array(#"{"seq":"258"}"#.utf8)) == nil)
        // An owner whose status is not online: nobody's to continue, or not a gateway at all.
        #expect(r.activity(device: daveID, payload: activity(gateway: "mallory"), isOnline: { $0 == "hall" }) == nil)
        #expect(r.activity(device: daveID, payload: activity(gateway: "hall"), isOnline: { $0 == "hall" }) == .advertise(0))
        #expect(r.activity(device: daveID, payload: activity(gateway: "mallory"), isOnline: { $0 == "hall" }) == .withdraw(0))
        #expect(r.count == 0)
    }

    @Test("§9: a slot just freed is the last one taken again, so a phone holding its old beacon does not reach another activity on it")
    func freedSlotTakenLast() {
        var r = Readvertiser(groupHash: keys.groupHash, selfID: "office", psms: [0x0091, 0x0092, 0x0093])
        let ids = (1...4).map { DeviceIdentity.id(groupHash: keys.groupHash, number: UInt16($0)) }
        #expect(r.activity(device: ids[0], payload: activity()) == .advertise(0))
        #expect(r.activity(device: ids[0], payload: []) == .withdraw(0))
        #expect(r.activity(device: ids[1], payload: activity()) == .advertise(1))
        #expect(r.activity(device: ids[2], payload: activity()) == .advertise(2))
        #expect(r.activity(device: ids[3], payload: activity()) == .advertise(0))
        // Two freed, the later one last: 2 (freed first) before 1 (freed just now).
        #expect(r.activity(device: ids[2], payload: []) == .withdraw(2))
        #expect(r.activity(device: ids[1], payload: []) == .withdraw(1))
        #expect(r.activity(device: ids[0], payload: activity()) == .advertise(2))
        #expect(r.activity(device: ids[1], payload: activity()) == .advertise(1))
    }

    @Test("§9: a gateway whose status turns offline takes its activities off the air; the others' stay")
    func ownerOffline() {
        var r = Readvertiser(groupHash: keys.groupHash, selfID: "office", psms: [0x0091, 0x0092])
        let other = DeviceIdentity.id(groupHash: keys.groupHash, number: 7)
        _ = r.activity(device: daveID, payload: activity(gateway: "hall"))
        _ = r.activity(device: other, payload: activity(gateway: "kitchen"))
        var changes: [Readvertiser.Change] = []
        r.ownerOffline("hall") { changes.append($0) }
        #expect(changes == [.withdraw(0)])
        #expect(r.slots[1]?.device == other)
    }

    @Test("§9: a save goes on the air again with the new sequence; the same message again changes nothing; a clear, or the device arriving in this room, takes it off")
    func followsTheOwner() {
        var r = Readvertiser(groupHash: keys.groupHash, selfID: "office", psms: [0x0091])
        #expect(r.activity(device: daveID, payload: activity(seq: 258)) == .advertise(0))
        #expect(r.activity(device: daveID, payload: activity(seq: 258)) == nil)
        #expect(r.activity(device: daveID, payload: activity(seq: 259)) == .advertise(0))
        #expect(r.slots[0]?.sequence == 259)
        #expect(r.activity(device: daveID, payload: activity(seq: 259, gateway: "kitchen")) == nil)  // moved rooms, same beacon
        #expect(r.slots[0]?.owner == "kitchen")
        #expect(r.activity(device: daveID, payload: activity(seq: 259, gateway: "office")) == .withdraw(0))
        #expect(r.activity(device: daveID, payload: activity(seq: 260)) == .advertise(0))
        #expect(r.activity(device: daveID, payload: []) == .withdraw(0))
        #expect(r.count == 0)
        #expect(r.slot(psm: 0x0091) == nil)
    }

    @Test("Capacity: relay.readvertise + 1 activities: the one more is counted, and takes a slot once one is free")
    func capacity() {
        var r = Readvertiser(groupHash: keys.groupHash, selfID: "office", psms: [0x0091, 0x0092])
        let ids = (1...3).map { DeviceIdentity.id(groupHash: keys.groupHash, number: UInt16($0)) }
        #expect(r.activity(device: ids[0], payload: activity()) == .advertise(0))
        #expect(r.activity(device: ids[1], payload: activity()) == .advertise(1))
        #expect(r.activity(device: ids[2], payload: activity()) == nil)
        #expect(r.drops.sorted.map(\.reason) == ["readvertise-full"])
        #expect(r.slot(psm: 0x0092) == 1)
        #expect(r.activity(device: ids[0], payload: []) == .withdraw(0))
        #expect(r.activity(device: ids[2], payload: activity(seq: 300)) == .advertise(0))
        #expect(r.slots[0]?.device == ids[2])
    }

    @Test("§9: after a broker reconnect, an activity cleared while away (not retained any more) leaves the air when the retained scan ends")
    func reconnect() {
        var r = Readvertiser(groupHash: keys.groupHash, selfID: "office", psms: [0x0091, 0x0092])
        let other = DeviceIdentity.id(groupHash: keys.groupHash, number: 7)
        _ = r.activity(device: daveID, payload: activity())
        _ = r.activity(device: other, payload: activity())
        r.reconnected()
        #expect(r.activity(device: daveID, payload: activity()) == nil)  // retained again: stays
        var changes: [Readvertiser.Change] = []
        r.retainedScanEnded { changes.append($0) }
        #expect(changes == [.withdraw(1)])
        #expect(r.slots[0]?.device == daveID)
    }

    @Test("§3: an owner's answer for a phone reads the same from v5 properties and from the v3.1.1 envelope")
    func answers() {
        let v5 = MQTTMessage(topic: "baton/answers/office/3", payload: [0xA1, 0x01, 0x02], qos: 1, retained: false,
                             properties: MQTTProperties(correlationData: [1, 2],
                                                        userProperties: [MQTTUserProperty("status", "ok"),
                                                                         MQTTUserProperty("seq", "258")]))
        let a = AnswerForPhone(v5)
        #expect(a.status == "ok" && a.sequence == 258 && a.correlation == [1, 2] && a.payload == [0xA1, 0x01, 0x02])
        let v3 = MQTTMessage(topic: "baton/answers/office/3",
                             payload: Array(#"{"status":"ok","device":"7cec72260004","gateway":"hall","correlation":"0102","seq":258,"cbor":"oQEC"}"#.utf8),
                             qos: 1, retained: false)
        let b = AnswerForPhone(v3)
        #expect(b.status == "ok" && b.sequence == 258 && b.correlation == [1, 2] && b.payload == [0xA1, 0x01, 0x02])
        let refused = AnswerForPhone(MQTTMessage(topic: "t", payload: Array(#"{"status":"timeout","correlation":"0a","detail":"x"}"#.utf8),
                                                 qos: 1, retained: false))
        #expect(refused.status == "timeout" && refused.payload.isEmpty && refused.correlation == [0x0A])
        #expect(AnswerForPhone(MQTTMessage(topic: "t", payload: Array("garbage".utf8), qos: 1, retained: false)).status == "bad-answer")
    }
}
