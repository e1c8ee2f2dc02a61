// btsnoop files: the format of Symbian's btsnoop (RFC 1761 "snoop" with Bluetooth datalinks),
// as BlueZ writes and reads it (src/shared/btsnoop.h, btsnoop.c) and Wireshark reads it
// (wiretap/btsnoop.c). Everything is big-endian.
//
//   File header (16):  "btsnoop\0" | version u32 = 1 | datalink u32
//   Record (24 + n):   original length u32 | included length u32 | flags u32 |
//                      cumulative drops u32 | timestamp u64 | packet data (included length)
//
// Datalinks read here:
//   1001 HCI (un-encapsulated): flags bit 0 = direction (0 sent, 1 received), bit 1 = 1 for a
//        command or event, 0 for data; the packet has no H4 byte. Data is taken as ACL (SCO and
//        ISO cannot be told apart in this datalink; BlueZ's get_opcode_from_flags does the same).
//   1002 HCI UART (H4), what Android's btsnoop_hci.log holds: the packet starts with its H4
//        indicator; flags bit 0 = direction.
//   2001 Linux monitor, what `btmon -w` writes: flags = controller index << 16 | opcode
//        (BTSNOOP_OPCODE_*); no H4 byte; most records are not HCI packets (new/del index,
//        open/close, index info, system notes, user logging, control channel).
// Timestamps count microseconds since midnight, 1 January 0 AD (proleptic Gregorian).
// 0x00DCDDB30F2F8000 of them lie before the Unix epoch: Android's BTSNOOP_EPOCH_DELTA and
// Wireshark's KUnixTimeBase. (BlueZ writes `(sec - 946684800) * 10^6 + usec + 0x00E03AB44A676000`,
// i.e. the same origin expressed from 2000-01-01: 0x00E03AB44A676000 - 946684800 * 10^6 =
// 0x00DCDDB30F2F8000.)
public import BatonWire

extension Malformed {
    /// The file does not start with "btsnoop\0".
    public static let btsnoopMagic = Malformed("btsnoop-magic")
}

public enum BTSnoop {
    public static let magic: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) =
        (0x62, 0x74, 0x73, 0x6E, 0x6F, 0x6F, 0x70, 0x00)  // "btsnoop\0"
    public static let version: UInt32 = 1
    public static let headerSize = 16
    public static let recordHeaderSize = 24

    /// Datalink types (BlueZ src/shared/btsnoop.h BTSNOOP_FORMAT_*).
    public static let datalinkHCI: UInt32 = 1001
    public static let datalinkH4: UInt32 = 1002
    public static let datalinkMonitor: UInt32 = 2001

    /// Microseconds from 0000-01-01T00:00 to the Unix epoch.
    public static let unixEpochOffset: UInt64 = 0x00DC_DDB3_0F2F_8000

    /// Flag bits for datalinks 1001 and 1002.
    public static let flagReceived: UInt32 = 0x01
    public static let flagCommandOrEvent: UInt32 = 0x02

    @inlinable
    public static func unixMicroseconds(fromBTSnoop raw: UInt64) -> Int64 {
        // Wrapping: a corrupt timestamp gives a strange date, never a trap.
        Int64(bitPattern: raw &- unixEpochOffset)
    }

    @inlinable
    public static func btsnoopTimestamp(unixMicroseconds us: Int64) -> UInt64 {
        UInt64(bitPattern: us) &+ unixEpochOffset
    }

    /// Flags for a monitor (2001) record: controller index << 16 | opcode.
    @inlinable
    public static func monitorFlags(index: UInt16, opcode: UInt16) -> UInt32 {
        UInt32(index) << 16 | UInt32(opcode)
    }

    /// Flags for an HCI (1001) or H4 (1002) record.
    @inlinable
    public static func hciFlags(type: H4PacketType, direction: HCIDirection) -> UInt32 {
        var flags: UInt32 = 0
        if type == .command || type == .event { flags |= flagCommandOrEvent }
        switch direction {
        case .controllerToHost: flags |= flagReceived
        case .hostToController: break
        // Commands are always sent and events always received; other unknowns are written as sent.
        case .unknown: if type == .event { flags |= flagReceived }
        }
        return flags
    }

    /// Writes the 16-byte file header.
    public static func writeHeader(datalink: UInt32, into w: inout ByteWriter) throws(WireError) {
        try w.reserve(headerSize)
        w.write(magic.0); w.write(magic.1); w.write(magic.2); w.write(magic.3)
        w.write(magic.4); w.write(magic.5); w.write(magic.6); w.write(magic.7)
        w.writeU32BE(version)
        w.writeU32BE(datalink)
    }

    /// Writes one record: header, then `prefix` (if any) and `packet` as its data. `timestamp`
    /// is microseconds since the Unix epoch.
    public static func writeRecord(timestamp: Int64, flags: UInt32, drops: UInt32 = 0,
                                   prefix: UInt8? = nil, packet: UnsafeRawBufferPointer,
                                   into w: inout ByteWriter) throws(WireError) {
        let length = packet.count &+ (prefix == nil ? 0 : 1)
        guard length <= Int(UInt32.max) else { throw .noRoom(need: length, have: Int(UInt32.max)) }
        try w.reserve(recordHeaderSize &+ length)
        w.writeU32BE(UInt32(length))  // original length
        w.writeU32BE(UInt32(length))  // included length
        w.writeU32BE(flags)
        w.writeU32BE(drops)
        w.writeU64BE(btsnoopTimestamp(unixMicroseconds: timestamp))
        if let prefix { w.write(prefix) }
        w.write(packet)
    }

    /// A datalink 1002 (H4) record: the indicator, then `packet` (which starts after it).
    public static func writeH4Record(timestamp: Int64, type: H4PacketType, direction: HCIDirection,
                                     packet: UnsafeRawBufferPointer, into w: inout ByteWriter) throws(WireError) {
        try writeRecord(timestamp: timestamp, flags: hciFlags(type: type, direction: direction),
                        prefix: type.rawValue, packet: packet, into: &w)
    }

    /// A datalink 1001 (HCI) record: `packet` without an indicator.
    public static func writeHCIRecord(timestamp: Int64, type: H4PacketType, direction: HCIDirection,
                                      packet: UnsafeRawBufferPointer, into w: inout ByteWriter) throws(WireError) {
        try writeRecord(timestamp: timestamp, flags: hciFlags(type: type, direction: direction),
                        packet: packet, into: &w)
    }

    /// A datalink 2001 (monitor) record.
    public static func writeMonitorRecord(timestamp: Int64, index: UInt16, opcode: UInt16,
                                          packet: UnsafeRawBufferPointer, into w: inout ByteWriter) throws(WireError) {
        try writeRecord(timestamp: timestamp, flags: monitorFlags(index: index, opcode: opcode),
                        packet: packet, into: &w)
    }

    /// A datalink 2001 record for an HCI packet (picks the opcode from type and direction).
    public static func writeMonitorRecord(timestamp: Int64, index: UInt16, type: H4PacketType,
                                          direction: HCIDirection, packet: UnsafeRawBufferPointer,
                                          into w: inout ByteWriter) throws(WireError) {
        try writeMonitorRecord(timestamp: timestamp, index: index,
                               opcode: LinuxMonitor.opcode(type: type, direction: direction),
                               packet: packet, into: &w)
    }
}

/// The Linux monitor channel's record opcodes (BlueZ src/shared/btsnoop.h BTSNOOP_OPCODE_*,
/// the kernel's HCI_MON_*), shared by btsnoop datalink 2001 and pcap link type 254.
public enum LinuxMonitor {
    public static let newIndex: UInt16 = 0
    public static let deleteIndex: UInt16 = 1
    public static let commandPacket: UInt16 = 2
    public static let eventPacket: UInt16 = 3
    public static let aclTxPacket: UInt16 = 4
    public static let aclRxPacket: UInt16 = 5
    public static let scoTxPacket: UInt16 = 6
    public static let scoRxPacket: UInt16 = 7
    public static let openIndex: UInt16 = 8
    public static let closeIndex: UInt16 = 9
    public static let indexInfo: UInt16 = 10
    public static let vendorDiagnostic: UInt16 = 11
    public static let systemNote: UInt16 = 12
    public static let userLogging: UInt16 = 13
    public static let controlOpen: UInt16 = 14
    public static let controlClose: UInt16 = 15
    public static let controlCommand: UInt16 = 16
    public static let controlEvent: UInt16 = 17
    public static let isoTxPacket: UInt16 = 18
    public static let isoRxPacket: UInt16 = 19

    /// The HCI packet an opcode carries, or nil for records that are not HCI packets.
    @inlinable
    public static func packet(opcode: UInt16) -> (H4PacketType, HCIDirection)? {
        switch opcode {
        case commandPacket: (.command, .hostToController)
        case eventPacket: (.event, .controllerToHost)
        case aclTxPacket: (.acl, .hostToController)
        case aclRxPacket: (.acl, .controllerToHost)
        case scoTxPacket: (.sco, .hostToController)
        case scoRxPacket: (.sco, .controllerToHost)
        case isoTxPacket: (.iso, .hostToController)
        case isoRxPacket: (.iso, .controllerToHost)
        default: nil
        }
    }

    @inlinable
    public static func opcode(type: H4PacketType, direction: HCIDirection) -> UInt16 {
        let rx = direction == .controllerToHost || (direction == .unknown && type == .event)
        switch type {
        case .command: return commandPacket
        case .event: return eventPacket
        case .acl: return rx ? aclRxPacket : aclTxPacket
        case .sco: return rx ? scoRxPacket : scoTxPacket
        case .iso: return rx ? isoRxPacket : isoTxPacket
        }
    }

    /// Classifies one monitor record. Non-HCI records are `.other`, counted and not errors.
    @inlinable
    public static func kind(index: UInt16, opcode: UInt16, payload: UnsafeRawBufferPointer) -> CaptureRecord.Kind {
        if let (type, direction) = packet(opcode: opcode) {
            return .hci(HCIRecord(type: type, direction: direction, adapterIndex: index, bytes: payload))
        }
        return .other(opcode: opcode, index: index, bytes: payload)
    }
}

/// Reads a btsnoop file held in memory, one record at a time, borrowing each packet.
public struct BTSnoopReader {
    public let bytes: UnsafeRawBufferPointer
    public let datalink: UInt32
    /// File offset of the next record.
    public private(set) var offset: Int
    @usableFromInline var finished = false

    /// Reads and checks the file header. Datalinks other than 1001, 1002 and 2001 throw
    /// `.unsupported` naming byte 12.
    public init(_ bytes: UnsafeRawBufferPointer) throws(WireError) {
        var r = ByteReader(bytes)
        let magic = try r.readU64BE()
        guard magic == 0x6274_736E_6F6F_7000 else { throw .malformed(at: 0, .btsnoopMagic) }
        let version = try r.readU32BE()
        guard version == BTSnoop.version else { throw .unsupported(at: 8, value: UInt64(version)) }
        let datalink = try r.readU32BE()
        switch datalink {
        case BTSnoop.datalinkHCI, BTSnoop.datalinkH4, BTSnoop.datalinkMonitor: break
        default: throw .unsupported(at: 12, value: UInt64(datalink))
        }
        self.bytes = bytes
        self.datalink = datalink
        self.offset = r.offset
    }

    /// The next record, nil at the end. A record cut short by the end of the file throws
    /// `.truncated` naming the offset where bytes ran out; after any throw, returns nil.
    public mutating func next() throws(WireError) -> CaptureRecord? {
        guard !finished else { return nil }
        var r = ByteReader(bytes, offset: offset)
        if r.isAtEnd { finished = true; return nil }
        do throws(WireError) {
            let start = r.offset
            let original = try r.readU32BE()
            let lengthAt = r.offset
            let included = try r.readU32BE()
            let flags = try r.readU32BE()
            _ = try r.readU32BE()  // cumulative drops
            let timestamp = BTSnoop.unixMicroseconds(fromBTSnoop: try r.readU64BE())
            guard included <= Capture.maxRecordLength else {
                throw WireError.badLength(at: lengthAt, length: Int(included))
            }
            var data = try r.readSubReader(Int(included))
            offset = r.offset
            let kind = decode(flags: flags, data: &data)
            return CaptureRecord(timestamp: timestamp, offset: start, capturedLength: Int(included),
                                 originalLength: Int(original), kind: kind)
        } catch {
            finished = true
            throw error
        }
    }

    @usableFromInline
    func decode(flags: UInt32, data: inout ByteReader) -> CaptureRecord.Kind {
        switch datalink {
        case BTSnoop.datalinkMonitor:
            return LinuxMonitor.kind(index: UInt16(truncatingIfNeeded: flags >> 16),
                                     opcode: UInt16(truncatingIfNeeded: flags),
                                     payload: data.readRest())
        case BTSnoop.datalinkH4:
            let direction: HCIDirection = flags & BTSnoop.flagReceived != 0 ? .controllerToHost : .hostToController
            do throws(WireError) { return try Capture.h4Packet(&data, direction: direction, index: 0) } catch { return .malformed(error) }
        default:  // 1001
            let received = flags & BTSnoop.flagReceived != 0
            let type: H4PacketType = flags & BTSnoop.flagCommandOrEvent != 0 ? (received ? .event : .command) : .acl
            return .hci(HCIRecord(type: type, direction: received ? .controllerToHost : .hostToController,
                                  adapterIndex: 0, bytes: data.readRest()))
        }
    }
}
