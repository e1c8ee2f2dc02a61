// The one field a gateway reads off a retained activity or Apple entry it did not write
// (docs/mqtt.md §2, §3): the gateway that published it. The orphan scan (docs/mqtt.md §5) and
// the owner's corrections (docs/rooms.md §7) need nothing else. Both are JSON objects whose
// values are scalars or arrays of scalars (an Apple entry's `kinds`), as the gateway's payload
// writer makes them; anything else names no gateway. One pass over borrowed bytes with the
// tokens of `FlatJSONScanner`; nothing allocates but the result.

extension Malformed {
    /// Not the JSON object of a retained entry (never counted: the reader says nil).
    static let retainedEntrySyntax = Malformed("retained-entry-syntax")
}

public enum RetainedEntry {
    /// A value of a flat entry as the readers need it: strings without escapes (everything a
    /// gateway writes into the fields read here: ids, hex, base64, state words), integers,
    /// booleans. A string with an escape, a number with a fraction and an array read as `.other`.
    public enum Value: Equatable, Sendable {
        case string(String)
        case integer(Int64)
        case bool(Bool)
        case null
        case other

        public var string: String? { if case .string(let s) = self { s } else { nil } }
        public var integer: Int64? { if case .integer(let i) = self { i } else { nil } }
        public var bool: Bool? { if case .bool(let b) = self { b } else { nil } }
    }

    /// The `gateway` of a retained entry, or nil when the bytes are not a JSON object of
    /// scalars and arrays of scalars, have no `gateway` string or have it twice, or write it
    /// with an escape (a gateway id is `a-z 0-9 _ -`, docs/config.md `gateway.id`, so a
    /// gateway never does).
    public static func gateway(_ bytes: UnsafeRawBufferPointer) -> String? {
        var found: Range<Int>?
        var twice = false
        let whole = scan(bytes) { s, key, value in
            guard s.equals(key, "gateway") else { return }
            if found != nil { twice = true }
            if case .string(let range) = value { found = range } else { twice = true }
        }
        guard whole, !twice, let found, !bytes[found].contains(UInt8(ascii: "\\")) else { return nil }
        return String(decoding: UnsafeRawBufferPointer(rebasing: bytes[found]), as: UTF8.self)
    }

    /// Every field of a flat entry (an activity message, an owner's answer: docs/mqtt.md §2,
    /// docs/relay.md §3), or nil when the bytes are not a JSON object of scalars and arrays of
    /// scalars. A key given twice keeps its last value. Allocates the result: for the messages
    /// re-advertising reads, never per advertisement.
    public static func fields(_ bytes: UnsafeRawBufferPointer) -> [String: Value]? {
        var out: [String: Value] = [:]
        let whole = scan(bytes) { s, key, value in
            let name = String(decoding: UnsafeRawBufferPointer(rebasing: bytes[key]), as: UTF8.self)
            switch value {
            case .string(let range):
                out[name] = bytes[range].contains(UInt8(ascii: "\\"))
                    ? .other : .string(String(decoding: UnsafeRawBufferPointer(rebasing: bytes[range]), as: UTF8.self))
            case .number(let range, let fractional):
                out[name] = fractional ? .other : Int64(String(decoding: UnsafeRawBufferPointer(rebasing: bytes[range]), as: UTF8.self)).map { .integer($0) } ?? .other
            case .literal(let word):
                out[name] = word == 0 ? .bool(false) : word == 1 ? .bool(true) : .null
            case .array:
                out[name] = .other
            }
        }
        return whole ? out : nil
    }

    enum Scanned {
        case string(Range<Int>)
        /// The number's whole text (sign included) and whether it has a fraction or exponent.
        case number(Range<Int>, fractional: Bool)
        /// 0 false, 1 true, 2 null.
        case literal(Int)
        case array
    }

    /// One pass over a flat object: `visit` sees each key (the string's content) and its value;
    /// false when the bytes are not a JSON object of scalars and arrays of scalars.
    static func scan(_ bytes: UnsafeRawBufferPointer,
                     _ visit: (borrowing FlatJSONScanner, Range<Int>, Scanned) -> Void) -> Bool {
        var s = FlatJSONScanner(bytes, syntax: .retainedEntrySyntax)
        let quote = UInt8(ascii: "\"")
        do throws(WireError) {
            s.skipWhitespace()
            try s.expect(UInt8(ascii: "{"))
            s.skipWhitespace()
            if try s.peekByte() != UInt8(ascii: "}") {
                while true {
                    guard try s.peekByte() == quote else { return false }
                    let key = try s.scanString(escapes: .checked, utf8: .retainedEntrySyntax)
                    s.skipWhitespace()
                    try s.expect(UInt8(ascii: ":"))
                    s.skipWhitespace()
                    if try s.peekByte() == UInt8(ascii: "[") {
                        s.skipOne()
                        s.skipWhitespace()
                        if try s.peekByte() != UInt8(ascii: "]") {
                            while true {
                                guard try scalar(&s) != nil else { return false }
                                s.skipWhitespace()
                                let next = try s.peekByte()
                                s.skipOne()
                                s.skipWhitespace()
                                if next == UInt8(ascii: "]") { break }
                                guard next == UInt8(ascii: ",") else { return false }
                            }
                        } else {
                            s.skipOne()
                        }
                        visit(s, key, .array)
                    } else {
                        guard let value = try scalar(&s) else { return false }
                        visit(s, key, value)
                    }
                    s.skipWhitespace()
                    let next = try s.peekByte()
                    if next == UInt8(ascii: ",") {
                        s.skipOne()
                        s.skipWhitespace()
                        continue
                    }
                    guard next == UInt8(ascii: "}") else { return false }
                    break
                }
            }
            s.skipOne()  // the `}` peeked above
            s.skipWhitespace()
            try s.requireEnd()
            return true
        } catch {
            return false
        }
    }

    /// One scalar, or nil for anything else (an object, or an array inside an array).
    private static func scalar(_ s: inout FlatJSONScanner) throws(WireError) -> Scanned? {
        let c = try s.peekByte()
        if c == UInt8(ascii: "\"") { return .string(try s.scanString(escapes: .checked, utf8: .retainedEntrySyntax)) }
        if c == UInt8(ascii: "t") { try s.literal("true"); return .literal(1) }
        if c == UInt8(ascii: "f") { try s.literal("false"); return .literal(0) }
        if c == UInt8(ascii: "n") { try s.literal("null"); return .literal(2) }
        if c == UInt8(ascii: "-") || FlatJSONScanner.isDigit(c) {
            let n = try s.scanNumber()
            let start = n.negative ? n.digits.lowerBound - 1 : n.digits.lowerBound
            return .number(start..<n.digits.upperBound, fractional: n.fractionOrExponent)
        }
        return nil
    }
}

/// RFC 4648 §4 base64 with padding, as the relay writes payloads into JSON (docs/relay.md §3)
/// and users write keys into the config.
public enum Base64 {
    /// The decoded bytes; nil on any character outside the alphabet and `=`.
    public static func decode(_ s: some StringProtocol) -> [UInt8]? {
        var out: [UInt8] = []
        out.reserveCapacity(s.utf8.count * 3 / 4)
        var acc: UInt32 = 0, bits = 0
        for c in s.utf8 where c != 0x3D {
            let v: UInt8
            switch c {
            case 0x41...0x5A: v = c - 0x41
            case 0x61...0x7A: v = c - 0x61 + 26
            case 0x30...0x39: v = c - 0x30 + 52
            case 0x2B: v = 62
            case 0x2F: v = 63
            default: return nil
            }
            acc = acc << 6 | UInt32(v)
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: acc >> UInt32(bits)))
            }
        }
        return out
    }
}
