// Keeps the broker's retained state equal to what this room holds (docs/mqtt.md §5
// "Through restarts"). It is state-based: while the broker is away nothing is queued but the
// clears of what ended meanwhile; on every (re)connect it publishes the birth status and all
// it owns again, so a broker that restarted without persistence converges back to the truth.
import BatonLibc
public import BatonCore
public import BatonMQTT
public import BatonRelay
import BatonWire

public struct PublisherCounters: Sendable, Equatable {
    /// Retained activity / Apple messages published (set or cleared).
    public var changesPublished = 0
    /// Changes that happened while the broker was away; republished on connect.
    public var changesWhileAway = 0
    /// Clears that did not fit the pending list (the knob: table.capacity + apple.capacity).
    public var pendingClearsDropped = 0
    /// Retained entries a previous run of this gateway left, cleared after the expiry.
    public var orphansCleared = 0
    public var publishErrors = 0
    public var connects = 0
    /// Activities of other, offline gateways that nobody hears any more, cleared by this one
    /// as the first online gateway (docs/rooms.md §4).
    public var clearedForOthers = 0
    /// Retained activities of devices this gateway owns that said otherwise (another
    /// gateway's, an older one, a clear), published again (docs/rooms.md §7).
    public var corrections = 0
    /// Times the broker was asked again for retained entries because more orphans were left
    /// than the orphan list holds (docs/mqtt.md §5).
    public var orphanRescans = 0
    /// Times this gateway's status and connectivity config were published again because the
    /// broker, asked, had not kept `online` (StatusCheck, docs/broker.md).
    public var statusRepublished = 0
    public init() {}
}

/// Something published retained that must be cleared.
public enum OwnedTopic: Sendable, Equatable {
    case activity(UInt64)
    case apple(UInt32)
}

extension Topics {
    /// The retained topic an owned entry lives on.
    public func name(_ owned: OwnedTopic) -> String {
        switch owned {
        case .activity(let id): activity(id)
        case .apple(let id): apple(id)
        }
    }
}

public struct Publisher: ~Copyable {
    public let topics: Topics
    /// This gateway's two batch topics, built once: they are published four times a second.
    let batchTopic: String, buildingBatchTopic: String
    public let origin: Payloads.Origin
    public let clock: WallClock
    public let version: String
    public let discovery: Bool
    public let appleAddresses: Bool
    /// The group whose beacons this gateway verifies, if any: its activities say `verified`.
    public var keyedGroup: UInt32?
    /// What this gateway asks the broker for (Subscriptions): subscribed here at connect.
    public var subscriptions: Subscriptions
    /// The names of `apple.irks`, in file order: a named device's entry says its name.
    public var appleNames: [String] = []
    /// What each activity is called, and the fetches for its title (docs/mqtt.md §2).
    public var names = ActivityNames(types: [], fetchTitles: false, capacity: 0, fetches: 4)
    /// Grace for retained entries left by an earlier run: cleared if not heard within it.
    public let orphanGrace: Duration
    public var log: Logger
    public private(set) var counters = PublisherCounters()
    /// One JSON document at a time; 8 KiB holds the largest (an activity with a 255-byte title
    /// of control characters, each escaped to 6 bytes, and a 1,024-byte URL).
    private let scratch: UnsafeMutableRawBufferPointer
    /// Clears owed to the broker since it went away. Capacity reserved once.
    private var pending: [(topic: OwnedTopic, departed: Bool)]
    private let pendingCapacity: Int
    /// Retained entries naming this gateway that it does not hold, or naming an offline
    /// gateway, with the instant they are cleared unless heard again first.
    private var orphans: [(topic: OwnedTopic, deadline: Instant, mine: Bool)]
    /// Orphans were seen that did not fit the list: once a batch is cleared, the broker is
    /// asked again (a new SUBSCRIBE sends every retained entry anew), no sooner than
    /// `orphanRescanGap` after the last time, until one pass finds no more than fit.
    private var orphansOverflowed = false
    private var rescanAt: Instant?
    private var lastRescan: Instant?
    private var connectedAt: Instant?
    static let orphanRescanGap: Duration = .milliseconds(500)
    /// FNV-1a 64 of the last activity JSON this gateway published for each device it owns,
    /// until it clears it or stops owning it: what the broker should retain (docs/rooms.md §7).
    private var published: [UInt64: UInt64]
    /// Owned devices whose retained activity was seen to say otherwise: since when, and the
    /// gateway the message named (nil: a clear, or no gateway).
    private var disputes: [UInt64: (since: Instant, writer: String?)]
    /// How long a disagreement may stand before the owner settles it. Gateways that receive
    /// the same sightings decide a hand-over within milliseconds of each other (docs/rooms.md
    /// §3 "How far the gateways agree"), so a quarter second lets one that the others have
    /// already made pass untouched; a message that libmosquitto resent from before an outage
    /// is corrected within it. Two gateways that both claim a device settle it by rank
    /// (RoomOwnership.yield), so they do not publish over each other for long.
    public static let correctAfter: Duration = .milliseconds(250)

    public init(topics: Topics, origin: Payloads.Origin, clock: WallClock, version: String,
                discovery: Bool, appleAddresses: Bool, orphanGrace: Duration, ownedCapacity: Int, log: Logger) {
        self.topics = topics
        self.subscriptions = Subscriptions(topics: topics)
        self.batchTopic = topics.batch
        self.buildingBatchTopic = topics.buildingBatch
        self.origin = origin
        self.clock = clock
        self.version = version
        self.discovery = discovery
        self.appleAddresses = appleAddresses
        self.orphanGrace = orphanGrace
        self.log = log
        self.scratch = .allocate(byteCount: 8192, alignment: 8)
        self.pendingCapacity = ownedCapacity
        self.pending = []
        self.pending.reserveCapacity(ownedCapacity)
        self.orphans = []
        self.orphans.reserveCapacity(ownedCapacity)
        // Reserved once: an owner publishes only what its tables hold.
        self.published = [:]
        self.published.reserveCapacity(ownedCapacity)
        self.disputes = [:]
        self.disputes.reserveCapacity(ownedCapacity)
    }

    deinit { scratch.deallocate() }

    static let jsonProperties = MQTTProperties(contentType: "application/json")

    public var pendingClears: Int { pending.count }
    public var orphanCount: Int { orphans.count }
    /// The earliest orphan's deadline, or the next rescan for orphans that did not fit.
    public var nextOrphanDeadline: Instant? {
        let first = orphans.lazy.map({ $0.deadline }).min()
        guard let rescanAt else { return first }
        return first.map { min($0, rescanAt) } ?? rescanAt
    }

    // MARK: changes

    /// A change in this room's table. Only the device's owner publishes it (docs/rooms.md §1):
    /// another room hears the same beacons and its owner says the same thing.
    public mutating func activityChanged(_ mqtt: inout MQTTClient, _ change: ActivityChange, owned: Bool) {
        let a = change.activity
        if change.kind == .expired || change.kind == .evicted { names.forget(a.deviceID) }
        guard owned else { return }
        switch change.kind {
        case .becameCurrent, .saved:
            names.changed(a, kind: change.kind, readable: readable(a))
            guard mqtt.isConnected else { counters.changesWhileAway &+= 1; return }
            publishActivity(&mqtt, a)
            // Its configs went out when this room took it (`tookOver`); a device back after it
            // expired here reads its room again on its tracker (docs/mqtt.md §4).
            if change.kind == .becameCurrent { publish(&mqtt, topics.tracker(a.deviceID), text: origin.room) }
        case .invalidated:
            // The device is still here; its activity ended. Its Home Assistant entities stay
            // and read "unknown" until it becomes current again or expires.
            clear(&mqtt, .activity(a.deviceID), departed: false)
        case .expired, .evicted:
            clear(&mqtt, .activity(a.deviceID), departed: true)
        }
    }

    /// `owned`: false for a named device another room owns (docs/security.md §10).
    public mutating func appleChanged(_ mqtt: inout MQTTClient, _ change: AppleChange, owned: Bool = true) {
        guard owned else { return }
        switch change.kind {
        case .appeared, .handoffChanged, .kindsChanged:
            guard mqtt.isConnected else { counters.changesWhileAway &+= 1; return }
            publishApple(&mqtt, change.device)
            if change.kind == .appeared { publishPersonDiscovery(&mqtt, change.device) }
        case .expired, .evicted:
            // A named device's Home Assistant entity goes with it (an unnamed one has none).
            clear(&mqtt, .apple(change.device.id), departed: change.device.identity != nil)
        }
    }

    // MARK: rooms

    /// This gateway became the device's owner: what it holds goes out now, its room on the
    /// tracker, and its discovery configs unless `announced`: the building retains an activity
    /// of it, so the room that published that one sent them (docs/mqtt.md §4 "Once").
    public mutating func tookOver(_ mqtt: inout MQTTClient, _ a: TrackedActivity, announced: Bool) {
        if a.state == .current { names.tookOver(a, readable: readable(a), now: clock.unixMicroseconds(Instant.now)) }
        guard mqtt.isConnected else { counters.changesWhileAway &+= 1; return }
        if !announced { publishDeviceConfigs(&mqtt, a.deviceID) }
        publish(&mqtt, topics.tracker(a.deviceID), text: origin.room)
        if a.state == .current { publishActivity(&mqtt, a) }
    }

    /// This gateway's room took over a named Apple device: its entry goes out from here now.
    public mutating func tookOver(_ mqtt: inout MQTTClient, _ d: AppleDevice) {
        guard mqtt.isConnected else { counters.changesWhileAway &+= 1; return }
        publishPersonDiscovery(&mqtt, d)
        publishApple(&mqtt, d)
    }

    /// The Room sensor and the tracker of a named device, the sensor's availability following
    /// this gateway's status (Discovery.personRoom), and the room on the tracker's topic.
    /// Nothing for an unnamed device.
    private mutating func publishPersonDiscovery(_ mqtt: inout MQTTClient, _ d: AppleDevice) {
        guard let name = appleName(d) else { return }
        if discovery {
            var w = JSONWriter(scratch)
            do throws(WireError) {
                try Discovery.personRoom(name: name, appleID: d.id, topics: topics, version: version, into: &w)
            } catch {
                return log.error("discovery JSON did not fit 8 KiB (our bug): \(error)")
            }
            _ = publish(&mqtt, topics.personRoomConfig(d.id), w.written)
            w = JSONWriter(scratch)
            do throws(WireError) {
                try Discovery.tracker(deviceID: nil, appleID: d.id, name: name, topics: topics, version: version, into: &w)
            } catch {
                return log.error("discovery JSON did not fit 8 KiB (our bug): \(error)")
            }
            _ = publish(&mqtt, topics.personTrackerConfig(d.id), w.written)
        }
        publish(&mqtt, topics.tracker(apple: d.id), text: origin.room)
    }

    /// Whether the gateway can read the activity's payload: it offers a link, and it is not of
    /// the keyed group, whose payloads are sealed with a key only devices hold (docs/security.md §5).
    func readable(_ a: TrackedActivity) -> Bool {
        a.beacon.psm != 0 && keyedGroup != a.beacon.groupHash
    }

    /// A fetch for the title answered (docs/relay.md §4.1): the activity goes out again, saying it.
    public mutating func described(_ mqtt: inout MQTTClient, _ a: TrackedActivity) {
        guard mqtt.isConnected, a.state == .current else { return }
        publishActivity(&mqtt, a)
    }

    /// Another gateway's message about a device this room holds and does not own: what it
    /// said is kept for a takeover (docs/mqtt.md §2 "Moves"). Change-rate, not per advert.
    public mutating func observedActivity(_ message: MQTTMessage, device id: UInt64, table: borrowing ActivityTable,
                                          ownership: borrowing RoomOwnership) {
        guard !message.payload.isEmpty, !ownership.owns(id), let held = table.activity(deviceID: id) else { return }
        guard let m = message.payload.withUnsafeBytes({ RetainedActivity.read($0) }), let gateway = m.gateway,
              gateway != topics.gatewayID else { return }
        names.observed(id, m, held: held)
    }

    /// Clears a named Apple device's entry: it left this room's table, or nobody hears it and
    /// its owner is offline.
    public mutating func clearApple(_ mqtt: inout MQTTClient, _ id: UInt32, forOthers: Bool) {
        clear(&mqtt, .apple(id), departed: true)
        if forOthers { counters.clearedForOthers &+= 1 }
    }

    /// The user's name for a named device, nil for any other.
    public func appleName(_ d: AppleDevice) -> String? {
        d.identity.flatMap { appleNames.indices.contains($0) ? appleNames[$0] : nil }
    }

    /// Clears a device's activity, and its tracker reads `not_home`: it ended while owned
    /// here, or nobody hears it and its owner is gone (docs/rooms.md §4). Its Home Assistant
    /// entities stay (docs/mqtt.md §4).
    public mutating func clearActivity(_ mqtt: inout MQTTClient, _ deviceID: UInt64, forOthers: Bool) {
        clear(&mqtt, .activity(deviceID), departed: true)
        if forOthers { counters.clearedForOthers &+= 1 }
    }

    /// One sighting as JSON on its own topic, QoS 0 and not retained (docs/rooms.md §2): the
    /// form of gateways before batches, sent with `rooms.batches: false`.
    public mutating func publishSighting(_ mqtt: inout MQTTClient, device: UInt64, _ sighting: Sighting) {
        guard mqtt.isConnected else { return }
        var w = JSONWriter(scratch)
        do throws(WireError) {
            try sighting.write(into: &w)
        } catch {
            return log.error("sighting JSON did not fit 8 KiB (our bug): \(error)")
        }
        do throws(MQTTError) {
            try mqtt.publish(topic: topics.sighting(device), payload: w.written, qos: 0, retain: false,
                             properties: Self.jsonProperties)
        } catch {
            counters.publishErrors &+= 1
        }
    }

    /// A sighting batch (docs/rooms.md §8, docs/protocol.md §6), not retained: it is news,
    /// not state. The tick's own batch goes to the neighbourhood at QoS 0, as the next
    /// heartbeat replaces a lost one (§2); a building-wide one (newcomers and answers, §8.3) at
    /// QoS 1, since it is rare and neighbourhoods are learned from it. The building batch is
    /// sent after the tick's own, whose records it numbers after.
    public mutating func publishBatch(_ mqtt: inout MQTTClient, _ batch: UnsafeRawBufferPointer, buildingWide: Bool = false) {
        guard mqtt.isConnected else { return }
        do throws(MQTTError) {
            try mqtt.publish(topic: buildingWide ? buildingBatchTopic : batchTopic, payload: batch, qos: buildingWide ? 1 : 0,
                             retain: false, properties: nil)
        } catch {
            counters.publishErrors &+= 1
        }
    }

    /// `qos` 0 only for orphans (clearOrphans says why). `departed`: the device left, not
    /// only its activity.
    private mutating func clear(_ mqtt: inout MQTTClient, _ topic: OwnedTopic, departed: Bool, qos: Int32 = 1) {
        if case .activity(let id) = topic { stoppedOwning(id) }
        var sent = mqtt.isConnected
        if sent {
            // The device left: its tracker says `not_home`, so a person attached to it reads
            // away rather than unknown, and its entities stay, reading "unknown" until it is
            // back: Home Assistant's entities of a device do not vanish and return each time
            // it leaves the building (docs/mqtt.md §4). A named Apple device's Room entity goes,
            // as its availability is the publishing room's.
            switch topic {
            case .activity(let id):
                if departed { sent = publish(&mqtt, topics.tracker(id), text: "not_home", qos: qos) && sent }
                sent = publish(&mqtt, topics.activity(id), empty: true, qos: qos) && sent
            case .apple(let id):
                if departed {
                    if discovery { sent = publish(&mqtt, topics.personRoomConfig(id), empty: true, qos: qos) && sent }
                    sent = publish(&mqtt, topics.tracker(apple: id), text: "not_home", qos: qos) && sent
                }
                sent = publish(&mqtt, topics.apple(id), empty: true, qos: qos) && sent
            }
        }
        if sent {
            counters.changesPublished &+= 1
            return
        }
        // Not connected, or the connection died in this turn (the library says so before
        // the disconnect event arrives): owed, and sent on the next connect.
        counters.changesWhileAway &+= 1
        if let i = pending.firstIndex(where: { $0.topic == topic }) {
            pending[i].departed = pending[i].departed || departed
        } else if pending.count < pendingCapacity {
            pending.append((topic, departed))
        } else {
            // Not lost for good: on reconnect the leftover is found as an orphan and cleared
            // after the grace period.
            counters.pendingClearsDropped &+= 1
        }
    }

    // MARK: publishing

    private mutating func publishActivity(_ mqtt: inout MQTTClient, _ a: TrackedActivity) {
        var w = JSONWriter(scratch)
        do throws(WireError) {
            try Payloads.activity(a, origin: origin, clock: clock, keyedGroup: keyedGroup, extras: names.extras(a), into: &w)
        } catch {
            return log.error("activity JSON did not fit 8 KiB (our bug): \(error)")
        }
        if publish(&mqtt, topics.activity(a.deviceID), w.written) {
            counters.changesPublished &+= 1
            if published[a.deviceID] != nil || published.count < pendingCapacity {
                published[a.deviceID] = Self.digest(w.written)
            }
            disputes[a.deviceID] = nil
        }
    }

    private mutating func publishApple(_ mqtt: inout MQTTClient, _ d: AppleDevice) {
        var w = JSONWriter(scratch)
        do throws(WireError) {
            try Payloads.apple(d, origin: origin, clock: clock, withAddress: appleAddresses,
                               name: appleName(d), into: &w)
        } catch {
            return log.error("Apple entry JSON did not fit 8 KiB (our bug): \(error)")
        }
        if publish(&mqtt, topics.apple(d.id), w.written) { counters.changesPublished &+= 1 }
    }

    /// The device's Home Assistant entities, and its room on the tracker's topic.
    private mutating func publishDeviceDiscovery(_ mqtt: inout MQTTClient, _ deviceID: UInt64) {
        publishDeviceConfigs(&mqtt, deviceID)
        publish(&mqtt, topics.tracker(deviceID), text: origin.room)
    }

    /// The device's Home Assistant configs: the same from every room (Discovery.deviceEntity),
    /// so they are sent once, not at every move (docs/mqtt.md §4 "Once").
    private mutating func publishDeviceConfigs(_ mqtt: inout MQTTClient, _ deviceID: UInt64) {
        if discovery {
            for entity in [Discovery.DeviceEntity.room, .activity] {
                var w = JSONWriter(scratch)
                do throws(WireError) {
                    try Discovery.deviceEntity(entity, deviceID: deviceID, topics: topics, version: version, into: &w)
                } catch {
                    return log.error("discovery JSON did not fit 8 KiB (our bug): \(error)")
                }
                let topic = entity == .room ? topics.deviceRoomConfig(deviceID) : topics.deviceActivityConfig(deviceID)
                _ = publish(&mqtt, topic, w.written)
            }
            var w = JSONWriter(scratch)
            do throws(WireError) {
                try Discovery.tracker(deviceID: deviceID, appleID: nil, name: nil, topics: topics, version: version, into: &w)
            } catch {
                return log.error("discovery JSON did not fit 8 KiB (our bug): \(error)")
            }
            _ = publish(&mqtt, topics.deviceTrackerConfig(deviceID), w.written)
        }
    }

    /// Retained, QoS 1: a subscriber that comes later must see it, and the broker must have it.
    /// JSON documents say so in MQTT v5's content type (MQTT 5.0 §3.3.2.3.9); the status text
    /// and clears carry nothing.
    @discardableResult
    private mutating func publish(_ mqtt: inout MQTTClient, _ topic: String, _ payload: UnsafeRawBufferPointer, qos: Int32 = 1) -> Bool {
        let isJSON = payload.first == UInt8(ascii: "{")
        do throws(MQTTError) {
            try mqtt.publish(topic: topic, payload: payload, qos: qos, retain: true,
                             properties: isJSON ? Self.jsonProperties : nil)
            return true
        } catch {
            counters.publishErrors &+= 1
            // One line per connection, not one per topic: a dead socket fails them all.
            if !loggedPublishError {
                loggedPublishError = true
                log.warning("publish to \(topic) failed: \(error); what is owed goes out on the next connect")
            }
            return false
        }
    }

    private var loggedPublishError = false

    private mutating func publish(_ mqtt: inout MQTTClient, _ topic: String, empty: Bool, qos: Int32 = 1) -> Bool {
        publish(&mqtt, topic, UnsafeRawBufferPointer(start: nil, count: 0), qos: qos)
    }

    @discardableResult
    public mutating func publish(_ mqtt: inout MQTTClient, _ topic: String, text: String, qos: Int32 = 1) -> Bool {
        var t = text
        return t.withUTF8 { publish(&mqtt, topic, UnsafeRawBufferPointer($0), qos: qos) }
    }

    /// The stats JSON beside the status (docs/mqtt.md §1), rendered by the caller.
    public mutating func publishStats(_ mqtt: inout MQTTClient, _ json: UnsafeRawBufferPointer) {
        guard mqtt.isConnected else { return }
        publish(&mqtt, topics.stats, json)
    }

    // MARK: (re)connect

    /// Birth, then everything owned: the broker may have restarted with nothing retained.
    public mutating func connected(_ mqtt: inout MQTTClient, table: borrowing ActivityTable, apple: borrowing AppleDeviceTable,
                                   ownership: borrowing RoomOwnership, now: Instant) {
        counters.connects &+= 1
        loggedPublishError = false
        connectedAt = now
        disputes.removeAll(keepingCapacity: true)
        orphansOverflowed = false
        rescanAt = nil
        // Every gateway's status and sightings, for the ownership rule (docs/rooms.md), and
        // the relay's requests.
        do throws(MQTTError) { try subscriptions.subscribeBuilding(&mqtt) } catch {
            log.warning("subscribing to the building's statuses, sightings, fetches and streams failed: \(error)")
        }
        publishBirth(&mqtt)
        let owed = pending
        pending.removeAll(keepingCapacity: true)
        for owedClear in owed { clear(&mqtt, owedClear.topic, departed: owedClear.departed) }
        table.forEach { a in
            // A device this gateway only stands in for waits for the rejoin window: its room
            // may come back in it (the wills a broker sends as it shuts down make every
            // gateway stand in for the others on the way down), and is published then if not
            // (Gateway.republishStandIns, docs/rooms.md §7).
            guard ownership.owns(a.deviceID), !ownership.standsIn(for: a.deviceID) else { return }
            // An invalidated device keeps its Home Assistant entities (docs/mqtt.md §4).
            publishDeviceDiscovery(&mqtt, a.deviceID)
            if a.state == .current { publishActivity(&mqtt, a) }
        }
        apple.forEach { d in
            // A named device only from the room that owns it (docs/security.md §10).
            // A stand-in waits for the rejoin window, as an activity does (above).
            guard d.identity == nil || ownership.owns(AppleDevice.roomsID(d.id)) && !ownership.standsIn(for: AppleDevice.roomsID(d.id))
            else { return }
            publishPersonDiscovery(&mqtt, d)
            publishApple(&mqtt, d)
        }
        // Retained entries naming this gateway that it no longer holds (a restart of the
        // gateway, or clears lost while away) arrive as retained messages and become orphans.
        do throws(MQTTError) { try subscriptions.startRetainedScan(&mqtt, now: now) } catch {
            log.warning("subscribing to this gateway's retained entries failed: \(error)")
        }
    }

    /// This gateway's retained `online` and, with discovery, its connectivity sensor's config:
    /// what it says once per connect, and again when the broker did not keep it (StatusCheck).
    private mutating func publishBirth(_ mqtt: inout MQTTClient) {
        publish(&mqtt, topics.status, text: "online")
        guard discovery else { return }
        var w = JSONWriter(scratch)
        do throws(WireError) {
            try Discovery.gatewayConnectivity(topics: topics, room: origin.room, version: version, into: &w)
            publish(&mqtt, topics.gatewayConnectivityConfig, w.written)
        } catch {
            log.error("discovery JSON did not fit 8 KiB (our bug): \(error)")
        }
    }

    /// The broker was asked for this gateway's retained status and had not kept `online`.
    public mutating func republishBirth(_ mqtt: inout MQTTClient) {
        counters.statusRepublished &+= 1
        publishBirth(&mqtt)
    }

    /// Before a clean stop: nothing more is wanted from the broker.
    public mutating func stopListening(_ mqtt: inout MQTTClient) { subscriptions.unsubscribeAll(&mqtt) }

    public mutating func endRetainedScan(_ mqtt: inout MQTTClient) {
        do throws(MQTTError) { try subscriptions.endRetainedScan(&mqtt) } catch {
            // Harmless: the messages keep coming, as before.
            log.debug("changing the subscriptions after the retained scan failed: \(error)")
        }
    }

    /// A message on the retained-scan patterns, on the topic of `owned`. Only retained ones
    /// matter: those are the broker's memory; live ones are changes coming by.
    public mutating func received(_ mqtt: inout MQTTClient, _ message: MQTTMessage, on owned: OwnedTopic, table: borrowing ActivityTable,
                                  apple: borrowing AppleDeviceTable, ownership: borrowing RoomOwnership,
                                  now: Instant) {
        guard message.retained, !message.payload.isEmpty else { return }
        if Self.holds(owned, table: table, apple: apple, ownership: ownership) { return }
        guard let gateway = Self.gateway(of: message.payload) else { return }
        let mine = gateway == topics.gatewayID
        // Another gateway's entry is its business while it is online; an offline gateway's
        // activity is everyone's (docs/rooms.md §4). Apple entries are per gateway.
        if !mine {
            guard Self.roomsID(owned, ownership) != nil, !ownership.isOnline(gateway: Substring(gateway)) else { return }
            // Only the first online gateway clears them (docs/rooms.md §4), so only it holds
            // them: the others' lists stay free for their own, and one that becomes first later
            // asks the broker for everything again (`askForRetainedAgain`).
            guard ownership.firstOnline == ownership.selfSlot else { return }
        }
        guard !orphans.contains(where: { $0.topic == owned }) else { return }
        guard orphans.count < pendingCapacity else {
            // Not lost: cleared in a later batch (docs/mqtt.md §5).
            if !orphansOverflowed {
                log.info("more retained entries to check than the orphan list holds (table.capacity + apple.capacity = \(pendingCapacity)): clearing them in batches")
            }
            orphansOverflowed = true
            return
        }
        // The grace runs from when the entry could first have been an orphan: this gateway's
        // connect (its earlier run's entries; gateways offline by then), or the moment its
        // gateway went offline. An entry found again by a later pass may be due at once.
        var from = connectedAt ?? now
        if !mine, let off = ownership.offlineSince(gateway: Substring(gateway)), off > from { from = off }
        orphans.append((owned, max(now, from + orphanGrace), mine))
    }

    /// A message on an activity topic, retained or live (docs/rooms.md §7): for a device this
    /// gateway owns and has published, anything but what it published last is a disagreement,
    /// corrected after `Publisher.correctAfter` unless a matching message comes first, or,
    /// for another gateway's claim, even then (docs/rooms.md §7 rule 3): a broker of several
    /// nodes (NATS) keeps retained messages per node in each node's order of arrival, so two
    /// gateways publishing one device at once can each see its own message land last while
    /// the other's node keeps the other's. Only settling it by rank, the winner publishing
    /// once more, leaves every node the same last writer.
    public mutating func observed(_ message: MQTTMessage, device id: UInt64, now: Instant) {
        guard let mine = published[id] else { return }
        if message.payload.withUnsafeBytes({ Self.digest($0) }) == mine {
            if let claim = disputes[id], let writer = claim.writer, writer != topics.gatewayID { return }
            disputes[id] = nil
        } else if disputes[id] == nil, disputes.count < pendingCapacity {
            // Rare (after faults), so the one copy of the writer's id is fine here.
            disputes[id] = (now, message.payload.isEmpty ? nil : Self.gateway(of: message.payload))
        }
    }

    /// This gateway no longer owns the device (or cleared it): what others publish is theirs.
    public mutating func stoppedOwning(_ deviceID: UInt64) {
        names.stoppedOwning(deviceID)
        published[deviceID] = nil
        disputes[deviceID] = nil
    }

    /// When the first disagreement is due to be corrected.
    public var nextCorrection: Instant? {
        disputes.values.lazy.map({ $0.since }).min().map { $0 + Self.correctAfter }
    }

    /// Settles every disagreement that has stood for `Publisher.correctAfter` about a device
    /// this gateway still owns and holds current: a clear, or a message of no gateway's or of
    /// this one's, is published over at once; another gateway's claim is returned, for the
    /// rule to say which of the two keeps the device (RoomOwnership.yield, then `republish`).
    /// A stand-in inside the rejoin window waits for the window (docs/rooms.md §7 rule 1).
    public mutating func correct(_ mqtt: inout MQTTClient, table: borrowing ActivityTable, ownership: borrowing RoomOwnership,
                                 now: Instant) -> [(device: UInt64, claimedBy: String)] {
        let due = disputes.filter { $0.value.since + Self.correctAfter <= now }.map { ($0.key, $0.value.writer) }
        var contested: [(device: UInt64, claimedBy: String)] = []
        for (id, writer) in due {
            disputes[id] = nil
            guard ownership.owns(id), table.activity(deviceID: id)?.state == .current else {
                published[id] = nil
                continue
            }
            if ownership.isRejoining(now: now) && ownership.standsIn(for: id) { continue }
            if let writer, writer != topics.gatewayID {
                contested.append((id, writer))
            } else {
                republish(&mqtt, id, table: table)
            }
        }
        return contested
    }

    /// The owner publishes a device's activity over a retained message that said otherwise.
    public mutating func republish(_ mqtt: inout MQTTClient, _ id: UInt64, table: borrowing ActivityTable) {
        guard let a = table.activity(deviceID: id), a.state == .current else { return }
        log.info("device \(Topics.deviceText(id)): the retained activity says otherwise than this room, which owns it; publishing it again")
        counters.corrections &+= 1
        publishActivity(&mqtt, a)
    }

    /// Equal payloads, equal digests; a different payload that collided would only skip one
    /// correction. Over borrowed bytes: a generic sequence from another module was iterated
    /// through a boxed iterator, one allocation per message heard (heaptrack, issue 17).
    static func digest(_ bytes: UnsafeRawBufferPointer) -> UInt64 {
        var f = FNV1a64()
        for b in bytes { f.add(b) }
        return f.value
    }

    /// Clears the orphans whose grace has passed and that were not heard again: this
    /// gateway's own, and offline gateways' activities that no online gateway owns, when this
    /// gateway is the first online one (so one gateway clears, not all).
    public mutating func clearOrphans(_ mqtt: inout MQTTClient, table: borrowing ActivityTable, apple: borrowing AppleDeviceTable,
                                      ownership: borrowing RoomOwnership, publishers: borrowing ActivityPublishers,
                                      now: Instant) {
        guard mqtt.isConnected else { return }
        if let due = rescanAt, due <= now { return rescanOrphans(&mqtt, now: now) }
        guard orphans.contains(where: { $0.deadline <= now }) else { return }
        var kept: [(topic: OwnedTopic, deadline: Instant, mine: Bool)] = []
        var cleared = 0
        for o in orphans {
            guard o.deadline <= now else { kept.append(o); continue }
            if Self.holds(o.topic, table: table, apple: apple, ownership: ownership) { continue }
            if let id = Self.roomsID(o.topic, ownership) {
                if let owner = ownership.owner(of: id), owner != ownership.selfSlot, ownership.isOnline(owner) {
                    continue  // an online gateway owns it now and keeps the topic right
                }
                if !o.mine, ownership.follows(id) {
                    continue  // the rule forgets it when nobody hears it, and the first online gateway clears it then (docs/rooms.md §4)
                }
            }
            // A device the rule does not follow (with neighbourhoods, one at the far end of the
            // building): an online gateway that published it since has it (docs/relay.md §4).
            if case .activity(let id) = o.topic, let by = publishers.publisher(of: id),
               by != ownership.selfSlot, ownership.isOnline(by) {
                continue
            }
            if !o.mine, ownership.firstOnline != ownership.selfSlot { continue }
            if cleared < 8 {
                log.info("clearing \(topics.name(o.topic)), left retained by \(o.mine ? "an earlier run" : "an offline gateway") and not heard since")
            }
            cleared += 1
            // QoS 0: libmosquitto holds back QoS 1 publishes beyond the broker's receive
            // maximum, so the next pass's SUBSCRIBE would overtake a batch of clears and bring
            // the same entries back. QoS 0 goes out in order, before it. One that is lost is
            // found again by the next pass or the next connect's scan.
            clear(&mqtt, o.topic, departed: true, qos: 0)
            if o.mine { counters.orphansCleared &+= 1 } else { counters.clearedForOthers &+= 1 }
        }
        if cleared > 8 { log.info("cleared \(cleared) retained entries left by an earlier run or offline gateways") }
        orphans.removeAll(keepingCapacity: true)
        orphans.append(contentsOf: kept)
        if orphansOverflowed, rescanAt == nil {
            rescanAt = max(now, (lastRescan ?? now) + Self.orphanRescanGap)
        }
    }

    /// Asks the broker again for every retained entry, at most every `orphanRescanGap`, when this
    /// gateway is the first online one and may not know what another left (docs/rooms.md §4):
    /// it has just become first, and the one before may have left some; or, with
    /// neighbourhoods (§8.3), another gateway died while this one is first, and its devices at
    /// the far end of the building are known here only from the broker's retained entries.
    /// Those nobody takes over are cleared after the grace (docs/mqtt.md §5).
    public mutating func askForRetainedAgain(_ mqtt: inout MQTTClient, now: Instant) {
        guard mqtt.isConnected, rescanAt == nil else { return }
        rescanAt = max(now, (lastRescan ?? now) + Self.orphanRescanGap)
    }

    /// Asks the broker for every retained entry again: the ones that did not fit last time
    /// come back (those cleared are gone), and fill the list for the next batch.
    private mutating func rescanOrphans(_ mqtt: inout MQTTClient, now: Instant) {
        rescanAt = nil
        lastRescan = now
        orphansOverflowed = false
        counters.orphanRescans &+= 1
        do throws(MQTTError) { try subscriptions.startRetainedScan(&mqtt, now: now) } catch {
            orphansOverflowed = true
            log.warning("asking the broker again for retained entries failed: \(error)")
        }
    }

    /// True when this gateway holds what the topic shows: a current activity it owns, an Apple entry.
    static func holds(_ owned: OwnedTopic, table: borrowing ActivityTable, apple: borrowing AppleDeviceTable,
                      ownership: borrowing RoomOwnership) -> Bool {
        switch owned {
        case .activity(let id):
            return table.activity(deviceID: id)?.state == .current && ownership.owns(id)
        case .apple(let id):
            var held = false
            apple.forEach { if $0.id == id && ($0.identity == nil || ownership.owns(AppleDevice.roomsID(id))) { held = true } }
            return held
        }
    }

    /// The id rooms decide the topic's owner by: an activity's device, or a named Apple device
    /// the rooms follow. nil: an Apple entry of one gateway's own (docs/table.md).
    static func roomsID(_ owned: OwnedTopic, _ ownership: borrowing RoomOwnership) -> UInt64? {
        switch owned {
        case .activity(let id): id
        case .apple(let id): ownership.follows(AppleDevice.roomsID(id)) ? AppleDevice.roomsID(id) : nil
        }
    }

    static func gateway(of payload: [UInt8]) -> String? {
        payload.withUnsafeBytes { RetainedEntry.gateway($0) }
    }
}
