// A gateway's sighting of a device (docs/rooms.md §2): the message every gateway publishes on
// `<prefix>/sightings/<gateway>/<device>` (QoS 0, not retained) and every gateway runs the
// ownership rule on. JSON, because a user debugging a building reads it with mosquitto_sub:
//
//   {"rssi":-61,"since":1795430000123,"n":42}     heard, smoothed RSSI in dBm
//   {"rssi":null,"since":1795430000123,"n":43}    no longer heard
//
// `since` is the unix time in ms at which the sending gateway's run started, `n` that run's
// counter of sightings (all devices); together they order one gateway's sightings, so a
// replayed old one is recognised.
//
// The decoder is strict JSON (RFC 8259) over borrowed bytes and allocates nothing: one flat
// object, keys in any order, each of `rssi`, `since`, `n` exactly once, unknown keys with
// scalar values skipped (a later version may add fields; docs/rooms.md §2 "Decoding").

extension Malformed {
    /// A byte RFC 8259 does not allow where it stands: not an object at the top, a missing
    /// `:` or `,`, a misspelt literal, a bad escape, a raw control character in a string, a
    /// number with a leading zero or without digits.
    public static let sightingSyntax = Malformed("sighting-syntax")
    /// An object or array as a value: a sighting is one flat object.
    public static let sightingNested = Malformed("sighting-nested")
    /// `rssi`, `since` or `n` twice: which one counts would be a guess.
    public static let sightingDuplicateKey = Malformed("sighting-duplicate-key")
    /// `rssi`, `since` or `n` absent.
    public static let sightingMissingKey = Malformed("sighting-missing-key")
    /// A key written with a backslash escape: keys are compared as they stand (a sender never
    /// needs to escape one), so `"rs\u0073i"` cannot sneak in beside `"rssi"`.
    public static let sightingKeyEscape = Malformed("sighting-key-escape")
    /// `rssi` that is not a number or null, or `since`/`n` that is not a number.
    public static let sightingType = Malformed("sighting-type")
    /// `rssi`, `since` or `n` with a fraction or an exponent.
    public static let sightingNotInteger = Malformed("sighting-not-integer")
    /// An RSSI outside −127…+20 dBm, the range a controller reports (Core 5.4, Vol 4, Part E,
    /// §7.7.65.2). Its own reason, so a gateway with a broken radio or smoothing shows up on
    /// the stats topic by name.
    public static let sightingRSSI = Malformed("sighting-rssi")
    /// `since` negative (a sign is not allowed) or past Int64.max.
    public static let sightingSince = Malformed("sighting-since")
    /// `n` negative (a sign is not allowed) or past UInt64.max.
    public static let sightingCounter = Malformed("sighting-n")
    /// A string that is not well-formed UTF-8 (RFC 8259 §8.1).
    public static let sightingUTF8 = Malformed("sighting-utf8")
}

/// A sighting as it travels. Decoding checks the bytes; whether the sender is online or the
/// sighting is a replay is the ownership rule's business (BatonCore.RoomOwnership).
public struct Sighting: Sendable, Equatable {
    /// Smoothed RSSI in dBm, −127…+20; nil: the gateway no longer hears the device.
    public var rssi: Int8?
    /// Unix ms at which the sending gateway's run started.
    public var since: Int64
    /// The run's sighting counter.
    public var n: UInt64

    public init(rssi: Int8?, since: Int64, n: UInt64) {
        self.rssi = rssi
        self.since = since
        self.n = n
    }

    /// The RSSI a sighting may carry: what a controller reports (Core 5.4, Vol 4, Part E,
    /// §7.7.65.2: −127…+20 dBm; 127 "not available" is never sent, `null` says "not heard").
    public static let rssiRange: ClosedRange<Int8> = -127 ... 20

    /// The largest encoded sighting, for callers sizing a buffer:
    /// `{"rssi":-127,"since":9223372036854775807,"n":18446744073709551615}` is 66 bytes.
    public static let maxEncodedCount = 66

    /// Decodes one sighting. Never traps; garbage is a `WireError` whose reason names the rule.
    /// Input that ends early is `.truncated`; anything but whitespace after the object is
    /// `.trailing`.
    public static func decode(_ bytes: UnsafeRawBufferPointer) throws(WireError) -> Sighting {
        var p = SightingParser(bytes)
        return try p.document()
    }

    /// Writes the JSON above (keys in that order, no spaces). A `since` below zero or an RSSI
    /// outside `rssiRange` is the caller's bug (a precondition): the decoder would refuse it.
    public func write(into w: inout JSONWriter) throws(WireError) {
        precondition(since >= 0, "a sighting's since is a unix time in ms, never negative")
        if let rssi { precondition(Sighting.rssiRange.contains(rssi), "sighting RSSI \(rssi) outside −127…20") }
        try w.beginObject()
        try w.key("rssi")
        if let rssi { try w.int(Int64(rssi)) } else { try w.null() }
        try w.key("since")
        try w.int(since)
        try w.key("n")
        try w.uint(n)
        try w.endObject()
    }
}

/// One pass over the bytes, RFC 8259's grammar restricted to what a sighting may hold. The
/// tokens come from `FlatJSONScanner` (FlatJSON.swift); what they mean is decided here.
private struct SightingParser {
    var s: FlatJSONScanner
    init(_ bytes: UnsafeRawBufferPointer) { self.s = FlatJSONScanner(bytes, syntax: .sightingSyntax) }

    private enum Field { case rssi, since, n, other }

    mutating func document() throws(WireError) -> Sighting {
        s.skipWhitespace()
        try s.expect(UInt8(ascii: "{"))
        var rssi: Int8?? = .none, since: Int64?, n: UInt64?
        s.skipWhitespace()
        if try s.peekByte() != UInt8(ascii: "}") {
            while true {
                let keyAt = s.offset
                let field = try key()
                s.skipWhitespace()
                try s.expect(UInt8(ascii: ":"))
                s.skipWhitespace()
                switch field {
                case .rssi:
                    guard rssi == nil else { throw .malformed(at: keyAt, .sightingDuplicateKey) }
                    rssi = .some(try rssiValue())
                case .since:
                    guard since == nil else { throw .malformed(at: keyAt, .sightingDuplicateKey) }
                    since = try sinceValue()
                case .n:
                    guard n == nil else { throw .malformed(at: keyAt, .sightingDuplicateKey) }
                    n = try counterValue()
                case .other:
                    try skipScalar()
                }
                s.skipWhitespace()
                let c = try s.peekByte()
                if c == UInt8(ascii: ",") {
                    s.skipOne()
                    s.skipWhitespace()
                    continue
                }
                if c == UInt8(ascii: "}") { break }
                throw .malformed(at: s.offset, .sightingSyntax)
            }
        }
        let closeAt = s.offset
        s.skipOne()  // the `}` peeked above
        s.skipWhitespace()
        try s.requireEnd()
        guard let rssi, let since, let n else { throw .malformed(at: closeAt, .sightingMissingKey) }
        return Sighting(rssi: rssi, since: since, n: n)
    }

    // MARK: keys

    /// Reads a key string and says which field it names. Keys are compared byte for byte.
    private mutating func key() throws(WireError) -> Field {
        guard try s.peekByte() == UInt8(ascii: "\"") else { throw .malformed(at: s.offset, .sightingSyntax) }
        let content = try s.scanString(escapes: .refused(.sightingKeyEscape), utf8: .sightingUTF8)
        if s.equals(content, "rssi") { return .rssi }
        if s.equals(content, "since") { return .since }
        if s.equals(content, "n") { return .n }
        return .other
    }

    // MARK: values

    private mutating func rssiValue() throws(WireError) -> Int8? {
        let at = s.offset
        let c = try s.peekByte()
        if c == UInt8(ascii: "n") { try s.literal("null"); return nil }
        let (negative, magnitude) = try integer(field: .sightingRSSI)
        // Proof: magnitude <= 127 (or 20) is checked before the conversion.
        if negative {
            guard magnitude <= 127 else { throw .malformed(at: at, .sightingRSSI) }
            return -Int8(magnitude)
        }
        guard magnitude <= 20 else { throw .malformed(at: at, .sightingRSSI) }
        return Int8(magnitude)
    }

    private mutating func sinceValue() throws(WireError) -> Int64 {
        let at = s.offset
        let (negative, magnitude) = try integer(field: .sightingSince)
        guard !negative, magnitude <= UInt64(Int64.max) else { throw .malformed(at: at, .sightingSince) }
        return Int64(magnitude)
    }

    private mutating func counterValue() throws(WireError) -> UInt64 {
        let at = s.offset
        let (negative, magnitude) = try integer(field: .sightingCounter)
        guard !negative else { throw .malformed(at: at, .sightingCounter) }
        return magnitude
    }

    /// A number that must be an integer. Past UInt64's range it is `range`'s fault, a string,
    /// literal or container is `sighting-type` (`sighting-nested` for a container).
    private mutating func integer(field range: Malformed) throws(WireError) -> (negative: Bool, magnitude: UInt64) {
        let at = s.offset
        let c = try s.peekByte()
        guard c == UInt8(ascii: "-") || FlatJSONScanner.isDigit(c) else {
            if c == UInt8(ascii: "{") || c == UInt8(ascii: "[") { throw .malformed(at: at, .sightingNested) }
            if c == UInt8(ascii: "\"") || c == UInt8(ascii: "t") || c == UInt8(ascii: "f") || c == UInt8(ascii: "n") {
                throw .malformed(at: at, .sightingType)
            }
            throw .malformed(at: at, .sightingSyntax)
        }
        let number = try s.scanNumber()
        guard !number.fractionOrExponent else { throw .malformed(at: at, .sightingNotInteger) }
        var magnitude: UInt64 = 0
        var overflow = false
        for i in number.digits {
            let (m, o1) = magnitude.multipliedReportingOverflow(by: 10)
            let (sum, o2) = m.addingReportingOverflow(UInt64(s.bytes[i] &- UInt8(ascii: "0")))
            overflow = overflow || o1 || o2
            magnitude = sum
        }
        guard !overflow else { throw .malformed(at: at, range) }
        return (number.negative, magnitude)
    }

    /// Skips an unknown key's value: a number, a string, true, false or null.
    private mutating func skipScalar() throws(WireError) {
        let c = try s.peekByte()
        switch c {
        case UInt8(ascii: "{"), UInt8(ascii: "["): throw .malformed(at: s.offset, .sightingNested)
        case UInt8(ascii: "\""): _ = try s.scanString(escapes: .checked, utf8: .sightingUTF8)
        case UInt8(ascii: "t"): try s.literal("true")
        case UInt8(ascii: "f"): try s.literal("false")
        case UInt8(ascii: "n"): try s.literal("null")
        case UInt8(ascii: "-"), UInt8(ascii: "0") ... UInt8(ascii: "9"): _ = try s.scanNumber()
        default: throw .malformed(at: s.offset, .sightingSyntax)
        }
    }
}
