// When this gateway publishes its own sightings (docs/rooms.md §2 "When a sighting is sent"):
// on first hearing a device, when its smoothed RSSI moved by `sightingStep` dB (at most every
// `sightingMinInterval`), as a heartbeat every `sightingInterval`, and once `rssi: null`
// when it has not been heard for `lostAfter` (or left the table).
//
// The schedule walks the activity table through its public API (`forEach`: smoothed `rssi`,
// `lastSeen`) and keeps, per device, what it last sent and when, in fixed storage allocated at
// init (an entry array, a free stack and the table's open-addressing index). `due` allocates
// nothing.
import BatonLibc
import BatonWire

public struct DueSighting: Sendable, Equatable {
    public var device: UInt64
    /// nil: no longer heard.
    public var rssi: Int8?
    public init(device: UInt64, rssi: Int8?) { self.device = device; self.rssi = rssi }
}

/// What a sighting is about: an activity table entry, or a device the user named by its IRK
/// (docs/rooms.md §2, docs/security.md §10). `rssi` is smoothed; 127 means none measured.
public struct SightedDevice: Sendable, Equatable {
    public var deviceID: UInt64
    public var rssi: Int8
    public var lastSeen: Instant
    /// How often it advertises as this room hears it, in ms; 0: unknown (`SilenceFade`).
    public var interval: UInt16
    public init(deviceID: UInt64, rssi: Int8, lastSeen: Instant, interval: UInt16 = 0) {
        self.deviceID = deviceID; self.rssi = rssi; self.lastSeen = lastSeen; self.interval = interval
    }
    public init(_ a: TrackedActivity) {
        self.init(deviceID: a.deviceID, rssi: a.rssi, lastSeen: a.lastSeen, interval: a.interval)
    }
}

/// What the schedule walks: the activity table, and the named Apple devices.
public protocol SightingSource: ~Copyable {
    /// Calls `body` for each device that may be sighted, in a stable order.
    func forEachSighted(_ body: (SightedDevice) -> Void)
}

/// No devices: for a schedule over the activity table alone.
public struct NoSightings: SightingSource {
    public init() {}
    public func forEachSighted(_ body: (SightedDevice) -> Void) {}
}

/// A closure as a source (`due(now:each:)`).
struct ClosureSightings: SightingSource {
    let each: ((SightedDevice) -> Void) -> Void
    func forEachSighted(_ body: (SightedDevice) -> Void) { each(body) }
}

extension ActivityTable: SightingSource {
    public func forEachSighted(_ body: (SightedDevice) -> Void) { forEach { body(SightedDevice($0)) } }
}

extension AppleDeviceTable: SightingSource {
    /// The named devices only, under their rooms id (docs/security.md §10).
    public func forEachSighted(_ body: (SightedDevice) -> Void) {
        forEach { d in
            guard d.identity != nil else { return }
            body(SightedDevice(deviceID: AppleDevice.roomsID(d.id), rssi: d.rssi, lastSeen: d.lastSeen,
                               interval: d.interval))
        }
    }
}

public struct SightingSchedule: ~Copyable {
    public let config: RoomsConfig

    // Internal, not private: see ActivityTable.Entry (a Swift 6.3.1 IRGen failure).
    struct Sent {
        var inUse = false
        var device: UInt64 = 0
        /// The RSSI last sent; nil: the last sighting sent said `rssi: null`.
        var rssi: Int8?
        var at: Instant?
        /// The `due` pass that last found the device in the table.
        var pass: UInt64 = 0
        /// When `due` last called the device a newcomer (docs/rooms.md §8.3).
        var announced: Instant?
        /// The last sighting sent was the `rssi: null` of a device heard but out of reach
        /// (docs/rooms.md §8.4): it is sent again once back within reach.
        var withdrawn = false
        var withdrawnAt: Instant?
        /// While withdrawn: the RSSI heard at the last look at reach (`at` is when).
        var lookedAt: Int8 = 0
    }

    private var entries: [Sent]
    private var free: [Int32]
    private var index: SlotIndex
    /// Devices a walk found in the sources but not here, taken in after it (reserved at init
    /// for every device at once: after a reset, everything heard is new).
    private var found: [SightedDevice]
    /// When `due` last walked the sources.
    private var lastWalk: Instant?
    /// How long a lost device's entry is kept after its `rssi: null`.
    private var forgetLost: Duration { max(.seconds(1), config.sightingInterval) }
    /// Counts `due` calls. Proof it never wraps: 2⁶⁴ calls at one per microsecond take
    /// 584,000 years.
    private var pass: UInt64 = 0

    /// Fixed capacity, allocated once: the activity table's.
    public init(config: RoomsConfig, capacity: Int) {
        precondition(capacity >= 1 && capacity <= TableLimits.maxCapacity,
                     "sighting schedule capacity \(capacity) outside 1...\(TableLimits.maxCapacity)")
        self.config = config
        entries = Array(repeating: Sent(), count: capacity)
        free = []
        free.reserveCapacity(capacity)
        for i in stride(from: capacity - 1, through: 0, by: -1) { free.append(Int32(i)) }
        index = SlotIndex(maxKeys: capacity)
        found = []
        found.reserveCapacity(capacity)
    }

    public var capacity: Int { entries.count }
    /// Devices whose last sighting sent is remembered.
    public var count: Int { entries.count - free.count }

    /// Walks the table and calls `body` for every sighting due at `now`, then remembers it as
    /// sent. Allocates nothing. Devices that left the table get their `rssi: null` too.
    ///
    /// A device whose reports carry no RSSI (127, "not available") is sighted at the floor,
    /// −127 (see `rssi(_:)`). The smoothed RSSI is clamped to −127…+20 (`Sighting.rssiRange`),
    /// the range a sighting may carry.
    public mutating func due(table: borrowing ActivityTable, now: Instant, _ body: (DueSighting) -> Void) {
        due(table, NoSightings(), now: now, body)
    }

    /// `due` over the activity table and the named Apple devices: the gateway's call. Concrete,
    /// so the generic walk is specialized here; called across modules unspecialized, it
    /// allocated its locals' boxes on every call (GatewayBench counted them).
    public mutating func due(table: borrowing ActivityTable, apple: borrowing AppleDeviceTable, now: Instant,
                             _ body: (DueSighting) -> Void) {
        due(table, apple, now: now, body)
    }

    /// `due` over both tables, withdrawing what is out of reach (docs/rooms.md §8.4):
    /// `outOfReach(device, rssi)` is true when a sighting at `rssi` cannot matter to the rule
    /// now. Such a device gets one `rssi: null` and then nothing, until it is heard
    /// `sightingStep` dB better than the level it was withdrawn below.
    public mutating func due(table: borrowing ActivityTable, apple: borrowing AppleDeviceTable, now: Instant,
                             outOfReach: (UInt64, Int) -> Bool, _ body: (DueSighting) -> Void) {
        dueMarkingNewcomers(table, apple, now: now, outOfReach: outOfReach) { due, _ in body(due) }
    }

    /// `due` over two sources: the activity table's devices, and the named Apple devices
    /// (docs/security.md §10). Walked as one, in that order.
    public mutating func due<A: SightingSource & ~Copyable, B: SightingSource & ~Copyable>(
        _ a: borrowing A, _ b: borrowing B, now: Instant, _ body: (DueSighting) -> Void
    ) {
        dueMarkingNewcomers(a, b, now: now) { due, _ in body(due) }
    }

    /// `due` over the activity table and the named Apple devices, telling `body` which sightings
    /// are a *newcomer*'s (docs/rooms.md §8.3): the first sighting of a device this gateway
    /// starts hearing (taken in for the first time, or heard again after its `rssi: null`), at
    /// most once per device per `sightingInterval`. The gateway also sends those building-wide.
    public mutating func dueMarkingNewcomers(table: borrowing ActivityTable, apple: borrowing AppleDeviceTable,
                                             now: Instant, outOfReach: (UInt64, Int) -> Bool = { _, _ in false },
                                             _ body: (DueSighting, _ newcomer: Bool) -> Void) {
        dueMarkingNewcomers(table, apple, now: now, outOfReach: outOfReach, body)
    }

    /// `dueMarkingNewcomers` over whatever `each` hands out, for tests; as `due(now:each:)`.
    public mutating func dueMarkingNewcomers(now: Instant, each: ((SightedDevice) -> Void) -> Void,
                                             outOfReach: (UInt64, Int) -> Bool = { _, _ in false },
                                             _ body: (DueSighting, _ newcomer: Bool) -> Void) {
        withoutActuallyEscaping(each) { each in
            dueMarkingNewcomers(ClosureSightings(each: each), NoSightings(), now: now, outOfReach: outOfReach, body)
        }
    }

    /// `due` over two sources, each sighting with whether it is a newcomer's.
    public mutating func dueMarkingNewcomers<A: SightingSource & ~Copyable, B: SightingSource & ~Copyable>(
        _ a: borrowing A, _ b: borrowing B, now: Instant, outOfReach: (UInt64, Int) -> Bool = { _, _ in false },
        _ body: (DueSighting, _ newcomer: Bool) -> Void
    ) {
        pass &+= 1
        found.removeAll(keepingCapacity: true)
        var overflow = false
        var kept = 0
        lastWalk = now
        // A device lost (not heard for `lostAfter`) keeps its entry, with its `rssi: null`
        // sent, for `forgetLost` (a newcomer is one at most once per `sightingInterval`); then a
        // walk in the next second frees it, and later walks pass it by without a lookup: at 50
        // rooms most of a table is devices heard a while ago, kept until they expire, and
        // looking each up four times a second showed in the profile. Were one missed (walks
        // late by more than a second), its entry departs below all the same.
        // Spans added once per walk, not per device (Duration's arithmetic is 128-bit).
        let keptFor = config.lostAfter + forgetLost, freedWithin = keptFor + .seconds(1)
        func walkKnown(_ s: SightedDevice) {
            guard now < s.lastSeen + keptFor else {
                if now < s.lastSeen + freedWithin, let e = index.find(s.deviceID).map({ Int($0) }) {
                    if entries[e].rssi != nil { body(DueSighting(device: s.deviceID, rssi: nil), false) }
                    remove(e)
                }
                return
            }
            guard let e = index.find(s.deviceID).map({ Int($0) }) else {
                guard heard(s, now: now) else { return }
                if found.count < found.capacity { found.append(s) } else { overflow = true }
                return
            }
            entries[e].pass = pass
            visit(e, s, now: now, outOfReach, body)
            kept &+= 1  // `visit` never frees an entry
        }
        a.forEachSighted(walkKnown)
        b.forEachSighted(walkKnown)
        // Departed devices first, so their entries are free for the newcomers. When every entry
        // left was found in the sources none departed, and the whole capacity need not be
        // walked (four times a second, over 5,000 entries at 50 rooms).
        if kept < count {
            for e in entries.indices where entries[e].inUse && entries[e].pass != pass {
                if entries[e].rssi != nil { body(DueSighting(device: entries[e].device, rssi: nil), false) }
                remove(e)
            }
        }
        for s in found { takeIn(s) }
        guard overflow else { return }
        a.forEachSighted(takeIn)
        b.forEachSighted(takeIn)

        func takeIn(_ s: SightedDevice) {
            // A device already lost gets no entry: there is nothing to send about it.
            guard heard(s, now: now), index.find(s.deviceID) == nil else { return }
            let rssi = Self.rssi(s, now: now)
            // The sources never hold more devices than this schedule's capacity (sized for
            // both), and every entry left is a device in them; a smaller schedule skips the rest.
            guard let slot = free.popLast() else { return }
            let e = Int(slot)
            // First heard already out of reach of a room this gateway hears about (§8.4): not
            // announced at all. It is a newcomer when it comes within reach.
            if outOfReach(s.deviceID, Int(rssi)) {
                entries[e] = Sent(inUse: true, device: s.deviceID, rssi: nil, at: now, pass: pass, withdrawn: true,
                                  lookedAt: rssi)
                index.insert(s.deviceID, slot: slot)
                return
            }
            entries[e] = Sent(inUse: true, device: s.deviceID, rssi: rssi, at: now, pass: pass, announced: now)
            index.insert(s.deviceID, slot: slot)
            body(DueSighting(device: s.deviceID, rssi: rssi), true)
        }
    }

    /// `due` over whatever `each` hands to its argument, for tests and one-off callers. It may
    /// allocate its closure's context; the gateway's loop uses the two-source form.
    public mutating func due(now: Instant, each: ((SightedDevice) -> Void) -> Void, _ body: (DueSighting) -> Void) {
        withoutActuallyEscaping(each) { each in due(ClosureSightings(each: each), NoSightings(), now: now, body) }
    }

    /// `nextDeadline` over whatever `each` hands out; as `due(now:each:)`.
    public func nextDeadline(each: ((SightedDevice) -> Void) -> Void) -> Instant? {
        withoutActuallyEscaping(each) { each in nextDeadline(ClosureSightings(each: each), NoSightings()) }
    }

    /// What this gateway last sent of `device` (`rssi` nil: `rssi: null`, it does not hear it
    /// now); nil when the schedule does not follow it. O(1), allocates nothing.
    public func lastSent(_ device: UInt64) -> DueSighting? {
        guard let slot = index.find(device) else { return nil }
        return DueSighting(device: device, rssi: entries[Int(slot)].rssi)
    }

    /// True when the last sighting this gateway sent of `device` heard it.
    public func hears(_ device: UInt64) -> Bool { lastSent(device)?.rssi != nil }

    /// Forget what was sent (the broker connection was lost: everything is due again on connect).
    public mutating func reset() {
        for e in entries.indices where entries[e].inUse { remove(e) }
    }

    /// The earliest instant `due` would call `body`; nil when the table is empty and nothing is owed.
    /// An instant in the past means "now". O(table + capacity).
    public func nextDeadline(table: borrowing ActivityTable) -> Instant? {
        nextDeadline(table, NoSightings())
    }

    public func nextDeadline<A: SightingSource & ~Copyable, B: SightingSource & ~Copyable>(
        _ a: borrowing A, _ b: borrowing B
    ) -> Instant? {
        var next: Instant?
        func consider(_ t: Instant) { next = min(next ?? t, t) }
        var matched = 0
        func look(_ d: SightedDevice) {
            let rssi = Self.rssi(d)
            guard let slot = index.find(d.deviceID) else {
                // Not walked while heard: `due` takes it in (and sends it if still heard); one
                // that `due` has found lost (and then freed) is owed nothing.
                if lastWalk.map({ $0 < d.lastSeen + config.lostAfter }) ?? true { consider(d.lastSeen) }
                return
            }
            matched += 1
            let s = entries[Int(slot)]
            // Proof: every entry in use was stamped when created.
            let at = s.at!
            if let sent = s.rssi {
                consider(d.lastSeen + config.lostAfter)  // the `rssi: null`
                consider(at + config.sightingInterval)   // the heartbeat
                if Self.moved(rssi, from: sent, by: config.sightingStep) {
                    consider(at + config.sightingMinInterval)
                } else if d.interval > 0 {
                    // Silent, the level fades (`SilenceFade`) until it has moved by the step.
                    let needed = Int64(Int(rssi) - Int(sent) + config.sightingStep)
                    let faded = SilenceFade.instant(fadedBy: needed, lastSeen: d.lastSeen, interval: d.interval)
                    consider(max(faded, at + config.sightingMinInterval))
                }
            } else if s.withdrawn {
                // Heard, but out of reach when `due` last looked: it looks again (§8.4).
                consider(at + config.sightingMinInterval)
            } else if d.lastSeen + config.lostAfter > at {
                // Heard again since the `rssi: null` (or since `due` last found it lost).
                consider(at)
            }
        }
        a.forEachSighted(look)
        b.forEachSighted(look)
        if matched < count {
            // Something left the table: the next `due` sends its `rssi: null` and frees it.
            for e in entries.indices where entries[e].inUse && entries[e].rssi != nil {
                if let at = entries[e].at { consider(at) }
            }
            if next == nil {
                // Only silent entries left: freeing them sends nothing, but let `due` run once.
                for e in entries.indices where entries[e].inUse { if let at = entries[e].at { consider(at) } }
            }
        }
        return next
    }

    // MARK: - internals

    private mutating func visit(_ e: Int, _ a: SightedDevice, now: Instant, _ outOfReach: (UInt64, Int) -> Bool,
                                _ body: (DueSighting, Bool) -> Void) {
        let s = entries[e]
        guard heard(a, now: now) else {
            // Not heard for lostAfter: one `rssi: null`, then silence until heard again. The
            // stamp moves on either way, so "heard again" means heard after this instant.
            entries[e].at = now
            entries[e].withdrawn = false
            guard s.rssi != nil else { return }
            entries[e].rssi = nil
            body(DueSighting(device: a.deviceID, rssi: nil), false)
            return
        }
        let rssi = Self.rssi(a, now: now)
        let due: Bool
        if let sent = s.rssi, let at = s.at {
            let elapsed = now - at
            due = elapsed >= config.sightingInterval
                || (elapsed >= config.sightingMinInterval && Self.moved(rssi, from: sent, by: config.sightingStep))
        } else if s.withdrawn {
            // Back within reach by a step more than it was withdrawn at: no flapping at the
            // edge of reach (docs/rooms.md §8.4). Asked every `sightingMinInterval`, the
            // soonest a sighting could follow the last one anyway.
            guard let at = s.at, now - at >= config.sightingMinInterval else { return }
            // Between heartbeats, only when heard louder than at the last look: asking the
            // rule about every withdrawn device twice a second was 6 % of a gateway at 50 rooms,
            // and a device walking closer is heard louder within a second. The best room going
            // quiet is seen at the next heartbeat's look.
            if now - at < config.sightingInterval, Int(rssi) < Int(s.lookedAt) + Self.louder { return }
            due = !outOfReach(a.deviceID, Int(rssi) - config.sightingStep)
            if !due {
                entries[e].at = now
                entries[e].lookedAt = rssi
            }
        } else {
            due = true  // heard again after a `rssi: null`
        }
        guard due else { return }
        // A withdrawn device due now was just found within reach.
        if !s.withdrawn, outOfReach(a.deviceID, Int(rssi)) {
            // It cannot matter to the rule now: said once, as a device no longer heard; or, heard
            // again after its `rssi: null` but out of reach, not said at all (and announced when
            // it comes within reach).
            entries[e].at = now
            entries[e].withdrawn = true
            entries[e].lookedAt = rssi
            guard s.rssi != nil else { return entries[e].withdrawnAt = nil }
            entries[e].rssi = nil
            entries[e].withdrawnAt = now
            body(DueSighting(device: a.deviceID, rssi: nil), false)
            return
        }
        entries[e].withdrawn = false
        // Heard again after its `rssi: null`: a newcomer, unless it was one within the interval,
        // or it is back within reach soon enough that the gateways hearing it still count
        // this one a neighbour (§8.4).
        let remembered = s.withdrawn && s.withdrawnAt.map { now - $0 < Self.neighbourMemory(config) } ?? false
        let newcomer = s.rssi == nil && !remembered && (s.announced.map { now - $0 >= config.sightingInterval } ?? true)
        entries[e].rssi = rssi
        entries[e].at = now
        if newcomer { entries[e].announced = now }
        body(DueSighting(device: a.deviceID, rssi: rssi), newcomer)
    }

    /// dB louder than at the last look that has a withdrawn device looked at again before its
    /// heartbeat: less than `sighting-step` (3 dB), so a return is not held up by the wait,
    /// more than the smoothed noise's wobble.
    static let louder = 2

    /// How long after this gateway's last heard sighting of a device the gateways that hear it
    /// surely still count it a neighbour: half of their `Neighbourhood.forgetAfter` (60 s, or
    /// three heartbeats when those are slower), so a return within it needs no announcing.
    static func neighbourMemory(_ config: RoomsConfig) -> Duration {
        max(.seconds(30), config.sightingInterval * 3 / 2)
    }

    /// Heard within `lostAfter` (at exactly lastSeen + lostAfter it is lost).
    private func heard(_ a: SightedDevice, now: Instant) -> Bool { now < a.lastSeen + config.lostAfter }

    /// The smoothed RSSI as a sighting carries it. An entry whose reports carry none (127,
    /// "not available", Core 5.4, Vol 4, Part E, §7.7.65.2) is sighted at the floor, −127:
    /// heard, and beaten by any room that measures an RSSI. The real kernel stack showed why
    /// (docs/vm.md): BlueZ's virtual controllers never report an RSSI, and neither do some
    /// real ones; were such a device not sighted, no gateway would ever own it.
    /// Silent for several of its intervals, the level fades (`SilenceFade`): a room that stops
    /// hearing a device says so at once, in its level, not only after `lostAfter` with a `null`.
    private static func rssi(_ a: SightedDevice, now: Instant) -> Int8 {
        guard a.rssi != 127 else { return Sighting.rssiRange.lowerBound }
        let fade = SilenceFade.dB(silent: now.nanoseconds &- a.lastSeen.nanoseconds, interval: a.interval)
        let level = max(Int(a.rssi) - fade, Int(Sighting.rssiRange.lowerBound))
        return Int8(min(level, Int(Sighting.rssiRange.upperBound)))
    }

    /// The level as last heard, before any fade (`nextDeadline`'s view).
    private static func rssi(_ a: SightedDevice) -> Int8 {
        guard a.rssi != 127 else { return Sighting.rssiRange.lowerBound }
        return min(max(a.rssi, Sighting.rssiRange.lowerBound), Sighting.rssiRange.upperBound)
    }

    private static func moved(_ rssi: Int8, from sent: Int8, by step: Int) -> Bool {
        abs(Int(rssi) - Int(sent)) >= step
    }

    private mutating func remove(_ e: Int) {
        index.remove(entries[e].device)
        entries[e] = Sent()
        free.append(Int32(e))
    }
}
