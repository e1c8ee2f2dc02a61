// Fuzz target: LE advertising report events (Core 5.4, Vol 4, Part E, §7.7.65.2 legacy,
// §7.7.65.13 extended) through `HCIEvent.forEachAdvertisingReport(inEvent:_:)`.
//
// Input: an HCI event packet without its H4 indicator (code, Parameter_Total_Length, params).
// Each input is checked as given and once more with Parameter_Total_Length set to fit, so the
// fuzzer reaches the report walk without first having to guess the length byte.
// Invariants:
//   * success ⇔ a reference walk written from the two parameter tables accepts the event;
//   * on success the count returned equals the calls made, is 0 unless the event is an LE
//     Meta advertising report, and equals Num_Reports otherwise; every report's fields and
//     data slice are where the tables put them, inside the event, one after another, and the
//     data length is within the legacy (31) or extended (229) maximum;
//   * on error `body` was never called and the error names a byte inside the event;
//   * every report's data goes through `AdvertisementContent.decode` without trapping.
import BatonHCI
import BatonWire
import FuzzSupport

func check(_ bytes: UnsafeRawBufferPointer) {
    checkEvent(bytes)
    // The same parameters with a Parameter_Total_Length that fits.
    guard bytes.count >= 2, bytes.count - 2 <= 255, Int(bytes[1]) != bytes.count - 2 else { return }
    var fixed = Array(bytes)
    fixed[1] = UInt8(bytes.count - 2)
    fixed.withUnsafeBytes { checkEvent($0) }
}

func checkEvent(_ event: UnsafeRawBufferPointer) {
    var seen: [AdvertisingReport] = []
    let expected = referenceWalk(event)
    do {
        let count = try HCIEvent.forEachAdvertisingReport(inEvent: event) { report in
            seen.append(report)
        }
        invariant(count == seen.count, "returned \(count) after \(seen.count) calls")
        guard let expected else {
            invariant(false, "accepted an event the reference walk rejects: \(hex(event))")
            return
        }
        invariant(count == expected.count, "\(count) reports, the reference walk found \(expected.count)")
        for (report, at) in zip(seen, expected) { checkReport(report, at: at, in: event) }
    } catch {
        invariant(seen.isEmpty, "body was called \(seen.count) time(s) before \(error)")
        invariant(expected == nil, "rejected an event the reference walk accepts: \(error)")
        checkErrorOffset(error, count: event.count)
    }
}

/// Where each report starts, or nil when the event is malformed; [] for events that carry no
/// advertising reports. From the tables of §7.7.65.2 and §7.7.65.13 directly.
func referenceWalk(_ e: UnsafeRawBufferPointer) -> [Int]? {
    guard e.count >= 2, Int(e[1]) == e.count - 2 else { return nil }
    guard e[0] == 0x3E else { return [] }               // LE Meta
    guard e.count >= 3 else { return nil }              // Subevent_Code
    let extended: Bool
    switch e[2] {
    case 0x02: extended = false
    case 0x0D: extended = true
    default: return []
    }
    guard e.count >= 4, e[3] > 0 else { return nil }    // Num_Reports, 0x01…0xFF
    var starts: [Int] = []
    var p = 4
    for _ in 0 ..< Int(e[3]) {
        starts.append(p)
        if extended {
            guard p + 24 <= e.count else { return nil }
            let length = Int(e[p + 23])
            guard length <= 229, p + 24 + length <= e.count else { return nil }
            p += 24 + length
        } else {
            guard p + 9 <= e.count, e[p] <= 0x04 else { return nil }
            let length = Int(e[p + 8])
            guard length <= 31, p + 10 + length <= e.count else { return nil }
            p += 10 + length
        }
    }
    return p == e.count ? starts : nil
}

/// One report against the bytes at `p`.
func checkReport(_ r: AdvertisingReport, at p: Int, in e: UnsafeRawBufferPointer) {
    func u16(_ i: Int) -> UInt16 { UInt16(e[i]) | UInt16(e[i + 1]) << 8 }
    func address(_ i: Int) -> UInt64 { (0 ..< 6).reduce(0) { $0 | UInt64(e[i + $1]) << (8 * UInt64($1)) } }
    let dataAt: Int
    if r.isExtended {
        invariant(e[2] == 0x0D && r.legacyEventType == nil, "an extended report from a legacy event")
        invariant(r.eventType == u16(p) && r.addressType == e[p + 2] && r.address == address(p + 3), "extended header fields")
        invariant(r.primaryPHY == e[p + 9] && r.secondaryPHY == e[p + 10] && r.sid == e[p + 11], "extended PHY/SID")
        invariant(r.txPower == Int8(bitPattern: e[p + 12]) && r.rssi == Int8(bitPattern: e[p + 13]), "extended power fields")
        invariant(r.periodicInterval == u16(p + 14) && r.directAddressType == e[p + 16]
                  && r.directAddress == address(p + 17), "extended direct fields")
        invariant(r.data.count == Int(e[p + 23]) && r.data.count <= HCIEvent.extendedMaxData, "extended data length")
        dataAt = p + 24
    } else {
        invariant(e[2] == 0x02, "a legacy report from an extended event")
        invariant(r.legacyEventType == e[p] && r.eventType == AdvertisingReport.extendedEventType(legacy: e[p]),
                  "legacy event type \(e[p]) mapped to \(r.eventType)")
        invariant(r.isLegacyPDU, "a legacy report without the legacy bit")
        invariant(r.addressType == e[p + 1] && r.address == address(p + 2), "legacy address")
        invariant(r.data.count == Int(e[p + 8]) && r.data.count <= HCIEvent.legacyMaxData, "legacy data length")
        invariant(r.rssi == Int8(bitPattern: e[p + 9 + r.data.count]), "legacy RSSI after the data")
        dataAt = p + 9
    }
    invariant(r.address >> 48 == 0 && r.directAddress >> 48 == 0, "an address wider than 48 bits")
    invariant(offset(of: r.data, in: e) == dataAt, "report data at \(String(describing: offset(of: r.data, in: e))), not \(dataAt)")
    // The AD walk over what a real report would carry must not trap (its invariants: FuzzAD).
    if let content = try? AdvertisementContent.decode(r.data) {
        var messages = content.continuityMessages
        while let m = messages.next() { _ = try? m.decode() }
    }
}


func checkErrorOffset(_ e: WireError, count: Int) {
    switch e {
    case .truncated(let at, let need):
        invariant(at >= 0 && at <= count && need > 0, "\(e) in \(count) bytes")
    case .badLength(let at, _), .unsupported(let at, _), .malformed(let at, _):
        invariant(at >= 0 && at < count, "\(e) names a byte outside \(count) bytes")
    case .trailing(let at, let trailing):
        invariant(at >= 0 && trailing > 0 && at + trailing == count, "\(e) in \(count) bytes")
    case .noRoom:
        invariant(false, "a decoder threw \(e)")
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
