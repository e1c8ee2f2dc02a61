// Fuzz target: the fetch request body (docs/relay.md §2). The input is the MQTT payload, byte
// for byte, so a crash file is a body you can read with `cat`.
// Invariants:
//   * every error names a byte inside the input: `truncated` at the end with need ≥ 1,
//     `trailing` after at least `{}` and reaching the end exactly, `malformed` at a byte before
//     the end; no other error kind;
//   * an input of JSON whitespace only (or nothing) decodes, to the defaults; anything else that
//     decodes starts (after whitespace) with `{`;
//   * what decodes has its strings inside the input, between quotes, with no backslash, quote
//     or control character in them: a response topic of 1…256 bytes, well-formed UTF-8 (checked
//     by the standard library's decoder) without `+` or `#`; a correlation of 2…128 hex digits,
//     an even count, whose `correlationBytes` are half as many bytes that print back as the same
//     digits (ignoring case); a continue of 1…64 bytes of well-formed UTF-8;
//   * the canonical body written from what decoded (`{"format":…,"response_topic":…,
//     "correlation":…}`, no spaces) decodes to the same values;
//   * every cut of an accepted object before its closing `}` (just after the `{`, half way,
//     and all but the brace) is `truncated` at the cut.
import BatonWire
import FuzzSupport

func check(_ bytes: UnsafeRawBufferPointer) {
    let n = bytes.count
    let firstNonSpace = bytes.firstIndex { !isWhitespace($0) }
    let request: FetchRequest
    do {
        request = try FetchRequest.decode(bytes)
    } catch {
        checkError(error, count: n)
        invariant(firstNonSpace != nil, "a whitespace-only body threw \(error)")
        return
    }
    guard let open = firstNonSpace else {
        invariant(request == FetchRequest(), "a whitespace-only body decoded to \(request)")
        return
    }
    invariant(bytes[open] == UInt8(ascii: "{"), "an accepted body starts with \(bytes[open])")

    let topic = request.responseTopic.map { strings(bytes, $0) }
    if let topic {
        invariant((1 ... FetchRequest.maxResponseTopic).contains(topic.count), "a topic of \(topic.count) bytes")
        invariant(!topic.contains(UInt8(ascii: "+")) && !topic.contains(UInt8(ascii: "#")), "a wildcard in \(hex(topic))")
        invariant(String(validating: topic, as: UTF8.self) != nil, "a topic that is not UTF-8: \(hex(topic))")
    }
    let correlation = request.correlationHex.map { strings(bytes, $0) }
    if let correlation {
        invariant(correlation.count >= 2 && correlation.count <= 2 * FetchRequest.maxCorrelation && correlation.count % 2 == 0,
                  "a correlation of \(correlation.count) digits")
        invariant(correlation.allSatisfy(isHexDigit), "a correlation that is not hex: \(hex(correlation))")
        var out = [UInt8](repeating: 0, count: FetchRequest.maxCorrelation)
        let count = correlation.withUnsafeBytes { h in out.withUnsafeMutableBytes { FetchRequest.correlationBytes(h, into: $0) } }
        invariant(count * 2 == correlation.count, "\(count) bytes from \(correlation.count) digits")
        invariant(Array(hex(out[..<count]).utf8) == correlation.map(lowercased), "\(hex(out[..<count])) from \(hex(correlation))")
    }

    if let place = request.continuedAt.map({ strings(bytes, $0) }) {
        invariant((1 ... FetchRequest.maxContinuedAt).contains(place.count), "a continue of \(place.count) bytes")
        invariant(String(validating: place, as: UTF8.self) != nil, "a continue that is not UTF-8: \(hex(place))")
    }

    let canonical = canonicalBody(request.format, topic: topic, correlation: correlation)
    let again = canonical.withUnsafeBytes { try? FetchRequest.decode($0) }
    invariant(again?.format == request.format, "the canonical body changes the format: \(String(decoding: canonical, as: UTF8.self))")
    invariant(again?.responseTopic.map { Array(canonical[$0]) } == topic, "the canonical body changes the topic")
    invariant(again?.correlationHex.map { Array(canonical[$0]) } == correlation, "the canonical body changes the correlation")

    // The closing brace: the last byte that is not whitespace.
    var close = n - 1
    while close > open, isWhitespace(bytes[close]) { close -= 1 }
    invariant(bytes[close] == UInt8(ascii: "}"), "an accepted body does not end with }")
    for cut in Set([open + 1, (open + 1 + close) / 2, close]) {
        do {
            let r = try FetchRequest.decode(UnsafeRawBufferPointer(rebasing: bytes[..<cut]))
            invariant(false, "a \(cut)-byte prefix decoded: \(r)")
        } catch {
            invariant(isTruncatedAt(error, cut), "a \(cut)-byte prefix threw \(error)")
        }
    }
}

/// The bytes of a decoded string, after checking that they lie between quotes in the input and
/// hold nothing an escape would have been needed for.
func strings(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> [UInt8] {
    invariant(range.lowerBound >= 1 && range.upperBound < bytes.count, "\(range) outside \(bytes.count) bytes")
    invariant(bytes[range.lowerBound - 1] == UInt8(ascii: "\"") && bytes[range.upperBound] == UInt8(ascii: "\""),
              "\(range) is not between quotes")
    let value = Array(bytes[range])
    invariant(!value.contains { $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") || $0 < 0x20 },
              "a quote, backslash or control character in \(hex(value))")
    return value
}

func canonicalBody(_ format: FetchFormat, topic: [UInt8]?, correlation: [UInt8]?) -> [UInt8] {
    var out = Array(#"{"format":""#.utf8) + Array((format == .json ? "json" : "cbor").utf8) + [UInt8(ascii: "\"")]
    if let topic { out += Array(#","response_topic":""#.utf8) + topic + [UInt8(ascii: "\"")] }
    if let correlation { out += Array(#","correlation":""#.utf8) + correlation + [UInt8(ascii: "\"")] }
    return out + [UInt8(ascii: "}")]
}

func isTruncatedAt(_ e: WireError, _ cut: Int) -> Bool {
    if case .truncated(let at, let need) = e { return at == cut && need >= 1 }
    return false
}

func checkError(_ e: WireError, count: Int) {
    switch e {
    case .truncated(let at, let need):
        invariant(at == count && need >= 1, "\(e) in \(count) bytes")
    case .trailing(let at, let trailing):
        invariant(at >= 2 && trailing > 0 && at + trailing == count, "\(e) in \(count) bytes")
    case .malformed(let at, _):
        invariant(at >= 0 && at < count, "\(e) names a byte outside \(count) bytes")
    case .badLength, .unsupported, .noRoom:
        invariant(false, "the decoder threw \(e)")
    }
}

/// RFC 8259 §2.
func isWhitespace(_ c: UInt8) -> Bool { c == 0x20 || c == 0x09 || c == 0x0A || c == 0x0D }

func isHexDigit(_ c: UInt8) -> Bool {
    (UInt8(ascii: "0") ... UInt8(ascii: "9")).contains(c) || (UInt8(ascii: "a") ... UInt8(ascii: "f")).contains(c)
        || (UInt8(ascii: "A") ... UInt8(ascii: "F")).contains(c)
}

func lowercased(_ c: UInt8) -> UInt8 { (UInt8(ascii: "A") ... UInt8(ascii: "F")).contains(c) ? c + 0x20 : c }

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
