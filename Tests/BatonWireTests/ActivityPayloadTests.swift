// The activity payload: docs/payload.md. Vectors are the payload bytes in hex; "§" numbers
// are docs/payload.md's sections, "RFC 8949 §" the CBOR spec's.
import Foundation
import BatonTestSupport
import Testing
@testable import BatonWire



/// The CBOR text string for `s`.
private func text(_ s: String) -> [UInt8] {
    var b = CBORBuilder()
    b.text(s)
    return b.bytes
}

/// Validates and copies out (allocating, for assertions).
private func decode(_ bytes: [UInt8], limits: PayloadLimits = .default) throws(WireError) -> ActivityPayloadContent {
    let r: Result<ActivityPayloadContent, WireError> = bytes.withUnsafeBytes { raw in
        do throws(WireError) {
            return .success(ActivityPayloadContent(try ActivityPayload.validate(raw, limits: limits)))
        } catch { return .failure(error) }
    }
    return try r.get()
}

private func error(_ bytes: [UInt8], limits: PayloadLimits = .default) -> WireError? {
    do { _ = try decode(bytes, limits: limits); return nil } catch { return error }
}

private func reason(_ e: WireError?) -> Malformed? {
    if case .malformed(_, let m)? = e { return m }
    return nil
}

private func withView<R>(_ bytes: [UInt8], _ body: (ActivityPayloadView) throws -> R) throws -> R {
    try bytes.withUnsafeBytes { raw in try body(try ActivityPayload.validate(raw)) }
}

private func string(_ p: UnsafeRawBufferPointer?) -> String? { p.map { String(decoding: $0, as: UTF8.self) } }

private func renderJSON(_ bytes: [UInt8], capacity: Int = 8192) throws -> String {
    var out = [UInt8](repeating: 0, count: capacity)
    let n = try bytes.withUnsafeBytes { raw in
        let view = try ActivityPayload.validate(raw)
        return try out.withUnsafeMutableBytes { buf in
            var w = JSONWriter(buf)
            try view.renderJSON(into: &w)
            #expect(w.isComplete)
            return w.count
        }
    }
    return String(decoding: out[..<n], as: UTF8.self)
}

// MARK: - The independent implementation (Python's cbor2)

/// Runs Tests/BatonWireTests/Interop/cbor_interop.py with Debian's /usr/bin/python3, which has
/// python3-cbor2 from scripts/setup. A missing interpreter or module fails the test (an
/// interop test that cannot run has proved nothing).
enum CBORInterop {
    static let python = "/usr/bin/python3"
    static let setupHint = "run scripts/setup (it installs python3 and python3-cbor2 for the CBOR interop tests)"
    static var script: String {
        let here = #filePath
        let dir = here[..<(here.lastIndex(of: "/") ?? here.startIndex)]
        return dir + "/Interop/cbor_interop.py"
    }

    /// stdout (trimmed) when the script exits 0; records an issue and returns nil otherwise.
    static func run(_ args: [String], input: String? = nil, sourceLocation: SourceLocation = #_sourceLocation) -> String? {
        guard FileManager.default.isExecutableFile(atPath: python) else {
            Issue.record("\(python) not found: \(setupHint)", sourceLocation: sourceLocation)
            return nil
        }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: python)
        p.arguments = [script] + args
        let out = Pipe(), err = Pipe(), inp = Pipe()
        p.standardOutput = out
        p.standardError = err
        p.standardInput = inp
        do { try p.run() } catch {
            Issue.record("cannot run \(python): \(error); \(setupHint)", sourceLocation: sourceLocation)
            return nil
        }
        if let input { inp.fileHandleForWriting.write(Data(input.utf8)) }
        try? inp.fileHandleForWriting.close()
        let o = out.fileHandleForReading.readDataToEndOfFile()
        let e = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        let stdout = String(decoding: o, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        let stderr = String(decoding: e, as: UTF8.self)
        switch p.terminationStatus {
        case 0: return stdout
        case 3: Issue.record("\(stderr) — \(setupHint)", sourceLocation: sourceLocation)
        default: Issue.record("cbor_interop.py \(args.prefix(2).joined(separator: " ")) failed: \(stderr)", sourceLocation: sourceLocation)
        }
        return nil
    }
}

// MARK: - Fixtures (the same values as CASES in cbor_interop.py)

enum PayloadFixtures {
    /// §5: the reference vector, 116 bytes.
    static let vectorHex = """
        a6 00 01 01 78 1a 636f6d2e6578616d706c652e7265616465722e61727469636c65
        02 69 436861707465722033
        03 d8 20 78 1b 68747470733a2f2f6578616d706c652e636f6d2f626f6f6b732f33
        04 81 68 706f736974696f6e
        05 a3 65 6e69676874 f5 65 7363616c65 f9 3e00 68 706f736974696f6e 19 04d2
        """

    static let vector = ActivityPayloadContent(
        activityType: "com.example.reader.article", title: "Chapter 3",
        webpageURL: "https://example.com/books/3", requiredUserInfoKeys: ["position"],
        userInfo: ["position": .int(1234), "night": .bool(true), "scale": .double(1.5)])

    static let minimal = ActivityPayloadContent(activityType: "com.example.a")

    static let kinds = ActivityPayloadContent(activityType: "org.example.kinds", userInfo: [
        "array": .array([.int(1), .string("two"), .double(3.5), .array([.null])]),
        "data": .data([0x00, 0x01, 0xFE, 0xFF]),
        "empty-data": .data([]),
        "date": .date(1_700_000_000),
        "date-frac": .date(1_700_000_000.5),
        "date-old": .date(-14_182_940),
        "dict": .dictionary(["inner": .dictionary(["deep": .null, "n": .int(0)])]),
        "null": .null,
        "int": .int(1_234_567_890_123),
        "neg": .int(-42),
        "min": .int(.min),
        "max": .int(.max),
        "half": .double(1.5),
        "single": .double(100_000),
        "double": .double(0.1),
        "negzero": .double(-0.0),
        "inf": .double(.infinity),
        "nan": .double(.nan),
        "true": .bool(true),
        "false": .bool(false),
        "set": .set([.string("bb"), .string("a"), .string("c")]),
        "intset": .set([.int(1000), .int(1), .int(100), .int(2)]),
        "string": .string("Grüße, 世界 🎉 \"q\" \\ \n\t\u{01}"),
        "url": .url("file:///tmp/x?y=1#z"),
    ])

    static let mixedSet = ActivityPayloadContent(activityType: "com.example.sets",
                                                 userInfo: ["s": .set([.int(1000), .int(-1), .string("a")])])

    static let cases: [(String, ActivityPayloadContent)] = [
        ("vector", vector), ("minimal", minimal), ("kinds", kinds), ("mixed-set", mixedSet),
    ]

    /// a3 {0: 1, 1: "com.example.a", 5: <userInfo>}: userInfo's first byte is at offset 19.
    static func withUserInfo(_ hex: String) -> [UInt8] {
        hx("a3 00 01 01") + text("com.example.a") + hx("05") + hx(hex)
    }
}

private func encoded(_ p: ActivityPayloadContent, limits: PayloadLimits = .default) throws(WireError) -> [UInt8] {
    try p.encoded(limits: limits)
}

// MARK: - Tests

@Suite("Activity payload: reference vector (§5)")
struct ActivityPayloadVectorTests {
    @Test func vectorDecodesToItsFields() throws {
        let bytes = hx(PayloadFixtures.vectorHex)
        #expect(bytes.count == 116)
        try withView(bytes) { v in
            #expect(v.version == 1)
            #expect(string(v.activityType) == "com.example.reader.article")
            #expect(string(v.title) == "Chapter 3")
            #expect(string(v.webpageURL) == "https://example.com/books/3")
            #expect(Array(v.requiredUserInfoKeys).map { string($0.utf8) } == ["position"])
            // userInfo in canonical order: shorter keys first, then bytewise.
            #expect(Array(v.userInfo).map { string($0.key.utf8) } == ["night", "scale", "position"])
            #expect(v.userInfo("position")?.int == 1234)
            #expect(v.userInfo("position")?.kind == .int)
            #expect(v.userInfo("night")?.bool == true)
            #expect(v.userInfo("scale")?.double == 1.5)
            #expect(v.userInfo("absent") == nil)
            #expect(!v.exceedsRecommendedSize)
        }
        #expect(try decode(bytes) == PayloadFixtures.vector)
    }

    @Test func swiftEncodesTheVectorByteForByte() throws {
        #expect(hexString(try encoded(PayloadFixtures.vector)) == hexString(hx(PayloadFixtures.vectorHex)))
    }

    @Test func encodeIntoCallerBufferReservesOnce() throws {
        let expected = hx(PayloadFixtures.vectorHex)
        var buf = [UInt8](repeating: 0xAA, count: 200)
        let n = try buf.withUnsafeMutableBytes { raw in
            var w = ByteWriter(raw)
            try PayloadFixtures.vector.encode(into: &w)
            return w.count
        }
        #expect(Array(buf[..<n]) == expected)
        #expect(buf[n] == 0xAA)
        // One byte short: nothing written, `.noRoom` names both sizes.
        var small = [UInt8](repeating: 0, count: expected.count - 1)
        #expect(throws: WireError.noRoom(need: expected.count, have: expected.count - 1)) {
            try small.withUnsafeMutableBytes { raw in
                var w = ByteWriter(raw)
                try PayloadFixtures.vector.encode(into: &w)
            }
        }
    }

    @Test func emptyInputIsTruncated() {
        #expect(error([]) == .truncated(at: 0, need: 1))
    }

    // Every proper prefix of a valid payload is `.truncated`, at or before the cut.
    @Test(arguments: ["vector", "kinds"])
    func truncatedAtEveryByte(name: String) throws {
        let bytes = try encoded(PayloadFixtures.cases.first { $0.0 == name }!.1)
        for cut in 0 ..< bytes.count {
            let e = error(Array(bytes[..<cut]))
            guard case .truncated(let at, let need)? = e else {
                Issue.record("cut at \(cut): \(String(describing: e))")
                continue
            }
            // `need` counts the bytes missing past the end of the input.
            #expect(at <= cut && need >= 1, "cut at \(cut)")
        }
        #expect(error(bytes) == nil)
    }

    @Test func trailingBytesAreRejected() {
        let bytes = hx(PayloadFixtures.vectorHex)
        #expect(error(bytes + [0x00]) == .trailing(at: 116, count: 1))
        #expect(error(bytes + bytes) == .trailing(at: 116, count: 116))
    }
}

@Suite("Activity payload: limits")
struct ActivityPayloadLimitTests {
    /// userInfo {"d": k nested arrays around null}; the deepest array has depth 2 + k.
    private func nested(_ k: Int) -> [UInt8] {
        PayloadFixtures.withUserInfo("a1 6164" + String(repeating: "81", count: k) + "f6")
    }

    @Test func depthCapAndCapPlusOne() {
        let cap = PayloadLimits.defaultMaxDepth  // 16
        #expect(error(nested(cap - 2)) == nil)
        // The first array past the cap is the (cap-1)th, at 19 + 3 + (cap - 2).
        #expect(error(nested(cap - 1)) == .malformed(at: 22 + cap - 2, .cborTooDeep))
        // A configured cap applies the same way.
        let four = PayloadLimits(maxDepth: 4)
        #expect(error(nested(2), limits: four) == nil)
        #expect(error(nested(3), limits: four) == .malformed(at: 24, .cborTooDeep))
    }

    @Test func depthCountsMapsAndSets() {
        let three = PayloadLimits(maxDepth: 3)
        #expect(error(PayloadFixtures.withUserInfo("a1 6164 a0"), limits: three) == nil)
        #expect(error(PayloadFixtures.withUserInfo("a1 6164 a1 6161 a0"), limits: three) == .malformed(at: 25, .cborTooDeep))
        #expect(error(PayloadFixtures.withUserInfo("a1 6164 d90102 80"), limits: three) == nil)
        #expect(error(PayloadFixtures.withUserInfo("a1 6164 d90102 81 80"), limits: three) == .malformed(at: 26, .cborTooDeep))
    }

    @Test func encoderRefusesTooDeepValues() {
        var v = UserInfoValue.null
        for _ in 0 ..< 15 { v = .array([v]) }
        let p = ActivityPayloadContent(activityType: "a.b", userInfo: ["d": v])
        #expect(reason(encodeError(p)) == .cborTooDeep)
        var ok = UserInfoValue.null
        for _ in 0 ..< 14 { ok = .array([ok]) }
        #expect(encodeError(ActivityPayloadContent(activityType: "a.b", userInfo: ["d": ok])) == nil)
    }

    /// A payload of exactly `size` bytes (a data value pads it).
    private func payload(size: Int) throws -> [UInt8] {
        let probe = try encoded(ActivityPayloadContent(activityType: "com.example.big", userInfo: ["blob": .data(Array(repeating: 7, count: 1000))]),
                                limits: PayloadLimits(maxBytes: 1 << 20))
        let blob = 1000 + size - probe.count  // the data head stays 3 bytes for 256…65535
        let bytes = try encoded(ActivityPayloadContent(activityType: "com.example.big", userInfo: ["blob": .data(Array(repeating: 7, count: blob))]),
                                limits: PayloadLimits(maxBytes: 1 << 20))
        #expect(bytes.count == size)
        return bytes
    }

    @Test func recommendedSizeCapAndCapPlusOne() throws {
        #expect(PayloadLimits.recommendedMaxBytes == 3072)
        let atCap = try payload(size: 3072)
        #expect(error(atCap) == nil)
        try withView(atCap) { #expect(!$0.exceedsRecommendedSize) }
        #expect(error(try payload(size: 3073)) == .malformed(at: 3072, .payloadTooLarge))
    }

    @Test func configuredHardCap() throws {
        let limits = PayloadLimits(maxBytes: 4096)
        let big = try payload(size: 4096)
        #expect(error(big, limits: limits) == nil)
        big.withUnsafeBytes { raw in
            #expect((try? ActivityPayload.validate(raw, limits: limits))?.exceedsRecommendedSize == true)
        }
        #expect(error(try payload(size: 4097), limits: limits) == .malformed(at: 4096, .payloadTooLarge))
        // The encoder applies the same cap.
        #expect(reason(encodeError(ActivityPayloadContent(activityType: "a.b", userInfo: ["x": .data(Array(repeating: 0, count: 5000))]),
                                   limits: limits)) == .payloadTooLarge)
    }

    @Test func itemCapAndCapPlusOne() {
        let limits = PayloadLimits(maxItemsPerContainer: 8)
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 88" + String(repeating: "01", count: 8)), limits: limits) == nil)
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 89" + String(repeating: "01", count: 9)), limits: limits)
                == .malformed(at: 22, .cborTooManyItems))
        // A count far beyond the input is refused by the cap before any element is read.
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 9b ffffffffffffffff"))
                == .malformed(at: 22, .cborTooManyItems))
        // Within the cap but beyond the input: truncated.
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 83 01")) == .truncated(at: 24, need: 1))
    }

    @Test func hugeStringLengthIsTruncatedNotATrap() {
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 5b ffffffffffffffff 00"))
                == .truncated(at: 31, need: Int.max))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 7a 00010000 61"))
                == .truncated(at: 27, need: 65535))
    }
}

private func encodeError(_ p: ActivityPayloadContent, limits: PayloadLimits = .default) -> WireError? {
    do { _ = try p.encoded(limits: limits); return nil } catch { return error }
}

@Suite("Activity payload: deterministic encoding enforced on decode (RFC 8949 §4.2)")
struct ActivityPayloadCanonicalTests {
    @Test func nonPreferredIntegers() {
        // Version 1 written as 0x18 0x01 (§4.2.1: 0–23 fit the initial byte).
        #expect(error(hx("a2 00 1801 01") + text("com.example.a")) == .malformed(at: 2, .cborNonPreferredArgument))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 1805")) == .malformed(at: 22, .cborNonPreferredArgument))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 390000")) == .malformed(at: 22, .cborNonPreferredArgument))
        // A string length in a longer form than needed.
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 7801 61")) == .malformed(at: 22, .cborNonPreferredArgument))
        #expect(error(PayloadFixtures.withUserInfo("b801 6161 01")) == .malformed(at: 19, .cborNonPreferredArgument))
    }

    @Test func unsortedAndDuplicateKeys() {
        #expect(error(PayloadFixtures.withUserInfo("a2 617a 01 6161 02")) == .malformed(at: 23, .cborUnsortedKeys))
        // "aa" after "b": longer keys sort after shorter ones (the head holds the length).
        #expect(error(PayloadFixtures.withUserInfo("a2 626161 01 6162 02")) == .malformed(at: 24, .cborUnsortedKeys))
        #expect(error(PayloadFixtures.withUserInfo("a2 6161 01 6161 02")) == .malformed(at: 23, .cborDuplicateKey))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 a2 6162 01 6161 02")) == .malformed(at: 26, .cborUnsortedKeys))
        // Top level: {1: …, 0: 1} and {0: 1, 0: 1, …}.
        #expect(error(hx("a2 01") + text("com.example.a") + hx("00 01")) == .malformed(at: 16, .cborUnsortedKeys))
        #expect(error(hx("a3 00 01 00 01 01") + text("com.example.a")) == .malformed(at: 3, .cborDuplicateKey))
    }

    @Test func indefiniteLengths() {
        #expect(error(PayloadFixtures.withUserInfo("bf 6161 01 ff")) == .malformed(at: 19, .cborIndefiniteLength))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 7f 6161 ff")) == .malformed(at: 22, .cborIndefiniteLength))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 5f 4101 ff")) == .malformed(at: 22, .cborIndefiniteLength))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 9f 01 ff")) == .malformed(at: 22, .cborIndefiniteLength))
        #expect(error(hx("bf 00 01 ff")) == .malformed(at: 0, .cborIndefiniteLength))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 ff")) == .malformed(at: 22, .cborUnexpectedBreak))
    }

    @Test func badUTF8() {
        // c3 28: a lead byte without its continuation.
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 62 c328")) == .malformed(at: 23, .cborBadUTF8))
        #expect(error(PayloadFixtures.withUserInfo("a1 61ff 01")) == .malformed(at: 21, .cborBadUTF8))
        // A surrogate (U+D800) and an overlong '/' (c0 af).
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 64 41eda080")) == .malformed(at: 24, .cborBadUTF8))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 62 c0af")) == .malformed(at: 23, .cborBadUTF8))
        #expect(error(hx("a3 00 01 01") + text("com.example.a") + hx("02 63 41 42 80")) == .malformed(at: 22, .cborBadUTF8))
        // Required keys are checked too.
        #expect(error(hx("a4 00 01 01") + text("com.example.a") + hx("04 81 61 80 05 a1 6161 01")) == .malformed(at: 21, .cborBadUTF8))
    }

    @Test func floats() {
        // 1.5 as single and as double: half holds it (RFC 8949 §4.2.2).
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 fa3fc00000")) == .malformed(at: 22, .cborNonPreferredFloat))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 fb3ff8000000000000")) == .malformed(at: 22, .cborNonPreferredFloat))
        // 100000.0 as double: single holds it.
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 fb40f86a0000000000")) == .malformed(at: 22, .cborNonPreferredFloat))
        // Infinity as single.
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 fa7f800000")) == .malformed(at: 22, .cborNonPreferredFloat))
        // NaNs other than f97e00.
        for nan in ["f97e01", "f9fe00", "f97c01", "fa7fc00000", "fb7ff8000000000000"] {
            #expect(error(PayloadFixtures.withUserInfo("a1 6161 " + nan)) == .malformed(at: 22, .cborNonCanonicalNaN), "\(nan)")
        }
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 f97e00")) == nil)
        // 0.1 needs a double; a double is then the shortest form.
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 fb3fb999999999999a")) == nil)
    }

    @Test func integerRange() throws {
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 1b8000000000000000")) == .malformed(at: 22, .cborIntegerRange))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 3b8000000000000000")) == .malformed(at: 22, .cborIntegerRange))
        let bytes = PayloadFixtures.withUserInfo("a2 6161 1b7fffffffffffffff 6162 3b7fffffffffffffff")
        try withView(bytes) { v in
            #expect(v.userInfo("a")?.int == .max)
            #expect(v.userInfo("b")?.int == .min)
        }
    }

    @Test func disallowedTagsAndSimpleValues() {
        for (hex, at) in [("c0 60", 22), ("c2 4101", 22), ("d9d9f7 01", 22), ("d818 4101", 22), ("c4 82 20 01", 22)] {
            #expect(error(PayloadFixtures.withUserInfo("a1 6161 " + hex)) == .malformed(at: at, .cborDisallowedTag), "\(hex)")
        }
        // An unknown tag is named even with nothing after it.
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 c0")) == .malformed(at: 22, .cborDisallowedTag))
        for hex in ["f7", "e0", "f3", "f820", "f8ff"] {
            #expect(error(PayloadFixtures.withUserInfo("a1 6161 " + hex)) == .malformed(at: 22, .cborDisallowedSimple), "\(hex)")
        }
    }

    @Test func allowedTagsOverTheWrongContent() {
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 c1 60")) == .malformed(at: 23, .cborBadDate))
        // Tags cannot nest: tag 1 over tag 1.
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 c1 c1 00")) == .malformed(at: 23, .cborBadDate))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 d820 4161")) == .malformed(at: 24, .cborBadURL))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 d90102 a0")) == .malformed(at: 25, .cborBadSet))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 d90102 d90102 80")) == .malformed(at: 25, .cborBadSet))
        // A run of tags, each over the next, stops at the second: no recursion to exhaust.
        let deep = PayloadFixtures.withUserInfo("a1 6161 " + String(repeating: "d820", count: 1000) + "60")
        #expect(error(deep) == .malformed(at: 24, .cborBadURL))
    }

    @Test func dates() throws {
        // §3.6: 0001-01-01T00:00:00Z … 9999-12-31T23:59:59Z.
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 c1 3b0000000e7791f6ff")) == nil)
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 c1 3b0000000e7791f700")) == .malformed(at: 23, .cborBadDate))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 c1 1b0000003afff4417f")) == nil)
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 c1 1b0000003afff44180")) == .malformed(at: 23, .cborBadDate))
        // Whole seconds must be an integer; NaN and infinity are no dates.
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 c1 fa4ecaa7e2")) == .malformed(at: 23, .cborBadDate))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 c1 f93c00")) == .malformed(at: 23, .cborBadDate))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 c1 f97e00")) == .malformed(at: 23, .cborBadDate))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 c1 f97c00")) == .malformed(at: 23, .cborBadDate))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 c1 f93e00")) == nil)  // 1.5 s
        try withView(PayloadFixtures.withUserInfo("a2 6161 c1 1a6553f100 6162 c1 fb41d954fc40200000")) { v in
            #expect(v.userInfo("a")?.dateInteger == 1_700_000_000)
            #expect(v.userInfo("a")?.dateSeconds == 1_700_000_000)
            #expect(v.userInfo("b")?.dateInteger == nil)
            #expect(v.userInfo("b")?.dateSeconds == 1_700_000_000.5)
        }
        // The encoder writes whole seconds as integers.
        let e = try encoded(ActivityPayloadContent(activityType: "a.b", userInfo: ["d": .date(-0.0)]))
        #expect(hexString(Array(e.suffix(2))) == "c100")
    }

    @Test func sets() throws {
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 d90102 82 02 01")) == .malformed(at: 27, .cborUnsortedSet))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 d90102 82 01 01")) == .malformed(at: 27, .cborDuplicateSetElement))
        // RFC 8949 order across kinds: 1000 (19…) before -1 (20) before "a" (61…).
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 d90102 83 1903e8 20 6161")) == nil)
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 d90102 83 20 6161 1903e8")) == .malformed(at: 29, .cborUnsortedSet))
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 d90102 80")) == nil)
        // Elements compare by their whole encodings, containers too.
        #expect(error(PayloadFixtures.withUserInfo("a1 6161 d90102 82 820102 820101")) == .malformed(at: 29, .cborUnsortedSet))
    }
}

@Suite("Activity payload: fields (§2)")
struct ActivityPayloadFieldTests {
    private func withType(_ t: String) -> [UInt8] { hx("a2 00 01 01") + text(t) }

    @Test(arguments: ["a.b", "com.example.reader", "com.example-app.read_1", "A.B.C.D.E", "0.9"])
    func goodActivityTypes(t: String) throws {
        #expect(try decode(withType(t)).activityType == t)
    }

    @Test(arguments: ["", "com", "com.", ".com", "com..example", "com.ex ample", "com.exämple", "com/example", "com.example\n"])
    func badActivityTypes(t: String) {
        #expect(reason(error(withType(t))) == .payloadActivityType, "\(t)")
        #expect(reason(encodeError(ActivityPayloadContent(activityType: t))) == .payloadActivityType)
    }

    private func withURL(_ u: String) -> [UInt8] {
        hx("a3 00 01 01") + text("com.example.a") + hx("03 d820") + text(u)
    }

    @Test(arguments: ["http://example.com", "https://example.com/a?b=c#d", "HTTPS://EXAMPLE.COM", "hTtP://x"])
    func goodWebpageURLs(u: String) throws {
        #expect(try decode(withURL(u)).webpageURL == u)
    }

    // The seeds: any scheme other than http or https is an error.
    @Test(arguments: ["ftp://example.com/f", "javascript:alert(1)", "file:///etc/passwd", "data:text/html,x", "mailto:a@b.c",
                      "httpx://example.com", "http+s://example.com", "ws://example.com"])
    func badWebpageURLSchemes(u: String) {
        // 18: key 3; 19: the tag; 21: the text head; then the text.
        let urlAt = 21 + (u.utf8.count < 24 ? 1 : 2)
        #expect(error(withURL(u)) == .malformed(at: urlAt, .payloadURLScheme), "\(u)")
        #expect(reason(encodeError(ActivityPayloadContent(activityType: "a.b", webpageURL: u))) == .payloadURLScheme)
    }

    @Test func malformedWebpageURLs() {
        #expect(reason(error(withURL(""))) == .cborBadURL)
        #expect(reason(error(withURL("//example.com"))) == .cborBadURL)
        #expect(reason(error(withURL("https://exa mple.com"))) == .cborBadURL)
        #expect(reason(error(withURL("https://example.com/\u{7F}"))) == .cborBadURL)
        #expect(reason(error(withURL("http:/example.com"))) == .payloadURLNoHost)
        #expect(reason(error(withURL("https:///path"))) == .payloadURLNoHost)
        #expect(reason(error(withURL("https://"))) == .payloadURLNoHost)
        // Not tagged 32: the wrong type for field 3.
        #expect(error(hx("a3 00 01 01") + text("com.example.a") + hx("03") + text("https://a.b")) == .malformed(at: 19, .payloadFieldType))
    }

    @Test func userInfoURLsTakeAnyScheme() throws {
        for u in ["file:///tmp/x", "myapp:open?id=1", "urn:isbn:0451450523"] {
            let p = ActivityPayloadContent(activityType: "a.b", userInfo: ["u": .url(u)])
            #expect(try decode(try encoded(p)) == p)
        }
        #expect(reason(encodeError(ActivityPayloadContent(activityType: "a.b", userInfo: ["u": .url("no-scheme")]))) == .cborBadURL)
        #expect(reason(encodeError(ActivityPayloadContent(activityType: "a.b", userInfo: ["u": .url("1a:x")]))) == .cborBadURL)
    }

    @Test func topLevelShape() {
        #expect(error(hx("80")) == .malformed(at: 0, .payloadNotMap))
        #expect(error(hx("01")) == .malformed(at: 0, .payloadNotMap))
        #expect(error(hx("a0")) == .malformed(at: 0, .payloadMissingField))
        #expect(error(hx("a1 00 01")) == .malformed(at: 0, .payloadMissingField))
        #expect(error(hx("a1 01") + text("a.b")) == .malformed(at: 0, .payloadMissingField))
        #expect(error(hx("a1 20 01")) == .malformed(at: 1, .payloadKeyType))
        #expect(error(hx("a1 6130 01")) == .malformed(at: 1, .payloadKeyType))
        #expect(error(hx("a2 00 6131 01") + text("a.b")) == .malformed(at: 2, .payloadFieldType))
        #expect(error(hx("a2 00 01 01 4161")) == .malformed(at: 4, .payloadFieldType))
        #expect(error(hx("a3 00 01 01") + text("a.b") + hx("02 01")) == .malformed(at: 9, .payloadFieldType))
        #expect(error(hx("a3 00 01 01") + text("a.b") + hx("05 80")) == .malformed(at: 9, .payloadFieldType))
    }

    @Test func versionAndUnknownKeysAreUnsupported() {
        #expect(error(hx("a2 00 02 01") + text("com.example.a")) == .unsupported(at: 2, value: 2))
        #expect(error(hx("a2 00 00 01") + text("com.example.a")) == .unsupported(at: 2, value: 0))
        #expect(error(hx("a3 00 01 01") + text("com.example.a") + hx("09 6178")) == .unsupported(at: 18, value: 9))
        #expect(error(hx("a3 00 01 01") + text("com.example.a") + hx("06 6178")) == .unsupported(at: 18, value: 6))
    }

    @Test func emptyOptionalFieldsAreAbsentInstead() throws {
        #expect(error(hx("a3 00 01 01") + text("a.b") + hx("02 60")) == .malformed(at: 9, .payloadEmptyField))
        #expect(error(hx("a3 00 01 01") + text("a.b") + hx("04 80")) == .malformed(at: 9, .payloadEmptyField))
        #expect(error(hx("a3 00 01 01") + text("a.b") + hx("05 a0")) == .malformed(at: 9, .payloadEmptyField))
        // The encoder writes nothing for an empty title, key set or userInfo.
        let e = try encoded(ActivityPayloadContent(activityType: "a.b", title: "", requiredUserInfoKeys: [], userInfo: [:]))
        #expect(hexString(e) == "a20001016361" + "2e62")
        #expect(try decode(e) == ActivityPayloadContent(activityType: "a.b"))
    }

    @Test func requiredKeys() throws {
        let ok = ActivityPayloadContent(activityType: "a.b", requiredUserInfoKeys: ["pos", "b", "zz"],
                                        userInfo: ["pos": .int(1), "b": .null, "zz": .bool(false), "other": .int(2)])
        let bytes = try encoded(ok)
        #expect(try decode(bytes) == ok)
        try withView(bytes) { v in
            #expect(Array(v.requiredUserInfoKeys).map { string($0.utf8) } == ["b", "zz", "pos"])
        }
        // "a" required, userInfo holds only "b": named at the required key (offset 10).
        let head = hx("a4 00 01 01") + text("a.b")
        #expect(error(head + hx("04 81 6161 05 a1 6162 01")) == .malformed(at: 10, .payloadRequiredKeyMissing))
        // "c" required after "b" but userInfo ends first.
        #expect(error(head + hx("04 82 6162 6163 05 a1 6162 01")) == .malformed(at: 12, .payloadRequiredKeyMissing))
        // Required keys and no userInfo.
        #expect(error(hx("a3 00 01 01") + text("a.b") + hx("04 81 6161")) == .malformed(at: 10, .payloadRequiredKeyMissing))
        // Unsorted, duplicate, not text.
        #expect(error(head + hx("04 82 6162 6161 05 a2 6161 01 6162 02")) == .malformed(at: 12, .payloadRequiredKeysOrder))
        #expect(error(head + hx("04 82 6161 6161 05 a1 6161 01")) == .malformed(at: 12, .payloadRequiredKeysOrder))
        #expect(error(head + hx("04 81 01 05 a1 6161 01")) == .malformed(at: 10, .payloadFieldType))
        // The encoder refuses a required key that userInfo lacks.
        #expect(reason(encodeError(ActivityPayloadContent(activityType: "a.b", requiredUserInfoKeys: ["x"], userInfo: ["y": .null])))
                == .payloadRequiredKeyMissing)
    }
}

@Suite("Activity payload: userInfo kinds (§3)")
struct ActivityPayloadKindTests {
    // Each kind alone, with the exact encoding of the value (RFC 8949 App. A where it has one).
    @Test(arguments: [
        (UserInfoValue.int(0), CBORValue.Kind.int, "00"), (.int(-1), .int, "20"), (.int(24), .int, "1818"),
        (.int(.max), .int, "1b7fffffffffffffff"), (.int(.min), .int, "3b7fffffffffffffff"),
        (.double(1.5), .double, "f93e00"), (.double(100_000), .double, "fa47c35000"), (.double(0.1), .double, "fb3fb999999999999a"),
        (.double(-0.0), .double, "f98000"), (.double(.nan), .double, "f97e00"), (.double(-.infinity), .double, "f9fc00"),
        (.bool(true), .bool, "f5"), (.bool(false), .bool, "f4"), (.null, .null, "f6"),
        (.string(""), .text, "60"), (.string("ü"), .text, "62c3bc"),
        (.data([]), .data, "40"), (.data([1, 2]), .data, "420102"),
        (.date(1_700_000_000), .date, "c11a6553f100"), (.date(1_700_000_000.5), .date, "c1fb41d954fc40200000"), (.date(-1), .date, "c120"),
        (.url("https://a.b"), .url, "d8206b68747470733a2f2f612e62"),
        (.array([]), .array, "80"), (.array([.int(1), .string("a")]), .array, "82016161"),
        (.dictionary([:]), .map, "a0"), (.dictionary(["b": .int(1), "a": .int(2)]), .map, "a2616102616201"),
        (.set([]), .set, "d9010280"), (.set([.int(2), .int(1), .int(1)]), .set, "d90102820102"),
        (.set([.string("a"), .int(1000), .int(-1)]), .set, "d90102831903e8206161"),
    ] as [(UserInfoValue, CBORValue.Kind, String)])
    func kindRoundTrips(value: UserInfoValue, kind: CBORValue.Kind, hex: String) throws {
        let p = ActivityPayloadContent(activityType: "a.b", userInfo: ["v": value])
        let bytes = try encoded(p)
        let expected = hx("a3 00 01 01") + text("a.b") + hx("05 a1 6176") + hx(hex)
        #expect(hexString(bytes) == hexString(expected))
        try withView(bytes) { v in
            let got = v.userInfo("v")
            #expect(got?.kind == kind)
            #expect(got.map { hexString(Array($0.encoded)) } == hex)
            // Copy out and encode again: the same bytes (NaN, -0.0 and set order included).
            let again = try encoded(ActivityPayloadContent(v))
            #expect(again == bytes)
        }
    }

    @Test func lazyCursorsOverNestedValues() throws {
        let bytes = try encoded(PayloadFixtures.kinds)
        try withView(bytes) { v in
            let dict = v.userInfo("dict")
            #expect(dict?.kind == .map && dict?.count == 1)
            #expect(dict?["inner"]?["n"]?.int == 0)
            #expect(dict?["inner"]?["deep"]?.isNull == true)
            #expect(dict?["inner"]?["absent"] == nil)
            let set = v.userInfo("set").map { Array($0.elements).map { string($0.utf8) } }
            #expect(set == ["a", "c", "bb"])  // canonical: length first
            let intset = v.userInfo("intset").map { Array($0.elements).compactMap(\.int) }
            #expect(intset == [1, 2, 100, 1000])
            #expect(v.userInfo("data")?.data.map(Array.init) == [0x00, 0x01, 0xFE, 0xFF])
            #expect(string(v.userInfo("url")?.utf8) == "file:///tmp/x?y=1#z")
            #expect(string(v.userInfo("string")?.utf8) == "Grüße, 世界 🎉 \"q\" \\ \n\t\u{01}")
            #expect(v.userInfo("nan")?.double?.isNaN == true)
            #expect(v.userInfo("negzero")?.double?.sign == .minus)
            #expect(v.userInfo("array")?.elements.map(\.kind) == [.int, .text, .double, .array])
            // Accessors of the wrong kind say nil, not a guess.
            #expect(v.userInfo("int")?.double == nil && v.userInfo("int")?.utf8 == nil && v.userInfo("int")?.count == 0)
            // Every entry in key order: (length, bytes).
            let keys = Array(v.userInfo).compactMap { string($0.key.utf8) }
            #expect(keys == keys.sorted { CBORBuilder.keyOrder($0, $1) })
            #expect(keys.count == 24)
        }
    }
}

@Suite("Activity payload: interop with Python cbor2 (§6)")
struct ActivityPayloadInteropTests {
    @Test(arguments: ["vector", "minimal", "kinds", "mixed-set"])
    func swiftEncodesCbor2Decodes(name: String) throws {
        let p = PayloadFixtures.cases.first { $0.0 == name }!.1
        let bytes = try encoded(p)
        #expect(CBORInterop.run(["check", name, hexString(bytes)]) == "ok")
    }

    @Test(arguments: ["vector", "minimal", "kinds"])
    func cbor2EncodesSwiftReads(name: String) throws {
        guard let hex = CBORInterop.run(["emit", name]) else { return }
        let bytes = hx(hex)
        let expected = PayloadFixtures.cases.first { $0.0 == name }!.1
        // Byte-identical to ours, and it reads back to the same values.
        #expect(hex == hexString(try encoded(expected)))
        #expect(try encoded(try decode(bytes)) == bytes)
        #expect(try decode(bytes).activityType == expected.activityType)
    }

    // cbor2 5.4's canonical=True sorts a set of mixed kinds length-first (RFC 7049 §3.9);
    // RFC 8949 §4.2.1 sorts bytewise. Same-kind keys, i.e. every map this payload has, agree.
    @Test func cbor2LengthFirstMixedSetIsRejected() {
        guard let hex = CBORInterop.run(["emit", "mixed-set"]) else { return }
        #expect(hex.hasSuffix("d90102832061611903e8"))
        #expect(reason(error(hx(hex))) == .cborUnsortedSet)
    }

    @Test(arguments: [
        ("unsorted-keys", Malformed.cborUnsortedKeys), ("unsorted-top", .cborUnsortedKeys), ("float64", .cborNonPreferredFloat),
        ("tag0-date", .cborDisallowedTag), ("undefined", .cborDisallowedSimple), ("bytes-key", .cborMapKeyNotText),
        ("int-range", .cborIntegerRange), ("bignum", .cborDisallowedTag), ("integral-float-date", .cborBadDate),
        ("ftp-url", .payloadURLScheme),
    ])
    func cbor2NonCanonicalIsRejected(name: String, expected: Malformed) {
        guard let hex = CBORInterop.run(["emit-loose", name]) else { return }
        #expect(reason(error(hx(hex))) == expected, "\(name): \(hex)")
    }

    @Test func cbor2VersionAndUnknownKey() {
        if let hex = CBORInterop.run(["emit-loose", "version-2"]) { #expect(error(hx(hex)) == .unsupported(at: 2, value: 2)) }
        if let hex = CBORInterop.run(["emit-loose", "unknown-key"]) { #expect(error(hx(hex)) == .unsupported(at: 18, value: 9)) }
    }
}

@Suite("Activity payload: JSON rendering (§4)")
struct ActivityPayloadJSONTests {
    @Test func vectorRendersExactly() throws {
        let json = try renderJSON(hx(PayloadFixtures.vectorHex))
        #expect(json == #"{"version":1,"activityType":"com.example.reader.article","title":"Chapter 3","#
            + #""webpageURL":"https://example.com/books/3","requiredUserInfoKeys":["position"],"#
            + #""userInfo":{"night":true,"scale":1.5,"position":1234}}"#)
    }

    @Test func minimalRendersStableShape() throws {
        #expect(try renderJSON(try encoded(PayloadFixtures.minimal)) == #"{"version":1,"activityType":"com.example.a","title":null,"#
            + #""webpageURL":null,"requiredUserInfoKeys":[],"userInfo":{}}"#)
    }

    @Test func kindsRender() throws {
        let json = try renderJSON(try encoded(ActivityPayloadContent(activityType: "a.b", userInfo: [
            "d": .date(1_700_000_000), "f": .date(1_700_000_000.5), "o": .date(-62_135_596_800), "l": .date(253_402_300_799),
            "p": .date(951_782_400), "n": .date(-0.25), "b": .data([0xFB, 0xFF]), "s": .set([.int(2), .int(1)]),
            "x": .double(.nan), "i": .double(-.infinity), "z": .double(-0.0), "e": .double(1e-7), "u": .url("https://a.b/?q=\"x\""),
        ])))
        #expect(json.contains(#""d":"2023-11-14T22:13:20Z""#))
        #expect(json.contains(#""f":"2023-11-14T22:13:20.500000Z""#))
        #expect(json.contains(#""o":"0001-01-01T00:00:00Z""#))
        #expect(json.contains(#""l":"9999-12-31T23:59:59Z""#))
        #expect(json.contains(#""p":"2000-02-29T00:00:00Z""#))  // a leap day in a century leap year
        #expect(json.contains(#""n":"1969-12-31T23:59:59.750000Z""#))
        #expect(json.contains(#""b":"+/8=""#))
        #expect(json.contains(#""s":[1,2]"#))
        #expect(json.contains(#""x":null"#) && json.contains(#""i":null"#))
        #expect(json.contains(#""z":-0.0"#) && json.contains(#""e":1e-07"#))
        #expect(json.contains(#""u":"https://a.b/?q=\"x\"""#))
    }

    // Python's json module parses Swift's output, and Python's own mapping of the same value
    // (written independently in cbor_interop.py) equals it.
    @Test(arguments: ["vector", "minimal", "kinds"])
    func pythonReadsTheJSON(name: String) throws {
        let json = try renderJSON(try encoded(PayloadFixtures.cases.first { $0.0 == name }!.1))
        #expect(CBORInterop.run(["json", name], input: json) == "ok")
    }

    @Test func everyShortBufferIsNoRoomNeverATrap() throws {
        let bytes = hx(PayloadFixtures.vectorHex)
        let full = try renderJSON(bytes).utf8.count
        for capacity in 0 ..< full {
            do {
                _ = try renderJSON(bytes, capacity: capacity)
                Issue.record("capacity \(capacity) of \(full) was enough")
            } catch let e as WireError {
                guard case .noRoom(let need, let have) = e else { Issue.record("\(e)"); continue }
                #expect(have == capacity && need > capacity)
            }
        }
        #expect(try renderJSON(bytes, capacity: full).utf8.count == full)
    }
}

@Suite("Activity payload: invariants under mutation")
struct ActivityPayloadMutationTests {
    /// SplitMix64 (BatonTestSupport): a fixed sequence, so a failure reproduces.
    typealias Rng = SplitMix

    // Any input: a view or a typed error, never a trap. An accepted input is canonical, so
    // copying it out and encoding again gives the same bytes, and it renders to JSON.
    @Test func mutatedPayloadsAreTotalAndCanonical() throws {
        let seeds = [hx(PayloadFixtures.vectorHex), try encoded(PayloadFixtures.kinds)]
        var rng = Rng(state: 0xBA70_0001)
        var accepted = 0
        var json = [UInt8](repeating: 0, count: 16384)
        for i in 0 ..< 6000 {
            var b = seeds[i % seeds.count]
            for _ in 0 ... rng.below(3) {
                switch rng.below(4) {
                case 0: b[rng.below(b.count)] = UInt8(truncatingIfNeeded: rng.next())
                case 1: b[rng.below(b.count)] ^= 1 << UInt8(rng.below(8))
                case 2: b.insert(UInt8(truncatingIfNeeded: rng.next()), at: rng.below(b.count + 1))
                default: if b.count > 1 { b.remove(at: rng.below(b.count)) }
                }
            }
            let ok: Bool = b.withUnsafeBytes { raw in
                guard let view = try? ActivityPayload.validate(raw) else { return false }
                json.withUnsafeMutableBytes { out in
                    var w = JSONWriter(out)
                    #expect((try? view.renderJSON(into: &w)) != nil)
                }
                return true
            }
            if ok {
                accepted += 1
                let again = try encoded(try decode(b))
                #expect(again == b, "re-encoding differs for \(hexString(b))")
            }
        }
        #expect(accepted > 200)
    }

    @Test func randomBytesAreTotal() {
        var rng = Rng(state: 42)
        for _ in 0 ..< 4000 {
            var b = (0 ..< rng.below(40)).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
            if !b.isEmpty && rng.below(2) == 0 { b[0] = 0xA0 | UInt8(rng.below(6)) }  // a small map, to get further
            _ = error(b)
        }
    }
}

extension SplitMix {
    /// A draw from 0 up to `n` (not included), as the mutation tests pick a byte or an edit.
    mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
}
