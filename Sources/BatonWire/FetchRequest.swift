// The body of a fetch request (docs/relay.md §2): empty, or one flat strict JSON object
// (RFC 8259) with any of `format`, `response_topic`, `correlation` and `continue`, string
// values only:
//
//   {"format":"json","response_topic":"kitchen/tv/answer","correlation":"0a1b2c3d"}
//
// Decoded over borrowed bytes without allocating, with the tokens of `FlatJSONScanner`
// (FlatJSON.swift, shared with the sighting decoder). No string may hold a backslash escape,
// so a value's bytes in the body are the value, and the result can point at them.
//
// Errors: one pass, so the first key or value that breaks a rule is the one named. A body that
// ends early is `.truncated` at its end; bytes after the object other than whitespace are
// `.trailing`; the rest is one of the reasons below, at the byte that breaks it.

extension Malformed {
    /// Not RFC 8259 JSON, or not one object; also a backslash in any string (docs/relay.md §2
    /// allows no escapes: at the backslash) and a key or a `format` or `correlation` value that
    /// is not UTF-8 (RFC 8259 §8.1).
    public static let fetchSyntax = Malformed("fetch-syntax")
    /// A key that docs/relay.md §2 does not define (a typo must not pass silently).
    public static let fetchUnknownKey = Malformed("fetch-unknown-key")
    /// A key twice.
    public static let fetchDuplicateKey = Malformed("fetch-duplicate-key")
    /// A value of the wrong JSON type, or a nested object or array.
    public static let fetchType = Malformed("fetch-type")
    /// `format` other than "cbor" or "json".
    public static let fetchFormat = Malformed("fetch-format")
    /// `response_topic` empty, over 256 bytes, with a wildcard (`+`, `#`) or NUL, or not UTF-8.
    /// (A NUL cannot get this far: raw it is a control character and escaped it is an escape,
    /// both `fetch-syntax`.)
    public static let fetchResponseTopic = Malformed("fetch-response-topic")
    /// `correlation` not an even number of hex digits, none, or over 128 of them (64 bytes).
    public static let fetchCorrelation = Malformed("fetch-correlation")
    /// `continue` empty, over 64 bytes (it must fit the device's `continued` message,
    /// docs/protocol.md §5.1), or not UTF-8.
    public static let fetchContinue = Malformed("fetch-continue")
}

/// What a fetch answer carries (docs/relay.md §3).
public enum FetchFormat: Sendable, Equatable {
    /// The payload's bytes as they are (deterministic CBOR, or sealed).
    case cbor
    /// The payload rendered as JSON (docs/payload.md §4).
    case json
}

/// A fetch request's body. Strings are ranges of the decoded bytes (no escapes are allowed in
/// them, so the bytes are the value).
public struct FetchRequest: Sendable, Equatable {
    public var format: FetchFormat
    /// `response_topic`, the MQTT v3.1.1 fallback for the v5 Response Topic property.
    public var responseTopic: Range<Int>?
    /// `correlation`: hex digits, the v3.1.1 fallback for the v5 Correlation Data property.
    public var correlationHex: Range<Int>?
    /// `continue`: the requester continues the activity there ("Living room TV"): the device
    /// is told and the event published (docs/relay.md §3). Absent: the fetch only looks.
    public var continuedAt: Range<Int>?

    public init(format: FetchFormat = .cbor, responseTopic: Range<Int>? = nil, correlationHex: Range<Int>? = nil,
                continuedAt: Range<Int>? = nil) {
        self.format = format; self.responseTopic = responseTopic; self.correlationHex = correlationHex
        self.continuedAt = continuedAt
    }

    /// The longest `continue`, in bytes: the `continued` message's room id (protocol.md §5.1).
    public static let maxContinuedAt = 64

    /// Longest `response_topic` in bytes, and longest correlation in bytes (hex digits / 2).
    public static let maxResponseTopic = 256
    public static let maxCorrelation = 64

    /// Empty bytes (or only JSON whitespace) decode as the defaults.
    ///
    /// Where each error points: `fetch-unknown-key` and `fetch-duplicate-key` at the key's
    /// opening quote; `fetch-type` at the value's first byte; `fetch-format` at the value's
    /// opening quote; `fetch-response-topic` at the opening quote of an empty topic, else at the
    /// first byte that is not UTF-8, the 257th byte or the wildcard; `fetch-correlation` at the
    /// opening quote of an empty one, else at the first byte that is not a hex digit, the 129th
    /// digit or (an odd count) the last digit.
    public static func decode(_ bytes: UnsafeRawBufferPointer) throws(WireError) -> FetchRequest {
        var p = FetchRequestParser(bytes)
        return try p.document()
    }

    /// The route a bad body gave before its first mistake: a v3.1.1 requester whose body has
    /// `response_topic` (and `correlation`) before the mistake is answered `bad-request` there
    /// instead of waiting for nothing (docs/relay.md §2). Only values checked whole are kept.
    public static func routeBeforeError(_ bytes: UnsafeRawBufferPointer) -> FetchRequest {
        var p = FetchRequestParser(bytes)
        do throws(WireError) { return try p.document() } catch { return p.request }
    }

    /// Writes the bytes the hex digits stand for into `out` (room for `maxCorrelation`);
    /// returns how many. `hex` was checked by `decode`.
    public static func correlationBytes(_ hex: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer) -> Int {
        let count = hex.count / 2
        precondition(hex.count % 2 == 0 && count <= out.count, "correlation hex not checked by decode, or no room for it")
        for i in 0 ..< count {
            // Proof: i < count = hex.count / 2, so 2i + 1 < hex.count.
            out[i] = nibble(hex[i &* 2]) << 4 | nibble(hex[i &* 2 &+ 1])
        }
        return count
    }

    private static func nibble(_ c: UInt8) -> UInt8 {
        // Proof of each subtraction: the case's range puts c at or above what is subtracted.
        switch c {
        case UInt8(ascii: "0") ... UInt8(ascii: "9"): c &- UInt8(ascii: "0")
        case UInt8(ascii: "a") ... UInt8(ascii: "f"): c &- UInt8(ascii: "a") &+ 10
        case UInt8(ascii: "A") ... UInt8(ascii: "F"): c &- UInt8(ascii: "A") &+ 10
        default: preconditionFailure("correlation hex not checked by decode")
        }
    }
}

/// One pass over the body: the object, its keys, their string values.
private struct FetchRequestParser {
    var s: FlatJSONScanner
    init(_ bytes: UnsafeRawBufferPointer) { self.s = FlatJSONScanner(bytes, syntax: .fetchSyntax) }

    private enum Field { case format, responseTopic, correlation, continuedAt }

    /// What was read so far: whole, checked values only.
    var request = FetchRequest()

    mutating func document() throws(WireError) -> FetchRequest {
        request = FetchRequest()
        s.skipWhitespace()
        // docs/relay.md §2: an empty body asks with every default.
        if s.peek() == nil { return request }
        try s.expect(UInt8(ascii: "{"))
        var seenFormat = false
        s.skipWhitespace()
        if try s.peekByte() != UInt8(ascii: "}") {
            while true {
                let keyAt = s.offset
                guard try s.peekByte() == UInt8(ascii: "\"") else { throw .malformed(at: keyAt, .fetchSyntax) }
                let key = try s.scanString(escapes: .refused(.fetchSyntax), utf8: .fetchSyntax)
                let field: Field
                // Keys are compared byte for byte; a typo must not pass silently (§2).
                if s.equals(key, "format") { field = .format }
                else if s.equals(key, "response_topic") { field = .responseTopic }
                else if s.equals(key, "correlation") { field = .correlation }
                else if s.equals(key, "continue") { field = .continuedAt }
                else { throw .malformed(at: keyAt, .fetchUnknownKey) }
                let seen = switch field {
                case .format: seenFormat
                case .responseTopic: request.responseTopic != nil
                case .correlation: request.correlationHex != nil
                case .continuedAt: request.continuedAt != nil
                }
                guard !seen else { throw .malformed(at: keyAt, .fetchDuplicateKey) }
                s.skipWhitespace()
                try s.expect(UInt8(ascii: ":"))
                s.skipWhitespace()
                switch field {
                case .format:
                    request.format = try format()
                    seenFormat = true
                case .responseTopic:
                    request.responseTopic = try responseTopic()
                case .correlation:
                    request.correlationHex = try correlation()
                case .continuedAt:
                    request.continuedAt = try continuedAt()
                }
                s.skipWhitespace()
                let c = try s.peekByte()
                if c == UInt8(ascii: ",") {
                    s.skipOne()
                    s.skipWhitespace()
                    continue
                }
                if c == UInt8(ascii: "}") { break }
                throw .malformed(at: s.offset, .fetchSyntax)
            }
        }
        s.skipOne()  // the `}` peeked above
        s.skipWhitespace()
        try s.requireEnd()
        return request
    }

    /// Every value is a string. Any other JSON value, an object or array included, is the wrong
    /// type, named at its first byte; a byte that starts no JSON value is a syntax error.
    private mutating func string(utf8: Malformed) throws(WireError) -> Range<Int> {
        let at = s.offset
        switch try s.peekByte() {
        case UInt8(ascii: "\""):
            return try s.scanString(escapes: .refused(.fetchSyntax), utf8: utf8)
        case UInt8(ascii: "{"), UInt8(ascii: "["), UInt8(ascii: "t"), UInt8(ascii: "f"), UInt8(ascii: "n"),
             UInt8(ascii: "-"), UInt8(ascii: "0") ... UInt8(ascii: "9"):
            throw .malformed(at: at, .fetchType)
        default:
            throw .malformed(at: at, .fetchSyntax)
        }
    }

    private mutating func format() throws(WireError) -> FetchFormat {
        let at = s.offset
        let value = try string(utf8: .fetchSyntax)
        if s.equals(value, "cbor") { return .cbor }
        if s.equals(value, "json") { return .json }
        throw .malformed(at: at, .fetchFormat)
    }

    /// The v3.1.1 stand-in for MQTT 5.0 §3.3.2.3.5's Response Topic: a topic name a client can
    /// publish to (MQTT 5.0 §4.7: no wildcards; §1.5.4: UTF-8 without NUL), capped at 256 bytes.
    private mutating func responseTopic() throws(WireError) -> Range<Int> {
        let at = s.offset
        let topic = try string(utf8: .fetchResponseTopic)
        guard !topic.isEmpty else { throw .malformed(at: at, .fetchResponseTopic) }
        guard topic.count <= FetchRequest.maxResponseTopic else {
            // Proof: topic.count > 256, so lowerBound + 256 lies inside the topic.
            throw .malformed(at: topic.lowerBound &+ FetchRequest.maxResponseTopic, .fetchResponseTopic)
        }
        // No NUL to look for: raw it is a control character, escaped it is an escape, and the
        // scanner refused both as `fetch-syntax`.
        for i in topic where s.bytes[i] == UInt8(ascii: "+") || s.bytes[i] == UInt8(ascii: "#") {
            throw .malformed(at: i, .fetchResponseTopic)
        }
        return topic
    }

    /// Where the activity is continued: 1 to 64 bytes of UTF-8 (the scanner refused control
    /// characters and escapes), as the device's `continued` message carries it.
    private mutating func continuedAt() throws(WireError) -> Range<Int> {
        let at = s.offset
        let text = try string(utf8: .fetchContinue)
        guard !text.isEmpty else { throw .malformed(at: at, .fetchContinue) }
        // Proof: text.count > 64, so lowerBound + 64 lies inside the text.
        guard text.count <= FetchRequest.maxContinuedAt else {
            throw .malformed(at: text.lowerBound &+ FetchRequest.maxContinuedAt, .fetchContinue)
        }
        return text
    }

    /// The v3.1.1 stand-in for MQTT 5.0 §3.3.2.3.6's Correlation Data: 1 to 64 bytes as 2 to
    /// 128 hex digits, either case.
    private mutating func correlation() throws(WireError) -> Range<Int> {
        let at = s.offset
        let hex = try string(utf8: .fetchSyntax)
        guard !hex.isEmpty else { throw .malformed(at: at, .fetchCorrelation) }
        for i in hex {
            // Proof: i >= lowerBound, so the difference is a digit's index in the value.
            guard FlatJSONScanner.isHex(s.bytes[i]), i &- hex.lowerBound < 2 &* FetchRequest.maxCorrelation else {
                throw .malformed(at: i, .fetchCorrelation)
            }
        }
        // Proof: hex is not empty, so upperBound - 1 is its last digit.
        guard hex.count % 2 == 0 else { throw .malformed(at: hex.upperBound &- 1, .fetchCorrelation) }
        return hex
    }
}
