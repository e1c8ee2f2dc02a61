// Retained floods (docs/broker.md "Retained floods", issue 21 item 3): a fresh subscriber to
// 5,000 retained activities, as a gateway, `baton watch` or Home Assistant subscribes after a
// restart, gets all 5,000 from a broker configured as board/mosquitto-building.conf; with
// mosquitto's defaults the same subscription loses most of them (eclipse-mosquitto#2196).
import BatonLibc
import Foundation
import Testing
import BatonMQTT
import BatonTestSupport

let floodCount = 5000

/// Subscribes a fresh MQTTClient to `baton/activities/+` at QoS 1 (as the gateway and
/// `baton watch` do) and counts the distinct retained activities that arrive, until all have
/// or nothing arrived for 2 s (bounded by 30 s in all).
func retainedReceived(_ broker: MosquittoBroker, id: String) throws -> Int {
    var client = try MQTTClient(config: clientConfig(broker, id: id))
    let log = EventLog()
    try connect(&client, log)
    try client.subscribe("baton/activities/+", qos: 1)
    var topics = Set<String>()
    var seen = 0
    var lastArrival = Instant.now
    let end = Instant.now + .seconds(30)
    runLoop(&client, log, limit: .seconds(30)) {
        let messages = log.events.count
        if messages > seen {
            for e in log.events[seen...] {
                if case .message(let m) = e, m.retained { topics.insert(m.topic) }
            }
            seen = messages
            lastArrival = .now
        }
        return topics.count == floodCount || Instant.now - lastArrival > .seconds(2) || Instant.now > end
    }
    return topics.count
}

@Suite("Retained floods (docs/broker.md)", .serialized)
struct RetainedFloodTests {
    @Test func aFreshSubscriberGetsAll5000RetainedActivitiesFromABuildingsBroker() throws {
        let broker = try MosquittoBroker(extraConfig: try MosquittoBroker.buildingConfig())
        try broker.publishRetained(retainedActivities(count: floodCount), qos: 1)
        #expect(try broker.retained("baton/activities/+").count == floodCount, "all stored")
        let received = try retainedReceived(broker, id: "fresh-building")
        print("retained flood, board/mosquitto-building.conf: \(received) of \(floodCount) delivered")
        #expect(received == floodCount)
    }

    /// What the building's settings are for: mosquitto 2.0's defaults (max_queued_messages
    /// 1000, max_inflight_messages 20) deliver a QoS 1 subscriber the inflight window and the
    /// queue, and drop the rest without a word to either side.
    @Test func mosquittosDefaultsDropMostOfThem() throws {
        let broker = try MosquittoBroker()
        try broker.publishRetained(retainedActivities(count: floodCount), qos: 1)
        #expect(try broker.retained("baton/activities/+").count == floodCount, "all stored")
        let received = try retainedReceived(broker, id: "fresh-default")
        print("retained flood, mosquitto defaults: \(received) of \(floodCount) delivered")
        #expect(received < floodCount)
        let said = broker.log.split(separator: "\n").filter { $0.lowercased().contains("drop") }
        print("mosquitto's log on the drops: \(said.prefix(3))")
    }
}
