// What the retained activity says the activity is (issue 18, docs/mqtt.md §2 "What an activity
// is called"): the relay building of RelayTests on a real mosquitto — alice's phone is an open
// group with a title and a web URL, bob's laptop offers no link, Dave's phone is the keyed
// group whose payloads are sealed.
import BatonSim
import BatonTestSupport
import BatonWire
import Foundation
import Testing

@Suite(.serialized) struct TitleTests {
    let alice = "5a0000000001", bob = "5a0000000002"

    /// Dave's type is named by `activity-types:`, from its hash alone.
    static let extra = "activity-types:\n  - com.example.notes.edit\n  - com.example.mail.compose\n"

    @Test func anOpenGroupsActivityCarriesItsTypeTitleAndURLFromThePayload() throws {
        let broker = try MosquittoBroker()
        let b = try RelayBuilding(name: "titles-open", brokers: [broker], extra: Self.extra)
        defer { b.stopAll() }
        let message = try #require(eventually(within: 15) { () -> [String: Any]? in
            let m = json((try? broker.retained("baton/activities/\(alice)"))?["baton/activities/\(alice)"] ?? [])
            return m?["title"] is String ? m : nil
        }, "alice's activity never carried a title: \(b.gateways[0].log)")
        // What her phone's payload says, read the way any client would.
        let payload = b.player.payload(device: 0, sequence: UInt16(message["payload_seq"] as? Int ?? 0))
        let read: (String, String?, String?)? = payload.withUnsafeBytes { p in
            guard let v = try? ActivityPayload.validate(p, limits: PayloadLimits(maxBytes: 4096)) else { return nil }
            return (String(decoding: v.activityType, as: UTF8.self), v.title.map { String(decoding: $0, as: UTF8.self) },
                    v.webpageURL.map { String(decoding: $0, as: UTF8.self) })
        }
        let view = try #require(read, "her payload is a v1 payload")
        #expect(message["type"] as? String == "com.example.reader.article")
        #expect(message["type"] as? String == view.0)
        #expect(message["title"] as? String == view.1)
        #expect(message["title"] as? String == "A long read")
        #expect(message["webpage_url"] as? String == view.2)
        #expect((message["webpage_url"] as? String)?.hasPrefix("http") == true)
        #expect(message["change"] as? String == "became-current")
        #expect(message["moved_at"] is NSNull)
        let described = eventually(within: 10) { () -> Int? in
            let stats = json((try? broker.retained("baton/gateways/hall/stats"))?["baton/gateways/hall/stats"] ?? [])
            let n = (stats?["titles"] as? [String: Any])?["described"] as? Int ?? 0
            return n >= 1 ? n : nil
        }
        #expect(described != nil, "the stats never counted the title")
    }

    @Test func aDeviceWhoseLinkFailsStaysPublishedAsBeforeAndTheFailureIsCounted() throws {
        let broker = try MosquittoBroker()
        // Every gateway's link goes nowhere: alice's fetch fails.
        let b = try RelayBuilding(name: "titles-fail", brokers: [broker],
                                  extra: Self.extra + "relay:\n  link: sim:/nonexistent/baton.link\n")
        defer { b.stopAll() }
        let failed = eventually(within: 15) { () -> Int? in
            let stats = json((try? broker.retained("baton/gateways/hall/stats"))?["baton/gateways/hall/stats"] ?? [])
            let n = (stats?["titles"] as? [String: Any])?["failed"] as? Int ?? 0
            return n >= 1 ? n : nil
        }
        #expect(failed != nil, "alice's failed fetch was never counted: \(b.gateways[0].log)")
        let m = try #require(json(try broker.retained("baton/activities/\(alice)")["baton/activities/\(alice)"] ?? []),
                             "alice's activity is still published")
        #expect(m["title"] is NSNull && m["webpage_url"] is NSNull && m["payload_seq"] is NSNull)
        #expect(m["type_hash"] as? String == "be9b4bb7" && m["gateway"] as? String == "hall")
    }

    @Test func aKeyedGroupsActivityNeverCarriesATitle() throws {
        let broker = try MosquittoBroker()
        let b = try RelayBuilding(name: "titles-keyed", brokers: [broker], extra: Self.extra)
        defer { b.stopAll() }
        // alice's title arrives: the fetching works in this building.
        _ = eventually(within: 15) { () -> Bool? in
            json((try? broker.retained("baton/activities/\(alice)"))?["baton/activities/\(alice)"] ?? [])?["title"] is String ? true : nil
        }
        // Over several seconds (Dave's phone saves and rotates meanwhile), his activity never
        // carries a title: his payload is sealed with a key only devices hold.
        let end = Date().addingTimeInterval(4)
        var daveSeen = 0
        while Date() < end {
            let retained = try broker.retained("baton/activities/+")
            if let d = json(retained["baton/activities/\(dave)"] ?? []) {
                daveSeen += 1
                #expect(d["title"] is NSNull, "Dave's activity carried a title: \(d)")
                #expect(d["webpage_url"] is NSNull)
                #expect(d["type"] as? String == "com.example.notes.edit", "named from activity-types by its hash")
            }
            let bobMessage = try #require(json(retained["baton/activities/\(bob)"] ?? []), "bob's activity is still published")
            #expect(bobMessage["title"] is NSNull)
            #expect(bobMessage["type"] as? String == "com.example.mail.compose")
            #expect(bobMessage["gateway"] as? String == "office")
            usleep(500_000)
        }
        #expect(daveSeen > 0)
        let kitchen = try #require(json(try broker.retained("baton/gateways/kitchen/stats")["baton/gateways/kitchen/stats"] ?? []))
        // The gateways hold Dave's group's beacon key: his payloads are never even asked for.
        #expect((kitchen["titles"] as? [String: Any])?["unreadable"] as? Int == 0)
    }

    @Test func fetchTitlesOffLeavesOnlyHashesAndConfiguredNames() throws {
        let broker = try MosquittoBroker()
        let b = try RelayBuilding(name: "titles-off", brokers: [broker], extra: "relay:\n  fetch-titles: false\n")
        defer { b.stopAll() }
        usleep(2_000_000)
        let m = try #require(json(try broker.retained("baton/activities/\(alice)")["baton/activities/\(alice)"] ?? []))
        #expect(m["title"] is NSNull && m["type"] is NSNull && m["type_hash"] as? String == "be9b4bb7")
        let stats = try #require(json(try broker.retained("baton/gateways/hall/stats")["baton/gateways/hall/stats"] ?? []))
        #expect((stats["titles"] as? [String: Any])?["fetches"] as? Int == 0)
    }

    @Test func eachDeviceHasATrackerThatReadsItsRoom() throws {
        let broker = try MosquittoBroker()
        let b = try RelayBuilding(name: "titles-tracker", brokers: [broker])
        defer { b.stopAll() }
        // Dave's too: each tracker is published when its device is first owned, so the four
        // are read together (reading Dave's once the other three were there raced his).
        let rooms = [alice: "Hall", bob: "Office", "5a0000000003": "Kitchen", dave: "Kitchen"]
        let trackers = eventually(within: 10) { () -> [String: [UInt8]]? in
            let r = (try? broker.retained("baton/trackers/+")) ?? [:]
            return rooms.allSatisfy { text(r["baton/trackers/\($0.key)"]) == $0.value } ? r : nil
        }
        let read = (try? broker.retained("baton/trackers/+")) ?? [:]
        #expect(trackers != nil, "the trackers never read the rooms: \(read.mapValues { text($0) ?? "?" })")
    }
}
