// btsnoop (BlueZ src/shared/btsnoop.h/.c, Wireshark wiretap/btsnoop.c): all fields big-endian.
//   header: "btsnoop\0" | version 1 | datalink
//   record: original length | included length | flags | drops | timestamp (µs since 0 AD)
// The three files below are built with our writer and compared byte for byte with files that
// Wireshark 4.0.17 decoded as intended (`tshark -r … -t ud`):
//   1002: 22:13:20.000000 host → controller LE Set Scan Enable; .001 controller → host LE Meta
//         (LE Advertising Report, 2 reports); .002 Rcvd ATT Read Request
//   1001: the same packets without H4 bytes
//   2001: New Index (hci0), System Note (index 65535), command, LE Extended Advertising Report,
//         ACL RX
import Testing
import BatonTestSupport
import BatonHCI
import BatonWire

/// Builds a file by calling `body` with a ByteWriter over a buffer of `capacity` bytes.
func buildFile(capacity: Int = 4096, _ body: (inout ByteWriter) throws -> Void) throws -> [UInt8] {
    var storage = [UInt8](repeating: 0, count: capacity)
    let count = try storage.withUnsafeMutableBytes { buf in
        var w = ByteWriter(buf)
        try body(&w)
        return w.count
    }
    return Array(storage[..<count])
}

@Suite struct BTSnoopTests {
    /// 2023-11-14T22:13:20Z.
    static let t0: Int64 = 1_700_000_000_000_000
    static let command = hx("0c2002 0100")                       // LE Set Scan Enable
    static let event = HCIEventTests.legacyTwo                                // LE Advertising Report
    static let acl = hx("4020 0700 0300 0400 0a0100")            // ATT Read Request

    static let h4File = hx("""
        6274736e6f6f7000 00000001 000003ea
        00000006 00000006 00000002 00000000 00e2e7d7274dc000 01 0c20020100
        00000023 00000023 00000003 00000000 00e2e7d7274dc3e8 04 3e20020200015544332211c003020106c404001371da7d1a000706094261746f6eb5
        0000000c 0000000c 00000001 00000000 00e2e7d7274dc7d0 02 40200700030004000a0100
        """)
    static let hciFile = hx("""
        6274736e6f6f7000 00000001 000003e9
        00000005 00000005 00000002 00000000 00e2e7d7274dc000 0c20020100
        00000022 00000022 00000003 00000000 00e2e7d7274dc3e8 3e20020200015544332211c003020106c404001371da7d1a000706094261746f6eb5
        0000000b 0000000b 00000001 00000000 00e2e7d7274dc7d0 40200700030004000a0100
        """)
    static let newIndex = hx("00 01 665544332211") + Array("hci0\0\0\0\0".utf8)  // type, bus USB, addr, name[8]
    static let systemNote = Array("Bluetooth monitor ver 5.66\0".utf8)
    static let monitorFile = hx("""
        6274736e6f6f7000 00000001 000007d1
        00000010 00000010 00000000 00000000 00e2e7d7274dc000 0001665544332211 6863693000000000
        0000001b 0000001b ffff000c 00000000 00e2e7d7274dc3e8 426c7565746f6f7468206d6f6e69746f722076657220352e363600
        00000005 00000005 00000002 00000000 00e2e7d7274dc7d0 0c20020100
        00000027 00000027 00000003 00000000 00e2e7d7274dcbb8 3e250d010000016655443322c10102037fc00000000000000000000b0201060716d2fc40004142
        0000000b 0000000b 00000005 00000000 00e2e7d7274dcfa0 40200700030004000a0100
        """)

    @Test func timestampOrigin() {
        // Unix epoch = 0x00DCDDB30F2F8000 µs after 0000-01-01 (Android BTSNOOP_EPOCH_DELTA).
        #expect(BTSnoop.unixMicroseconds(fromBTSnoop: 0x00DC_DDB3_0F2F_8000) == 0)
        // BlueZ writes from 2000-01-01 = 946684800 s, offset 0x00E03AB44A676000: same origin.
        #expect(BTSnoop.unixMicroseconds(fromBTSnoop: 0x00E0_3AB4_4A67_6000) == 946_684_800_000_000)
        #expect(BTSnoop.btsnoopTimestamp(unixMicroseconds: Self.t0) == 0x00E2_E7D7_274D_C000)
        // A corrupt timestamp wraps instead of trapping.
        _ = BTSnoop.unixMicroseconds(fromBTSnoop: 0)
        _ = BTSnoop.unixMicroseconds(fromBTSnoop: .max)
    }

    @Test func writesTheH4FileByteForByte() throws {
        let file = try buildFile { w in
            try BTSnoop.writeHeader(datalink: BTSnoop.datalinkH4, into: &w)
            try Self.command.withUnsafeBytes { b in
                try BTSnoop.writeH4Record(timestamp: Self.t0, type: .command, direction: .hostToController, packet: b, into: &w)
            }
            try Self.event.withUnsafeBytes { b in
                try BTSnoop.writeH4Record(timestamp: Self.t0 + 1000, type: .event, direction: .controllerToHost, packet: b, into: &w)
            }
            try Self.acl.withUnsafeBytes { b in
                try BTSnoop.writeH4Record(timestamp: Self.t0 + 2000, type: .acl, direction: .controllerToHost, packet: b, into: &w)
            }
        }
        #expect(file == Self.h4File)
    }

    @Test func readsTheH4File_1002() throws {
        let read = try readCapture(Self.h4File)
        #expect(read.error == nil)
        #expect(read.seen == [
            .hci(.command, .hostToController, index: 0, Self.command),
            .hci(.event, .controllerToHost, index: 0, Self.event),
            .hci(.acl, .controllerToHost, index: 0, Self.acl),
        ])
        #expect(read.records.map(\.timestamp) == [Self.t0, Self.t0 + 1000, Self.t0 + 2000])
        #expect(read.records.map(\.offset) == [16, 16 + 24 + 6, 16 + 24 + 6 + 24 + 35])
    }

    @Test func writesAndReadsTheHCIFile_1001() throws {
        let file = try buildFile { w in
            try BTSnoop.writeHeader(datalink: BTSnoop.datalinkHCI, into: &w)
            for (i, (type, direction, packet)) in [(H4PacketType.command, HCIDirection.hostToController, Self.command),
                                                     (.event, .controllerToHost, Self.event),
                                                     (.acl, .controllerToHost, Self.acl)].enumerated() {
                try packet.withUnsafeBytes { b in
                    try BTSnoop.writeHCIRecord(timestamp: Self.t0 + Int64(i) * 1000, type: type, direction: direction,
                                               packet: b, into: &w)
                }
            }
        }
        #expect(file == Self.hciFile)
        let read = try readCapture(file)
        #expect(read.seen == [
            .hci(.command, .hostToController, index: 0, Self.command),
            .hci(.event, .controllerToHost, index: 0, Self.event),
            .hci(.acl, .controllerToHost, index: 0, Self.acl),
        ])
    }

    @Test func writesAndReadsTheMonitorFile_2001() throws {
        let ext = HCIEventTests.extendedOne
        let file = try buildFile { w in
            try BTSnoop.writeHeader(datalink: BTSnoop.datalinkMonitor, into: &w)
            try Self.newIndex.withUnsafeBytes { b in
                try BTSnoop.writeMonitorRecord(timestamp: Self.t0, index: 0, opcode: LinuxMonitor.newIndex, packet: b, into: &w)
            }
            try Self.systemNote.withUnsafeBytes { b in
                try BTSnoop.writeMonitorRecord(timestamp: Self.t0 + 1000, index: 0xFFFF, opcode: LinuxMonitor.systemNote,
                                               packet: b, into: &w)
            }
            try Self.command.withUnsafeBytes { b in
                try BTSnoop.writeMonitorRecord(timestamp: Self.t0 + 2000, index: 0, type: .command,
                                               direction: .hostToController, packet: b, into: &w)
            }
            try ext.withUnsafeBytes { b in
                try BTSnoop.writeMonitorRecord(timestamp: Self.t0 + 3000, index: 0, type: .event,
                                               direction: .controllerToHost, packet: b, into: &w)
            }
            try Self.acl.withUnsafeBytes { b in
                try BTSnoop.writeMonitorRecord(timestamp: Self.t0 + 4000, index: 0, type: .acl,
                                               direction: .controllerToHost, packet: b, into: &w)
            }
        }
        #expect(file == Self.monitorFile)
        let read = try readCapture(file)
        #expect(read.seen == [
            .other(opcode: 0, index: 0, Self.newIndex),
            .other(opcode: 12, index: 0xFFFF, Self.systemNote),
            .hci(.command, .hostToController, index: 0, Self.command),
            .hci(.event, .controllerToHost, index: 0, ext),
            .hci(.acl, .controllerToHost, index: 0, Self.acl),
        ])
        #expect(read.stats.other == 2)
        #expect(read.stats.hci == 3)
        #expect(read.stats.malformed == 0)
    }

    @Test func monitorOpcodesRoundTrip() {
        for type in H4PacketType.allCases {
            for direction in [HCIDirection.hostToController, .controllerToHost] {
                let opcode = LinuxMonitor.opcode(type: type, direction: direction)
                let back = LinuxMonitor.packet(opcode: opcode)
                #expect(back?.0 == type)
                if type != .command && type != .event { #expect(back?.1 == direction) }
            }
        }
        #expect(LinuxMonitor.packet(opcode: LinuxMonitor.indexInfo) == nil)
        #expect(BTSnoop.monitorFlags(index: 1, opcode: 3) == 0x0001_0003)
    }

    @Test func truncatedAtEveryByte() {
        for file in [Self.h4File, Self.hciFile, Self.monitorFile] {
            expectTruncationEverywhere(file, minimum: 0)
        }
    }

    @Test func truncatedInsideARecordNamesTheOffset() throws {
        // Cut 10 bytes into the second record's 35-byte packet (which starts at 46 + 24 = 70).
        let read = try readCapture(Array(Self.h4File[..<80]))
        #expect(read.records.count == 1)
        #expect(read.error == .truncated(at: 70, need: 25))
        // Cut inside the second record header: 46 + 6 bytes, the included length is cut.
        let read2 = try readCapture(Array(Self.h4File[..<52]))
        #expect(read2.records.count == 1)
        #expect(read2.error == .truncated(at: 50, need: 2))
    }

    @Test func headerErrors() {
        var bad = Self.h4File
        bad[7] = 0x20
        #expect(throws: WireError.malformed(at: 0, .btsnoopMagic)) { try readCapture(bad) }
        var v2 = Self.h4File
        v2[11] = 2
        #expect(throws: WireError.unsupported(at: 8, value: 2)) { try readCapture(v2) }
        var bcsp = Self.h4File
        bcsp[15] = 0xEB  // 1003, BCSP
        #expect(throws: WireError.unsupported(at: 12, value: 1003)) { try readCapture(bcsp) }
        #expect(throws: WireError.truncated(at: 12, need: 4)) { try readCapture(Array(Self.h4File[..<12])) }
    }

    @Test func unknownH4IndicatorIsOneMalformedRecord() throws {
        var file = Self.h4File
        file[16 + 24] = 0x07  // first record's indicator
        let read = try readCapture(file)
        #expect(read.error == nil)
        #expect(read.seen.first == .malformed(.unsupported(at: 40, value: 7)))
        #expect(read.seen.count == 3)
        #expect(read.stats.malformed == 1)
        #expect(read.stats.hci == 2)
    }

    @Test func emptyH4RecordIsMalformed() throws {
        let file = try buildFile { w in
            try BTSnoop.writeHeader(datalink: BTSnoop.datalinkH4, into: &w)
            try BTSnoop.writeRecord(timestamp: 0, flags: 0, packet: UnsafeRawBufferPointer(start: nil, count: 0), into: &w)
        }
        #expect(try readCapture(file).seen == [.malformed(.truncated(at: 40, need: 1))])
    }

    @Test func impossibleIncludedLength() throws {
        var file = Self.h4File
        file[20] = 0x7F  // included length 0x7F000006
        let read = try readCapture(file)
        #expect(read.records.isEmpty)
        #expect(read.error == .badLength(at: 20, length: 0x7F00_0006))
    }

    @Test func writerThrowsNoRoomAndWritesNothingPastIt() {
        var storage = [UInt8](repeating: 0, count: 20)
        storage.withUnsafeMutableBytes { buf in
            var w = ByteWriter(buf)
            #expect(throws: WireError.noRoom(need: 32, have: 20)) {
                try BTSnoop.writeHeader(datalink: 1002, into: &w)
                try BTSnoop.writeHeader(datalink: 1002, into: &w)
            }
            #expect(w.count == 16)
        }
    }

    @Test func cutPacketsAreMarked() throws {
        // Original length 8, included 6: the capturing tool cut it (snaplen).
        var file = Self.h4File
        file[19] = 8
        let read = try file.withUnsafeBytes { buf in
            var reader = try CaptureReader(buf)
            return try reader.next()?.isCut ?? false
        }
        #expect(read)
    }
}
