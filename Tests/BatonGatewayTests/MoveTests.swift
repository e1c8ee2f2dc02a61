// A move is not a new activity (issue 18 item 3, docs/mqtt.md §2 "Moves"): alice's phone, an
// open group, becomes current in the hall, saves, and walks into the kitchen. The kitchen's
// gateway takes her over and republishes her activity as the hall last said it — its own
// `change` (`saved`), `changed`, `seq`, type, title and URL — with its own `room` and `gateway`
// and a `moved_at`; it never says `became-current`. So an automation keyed on
// `change == "became-current"` fires once for the whole walk. Two rooms' gateways on the
// simulator (`baton sim --scenario`), a real mosquitto, and `mosquitto_sub` on the activity
// topic from the start, as Home Assistant would see it.
import BatonSim
import BatonTestSupport
import BatonWire
import Foundation
import Testing

/// alice's phone starts current in the hall (sequence 1), saves at 6 s (sequence 2) and walks
/// into the kitchen at 12 s. Real time (speed 1), so the hall has fetched her title long before
/// she saves; quiet radio, so the walk is the only reason for a move.
let moveScenario = """
    seed: 13
    speed: 1
    duration: 45
    rate: 10
    radio: {in-room: -55, per-room: -15, heard-down-to: -95, noise: 1, loss: 0, link-latency: 0.1}
    rooms:
      - {id: hall, name: Hall}
      - {id: kitchen, name: Kitchen}
    devices:
      - id: 5a0000000001
        name: alice-phone
        type: com.example.reader.article
        title: A long read
        web-url: true
        at: hall
        script:
          - {at: 6, save: true}
          - {at: 12, walk: kitchen}
    """

@Suite(.serialized) struct MoveTests {
    let alice = "5a0000000001"

    @Test func aMoveKeepsTheActivitysOwnChangeAndSaysItMoved() throws {
        let broker = try MosquittoBroker()
        let dir = try scratchDirectory("move")
        // Subscribed before any gateway runs: every message about alice, in order.
        let watcher = try ActivityWatcher(port: broker.port, in: dir)
        let building = try SimulatedBuilding(scenario: moveScenario, in: dir)
        let player = ScenarioPlayer(try Scenario.parse(yaml: moveScenario, file: "move.yaml"))
        let gateways = try building.gateways([("hall", "Hall"), ("kitchen", "Kitchen")], port: broker.port, in: dir, speed: 1)
        let hall = gateways["hall"]!, kitchen = gateways["kitchen"]!
        defer { for g in gateways.values { g.kill() } }
        func logs() -> String { "hall:\n\(hall.log)\n---\nkitchen:\n\(kitchen.log)" }
        func messages() -> [[String: Any]] { (watcher.messages[alice] ?? []).compactMap { $0 } }
        func from(_ gateway: String) -> [[String: Any]] { messages().filter { $0["gateway"] as? String == gateway } }
        func simulated(_ event: String) -> [String: Any]? {
            building.lines.first { $0["event"] as? String == event && $0["device"] as? String == alice }
        }

        // 1. She becomes current in the hall: the hall publishes a new activity, first heard
        //    here, and names it from her payload.
        let current = try #require(eventually(within: 10) { () -> [String: Any]? in
            from("hall").first { $0["change"] as? String == "became-current" && $0["title"] is String }
        }, "the hall never published alice's activity with a title: \(messages())\n\(logs())")
        #expect(current["room"] as? String == "Hall")
        #expect(current["seq"] as? Int == 1)
        #expect(current["moved_at"] is NSNull, "first heard in the hall, not moved: \(current)")
        let payloadSeq = try #require(current["payload_seq"] as? Int)
        let payload = player.payload(device: 0, sequence: UInt16(payloadSeq))
        let read: (String, String?, String?)? = payload.withUnsafeBytes { p in
            guard let v = try? ActivityPayload.validate(p, limits: PayloadLimits(maxBytes: 4096)) else { return nil }
            return (String(decoding: v.activityType, as: UTF8.self), v.title.map { String(decoding: $0, as: UTF8.self) },
                    v.webpageURL.map { String(decoding: $0, as: UTF8.self) })
        }
        let view = try #require(read, "her payload is a v1 payload")
        #expect(current["type"] as? String == view.0 && view.0 == "com.example.reader.article")
        #expect(current["title"] as? String == view.1 && view.1 == "A long read")
        #expect(current["webpage_url"] as? String == view.2 && view.2 != nil)
        #expect(simulated("save") == nil, "the scenario saved before the hall had named her activity")

        // 2. She saves: the hall says so, at the simulator's new sequence.
        let saved = try #require(eventually(within: 10) { () -> [String: Any]? in
            from("hall").last { $0["change"] as? String == "saved" }
        }, "the hall never published alice's save: \(messages())\n\(logs())")
        let savedSeq = try #require(simulated("save")?["sequence"] as? Int, "the simulator's save line")
        #expect(saved["seq"] as? Int == savedSeq && savedSeq == 2)
        #expect(saved["room"] as? String == "Hall" && saved["moved_at"] is NSNull)
        #expect(saved["title"] as? String == "A long read", "a save keeps the title it had: \(saved)")
        #expect(simulated("walk") == nil, "the scenario walked before the hall had published the save")

        // 3. She walks into the kitchen, and the kitchen takes her over.
        let moved = try #require(eventually(within: 15) { from("kitchen").first },
                                 "the kitchen never took alice over: \(messages())\n\(logs())")
        // What the hall said last, before it let her go.
        let before = try #require(from("hall").last)
        #expect(before["change"] as? String == "saved", "the hall's last message: \(before)")

        // The kitchen's takeover: her own activity, as it was, in the kitchen, moved.
        #expect(moved["room"] as? String == "Kitchen")
        #expect(moved["gateway"] as? String == "kitchen")
        #expect(moved["change"] as? String == "saved", "the move said \(moved["change"] ?? "nothing"): \(moved)")
        #expect(moved["change"] as? String != "became-current")
        #expect(moved["changed"] as? String == before["changed"] as? String,
                "the move kept the activity's own time: \(moved) after \(before)")
        #expect(moved["seq"] as? Int == before["seq"] as? Int && moved["seq"] as? Int == savedSeq)
        #expect(moved["type"] as? String == before["type"] as? String && moved["type"] as? String == view.0)
        #expect(moved["title"] as? String == before["title"] as? String && moved["title"] as? String == view.1)
        #expect(moved["webpage_url"] as? String == before["webpage_url"] as? String
                    && moved["webpage_url"] as? String == view.2)
        #expect(moved["payload_seq"] as? Int == before["payload_seq"] as? Int)
        #expect(moved["moved_at"] is String, "a move says when it moved: \(moved)")

        // What stays retained, what Home Assistant reads: the same, until anything else happens.
        let retained = try #require(json(try broker.retained("baton/activities/\(alice)")["baton/activities/\(alice)"] ?? []),
                                    "alice's activity is retained")
        #expect(retained["room"] as? String == "Kitchen" && retained["gateway"] as? String == "kitchen",
                "retained: \(retained)")
        #expect(retained["change"] as? String == "saved", "retained: \(retained)")
        #expect(retained["changed"] as? String == before["changed"] as? String)
        #expect(retained["seq"] as? Int == savedSeq)
        #expect(retained["type"] as? String == view.0 && retained["title"] as? String == view.1
                    && retained["webpage_url"] as? String == view.2)
        #expect(retained["moved_at"] is String)
        #expect(retained["moved_at"] as? String == moved["moved_at"] as? String, "moved once: \(retained)")

        // 4. Over the whole walk (let the room rule settle a while longer), the kitchen never
        //    said became-current, and an automation keyed on it fired once. It fires the way a
        //    Home Assistant state trigger on the activity's `change` does: on a message that says
        //    became-current where the one before did not say it of the same sequence (the hall's
        //    republish with the title added is the same event, not a second one).
        sleep(3)
        let all = messages()
        let kitchenBecameCurrent = from("kitchen").filter { $0["change"] as? String == "became-current" }
        #expect(kitchenBecameCurrent.isEmpty, "the kitchen said became-current: \(kitchenBecameCurrent)")
        var fired = 0
        var previous: [String: Any]?
        for m in all {
            if m["change"] as? String == "became-current",
               previous?["change"] as? String != "became-current" || previous?["seq"] as? Int != m["seq"] as? Int {
                fired += 1
            }
            previous = m
        }
        let saidBecameCurrent = all.filter { $0["change"] as? String == "became-current" }
        #expect(fired == 1,
                "an automation on became-current fired \(fired) times; the messages saying it: \(saidBecameCurrent)")
        #expect(saidBecameCurrent.allSatisfy { $0["gateway"] as? String == "hall" && $0["seq"] as? Int == 1 })
        #expect(watcher.owners(of: alice) == ["hall", "kitchen"], "owners: \(watcher.owners(of: alice))")

        let stats = json((try broker.retained("baton/gateways/kitchen/stats"))["baton/gateways/kitchen/stats"] ?? [])
        #expect(((stats?["titles"] as? [String: Any])?["carried"] as? Int ?? 0) >= 1,
                "the kitchen's stats count the carried move: \(stats.map { "\($0["titles"] ?? "none")" } ?? "no stats")")
        // The hall first: were the kitchen to stop first, the hall would take her back (§5).
        for (id, g) in [("hall", hall), ("kitchen", kitchen)] {
            #expect(g.stop() == 0, "\(id) did not stop cleanly: \(g.log)")
        }
    }
}
