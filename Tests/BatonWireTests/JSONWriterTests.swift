// The fixed-buffer JSON writer (RFC 8259). Expected output is written out in full.
import Testing
@testable import BatonWire

/// Runs `body` on a writer over `capacity` bytes; returns the text or the error.
private func json(_ capacity: Int = 1024, _ body: (inout JSONWriter) throws(WireError) -> Void) -> Result<String, WireError> {
    var buf = [UInt8](repeating: 0, count: capacity)
    return buf.withUnsafeMutableBytes { raw in
        var w = JSONWriter(raw)
        do throws(WireError) {
            try body(&w)
            return .success(String(decoding: w.written, as: UTF8.self))
        } catch {
            // The bytes written before the failure end on a token boundary: a prefix of the
            // full document, never half a token.
            return .failure(error)
        }
    }
}

private func text(_ capacity: Int = 1024, _ body: (inout JSONWriter) throws(WireError) -> Void) -> String? {
    try? json(capacity, body).get()
}

@Suite("JSONWriter (RFC 8259)")
struct JSONWriterTests {
    @Test func objectsArraysAndCommas() {
        let s = text { w throws(WireError) in
            try w.beginObject()
            try w.key("a"); try w.int(1)
            try w.key("b"); try w.beginArray()
            try w.int(-2); try w.bool(true); try w.bool(false); try w.null()
            try w.beginObject(); try w.endObject()
            try w.beginArray(); try w.endArray()
            try w.endArray()
            try w.key("c"); try w.beginObject(); try w.key("d"); try w.string("e"); try w.endObject()
            try w.endObject()
        }
        #expect(s == #"{"a":1,"b":[-2,true,false,null,{},[]],"c":{"d":"e"}}"#)
    }

    @Test func topLevelScalarsAndCompletion() {
        var buf = [UInt8](repeating: 0, count: 8)
        buf.withUnsafeMutableBytes { raw in
            var w = JSONWriter(raw)
            #expect(!w.isComplete)
            #expect((try? w.uint(42)) != nil)
            #expect(w.isComplete)
            #expect(String(decoding: w.written, as: UTF8.self) == "42")
        }
    }

    @Test(arguments: [
        (Int64(0), "0"), (7, "7"), (-7, "-7"), (10, "10"), (1_234_567_890, "1234567890"),
        (.max, "9223372036854775807"), (.min, "-9223372036854775808"),
    ])
    func integers(v: Int64, expected: String) {
        #expect(text { w throws(WireError) in try w.int(v) } == expected)
    }

    @Test func unsignedMax() {
        #expect(text { w throws(WireError) in try w.uint(.max) } == "18446744073709551615")
    }

    // Shortest digits that read back to the same Double; JSON has no NaN or infinity
    // (RFC 8259 §6), so those are null.
    @Test(arguments: [
        (1.5, "1.5"), (0.1, "0.1"), (-0.0, "-0.0"), (1.0, "1.0"), (1e-7, "1e-07"), (5e20, "5e+20"),
        (0.30000000000000004, "0.30000000000000004"), (1.7976931348623157e308, "1.7976931348623157e+308"),
        (Double.leastNonzeroMagnitude, "5e-324"), (-1.2345678901234568e-300, "-1.2345678901234568e-300"), (1e16, "1e+16"),
        (Double.nan, "null"), (Double.infinity, "null"), (-Double.infinity, "null"),
    ])
    func doubles(v: Double, expected: String) {
        let s = text { w throws(WireError) in try w.double(v) }
        #expect(s == expected)
        if v.isFinite, let s { #expect(Double(s) == v) }
    }

    // RFC 8259 §7: quotation mark, reverse solidus and U+0000–U+001F must be escaped.
    @Test func stringEscaping() {
        let input = "q\"b\\s/\u{0}\u{1}\n\r\t\u{1F}\u{7F} é 世 🎉"
        #expect(text { w throws(WireError) in try w.string(input) }
                == #""q\"b\\s/\u0000\u0001\u000a\u000d\u0009\u001f"# + "\u{7F} é 世 🎉\"")
        #expect(text { w throws(WireError) in try w.beginObject(); try w.key("k\"\n"); try w.int(1); try w.endObject() }
                == #"{"k\"\u000a":1}"#)
    }

    // Ill-formed UTF-8 (e.g. a device name off the air): each bad byte becomes U+FFFD.
    @Test func illFormedUTF8IsReplaced() {
        let bytes: [UInt8] = [0x41, 0xFF, 0xC3, 0x28, 0xED, 0xA0, 0x80, 0xC3, 0xBC]
        let s = bytes.withUnsafeBytes { b in text { w throws(WireError) in try w.string(utf8: b) } }
        #expect(s == "\"A\u{FFFD}\u{FFFD}(\u{FFFD}\u{FFFD}\u{FFFD}ü\"")
    }

    // RFC 4648 §10 test vectors.
    @Test(arguments: [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="),
                      ("fooba", "Zm9vYmE="), ("foobar", "Zm9vYmFy")])
    func base64(input: String, expected: String) {
        let bytes = Array(input.utf8)
        #expect(bytes.withUnsafeBytes { b in text { w throws(WireError) in try w.base64(b) } } == "\"\(expected)\"")
    }

    @Test func base64AlphabetEnds() {
        let bytes: [UInt8] = [0xFB, 0xEF, 0xBE, 0x00]
        #expect(bytes.withUnsafeBytes { b in text { w throws(WireError) in try w.base64(b) } } == #""++++AA==""#)
        let slash: [UInt8] = [0xFF, 0xFF, 0xFF]
        #expect(slash.withUnsafeBytes { b in text { w throws(WireError) in try w.base64(b) } } == #""////""#)
    }

    // A buffer one byte short at every size: `.noRoom` naming the capacity, and what was
    // written is a prefix of the full output ending on a token boundary.
    @Test func noRoomAtEverySize() {
        let doc: (inout JSONWriter) throws(WireError) -> Void = { w throws(WireError) in
            try w.beginObject()
            try w.key("name"); try w.string("Küche \"3\"")
            try w.key("rssi"); try w.int(-67)
            try w.key("x"); try w.double(0.1)
            try w.key("list"); try w.beginArray(); try w.bool(true); try w.null(); try w.endArray()
            try w.endObject()
        }
        guard case .success(let full) = json(1024, doc) else { Issue.record("full document failed"); return }
        #expect(full == #"{"name":"Küche \"3\"","rssi":-67,"x":0.1,"list":[true,null]}"#)
        let n = full.utf8.count
        var prefixes = Set<Int>()
        for capacity in 0 ..< n {
            var buf = [UInt8](repeating: 0, count: capacity)
            buf.withUnsafeMutableBytes { raw in
                var w = JSONWriter(raw)
                do throws(WireError) {
                    try doc(&w)
                    Issue.record("capacity \(capacity) < \(n) succeeded")
                } catch {
                    guard case .noRoom(let need, let have) = error else { Issue.record("\(error)"); return }
                    #expect(have == capacity && need > capacity && need <= n)
                    #expect(Array(full.utf8.prefix(w.count)) == Array(w.written))
                    prefixes.insert(w.count)
                }
            }
        }
        // Tokens are written whole: far fewer distinct stopping points than bytes.
        #expect(prefixes.count < n / 2)
        #expect(json(n, doc) == .success(full))
    }
}
