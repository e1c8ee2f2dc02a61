// LE Meta events carrying advertising reports (Core 5.4, Vol 4, Part E, §7.7.65):
//   §7.7.65.2  HCI_LE_Advertising_Report          (subevent 0x02, legacy PDUs)
//   §7.7.65.13 HCI_LE_Extended_Advertising_Report (subevent 0x0D)
// Validate the whole event first (every report's fixed part, then its tail, lengths adding up
// exactly: NimBLE's ble_hs_hci_evt.c, Zephyr's scan.c), then decode and hand each report to
// the caller. Reports borrow their data from the event; nothing is allocated.
//
// Layout of the legacy event. §7.7.65.2 lists its parameters as arrays (Event_Type[i],
// Address_Type[i], …, RSSI[i]). Core 4.x's wording was read by some as "all Event_Types, then
// all Address_Types, …"; every controller and host we know of sends and parses report after
// report, i.e. element-major, with RSSI after the data: BlueZ monitor/packet.c
// (le_adv_report_evt: `rssi = evt->data + evt->data_len`, next report right after),
// Linux net/bluetooth/hci_event.c (hci_le_adv_report_evt), BTstack hci.c, Zephyr scan.c.
// Baton follows the controllers: report after report is the only layout this parser accepts
// (with one report, both readings are the same bytes).
public import BatonWire

extension Malformed {
    /// Num_Reports is 0 (§7.7.65.2 / §7.7.65.13 allow 0x01…).
    public static let advNoReports = Malformed("adv-no-reports")
    /// A legacy report's Data_Length above 31 (§7.7.65.2: 0x00 to 0x1F).
    public static let advDataTooLong = Malformed("adv-data-too-long")
    /// An extended report's Data_Length above 229 (§7.7.65.13: 0 to 229).
    public static let extAdvDataTooLong = Malformed("ext-adv-data-too-long")
    /// A legacy Event_Type outside 0x00…0x04 (§7.7.65.2).
    public static let advEventTypeReserved = Malformed("adv-event-type-reserved")
}

/// HCI event codes and LE subevent codes Baton reads.
public enum HCIEventCode {
    /// Core 5.4, Vol 4, Part E, §7.7.65.
    public static let leMeta: UInt8 = 0x3E
}

public enum LESubevent {
    public static let advertisingReport: UInt8 = 0x02
    public static let extendedAdvertisingReport: UInt8 = 0x0D
}

/// One advertising report, from either report event or from a sniffed LL PDU.
///
/// `eventType` is always in the extended form of §7.7.65.13 (bit 0 connectable, 1 scannable,
/// 2 directed, 3 scan response, 4 legacy PDU, 5–6 data status), so downstream code asks one set
/// of questions. A legacy report's type maps per the §7.7.65.13 table for legacy PDUs:
///   ADV_IND 0x00 → 0x13, ADV_DIRECT_IND 0x01 → 0x15, ADV_SCAN_IND 0x02 → 0x12,
///   ADV_NONCONN_IND 0x03 → 0x10, SCAN_RSP 0x04 → 0x1A.
/// A legacy SCAN_RSP does not say whether it answered ADV_IND (0x1B) or ADV_SCAN_IND (0x1A);
/// we claim the weaker 0x1A (scannable, not connectable). The raw legacy value stays in
/// `legacyEventType`.
public struct AdvertisingReport {
    public var eventType: UInt16
    /// The legacy Event_Type as received (§7.7.65.2), or nil for extended reports.
    public var legacyEventType: UInt8?
    /// 0 public, 1 random, 2 public identity, 3 random (static) identity, 0xFF anonymous.
    public var addressType: UInt8
    /// 48-bit address as a number: the on-air little-endian bytes, so `address >> 40` is the
    /// most significant octet, printed first (see `addressString`).
    public var address: UInt64
    /// dBm; 127 means not available.
    public var rssi: Int8
    /// Advertising or scan response data, borrowed from the event or capture.
    public var data: UnsafeRawBufferPointer
    public var isExtended: Bool
    /// HCI PHY numbering: 1 LE 1M, 2 LE 2M, 3 LE Coded; 0 = no secondary PHY.
    public var primaryPHY: UInt8
    public var secondaryPHY: UInt8
    /// Advertising_SID, 0xFF = none.
    public var sid: UInt8
    /// dBm, 127 = not available.
    public var txPower: Int8
    /// Periodic_Advertising_Interval in units of 1.25 ms, 0 = none.
    public var periodicInterval: UInt16
    /// Meaningful when `isDirected`: the target's address type and address.
    public var directAddressType: UInt8
    public var directAddress: UInt64

    public init(eventType: UInt16, legacyEventType: UInt8? = nil, addressType: UInt8, address: UInt64,
                rssi: Int8, data: UnsafeRawBufferPointer, isExtended: Bool,
                primaryPHY: UInt8 = 1, secondaryPHY: UInt8 = 0, sid: UInt8 = 0xFF, txPower: Int8 = 127,
                periodicInterval: UInt16 = 0, directAddressType: UInt8 = 0, directAddress: UInt64 = 0) {
        self.eventType = eventType; self.legacyEventType = legacyEventType
        self.addressType = addressType; self.address = address; self.rssi = rssi; self.data = data
        self.isExtended = isExtended; self.primaryPHY = primaryPHY; self.secondaryPHY = secondaryPHY
        self.sid = sid; self.txPower = txPower; self.periodicInterval = periodicInterval
        self.directAddressType = directAddressType; self.directAddress = directAddress
    }

    public static let rssiNotAvailable: Int8 = 127

    public var isConnectable: Bool { eventType & 0x01 != 0 }
    public var isScannable: Bool { eventType & 0x02 != 0 }
    public var isDirected: Bool { eventType & 0x04 != 0 }
    public var isScanResponse: Bool { eventType & 0x08 != 0 }
    public var isLegacyPDU: Bool { eventType & 0x10 != 0 }
    /// 0 complete, 1 incomplete (more to come), 2 incomplete (truncated), 3 reserved.
    public var dataStatus: UInt8 { UInt8(truncatingIfNeeded: (eventType >> 5) & 0x3) }

    /// Maps a legacy Event_Type (§7.7.65.2) to the extended bits (§7.7.65.13); nil if reserved.
    @inlinable
    public static func extendedEventType(legacy: UInt8) -> UInt16? {
        switch legacy {
        case 0x00: 0x13  // ADV_IND: legacy, scannable, connectable
        case 0x01: 0x15  // ADV_DIRECT_IND: legacy, directed, connectable
        case 0x02: 0x12  // ADV_SCAN_IND: legacy, scannable
        case 0x03: 0x10  // ADV_NONCONN_IND: legacy
        case 0x04: 0x1A  // SCAN_RSP: legacy, scan response, scannable (see type comment)
        default: nil
        }
    }

    /// "AA:BB:CC:DD:EE:FF", most significant octet first. Allocates: for logs and display only.
    public static func addressString(_ address: UInt64) -> String {
        let hex: [Character] = ["0","1","2","3","4","5","6","7","8","9","A","B","C","D","E","F"]
        var s = ""
        s.reserveCapacity(17)
        for i in stride(from: 5, through: 0, by: -1) {
            let b = Int((address >> (UInt64(i) * 8)) & 0xFF)
            s.append(hex[b >> 4]); s.append(hex[b & 0xF])
            if i > 0 { s.append(":") }
        }
        return s
    }

    public var addressString: String { Self.addressString(address) }
}

extension ByteReader {
    /// A 48-bit address, little-endian on the wire (Core 5.4, Vol 6, Part B, §1.3).
    // Always inlined: it is read once per report in both report loops below.
    @inlinable @inline(__always)
    mutating func readAddress48() throws(WireError) -> UInt64 {
        let lo = UInt64(try readU32LE())
        let hi = UInt64(try readU16LE())
        return lo | hi << 32
    }
}

public enum HCIEvent {
    /// Fixed part of one legacy report: Event_Type, Address_Type, Address, Data_Length — then
    /// Data, then RSSI (§7.7.65.2).
    public static let legacyReportFixedSize = 1 + 1 + 6 + 1 + 1
    /// Fixed part of one extended report up to and including Data_Length (§7.7.65.13).
    public static let extendedReportFixedSize = 2 + 1 + 6 + 1 + 1 + 1 + 1 + 1 + 2 + 1 + 6 + 1
    public static let legacyMaxData = 31
    public static let extendedMaxData = 229

    /// Calls `body` once per advertising report in `event` and returns how many there were.
    ///
    /// `event` is an HCI event packet without its H4 indicator: Event_Code, Parameter_Total_Length,
    /// parameters (Core 5.4, Vol 4, Part E, §5.4.4). Events that are not LE Advertising Report or
    /// LE Extended Advertising Report return 0 without error. The whole event is validated before
    /// the first call: on error `body` was not called. Offsets in errors are from `event`'s start.
    public static func forEachAdvertisingReport(
        inEvent event: UnsafeRawBufferPointer, _ body: (AdvertisingReport) -> Void
    ) throws(WireError) -> Int {
        var r = ByteReader(event)
        let code = try r.readU8()
        let length = Int(try r.readU8())
        // Parameter_Total_Length must cover exactly the rest of the packet.
        if length > r.remaining { throw .truncated(at: r.offset, need: length &- r.remaining) }
        if length < r.remaining { throw .trailing(at: r.offset &+ length, count: r.remaining &- length) }
        guard code == HCIEventCode.leMeta else { return 0 }
        let subevent = try r.readU8()
        switch subevent {
        case LESubevent.advertisingReport:
            return try legacyReports(r, body)
        case LESubevent.extendedAdvertisingReport:
            return try extendedReports(r, body)
        default:
            return 0
        }
    }

    static func legacyReports(_ start: ByteReader, _ body: (AdvertisingReport) -> Void) throws(WireError) -> Int {
        var r = start
        let countAt = r.offset
        let count = Int(try r.readU8())
        guard count > 0 else { throw .malformed(at: countAt, .advNoReports) }
        // Pass 1: every report's fixed part, then its tail; lengths must add up exactly.
        let first = r
        for _ in 0 ..< count {
            let typeAt = r.offset
            try r.require(legacyReportFixedSize &- 1)  // up to and including Data_Length
            if AdvertisingReport.extendedEventType(legacy: try r.peekU8()) == nil {
                throw .malformed(at: typeAt, .advEventTypeReserved)
            }
            try r.skip(8)
            let lengthAt = r.offset
            let dataLength = Int(try r.readU8())
            guard dataLength <= legacyMaxData else { throw .malformed(at: lengthAt, .advDataTooLong) }
            try r.skip(dataLength &+ 1)  // Data, RSSI
        }
        try r.requireEnd()
        // Pass 2: decode. Proof: pass 1 showed every read below is in bounds, so `try` cannot throw.
        r = first
        for _ in 0 ..< count {
            let legacy = try r.readU8()
            let addressType = try r.readU8()
            let address = try r.readAddress48()
            let dataLength = Int(try r.readU8())
            let data = try r.readBytes(dataLength)
            let rssi = try r.readI8()
            body(AdvertisingReport(
                eventType: AdvertisingReport.extendedEventType(legacy: legacy) ?? 0,
                legacyEventType: legacy, addressType: addressType, address: address, rssi: rssi,
                data: data, isExtended: false))
        }
        return count
    }

    static func extendedReports(_ start: ByteReader, _ body: (AdvertisingReport) -> Void) throws(WireError) -> Int {
        var r = start
        let countAt = r.offset
        let count = Int(try r.readU8())
        guard count > 0 else { throw .malformed(at: countAt, .advNoReports) }
        let first = r
        for _ in 0 ..< count {
            try r.require(extendedReportFixedSize)
            try r.skip(extendedReportFixedSize &- 1)
            let lengthAt = r.offset
            let dataLength = Int(try r.readU8())
            guard dataLength <= extendedMaxData else { throw .malformed(at: lengthAt, .extAdvDataTooLong) }
            try r.skip(dataLength)
        }
        try r.requireEnd()
        r = first
        for _ in 0 ..< count {
            let eventType = try r.readU16LE()
            let addressType = try r.readU8()
            let address = try r.readAddress48()
            let primaryPHY = try r.readU8()
            let secondaryPHY = try r.readU8()
            let sid = try r.readU8()
            let txPower = try r.readI8()
            let rssi = try r.readI8()
            let interval = try r.readU16LE()
            let directType = try r.readU8()
            let direct = try r.readAddress48()
            let dataLength = Int(try r.readU8())
            let data = try r.readBytes(dataLength)
            body(AdvertisingReport(
                eventType: eventType, legacyEventType: nil, addressType: addressType, address: address,
                rssi: rssi, data: data, isExtended: true, primaryPHY: primaryPHY,
                secondaryPHY: secondaryPHY, sid: sid, txPower: txPower, periodicInterval: interval,
                directAddressType: directType, directAddress: direct))
        }
        return count
    }
}
