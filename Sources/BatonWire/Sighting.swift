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
        var p = SightingParser(ByteReader(bytes))
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

/// One pass over the bytes, RFC 8259's grammar restricted to what a sighting may hold.
private struct SightingParser {
    var r: ByteReader
    init(_ r: ByteReader) { self.r = r }

    private enum Field { case rssi, since, n, other }

    mutating func document() throws(WireError) -> Sighting {
        skipWhitespace()
        try expect(UInt8(ascii: "{"))
        var rssi: Int8?? = .none, since: Int64?, n: UInt64?
        skipWhitespace()
        if try r.peekU8() != UInt8(ascii: "}") {
            while true {
                let keyAt = r.offset
                let field = try key()
                skipWhitespace()
                try expect(UInt8(ascii: ":"))
                skipWhitespace()
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
                skipWhitespace()
                let c = try r.peekU8()
                if c == UInt8(ascii: ",") {
                    _ = try r.readU8()
                    skipWhitespace()
                    continue
                }
                if c == UInt8(ascii: "}") { break }
                throw .malformed(at: r.offset, .sightingSyntax)
            }
        }
        let closeAt = r.offset
        _ = try r.readU8()  // the `}` peeked above
        skipWhitespace()
        try r.requireEnd()
        guard let rssi, let since, let n else { throw .malformed(at: closeAt, .sightingMissingKey) }
        return Sighting(rssi: rssi, since: since, n: n)
    }

    // MARK: keys

    /// Reads a key string and says which field it names. Keys are compared byte for byte.
    private mutating func key() throws(WireError) -> Field {
        guard try r.peekU8() == UInt8(ascii: "\"") else { throw .malformed(at: r.offset, .sightingSyntax) }
        let start = r.offset &+ 1
        try skipString(keyMode: true)
        // Proof: skipString consumed the opening quote, the content and the closing quote.
        let content = UnsafeRawBufferPointer(rebasing: r.bytes[start ..< r.offset &- 1])
        if Self.equals(content, "rssi") { return .rssi }
        if Self.equals(content, "since") { return .since }
        if Self.equals(content, "n") { return .n }
        return .other
    }

    private static func equals(_ bytes: UnsafeRawBufferPointer, _ s: StaticString) -> Bool {
        s.withUTF8Buffer { b in bytes.elementsEqual(b) }
    }

    // MARK: values

    private mutating func rssiValue() throws(WireError) -> Int8? {
        let at = r.offset
        let c = try r.peekU8()
        if c == UInt8(ascii: "n") { try literal("null"); return nil }
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
        let at = r.offset
        let (negative, magnitude) = try integer(field: .sightingSince)
        guard !negative, magnitude <= UInt64(Int64.max) else { throw .malformed(at: at, .sightingSince) }
        return Int64(magnitude)
    }

    private mutating func counterValue() throws(WireError) -> UInt64 {
        let at = r.offset
        let (negative, magnitude) = try integer(field: .sightingCounter)
        guard !negative else { throw .malformed(at: at, .sightingCounter) }
        return magnitude
    }

    /// A number that must be an integer. Past UInt64's range it is `range`'s fault, a string,
    /// literal or container is `sighting-type` (`sighting-nested` for a container).
    private mutating func integer(field range: Malformed) throws(WireError) -> (negative: Bool, magnitude: UInt64) {
        let at = r.offset
        let c = try r.peekU8()
        guard c == UInt8(ascii: "-") || Self.isDigit(c) else {
            if c == UInt8(ascii: "{") || c == UInt8(ascii: "[") { throw .malformed(at: at, .sightingNested) }
            if c == UInt8(ascii: "\"") || c == UInt8(ascii: "t") || c == UInt8(ascii: "f") || c == UInt8(ascii: "n") {
                throw .malformed(at: at, .sightingType)
            }
            throw .malformed(at: at, .sightingSyntax)
        }
        let number = try scanNumber()
        guard !number.fractionOrExponent else { throw .malformed(at: at, .sightingNotInteger) }
        var magnitude: UInt64 = 0
        var overflow = false
        for i in number.digits {
            let (m, o1) = magnitude.multipliedReportingOverflow(by: 10)
            let (s, o2) = m.addingReportingOverflow(UInt64(r.bytes[i] &- UInt8(ascii: "0")))
            overflow = overflow || o1 || o2
            magnitude = s
        }
        guard !overflow else { throw .malformed(at: at, range) }
        return (number.negative, magnitude)
    }

    /// Skips an unknown key's value: a number, a string, true, false or null.
    private mutating func skipScalar() throws(WireError) {
        let c = try r.peekU8()
        switch c {
        case UInt8(ascii: "{"), UInt8(ascii: "["): throw .malformed(at: r.offset, .sightingNested)
        case UInt8(ascii: "\""): try skipString(keyMode: false)
        case UInt8(ascii: "t"): try literal("true")
        case UInt8(ascii: "f"): try literal("false")
        case UInt8(ascii: "n"): try literal("null")
        case UInt8(ascii: "-"), UInt8(ascii: "0") ... UInt8(ascii: "9"): _ = try scanNumber()
        default: throw .malformed(at: r.offset, .sightingSyntax)
        }
    }

    // MARK: tokens

    /// RFC 8259 §6: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`. Returns the
    /// integer part's digits (offsets into the input). What follows the number is the caller's
    /// business, so `01` fails there, at the `1`.
    private mutating func scanNumber() throws(WireError) -> (negative: Bool, digits: Range<Int>, fractionOrExponent: Bool) {
        var negative = false
        if try r.peekU8() == UInt8(ascii: "-") { negative = true; _ = try r.readU8() }
        let first = r.offset
        let c = try r.peekU8()
        guard Self.isDigit(c) else { throw .malformed(at: r.offset, .sightingSyntax) }
        _ = try r.readU8()
        if c != UInt8(ascii: "0") { skipDigits() }
        let digits = first ..< r.offset
        var more = false
        if peek() == UInt8(ascii: ".") {
            _ = try r.readU8()
            try requireDigits()
            more = true
        }
        if peek() == UInt8(ascii: "e") || peek() == UInt8(ascii: "E") {
            _ = try r.readU8()
            if peek() == UInt8(ascii: "+") || peek() == UInt8(ascii: "-") { _ = try r.readU8() }
            try requireDigits()
            more = true
        }
        return (negative, digits, more)
    }

    private mutating func requireDigits() throws(WireError) {
        guard Self.isDigit(try r.peekU8()) else { throw .malformed(at: r.offset, .sightingSyntax) }
        skipDigits()
    }

    private mutating func skipDigits() {
        while let c = peek(), Self.isDigit(c) { r.skipOne() }
    }

    /// A string, opening quote included. RFC 8259 §7: escapes from the grammar only, no raw
    /// control characters; §8.1: UTF-8. Escapes are checked, not decoded: the value is skipped.
    private mutating func skipString(keyMode: Bool) throws(WireError) {
        try expect(UInt8(ascii: "\""))
        while true {
            let at = r.offset
            let c = try r.readU8()
            if c == UInt8(ascii: "\"") { return }
            if c < 0x20 { throw .malformed(at: at, .sightingSyntax) }
            if c == UInt8(ascii: "\\") {
                if keyMode { throw .malformed(at: at, .sightingKeyEscape) }
                let e = try r.readU8()
                switch e {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"),
                     UInt8(ascii: "f"), UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                    continue
                case UInt8(ascii: "u"):
                    for _ in 0 ..< 4 {
                        guard Self.isHex(try r.peekU8()) else { throw .malformed(at: r.offset, .sightingSyntax) }
                        r.skipOne()
                    }
                default:
                    // Proof: `at` and the escape byte after it lie inside the input.
                    throw .malformed(at: at &+ 1, .sightingSyntax)
                }
                continue
            }
            if c < 0x80 { continue }
            if let length = UTF8Check.sequenceLength(r.bytes, at: at) {
                // Proof: sequenceLength checked that `length` bytes from `at` lie inside the input.
                try r.skip(length &- 1)
                continue
            }
            // A sequence the input's end cuts short is truncation, not bad UTF-8.
            let expected = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 1
            // Proof: 1 <= expected <= 4 and 0 <= remaining, so the differences are small.
            if expected > 1, r.remaining < expected &- 1 { throw .truncated(at: r.bytes.count, need: expected &- 1 &- r.remaining) }
            throw .malformed(at: at, .sightingUTF8)
        }
    }

    private mutating func literal(_ word: StaticString) throws(WireError) {
        let failure: WireError? = word.withUTF8Buffer { w -> WireError? in
            for expected in w {
                do throws(WireError) {
                    guard try r.peekU8() == expected else { return .malformed(at: r.offset, .sightingSyntax) }
                    r.skipOne()
                } catch {
                    return error
                }
            }
            return nil
        }
        if let failure { throw failure }
    }

    private mutating func expect(_ c: UInt8) throws(WireError) {
        guard try r.peekU8() == c else { throw .malformed(at: r.offset, .sightingSyntax) }
        r.skipOne()
    }

    /// RFC 8259 §2: space, tab, line feed, carriage return.
    private mutating func skipWhitespace() {
        while let c = peek(), c == 0x20 || c == 0x09 || c == 0x0A || c == 0x0D { r.skipOne() }
    }

    private func peek() -> UInt8? { r.isAtEnd ? nil : r.bytes[r.offset] }

    private static func isDigit(_ c: UInt8) -> Bool { c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9") }

    private static func isHex(_ c: UInt8) -> Bool {
        isDigit(c) || (c >= UInt8(ascii: "a") && c <= UInt8(ascii: "f")) || (c >= UInt8(ascii: "A") && c <= UInt8(ascii: "F"))
    }
}

private extension ByteReader {
    /// Moves past one byte the caller has just peeked.
    mutating func skipOne() {
        precondition(!isAtEnd, "skipOne past the end: peek first")
        // Proof: the precondition above keeps offset < count.
        _offset &+= 1
    }
}
