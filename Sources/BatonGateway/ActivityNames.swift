// What the retained activity says the activity *is* (docs/mqtt.md §2 "What an activity is
// called"): the type from `activity-types:` by its hash, and for a group whose payload is not
// sealed, the type, title and webpage URL of the payload, which the owning gateway fetches over
// the device link when the activity becomes current or is saved (docs/relay.md §4.1).
//
// Every fetch costs the phone a link and airtime, so they are bounded: one in flight per
// device, `inFlightCapacity` at once (a quarter of `relay.fetches`), at most one per device
// per `minInterval`, and after a failure none for a back-off that doubles up to
// `backoffMax`. A failed fetch leaves the message as it was and is tried again at the next
// save (or the save that comes after the back-off).
//
// It also keeps what another room said of a device this room hears, so that when this room
// takes the device over it republishes the activity as it was (its change, its time, its
// title), with `moved_at`, rather than as a new activity (docs/mqtt.md §2 "Moves").
//
// Entries are per device this room holds, so at most `table.capacity` (reserved at start);
// they are touched on changes and answers only, never per advertisement.
public import BatonLibc
import BatonCore
public import BatonRelay
public import BatonWire

public struct ActivityNamesCounters: Sendable, Equatable {
    /// Own fetches started (cache hits included), and their answers.
    public var fetches = 0
    public var described = 0
    /// Answered, but no payload the gateway can read (sealed, or not v1): not asked again
    /// until the activity's type changes.
    public var unreadable = 0
    /// Failed (unreachable, timeout, …): the message stays as it was; counted, backed off.
    public var failed = 0
    /// A fetch owed but not started: every own slot (or the relay's pending table) was busy.
    /// It starts as soon as one is free.
    public var waited = 0
    /// Moves that kept the previous room's change and title.
    public var carried = 0
    /// A device this room holds that found no free entry (never expected: one per table entry).
    public var full = 0
    public init() {}
}

public struct ActivityNames {
    /// `activity-types:` by FNV-1a 32 (docs/protocol.md §2.3).
    let types: [UInt32: String]
    /// `relay.fetch-titles`.
    public let fetchTitles: Bool
    public let capacity: Int
    public let inFlightCapacity: Int
    public static let minInterval: Duration = .seconds(30)
    public static let backoffMin: Duration = .seconds(30)
    public static let backoffMax: Duration = .seconds(600)

    struct Entry {
        var typeHash: UInt32
        /// What the payload of `payloadSeq` said, for `typeHash`.
        var described: ActivityDescription?
        var payloadSeq: UInt16?
        /// The payload of this type is not readable here (sealed): never fetched again for it.
        var unreadable = false
        /// The activity's own change and time as the room that owned it before said them, for
        /// the sequence `carriedSeq`.
        var carriedSeq: UInt16?
        var carriedChange: String?
        var carriedChanged: String?
        /// The last message about it came from another gateway: the next takeover is a move.
        var heardElsewhere = false
        /// When this room took it over from another (unix µs), while it owns it.
        var movedAt: Int64?
        var owed = false
        var inFlight = false
        var lastFetch: Instant?
        var failures = 0
        var retryAt: Instant?

        init(typeHash: UInt32) { self.typeHash = typeHash }
    }
    var entries: [UInt64: Entry]
    public private(set) var inFlight = 0
    public private(set) var owed = 0
    public private(set) var counters = ActivityNamesCounters()

    public init(types: [String], fetchTitles: Bool, capacity: Int, fetches: Int) {
        var t: [UInt32: String] = [:]
        for type in types { t[activityTypeHash(type.utf8)] = type }
        self.types = t
        self.fetchTitles = fetchTitles
        self.capacity = capacity
        self.inFlightCapacity = max(1, fetches / 4)
        self.entries = [:]
        self.entries.reserveCapacity(capacity)
    }

    /// The name `activity-types:` gives a type hash.
    public func typeName(_ hash: UInt32) -> String? { types[hash] }

    /// What the activity message adds to the beacon's fields (Payloads.activity).
    func extras(_ a: TrackedActivity) -> Payloads.Extras {
        var x = Payloads.Extras()
        x.type = types[a.beacon.activityTypeHash]
        guard let e = entries[a.deviceID] else { return x }
        if e.typeHash == a.beacon.activityTypeHash, let d = e.described {
            x.type = d.type ?? x.type
            x.title = d.title
            x.webpageURL = d.webpageURL
            x.payloadSeq = e.payloadSeq
        }
        if e.carriedSeq == a.beacon.sequence {
            x.change = e.carriedChange
            x.changed = e.carriedChanged
        }
        x.movedAt = e.movedAt
        return x
    }

    // MARK: changes

    /// An activity this room owns became current or was saved: a new activity (or a new type)
    /// forgets what the old one was called; a fetch is owed when the payload can be read here.
    mutating func changed(_ a: TrackedActivity, kind: ActivityChangeKind, readable: Bool) {
        guard let e = entry(a) else { return }
        let hash = a.beacon.activityTypeHash
        if kind == .becameCurrent || e.typeHash != hash {
            entries[a.deviceID]!.typeHash = hash
            entries[a.deviceID]!.described = nil
            entries[a.deviceID]!.payloadSeq = nil
            entries[a.deviceID]!.unreadable = false
        }
        // Its own change now, from this room.
        entries[a.deviceID]!.carriedSeq = nil
        owe(a, readable: readable)
    }

    /// This room took the device over: what the room before said of it is kept.
    mutating func tookOver(_ a: TrackedActivity, readable: Bool, now unixMicroseconds: Int64) {
        guard var e = entry(a) else { return }
        if e.heardElsewhere {
            e.movedAt = unixMicroseconds
            e.heardElsewhere = false
            if e.carriedSeq == a.beacon.sequence || e.described != nil { counters.carried &+= 1 }
        }
        entries[a.deviceID] = e
        owe(a, readable: readable)
    }

    /// Owes a fetch unless the payload of this sequence is already described, or cannot be.
    private mutating func owe(_ a: TrackedActivity, readable: Bool) {
        guard fetchTitles, readable, var e = entries[a.deviceID], !e.unreadable else { return }
        if e.described != nil, e.payloadSeq == a.beacon.sequence { return }
        if !e.owed { owed += 1 }
        e.owed = true
        entries[a.deviceID] = e
    }

    /// This room no longer owns the device: nothing is fetched for it here.
    mutating func stoppedOwning(_ id: UInt64) {
        guard var e = entries[id] else { return }
        if e.owed { owed -= 1 }
        e.owed = false
        e.movedAt = nil
        entries[id] = e
    }

    /// An owed fetch that can no longer be made (the activity ended, or the device moved).
    mutating func dropOwed(_ id: UInt64) {
        guard entries[id]?.owed == true else { return }
        entries[id]!.owed = false
        owed -= 1
    }

    /// The device left this room's table.
    mutating func forget(_ id: UInt64) {
        guard let e = entries.removeValue(forKey: id) else { return }
        if e.owed { owed -= 1 }
        if e.inFlight { inFlight -= 1 }
    }

    /// Another gateway's message about a device this room holds (docs/mqtt.md §2 "Moves").
    mutating func observed(_ id: UInt64, _ m: RetainedActivity, held: TrackedActivity) {
        guard let hash = m.typeHash, let e0 = entry(held) else { return }
        var e = e0
        e.heardElsewhere = true
        if let seq = m.seq, let change = m.change {
            e.carriedSeq = seq
            e.carriedChange = change
            e.carriedChanged = m.changed
        }
        if m.title != nil || m.webpageURL != nil || m.type != nil, let p = m.payloadSeq {
            if e.typeHash != hash || e.payloadSeq.map({ SerialOrder(p, comparedTo: $0) == .newer }) ?? true {
                e.typeHash = hash
                e.described = ActivityDescription(type: m.type, title: m.title, webpageURL: m.webpageURL)
                e.payloadSeq = p
                e.unreadable = false
            }
        } else if e.typeHash != hash {
            e.typeHash = hash
            e.described = nil
            e.payloadSeq = nil
        }
        entries[id] = e
    }

    private mutating func entry(_ a: TrackedActivity) -> Entry? {
        if let e = entries[a.deviceID] { return e }
        guard entries.count < capacity else {
            counters.full &+= 1
            return nil
        }
        let e = Entry(typeHash: a.beacon.activityTypeHash)
        entries[a.deviceID] = e
        return e
    }

    // MARK: fetching

    /// The earliest time an owed fetch that waits may start (nil: none waits; one owed without
    /// a wait starts in the turn that owed it, `Gateway.fetchTitles`).
    public var nextDeadline: Instant? {
        guard owed > 0, inFlight < inFlightCapacity else { return nil }
        var next: Instant?
        for e in entries.values where e.owed && !e.inFlight {
            guard let t = notBefore(e) else { continue }
            if next.map({ t < $0 }) ?? true { next = t }
        }
        return next
    }

    /// The minimum interval after the last fetch, and the back-off after a failure.
    func notBefore(_ e: Entry) -> Instant? {
        let interval = e.lastFetch.map { $0 + Self.minInterval }
        switch (interval, e.retryAt) {
        case (let a?, let b?): return max(a, b)
        case (let a?, nil): return a
        case (nil, let b?): return b
        case (nil, nil): return nil
        }
    }

    /// The devices whose fetch may start now, as many as free own slots.
    func due(now: Instant) -> [UInt64] {
        guard owed > 0, inFlight < inFlightCapacity else { return [] }
        var out: [UInt64] = []
        for (id, e) in entries where e.owed && !e.inFlight && (notBefore(e).map { $0 <= now } ?? true) {
            out.append(id)
            if out.count + inFlight >= inFlightCapacity { break }
        }
        return out
    }

    mutating func started(_ id: UInt64, now: Instant) {
        guard var e = entries[id] else { return }
        if e.owed { owed -= 1 }
        e.owed = false
        e.inFlight = true
        e.lastFetch = now
        entries[id] = e
        inFlight += 1
        counters.fetches &+= 1
    }

    /// The relay had no room: the fetch stays owed and is tried at the next turn's deadline.
    mutating func couldNotStart(_ id: UInt64, now: Instant) {
        counters.waited &+= 1
        entries[id]?.retryAt = now + .seconds(1)
    }

    /// An answer; true when the message now says more (republish it).
    mutating func answered(_ a: OwnFetchAnswer, now: Instant) -> Bool {
        guard var e = entries[a.device] else { return false }
        if e.inFlight { inFlight -= 1 }
        e.inFlight = false
        defer { entries[a.device] = e }
        guard a.status == .ok else {
            counters.failed &+= 1
            e.failures += 1
            // 30 s, 60 s, 120 s … 600 s.
            let shift = min(e.failures - 1, 5)
            e.retryAt = now + min(Self.backoffMax, Self.backoffMin * (1 << shift))
            return false
        }
        e.failures = 0
        e.retryAt = nil
        guard let d = a.described else {
            counters.unreadable &+= 1
            e.unreadable = true
            return false
        }
        counters.described &+= 1
        // A payload of another type than the beacon's now (the user moved on meanwhile) names
        // nothing current: the next change owes its own fetch.
        guard activityTypeHash((d.type ?? "").utf8) == e.typeHash else { return false }
        if let held = e.payloadSeq, SerialOrder(held, comparedTo: a.sequence) == .newer { return false }
        let before = (e.described, e.payloadSeq)
        e.described = d
        e.payloadSeq = a.sequence
        return before.0 != d || before.1 != a.sequence
    }
}
