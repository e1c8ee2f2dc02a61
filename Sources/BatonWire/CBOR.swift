// Low-level deterministic CBOR (RFC 8949): the data item head, floats in their shortest form,
// UTF-8 well-formedness, bytewise ordering, and `CBORValue`, a borrowed cursor over one
// already-validated item. The activity payload (ActivityPayload.swift, docs/payload.md) is
// built on these; nothing here allocates.
//
// A head is the initial byte (major type in bits 7–5, additional information in bits 4–0)
// and 0, 1, 2, 4 or 8 argument bytes, big-endian (RFC 8949 §3). Core deterministic
// encoding (§4.2.1) demands the shortest argument, definite lengths only, map keys sorted
// bytewise by their encodings, and floats in the shortest form that keeps the value (§4.2.2).

extension Malformed {
    /// An argument not in its shortest form, e.g. 0x18 0x05 for 5 (RFC 8949 §4.2.1).
    public static let cborNonPreferredArgument = Malformed("cbor-non-preferred-argument")
    /// An indefinite-length string, array or map (RFC 8949 §3.2; forbidden by §4.2.1).
    public static let cborIndefiniteLength = Malformed("cbor-indefinite-length")
    /// Additional information 28–30, or 31 on major types 0, 1, 6: not well-formed (RFC 8949 §3).
    public static let cborReservedInfo = Malformed("cbor-reserved-info")
    /// 0xFF, the "break" stop code, outside an indefinite-length item (RFC 8949 §3.2.1).
    public static let cborUnexpectedBreak = Malformed("cbor-unexpected-break")
    /// A float that a shorter float encodes exactly (RFC 8949 §4.2.2, §4.2.1).
    public static let cborNonPreferredFloat = Malformed("cbor-non-preferred-float")
    /// A NaN other than the half-precision 0xF9 0x7E 0x00 (RFC 8949 §4.2.2; docs/payload.md §3.4).
    public static let cborNonCanonicalNaN = Malformed("cbor-non-canonical-nan")
    /// Map keys not in bytewise order of their encodings (RFC 8949 §4.2.1).
    public static let cborUnsortedKeys = Malformed("cbor-unsorted-keys")
    /// The same map key twice (RFC 8949 §5.6: not valid).
    public static let cborDuplicateKey = Malformed("cbor-duplicate-key")
    /// A text string that is not well-formed UTF-8 (RFC 8949 §3.1 major type 3; RFC 3629 §4).
    public static let cborBadUTF8 = Malformed("cbor-bad-utf8")
    /// A tag other than 1 (date), 32 (URI), 258 (set) (docs/payload.md §3.6).
    public static let cborDisallowedTag = Malformed("cbor-disallowed-tag")
    /// A simple value other than false, true, null: undefined, 0–19, or a one-byte simple.
    public static let cborDisallowedSimple = Malformed("cbor-disallowed-simple")
    /// A container nested deeper than the configured depth cap.
    public static let cborTooDeep = Malformed("cbor-too-deep")
    /// An array, map or set with more items than the configured per-container cap.
    public static let cborTooManyItems = Malformed("cbor-too-many-items")
    /// An integer outside Int64 (docs/payload.md §3.3).
    public static let cborIntegerRange = Malformed("cbor-integer-range")
    /// A map key that is not a text string (userInfo keys are strings, as NSUserActivity's are).
    public static let cborMapKeyNotText = Malformed("cbor-map-key-not-text")
    /// Tag 1 over something other than an integer or a non-integral finite float, or a date
    /// outside 0001-01-01T00:00:00Z … 9999-12-31T23:59:59Z (docs/payload.md §3.6).
    public static let cborBadDate = Malformed("cbor-bad-date")
    /// Tag 32 over something other than an absolute URI text (RFC 3986 §3.1 scheme, no
    /// whitespace or control characters).
    public static let cborBadURL = Malformed("cbor-bad-url")
    /// Tag 258 over something other than an array (docs/payload.md §3.6).
    public static let cborBadSet = Malformed("cbor-bad-set")
    /// Set elements not in bytewise order of their encodings (docs/payload.md §3.6).
    public static let cborUnsortedSet = Malformed("cbor-unsorted-set")
    /// The same element twice in a set.
    public static let cborDuplicateSetElement = Malformed("cbor-duplicate-set-element")
}

/// Constants and pure helpers of RFC 8949.
public enum CBOR {
    // Major types, RFC 8949 §3.1.
    public static let majorUnsigned: UInt8 = 0
    public static let majorNegative: UInt8 = 1
    public static let majorBytes: UInt8 = 2
    public static let majorText: UInt8 = 3
    public static let majorArray: UInt8 = 4
    public static let majorMap: UInt8 = 5
    public static let majorTag: UInt8 = 6
    public static let majorSimple: UInt8 = 7

    // Tags this project allows (docs/payload.md §3.6).
    /// Epoch-based date/time, RFC 8949 §3.4.2.
    public static let tagEpochDate: UInt64 = 1
    /// URI, RFC 8949 §3.4.5.3.
    public static let tagURI: UInt64 = 32
    /// Mathematical finite set, IANA "CBOR Tags" registry, 258.
    public static let tagSet: UInt64 = 258

    // Simple values, RFC 8949 §3.3.
    public static let simpleFalse: UInt8 = 20
    public static let simpleTrue: UInt8 = 21
    public static let simpleNull: UInt8 = 22

    /// The only NaN a deterministic encoding carries: half-precision quiet NaN, 0xF9 0x7E 0x00.
    public static let canonicalNaNHalfBits: UInt16 = 0x7E00

    /// Bytes a head takes with this argument in preferred serialization (RFC 8949 §4.2.1).
    @inlinable
    public static func headLength(argument: UInt64) -> Int {
        switch argument {
        case ..<24: 1
        case ...0xFF: 2
        case ...0xFFFF: 3
        case ...0xFFFF_FFFF: 5
        default: 9
        }
    }

    /// Bytes a float takes in its shortest exact form (RFC 8949 §4.2.2): 3, 5 or 9.
    public static func floatLength(_ d: Double) -> Int {
        if d.isNaN || halfBits(exactly: d) != nil { return 3 }
        if Double(Float(d)) == d { return 5 }
        return 9
    }

    /// The binary16 encoding of `d` when binary16 holds it exactly (infinities included),
    /// else nil. NaN gives nil: callers encode every NaN as `canonicalNaNHalfBits`.
    ///
    /// Done by hand on the bits, not with `Float16`, which Swift lacks on x86_64 macOS.
    public static func halfBits(exactly d: Double) -> UInt16? {
        if d.isNaN { return nil }
        // binary16 ⊂ binary32: a value that binary32 cannot hold, binary16 cannot either.
        let f = Float(d)
        guard Double(f) == d else { return nil }
        let bits = f.bitPattern
        let sign = UInt16(truncatingIfNeeded: bits >> 16) & 0x8000
        if f.isInfinite { return sign | 0x7C00 }
        if f == 0 { return sign }
        let biased = Int((bits >> 23) & 0xFF)
        let mantissa = bits & 0x7F_FFFF
        // Binary32 subnormals (below 2^-126) are far below binary16's smallest (2^-24).
        guard biased != 0 else { return nil }
        let e = biased - 127
        if e >= -14 && e <= 15 {
            // Normal binary16: 10 mantissa bits, the low 13 of binary32's must be zero.
            guard mantissa & 0x1FFF == 0 else { return nil }
            return sign | UInt16(e + 15) << 10 | UInt16(truncatingIfNeeded: mantissa >> 13)
        }
        if e >= -24 && e < -14 {
            // Subnormal binary16: m × 2^-24 with m < 1024. The value is (2^23 | mantissa) × 2^(e-23),
            // so m = (2^23 | mantissa) >> -(e+1), exact only if the shifted-out bits are zero.
            let full = 0x80_0000 | mantissa
            let shift = UInt32(-(e + 1))  // 14…23
            guard full & ((1 << shift) - 1) == 0 else { return nil }
            return sign | UInt16(truncatingIfNeeded: full >> shift)
        }
        return nil
    }

    /// The value of binary16 bits (IEEE 754-2008 §3.4; RFC 8949 Appendix D gives the same in C).
    public static func double(halfBits h: UInt16) -> Double {
        let negative = h & 0x8000 != 0
        let exponent = Int((h >> 10) & 0x1F)
        let mantissa = Double(h & 0x3FF)
        let magnitude: Double
        switch exponent {
        case 0: magnitude = mantissa * 0x1p-24
        case 31: magnitude = mantissa == 0 ? .infinity : .nan
        default: magnitude = (1024 + mantissa) * Double(sign: .plus, exponent: exponent - 25, significand: 1)
        }
        return negative ? -magnitude : magnitude
    }

    /// True when `d` is finite and has no fractional part.
    ///
    /// By hand rather than `d.rounded(.towardZero) == d`: `rounded` compiles to libm's
    /// `trunc`, which BatonWire does not link (executables without Foundation, such as the
    /// fuzz targets, then fail to link). `Int64(_:)` truncates with one instruction.
    public static func isIntegral(_ d: Double) -> Bool {
        guard d.isFinite else { return false }
        // Every double of magnitude 2^52 or more is an integer; below, Int64 holds it.
        if d.magnitude >= 0x1p52 { return true }
        return Double(Int64(d)) == d
    }

    /// Bytewise lexicographic order (RFC 8949 §4.2.1): negative when `a` sorts first.
    /// A CBOR item is self-delimiting, so one item's encoding is never a proper prefix of
    /// another's; the length tie-break is there only to make this a total order on bytes.
    public static func compare(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Int {
        let n = min(a.count, b.count)
        var i = 0
        while i < n {
            let x = a[i], y = b[i]
            if x != y { return x < y ? -1 : 1 }
            i += 1
        }
        return a.count == b.count ? 0 : (a.count < b.count ? -1 : 1)
    }
}

// MARK: - UTF-8 (RFC 3629 §4)

enum UTF8Check {
    /// The length of the well-formed UTF-8 sequence starting at `i`, or nil when the bytes
    /// there are ill-formed: a stray continuation byte, C0/C1 or F5–FF, an overlong form,
    /// a surrogate (U+D800–DFFF), above U+10FFFF, or cut short. Table 3-7 of Unicode 15 §3.9.
    static func sequenceLength(_ p: UnsafeRawBufferPointer, at i: Int) -> Int? {
        let n = p.count
        guard i >= 0, i < n else { return nil }
        let b0 = p[i]
        if b0 < 0x80 { return 1 }
        func cont(_ k: Int, _ lo: UInt8 = 0x80, _ hi: UInt8 = 0xBF) -> Bool {
            // Proof of no overflow: k <= 3 and i < n.
            i &+ k < n && p[i &+ k] >= lo && p[i &+ k] <= hi
        }
        switch b0 {
        case 0xC2...0xDF: return cont(1) ? 2 : nil
        case 0xE0: return cont(1, 0xA0) && cont(2) ? 3 : nil
        case 0xE1...0xEC, 0xEE...0xEF: return cont(1) && cont(2) ? 3 : nil
        case 0xED: return cont(1, 0x80, 0x9F) && cont(2) ? 3 : nil
        case 0xF0: return cont(1, 0x90) && cont(2) && cont(3) ? 4 : nil
        case 0xF1...0xF3: return cont(1) && cont(2) && cont(3) ? 4 : nil
        case 0xF4: return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : nil
        default: return nil
        }
    }

    /// The offset (within `p`) of the first ill-formed sequence, or nil when all is UTF-8.
    static func firstInvalid(_ p: UnsafeRawBufferPointer) -> Int? {
        var i = 0
        while i < p.count {
            guard let len = sequenceLength(p, at: i) else { return i }
            i += len
        }
        return nil
    }
}

// MARK: - Heads

/// One CBOR head (RFC 8949 §3): major type, additional information and argument.
public struct CBORHead: Hashable, Sendable {
    /// Major type, 0…7.
    public let major: UInt8
    /// Additional information, the low five bits of the initial byte.
    public let info: UInt8
    /// The argument; for major type 7 with info 25/26/27 it is the float's raw bits.
    public let argument: UInt64
    /// Byte offset of the initial byte in the input.
    public let offset: Int
    /// Bytes the head occupies: 1, 2, 3, 5 or 9.
    public let length: Int

    /// True for major type 7 with info 25, 26, 27: the argument is a float's bits.
    @inlinable public var isFloat: Bool { major == CBOR.majorSimple && info >= 25 && info <= 27 }
}

extension ByteReader {
    /// Reads one head, enforcing the parts of RFC 8949 §4.2.1 that a head alone shows:
    /// shortest argument, no indefinite length, no reserved additional information.
    /// On error the cursor stays at the head (a `truncated` names the head's offset).
    public mutating func readCBORHead() throws(WireError) -> CBORHead {
        let at = offset
        let initial = try peekU8()
        let major = initial >> 5, info = initial & 0x1F
        let extra: Int
        switch info {
        case 0..<24: extra = 0
        case 24: extra = 1
        case 25: extra = 2
        case 26: extra = 4
        case 27: extra = 8
        case 31:
            switch major {
            case CBOR.majorBytes...CBOR.majorMap: throw .malformed(at: at, .cborIndefiniteLength)
            case CBOR.majorSimple: throw .malformed(at: at, .cborUnexpectedBreak)
            default: throw .malformed(at: at, .cborReservedInfo)
            }
        default: throw .malformed(at: at, .cborReservedInfo)  // 28, 29, 30
        }
        try require(1 + extra)
        // Proof: require(1 + extra) just checked these bytes are there.
        _offset &+= 1
        var argument = UInt64(info)
        switch extra {
        case 1: argument = UInt64(try readU8())
        case 2: argument = UInt64(try readU16BE())
        case 4: argument = UInt64(try readU32BE())
        case 8: argument = try readU64BE()
        default: break
        }
        // Floats (major 7, info 25–27) carry bits, not a number: their shortest-form rule is
        // RFC 8949 §4.2.2, checked by the caller. Major 7 info 24 is a one-byte simple value,
        // which this project rejects whatever its value.
        if major != CBOR.majorSimple && extra > 0 && CBOR.headLength(argument: argument) != 1 + extra {
            _offset = at
            throw .malformed(at: at, .cborNonPreferredArgument)
        }
        return CBORHead(major: major, info: info, argument: argument, offset: at, length: 1 + extra)
    }
}

extension ByteWriter {
    /// Writes a head in preferred serialization; reserve `CBOR.headLength(argument:)` first.
    public mutating func writeCBORHead(major: UInt8, argument: UInt64) {
        precondition(major <= 7, "CBOR major type is three bits")
        let m = major << 5
        switch CBOR.headLength(argument: argument) {
        case 1: write(m | UInt8(truncatingIfNeeded: argument))
        case 2: write(m | 24); write(UInt8(truncatingIfNeeded: argument))
        case 3: write(m | 25); writeU16BE(UInt16(truncatingIfNeeded: argument))
        case 5: write(m | 26); writeU32BE(UInt32(truncatingIfNeeded: argument))
        default: write(m | 27); writeU64BE(argument)
        }
    }

    /// Writes a float in its shortest exact form, any NaN as 0xF9 0x7E 0x00 (RFC 8949 §4.2.2);
    /// reserve `CBOR.floatLength(_:)` first.
    public mutating func writeCBORFloat(_ d: Double) {
        if d.isNaN {
            write(0xF9); writeU16BE(CBOR.canonicalNaNHalfBits)
        } else if let h = CBOR.halfBits(exactly: d) {
            write(0xF9); writeU16BE(h)
        } else if Double(Float(d)) == d {
            write(0xFA); writeU32BE(Float(d).bitPattern)
        } else {
            write(0xFB); writeU64BE(d.bitPattern)
        }
    }
}

// MARK: - Borrowed values

/// A borrowed cursor over one data item of an input that a validator has already accepted
/// (`ActivityPayload.validate`). It holds offsets, never copies: `base` must stay alive and
/// unchanged while the value is used. Containers are walked lazily by `elements` / `entries`.
public struct CBORValue {
    /// The kinds userInfo allows (docs/payload.md §3).
    public enum Kind: Hashable, Sendable {
        case int, double, bool, null, text, data, array, map, set, date, url
    }

    public let kind: Kind
    /// The whole validated input.
    public let base: UnsafeRawBufferPointer
    /// Byte offset of the item's first head (the tag's head for date, URL and set).
    public let offset: Int
    /// Byte offset just past the item.
    public let end: Int
    /// Where the string bytes or the first element start.
    @usableFromInline let contentOffset: Int
    /// int / date-int: the head's argument; double / date-float: the Double's bits;
    /// text / data / url: byte length; array / set: element count; map: entry count; bool: 0/1.
    @usableFromInline let argument: UInt64
    /// int / date-int: major type 1 (value = -1 - argument).
    @usableFromInline let negative: Bool
    /// date: carried as a float (argument holds Double bits).
    @usableFromInline let floatForm: Bool

    init(kind: Kind, base: UnsafeRawBufferPointer, offset: Int, end: Int, contentOffset: Int,
         argument: UInt64, negative: Bool = false, floatForm: Bool = false) {
        self.kind = kind
        self.base = base
        self.offset = offset
        self.end = end
        self.contentOffset = contentOffset
        self.argument = argument
        self.negative = negative
        self.floatForm = floatForm
    }

    /// The item's deterministic encoding, borrowed: equal items have equal bytes.
    public var encoded: UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: base[offset ..< end]) }

    /// The integer, for `.int`. The validator proved it fits Int64.
    public var int: Int64? {
        guard kind == .int else { return nil }
        return Self.signed(argument, negative: negative)
    }

    public var double: Double? { kind == .double ? Double(bitPattern: argument) : nil }
    public var bool: Bool? { kind == .bool ? argument != 0 : nil }
    public var isNull: Bool { kind == .null }

    /// The UTF-8 bytes of a `.text` or a `.url`.
    public var utf8: UnsafeRawBufferPointer? {
        guard kind == .text || kind == .url else { return nil }
        return UnsafeRawBufferPointer(rebasing: base[contentOffset ..< end])
    }

    /// The bytes of a `.data`.
    public var data: UnsafeRawBufferPointer? {
        guard kind == .data else { return nil }
        return UnsafeRawBufferPointer(rebasing: base[contentOffset ..< end])
    }

    /// Elements of an array or set, entries of a map, bytes of text/data/url; 0 otherwise.
    public var count: Int {
        switch kind {
        // Proof: the validator capped these by the input size or the per-container cap.
        case .array, .set, .map, .text, .data, .url: Int(truncatingIfNeeded: argument)
        default: 0
        }
    }

    /// Seconds since 1970-01-01T00:00:00Z for a `.date` (RFC 8949 §3.4.2).
    public var dateSeconds: Double? {
        guard kind == .date else { return nil }
        return floatForm ? Double(bitPattern: argument) : Double(Self.signed(argument, negative: negative))
    }

    /// The whole seconds of a `.date` carried as an integer; nil for a fractional date.
    public var dateInteger: Int64? {
        guard kind == .date, !floatForm else { return nil }
        return Self.signed(argument, negative: negative)
    }

    /// The elements of an array or a set (in encoded order); empty for other kinds.
    public var elements: CBORElements {
        let n = kind == .array || kind == .set ? count : 0
        return CBORElements(base: base, offset: contentOffset, remaining: n)
    }

    /// The entries of a map (in key order); empty for other kinds.
    public var entries: CBOREntries {
        CBOREntries(base: base, offset: contentOffset, remaining: kind == .map ? count : 0)
    }

    /// True when this is a `.text` whose bytes equal `s`'s UTF-8 (no allocation).
    public func isText(_ s: some StringProtocol) -> Bool {
        guard kind == .text, let u = utf8 else { return false }
        return u.elementsEqual(s.utf8)
    }

    /// The value under text key `key` in a map; nil if absent or not a map.
    public subscript(key: some StringProtocol) -> CBORValue? {
        for entry in entries where entry.key.isText(key) { return entry.value }
        return nil
    }

    @inlinable
    static func signed(_ argument: UInt64, negative: Bool) -> Int64 {
        // Proof: validated arguments are <= Int64.max, and -1 - a == ~a in two's complement.
        let a = Int64(truncatingIfNeeded: argument)
        return negative ? ~a : a
    }

    /// Re-reads the item at `at` in bytes that a validator already accepted: kind, content
    /// and end, with one counter instead of recursion. Nil only if the bytes changed since
    /// (our caller's bug); every read is still bounds-checked, so it cannot trap.
    static func scan(_ base: UnsafeRawBufferPointer, at: Int) -> CBORValue? {
        guard at >= 0, at <= base.count else { return nil }
        var r = ByteReader(base, offset: at)
        guard var h = try? r.readCBORHead() else { return nil }
        var tag: UInt64? = nil
        if h.major == CBOR.majorTag {
            tag = h.argument
            guard let inner = try? r.readCBORHead() else { return nil }
            h = inner
        }
        let content = r.offset
        func make(_ kind: Kind, _ argument: UInt64, negative: Bool = false, floatForm: Bool = false,
                  end: Int) -> CBORValue {
            CBORValue(kind: kind, base: base, offset: at, end: end, contentOffset: content,
                      argument: argument, negative: negative, floatForm: floatForm)
        }
        switch h.major {
        case CBOR.majorUnsigned, CBOR.majorNegative:
            return make(tag == nil ? .int : .date, h.argument, negative: h.major == CBOR.majorNegative, end: content)
        case CBOR.majorBytes, CBOR.majorText:
            guard h.argument <= UInt64(r.remaining) else { return nil }
            let end = content + Int(h.argument)
            return make(h.major == CBOR.majorBytes ? .data : (tag == nil ? .text : .url), h.argument, end: end)
        case CBOR.majorArray, CBOR.majorMap:
            let (items, overflow) = h.major == CBOR.majorMap ? h.argument.multipliedReportingOverflow(by: 2) : (h.argument, false)
            guard !overflow, skip(&r, items: items) else { return nil }
            return make(h.major == CBOR.majorMap ? .map : (tag == nil ? .array : .set), h.argument, end: r.offset)
        case CBOR.majorSimple:
            switch h.info {
            case CBOR.simpleFalse, CBOR.simpleTrue: return make(.bool, h.info == CBOR.simpleTrue ? 1 : 0, end: content)
            case CBOR.simpleNull: return make(.null, 0, end: content)
            case 25, 26, 27:
                let d = floatValue(h)
                return make(tag == nil ? .double : .date, d.bitPattern, floatForm: true, end: content)
            default: return nil
            }
        default:
            return nil
        }
    }

    /// Moves `r` past `items` complete items. Each turn consumes at least one byte, so the
    /// loop ends within `r.remaining` turns whatever the bytes say.
    static func skip(_ r: inout ByteReader, items: UInt64) -> Bool {
        var pending = items
        while pending > 0 {
            guard let h = try? r.readCBORHead() else { return false }
            pending -= 1  // > 0 by the loop condition
            var more: UInt64 = 0
            switch h.major {
            case CBOR.majorBytes, CBOR.majorText:
                guard h.argument <= UInt64(r.remaining) else { return false }
                // Proof: argument <= remaining, checked on the line above.
                r._offset &+= Int(h.argument)
            case CBOR.majorArray: more = h.argument
            case CBOR.majorMap:
                let (m, o) = h.argument.multipliedReportingOverflow(by: 2)
                guard !o else { return false }
                more = m
            case CBOR.majorTag: more = 1
            default: break
            }
            let (p, o) = pending.addingReportingOverflow(more)
            guard !o else { return false }
            pending = p
        }
        return true
    }

    /// The value of a float head (major 7, info 25/26/27).
    static func floatValue(_ h: CBORHead) -> Double {
        switch h.info {
        case 25: CBOR.double(halfBits: UInt16(truncatingIfNeeded: h.argument))
        case 26: Double(Float(bitPattern: UInt32(truncatingIfNeeded: h.argument)))
        default: Double(bitPattern: h.argument)
        }
    }
}

/// The elements of a validated array or set, read lazily.
public struct CBORElements: Sequence, IteratorProtocol {
    let base: UnsafeRawBufferPointer
    var offset: Int
    var remaining: Int

    public mutating func next() -> CBORValue? {
        guard remaining > 0, let v = CBORValue.scan(base, at: offset) else { return nil }
        remaining -= 1
        offset = v.end
        return v
    }
}

/// The entries of a validated map, read lazily, in key order.
public struct CBOREntries: Sequence, IteratorProtocol {
    let base: UnsafeRawBufferPointer
    var offset: Int
    var remaining: Int

    public mutating func next() -> (key: CBORValue, value: CBORValue)? {
        guard remaining > 0, let k = CBORValue.scan(base, at: offset),
              let v = CBORValue.scan(base, at: k.end) else { return nil }
        remaining -= 1
        offset = v.end
        return (k, v)
    }
}
