// HCI LE Meta events as a controller sends them, for the generator and (later) the virtual
// controller. Layouts: Core 5.4, Vol 4, Part E, §7.7.65.2 (LE Advertising Report) and
// §7.7.65.13 (LE Extended Advertising Report). Every controller, BlueZ's monitor/packet.c,
// Zephyr's scan.c and Wireshark lay the legacy event out report by report
// (type, address type, address, length, data, RSSI), and so do we.
import BatonWire

public enum AdvertisingEvents {
    public static let leMetaEventCode: UInt8 = 0x3E
    public static let legacySubevent: UInt8 = 0x02
    public static let extendedSubevent: UInt8 = 0x0D
    /// HCI event parameters are at most 255 bytes.
    public static let maxParameters = 255

    /// Legacy PDU types (Event_Type): ADV_IND 0x00, ADV_NONCONN_IND 0x03.
    public static func legacyEventType(_ kind: SimulatedDevice.Kind) -> UInt8 {
        if case .apple = kind { return 0x00 }
        return 0x03
    }

    /// Size one report takes in its event.
    public static func reportSize(_ r: GeneratedReport) -> Int {
        r.extended ? 24 + r.data.count : 10 + r.data.count
    }

    /// One LE Meta event (without the H4 indicator) carrying `reports`, all legacy or all
    /// extended; the caller keeps the parameters within 255 bytes.
    public static func event(_ reports: ArraySlice<GeneratedReport>) -> [UInt8] {
        precondition(!reports.isEmpty)
        let extended = reports.first!.extended
        precondition(reports.allSatisfy { $0.extended == extended })
        let paramLength = 2 + reports.reduce(0) { $0 + reportSize($1) }
        precondition(paramLength <= maxParameters, "reports exceed one HCI event")
        var out: [UInt8] = [leMetaEventCode, UInt8(paramLength), extended ? extendedSubevent : legacySubevent,
                            UInt8(reports.count)]
        out.reserveCapacity(2 + paramLength)
        for r in reports {
            if extended {
                // Event_Type: extended, non-connectable, non-scannable, with the report's
                // Data_Status in bits 5–6 (§7.7.65.13).
                out += [(r.dataStatus & 0x3) << 5, 0x00, r.addressType]
                out += address(r.address)
                // Primary PHY LE 1M, secondary LE 2M, SID 0, TX power not available (127),
                // RSSI, no periodic advertising, no direct address.
                out += [0x01, 0x02, 0x00, 0x7F, UInt8(bitPattern: r.rssi), 0x00, 0x00, 0x00]
                out += [UInt8](repeating: 0, count: 6)
                out.append(UInt8(r.data.count))
                out += r.data
            } else {
                out += [r.legacyEventType ?? legacyEventType(r.kind), r.addressType]
                out += address(r.address)
                out.append(UInt8(r.data.count))
                out += r.data
                out.append(UInt8(bitPattern: r.rssi))
            }
        }
        return out
    }

    /// §7.7.65.13: at most 229 bytes of Data per extended report.
    public static let maxExtendedData = 229

    /// An extended advertisement as the controller reports it: one report if it fits 229
    /// bytes, else a chain, every report but the last with Data_Status 1 (§7.7.65.13).
    public static func fragments(_ r: GeneratedReport) -> [GeneratedReport] {
        guard r.extended, r.data.count > maxExtendedData else { return [r] }
        var out: [GeneratedReport] = []
        var at = 0
        while at < r.data.count {
            var f = r
            let end = min(at + maxExtendedData, r.data.count)
            f.data = Array(r.data[at..<end])
            f.dataStatus = end == r.data.count ? r.dataStatus : 1
            out.append(f)
            at = end
        }
        return out
    }

    /// A BD_ADDR on the wire: least significant byte first.
    static func address(_ a: UInt64) -> [UInt8] {
        (0..<6).map { UInt8(truncatingIfNeeded: a >> (8 * $0)) }
    }
}
