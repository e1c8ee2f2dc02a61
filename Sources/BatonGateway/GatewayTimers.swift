// The gateway's own timers, named once (docs/architecture.md §2): `timersDeadline` is the
// nearest of their deadlines, `runTimers` fires each that is due, both from the one list.
import BatonLibc
import BatonCore
import BatonHCI
import BatonMQTT
import BatonRelay

/// In the order they fire in a turn: the tables' expiry first, so what expired is neither
/// corrected nor sent as a sighting; the stats last, so they count the turn.
enum GatewayTimer: CaseIterable {
    /// Entries not heard for their expiry leave the activity table (docs/table.md).
    case tableExpiry
    /// The same for the Apple table.
    case appleExpiry
    /// The retained scan after a connect ends (docs/rooms.md §7).
    case retainedScanEnd
    /// Retained entries nobody heard are cleared (docs/mqtt.md §5).
    case orphans
    /// What this gateway stands in for is published after the rejoin window (docs/rooms.md §7).
    case standIns
    /// An owned device's retained activity that says otherwise is put right (docs/rooms.md §7 rule 3).
    case correction
    /// The room rule's dwell, forgetting and heartbeats (`RoomOwnership.nextDeadline`).
    case rooms
    /// The sightings due to the other gateways (docs/rooms.md §2).
    case sightings
    /// The own retained status read back (docs/broker.md "A status the broker did not keep").
    case statusCheck
    /// The minute's capacity warnings (`CapacityWarnings`).
    case capacityWarnings
    /// The stats, every `status.interval` (docs/mqtt.md §1).
    case stats

    /// The retained state's upkeep and the sightings wait while the broker is away: a past
    /// deadline must not spin the loop then.
    var needsBroker: Bool {
        switch self {
        case .tableExpiry, .appleExpiry, .rooms, .capacityWarnings, .stats: false
        case .retainedScanEnd, .orphans, .standIns, .correction, .sightings, .statusCheck: true
        }
    }
}

extension Gateway where Radio: ~Copyable {
    func deadline(of timer: GatewayTimer) -> Instant? {
        switch timer {
        case .tableExpiry: room.table.nextExpiry
        case .appleExpiry: room.apple.nextExpiry
        case .retainedScanEnd: room.publisher.subscriptions.retainedScanEnds
        case .orphans: room.publisher.nextOrphanDeadline
        case .standIns: room.rooms.standInsDue
        case .correction: room.publisher.nextCorrection
        case .rooms: room.rooms.tickDue
        case .sightings: room.rooms.nextSightingCheck
        case .statusCheck: upkeep.statusCheck.deadline
        case .capacityWarnings: upkeep.capacityWarnings.next
        case .stats: upkeep.nextStats
        }
    }

    mutating func fire(_ timer: GatewayTimer, now: Instant) {
        switch timer {
        case .tableExpiry: room.expire(now: now, mqtt: &broker.mqtt)
        case .appleExpiry: room.expireApple(now: now, mqtt: &broker.mqtt)
        case .retainedScanEnd:
            room.publisher.endRetainedScan(&broker.mqtt)
            relays.readvertising?.retainedScanEnded()
        case .orphans: room.clearOrphans(now: now, mqtt: &broker.mqtt)
        case .standIns: room.republishStandIns(mqtt: &broker.mqtt)
        case .correction: room.correct(now: now, mqtt: &broker.mqtt)
        case .rooms: room.roomsTick(now: now, mqtt: &broker.mqtt)
        case .sightings: room.sendSightings(now: now, mqtt: &broker.mqtt)
        case .statusCheck:
            if let step = upkeep.statusCheck.due(now: now) { statusChecked(step) }
        case .capacityWarnings: upkeep.capacityWarnings.check(now: now, table: room.table, rooms: room.rooms, log: log)
        case .stats:
            publishStats(now: now)
            upkeep.nextStats = now + config.statusInterval
        }
    }

    /// The nearest of the gateway's own timers.
    var timersDeadline: Instant? {
        let connected = broker.mqtt.isConnected
        var next: Instant?
        for timer in GatewayTimer.allCases where connected || !timer.needsBroker {
            next = Instant.earliest(next, deadline(of: timer))
        }
        return next
    }

    /// What is due of the timers, each deadline read again as its turn comes: the work of the
    /// ones before may have moved it.
    mutating func runTimers(now: Instant) {
        for timer in GatewayTimer.allCases {
            guard broker.mqtt.isConnected || !timer.needsBroker, let due = deadline(of: timer), due <= now else { continue }
            fire(timer, now: now)
        }
    }
}
