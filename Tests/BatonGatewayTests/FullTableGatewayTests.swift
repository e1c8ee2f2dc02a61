// A gateway that hears more devices than its table holds (issue 30, docs/table.md "A full
// table"): three rooms in a line, five devices standing in each, a table of 8 at every gateway.
// The middle room hears all fifteen, each end room ten (its own, and the next room's 15 dB
// weaker; two rooms away is below what it hears). A full table is a steady state: every device
// is published once, by its own room, and nothing moves or is cleared while nobody walks; the
// beacons a table did not take in are counted, not acted on.
import BatonTestSupport
import Foundation
import Testing

@Suite(.serialized) struct FullTableGatewayTests {
    static let rooms = threeRooms.map(\.0)
    /// Five devices a room: `5b0000000<room><n>`.
    static func device(_ room: Int, _ n: Int) -> String { "5b00000000\(room)\(n)" }

    func scenario() -> String {
        var devices = ""
        for (r, id) in Self.rooms.enumerated() {
            for n in 0..<5 { devices += "  - {id: \(Self.device(r, n)), at: \(id)}\n" }
        }
        return """
        seed: 30
        speed: 4
        duration: 400
        rate: 10
        radio: {in-room: -55, per-room: -15, heard-down-to: -80, noise: 1, loss: 0.05}
        rooms:
          - {id: hall, name: Hall}
          - {id: kitchen, name: Kitchen}
          - {id: office, name: Office}
        devices:
        \(devices)
        """
    }

    func stats(_ id: String, _ broker: MosquittoBroker) -> [String: Any]? {
        let topic = "baton/gateways/\(id)/stats"
        return json((try? broker.retained(topic))?[topic] ?? [])
    }

    @Test func aFullTableHoldsItsRoomsDevicesAndNothingMovesWithoutAWalk() throws {
        let broker = try MosquittoBroker()
        let dir = try scratchDirectory("full-table")
        let watcher = try ActivityWatcher(port: broker.port, in: dir)
        let building = try SimulatedBuilding(scenario: scenario(), in: dir)
        let gateways = try building.gateways(threeRooms, port: broker.port, in: dir, tableCapacity: 8)
        let all = Self.rooms.indices.flatMap { r in (0..<5).map { (Self.device(r, $0), Self.rooms[r]) } }
        func wrong() -> [String] {
            all.compactMap { d, room in
                let last = watcher.last(d).flatMap { $0 }
                return last?["gateway"] as? String == room ? nil : "\(d): \(watcher.owners(of: d))"
            }
        }
        let settled = eventually(within: 15, every: 0.5) { wrong().isEmpty ? true : nil }
        try #require(settled != nil, "not every device in its room: \(wrong())")
        // The tables are full and refusing: the middle room takes in 8 of 15.
        sleep(2)
        var before: [String: [String: Any]] = [:]
        for id in Self.rooms {
            let s = try #require(stats(id, broker), "no stats from \(id)")
            before[id] = s
            let table = try #require(s["table"] as? [String: Any])
            #expect(table["fill"] as? Int == 8, "\(id): \(table)")
            #expect(table["kept_owned"] as? Int == 5, "\(id) keeps its five: \(table)")
            #expect((s["drops"] as? [String: Any])?["table-full-weaker"] as? Int ?? 0 > 0, "\(id): \(s["drops"] ?? "")")
        }

        // Forty simulated seconds in which nobody walks.
        let messagesBefore = all.map { watcher.messages[$0.0]?.count ?? 0 }
        sleep(10)
        #expect(wrong().isEmpty, "\(wrong())")
        for (i, (d, room)) in all.enumerated() {
            let messages = watcher.messages[d] ?? []
            #expect(watcher.owners(of: d) == [room], "\(d) moved: \(watcher.owners(of: d))")
            #expect(!messages.contains { $0 == nil }, "\(d)'s activity was cleared")
            #expect(messages.count == messagesBefore[i], "\(d) was published again without a change")
        }
        for id in Self.rooms {
            let now = try #require(stats(id, broker))
            let rooms = now["rooms"] as? [String: Any], was = before[id]?["rooms"] as? [String: Any]
            let table = now["table"] as? [String: Any], wasTable = before[id]?["table"] as? [String: Any]
            #expect(rooms?["ownership_changes"] as? Int == was?["ownership_changes"] as? Int, "\(id): \(rooms ?? [:])")
            #expect(rooms?["takeovers"] as? Int == 0, "\(id): \(rooms ?? [:])")
            #expect(table?["evicted"] as? Int == wasTable?["evicted"] as? Int, "\(id): \(table ?? [:])")
            #expect(table?["refused"] as? Int ?? 0 > wasTable?["refused"] as? Int ?? 0, "\(id): \(table ?? [:])")
        }
        for id in Self.rooms { #expect(gateways[id]!.stop() == 0, "\(id) did not stop cleanly: \(gateways[id]!.log)") }
        _ = building
    }
}
