// The loop's rooms part (docs/rooms.md): which gateway of the building owns each device,
// decided by the same rule on the same evidence at every gateway, and this gateway's own
// evidence, its sightings.
import BatonLibc
import BatonCore
import BatonHCI
import BatonKeys
import BatonMQTT
import BatonRelay
import BatonWire

struct GatewayRooms: ~Copyable {
    var ownership: RoomOwnership
    var sightings: SightingSchedule
    /// Packs a tick's due sightings into batches, carrying this run's `since` and sighting
    /// counter `n` (docs/rooms.md §8.1, docs/protocol.md §6).
    var batcher: SightingBatcher
    /// `rooms.lost-after` in nanoseconds: `hears` adds it for every record of every batch.
    let lostAfter: Int64
    /// When the table is next walked for due sightings. A fixed cadence, not the schedule's
    /// exact deadline: that deadline moves with every report's RSSI, and finding it walks the
    /// whole table, which every loop turn would pay (docs/rooms.md §2).
    var nextSightingCheck: Instant
    let sightingCheckInterval: Duration
    /// The rule's own deadlines are run at most every `tickInterval`: with a thousand devices
    /// one of them is due every few milliseconds, and each was a wake-up of its own. A settle,
    /// a dwell or a lapse then acts up to that much late (docs/rooms.md §3).
    var nextTick: Instant
    static let tickInterval = Duration.milliseconds(20)
    /// When the rule's deadlines are next run.
    var tickDue: Instant? { ownership.nextDeadline.map { max($0, nextTick) } }
    /// Ownership changes of one call, handled after it (the handler reads the rule's state).
    /// Reserved for every device at once: a gateway going offline hands over all of them.
    var changes: [OwnershipChange]
    /// Sightings dropped, by reason (stats `rooms.drops`).
    var drops = DropCounts()
    var sightingsReceived = 0
    var batchesReceived = 0
    /// Of those, from the building-wide channel (docs/rooms.md §8.3).
    var buildingSightingsReceived = 0
    var buildingBatchesReceived = 0
    /// When the rejoin window after a reconnect closes (docs/rooms.md §7).
    var standInsDue: Instant?
    /// `rooms.neighbourhoods` (docs/rooms.md §8.3): whose batches this gateway subscribes to,
    /// beside its own and the building-wide ones; nil: every gateway's (`<prefix>/rooms/+`).
    var neighbourhood: Neighbourhood?
    /// This tick's building-wide records: newcomers, then answers. Reserved at init for every
    /// device the schedule follows, twice (all newcomers after a reconnect, and as many answers).
    var building: [DueSighting]
    let buildingCapacity: Int
    /// Building-wide records that did not fit `building` (never in practice: see its size).
    var buildingDropped = 0
    /// The gateway each device's activity topic names: who answers for a device the rule does
    /// not follow (docs/relay.md §4 "Who answers"), and whether a device's discovery configs
    /// are out (docs/mqtt.md §4 "Once"). Four times as many devices as the rule follows.
    var publishers: ActivityPublishers

    init(config: GatewayConfig, unixMicroseconds: Int64, now: Instant) {
        var rooms = config.rooms
        rooms.forgetAfter = config.table.expiry
        self.batcher = SightingBatcher(since: unixMicroseconds / 1000)
        self.lostAfter = config.rooms.lostAfter.nanoseconds
        self.ownership = RoomOwnership(config: rooms, selfID: config.gatewayID, selfSince: unixMicroseconds / 1000)
        // The named Apple devices are sighted too, so one room owns each (docs/security.md §10).
        self.sightings = SightingSchedule(config: rooms, capacity: config.table.capacity + config.appleIRKs.count)
        self.changes = []
        self.changes.reserveCapacity(rooms.capacity)
        // Four times the rule's devices: an index entry is 32 bytes, and a device whose owner is
        // not remembered has its discovery configs sent again at every move (docs/mqtt.md §4
        // "Once"): 3,000 devices over the default 2,048 sent 137 per device per hour.
        self.publishers = ActivityPublishers(capacity: 4 * rooms.capacity)
        let followed = config.table.capacity + config.appleIRKs.count
        if config.neighbourhoods && config.sightingBatches {
            // A neighbour is forgotten after 60 s without a shared device, or three heartbeats
            // when those are slower: a neighbour's heartbeats keep it while it shares one.
            self.neighbourhood = Neighbourhood(gateways: rooms.gateways, answerCapacity: followed,
                                               forgetAfter: max(.seconds(60), rooms.sightingInterval * 3))
            self.buildingCapacity = 2 * followed
        } else {
            self.neighbourhood = nil
            self.buildingCapacity = 0
        }
        self.building = []
        self.building.reserveCapacity(buildingCapacity)
        self.sightingCheckInterval = min(rooms.sightingMinInterval, .milliseconds(250))
        self.nextSightingCheck = now
        self.nextTick = now
    }

    /// The rooms' part of the stats topic (docs/mqtt.md §1).
    func writeStats(owned: Int, publisher: PublisherCounters, into w: inout JSONWriter) throws(WireError) {
        // Sightings are counted record by record, sent in batches or received in either form.
        let oc = ownership.counters
        try w.key("rooms"); try w.beginObject()
        try w.key("devices"); try w.int(Int64(ownership.count))
        try w.key("capacity"); try w.int(Int64(ownership.capacity))
        try w.key("owned"); try w.int(Int64(owned))
        try w.key("ownership_changes"); try w.int(Int64(oc.changes))
        try w.key("takeovers"); try w.int(Int64(oc.takeovers))
        try w.key("forgotten"); try w.int(Int64(oc.forgotten))
        try w.key("unfollowed"); try w.int(Int64(oc.unfollowed))
        try w.key("sightings_sent"); try w.int(Int64(batcher.recordsSent))
        try w.key("batches_sent"); try w.int(Int64(batcher.batchesSent))
        try w.key("sightings_received"); try w.int(Int64(sightingsReceived))
        try w.key("batches_received"); try w.int(Int64(batchesReceived))
        if let n = neighbourhood {
            try w.key("building_sightings_received"); try w.int(Int64(buildingSightingsReceived))
            try w.key("building_batches_received"); try w.int(Int64(buildingBatchesReceived))
            // Whose batches this gateway receives besides its own (docs/rooms.md §8.3).
            try w.key("neighbours"); try w.beginArray()
            var failed: WireError?
            n.forEachNeighbour { g in
                guard failed == nil else { return }
                do throws(WireError) { try w.string(ownership.id(of: g)) } catch { failed = error }
            }
            if let failed { throw failed }
            try w.endArray()
        }
        // Devices whose owner is known from their activity topic (docs/relay.md §4), and
        // messages about one more that did not fit.
        try w.key("owners_known"); try w.int(Int64(publishers.count))
        try w.key("owners_known_full"); try w.int(Int64(publishers.full))
        try w.key("cleared_for_others"); try w.int(Int64(publisher.clearedForOthers))
        try w.key("corrections"); try w.int(Int64(publisher.corrections))
        // Apart from the radio's drops: a sighting's `truncated` is not an advert's.
        try w.key("drops"); try w.beginObject()
        for d in drops.sorted { try w.key(d.reason); try w.int(Int64(d.count)) }
        try w.endObject()
        try w.endObject()
    }
}

extension RoomState {
    /// A gateway's status: online, or its will. A gateway gone offline is news for the relays
    /// (`Gateway.received` routes it): its activities are nobody's to continue now, and its
    /// streams' endpoints must be told.
    mutating func statusReceived(_ message: MQTTMessage, gateway id: Substring, now: Instant, mqtt: inout MQTTClient) -> GatewayWentOffline? {
        let online = message.payload.elementsEqual("online".utf8)
        // A gateway coming online subscribed to the sightings before it said so, but missed
        // the ones sent before: send ours again now, within its `rooms.settle`, rather than
        // at the next heartbeat, after it (two gateways starting together would each settle
        // on itself first, docs/rooms.md §3). Also when it was online already as far as
        // this gateway knows: after a broker restart nobody's will was sent, and a live
        // `online` is its reconnect (a retained one is old news, sent at our own subscribe,
        // and our own connect sent everything anyway). Its rejoin window waits for exactly
        // these (docs/rooms.md §7).
        if online, id != gatewayID, !message.retained || !rooms.ownership.isOnline(gateway: id) {
            rooms.sightings.reset()
            // It knows no neighbours now: its next shared record is answered (§8.3).
            if let g = rooms.ownership.slot(of: id), rooms.neighbourhood?.forget(g) == true {
                neighbour(g, subscribe: false, mqtt: &mqtt)
            }
        }
        let wasFirst = rooms.ownership.firstOnline == rooms.ownership.selfSlot
        defer {
            // Orphans are the first gateway's: it has just become first, or (neighbourhoods) a
            // gateway whose far devices are not followed here died. A retained `offline` is one
            // our connect's own scan covers.
            let died = !online && !message.retained && rooms.neighbourhood != nil
            if rooms.ownership.firstOnline == rooms.ownership.selfSlot, id != gatewayID, !wasFirst || died {
                publisher.askForRetainedAgain(&mqtt, now: now)
            }
        }
        if !rooms.ownership.status(gateway: id, online: online, now: now, { rooms.changes.append($0) }) {
            rooms.drops.count(SightingDrop.gatewaysFull.name)
            log.warning("gateway \(id): more gateways than rooms.gateways (\(gatewayLimit)); its devices are not followed")
        }
        handleOwnershipChanges(now: now, mqtt: &mqtt)
        guard !online else { return nil }
        // Its streams' endpoints are told by the first online gateway (docs/relay.md §7.3).
        return GatewayWentOffline(id: id, tellStreams: id != gatewayID && rooms.ownership.firstOnline == rooms.ownership.selfSlot)
    }

    /// Another gateway's sighting of a device (docs/rooms.md §2), or our own coming back.
    mutating func sightingReceived(_ message: MQTTMessage, gateway: Substring, device: UInt64, now: Instant, mqtt: inout MQTTClient) {
        rooms.sightingsReceived &+= 1
        // Array.withUnsafeBytes rethrows untyped: the decode result travels out as a value.
        let decoded: Result<Sighting, WireError> = message.payload.withUnsafeBytes { bytes in
            do throws(WireError) { return .success(try Sighting.decode(bytes)) } catch { return .failure(error) }
        }
        let sighting: Sighting
        switch decoded {
        case .success(let s): sighting = s
        case .failure(let error): return rooms.drops.count(error)
        }
        // A device newly followed takes the owner its activity message names (docs/rooms.md §3).
        if let drop = rooms.ownership.sighting(sighting, gateway: gateway, device: device, now: now,
                                               publisher: { rooms.publishers.publisher(of: $0) },
                                               { rooms.changes.append($0) }) {
            rooms.drops.count(drop.name)
        }
        handleOwnershipChanges(now: now, mqtt: &mqtt)
    }

    /// A gateway's batch of sightings (docs/rooms.md §8.1), our own coming back included: each
    /// record under the rule as a single sighting is.
    mutating func batchReceived(_ message: MQTTMessage, topic: BatchTopic, now: Instant, mqtt: inout MQTTClient) {
        let gateway: Substring
        switch topic {
        case .neighbourhood(let g), .building(let g): gateway = g
        case .malformed: return rooms.drops.count("batch-topic")
        }
        rooms.batchesReceived &+= 1
        let buildingWide = topic.isBuildingWide
        if buildingWide { rooms.buildingBatchesReceived &+= 1 }
        // Array.withUnsafeBytes rethrows untyped: the outcome travels out as a value.
        let outcome: Result<BatchOutcome, WireError> = message.payload.withUnsafeBytes { bytes in
            do throws(WireError) {
                let batch = try SightingBatch.decode(bytes)
                // Before the rule takes a building batch in: whether we held its sender's
                // sightings fresh is what tells a newcomer (docs/rooms.md §8.3).
                if rooms.neighbourhood != nil { learnNeighbours(batch, topic: topic, from: gateway, now: now, mqtt: &mqtt) }
                // With neighbourhoods, a record of a device this gateway neither hears nor owns
                // (nor follows already) is not taken up: it needs nothing about such devices
                // (docs/rooms.md §8.2). Building-wide, each one followed went stale 5 s later and
                // was evaluated over and over until forgotten; from the neighbours, a building of
                // 3,000 devices filled `rooms.capacity` with devices heard only next door, and
                // the ones this room holds were dropped (issue 30). A full rule frees such an
                // entry for one this room needs.
                let lostAfter = rooms.lostAfter
                let needsHeard = rooms.neighbourhood != nil
                return .success(rooms.ownership.batch(batch, gateway: gateway, now: now, buildingWide: buildingWide,
                                                      ignoreNew: { device in
                    needsHeard && !Self.heard(device, table: table, apple: apple, lostAfter: lostAfter, now: now)
                }, publisher: { rooms.publishers.publisher(of: $0) }) {
                    rooms.changes.append($0)
                })
            } catch {
                return .failure(error)
            }
        }
        switch outcome {
        case .failure(let error):
            rooms.drops.count(error)
        case .success(let o):
            rooms.sightingsReceived &+= o.accepted + o.dropped
            if buildingWide { rooms.buildingSightingsReceived &+= o.accepted + o.dropped }
            if o.unknownGateway > 0 { rooms.drops.count(SightingDrop.unknownGateway.name, o.unknownGateway) }
            if o.replayed > 0 { rooms.drops.count(SightingDrop.replayed.name, o.replayed) }
            if o.impostor > 0 { rooms.drops.count(SightingDrop.impostor.name, o.impostor) }
            if o.devicesFull > 0 { rooms.drops.count(SightingDrop.devicesFull.name, o.devicesFull) }
        }
        handleOwnershipChanges(now: now, mqtt: &mqtt)
    }

    /// A batch's records as neighbourhood evidence (docs/rooms.md §8.3): a record that heard a
    /// device this gateway hears or owns makes its sender a neighbour (subscribed to at once);
    /// from the building-wide channel, a sender that was not one yet, or one whose sightings
    /// of the device we did not hold fresh (it has just started hearing it), is also owed our
    /// own sighting of the device in our next building batch. Allocates nothing but the
    /// topic of a new neighbour.
    mutating func learnNeighbours(_ batch: SightingBatch, topic: BatchTopic, from gateway: Substring, now: Instant,
                                  mqtt: inout MQTTClient) {
        guard let from = rooms.ownership.slot(of: gateway), from != rooms.ownership.selfSlot else { return }
        let building = topic.isBuildingWide
        // Looking through every neighbour's every batch for a shared device was 6 % of a
        // gateway at 50 rooms; one look in a while keeps the neighbour as well.
        if !building, rooms.neighbourhood?.sharedRecently(from, now: now) == true { return }
        for i in 0 ..< batch.count {
            let r = batch[i]
            guard r.rssi != nil else { continue }
            guard hears(r.device, now: now) || rooms.ownership.owns(r.device) else { continue }
            guard building else {
                if case .subscribe(let g)? = rooms.neighbourhood?.record(from: from, shared: true, now: now) {
                    neighbour(g, subscribe: true, mqtt: &mqtt)
                }
                // One shared device keeps a neighbour: the rest of its batch tells nothing more,
                // and asking the tables about every record showed in the profile.
                return
            }
            var fresh = false
            rooms.ownership.sightings(of: r.device, now: now) { g, _ in if g == from { fresh = true } }
            switch rooms.neighbourhood?.buildingRecord(device: r.device, from: from, shared: true, now: now) {
            case .subscribe(let g)?: neighbour(g, subscribe: true, mqtt: &mqtt)
            case nil: if !fresh { rooms.neighbourhood?.answer(r.device) }
            }
        }
    }

    /// Whether this gateway hears `device` now: its last sighting sent heard it, or, since the
    /// schedule forgets what it sent whenever a gateway comes online (§7), its tables heard it
    /// within `lost-after`. O(1), allocates nothing.
    func hears(_ device: UInt64, now: Instant) -> Bool {
        rooms.sightings.hears(device) || Self.heard(device, table: table, apple: apple, lostAfter: rooms.lostAfter, now: now)
    }

    /// Whether the tables heard `device` (an activity, or a named Apple device's rooms id)
    /// within `lostAfter` nanoseconds. Static, so it can be asked while the rule is being changed.
    static func heard(_ device: UInt64, table: borrowing ActivityTable, apple: borrowing AppleDeviceTable,
                      lostAfter: Int64, now: Instant) -> Bool {
        if let a = table.activity(deviceID: device) { return now < a.lastSeen.after(lostAfter) }
        if device >> 32 == 0xFFFF, let d = apple.namedDevice(id: UInt32(truncatingIfNeeded: device)) {
            return now < d.lastSeen.after(lostAfter)
        }
        return false
    }

    /// Start or stop receiving a gateway's batches (docs/rooms.md §8.3); change-rate, so the
    /// topic is built here.
    mutating func neighbour(_ g: GatewaySlot, subscribe: Bool, mqtt: inout MQTTClient) {
        Self.neighbour(g, subscribe: subscribe, ownership: rooms.ownership, subscriptions: publisher.subscriptions,
                       mqtt: &mqtt, log: log)
    }

    static func neighbour(_ g: GatewaySlot, subscribe: Bool, ownership: borrowing RoomOwnership, subscriptions: Subscriptions,
                          mqtt: inout MQTTClient, log: Logger) {
        let id = ownership.id(of: g)
        do throws(MQTTError) {
            try subscriptions.neighbour(id, subscribe: subscribe, &mqtt)
            log.debug("neighbour \(id): \(subscribe ? "subscribed to" : "unsubscribed from") its batches")
        } catch {
            log.warning("\(subscribe ? "subscribing to" : "unsubscribing from") \(subscriptions.topics.batch(of: id)) failed: \(error)")
        }
    }

    /// The rule's own deadlines: a settle window ending, an owner's sightings lapsing.
    mutating func roomsTick(now: Instant, mqtt: inout MQTTClient) {
        rooms.nextTick = now + GatewayRooms.tickInterval
        rooms.ownership.tick(now: now) { rooms.changes.append($0) }
        handleOwnershipChanges(now: now, mqtt: &mqtt)
    }

    /// Acts on what the rule decided: the new owner publishes what it holds; the old one
    /// falls silent without clearing (the topic is the new owner's now); a forgotten device's
    /// activity is cleared by its owner, or by the first online gateway if its owner is gone.
    mutating func handleOwnershipChanges(now: Instant, mqtt: inout MQTTClient) {
        guard !rooms.changes.isEmpty else { return }
        let me = rooms.ownership.selfSlot
        for change in rooms.changes {
            let device = Topics.deviceText(change.device)
            // A full table never gives up what this room owns (docs/table.md "A full table").
            if change.to == me { table.setOwned(change.device, true) } else if change.from == me { table.setOwned(change.device, false) }
            if change.to == me {
                // A first owner is every new device's arrival: debug; a move is news.
                let level: Logger.Level = change.reason == .settled ? .debug : .info
                let from = change.from.map { " from \(rooms.ownership.id(of: $0))" } ?? ""
                if let a = table.activity(deviceID: change.device) {
                    log.log(level: level, "device \(device): now in \(name) (\(change.reason))\(from)")
                    publisher.tookOver(&mqtt, a, announced: rooms.publishers.publisher(of: change.device) != nil)
                } else if let d = namedApple(change.device) {
                    log.log(level: level, "\(publisher.appleName(d) ?? device): now in \(name) (\(change.reason))\(from)")
                    publisher.tookOver(&mqtt, d)
                }
            } else if change.from == me, let to = change.to {
                publisher.stoppedOwning(change.device)
                log.info("device \(device): moved to \(rooms.ownership.id(of: to)) (\(change.reason))")
            } else if change.reason == .forgotten {
                // The rooms id of a named Apple device (`ffff‖id`), unless an activity holds that id.
                let named = change.device >> 32 == 0xFFFF && table.activity(deviceID: change.device) == nil
                    ? UInt32(truncatingIfNeeded: change.device) : nil
                if change.from == me {
                    if table.activity(deviceID: change.device)?.state == .current {
                        publisher.clearActivity(&mqtt, change.device, forOthers: false)
                    } else if let named, apple.namedDevice(id: named) != nil {
                        publisher.clearApple(&mqtt, named, forOthers: false)
                    }
                } else if change.from.map({ !rooms.ownership.isOnline($0) }) ?? true, rooms.ownership.firstOnline == me {
                    if let named {
                        log.info("device \(device): nobody hears it and its gateway is offline; clearing its Apple entry")
                        publisher.clearApple(&mqtt, named, forOthers: true)
                    } else {
                        log.info("device \(device): nobody hears it and its gateway is offline; clearing its activity")
                        publisher.clearActivity(&mqtt, change.device, forOthers: true)
                    }
                }
            }
        }
        rooms.changes.removeAll(keepingCapacity: true)
    }

    /// Disagreements about devices this gateway owns (docs/rooms.md §7 rule 3): another
    /// gateway's claim is settled by rank, the same way at both; anything else is published over.
    mutating func correct(now: Instant, mqtt: inout MQTTClient) {
        for (device, claimant) in publisher.correct(&mqtt, table: table, ownership: rooms.ownership, now: now) {
            let gaveWay = rooms.ownership.yield(device, to: Substring(claimant), now: now) { rooms.changes.append($0) }
            if !gaveWay { publisher.republish(&mqtt, device, table: table) }
        }
        handleOwnershipChanges(now: now, mqtt: &mqtt)
    }

    /// The rejoin window closed: what this gateway still stands in for is its to publish
    /// (docs/rooms.md §7); a room that came back in the window has taken its devices back.
    mutating func republishStandIns(mqtt: inout MQTTClient) {
        rooms.standInsDue = nil
        table.forEach { a in
            guard rooms.ownership.owns(a.deviceID), rooms.ownership.standsIn(for: a.deviceID) else { return }
            publisher.tookOver(&mqtt, a, announced: rooms.publishers.publisher(of: a.deviceID) != nil)
        }
        apple.forEach { d in
            let id = AppleDevice.roomsID(d.id)
            guard d.identity != nil, rooms.ownership.owns(id), rooms.ownership.standsIn(for: id) else { return }
            publisher.tookOver(&mqtt, d)
        }
        // Held back after the broker gave this gateway up: published just now (docs/rooms.md §7 rule 4).
        rooms.ownership.endHoldBack()
    }

    /// The named Apple device that rooms know as `roomsID`, if this gateway holds it.
    func namedApple(_ roomsID: UInt64) -> AppleDevice? {
        guard roomsID >> 32 == 0xFFFF else { return nil }
        return apple.namedDevice(id: UInt32(truncatingIfNeeded: roomsID))
    }

    /// This gateway's sightings that are due (docs/rooms.md §2).
    mutating func sendSightings(now: Instant, mqtt: inout MQTTClient) {
        rooms.nextSightingCheck = now + rooms.sightingCheckInterval
        // What is due goes out as one message, not one per device (docs/rooms.md §8.1); or, for
        // a building of older gateways, as one JSON message per device (§2).
        if sightingBatches, rooms.neighbourhood != nil {
            // Newcomers go building-wide too, after the tick's batch (docs/rooms.md §8.3).
            rooms.batcher.collect(&rooms.sightings, table: table, apple: apple, now: now, outOfReach: { device, rssi in
                rooms.ownership.outOfReach(device, rssi: rssi, now: now)
            }, newcomer: { due in
                guard rooms.building.count < rooms.buildingCapacity else { return rooms.buildingDropped &+= 1 }
                rooms.building.append(due)
            }) { batch in
                publisher.publishBatch(&mqtt, batch)
            }
            sendBuildingBatch(now: now, mqtt: &mqtt)
        } else if sightingBatches {
            rooms.batcher.collect(&rooms.sightings, table: table, apple: apple, now: now, outOfReach: { device, rssi in
                rooms.ownership.outOfReach(device, rssi: rssi, now: now)
            }) { batch in
                publisher.publishBatch(&mqtt, batch)
            }
        } else {
            rooms.batcher.collectEach(&rooms.sightings, table: table, apple: apple, now: now, outOfReach: { device, rssi in
                rooms.ownership.outOfReach(device, rssi: rssi, now: now)
            }) { device, sighting in
                publisher.publishSighting(&mqtt, device: device, sighting)
            }
        }
    }

    /// Neighbours that shared nothing for a while are unsubscribed; the answers owed and this
    /// tick's newcomers go out as one building-wide batch (docs/rooms.md §8.3).
    mutating func sendBuildingBatch(now: Instant, mqtt: inout MQTTClient) {
        rooms.neighbourhood?.expire(now: now) { g in
            Self.neighbour(g, subscribe: false, ownership: rooms.ownership, subscriptions: publisher.subscriptions,
                           mqtt: &mqtt, log: log)
        }
        // Our current sighting of each device owed: heard, or `rssi: null` from its owner that
        // no longer hears it (the newcomer then knows the owner is no candidate).
        rooms.neighbourhood?.takeAnswers { d in
            guard rooms.building.count < rooms.buildingCapacity else { return rooms.buildingDropped &+= 1 }
            if let s = rooms.sightings.lastSent(d), s.rssi != nil {
                rooms.building.append(s)
            } else if rooms.ownership.owns(d) {
                rooms.building.append(DueSighting(device: d, rssi: nil))
            }
        }
        guard !rooms.building.isEmpty else { return }
        rooms.batcher.collect(records: rooms.building) { batch in publisher.publishBatch(&mqtt, batch, buildingWide: true) }
        rooms.building.removeAll(keepingCapacity: true)
    }

    /// Whether this gateway publishes an Apple entry: a named device only in the room that
    /// owns it (docs/security.md §10), any other where it is heard (docs/table.md).
    static func owns(_ d: AppleDevice, _ ownership: borrowing RoomOwnership) -> Bool {
        d.identity == nil || ownership.owns(AppleDevice.roomsID(d.id))
    }
}
