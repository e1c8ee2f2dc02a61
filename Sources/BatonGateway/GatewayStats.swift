// The stats topic (docs/mqtt.md §1): a snapshot of every part's counters beside the
// gateway's status, every `status.interval` and at once after a radio error. Each part writes
// its own section; this file only puts them in order.
import BatonLibc
import BatonCore
import BatonHCI
import BatonKeys
import BatonMQTT
import BatonProxy
import BatonRelay
import BatonWire

extension Gateway where Radio: ~Copyable {
    mutating func publishStats(now: Instant) {
        var w = JSONWriter(upkeep.statsScratch)
        do throws(WireError) {
            try writeStats(now: now, into: &w)
        } catch {
            return log.error("stats JSON did not fit 8 KiB (our bug): \(error)")
        }
        room.publisher.publishStats(&broker.mqtt, w.written)
    }

    func writeStats(now: Instant, into w: inout JSONWriter) throws(WireError) {
        try w.beginObject()
        try w.key("gateway"); try w.string(config.gatewayID)
        try w.key("room"); try w.string(config.room)
        try w.key("version"); try w.string(BatonVersion.current)
        try w.key("uptime_s"); try w.int((now - upkeep.startedAt).components.seconds)
        try radio.writeStats(now: now, into: &w)
        try w.key("changes_published"); try w.int(Int64(room.publisher.counters.changesPublished))
        try w.key("drops"); try w.beginObject()
        try radio.writeDrops(into: &w)
        if let verifier = room.keys.verifier { for d in verifier.drops.sorted { try w.key(d.reason); try w.int(Int64(d.count)) } }
        try room.table.writeDrops(into: &w)
        try w.endObject()
        if let verifier = room.keys.verifier {
            // docs/security.md §4.4; never the key itself (§6).
            try w.key("security"); try w.beginObject()
            try w.key("group"); try w.string(Hex.text(UInt64(verifier.groupHash), digits: 8))
            try w.key("identities"); try w.int(Int64(verifier.identities))
            try w.key("unkeyed"); try w.string(verifier.policy == .publish ? "publish" : "ignore")
            try w.key("verified"); try w.int(Int64(verifier.verified))
            try w.key("unverified"); try w.int(Int64(verifier.unverified))
            try w.key("resolutions"); try w.int(Int64(verifier.resolutions))
            try w.endObject()
        }
        try room.table.writeStats(into: &w)
        try room.apple.writeStats(into: &w)
        var owned = 0
        room.table.forEach { if room.rooms.ownership.owns($0.deviceID) { owned += 1 } }
        try room.rooms.writeStats(owned: owned, publisher: room.publisher.counters, into: &w)
        try w.key("relay"); try w.beginObject()
        try relays.fetches.writeStats(into: &w)
        try w.key("streams"); try w.beginObject()
        try relays.streams.writeStats(into: &w)
        try w.endObject()
        try relays.readvertising?.writeStats(continuing: relays.continuing, into: &w)
        try w.endObject()
        try room.publisher.writeStats(typesKnown: config.activityTypes.count, messagesReceived: broker.messagesReceived, into: &w)
        if proxy != nil {
            try w.key("esphome")
            try proxy?.writeStats(into: &w)
        }
        if connections != nil {
            try w.key("esphome_connections")
            try connections?.writeStats(into: &w)
        }
        try w.endObject()
    }
}

/// A capacity that is short says so in the log once a minute, naming its knob, with what it
/// refused since the last line (issue 30): a full capacity is a steady state, counted on the
/// stats topic, not a line per beacon.
/// What keeps the gateway itself told and watched: systemd's notifier (readiness and its
/// watchdog), the stats' schedule and their scratch buffer, the read-back of the own retained
/// status, and the minute's capacity warnings.
struct GatewayUpkeep: ~Copyable {
    var notifier: SystemdNotifier
    let startedAt: Instant
    var nextStats: Instant
    /// Reads this gateway's own retained status back (docs/broker.md "A status the broker
    /// did not keep").
    var statusCheck: StatusCheck
    var capacityWarnings: CapacityWarnings
    /// The stats JSON is written here: 8 KiB, allocated once.
    let statsScratch: UnsafeMutableRawBufferPointer

    init(config: GatewayConfig, environment: [String: String], now: Instant) {
        self.notifier = SystemdNotifier(environment: environment)
        self.startedAt = now
        self.nextStats = now + config.statusInterval
        self.statusCheck = StatusCheck(interval: config.statusInterval)
        self.capacityWarnings = CapacityWarnings(now: now)
        self.statsScratch = .allocate(byteCount: 8192, alignment: 8)
    }

    deinit { statsScratch.deallocate() }
}

struct CapacityWarnings {
    static let every: Duration = .seconds(60)
    var next: Instant
    private var tableRefused = 0, tableEvicted = 0, roomsFull = 0, ownersFull = 0

    init(now: Instant) { next = now + Self.every }

    mutating func check(now: Instant, table: borrowing ActivityTable, rooms: borrowing GatewayRooms, log: Logger) {
        next = now + Self.every
        let c = table.counters
        let refused = c.refused - tableRefused, evicted = c.evicted - tableEvicted
        if refused > 0 {
            log.warning("table.capacity \(table.capacity) is full: \(refused) beacons of devices not taken in and \(evicted) entries given up in the last minute (\(table.ownedCount) kept as this room's own, the weakest held at \(table.weakestGivable.map { "\($0) dBm" } ?? "none")); raise table.capacity to hold more (docs/config.md)")
        }
        tableRefused = c.refused
        tableEvicted = c.evicted
        let full = rooms.ownership.counters.devicesFull - roomsFull
        if full > 0 {
            log.warning("rooms.capacity \(rooms.ownership.capacity) is full: \(full) sightings of devices not followed in the last minute; raise rooms.capacity (docs/config.md)")
        }
        roomsFull = rooms.ownership.counters.devicesFull
        let owners = rooms.publishers.full - ownersFull
        if owners > 0 {
            log.warning("rooms.capacity \(rooms.publishers.capacity) cannot remember more devices' owners: \(owners) activity messages not remembered in the last minute; raise rooms.capacity (docs/config.md)")
        }
        ownersFull = rooms.publishers.full
    }
}

extension ActivityTable {
    /// The table's drops beside the radio's (stats `drops`), only when there are any.
    func writeDrops(into w: inout JSONWriter) throws(WireError) {
        if counters.staleSequence > 0 { try w.key("stale-sequence"); try w.int(Int64(counters.staleSequence)) }
        if counters.relayed > 0 { try w.key("beacon-relayed"); try w.int(Int64(counters.relayed)) }
        // A full table's refusals, by reason (docs/table.md "A full table").
        if counters.refusedWeaker > 0 { try w.key("table-full-weaker"); try w.int(Int64(counters.refusedWeaker)) }
        if counters.refusedOwned > 0 { try w.key("table-full-owned"); try w.int(Int64(counters.refusedOwned)) }
        if counters.refusedEnded > 0 { try w.key("table-full-ended"); try w.int(Int64(counters.refusedEnded)) }
    }

    func writeStats(into w: inout JSONWriter) throws(WireError) {
        try w.key("table"); try w.beginObject()
        try w.key("fill"); try w.int(Int64(count))
        try w.key("capacity"); try w.int(Int64(capacity))
        try w.key("evicted"); try w.int(Int64(counters.evicted))
        try w.key("expired"); try w.int(Int64(counters.expired))
        // A full table (docs/table.md): beacons of devices it did not take in, the entries it
        // keeps as this room's own, and the level a newcomer must beat by `admitMargin`.
        try w.key("refused"); try w.int(Int64(counters.refused))
        try w.key("kept_owned"); try w.int(Int64(ownedCount))
        try w.key("weakest_dbm")
        if count == capacity, let weakest = weakestGivable { try w.int(Int64(weakest)) } else { try w.null() }
        try w.endObject()
    }
}

extension AppleDeviceTable {
    func writeStats(into w: inout JSONWriter) throws(WireError) {
        try w.key("apple"); try w.beginObject()
        try w.key("fill"); try w.int(Int64(count))
        try w.key("capacity"); try w.int(Int64(capacity))
        try w.key("evicted"); try w.int(Int64(counters.evicted))
        try w.key("expired"); try w.int(Int64(counters.expired))
        try w.endObject()
    }
}

extension Publisher {
    /// The titles' and the broker connection's sections (docs/mqtt.md §1).
    func writeStats(typesKnown: Int, messagesReceived: Int, into w: inout JSONWriter) throws(WireError) {
        let nc = names.counters
        try w.key("titles"); try w.beginObject()
        try w.key("fetching"); try w.bool(names.fetchTitles)
        try w.key("types_known"); try w.int(Int64(typesKnown))
        try w.key("in_flight"); try w.int(Int64(names.inFlight))
        try w.key("capacity"); try w.int(Int64(names.inFlightCapacity))
        try w.key("owed"); try w.int(Int64(names.owed))
        try w.key("fetches"); try w.int(Int64(nc.fetches))
        try w.key("described"); try w.int(Int64(nc.described))
        try w.key("unreadable"); try w.int(Int64(nc.unreadable))
        try w.key("failed"); try w.int(Int64(nc.failed))
        try w.key("waited"); try w.int(Int64(nc.waited))
        try w.key("carried"); try w.int(Int64(nc.carried))
        try w.endObject()
        try w.key("broker"); try w.beginObject()
        try w.key("connects"); try w.int(Int64(counters.connects))
        try w.key("changes_while_away"); try w.int(Int64(counters.changesWhileAway))
        try w.key("orphans_cleared"); try w.int(Int64(counters.orphansCleared))
        try w.key("orphan_rescans"); try w.int(Int64(counters.orphanRescans))
        try w.key("status_republished"); try w.int(Int64(counters.statusRepublished))
        try w.key("publish_errors"); try w.int(Int64(counters.publishErrors))
        try w.key("messages_received"); try w.int(Int64(messagesReceived))
        try w.endObject()
    }
}
