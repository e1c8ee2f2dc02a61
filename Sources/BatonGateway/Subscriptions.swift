// What this gateway asks the broker for, in one list (docs/mqtt.md §9): the building's topics
// at every connect, this gateway's retained entries for the retained scan, the neighbours'
// batches as the rooms part learns them, its own status while the status check asks. A clean
// stop unsubscribes what the list says was subscribed.
import BatonLibc
import BatonMQTT
import BatonRelay

public struct Subscriptions {
    public struct Entry: Equatable {
        public let pattern: String
        public let qos: Int32
        /// MQTT 5's Retain As Published (§3.8.3.1): the retained flag as the publisher set it.
        public var retainAsPublished = false
    }

    let topics: Topics
    /// `rooms.neighbourhoods` (docs/rooms.md §8.3): this gateway's own batches and the
    /// building-wide ones at connect, not every gateway's; the neighbours follow.
    public var neighbourhoods = false
    /// With re-advertising: the owners' answers to the phones' fetches (docs/relay.md §9).
    public var answers: String?
    /// While the retained scan runs: when it ends (`retainedScan` after the SUBACK's request).
    public private(set) var retainedScanEnds: Instant?

    /// The broker sends retained messages right after SUBACK; after this long the Apple
    /// subscription only brings every gateway's live changes (ours included), each copied
    /// into the heap for nothing, so it ends. The activities' stays (docs/rooms.md §7).
    public static var retainedScan: Duration { .seconds(5) }

    init(topics: Topics) { self.topics = topics }

    /// The building's topics, in the order they are subscribed at every connect. The statuses
    /// come first, so the retained scan (after them) knows who is online. All but the relay's
    /// at QoS 0 (the statuses and building batches are published at QoS 1, so the broker has
    /// them): mosquitto sends a QoS 0 message at once but may hold a QoS 1 one behind a full
    /// inflight window, so a gateway's batch could overtake its own `online` and be dropped as
    /// an unknown gateway's; and at 50 rooms the acknowledgements of the building batches were
    /// a write per message at every gateway (docs/rooms.md §8.3). A delivery is lost only with
    /// the connection, and a reconnect starts the rooms over (§7).
    public var building: [Entry] {
        var list = [Entry(pattern: topics.statusPattern, qos: 0)]
        // The gateways' sighting batches (docs/rooms.md §8.1), and single JSON sightings from
        // gateways older than batches (§2), so a building can be upgraded room by room.
        if neighbourhoods {
            list += [Entry(pattern: topics.batch, qos: 0), Entry(pattern: topics.buildingBatchPattern, qos: 0)]
        } else {
            list.append(Entry(pattern: topics.batchPattern, qos: 0))
        }
        list += [
            Entry(pattern: topics.sightingPattern, qos: 0),
            // Payload fetches for any device: the owner answers (docs/relay.md §4).
            Entry(pattern: topics.fetchPattern, qos: 1),
            // Stream opens, and who carries which stream (docs/relay.md §7); the stream
            // directory takes only retained claims, so their flag is kept (§7.3).
            Entry(pattern: topics.streamOpenPattern, qos: 1),
            Entry(pattern: topics.streamCarrierPattern, qos: 1, retainAsPublished: true),
        ]
        if let answers { list.append(Entry(pattern: answers, qos: 1)) }
        return list
    }

    /// The retained scan's topics: this gateway's retained activities and Apple entries, at
    /// QoS 1 so none is skipped behind a full queue (docs/mqtt.md §5).
    public var retained: [Entry] {
        [Entry(pattern: topics.activityPattern, qos: 1), Entry(pattern: topics.applePattern, qos: 1)]
    }

    func subscribeBuilding(_ mqtt: inout MQTTClient) throws(MQTTError) {
        for e in building { try mqtt.subscribe(e.pattern, qos: e.qos, retainAsPublished: e.retainAsPublished) }
    }

    /// Asks the broker for every retained entry (at connect, and again for orphans that did
    /// not fit): the activities stay subscribed for good, since an owner keeps the retained
    /// state of what it owns right, whoever wrote it (docs/rooms.md §7).
    mutating func startRetainedScan(_ mqtt: inout MQTTClient, now: Instant) throws(MQTTError) {
        for e in retained { try mqtt.subscribe(e.pattern, qos: e.qos) }
        retainedScanEnds = now + Self.retainedScan
    }

    /// The scan is over: the Apple entries go, and the activities bring only the building's
    /// live changes, a few hundred a second at 50 rooms: at QoS 1 each cost an acknowledgement
    /// back to the broker, a write of its own at every gateway (docs/rooms.md §8.6). A live
    /// change lost with the connection is found again by the next connect's scan, which is
    /// QoS 1. Under MQTT 3.1.1 subscribing again would bring every retained entry once more:
    /// it stays.
    mutating func endRetainedScan(_ mqtt: inout MQTTClient) throws(MQTTError) {
        retainedScanEnds = nil
        try mqtt.unsubscribe(topics.applePattern)
        if mqtt.protocolVersion == .v5 { try mqtt.subscribe(topics.activityPattern, qos: 0, sendRetained: false) }
    }

    /// A neighbour's batches (docs/rooms.md §8.3), or no longer.
    func neighbour(_ id: String, subscribe: Bool, _ mqtt: inout MQTTClient) throws(MQTTError) {
        let topic = topics.batch(of: id)
        if subscribe { try mqtt.subscribe(topic, qos: 0) } else { try mqtt.unsubscribe(topic) }
    }

    /// The status check asks the broker for this gateway's own retained status, or stops
    /// (docs/broker.md "A status the broker did not keep").
    func ownStatus(asking: Bool, _ mqtt: inout MQTTClient) throws(MQTTError) {
        if asking { try mqtt.subscribe(topics.status, qos: 0) } else { try mqtt.unsubscribe(topics.status) }
    }

    /// Before a clean stop: nothing more is wanted from the broker. The Apple entries only
    /// while the retained scan runs (after it they are not subscribed).
    func unsubscribeAll(_ mqtt: inout MQTTClient) {
        var patterns = building.map { $0.pattern }
        patterns.append(topics.activityPattern)
        if retainedScanEnds != nil { patterns.append(topics.applePattern) }
        for pattern in patterns {
            do throws(MQTTError) { try mqtt.unsubscribe(pattern) } catch { return }
        }
    }
}
