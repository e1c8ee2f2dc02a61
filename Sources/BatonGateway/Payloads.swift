// What the gateway publishes, written by the fixed-buffer JSONWriter (docs/mqtt.md has an
// example of each). These run once per change, never per advertisement.
import BatonLibc
public import BatonCore
public import BatonRelay
public import BatonWire

/// Converts the loop's monotonic instants to wall-clock time for JSON, from one reading of
/// both clocks at start: a wall-clock jump (NTP setting a Pi's clock after boot) then moves no
/// expiry, and timestamps stay consistent with each other.
public struct WallClock: Sendable {
    public let unixMicrosecondsAtStart: Int64
    public let instantAtStart: Instant

    public init(unixMicrosecondsAtStart: Int64, instantAtStart: Instant) {
        self.unixMicrosecondsAtStart = unixMicrosecondsAtStart
        self.instantAtStart = instantAtStart
    }

    public func unixMicroseconds(_ instant: Instant) -> Int64 {
        return unixMicrosecondsAtStart + (instant - instantAtStart).microseconds
    }
}

public enum Payloads {
    /// Room and gateway of the publisher, written into every activity and Apple entry.
    public struct Origin: Sendable {
        public var room: String
        public var gatewayID: String
        public init(room: String, gatewayID: String) { self.room = room; self.gatewayID = gatewayID }
    }

    /// What an activity message says beyond the beacon (docs/mqtt.md §2): what the activity is
    /// called (ActivityNames), and for a device this room took over from another, the
    /// activity's own change and time as that room said them, and when it moved here.
    public struct Extras: Sendable, Equatable {
        public var type: String?
        public var title: String?
        public var webpageURL: String?
        /// The sequence whose payload gave `title` and `webpageURL`.
        public var payloadSeq: UInt16?
        /// `change` and `changed` as the room before wrote them, for this sequence.
        public var change: String?
        public var changed: String?
        public var movedAt: Int64?
        public init() {}
    }

    /// `<prefix>/activities/<device>` (docs/mqtt.md §2).
    /// Everything in it is as of the last change, so republishing the same entry after a
    /// reconnect gives the same bytes (docs/mqtt.md §5).
    /// `keyedGroup` is the group hash this gateway verifies beacons of (docs/security.md §4.4):
    /// its activities are `verified`, and those of a device with an identity say its number.
    public static func activity(_ a: TrackedActivity, origin: Origin, clock: WallClock, keyedGroup: UInt32? = nil,
                                extras: Extras = Extras(), into w: inout JSONWriter) throws(WireError) {
        let b = a.beacon
        try w.beginObject()
        try w.key("device"); try w.string(Topics.deviceText(a.deviceID))
        try w.key("state"); try w.string(a.state == .current ? "current" : "invalidated")
        try w.key("change")
        if let c = extras.change { try w.string(c) } else { try w.string(name(a.lastChangeKind)) }
        try w.key("seq"); try w.uint(UInt64(b.sequence))
        try w.key("type_hash"); try w.string(Hex.text(UInt64(b.activityTypeHash), digits: 8))
        try w.key("type"); if let t = extras.type { try w.string(t) } else { try w.null() }
        try w.key("title"); if let t = extras.title { try w.string(t) } else { try w.null() }
        try w.key("webpage_url"); if let u = extras.webpageURL { try w.string(u) } else { try w.null() }
        try w.key("payload_seq"); if let p = extras.payloadSeq { try w.uint(UInt64(p)) } else { try w.null() }
        try w.key("group"); try w.string(Hex.text(UInt64(b.groupHash), digits: 8))
        try w.key("supports_streams"); try w.bool(b.flags.contains(.supportsStreams))
        try w.key("has_web_url"); try w.bool(b.flags.contains(.hasWebURL))
        try w.key("relayed"); try w.bool(b.flags.contains(.relayed))
        try w.key("psm"); try w.uint(UInt64(b.psm))
        // Every other group's beacon was dropped unless its tag verified (BeaconVerifier).
        let verified = keyedGroup == b.groupHash
        try w.key("verified"); try w.bool(verified)
        if verified, a.deviceID >> 16 == UInt64(b.groupHash) {
            try w.key("identity"); try w.uint(a.deviceID & 0xFFFF)
        }
        try w.key("room"); try w.string(origin.room)
        try w.key("gateway"); try w.string(origin.gatewayID)
        // 127 is "RSSI not available" (Core 5.4, Vol 4, Part E, §7.7.65.2): some controllers,
        // and BlueZ's virtual ones, never measure one. null says so; 127 dBm would be a lie.
        try w.key("rssi"); if a.rssiAtChange == 127 { try w.null() } else { try w.int(Int64(a.rssiAtChange)) }
        try w.key("first_seen"); try w.timestamp(unixMicroseconds: clock.unixMicroseconds(a.firstSeen))
        try w.key("changed")
        if let c = extras.changed { try w.string(c) } else { try w.timestamp(unixMicroseconds: clock.unixMicroseconds(a.lastChange)) }
        try w.key("moved_at"); if let m = extras.movedAt { try w.timestamp(unixMicroseconds: m) } else { try w.null() }
        try w.endObject()
    }

    public static func name(_ change: ActivityChangeKind) -> StaticString {
        switch change {
        case .becameCurrent: "became-current"
        case .saved: "saved"
        case .invalidated: "invalidated"
        case .expired: "expired"
        case .evicted: "evicted"
        }
    }

    /// `<prefix>/apple/<id>` (docs/mqtt.md §3). The MAC address only when the config asks.
    /// `name`: the user's name for a device resolved by its IRK (docs/security.md §10).
    public static func apple(_ d: AppleDevice, origin: Origin, clock: WallClock, withAddress: Bool, name: String? = nil,
                             into w: inout JSONWriter) throws(WireError) {
        try w.beginObject()
        try w.key("id"); try w.string(Topics.appleText(d.id))
        if let name { try w.key("name"); try w.string(name) }
        try w.key("resolved"); try w.bool(d.identity != nil)
        try w.key("kinds"); try w.beginArray()
        if d.kinds.contains(.handoff) { try w.string("handoff") }
        if d.kinds.contains(.nearbyInfo) { try w.string("nearby-info") }
        if d.kinds.contains(.nearbyAction) { try w.string("nearby-action") }
        try w.endArray()
        try w.key("handoff_seq")
        if let s = d.handoffSequence { try w.uint(UInt64(s)) } else { try w.null() }
        try w.key("handoff_changed")
        if let t = d.handoffChanged { try w.timestamp(unixMicroseconds: clock.unixMicroseconds(t)) } else { try w.null() }
        try w.key("rssi"); if d.rssiAtChange == 127 { try w.null() } else { try w.int(Int64(d.rssiAtChange)) }
        try w.key("addresses"); try w.uint(UInt64(d.addressesAtChange))
        if withAddress {
            try w.key("address"); try w.string(addressText(d.address))
        }
        try w.key("room"); try w.string(origin.room)
        try w.key("gateway"); try w.string(origin.gatewayID)
        try w.key("first_seen"); try w.timestamp(unixMicroseconds: clock.unixMicroseconds(d.firstSeen))
        try w.endObject()
    }

    static func addressText(_ a: UInt64) -> String {
        (0..<6).map { i in Hex.text((a >> UInt64(8 * (5 - i))) & 0xFF, digits: 2, uppercase: true) }.joined(separator: ":")
    }
}
