// Neighbourhoods on real gateways (docs/rooms.md §8.3): three rooms in a line, hall — kitchen —
// office, where a room hears the next one's devices 15 dB weaker and nothing two rooms away.
// The end rooms share no device, so neither subscribes to the other's batches; a device walking
// from one end to the other still moves room by room, and a killed room's devices are taken
// over by the room that hears them, at once.
import BatonTestSupport
import Foundation
import Testing

@Suite(.serialized) struct NeighbourhoodGatewayTests {
    let alice = "5a0000000001", bob = "5a0000000002"

    /// alice starts in the hall and walks to the kitchen at 40 s and the office at 60 s; bob
    /// stays in the office. Heard down to −75 dBm: the next room (−70) hears, two rooms
    /// away (−85) does not.
    func lineScenario() -> String {
        """
        seed: 11
        speed: 4
        duration: 200
        rate: 10
        radio: {in-room: -55, per-room: -15, heard-down-to: -75, noise: 1, loss: 0.05}
        rooms:
          - {id: hall, name: Hall}
          - {id: kitchen, name: Kitchen}
          - {id: office, name: Office}
        devices:
          - id: \(alice)
            name: alice-phone
            at: hall
            script:
              - {at: 40, walk: kitchen}
              - {at: 60, walk: office}
          - id: \(bob)
            name: bob-laptop
            at: office
        """
    }

    /// A gateway's `rooms.neighbours` from its retained stats (docs/mqtt.md §1), sorted; nil
    /// before its first stats.
    func neighbours(_ id: String, _ broker: MosquittoBroker) -> [String]? {
        let topic = "baton/gateways/\(id)/stats"
        guard let stats = json((try? broker.retained(topic))?[topic] ?? []),
              let rooms = stats["rooms"] as? [String: Any],
              let list = rooms["neighbours"] as? [String] else { return nil }
        return list.sorted()
    }

    @Test func theEndsOfALineAreNotNeighboursYetAWalkMovesAndAKilledRoomIsTakenOver() throws {
        let broker = try MosquittoBroker()
        let dir = try scratchDirectory("neighbourhoods")
        let watcher = try ActivityWatcher(port: broker.port, in: dir)
        let building = try SimulatedBuilding(scenario: lineScenario(), in: dir)
        let gateways = try building.gateways(threeRooms, port: broker.port, in: dir)

        // Before the walk (40 simulated seconds: 10 s here): the kitchen shares alice with the
        // hall and bob with the office; the hall and the office share nothing. A neighbour is
        // kept 60 s, so one seen now was never dropped in between.
        let settled = eventually(within: 9, every: 0.5) { () -> Bool? in
            neighbours("kitchen", broker) == ["hall", "office"] && neighbours("hall", broker) == ["kitchen"]
                && neighbours("office", broker) == ["kitchen"] ? true : nil
        }
        #expect(settled != nil, """
            neighbours: hall \(neighbours("hall", broker) ?? []), kitchen \(neighbours("kitchen", broker) ?? []), \
            office \(neighbours("office", broker) ?? [])
            """)
        #expect(watcher.owners(of: alice) == ["hall"] && watcher.owners(of: bob) == ["office"],
                "alice \(watcher.owners(of: alice)), bob \(watcher.owners(of: bob))")
        // The neighbourhoods were found on the building-wide channel: the kitchen received the
        // hall's and the office's newcomers there, and counts them apart (docs/mqtt.md §1).
        let topic = "baton/gateways/kitchen/stats"
        let kitchen = json((try? broker.retained(topic))?[topic] ?? [])?["rooms"] as? [String: Any]
        let buildingBatches = kitchen?["building_batches_received"] as? Int ?? 0
        let buildingRecords = kitchen?["building_sightings_received"] as? Int ?? 0
        #expect(buildingBatches >= 2 && buildingRecords >= buildingBatches
                && buildingRecords <= kitchen?["sightings_received"] as? Int ?? 0, "\(kitchen ?? [:])")

        // The walk: hall → kitchen → office, one move each, though the hall never received the
        // office's batches before alice reached the kitchen.
        let walked = eventually(within: 15, every: 0.2) {
            watcher.owners(of: alice) == ["hall", "kitchen", "office"] ? true : nil
        }
        #expect(walked != nil, "alice's owners: \(watcher.owners(of: alice))")

        // The office dies: the kitchen hears both of its devices and takes them over at once
        // (its will arrives as its socket closes; 1.5 × keepalive at the latest).
        gateways["office"]!.kill()
        let taken = eventually(within: 7.5, every: 0.2) {
            watcher.owners(of: alice).last == "kitchen" && watcher.owners(of: bob) == ["office", "kitchen"] ? true : nil
        }
        #expect(taken != nil, "after the kill: alice \(watcher.owners(of: alice)), bob \(watcher.owners(of: bob))")
        for id in ["hall", "kitchen"] {
            #expect(gateways[id]!.stop() == 0, "\(id) did not stop cleanly: \(gateways[id]!.log)")
        }
        _ = building
    }
}

/// The far end of a building (docs/relay.md §4, docs/rooms.md §4): four rooms in a line, hall —
/// kitchen — office — study, where the hall's id sorts first. Its rule follows only the devices
/// of the rooms it shares one with, yet it is the gateway that answers for devices nobody owns
/// and clears what an offline gateway left.
final class LineOfFour {
    static let rooms = [("hall", "Hall"), ("kitchen", "Kitchen"), ("office", "Office"), ("study", "Study")]
    let broker: MosquittoBroker
    let dir: URL
    let watcher: ActivityWatcher
    let building: SimulatedBuilding
    var gateways: [String: GatewayProcess] = [:]

    /// alice in the hall, erin's tablet (a 300-byte payload) in the study; a room hears the
    /// next one `perRoom` dB weaker, down to −75 dBm.
    init(_ name: String, perRoom: Int) throws {
        let scenario = """
            seed: 12
            speed: 4
            duration: 200
            rate: 10
            radio: {in-room: -55, per-room: \(perRoom), heard-down-to: -75, noise: 1, loss: 0}
            rooms:
              - {id: hall, name: Hall}
              - {id: kitchen, name: Kitchen}
              - {id: office, name: Office}
              - {id: study, name: Study}
            devices:
              - id: 5a0000000001
                name: alice-phone
                at: hall
              - id: 5a0000000005
                name: erin-tablet
                type: com.example.reader.article
                title: A long read
                payload-bytes: 300
                at: study
            """
        broker = try MosquittoBroker()
        dir = try scratchDirectory(name)
        watcher = try ActivityWatcher(port: broker.port, in: dir)
        building = try SimulatedBuilding(scenario: scenario, in: dir)
        gateways = try building.gateways(Self.rooms, port: broker.port, in: dir)
    }

    func stats(_ id: String) -> [String: Any]? {
        let topic = "baton/gateways/\(id)/stats"
        return json((try? broker.retained(topic))?[topic] ?? [])?["rooms"] as? [String: Any]
    }

    func stopAll() {
        for (id, g) in gateways where g.isRunning { #expect(g.stop() == 0, "\(id) did not stop cleanly: \(g.log)") }
    }
}

@Suite(.serialized) struct NeighbourhoodFarEndTests {
    let alice = "5a0000000001", erin = "5a0000000005"

    /// A room hears only the next one: the hall never hears erin, nor does the kitchen, the
    /// only room it shares a device with, so the hall's rule does not follow erin. It must
    /// still leave erin's fetch to the study, and answer alone for a device nobody hears.
    @Test func aFetchAboutADeviceTheFirstGatewayDoesNotFollowGetsOneAnswerFromItsOwner() throws {
        let line = try LineOfFour("far-end-fetch", perRoom: -15)
        let settled = eventually(within: 10, every: 0.2) {
            line.watcher.owners(of: alice) == ["hall"] && line.watcher.owners(of: erin) == ["study"] ? true : nil
        }
        #expect(settled != nil, "alice \(line.watcher.owners(of: alice)), erin \(line.watcher.owners(of: erin))")

        let hand = try HandFetches(broker: line.broker, in: line.dir)
        try hand.request(erin, HandFetches.route(1))            // the study's: ok, from the study alone
        try hand.request("5affffffffff", HandFetches.route(2))  // nobody's: unknown-device, from the hall alone
        try hand.request(alice, HandFetches.route(3))           // the hall's own, from the hall alone
        _ = eventually(within: 10) { hand.collected().count == 3 ? true : nil }
        // Any second answer would come within the fetch timeout: wait it out once.
        usleep(1_500_000)
        let got = hand.collected()
        #expect(got["1"]?.count == 1 && got["1"]?.first?["status"] as? String == "ok"
                && got["1"]?.first?["gateway"] as? String == "study", "erin's fetch: \(got["1"] ?? [])")
        #expect(got["2"]?.count == 1 && got["2"]?.first?["status"] as? String == "unknown-device",
                "a fetch about a device nobody hears: \(got["2"] ?? [])")
        #expect(got["3"]?.count == 1 && got["3"]?.first?["gateway"] as? String == "hall", "alice's fetch: \(got["3"] ?? [])")
        // The hall knows erin's owner from her activity topic (docs/mqtt.md §1).
        #expect((line.stats("hall")?["owners_known"] as? Int ?? 0) >= 2, "\(line.stats("hall") ?? [:])")
        line.stopAll()
    }

    /// Walls stop the radio (a room hears nothing of the next): no room shares a device with
    /// another. The study dies; nobody else hears erin, so her activity stays retained for
    /// `table.expiry` (15 s here), then the hall, first in id order, clears it, though its
    /// rule never followed her.
    @Test func aDeadRoomsDeviceThatNobodyHearsIsClearedByTheFirstGatewayAfterExpiry() throws {
        let line = try LineOfFour("far-end-clear", perRoom: -25)
        let topic = "baton/activities/\(erin)"
        let settled = eventually(within: 10, every: 0.2) {
            line.watcher.owners(of: alice) == ["hall"] && line.watcher.owners(of: erin) == ["study"] ? true : nil
        }
        #expect(settled != nil, "alice \(line.watcher.owners(of: alice)), erin \(line.watcher.owners(of: erin))")
        #expect(line.stats("hall")?["neighbours"] as? [String] == [], "\(line.stats("hall") ?? [:])")

        line.gateways["study"]!.kill()
        let killed = Date()
        usleep(3_000_000)
        #expect((try? line.broker.retained(topic))?[topic] != nil, "erin's activity went before table.expiry")
        let cleared = eventually(within: 30, every: 0.5) { (try? line.broker.retained(topic))?[topic] == nil ? true : nil }
        #expect(cleared != nil, "erin's activity is still retained \(Int(-killed.timeIntervalSinceNow)) s after the study died")
        let counted = eventually(within: 5, every: 0.5) { line.stats("hall")?["cleared_for_others"] as? Int == 1 ? true : nil }
        #expect(counted != nil, "the hall's stats: \(line.stats("hall") ?? [:])")
        // alice is the hall's own, and stays.
        #expect((try? line.broker.retained("baton/activities/\(alice)"))?["baton/activities/\(alice)"] != nil)
        line.stopAll()
    }
}
