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
    /// The `gateway` of a retained entry, or nil when the bytes are not a JSON object of
    /// scalars and arrays of scalars, have no `gateway` string or have it twice, or write it
    /// with an escape (a gateway id is `a-z 0-9 _ -`, docs/config.md `gateway.id`, so a
    /// gateway never does).
    public static func gateway(_ bytes: UnsafeRawBufferPointer) -> String? {
        var s = FlatJSONScanner(bytes, syntax: .retainedEntrySyntax)
        let quote = UInt8(ascii: "\"")
        do throws(WireError) {
            s.skipWhitespace()
            try s.expect(UInt8(ascii: "{"))
            s.skipWhitespace()
            var found: Range<Int>?
            if try s.peekByte() != UInt8(ascii: "}") {
                while true {
                    guard try s.peekByte() == quote else { return nil }
                    let key = try s.scanString(escapes: .checked, utf8: .retainedEntrySyntax)
                    s.skipWhitespace()
                    try s.expect(UInt8(ascii: ":"))
                    s.skipWhitespace()
                    if try s.peekByte() == UInt8(ascii: "[") {
                        s.skipOne()
                        s.skipWhitespace()
                        if try s.peekByte() != UInt8(ascii: "]") {
                            while true {
                                guard try scalar(&s) != nil else { return nil }
                                s.skipWhitespace()
                                let next = try s.peekByte()
                                s.skipOne()
                                s.skipWhitespace()
                                if next == UInt8(ascii: "]") { break }
                                guard next == UInt8(ascii: ",") else { return nil }
                            }
                        } else {
                            s.skipOne()
                        }
                    } else {
                        guard let value = try scalar(&s) else { return nil }
                        if s.equals(key, "gateway") {
                            guard found == nil, let string = value else { return nil }
                            found = string
                        }
                    }
                    s.skipWhitespace()
                    let next = try s.peekByte()
                    if next == UInt8(ascii: ",") {
                        s.skipOne()
                        s.skipWhitespace()
                        continue
                    }
                    guard next == UInt8(ascii: "}") else { return nil }
                    break
                }
            }
            s.skipOne()  // the `}` peeked above
            s.skipWhitespace()
            try s.requireEnd()
            guard let found, !bytes[found].contains(UInt8(ascii: "\\")) else { return nil }
            return String(decoding: UnsafeRawBufferPointer(rebasing: bytes[found]), as: UTF8.self)
        } catch {
            return nil
        }
    }

    /// One scalar: `.some(range)` for a string (its content), `.some(nil)` for a number or a
    /// literal, nil for anything else (an object, or an array inside an array).
    private static func scalar(_ s: inout FlatJSONScanner) throws(WireError) -> Range<Int>?? {
        let c = try s.peekByte()
        if c == UInt8(ascii: "\"") { return .some(try s.scanString(escapes: .checked, utf8: .retainedEntrySyntax)) }
        if c == UInt8(ascii: "t") { try s.literal("true"); return .some(nil) }
        if c == UInt8(ascii: "f") { try s.literal("false"); return .some(nil) }
        if c == UInt8(ascii: "n") { try s.literal("null"); return .some(nil) }
        if c == UInt8(ascii: "-") || FlatJSONScanner.isDigit(c) { _ = try s.scanNumber(); return .some(nil) }
        return nil
    }
}
