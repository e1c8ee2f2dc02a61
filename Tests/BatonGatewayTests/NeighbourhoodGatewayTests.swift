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
        var gateways: [String: GatewayProcess] = [:]
        for (id, room) in threeRooms {
            let gdir = dir.appendingPathComponent(id)
            try FileManager.default.createDirectory(at: gdir, withIntermediateDirectories: true)
            gateways[id] = try GatewayProcess(
                yaml: roomGatewayYAML(port: broker.port, id: id, room: room, socket: building.socket(id)), in: gdir)
        }

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
