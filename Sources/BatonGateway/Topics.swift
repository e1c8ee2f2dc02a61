// The MQTT topic layout: the contract written down in docs/mqtt.md. Every topic the gateway
// publishes or reads is spelled here and nowhere else.

public import BatonRelay
import BatonWire

public struct Topics: Sendable, Equatable {
    public let prefix: String
    public let discoveryPrefix: String
    public let gatewayID: String

    public init(prefix: String, discoveryPrefix: String, gatewayID: String) {
        self.prefix = prefix
        self.discoveryPrefix = discoveryPrefix
        self.gatewayID = gatewayID
    }

    /// Retained `online`; the last will says `offline` (docs/mqtt.md §1).
    public var status: String { "\(prefix)/gateways/\(gatewayID)/status" }
    /// Retained JSON beside the status: room, version, uptime, counters (docs/mqtt.md §1).
    public var stats: String { "\(prefix)/gateways/\(gatewayID)/stats" }
    /// Retained JSON of a device's current activity; empty when it ends (docs/mqtt.md §2).
    public func activity(_ deviceID: UInt64) -> String { "\(prefix)/activities/\(Self.deviceText(deviceID))" }
    public var activityPattern: String { "\(prefix)/activities/+" }
    /// Retained JSON of an Apple device seen through Continuity frames (docs/mqtt.md §3).
    public func apple(_ id: UInt32) -> String { "\(prefix)/apple/\(Self.appleText(id))" }
    public var applePattern: String { "\(prefix)/apple/+" }

    /// Every gateway's status, for the ownership rule (docs/rooms.md §4).
    public var statusPattern: String { "\(prefix)/gateways/+/status" }
    /// This gateway's sighting of a device: QoS 0, not retained (docs/rooms.md §2).
    public func sighting(_ deviceID: UInt64) -> String {
        "\(prefix)/sightings/\(gatewayID)/\(Self.deviceText(deviceID))"
    }
    public var sightingPattern: String { "\(prefix)/sightings/+/+" }
    public var sightingsRoot: String { "\(prefix)/sightings/" }
    /// Stream opens (docs/relay.md §7.1): `<prefix>/stream/<device>/<stream>`.
    public var streamOpenPattern: String { "\(prefix)/stream/+/+" }
    /// Who carries each stream: `<prefix>/streams/<stream>/gateway`, retained.
    public var streamCarrierPattern: String { "\(prefix)/streams/+/gateway" }
    public var streamOpenRoot: String { "\(prefix)/stream/" }
    public var streamsRoot: String { "\(prefix)/streams/" }
    public func stream(_ id: String) -> StreamTopics {
        let base = "\(prefix)/streams/\(id)/"
        return StreamTopics(up: base + "up", down: base + "down", gateway: base + "gateway")
    }
    /// The device (nil: not 12 lowercase hex digits) and stream id of an open's topic; nil
    /// when the topic is not one, or the id breaks docs/relay.md §7.1.
    public func streamOpen(inTopic topic: String) -> (device: UInt64?, stream: String)? {
        guard let rest = Self.tail(of: topic, after: prefix, "stream"), let slash = rest.firstIndex(of: "/") else { return nil }
        let id = rest[rest.index(after: slash)...]
        guard Self.isStreamID(id) else { return nil }
        return (Self.deviceID(rest[..<slash]), String(id))
    }
    /// The stream of `<prefix>/streams/<stream>/<leaf>`.
    public func streamID(inTopic topic: String, leaf: String) -> String? {
        guard let rest = Self.tail(of: topic, after: prefix, "streams"), rest.hasSuffix("/" + leaf) else { return nil }
        let id = rest.dropLast(leaf.count + 1)
        return Self.isStreamID(id) ? String(id) : nil
    }
    /// 1–32 of `a-z 0-9 - _` (docs/relay.md §7.1).
    static func isStreamID(_ id: Substring) -> Bool {
        !id.isEmpty && id.utf8.count <= 32
            && id.utf8.allSatisfy { (0x61...0x7A).contains($0) || (0x30...0x39).contains($0) || $0 == 0x2D || $0 == 0x5F }
    }

    /// Was-continued events: `<prefix>/continued/<device>` (docs/relay.md §3).
    public var continuedRoot: String { "\(prefix)/continued/" }

    /// Payload fetch requests (docs/relay.md §1): any client, any device.
    public var fetchPattern: String { "\(prefix)/fetch/+" }
    public var fetchRoot: String { "\(prefix)/fetch/" }
    /// The device of `<prefix>/fetch/<device>`; nil when the level is not 12 lowercase hex digits.
    public func deviceID(inFetchTopic topic: String) -> UInt64? {
        guard topic.hasPrefix(fetchRoot) else { return nil }
        return Self.deviceID(topic.dropFirst(fetchRoot.count))
    }

    // Home Assistant MQTT discovery (docs/mqtt.md §4): <discovery>/<component>/<node>/<object>/config.
    public var gatewayNode: String { "baton_\(gatewayID)" }
    public var gatewayConnectivityConfig: String { "\(discoveryPrefix)/binary_sensor/\(gatewayNode)/connectivity/config" }
    public static func deviceNode(_ deviceID: UInt64) -> String { "baton_\(deviceText(deviceID))" }
    public func deviceRoomConfig(_ deviceID: UInt64) -> String {
        "\(discoveryPrefix)/sensor/\(Self.deviceNode(deviceID))/room/config"
    }
    public func deviceActivityConfig(_ deviceID: UInt64) -> String {
        "\(discoveryPrefix)/sensor/\(Self.deviceNode(deviceID))/activity/config"
    }
    /// A device named by its IRK (`apple.irks`): a person's phone or watch, one Room sensor.
    public static func personNode(_ appleID: UInt32) -> String { "baton_apple_\(appleText(appleID))" }
    public func personRoomConfig(_ appleID: UInt32) -> String {
        "\(discoveryPrefix)/sensor/\(Self.personNode(appleID))/room/config"
    }
    /// The device trackers (docs/mqtt.md §4): one per tracked device and per named device.
    public func deviceTrackerConfig(_ deviceID: UInt64) -> String {
        "\(discoveryPrefix)/device_tracker/\(Self.deviceNode(deviceID))/tracker/config"
    }
    public func personTrackerConfig(_ appleID: UInt32) -> String {
        "\(discoveryPrefix)/device_tracker/\(Self.personNode(appleID))/tracker/config"
    }
    /// `<prefix>/trackers/<device>` and `…/apple-<id>`: the room as plain text, or `not_home`
    /// (docs/mqtt.md §4): Home Assistant's MQTT device tracker takes its location from the raw
    /// payload, so it cannot read a JSON field.
    public func tracker(_ deviceID: UInt64) -> String { "\(prefix)/trackers/\(Self.deviceText(deviceID))" }
    public func tracker(apple appleID: UInt32) -> String { "\(prefix)/trackers/apple-\(Self.appleText(appleID))" }

    /// A device id in topics: 12 lowercase hex digits, most significant byte first
    /// (docs/protocol.md §2.4 prints it the same way, with colons).
    public static func deviceText(_ id: UInt64) -> String { ActivityBeacon.deviceIDText(id) }
    public static func appleText(_ id: UInt32) -> String { hex(UInt64(id), digits: 8) }

    /// The device id in an activity topic of this prefix, if it is one.
    public func deviceID(inActivityTopic topic: String) -> UInt64? {
        let head = "\(prefix)/activities/"
        guard topic.hasPrefix(head) else { return nil }
        let tail = topic.dropFirst(head.count)
        guard tail.count == 12, let v = UInt64(tail, radix: 16), tail.allSatisfy({ $0.isHexDigit && !$0.isUppercase }) else { return nil }
        return v
    }

    /// The gateway id in `<prefix>/gateways/<id>/status`, if the topic is one.
    public func gatewayID(inStatusTopic topic: String) -> Substring? {
        guard let rest = Self.tail(of: topic, after: prefix, "gateways"), rest.hasSuffix("/status") else { return nil }
        let id = rest.dropLast("/status".count)
        return id.isEmpty || id.contains("/") ? nil : id
    }

    /// The sender and device of `<prefix>/sightings/<gateway>/<device>`, if the topic is one.
    public func sighting(inTopic topic: String) -> (gateway: Substring, device: UInt64)? {
        guard let rest = Self.tail(of: topic, after: prefix, "sightings"),
              let slash = rest.lastIndex(of: "/") else { return nil }
        let gateway = rest[..<slash]
        let device = rest[rest.index(after: slash)...]
        guard !gateway.isEmpty, !gateway.contains("/"), let id = Self.deviceID(device) else { return nil }
        return (gateway, id)
    }

    /// What follows `<prefix>/<level>/` in a topic.
    static func tail(of topic: String, after prefix: String, _ level: String) -> Substring? {
        guard topic.hasPrefix(prefix) else { return nil }
        var rest = topic.dropFirst(prefix.count)
        guard rest.hasPrefix("/\(level)/") else { return nil }
        rest = rest.dropFirst(level.count + 2)
        return rest
    }

    /// 12 lowercase hex digits, as `deviceText` writes them; nothing else.
    static func deviceID(_ text: Substring) -> UInt64? {
        guard text.utf8.count == 12, text.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }) else {
            return nil
        }
        return UInt64(text, radix: 16)
    }

    /// The entry id in an Apple topic of this prefix, if it is one.
    public func appleID(inAppleTopic topic: String) -> UInt32? {
        let head = "\(prefix)/apple/"
        guard topic.hasPrefix(head) else { return nil }
        let tail = topic.dropFirst(head.count)
        guard tail.count == 8, let v = UInt32(tail, radix: 16), tail.allSatisfy({ $0.isHexDigit && !$0.isUppercase }) else { return nil }
        return v
    }

    /// The retained topic an owned entry lives on.
    public func name(_ owned: OwnedTopic) -> String {
        switch owned {
        case .activity(let id): activity(id)
        case .apple(let id): apple(id)
        }
    }

    static func hex(_ v: UInt64, digits: Int) -> String {
        let s = String(v, radix: 16)
        return String(repeating: "0", count: max(0, digits - s.count)) + s
    }
}
