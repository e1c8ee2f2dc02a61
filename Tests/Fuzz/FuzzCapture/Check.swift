// Fuzz target: `CaptureReader` (docs/captures.md) over the whole input as a capture file:
// btsnoop 1001/1002/2001, pcap and pcapng with link types 187, 201, 254, 256, 272.
// Invariants:
//   * a header error names a byte inside the file; otherwise the format is the one its first
//     four bytes name;
//   * records come in file order: offsets strictly increase, lie past the file header and
//     inside the file, and there are at most count / 16 of them (the smallest records are a
//     pcap record header and a pcapng Simple Packet Block, 16 bytes each);
//   * every borrowed slice (HCI packet, LL PDU, other, unsupported) lies inside the file,
//     after its record's offset; a `.malformed` record's error names a byte in the file at or
//     after its record;
//   * after a throw, and after nil, `next()` returns nil (without throwing) from then on;
//   * `stats` counts exactly the records yielded, per kind;
//   * btsnoop yields no link-layer or unsupported records, pcap no unsupported ones;
//   * every HCI event goes through `HCIEvent.forEachAdvertisingReport` and every link-layer
//     record through `advertisingReport()` without trapping, reports' data inside the packet
//     or PDU, and each report's data through `AdvertisementContent.decode`;
//   * for a file that reads without error, the same file cut at an input-chosen length yields
//     a prefix of the same records (every record that ended before the cut among them) and
//     then nothing or `.truncated` at or before the cut.
import BatonHCI
import BatonWire
import FuzzSupport

/// A record reduced to comparable facts: slices as offsets into the file.
struct Seen: Equatable {
    var offset: Int
    var timestamp: Int64
    var captured: Int
    var original: Int
    var kind: String
    var slice: Range<Int>?
    var error: WireError?
}

struct Read {
    var records: [Seen] = []
    var error: WireError?
    var headerError: WireError?
}

func check(_ file: UnsafeRawBufferPointer) {
    let full = read(file)
    guard full.headerError == nil, full.error == nil, file.count > 0 else { return }
    // Cut where the input says (a cheap hash), strictly inside the file.
    let cut = file.reduce(file.count) { ($0 &* 31 &+ Int($1)) & 0x7FFF_FFFF } % file.count
    let part = read(UnsafeRawBufferPointer(rebasing: file[..<cut]))
    if let e = part.headerError ?? part.error {
        guard case .truncated(let at, let need) = e, at <= cut, need > 0 else {
            invariant(false, "cut at \(cut): \(e), not truncated")
            return
        }
    }
    invariant(part.records.count <= full.records.count && part.records == Array(full.records.prefix(part.records.count)),
              "cut at \(cut) changed the records before it")
    for (i, r) in full.records.enumerated() {
        let end = i + 1 < full.records.count ? full.records[i + 1].offset : file.count
        if end <= cut { invariant(i < part.records.count, "cut at \(cut) lost record \(i) at \(r.offset)") }
    }
}

func read(_ file: UnsafeRawBufferPointer) -> Read {
    var out = Read()
    var reader: CaptureReader
    do {
        reader = try CaptureReader(file)
    } catch {
        checkErrorOffset(error, count: file.count, from: 0)
        out.headerError = error
        return out
    }
    let headerSize: Int
    let magic = (0 ..< 4).reduce(UInt32(0)) { $0 << 8 | UInt32(file[$1]) }
    switch reader.format {
    case .btsnoop: headerSize = 16; invariant(magic == 0x6274_736E, "btsnoop from \(magic)")
    case .pcap: headerSize = 24; invariant([0xA1B2_C3D4, 0xD4C3_B2A1, 0xA1B2_3C4D, 0x4D3C_B2A1].contains(magic), "pcap from \(magic)")
    // The smallest Section Header Block: 12 bytes of framing, byte-order magic and versions.
    case .pcapng: headerSize = 20; invariant(magic == 0x0A0D_0D0A, "pcapng from \(magic)")
    }

    var stats = CaptureStats()
    var last = -1
    while true {
        let record: CaptureRecord?
        do {
            record = try reader.next()
        } catch {
            checkErrorOffset(error, count: file.count, from: max(last, 0))
            out.error = error
            break
        }
        guard let record else { break }
        stats.count(record)
        invariant(record.offset > last, "record at \(record.offset) after one at \(last)")
        invariant(record.offset >= headerSize && record.offset < file.count, "record offset \(record.offset) outside the file")
        last = record.offset
        invariant(stats.records <= file.count / 16, "\(stats.records) records from \(file.count) bytes")
        out.records.append(checkRecord(record, in: file, format: reader.format))
    }
    // Done for good: nil from now on, never another throw.
    for _ in 0 ..< 2 {
        do {
            let again = try reader.next()
            invariant(again == nil, "a record after the end or after an error")
        } catch {
            invariant(false, "threw again after the end: \(error)")
        }
    }
    invariant(reader.stats == stats, "stats \(reader.stats) != counted \(stats)")
    return out
}

func checkRecord(_ r: CaptureRecord, in file: UnsafeRawBufferPointer, format: CaptureFormat) -> Seen {
    var seen = Seen(offset: r.offset, timestamp: r.timestamp, captured: r.capturedLength,
                    original: r.originalLength, kind: "")
    func place(_ slice: UnsafeRawBufferPointer, _ what: String) -> Range<Int> {
        let at = offset(of: slice, in: file)
        invariant(at != nil, "\(what) at record \(r.offset) lies outside the file")
        // Proof: checked on the line above.
        let lower = at!
        invariant(lower > r.offset, "\(what) at \(lower) starts before its record at \(r.offset)")
        return lower ..< lower + slice.count
    }
    switch r.kind {
    case .hci(let h):
        seen.kind = "hci \(h.type) \(h.direction) \(h.adapterIndex)"
        seen.slice = place(h.bytes, "HCI packet")
        invariant(seen.slice!.count <= r.capturedLength, "an HCI packet longer than its record")
        if h.type == .event { checkEvent(h.bytes) }
    case .linkLayer(let ll):
        if case .btsnoop = format { invariant(false, "a link-layer record from btsnoop") }
        seen.kind = "ll \(ll.channel) \(String(describing: ll.rssi)) \(ll.accessAddress) \(ll.phy) \(ll.crc)"
        seen.slice = place(ll.pdu, "LL PDU")
        invariant(ll.channel <= 39 && (1 ... 3).contains(ll.phy), "channel \(ll.channel) PHY \(ll.phy)")
        invariant(ll.pdu.count >= 2, "an LL PDU without its header")
        checkLinkLayer(ll)
    case .other(let opcode, let index, let bytes):
        seen.kind = "other \(opcode) \(index)"
        seen.slice = place(bytes, "other record")
    case .unsupported(let linkType, let bytes):
        if case .pcapng = format {} else { invariant(false, "an unsupported record outside pcapng") }
        invariant(!LinkType.isSupported(linkType), "link type \(linkType) is supported yet reported unsupported")
        seen.kind = "unsupported \(linkType)"
        seen.slice = place(bytes, "unsupported record")
    case .malformed(let e):
        seen.kind = "malformed"
        seen.error = e
        checkErrorOffset(e, count: file.count, from: r.offset)
    }
    if case .malformed = r.kind {} else {
        invariant(r.capturedLength >= 0 && r.offset + r.capturedLength <= file.count, "captured length past the file")
    }
    return seen
}

func checkEvent(_ event: UnsafeRawBufferPointer) {
    var calls = 0
    do {
        let count = try HCIEvent.forEachAdvertisingReport(inEvent: event) { report in
            calls += 1
            invariant(offset(of: report.data, in: event) != nil, "report data outside its event")
            decodeData(report.data)
        }
        invariant(count == calls, "\(count) reports returned after \(calls) calls")
    } catch {
        invariant(calls == 0, "body called before \(error)")
        checkErrorOffset(error, count: event.count, from: 0)
    }
}

func checkLinkLayer(_ ll: LinkLayerRecord) {
    do {
        guard let report = try ll.advertisingReport() else { return }
        invariant(ll.isAdvertising && ll.crc == .ok, "a report from a PDU that is not a good advertising PDU")
        invariant(offset(of: report.data, in: ll.pdu) != nil, "report data outside its PDU")
        invariant(report.data.count <= HCIEvent.legacyMaxData && !report.isExtended && report.isLegacyPDU,
                  "an LL report that is not a legacy report")
        decodeData(report.data)
    } catch {
        checkErrorOffset(error, count: ll.pdu.count, from: 0)
    }
}

func decodeData(_ data: UnsafeRawBufferPointer) {
    if let content = try? AdvertisementContent.decode(data) {
        var messages = content.continuityMessages
        while let m = messages.next() { _ = try? m.decode() }
    }
}


/// An error's byte must lie in `from…count` (`count` itself for "ran out here").
func checkErrorOffset(_ e: WireError, count: Int, from: Int) {
    switch e {
    case .truncated(let at, let need):
        invariant(at >= from && at <= count && need > 0, "\(e) in \(count) bytes, record at \(from)")
    case .badLength(let at, _), .unsupported(let at, _), .malformed(let at, _):
        invariant(at >= from && at <= count, "\(e) outside \(from)…\(count)")
    case .trailing(let at, let trailing):
        invariant(at >= from && trailing > 0 && at + trailing <= count, "\(e) in \(count) bytes")
    case .noRoom:
        invariant(false, "a reader threw \(e)")
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    check(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}
