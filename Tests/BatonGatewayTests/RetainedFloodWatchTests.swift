// Retained floods seen by `baton watch` (docs/broker.md "Retained floods"): `baton watch --once`
// against 5,000 retained activities lists all 5,000 on a broker configured as
// board/mosquitto-building.conf, and only what mosquitto's default queue lets through otherwise.
import Foundation
import Testing
import BatonTestSupport

/// The count `baton watch --once` prints on its last line ("N activities; gateways: …").
private func watchedActivities(_ broker: MosquittoBroker) throws -> Int? {
    let (status, printed) = try watchOnce(broker)
    guard status == 0,
          let last = printed.split(separator: "\n").last(where: { $0.contains(" activities; gateways:") }) else { return nil }
    return Int(last.prefix { $0 != " " })
}

@Suite("Retained floods and baton watch (docs/broker.md)", .serialized)
struct RetainedFloodWatchTests {
    @Test func batonWatchListsAll5000RetainedActivitiesFromABuildingsBroker() throws {
        let broker = try MosquittoBroker(extraConfig: try MosquittoBroker.buildingConfig())
        try broker.publishRetained(retainedActivities(count: 5000), qos: 1)
        let listed = try watchedActivities(broker)
        print("baton watch --once, board/mosquitto-building.conf: \(listed.map(String.init) ?? "nothing") of 5000 listed")
        #expect(listed == 5000)
    }

    @Test func batonWatchListsWhatMosquittosDefaultQueueLetsThrough() throws {
        let broker = try MosquittoBroker()
        try broker.publishRetained(retainedActivities(count: 5000), qos: 1)
        let listed = try watchedActivities(broker)
        print("baton watch --once, mosquitto defaults: \(listed.map(String.init) ?? "nothing") of 5000 listed")
        #expect((listed ?? 0) < 5000)
    }
}
