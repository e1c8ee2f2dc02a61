// What `baton gateway` runs with: the config file (docs/config.md), then the flags over it.
//
// The file is read and checked in ConfigFile.swift; the rules for single values (an id, a
// topic prefix, a radio source…) live here, because the flags go through the same rules.
public import BatonCore
public import BatonMQTT
public import BatonRelay
public import BatonYAML
public import BatonKeys
public import BatonProxy
import BatonWire
import CLibc

/// Where advertising reports come from (`radio.source`, `--radio`).
public enum RadioSourceSpec: Sendable, Equatable {
    /// A BlueZ adapter, e.g. `hci0`.
    case adapter(String)
    /// A serial HCI-UART controller speaking H4: `h4:/dev/ttyACM0`.
    case h4(path: String)
    /// A capture file replayed as a radio: `capture:FILE`.
    case capture(path: String)
    /// The simulator's virtual controller, H4 over a Unix socket: `sim:SOCKET`.
    case simulator(socket: String)
}

/// How this gateway reaches devices for fetches and streams (`relay.link`, docs/relay.md §5).
public enum RelayLinkSpec: Sendable, Equatable {
    /// The radio's own kind: an adapter's L2CAP channels, the simulator's link socket beside
    /// its controller socket, nothing for a capture or a serial controller.
    case auto
    /// No links: fetches this gateway owns are answered `unreachable`.
    case none
    /// BlueZ L2CAP LE credit-based channels on this adapter.
    case bluez(adapter: String)
    /// The simulator's link socket (docs/protocol.md §5.5).
    case simulator(path: String)
}

/// Everything `baton gateway` runs with: the config file, then flags over it.
public struct GatewayConfig: Sendable, Equatable {
    public var gatewayID: String
    public var room: String
    public var broker: MQTTConfig
    /// Topic prefix (`baton`), and Home Assistant's discovery prefix (`homeassistant`).
    public var prefix: String
    public var discoveryPrefix: String
    public var discovery: Bool
    public var radio: RadioSourceSpec
    /// Capture sources: replay at the capture's timestamps (true) or as fast as possible.
    public var pacedCapture: Bool
    /// Watchdog: no advertising report for this long while scanning → re-initialise.
    public var radioSilence: Duration
    public var companyID: UInt16
    /// Extended advertisements in fragments reassembled at once (`radio.reassembly`): one
    /// 1,650-byte buffer each, allocated at start (docs/radio.md "Advertisements in fragments").
    public var radioReassembly: Int = 8  // AdvertisementReassembly.defaultCapacity
    /// How long the radio's reports gather in the kernel after a read before the next read
    /// (`radio.gather`, docs/architecture.md §2 "Gathering").
    public var radioGather: Duration = .milliseconds(10)
    public var table: ActivityTableConfig
    public var apple: AppleDeviceTableConfig
    /// Publish the raw MAC address of Apple devices (off by default).
    public var appleAddresses: Bool
    /// How often the status JSON is republished.
    public var statusInterval: Duration
    public var logLevel: String
    /// The room-ownership rule's parameters (docs/rooms.md §3). Its `forgetAfter` is always
    /// `table.expiry`: a device nobody hears is forgotten when a table would expire it.
    public var rooms: RoomsConfig
    /// Payload fetches (docs/relay.md): capacities and deadlines, and how devices are reached.
    public var relay: RelayConfig
    public var relayLink: RelayLinkSpec
    /// Activities of the keyed group current in other rooms that this gateway re-advertises
    /// for the phones in its room (`relay.readvertise`, docs/relay.md §9); 0: none.
    public var readvertise: Int = 0
    /// Beacon verification (docs/security.md §4.4): the group's beacon key, if any.
    public var security: SecurityConfig
    /// The user's own devices by IRK (`apple.irks`, docs/security.md §10), in file order.
    public var appleIRKs: [NamedIRK] = []
    /// `activity-types:`: activity types the gateway names by their hash (docs/mqtt.md §2).
    public var activityTypes: [String] = []
    /// `relay.fetch-titles`: the owner fetches an open group's payload for its type, title and
    /// webpage URL (docs/relay.md §4.1).
    public var fetchTitles = true
    /// `rooms.batches`: send sightings as one batch per tick (docs/rooms.md §8.1); false sends
    /// one JSON message per device as gateways before 0.5 did, for a building whose other
    /// gateways are not upgraded yet (they read only those).
    public var sightingBatches = true
    /// `rooms.neighbourhoods`: receive only the batches of the gateways that hear the same
    /// devices, learned over the building-wide channel (docs/rooms.md §8.3); false receives
    /// every gateway's batches. Only with `rooms.batches`.
    public var neighbourhoods = true
    /// `esphome:`: the ESPHome API server, Home Assistant's Bluetooth proxy (docs/esphome.md);
    /// nil when the section is absent (off).
    public var esphome: ProxySettings? = nil

    /// What `relay.link` comes to with this radio.
    public var resolvedRelayLink: RelayLinkSpec {
        guard relayLink == .auto else { return relayLink }
        switch radio {
        case .adapter(let name): return .bluez(adapter: name)
        case .simulator(let socket):
            // `DIR/hall.sock` → `DIR/hall.link` (docs/protocol.md §5.5).
            let base = socket.hasSuffix(".sock") ? String(socket.dropLast(5)) : socket
            return .simulator(path: base + ".link")
        case .h4, .capture: return .none
        }
    }
}

/// A device the user named, with its Identity Resolving Key (`apple.irks`).
public struct NamedIRK: Sendable, Equatable {
    public var name: String
    public var irk: IdentityResolvingKey
    public init(name: String, irk: IdentityResolvingKey) { self.name = name; self.irk = irk }
}

/// `security.*` (docs/config.md "security", docs/security.md §4.4).
public struct SecurityConfig: Sendable, Equatable {
    /// The group's beacon key; nil: no group is keyed and every beacon is unverified.
    public var beaconKey: BeaconKey?
    /// Device numbers 0..<identities resolve to a stable identity (docs/security.md §3.1).
    public var identities = 16
    /// Beacons of groups without a key.
    public var unkeyed = UnkeyedGroupPolicy.publish
    public init() {}
}

/// A config problem, said the way a user fixes it: `FILE:LINE: KEY: MESSAGE` (BatonYAML).
public typealias ConfigError = YAMLFileError

/// A value that does not parse (a radio source, a duration…); the caller adds where it came
/// from (file and line, or the flag) to make a `ConfigError`.
public struct ConfigValueError: Error, Sendable, Equatable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

// MARK: - Defaults

extension GatewayConfig {
    /// The settings of a gateway with an empty config file: docs/config.md lists each one.
    /// `hostName` gives the gateway id (and through it the room and the MQTT client id).
    public static func defaults(hostName: String) -> GatewayConfig {
        let id = defaultGatewayID(hostName: hostName)
        var random = SystemRandomNumberGenerator()
        return GatewayConfig(
            gatewayID: id,
            room: id,
            broker: MQTTConfig(host: "127.0.0.1", port: 1883, tls: nil, clientID: defaultClientID(gatewayID: id),
                               username: nil, password: nil, keepalive: 30, will: nil, protocolVersion: .automatic,
                               reconnectMin: .milliseconds(250), reconnectMax: .seconds(30)),
            prefix: "baton",
            discoveryPrefix: "homeassistant",
            discovery: true,
            radio: .adapter("hci0"),
            pacedCapture: true,
            radioSilence: .seconds(60),
            companyID: ActivityBeacon.defaultCompanyID,
            table: ActivityTableConfig(capacity: ActivityTableConfig.defaultCapacity, expiry: .seconds(60)),
            // The id key is never configured: a fresh one per run keeps Apple pseudonyms from
            // linking one run's devices to the next's (docs/config.md "apple").
            apple: AppleDeviceTableConfig(tracking: .handoff, capacity: 64, expiry: .seconds(60),
                                          idKey: UInt64.random(in: .min ... .max, using: &random)),
            appleAddresses: false,
            statusInterval: .seconds(30),
            logLevel: "info",
            rooms: RoomsConfig(),
            relay: RelayConfig(),
            relayLink: .auto,
            security: SecurityConfig())
    }

    /// The host name, lowercased, with every character outside `[a-z0-9_-]` replaced by `-`, at
    /// most 64 characters; `baton` if nothing is left.
    public static func defaultGatewayID(hostName: String) -> String {
        var id = ""
        for scalar in hostName.lowercased().unicodeScalars.prefix(maxIDLength) {
            id.unicodeScalars.append(isIDCharacter(scalar) ? scalar : "-")
        }
        return id.isEmpty ? "baton" : id
    }

    /// `baton-<gateway id>`: unique per gateway, so two gateways never take each other's session.
    public static func defaultClientID(gatewayID: String) -> String { "baton-" + gatewayID }
}

// MARK: - Single values (shared by the file and the flags)

let maxIDLength = 64
/// Room names travel in JSON on every activity message; 128 bytes holds any real name.
let maxRoomBytes = 128
/// MQTT 5.0 §1.5.4: a UTF-8 string is at most 65,535 bytes.
let maxMQTTStringBytes = 65_535

func isIDCharacter(_ s: Unicode.Scalar) -> Bool {
    ("a"..."z").contains(s) || ("0"..."9").contains(s) || s == "_" || s == "-"
}

func quoted(_ text: String) -> String { text.debugDescription }

func hasControlCharacter(_ text: String) -> Bool {
    text.unicodeScalars.contains { $0.properties.generalCategory == .control }
}

enum ConfigValue {
    /// `esphome.address`: an IPv4 or IPv6 address in the forms inet_pton(3) reads.
    static func isIPAddress(_ text: String) -> Bool {
        var v4 = in_addr()
        var v6 = in6_addr()
        return text.withCString { inet_pton(AF_INET, $0, &v4) == 1 || inet_pton(AF_INET6, $0, &v6) == 1 }
    }

    /// `gateway.id` / `--id`: a level in every topic and Home Assistant's device id.
    static func gatewayID(_ text: String) throws(ConfigValueError) -> String {
        guard !text.isEmpty else { throw ConfigValueError("must not be empty") }
        guard text.unicodeScalars.allSatisfy(isIDCharacter) else {
            throw ConfigValueError("use only a-z, 0-9, _ and - (the id is part of MQTT topics and "
                                   + "Home Assistant's device id), got \(quoted(text))")
        }
        guard text.unicodeScalars.count <= maxIDLength else {
            throw ConfigValueError("must be at most \(maxIDLength) characters, got \(text.unicodeScalars.count)")
        }
        return text
    }

    /// `gateway.room` / `--room`: shown to people, any UTF-8.
    static func room(_ text: String) throws(ConfigValueError) -> String {
        guard !text.isEmpty else { throw ConfigValueError("must not be empty") }
        guard !hasControlCharacter(text) else {
            throw ConfigValueError("must not contain control characters (line breaks, tabs), got \(quoted(text))")
        }
        guard text.utf8.count <= maxRoomBytes else {
            throw ConfigValueError("must be at most \(maxRoomBytes) bytes of UTF-8, got \(text.utf8.count)")
        }
        return text
    }

    /// `topics.prefix`, `topics.discovery-prefix`, `--prefix`: the first levels of topic names
    /// the gateway publishes to and subscribes under (MQTT 5.0 §4.7).
    static func topicPrefix(_ text: String) throws(ConfigValueError) -> String {
        guard !text.isEmpty else { throw ConfigValueError("must not be empty") }
        guard !text.contains("+") && !text.contains("#") else {
            throw ConfigValueError("must not contain the MQTT wildcards + or # (MQTT 5.0 §4.7.1), got \(quoted(text))")
        }
        guard !text.hasPrefix("/") && !text.hasSuffix("/") else {
            throw ConfigValueError("must not start or end with \"/\", got \(quoted(text))")
        }
        // Leading and trailing "/" are refused above, so an empty piece is a "//".
        guard !text.split(separator: "/", omittingEmptySubsequences: false).contains(where: { $0.isEmpty }) else {
            throw ConfigValueError("must not contain an empty topic level (\"//\"), got \(quoted(text))")
        }
        guard !text.hasPrefix("$") else {
            throw ConfigValueError("must not start with \"$\" (such topics are the broker's own, MQTT 5.0 §4.7.2), "
                                   + "got \(quoted(text))")
        }
        guard !hasControlCharacter(text) else {
            throw ConfigValueError("must not contain control characters, got \(quoted(text))")
        }
        guard text.utf8.count <= 1024 else {
            // The prefix is repeated in every topic; a topic is at most 65,535 bytes (§1.5.4).
            throw ConfigValueError("must be at most 1024 bytes, got \(text.utf8.count)")
        }
        return text
    }

    /// `broker.url` / `--broker`, through BatonMQTT's own parser so the two never disagree; its
    /// reason already quotes the URL and says what to write instead.
    static func brokerURL(_ text: String) throws(ConfigValueError) -> MQTTURL {
        do throws(MQTTError) {
            return try MQTTURL(parsing: text)
        } catch {
            if case .invalidURL(let reason) = error { throw ConfigValueError(reason) }
            throw ConfigValueError("expected a broker URL like mqtt://host:1883 or mqtts://host:8883, got \(quoted(text))")
        }
    }

    /// `--broker` and `broker.url` written on one line: one URL, or a broker's nodes separated
    /// by commas, through BatonMQTT's own list parser (`MQTTURL.nodes(parsing:)`).
    static func brokerURLs(_ text: String) throws(ConfigValueError) -> [MQTTURL] {
        do throws(MQTTError) {
            return try MQTTURL.nodes(parsing: text)
        } catch {
            if case .invalidURL(let reason) = error { throw ConfigValueError(reason) }
            throw ConfigValueError("expected a broker URL like mqtt://host:1883 or mqtts://host:8883, got \(quoted(text))")
        }
    }

    /// The checks `brokerURLs` makes of a list, for one written as a YAML list.
    static func brokerNodes(_ urls: [MQTTURL]) throws(ConfigValueError) {
        do throws(MQTTError) {
            try MQTTURL.checkNodes(urls)
        } catch {
            if case .invalidURL(let reason) = error { throw ConfigValueError(reason) }
            throw ConfigValueError("\(error)")
        }
    }

    /// `relay.link`: `auto`, `none`, `bluez:hci0` (or `bluez` for hci0), `sim:SOCKET`.
    static func relayLink(_ text: String) throws(ConfigValueError) -> RelayLinkSpec {
        switch text {
        case "auto": return .auto
        case "none": return .none
        case "bluez": return .bluez(adapter: "hci0")
        default: break
        }
        if text.hasPrefix("bluez:") {
            let adapter = String(text.dropFirst(6))
            guard RadioSourceSpec.isAdapterName(adapter) else {
                throw ConfigValueError("bluez: needs an adapter like bluez:hci0, got \(quoted(text))")
            }
            return .bluez(adapter: adapter)
        }
        if text.hasPrefix("sim:") {
            let path = String(text.dropFirst(4))
            guard !path.isEmpty else { throw ConfigValueError("sim: needs the simulator's link socket, like sim:/tmp/b/hall.link") }
            return .simulator(path: path)
        }
        throw ConfigValueError("expected auto, none, bluez:hci0 or sim:SOCKET, got \(quoted(text))")
    }

    /// `broker.client-id`: MQTT 5.0 §3.1.3.1. Brokers must take 1–23 letters and digits;
    /// mosquitto and the others take any UTF-8 string, so only the emptiness is refused.
    static func clientID(_ text: String) throws(ConfigValueError) -> String {
        guard !text.isEmpty else { throw ConfigValueError("must not be empty") }
        guard !hasControlCharacter(text) else {
            throw ConfigValueError("must not contain control characters, got \(quoted(text))")
        }
        guard text.utf8.count <= maxMQTTStringBytes else {
            throw ConfigValueError("must be at most \(maxMQTTStringBytes) bytes (MQTT 5.0 §1.5.4), got \(text.utf8.count)")
        }
        return text
    }
}

// MARK: - The radio source

extension RadioSourceSpec: CustomStringConvertible {
    /// Parses `hci<N>`, `h4:PATH`, `capture:PATH` or `sim:SOCKET` (docs/config.md "radio").
    /// Paths are taken as written; nothing is opened here, because a USB controller or the
    /// simulator's socket may appear after the gateway starts (the radio source retries).
    public init(parsing text: String) throws(ConfigValueError) {
        func path(after prefix: String, _ what: String) throws(ConfigValueError) -> String? {
            guard text.hasPrefix(prefix) else { return nil }
            let rest = String(text.dropFirst(prefix.count))
            guard !rest.isEmpty else { throw ConfigValueError("\(prefix) needs \(what)") }
            return rest
        }
        if let p = try path(after: "h4:", "the controller's serial device, like h4:/dev/ttyACM0") {
            self = .h4(path: p)
        } else if let p = try path(after: "capture:", "a btsnoop or pcap file, like capture:/var/lib/baton/room.btsnoop") {
            self = .capture(path: p)
        } else if let p = try path(after: "sim:", "the simulator's socket, like sim:/run/baton/sim.sock") {
            self = .simulator(socket: p)
        } else if Self.isAdapterName(text) {
            self = .adapter(text)
        } else {
            var message = "expected an adapter like hci0, or h4:/dev/ttyACM0, capture:FILE or sim:SOCKET, got \(quoted(text))"
            if text.contains("/") { message += " (a path needs its kind in front: h4:, capture: or sim:)" }
            throw ConfigValueError(message)
        }
    }

    /// `hci` and the adapter's index, which BlueZ keeps in 16 bits (`struct hci_dev_info.dev_id`).
    static func isAdapterName(_ text: String) -> Bool {
        guard text.hasPrefix("hci") else { return false }
        let digits = text.dropFirst(3)
        guard !digits.isEmpty, digits.count <= 5, digits.allSatisfy({ $0.isASCII && $0.isNumber }),
              let n = Int(digits), n <= 0xFFFF else { return false }
        return true
    }

    /// The text `init(parsing:)` reads back.
    public var description: String {
        switch self {
        case .adapter(let name): name
        case .h4(let path): "h4:" + path
        case .capture(let path): "capture:" + path
        case .simulator(let socket): "sim:" + socket
        }
    }
}

// MARK: - Flags over the file

/// The command-line flags that override the config file; nil leaves the file's value.
/// The strings are the flags' text as typed: `apply` checks them by the file's rules.
public struct GatewayOverrides: Sendable, Equatable {
    /// `--broker URL[,URL…]`
    public var broker: String?
    /// `--radio SOURCE`
    public var radio: String?
    /// `--room NAME`
    public var room: String?
    /// `--id NAME`
    public var id: String?
    /// `--prefix TOPIC`
    public var prefix: String?

    public init(broker: String? = nil, radio: String? = nil, room: String? = nil, id: String? = nil,
                prefix: String? = nil) {
        self.broker = broker; self.radio = radio; self.room = room; self.id = id; self.prefix = prefix
    }
}

extension GatewayConfig {
    /// Applies the flags over the file's settings. All flags are checked; a bad one throws a
    /// `ConfigError` naming the flag (`command line: --broker: …`, the others in `others`)
    /// and leaves the config unchanged.
    ///
    /// `--id` carries the room and the MQTT client id with it when they still have their
    /// defaults for the old id (the room equal to the id, the client id `baton-<id>`); values
    /// set on purpose stay.
    public mutating func apply(_ overrides: GatewayOverrides, source: String = "command line") throws(ConfigError) {
        var next = self
        var errors: [ConfigError] = []
        func check<T>(_ flag: String, _ text: String?, _ parse: (String) throws(ConfigValueError) -> T) -> T? {
            guard let text else { return nil }
            do throws(ConfigValueError) {
                return try parse(text)
            } catch {
                errors.append(ConfigError(file: source, line: nil, key: flag, message: error.message))
                return nil
            }
        }
        if let id = check("--id", overrides.id, ConfigValue.gatewayID) {
            let old = next.gatewayID
            next.gatewayID = id
            if next.room == old { next.room = id }
            if next.broker.clientID == Self.defaultClientID(gatewayID: old) {
                next.broker.clientID = Self.defaultClientID(gatewayID: id)
            }
        }
        if let room = check("--room", overrides.room, ConfigValue.room) {
            next.room = room
        }
        if let urls = check("--broker", overrides.broker, ConfigValue.brokerURLs) {
            next.broker.nodes = urls.map { MQTTNode(host: $0.host, port: $0.port) }
            // TLS settings from the file stay for an mqtts:// URL; mqtt:// is plain TCP.
            next.broker.tls = urls[0].tls ? (next.broker.tls ?? MQTTTLS()) : nil
        }
        if let radio = check("--radio", overrides.radio, RadioSourceSpec.init(parsing:)) {
            next.radio = radio
        }
        if let prefix = check("--prefix", overrides.prefix, ConfigValue.topicPrefix) {
            next.prefix = prefix
        }
        if let first = errors.first {
            throw ConfigError(file: first.file, line: nil, key: first.key, message: first.message,
                              others: Array(errors.dropFirst()))
        }
        self = next
    }
}
