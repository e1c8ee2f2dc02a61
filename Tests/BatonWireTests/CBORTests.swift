// Low-level deterministic CBOR (RFC 8949): heads, shortest floats, UTF-8, bytewise order.
// Vectors marked "App. A" are RFC 8949 Appendix A's examples, byte for byte.
import BatonTestSupport
import Testing
@testable import BatonWire



private func head(_ bytes: [UInt8]) throws(WireError) -> CBORHead {
    let r: Result<CBORHead, WireError> = bytes.withUnsafeBytes { raw in
        var reader = ByteReader(raw)
        do throws(WireError) {
            let h = try reader.readCBORHead()
            return .success(h)
        } catch {
            // A failed read leaves the cursor at the head (architecture.md §5.1).
            #expect(reader.offset == 0)
            return .failure(error)
        }
    }
    return try r.get()
}

private func written(_ capacity: Int = 16, _ body: (inout ByteWriter) -> Void) -> [UInt8] {
    var out = [UInt8](repeating: 0, count: capacity)
    let n = out.withUnsafeMutableBytes { raw in
        var w = ByteWriter(raw)
        // Proof: every caller writes at most `capacity` bytes.
        try! w.reserve(capacity)
        body(&w)
        return w.count
    }
    return Array(out[..<n])
}

@Suite("CBOR heads (RFC 8949 §3, §4.2.1)")
struct CBORHeadTests {
    // App. A: unsigned integers in preferred serialization.
    @Test(arguments: [
        (UInt64(0), "00"), (1, "01"), (10, "0a"), (23, "17"), (24, "1818"), (25, "1819"), (100, "1864"),
        (255, "18ff"), (256, "190100"), (1000, "1903e8"), (65535, "19ffff"), (65536, "1a00010000"),
        (1_000_000, "1a000f4240"), (4_294_967_295, "1affffffff"), (4_294_967_296, "1b0000000100000000"),
        (1_000_000_000_000, "1b000000e8d4a51000"), (18_446_744_073_709_551_615, "1bffffffffffffffff"),
    ])
    func unsignedHeadsRoundTrip(value: UInt64, hex: String) throws {
        let bytes = written { $0.writeCBORHead(major: 0, argument: value) }
        #expect(hexString(bytes) == hex)
        #expect(CBOR.headLength(argument: value) == bytes.count)
        let h = try head(bytes)
        #expect(h.major == 0 && h.argument == value && h.length == bytes.count && h.offset == 0)
    }

    // App. A: -1 is 0x20, -100 is 0x3863, -1000 is 0x3903e7.
    @Test func negativeHeads() throws {
        #expect(try head(hx("20")).argument == 0)
        #expect(try head(hx("3863")).argument == 99)
        #expect(try head(hx("3903e7")) == CBORHead(major: 1, info: 25, argument: 999, offset: 0, length: 3))
    }

    // §4.2.1: "0 to 23 and -1 to -24 MUST be expressed in the same byte as the major type;
    // 24 to 255 … MUST be expressed only with an additional uint8_t", and so on.
    @Test(arguments: ["1805", "1817", "1900ff", "1a0000ffff", "1b00000000ffffffff", "3817", "5800", "7900ff", "9800", "b80a", "d817"])
    func nonPreferredArgumentsAreRejected(hex: String) {
        #expect(throws: WireError.malformed(at: 0, .cborNonPreferredArgument)) { try head(hx(hex)) }
    }

    // §3.2: indefinite lengths (additional information 31) are not deterministic (§4.2.1).
    @Test(arguments: ["5f", "7f", "9f", "bf"])
    func indefiniteLengthsAreRejected(hex: String) {
        #expect(throws: WireError.malformed(at: 0, .cborIndefiniteLength)) { try head(hx(hex)) }
    }

    // §3: additional information 28–30 is reserved; 31 on majors 0, 1, 6 is not well-formed.
    @Test(arguments: ["1c", "1d", "1e", "3c", "5d", "fe", "1f", "3f", "df"])
    func reservedInformationIsRejected(hex: String) {
        #expect(throws: WireError.malformed(at: 0, .cborReservedInfo)) { try head(hx(hex)) }
    }

    @Test func breakOutsideIndefiniteIsRejected() {
        #expect(throws: WireError.malformed(at: 0, .cborUnexpectedBreak)) { try head(hx("ff")) }
    }

    @Test func truncatedHeadsNameTheMissingBytes() {
        #expect(throws: WireError.truncated(at: 0, need: 1)) { try head([]) }
        #expect(throws: WireError.truncated(at: 0, need: 1)) { try head(hx("18")) }
        #expect(throws: WireError.truncated(at: 0, need: 1)) { try head(hx("1901")) }
        #expect(throws: WireError.truncated(at: 0, need: 4)) { try head(hx("1a")) }
        #expect(throws: WireError.truncated(at: 0, need: 1)) { try head(hx("1b00000000000000")) }
    }
}

@Suite("CBOR floats (RFC 8949 §4.2.2)")
struct CBORFloatTests {
    // App. A, floats: each in the shortest form that preserves its value.
    @Test(arguments: [
        (0.0, "f90000"), (-0.0, "f98000"), (1.0, "f93c00"), (1.5, "f93e00"), (65504.0, "f97bff"),
        (100000.0, "fa47c35000"), (3.4028234663852886e+38, "fa7f7fffff"), (1.0e+300, "fb7e37e43c8800759c"),
        (5.960464477539063e-8, "f90001"), (0.00006103515625, "f90400"), (-4.0, "f9c400"),
        (-4.1, "fbc010666666666666"), (1.1, "fb3ff199999999999a"), (Double.infinity, "f97c00"),
        (-Double.infinity, "f9fc00"), (0.1, "fb3fb999999999999a"),
    ])
    func shortestFloat(value: Double, hex: String) throws {
        let bytes = written { $0.writeCBORFloat(value) }
        #expect(hexString(bytes) == hex)
        #expect(CBOR.floatLength(value) == bytes.count)
        let h = try head(bytes)
        #expect(h.isFloat)
        let back = CBORValue.floatValue(h)
        #expect(back == value && back.sign == value.sign)
    }

    // §4.2.2: NaN is written as the half-precision quiet NaN with no payload.
    @Test func everyNaNIsWrittenAsF97E00() {
        for nan in [Double.nan, -Double.nan, Double.signalingNaN, Double(bitPattern: 0x7FF8_0000_0000_1234)] {
            #expect(hexString(written { $0.writeCBORFloat(nan) }) == "f97e00")
        }
    }

    // Every binary16 value converts to Double and back to the same bits.
    @Test func allHalfValuesRoundTrip() {
        for bits in 0 ... UInt16.max {
            let d = CBOR.double(halfBits: bits)
            if d.isNaN { continue }
            #expect(CBOR.halfBits(exactly: d) == bits, "half 0x\(String(bits, radix: 16))")
        }
    }

    // Whole-second dates must be integers (docs/payload.md §3.6); this is the test for "whole".
    @Test(arguments: [
        (1.0, true), (-0.0, true), (0x1p52, true), (0x1p60, true), (-0x1p63, true), (1e300, true),
        (0.5, false), (-1.5, false), (0x1p52 - 0.5, false), (Double.leastNonzeroMagnitude, false),
        (Double.nan, false), (Double.infinity, false), (-Double.infinity, false),
    ])
    func integralDoubles(value: Double, integral: Bool) {
        #expect(CBOR.isIntegral(value) == integral)
    }

    @Test func valuesBetweenHalvesAreNotHalves() {
        // 1 + 2^-11 needs 11 mantissa bits; 2^-25 is below the smallest subnormal; 65520 overflows.
        #expect(CBOR.halfBits(exactly: 1 + 0x1p-11) == nil)
        #expect(CBOR.halfBits(exactly: 0x1p-25) == nil)
        #expect(CBOR.halfBits(exactly: 65520) == nil)
        #expect(CBOR.halfBits(exactly: 0x1p-24) == 0x0001)
        #expect(CBOR.halfBits(exactly: 3 * 0x1p-24) == 0x0003)
    }
}

@Suite("UTF-8 well-formedness (RFC 3629 §4)")
struct UTF8CheckTests {
    @Test(arguments: [
        ("", nil), ("41", nil), ("c3bc", nil), ("e4b896", nil), ("f09f8e89", nil), ("efbfbd", nil), ("f48fbfbf", nil),
        ("80", 0), ("41c0", 1), ("c080", 0), ("c1bf", 0), ("e08080", 0), ("eda080", 0), ("edbfbf", 0),
        ("f08f8080", 0), ("f4908080", 0), ("f5808080", 0), ("ff", 0), ("41e282", 1), ("c3", 0), ("4142c3bc80", 4),
    ] as [(String, Int?)])
    func firstInvalid(hex: String, expected: Int?) {
        let bytes = hx(hex)
        bytes.withUnsafeBytes { #expect(UTF8Check.firstInvalid($0) == expected) }
    }

    // Agrees with the standard library's validating decoder on every 1- and 2-byte input
    // and on a sweep of 3- and 4-byte lead/continuation combinations.
    @Test func agreesWithStandardLibrary() {
        var inputs: [[UInt8]] = []
        for a in 0 ... 255 { inputs.append([UInt8(a)]) }
        for a in 0xC0 ... 0xFF { for b in 0 ... 255 { inputs.append([UInt8(a), UInt8(b)]) } }
        for a in [0xE0, 0xE1, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF4, 0xF5] as [UInt8] {
            for b in stride(from: 0x70, through: 0xC0, by: 0x08) {
                inputs.append([a, UInt8(b), 0x80])
                inputs.append([a, UInt8(b), 0x80, 0x80])
            }
        }
        for input in inputs {
            let ours = input.withUnsafeBytes { UTF8Check.firstInvalid($0) == nil }
            let theirs = String(validating: input, as: UTF8.self) != nil
            #expect(ours == theirs, "\(hexString(input))")
        }
    }
}

@Suite("Bytewise order (RFC 8949 §4.2.1)")
struct CBOROrderTests {
    // §4.2.1's example order: 10, 100, -1, "z", "aa", [100], [-1], false.
    @Test func rfcExampleKeysSortBytewise() {
        let keys = ["0a", "1864", "20", "617a", "626161", "811864", "8120", "f4"].map(hx)
        for i in 1 ..< keys.count {
            keys[i - 1].withUnsafeBytes { a in keys[i].withUnsafeBytes { b in
                #expect(CBOR.compare(a, b) < 0)
                #expect(CBOR.compare(b, a) > 0)
            } }
        }
        keys[3].withUnsafeBytes { a in #expect(CBOR.compare(a, a) == 0) }
    }

    // Text keys: the builder's (length, bytes) order is the bytewise order of encodings.
    @Test func textKeyOrderMatchesEncodedOrder() {
        let keys = ["", "a", "b", "z", "aa", "ab", "zz", String(repeating: "a", count: 23), String(repeating: "a", count: 24),
                    String(repeating: "b", count: 255), String(repeating: "a", count: 256), "é", "\u{1F389}"]
        for x in keys {
            for y in keys where x != y {
                var bx = CBORBuilder(), by = CBORBuilder()
                bx.text(x); by.text(y)
                let bytewise = bx.bytes.lexicographicallyPrecedes(by.bytes)
                #expect(CBORBuilder.keyOrder(x, y) == bytewise, "\(x.utf8.count) vs \(y.utf8.count)")
            }
        }
    }
}
