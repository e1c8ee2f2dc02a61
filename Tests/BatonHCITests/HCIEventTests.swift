// LE Advertising Report (Core 5.4, Vol 4, Part E, §7.7.65.2) and LE Extended Advertising Report
// (§7.7.65.13). The two event vectors below were put in a btsnoop file and decoded by
// Wireshark 4.0.17 (tshark -V) as: report 1 ADV_IND, random, c0:11:22:33:44:55, flags 0x06,
// RSSI -60; report 2 SCAN_RSP, public, 00:1a:7d:da:71:13, name "Baton", RSSI -75; and the
// extended report: type 0x0000 complete, random c1:22:33:44:55:66, PHY 1M/2M, SID 3, TX power
// 127 (n/a), RSSI -64, 11 bytes of data.
import Testing
import BatonTestSupport
import BatonHCI
import BatonWire

/// What a report said, copied out of the borrowed event.
struct ReportCopy: Equatable {
    var eventType: UInt16
    var legacyEventType: UInt8?
    var addressType: UInt8
    var address: UInt64
    var rssi: Int8
    var data: [UInt8]
    var isExtended: Bool
    var primaryPHY: UInt8
    var secondaryPHY: UInt8
    var sid: UInt8
    var txPower: Int8
    var periodicInterval: UInt16
    var directAddressType: UInt8
    var directAddress: UInt64

    init(_ r: AdvertisingReport) {
        eventType = r.eventType; legacyEventType = r.legacyEventType; addressType = r.addressType
        address = r.address; rssi = r.rssi; data = Array(r.data); isExtended = r.isExtended
        primaryPHY = r.primaryPHY; secondaryPHY = r.secondaryPHY; sid = r.sid; txPower = r.txPower
        periodicInterval = r.periodicInterval; directAddressType = r.directAddressType
        directAddress = r.directAddress
    }
}

/// Runs the parser over `event`, returning the reports and the count, or the error.
func advertisingReports(_ event: [UInt8]) -> Result<[ReportCopy], WireError> {
    event.withUnsafeBytes { buf in
        var reports: [ReportCopy] = []
        do throws(WireError) {
            let n = try HCIEvent.forEachAdvertisingReport(inEvent: buf) { reports.append(ReportCopy($0)) }
            #expect(n == reports.count)
            return .success(reports)
        } catch {
            // The whole event is validated first: on error no report was delivered.
            #expect(reports.isEmpty)
            return .failure(error)
        }
    }
}

extension Result {
    var thrown: Failure? { if case .failure(let e) = self { e } else { nil } }
    var value: Success? { if case .success(let v) = self { v } else { nil } }
}

@Suite struct HCIEventTests {
    // §7.7.65.2, two reports, report after report (BlueZ monitor/packet.c le_adv_report_evt):
    //   3e 20          LE Meta, Parameter_Total_Length 32
    //   02 02          Subevent LE Advertising Report, Num_Reports 2
    //   00 01 554433 2211c0 03 020106 c4          ADV_IND, random, C0:11:22:33:44:55, flags, -60 dBm
    //   04 00 1371da 7d1a00 07 0609426174 6f6e b5 SCAN_RSP, public, 00:1A:7D:DA:71:13, "Baton", -75 dBm
    static let legacyTwo = hx(
        "3e20 0202 00 01 554433 2211c0 03 020106 c4 04 00 1371da 7d1a00 07 0609426174 6f6e b5")

    // §7.7.65.13, one report:
    //   3e 25 0d 01                  LE Meta, 37 bytes, LE Extended Advertising Report, 1 report
    //   0000                         Event_Type: non-connectable, non-scannable, complete
    //   01 665544 3322c1             random, C1:22:33:44:55:66
    //   01 02 03 7f c0 0000          Primary 1M, Secondary 2M, SID 3, TX power n/a, RSSI -64, no periodic
    //   00 000000000000              Direct_Address_Type / Direct_Address
    //   0b 0201060716d2fc40004142    Data_Length 11, data
    static let extendedOne = hx(
        "3e 25 0d 01 0000 01 665544 3322c1 01 02 03 7f c0 0000 00 000000000000 0b 0201060716d2fc40004142")

    @Test func legacyReportWithTwoReports_7_7_65_2() throws {
        let reports = try #require(advertisingReports(Self.legacyTwo).value)
        #expect(reports.count == 2)
        let a = reports[0], b = reports[1]
        #expect(a.legacyEventType == 0x00)
        #expect(a.eventType == 0x13)  // ADV_IND → legacy | scannable | connectable
        #expect(a.addressType == 1)
        #expect(a.address == 0xC0_11_22_33_44_55)
        #expect(a.data == [0x02, 0x01, 0x06])
        #expect(a.rssi == -60)
        #expect(!a.isExtended)
        #expect(a.sid == 0xFF && a.txPower == 127 && a.primaryPHY == 1 && a.secondaryPHY == 0)
        #expect(b.legacyEventType == 0x04)
        #expect(b.eventType == 0x1A)  // SCAN_RSP → legacy | scan response | scannable
        #expect(b.addressType == 0)
        #expect(b.address == 0x00_1A_7D_DA_71_13)
        #expect(b.data == Array("\u{06}\u{09}Baton".utf8))
        #expect(b.rssi == -75)
    }

    @Test func addressPrintsMostSignificantOctetFirst() {
        #expect(AdvertisingReport.addressString(0xC0_11_22_33_44_55) == "C0:11:22:33:44:55")
        #expect(AdvertisingReport.addressString(0x00_1A_7D_DA_71_13) == "00:1A:7D:DA:71:13")
    }

    @Test func extendedReport_7_7_65_13() throws {
        let reports = try #require(advertisingReports(Self.extendedOne).value)
        #expect(reports.count == 1)
        let r = reports[0]
        #expect(r.isExtended)
        #expect(r.legacyEventType == nil)
        #expect(r.eventType == 0x0000)
        #expect(r.addressType == 1)
        #expect(r.address == 0xC1_22_33_44_55_66)
        #expect(r.primaryPHY == 1)
        #expect(r.secondaryPHY == 2)
        #expect(r.sid == 3)
        #expect(r.txPower == 127)
        #expect(r.rssi == -64)
        #expect(r.periodicInterval == 0)
        #expect(r.directAddressType == 0 && r.directAddress == 0)
        #expect(r.data == hx("0201060716d2fc40004142"))
    }

    @Test func extendedEventTypeBits() {
        // §7.7.65.13 Event_Type: connectable scannable legacy, scan response, data status 2.
        let report = AdvertisingReport(eventType: 0b100_1011, addressType: 0, address: 0, rssi: 0,
                                       data: UnsafeRawBufferPointer(start: nil, count: 0), isExtended: true)
        #expect(report.isConnectable && report.isScannable && report.isScanResponse)
        #expect(!report.isDirected && !report.isLegacyPDU)
        #expect(report.dataStatus == 2)
    }

    @Test func legacyEventTypesMapToTheExtendedTable() {
        #expect(AdvertisingReport.extendedEventType(legacy: 0x00) == 0b001_0011)
        #expect(AdvertisingReport.extendedEventType(legacy: 0x01) == 0b001_0101)
        #expect(AdvertisingReport.extendedEventType(legacy: 0x02) == 0b001_0010)
        #expect(AdvertisingReport.extendedEventType(legacy: 0x03) == 0b001_0000)
        #expect(AdvertisingReport.extendedEventType(legacy: 0x04) == 0b001_1010)
        #expect(AdvertisingReport.extendedEventType(legacy: 0x05) == nil)
    }

    @Test func truncatedAtEveryByte() {
        for vector in [Self.legacyTwo, Self.extendedOne] {
            for cut in 0 ..< vector.count {
                // As cut off in transit: Parameter_Total_Length promises more than is there.
                let error = advertisingReports(Array(vector[..<cut])).thrown
                if cut < 2 {
                    #expect(error == .truncated(at: cut, need: 1), "cut \(cut)")
                } else {
                    #expect(error == .truncated(at: 2, need: vector.count - cut), "cut \(cut)")
                }
            }
        }
    }

    @Test func shortenedParameterLengthAtEveryByte() {
        // Parameter_Total_Length agrees with the bytes, but the reports inside do not fit.
        for vector in [Self.legacyTwo, Self.extendedOne] {
            for cut in 2 ..< vector.count {
                var event = Array(vector[..<cut])
                event[1] = UInt8(cut - 2)
                let result = advertisingReports(event)
                switch result.thrown {
                case .truncated(let at, let need)?:
                    #expect(at >= 2 && at <= cut && need > 0, "cut \(cut)")
                case .malformed(_, let reason)?:
                    // A cut right after Num_Reports = 0 is impossible; nothing else is malformed.
                    Issue.record("cut \(cut): unexpected \(reason)")
                default:
                    Issue.record("cut \(cut): expected truncation, got \(result)")
                }
            }
        }
    }

    @Test func zeroReportsIsMalformed() {
        #expect(advertisingReports(hx("3e02 0200")).thrown == .malformed(at: 3, .advNoReports))
        #expect(advertisingReports(hx("3e02 0d00")).thrown == .malformed(at: 3, .advNoReports))
    }

    @Test func legacyDataLength31IsTheMaximum() throws {
        let data31 = [UInt8](repeating: 0x11, count: 31)
        let ok = [0x3E, UInt8(2 + 10 + 31), 0x02, 0x01, 0x03, 0x00] + [UInt8](repeating: 0xAA, count: 6)
            + [31] + data31 + [0xD0]
        let reports = try #require(advertisingReports(ok).value)
        #expect(reports.first?.data == data31)
        #expect(reports.first?.rssi == -48)
    }

    @Test func legacyDataLength32IsMalformed() {
        // §7.7.65.2: Data_Length 0x00 to 0x1F. The length byte is at offset 12.
        let bad = [0x3E, UInt8(2 + 10 + 32), 0x02, 0x01, 0x03, 0x00] + [UInt8](repeating: 0xAA, count: 6)
            + [32] + [UInt8](repeating: 0x11, count: 32) + [0xD0]
        #expect(advertisingReports(bad).thrown == .malformed(at: 12, .advDataTooLong))
    }

    @Test func extendedDataLength229IsTheMaximum() throws {
        let data = [UInt8](repeating: 0x22, count: 229)
        let event = [0x3E, 255] + Array(Self.extendedOne[2 ..< 27]) + [229] + data
        #expect(event.count == 257)
        let reports = try #require(advertisingReports(event).value)
        #expect(reports.first?.data == data)
    }

    @Test func extendedDataLength230IsMalformed() {
        // 230 cannot fit an event (2 + 24 + 230 > 255); the length byte alone condemns it.
        let event = [0x3E, 255] + Array(Self.extendedOne[2 ..< 27]) + [230] + [UInt8](repeating: 0x22, count: 229)
        #expect(advertisingReports(event).thrown == .malformed(at: 27, .extAdvDataTooLong))
    }

    @Test func trailingByteAfterTheReports() {
        var event = Self.legacyTwo + [0x00]
        event[1] += 1
        #expect(advertisingReports(event).thrown == .trailing(at: event.count - 1, count: 1))
    }

    @Test func parameterLengthShorterThanThePacket() {
        let event = Self.legacyTwo + [0x00]
        #expect(advertisingReports(event).thrown == .trailing(at: event.count - 1, count: 1))
    }

    @Test func lengthIsCheckedForEveryEventNotOnlyReports() {
        // A Command Complete whose Parameter_Total_Length disagrees with the packet is bad
        // bytes even though it carries no report.
        #expect(advertisingReports(hx("0e 04 01 0c20 00 ff")).thrown == .trailing(at: 6, count: 1))
        #expect(advertisingReports(hx("0e 04 01 0c20")).thrown == .truncated(at: 2, need: 1))
    }

    @Test func reservedLegacyEventType() {
        var event = Self.legacyTwo
        event[4] = 0x05
        #expect(advertisingReports(event).thrown == .malformed(at: 4, .advEventTypeReserved))
    }

    @Test func otherEventsAndSubeventsYieldNothing() {
        // Command Complete (§7.7.14) and LE Connection Complete (§7.7.65.1).
        #expect(advertisingReports(hx("0e 04 01 0c20 00")).value?.isEmpty == true)
        #expect(advertisingReports(hx("3e 02 01 00")).value?.isEmpty == true)
        // LE Meta with no subevent byte is truncated, not silently ignored.
        #expect(advertisingReports(hx("3e 00")).thrown == .truncated(at: 2, need: 1))
    }

    @Test func threeReportsComeOutInOrder() throws {
        // Same reports, repeated: report-major order means RSSI follows each report's data.
        var event: [UInt8] = [0x3E, 0x00, 0x02, 0x03]
        for rssi: UInt8 in [0xF0, 0xE0, 0xD0] {
            event += [0x03, 0x00, 1, 2, 3, 4, 5, 6, 0x00, rssi]
        }
        event[1] = UInt8(event.count - 2)
        let reports = try #require(advertisingReports(event).value)
        #expect(reports.map(\.rssi) == [-16, -32, -48])
        #expect(reports.allSatisfy { $0.address == 0x06_05_04_03_02_01 && $0.data.isEmpty && $0.eventType == 0x10 })
    }
}
