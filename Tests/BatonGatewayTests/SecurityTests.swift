// Authenticated beacons at the gateway (docs/security.md §3.1, §4.4): forged, altered, replayed
// and foreign beacons are dropped with their reasons, and a device rotating its id keeps one
// retained topic and one Home Assistant entity. Real mosquitto, the gateway as a process.
import BatonHCI
import BatonKeys
import BatonSim
import BatonTestSupport
import BatonWire
import Foundation
import Testing

/// docs/security.md §8.1's secret: the group whose beacon key the gateways hold.
private let groupSecret = "BATON-GROUP-V1:AAAQEAYEAUDAOCAJBIFQYDIOB4QL"

/// A btsnoop capture (Android H4, datalink 1002) of legacy LE Advertising Reports, one per
/// advertisement, 10 ms apart, all from one address.
private func capture(_ adverts: [[UInt8]]) -> [UInt8] {
    capture(adverts.map { (address: 0x6655_4433_2211, data: $0, rssi: -50) })
}

/// The same, each report with its own random address and RSSI.
private func capture(_ reports: [(address: UInt64, data: [UInt8], rssi: Int8)]) -> [UInt8] {
    var file = [UInt8](repeating: 0, count: 16 + reports.count * 80)
    let n = file.withUnsafeMutableBytes { raw -> Int in
        var w = ByteWriter(raw)
        do {
            try BTSnoop.writeHeader(datalink: BTSnoop.datalinkH4, into: &w)
            for (i, r) in reports.enumerated() {
                // Core 5.4, Vol 4, Part E, §7.7.65.2: LE Meta, LE Advertising Report, 1 report,
                // ADV_NONCONN_IND, random address (least significant byte first), data, RSSI.
                var event: [UInt8] = [0x3E, UInt8(12 + r.data.count), 0x02, 0x01, 0x03, 0x01]
                for k in 0..<6 { event.append(UInt8(truncatingIfNeeded: r.address >> (8 * UInt64(k)))) }
                event.append(UInt8(r.data.count))
                event += r.data
                event.append(UInt8(bitPattern: r.rssi))
                try event.withUnsafeBytes { e in
                    try BTSnoop.writeH4Record(timestamp: 1_790_000_000_000_000 + Int64(i) * 10_000, type: .event,
                                              direction: .controllerToHost, packet: e, into: &w)
                }
            }
        } catch {
            Issue.record("the capture did not fit: \(error)")
        }
        return w.count
    }
    return Array(file[..<n])
}

/// A group's device: makes its rotating ids with `irk` and tags its beacons with the beacon key.
private struct KeyedDevice {
    let tagger: BeaconTagger
    let ids: DeviceIDResolver
    let groupHash: UInt32

    init(secret: String, identity: UInt16?) throws {
        let keys = try GroupKeys.derive(secret: try GroupSecret(text: secret))
        tagger = try BeaconTagger(key: keys.beaconKey)
        ids = try identity.map { try DeviceIDResolver(irk: try keys.beaconKey.identityKey(number: $0)) }
            ?? DeviceIDResolver(key: keys.beaconKey)
        groupHash = keys.groupHash
    }

    func beacon(prand: UInt32, sequence: UInt16, flags: BeaconFlags = []) -> ActivityBeacon {
        ActivityBeacon(flags: flags, sequence: sequence, activityTypeHash: activityTypeHash("com.example.reader.article".utf8),
                       groupHash: groupHash, deviceID: ids.deviceID(prand: prand), psm: 0x80)
    }

    func advert(_ b: ActivityBeacon) throws -> [UInt8] { try encode(b, tagger) }
}

private func encode(_ b: ActivityBeacon, _ authenticator: some BeaconAuthenticator) throws -> [UInt8] {
    var out = [UInt8](repeating: 0, count: ActivityBeacon.advertisementLength)
    try out.withUnsafeMutableBytes { raw in
        var w = ByteWriter(raw)
        try b.encodeAdvertisement(authenticator: authenticator, into: &w)
    }
    return out
}

private func securityYAML(port: Int, capture: String, unkeyed: String) throws -> String {
    let beaconKey = try GroupKeys.derive(secret: try GroupSecret(text: groupSecret)).beaconKey.text
    return gatewayYAML(port: port, radio: "capture:\(capture)", extra: """
        security:
          beacon-key: \(beaconKey)
          identities: 16
          unkeyed: \(unkeyed)
        """)
}

@Suite(.serialized) struct SecurityTests {
    /// Issue 7: wrong tag, wrong group, a valid beacon replayed with an old sequence, a bit
    /// flipped: each dropped with its reason; only the device's own beacons reach the broker.
    @Test func forgedAlteredForeignAndReplayedBeaconsAreDroppedWithTheirReasons() throws {
        let dir = try scratchDirectory("security-forged")
        let broker = try MosquittoBroker()
        let anna = try KeyedDevice(secret: groupSecret, identity: 3)
        let stranger = try KeyedDevice(secret: GroupSecret(bytes: Array(repeating: 0x42, count: 16)).text, identity: 3)
        let far = try KeyedDevice(secret: groupSecret, identity: 20)  // beyond security.identities: 16

        let first = anna.beacon(prand: 0x41_2345, sequence: 10)
        var wrongTag = try anna.advert(first); wrongTag[30] ^= 0x01
        var seqFlipped = try anna.advert(first); seqFlipped[9] ^= 0x02          // sequence 10 → 8, same tag
        var reservedFlag = try anna.advert(first); reservedFlag[8] ^= 0x80      // a reserved flag bit
        var idFlipped = try anna.advert(first); idFlipped[21] ^= 0x10           // a bit of the device id
        let rotated = anna.beacon(prand: 0x5E_DCBA, sequence: 12)                // new id, saved twice since
        let adverts: [[UInt8]] = [
            try anna.advert(first),
            wrongTag, seqFlipped, reservedFlag, idFlipped,                       // 4 × beacon-bad-tag
            try stranger.advert(stranger.beacon(prand: 0x41_2345, sequence: 99)), // beacon-unkeyed-group
            try anna.advert(rotated),
            try anna.advert(first),                                              // beacon-replayed (seq 10 < 12)
            try far.advert(far.beacon(prand: 0x40_0001, sequence: 1)),           // beacon-unresolved-id
            try anna.advert(anna.beacon(prand: 0x5E_DCBA, sequence: 13, flags: [.relayed])),  // beacon-relayed
            try anna.advert(rotated),
        ]
        let file = dir.appendingPathComponent("forged.btsnoop")
        try Data(capture(adverts)).write(to: file)
        let gateway = try GatewayProcess(yaml: securityYAML(port: broker.port, capture: file.path, unkeyed: "ignore"), in: dir)
        defer { gateway.kill() }

        let o = try finishedStats(broker, gateway)
        let drops = try #require(o["drops"] as? [String: Int])
        #expect(drops["beacon-bad-tag"] == 4, "\(drops)")
        #expect(drops["beacon-unkeyed-group"] == 1, "\(drops)")
        #expect(drops["beacon-replayed"] == 1, "\(drops)")
        #expect(drops["beacon-unresolved-id"] == 1, "\(drops)")
        #expect(drops["beacon-relayed"] == 1, "a relayed copy is for phones, not rooms: \(drops)")
        let security = try #require(o["security"] as? [String: Any])
        #expect(security["verified"] as? Int == 3 && security["unkeyed"] as? String == "ignore", "\(security)")
        #expect(security["group"] as? String == String(format: "%08x", anna.groupHash))
        #expect(!gateway.log.contains("BATON-BEACON-V1"), "the key reached the log")
        #expect(!String(decoding: try broker.retained("#").values.joined(), as: UTF8.self).contains("BATON-BEACON"),
                "the key reached the broker")

        // One activity: Anna's, under her identity id, at the rotated beacon's sequence (once the
        // gateway owns it: docs/rooms.md's settle time).
        let identity = String(format: "%08x%04x", anna.groupHash, 3)
        let activities = try #require(try broker.retained("baton/activities/+", within: 10) { !$0.isEmpty },
                                      "nothing was published: \(gateway.log)")
        #expect(Array(activities.keys) == ["baton/activities/\(identity)"], "\(activities.keys.sorted())")
        let a = try #require(json(activities["baton/activities/\(identity)"] ?? []))
        #expect(a["seq"] as? Int == 12 && a["verified"] as? Bool == true && a["identity"] as? Int == 3, "\(a)")
    }

    /// `security.unkeyed: publish`: another group's beacon is published, marked unverified,
    /// unless it claims an id of the keyed group (an identity id, or one its key resolves).
    @Test func otherGroupsArePublishedUnverifiedButCannotTakeAKeyedDevicesID() throws {
        let dir = try scratchDirectory("security-unkeyed")
        let broker = try MosquittoBroker()
        let anna = try KeyedDevice(secret: groupSecret, identity: 3)
        let groupWide = try KeyedDevice(secret: groupSecret, identity: nil)
        let identityID = DeviceIdentity.id(groupHash: anna.groupHash, number: 3)
        let open = { (id: UInt64, seq: UInt16) in
            ActivityBeacon(sequence: seq, activityTypeHash: 1, groupHash: 0x1234_5678, deviceID: id, psm: 0)
        }
        let groupWideBeacon = groupWide.beacon(prand: 0x40_BEEF, sequence: 5)
        let adverts: [[UInt8]] = [
            try anna.advert(anna.beacon(prand: 0x41_2345, sequence: 10)),
            try encode(open(0x5A00_0000_0009, 1), OpenGroup()),                  // published, unverified
            try encode(open(identityID, 11), OpenGroup()),                       // beacon-impersonation
            try groupWide.advert(groupWideBeacon),                               // verified, its rotating id
            try encode(open(groupWideBeacon.deviceID, 6), OpenGroup()),          // beacon-impersonation
        ]
        let file = dir.appendingPathComponent("unkeyed.btsnoop")
        try Data(capture(adverts)).write(to: file)
        let gateway = try GatewayProcess(yaml: securityYAML(port: broker.port, capture: file.path, unkeyed: "publish"), in: dir)
        defer { gateway.kill() }

        let o = try finishedStats(broker, gateway)
        let drops = try #require(o["drops"] as? [String: Int])
        #expect(drops["beacon-impersonation"] == 2, "\(drops)")
        let activities = try #require(try broker.retained("baton/activities/+", within: 10) { $0.count >= 3 },
                                      "not everything was published: \(gateway.log)")
        func activity(_ id: UInt64) -> [String: Any]? {
            json(activities["baton/activities/\(ActivityBeacon.deviceIDText(id))"] ?? [])
        }
        #expect(activities.count == 3, "\(activities.keys.sorted())")
        #expect(activity(identityID)?["seq"] as? Int == 10 && activity(identityID)?["verified"] as? Bool == true)
        #expect(activity(0x5A00_0000_0009)?["verified"] as? Bool == false)
        #expect(activity(groupWideBeacon.deviceID)?["verified"] as? Bool == true)
        #expect(activity(groupWideBeacon.deviceID)?["identity"] == nil)
    }

    /// Issue 7: a device rotating its id (and address) every second keeps one retained topic
    /// and one Home Assistant entity, at a gateway holding the group's beacon key.
    @Test func aDeviceRotatingItsIDKeepsOneTopicAndOneEntity() throws {
        let dir = try scratchDirectory("security-rotating")
        let broker = try MosquittoBroker()
        let building = try SimulatedBuilding(scenario: """
            seed: 7
            speed: 1
            duration: 60
            rate: 10
            rooms:
              - {id: hall, name: Hall}
            devices:
              - id: 5a0000000001
                name: anna-laptop
                at: hall
                group-secret: \(groupSecret)
                identity: 5
                rotate: 1
            """, in: dir)
        let beaconKey = try GroupKeys.derive(secret: try GroupSecret(text: groupSecret)).beaconKey.text
        let gateway = try GatewayProcess(yaml: roomGatewayYAML(port: broker.port, id: "hall", room: "Hall",
                                                               socket: building.socket("hall")) + """

            security:
              beacon-key: \(beaconKey)
            """, in: dir)
        defer { gateway.kill() }
        let groupHash = try GroupKeys.derive(secret: try GroupSecret(text: groupSecret)).groupHash
        let identity = ActivityBeacon.deviceIDText(DeviceIdentity.id(groupHash: groupHash, number: 5))

        // At least six new ids, each costing one AES block under the beacon key and then one per
        // identity number tried, 0 through 5 (docs/security.md §4.4): 7 blocks an id.
        let stats = try eventually(within: 30) { () -> [String: Any]? in
            guard let o = json(try broker.retained("baton/gateways/hall/stats")["baton/gateways/hall/stats"] ?? []),
                  let s = o["security"] as? [String: Any], let r = s["resolutions"] as? Int, r >= 6 * 7 else { return nil }
            return o
        }
        let o = try #require(stats, "the gateway never resolved six rotations: \(gateway.log)")
        #expect((o["drops"] as? [String: Int])?.keys.filter { $0.hasPrefix("beacon-") } == [], "\(o["drops"] ?? "")")

        let activities = try broker.retained("baton/activities/+")
        #expect(Array(activities.keys) == ["baton/activities/\(identity)"], "\(activities.keys.sorted())")
        let a = try #require(json(activities["baton/activities/\(identity)"] ?? []))
        #expect(a["verified"] as? Bool == true && a["identity"] as? Int == 5 && a["change"] as? String == "became-current",
                "rotation published a change: \(a)")
        // One gateway entity, and the device's three (room, activity, tracker): all under the identity.
        let discovery = try broker.retained("homeassistant/#")
        #expect(discovery.count == 4, "\(discovery.keys.sorted())")
        #expect(discovery.keys.filter { $0.contains(identity) }.count == 3, "\(discovery.keys.sorted())")
    }
}

/// Issue 7 part 4: a user's own iPhone, given by its IRK, followed across address rotation
/// under its name, in the one room that hears it best (docs/security.md §10).
@Suite(.serialized) struct NamedAppleDeviceTests {
    /// The IRK of Core 5.4, Vol 3, Part H, §2.2.2's sample, as Home Assistant users paste it.
    static let irk = "ec0234a357c8ad05341010a60a397d9b"
    /// Nearby Info (docs/protocol.md §4.3), as an iPhone sends it continuously.
    static let nearbyInfo: [UInt8] = [0x02, 0x01, 0x1A, 0x0A, 0xFF, 0x4C, 0x00, 0x10, 0x05, 0x1B, 0x1C, 0x7A, 0x8D, 0x2E]
    /// A stranger's Handoff frame (§4.2).
    static let handoff: [UInt8] = [0x02, 0x01, 0x1A, 0x13, 0xFF, 0x4C, 0x00, 0x0C, 0x0E, 0x08, 0x34, 0x12, 0xAB,
                                   0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99]

    @Test func aNamedIPhoneIsOneEntryUnderItsNameInTheRoomThatHearsItBest() throws {
        let dir = try scratchDirectory("named-apple")
        let broker = try MosquittoBroker()
        let key = try IdentityResolvingKey(text: Self.irk)
        let ids = try DeviceIDResolver(irk: key.bytes)
        // Four resolvable private addresses of the phone, as it rotates them.
        let addresses = [0x70_8194, 0x4A_BCDE, 0x51_2345, 0x7F_0001].map { ids.deviceID(prand: UInt32($0)) }
        let stranger: UInt64 = 0x5B12_3456_789A
        func reports(rssi: Int8) -> [(address: UInt64, data: [UInt8], rssi: Int8)] {
            var r: [(address: UInt64, data: [UInt8], rssi: Int8)] = []
            for a in addresses { for _ in 0..<5 { r.append((a, Self.nearbyInfo, rssi)) } }
            for _ in 0..<5 { r.append((stranger, Self.handoff, rssi)) }
            return r
        }
        let everything = dir.appendingPathComponent("apple.txt")
        let sub = try ChildProcess("/usr/bin/mosquitto_sub", ["-h", "127.0.0.1", "-p", "\(broker.port)", "-v", "-t", "baton/apple/#"],
                                   stdout: everything.path)
        defer { sub.signal(SIGKILL); _ = sub.wait(timeout: .seconds(5)) }
        usleep(300_000)
        var gateways: [GatewayProcess] = []
        defer { for g in gateways { g.kill() } }
        for (id, room, rssi) in [("hall", "Hall", Int8(-50)), ("kitchen", "Kitchen", Int8(-85))] {
            let gdir = try folder(id, in: dir)
            let file = gdir.appendingPathComponent("air.btsnoop")
            try Data(capture(reports(rssi: rssi))).write(to: file)
            gateways.append(try GatewayProcess(yaml: gatewayYAML(port: broker.port, id: id, room: room,
                                                                 radio: "capture:\(file.path)", extra: """
                apple:
                  irks:
                    "Anna's iPhone": irk:\(Self.irk.uppercased())
                rooms:
                  settle: 1s
                """), in: gdir))
        }
        let appleID = String(format: "%08x", try key.stableID())
        let entry = try #require(try eventually(within: 15) { () -> [String: Any]? in
            json(try broker.retained("baton/apple/\(appleID)")["baton/apple/\(appleID)"] ?? [])
        }, "the named phone was never published: \(gateways.map(\.log).joined(separator: "\n---\n"))")
        #expect(entry["name"] as? String == "Anna's iPhone" && entry["resolved"] as? Bool == true, "\(entry)")
        #expect(entry["gateway"] as? String == "hall" && entry["room"] as? String == "Hall", "\(entry)")
        // A stranger's phone is each gateway's own pseudonymous entry, as before.
        let all = try broker.retained("baton/apple/+")
        let strangers = all.filter { $0.key != "baton/apple/\(appleID)" }.compactMap { json($0.value) }
        #expect(strangers.count == 2 && strangers.allSatisfy { $0["resolved"] as? Bool == false && $0["name"] == nil },
                "\(strangers)")
        // The kitchen hears the phone too, but never published it: no flapping between rooms.
        usleep(1_500_000)
        let seen = (try? String(contentsOf: everything, encoding: .utf8)) ?? ""
        let named = seen.split(separator: "\n").filter { $0.hasPrefix("baton/apple/\(appleID) ") }
        #expect(!named.isEmpty && named.allSatisfy { $0.contains("\"gateway\":\"hall\"") }, "\(named)")

        // Home Assistant gets one device per person, with a Room sensor whose availability is
        // the owning gateway's (docs/mqtt.md §4); strangers get none.
        let configs = try broker.retained("homeassistant/sensor/+/room/config").filter { $0.key.contains("baton_apple_") }
        #expect(Array(configs.keys) == ["homeassistant/sensor/baton_apple_\(appleID)/room/config"], "\(configs.keys)")
        let config = try #require(json(configs.values.first ?? []))
        #expect((config["device"] as? [String: Any])?["name"] as? String == "Anna's iPhone")
        #expect(config["state_topic"] as? String == "baton/apple/\(appleID)")
        #expect(((config["availability"] as? [[String: Any]])?.first?["topic"] as? String) == "baton/gateways/hall/status")

        // `baton watch --once` shows where the person is; not the strangers' pseudonyms.
        let (status, printed) = try watchOnce(broker, in: dir)
        #expect(status == 0 && printed.split(separator: "\n").contains { $0.hasPrefix("Hall ") && $0.hasSuffix(" Anna's iPhone") },
                "\(printed)")
    }
}
