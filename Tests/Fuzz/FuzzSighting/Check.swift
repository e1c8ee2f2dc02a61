// Fuzz target: the sighting decoder (docs/rooms.md §2). The input is the MQTT payload, byte for
// byte, so a crash file is a message you can read with `cat`.
// Invariants:
//   * every error names a byte inside the input: `truncated` at the end with need ≥ 1,
//     `trailing` reaching the end exactly, `malformed` at a byte before the end;
//   * what decodes has an RSSI in −127…+20 and a `since` ≥ 0;
//   * it re-encodes within `maxEncodedCount` bytes to JSON that decodes to the same value, and
//     that JSON is the canonical form (`{"rssi":…,"since":…,"n":…}`): encoding it again gives
//     the same bytes;
//   * every cut of an accepted input before its closing `}` is `truncated` (nothing in a valid
//     sighting can fail early on a shorter input); three cuts keep this linear.
import BatonWire
import FuzzSupport

func check(_ bytes: UnsafeRawBufferPointer) {
    let n = bytes.count
    let sighting: Sighting
    do {
        sighting = try Sighting.decode(bytes)
    } catch {
        checkError(error, count: n)
        return
    }
    if let rssi = sighting.rssi { invariant(Sighting.rssiRange.contains(rssi), "decoded RSSI \(rssi)") }
    invariant(sighting.since >= 0, "decoded since \(sighting.since)")

    let json = encode(sighting)
    let again = json.withUnsafeBytes { try? Sighting.decode($0) }
    invariant(again == sighting, "re-encoded \(String(decoding: json, as: UTF8.self)) decodes to \(String(describing: again)), not \(sighting)")
    invariant(json.starts(with: #"{"rssi":"#.utf8), "members out of order: \(String(decoding: json, as: UTF8.self))")
    if let again { invariant(encode(again) == json, "the canonical form is not stable") }

    // The closing brace: the last byte that is not whitespace.
    var close = n - 1
    while close > 0, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[close]) { close -= 1 }
    invariant(bytes[close] == UInt8(ascii: "}"), "accepted input does not end with }")
    for cut in Set([0, close / 2, close]) {
        let prefix = UnsafeRawBufferPointer(rebasing: bytes[..<cut])
        do {
            let s = try Sighting.decode(prefix)
            invariant(false, "a \(cut)-byte prefix decoded: \(s)")
        } catch {
            guard case .truncated(let at, let need) = error else {
                invariant(false, "a \(cut)-byte prefix threw \(error), not truncated")
                return
            }
            invariant(at == cut && need >= 1, "a \(cut)-byte prefix: \(error)")
        }
    }
}

func encode(_ s: Sighting) -> [UInt8] {
    var out = [UInt8](repeating: 0, count: Sighting.maxEncodedCount)
    let count = out.withUnsafeMutableBytes { raw -> Int in
        var w = JSONWriter(raw)
        do {
            try s.write(into: &w)
        } catch {
            invariant(false, "\(s) does not fit maxEncodedCount (\(Sighting.maxEncodedCount)): \(error)")
        }
        invariant(w.isComplete, "write returned with the object open")
        return w.count
    }
    return Array(out[..<count])
}

func checkError(_ e: WireError, count: Int) {
    switch e {
    case .truncated(let at, let need):
        invariant(at == count && need >= 1, "\(e) in \(count) bytes")
    case .trailing(let at, let trailing):
        invariant(at >= 1 && trailing > 0 && at + trailing == count, "\(e) in \(count) bytes")
    case .malformed(let at, _):
        invariant(at >= 0 && at < count, "\(e) names a byte outside \(count) bytes")
    case .badLength, .unsupported, .noRoom:
        invariant(false, "the decoder threw \(e)")
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
