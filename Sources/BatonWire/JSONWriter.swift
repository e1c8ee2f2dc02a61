// A JSON (RFC 8259) writer over a caller-owned buffer, for every MQTT payload Baton
// publishes. Like `ByteWriter` it never grows: each token is measured, checked against the
// room left (throwing `.noRoom`), then written whole, so the output always ends on a token
// boundary. After `.noRoom` the document is incomplete; start again with a larger buffer.
//
// Commas and colons are placed by the writer. Misuse (a value in an object without a key,
// an unbalanced end, nesting past `maxDepth`) is the caller's bug and a `precondition`.
// Nothing allocates: numbers are formatted on the stack.

public struct JSONWriter {
    public let buffer: UnsafeMutableRawBufferPointer
    public private(set) var count: Int = 0

    /// Nesting this writer tracks (one bit per level in two words).
    public static let maxDepth = 64

    /// Bit d: the container at depth d+1 is an object (else an array).
    private var objectBits: UInt64 = 0
    /// Bit d: the container at depth d+1 already holds a member (the next needs a comma).
    private var nonEmptyBits: UInt64 = 0
    private var depth = 0
    /// A key was written and its value is due.
    private var afterKey = false
    /// The top-level value was written.
    private var done = false

    public init(_ buffer: UnsafeMutableRawBufferPointer) {
        self.buffer = buffer
    }

    public var capacity: Int { buffer.count }
    public var available: Int { buffer.count - count }
    /// The JSON written so far, borrowed.
    public var written: UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: buffer[..<count]) }
    /// True when one complete top-level value has been written.
    public var isComplete: Bool { done && depth == 0 }

    // MARK: structure

    public mutating func beginObject() throws(WireError) { try open(UInt8(ascii: "{"), object: true) }
    public mutating func endObject() throws(WireError) { try close(UInt8(ascii: "}"), object: true) }
    public mutating func beginArray() throws(WireError) { try open(UInt8(ascii: "["), object: false) }
    public mutating func endArray() throws(WireError) { try close(UInt8(ascii: "]"), object: false) }

    /// Writes an object member's name (and the colon); the next call writes its value.
    public mutating func key(utf8: UnsafeRawBufferPointer) throws(WireError) {
        precondition(depth > 0 && isObject(depth) && !afterKey, "JSON key outside an object or twice in a row")
        let comma = nonEmpty(depth) ? 1 : 0
        let n = comma + JSONWriter.quotedLength(utf8) + 1
        try room(n)
        if comma == 1 { put(UInt8(ascii: ",")) }
        putQuoted(utf8)
        put(UInt8(ascii: ":"))
        setNonEmpty()
        afterKey = true
    }

    public mutating func key(_ name: StaticString) throws(WireError) {
        // The standard library's withUTF8Buffer/withUTF8 take non-throwing or untyped-throwing
        // bodies, so the typed error is carried out as a value.
        let failure: WireError? = name.withUTF8Buffer { b -> WireError? in
            do throws(WireError) { try key(utf8: UnsafeRawBufferPointer(b)); return nil } catch { return error }
        }
        if let failure { throw failure }
    }

    public mutating func key(_ name: String) throws(WireError) {
        var name = name
        // withUTF8 on a native String borrows its storage (a bridged one is copied once).
        let failure: WireError? = name.withUTF8 { b -> WireError? in
            do throws(WireError) { try key(utf8: UnsafeRawBufferPointer(b)); return nil } catch { return error }
        }
        if let failure { throw failure }
    }

    // MARK: values

    /// A string value from UTF-8. Quote, backslash and C0 controls are escaped (RFC 8259 §7:
    /// `\"`, `\\`, `\u00XX`); each byte of ill-formed UTF-8 becomes U+FFFD, so the output is
    /// always valid JSON even for names read off the air.
    public mutating func string(utf8: UnsafeRawBufferPointer) throws(WireError) {
        try value(JSONWriter.quotedLength(utf8)) { w in w.putQuoted(utf8) }
    }

    public mutating func string(_ s: StaticString) throws(WireError) {
        let failure: WireError? = s.withUTF8Buffer { b -> WireError? in
            do throws(WireError) { try string(utf8: UnsafeRawBufferPointer(b)); return nil } catch { return error }
        }
        if let failure { throw failure }
    }

    public mutating func string(_ s: String) throws(WireError) {
        var s = s
        let failure: WireError? = s.withUTF8 { b -> WireError? in
            do throws(WireError) { try string(utf8: UnsafeRawBufferPointer(b)); return nil } catch { return error }
        }
        if let failure { throw failure }
    }

    /// A string of `bytes` in base64 (RFC 4648 §4, standard alphabet, padded).
    public mutating func base64(_ bytes: UnsafeRawBufferPointer) throws(WireError) {
        // Proof of no overflow: inputs are bounded by memory, far below Int.max / 4.
        let n = (bytes.count + 2) / 3 * 4 + 2
        try value(n) { w in
            w.put(UInt8(ascii: "\""))
            var i = 0
            while i < bytes.count {
                let b0 = UInt32(bytes[i])
                let b1 = i + 1 < bytes.count ? UInt32(bytes[i + 1]) : 0
                let b2 = i + 2 < bytes.count ? UInt32(bytes[i + 2]) : 0
                let v = b0 << 16 | b1 << 8 | b2
                w.put(JSONWriter.base64Digit(v >> 18))
                w.put(JSONWriter.base64Digit(v >> 12))
                w.put(i + 1 < bytes.count ? JSONWriter.base64Digit(v >> 6) : UInt8(ascii: "="))
                w.put(i + 2 < bytes.count ? JSONWriter.base64Digit(v) : UInt8(ascii: "="))
                i += 3
            }
            w.put(UInt8(ascii: "\""))
        }
    }

    public mutating func int(_ v: Int64) throws(WireError) {
        let magnitude = v.magnitude
        let n = JSONWriter.digitCount(magnitude) + (v < 0 ? 1 : 0)
        try value(n) { w in
            if v < 0 { w.put(UInt8(ascii: "-")) }
            w.putDigits(magnitude)
        }
    }

    public mutating func uint(_ v: UInt64) throws(WireError) {
        try value(JSONWriter.digitCount(v)) { w in w.putDigits(v) }
    }

    /// A double in the shortest digits that read back as the same value; NaN and ±infinity,
    /// which JSON lacks (RFC 8259 §6), as `null`.
    ///
    /// The digits come from the standard library's `Double.write(to:)` (the same algorithm as
    /// `description`), captured by `_writeASCII`, the stream hook it calls with its stack
    /// buffer, so no String is made. Should a future library call `write(_: String)`
    /// instead, the result is the same and merely allocates.
    public mutating func double(_ d: Double) throws(WireError) {
        guard d.isFinite else { return try null() }
        var digits = DigitSink()
        d.write(to: &digits)
        precondition(!digits.overflow, "Double's shortest form exceeds 32 characters")
        try value(digits.count) { w in
            for i in 0 ..< digits.count { w.put(digits.bytes[i]) }
        }
    }

    public mutating func bool(_ b: Bool) throws(WireError) {
        if b { try literal("true") } else { try literal("false") }
    }

    public mutating func null() throws(WireError) { try literal("null") }

    // MARK: internals

    private mutating func literal(_ s: StaticString) throws(WireError) {
        try value(s.utf8CodeUnitCount) { w in
            s.withUTF8Buffer { b in for c in b { w.put(c) } }
        }
    }

    /// Writes one value of `length` bytes, preceded by a comma when an array needs one.
    private mutating func value(_ length: Int, _ body: (inout JSONWriter) -> Void) throws(WireError) {
        let comma = prepareValue()
        try room(length + comma)
        if comma == 1 { put(UInt8(ascii: ",")) }
        body(&self)
        finishValue()
    }

    /// 1 when a comma must precede the next value; checks the value is allowed here.
    private func prepareValue() -> Int {
        if depth == 0 {
            precondition(!done, "a second top-level JSON value")
            return 0
        }
        if isObject(depth) {
            precondition(afterKey, "JSON value in an object without a key")
            return 0
        }
        return nonEmpty(depth) ? 1 : 0
    }

    private mutating func finishValue() {
        if depth == 0 { done = true; return }
        if isObject(depth) { afterKey = false } else { setNonEmpty() }
    }

    private mutating func open(_ c: UInt8, object: Bool) throws(WireError) {
        precondition(depth < JSONWriter.maxDepth, "JSON nested deeper than JSONWriter.maxDepth")
        let comma = prepareValue()
        try room(1 + comma)
        if comma == 1 { put(UInt8(ascii: ",")) }
        put(c)
        if depth > 0 && !isObject(depth) { setNonEmpty() }
        afterKey = false
        depth += 1
        let bit: UInt64 = 1 << UInt64(depth - 1)
        if object { objectBits |= bit } else { objectBits &= ~bit }
        nonEmptyBits &= ~bit
    }

    private mutating func close(_ c: UInt8, object: Bool) throws(WireError) {
        precondition(depth > 0 && isObject(depth) == object && !afterKey, "unbalanced JSON end")
        try room(1)
        put(c)
        depth -= 1
        if depth == 0 { done = true }
    }

    private func isObject(_ d: Int) -> Bool { objectBits & (1 << UInt64(d - 1)) != 0 }
    private func nonEmpty(_ d: Int) -> Bool { nonEmptyBits & (1 << UInt64(d - 1)) != 0 }
    private mutating func setNonEmpty() { nonEmptyBits |= 1 << UInt64(depth - 1) }

    private func room(_ n: Int) throws(WireError) {
        guard n <= available else { throw .noRoom(need: count + n, have: capacity) }
    }

    private mutating func put(_ b: UInt8) {
        precondition(count < buffer.count, "JSON writer wrote past the length it measured")
        buffer[count] = b
        count += 1
    }

    private mutating func putDigits(_ v: UInt64) {
        let n = JSONWriter.digitCount(v)
        var rest = v
        // Fill the n digit positions from the right.
        let start = count
        for _ in 0 ..< n { put(0) }
        var i = start + n - 1
        repeat {
            buffer[i] = UInt8(ascii: "0") + UInt8(rest % 10)
            rest /= 10
            i -= 1
        } while rest > 0
    }

    static func digitCount(_ v: UInt64) -> Int {
        var n = 1, x = v
        while x >= 10 { x /= 10; n += 1 }
        return n
    }

    static func base64Digit(_ v: UInt32) -> UInt8 {
        let i = UInt8(truncatingIfNeeded: v & 0x3F)
        switch i {
        case 0 ..< 26: return UInt8(ascii: "A") + i
        case 26 ..< 52: return UInt8(ascii: "a") + i - 26
        case 52 ..< 62: return UInt8(ascii: "0") + i - 52
        case 62: return UInt8(ascii: "+")
        default: return UInt8(ascii: "/")
        }
    }

    /// Bytes `putQuoted` writes: the quotes and each byte escaped or replaced.
    static func quotedLength(_ s: UnsafeRawBufferPointer) -> Int {
        var n = 2, i = 0
        while i < s.count {
            let b = s[i]
            if b < 0x80 {
                n += b == UInt8(ascii: "\"") || b == UInt8(ascii: "\\") ? 2 : (b < 0x20 ? 6 : 1)
                i += 1
            } else if let len = UTF8Check.sequenceLength(s, at: i) {
                n += len; i += len
            } else {
                n += 3; i += 1  // U+FFFD is EF BF BD
            }
        }
        return n
    }

    private mutating func putQuoted(_ s: UnsafeRawBufferPointer) {
        put(UInt8(ascii: "\""))
        var i = 0
        while i < s.count {
            let b = s[i]
            if b < 0x80 {
                if b == UInt8(ascii: "\"") || b == UInt8(ascii: "\\") {
                    put(UInt8(ascii: "\\")); put(b)
                } else if b < 0x20 {
                    put(UInt8(ascii: "\\")); put(UInt8(ascii: "u")); put(UInt8(ascii: "0")); put(UInt8(ascii: "0"))
                    put(Hex.digit(b >> 4)); put(Hex.digit(b))
                } else {
                    put(b)
                }
                i += 1
            } else if let len = UTF8Check.sequenceLength(s, at: i) {
                for k in 0 ..< len { put(s[i + k]) }
                i += len
            } else {
                put(0xEF); put(0xBF); put(0xBD)
                i += 1
            }
        }
        put(UInt8(ascii: "\""))
    }
}

/// Collects the ASCII that `Double.write(to:)` produces, on the stack.
struct DigitSink: TextOutputStream {
    var bytes: InlineArray<32, UInt8> = .init(repeating: 0)
    var count = 0
    var overflow = false

    mutating func write(_ string: String) {
        for b in string.utf8 { append(b) }
    }

    mutating func _writeASCII(_ buffer: UnsafeBufferPointer<UInt8>) {
        for b in buffer { append(b) }
    }

    private mutating func append(_ b: UInt8) {
        guard count < 32 else { overflow = true; return }
        bytes[count] = b
        count += 1
    }
}
