// Writes generated reports as a capture file, the way a controller and a snoop log would:
// LE Meta events of 1–3 reports (all legacy or all extended), one btsnoop record each.
import BatonWire
import BatonHCI

public enum CaptureDatalink: Sendable {
    /// btsnoop 1002: Android's HCI snoop log (H4 indicator before each packet).
    case androidH4
    /// btsnoop 2001: the Linux monitor format `btmon -w` writes, with a New Index record.
    case btmon
}

extension CaptureGenerator {
    /// `count` reports, then the rest of any chain still open (`longAdvertisements`), (then, if `invalidateAtEnd`, one invalidating beacon per Baton
    /// device) as a btsnoop file. Returns the file and every report in it, in order.
    public mutating func capture(reports count: Int, datalink: CaptureDatalink = .androidH4,
                                 invalidateAtEnd: Bool = false) -> (file: [UInt8], reports: [GeneratedReport]) {
        var reports: [GeneratedReport] = []
        reports.reserveCapacity(count + devices.count)
        for _ in 0..<count { reports.append(next()) }
        // Long advertisements: the chains still open end, so the capture holds whole ones.
        reports += finishChains()
        if invalidateAtEnd { reports += invalidateAll() }

        var file: [UInt8] = []
        file.reserveCapacity(reports.count * 70 + 64)
        var rng = SplitMix64(seed: UInt64(truncatingIfNeeded: count) &+ 0x5EED)
        append(&file) { w in
            try BTSnoop.writeHeader(datalink: datalink == .btmon ? BTSnoop.datalinkMonitor : BTSnoop.datalinkH4, into: &w)
        }
        if datalink == .btmon, let first = reports.first {
            // btmon starts with New Index: type 0 (primary), bus 1 (USB), address, name "hci0"
            // (BlueZ src/shared/btsnoop.h, struct btsnoop_opcode_new_index).
            let newIndex: [UInt8] = [0x00, 0x01, 0x00, 0x00, 0x00, 0xAA, 0x00, 0x00,
                                     0x68, 0x63, 0x69, 0x30, 0x00, 0x00, 0x00, 0x00]
            append(&file) { w in
                try newIndex.withUnsafeBytes { raw in
                    try BTSnoop.writeMonitorRecord(timestamp: first.timestamp, index: 0, opcode: LinuxMonitor.newIndex,
                                                   packet: raw, into: &w)
                }
            }
        }
        var i = 0
        while i < reports.count {
            // Pack 1–3 consecutive reports of the same kind into one event, within 255 bytes.
            let want = 1 + Int(rng.next() % 3)
            var end = i + 1
            var size = 2 + AdvertisingEvents.reportSize(reports[i])
            while end < reports.count, end - i < want, reports[end].extended == reports[i].extended,
                  size + AdvertisingEvents.reportSize(reports[end]) <= AdvertisingEvents.maxParameters {
                size += AdvertisingEvents.reportSize(reports[end])
                end += 1
            }
            let event = AdvertisingEvents.event(reports[i..<end])
            let t = reports[end - 1].timestamp
            append(&file) { w in
                try event.withUnsafeBytes { raw in
                    switch datalink {
                    case .androidH4:
                        try BTSnoop.writeH4Record(timestamp: t, type: .event, direction: .controllerToHost, packet: raw, into: &w)
                    case .btmon:
                        try BTSnoop.writeMonitorRecord(timestamp: t, index: 0, type: .event, direction: .controllerToHost,
                                                       packet: raw, into: &w)
                    }
                }
            }
            i = end
        }
        return (file, reports)
    }

    /// Appends what `body` writes (at most 512 bytes: one record) to `file`.
    private func append(_ file: inout [UInt8], _ body: (inout ByteWriter) throws -> Void) {
        var chunk = [UInt8](repeating: 0, count: 512)
        let n = chunk.withUnsafeMutableBytes { raw in
            var w = ByteWriter(raw)
            // Proof: a header is 16 bytes and a record 24 + 1 + 257 at most.
            do { try body(&w) } catch { preconditionFailure("a record fits 512 bytes: \(error)") }
            return w.count
        }
        file += chunk[..<n]
    }
}
