// Room ownership (docs/rooms.md §3): every gateway runs this same rule on the same sightings,
// so exactly one gateway owns (publishes) a device's retained activity at a time, and the room
// follows the person without flapping.
//
// Storage is fixed at init (architecture.md §5): a registry of `gateways` slots, a device
// table of `capacity` entries with an open-addressing index (the activity table's SlotPool and
// SlotIndex), and one column array of `capacity × gateways` cells holding each gateway's last
// sighting of each device. `sighting` and `tick` allocate nothing. Time is injected: every
// instant is the receiver's `ContinuousClock` reading, so nothing compares two machines' clocks.
import BatonLibc
public import BatonWire

/// The rule's parameters (docs/rooms.md §3 says why each has its value). Durations are
/// receiver-side: nothing here compares clocks of two machines.
public struct RoomsConfig: Sendable, Equatable {
    /// A gateway that hears a device repeats its sighting this often (the heartbeat).
    public var sightingInterval: Duration
    /// Sooner than the heartbeat when the smoothed RSSI moved by at least this many dB since
    /// the last sighting sent…
    public var sightingStep: Int
    /// …but never more often than this per device.
    public var sightingMinInterval: Duration
    /// A sighting counts this long after it arrived (2.5 heartbeats: one lost QoS 0 message
    /// is not a departure).
    public var sightingFresh: Duration
    /// A gateway that has not heard a device for this long says so (an `rssi: null` sighting).
    public var lostAfter: Duration
    /// A device with no owner gets one this long after its first sighting, so every
    /// gateway's first sighting is in before the choice is made.
    public var settle: Duration
    /// A challenger must be at least this many dB stronger than the owner…
    public var margin: Int
    /// …for this long without a break, before it takes the device over…
    public var dwell: Duration
    /// …or, for a device that walks (a challenge that begins within `walkWindow` of the first
    /// room to come within `margin` of its owner once the device is calm), until its lead
    /// summed over time reaches `margin × walkDwell` (docs/rooms.md §3 "A walk and a border").
    public var walkDwell: Duration
    public var walkWindow: Duration
    /// A device with no other room within `margin` of its owner for this long after a move is
    /// calm, settled in its room: the next room to come that close starts a walk…
    public var calm: Duration
    /// …where each contest puts the calm this much further off, up to `calm` from the contest
    /// (docs/rooms.md §3 "A walk and a border"): a device contested now and then, by fading,
    /// is calm again soon after; one contested at most of its sightings (a border) never is.
    /// `calm` or more: every contest starts the whole calm over.
    public var calmPerContest: Duration
    /// A device nobody sights any more is forgotten after this long (the gateway sets it to
    /// `table.expiry`).
    public var forgetAfter: Duration
    /// Devices tracked (fixed; allocated once): with neighbourhoods, the ones this gateway
    /// hears or owns, and how many devices' owners it remembers building-wide
    /// (`ActivityPublishers`). The default holds a 10-room building of 1,000 devices twice.
    public var capacity: Int
    /// Gateways known building-wide (fixed; allocated once). Includes this one.
    public var gateways: Int
    /// A gateway that hears a device more than this many dB below another gateway's fresh
    /// sighting, and does not own it, stops sending sightings of it (docs/rooms.md §8.4).
    /// 0: off, every device heard is sighted.
    public var reach: Int

    public init(sightingInterval: Duration = .seconds(2), sightingStep: Int = 3,
                sightingMinInterval: Duration = .milliseconds(500), sightingFresh: Duration = .seconds(5),
                lostAfter: Duration = .seconds(10), settle: Duration = .seconds(1), margin: Int = 6,
                dwell: Duration = .seconds(3), walkDwell: Duration = .seconds(1), walkWindow: Duration = .seconds(15),
                calm: Duration = .seconds(5), calmPerContest: Duration = .seconds(1), forgetAfter: Duration = .seconds(60),
                capacity: Int = 2048, gateways: Int = 32, reach: Int = 20) {
        self.sightingInterval = sightingInterval
        self.sightingStep = sightingStep
        self.sightingMinInterval = sightingMinInterval
        self.sightingFresh = sightingFresh
        self.lostAfter = lostAfter
        self.settle = settle
        self.margin = margin
        self.dwell = dwell
        self.walkDwell = walkDwell
        self.walkWindow = walkWindow
        self.calm = calm
        self.calmPerContest = calmPerContest
        self.forgetAfter = forgetAfter
        self.capacity = capacity
        self.gateways = gateways
        self.reach = reach
    }
}

/// A gateway known to the rule: an index into its fixed registry.
public struct GatewaySlot: Hashable, Sendable {
    public let index: Int
    public init(index: Int) { self.index = index }
}

public enum OwnershipReason: Sendable, Equatable {
    /// A device without an owner got its first one, `settle` after its first sighting.
    case settled
    /// A challenger led the owner by `margin` dB or more without a break for `dwell`, or, on a
    /// walk, until its lead summed over that time reached `margin × walkDwell` (docs/rooms.md
    /// §3 "The evidence").
    case stronger
    /// The owner went offline or stopped hearing the device; the best gateway hearing it took over at once.
    case takeover
    /// A gateway that came online less than `dwell` ago, or the one the owner took the device
    /// over from, was `margin` dB stronger than the owner: it took the device at once
    /// (docs/rooms.md §7). Its first sightings are not noise for the dwell to filter, and it is
    /// usually a room's own gateway coming back to the devices in its room that another room
    /// stood in for.
    case returned
    /// This gateway and another both believed they owned the device (their views parted in
    /// a fault), and the other ranks higher on the sightings both hold: this one gave way
    /// (docs/rooms.md §7 rule 3).
    case yielded
    /// Nobody sighted the device for `forgetAfter`: it has no owner any more (`to` is nil).
    case forgotten
    /// A device this gateway starts following already has an owner: the online gateway whose
    /// activity message the broker holds for it (docs/rooms.md §3 "A device another room
    /// holds"). This view takes that owner, as the owner's own view has it, instead of settling
    /// on what it has heard so far; `from` is nil.
    case published
}

/// The reason as the gateway's log writes it ("moved to office (stronger)"). Spelled out, not
/// reflected: Embedded Swift prints an enum without a description as "(cannot print value in
/// embedded Swift)", which is what the firmware logged before.
extension OwnershipReason: CustomStringConvertible {
    public var description: String {
        switch self {
        case .settled: "settled"
        case .stronger: "stronger"
        case .takeover: "takeover"
        case .returned: "returned"
        case .yielded: "yielded"
        case .forgotten: "forgotten"
        case .published: "published"
        }
    }
}

public struct OwnershipChange: Sendable, Equatable {
    public var device: UInt64
    public var from: GatewaySlot?
    public var to: GatewaySlot?
    public var reason: OwnershipReason
    public init(device: UInt64, from: GatewaySlot?, to: GatewaySlot?, reason: OwnershipReason) {
        self.device = device
        self.from = from
        self.to = to
        self.reason = reason
    }
}

/// Why a sighting changed nothing (counted on the stats topic under `name`).
public enum SightingDrop: Error, Sendable, Equatable {
    /// The sender's status is not `online` (never seen, or offline).
    case unknownGateway
    /// Not newer than the last sighting accepted from that gateway (`since`, then `n`).
    case replayed
    /// Claims this gateway's id but not this run (`since` differs): another process with our id, or an old run's message.
    case impostor
    /// The device table is full (`capacity`); the oldest unsighted device is not evicted.
    case devicesFull
    /// The gateway registry is full (`gateways`).
    case gatewaysFull

    public var name: StaticString {
        switch self {
        case .unknownGateway: "sighting-unknown-gateway"
        case .replayed: "sighting-replayed"
        case .impostor: "sighting-impostor"
        case .devicesFull: "sighting-devices-full"
        case .gatewaysFull: "sighting-gateways-full"
        }
    }
}

/// What `RoomOwnership.batch` did with a batch's records: how many it took in, and how many
/// it dropped by reason (each record as one sighting, counted in `OwnershipCounters` too).
public struct BatchOutcome: Sendable, Equatable {
    public var accepted = 0
    public var unknownGateway = 0
    public var replayed = 0
    public var impostor = 0
    public var devicesFull = 0
    /// Of `accepted`, about devices not followed and left so (`RoomOwnership.batch`'s `ignoreNew`).
    public var ignored = 0
    public init() {}

    public var dropped: Int { unknownGateway + replayed + impostor + devicesFull }

    mutating func count(_ reason: SightingDrop) {
        switch reason {
        case .unknownGateway: unknownGateway &+= 1
        case .replayed: replayed &+= 1
        case .impostor: impostor &+= 1
        case .devicesFull: devicesFull &+= 1
        case .gatewaysFull: break  // status messages only
        }
    }

    /// The drops by reason, for a stats counter keyed by `SightingDrop.name`; reasons with none
    /// are skipped.
    public func forEachDrop(_ body: (SightingDrop, Int) -> Void) {
        if unknownGateway > 0 { body(.unknownGateway, unknownGateway) }
        if replayed > 0 { body(.replayed, replayed) }
        if impostor > 0 { body(.impostor, impostor) }
        if devicesFull > 0 { body(.devicesFull, devicesFull) }
    }
}

/// What the rule did, for the stats topic (docs/rooms.md §3 "Counters").
public struct OwnershipCounters: Sendable, Equatable {
    public var sightingsAccepted = 0
    /// Drops by reason, in `SightingDrop` order.
    public var unknownGateway = 0
    public var replayed = 0
    public var impostor = 0
    public var devicesFull = 0
    public var gatewaysFull = 0
    /// Every `OwnershipChange` reported, whatever its reason (settled, stronger, takeover,
    /// forgotten): the number of `onChange` calls.
    public var changes = 0
    /// Changes with reason `.takeover` (also counted in `changes`).
    public var takeovers = 0
    /// Device entries freed because nobody sighted the device for `forgetAfter`. An entry
    /// that never had an owner is freed without a change; it is counted here, not in `changes`.
    public var forgotten = 0
    /// Entries of devices this gateway neither hears nor owns, freed by a full table for one it
    /// needs (`RoomOwnership.batch`'s `ignoreNew`); no change is reported.
    public var unfollowed = 0
    public init() {}
}

public struct RoomOwnership: ~Copyable {
    public let config: RoomsConfig
    /// `config`'s spans in the monotonic clock's nanoseconds, converted once: the rule runs for
    /// every sighting record, and `Duration`'s 128-bit arithmetic showed in its profile.
    let fresh: Int64, forget: Int64, settle: Int64, dwell: Int64, walkWindow: Int64, calm: Int64, calmPerContest: Int64
    /// The evidence a challenger needs (`Device.evidence`'s units, dB·ns): a lead of `margin`
    /// (at least 1 dB) held for `dwell`; on a walk, its lead summed over time up to
    /// `margin × walkDwell` (never more than `winning`).
    let winning: Int64, walkWinning: Int64
    /// Tests only: run the rule for every sighting, as before `cannotMatter`, to show that
    /// skipping those changes nothing.
    var evaluatesEverySighting = false
    public private(set) var counters = OwnershipCounters()

    // Internal, not private: see ActivityTable.Entry (a Swift 6.3.1 IRGen failure with private
    // element types of ~Copyable generic storage).
    struct Gateway {
        var online = false
        /// When its status last turned `online` (the `returned` rule, docs/rooms.md §7).
        var onlineSince: Instant?
        /// When its status last turned offline (orphans, docs/mqtt.md §5).
        var offlineSince: Instant?
        /// Position of the id among the registered ones, byte-wise: the tie-break (rank 0 wins).
        var rank = 0
        /// The last accepted sighting's `since` and `n` (docs/rooms.md §5 "Replayed"): of its
        /// sightings and neighbourhood batches, and apart, of its building-wide batches. Each
        /// channel arrives in order, but not in order with the other: the broker sends QoS 0
        /// at once and may queue QoS 1 (§8.3).
        var sequence = Sequence()
        var buildingSequence = Sequence()
    }

    struct Sequence {
        var accepted = false
        var since: Int64 = 0
        var n: UInt64 = 0
        /// (since, n) in lexicographic order: a larger `since` is a new run, whose `n` restarts.
        func admits(_ s: Sighting) -> Bool { !accepted || s.since > since || (s.since == since && s.n > n) }
    }

    struct Device {
        var inUse = false
        var device: UInt64 = 0
        /// Gateway indices; -1: none.
        var owner: Int32 = -1
        var challenger: Int32 = -1
        /// The gateway whose device the owner took over (reason `takeover`); -1 otherwise. 0
        /// (this gateway) on a device this gateway owns: held back since the broker gave it up
        /// (`dropped`, `announced`), published when the rejoin window closes if still its own.
        var standInFor: Int32 = -1
        /// The challenger's evidence (docs/rooms.md §3 "The evidence"): the integral over time
        /// of its lead over the owner, in dB·ns, since the lead reached `margin` (and, on a walk,
        /// has stayed above 0 since: a walk's dips below the margin bank their smaller lead);
        /// the lead counted as `margin` at most unless the challenge is a walk. It wins at
        /// `winning` (`margin × dwell`), a walk at `walkWinning`.
        var evidence: Int64 = 0
        /// When `evidence` was last brought up to date, and the rate (dB) it grows by since;
        /// nil without a challenger.
        var evidenceAt: Instant?
        var lead: Int32 = 0
        /// The challenge began in a walk window: it weighs its whole lead, up to `walkWinning`.
        var walking = false
        /// When (ns) the device is calm if no room contests it before (another room heard
        /// within `margin` of the owner), and until when a challenge that begins is a walk:
        /// `walkWindow` after the first contest once calm. `Int64.min`: calm, none.
        var calmAt = Int64.min
        var walkUntil = Int64.min
        /// Another room was heard within `margin` of the owner at `now`: the calm moves
        /// `perContest` further off, never more than `calm` from now.
        mutating func contest(now: Instant, calm: Int64, perContest: Int64, window: Int64) {
            let t = now.nanoseconds
            var from = calmAt
            if calmAt == .min || t > calmAt {
                walkUntil = t &+ window
                from = t
            }
            let (later, overflow) = from.addingReportingOverflow(max(0, perContest))
            calmAt = min(overflow ? .max : later, t &+ calm)
        }
        /// The first and the latest non-nil sighting from any gateway. Valid while `inUse`: an
        /// entry is created by a non-nil sighting, which sets both.
        var firstSighted: Instant?
        var lastSighted: Instant?
        /// No challenger, no evidence.
        mutating func clearChallenge() {
            challenger = -1
            evidence = 0
            evidenceAt = nil
            lead = 0
            walking = false
        }

        /// Brings `evidence` up to `now`: the lead since `evidenceAt` times the time it held,
        /// saturating far above any threshold. A challenger's lead is `margin` or more, or on a
        /// walk above 0 (anything smaller ends the challenge).
        mutating func accrue(now: Instant) {
            guard challenger >= 0, let at = evidenceAt else { return }
            let (gained, overflow) = Int64(lead).multipliedReportingOverflow(by: max(0, now.nanoseconds &- at.nanoseconds))
            let (sum, overflow2) = evidence.addingReportingOverflow(gained)
            evidence = overflow || overflow2 ? .max : sum
            evidenceAt = now
        }

        /// Reason `published`: until then an owner whose sighting has not arrived yet is
        /// presumed there, not gone (one heartbeat and a settle after the entry was made).
        var presumedUntil: Instant?
    }

    /// One gateway's last sighting of one device. `arrived` nil: none, or it said `rssi: null`.
    struct Cell {
        var arrived: Instant?
        var rssi: Int8 = 0
        /// Nothing from that gateway about this device since the last `rejoin`: what it said
        /// before is unknown now, not weaker (docs/rooms.md §7).
        var unknown = false
    }

    private let selfSince: Int64
    /// Ids by gateway index, in registration order (index 0 is this gateway). Reserved for
    /// `gateways` at init; an id up to 15 bytes is stored inline, a longer one allocates once,
    /// when its gateway registers (status messages, never per sighting).
    private var ids: [String]
    private var gateways: [Gateway]
    private var devices: [Device]
    /// Free device entries (a stack of indices into `devices`).
    private var free: [Int32]
    private(set) var index: SlotIndex
    /// `capacity × gateways` cells: the row of device entry d starts at d × config.gateways.
    private var cells: [Cell]
    /// Which cells hold a sighting that heard the device (`arrived` set), a bit per gateway,
    /// `words` words per device entry; and which gateways are online. The rule walks the set
    /// bits of both, the gateways that hear a device, not every gateway of the building: at
    /// 50 rooms a device is heard by a third of them, and the walk over all was a third of a
    /// gateway's profile (docs/performance.md "Rooms").
    private var live: [UInt64]
    private var onlineBits: [UInt64]
    private let words: Int
    private var clock = MonotonicClamp()
    /// Each device entry's next deadline: the earliest instant time alone could change its
    /// owner (docs on `nextDeadline`). A tick runs the rule for the entries due, not for all.
    private var deadlines: DeadlineQueue
    /// Until then, an owner not heard from since the last `rejoin` is unknown, not gone.
    private var rejoinUntil: Instant?
    /// The last `rejoin` (or `leave`): a status `offline` from before it is old news too.
    private var rejoinedAt: Instant?
    /// Between `leave` and `rejoin`: this gateway has no broker, so it hears nothing new.
    private var away = false
    /// Set by `dropped`: the broker gave this gateway up while it was away, so at the next
    /// `rejoin` what it owns is held back until the broker says who holds it (§7 rule 4).
    private var givenUp = false

    /// `selfID` is this gateway's id, `selfSince` its run's start (unix ms, the `since` of its
    /// own sightings). Allocates every table once. Capacities outside 1…2²⁴ (devices) and
    /// 1…4096 (gateways) are the caller's bug: the config loader refuses them first.
    public init(config: RoomsConfig, selfID: String, selfSince: Int64) {
        precondition(config.capacity >= 1 && config.capacity <= TableLimits.maxCapacity,
                     "rooms.capacity \(config.capacity) outside 1...\(TableLimits.maxCapacity): the config loader checks it")
        precondition(config.gateways >= 1 && config.gateways <= Self.maxGateways,
                     "rooms.gateways \(config.gateways) outside 1...\(Self.maxGateways): the config loader checks it")
        let (cellCount, overflow) = config.capacity.multipliedReportingOverflow(by: config.gateways)
        precondition(!overflow, "rooms.capacity × rooms.gateways overflows")
        self.config = config
        self.fresh = config.sightingFresh.nanoseconds
        self.forget = config.forgetAfter.nanoseconds
        self.settle = config.settle.nanoseconds
        self.dwell = config.dwell.nanoseconds
        // At least 1 dB × dwell: with `margin: 0` a lead of nothing banks nothing.
        let needed = Int64(max(1, config.margin)).multipliedReportingOverflow(by: config.dwell.nanoseconds)
        self.winning = needed.overflow ? .max : needed.partialValue
        let walk = Int64(max(1, config.margin)).multipliedReportingOverflow(by: config.walkDwell.nanoseconds)
        self.walkWinning = min(self.winning, walk.overflow ? .max : walk.partialValue)
        self.walkWindow = config.walkWindow.nanoseconds
        self.calm = config.calm.nanoseconds
        self.calmPerContest = config.calmPerContest.nanoseconds
        self.selfSince = selfSince
        ids = []
        ids.reserveCapacity(config.gateways)
        gateways = []
        gateways.reserveCapacity(config.gateways)
        devices = Array(repeating: Device(), count: config.capacity)
        free = []
        free.reserveCapacity(config.capacity)
        // Popped from the end: entry 0 is handed out first.
        for i in stride(from: config.capacity - 1, through: 0, by: -1) { free.append(Int32(i)) }
        index = SlotIndex(maxKeys: config.capacity)
        deadlines = DeadlineQueue(capacity: config.capacity)
        cells = Array(repeating: Cell(), count: cellCount)
        words = (config.gateways + 63) / 64
        live = Array(repeating: 0, count: config.capacity * words)
        onlineBits = Array(repeating: 0, count: words)
        ids.append(selfID)
        gateways.append(Gateway())
    }

    /// The most gateways a building may configure (ranks are recomputed by pairwise comparison
    /// when one registers, so the registry stays small).
    public static let maxGateways = 4096

    /// This gateway.
    public var selfSlot: GatewaySlot { GatewaySlot(index: 0) }
    /// Devices tracked.
    public var count: Int { config.capacity - free.count }
    public var capacity: Int { config.capacity }
    /// Gateways registered (this one included).
    public var gatewayCount: Int { ids.count }

    /// A retained status arrived on `<prefix>/gateways/<id>/status` (`online` or anything
    /// else = offline). Going offline hands its devices over at once (reason `.takeover`).
    /// Returns false when the registry is full (counted as `gatewaysFull`).
    ///
    /// Only an `online` status registers an unknown id: an unknown gateway that is offline
    /// owns nothing and sends nothing that counts, and the retained `offline` of a gateway
    /// taken out of service long ago must not use up a slot.
    @discardableResult
    public mutating func status(gateway id: Substring, online: Bool, now: Instant,
                                _ onChange: (OwnershipChange) -> Void) -> Bool {
        let now = clock.clamp(now)
        guard let g = find(id) else {
            guard online else { return true }
            guard ids.count < config.gateways else {
                counters.gatewaysFull &+= 1
                return false
            }
            // A first `online` is not a return: the `returned` rule needs the `offline` before
            // it seen, as every gateway that was there saw it (docs/rooms.md §7).
            register(id)
            setOnline(ids.count - 1, true)
            return true
        }
        guard gateways[g].online != online else {
            // An `offline` of a gateway not yet seen online (this gateway's own, from its
            // previous run, at start) still makes its next `online` a return.
            if !online && gateways[g].offlineSince == nil { gateways[g].offlineSince = now }
            return true
        }
        setOnline(g, online)
        if !online {
            gateways[g].offlineSince = now
        } else if gateways[g].offlineSince != nil {
            gateways[g].onlineSince = now
        }
        // Coming online moves nothing: the gateway's sightings decide once they arrive.
        guard !online else { return true }
        // Its sightings from before no longer count, now or when it returns (rooms.md §4).
        let width = config.gateways
        for d in 0 ..< config.capacity where devices[d].inUse {
            cells[d * width + g].arrived = nil
            setLive(d, g, false)
        }
        for d in 0 ..< config.capacity where devices[d].inUse
            && (devices[d].owner == Int32(g) || devices[d].challenger == Int32(g)) {
            deadlines.set(d, evaluate(d, now: now, onChange))
        }
        return true
    }

    /// A sighting from `gateway` of `device`. Returns why it was dropped, or nil when accepted.
    /// A dropped sighting changes nothing at all. Allocates nothing.
    /// `publisher`: the gateway whose activity message the broker holds for a device, asked
    /// only when the device is not followed yet (reason `published`).
    public mutating func sighting(_ s: Sighting, gateway: Substring, device: UInt64, now: Instant,
                                  publisher: (UInt64) -> GatewaySlot? = { _ in nil },
                                  _ onChange: (OwnershipChange) -> Void) -> SightingDrop? {
        let now = clock.clamp(now)
        switch take(s, from: find(gateway), device: device, now: now, publisher: publisher, onChange) {
        case .dropped(let reason): return reason
        case .accepted, .ignored: return nil
        }
    }

    /// A batch of sightings from `gateway` (docs/protocol.md §6, docs/rooms.md §8): record i is
    /// taken in as the sighting (rssi, since, n + i) of its device, in order, under exactly the
    /// rule `sighting` applies to one, so a batch and the same sightings sent one by one leave
    /// the same state and report the same changes. The sender is looked up once. Allocates
    /// nothing.
    /// `buildingWide`: it came on the building-wide channel, whose order is checked apart.
    /// `ignoreNew`: a device the rule does not follow yet and for which it returns true is not
    /// taken up (the record is accepted, its place in the sender's order kept, and counted in
    /// `ignored`): the gateway passes "neither heard nor owned here" with neighbourhoods
    /// (docs/rooms.md §8.2: it needs nothing about those). A full table frees the entry of
    /// such a device, one this gateway does not own, to follow one it needs (`unfollowed`).
    /// `publisher`: as for `sighting`.
    public mutating func batch(_ b: SightingBatch, gateway: Substring, now: Instant, buildingWide: Bool = false,
                               ignoreNew: (UInt64) -> Bool = { _ in false },
                               publisher: (UInt64) -> GatewaySlot? = { _ in nil },
                               _ onChange: (OwnershipChange) -> Void) -> BatchOutcome {
        let now = clock.clamp(now)
        let g = find(gateway)
        var outcome = BatchOutcome()
        for i in 0 ..< b.count {
            let record = b[i]
            let s = Sighting(rssi: record.rssi, since: b.since, n: b.n &+ UInt64(i))
            switch take(s, from: g, device: record.device, now: now, buildingWide: buildingWide,
                        ignoreNew: ignoreNew, publisher: publisher, onChange) {
            case .dropped(let reason): outcome.count(reason)
            case .accepted: outcome.accepted &+= 1
            case .ignored: outcome.accepted &+= 1; outcome.ignored &+= 1
            }
        }
        return outcome
    }

    /// What became of one sighting taken in.
    enum Taken {
        case accepted
        /// Accepted, about a device not followed and not to be (`batch`'s `ignoreNew`).
        case ignored
        case dropped(SightingDrop)
    }

    /// `sighting`'s rule, with the sender already looked up (nil: not registered).
    private mutating func take(_ s: Sighting, from sender: Int?, device: UInt64, now: Instant,
                               buildingWide: Bool = false, ignoreNew: (UInt64) -> Bool = { _ in false },
                               publisher: (UInt64) -> GatewaySlot?, _ onChange: (OwnershipChange) -> Void) -> Taken {
        guard let g = sender, gateways[g].online else { return .dropped(drop(.unknownGateway)) }
        if g == 0 && s.since != selfSince { return .dropped(drop(.impostor)) }
        let sequence = buildingWide ? gateways[g].buildingSequence : gateways[g].sequence
        guard sequence.admits(s) else { return .dropped(drop(.replayed)) }
        var entry = index.find(device).map { Int($0) }
        let ignore = entry == nil && ignoreNew(device)
        if entry == nil && s.rssi != nil && free.isEmpty && !ignore && !reclaim(unneeded: ignoreNew) {
            return .dropped(drop(.devicesFull))
        }

        let taken = Sequence(accepted: true, since: s.since, n: s.n)
        if buildingWide { gateways[g].buildingSequence = taken } else { gateways[g].sequence = taken }
        counters.sightingsAccepted &+= 1
        if entry == nil {
            // A device nobody tracks is not created by "no longer heard".
            guard s.rssi != nil, !ignore else { return ignore ? .ignored : .accepted }
            entry = insert(device, now: now)
            // Proof: set just above.
            takePublisher(entry!, publisher(device), now: now, onChange)
        }
        // Proof: set just above, or found in the index.
        let d = entry!
        let cell = d * config.gateways + g
        if let rssi = s.rssi {
            cells[cell] = Cell(arrived: now, rssi: rssi)
            setLive(d, g, true)
            devices[d].lastSighted = now
        } else {
            cells[cell].arrived = nil
            cells[cell].unknown = false
            setLive(d, g, false)
        }
        noteContest(d, from: g, now: now)
        // Most sightings are the heartbeats of rooms that neither own the device nor challenge
        // its owner: they cannot change what the rule decides, so it is not run for them.
        guard evaluatesEverySighting || !cannotMatter(d, from: g, rssi: s.rssi, now: now) else { return .accepted }
        // A sighting mostly moves the device's next deadline later (a candidate's freshness);
        // the entry queued earlier then fires, finds nothing and queues the exact one. Moving
        // it at every record was a tenth of the rule's time at 50 rooms.
        if let next = evaluate(d, now: now, onChange) { deadlines.lower(d, next) } else { deadlines.remove(d) }
        return .accepted
    }

    /// A full device table makes room for a device the caller needs (docs/rooms.md §3
    /// "Accepting a sighting", §8.2): it frees the entry of a device this gateway does not own
    /// and `unneeded` says it neither hears nor owns, looking at most `reclaimLook` entries on
    /// from where the last look stopped (a clock hand: bounded work per sighting, every entry
    /// looked at in turn). Such a device's evidence is what the rule needs nothing of here; the
    /// gateways that hear it keep following it. Counted in `unfollowed`. Allocates nothing.
    private mutating func reclaim(unneeded: (UInt64) -> Bool) -> Bool {
        for _ in 0 ..< min(Self.reclaimLook, config.capacity) {
            let d = reclaimHand
            reclaimHand = reclaimHand + 1 == config.capacity ? 0 : reclaimHand + 1
            guard devices[d].inUse, devices[d].owner != 0, unneeded(devices[d].device) else { continue }
            remove(d)
            counters.unfollowed &+= 1
            return true
        }
        return false
    }

    /// Entries a full table looks at for one to free: enough that a table mostly of devices
    /// this gateway needs still finds the others within a few sightings, few enough that a
    /// table wholly of needed devices costs little per sighting it must drop.
    static let reclaimLook = 32
    private var reclaimHand = 0

    /// A device entry just made, whose activity the broker holds as published by `slot`
    /// (docs/rooms.md §3 "A device another room holds"): that gateway owns it in its own view,
    /// where a room starting to hear the device needs `margin` and `dwell` to take it. So this
    /// view takes the same owner at once (reason `published`), its sighting unknown until it
    /// arrives. Settling instead gave the device to this room whenever the owner's heartbeat
    /// (every `sightingInterval`) came later than `settle`: this room published, the owner
    /// published over it and this room gave way, a move and a move back in Home Assistant
    /// (about 250 a gateway in 80 s at 3,000 devices, issue 30). The owner is presumed there
    /// for one heartbeat and a settle; still silent then, it is taken over as a silent owner is.
    private mutating func takePublisher(_ d: Int, _ slot: GatewaySlot?, now: Instant,
                                        _ onChange: (OwnershipChange) -> Void) {
        guard let slot, slot.index != 0, slot.index < gateways.count, gateways[slot.index].online else { return }
        devices[d].owner = Int32(slot.index)
        devices[d].presumedUntil = now + config.sightingInterval + config.settle
        cells[d * config.gateways + slot.index].unknown = true
        report(OwnershipChange(device: devices[d].device, from: nil, to: slot, reason: .published), onChange)
    }

    /// Whether a sighting of entry `d` by room `g`, just taken in, cannot change what `evaluate`
    /// would decide now (docs/rooms.md §3 "Evaluating a device"): the device has an owner whose
    /// sighting is fresh, and `g` is neither that owner nor its challenger and is not `margin`
    /// louder than the owner (or no longer hears the device). Then the owner stays, no
    /// challenge starts or ends because of it, and the device's queued deadline
    /// (at the latest the owner's sighting going stale) comes before `g`'s. At 50 rooms
    /// evaluating every sighting, walking every candidate, was a sixth of a gateway's time.
    func cannotMatter(_ d: Int, from g: Int, rssi: Int8?, now: Instant) -> Bool {
        let owner = Int(devices[d].owner)
        guard owner >= 0, g != owner, devices[d].challenger != Int32(g), gateways[owner].online else { return false }
        let ownerCell = cells[d * config.gateways + owner]
        guard let arrived = ownerCell.arrived, now < arrived.after(fresh) else { return false }
        guard let rssi else { return true }
        // Int: rssi + margin can pass Int8's range.
        return Int(rssi) < Int(ownerCell.rssi) + config.margin
    }

    /// A sighting from `g` just stored: another room within `margin` of the owner (this one,
    /// or, when the owner speaks, the best of the others) is a contest (`Device.contest`). Run
    /// for every sighting, evaluated or not, so skipping the rule changes nothing.
    private mutating func noteContest(_ d: Int, from g: Int, now: Instant) {
        let owner = Int(devices[d].owner)
        guard owner >= 0 else { return }
        let row = d * config.gateways
        guard let arrived = cells[row + owner].arrived, now < arrived.after(fresh) else { return }
        // Int: rssi − margin can pass Int8's range.
        let floor = Int(cells[row + owner].rssi) - config.margin
        var near = false
        if g != owner {
            near = cells[row + g].arrived != nil && Int(cells[row + g].rssi) >= floor
        } else {
            let c = candidates(d, owner: owner, now: now)
            near = c.rival >= 0 && Int(c.rivalRSSI) >= floor
        }
        if near { devices[d].contest(now: now, calm: calm, perContest: calmPerContest, window: walkWindow) }
    }

    /// This gateway (re)connected to the broker (docs/rooms.md §7). Whatever it knew of every
    /// gateway's sightings, its own included, is from before: the broker may have restarted,
    /// or this gateway may have been frozen while the building moved on. So every earlier
    /// sighting becomes unknown (not weaker), and for one `sightingInterval` (a heartbeat: every
    /// gateway that is there and hears a device has said so by then) a device whose owner has
    /// said nothing of it since is not taken over. After that the rule runs as always: an
    /// owner still silent is gone, and the best gateway hearing its devices takes them.
    public mutating func rejoin(now: Instant) {
        let now = clock.clamp(now)
        forgetEvidence()
        away = false
        rejoinedAt = now
        let until = now + config.sightingInterval
        rejoinUntil = until
        // When the window closes, an owner still silent is gone: every device is due then.
        for d in 0 ..< config.capacity where devices[d].inUse { deadlines.lower(d, until) }
        // Given up by the broker (`dropped`): every other gateway saw this one's will and the
        // best of them stand in for what it owned. It holds each back as a stand-in holds a
        // device (not republished at connect, published when the window closes if still its
        // own) until the broker's retained activity names the gateway holding it (`announced`).
        if givenUp {
            givenUp = false
            for d in 0 ..< config.capacity where devices[d].inUse && devices[d].owner == 0 { devices[d].standInFor = 0 }
        }
    }

    /// The broker gave this gateway up (docs/rooms.md §7 rule 4): its loop stood still longer
    /// than the broker waits for a keepalive (1.5 × keepalive, MQTT 5.0 §3.1.2.10), a frozen
    /// or starved machine, so its will `offline` has gone out and the building has moved its
    /// devices to the rooms standing in for it. It `leave`s at once, before taking in the
    /// backlog the stall left (old sightings and reports, all stamped now), and at the next
    /// `rejoin` it does not claim what it owned before the broker has said who holds it.
    public mutating func dropped(now: Instant) {
        leave(now: now)
        givenUp = true
    }

    /// The broker holds `device`'s activity as published by `gateway` (its retained message,
    /// or a live one). For a device this gateway holds back after being given up (`dropped`),
    /// that is the building's decision while it was away: `gateway` took the device over from
    /// this one, so it owns it now in this view too (reason `yielded`), standing in for this
    /// gateway, and the rule goes on from there: this room takes it back at once if it hears
    /// it `margin` better (`returned`), as every other view decides. Returns true on a change.
    @discardableResult
    public mutating func announced(_ device: UInt64, by gateway: GatewaySlot, now: Instant,
                                   _ onChange: (OwnershipChange) -> Void) -> Bool {
        let now = clock.clamp(now)
        guard gateway.index != 0, gateway.index < gateways.count, gateways[gateway.index].online,
              let found = index.find(device) else { return false }
        let d = Int(found)
        guard devices[d].owner == 0, devices[d].standInFor == 0 else { return false }
        devices[d].owner = Int32(gateway.index)
        devices[d].clearChallenge()
        report(OwnershipChange(device: device, from: selfSlot, to: gateway, reason: .yielded), onChange)
        if let next = evaluate(d, now: now, onChange) { deadlines.lower(d, next) }
        return true
    }

    /// This gateway lost the broker (docs/rooms.md §7 rule 1). Until it rejoins no sighting
    /// reaches it, its own included, so every sighting it holds going stale says nothing of
    /// the devices: it is the outage's. Left to the clock, the owner's last heartbeat lapsing
    /// before another's handed the device over in this view only, while a gateway that had
    /// rejoined already kept the owner (issue 36: two views naming each other as the owner, and
    /// neither publishing). So the evidence is unknown from now on, as at `rejoin`, and the
    /// window stays open until then: nothing is taken over, settled or moved by a dwell while
    /// away. Forgetting still runs. Idempotent: every failed reconnect says it again.
    public mutating func leave(now: Instant) {
        guard !away else { return }
        let now = clock.clamp(now)
        forgetEvidence()
        away = true
        rejoinedAt = now
        rejoinUntil = nil
    }

    /// Every sighting held becomes unknown, not weaker (docs/rooms.md §7 rule 1), and no
    /// challenge stands.
    private mutating func forgetEvidence() {
        for d in 0 ..< config.capacity where devices[d].inUse {
            let row = d * config.gateways
            for g in 0 ..< config.gateways { cells[row + g] = Cell(arrived: nil, rssi: 0, unknown: true) }
            for w in 0 ..< words { live[d * words + w] = 0 }
            devices[d].clearChallenge()
        }
    }

    /// True while this gateway is away from the broker (`leave`), and then while `rejoin`'s
    /// window is open.
    public func isRejoining(now: Instant) -> Bool { away || (rejoinUntil.map { now < $0 } ?? false) }

    /// This gateway owns `device`, and so does `gateway` by its own view (its retained message
    /// says so): views that parted in a fault. The one that ranks higher on the sightings both
    /// hold keeps it, at both (docs/rooms.md §7 rule 3): if `gateway` is online, is a candidate
    /// and ranks above this one (or this one is no candidate), this one gives way (reason
    /// `yielded`) and returns true; otherwise it keeps the device and returns false.
    @discardableResult
    public mutating func yield(_ device: UInt64, to gateway: Substring, now: Instant,
                               _ onChange: (OwnershipChange) -> Void) -> Bool {
        let now = clock.clamp(now)
        guard let found = index.find(device), let g = find(gateway), g != 0, gateways[g].online else { return false }
        let d = Int(found)
        guard devices[d].owner == 0 else { return false }
        let row = d * config.gateways
        func fresh(_ k: Int) -> Int8? {
            guard let arrived = cells[row + k].arrived, now < arrived.after(self.fresh) else { return nil }
            return cells[row + k].rssi
        }
        guard let theirs = fresh(g) else { return false }
        if let mine = fresh(0), !beats(g, theirs, 0, mine) { return false }
        devices[d].owner = Int32(g)
        devices[d].clearChallenge()
        devices[d].standInFor = -1
        report(OwnershipChange(device: devices[d].device, from: selfSlot, to: GatewaySlot(index: g), reason: .yielded),
               onChange)
        return true
    }

    /// When a registered gateway's status last turned offline; nil while online or unknown.
    public func offlineSince(gateway id: Substring) -> Instant? {
        guard let g = find(id), !gateways[g].online else { return nil }
        return gateways[g].offlineSince
    }

    /// Runs the rule for what time alone decides (settle, dwell, freshness, forgetting), for
    /// the device entries that are due, earliest first (equal deadlines in entry order), each
    /// then queued at its own next deadline. O(log capacity) per entry due, allocating nothing.
    public mutating func tick(now: Instant, _ onChange: (OwnershipChange) -> Void) {
        let now = clock.clamp(now)
        // Terminates: `evaluate` returns only instants after `now`.
        while let d = deadlines.popDue(now) {
            guard devices[d].inUse else { continue }
            deadlines.set(d, evaluate(d, now: now, onChange))
        }
    }

    /// The earliest instant `tick` could change something; nil when nothing is pending. O(1):
    /// kept by `sighting`, `status`, `rejoin` and `tick`. It may be earlier than needed (a
    /// tick then changes nothing and moves it on), never later.
    public var nextDeadline: Instant? { deadlines.next }

    public func owner(of device: UInt64) -> GatewaySlot? {
        guard let d = index.find(device), devices[Int(d)].owner >= 0 else { return nil }
        return GatewaySlot(index: Int(devices[Int(d)].owner))
    }

    /// True when some gateway's sighting of the device is being followed (owned or settling).
    public func follows(_ device: UInt64) -> Bool { index.find(device) != nil }

    /// True when this gateway owns the device.
    public func owns(_ device: UInt64) -> Bool { owner(of: device) == selfSlot }

    /// Whether this gateway's sighting of `device` at `rssi` (dBm) cannot matter to the rule
    /// now (docs/rooms.md §8.4): `reach` is on, this gateway does not own the device, and
    /// another online gateway's fresh sighting is more than `reach` dB stronger. It would win
    /// only if every gateway within reach went quiet, and then it is within reach of the
    /// best left. O(gateways that hear the device); allocates nothing.
    public func outOfReach(_ device: UInt64, rssi: Int, now: Instant) -> Bool {
        guard config.reach > 0, let found = index.find(device) else { return false }
        let d = Int(found)
        guard devices[d].owner != 0 else { return false }
        // With this gateway as the "owner", the rival is the best of the others.
        let c = candidates(d, owner: 0, now: now)
        return c.rival >= 0 && rssi < Int(c.rivalRSSI) - config.reach
    }

    /// True when this gateway owns the device because it took it over from another gateway
    /// (reason `takeover`), rather than by settling on it or being stronger: it stands in
    /// for a room that went offline or stopped hearing it (docs/rooms.md §7).
    public func standsIn(for device: UInt64) -> Bool {
        guard let d = index.find(device) else { return false }
        return devices[Int(d)].owner == 0 && devices[Int(d)].standInFor >= 0
    }

    /// The rejoin window closed and what was held back and is still this gateway's has been
    /// published (`Gateway.republishStandIns`): the hold ends, so the next connect republishes
    /// those devices at once, as every other device it owns.
    public mutating func endHoldBack() {
        for d in 0 ..< config.capacity where devices[d].inUse && devices[d].owner == 0 && devices[d].standInFor == 0 {
            devices[d].standInFor = -1
        }
    }

    /// True while this gateway holds `device` back after the broker gave it up (`dropped`):
    /// it owns the device in its view but does not speak for it, not even for a change its
    /// radio hears, until the broker names who holds it (`announced`) or the rejoin window
    /// closes (docs/rooms.md §7 rule 4).
    public func holdsBack(_ device: UInt64, now: Instant) -> Bool {
        guard let d = index.find(device) else { return false }
        return devices[Int(d)].owner == 0 && devices[Int(d)].standInFor == 0 && isRejoining(now: now)
    }

    public func id(of slot: GatewaySlot) -> String { ids[slot.index] }

    public func isOnline(_ slot: GatewaySlot) -> Bool { gateways[slot.index].online }
    /// True when a gateway of that id is registered and its status is `online`.
    public func isOnline(gateway id: Substring) -> Bool {
        guard let s = slot(of: id) else { return false }
        return gateways[s.index].online
    }

    /// The slot of a registered gateway id (byte-wise), nil when unknown.
    public func slot(of id: Substring) -> GatewaySlot? { find(id).map { GatewaySlot(index: $0) } }

    /// The online gateway whose id sorts first: the one that clears what nobody hears (docs/rooms.md §4).
    public var firstOnline: GatewaySlot? {
        var first: Int?
        for g in gateways.indices where gateways[g].online && (first.map { gateways[g].rank < gateways[$0].rank } ?? true) {
            first = g
        }
        return first.map { GatewaySlot(index: $0) }
    }

    /// The device's freshest sighting RSSI per gateway, for logs and tests: every online
    /// gateway whose last sighting heard it and arrived within `sightingFresh` (the
    /// candidates of docs/rooms.md §3), in registration order.
    public func sightings(of device: UInt64, now: Instant, _ body: (GatewaySlot, Int8) -> Void) {
        guard let d = index.find(device) else { return }
        let row = Int(d) * config.gateways
        for g in gateways.indices where gateways[g].online {
            guard let arrived = cells[row + g].arrived, now < arrived.after(fresh) else { continue }
            body(GatewaySlot(index: g), cells[row + g].rssi)
        }
    }

    // MARK: - The rule (docs/rooms.md §3)

    /// The candidates of one device at `now`: the best of all, the best other than the owner,
    /// the owner's RSSI if it is one, and the earliest instant one of them goes stale.
    private struct Candidates {
        var best = -1
        var bestRSSI: Int8 = 0
        var rival = -1
        var rivalRSSI: Int8 = 0
        var ownerRSSI: Int8?
        var earliestExpiry: Instant?
    }

    /// Rank: higher RSSI first; equal RSSI, the id that sorts first byte-wise.
    private func beats(_ g: Int, _ rssi: Int8, _ other: Int, _ otherRSSI: Int8) -> Bool {
        other < 0 || rssi > otherRSSI || (rssi == otherRSSI && gateways[g].rank < gateways[other].rank)
    }

    private func candidates(_ d: Int, owner: Int, now: Instant) -> Candidates {
        var c = Candidates()
        let row = d * config.gateways
        // The order does not matter: `beats` ranks by RSSI, then by id.
        for w in 0 ..< words {
            var bits = live[d * words + w] & onlineBits[w]
            while bits != 0 {
                let g = w * 64 + bits.trailingZeroBitCount
                bits &= bits &- 1
                // A candidate: online, its last sighting heard the device (a live bit) and
                // arrived within sightingFresh. Stale at exactly arrived + sightingFresh.
                guard let arrived = cells[row + g].arrived else { continue }
                let expiry = arrived.after(fresh)
                guard now < expiry else { continue }
                let rssi = cells[row + g].rssi
                c.earliestExpiry = min(c.earliestExpiry ?? expiry, expiry)
                if beats(g, rssi, c.best, c.bestRSSI) { c.best = g; c.bestRSSI = rssi }
                if g == owner {
                    c.ownerRSSI = rssi
                } else if beats(g, rssi, c.rival, c.rivalRSSI) {
                    c.rival = g; c.rivalRSSI = rssi
                }
            }
        }
        return c
    }

    /// Applies the rule to entry `d` at `now`. Returns the entry's next deadline (nil when it
    /// was forgotten or nothing is pending).
    private mutating func evaluate(_ d: Int, now: Instant, _ onChange: (OwnershipChange) -> Void) -> Instant? {
        var e = devices[d]
        // Proof: an entry in use was created by a non-nil sighting, which set both instants.
        let firstSighted = e.firstSighted!, lastSighted = e.lastSighted!
        let c = candidates(d, owner: Int(e.owner), now: now)

        if c.best < 0 && now >= lastSighted.after(forget) {
            remove(d)
            counters.forgotten &+= 1
            if e.owner >= 0 {
                report(OwnershipChange(device: e.device, from: GatewaySlot(index: Int(e.owner)), to: nil,
                                       reason: .forgotten), onChange)
            }
            return nil
        }

        let from = e.owner
        var reason: OwnershipReason?
        if e.owner < 0 {
            if c.best >= 0 && now >= firstSighted.after(settle) {
                e.owner = Int32(c.best)
                reason = .settled
            }
        } else if let ownerRSSI = c.ownerRSSI {
            // The evidence so far: the lead that held since the last look, over the time since
            // (the cells change only at a sighting or a lapse, and both evaluate).
            e.accrue(now: now)
            // Int: rssi + margin can pass Int8's range.
            let lead = c.rival >= 0 ? Int(c.rivalRSSI) - Int(ownerRSSI) : 0
            // A walk's challenger that dips below the margin but still leads keeps what it
            // banked and goes on banking its smaller lead (docs/rooms.md §3 "A walk and a
            // border"): fading takes a walk's lead of 6–9 dB under the margin every few
            // reports, and starting over each time made the walks' tail (p99 5.5 s, 4.0 s so).
            // Only a walk: a border's challenges keep the unbroken dwell that holds it still.
            let dips = e.walking && e.challenger >= 0 && e.challenger == Int32(c.rival)
                && lead > 0 && lead < config.margin && now.nanoseconds <= e.walkUntil
            if c.rival < 0 || e.challenger != Int32(c.rival) || (lead < config.margin && !dips) {
                // A break in the lead, or a new challenger: it starts from nothing.
                e.clearChallenge()
            }
            if dips {
                e.evidenceAt = now
                e.lead = Int32(lead)
            } else if c.rival >= 0 && lead >= config.margin {
                // A walk weighs its whole lead; any other challenge counts at most `margin`, so
                // it wins after `dwell` whatever its lead (docs/rooms.md §3 "A walk and a border").
                if e.challenger < 0 { e.walking = now.nanoseconds <= e.walkUntil }
                e.challenger = Int32(c.rival)
                e.evidenceAt = now
                e.lead = Int32(clamping: e.walking ? lead : min(lead, max(1, config.margin)))
            }
            // With `dwell: 0` nothing is weighed: a lead of `margin` wins at once, as it always did.
            let needed = e.walking ? walkWinning : winning
            let won = needed > 0 ? e.evidence >= needed : lead >= config.margin
            if e.challenger >= 0 && won {
                e.owner = e.challenger
                reason = .stronger
            } else if c.rival >= 0 && lead >= config.margin,
                      let back = gateways[c.rival].onlineSince, now.nanoseconds &- back.nanoseconds < dwell {
                e.owner = Int32(c.rival)
                reason = .returned
            } else if c.rival >= 0 && lead >= config.margin && e.standInFor == Int32(c.rival) {
                // The room this one stood in for hears the device clearly better again:
                // its absence (its evidence unknown when a rejoin window closed, its
                // sightings stale) was not the device leaving it.
                e.owner = Int32(c.rival)
                reason = .returned
            }
        } else if c.best >= 0 {
            // An owner not heard from since this gateway rejoined is unknown, not gone: it
            // keeps the device until the window closes (docs/rooms.md §7). So is one whose
            // `offline` came before the rejoin: a broker that shuts down delivers every
            // client's will on the way, and the gateway may be back already. An `offline`
            // since the rejoin is news: taken over at once.
            let g = gateways[Int(e.owner)]
            let goneSinceRejoin = !g.online && (g.offlineSince.map { t in rejoinedAt.map { t >= $0 } ?? true } ?? true)
            let unknown = cells[d * config.gateways + Int(e.owner)].unknown
            // Taken from its activity message (`published`): there until its heartbeat is due.
            let presumed = unknown && g.online && e.presumedUntil.map { now < $0 } == true
            if !(isRejoining(now: now) && unknown && !goneSinceRejoin) && !presumed {
                e.owner = Int32(c.best)
                reason = .takeover
            }
        }
        if reason != nil {
            e.clearChallenge()
            // A room taken from another: the walk that brought it is spent, and its calm starts
            // now. A first owner (`settled`) took it from nobody: a room that comes close is a
            // contest like any other (the settle's calm, tried, made the 10/s walks' p99 4.56 s,
            // beyond the 3.46–4.00 s of four runs without it: docs/rooms.md §3, the table of
            // rules tried).
            if reason != .settled {
                e.walkUntil = .min
                e.calmAt = now.nanoseconds &+ calm
            }
            e.standInFor = reason == .takeover ? from : -1
            e.presumedUntil = nil
        }
        devices[d] = e
        if let reason {
            if reason == .takeover { counters.takeovers &+= 1 }
            report(OwnershipChange(device: e.device, from: from < 0 ? nil : GatewaySlot(index: Int(from)),
                                   to: GatewaySlot(index: Int(e.owner)), reason: reason), onChange)
        }

        // What time alone can change next: a candidate going stale (it may be the owner, the
        // best or the challenger), the settle, the dwell, forgetting. Only future instants.
        var next = c.earliestExpiry
        func consider(_ t: Instant) { if t > now { next = min(next ?? t, t) } }
        if e.owner < 0 { consider(firstSighted.after(settle)) }
        if let at = e.evidenceAt, e.lead > 0 {
            // When the evidence reaches `winning` at the lead that holds now (rounded up).
            let rate = Int64(e.lead)
            let left = (e.walking ? walkWinning : winning) - e.evidence
            consider(Instant(nanoseconds: at.nanoseconds &+ (left + rate - 1) / rate))
        }
        if e.owner >= 0, let until = rejoinUntil { consider(until) }
        if e.owner >= 0, let until = e.presumedUntil { consider(until) }
        consider(lastSighted.after(forget))
        return next
    }

    private mutating func report(_ change: OwnershipChange, _ onChange: (OwnershipChange) -> Void) {
        counters.changes &+= 1
        onChange(change)
    }

    // MARK: - Storage

    private mutating func setOnline(_ g: Int, _ online: Bool) {
        gateways[g].online = online
        let bit = UInt64(1) << UInt64(g % 64)
        if online { onlineBits[g / 64] |= bit } else { onlineBits[g / 64] &= ~bit }
    }

    private mutating func setLive(_ d: Int, _ g: Int, _ heard: Bool) {
        let bit = UInt64(1) << UInt64(g % 64)
        if heard { live[d * words + g / 64] |= bit } else { live[d * words + g / 64] &= ~bit }
    }

    private mutating func drop(_ reason: SightingDrop) -> SightingDrop {
        switch reason {
        case .unknownGateway: counters.unknownGateway &+= 1
        case .replayed: counters.replayed &+= 1
        case .impostor: counters.impostor &+= 1
        case .devicesFull: counters.devicesFull &+= 1
        case .gatewaysFull: counters.gatewaysFull &+= 1
        }
        return reason
    }

    /// Ids compare byte-wise (UTF-8), not by Unicode canonical equivalence as `String ==` does:
    /// two gateways whose ids differ in bytes are two gateways, on every machine alike.
    func find(_ id: Substring) -> Int? {
        for g in ids.indices where ids[g].utf8.elementsEqual(id.utf8) { return g }
        return nil
    }

    private mutating func register(_ id: Substring) {
        precondition(ids.count < config.gateways, "register into a full registry: the caller checks")
        ids.append(String(id))
        gateways.append(Gateway())
        // Re-rank: each id's rank is the number of ids sorting before it (ids are distinct).
        for g in ids.indices {
            var rank = 0
            for other in ids.indices where ids[other].utf8.lexicographicallyPrecedes(ids[g].utf8) { rank += 1 }
            gateways[g].rank = rank
        }
    }

    private mutating func insert(_ device: UInt64, now: Instant) -> Int {
        // Proof: the caller checked that a free entry exists.
        let d = Int(free.removeLast())
        devices[d] = Device(inUse: true, device: device, firstSighted: now, lastSighted: now)
        let row = d * config.gateways
        for g in 0 ..< config.gateways { cells[row + g] = Cell() }
        for w in 0 ..< words { live[d * words + w] = 0 }
        index.insert(device, slot: Int32(d))
        return d
    }

    private mutating func remove(_ d: Int) {
        deadlines.remove(d)
        index.remove(devices[d].device)
        devices[d] = Device()
        free.append(Int32(d))
    }
}
