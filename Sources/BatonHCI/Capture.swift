// One reader for every capture format Baton replays (docs/captures.md has the table): it sniffs
// the format from the first bytes, then yields records one at a time, borrowing each packet
// from the file's bytes (the caller keeps them alive: mmap or [UInt8] + withUnsafeBytes).
//
// Two kinds of damage, two outcomes:
//   * The container is broken (a record or block runs past the end of the file, a length field
//     is impossible, a pcapng trailer disagrees): the records before it come out, then `next()`
//     throws a `WireError` naming the file offset, then returns nil. Nothing after the damage
//     can be framed reliably.
//   * One record's contents are bad but its framing is intact (a pseudo-header too short, an
//     unknown H4 indicator, an LL length that disagrees with the record): the record comes out
//     as `.malformed(error)` with the file offset in the error, is counted in `stats.malformed`,
//     and reading goes on.
// Records that are not HCI packets (monitor index/system-note records, Nordic sniffer control
// packets) are `.other`; packets on a pcapng interface of a link type Baton does not read are
// `.unsupported`. Both are counted, neither is an error.
public import BatonWire

extension Malformed {
    /// An LL advertising PDU whose Length field disagrees with its type (Core 5.4, Vol 6, Part B, §2.3).
    public static let llAdvLength = Malformed("ll-adv-length")
}

/// Which side sent an HCI packet.
public enum HCIDirection: Sendable, Equatable {
    case hostToController
    case controllerToHost
    /// The capture does not say (pcap link type 187 for ACL, SCO and ISO data).
    case unknown
}

/// An HCI packet from a capture, borrowed from the file.
public struct HCIRecord {
    public let type: H4PacketType
    public let direction: HCIDirection
    /// The controller index (monitor formats), 0 otherwise.
    public let adapterIndex: UInt16
    /// The packet without its H4 indicator (for an event: code, length, parameters).
    public let bytes: UnsafeRawBufferPointer

    @inlinable
    public init(type: H4PacketType, direction: HCIDirection, adapterIndex: UInt16, bytes: UnsafeRawBufferPointer) {
        self.type = type; self.direction = direction; self.adapterIndex = adapterIndex; self.bytes = bytes
    }
}

/// The result of the LL CRC check.
public enum LinkLayerCRC: Sendable, Equatable {
    /// Baton computed it (advertising access address) or the sniffer checked it, and it matched.
    case ok
    /// It did not match: the PDU is not to be trusted and is not decoded further.
    case bad
    /// Neither Baton nor the sniffer could check it (e.g. a data channel PDU whose CRC init
    /// only the connection knows, and a sniffer that did not say).
    case unchecked
}

/// A link-layer packet from a sniffer capture (link types 256 and 272), borrowed from the file.
public struct LinkLayerRecord {
    /// Channel index 0…39 (37, 38, 39 are the primary advertising channels).
    public let channel: UInt8
    /// dBm, when the sniffer recorded it.
    public let rssi: Int8?
    public let accessAddress: UInt32
    /// HCI PHY numbering: 1 LE 1M, 2 LE 2M, 3 LE Coded.
    public let phy: UInt8
    public let crc: LinkLayerCRC
    /// The PDU: 2-byte header and payload, without access address, CI and CRC.
    public let pdu: UnsafeRawBufferPointer

    public init(channel: UInt8, rssi: Int8?, accessAddress: UInt32, phy: UInt8, crc: LinkLayerCRC,
                pdu: UnsafeRawBufferPointer) {
        self.channel = channel; self.rssi = rssi; self.accessAddress = accessAddress; self.phy = phy
        self.crc = crc; self.pdu = pdu
    }

    /// True for the advertising physical channel's fixed access address.
    public var isAdvertising: Bool { accessAddress == BLELinkLayer.advertisingAccessAddress }

    /// The advertising report this PDU amounts to, so sniffer captures flow into the same
    /// pipeline as HCI reports. Nil unless the PDU is on the advertising access address, its CRC
    /// checked out, and its type is one a scanner reports (see `AdvertisingReport.init(linkLayerPDU:…)`).
    public func advertisingReport() throws(WireError) -> AdvertisingReport? {
        guard isAdvertising, crc == .ok else { return nil }
        return try AdvertisingReport(linkLayerPDU: pdu, rssi: rssi ?? AdvertisingReport.rssiNotAvailable,
                                     phy: phy == 0 ? 1 : phy)
    }
}

/// One record of a capture file.
public struct CaptureRecord {
    public enum Kind {
        case hci(HCIRecord)
        case linkLayer(LinkLayerRecord)
        /// A monitor record that is not an HCI packet, or a sniffer control packet: opcode
        /// (monitor opcode or Nordic packet ID), controller index, payload.
        case other(opcode: UInt16, index: UInt16, bytes: UnsafeRawBufferPointer)
        /// A packet on a pcapng interface whose link type Baton does not read.
        case unsupported(linkType: UInt32, bytes: UnsafeRawBufferPointer)
        /// A record whose framing is intact but whose contents are bad; the error names the
        /// file offset.
        case malformed(WireError)
    }

    /// Microseconds since the Unix epoch.
    public let timestamp: Int64
    /// File offset of the record header (pcapng: of the block).
    public let offset: Int
    /// Bytes of the packet in the file (after any file-level record header).
    public let capturedLength: Int
    /// The packet's length when captured; more than `capturedLength` if the tool cut it.
    public let originalLength: Int
    public let kind: Kind

    public init(timestamp: Int64, offset: Int, capturedLength: Int, originalLength: Int, kind: Kind) {
        self.timestamp = timestamp; self.offset = offset; self.capturedLength = capturedLength
        self.originalLength = originalLength; self.kind = kind
    }

    public var isCut: Bool { capturedLength < originalLength }
}

/// Counts per record kind, for `baton replay` and the stats topic.
public struct CaptureStats: Sendable, Equatable {
    public var records = 0
    public var hci = 0
    public var linkLayer = 0
    public var crcOK = 0
    public var crcBad = 0
    public var crcUnchecked = 0
    public var other = 0
    public var unsupported = 0
    public var malformed = 0

    public init() {}

    public mutating func count(_ record: CaptureRecord) {
        records &+= 1
        switch record.kind {
        case .hci: hci &+= 1
        case .linkLayer(let ll):
            linkLayer &+= 1
            switch ll.crc {
            case .ok: crcOK &+= 1
            case .bad: crcBad &+= 1
            case .unchecked: crcUnchecked &+= 1
            }
        case .other: other &+= 1
        case .unsupported: unsupported &+= 1
        case .malformed: malformed &+= 1
        }
    }
}

public enum CaptureFormat: Sendable, Equatable {
    case btsnoop(datalink: UInt32)
    case pcap(linkType: UInt32, nanoseconds: Bool, bigEndian: Bool)
    case pcapng
}

/// Helpers shared by the per-format readers.
public enum Capture {
    /// Records longer than this are corruption, not packets (Wireshark's
    /// WTAP_MAX_PACKET_SIZE_STANDARD; an H4 packet is at most 1 + 4 + 65535).
    public static let maxRecordLength: UInt32 = 262_144

    /// An H4-framed packet: indicator, then the packet. `direction` applies to data packets;
    /// commands are always host→controller and events controller→host.
    // Always inlined: returned from a call, the Kind enum is written in pieces and read back
    // whole, a store-forwarding stall that was a quarter of the record reader's time.
    @inlinable @inline(__always)
    static func h4Packet(_ r: inout ByteReader, direction: HCIDirection, index: UInt16) throws(WireError) -> CaptureRecord.Kind {
        let at = r.offset
        let indicator = try r.readU8()
        guard let type = H4PacketType(rawValue: indicator) else {
            throw .unsupported(at: at, value: UInt64(indicator))
        }
        let d: HCIDirection = switch type {
        case .command: .hostToController
        case .event: .controllerToHost
        default: direction
        }
        return .hci(HCIRecord(type: type, direction: d, adapterIndex: index, bytes: r.readRest()))
    }
}

/// Reads any supported capture file: btsnoop, pcap or pcapng (format sniffed from the first
/// four bytes), counting what it yields.
public struct CaptureReader {
    public let format: CaptureFormat
    public private(set) var stats = CaptureStats()
    @usableFromInline var btsnoop: BTSnoopReader?
    @usableFromInline var pcap: PCAPReader?
    @usableFromInline var pcapng: PCAPNGReader?

    /// Sniffs the format and reads the file header. Throws for an unknown format
    /// (`.unsupported(at: 0, …)` with the first four bytes), or a bad or truncated header.
    public init(_ bytes: UnsafeRawBufferPointer) throws(WireError) {
        let r = ByteReader(bytes)
        try r.require(4)
        let first = (UInt32(try r.peekU8(at: 0)) << 24) | (UInt32(try r.peekU8(at: 1)) << 16)
            | (UInt32(try r.peekU8(at: 2)) << 8) | UInt32(try r.peekU8(at: 3))
        switch first {
        case 0x6274_736E:  // "btsn"
            let reader = try BTSnoopReader(bytes)
            btsnoop = reader
            format = .btsnoop(datalink: reader.datalink)
        case 0xA1B2_C3D4, 0xD4C3_B2A1, 0xA1B2_3C4D, 0x4D3C_B2A1:
            let reader = try PCAPReader(bytes)
            pcap = reader
            format = .pcap(linkType: reader.linkType, nanoseconds: reader.nanoseconds, bigEndian: reader.bigEndian)
        case PCAPNGReader.sectionHeaderType:
            pcapng = try PCAPNGReader(bytes)
            format = .pcapng
        default:
            throw .unsupported(at: 0, value: UInt64(first))
        }
    }

    /// The next record, or nil at the end (and after an error has been thrown once).
    public mutating func next() throws(WireError) -> CaptureRecord? {
        let record: CaptureRecord?
        if btsnoop != nil {
            record = try btsnoop!.next()
        } else if pcap != nil {
            record = try pcap!.next()
        } else {
            record = try pcapng!.next()
        }
        if let record { stats.count(record) }
        return record
    }
}

extension AdvertisingReport {
    /// Turns a legacy advertising PDU (Core 5.4, Vol 6, Part B, §2.3.1) into the report a
    /// controller would have sent for it. Returns nil for PDU types a scanner does not report
    /// (SCAN_REQ, CONNECT_IND, ADV_EXT_IND and the AUX_* family, reserved). `pdu` is header +
    /// payload; offsets in errors are from its start.
    ///
    ///   header byte 0: PDU_Type (bits 0–3), RFU, ChSel (5), TxAdd (6), RxAdd (7); byte 1: Length
    ///   ADV_IND 0b0000, ADV_NONCONN_IND 0b0010, ADV_SCAN_IND 0b0110: AdvA (6) | AdvData (0–31)
    ///   ADV_DIRECT_IND 0b0001: AdvA (6) | TargetA (6)
    ///   SCAN_RSP 0b0100: AdvA (6) | ScanRspData (0–31)
    public init?(linkLayerPDU pdu: UnsafeRawBufferPointer, rssi: Int8, phy: UInt8 = 1) throws(WireError) {
        var r = ByteReader(pdu)
        let header = try r.readU8()
        let length = Int(try r.readU8())
        if length > r.remaining { throw .truncated(at: r.offset, need: length &- r.remaining) }
        if length < r.remaining { throw .trailing(at: r.offset &+ length, count: r.remaining &- length) }
        let legacy: UInt8
        switch header & 0x0F {
        case 0b0000: legacy = 0x00  // ADV_IND
        case 0b0001: legacy = 0x01  // ADV_DIRECT_IND
        case 0b0110: legacy = 0x02  // ADV_SCAN_IND
        case 0b0010: legacy = 0x03  // ADV_NONCONN_IND
        case 0b0100: legacy = 0x04  // SCAN_RSP
        default: return nil
        }
        guard length >= 6 else { throw .malformed(at: 1, .llAdvLength) }
        let address = try r.readAddress48()
        var directAddress: UInt64 = 0
        var directType: UInt8 = 0
        let data: UnsafeRawBufferPointer
        if legacy == 0x01 {
            guard length == 12 else { throw .malformed(at: 1, .llAdvLength) }
            directAddress = try r.readAddress48()
            directType = header >> 7 & 1
            data = UnsafeRawBufferPointer(rebasing: pdu[pdu.count...])
        } else {
            guard length - 6 <= HCIEvent.legacyMaxData else { throw .malformed(at: 1, .advDataTooLong) }
            data = r.readRest()
        }
        self.init(eventType: AdvertisingReport.extendedEventType(legacy: legacy) ?? 0, legacyEventType: legacy,
                  addressType: header >> 6 & 1, address: address, rssi: rssi, data: data,
                  isExtended: false, primaryPHY: phy, directAddressType: directType,
                  directAddress: directAddress)
    }
}
