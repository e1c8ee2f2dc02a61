// The tokens of RFC 8259 JSON, scanned over borrowed bytes without allocating: what the
// decoders of Baton's small flat JSON messages share (Sighting.swift, docs/rooms.md §2;
// FetchRequest.swift, docs/relay.md §2). Each decoder walks its own object and decides what
// a key or value means; this scanner only reads whitespace, punctuation, strings, literals and
// numbers, and throws with the decoder's own reasons, so every message keeps its stats names.
//
// Errors: input that ends inside a token is `.truncated` at the end of the input (the
// reader's peek/read at the end); a byte the grammar does not allow is `.malformed` at that
// byte with the caller's `syntax` reason.

struct FlatJSONScanner {
    var r: ByteReader
    /// The reason for a byte RFC 8259 does not allow where it stands.
    let syntax: Malformed

    init(_ bytes: UnsafeRawBufferPointer, syntax: Malformed) {
        self.r = ByteReader(bytes)
        self.syntax = syntax
    }

    var offset: Int { r.offset }
    var bytes: UnsafeRawBufferPointer { r.bytes }

    /// What a string may hold after a backslash.
    enum Escapes {
        /// RFC 8259 §7's escapes, checked but not decoded.
        case checked
        /// None: a backslash is refused with this reason, at the backslash.
        case refused(Malformed)
    }

    /// The next byte, or nil at the end.
    func peek() -> UInt8? { r.isAtEnd ? nil : r.bytes[r.offset] }

    /// The next byte; `.truncated` at the end.
    func peekByte() throws(WireError) -> UInt8 { try r.peekU8() }

    /// Moves past one byte the caller has just peeked.
    mutating func skipOne() {
        precondition(!r.isAtEnd, "skipOne past the end: peek first")
        // Proof: the precondition above keeps offset < count.
        r._offset &+= 1
    }

    /// RFC 8259 §2: space, tab, line feed, carriage return.
    mutating func skipWhitespace() {
        while let c = peek(), c == 0x20 || c == 0x09 || c == 0x0A || c == 0x0D { skipOne() }
    }

    mutating func expect(_ c: UInt8) throws(WireError) {
        guard try r.peekU8() == c else { throw .malformed(at: r.offset, syntax) }
        skipOne()
    }

    /// `true`, `false` or `null`, spelt exactly.
    mutating func literal(_ word: StaticString) throws(WireError) {
        let failure: WireError? = word.withUTF8Buffer { w -> WireError? in
            for expected in w {
                do throws(WireError) {
                    guard try r.peekU8() == expected else { return .malformed(at: r.offset, syntax) }
                    skipOne()
                } catch {
                    return error
                }
            }
            return nil
        }
        if let failure { throw failure }
    }

    /// RFC 8259 §6: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`. Returns the
    /// integer part's digits (offsets into the input). What follows the number is the caller's
    /// business, so `01` fails there, at the `1`.
    mutating func scanNumber() throws(WireError) -> (negative: Bool, digits: Range<Int>, fractionOrExponent: Bool) {
        var negative = false
        if try r.peekU8() == UInt8(ascii: "-") { negative = true; skipOne() }
        let first = r.offset
        let c = try r.peekU8()
        guard Self.isDigit(c) else { throw .malformed(at: r.offset, syntax) }
        skipOne()
        if c != UInt8(ascii: "0") { skipDigits() }
        let digits = first ..< r.offset
        var more = false
        if peek() == UInt8(ascii: ".") {
            skipOne()
            try requireDigits()
            more = true
        }
        if peek() == UInt8(ascii: "e") || peek() == UInt8(ascii: "E") {
            skipOne()
            if peek() == UInt8(ascii: "+") || peek() == UInt8(ascii: "-") { skipOne() }
            try requireDigits()
            more = true
        }
        return (negative, digits, more)
    }

    private mutating func requireDigits() throws(WireError) {
        guard Self.isDigit(try r.peekU8()) else { throw .malformed(at: r.offset, syntax) }
        skipDigits()
    }

    private mutating func skipDigits() {
        while let c = peek(), Self.isDigit(c) { skipOne() }
    }

    /// A string, opening quote included; returns its content (between the quotes, escapes as
    /// written). RFC 8259 §7: no raw control characters, escapes from the grammar only (or
    /// none, per `escapes`); §8.1: UTF-8, a sequence that is not is `utf8` at its first byte.
    mutating func scanString(escapes: Escapes, utf8: Malformed) throws(WireError) -> Range<Int> {
        try expect(UInt8(ascii: "\""))
        let start = r.offset
        while true {
            let at = r.offset
            let c = try r.readU8()
            // Proof: the closing quote was just read, so at >= start and at is its offset.
            if c == UInt8(ascii: "\"") { return start ..< at }
            if c < 0x20 { throw .malformed(at: at, syntax) }
            if c == UInt8(ascii: "\\") {
                if case .refused(let reason) = escapes { throw .malformed(at: at, reason) }
                let e = try r.readU8()
                switch e {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"),
                     UInt8(ascii: "f"), UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                    continue
                case UInt8(ascii: "u"):
                    for _ in 0 ..< 4 {
                        guard Self.isHex(try r.peekU8()) else { throw .malformed(at: r.offset, syntax) }
                        skipOne()
                    }
                default:
                    // Proof: `at` and the escape byte after it lie inside the input.
                    throw .malformed(at: at &+ 1, syntax)
                }
                continue
            }
            if c < 0x80 { continue }
            if let length = UTF8Check.sequenceLength(r.bytes, at: at) {
                // Proof: sequenceLength checked that `length` bytes from `at` lie inside the input.
                try r.skip(length &- 1)
                continue
            }
            // A sequence the input's end cuts short is truncation, not bad UTF-8: more bytes could
            // still make it whole. One that no bytes could (FF, or a wrong continuation) is bad.
            if let need = Self.bytesMissing(r.bytes, at: at) { throw .truncated(at: r.bytes.count, need: need) }
            throw .malformed(at: at, utf8)
        }
    }

    /// When the bytes from `at` to the end are the start of a well-formed UTF-8 sequence that
    /// the end cuts short, how many bytes it lacks; else nil. The ranges are those of
    /// `UTF8Check.sequenceLength` (Unicode 15, §3.9, Table 3-7).
    static func bytesMissing(_ p: UnsafeRawBufferPointer, at i: Int) -> Int? {
        guard i >= 0, i < p.count else { return nil }
        let length: Int, low: UInt8, high: UInt8
        switch p[i] {
        case 0xC2 ... 0xDF: (length, low, high) = (2, 0x80, 0xBF)
        case 0xE0: (length, low, high) = (3, 0xA0, 0xBF)
        case 0xE1 ... 0xEC, 0xEE ... 0xEF: (length, low, high) = (3, 0x80, 0xBF)
        case 0xED: (length, low, high) = (3, 0x80, 0x9F)
        case 0xF0: (length, low, high) = (4, 0x90, 0xBF)
        case 0xF1 ... 0xF3: (length, low, high) = (4, 0x80, 0xBF)
        case 0xF4: (length, low, high) = (4, 0x80, 0x8F)
        default: return nil
        }
        // Proof: 0 <= i < count.
        let present = p.count &- i
        guard present < length else { return nil }
        for k in 1 ..< present {
            // Proof: k < present, so i + k < count.
            let c = p[i &+ k]
            let (lo, hi): (UInt8, UInt8) = k == 1 ? (low, high) : (0x80, 0xBF)
            guard c >= lo, c <= hi else { return nil }
        }
        // Proof: present < length <= 4.
        return length &- present
    }

    /// Throws `.trailing` unless every byte was read.
    func requireEnd() throws(WireError) { try r.requireEnd() }

    /// True when `bytes[range]` is exactly `word`: keys and enumerated values are compared
    /// byte for byte.
    func equals(_ range: Range<Int>, _ word: StaticString) -> Bool {
        word.withUTF8Buffer { w in UnsafeRawBufferPointer(rebasing: r.bytes[range]).elementsEqual(w) }
    }

    static func isDigit(_ c: UInt8) -> Bool { c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9") }

    static func isHex(_ c: UInt8) -> Bool {
        isDigit(c) || (c >= UInt8(ascii: "a") && c <= UInt8(ascii: "f")) || (c >= UInt8(ascii: "A") && c <= UInt8(ascii: "F"))
    }
}
