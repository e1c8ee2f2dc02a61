// pcap and pcapng readers, and the Bluetooth link types inside them.
//
// pcap (draft-ietf-opsawg-pcap; libpcap sf-pcap.c): a 24-byte header — magic u32 (0xA1B2C3D4
// microseconds, 0xA1B23C4D nanoseconds; read byte-swapped, the file is the other byte order),
// version 2.4, thiszone, sigfigs, snaplen, LinkType (low 28 bits; the top 4 carry FCS info) —
// then records: ts_sec u32 | ts_usec-or-nsec u32 | captured length u32 | original length u32 | data.
//
// pcapng (draft-ietf-opsawg-pcapng; libpcap sf-pcapng.c): blocks of
// type u32 | total length u32 | body | total length u32, total length ≥ 12 and a multiple of 4.
// Section Header Block 0x0A0D0D0A (byte-order magic 0x1A2B3C4D sets the section's byte order,
// major version 1), Interface Description Block 1 (LinkType u16, reserved u16, SnapLen u32,
// options: if_tsresol = 9, if_tsoffset = 14), Enhanced Packet Block 6 (interface u32, timestamp
// high u32, low u32, captured u32, original u32, data padded to 4), Simple Packet Block 3
// (original u32, data; interface 0, no timestamp), obsolete Packet Block 2 (interface u16,
// drops u16, then as EPB). Other blocks are skipped.
//
// Link types (tcpdump.org linktypes; libpcap pcap/bluetooth.h; Wireshark packet-bluetooth.c,
// packet-hci_mon.c, packet-btle_rf.c, packet-nordic_ble.c):
//   187 BLUETOOTH_HCI_H4: the H4 indicator, then the packet. No direction: commands are sent,
//       events received, data is `.unknown`.
//   201 BLUETOOTH_HCI_H4_WITH_PHDR: direction u32 big-endian (bit 0 set = received), then H4.
//   254 BLUETOOTH_LINUX_MONITOR: adapter index u16 big-endian, opcode u16 big-endian (the
//       BTSNOOP_OPCODE_* values), then the payload — as btsnoop 2001.
//   256 BLUETOOTH_LE_LL_WITH_PHDR: RF channel u8 (0…39, RF numbering: 2402 + 2k MHz), signal
//       dBm i8, noise dBm i8, access address offenses u8, reference access address u32 LE,
//       flags u16 LE (0x0001 dewhitened, 0x0002 signal valid, 0x0004 noise valid, 0x0008
//       decrypted, 0x0010 reference AA valid, 0x0020 offenses valid, 0x0040 channel aliased,
//       0x0380 PDU type, 0x0400 CRC checked, 0x0800 CRC valid, 0x1000 MIC checked, 0x2000 MIC
//       valid, 0xC000 PHY: 0 1M, 1 2M, 2 Coded), then the LE packet without preamble: access
//       address u32 LE, a coding-indicator byte on LE Coded (Sniffle's pcap.py writes it), PDU,
//       CRC (3 bytes, in air order).
//   272 NORDIC_BLE (nRF Sniffer, header versions 1–3): board id u8, then
//       v1: header length u8, payload length u8; v2+: payload length u16 LE; then protocol
//       version u8, packet counter u16 LE, packet id u8 (0x02 advertising PDU in v3, 0x06 any
//       PDU), then the event packet: length u8, flags u8 (bit 0 CRC ok, bits 4–6 PHY), channel
//       index u8, RSSI u8 (negated dBm), event counter u16, timestamp u32, then the LE packet as
//       for 256. Header length + payload length must equal the record length.
public import BatonWire

extension Malformed {
    /// A pcapng block whose trailing length differs from its leading one.
    public static let pcapngTrailer = Malformed("pcapng-trailer")
    /// A Section Header Block whose byte-order magic is neither 0x1A2B3C4D nor its swap.
    public static let pcapngByteOrder = Malformed("pcapng-byte-order")
    /// A pcapng file that does not start with a Section Header Block.
    public static let pcapngNoSection = Malformed("pcapng-no-section")
    /// An option running past the end of its block.
    public static let pcapngOption = Malformed("pcapng-option")
    /// A packet naming an interface no Interface Description Block defined.
    public static let pcapngUnknownInterface = Malformed("pcapng-unknown-interface")
    /// More Interface Description Blocks in a section than the reader has room for.
    public static let pcapngTooManyInterfaces = Malformed("pcapng-too-many-interfaces")
    /// A 256 record whose LE packet is still whitened (flag 0x0001 clear).
    public static let llWhitened = Malformed("ll-whitened")
    /// An LL PDU whose Length field disagrees with the bytes captured.
    public static let llLength = Malformed("ll-length")
    /// A Nordic sniffer record whose header + payload lengths disagree with the record.
    public static let nordicLength = Malformed("nordic-length")
}

/// Link-layer facts: Core 5.4, Vol 6, Part B.
public enum BLELinkLayer {
    /// §2.1.2: the access address of every advertising physical channel packet.
    public static let advertisingAccessAddress: UInt32 = 0x8E89_BED6
    /// §3.1.1: the CRC shift register's preset for advertising physical channel packets.
    public static let advertisingCRCInit: UInt32 = 0x55_5555

    /// The CRC-24 of §3.1.1 (polynomial x^24 + x^10 + x^9 + x^6 + x^4 + x^3 + x + 1) over `pdu`,
    /// returned as the three bytes appear in a capture, little-endian: byte 0 is the first
    /// octet on air.
    ///
    /// §3.1.1 feeds data LSB first into a register preset with `initial` (position 0 = its LSB)
    /// and sends the register from position 23 down to 0. Run with the register bit-reversed,
    /// the same LFSR shifts right: the reversed polynomial is 0xDA6000, the reversed preset of
    /// 0x555555 is 0xAAAAAA, and the register's bit 0 — position 23 — is the first bit sent, so
    /// the reversed register read as a little-endian number is exactly the on-air bytes.
    /// Checked against Wireshark's btle dissector on the frames in PCAPTests.
    @inlinable
    public static func crc24(_ pdu: UnsafeRawBufferPointer, initial: UInt32 = advertisingCRCInit) -> UInt32 {
        var state: UInt32 = 0
        for i in 0 ..< 24 where initial >> UInt32(i) & 1 != 0 { state |= 1 << UInt32(23 - i) }
        for byte in pdu {
            var b = UInt32(byte)
            for _ in 0 ..< 8 {
                let feedback = (state ^ b) & 1
                state >>= 1
                if feedback != 0 { state ^= 0xDA_6000 }
                b >>= 1
            }
        }
        return state
    }

    /// Channel index for an RF channel number (Vol 6, Part A, §2: RF channel k is 2402 + 2k MHz;
    /// advertising channels 37, 38, 39 sit on RF channels 0, 12, 39). Nil above 39.
    @inlinable
    public static func channelIndex(rfChannel: UInt8) -> UInt8? {
        switch rfChannel {
        case 0: 37
        case 12: 38
        case 39: 39
        case 1 ... 11: rfChannel - 1
        case 13 ... 38: rfChannel - 2
        default: nil
        }
    }

    /// Parses an LE packet without preamble — access address, [CI on Coded], PDU, CRC — and
    /// checks its CRC. Baton computes the CRC itself on the advertising access address; for
    /// other access addresses it takes the sniffer's verdict (`sniffer`), or leaves it unchecked.
    /// A PDU whose CRC is good but whose Length field disagrees with the bytes is malformed.
    static func packet(_ r: inout ByteReader, phy: UInt8, channel: UInt8, rssi: Int8?,
                       sniffer: LinkLayerCRC) throws(WireError) -> LinkLayerRecord {
        let accessAddress = try r.readU32LE()
        if phy == 3 { _ = try r.readU8() }  // coding indicator
        let pduStart = r.offset
        try r.require(2 &+ 3)
        let pdu = try r.readBytes(r.remaining &- 3)
        let b0 = UInt32(try r.readU8()), b1 = UInt32(try r.readU8()), b2 = UInt32(try r.readU8())
        let received = b0 | b1 << 8 | b2 << 16
        let crc: LinkLayerCRC
        if accessAddress == advertisingAccessAddress {
            crc = crc24(pdu) == received ? .ok : .bad
        } else {
            crc = sniffer
        }
        if crc != .bad {
            // Length (header byte 1) counts the payload after the 2-byte header (§2.3, §2.4).
            let length = Int(pdu[1])
            guard length == pdu.count &- 2 else { throw .malformed(at: pduStart &+ 1, .llLength) }
        }
        return LinkLayerRecord(channel: channel, rssi: rssi, accessAddress: accessAddress, phy: phy,
                               crc: crc, pdu: pdu)
    }
}

/// pcap / pcapng link types Baton reads (tcpdump.org linktypes).
public enum LinkType {
    public static let bluetoothHCIH4: UInt32 = 187
    public static let bluetoothHCIH4WithPHDR: UInt32 = 201
    public static let bluetoothLinuxMonitor: UInt32 = 254
    public static let bluetoothLELLWithPHDR: UInt32 = 256
    public static let nordicBLE: UInt32 = 272

    public static func isSupported(_ linkType: UInt32) -> Bool {
        switch linkType {
        case bluetoothHCIH4, bluetoothHCIH4WithPHDR, bluetoothLinuxMonitor, bluetoothLELLWithPHDR, nordicBLE: true
        default: false
        }
    }

    /// Decodes one packet of `linkType`; `r` spans exactly the packet, with file offsets.
    static func decode(linkType: UInt32, _ r: inout ByteReader) -> CaptureRecord.Kind {
        do throws(WireError) {
            switch linkType {
            case bluetoothHCIH4:
                return try Capture.h4Packet(&r, direction: .unknown, index: 0)
            case bluetoothHCIH4WithPHDR:
                let direction = try r.readU32BE()
                return try Capture.h4Packet(&r, direction: direction & 1 != 0 ? .controllerToHost : .hostToController,
                                            index: 0)
            case bluetoothLinuxMonitor:
                let index = try r.readU16BE()
                let opcode = try r.readU16BE()
                return LinuxMonitor.kind(index: index, opcode: opcode, payload: r.readRest())
            case bluetoothLELLWithPHDR:
                return try leLLWithPHDR(&r)
            case nordicBLE:
                return try nordic(&r)
            default:
                return .unsupported(linkType: linkType, bytes: r.readRest())
            }
        } catch {
            return .malformed(error)
        }
    }

    static func leLLWithPHDR(_ r: inout ByteReader) throws(WireError) -> CaptureRecord.Kind {
        let channelAt = r.offset
        let rf = try r.readU8()
        let signal = try r.readI8()
        _ = try r.readI8()        // noise
        _ = try r.readU8()        // access address offenses
        _ = try r.readU32LE()     // reference access address
        let flagsAt = r.offset
        let flags = try r.readU16LE()
        guard flags & 0x0001 != 0 else { throw .malformed(at: flagsAt, .llWhitened) }
        guard let channel = BLELinkLayer.channelIndex(rfChannel: rf) else {
            throw .unsupported(at: channelAt, value: UInt64(rf))
        }
        let phy: UInt8 = switch flags >> 14 { case 0: 1; case 1: 2; case 2: 3; default: 0 }
        guard phy != 0 else { throw .unsupported(at: flagsAt, value: UInt64(flags)) }
        let sniffer: LinkLayerCRC = flags & 0x0400 == 0 ? .unchecked : (flags & 0x0800 != 0 ? .ok : .bad)
        return .linkLayer(try BLELinkLayer.packet(&r, phy: phy, channel: channel,
                                                  rssi: flags & 0x0002 != 0 ? signal : nil, sniffer: sniffer))
    }

    static func nordic(_ r: inout ByteReader) throws(WireError) -> CaptureRecord.Kind {
        let start = r.offset
        let total = r.remaining
        _ = try r.readU8()  // board id
        let version = try r.peekU8(at: 2)
        let headerLength: Int
        let payloadLength: Int
        switch version {
        case 1:
            headerLength = Int(try r.readU8()) &+ 1  // counts from after the board id
            payloadLength = Int(try r.readU8())
        case 2, 3:
            headerLength = 7
            payloadLength = Int(try r.readU16LE())
        default:
            throw .unsupported(at: start &+ 3, value: UInt64(version))
        }
        guard headerLength >= 7, headerLength &+ payloadLength == total else { throw .malformed(at: start &+ 1, .nordicLength) }
        _ = try r.readU8()      // protocol version
        _ = try r.readU16LE()   // packet counter
        let id = try r.readU8()
        // Skip the rest of a longer v1 header.
        try r.skip(headerLength &- (r.offset &- start))
        guard id == 0x02 || id == 0x06 else {
            return .other(opcode: UInt16(id), index: 0, bytes: r.readRest())
        }
        _ = try r.readU8()      // event packet length
        let flags = try r.readU8()
        let channelAt = r.offset
        let channel = try r.readU8()
        let rssiRaw = try r.readU8()
        _ = try r.readU16LE()   // event counter
        _ = try r.readU32LE()   // firmware timestamp / delta time
        let phy: UInt8 = switch flags >> 4 & 7 { case 0: 1; case 1: 2; case 2: 3; default: 0 }
        guard phy != 0 else { throw .unsupported(at: start &+ headerLength &+ 1, value: UInt64(flags)) }
        // A channel index is 0…39 (Core 5.4, Vol 6, Part A, §2), as `LinkLayerRecord.channel`
        // promises; the sniffer writes the index itself, so anything above is corruption
        // (found by FuzzCapture; link type 256 refuses RF channels above 39 the same way).
        guard channel <= 39 else { throw .unsupported(at: channelAt, value: UInt64(channel)) }
        // RSSISAMPLE is the magnitude of a negative dBm value: rssi = -RSSISAMPLE (≤ 127 fits Int8).
        let rssi: Int8? = rssiRaw <= 128 ? Int8(truncatingIfNeeded: 0 &- Int(rssiRaw)) : nil
        return .linkLayer(try BLELinkLayer.packet(&r, phy: phy, channel: channel, rssi: rssi,
                                                  sniffer: flags & 1 != 0 ? .ok : .bad))
    }
}

/// Reads a classic pcap file held in memory.
public struct PCAPReader {
    public let bytes: UnsafeRawBufferPointer
    public let linkType: UInt32
    public let nanoseconds: Bool
    public let bigEndian: Bool
    public private(set) var offset: Int
    @usableFromInline var finished = false

    public static let headerSize = 24
    public static let recordHeaderSize = 16

    /// Reads the file header; throws `.unsupported` for a link type Baton does not read
    /// (naming byte 20) or a version other than 2.x (naming byte 4).
    public init(_ bytes: UnsafeRawBufferPointer) throws(WireError) {
        var r = ByteReader(bytes)
        let magic = try r.readU32LE()
        switch magic {
        case 0xA1B2_C3D4: (nanoseconds, bigEndian) = (false, false)
        case 0xD4C3_B2A1: (nanoseconds, bigEndian) = (false, true)
        case 0xA1B2_3C4D: (nanoseconds, bigEndian) = (true, false)
        case 0x4D3C_B2A1: (nanoseconds, bigEndian) = (true, true)
        default: throw .unsupported(at: 0, value: UInt64(magic))
        }
        let big = bigEndian
        func u16(_ r: inout ByteReader) throws(WireError) -> UInt16 { big ? try r.readU16BE() : try r.readU16LE() }
        func u32(_ r: inout ByteReader) throws(WireError) -> UInt32 { big ? try r.readU32BE() : try r.readU32LE() }
        let major = try u16(&r)
        _ = try u16(&r)  // minor
        guard major == 2 else { throw .unsupported(at: 4, value: UInt64(major)) }
        _ = try u32(&r)  // thiszone
        _ = try u32(&r)  // sigfigs
        _ = try u32(&r)  // snaplen
        let linkType = try u32(&r) & 0x0FFF_FFFF
        guard LinkType.isSupported(linkType) else { throw .unsupported(at: 20, value: UInt64(linkType)) }
        self.bytes = bytes
        self.linkType = linkType
        self.offset = r.offset
    }

    public mutating func next() throws(WireError) -> CaptureRecord? {
        guard !finished else { return nil }
        var r = ByteReader(bytes, offset: offset)
        if r.isAtEnd { finished = true; return nil }
        let big = bigEndian
        func u32(_ r: inout ByteReader) throws(WireError) -> UInt32 { big ? try r.readU32BE() : try r.readU32LE() }
        do throws(WireError) {
            let start = r.offset
            let seconds = Int64(try u32(&r))
            let fraction = Int64(try u32(&r))
            let lengthAt = r.offset
            let captured = try u32(&r)
            let original = try u32(&r)
            guard captured <= Capture.maxRecordLength else {
                throw WireError.badLength(at: lengthAt, length: Int(captured))
            }
            var data = try r.readSubReader(Int(captured))
            offset = r.offset
            // Proof: seconds < 2^32 and fraction < 2^32, so neither product nor sum can overflow.
            let timestamp = seconds &* 1_000_000 &+ (nanoseconds ? fraction / 1000 : fraction)
            return CaptureRecord(timestamp: timestamp, offset: start, capturedLength: Int(captured),
                                 originalLength: Int(original),
                                 kind: LinkType.decode(linkType: linkType, &data))
        } catch {
            finished = true
            throw error
        }
    }
}

/// One pcapng interface: what its packets need to be read.
public struct PCAPNGInterface: Sendable, Equatable {
    public var linkType: UInt32 = 0
    public var snapLength: UInt32 = 0
    /// if_tsresol as stored: bit 7 clear = 10^-n seconds, set = 2^-n; default 6 (microseconds).
    public var timestampResolution: UInt8 = 6
    /// if_tsoffset: seconds added to every timestamp.
    public var timestampOffset: Int64 = 0

    public init() {}

    /// Converts a raw 64-bit timestamp to microseconds since the Unix epoch, saturating.
    public func microseconds(_ raw: UInt64) -> Int64 {
        let n = Int(timestampResolution & 0x7F)
        var us: UInt128
        if timestampResolution & 0x80 == 0 {
            if n <= 6 {
                var scale: UInt128 = 1
                for _ in 0 ..< (6 &- n) { scale &*= 10 }
                us = UInt128(raw) &* scale  // ≤ 2^64 · 10^6 < 2^128
            } else if n - 6 > 38 {
                us = 0  // 10^39 > 2^128: every 64-bit count is below one microsecond
            } else {
                var scale: UInt128 = 1
                for _ in 0 ..< (n &- 6) { scale &*= 10 }
                us = UInt128(raw) / scale
            }
        } else {
            us = (UInt128(raw) &* 1_000_000) >> UInt128(n)
        }
        let base: Int64 = us > UInt128(Int64.max) ? Int64.max : Int64(us)
        let (shift, o1) = timestampOffset.multipliedReportingOverflow(by: 1_000_000)
        if o1 { return timestampOffset < 0 ? Int64.min : Int64.max }
        let (sum, o2) = base.addingReportingOverflow(shift)
        if o2 { return shift < 0 ? Int64.min : Int64.max }
        return sum
    }
}

/// Reads a pcapng file held in memory: every section, any byte order, any number of
/// interfaces up to `maxInterfaces` per section.
public struct PCAPNGReader {
    public static let sectionHeaderType: UInt32 = 0x0A0D_0D0A
    public static let interfaceDescriptionType: UInt32 = 1
    public static let packetType: UInt32 = 2
    public static let simplePacketType: UInt32 = 3
    public static let enhancedPacketType: UInt32 = 6
    public static let maxInterfaces = 16

    public let bytes: UnsafeRawBufferPointer
    public private(set) var offset = 0
    @usableFromInline var finished = false
    @usableFromInline var bigEndian = false
    @usableFromInline var interfaces = InlineArray<16, PCAPNGInterface>(repeating: PCAPNGInterface())
    /// Interface Description Blocks seen in the current section (may exceed `maxInterfaces`).
    public private(set) var interfaceCount = 0
    /// Simple Packet Blocks carry no timestamp; they get the previous packet's.
    @usableFromInline var lastTimestamp: Int64 = 0

    /// Checks that the file starts with a Section Header Block.
    public init(_ bytes: UnsafeRawBufferPointer) throws(WireError) {
        let r = ByteReader(bytes)
        try r.require(4)
        let type = UInt32(try r.peekU8(at: 0)) | UInt32(try r.peekU8(at: 1)) << 8
            | UInt32(try r.peekU8(at: 2)) << 16 | UInt32(try r.peekU8(at: 3)) << 24
        guard type == Self.sectionHeaderType else { throw .malformed(at: 0, .pcapngNoSection) }
        self.bytes = bytes
    }

    /// The interface descriptions of the current section (for tools and tests).
    public func interface(_ id: Int) -> PCAPNGInterface? {
        guard id >= 0, id < min(interfaceCount, Self.maxInterfaces) else { return nil }
        return interfaces[id]
    }

    @inlinable func u16(_ r: inout ByteReader) throws(WireError) -> UInt16 {
        bigEndian ? try r.readU16BE() : try r.readU16LE()
    }
    @inlinable func u32(_ r: inout ByteReader) throws(WireError) -> UInt32 {
        bigEndian ? try r.readU32BE() : try r.readU32LE()
    }

    public mutating func next() throws(WireError) -> CaptureRecord? {
        while true {
            guard !finished else { return nil }
            if offset == bytes.count { finished = true; return nil }
            do throws(WireError) {
                if let record = try block() { return record }
            } catch {
                finished = true
                throw error
            }
        }
    }

    /// Reads one block; returns a record for packet blocks, nil for the rest.
    mutating func block() throws(WireError) -> CaptureRecord? {
        var r = ByteReader(bytes, offset: offset)
        let start = r.offset
        try r.require(8)
        let rawType = UInt32(try r.peekU8(at: 0)) << 24 | UInt32(try r.peekU8(at: 1)) << 16
            | UInt32(try r.peekU8(at: 2)) << 8 | UInt32(try r.peekU8(at: 3))
        if rawType == Self.sectionHeaderType {
            // The type reads the same in both orders; the byte-order magic decides the rest.
            try r.require(12)
            let bom = UInt32(try r.peekU8(at: 8)) << 24 | UInt32(try r.peekU8(at: 9)) << 16
                | UInt32(try r.peekU8(at: 10)) << 8 | UInt32(try r.peekU8(at: 11))
            switch bom {
            case 0x1A2B_3C4D: bigEndian = true
            case 0x4D3C_2B1A: bigEndian = false
            default: throw .malformed(at: start &+ 8, .pcapngByteOrder)
            }
        }
        let type = try u32(&r)
        let lengthAt = r.offset
        let total = try u32(&r)
        guard total >= 12, total % 4 == 0 else { throw .badLength(at: lengthAt, length: Int(total)) }
        let bodyLength = Int(total) &- 12
        if bodyLength &+ 4 > r.remaining {
            throw .truncated(at: r.offset, need: bodyLength &+ 4 &- r.remaining)
        }
        var body = try r.readSubReader(bodyLength)
        let trailerAt = r.offset
        guard try u32(&r) == total else { throw .malformed(at: trailerAt, .pcapngTrailer) }
        offset = r.offset

        switch type {
        case Self.sectionHeaderType:
            try body.skip(4)  // byte-order magic, already read
            let majorAt = body.offset
            let major = try u16(&body)
            guard major == 1 else { throw .unsupported(at: majorAt, value: UInt64(major)) }
            interfaceCount = 0
            return nil
        case Self.interfaceDescriptionType:
            var iface = PCAPNGInterface()
            iface.linkType = UInt32(try u16(&body))
            _ = try u16(&body)
            iface.snapLength = try u32(&body)
            try options(&body) { code, value in
                if code == 9, value.count >= 1 { iface.timestampResolution = value[0] }
                if code == 14, value.count >= 8 {
                    var v: UInt64 = 0
                    for i in 0 ..< 8 {
                        let byte = UInt64(value[i])
                        v |= bigEndian ? byte << UInt64(8 * (7 - i)) : byte << UInt64(8 * i)
                    }
                    iface.timestampOffset = Int64(bitPattern: v)
                }
            }
            if interfaceCount < Self.maxInterfaces { interfaces[interfaceCount] = iface }
            interfaceCount &+= 1
            return nil
        case Self.enhancedPacketType, Self.packetType:
            let id: Int
            if type == Self.enhancedPacketType {
                id = Int(try u32(&body))
            } else {
                id = Int(try u16(&body))
                _ = try u16(&body)  // drops count
            }
            let high = UInt64(try u32(&body))
            let low = UInt64(try u32(&body))
            let capturedAt = body.offset
            let captured = Int(try u32(&body))
            let original = Int(try u32(&body))
            let kind: CaptureRecord.Kind
            var timestamp = lastTimestamp
            if captured > body.remaining {
                kind = .malformed(.badLength(at: capturedAt, length: captured))
            } else if let iface = self.interface(id) {
                timestamp = iface.microseconds(high << 32 | low)
                lastTimestamp = timestamp
                var data = try body.readSubReader(captured)
                kind = LinkType.decode(linkType: iface.linkType, &data)
            } else {
                kind = .malformed(.malformed(at: start &+ 8,
                                             id < interfaceCount ? .pcapngTooManyInterfaces : .pcapngUnknownInterface))
            }
            return CaptureRecord(timestamp: timestamp, offset: start, capturedLength: captured,
                                 originalLength: original, kind: kind)
        case Self.simplePacketType:
            let original = Int(try u32(&body))
            let kind: CaptureRecord.Kind
            var captured = min(original, body.remaining)
            if let iface = self.interface(0) {
                if iface.snapLength != 0 { captured = min(captured, Int(iface.snapLength)) }
                var data = try body.readSubReader(captured)
                kind = LinkType.decode(linkType: iface.linkType, &data)
            } else {
                kind = .malformed(.malformed(at: start, .pcapngUnknownInterface))
            }
            return CaptureRecord(timestamp: lastTimestamp, offset: start, capturedLength: captured,
                                 originalLength: original, kind: kind)
        default:
            return nil  // name resolution, interface statistics, custom, …: not ours to read
        }
    }

    /// Walks a block's options (code u16, length u16, value padded to 4) up to opt_endofopt.
    func options(_ r: inout ByteReader, _ each: (UInt16, UnsafeRawBufferPointer) -> Void) throws(WireError) {
        while r.remaining >= 4 {
            let at = r.offset
            let code = try u16(&r)
            let length = Int(try u16(&r))
            if code == 0 { return }
            let padded = (length &+ 3) & ~3
            guard padded <= r.remaining else { throw .malformed(at: at, .pcapngOption) }
            let value = try r.peekBytes(length)
            try r.skip(padded)
            each(code, value)
        }
    }
}
