// pcap / pcapng and the Bluetooth link types inside them (layouts cited in PCAP.swift).
//
// Every file vector here was written by hand per those layouts and decoded by Wireshark 4.0.17
// (tshark) as intended:
//   187: Sent? LE Set Scan Enable, LE Meta (LE Advertising Report), ATT Read Request, all
//        "UnknownDirection" (the link type has none)
//   201: Sent LE Set Scan Enable, Rcvd LE Meta, Rcvd ATT Read Request
//   254: New Index, Sent LE Set Scan Enable, Rcvd LE Extended Advertising Report, ns timestamps
//   256: three advertising PDUs whose CRC Wireshark recomputed and accepted (the CRC-checked
//        flag is clear, so it checks itself), and a fourth with one CRC bit flipped, flagged
//        "Incorrect CRC". The CRCs were also computed by a separate Python model of the
//        literal shift register of Core 5.4, Vol 6, Part B, §3.1.1 (position 0 = LSB of
//        0x555555, taps 1, 3, 4, 6, 9, 10, sent from position 23): ADV_IND → 75 7e d6.
//   272: nRF Sniffer protocol v3, three ADV_IND: channel 37 CRC ok, channel 37 CRC error
//        (flag clear and one bit flipped), channel 38 CRC ok; RSSI -60 dBm.
//   pcapng: section 1 little-endian with IDB 187 (if_tsresol 9 = ns) and IDB 256, a Name
//        Resolution Block, an EPB per interface, an SPB, an EPB on undefined interface 5
//        (Wireshark calls the file corrupt there; see docs/captures.md); section 2 big-endian
//        with IDB 254 (if_tsresol 0x83 = 1/8 s, if_tsoffset 10 s) and one EPB at
//        1700000010.5 s, which tshark confirmed with that block removed.
import Testing
import BatonTestSupport
import BatonHCI
import BatonWire

@Suite struct PCAPTests {
    static let t0 = BTSnoopTests.t0
    static let command = BTSnoopTests.command
    static let event = BTSnoopTests.event
    static let acl = BTSnoopTests.acl
    static let extEvent = HCIEventTests.extendedOne
    static let advInd = hx("40165544332211c002010606094261746f6e0516d2fc4000")
    static let advNonconn = hx("020d01020304050602010403ff4c00")
    static let advDirect = hx("810ca1a2a3a4a5a6b1b2b3b4b5f6")

    static let h4File = hx("""
        d4c3b2a1 0200 0400 00000000 00000000 ffff0000 bb000000
        00f15365 00000000 06000000 06000000 01 0c20020100
        00f15365 e8030000 23000000 23000000 04 3e20020200015544332211c003020106c404001371da7d1a000706094261746f6eb5
        00f15365 d0070000 0c000000 0c000000 02 40200700030004000a0100
        """)
    // Big-endian file; direction u32 (bit 0 = received) before each H4 packet.
    static let h4WithPHDRFile = hx("""
        a1b2c3d4 0002 0004 00000000 00000000 0000ffff 000000c9
        6553f100 00000000 0000000a 0000000a 00000000 01 0c20020100
        6553f100 000003e8 00000027 00000027 00000001 04 3e20020200015544332211c003020106c404001371da7d1a000706094261746f6eb5
        6553f100 000007d0 00000010 00000010 00000001 02 40200700030004000a0100
        """)
    // Nanosecond magic; adapter index and opcode big-endian before each payload.
    static let monitorFile = hx("""
        4d3cb2a1 0200 0400 00000000 00000000 ffff0000 fe000000
        00f15365 07000000 14000000 14000000 0000 0000 0001665544332211 6863693000000000
        00f15365 47420f00 09000000 09000000 0000 0002 0c20020100
        00f15365 87841e00 2b000000 2b000000 0000 0003 3e250d010000016655443322c10102037fc00000000000000000000b0201060716d2fc40004142
        """)
    // RF channel 0 (= advertising channel 37), signal -60, noise -128, offenses 0,
    // reference AA 8e89bed6, flags 0x0013 (dewhitened, signal valid, reference AA valid),
    // then access address, PDU, CRC.
    static let leLLFile = hx("""
        d4c3b2a1 0200 0400 00000000 00000000 ffff0000 00010000
        00f15365 00000000 29000000 29000000 00 c4 80 00 d6be898e 1300 d6be898e 40165544332211c002010606094261746f6e0516d2fc4000 757ed6
        01f15365 00000000 20000000 20000000 00 c4 80 00 d6be898e 1300 d6be898e 020d01020304050602010403ff4c00 844e0d
        02f15365 00000000 1f000000 1f000000 00 c4 80 00 d6be898e 1300 d6be898e 810ca1a2a3a4a5a6b1b2b3b4b5f6 dcaa9c
        03f15365 00000000 29000000 29000000 00 c4 80 00 d6be898e 1300 d6be898e 40165544332211c002010606094261746f6e0516d2fc4000 747ed6
        """)
    // board 00 | payload length 0x0029 | version 3 | counter 1 | id 02 (advertising) |
    // event: length 10, flags, channel, RSSI 60 (= -60 dBm), event counter 0, timestamp 123456 | LE packet
    static let nordicFile = hx("""
        d4c3b2a1 0200 0400 00000000 00000000 ffff0000 10010000
        00f15365 00000000 30000000 30000000 00 2900 03 0100 02 0a 01 25 3c 0000 40e20100 d6be898e 40165544332211c002010606094261746f6e0516d2fc4000 757ed6
        00f15365 e8030000 30000000 30000000 00 2900 03 0100 02 0a 00 25 3c 0000 40e20100 d6be898e 40165544332211c002010606094261746f6e0516d2fc4000 747ed6
        00f15365 d0070000 30000000 30000000 00 2900 03 0100 02 0a 01 26 3c 0000 40e20100 d6be898e 40165544332211c002010606094261746f6e0516d2fc4000 757ed6
        """)
    static let pcapngFile = hx("""
        0a0d0d0a 20000000 4d3c2b1a 0100 0000 ffffffffffffffff 0000 0000 20000000
        01000000 20000000 bb00 0000 00000000 0900 0100 09000000 0000 0000 20000000
        01000000 14000000 0001 0000 00000000 14000000
        04000000 10000000 0000 0000 10000000
        06000000 44000000 00000000 fe9c9717 05002a36 23000000 23000000
          043e20020200015544332211c003020106c404001371da7d1a000706094261746f6eb5 00 44000000
        06000000 4c000000 01000000 240a0600 01401e18 29000000 29000000
          00c98000d6be898e1300 d6be898e 40165544332211c002010606094261746f6e0516d2fc4000 757ed6 000000 4c000000
        03000000 18000000 06000000 010c20020100 0000 18000000
        06000000 44000000 05000000 00000000 00000000 23000000 23000000
          043e20020200015544332211c003020106c404001371da7d1a000706094261746f6eb5 00 44000000
        0a0d0d0a 0000001c 1a2b3c4d 0001 0000 ffffffffffffffff 0000001c
        00000001 00000028 00fe 0000 00000000 0009 0001 83000000 000e 0008 000000000000000a 00000028
        00000006 0000004c 00000000 00000003 2a9f8804 0000002b 0000002b
          0000 0003 3e250d010000016655443322c10102037fc00000000000000000000b0201060716d2fc40004142 00 0000004c
        """)

    // MARK: CRC, Core 5.4, Vol 6, Part B, §3.1.1

    static func crc(_ bytes: [UInt8], initial: UInt32 = BLELinkLayer.advertisingCRCInit) -> UInt32 {
        bytes.withUnsafeBytes { BLELinkLayer.crc24($0, initial: initial) }
    }

    @Test func crcOfKnownGoodAdvertisingPDUs() {
        // On-air bytes 75 7e d6, 84 4e 0d, dc aa 9c read little-endian.
        #expect(Self.crc(Self.advInd) == 0xD6_7E75)
        #expect(Self.crc(Self.advNonconn) == 0x0D_4E84)
        #expect(Self.crc(Self.advDirect) == 0x9C_AADC)
    }

    @Test func crcOfNothingIsTheReversedPreset() {
        #expect(Self.crc([]) == 0xAA_AAAA)
        #expect(Self.crc([], initial: 0x000001) == 0x80_0000)
    }

    @Test func everySingleBitFlipChangesTheCRC() {
        let good = Self.crc(Self.advInd)
        for i in 0 ..< Self.advInd.count * 8 {
            var pdu = Self.advInd
            pdu[i / 8] ^= 1 << UInt8(i % 8)
            #expect(Self.crc(pdu) != good, "bit \(i)")
        }
    }

    @Test func rfChannelsMapToChannelIndices() {
        // Vol 6, Part A, §2: advertising channels on RF 0, 12, 39; data channels fill the rest.
        #expect(BLELinkLayer.channelIndex(rfChannel: 0) == 37)
        #expect(BLELinkLayer.channelIndex(rfChannel: 12) == 38)
        #expect(BLELinkLayer.channelIndex(rfChannel: 39) == 39)
        #expect(BLELinkLayer.channelIndex(rfChannel: 1) == 0)
        #expect(BLELinkLayer.channelIndex(rfChannel: 11) == 10)
        #expect(BLELinkLayer.channelIndex(rfChannel: 13) == 11)
        #expect(BLELinkLayer.channelIndex(rfChannel: 38) == 36)
        #expect(BLELinkLayer.channelIndex(rfChannel: 40) == nil)
        let all = (0 ... 39).compactMap { BLELinkLayer.channelIndex(rfChannel: UInt8($0)) }
        #expect(Set(all).count == 40)
    }

    // MARK: pcap link types

    @Test func h4_187() throws {
        let read = try readCapture(Self.h4File)
        #expect(read.error == nil)
        #expect(read.seen == [
            .hci(.command, .hostToController, index: 0, Self.command),
            .hci(.event, .controllerToHost, index: 0, Self.event),
            .hci(.acl, .unknown, index: 0, Self.acl),
        ])
        #expect(read.records.map(\.timestamp) == [Self.t0, Self.t0 + 1000, Self.t0 + 2000])
        #expect(read.records.map(\.offset) == [24, 24 + 16 + 6, 24 + 16 + 6 + 16 + 35])
    }

    @Test func h4WithDirection_201_bigEndian() throws {
        let read = try readCapture(Self.h4WithPHDRFile)
        #expect(read.seen == [
            .hci(.command, .hostToController, index: 0, Self.command),
            .hci(.event, .controllerToHost, index: 0, Self.event),
            .hci(.acl, .controllerToHost, index: 0, Self.acl),
        ])
        #expect(read.records.map(\.timestamp) == [Self.t0, Self.t0 + 1000, Self.t0 + 2000])
    }

    @Test func linuxMonitor_254_nanoseconds() throws {
        let read = try readCapture(Self.monitorFile)
        #expect(read.seen == [
            .other(opcode: 0, index: 0, BTSnoopTests.newIndex),
            .hci(.command, .hostToController, index: 0, Self.command),
            .hci(.event, .controllerToHost, index: 0, Self.extEvent),
        ])
        // 7 ns, 1000007 ns, 2000007 ns: truncated to whole microseconds.
        #expect(read.records.map(\.timestamp) == [Self.t0, Self.t0 + 1000, Self.t0 + 2000])
    }

    @Test func leLinkLayer_256_checksTheCRC() throws {
        let read = try readCapture(Self.leLLFile)
        let aa: UInt32 = 0x8E89_BED6
        #expect(read.seen == [
            .ll(channel: 37, rssi: -60, accessAddress: aa, phy: 1, crc: .ok, pdu: Self.advInd),
            .ll(channel: 37, rssi: -60, accessAddress: aa, phy: 1, crc: .ok, pdu: Self.advNonconn),
            .ll(channel: 37, rssi: -60, accessAddress: aa, phy: 1, crc: .ok, pdu: Self.advDirect),
            .ll(channel: 37, rssi: -60, accessAddress: aa, phy: 1, crc: .bad, pdu: Self.advInd),
        ])
        #expect(read.stats.crcOK == 3)
        #expect(read.stats.crcBad == 1)
        #expect(read.records.map(\.timestamp) == [Self.t0, Self.t0 + 1_000_000, Self.t0 + 2_000_000, Self.t0 + 3_000_000])
    }

    @Test func nordicBLE_272() throws {
        let read = try readCapture(Self.nordicFile)
        let aa: UInt32 = 0x8E89_BED6
        #expect(read.seen == [
            .ll(channel: 37, rssi: -60, accessAddress: aa, phy: 1, crc: .ok, pdu: Self.advInd),
            .ll(channel: 37, rssi: -60, accessAddress: aa, phy: 1, crc: .bad, pdu: Self.advInd),
            .ll(channel: 38, rssi: -60, accessAddress: aa, phy: 1, crc: .ok, pdu: Self.advInd),
        ])
        #expect(read.stats.crcBad == 1)
    }

    /// A little-endian microsecond pcap file of `linkType` holding `packets` at t0, t0+1 s, …
    static func pcap(linkType: UInt32, _ packets: [[UInt8]]) -> [UInt8] {
        func le32(_ v: UInt32) -> [UInt8] { (0 ..< 4).map { UInt8(truncatingIfNeeded: v >> (8 * $0)) } }
        var out = hx("d4c3b2a1 0200 0400 00000000 00000000 ffff0000") + le32(linkType)
        for (i, p) in packets.enumerated() {
            out += le32(1_700_000_000 + UInt32(i)) + le32(0) + le32(UInt32(p.count)) + le32(UInt32(p.count)) + p
        }
        return out
    }

    /// A 256 record: pseudo-header with `flags` and `rf` channel, then AA, PDU, CRC.
    static func leLL(rf: UInt8 = 0, flags: UInt16 = 0x0013, aa: [UInt8] = [0xD6, 0xBE, 0x89, 0x8E],
                     ci: [UInt8] = [], pdu: [UInt8], crc: UInt32? = nil) -> [UInt8] {
        let c = crc ?? Self.crc(pdu)
        return [rf, 0xC4, 0x80, 0x00] + [0xD6, 0xBE, 0x89, 0x8E]
            + [UInt8(flags & 0xFF), UInt8(flags >> 8)] + aa + ci + pdu
            + [UInt8(c & 0xFF), UInt8(c >> 8 & 0xFF), UInt8(c >> 16)]
    }

    @Test func leLinkLayerCodedPHYSkipsTheCodingIndicator() throws {
        // Flags PHY = 2 (Coded): a CI byte follows the access address; it is not in the CRC.
        let read = try readCapture(Self.pcap(linkType: 256, [Self.leLL(flags: 0x8013, ci: [0x01], pdu: Self.advInd)]))
        #expect(read.seen == [.ll(channel: 37, rssi: -60, accessAddress: 0x8E89_BED6, phy: 3, crc: .ok, pdu: Self.advInd)])
    }

    @Test func leLinkLayerDataChannelTakesTheSniffersVerdict() throws {
        // A data channel PDU (LLID 1, empty): its CRC init belongs to the connection.
        let aa: [UInt8] = [0x78, 0x56, 0x34, 0x12]
        let pdu: [UInt8] = [0x01, 0x00]
        let file = Self.pcap(linkType: 256, [
            Self.leLL(rf: 5, flags: 0x0013 | 0x0C00, aa: aa, pdu: pdu, crc: 0),  // checked, valid
            Self.leLL(rf: 5, flags: 0x0013 | 0x0400, aa: aa, pdu: pdu, crc: 0),  // checked, invalid
            Self.leLL(rf: 5, flags: 0x0011, aa: aa, pdu: pdu, crc: 0),           // unchecked, no signal
        ])
        let read = try readCapture(file)
        #expect(read.seen == [
            .ll(channel: 4, rssi: -60, accessAddress: 0x1234_5678, phy: 1, crc: .ok, pdu: pdu),
            .ll(channel: 4, rssi: -60, accessAddress: 0x1234_5678, phy: 1, crc: .bad, pdu: pdu),
            .ll(channel: 4, rssi: nil, accessAddress: 0x1234_5678, phy: 1, crc: .unchecked, pdu: pdu),
        ])
        #expect(read.stats.crcUnchecked == 1)
    }

    @Test func leLinkLayerRecordsThatAreMalformed() throws {
        let recordData = 24 + 16  // file offset of the first record's data
        // Header-length field says 0x17 but 0x16 bytes follow; the CRC is right for these bytes.
        var wrongLength = Self.advInd
        wrongLength[1] = 0x17
        let file = Self.pcap(linkType: 256, [
            Self.leLL(flags: 0x0012, pdu: Self.advInd),        // still whitened
            Self.leLL(rf: 40, pdu: Self.advInd),                // no such RF channel
            Self.leLL(flags: 0xC013, pdu: Self.advInd),         // PHY 3 is reserved
            Self.leLL(pdu: wrongLength),
            Array(Self.leLL(pdu: Self.advInd).prefix(15)),      // pseudo-header + AA + too little
        ])
        let read = try readCapture(file)
        let size = 10 + 4 + Self.advInd.count + 3 + 16  // each full record: header + data
        #expect(read.seen == [
            .malformed(.malformed(at: recordData + 8, .llWhitened)),
            .malformed(.unsupported(at: recordData + size, value: 40)),
            .malformed(.unsupported(at: recordData + 2 * size + 8, value: 0xC013)),
            .malformed(.malformed(at: recordData + 3 * size + 15, .llLength)),
            .malformed(.truncated(at: recordData + 4 * size + 14, need: 4)),
        ])
        #expect(read.stats.malformed == 5)
        #expect(read.error == nil)
    }

    @Test func nordicRecordsThatAreNotPDUsOrAreBroken() throws {
        // Packet ID 0x0E (PING_RESP) is a sniffer control packet: `.other`, not an error.
        let ping: [UInt8] = [0x00, 0x02, 0x00, 0x03, 0x01, 0x00, 0x0E, 0xAB, 0xCD]
        // Payload length one more than the record holds.
        var short = Array(Self.nordicFile[(24 + 16) ..< (24 + 16 + 48)])
        short[1] = 0x2A
        // Protocol version 9.
        var future = Array(Self.nordicFile[(24 + 16) ..< (24 + 16 + 48)])
        future[3] = 9
        let read = try readCapture(Self.pcap(linkType: 272, [ping, short, future]))
        #expect(read.seen == [
            .other(opcode: 0x0E, index: 0, [0xAB, 0xCD]),
            .malformed(.malformed(at: 24 + 16 + 9 + 16 + 1, .nordicLength)),
            .malformed(.unsupported(at: 24 + 16 + 9 + 16 + 48 + 16 + 3, value: 9)),
        ])
    }

    @Test func nordicChannelIndexAbove39IsRefused() throws {
        // Core 5.4, Vol 6, Part A, §2: channel indices are 0…39. The nRF Sniffer's event packet
        // carries the index (here at record byte 9); 39 is read, 40 and 0xFF are refused at
        // that byte, and reading goes on. (FuzzCapture found 0xFF passed through as a channel.)
        let record = Array(Self.nordicFile[(24 + 16) ..< (24 + 16 + 48)])
        var last = record, forty = record, ff = record
        last[9] = 39
        forty[9] = 40
        ff[9] = 0xFF
        let read = try readCapture(Self.pcap(linkType: 272, [last, forty, ff, record]))
        let second = 24 + 16 + 48 + 16, third = second + 48 + 16
        #expect(read.seen == [
            .ll(channel: 39, rssi: -60, accessAddress: 0x8E89_BED6, phy: 1, crc: .ok, pdu: Self.advInd),
            .malformed(.unsupported(at: second + 9, value: 40)),
            .malformed(.unsupported(at: third + 9, value: 0xFF)),
            .ll(channel: 37, rssi: -60, accessAddress: 0x8E89_BED6, phy: 1, crc: .ok, pdu: Self.advInd),
        ])
        #expect(read.error == nil)
    }

    @Test func pcapHeaderErrors() {
        var ethernet = Self.h4File
        ethernet[20] = 1
        #expect(throws: WireError.unsupported(at: 20, value: 1)) { try readCapture(ethernet) }
        var v3 = Self.h4File
        v3[4] = 3
        #expect(throws: WireError.unsupported(at: 4, value: 3)) { try readCapture(v3) }
        #expect(throws: WireError.truncated(at: 20, need: 4)) { try readCapture(Array(Self.h4File[..<20])) }
    }

    @Test func pcapImpossibleRecordLength() throws {
        var file = Self.h4File
        file[24 + 8 + 3] = 0x10  // captured length 0x10000006
        let read = try readCapture(file)
        #expect(read.records.isEmpty)
        #expect(read.error == .badLength(at: 32, length: 0x1000_0006))
    }

    @Test func pcapTruncatedAtEveryByte() {
        for file in [Self.h4File, Self.h4WithPHDRFile, Self.monitorFile, Self.leLLFile, Self.nordicFile] {
            expectTruncationEverywhere(file, minimum: 0)
        }
    }

    @Test func pcapTruncatedRecordNamesTheOffset() throws {
        // Cut 3 bytes into the second record's 35-byte packet at 24 + 22 + 16 = 62.
        let read = try readCapture(Array(Self.h4File[..<65]))
        #expect(read.records.count == 1)
        #expect(read.error == .truncated(at: 62, need: 32))
    }

    // MARK: pcapng

    @Test func pcapngBothSectionsAndAllPacketBlocks() throws {
        let read = try readCapture(Self.pcapngFile)
        #expect(read.error == nil)
        #expect(read.seen == [
            .hci(.event, .controllerToHost, index: 0, Self.event),
            .ll(channel: 37, rssi: -55, accessAddress: 0x8E89_BED6, phy: 1, crc: .ok, pdu: Self.advInd),
            .hci(.command, .hostToController, index: 0, Self.command),
            .malformed(.malformed(at: 276, .pcapngUnknownInterface)),
            .hci(.event, .controllerToHost, index: 0, Self.extEvent),
        ])
        #expect(read.records.map(\.offset) == [100, 168, 244, 268, 404])
        #expect(read.records.map(\.timestamp) == [
            Self.t0,                   // 1700000000000000005 ns
            Self.t0 + 1,               // microseconds by default
            Self.t0 + 1,               // SPB: no timestamp, the previous one
            Self.t0 + 1,
            Self.t0 + 10_500_000,      // (8 · 1700000000 + 4) / 8 s + 10 s
        ])
    }

    @Test func pcapngTruncatedAtEveryByte() {
        expectTruncationEverywhere(Self.pcapngFile, minimum: 0)
    }

    /// A little-endian pcapng block.
    static func block(_ type: UInt32, _ body: [UInt8]) -> [UInt8] {
        func le32(_ v: UInt32) -> [UInt8] { (0 ..< 4).map { UInt8(truncatingIfNeeded: v >> (8 * $0)) } }
        let padded = body + [UInt8](repeating: 0, count: (4 - body.count % 4) % 4)
        let total = UInt32(12 + padded.count)
        return le32(type) + le32(total) + padded + le32(total)
    }
    static let shb = block(0x0A0D_0D0A, hx("4d3c2b1a 0100 0000 ffffffffffffffff"))
    static func idb(_ linkType: UInt16, options: [UInt8] = []) -> [UInt8] {
        block(1, [UInt8(linkType & 0xFF), UInt8(linkType >> 8), 0, 0, 0, 0, 0, 0] + options)
    }
    static func epb(_ interface: UInt8, _ data: [UInt8]) -> [UInt8] {
        block(6, [interface, 0, 0, 0] + [UInt8](repeating: 0, count: 8) + [UInt8(data.count), 0, 0, 0, UInt8(data.count), 0, 0, 0] + data)
    }

    @Test func pcapngBlockFramingErrors() throws {
        var trailer = Self.pcapngFile
        trailer[60] = 0x24  // first IDB's trailing length
        #expect(try readCapture(trailer).error == .malformed(at: 60, .pcapngTrailer))
        var notMultipleOf4 = Self.pcapngFile
        notMultipleOf4[36] = 0x21
        #expect(try readCapture(notMultipleOf4).error == .badLength(at: 36, length: 0x21))
        var tooShort = Self.pcapngFile
        tooShort[36] = 0x08
        #expect(try readCapture(tooShort).error == .badLength(at: 36, length: 8))
        var bom = Self.pcapngFile
        bom[8] = 0x00
        #expect(try readCapture(bom).error == .malformed(at: 8, .pcapngByteOrder))
        var major = Self.pcapngFile
        major[12] = 2
        #expect(try readCapture(major).error == .unsupported(at: 12, value: 2))
        // Records read before the damage still came out.
        var late = Self.pcapngFile
        late[244 + 4] = 0x1C  // SPB length 24 → 28: its trailer no longer matches
        let read = try readCapture(late)
        #expect(read.records.count == 2)
        #expect(read.error == .malformed(at: 244 + 24, .pcapngTrailer))
    }

    @Test func pcapngOptionRunningPastItsBlock() throws {
        let file = Self.shb + Self.idb(187, options: hx("0900 4000 06000000"))
        #expect(try readCapture(file).error == .malformed(at: Self.shb.count + 16, .pcapngOption))
    }

    @Test func pcapngMustStartWithASection() {
        let file = Self.idb(187)
        _ = file.withUnsafeBytes { buf in
            #expect(throws: WireError.malformed(at: 0, .pcapngNoSection)) { _ = try PCAPNGReader(buf) }
        }
    }

    @Test func pcapngInterfaceCapacityPlusOne() throws {
        // 16 interfaces fit; a packet on the 17th is counted as malformed, not misread.
        var file = Self.shb
        for _ in 0 ..< PCAPNGReader.maxInterfaces { file += Self.idb(187) }
        file += Self.idb(254)
        let packet = [0x04] + Self.event
        file += Self.epb(15, packet) + Self.epb(16, packet)
        let read = try readCapture(file)
        #expect(read.seen.first == .hci(.event, .controllerToHost, index: 0, Self.event))
        #expect(read.seen.last == .malformed(.malformed(at: read.records[1].offset + 8, .pcapngTooManyInterfaces)))
    }

    @Test func pcapngUnknownLinkTypeIsCountedNotAnError() throws {
        let file = Self.shb + Self.idb(1) + Self.epb(0, [1, 2, 3])
        let read = try readCapture(file)
        #expect(read.seen == [.unsupported(linkType: 1, [1, 2, 3])])
        #expect(read.stats.unsupported == 1)
    }

    @Test func pcapngCapturedLengthPastTheBlock() throws {
        var epb = Self.epb(0, [0x04, 0x0E, 0x00])
        epb[20] = 0x40  // captured length 64 in a 3-byte body
        let file = Self.shb + Self.idb(187) + epb
        let read = try readCapture(file)
        #expect(read.seen == [.malformed(.badLength(at: Self.shb.count + 20 + 20, length: 64))])
    }

    @Test func timestampResolutions() {
        var i = PCAPNGInterface()
        #expect(i.microseconds(1_700_000_000_000_000) == 1_700_000_000_000_000)  // default 10^-6
        i.timestampResolution = 9
        #expect(i.microseconds(1_700_000_000_000_000_999) == 1_700_000_000_000_000)
        i.timestampResolution = 3
        #expect(i.microseconds(1_700_000_000_123) == 1_700_000_000_123_000)
        i.timestampResolution = 0
        #expect(i.microseconds(UInt64.max) == Int64.max)  // saturates
        i.timestampResolution = 0x80 | 10  // 2^-10 s
        #expect(i.microseconds(1024) == 1_000_000)
        i.timestampResolution = 127  // 10^-127 s: every count is below a microsecond
        #expect(i.microseconds(UInt64.max) == 0)
        i.timestampResolution = 6
        i.timestampOffset = -1
        #expect(i.microseconds(0) == -1_000_000)
        i.timestampOffset = .max
        #expect(i.microseconds(0) == Int64.max)
    }
}
