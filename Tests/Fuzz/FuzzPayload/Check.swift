// Fuzz target: the activity payload validator and its JSON rendering (docs/payload.md).
// The input is the payload, byte for byte, so a crash file is a payload you can decode by hand.
// Invariants:
//   * the size cap is checked first: more bytes than `maxBytes` is `payload-too-large` at
//     `maxBytes`, whatever the bytes are (§3.7);
//   * every error names a byte inside the input (or the cap), and `truncated` needs ≥ 1 byte;
//   * looser limits never reject what tighter ones accept, and agree on the fields;
//   * an accepted payload re-encodes to the same bytes (`ActivityPayloadContent(view).encoded()`:
//     the encoding is deterministic, §1), and its proper prefixes are `truncated` (§7);
//   * its JSON (§4) fits `jsonBound(count)` bytes; the output is valid UTF-8 and one well-formed,
//     balanced JSON object; into a smaller buffer it either comes out identical or throws
//     `.noRoom`, having written a prefix of the full rendering (the writer writes whole tokens).
import BatonWire
import FuzzSupport

/// The tightest limits the gateway runs with by default, and the loosest it accepts.
let defaults = PayloadLimits.default
let loose = PayloadLimits(maxBytes: 1 << 20, maxDepth: PayloadLimits.maxSupportedDepth,
                          maxItemsPerContainer: PayloadLimits.defaultMaxItemsPerContainer)

/// An upper bound on the JSON of a valid payload of `count` bytes. The worst expansion per
/// input byte is a date: `c1 00` (2 bytes) renders as `,"1970-01-01T00:00:00Z"` (23 bytes);
/// everything else expands less (`f4` → `,false` is 6×, a control character in text → `\u00XX`
/// is 6×). The fixed members with absent fields take 103 bytes.
func jsonBound(_ count: Int) -> Int { 12 * count + 128 }

func check(_ bytes: UnsafeRawBufferPointer) {
    let n = bytes.count

    // The cap comes before any byte is read.
    if n > 0 {
        let tight = PayloadLimits(maxBytes: n - 1)
        expectError(bytes, tight, "cap at count - 1") { e in
            e == .malformed(at: n - 1, .payloadTooLarge)
        }
    }

    let strict = validate(bytes, defaults)
    let relaxed = validate(bytes, loose)
    if n > defaults.maxBytes {
        invariant(strict == .rejected(.malformed(at: defaults.maxBytes, .payloadTooLarge)),
                  "\(n) bytes passed the \(defaults.maxBytes)-byte cap: \(strict)")
    }
    for outcome in [strict, relaxed] {
        if case .rejected(let e) = outcome { checkErrorOffset(e, count: n) }
    }
    if case .accepted(let a) = strict {
        invariant(relaxed == .accepted(a), "looser limits rejected or changed an accepted payload: \(relaxed)")
    }
    // The cap at exactly n bytes changes nothing.
    if n <= defaults.maxBytes {
        let exact = validate(bytes, PayloadLimits(maxBytes: n))
        invariant(exact == strict, "a cap of exactly \(n) bytes changed the outcome: \(exact) vs \(strict)")
    }

    guard case .accepted = relaxed, let view = try? ActivityPayload.validate(bytes, limits: loose) else { return }
    invariant(view.version == ActivityPayload.version, "accepted version \(view.version)")
    invariant(view.exceedsRecommendedSize == (n > PayloadLimits.recommendedMaxBytes), "exceedsRecommendedSize is wrong")

    // Deterministic encoding: the copy in Swift values encodes to the very same bytes.
    let content = ActivityPayloadContent(view)
    if !hasEquivalentKeys(view) {
        do {
            let again = try content.encoded(limits: loose)
            invariant(again.elementsEqual(bytes), "re-encoding changed the payload: \(hex(again)) vs \(hex(bytes))")
        } catch {
            invariant(false, "an accepted payload does not re-encode: \(error)")
        }
    }

    // Every proper prefix is truncated (docs/payload.md §7); three cuts keep this linear.
    for cut in Set([0, n / 2, n - 1]) where cut < n {
        expectError(UnsafeRawBufferPointer(rebasing: bytes[..<cut]), loose, "prefix of \(cut) bytes") { e in
            if case .truncated(let at, let need) = e { return at <= cut && need > 0 }
            return false
        }
    }

    checkJSON(view, count: n)
}

/// Known finding (docs/fuzzing.md, "Findings"): keys that differ in bytes but are canonically
/// equivalent Unicode, such as "\u{E9}" and "e\u{301}", are two keys to the validator (as to
/// an NSDictionary, which compares NSString keys literally) but one to Swift's `String`, so
/// `ActivityPayloadContent`'s `Set<String>` and `[String: UserInfoValue]` merge them and the
/// copy cannot re-encode to the same bytes. Such payloads skip the round trip (every other
/// invariant still applies to them) until the copy keys by bytes.
func hasEquivalentKeys(_ view: ActivityPayloadView) -> Bool {
    func string(_ v: CBORValue) -> String { String(decoding: v.utf8 ?? UnsafeRawBufferPointer(start: nil, count: 0), as: UTF8.self) }
    var required = Set<String>()
    var count = 0
    for k in view.requiredUserInfoKeys { required.insert(string(k)); count += 1 }
    if required.count != count { return true }
    func walk(_ v: CBORValue) -> Bool {
        switch v.kind {
        case .map:
            var keys = Set<String>()
            for e in v.entries {
                if !keys.insert(string(e.key)).inserted || walk(e.value) { return true }
            }
            return false
        case .array, .set:
            for e in v.elements where walk(e) { return true }
            return false
        default:
            return false
        }
    }
    return view.userInfoValue.map(walk) ?? false
}

// MARK: - JSON

func checkJSON(_ view: ActivityPayloadView, count: Int) {
    let capacity = jsonBound(count)
    let full = UnsafeMutableRawBufferPointer.allocate(byteCount: capacity, alignment: 1)
    defer { full.deallocate() }
    var w = JSONWriter(full)
    do {
        try view.renderJSON(into: &w)
    } catch {
        invariant(false, "JSON of a \(count)-byte payload did not fit \(capacity) bytes: \(error)")
    }
    invariant(w.isComplete, "renderJSON returned with the document open")
    let json = w.written
    invariant(isValidUTF8(json), "the JSON is not UTF-8: \(hex(Array(json)))")
    var parser = JSONSyntax(json)
    invariant(parser.document(), "the JSON is not one well-formed object (at byte \(parser.i)): \(String(decoding: json, as: UTF8.self))")
    invariant(json.starts(with: #"{"version":1,"activityType":""#.utf8), "members out of order")

    // A smaller buffer, sized by the input: identical output, or `.noRoom` after a prefix.
    let size = (count &* 7 &+ Int(json.count / 3)) % (json.count + 1)
    let small = UnsafeMutableRawBufferPointer.allocate(byteCount: max(size, 1), alignment: 1)
    defer { small.deallocate() }
    var s = JSONWriter(UnsafeMutableRawBufferPointer(rebasing: small[..<size]))
    do {
        try view.renderJSON(into: &s)
        invariant(s.written.elementsEqual(json), "the JSON differs with a \(size)-byte buffer")
    } catch {
        guard case .noRoom(let need, let have) = error else {
            invariant(false, "rendering threw \(error), not .noRoom")
            return
        }
        invariant(have == size && need > size, "noRoom(need: \(need), have: \(have)) for a \(size)-byte buffer")
        invariant(size < json.count, "a \(size)-byte buffer holds the \(json.count)-byte JSON but threw")
        invariant(json.starts(with: s.written), "a short buffer received something other than a prefix")
    }
}

/// RFC 8259 §2–§7, strictly: one object at top level, nothing after it; no raw control
/// characters in strings; escapes from the grammar only; numbers without leading zeros.
struct JSONSyntax {
    let b: UnsafeRawBufferPointer
    var i = 0
    init(_ b: UnsafeRawBufferPointer) { self.b = b }

    mutating func document() -> Bool {
        guard peek() == UInt8(ascii: "{"), value(depth: 0) else { return false }
        return i == b.count
    }

    func peek() -> UInt8? { i < b.count ? b[i] : nil }
    mutating func eat(_ c: Unicode.Scalar) -> Bool {
        guard peek() == UInt8(ascii: c) else { return false }
        i += 1
        return true
    }

    mutating func value(depth: Int) -> Bool {
        guard let c = peek() else { return false }
        switch c {
        case UInt8(ascii: "{"):
            // `depth` counts the containers around this one; the writer nests at most maxDepth.
            guard depth < JSONWriter.maxDepth else { return false }
            i += 1
            if eat("}") { return true }
            repeat {
                guard string(), eat(":"), value(depth: depth + 1) else { return false }
            } while eat(",")
            return eat("}")
        case UInt8(ascii: "["):
            guard depth < JSONWriter.maxDepth else { return false }
            i += 1
            if eat("]") { return true }
            repeat {
                guard value(depth: depth + 1) else { return false }
            } while eat(",")
            return eat("]")
        case UInt8(ascii: "\""): return string()
        case UInt8(ascii: "t"): return literal("true")
        case UInt8(ascii: "f"): return literal("false")
        case UInt8(ascii: "n"): return literal("null")
        default: return number()
        }
    }

    mutating func literal(_ s: StaticString) -> Bool {
        let ok = s.withUTF8Buffer { w in
            i + w.count <= b.count && w.indices.allSatisfy { b[i + $0] == w[$0] }
        }
        if ok { i += s.utf8CodeUnitCount }
        return ok
    }

    mutating func string() -> Bool {
        guard eat("\"") else { return false }
        while let c = peek() {
            i += 1
            if c == UInt8(ascii: "\"") { return true }
            if c < 0x20 { return false }
            guard c == UInt8(ascii: "\\") else { continue }
            guard let e = peek() else { return false }
            i += 1
            switch e {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"),
                 UInt8(ascii: "f"), UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                continue
            case UInt8(ascii: "u"):
                for _ in 0 ..< 4 {
                    guard let h = peek(), isHex(h) else { return false }
                    i += 1
                }
            default:
                return false
            }
        }
        return false
    }

    mutating func number() -> Bool {
        _ = eat("-")
        if eat("0") {
        } else {
            guard digits() else { return false }
        }
        if eat(".") { guard digits() else { return false } }
        if eat("e") || eat("E") {
            if !eat("+") { _ = eat("-") }
            guard digits() else { return false }
        }
        return true
    }

    mutating func digits() -> Bool {
        let start = i
        while let c = peek(), c >= UInt8(ascii: "0"), c <= UInt8(ascii: "9") { i += 1 }
        return i > start
    }

    func isHex(_ c: UInt8) -> Bool {
        (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66)
    }
}

/// Well-formed UTF-8 by the standard library's own decoder (an independent check of the
/// writer's replacement of ill-formed sequences).
func isValidUTF8(_ b: UnsafeRawBufferPointer) -> Bool {
    var it = b.makeIterator()
    var decoder = UTF8()
    while true {
        switch decoder.decode(&it) {
        case .scalarValue: continue
        case .emptyInput: return true
        case .error: return false
        }
    }
}

// MARK: - helpers

/// What `validate` did, comparable; an accepted payload by its fields' offsets.
enum Outcome: Equatable, CustomStringConvertible {
    case accepted(Fields)
    case rejected(WireError)

    var description: String {
        switch self {
        case .accepted(let f): "accepted \(f)"
        case .rejected(let e): "rejected: \(e)"
        }
    }
}

struct Fields: Equatable {
    var activityType: Range<Int>
    var title: Range<Int>?
    var webpageURL: Range<Int>?
    var required: Range<Int>?
    var userInfo: Range<Int>?
}

func validate(_ bytes: UnsafeRawBufferPointer, _ limits: PayloadLimits) -> Outcome {
    do {
        let v = try ActivityPayload.validate(bytes, limits: limits)
        func range(_ p: UnsafeRawBufferPointer?) -> Range<Int>? {
            guard let p else { return nil }
            guard let base = bytes.baseAddress, let start = p.baseAddress else { return 0 ..< 0 }
            let lower = start - base
            invariant(lower >= 0 && lower + p.count <= bytes.count, "a field lies outside the payload")
            return lower ..< lower + p.count
        }
        func range(_ c: CBORValue?) -> Range<Int>? {
            guard let c else { return nil }
            invariant(c.offset >= 0 && c.offset < c.end && c.end <= bytes.count, "a value lies outside the payload")
            return c.offset ..< c.end
        }
        // Proof of non-nil: a validated payload always has an activity type.
        return .accepted(Fields(activityType: range(v.activityType)!, title: range(v.title),
                                webpageURL: range(v.webpageURL), required: range(v.requiredUserInfoKeysValue),
                                userInfo: range(v.userInfoValue)))
    } catch {
        return .rejected(error)
    }
}

func expectError(_ bytes: UnsafeRawBufferPointer, _ limits: PayloadLimits, _ what: String,
                 _ ok: (WireError) -> Bool) {
    switch validate(bytes, limits) {
    case .accepted(let f): invariant(false, "\(what): accepted \(f)")
    case .rejected(let e): invariant(ok(e), "\(what): unexpected \(e)")
    }
}

func checkErrorOffset(_ e: WireError, count: Int) {
    switch e {
    case .truncated(let at, let need):
        invariant(at >= 0 && at <= count && need > 0, "\(e) in \(count) bytes")
    case .badLength(let at, _), .unsupported(let at, _), .malformed(let at, _):
        invariant(at >= 0 && at <= count, "\(e) names a byte outside \(count) bytes")
    case .trailing(let at, let trailing):
        invariant(at >= 0 && trailing > 0 && at + trailing == count, "\(e) in \(count) bytes")
    case .noRoom:
        invariant(false, "the validator threw \(e)")
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
