// The format-sniffing capture reader (docs/captures.md), the LL advertising PDU → report
// helper (Core 5.4, Vol 6, Part B, §2.3.1), and helpers the BTSnoop and PCAP suites share.
import Testing
import BatonTestSupport
import BatonHCI
import BatonWire

/// A record copied out of the borrowed file, comparable in tests.
enum SeenRecord: Equatable {
    case hci(H4PacketType, HCIDirection, index: UInt16, [UInt8])
    case ll(channel: UInt8, rssi: Int8?, accessAddress: UInt32, phy: UInt8, crc: LinkLayerCRC, pdu: [UInt8])
    case other(opcode: UInt16, index: UInt16, [UInt8])
    case unsupported(linkType: UInt32, [UInt8])
    case malformed(WireError)

    init(_ kind: CaptureRecord.Kind) {
        switch kind {
        case .hci(let h): self = .hci(h.type, h.direction, index: h.adapterIndex, Array(h.bytes))
        case .linkLayer(let l):
            self = .ll(channel: l.channel, rssi: l.rssi, accessAddress: l.accessAddress, phy: l.phy,
                       crc: l.crc, pdu: Array(l.pdu))
        case .other(let opcode, let index, let bytes): self = .other(opcode: opcode, index: index, Array(bytes))
        case .unsupported(let linkType, let bytes): self = .unsupported(linkType: linkType, Array(bytes))
        case .malformed(let e): self = .malformed(e)
        }
    }
}

struct SeenCapture {
    var format: CaptureFormat
    var records: [(timestamp: Int64, offset: Int, seen: SeenRecord)] = []
    var error: WireError?
    var stats = CaptureStats()
    var seen: [SeenRecord] { records.map(\.seen) }
}

/// Reads a whole capture through `CaptureReader`. Header errors throw; a record-level error
/// is returned in `error`, after which the reader must yield nil.
func readCapture(_ file: [UInt8]) throws -> SeenCapture {
    try file.withUnsafeBytes { buf in
        var reader = try CaptureReader(buf)
        var out = SeenCapture(format: reader.format)
        while true {
            do throws(WireError) {
                guard let record = try reader.next() else { break }
                out.records.append((record.timestamp, record.offset, SeenRecord(record.kind)))
            } catch {
                out.error = error
                let after = try? reader.next()
                #expect(after == nil, "a reader must yield nil after throwing")
                break
            }
        }
        out.stats = reader.stats
        return out
    }
}

/// Cuts `file` at every length from `minimum` on: the records that come out must be a prefix
/// of the full read, and any error must be `.truncated` at or before the cut.
func expectTruncationEverywhere(_ file: [UInt8], minimum: Int, sourceLocation: SourceLocation = #_sourceLocation) {
    guard let full = try? readCapture(file) else {
        Issue.record("the uncut file does not read", sourceLocation: sourceLocation)
        return
    }
    #expect(full.error == nil, sourceLocation: sourceLocation)
    for cut in minimum ..< file.count {
        do {
            let part = try readCapture(Array(file[..<cut]))
            #expect(part.seen == Array(full.seen.prefix(part.seen.count)), "cut \(cut)", sourceLocation: sourceLocation)
            if let error = part.error {
                guard case .truncated(let at, let need) = error else {
                    Issue.record("cut \(cut): \(error)", sourceLocation: sourceLocation)
                    continue
                }
                #expect(at <= cut && need > 0, "cut \(cut): \(error)", sourceLocation: sourceLocation)
                // Every record that ends before the damage came out (a record's end is taken as the
                // next record's offset, which for pcapng may include blocks between them).
                let complete = full.records.indices.filter { i in
                    let end = i + 1 < full.records.count ? full.records[i + 1].offset : file.count
                    return end <= cut
                }.count
                let started = full.records.filter { $0.offset < cut }.count
                #expect(part.records.count >= complete && part.records.count <= started,
                        "cut \(cut)", sourceLocation: sourceLocation)
            }
        } catch {
            // Only a cut inside the file header may fail at init, and only as truncation.
            guard case .truncated? = error as? WireError else {
                Issue.record("cut \(cut): header error \(error)", sourceLocation: sourceLocation)
                continue
            }
        }
    }
}

/// Calls `body` with the advertising report an LL PDU amounts to (copied), or nil.
func llReport(_ pdu: [UInt8], rssi: Int8 = -70) -> Result<ReportCopy?, WireError> {
    pdu.withUnsafeBytes { buf in
        do throws(WireError) { return .success(try AdvertisingReport(linkLayerPDU: buf, rssi: rssi).map(ReportCopy.init)) }
        catch { return .failure(error) }
    }
}

@Suite struct CaptureTests {
    @Test func sniffsEachFormat() throws {
        #expect(try readCapture(BTSnoopTests.h4File).format == .btsnoop(datalink: 1002))
        #expect(try readCapture(PCAPTests.h4File).format == .pcap(linkType: 187, nanoseconds: false, bigEndian: false))
        #expect(try readCapture(PCAPTests.h4WithPHDRFile).format == .pcap(linkType: 201, nanoseconds: false, bigEndian: true))
        #expect(try readCapture(PCAPTests.monitorFile).format == .pcap(linkType: 254, nanoseconds: true, bigEndian: false))
        #expect(try readCapture(PCAPTests.pcapngFile).format == .pcapng)
    }

    @Test func unknownFormatNamesItsFirstBytes() {
        #expect(throws: WireError.unsupported(at: 0, value: 0x504B_0304)) {  // a zip file
            try readCapture(hx("504b0304 14000000"))
        }
    }

    @Test func filesShorterThanAMagic() {
        #expect(throws: WireError.truncated(at: 0, need: 4)) { try readCapture([]) }
        #expect(throws: WireError.truncated(at: 0, need: 1)) { try readCapture([0x62, 0x74, 0x73]) }
    }

    @Test func sniffedCapturesFeedTheSameReportPipeline() throws {
        // The same ADV_IND seen by a controller (HCI report in btsnoop 1002) and by a sniffer
        // (LL PDU in pcap 256) must give the same address, type and data.
        func reports(_ file: [UInt8]) throws -> [ReportCopy] {
            try file.withUnsafeBytes { buf in
                var reader = try CaptureReader(buf)
                var out: [ReportCopy] = []
                while let record = try reader.next() {
                    switch record.kind {
                    case .hci(let h) where h.type == .event:
                        _ = try HCIEvent.forEachAdvertisingReport(inEvent: h.bytes) { out.append(ReportCopy($0)) }
                    case .linkLayer(let l):
                        if let r = try l.advertisingReport() { out.append(ReportCopy(r)) }
                    default: break
                    }
                }
                return out
            }
        }
        let fromHCI = try reports(BTSnoopTests.h4File)
        let fromLL = try reports(PCAPTests.leLLFile)
        // HCI: 2 reports. LL: 3 good frames (the bad-CRC one is dropped).
        #expect(fromHCI.count == 2)
        #expect(fromLL.count == 3)
        let hci = fromHCI[0], ll = fromLL[0]
        #expect(hci.address == ll.address)
        #expect(hci.addressType == ll.addressType)
        #expect(hci.eventType == ll.eventType)
        #expect(hci.legacyEventType == ll.legacyEventType)
        #expect(ll.rssi == -60)
        #expect(Array(ll.data.prefix(3)) == hci.data)
    }

    // Core 5.4, Vol 6, Part B, §2.3.1: legacy advertising PDUs.

    @Test func advIndBecomesAReport() throws {
        let pdu = hx("40165544332211c002010606094261746f6e0516d2fc4000")
        let r = try #require(try llReport(pdu).get())
        #expect(r.legacyEventType == 0x00 && r.eventType == 0x13)
        #expect(r.addressType == 1)  // TxAdd
        #expect(r.address == 0xC0_11_22_33_44_55)
        #expect(r.data == Array(pdu[8...]))
        #expect(r.rssi == -70)
        #expect(!r.isExtended && r.primaryPHY == 1)
    }

    @Test func pduTypesMapToLegacyEventTypes() throws {
        // PDU type → legacy Event_Type: ADV_NONCONN_IND 0b0010 → 0x03, ADV_SCAN_IND 0b0110 → 0x02,
        // SCAN_RSP 0b0100 → 0x04.
        for (pduType, legacy) in [(UInt8(0x02), UInt8(0x03)), (0x06, 0x02), (0x04, 0x04)] {
            let r = try #require(try llReport([pduType, 6, 1, 2, 3, 4, 5, 6]).get())
            #expect(r.legacyEventType == legacy)
            #expect(r.addressType == 0)
            #expect(r.data.isEmpty)
        }
    }

    @Test func advDirectIndCarriesTheTarget() throws {
        let r = try #require(try llReport(hx("810ca1a2a3a4a5a6b1b2b3b4b5f6")).get())
        #expect(r.legacyEventType == 0x01 && r.eventType == 0x15)
        #expect(r.address == 0xA6_A5_A4_A3_A2_A1 && r.addressType == 0)
        #expect(r.directAddress == 0xF6_B5_B4_B3_B2_B1 && r.directAddressType == 1)  // RxAdd
        #expect(r.data.isEmpty)
    }

    @Test func pdusAScannerDoesNotReport() throws {
        // SCAN_REQ (0b0011), CONNECT_IND (0b0101), ADV_EXT_IND (0b0111), reserved (0b1111).
        for type: UInt8 in [0x03, 0x05, 0x07, 0x0F] {
            #expect(try llReport([type, 12] + [UInt8](repeating: 0, count: 12)).get() == nil)
        }
    }

    @Test func badAdvertisingPDULengths() {
        // Length says 7, 6 bytes follow.
        #expect(llReport([0x00, 7, 1, 2, 3, 4, 5, 6]).thrown == .truncated(at: 2, need: 1))
        #expect(llReport([0x00, 5, 1, 2, 3, 4, 5, 6]).thrown == .trailing(at: 7, count: 1))
        // Shorter than AdvA.
        #expect(llReport([0x00, 5, 1, 2, 3, 4, 5]).thrown == .malformed(at: 1, .llAdvLength))
        // ADV_DIRECT_IND must be exactly AdvA + TargetA.
        #expect(llReport([0x01, 6, 1, 2, 3, 4, 5, 6]).thrown == .malformed(at: 1, .llAdvLength))
        // AdvData of 32 bytes.
        #expect(llReport([0x00, 38] + [UInt8](repeating: 0, count: 38)).thrown == .malformed(at: 1, .advDataTooLong))
        #expect(llReport([0x00, 37] + [UInt8](repeating: 0, count: 37)).value != nil)
        #expect(llReport([0x00]).thrown == .truncated(at: 1, need: 1))
    }

    @Test func statsCountEveryKind() throws {
        let read = try readCapture(PCAPTests.pcapngFile)
        #expect(read.stats.records == 5)
        #expect(read.stats.hci == 3)
        #expect(read.stats.linkLayer == 1)
        #expect(read.stats.crcOK == 1)
        #expect(read.stats.malformed == 1)
    }
}
