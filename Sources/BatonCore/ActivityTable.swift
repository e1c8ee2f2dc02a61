// The activity table: what this room knows about each device's current activity, keyed by the
// beacon's rotating device id (docs/protocol.md §2.4), and the changes a subscriber must see
// (architecture.md §3a). The rules are written for users in docs/table.md; this file cites it.
//
// Storage is fixed at init (architecture.md §5): `capacity` entries in one allocation,
// an open-addressing index over them, two lists in order of last heard (current,
// invalidated), so expiry and `nextExpiry` are found at a list's head without a scan, and
// the entries this room may give up sorted into buckets by their smoothed RSSI, so a full
// table finds its weakest entry without a scan (docs/table.md "A full table"). `hear` and
// `expire` allocate nothing. Time is injected: `now` is the caller's `ContinuousClock`
// instant, never read here.
import BatonLibc
public import BatonWire


public struct ActivityTableConfig: Sendable, Equatable {
    /// Devices tracked at once; storage for this many is allocated at init and never grows.
    /// The default holds every device a room hears in a 10-room building of 1,000 devices
    /// (docs/config.md "What a capacity costs").
    public var capacity: Int
    /// Silence after which an activity expires (cleared from the broker).
    public var expiry: Duration
    public static let defaultCapacity = 1536
    public init(capacity: Int = ActivityTableConfig.defaultCapacity, expiry: Duration = .seconds(60)) {
        self.capacity = capacity
        self.expiry = expiry
    }
}

/// One device's entry: what the room knows about its current activity.
public struct TrackedActivity: Sendable, Equatable {
    public enum State: Sendable, Equatable { case current, invalidated }
    /// The beacon's 48-bit rotating device id (docs/protocol.md §2.4).
    public var deviceID: UInt64
    /// The latest beacon heard (sequence, flags, type hash, group hash, PSM).
    public var beacon: ActivityBeacon
    public var state: State
    /// The advertiser address and its type of the latest beacon.
    public var address: UInt64
    public var addressType: UInt8
    /// Smoothed RSSI in dBm (docs/table.md "RSSI"): 127 until a report carries one. And the
    /// last raw sample as the controller reported it (127: not available).
    public var rssi: Int8
    public var lastRSSI: Int8
    public var firstSeen: Instant
    public var lastSeen: Instant
    /// When the last change a subscriber sees happened (became current, saved, invalidated).
    public var lastChange: Instant
    /// What that change was, and the smoothed RSSI at that moment: what the published message
    /// said, so a republish after a reconnect repeats it exactly (docs/mqtt.md §5).
    public var lastChangeKind: ActivityChangeKind
    public var rssiAtChange: Int8
    /// Advertisements heard from this device since it entered the table.
    public var reports: UInt32
    /// How often the device advertises as this room hears it, in ms (`SilenceFade`); 0 until a
    /// second report.
    public var interval: UInt16 = 0
}

public enum ActivityChangeKind: Sendable, Equatable {
    /// A device's first beacon, or a beacon with a new activity type: NSUserActivity
    /// `becomeCurrent`.
    case becameCurrent
    /// A newer sequence number for the same activity type: `needsSave` → saved.
    case saved
    /// The invalidated flag: the activity ended (`invalidate`).
    case invalidated
    /// Silent for `expiry`: the entry left the table.
    case expired
    /// Given up by a full table for a newcomer heard `ActivityTable.admitMargin` dB louder
    /// than it (docs/table.md "A full table"); never an entry this room owns.
    case evicted
}

public struct ActivityChange: Sendable, Equatable {
    public var kind: ActivityChangeKind
    /// The entry after the change; for expired/evicted, its last state.
    public var activity: TrackedActivity
}

public struct ActivityTableCounters: Sendable, Equatable {
    public var beaconsHeard = 0
    public var becameCurrent = 0
    public var saved = 0
    public var invalidated = 0
    public var expired = 0
    public var evicted = 0
    /// Beacons with an older sequence than the entry holds (RFC 1982): ignored.
    public var staleSequence = 0
    /// Relayed copies (flag bit 3): another gateway re-advertising an activity current in
    /// another room. They say nothing about who is in this room: ignored (docs/table.md).
    public var relayed = 0
    /// Beacons of devices a full table did not take in (docs/table.md "A full table"), by
    /// reason: not `admitMargin` louder than the weakest entry it may give up; every entry is
    /// one this room owns; an already invalidated newcomer with no invalidated entry to replace.
    public var refusedWeaker = 0
    public var refusedOwned = 0
    public var refusedEnded = 0
    public var refused: Int { refusedWeaker + refusedOwned + refusedEnded }
    public init() {}
}

public struct ActivityTable: ~Copyable {
    public let config: ActivityTableConfig
    public private(set) var counters = ActivityTableCounters()

    // Internal, not private: Swift 6.3.1 fails in IRGen ("Global is external, but doesn't have
    // external or weak linkage") compiling a module that `@testable import`s this one when a
    // private type is the element of a ~Copyable generic stored property.
    struct Entry {
        var activity: TrackedActivity
        var smoothed: SmoothedRSSI
    }

    /// The two lists of `entries`, each in order of last heard. Invalidated entries have their
    /// own list so the eviction rule finds the least recently heard of them at its head.
    private static let currentList = 0
    private static let invalidatedList = 1

    private var entries: SlotPool<Entry>
    private var index: SlotIndex
    /// The entries a full table may give up, by strength; the ones this room owns are not in it.
    private var strength: StrengthBuckets
    private var clock = MonotonicClamp()

    /// How much louder than the weakest entry a full table may give up a newcomer's first
    /// report must be to take its place (docs/table.md "A full table"). The newcomer's level
    /// is one report, the entry's a smoothed average: 6 dB is two standard deviations of a
    /// report's noise (3 dB, docs/simulator.md) and `rooms.margin`'s halving of the distance,
    /// so devices at the edge of what a room holds do not push each other out in turn, while
    /// a person walking into the room (20–30 dB above the edge) is taken in at once.
    public static let admitMargin = 6

    /// Allocates storage for `config.capacity` entries, once. A capacity outside
    /// 1...`TableLimits.maxCapacity` is the caller's bug (a precondition): the config loader
    /// must refuse it with a message first (docs/table.md "Capacities").
    public init(config: ActivityTableConfig) {
        self.config = config
        entries = SlotPool(capacity: config.capacity)
        index = SlotIndex(maxKeys: config.capacity)
        strength = StrengthBuckets(capacity: config.capacity)
    }

    public var count: Int { entries.count }
    public var capacity: Int { entries.capacity }
    /// Entries this room owns, which a full table never gives up.
    public var ownedCount: Int { strength.protectedCount }
    /// The smoothed RSSI of the weakest current entry a full table would give up (nil: none):
    /// the level a newcomer must beat by `admitMargin` (stats `table.weakest_dbm`).
    public var weakestGivable: Int8? {
        guard let slot = strength.weakest(from: 1) else { return nil }
        return Self.level(entries[slot].activity.rssi)
    }

    /// This room owns the device (docs/rooms.md §3), or no longer does: an owned entry is
    /// never given up for a newcomer (docs/table.md "A full table"). Change-rate; allocates
    /// nothing. A device not in the table is ignored.
    public mutating func setOwned(_ deviceID: UInt64, _ owned: Bool) {
        guard let slot = index.find(deviceID & 0xFFFF_FFFF_FFFF) else { return }
        if owned { strength.protect(slot) } else if strength.isProtected(slot) { strength.place(slot, bucket(slot)) }
    }

    /// The strength bucket of an entry: invalidated ones lowest (they have no retained topic to
    /// lose), then current ones by whole dBm; an RSSI "not available" (127) at the floor.
    private func bucket(_ slot: Int32) -> Int {
        let a = entries[slot].activity
        return a.state == .invalidated ? 0 : 1 + Int(Self.level(a.rssi)) + 127
    }

    /// A smoothed or raw RSSI as a level to compare: 127 ("not available", Core 5.4, Vol 4,
    /// Part E, §7.7.65.2) is the floor, −127, as a sighting says it (docs/rooms.md §2).
    static func level(_ rssi: Int8) -> Int8 {
        rssi == 127 ? -127 : min(max(rssi, -127), 20)
    }

    /// Takes one beacon heard at `now`. Calls `onChange` for each change it makes (none for
    /// an identical repeat, the common case; an eviction and then `becameCurrent` for a new
    /// device in a full table that takes it). Allocates nothing. `onChange` records; it must
    /// not re-enter. `owned` says whether this room owns a device (docs/rooms.md): asked only
    /// of an entry a full table is about to give up, which it then keeps.
    public mutating func hear(_ beacon: ActivityBeacon, rssi: Int8, address: UInt64, addressType: UInt8,
                              now: Instant, owned: (UInt64) -> Bool = { _ in false },
                              _ onChange: (ActivityChange) -> Void) {
        counters.beaconsHeard &+= 1
        guard !beacon.flags.contains(.relayed) else { return ignoreRelayed() }
        let now = clock.clamp(now)
        // ActivityBeacon's init keeps 48 bits; a caller that set the field directly may not have.
        var beacon = beacon
        beacon.deviceID &= 0xFFFF_FFFF_FFFF
        guard let slot = index.find(beacon.deviceID) else {
            return insert(beacon, rssi: rssi, address: address, addressType: addressType, now: now, owned: owned, onChange)
        }
        let order = SerialOrder(beacon.sequence, comparedTo: entries[slot].activity.beacon.sequence)
        // A replayed or reordered old beacon changes nothing, not even lastSeen: a device that
        // restarted its sequence is silent to the table until its entry expires, then starts
        // afresh (docs/table.md "Sequence numbers").
        guard order != .older else { counters.staleSequence &+= 1; return }

        entries[slot].smoothed.add(rssi, after: now.nanoseconds &- entries[slot].activity.lastSeen.nanoseconds)
        entries[slot].activity.lastSeen = now
        entries[slot].activity.address = address
        entries[slot].activity.addressType = addressType
        entries[slot].activity.lastRSSI = rssi
        entries[slot].activity.rssi = entries[slot].smoothed.dBm
        entries[slot].activity.interval = entries[slot].smoothed.interval
        // Proof: at one beacon a millisecond, 2³² reports take 49 days; saturate rather than wrap.
        if entries[slot].activity.reports < .max { entries[slot].activity.reports &+= 1 }
        let old = entries[slot].activity
        entries.moveToTail(slot, list: Self.list(old.state))
        defer { strength.move(slot, bucket(slot)) }

        let ends = beacon.flags.contains(.invalidated)
        let kind: ActivityChangeKind?
        switch (old.state, order) {
        case (.invalidated, .same):
            // Invalidation is final for its sequence: a same-sequence beacon without the flag
            // is a copy sent before it. Only a newer sequence makes the device current again.
            kind = nil
        case (.invalidated, _):
            entries[slot].activity.beacon = beacon
            kind = ends ? nil : .becameCurrent
        case (.current, _) where ends:
            entries[slot].activity.beacon = beacon
            kind = .invalidated
        case (.current, .same):
            // Fields a subscriber sees changing without a new sequence (a device that flips
            // "supports streams" in place) still reach the broker. Group hash, PSM, tag and the
            // relayed bit are kept silently, so a relayed copy does not flap the topic.
            entries[slot].activity.beacon = beacon
            kind = beacon.activityTypeHash != old.beacon.activityTypeHash ? .becameCurrent
                : beacon.flags.intersection(Self.visibleFlags) != old.beacon.flags.intersection(Self.visibleFlags) ? .saved
                : nil
        case (.current, _):
            entries[slot].activity.beacon = beacon
            kind = beacon.activityTypeHash != old.beacon.activityTypeHash ? .becameCurrent : .saved
        }
        guard let kind else { return }
        switch kind {
        case .becameCurrent:
            counters.becameCurrent &+= 1
            entries[slot].activity.state = .current
        case .saved:
            counters.saved &+= 1
        case .invalidated:
            counters.invalidated &+= 1
            entries[slot].activity.state = .invalidated
        case .expired, .evicted:
            preconditionFailure("hear never expires or evicts a known device")
        }
        entries[slot].activity.lastChange = now
        entries[slot].activity.lastChangeKind = kind
        entries[slot].activity.rssiAtChange = entries[slot].activity.rssi
        let changed = entries[slot].activity
        entries.moveToTail(slot, list: Self.list(changed.state))
        onChange(ActivityChange(kind: kind, activity: changed))
    }

    /// Counts a relayed copy, ignored: the device it describes is in another room, and taking
    /// it would make this room's gateway sight it here (docs/rooms.md) and keep it alive.
    public mutating func ignoreRelayed() {
        counters.relayed &+= 1
    }

    /// Flags a subscriber sees on the activity topic (docs/mqtt.md §2).
    private static let visibleFlags: BeaconFlags = [.supportsStreams, .hasWebURL]

    private static func list(_ state: TrackedActivity.State) -> Int {
        state == .current ? currentList : invalidatedList
    }

    private mutating func insert(_ beacon: ActivityBeacon, rssi: Int8, address: UInt64, addressType: UInt8,
                                 now: Instant, owned: (UInt64) -> Bool, _ onChange: (ActivityChange) -> Void) {
        let ends = beacon.flags.contains(.invalidated)
        if entries.isFull {
            guard let victim = victim(for: rssi, ends: ends, owned: owned) else { return }
            let last = remove(victim)
            counters.evicted &+= 1
            onChange(ActivityChange(kind: .evicted, activity: last))
        }
        var smoothed = SmoothedRSSI()
        smoothed.add(rssi)
        let activity = TrackedActivity(deviceID: beacon.deviceID, beacon: beacon, state: ends ? .invalidated : .current,
                                       address: address, addressType: addressType, rssi: smoothed.dBm, lastRSSI: rssi,
                                       firstSeen: now, lastSeen: now, lastChange: now,
                                       lastChangeKind: ends ? .invalidated : .becameCurrent, rssiAtChange: smoothed.dBm,
                                       reports: 1)
        let slot = entries.append(Entry(activity: activity, smoothed: smoothed), to: Self.list(activity.state))
        index.insert(beacon.deviceID, slot: slot)
        strength.place(slot, bucket(slot))
        // An invalidated first beacon has nothing to clear and nothing to show: kept (so an older
        // replay cannot make it current) but not announced.
        guard !ends else { return }
        counters.becameCurrent &+= 1
        onChange(ActivityChange(kind: .becameCurrent, activity: activity))
    }

    /// docs/table.md "A full table", in the order the rules apply: an invalidated entry this
    /// room does not own goes first (it has no retained topic to lose); an already invalidated
    /// newcomer takes nothing else; otherwise the weakest entry this room does not own, if the
    /// newcomer's report is `admitMargin` dB louder. An entry found to be owned on the way is
    /// kept from then on. nil: the newcomer is not taken in, and counted by reason. A full
    /// table is a steady state (architecture.md §5): it holds what this room owns, then
    /// the strongest it hears, and a newcomer weaker than those changes nothing.
    private mutating func victim(for rssi: Int8, ends: Bool, owned: (UInt64) -> Bool) -> Int32? {
        while true {
            guard let slot = strength.takeWeakest() else {
                if ends { counters.refusedEnded &+= 1 } else { counters.refusedOwned &+= 1 }
                return nil
            }
            let invalidated = entries[slot].activity.state == .invalidated
            if !invalidated {
                if ends { counters.refusedEnded &+= 1; return nil }
                // Int: level + margin can pass Int8's range.
                guard Int(Self.level(rssi)) >= Int(Self.level(entries[slot].activity.rssi)) + Self.admitMargin else {
                    counters.refusedWeaker &+= 1
                    return nil
                }
            }
            // Checked last, as it asks the rule: the weakest entry is rarely one this room owns.
            guard owned(entries[slot].activity.deviceID) else { return slot }
            strength.protect(slot)
        }
    }

    private mutating func remove(_ slot: Int32) -> TrackedActivity {
        strength.remove(slot)
        let last = entries.remove(slot).activity
        index.remove(last.deviceID)
        return last
    }

    /// The least recently heard entry of both lists.
    private var oldest: Int32? {
        guard let c = entries.head(Self.currentList) else { return entries.head(Self.invalidatedList) }
        guard let i = entries.head(Self.invalidatedList) else { return c }
        return entries[i].activity.lastSeen < entries[c].activity.lastSeen ? i : c
    }

    /// Removes entries silent for `expiry`, calling `onChange` with `.expired` for each.
    /// An entry heard at `t` expires at exactly `t + expiry` (docs/table.md "Expiry").
    public mutating func expire(now: Instant, _ onChange: (ActivityChange) -> Void) {
        while let slot = oldest, entries[slot].activity.lastSeen + config.expiry <= now {
            let last = remove(slot)
            counters.expired &+= 1
            onChange(ActivityChange(kind: .expired, activity: last))
        }
    }

    /// The earliest instant at which `expire` has something to do; nil when empty. Exact and
    /// O(1): the oldest entry is at the head of one of the two lists.
    public var nextExpiry: Instant? {
        guard let slot = oldest else { return nil }
        return entries[slot].activity.lastSeen + config.expiry
    }

    public func activity(deviceID: UInt64) -> TrackedActivity? {
        guard let slot = index.find(deviceID & 0xFFFF_FFFF_FFFF) else { return nil }
        return entries[slot].activity
    }

    /// Every entry, in no particular order (republish after a reconnect).
    public func forEach(_ body: (TrackedActivity) -> Void) {
        entries.forEach(list: Self.currentList) { body($0.activity) }
        entries.forEach(list: Self.invalidatedList) { body($0.activity) }
    }
}

// MARK: - Shared by both tables

/// An exponentially weighted moving average of RSSI (docs/table.md "RSSI"), integer only:
/// 1/16 dBm fixed point, each new sample weighing 1/4, or 1/2 for a device heard at most every
/// `sparseInterval`. Room ownership compares these averages between gateways; a single faded or
/// reflected report moves the average by a quarter of its error, and a step change (a person
/// walking into the room) is 90 % followed after 8 reports (4 at the half weight).
struct SmoothedRSSI {
    /// The interval (ms, as `SilenceFade.track` measures it) from which a report weighs 1/2.
    /// An average forgets at a time constant of interval / ln(1 / (1 − weight)): 0.35 s for a
    /// phone heard every 100 ms at 1/4, but 3.5 s at 1 s and 17 s at 5 s, which held a sparse
    /// advertiser's walk for tens of seconds. At 1/2 it is 1.0 s from 0.7 s on (1.4 s at 1 s,
    /// 7.2 s at 5 s): a longer memory in time than a fast phone's still.
    /// 0.7 s lies between the advertising intervals Apple's accessory guidelines list (546.25
    /// and 760 ms), so a device does not sit on the edge.
    static let sparseInterval: UInt16 = 700
    /// Core 5.4, Vol 4, Part E, §7.7.65.2: RSSI 127 is "not available"; it never enters the average.
    static let notAvailable: Int8 = 127
    /// The average in 1/16 dBm; `Int16.min` until the first sample.
    private var q4 = Int16.min
    /// The advertising interval as heard here, in ms (`SilenceFade.track`); 0 until a second report.
    private(set) var interval: UInt16 = 0

    init() {}

    /// The first report's sample.
    mutating func add(_ sample: Int8) { add(sample, after: nil) }

    /// A report `gap` ns after the one before (nil: the first): the gap also measures how often
    /// the device advertises (`SilenceFade.track`), which the sighting schedule fades by.
    mutating func add(_ sample: Int8, after gap: Int64?) {
        if let gap {
            // The average itself is not faded: the published `rssi` must not depend on when the
            // loop read a report (a replayed capture publishes the same bytes every run).
            interval = SilenceFade.track(interval, gap: gap)
        }
        guard sample != Self.notAvailable else { return }
        let x = Int16(sample) << 4
        guard q4 != .min else { q4 = x; return }
        // Proof: x and q4 lie in −2048…2016, so x − q4 + 2 is within ±4066, and a quarter or a
        // half of it added to q4 stays between q4 and x (rounded): −2048…2016, nothing here can
        // overflow Int16. `+ 2 >> 2` and `+ 1 >> 1` round to nearest, so the average settles
        // within 2/16 dBm of a steady signal and reads back exactly.
        if interval >= Self.sparseInterval {
            q4 = q4 &+ ((x &- q4 &+ 1) >> 1)
        } else {
            q4 = q4 &+ ((x &- q4 &+ 2) >> 2)
        }
    }

    /// Rounded to the nearest dBm; 127 (not available) before the first sample.
    var dBm: Int8 {
        // Proof: q4 in −2048…2016 gives (q4 + 8) >> 4 in −128…126.
        q4 == .min ? Self.notAvailable : Int8(truncatingIfNeeded: (q4 &+ 8) >> 4)
    }
}

/// Silence is evidence (docs/table.md "RSSI", docs/rooms.md §3 "The evidence"): a device that
/// advertises every `interval` and is not heard for several intervals is, most likely, weaker
/// here than the reports heard before said: each missed report is one the room's radio did not
/// pick out of the noise. So after `graceIntervals` missed intervals the level fades by one dB
/// per further interval missed. Adapted to the device: a phone advertising ten times a second
/// fades 10 dB a second once 0.4 s silent, a sensor every 5 s fades 1 dB per 5 s after 20 s.
/// Four intervals, because four reports in a row are lost by chance rarely: at the simulator's
/// 5 % loss one time in 160,000, at 30 % (a far room, a busy channel) one time in 120.
public enum SilenceFade {
    /// Missed intervals before the level fades.
    public static let graceIntervals: Int64 = 4
    /// The shortest interval the fade assumes, in ms: a controller may report one advertising
    /// event once per channel, milliseconds apart, which is not the device's rate.
    public static let shortest: UInt16 = 100
    /// dB to take off a level last heard `silent` ns ago, for a device heard every `interval`
    /// ms (0: unknown, no fade). Allocates nothing.
    public static func dB(silent: Int64, interval: UInt16) -> Int {
        guard interval > 0, silent > 0 else { return 0 }
        let step = Int64(max(interval, shortest)) * 1_000_000
        let missed = silent / step - graceIntervals
        return missed > 0 ? Int(min(missed, 255)) : 0
    }

    /// The instant a level last heard at `lastSeen` has faded by `dB` (at least 1), for a device
    /// heard every `interval` ms (more than 0): the inverse of `dB(silent:interval:)`.
    public static func instant(fadedBy dB: Int64, lastSeen: Instant, interval: UInt16) -> Instant {
        let step = Int64(max(interval, shortest)) * 1_000_000
        return lastSeen.after((graceIntervals + max(1, dB)) * step)
    }

    /// The interval estimate after a report `gap` ns after the last: the shortest gap heard
    /// (a room that misses reports sees multiples of the interval, never less), creeping up by a
    /// 64th of the difference when the gaps grow: a device that slowed down (a phone's screen
    /// went off) is followed within tens of reports, while a room that only lost most of them
    /// keeps fading for as long. In ms, at least 1, at most 65,535.
    public static func track(_ interval: UInt16, gap: Int64) -> UInt16 {
        let ms = UInt16(clamping: max(1, gap / 1_000_000))
        guard interval > 0, ms >= interval else { return ms }
        return interval &+ (ms &- interval) / 64
    }
}

/// Keeps a table's idea of now from running backwards. `ContinuousClock` never does, but the
/// lists' order (the oldest at the head) depends on it, so a caller's mistake costs a moment
/// of staleness, never a wrong order.
struct MonotonicClamp {
    private var latest: Instant?
    mutating func clamp(_ now: Instant) -> Instant {
        if let latest, now < latest { return latest }
        latest = now
        return now
    }
}

/// SplitMix64's finaliser (Steele, Lea, Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014): a bijective 64-bit mix whose every output bit depends on every
/// input bit. Used for the index's home buckets and the Apple table's pseudonyms.
@inline(__always)
func mix64(_ x: UInt64) -> UInt64 {
    // Proof: wrapping multiplication is the point of the mix.
    var z = x &+ 0x9E37_79B9_7F4A_7C15
    z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
    z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
    return z ^ (z >> 31)
}

enum TableLimits {
    /// The largest capacity a table accepts (slot numbers are Int32, and an index's buckets
    /// number up to 4 × its keys).
    static var maxCapacity: Int { 1 << 24 }
}

/// Fixed storage for up to `capacity` elements in one allocation, each slot on one of two
/// doubly linked lists or on the free list. Slots are stable while occupied. A list is kept in
/// the order elements were appended or moved to its tail: the tables move an entry to the tail
/// whenever they hear it, so each head is that list's least recently heard.
@usableFromInline  // Embedded Swift destroys it in the modules that hold a table.
struct SlotPool<Element>: ~Copyable {
    /// Slot numbers are Int32, and an index sizes its buckets at 2–4 × its keys.
    static var maxCapacity: Int { TableLimits.maxCapacity }

    private struct Link {
        var prev: Int32
        var next: Int32
        /// 0 or 1 when on a list; -1 when free.
        var list: Int32
    }

    let capacity: Int
    private(set) var count = 0
    private let elements: UnsafeMutablePointer<Element>
    private let links: UnsafeMutablePointer<Link>
    private var free: Int32
    private var heads: InlineArray<2, Int32> = .init(repeating: -1)
    private var tails: InlineArray<2, Int32> = .init(repeating: -1)

    init(capacity: Int) {
        precondition(capacity >= 1 && capacity <= Self.maxCapacity,
                     "table capacity \(capacity) outside 1...\(Self.maxCapacity): the config loader checks it")
        self.capacity = capacity
        elements = .allocate(capacity: capacity)
        links = .allocate(capacity: capacity)
        for i in 0..<capacity {
            // Proof: i + 1 <= capacity <= 2²⁴ fits Int32; the last slot ends the free list.
            (links + i).initialize(to: Link(prev: -1, next: i + 1 < capacity ? Int32(i + 1) : -1, list: -1))
        }
        free = 0
    }

    deinit {
        for list in 0..<2 {
            var s = heads[list]
            while s >= 0 {
                (elements + Int(s)).deinitialize(count: 1)
                s = links[Int(s)].next
            }
        }
        elements.deallocate()
        links.deallocate()
    }

    var isFull: Bool { count == capacity }

    /// Every slot number handed out is in 0..<capacity, so these accesses stay inside the
    /// allocation; a slot that is not occupied is our bug.
    subscript(slot: Int32) -> Element {
        unsafeAddress {
            precondition(slot >= 0 && Int(slot) < capacity)
            return UnsafePointer(elements + Int(slot))
        }
        unsafeMutableAddress {
            precondition(slot >= 0 && Int(slot) < capacity)
            return elements + Int(slot)
        }
    }

    func head(_ list: Int) -> Int32? {
        let s = heads[list]
        return s >= 0 ? s : nil
    }

    /// Puts `element` in a free slot at the tail of `list`. The caller made room first.
    mutating func append(_ element: Element, to list: Int) -> Int32 {
        precondition(free >= 0, "append to a full pool: the table evicts first")
        let slot = free
        free = links[Int(slot)].next
        (elements + Int(slot)).initialize(to: element)
        link(slot, list: list)
        count &+= 1
        return slot
    }

    /// Takes the element out of `slot` and frees the slot.
    mutating func remove(_ slot: Int32) -> Element {
        precondition(links[Int(slot)].list >= 0, "remove of a free slot")
        unlink(slot)
        links[Int(slot)] = Link(prev: -1, next: free, list: -1)
        free = slot
        count &-= 1
        return (elements + Int(slot)).move()
    }

    /// Moves an occupied slot to the tail of `list` (the same list or the other one).
    mutating func moveToTail(_ slot: Int32, list: Int) {
        guard tails[list] != slot else { return }
        unlink(slot)
        link(slot, list: list)
    }

    func forEach(list: Int, _ body: (borrowing Element) -> Void) {
        var s = heads[list]
        while s >= 0 {
            body(elements[Int(s)])
            s = links[Int(s)].next
        }
    }

    private mutating func link(_ slot: Int32, list: Int) {
        let tail = tails[list]
        links[Int(slot)] = Link(prev: tail, next: -1, list: Int32(list))
        if tail >= 0 { links[Int(tail)].next = slot } else { heads[list] = slot }
        tails[list] = slot
    }

    private mutating func unlink(_ slot: Int32) {
        let l = links[Int(slot)]
        let list = Int(l.list)
        if l.prev >= 0 { links[Int(l.prev)].next = l.next } else { heads[list] = l.next }
        if l.next >= 0 { links[Int(l.next)].prev = l.prev } else { tails[list] = l.prev }
    }
}

/// The entries a full table may give up, each on the list of its strength bucket, so the weakest
/// is found by looking at the bucket heads from the bottom (at most 149) rather than at every
/// entry; and the entries it keeps whatever their strength (protected: this room owns them),
/// on no list. Moving an entry between buckets is O(1): a report that changes its smoothed
/// RSSI by a whole dBm relinks it. Fixed storage, allocated once: 9 bytes an entry.
@usableFromInline  // Embedded Swift destroys it in the modules that hold a table.
struct StrengthBuckets: ~Copyable {
    /// Bucket 0: invalidated; 1…148: current, by level −127…+20 dBm.
    static let count = 149
    private static let protected: UInt8 = 0xFE
    private static let none: UInt8 = 0xFF

    private let prev: UnsafeMutablePointer<Int32>
    private let next: UnsafeMutablePointer<Int32>
    private let bucketOf: UnsafeMutablePointer<UInt8>
    private var heads: InlineArray<149, Int32> = .init(repeating: -1)
    private var tails: InlineArray<149, Int32> = .init(repeating: -1)
    /// No bucket below this one holds an entry (a lower bound, raised by `weakest`).
    private var lowest = StrengthBuckets.count
    private(set) var protectedCount = 0

    init(capacity: Int) {
        prev = .allocate(capacity: capacity)
        next = .allocate(capacity: capacity)
        bucketOf = .allocate(capacity: capacity)
        prev.initialize(repeating: -1, count: capacity)
        next.initialize(repeating: -1, count: capacity)
        bucketOf.initialize(repeating: Self.none, count: capacity)
    }

    deinit {
        prev.deallocate()
        next.deallocate()
        bucketOf.deallocate()
    }

    func isProtected(_ slot: Int32) -> Bool { bucketOf[Int(slot)] == Self.protected }

    /// A new entry, or a protected one given back, on `bucket`'s list.
    mutating func place(_ slot: Int32, _ bucket: Int) {
        remove(slot)
        link(slot, bucket)
    }

    /// A report moved an entry: relinked only when its bucket changed; a protected entry stays.
    @inline(__always)
    mutating func move(_ slot: Int32, _ bucket: Int) {
        let b = bucketOf[Int(slot)]
        guard b != Self.protected, Int(b) != bucket else { return }
        unlink(slot)
        link(slot, bucket)
    }

    /// Kept from now on, whatever its strength.
    mutating func protect(_ slot: Int32) {
        guard !isProtected(slot) else { return }
        unlink(slot)
        bucketOf[Int(slot)] = Self.protected
        protectedCount &+= 1
    }

    /// The slot left the table.
    mutating func remove(_ slot: Int32) {
        if isProtected(slot) { protectedCount &-= 1; bucketOf[Int(slot)] = Self.none; return }
        unlink(slot)
    }

    /// The head of the lowest non-empty bucket at or above `from`: the least recently placed
    /// of the weakest entries. O(buckets), and O(1) while the lowest stays where it was.
    func weakest(from: Int = 0) -> Int32? {
        let b = firstFilled(from: from)
        return b < Self.count ? heads[b] : nil
    }

    /// `weakest` of all, raising the lower bound to where it was found.
    mutating func takeWeakest() -> Int32? {
        lowest = firstFilled(from: 0)
        return lowest < Self.count ? heads[lowest] : nil
    }

    private func firstFilled(from: Int) -> Int {
        var b = max(from, lowest)
        while b < Self.count && heads[b] < 0 { b &+= 1 }
        return b
    }

    private mutating func link(_ slot: Int32, _ bucket: Int) {
        precondition(bucket >= 0 && bucket < Self.count, "a strength bucket is 0...148")
        let s = Int(slot)
        let tail = tails[bucket]
        prev[s] = tail
        next[s] = -1
        if tail >= 0 { next[Int(tail)] = slot } else { heads[bucket] = slot }
        tails[bucket] = slot
        bucketOf[s] = UInt8(bucket)
        if bucket < lowest { lowest = bucket }
    }

    /// Off its list, if on one.
    private mutating func unlink(_ slot: Int32) {
        let s = Int(slot)
        let b = bucketOf[s]
        guard b != Self.none, b != Self.protected else { return }
        let bucket = Int(b)
        if prev[s] >= 0 { next[Int(prev[s])] = next[s] } else { heads[bucket] = next[s] }
        if next[s] >= 0 { prev[Int(next[s])] = prev[s] } else { tails[bucket] = prev[s] }
        prev[s] = -1
        next[s] = -1
        bucketOf[s] = Self.none
    }
}

/// A fixed open-addressing index from a 64-bit key to a slot, linear probing, at most half
/// full so every probe ends at an empty bucket. Removal shifts the following run back (Knuth,
/// TAOCP vol. 3, §6.4, Algorithm R), so there are no tombstones and lookups never slow down
/// with churn. Home buckets are keyed by a per-table random seed: devices choose their ids and
/// addresses, and must not be able to choose a long probe run.
@usableFromInline  // Embedded Swift destroys it in the modules that hold a table.
struct SlotIndex: ~Copyable {
    private struct Bucket {
        var key: UInt64
        /// -1: empty.
        var slot: Int32
    }

    private let buckets: UnsafeMutablePointer<Bucket>
    private let mask: Int
    private let seed: UInt64
    private let maxKeys: Int
    private(set) var count = 0

    init(maxKeys: Int) {
        precondition(maxKeys >= 1 && maxKeys <= 2 * TableLimits.maxCapacity)
        var size = 4
        while size < 2 * maxKeys { size <<= 1 }
        buckets = .allocate(capacity: size)
        buckets.initialize(repeating: Bucket(key: 0, slot: -1), count: size)
        mask = size - 1
        self.maxKeys = maxKeys
        seed = UInt64.random(in: .min ... .max)
    }

    deinit { buckets.deallocate() }

    @inline(__always)
    private func home(_ key: UInt64) -> Int { Int(truncatingIfNeeded: mix64(key ^ seed)) & mask }

    func find(_ key: UInt64) -> Int32? {
        var i = home(key)
        while true {
            // Proof: i is masked into 0..<size; at most half the buckets are full, so the
            // probe meets an empty one.
            let b = buckets[i]
            if b.slot < 0 { return nil }
            if b.key == key { return b.slot }
            i = (i &+ 1) & mask
        }
    }

    /// Maps `key` to `slot`, replacing what it mapped to.
    mutating func insert(_ key: UInt64, slot: Int32) {
        var i = home(key)
        while buckets[i].slot >= 0 && buckets[i].key != key { i = (i &+ 1) & mask }
        if buckets[i].slot < 0 {
            precondition(count < maxKeys, "index over its sizing: the table removes first")
            count &+= 1
        }
        buckets[i] = Bucket(key: key, slot: slot)
    }

    /// Every key forgotten: O(buckets), for a change-rate reset (a reconnect).
    mutating func removeAll() {
        buckets.update(repeating: Bucket(key: 0, slot: -1), count: mask + 1)
        count = 0
    }

    mutating func remove(_ key: UInt64) {
        var hole = home(key)
        while true {
            if buckets[hole].slot < 0 { return }
            if buckets[hole].key == key { break }
            hole = (hole &+ 1) & mask
        }
        count &-= 1
        var j = hole
        while true {
            j = (j &+ 1) & mask
            let b = buckets[j]
            if b.slot < 0 { break }
            // b may fill the hole unless its home lies cyclically in (hole, j]: then moving it
            // before its home would hide it from its own probe.
            let h = home(b.key)
            let stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j)
            if !stays {
                buckets[hole] = b
                hole = j
            }
        }
        buckets[hole].slot = -1
    }
}
