// Fuzz target: the reassembly of extended advertisements in fragments (Core 5.4, Vol 4,
// Part E, §7.7.65.13 Data_Status; docs/radio.md "Advertisements in fragments") through
// `AdvertisementDecoder.decode(report:timestamp:_:)`: fragments in any order, any status, any
// lengths, from up to 16 advertisers, with gaps around the deadline.
//
// Input: byte 0 is the pool's capacity (0…4). Then reports, each
//   control (1): bits 0–1 address, bit 2 SID 0/1, bit 3 scan response, bits 4–5 Data_Status,
//                bit 6 legacy PDU, bit 7 a 1.5 s gap before it (else 1 ms)
//   length (1): the Data_Length, capped at 229 and at what the input has left
//   data (length)
// Invariants:
//   * nothing traps, and each report yields at most one advertisement;
//   * an advertisement is handed on only for a report with Data_Status 0 or 2; it has
//     Data_Status 0, at most 1,650 bytes, and is made of this advertiser's own fragments: it
//     starts at one of the fragment boundaries since its last chain ended and runs contiguously
//     to the end of the current report (Data_Status 0), or stops earlier at a whole AD
//     structure (Data_Status 2, truncated);
//   * an advertisement of one report that is not truncated is that report's data exactly;
//   * the pool never holds more chains than its capacity, and after every advertiser has been
//     silent past the deadline one new chain finds all the others expired (no buffer leaks);
//   * every report is counted once in `reports`, and every drop under a reassembly reason or
//     one of the AD decoders' reasons.
import BatonHCI
import BatonWire
import FuzzSupport

func check(_ bytes: UnsafeRawBufferPointer) {
    guard !bytes.isEmpty else { return }
    let capacity = Int(bytes[0] % 5)
    var decoder = AdvertisementDecoder(reassembly: capacity)
    // Per advertiser (16 keys): the data since its last chain ended, and where each fragment began.
    var history = [[UInt8]](repeating: [], count: 16)
    var boundaries = [[Int]](repeating: [], count: 16)
    var now: Int64 = 1_795_000_000_000_000
    var at = 1
    var reports = 0
    while at + 2 <= bytes.count {
        let control = bytes[at]
        let length = min(Int(bytes[at + 1]), 229, bytes.count - at - 2)
        let data = UnsafeRawBufferPointer(rebasing: bytes[(at + 2)..<(at + 2 + length)])
        at += 2 + length
        now += control & 0x80 != 0 ? 1_500_000 : 1_000
        let key = Int(control & 0x0F)
        let status = UInt16((control >> 4) & 0x3)
        let legacy = control & 0x40 != 0
        var eventType = status << 5 | (control & 0x08 != 0 ? 0x08 : 0)
        if legacy { eventType = 0x10 }
        let report = AdvertisingReport(eventType: eventType, addressType: 1, address: 0xC0_00_00_00_00_00 | UInt64(control & 0x03),
                                       rssi: -50, data: data, isExtended: true, sid: (control >> 2) & 1)
        if !legacy {
            boundaries[key].append(history[key].count)
            history[key] += Array(data)
        }
        var handed = 0
        decoder.decode(report: report, timestamp: now) { heard in
            handed += 1
            let out = Array(heard.report.data)
            invariant(heard.report.dataStatus == 0, "handed on with Data_Status \(heard.report.dataStatus)")
            invariant(out.count <= AdvertisementReassembly.maxLength, "\(out.count) bytes handed on")
            if legacy || status == 0 && out == Array(data) { return }
            invariant(status == 0 || status == 2, "handed on at Data_Status \(status)")
            let h = history[key]
            let fits = boundaries[key].contains { b in
                b + out.count <= h.count && Array(h[b..<(b + out.count)]) == out && (status == 2 || b + out.count == h.count)
            }
            invariant(fits, "handed on \(hex(out)), not this advertiser's fragments \(hex(h))")
            if status == 2 {
                out.withUnsafeBytes { invariant(AdvertisementReassembly.wholePrefix($0) == out.count, "a cut structure handed on") }
            }
        }
        invariant(handed <= 1, "\(handed) advertisements from one report")
        if !legacy && status != 1 { history[key] = []; boundaries[key] = [] }
        reports += 1
        invariant(decoder.reassembly.openChains <= capacity, "\(decoder.reassembly.openChains) chains in \(capacity) buffers")
        invariant(decoder.tally.reports == reports, "reports \(decoder.tally.reports), fed \(reports)")
    }
    // Silence past the deadline, then one new chain: every old one expires.
    let one: [UInt8] = [0x02, 0x01, 0x06]
    one.withUnsafeBytes { data in
        let report = AdvertisingReport(eventType: 0x20, addressType: 0, address: 0xAB, rssi: -50, data: data, isExtended: true, sid: 9)
        decoder.decode(report: report, timestamp: now + 10_000_000) { _ in invariant(false, "a first fragment was handed on") }
    }
    invariant(decoder.reassembly.openChains == min(1, capacity), "\(decoder.reassembly.openChains) chains open after the deadline")
    let known: Set<String> = ["ext-adv-truncated", "ext-adv-data-status-reserved", "ext-adv-pool-full", "ext-adv-chain-expired",
                              "ext-adv-chain-too-long", "ad-overlong", "ad-zero-length", "truncated", "bad-length",
                              "trailing-bytes", "unsupported"]
    for d in decoder.tally.drops.sorted where !known.contains(d.reason) && !d.reason.hasPrefix("beacon") && !d.reason.hasPrefix("continuity") {
        invariant(false, "a drop under \(d.reason)")
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
