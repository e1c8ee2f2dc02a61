// A building of simulated rooms following a scenario (docs/simulator.md "Scenarios").
//
// `ScenarioPlayer` runs the scenario in simulated time: who advertises when (a binary heap of
// due times, one entry per device and one per wandering crowd device, allocated once), where
// each device is, and what each room makes of each report under the RSSI model. It knows no
// sockets and no clock, so tests drive it directly and the same seed always gives the same
// reports. `Building` gives every room a Unix socket and a `VirtualController`, maps real
// time to simulated time at the scenario's speed, and hands each heard report to its room's
// controller while that controller is scanning. Beside each room's controller socket is its
// link socket (DeviceLinks.swift), served by BatonDevice's `DeviceLinkServer` in the same poll
// loop.
import BatonLibc
import BatonDevice
import BatonHCI
import BatonKeys
import BatonWire
import CLibc

/// What became of the reports a room could have heard.
public struct RoomCounts: Sendable, Equatable {
    /// Heard: passed on to the room (delivered if its gateway scans).
    public var heard = 0
    /// Missed by the room's `loss`.
    public var lost = 0
    /// Weaker than `heard-down-to`.
    public var unheard = 0
    public init() {}
}

/// A scenario step as it happens (a script's, or a crowd device wandering).
public struct ScenarioEvent: Sendable, Equatable {
    /// Simulated microseconds from the start.
    public var time: Int64
    /// The device's index in the player (scripted devices first, then the crowd).
    public var device: Int
    public var deviceID: UInt64
    public var name: String
    public var action: Scenario.Action
    /// The beacon's sequence after the step.
    public var sequence: UInt16
}

public final class ScenarioPlayer {
    public let scenario: Scenario
    /// The end, in simulated microseconds.
    public let end: Int64
    /// Simulated microseconds from the start: how far `advance` has run.
    public private(set) var now: Int64 = 0
    public private(set) var counts: [RoomCounts]
    /// Reports sent by all devices (each may be heard in several rooms).
    public private(set) var reportsSent = 0

    struct Device {
        var id: UInt64
        var name: String
        var beacon: ActivityBeacon
        /// A random static address (Core 5.4, Vol 6, Part B, §1.3.2.1), fixed per device.
        var address: UInt64
        /// The advertisement, encoded again only when the beacon changes.
        var data: [UInt8]
        var x: Double
        var y: Double
        /// A walk under way (`radio.walk-speed`): from (fromX, fromY) at `walkStart` to
        /// (toX, toY) at `walkEnd`, simulated µs; walkEnd 0: standing.
        var fromX = 0.0, fromY = 0.0, toX = 0.0, toY = 0.0
        var walkStart: Int64 = 0, walkEnd: Int64 = 0
        /// The room a crowd device wanders from.
        var room: Int
        var silent = false
        /// The current activity type (become-current changes it) and what the payload says
        /// (docs/simulator.md "Device links").
        var type: String
        var title: String
        var webURL: Bool
        var payloadBytes: Int?
        /// Offers a device link: its beacon names a PSM (docs/protocol.md §2.1, §5).
        var link: Bool
        /// The sequence the current activity began at: a fetch for an older one is refused.
        var activityStart: UInt16 = 1
        /// A keyed group's sealer (docs/security.md §5): payloads leave sealed.
        var sealer: SealedEnvelope?
        /// A keyed group's tagger (§4): every advertisement carries the tag.
        var tagger: BeaconTagger?
        /// Makes the device's rotating ids (§3): under its identity key when it has an
        /// identity (§3.1), else under the beacon key. nil: an open group's fixed id.
        var idMaker: DeviceIDResolver?
        /// Whether `id` is an identity's (fixed) or the current rotating id.
        var hasIdentity = false
        /// Simulated µs between rotations (0: never), and the next one.
        var rotateEvery: Int64 = 0
        var rotateAt: Int64 = .max
        /// The address before the last rotation: still answers a link opened just before it.
        var previousAddress: UInt64?
        /// A BTHome sensor (`Scenario.bthome`): it sends `data` as it is, from `address` of
        /// `addressType`, and has no activity, id or link.
        var sensor = false
        var addressType: UInt8 = 1
    }

    var devices: [Device] = []
    /// Device index by activity-beacon device id, and by LE address (a link names the address).
    var indexByID: [UInt64: Int] = [:]
    var indexByAddress: [UInt64: Int] = [:]
    let roomX: [Double], roomY: [Double], roomNoise: [Double], roomLoss: [Double]
    let roomIndex: [String: Int]
    /// Mean RSSI of device d in room r at `d * rooms + r`: the model without noise, recomputed
    /// when d moves.
    var mean: [Double] = []
    let interval: Double
    let wander: Double
    let wanderers: Int
    /// `crowd.walk: next-door`: room r's next-door rooms are
    /// `nextDoor[nextDoorStart[r] ..< nextDoorStart[r + 1]]`; empty arrays for `anywhere`.
    let nextDoor: [Int]
    let nextDoorStart: [Int]

    /// When something is due: `key` is device × 2 (advertise) or device × 2 + 1 (wander).
    struct Due {
        var time: Int64
        var key: Int
        static func < (a: Due, b: Due) -> Bool { (a.time, a.key) < (b.time, b.key) }
    }
    var heap: [Due] = []
    struct ScriptStep {
        var time: Int64
        var device: Int
        var action: Scenario.Action
    }
    var steps: [ScriptStep] = []
    var nextStep = 0
    var rng: SplitMix64
    var spareGaussian: Double?
    /// Body shadowing (`radio.shadowing`) of device d in room r at `d * rooms + r`, dB, and when
    /// it was last drawn (simulated µs; −1: never). Empty without shadowing.
    var shadow: [Double] = []
    var shadowAt: [Int64] = []
    /// And how far the device had walked then (rooms); `walked` is each device's total so far.
    var shadowWalked: [Double] = []
    var walked: [Double] = []

    /// The group hash every simulated beacon carries (as the capture generator's).
    public static let groupHash: UInt32 = 0xA1B2_C3D4

    public init(_ scenario: Scenario) {
        self.scenario = scenario
        end = Self.micros(scenario.duration)
        let rooms = scenario.rooms
        precondition(!rooms.isEmpty, "a scenario has rooms (Scenario.parse checks)")
        roomX = rooms.map(\.x)
        roomY = rooms.map(\.y)
        roomNoise = rooms.map { $0.noise ?? scenario.radio.noise }
        roomLoss = rooms.map { $0.loss ?? scenario.radio.loss }
        roomIndex = Dictionary(uniqueKeysWithValues: rooms.enumerated().map { ($1.id, $0) })
        counts = Array(repeating: RoomCounts(), count: rooms.count)
        interval = 1_000_000 / scenario.rate
        wander = scenario.crowd?.wander ?? 0
        rng = SplitMix64(seed: scenario.seed)

        let crowdCount = scenario.crowd?.count ?? 0
        wanderers = wander > 0 && rooms.count > 1 ? crowdCount : 0
        (nextDoor, nextDoorStart) = scenario.crowd?.walk == .nextDoor ? Self.nextDoorRooms(rooms) : ([], [])
        devices.reserveCapacity(scenario.devices.count + crowdCount + scenario.bthome.count)
        for (i, d) in scenario.devices.enumerated() {
            var flags: BeaconFlags = []
            if d.streams { flags.insert(.supportsStreams) }
            if d.webURL { flags.insert(.hasWebURL) }
            add(id: d.id, name: d.name, type: d.type, flags: flags, index: i, room: 0, title: d.title ?? d.name,
                webURL: d.webURL, payloadBytes: d.payloadBytes, link: d.link)
            if let text = d.groupSecret {
                // Proof: Scenario.parse checked the text and derivation only fails if libcrypto does.
                guard let secret = try? GroupSecret(text: text), let keys = try? GroupKeys.derive(secret: secret),
                      let sealer = try? SealedEnvelope(key: keys.payloadKey),
                      let tagger = try? BeaconTagger(key: keys.beaconKey),
                      let irk = d.identity.map({ try? keys.beaconKey.identityKey(number: $0) }) ?? keys.beaconKey.withUnsafeBytes({ Array($0) }),
                      let idMaker = try? DeviceIDResolver(irk: irk) else {
                    preconditionFailure("a checked group secret derives its keys")
                }
                devices[i].sealer = sealer
                devices[i].tagger = tagger
                devices[i].idMaker = idMaker
                devices[i].beacon.groupHash = keys.groupHash
                if let n = d.identity {
                    devices[i].hasIdentity = true
                    devices[i].id = DeviceIdentity.id(groupHash: keys.groupHash, number: n)
                }
                // BLE privacy's default is 15 minutes (Core 5.4, Vol 3, Part C, Appendix A, TGAP(private_addr_int)).
                devices[i].rotateEvery = Self.micros(d.rotate ?? 900)
                rotate(i)
            }
            let (x, y) = position(d.place)
            devices[i].x = x
            devices[i].y = y
            if case .room(let r) = d.place, let index = roomIndex[r] { devices[i].room = index }
        }
        if let crowd = scenario.crowd {
            for k in 0..<crowd.count {
                let type = crowd.type ?? CaptureGenerator.activityTypes[k % CaptureGenerator.activityTypes.count]
                let room = Int(rng.next() % UInt64(rooms.count))
                // Proof: Scenario.parse keeps first-id + count - 1 within 48 bits.
                let name = "crowd-\(k)"
                add(id: crowd.firstID + UInt64(k), name: name, type: type, flags: [], index: devices.count, room: room,
                    title: crowd.title ?? name, webURL: false, payloadBytes: crowd.payloadBytes, link: crowd.link)
                devices[devices.count - 1].x = roomX[room]
                devices[devices.count - 1].y = roomY[room]
            }
        }
        // BTHome sensors last, so the crowd's indices (and every draw before these) are as
        // without them.
        for s in scenario.bthome {
            let (x, y) = position(s.place)
            var room = 0
            if case .room(let r) = s.place, let index = roomIndex[r] { room = index }
            // Random static unless given (Core 5.4, Vol 6, Part B, §1.3.2.1).
            let address = s.address ?? ((rng.next() & 0x3FFF_FFFF_FFFF) | 0xC000_0000_0000)
            let name = s.name ?? "bthome-" + hex12(address)
            devices.append(Device(id: address, name: name, beacon: ActivityBeacon(flags: [], sequence: 0, activityTypeHash: 0,
                                                                               groupHash: 0, deviceID: 0, psm: 0),
                                  address: address, data: s.advertisement, x: x, y: y, room: room, type: "", title: name,
                                  webURL: false, payloadBytes: nil, link: false, sensor: true,
                                  addressType: s.address == nil ? 1 : 0))
        }
        let total = devices.count
        indexByID.reserveCapacity(total)
        indexByAddress.reserveCapacity(total)
        for (i, d) in devices.enumerated() where !d.sensor {
            indexByID[d.id] = i
            // 46 random bits: two of 100000 devices share an address about once in 14000
            // scenarios (n² / 2⁴⁷); the first keeps it, the other is unreachable over a link.
            if indexByAddress[d.address] == nil { indexByAddress[d.address] = i }
        }
        mean = Array(repeating: 0, count: total * rooms.count)
        for d in 0..<total { placeMean(d) }
        if scenario.radio.shadowing > 0 {
            shadow = Array(repeating: 0, count: total * rooms.count)
            shadowAt = Array(repeating: -1, count: total * rooms.count)
            shadowWalked = Array(repeating: 0, count: total * rooms.count)
            walked = Array(repeating: 0, count: total)
        }

        // Devices start at a random phase of their interval, so they do not all speak at t = 0.
        heap.reserveCapacity(total + wanderers)
        for d in 0..<total {
            push(Due(time: Int64(uniform() * interval), key: d * 2))
        }
        for k in 0..<wanderers {
            push(Due(time: nextWander(from: 0), key: (scenario.devices.count + k) * 2 + 1))
        }
        for (i, d) in scenario.devices.enumerated() {
            for s in d.script { steps.append(ScriptStep(time: Self.micros(s.at), device: i, action: s.action)) }
        }
        // Stable: same time, file order (device, then its script).
        steps = steps.enumerated().sorted { ($0.element.time, $0.offset) < ($1.element.time, $1.offset) }.map(\.element)
    }

    static func micros(_ seconds: Double) -> Int64 { Int64((seconds * 1_000_000).rounded()) }

    private func add(id: UInt64, name: String, type: String, flags: BeaconFlags, index: Int, room: Int, title: String,
                     webURL: Bool, payloadBytes: Int?, link: Bool) {
        // PSM 0: the device offers no link (docs/protocol.md §2.1).
        let psm = link ? 0x0080 + UInt16(index % 128) : 0
        let beacon = ActivityBeacon(flags: flags, sequence: 1, activityTypeHash: activityTypeHash(type.utf8),
                                    groupHash: Self.groupHash, deviceID: id, psm: psm)
        // Random static: the two most significant bits are 1 (Core 5.4, Vol 6, Part B, §1.3.2.1).
        let address = (rng.next() & 0x3FFF_FFFF_FFFF) | 0xC000_0000_0000
        devices.append(Device(id: id, name: name, beacon: beacon, address: address,
                              data: Self.advertisement(beacon, companyID: scenario.companyID), x: 0, y: 0, room: room,
                              type: type, title: title, webURL: webURL, payloadBytes: payloadBytes, link: link))
    }

    /// The beacon's 31-byte advertisement (docs/protocol.md §2.1), as CaptureGenerator writes it;
    /// tagged under the group's beacon key when the device has one (docs/security.md §4).
    static func advertisement(_ beacon: ActivityBeacon, companyID: UInt16,
                              tagger: BeaconTagger? = nil) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: ActivityBeacon.advertisementLength)
        out.withUnsafeMutableBytes { raw in
            var w = ByteWriter(raw)
            // Proof: the buffer is exactly advertisementLength bytes.
            do throws(WireError) {
                if let tagger {
                    try beacon.encodeAdvertisement(companyID: companyID, authenticator: tagger, into: &w)
                } else {
                    try beacon.encodeAdvertisement(companyID: companyID, authenticator: OpenGroup(), into: &w)
                }
            } catch { preconditionFailure("a beacon fits 31 bytes") }
        }
        return out
    }

    /// Encodes device `d`'s advertisement again after its beacon changed.
    func encode(_ d: Int) {
        devices[d].data = Self.advertisement(devices[d].beacon, companyID: scenario.companyID, tagger: devices[d].tagger)
    }

    /// A keyed device draws a new rotating id and a new address (docs/security.md §3), as BLE
    /// privacy rotates both together. From the scenario's PRNG, so a seed still names a run.
    func rotate(_ d: Int) {
        guard let idMaker = devices[d].idMaker else { return }
        var random: UInt32
        repeat { random = UInt32(truncatingIfNeeded: rng.next()) & 0x3F_FFFF } while random == 0 || random == 0x3F_FFFF
        let air = idMaker.deviceID(prand: 0x40_0000 | random)
        if !devices[d].hasIdentity {
            // Group-wide ids: the id topics use is the one on air (§3), so links find it by it.
            if indexByID[devices[d].id] == d { indexByID[devices[d].id] = nil }
            devices[d].id = air
            indexByID[air] = d
        }
        devices[d].beacon.deviceID = air
        // A resolvable private address's shape: top bits 0b01 (Core 5.4, Vol 6, Part B, §1.3.2.2).
        let address = (rng.next() & 0x3FFF_FFFF_FFFF) | 0x4000_0000_0000
        if let old = devices[d].previousAddress, indexByAddress[old] == d { indexByAddress[old] = nil }
        devices[d].previousAddress = devices[d].address
        devices[d].address = address
        if indexByAddress[address] == nil { indexByAddress[address] = d }
        devices[d].rotateAt = devices[d].rotateEvery > 0 ? now + devices[d].rotateEvery : .max
        encode(d)
    }

    func position(_ place: Scenario.Place) -> (Double, Double) {
        switch place {
        case .room(let r):
            let i = roomIndex[r]!
            return (roomX[i], roomY[i])
        case .between(let a, let b):
            let i = roomIndex[a]!, j = roomIndex[b]!
            return ((roomX[i] + roomX[j]) / 2, (roomY[i] + roomY[j]) / 2)
        case .point(let x, let y):
            return (x, y)
        }
    }

    /// docs/simulator.md "The radio": in-room + per-room × distance, before noise.
    func placeMean(_ d: Int) {
        let rooms = roomX.count
        for r in 0..<rooms {
            let dx = devices[d].x - roomX[r], dy = devices[d].y - roomY[r]
            mean[d * rooms + r] = scenario.radio.inRoom + scenario.radio.perRoom * (dx * dx + dy * dy).squareRoot()
        }
    }

    /// Simulated seconds the walk under way takes (`radio.walk-speed`); nil when standing.
    public func walkTakes(_ device: Int) -> Double? {
        let d = devices[device]
        return d.walkEnd > 0 ? Double(d.walkEnd - d.walkStart) / 1e6 : nil
    }

    /// The mean RSSI (dBm, before noise and clamping) of device `device` in room `room` now.
    public func meanRSSI(device: Int, room: Int) -> Double { mean[device * roomX.count + room] }

    public var deviceCount: Int { devices.count }
    public func deviceID(_ device: Int) -> UInt64 { devices[device].id }
    public func beacon(_ device: Int) -> ActivityBeacon { devices[device].beacon }
    /// The device's random static address, as its advertising reports carry it (address type 1).
    public func address(_ device: Int) -> UInt64 { devices[device].address }

    /// The simulated time of the next report or step; `Int64.max` when nothing is left.
    public var nextDue: Int64 {
        min(nextStep < steps.count ? steps[nextStep].time : .max, heap.first?.time ?? .max)
    }

    /// Runs the scenario up to simulated time `time` (µs): each step goes to `event`, each
    /// report each room hears goes to `hear` with that room's index and the report as the
    /// room heard it (RSSI included). A step and a report due at the same time: the step first.
    public func advance(to time: Int64, hear: (Int, GeneratedReport) -> Void, event: (ScenarioEvent) -> Void) {
        while true {
            let stepTime = nextStep < steps.count ? steps[nextStep].time : .max
            let reportTime = heap.first?.time ?? .max
            let t = min(stepTime, reportTime)
            guard t <= time else { break }
            now = t
            if stepTime <= reportTime {
                let s = steps[nextStep]
                nextStep += 1
                apply(s.action, to: s.device)
                event(ScenarioEvent(time: t, device: s.device, deviceID: devices[s.device].id, name: devices[s.device].name,
                                    action: s.action, sequence: devices[s.device].beacon.sequence))
                continue
            }
            let due = heap[0]
            let d = due.key >> 1
            if due.key & 1 == 0 {
                advertise(d, hear: hear)
                // A little jitter (±10 %), as real advertisers add advDelay (Core 5.4, Vol 6,
                // Part B, §4.4.2.2.1); at least 1 µs so time always moves on.
                replaceTop(Due(time: t + max(1, Int64(interval * (0.9 + 0.2 * uniform()))), key: due.key))
            } else {
                let r: Int
                if nextDoorStart.isEmpty {
                    let rooms = roomX.count
                    let pick = Int(rng.next() % UInt64(rooms - 1))
                    r = pick >= devices[d].room ? pick + 1 : pick
                } else {
                    let from = devices[d].room
                    let first = nextDoorStart[from], count = nextDoorStart[from + 1] - first
                    r = nextDoor[first + Int(rng.next() % UInt64(count))]
                }
                let place = Scenario.Place.room(scenario.rooms[r].id)
                apply(.walk(place), to: d)
                event(ScenarioEvent(time: t, device: d, deviceID: devices[d].id, name: devices[d].name,
                                    action: .walk(place), sequence: devices[d].beacon.sequence))
                replaceTop(Due(time: nextWander(from: t), key: due.key))
            }
        }
        now = max(now, time)
    }

    /// Each room's next-door rooms: the other rooms at the smallest distance from it, within
    /// 1 % (a grid's two to four rooms sharing a wall, not the diagonals at √2).
    static func nextDoorRooms(_ rooms: [Scenario.Room]) -> ([Int], [Int]) {
        var next: [Int] = [], start: [Int] = [0]
        for (i, a) in rooms.enumerated() {
            func distance(_ b: Scenario.Room) -> Double { ((a.x - b.x) * (a.x - b.x) + (a.y - b.y) * (a.y - b.y)).squareRoot() }
            let nearest = rooms.indices.filter { $0 != i }.map { distance(rooms[$0]) }.min() ?? 0
            next += rooms.indices.filter { $0 != i && distance(rooms[$0]) <= nearest * 1.01 }
            start.append(next.count)
        }
        return (next, start)
    }

    func nextWander(from t: Int64) -> Int64 {
        t + max(1, Self.micros(wander * (0.5 + uniform())))
    }

    func apply(_ action: Scenario.Action, to d: Int) {
        switch action {
        case .walk(let place):
            let (x, y) = position(place)
            if case .room(let r) = place { devices[d].room = roomIndex[r]! }
            let speed = scenario.radio.walkSpeed
            if speed > 0 {
                moveAlong(d)
                let distance = ((x - devices[d].x) * (x - devices[d].x) + (y - devices[d].y) * (y - devices[d].y)).squareRoot()
                devices[d].fromX = devices[d].x; devices[d].fromY = devices[d].y
                devices[d].toX = x; devices[d].toY = y
                devices[d].walkStart = now
                devices[d].walkEnd = now + max(1, Self.micros(distance / speed))
            } else {
                (devices[d].x, devices[d].y) = (x, y)
                placeMean(d)
            }
        case .save:
            devices[d].beacon.sequence &+= 1
        case .becomeCurrent(let type):
            devices[d].beacon.activityTypeHash = activityTypeHash(type.utf8)
            devices[d].beacon.flags.remove(.invalidated)
            devices[d].beacon.sequence &+= 1
            devices[d].type = type
            devices[d].activityStart = devices[d].beacon.sequence
        case .invalidate:
            devices[d].beacon.flags.insert(.invalidated)
            devices[d].beacon.sequence &+= 1
        case .silent:
            devices[d].silent = true
        case .resume:
            devices[d].silent = false
        }
        switch action {
        case .save, .becomeCurrent, .invalidate:
            encode(d)
        default:
            break
        }
    }

    /// One report, offered to every room. Noise first (a report too weak is unheard whatever
    /// else happens), then loss. A room so far that even six standard deviations of noise
    /// would not reach `heard-down-to` is unheard without drawing any noise.
    func advertise(_ d: Int, hear: (Int, GeneratedReport) -> Void) {
        guard !devices[d].silent else { return }
        if devices[d].walkEnd > 0 { moveAlong(d) }
        if now >= devices[d].rotateAt { rotate(d) }
        reportsSent += 1
        let rooms = roomX.count
        let threshold = scenario.radio.heardDownTo
        var report = GeneratedReport(timestamp: now, device: d,
                                     kind: devices[d].sensor ? .ordinary(name: devices[d].name) : .baton(devices[d].beacon),
                                     address: devices[d].address, addressType: devices[d].addressType, rssi: 0,
                                     extended: false, data: devices[d].data)
        for r in 0..<rooms {
            let m = mean[d * rooms + r]
            let sigma = roomNoise[r]
            if m + 6 * sigma + 3 * scenario.radio.shadowing < threshold { counts[r].unheard += 1; continue }
            var raw = m + sigma * gaussian()
            if !shadow.isEmpty { raw += shadowing(d * rooms + r) }
            if let k = scenario.radio.fadingK { raw += fading(k) }
            let level = min(20, max(-127, raw.rounded()))
            if level < threshold { counts[r].unheard += 1; continue }
            if roomLoss[r] > 0, uniform() < roomLoss[r] { counts[r].lost += 1; continue }
            counts[r].heard += 1
            report.rssi = Int8(level)
            hear(r, report)
        }
    }

    /// Where a walking device is now: on the straight line between where it set off and where
    /// it goes, at `radio.walk-speed`; its levels follow (docs/simulator.md).
    func moveAlong(_ d: Int) {
        let end = devices[d].walkEnd
        guard end > 0 else { return }
        let (x0, y0) = (devices[d].x, devices[d].y)
        defer {
            if !walked.isEmpty {
                let dx = devices[d].x - x0, dy = devices[d].y - y0
                walked[d] += (dx * dx + dy * dy).squareRoot()
            }
        }
        if now >= end {
            devices[d].x = devices[d].toX; devices[d].y = devices[d].toY
            devices[d].walkEnd = 0
        } else {
            let f = Double(now - devices[d].walkStart) / Double(end - devices[d].walkStart)
            devices[d].x = devices[d].fromX + (devices[d].toX - devices[d].fromX) * f
            devices[d].y = devices[d].fromY + (devices[d].toY - devices[d].fromY) * f
        }
        placeMean(d)
    }

    /// Shadowing in one room: a gaussian of standard deviation `radio.shadowing` whose
    /// correlation falls as e^(−d/shadowing-distance) over the distance d the device walked
    /// (M. Gudmundson, "Correlation model for shadow fading in mobile radio systems",
    /// Electronics Letters 27(23), 1991) and, with `shadowing-time`, as e^(−t/time) over time
    /// alone: a first-order Gauss–Markov process, drawn exactly over whatever passed since its
    /// last draw. A device standing still keeps its offsets, unless people fidget.
    func shadowing(_ cell: Int) -> Double {
        let radio = scenario.radio, sigma = radio.shadowing
        let d = cell / roomX.count
        guard shadowAt[cell] >= 0 else {
            shadowAt[cell] = now
            shadowWalked[cell] = walked[d]
            shadow[cell] = sigma * gaussian()
            return shadow[cell]
        }
        var decay = (walked[d] - shadowWalked[cell]) / radio.shadowingDistance
        if radio.shadowingTime > 0 { decay += Double(now - shadowAt[cell]) / 1e6 / radio.shadowingTime }
        guard decay > 0 else { return shadow[cell] }
        let keep = exp(-decay)
        shadow[cell] = shadow[cell] * keep + sigma * (1 - keep * keep).squareRoot() * gaussian()
        shadowAt[cell] = now
        shadowWalked[cell] = walked[d]
        return shadow[cell]
    }

    /// Fast fading on one report: the power of a Rician channel of factor K (dB) with mean
    /// power 1, in dB. K → −∞ is Rayleigh (no line of sight): a report 10 dB below the mean
    /// one time in ten, 20 dB one time in a hundred.
    func fading(_ kDB: Double) -> Double {
        let k = pow(10, kDB / 10)
        let los = (k / (k + 1)).squareRoot(), scatter = (1 / (2 * (k + 1))).squareRoot()
        let i = los + scatter * gaussian(), q = scatter * gaussian()
        return 10 * log10(max(1e-12, i * i + q * q))
    }

    /// Uniform in [0, 1): the top 53 bits of the PRNG.
    func uniform() -> Double { Double(rng.next() >> 11) * 0x1p-53 }

    /// Standard normal, Box–Muller; the second value of each pair is kept for the next call.
    func gaussian() -> Double {
        if let g = spareGaussian { spareGaussian = nil; return g }
        let u1 = 1 - uniform()  // (0, 1]: log is finite
        let u2 = uniform()
        let radius = (-2 * log(u1)).squareRoot()
        spareGaussian = radius * sin(2 * .pi * u2)
        return radius * cos(2 * .pi * u2)
    }

    // MARK: The heap (entries allocated once, at init)

    func push(_ due: Due) {
        heap.append(due)
        var i = heap.count - 1
        while i > 0 {
            let parent = (i - 1) / 2
            guard heap[i] < heap[parent] else { break }
            heap.swapAt(i, parent)
            i = parent
        }
    }

    func replaceTop(_ due: Due) {
        heap[0] = due
        var i = 0
        let n = heap.count
        while true {
            let l = 2 * i + 1, r = l + 1
            var smallest = i
            if l < n, heap[l] < heap[smallest] { smallest = l }
            if r < n, heap[r] < heap[smallest] { smallest = r }
            guard smallest != i else { return }
            heap.swapAt(i, smallest)
            i = smallest
        }
    }
}

// MARK: - The building

/// A room's socket could not be set up (the OS's answer, with the path).
public struct BuildingError: Error, Sendable, CustomStringConvertible {
    public var message: String
    public var description: String { message }
}

public final class Building {
    public let player: ScenarioPlayer
    public var scenario: Scenario { player.scenario }
    /// Each room's socket, in the scenario's order.
    public let socketPaths: [String]
    var listeners: [Int32]
    var controllers: [VirtualController?]
    public private(set) var delivered: [Int]
    /// Reports a room heard while its gateway was not connected or not scanning.
    public private(set) var notScanning: [Int]
    /// Reports a scanning gateway did not take in time (`VirtualController.outboxLimit`).
    public private(set) var dropped: [Int]
    public private(set) var started = false
    var startInstant = Instant.now
    var pollFDs: [pollfd] = []
    var closed = false
    /// Every room's link socket and the links open to simulated devices.
    let links: DeviceLinkServer

    public enum Output {
        case start(unixMicros: Int64)
        case step(ScenarioEvent, unixMicros: Int64)
        /// A device heard over a link that its activity was continued (docs/protocol.md §5.2).
        case continued(LinkContinuation, unixMicros: Int64)
        case end(unixMicros: Int64)
        /// A gateway connected to or left a room (for a log line, not the JSON).
        case connected(room: Int)
        case disconnected(room: Int)
    }

    /// Listens on `<directory>/<room id>.sock` and `<directory>/<room id>.link` for every
    /// room, replacing stale socket files.
    public init(scenario: Scenario, directory: String) throws(BuildingError) {
        player = ScenarioPlayer(scenario)
        let base = directory.hasSuffix("/") ? String(directory.dropLast()) : directory
        links = try DeviceLinkServer(player: player, directory: base)
        socketPaths = scenario.rooms.map { base + "/" + $0.id + ".sock" }
        listeners = []
        let rooms = scenario.rooms.count
        controllers = Array(repeating: nil, count: rooms)
        delivered = Array(repeating: 0, count: rooms)
        notScanning = Array(repeating: 0, count: rooms)
        dropped = Array(repeating: 0, count: rooms)
        pollFDs.reserveCapacity(2 * rooms + Self.linkCapacity + 1)
        for path in socketPaths {
            do throws(BuildingError) {
                listeners.append(try Self.listen(path))
            } catch {
                close()
                throw error
            }
        }
    }

    deinit { close() }

    /// A listening Unix socket of `type` (flags such as SOCK_NONBLOCK included) at `path`.
    static func listen(_ path: String, type: Int32 = Int32(SOCK_STREAM.rawValue)) throws(BuildingError) -> Int32 {
        guard var unix = Syscall.unixAddress(path) else {
            throw BuildingError(message: "\(path): longer than a Unix socket path may be (108 bytes): use a shorter --sockets directory")
        }
        unlink(path)
        let fd = socket(AF_UNIX, type | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw BuildingError(message: "\(path): socket: \(String(cString: strerror(errno)))") }
        let r = withUnsafePointer(to: &unix.address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, unix.length) }
        }
        // A gateway opens a few links at once; the kernel caps the backlog at somaxconn anyway.
        guard r == 0, CLibc.listen(fd, 16) == 0 else {
            let reason = String(cString: strerror(errno))
            CLibc.close(fd)
            throw BuildingError(message: "cannot listen on \(path): \(reason)")
        }
        return fd
    }

    /// True when every room has a gateway connected that has turned scanning on.
    public var everyRoomScanning: Bool { controllers.allSatisfy { $0?.scanning == true } }

    /// Serves the rooms until the scenario's duration is over or `stop` (a file descriptor)
    /// becomes readable. The scenario clock starts at once, or with `waitForScanning` when
    /// every room's gateway scans.
    public func run(waitForScanning: Bool, stop: Int32? = nil, output: (Output) -> Void) {
        let speed = scenario.speed
        while !closed {
            if !started, !waitForScanning || everyRoomScanning {
                started = true
                startInstant = .now
                output(.start(unixMicros: unixMicros()))
            }
            if started {
                let target = min(player.end, simulatedNow(speed))
                player.advance(to: target, hear: { room, report in deliver(room, report) },
                               event: { output(.step($0, unixMicros: unixMicros())) })
                // One write per room per turn: at 5,000 devices heard by 15 rooms each, a write
                // per report was 75,000 a second, most of the simulator's time.
                for c in controllers { if let c, c.wantsWrite { c.flush() } }
                if target >= player.end { break }
            }
            links.service()
            pollFDs.removeAll(keepingCapacity: true)
            for (r, c) in controllers.enumerated() {
                if let c {
                    pollFDs.append(pollfd(fd: c.fd, events: Int16(POLLIN) | (c.wantsWrite ? Int16(POLLOUT) : 0), revents: 0))
                } else {
                    pollFDs.append(pollfd(fd: listeners[r], events: Int16(POLLIN), revents: 0))
                }
            }
            links.addPollFDs(&pollFDs)
            let stopIndex = pollFDs.count
            if let stop { pollFDs.append(pollfd(fd: stop, events: Int16(POLLIN), revents: 0)) }
            var timeout: Int32 = 1000
            if started {
                let dueReal = Double(min(player.nextDue, player.end)) / speed
                let elapsed = Double((Instant.now - startInstant).microseconds)
                // Turns at most every `Self.turn` ms: what falls due meanwhile goes in the next
                // turn's writes, up to that much late (a gateway gathers 10 ms anyway).
                timeout = Int32(min(1000, max(Self.turn, ((dueReal - elapsed) / 1000).rounded(.up))))
            }
            if let due = links.nextDue {
                timeout = (due - .now).pollMilliseconds(atMost: timeout)
            }
            let ready = pollFDs.withUnsafeMutableBufferPointer { CLibc.poll($0.baseAddress, nfds_t($0.count), timeout) }
            if ready <= 0 { continue }
            if stop != nil, pollFDs[stopIndex].revents != 0 { break }
            links.handle(pollFDs) { output(.continued($0, unixMicros: unixMicros())) }
            for r in controllers.indices where pollFDs[r].revents != 0 {
                if let c = controllers[r] {
                    c.poll()
                    if c.closed {
                        controllers[r] = nil
                        output(.disconnected(room: r))
                    }
                } else {
                    let fd = accept(listeners[r], nil, nil)
                    if fd >= 0 {
                        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
                        controllers[r] = VirtualController(fd: fd)
                        output(.connected(room: r))
                    }
                }
            }
        }
        finish()
        output(.end(unixMicros: unixMicros()))
        close()
    }

    /// The shortest wait between turns, in milliseconds, while the scenario runs.
    static let turn = 4.0

    func simulatedNow(_ speed: Double) -> Int64 {
        Int64(Double((Instant.now - startInstant).microseconds) * speed)
    }

    func deliver(_ room: Int, _ report: GeneratedReport) {
        guard let c = controllers[room], c.scanning, !c.closed else { notScanning[room] += 1; return }
        let before = c.reportsDelivered
        c.queue(report)
        if c.reportsDelivered != before { delivered[room] += 1 } else { dropped[room] += 1 }
    }

    /// Gives connected gateways up to a second to read what was delivered, so `delivered`
    /// counts reports that left.
    func finish() {
        let deadline = Instant.now + .seconds(1)
        for c in controllers {
            guard let c else { continue }
            while c.wantsWrite, !c.closed, Instant.now < deadline {
                var p = pollfd(fd: c.fd, events: Int16(POLLOUT), revents: 0)
                _ = CLibc.poll(&p, 1, 100)
                c.flush()
            }
        }
    }

    /// Hangs up on every gateway and removes the sockets.
    public func close() {
        guard !closed else { return }
        closed = true
        for c in controllers { c?.hangUp() }
        controllers = controllers.map { _ in nil }
        for fd in listeners { CLibc.close(fd) }
        for path in socketPaths { unlink(path) }
        links.close()
    }
}

/// Microseconds since the Unix epoch.
public func unixMicros() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1000
}

// MARK: - JSON lines (docs/simulator.md "What it prints")

extension Building {
    /// `{"event":"ready","rooms":{"hall":"DIR/hall.sock",…},"links":{"hall":"DIR/hall.link",…},"names":{"hall":"Hall",…}}`
    public func readyLine() -> String {
        jsonLine { w throws(WireError) in
            try w.key("event"); try w.string("ready")
            try w.key("rooms"); try w.beginObject()
            for (room, path) in zip(scenario.rooms, socketPaths) { try w.key(room.id); try w.string(path) }
            try w.endObject()
            try w.key("links"); try w.beginObject()
            for (room, path) in zip(scenario.rooms, linkPaths) { try w.key(room.id); try w.string(path) }
            try w.endObject()
            try w.key("names"); try w.beginObject()
            for room in scenario.rooms { try w.key(room.id); try w.string(room.name) }
            try w.endObject()
        }
    }

    /// The JSON line for an output, or nil for the ones that are log lines.
    public func line(_ output: Output) -> String? {
        switch output {
        case .start(let unix):
            return jsonLine { w throws(WireError) in
                try w.key("event"); try w.string("start")
                try w.key("unix_us"); try w.int(unix)
            }
        case .step(let e, let unix):
            return jsonLine { w throws(WireError) in try stepFields(e, unix, &w) }
        case .end(let unix):
            return jsonLine { w throws(WireError) in
                try w.key("event"); try w.string("end")
                try w.key("unix_us"); try w.int(unix)
                try w.key("t"); try w.double(Double(player.now) / 1e6)
                try w.key("rooms"); try w.beginObject()
                for (r, room) in scenario.rooms.enumerated() {
                    try w.key(room.id); try w.beginObject()
                    try w.key("delivered"); try w.int(Int64(delivered[r]))
                    try w.key("lost"); try w.int(Int64(player.counts[r].lost))
                    try w.key("unheard"); try w.int(Int64(player.counts[r].unheard))
                    try w.key("not_scanning"); try w.int(Int64(notScanning[r]))
                    try w.key("dropped"); try w.int(Int64(dropped[r]))
                    let l = links.linkCounts[r]
                    try w.key("links"); try w.int(Int64(l.links))
                    try w.key("links_refused"); try w.int(Int64(l.refused))
                    try w.key("links_full"); try w.int(Int64(l.full))
                    try w.key("link_errors"); try w.int(Int64(l.errors))
                    try w.key("fetches"); try w.int(Int64(l.fetches))
                    try w.key("continued"); try w.int(Int64(l.continued))
                    try w.key("streams"); try w.int(Int64(l.streams))
                    try w.endObject()
                }
                try w.endObject()
            }
        case .continued(let c, let unix):
            return jsonLine { w throws(WireError) in
                try w.key("event"); try w.string("continued")
                try w.key("device"); try w.string(hex12(c.deviceID))
                try w.key("name"); try w.string(c.name)
                try w.key("room"); try w.string(c.room)
                try w.key("sequence"); try w.int(Int64(c.sequence))
                try w.key("unix_us"); try w.int(unix)
            }
        case .connected, .disconnected:
            return nil
        }
    }

    func stepFields(_ e: ScenarioEvent, _ unix: Int64, _ w: inout JSONWriter) throws(WireError) {
        try w.key("t"); try w.double(Double(e.time) / 1e6)
        try w.key("unix_us"); try w.int(unix)
        try w.key("device"); try w.string(hex12(e.deviceID))
        try w.key("name"); try w.string(e.name)
        try w.key("event")
        switch e.action {
        case .walk(let place):
            try w.string("walk")
            switch place {
            case .room(let r):
                try w.key("room"); try w.string(r)
            case .between(let a, let b):
                try w.key("between"); try w.beginArray(); try w.string(a); try w.string(b); try w.endArray()
            case .point(let x, let y):
                try w.key("x"); try w.double(x)
                try w.key("y"); try w.double(y)
            }
            // With `radio.walk-speed`, how long the walk takes: it passes the door (where both
            // rooms hear it alike, between two rooms) half-way.
            if let takes = player.walkTakes(e.device) { try w.key("takes"); try w.double(takes) }
        case .save: try w.string("save")
        case .becomeCurrent(let type):
            try w.string("become-current")
            try w.key("type"); try w.string(type)
        case .invalidate: try w.string("invalidate")
        case .silent: try w.string("silent")
        case .resume: try w.string("resume")
        }
        try w.key("sequence"); try w.int(Int64(e.sequence))
    }

    /// One object; a line is at most a few KiB (a hundred rooms' counts), far under 128 KiB.
    func jsonLine(_ fields: (inout JSONWriter) throws(WireError) -> Void) -> String {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 17, alignment: 1)
        defer { buffer.deallocate() }
        var w = JSONWriter(buffer)
        do throws(WireError) {
            try w.beginObject()
            try fields(&w)
            try w.endObject()
        } catch {
            preconditionFailure("a simulator line fits 128 KiB: \(error)")
        }
        return String(decoding: w.written, as: UTF8.self)
    }
}
