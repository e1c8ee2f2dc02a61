// Fuzz target: the sighting batch decoder (docs/protocol.md §6). The input is the MQTT payload
// on `<prefix>/rooms/<gateway>`, byte for byte.
// Invariants:
//   * every error names a byte inside the input, and the rule the doc gives it: `truncated`
//     only where the header or the tail is short (need ≥ 1), `trailing` reaching the end
//     exactly, `unsupported` at 0, `badLength` at 17, `batch-since` at 1, `batch-n` at 9,
//     `batch-rssi` at a record's RSSI byte;
//   * what decodes fills the input exactly (19 + 7 × count bytes, 1 ≤ count ≤ 4096), has
//     since ≥ 0, RSSIs in −127…+20 or none, device ids within 48 bits, and counters n + i
//     that do not wrap;
//   * re-encoding it with `SightingBatchWriter` into a buffer of exactly its size gives the
//     same bytes (the format has one spelling);
//   * every cut before the end is refused (a batch never decodes from a prefix of one).
import BatonWire
import FuzzSupport

func check(_ bytes: UnsafeRawBufferPointer) {
    let n = bytes.count
    let batch: SightingBatch
    do {
        batch = try SightingBatch.decode(bytes)
    } catch {
        checkError(error, bytes: bytes)
        return
    }
    invariant(batch.count >= 1 && batch.count <= SightingBatch.maxRecords, "count \(batch.count)")
    invariant(n == SightingBatch.encodedCount(records: batch.count), "\(n) bytes hold \(batch.count) records")
    invariant(batch.since >= 0, "since \(batch.since)")
    invariant(!batch.n.addingReportingOverflow(UInt64(batch.count - 1)).overflow, "counter wraps")

    var out = [UInt8](repeating: 0xA5, count: n)
    out.withUnsafeMutableBytes { raw in
        do {
            var w = try SightingBatchWriter(raw, since: batch.since, n: batch.n)
            for i in 0 ..< batch.count {
                let r = batch[i]
                invariant(r.device <= SightingBatch.deviceMask, "device past 48 bits")
                if let rssi = r.rssi { invariant(Sighting.rssiRange.contains(rssi), "rssi \(rssi)") }
                let s = batch.sighting(i)
                invariant(s.rssi == r.rssi && s.since == batch.since && s.n == batch.n &+ UInt64(i), "sighting \(i)")
                try w.append(device: r.device, rssi: r.rssi)
            }
            invariant(w.isFull || w.count < SightingBatch.maxRecords, "full writer")
            let again = w.finish()
            invariant(again.elementsEqual(bytes), "re-encoded \(hex(again)) differs from \(hex(bytes))")
        } catch {
            invariant(false, "re-encoding into \(n) bytes threw \(error)")
        }
    }

    for cut in Set([0, n / 2, n - 1]) {
        let prefix = UnsafeRawBufferPointer(rebasing: bytes[..<cut])
        invariant((try? SightingBatch.decode(prefix)) == nil, "a \(cut)-byte prefix decoded")
    }
}

func checkError(_ e: WireError, bytes: UnsafeRawBufferPointer) {
    let count = bytes.count
    switch e {
    case .truncated(let at, let need):
        invariant((at == 0 && count == 0) || at == 1 || at == SightingBatch.headerCount, "\(e) in \(count) bytes")
        invariant(need >= 1 && at <= count, "\(e) in \(count) bytes")
    case .trailing(let at, let trailing):
        invariant(at >= SightingBatch.encodedCount(records: 1) && trailing > 0 && at + trailing == count, "\(e) in \(count) bytes")
    case .unsupported(let at, let value):
        invariant(at == 0 && count >= 1 && value == UInt64(bytes[0]) && value != 1, "\(e)")
    case .badLength(let at, let length):
        invariant(at == 17 && (length == 0 || length > SightingBatch.maxRecords), "\(e)")
    case .malformed(let at, let reason):
        if reason == .batchSince {
            invariant(at == 1 && bytes[8] >= 0x80, "\(e)")
        } else if reason == .batchCounter {
            invariant(at == 9, "\(e)")
        } else if reason == .batchRSSI {
            invariant(at >= SightingBatch.headerCount && at < count
                      && (at - SightingBatch.headerCount) % SightingBatch.recordCount == 6, "\(e) in \(count) bytes")
            let b = bytes[at]
            invariant(b != 0x7F && (b == 0x80 || (b >= 0x15 && b < 0x7F)), "\(e): byte \(b) is a valid RSSI")
        } else {
            invariant(false, "unexpected reason \(e)")
        }
    case .noRoom:
        invariant(false, "the decoder threw \(e)")
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
