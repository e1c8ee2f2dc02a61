// A scenario: a building of simulated rooms, the devices in it and what they do when
// (docs/simulator.md "Scenarios"). It is YAML like the gateway's config file, read the same
// way: BatonYAML composes nodes that keep their line numbers, the reader walks them against the
// keys below with BatonYAML's schema checks, and every problem becomes a `ScenarioError` with file, line and key. The whole
// file is checked before anything is refused, so one run shows every mistake.
import BatonLibc
import BatonKeys
import BatonWire
import CLibc
public import BatonYAML

public struct Scenario: Sendable, Equatable {
    /// The one seed every random choice comes from: same seed, same scenario, same reports.
    public var seed: UInt64
    /// Simulated seconds per real second.
    public var speed: Double
    /// Simulated seconds; then the simulator ends.
    public var duration: Double
    /// Advertising reports per simulated second per device.
    public var rate: Double
    /// The company id beacons are sent under (docs/protocol.md §2.1).
    public var companyID: UInt16
    public var radio: Radio
    public var rooms: [Room]
    public var devices: [Device]
    public var crowd: Crowd?
    /// BTHome v2 sensors (docs/simulator.md "BTHome sensors").
    public var bthome: [BTHomeSensor]

    public init(seed: UInt64 = 1, speed: Double = 1, duration: Double, rate: Double = 10,
                companyID: UInt16 = ActivityBeacon.defaultCompanyID, radio: Radio = Radio(), rooms: [Room],
                devices: [Device], crowd: Crowd? = nil, bthome: [BTHomeSensor] = []) {
        self.seed = seed; self.speed = speed; self.duration = duration; self.rate = rate
        self.companyID = companyID; self.radio = radio; self.rooms = rooms; self.devices = devices; self.crowd = crowd
        self.bthome = bthome
    }

    /// The RSSI model: what a room hears of a device at some distance (docs/simulator.md "The radio").
    public struct Radio: Sendable, Equatable {
        /// dBm heard in the device's own room.
        public var inRoom: Double
        /// dB added per room of distance (negative: farther is weaker).
        public var perRoom: Double
        /// Reports weaker than this are not heard at all.
        public var heardDownTo: Double
        /// dB, the standard deviation of the gaussian noise on each report in each room.
        public var noise: Double
        /// The fraction of reports each room misses.
        public var loss: Double
        /// Simulated seconds a device takes to answer a link's connect message or a fetch.
        public var linkLatency: Double
        /// Rooms a second a walking device covers, its levels changing along the way; 0: a walk
        /// is a step (docs/simulator.md "A radio that moves like a person").
        public var walkSpeed: Double
        /// dB, the standard deviation of shadowing: an offset per device and room (walls, the
        /// body between phone and gateway) that changes as the device moves, over
        /// `shadowingDistance`, and, if `shadowingTime` > 0, with time alone (people fidgeting).
        public var shadowing: Double
        /// Rooms walked over which the shadowing decorrelates (Gudmundson's model).
        public var shadowingDistance: Double
        /// Seconds over which it decorrelates standing still; 0: it does not.
        public var shadowingTime: Double
        /// The Rician K factor of fast fading on each report, in dB (−30 is all but Rayleigh);
        /// nil: no fading.
        public var fadingK: Double?

        public init(inRoom: Double = -55, perRoom: Double = -15, heardDownTo: Double = -95,
                    noise: Double = 3, loss: Double = 0.05, linkLatency: Double = 0,
                    walkSpeed: Double = 0, shadowing: Double = 0, shadowingDistance: Double = 0.25,
                    shadowingTime: Double = 0, fadingK: Double? = nil) {
            self.inRoom = inRoom; self.perRoom = perRoom; self.heardDownTo = heardDownTo
            self.noise = noise; self.loss = loss; self.linkLatency = linkLatency
            self.walkSpeed = walkSpeed; self.shadowing = shadowing; self.shadowingDistance = shadowingDistance
            self.shadowingTime = shadowingTime
            self.fadingK = fadingK
        }
    }

    public struct Room: Sendable, Equatable {
        /// Names the room's socket (`<id>.sock`) and, usually, its gateway's id.
        public var id: String
        public var name: String
        /// Position in room units (one room's width).
        public var x: Double
        public var y: Double
        /// This room's own noise and loss, instead of the radio's.
        public var noise: Double?
        public var loss: Double?

        public init(id: String, name: String, x: Double, y: Double = 0, noise: Double? = nil, loss: Double? = nil) {
            self.id = id; self.name = name; self.x = x; self.y = y; self.noise = noise; self.loss = loss
        }
    }

    /// Where a device is.
    public enum Place: Sendable, Equatable {
        /// In the middle of a room.
        case room(String)
        /// Halfway between two rooms: heard as well in both.
        case between(String, String)
        /// Anywhere, in room units.
        case point(x: Double, y: Double)
    }

    public struct Device: Sendable, Equatable {
        /// The 48-bit activity-beacon device id (docs/protocol.md §2.4).
        public var id: UInt64
        public var name: String
        /// The current activity type (its FNV-1a 32 hash is in the beacon, §2.3).
        public var type: String
        public var streams: Bool
        public var webURL: Bool
        public var place: Place
        public var script: [Step]
        /// The payload's title (docs/simulator.md "Device links"); nil: the device's name.
        public var title: String?
        /// The encoded payload's exact size: padded up to it. nil: its natural size.
        public var payloadBytes: Int?
        /// Whether the device offers a device link (docs/protocol.md §5); false: beacon PSM 0.
        public var link: Bool
        /// The group secret in its text form (docs/security.md §1): the device's beacons carry
        /// the group's hash and its payloads go out sealed (§5). nil: an open group.
        public var groupSecret: String?
        /// With a group secret: the device number its ids resolve to, for one stable identity
        /// across rotation (docs/security.md §3.1). nil: group-wide ids (§3).
        public var identity: UInt16?
        /// With a group secret: simulated seconds between rotations of the device id and the
        /// address, as BLE privacy rotates them (15 minutes unless set; 0: never).
        public var rotate: Double?

        public init(id: UInt64, name: String, type: String, streams: Bool = false, webURL: Bool = false,
                    place: Place, script: [Step] = [], title: String? = nil, payloadBytes: Int? = nil,
                    link: Bool = true, groupSecret: String? = nil) {
            self.id = id; self.name = name; self.type = type; self.streams = streams; self.webURL = webURL
            self.place = place; self.script = script
            self.title = title; self.payloadBytes = payloadBytes; self.link = link; self.groupSecret = groupSecret
        }
    }

    public struct Step: Sendable, Equatable {
        /// Simulated seconds from the start.
        public var at: Double
        public var action: Action
        public init(at: Double, _ action: Action) { self.at = at; self.action = action }
    }

    public enum Action: Sendable, Equatable {
        /// The position jumps there.
        case walk(Place)
        /// The activity is saved: sequence + 1 (NSUserActivity needsSave → saved).
        case save
        /// A new current activity of this type: sequence + 1, no longer invalidated.
        case becomeCurrent(String)
        /// The activity ends: sequence + 1, beacons carry the invalidated flag.
        case invalidate
        /// The device stops advertising.
        case silent
        /// ... and starts again.
        case resume
    }

    /// Many generated devices, for benchmarks.
    public struct Crowd: Sendable, Equatable {
        public var count: Int
        /// Devices get ids first-id, first-id + 1, …
        public var firstID: UInt64
        /// Each walks to a random room about every this many simulated seconds; 0: never.
        public var wander: Double
        /// Where a wandering device walks: any other room, or only next door (the nearest
        /// rooms: people walk through doors, they do not cross a building in one step).
        public var walk: Walk = .anywhere
        /// Their activity type; nil: the capture generator's five, in turn.
        public var type: String?
        /// As a device's: one title for all (nil: each device's name), payload size, link.
        public var title: String?
        public var payloadBytes: Int?
        public var link: Bool

        public init(count: Int, firstID: UInt64, wander: Double = 0, type: String? = nil, title: String? = nil,
                    payloadBytes: Int? = nil, link: Bool = true) {
            self.count = count; self.firstID = firstID; self.wander = wander; self.type = type
            self.title = title; self.payloadBytes = payloadBytes; self.link = link
        }
    }

    /// Where a crowd device wanders to (`crowd.walk`).
    public enum Walk: String, Sendable, Equatable, CaseIterable {
        /// Any other room of the building, each as likely.
        case anywhere
        /// One of the rooms nearest its own (in a grid, the two to four that share a wall).
        case nextDoor = "next-door"
    }

    /// A thermometer with BTHome v2 firmware: it advertises its measurements (BTHome.swift) at
    /// the scenario's `rate`, heard by the rooms as any device is; it offers no link.
    public struct BTHomeSensor: Sendable, Equatable {
        /// The Complete Local Name it sends; nil: none.
        public var name: String?
        /// Its public address (address type 0); nil: a random static address from the seed.
        public var address: UInt64?
        public var place: Place
        /// °C and % (hundredths); at least one of them.
        public var temperature: Double?
        public var humidity: Double?

        public init(name: String? = nil, address: UInt64? = nil, place: Place, temperature: Double? = nil,
                    humidity: Double? = nil) {
            self.name = name; self.address = address; self.place = place
            self.temperature = temperature; self.humidity = humidity
        }

        /// The advertising data it sends.
        public var advertisement: [UInt8] { BTHome.advertisement(temperature: temperature, humidity: humidity, name: name) }
    }

    public static let maxRooms = 100
    public static let maxBTHomeSensors = 1000
    /// Scripted and crowd devices together.
    public static let maxDevices = 100_000
    public static let maxRoomIDLength = 64
    /// Room and device names, in bytes.
    public static let maxNameBytes = 100
    public static let defaultType = "com.example.reader.article"
    /// `payload-bytes`: at least a legacy-sized payload, at most what a payload message carries.
    public static let payloadBytesRange = 64...65535
    /// `radio.link-latency`, simulated seconds.
    public static let maxLinkLatency = 60.0
}

/// A problem with a scenario file: `FILE:LINE: KEY: MESSAGE` (BatonYAML).
public typealias ScenarioError = YAMLFileError

// MARK: - Loading

extension Scenario {
    /// A scenario of a thousand scripted devices is well under this; more is the wrong file.
    static let maxFileBytes = 16 << 20

    /// Every key, section by section, in the order docs/simulator.md lists them.
    static let schema: [(section: String, keys: [String])] = [
        ("", ["seed", "speed", "duration", "rate", "company-id", "radio", "rooms", "devices", "crowd", "bthome"]),
        ("radio", ["in-room", "per-room", "heard-down-to", "noise", "loss", "link-latency", "walk-speed",
                   "shadowing", "shadowing-distance", "shadowing-time", "fading-k"]),
        ("rooms", ["id", "name", "x", "y", "noise", "loss"]),
        ("devices", ["id", "name", "type", "streams", "web-url", "at", "script", "title", "payload-bytes", "link",
                     "group-secret", "identity", "rotate"]),
        ("script", ["at", "walk", "save", "become-current", "invalidate", "silent", "resume"]),
        ("place", ["between", "x", "y"]),
        ("crowd", ["count", "first-id", "wander", "walk", "type", "title", "payload-bytes", "link"]),
        ("bthome", ["name", "address", "at", "temperature", "humidity"]),
    ]

    /// Reads and checks the scenario file at `path`.
    public static func load(file path: String) throws(ScenarioError) -> Scenario {
        var fd: Int32
        repeat { fd = open(path, O_RDONLY | O_CLOEXEC) } while fd < 0 && errno == EINTR
        guard fd >= 0 else {
            throw ScenarioError(file: path, line: nil, key: "",
                                message: "cannot read the scenario: \(String(cString: strerror(errno)))")
        }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0, errno == EINTR { continue }
            guard n >= 0 else {
                throw ScenarioError(file: path, line: nil, key: "",
                                    message: "cannot read the scenario: \(String(cString: strerror(errno)))")
            }
            if n == 0 { break }
            guard bytes.count + n <= maxFileBytes else {
                throw ScenarioError(file: path, line: nil, key: "",
                                    message: "larger than \(maxFileBytes >> 20) MiB: is it the right file?")
            }
            bytes += chunk[..<n]
        }
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw ScenarioError(file: path, line: nil, key: "", message: "not UTF-8 text (save the file as UTF-8)")
        }
        return try parse(yaml: text, file: path)
    }

    /// Checks `text` as the scenario file `file` (which names the file in errors).
    public static func parse(yaml text: String, file: String) throws(ScenarioError) -> Scenario {
        // Nesting past YAMLComposer.maxDepth is refused here, so the walk below stays shallow.
        let (root, tags) = try YAMLComposer.compose(text, file: file)
        var reader = ScenarioReader(file: file)
        let scenario = reader.read(root)
        try YAMLFileError.throwFirst(tags + reader.errors)
        guard let scenario else { preconditionFailure("a scenario read without errors") }
        return scenario
    }

    static func keys(of section: String) -> [String] {
        schema.first { $0.section == section }?.keys ?? []
    }
}

// MARK: - Walking the document

/// One `key: value` of a mapping; `key` is the path errors name (`devices[0].script[1].walk`).
typealias ScenarioEntry = YAMLEntry

struct ScenarioReader {
    /// A mapping's known entries by key. Absent, empty and `~` values read as absent.
    typealias Mapping = YAMLSection

    private(set) var yaml: YAMLReader
    var errors: [ScenarioError] { yaml.errors }
    /// Room ids read so far, for places and suggestions.
    var roomIDs: [String] = []

    init(file: String) { yaml = YAMLReader(file: file, mappingName: "a mapping of keys", quote: quoted) }

    mutating func report(_ node: YAMLNode?, _ key: String, _ message: String) {
        yaml.report(node, key, message)
    }

    // MARK: The file

    mutating func read(_ root: YAMLNode?) -> Scenario? {
        guard let root, let top = mapping(root, path: "", section: "") else {
            if root == nil { report(nil, "", "empty: a scenario needs at least duration, rooms and devices") }
            return nil
        }
        var s = Scenario(duration: 0, rooms: [], devices: [])
        if let e = top["seed"], let n = integer(e, 0...Int.max) { s.seed = UInt64(n) }
        if let e = top["speed"], let v = number(e, above: 0, atMost: 1000, "simulated seconds per real second") { s.speed = v }
        var durationKnown = false
        if let e = top["duration"] {
            if let v = number(e, above: 0, atMost: 1e7, "simulated seconds") { s.duration = v; durationKnown = true }
        } else {
            report(root, "duration", "missing: give the simulated seconds to run, like \"duration: 60\"")
        }
        if let e = top["rate"], let v = number(e, above: 0, atMost: 1000, "reports per simulated second") { s.rate = v }
        if let e = top["company-id"], let n = integer(e, 0...0xFFFF, hex: true) {
            // docs/protocol.md §1: manufacturer data under 0x004C is read as Apple Continuity.
            if n == 0x004C {
                report(e.value, e.key, "0x004C is Apple's company id (read as Continuity frames): pick another")
            } else {
                s.companyID = UInt16(n)
            }
        }
        if let e = top["radio"], let m = mapping(e.value, path: e.key, section: "radio") {
            readRadio(m, into: &s.radio)
        }
        if let e = top["rooms"] {
            s.rooms = readRooms(e)
        } else {
            report(root, "rooms", "missing: list the rooms, like \"rooms: [{id: hall}, {id: kitchen}]\"")
        }
        let end = durationKnown ? s.duration : nil
        if let e = top["devices"] { s.devices = readDevices(e, end: end) }
        if let e = top["crowd"], let m = mapping(e.value, path: e.key, section: "crowd") {
            s.crowd = readCrowd(m, scripted: s.devices)
        }
        if let e = top["bthome"] { s.bthome = readBTHome(e) }
        if top["devices"] == nil, top["crowd"] == nil, top["bthome"] == nil {
            report(root, "devices", "missing: list the devices, or add a crowd or BTHome sensors")
        }
        return s
    }

    mutating func readRadio(_ m: Mapping, into r: inout Scenario.Radio) {
        if let e = m["in-room"], let v = number(e, -127...20, "dBm") { r.inRoom = v }
        if let e = m["per-room"], let v = number(e, -100...0, "dB per room (0 or less: farther is weaker)") { r.perRoom = v }
        if let e = m["heard-down-to"], let v = number(e, -127...20, "dBm") { r.heardDownTo = v }
        if let e = m["noise"], let v = number(e, 0...30, "dB") { r.noise = v }
        if let e = m["loss"], let v = number(e, 0...1, "a fraction from 0 to 1") { r.loss = v }
        if let e = m["link-latency"], let v = number(e, 0...Scenario.maxLinkLatency, "simulated seconds") { r.linkLatency = v }
        if let e = m["walk-speed"], let v = number(e, 0...10, "rooms a second (0: a walk is a step)") { r.walkSpeed = v }
        if let e = m["shadowing"], let v = number(e, 0...20, "dB") { r.shadowing = v }
        if let e = m["shadowing-distance"], let v = number(e, 0.01...100, "rooms") { r.shadowingDistance = v }
        if let e = m["shadowing-time"], let v = number(e, 0...600, "seconds (0: not with time alone)") { r.shadowingTime = v }
        if let e = m["fading-k"], let v = number(e, -30...30, "dB (the Rician K factor)") { r.fadingK = v }
    }

    mutating func readRooms(_ e: ScenarioEntry) -> [Scenario.Room] {
        guard let items = list(e, expected: "a list of rooms, like \"- {id: hall, name: Hall}\"") else { return [] }
        guard !items.isEmpty else { report(e.value, e.key, "empty: list at least one room"); return [] }
        guard items.count <= Scenario.maxRooms else {
            report(e.value, e.key, "at most \(Scenario.maxRooms) rooms, got \(items.count)")
            return []
        }
        var rooms: [Scenario.Room] = []
        for (i, item) in items.enumerated() {
            let path = "\(e.key)[\(i)]"
            guard let m = mapping(item, path: path, section: "rooms") else { continue }
            guard let idEntry = m["id"] else { report(item, path + ".id", "missing: give the room an id, like \"id: hall\""); continue }
            guard let id = text(idEntry, expected: "a room id") else { continue }
            guard validRoomID(id) else {
                report(idEntry.value, idEntry.key,
                       "use 1 to \(Scenario.maxRoomIDLength) of a-z, 0-9, _ and - (it names the room's socket and "
                       + "usually its gateway's id), got \(quoted(id))")
                continue
            }
            if rooms.contains(where: { $0.id == id }) {
                report(idEntry.value, idEntry.key, "room \(quoted(id)) is listed twice")
                continue
            }
            var room = Scenario.Room(id: id, name: id, x: Double(i))
            if let n = m["name"], let t = name(n, expected: "the room's name") { room.name = t }
            if let n = m["x"], let v = number(n, -1000...1000, "a position in room units") { room.x = v }
            if let n = m["y"], let v = number(n, -1000...1000, "a position in room units") { room.y = v }
            if let n = m["noise"], let v = number(n, 0...30, "dB") { room.noise = v }
            if let n = m["loss"], let v = number(n, 0...1, "a fraction from 0 to 1") { room.loss = v }
            rooms.append(room)
        }
        roomIDs = rooms.map(\.id)
        return rooms
    }

    mutating func readDevices(_ e: ScenarioEntry, end: Double?) -> [Scenario.Device] {
        guard let items = list(e, expected: "a list of devices, like \"- {id: 5a0000000001, at: hall}\"") else { return [] }
        guard items.count <= Scenario.maxDevices else {
            report(e.value, e.key, "at most \(Scenario.maxDevices) devices, got \(items.count)")
            return []
        }
        var devices: [Scenario.Device] = []
        var lines: [UInt64: Int] = [:]
        for (i, item) in items.enumerated() {
            let path = "\(e.key)[\(i)]"
            guard let m = mapping(item, path: path, section: "devices") else { continue }
            var ok = true
            var id: UInt64 = 0
            if let n = m["id"] {
                if let v = deviceID(n) {
                    id = v
                    if let first = lines[v] {
                        report(n.value, n.key, "device \(hex12(v)) is listed twice (first on line \(first))")
                        ok = false
                    }
                    lines[v] = n.keyLine
                } else {
                    ok = false
                }
            } else {
                report(item, path + ".id", "missing: give the device's 12-hex-digit id, like \"id: 5a0000000001\"")
                ok = false
            }
            var place = Scenario.Place.point(x: 0, y: 0)
            if let n = m["at"] {
                if let p = self.place(n.value, key: n.key) { place = p } else { ok = false }
            } else {
                report(item, path + ".at", "missing: say where the device starts, like \"at: hall\"")
                ok = false
            }
            var device = Scenario.Device(id: id, name: hex12(id), type: Scenario.defaultType, place: place)
            if let n = m["name"], let t = name(n, expected: "the device's name") { device.name = t }
            if let n = m["type"], let t = activityType(n) { device.type = t }
            if let n = m["streams"], let b = bool(n) { device.streams = b }
            if let n = m["web-url"], let b = bool(n) { device.webURL = b }
            if let n = m["script"] { device.script = readScript(n, end: end) }
            if let n = m["title"], let t = name(n, expected: "the activity's title") { device.title = t }
            if let n = m["link"], let b = bool(n) { device.link = b }
            if let n = m["group-secret"], let t = name(n, expected: "a group secret like BATON-GROUP-V1:…") {
                do throws(KeyTextError) {
                    device.groupSecret = try GroupSecret(text: t).text
                } catch {
                    report(n.value, n.key, "\(error)")
                }
            }
            for key in ["identity", "rotate"] where m[key] != nil && m["group-secret"] == nil {
                report(m[key]!.value, m[key]!.key, "needs group-secret: only a keyed group's ids rotate and resolve (docs/security.md §3)")
            }
            if let n = m["identity"], let v = integer(n, 0...65_535) { device.identity = UInt16(v) }
            if let n = m["rotate"], let v = number(n, 0...86_400, "simulated seconds between id rotations") { device.rotate = v }
            if let n = m["payload-bytes"], let v = integer(n, Scenario.payloadBytesRange) {
                var types = [device.type]
                for step in device.script { if case .becomeCurrent(let t) = step.action { types.append(t) } }
                if payloadBytes(v, fit: n, types: types, names: [device.name], title: device.title, webURL: device.webURL) {
                    device.payloadBytes = v
                }
            }
            if ok { devices.append(device) }
        }
        return devices
    }

    mutating func readScript(_ e: ScenarioEntry, end: Double?) -> [Scenario.Step] {
        guard let items = list(e, expected: "a list of steps, like \"- {at: 10, walk: kitchen}\"") else { return [] }
        var steps: [Scenario.Step] = []
        let actions = ["walk", "save", "become-current", "invalidate", "silent", "resume"]
        for (i, item) in items.enumerated() {
            let path = "\(e.key)[\(i)]"
            guard let m = mapping(item, path: path, section: "script") else { continue }
            let given = actions.filter { m.entries[$0] != nil }
            guard given.count == 1, let name = given.first, let a = m.entries[name] else {
                let message = given.isEmpty ? "a step needs one of " + YAMLText.listed(actions)
                                            : "one action per step, got " + YAMLText.listed(given) + ": write a step for each"
                report(item, path, message)
                continue
            }
            guard let atEntry = m["at"] else {
                report(item, path + ".at", "missing: give the simulated second of the step, like \"at: 10\"")
                continue
            }
            guard let at = number(atEntry, 0...1e7, "simulated seconds") else { continue }
            if let end, at > end {
                report(atEntry.value, atEntry.key, "\(formatNumber(at)) is after the end (duration \(formatNumber(end)))")
                continue
            }
            let action: Scenario.Action
            switch name {
            case "walk":
                guard let p = place(a.value, key: a.key) else { continue }
                action = .walk(p)
            case "become-current":
                guard let t = activityType(a) else { continue }
                action = .becomeCurrent(t)
            default:
                guard let b = bool(a) else { continue }
                guard b else {
                    report(a.value, a.key, "write \"\(name): true\", or leave the step out")
                    continue
                }
                switch name {
                case "save": action = .save
                case "invalidate": action = .invalidate
                case "silent": action = .silent
                default: action = .resume
                }
            }
            steps.append(Scenario.Step(at: at, action))
        }
        return steps
    }

    mutating func readCrowd(_ m: Mapping, scripted: [Scenario.Device]) -> Scenario.Crowd? {
        var count: Int?
        if let e = m["count"] {
            let room = Scenario.maxDevices - scripted.count
            count = integer(e, 1...max(1, room))
        } else {
            report(m.node, "crowd.count", "missing: how many devices, like \"count: 1000\"")
        }
        var first: UInt64?
        if let e = m["first-id"] {
            first = deviceID(e)
            if let f = first, let c = count {
                // Proof: f <= 0xFFFF_FFFF_FFFF and c <= maxDevices, far from UInt64's range.
                let last = f + UInt64(c) - 1
                if last > 0xFFFF_FFFF_FFFF {
                    report(e.value, e.key, "the crowd's ids would run past ffffffffffff: start lower")
                    first = nil
                } else if let d = scripted.first(where: { (f...last).contains($0.id) }) {
                    report(e.value, e.key, "the crowd's ids \(hex12(f))…\(hex12(last)) include device \(hex12(d.id)) "
                           + "(\(d.name)): start the crowd elsewhere")
                    first = nil
                }
            }
        } else {
            report(m.node, "crowd.first-id", "missing: the first crowd device's id, like \"first-id: 5b0000000000\"")
        }
        var crowd = Scenario.Crowd(count: count ?? 1, firstID: first ?? 0)
        if let e = m["wander"], let v = number(e, 0...1e7, "simulated seconds (0: never)") { crowd.wander = v }
        if let e = m["walk"], let t = text(e, expected: "where a wandering device walks") {
            if let w = Scenario.Walk(rawValue: t) {
                crowd.walk = w
            } else {
                report(e.value, e.key, "expected one of " + YAMLText.listed(Scenario.Walk.allCases.map(\.rawValue)) + ", got \"\(t)\"")
            }
        }
        if let e = m["type"], let t = activityType(e) { crowd.type = t }
        if let e = m["title"], let t = name(e, expected: "the activity's title") { crowd.title = t }
        if let e = m["link"], let b = bool(e) { crowd.link = b }
        if let e = m["payload-bytes"], let v = integer(e, Scenario.payloadBytesRange) {
            // The longest name is the last device's.
            let names = ["crowd-\(max(0, (count ?? 1) - 1))"]
            if payloadBytes(v, fit: e, types: crowd.type.map { [$0] } ?? CaptureGenerator.activityTypes, names: names,
                            title: crowd.title, webURL: false) {
                crowd.payloadBytes = v
            }
        }
        guard count != nil, first != nil else { return nil }
        return crowd
    }

    mutating func readBTHome(_ e: ScenarioEntry) -> [Scenario.BTHomeSensor] {
        guard let items = list(e, expected: "a list of BTHome sensors, like \"- {at: hall, temperature: 21.5}\"") else {
            return []
        }
        guard items.count <= Scenario.maxBTHomeSensors else {
            report(e.value, e.key, "at most \(Scenario.maxBTHomeSensors) BTHome sensors, got \(items.count)")
            return []
        }
        var sensors: [Scenario.BTHomeSensor] = []
        var lines: [UInt64: Int] = [:]
        for (i, item) in items.enumerated() {
            let path = "\(e.key)[\(i)]"
            guard let m = mapping(item, path: path, section: "bthome") else { continue }
            var ok = true
            var sensor = Scenario.BTHomeSensor(place: .point(x: 0, y: 0))
            if let n = m["at"] {
                if let p = place(n.value, key: n.key) { sensor.place = p } else { ok = false }
            } else {
                report(item, path + ".at", "missing: say where the sensor is, like \"at: hall\"")
                ok = false
            }
            if let n = m["name"], let t = text(n, expected: "the sensor's name") {
                // It goes in the advertisement, beside the measurements (BTHome.maxNameBytes).
                if t.isEmpty || t.utf8.count > BTHome.maxNameBytes {
                    report(n.value, n.key, "expected the sensor's name, 1 to \(BTHome.maxNameBytes) bytes (what fits in "
                           + "its advertisement), got \(t.utf8.count)")
                    ok = false
                } else {
                    sensor.name = t
                }
            }
            if let n = m["address"] {
                if let v = deviceID(n, expected: "a public address like A4:C1:38:00:00:01") {
                    sensor.address = v
                    if let first = lines[v] {
                        report(n.value, n.key, "address \(hex12(v)) is given twice (first on line \(first))")
                        ok = false
                    }
                    lines[v] = n.keyLine
                } else {
                    ok = false
                }
            }
            if let n = m["temperature"] {
                if let v = number(n, BTHome.temperatureRange, "°C") { sensor.temperature = v } else { ok = false }
            }
            if let n = m["humidity"] {
                if let v = number(n, BTHome.humidityRange, "%") { sensor.humidity = v } else { ok = false }
            }
            if m["temperature"] == nil, m["humidity"] == nil {
                report(item, path, "a BTHome sensor measures something: give temperature (°C) or humidity (%)")
                ok = false
            }
            if ok { sensors.append(sensor) }
        }
        return sensors
    }

    /// Whether a payload of the device's padded to `bytes` can be exactly that size: its
    /// largest unpadded form (any of its activity types, a sequence of three CBOR bytes) plus
    /// the smallest padding entry.
    mutating func payloadBytes(_ bytes: Int, fit e: ScenarioEntry, types: [String], names: [String], title: String?,
                               webURL: Bool) -> Bool {
        var least = 0
        for type in types {
            for name in names {
                let size = SimulatedPayload.unpadded(type: type, title: title ?? name, name: name, webURL: webURL,
                                                     sequence: .max).count
                least = max(least, size + SimulatedPayload.leastPadding)
            }
        }
        guard bytes >= least else {
            report(e.value, e.key, "must be at least \(least) for this device (its payload without padding takes up "
                   + "to \(least - SimulatedPayload.leastPadding) bytes), got \(bytes)")
            return false
        }
        return true
    }

    // MARK: Places

    /// A room id, `{between: [a, b]}` or `{x: …, y: …}`.
    mutating func place(_ node: YAMLNode, key: String) -> Scenario.Place? {
        let expected = "a room id, {between: [a, b]} or {x: …, y: …}"
        switch node.kind {
        case .scalar(let s):
            return room(s.string, node: node, key: key).map { .room($0) }
        case .mapping:
            guard let m = mapping(node, path: key, section: "place") else { return nil }
            if let b = m["between"] {
                if m["x"] != nil || m["y"] != nil {
                    report(node, key, "give between or x and y, not both")
                    return nil
                }
                guard case .sequence(let seq) = b.value.kind, seq.count == 2,
                      let first = seq[0].scalar, let second = seq[1].scalar else {
                    report(b.value, b.key, "expected two room ids, like \"between: [hall, kitchen]\", got \(yaml.describe(b.value))")
                    return nil
                }
                guard let r1 = room(first.string, node: seq[0], key: b.key),
                      let r2 = room(second.string, node: seq[1], key: b.key) else { return nil }
                guard r1 != r2 else {
                    report(b.value, b.key, "two different rooms, got \(quoted(r1)) twice")
                    return nil
                }
                return .between(r1, r2)
            }
            guard let xe = m["x"] else {
                report(node, key, "expected \(expected)")
                return nil
            }
            guard let x = number(xe, -1000...1000, "a position in room units") else { return nil }
            var y = 0.0
            if let ye = m["y"] {
                guard let v = number(ye, -1000...1000, "a position in room units") else { return nil }
                y = v
            }
            return .point(x: x, y: y)
        case .sequence:
            report(node, key, "expected \(expected), got \(yaml.describe(node))")
            return nil
        }
    }

    mutating func room(_ id: String, node: YAMLNode, key: String) -> String? {
        if roomIDs.contains(id) { return id }
        var message = "no room \(quoted(id))"
        if let best = closest(to: id, among: roomIDs) {
            message += " (did you mean \(quoted(best))?)"
        } else if !roomIDs.isEmpty {
            message += "; the rooms are " + YAMLText.listed(roomIDs.map(quoted))
        }
        report(node, key, message)
        return nil
    }

    // MARK: Mappings and lists

    /// A mapping's entries by key: an unknown key or a key given twice is reported and left
    /// out.
    mutating func mapping(_ node: YAMLNode, path: String, section: String) -> Mapping? {
        let what = path.isEmpty ? "keys like \"duration: 60\" at the top of the file"
                                : "\"key: value\" entries (a mapping)"
        return yaml.section(node, path: path, known: Scenario.keys(of: section), expected: what) { name in
            var message = "unknown key"
            if let hint = Self.suggestion(for: name, in: section) { message += " (\(hint))" }
            return (path.isEmpty ? name : path + "." + name, message)
        }
    }

    static func suggestion(for name: String, in section: String) -> String? {
        if let best = closest(to: name, among: Scenario.keys(of: section)) { return "did you mean \(quoted(best))?" }
        let lower = name.lowercased()
        for (other, keys) in Scenario.schema where other != section && keys.contains(lower) {
            return other.isEmpty ? "\(quoted(lower)) belongs at the top of the file, not indented"
                                 : "\(quoted(lower)) is a key of \(other)"
        }
        return "the keys here are " + YAMLText.listed(Scenario.keys(of: section).map(quoted))
    }

    mutating func list(_ e: ScenarioEntry, expected: String) -> [YAMLNode]? {
        yaml.list(e, expected: expected)
    }

    // MARK: Values

    mutating func text(_ e: ScenarioEntry, expected: String) -> String? {
        yaml.text(e, expected: expected)
    }

    /// A name people read in the simulator's lines; short, so a line stays a line.
    mutating func name(_ e: ScenarioEntry, expected: String) -> String? {
        guard let t = text(e, expected: expected) else { return nil }
        guard !t.isEmpty, t.utf8.count <= Scenario.maxNameBytes else {
            report(e.value, e.key, "expected \(expected), 1 to \(Scenario.maxNameBytes) bytes, got \(t.utf8.count)")
            return nil
        }
        return t
    }

    mutating func bool(_ e: ScenarioEntry) -> Bool? {
        yaml.bool(e)
    }

    mutating func integer(_ e: ScenarioEntry, _ range: ClosedRange<Int>, hex: Bool = false) -> Int? {
        let expected = hex ? "a number like 0xFFFF" : "a whole number"
        guard let t = text(e, expected: expected) else { return nil }
        // No leading `+`, which Swift's `Int` and `Double` accept: no value is written with a
        // plus, so one is more likely a slip than a sign (issue 16), as in the config file.
        if t.hasPrefix("+") {
            report(e.value, e.key, "expected \(expected), got \(quoted(t)): write it without the +")
            return nil
        }
        guard let n = YAMLText.integer(t) else {
            report(e.value, e.key, "expected \(expected), got \(quoted(t))")
            return nil
        }
        guard range.contains(n) else {
            report(e.value, e.key, "must be between \(range.lowerBound) and \(range.upperBound), got \(t)")
            return nil
        }
        return n
    }

    mutating func number(_ e: ScenarioEntry, _ range: ClosedRange<Double>, _ unit: String) -> Double? {
        guard let v = anyNumber(e, unit) else { return nil }
        guard range.contains(v) else {
            report(e.value, e.key, "must be between \(formatNumber(range.lowerBound)) and "
                   + "\(formatNumber(range.upperBound)) (\(unit)), got \(formatNumber(v))")
            return nil
        }
        return v
    }

    mutating func number(_ e: ScenarioEntry, above low: Double, atMost high: Double, _ unit: String) -> Double? {
        guard let v = anyNumber(e, unit) else { return nil }
        guard v > low, v <= high else {
            report(e.value, e.key, "must be more than \(formatNumber(low)) and at most \(formatNumber(high)) "
                   + "(\(unit)), got \(formatNumber(v))")
            return nil
        }
        return v
    }

    mutating func anyNumber(_ e: ScenarioEntry, _ unit: String) -> Double? {
        guard let t = text(e, expected: "a number (\(unit))") else { return nil }
        guard !t.hasPrefix("+") else {
            report(e.value, e.key, "expected a number (\(unit)), got \(quoted(t)): write it without the +")
            return nil
        }
        guard let v = Double(t), v.isFinite else {
            var message = "expected a number (\(unit)), got \(quoted(t))"
            if t.hasSuffix("s"), Double(t.dropLast()) != nil { message += ": write the number alone" }
            report(e.value, e.key, message)
            return nil
        }
        return v
    }

    /// 12 hex digits, optionally written with colons like a BD_ADDR (`5A:00:00:00:00:01`).
    mutating func deviceID(_ e: ScenarioEntry, expected: String? = nil) -> UInt64? {
        let what = expected ?? "a device id of 12 hex digits"
        guard let t = text(e, expected: what) else { return nil }
        let digits = t.filter { $0 != ":" }
        guard digits.count == 12, digits.allSatisfy(\.isHexDigit), let v = UInt64(digits, radix: 16) else {
            report(e.value, e.key, expected.map { "expected \($0), got \(quoted(t))" }
                   ?? "expected a device id of 12 hex digits (48 bits, docs/protocol.md §2.4), like 5a0000000001, got \(quoted(t))")
            return nil
        }
        return v
    }

    mutating func activityType(_ e: ScenarioEntry) -> String? {
        guard let t = text(e, expected: "an activity type like com.example.reader.article") else { return nil }
        // docs/payload.md §2.1: the devices send it in their payloads, which a gateway checks.
        let labels = t.split(separator: ".", omittingEmptySubsequences: false)
        let valid = labels.count >= 2 && labels.allSatisfy { label in
            !label.isEmpty && label.unicodeScalars.allSatisfy {
                ("a"..."z").contains($0) || ("A"..."Z").contains($0) || ("0"..."9").contains($0) || $0 == "-" || $0 == "_"
            }
        }
        guard valid, t.utf8.count <= 255 else {
            report(e.value, e.key, "expected an activity type like com.example.reader.article "
                   + "(reverse DNS: two or more labels of A-Z, a-z, 0-9, - and _, at most 255 bytes), got \(quoted(t))")
            return nil
        }
        return t
    }

    func validRoomID(_ id: String) -> Bool {
        !id.isEmpty && id.unicodeScalars.count <= Scenario.maxRoomIDLength && id.unicodeScalars.allSatisfy {
            ("a"..."z").contains($0) || ("0"..."9").contains($0) || $0 == "_" || $0 == "-"
        }
    }
}

// MARK: - Small helpers

func quoted(_ s: String) -> String { "\"" + s + "\"" }

/// `60` rather than `60.0`, and `0.5` as is.
func formatNumber(_ v: Double) -> String {
    v == v.rounded() && abs(v) < 1e15 ? String(Int64(v)) : String(v)
}

/// A device id as the simulator prints it: as topics do (`ActivityBeacon.deviceIDText`).
public func hex12(_ v: UInt64) -> String { ActivityBeacon.deviceIDText(v) }

/// The known name within a small edit distance (a typo, `_` for `-`, another case), if any.
func closest(to name: String, among candidates: [String]) -> String? {
    YAMLText.closest(to: name, among: candidates, shortName: 3)
}
