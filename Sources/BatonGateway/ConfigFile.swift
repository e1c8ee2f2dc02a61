// Reading and checking the config file: YAML (docs/config.md), composed by BatonYAML (on
// libyaml) into nodes that keep their line numbers, then walked section by section against
// `ConfigSchema` with BatonYAML's schema checks.
//
// The whole file is checked before anything is refused: every problem becomes a
// `ConfigError` with file, line and key, sorted into file order, and the first is thrown with
// the rest in `others`. An unknown key gets a suggestion (a close spelling, or the section it
// belongs to). A key that is absent, empty or `~` keeps its default.
import BatonLibc
import CLibc
import BatonYAML
import BatonCore
import BatonMQTT
import BatonRelay
import BatonKeys
import BatonWire
import BatonProxy

/// Every key the file may hold, section by section, in the order docs/config.md lists them.
/// Unknown-key suggestions search it; the tests check docs/config.md and board/baton.yaml
/// against it, so a key cannot be added without its documentation.
enum ConfigSchema {
    static let sections: [(path: String, keys: [String])] = [
        ("", ["gateway", "broker", "topics", "radio", "table", "apple", "rooms", "relay", "security", "status", "log",
              "activity-types", "esphome"]),
        ("gateway", ["id", "room"]),
        ("broker", ["url", "client-id", "username", "password", "password-file", "keepalive", "protocol",
                    "max-qos", "reconnect-min", "reconnect-max", "tls"]),
        ("broker.tls", ["ca-file", "cert-file", "key-file", "insecure", "psk-identity", "psk", "psk-file"]),
        ("topics", ["prefix", "discovery", "discovery-prefix"]),
        ("radio", ["source", "paced", "silence", "company-id", "reassembly", "gather"]),
        ("table", ["capacity", "expiry"]),
        ("apple", ["tracking", "capacity", "expiry", "publish-address", "irks"]),
        ("rooms", ["sighting-interval", "sighting-step", "sighting-min-interval", "sighting-fresh", "lost-after",
                   "settle", "margin", "reach", "dwell", "walk-dwell", "walk-window", "calm", "calm-per-contest", "capacity", "gateways", "batches", "neighbourhoods"]),
        ("relay", ["link", "fetch-timeout", "link-idle", "fetches", "cache", "links", "payload-max", "streams",
                   "stream-window", "stream-max-data", "stream-retry", "stream-idle", "readvertise", "fetch-titles"]),
        ("security", ["beacon-key", "beacon-key-file", "identities", "unkeyed"]),
        ("status", ["interval"]),
        ("log", ["level"]),
        ("esphome", ["encryption-key", "encryption", "address", "port", "clients", "name", "friendly-name", "mac",
                     "mdns-service-file", "scan-mode", "connections"]),
    ]

    static func keys(of path: String) -> [String] {
        sections.first { $0.path == path }?.keys ?? []
    }

    /// Every key that holds a value, dotted (`broker.tls.ca-file`); sections are not listed.
    static var valueKeys: [String] {
        var result: [String] = []
        for (path, keys) in sections where !path.isEmpty {
            for key in keys where !sections.contains(where: { $0.path == path + "." + key }) {
                result.append(path + "." + key)
            }
        }
        return result
    }

    /// What to say after `unknown key "…"`.
    static func suggestion(for name: String, in path: String) -> String? {
        let full = path.isEmpty ? name : path + "." + name
        // `broker.url: …` written as one key: YAML nests by indentation instead.
        if name.contains("."), valueKeys.contains(full) || sections.contains(where: { $0.path == full }) {
            let parts = full.split(separator: ".").map { "\"\($0):\"" }
            return "keys nest by indentation: write " + parts.joined(separator: ", then indented under it ")
        }
        if let best = closest(to: name, among: keys(of: path)) {
            return "did you mean \(quoted(best))?"
        }
        let lower = name.lowercased()
        if !path.isEmpty, keys(of: "").contains(lower) {
            return "\(quoted(lower)) is a section of its own: start it at the beginning of a line, not indented"
        }
        for (other, keys) in sections where other != path && !other.isEmpty && keys.contains(lower) {
            return "did you mean \(quoted(other + "." + lower))?"
        }
        return nil
    }

    /// The known key within a small edit distance (a typo, `_` for `-`, another case), if any.
    static func closest(to name: String, among candidates: [String]) -> String? {
        YAMLText.closest(to: name, among: candidates, shortName: 4)
    }
}

// MARK: - Loading

/// A config file is a few kilobytes; anything past this is the wrong file.
let maxConfigFileBytes = 1 << 20
/// A password file holds one line.
let maxPasswordFileBytes = 64 << 10

extension GatewayConfig {
    /// Reads and checks the config file at `path`. A missing or unreadable file, bytes that are
    /// not UTF-8, a YAML syntax error and every bad setting are a `ConfigError`.
    public static func load(file path: String, hostName: String) throws(ConfigError) -> GatewayConfig {
        let bytes: [UInt8]
        do throws(ConfigValueError) {
            bytes = try readFile(path, limit: maxConfigFileBytes)
        } catch {
            throw ConfigError(file: path, line: nil, key: "", message: "cannot read the config file: \(error.message)")
        }
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw ConfigError(file: path, line: firstInvalidUTF8Line(bytes), key: "",
                              message: "not UTF-8 text (save the file as UTF-8)")
        }
        return try parse(yaml: text, file: path, hostName: hostName)
    }

    /// Checks `text` as the contents of the config file `file`: `file` names the file in
    /// errors, and relative paths in the settings are taken from its directory.
    public static func parse(yaml text: String, file: String, hostName: String) throws(ConfigError) -> GatewayConfig {
        // Nesting past YAMLComposer.maxDepth is refused here, so the walk below stays shallow.
        let (root, tags) = try YAMLComposer.compose(text, file: file)
        var config = defaults(hostName: hostName)
        var reader = ConfigFileReader(file: file)
        if let root { reader.read(root, into: &config) }
        // File order; problems found by later cross-checks slot in by line.
        try YAMLFileError.throwFirst(tags + reader.errors)
        return config
    }

}

/// The line (from 1) holding the first byte that is not UTF-8.
func firstInvalidUTF8Line(_ bytes: [UInt8]) -> Int {
    var line = 1
    for piece in bytes.split(separator: 0x0A, omittingEmptySubsequences: false) {
        if String(validating: piece, as: UTF8.self) == nil { return line }
        line += 1
    }
    return line
}

/// Reads a whole small file. The error is the reason alone (`No such file or directory`); the
/// caller says which file and what it was for.
func readFile(_ path: String, limit: Int) throws(ConfigValueError) -> [UInt8] {
    let fd = try openForReading(path)
    defer { close(fd) }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 4096)
    while true {
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 {
            if errno == EINTR { continue }
            throw ConfigValueError(String(cString: strerror(errno)))
        }
        if n == 0 { return bytes }
        guard bytes.count + n <= limit else {
            throw ConfigValueError("larger than \(limit / 1024) KiB: is it the right file?")
        }
        bytes += chunk[..<n]
    }
}

/// Opens `path` for reading, refusing a directory. The error is the reason alone.
func openForReading(_ path: String) throws(ConfigValueError) -> Int32 {
    var fd: Int32
    repeat { fd = open(path, O_RDONLY | O_CLOEXEC) } while fd < 0 && errno == EINTR
    guard fd >= 0 else { throw ConfigValueError(String(cString: strerror(errno))) }
    var info = stat()
    if fstat(fd, &info) == 0, info.st_mode & mode_t(S_IFMT) == mode_t(S_IFDIR) {
        close(fd)
        throw ConfigValueError("it is a directory")
    }
    return fd
}

// MARK: - Walking the document

/// One `key: value` of a section; `key` is dotted (`broker.keepalive`): what errors name.
typealias ConfigEntry = YAMLEntry

struct ConfigFileReader {
    /// A section's entries by key name. Absent, empty and `~` values read as absent.
    typealias Section = YAMLSection

    /// Relative paths in the file are taken from the file's directory, not from wherever the
    /// service happens to start (systemd starts it in /).
    let directory: String
    private(set) var yaml: YAMLReader
    var errors: [ConfigError] { yaml.errors }

    init(file: String) {
        yaml = YAMLReader(file: file, mappingName: "a section of keys", quote: quoted)
        if let slash = file.lastIndex(of: "/") {
            directory = slash == file.startIndex ? "/" : String(file[..<slash])
        } else {
            directory = ""
        }
    }

    /// `relay.readvertise`, checked against the security section read after it.
    var readvertiseEntry: ConfigEntry?

    mutating func report(line: Int?, _ key: String, _ message: String) {
        yaml.report(line: line, key, message)
    }

    mutating func report(_ node: YAMLNode, _ key: String, _ message: String) {
        yaml.report(node, key, message)
    }

    // MARK: Sections

    mutating func read(_ root: YAMLNode, into c: inout GatewayConfig) {
        guard let top = section(root, path: "") else { return }
        if let s = subsection(top["gateway"]) { readGateway(s, into: &c) }
        if let s = subsection(top["broker"]) { readBroker(s, into: &c) }
        if let s = subsection(top["topics"]) { readTopics(s, into: &c) }
        if let s = subsection(top["radio"]) { readRadio(s, into: &c) }
        if let s = subsection(top["table"]) {
            if let e = s["capacity"], let n = integer(e, 1...100_000) { c.table.capacity = n }
            if let e = s["expiry"], let d = duration(e, atLeast: .seconds(1)) { c.table.expiry = d }
        }
        if let s = subsection(top["apple"]) {
            if let e = s["tracking"], let t = choice(e, AppleTracking.allCases.map { ($0.rawValue, $0) }) {
                c.apple.tracking = t
            }
            if let e = s["capacity"], let n = integer(e, 1...100_000) { c.apple.capacity = n }
            if let e = s["expiry"], let d = duration(e, atLeast: .seconds(1)) { c.apple.expiry = d }
            if let e = s["publish-address"], let b = bool(e) { c.appleAddresses = b }
            if let e = s["irks"] {
                readIRKs(e, into: &c)
                if c.apple.tracking == .off, !c.appleIRKs.isEmpty {
                    report(line: e.keyLine, e.key, "apple.tracking is off, so no Apple device is followed, named or not: set it to handoff or all")
                }
            }
        }
        if let s = subsection(top["rooms"]) { readRooms(s, into: &c) }
        c.rooms.forgetAfter = c.table.expiry
        if let s = subsection(top["relay"]) { readRelay(s, into: &c) }
        if let s = subsection(top["security"]) { readSecurity(s, into: &c) }
        if let e = readvertiseEntry, c.readvertise > 0, c.security.beaconKey == nil {
            // A relayed beacon is tagged with the group's key, so a phone can tell it from a
            // forgery (docs/relay.md §9); without a key there is nothing to tag it with.
            report(e.value, e.key, "re-advertising needs the group's beacon key: set security.beacon-key (or beacon-key-file) too")
        }
        if let e = top["activity-types"] { readActivityTypes(e, into: &c) }
        if let s = subsection(top["status"]) {
            if let e = s["interval"], let d = duration(e, atLeast: .seconds(1)) { c.statusInterval = d }
        }
        if let e = top["esphome"], let s = subsection(e) { readESPHome(e, s, into: &c) }
        if let s = subsection(top["log"]) {
            if let e = s["level"], let level = choice(e, Logger.Level.allCases.map { ($0.rawValue, $0.rawValue) }) {
                c.logLevel = level
            }
        }
    }

    /// docs/rooms.md §3. The bounds keep the rule meaningful: a heartbeat must arrive before
    /// its sighting goes stale, and a device must be called lost before a table expires it.
    mutating func readRooms(_ s: Section, into c: inout GatewayConfig) {
        let ms100 = Duration.milliseconds(100)
        if let e = s["sighting-interval"], let d = duration(e, atLeast: ms100, atMost: .seconds(600)) {
            c.rooms.sightingInterval = d
        }
        if let e = s["sighting-step"], let n = integer(e, 1...60) { c.rooms.sightingStep = n }
        if let e = s["sighting-min-interval"], let d = duration(e, atLeast: .milliseconds(10), atMost: .seconds(600)) {
            c.rooms.sightingMinInterval = d
        }
        if let e = s["sighting-fresh"], let d = duration(e, atLeast: ms100, atMost: .seconds(3600)) {
            c.rooms.sightingFresh = d
            if d <= c.rooms.sightingInterval {
                report(e.value, e.key, "must be longer than rooms.sighting-interval (\(formatDuration(c.rooms.sightingInterval))), or every heartbeat would arrive stale")
            }
        }
        if let e = s["lost-after"], let d = duration(e, atLeast: ms100, atMost: .seconds(3600)) {
            c.rooms.lostAfter = d
            if d >= c.table.expiry {
                report(e.value, e.key, "must be shorter than table.expiry (\(formatDuration(c.table.expiry))), so other rooms take a device over before this one forgets it")
            }
        }
        if let e = s["settle"], let d = duration(e, atLeast: .zero, atMost: .seconds(60)) { c.rooms.settle = d }
        if let e = s["margin"], let n = integer(e, 0...60) { c.rooms.margin = n }
        if let e = s["reach"], let n = integer(e, 0...127) { c.rooms.reach = n }
        if let e = s["dwell"], let d = duration(e, atLeast: .zero, atMost: .seconds(600)) { c.rooms.dwell = d }
        if let e = s["walk-dwell"], let d = duration(e, atLeast: .zero, atMost: .seconds(600)) { c.rooms.walkDwell = d }
        if let e = s["walk-window"], let d = duration(e, atLeast: .zero, atMost: .seconds(600)) { c.rooms.walkWindow = d }
        if let e = s["calm"], let d = duration(e, atLeast: .zero, atMost: .seconds(3600)) { c.rooms.calm = d }
        if let e = s["calm-per-contest"], let d = duration(e, atLeast: .zero, atMost: .seconds(3600)) { c.rooms.calmPerContest = d }
        if let e = s["capacity"], let n = integer(e, 1...100_000) { c.rooms.capacity = n }
        if let e = s["gateways"], let n = integer(e, 1...1024) { c.rooms.gateways = n }
        if let e = s["batches"], let b = bool(e) { c.sightingBatches = b }
        if let e = s["neighbourhoods"], let b = bool(e) { c.neighbourhoods = b }
    }

    /// docs/relay.md §5.
    mutating func readRelay(_ s: Section, into c: inout GatewayConfig) {
        if let e = s["link"], let spec = value(e, expected: "auto, none, bluez:ADAPTER or sim:SOCKET", ConfigValue.relayLink) {
            c.relayLink = spec
        }
        if let e = s["fetch-timeout"], let d = duration(e, atLeast: .milliseconds(100), atMost: .seconds(600)) {
            c.relay.fetchTimeout = d
        }
        if let e = s["link-idle"], let d = duration(e, atLeast: .zero, atMost: .seconds(3600)) { c.relay.linkIdle = d }
        if let e = s["fetches"], let n = integer(e, 1...4096) { c.relay.fetches = n }
        if let e = s["cache"], let n = integer(e, 0...4096) { c.relay.cache = n }
        if let e = s["links"], let n = integer(e, 1...256) { c.relay.links = n }
        // 65,532: the largest payload a 65,535-byte SDU carries after its 3-byte header.
        if let e = s["payload-max"], let n = integer(e, 64...65_532) { c.relay.payloadMax = n }
        if let e = s["streams"], let n = integer(e, 0...1024) { c.relay.streams = n }
        if let e = s["stream-window"], let n = integer(e, 1...1024) { c.relay.streamWindow = n }
        if let e = s["stream-max-data"], let n = integer(e, 1...65_530) {
            c.relay.streamMaxData = n
            // A device's data message (5 bytes of header) must fit the link's receive MTU,
            // which is sized for the largest payload message (docs/protocol.md §5.1).
            if n + 5 > c.relay.payloadMax + 3 {
                report(e.value, e.key, "must be at most relay.payload-max - 2 (\(c.relay.payloadMax - 2)): a data frame must fit the link's MTU")
            }
        }
        if let e = s["stream-retry"], let d = duration(e, atLeast: .milliseconds(50), atMost: .seconds(60)) {
            c.relay.streamRetry = d
        }
        if let e = s["stream-idle"], let d = duration(e, atLeast: .seconds(1), atMost: .seconds(86_400)) {
            c.relay.streamIdle = d
        }
        // One mgmt advertising instance and one L2CAP listener each (docs/relay.md §9);
        // controllers offer a handful of instances (BlueZ's software rotation: 5 by default).
        if let e = s["fetch-titles"], let b = bool(e) { c.fetchTitles = b }
        if let e = s["readvertise"], let n = integer(e, 0...16) {
            c.readvertise = n
            readvertiseEntry = e
        }
    }

    /// `activity-types:`: a list of reverse-DNS activity types (docs/mqtt.md §2), each hashed
    /// at start to name the beacons that carry its hash.
    mutating func readActivityTypes(_ e: ConfigEntry, into c: inout GatewayConfig) {
        guard case .sequence(let items) = e.value.kind else {
            report(e.value, e.key, "expected a list of activity types, one \"- com.example.app.activity\" line each, got \(yaml.describe(e.value))")
            return
        }
        var seen: [UInt32: String] = [:]
        for item in items {
            guard case .scalar(let scalar) = item.kind else {
                report(item, e.key, "expected an activity type like com.example.reader.article, got \(yaml.describe(item))")
                continue
            }
            let type = scalar.string
            guard type.utf8.count <= 255, ActivityPayload.isActivityType(type) else {
                report(item, e.key, "\(quoted(type)) is not an activity type: reverse-DNS, two or more labels of A-Z a-z 0-9 _ - joined by dots (docs/payload.md §2.1), at most 255 bytes")
                continue
            }
            let hash = activityTypeHash(type.utf8)
            if let other = seen[hash] {
                report(item, e.key, other == type ? "\(quoted(type)) is listed twice"
                       : "\(quoted(type)) has the same hash as \(quoted(other)) (FNV-1a 32): the gateway cannot tell them apart")
                continue
            }
            seen[hash] = type
            c.activityTypes.append(type)
        }
    }

    /// `apple.irks`: `name: IRK` lines, one per device (docs/security.md §10). The names are
    /// the user's, so this mapping's keys are not checked against the schema.
    mutating func readIRKs(_ e: ConfigEntry, into c: inout GatewayConfig) {
        guard case .mapping(let pairs) = e.value.kind else {
            report(e.value, e.key, "expected one \"name: IRK\" line per device indented under it, got \(yaml.describe(e.value))")
            return
        }
        var lines: [String: Int] = [:]
        for pair in pairs {
            let keyNode = pair.key, value = pair.value
            guard let k = keyNode.scalar, !k.string.isEmpty else {
                report(keyNode, e.key, "expected a device's name, got \(yaml.describe(keyNode))")
                continue
            }
            let name = k.string, key = e.key + "." + name
            guard name.count <= 64, name.unicodeScalars.allSatisfy({ $0.value >= 0x20 && $0.value != 0x7F }) else {
                report(keyNode, key, "a device's name is at most 64 characters, without control characters")
                continue
            }
            if let first = lines[name] {
                report(keyNode, key, "given twice (first on line \(first))")
                continue
            }
            lines[name] = keyNode.line
            guard let t = text(ConfigEntry(key: key, keyNode: keyNode, value: value), expected: "an IRK") else { continue }
            do throws(IRKTextError) {
                let irk = try IdentityResolvingKey(text: t)
                if let other = c.appleIRKs.first(where: { $0.irk == irk }) {
                    report(value, key, "the same IRK as \(quoted(other.name)): one device, one name")
                    continue
                }
                c.appleIRKs.append(NamedIRK(name: name, irk: irk))
            } catch {
                report(value, key, error.description)
            }
        }
        if c.appleIRKs.count > Self.maxIRKs {
            report(e.value, e.key, "at most \(Self.maxIRKs) devices, got \(c.appleIRKs.count)")
            c.appleIRKs.removeAll()
        }
    }

    /// Each IRK costs one AES block per new address heard (docs/security.md §10).
    static let maxIRKs = 64

    /// `broker.tls.psk-identity` with `psk` or `psk-file` (docs/config.md "broker"): TLS-PSK
    /// instead of certificates. The key is hex, as mosquitto's `psk_file` holds it.
    mutating func readPSK(_ t: Section, into tls: inout MQTTTLS) {
        let identity = t["psk-identity"], inline = t["psk"], file = t["psk-file"]
        guard identity != nil || inline != nil || file != nil else { return }
        var key: String? = nil
        switch (inline, file) {
        case (.some, .some(let f)):
            report(f.value, f.key, "give broker.tls.psk or broker.tls.psk-file, not both")
        case (.some(let e), nil):
            if let k = text(e, expected: "the pre-shared key as hex digits") {
                if MQTTClient.isPSKHex(k) { key = k } else {
                    report(e.value, e.key, "expected 2 to 128 hex digits, an even number of them (the key is not shown)")
                }
            }
        case (nil, .some(let e)):
            if let p = path(e) {
                do throws(ConfigValueError) {
                    let k = try readPasswordFile(p)
                    if MQTTClient.isPSKHex(k) { key = k } else {
                        report(e.value, e.key, "\(quoted(p)): the first line must be 2 to 128 hex digits, an even number of them")
                    }
                } catch {
                    report(e.value, e.key, error.message)
                }
            }
        case (nil, nil):
            break
        }
        let anchor = identity ?? inline ?? file!
        if identity == nil {
            report(line: anchor.keyLine, anchor.key, "a pre-shared key needs its identity: set broker.tls.psk-identity too")
        } else if inline == nil && file == nil {
            report(line: anchor.keyLine, anchor.key, "an identity needs its pre-shared key: set broker.tls.psk or broker.tls.psk-file too")
        }
        for name in ["ca-file", "cert-file", "key-file"] {
            if let e = t[name] {
                report(line: e.keyLine, e.key, "TLS-PSK and certificates do not go together: remove broker.tls.\(name) or the pre-shared key")
            }
        }
        if let e = identity, let id = text(e, expected: "the PSK identity the broker knows") {
            if id.isEmpty {
                report(e.value, e.key, "expected the identity the broker's psk_file lists, got \"\"")
            } else if let key {
                tls.psk = MQTTPSK(identity: id, hexKey: key)
            }
        }
    }

    /// docs/security.md §4.4. The key is checked here, whole (prefix, length, checksum), so a
    /// mistyped key stops the gateway with its line instead of dropping every beacon as forged.
    mutating func readSecurity(_ s: Section, into c: inout GatewayConfig) {
        switch (s["beacon-key"], s["beacon-key-file"]) {
        case (.some, .some(let f)):
            report(f.value, f.key, "give security.beacon-key or security.beacon-key-file, not both")
        case (.some(let e), nil):
            if let t = text(e, expected: "a beacon key like BATON-BEACON-V1:…") {
                do throws(KeyTextError) { c.security.beaconKey = try BeaconKey(text: t) } catch {
                    report(e.value, e.key, error.description)
                }
            }
        case (nil, .some(let e)):
            if let p = path(e) {
                do throws(KeyTextError) { c.security.beaconKey = try BeaconKey.load(path: p) } catch {
                    report(e.value, e.key, "\(quoted(p)): " + error.description)
                }
            }
        case (nil, nil):
            break
        }
        if let e = s["identities"], let n = integer(e, 0...DeviceIdentity.maxNumbers) { c.security.identities = n }
        if let e = s["unkeyed"], let p = choice(e, [("publish", UnkeyedGroupPolicy.publish), ("ignore", .ignore)]) {
            c.security.unkeyed = p
        }
    }

    /// docs/esphome.md §6: the ESPHome API server, off unless the section is there, and then
    /// encrypted unless it says `encryption: none`.
    mutating func readESPHome(_ entry: ConfigEntry, _ s: Section, into c: inout GatewayConfig) {
        var settings = ProxySettings(encryption: .none)
        switch (s["encryption-key"], s["encryption"]) {
        case (.some, .some(let e)):
            report(e.value, e.key, "give esphome.encryption-key or esphome.encryption: none, not both")
            return
        case (.some(let e), nil):
            guard let t = text(e, expected: "32 bytes in base64") else { return }
            guard let key = ProxySettings.key(base64: t) else {
                report(e.value, e.key, "expected 32 bytes in base64 (44 characters ending in \"=\", as `openssl rand -base64 32` writes), got \(t.utf8.count) characters")
                return
            }
            settings.encryption = .noise(key: key)
        case (nil, .some(let e)):
            guard choice(e, [("none", true)]) != nil else { return }
            settings.encryption = .none
        case (nil, nil):
            report(line: entry.keyLine, entry.key, "needs encryption-key (32 bytes in base64, which Home Assistant asks for) or, to serve it unencrypted, encryption: none")
            return
        }
        if let e = s["address"], let a = text(e, expected: "an IPv4 or IPv6 address") {
            if ConfigValue.isIPAddress(a) { settings.address = a } else {
                report(e.value, e.key, "expected an IPv4 or IPv6 address (0.0.0.0: every IPv4 address, :: every address), got \(quoted(a))")
            }
        }
        if let e = s["port"], let n = integer(e, 1...65_535) { settings.port = UInt16(n) }
        if let e = s["clients"], let n = integer(e, 1...16) { settings.clients = n }
        if let e = s["name"], let n = value(e, ConfigValue.gatewayID) {
            if n.utf8.count > 31 { report(e.value, e.key, "at most 31 characters (ESPHome's node name)") } else { settings.name = n }
        }
        if let e = s["friendly-name"], let n = value(e, ConfigValue.room) { settings.friendlyName = n }
        if let e = s["mac"], let t = text(e, expected: "a MAC address like 02:BA:70:12:34:56") {
            if let m = ProxySettings.parseMAC(t) { settings.mac = ProxySettings.macText(m) } else {
                report(e.value, e.key, "expected a MAC address like 02:BA:70:12:34:56, got \(quoted(t))")
            }
        }
        if let e = s["mdns-service-file"], let t = text(e, expected: "a file path, or \"\" for none") {
            settings.mdnsServiceFile = t.isEmpty ? "" : resolve(t)
        }
        if let e = s["scan-mode"],
           let m = choice(e, [("auto", ProxyScanMode.onRequest), ("passive", .passive), ("active", .active)]) {
            settings.scanMode = m
        }
        if let e = s["connections"], let n = integer(e, ProxySettings.connectionsRange) { settings.connections = n }
        c.esphome = settings
    }

    mutating func readGateway(_ s: Section, into c: inout GatewayConfig) {
        if let e = s["id"], let id = value(e, ConfigValue.gatewayID) {
            // The room and the client id follow the id unless set themselves (below, and in
            // the broker section, which is read after this one).
            c.gatewayID = id
            c.room = id
            c.broker.clientID = GatewayConfig.defaultClientID(gatewayID: id)
        }
        if let e = s["room"], let room = value(e, ConfigValue.room) { c.room = room }
    }

    mutating func readBroker(_ s: Section, into c: inout GatewayConfig) {
        var urlTLS = false
        var urlText = "the default, mqtt://127.0.0.1:1883"
        var urlValid = true
        if let e = s["url"] {
            if let urls = brokerURLs(e) {
                c.broker.nodes = urls.map { MQTTNode(host: $0.host, port: $0.port) }
                urlTLS = urls[0].tls
                urlText = e.value.scalar != nil ? quoted(written(e)) : "the list \(urls[0]), …"
            } else {
                urlValid = false
            }
        }
        if let e = s["client-id"], let id = value(e, ConfigValue.clientID) { c.broker.clientID = id }
        if let e = s["username"], let u = value(e, ConfigValue.mqttString) { c.broker.username = u }

        switch (s["password"], s["password-file"]) {
        case (.some, .some(let file)):
            report(line: file.keyLine, file.key, "give broker.password or broker.password-file, not both")
        case (.some(let e), nil):
            if let p = value(e, ConfigValue.mqttString) { c.broker.password = p }
        case (nil, .some(let e)):
            if let path = path(e) {
                do throws(ConfigValueError) {
                    c.broker.password = try readPasswordFile(path)
                } catch {
                    report(e.value, e.key, error.message)
                }
            }
        case (nil, nil):
            break
        }

        // MQTT 5.0 §3.1.2.10: the keep alive is a two-byte count of seconds. libmosquitto
        // refuses 1–4 (lib/connect.c). 0 (off) is not offered: the broker would never notice a
        // dead gateway, and its will (`offline`) would never go out.
        if let e = s["keepalive"], let d = duration(e, atLeast: .seconds(5), atMost: .seconds(65_535), wholeSeconds: true) {
            c.broker.keepalive = Int(d.components.seconds)
        }
        if let e = s["protocol"], let p = choice(e, [MQTTProtocol.automatic, .v5, .v311].map { ($0.rawValue, $0) }) {
            c.broker.protocolVersion = p
        }
        // Baton asks for QoS 0 and 1 only, so 1 changes nothing and 2 would mean nothing.
        if let e = s["max-qos"], let n = integer(e, 0...1) { c.broker.maxQoS = Int32(n) }
        // Backoff doubles from min to max; a floor keeps a refused connection from spinning.
        let minEntry = s["reconnect-min"], maxEntry = s["reconnect-max"]
        var backoffValid = true
        if let e = minEntry {
            if let d = duration(e, atLeast: .milliseconds(10), atMost: .seconds(3600)) { c.broker.reconnectMin = d } else {
                backoffValid = false
            }
        }
        if let e = maxEntry {
            if let d = duration(e, atLeast: .milliseconds(10), atMost: .seconds(3600)) { c.broker.reconnectMax = d } else {
                backoffValid = false
            }
        }
        if backoffValid, c.broker.reconnectMin > c.broker.reconnectMax {
            if let e = maxEntry {
                report(e.value, e.key, "must not be less than broker.reconnect-min (\(formatDuration(c.broker.reconnectMin))), "
                                       + "got \(written(e))")
            } else if let e = minEntry {
                report(e.value, e.key, "must not be more than broker.reconnect-max (\(formatDuration(c.broker.reconnectMax))), "
                                       + "got \(written(e))")
            }
        }

        var tls = MQTTTLS()
        var tlsEntry: ConfigEntry? = nil
        if let e = s["tls"], let t = section(e.value, path: e.key) {
            // Given, even if unreadable: the URL problem is reported alongside.
            if t["ca-file"] != nil || t["cert-file"] != nil || t["key-file"] != nil || bool(quiet: t["insecure"]) == true
                || t["psk-identity"] != nil || t["psk"] != nil || t["psk-file"] != nil {
                tlsEntry = e
            }
            let ca = t["ca-file"], cert = t["cert-file"], key = t["key-file"]
            if let e = ca, let p = readableFile(e) { tls.caFile = p }
            if let e = cert, let p = readableFile(e) { tls.certFile = p }
            if let e = key, let p = readableFile(e) { tls.keyFile = p }
            // libmosquitto takes a client certificate and its key together (mosquitto_tls_set).
            if let e = cert, key == nil {
                report(line: e.keyLine, e.key, "a client certificate needs its private key: set broker.tls.key-file too")
            }
            if let e = key, cert == nil {
                report(line: e.keyLine, e.key, "a private key needs its client certificate: set broker.tls.cert-file too")
            }
            if let e = t["insecure"], let b = bool(e) { tls.insecure = b }
            readPSK(t, into: &tls)
        }
        if let e = tlsEntry, urlValid, !urlTLS {
            report(line: e.keyLine, e.key, "TLS settings need an mqtts:// broker.url, and it is \(urlText)")
        }
        c.broker.tls = urlTLS ? tls : nil
    }

    /// `broker.url`: one URL; the nodes of one broker as a YAML list (docs/config.md
    /// "broker"), each item's problem at its own line; or a comma-separated line, as `--broker`
    /// takes it.
    mutating func brokerURLs(_ e: ConfigEntry) -> [MQTTURL]? {
        guard case .sequence(let items) = e.value.kind else {
            return value(e, expected: "a broker URL like mqtt://host:1883, or a list of them", ConfigValue.brokerURLs)
        }
        guard !items.isEmpty else {
            report(e.value, e.key, "expected at least one broker URL, like mqtt://host:1883; an empty list names no broker")
            return nil
        }
        var urls: [MQTTURL] = []
        var valid = true
        for item in items {
            guard case .scalar(let scalar) = item.kind else {
                report(item, e.key, "expected a broker URL like mqtt://host:1883, got \(yaml.describe(item))")
                valid = false
                continue
            }
            do throws(ConfigValueError) {
                let url = try ConfigValue.brokerURL(scalar.string)
                try ConfigValue.brokerNodes(urls + [url])
                urls.append(url)
            } catch {
                report(item, e.key, error.message)
                valid = false
            }
        }
        return valid ? urls : nil
    }

    mutating func readTopics(_ s: Section, into c: inout GatewayConfig) {
        if let e = s["prefix"], let p = value(e, ConfigValue.topicPrefix) { c.prefix = p }
        if let e = s["discovery"], let b = bool(e) { c.discovery = b }
        if let e = s["discovery-prefix"], let p = value(e, ConfigValue.topicPrefix) { c.discoveryPrefix = p }
    }

    mutating func readRadio(_ s: Section, into c: inout GatewayConfig) {
        if let e = s["source"],
           let spec = value(e, expected: "a radio source like hci0", RadioSourceSpec.init(parsing:)) {
            switch spec {
            case .adapter: c.radio = spec
            case .h4(let p): c.radio = .h4(path: resolve(p))
            case .capture(let p): c.radio = .capture(path: resolve(p))
            case .simulator(let p): c.radio = .simulator(socket: resolve(p))
            }
        }
        if let e = s["paced"], let b = bool(e) { c.pacedCapture = b }
        if let e = s["silence"], let d = duration(e, atLeast: .seconds(1)) { c.radioSilence = d }
        if let e = s["reassembly"], let n = integer(e, 1...64) { c.radioReassembly = n }
        if let e = s["gather"], let d = duration(e, atLeast: .zero, atMost: .milliseconds(100)) { c.radioGather = d }
        if let e = s["company-id"], let n = integer(e, 0...0xFFFF, hex: true) {
            if UInt16(n) == appleCompanyID {
                // docs/protocol.md §1: manufacturer data under 0x004C is read as Apple Continuity.
                report(e.value, e.key, "0x004C is Apple's company id (read as Continuity frames): pick another, got \(written(e))")
            } else {
                c.companyID = UInt16(n)
            }
        }
    }

    // MARK: Mappings

    mutating func subsection(_ entry: ConfigEntry?) -> Section? {
        guard let entry else { return nil }
        return section(entry.value, path: entry.key)
    }

    /// Checks a mapping's keys against the schema: an unknown key or a key given twice is
    /// reported and left out. nil when `node` is not a mapping (reported).
    mutating func section(_ node: YAMLNode, path: String) -> Section? {
        let expected = path.isEmpty ? "sections like \"broker:\" at the top of the file"
                                    : "a section of \"key: value\" lines indented under it"
        return yaml.section(node, path: path, known: ConfigSchema.keys(of: path), expected: expected,
                            nullIsEmpty: true) { name in
            var message = "unknown key \(quoted(name))"
            if let hint = ConfigSchema.suggestion(for: name, in: path) { message += " (\(hint))" }
            return (path, message)
        }
    }

    // MARK: Values

    /// The scalar's text, for messages about a value already read.
    func written(_ e: ConfigEntry) -> String { e.value.scalar?.string ?? "" }

    /// The scalar's text as written (so `room: 101` is the room "101", and `no` stays "no").
    mutating func text(_ e: ConfigEntry, expected: String) -> String? {
        yaml.text(e, expected: expected)
    }

    mutating func value<T>(_ e: ConfigEntry, expected: String = "text",
                           _ parse: (String) throws(ConfigValueError) -> T) -> T? {
        guard let t = text(e, expected: expected) else { return nil }
        do throws(ConfigValueError) {
            return try parse(t)
        } catch {
            report(e.value, e.key, error.message)
            return nil
        }
    }

    /// `true`/`false`, and the YAML 1.1 spellings Home Assistant users also write (yes/no, on/off).
    mutating func bool(_ e: ConfigEntry) -> Bool? {
        yaml.bool(e)
    }

    /// A boolean that another check already reports if it is bad.
    func bool(quiet e: ConfigEntry?) -> Bool? {
        guard let e, let scalar = e.value.scalar else { return nil }
        return YAMLText.bool(scalar.string)
    }

    /// Decimal, or hexadecimal after `0x` where `hex` says the key is usually written so.
    mutating func integer(_ e: ConfigEntry, _ range: ClosedRange<Int>, hex: Bool = false) -> Int? {
        let expected = hex ? "a number like 0xFFFF" : "a whole number"
        guard let t = text(e, expected: expected) else { return nil }
        guard let n = YAMLText.integer(t) else {
            report(e.value, e.key, "expected \(expected), got \(quoted(t))" + plusHint(t))
            return nil
        }
        guard range.contains(n) else {
            let bounds = hex ? "0x\(hexDigits(range.lowerBound)) and 0x\(hexDigits(range.upperBound))"
                             : "\(range.lowerBound) and \(range.upperBound)"
            report(e.value, e.key, "must be between \(bounds), got \(t)")
            return nil
        }
        return n
    }

    mutating func duration(_ e: ConfigEntry, atLeast low: Duration, atMost high: Duration? = nil,
                           wholeSeconds: Bool = false) -> Duration? {
        let expected = "a duration like 30s or 500ms"
        guard let t = text(e, expected: expected) else { return nil }
        guard let d = parseDuration(t) else {
            var message = "expected \(expected), got \(quoted(t))"
            if !t.isEmpty, t.allSatisfy({ $0.isASCII && $0.isNumber }) {
                message += " (a number needs its unit: ms, s, m or h)"
            }
            message += plusHint(t)
            report(e.value, e.key, message)
            return nil
        }
        if let high, d < low || d > high {
            report(e.value, e.key, "must be between \(formatDuration(low)) and \(formatDuration(high)), got \(t)")
            return nil
        }
        if d < low {
            report(e.value, e.key, "must be at least \(formatDuration(low)), got \(t)")
            return nil
        }
        if wholeSeconds, d.components.attoseconds != 0 {
            report(e.value, e.key, "must be whole seconds, got \(t)")
            return nil
        }
        return d
    }

    /// The value of the choice written, in any letter case (choices are lowercase).
    mutating func choice<T>(_ e: ConfigEntry, _ choices: [(text: String, value: T)]) -> T? {
        let names = YAMLText.listed(choices.map { $0.text })
        guard let t = text(e, expected: "one of " + names) else { return nil }
        guard let c = choices.first(where: { $0.text == t.lowercased() }) else {
            report(e.value, e.key, "expected \(names), got \(quoted(t))")
            return nil
        }
        return c.value
    }

    /// A path, absolute or relative to the config file's directory.
    mutating func path(_ e: ConfigEntry) -> String? {
        guard let t = text(e, expected: "a file path") else { return nil }
        guard !t.isEmpty else { report(e.value, e.key, "expected a file path, got \"\""); return nil }
        return resolve(t)
    }

    /// A path to a file that this process can read now: a TLS file that cannot be read fails
    /// here, with its key and line, instead of at the first handshake.
    mutating func readableFile(_ e: ConfigEntry) -> String? {
        guard let p = path(e) else { return nil }
        do throws(ConfigValueError) {
            close(try openForReading(p))
            return p
        } catch {
            report(e.value, e.key, "cannot read \(quoted(p)): \(error.message)")
            return nil
        }
    }

    func resolve(_ path: String) -> String {
        if path.hasPrefix("/") || directory.isEmpty { return path }
        return directory.hasSuffix("/") ? directory + path : directory + "/" + path
    }
}

/// The password is the file's first line, without its line ending.
func readPasswordFile(_ path: String) throws(ConfigValueError) -> String {
    let bytes: [UInt8]
    do throws(ConfigValueError) {
        bytes = try readFile(path, limit: maxPasswordFileBytes)
    } catch {
        throw ConfigValueError("cannot read \(quoted(path)): \(error.message)")
    }
    let firstLine = bytes.split(separator: 0x0A, maxSplits: 1, omittingEmptySubsequences: false).first ?? []
    let line = firstLine.last == 0x0D ? firstLine.dropLast() : firstLine
    guard let password = String(validating: line, as: UTF8.self) else {
        throw ConfigValueError("\(quoted(path)) is not UTF-8 text")
    }
    guard !password.isEmpty else {
        throw ConfigValueError("\(quoted(path)) has an empty first line: write the password on it")
    }
    return password
}

// MARK: - Value syntax

func hexDigits(_ n: Int) -> String { Hex.text(n, digits: 4, uppercase: true) }

/// Said after "expected …, got "+5"": the plus is what was refused.
func plusHint(_ text: String) -> String {
    text.hasPrefix("+") ? " (write it without the +)" : ""
}

/// `250ms`, `30s`, `5m`, `1h`, or parts added up (`1m30s`). A bare number other than `0` is
/// refused: `30` could mean seconds or milliseconds, and guessing wrong is silent.
func parseDuration(_ text: String) -> Duration? {
    if text == "0" { return .zero }
    var rest = Substring(text)
    guard !rest.isEmpty else { return nil }
    var total = Duration.zero
    while !rest.isEmpty {
        let digits = rest.prefix { $0.isASCII && $0.isNumber }
        // At most 9 digits: no sum of such parts comes near Duration's range.
        guard !digits.isEmpty, digits.count <= 9, let n = Int64(digits) else { return nil }
        rest = rest.dropFirst(digits.count)
        let unit: Duration
        if rest.hasPrefix("ms") {
            unit = .milliseconds(1); rest = rest.dropFirst(2)
        } else if rest.hasPrefix("s") {
            unit = .seconds(1); rest = rest.dropFirst()
        } else if rest.hasPrefix("m") {
            unit = .seconds(60); rest = rest.dropFirst()
        } else if rest.hasPrefix("h") {
            unit = .seconds(3600); rest = rest.dropFirst()
        } else {
            return nil
        }
        total += unit * n
    }
    return total
}

/// The shortest exact spelling in the units `parseDuration` reads.
func formatDuration(_ d: Duration) -> String {
    let (seconds, attoseconds) = d.components
    if attoseconds == 0 {
        if seconds != 0, seconds % 3600 == 0 { return "\(seconds / 3600)h" }
        if seconds != 0, seconds % 60 == 0 { return "\(seconds / 60)m" }
        return "\(seconds)s"
    }
    return "\(seconds * 1000 + attoseconds / 1_000_000_000_000_000)ms"
}

extension ConfigValue {
    /// `broker.username`, `broker.password`: MQTT UTF-8 strings (MQTT 5.0 §1.5.4).
    static func mqttString(_ text: String) throws(ConfigValueError) -> String {
        guard text.utf8.count <= maxMQTTStringBytes else {
            throw ConfigValueError("must be at most \(maxMQTTStringBytes) bytes (MQTT 5.0 §1.5.4), got \(text.utf8.count)")
        }
        return text
    }
}
