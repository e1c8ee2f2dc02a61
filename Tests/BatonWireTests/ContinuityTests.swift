// Apple Continuity: docs/protocol.md §4. Frames are the manufacturer value after 4C 00.
import BatonTestSupport
import Testing
@testable import BatonWire


/// Decodes every message of a value, as the replay prints them: (type name, summary).
private func messages(_ value: [UInt8]) throws -> [String] {
    try value.withUnsafeBytes { raw in
        var it = try ContinuityIterator(validating: raw)
        var out: [String] = []
        while let m = it.next() {
            switch try m.decode() {
            case .handoff(let h):
                out.append("handoff clip=\(h.hasClipboardData) seq=\(h.sequence) tag=\(h.authTag) enc=\(h.encrypted.count)")
            case .nearbyInfo(let n):
                out.append("nearby-info status=\(n.statusFlags) action=\(n.actionCode) data=\(n.dataFlags) rest=\(n.rest.count)")
            case .nearbyAction(let a):
                out.append("nearby-action flags=\(a.actionFlags) type=\(a.actionType) rest=\(a.rest.count)")
            case .iBeacon(let b):
                out.append("ibeacon uuid0=\(b.uuid[0]) major=\(b.major) minor=\(b.minor) power=\(b.measuredPower)")
            case .other(let type, let v):
                out.append("\(ContinuityType.name(type)) type=\(type) len=\(v.count)")
            }
        }
        return out
    }
}

private func error(_ value: [UInt8]) -> WireError? {
    do { _ = try messages(value); return nil } catch { return error as? WireError }
}

@Suite struct ContinuityTests {
    @Test func handoffThenNearbyInfo() throws {
        // §4.2 Handoff: clipboard 0x08, sequence 0x1234 (LE), tag 0xAB, 10 encrypted bytes;
        // §4.3 Nearby Info: status 1, action 0xB, data flags 0x1C, 3-byte auth tag.
        let v = hx("0C 0E 08 3412 AB 00112233445566778899  10 05 1B 1C 7A8D2E")
        #expect(try messages(v) == ["handoff clip=true seq=4660 tag=171 enc=10",
                                    "nearby-info status=1 action=11 data=28 rest=3"])
    }

    @Test func iBeaconIsBigEndianMajorMinor() throws {
        // §4.5: 02 15, UUID, major 0x0001, minor 0x0102, measured power -59 (0xC5).
        let v = hx("02 15 E2C56DB5DFFB48D2B060D0F5A71096E0 0001 0102 C5")
        #expect(try messages(v) == ["ibeacon uuid0=226 major=1 minor=258 power=-59"])
    }

    @Test func iBeaconMustBe21Bytes() {
        #expect(error(hx("02 14 E2C56DB5DFFB48D2B060D0F5A71096E0 0001 01C5")) == .malformed(at: 2, .continuityShort))
        #expect(error(hx("02 16 E2C56DB5DFFB48D2B060D0F5A71096E0 0001 0102 C5 00")) == .trailing(at: 23, count: 1))
    }

    @Test func nearbyActionKeepsItsParameters() throws {
        #expect(try messages(hx("0F 05 90 00 B5DA60")) == ["nearby-action flags=144 type=0 rest=3"])
    }

    @Test func unknownTypesAreKeptAsTypeAndBytes() throws {
        #expect(try messages(hx("42 02 AABB  07 01 00")) == ["other type=66 len=2", "proximity-pairing type=7 len=1"])
    }

    @Test func homeKitPacksASubtypeIntoItsLengthByte() throws {
        // HAP R2 §7.4.2.1.1: 0x31 = subtype 1, length 17. Heard from a real accessory.
        let v = hx("06 31 013E4F2538572406000200 0102AC64E5F1")
        #expect(try messages(v) == ["homekit type=6 len=17"])
    }

    @Test func emptyAppleDataIsMalformed() {
        #expect(error([]) == .malformed(at: 0, .continuityEmpty))
    }

    @Test func aTLVRunningPastTheEndIsMalformed() {
        #expect(error(hx("10 05 1B 1C 7A8D2E  0C 0E 08 3412")) == .malformed(at: 7, .continuityOverlong))
    }

    @Test func aLoneTypeByteIsTruncated() {
        #expect(error(hx("10 02 1B 1C  0C")) == .truncated(at: 4, need: 1))
    }

    @Test func fixedPartsAreChecked() {
        #expect(error(hx("0C 03 08 3412")) == .malformed(at: 2, .continuityShort), "Handoff needs 4 bytes")
        #expect(error(hx("10 01 1B")) == .malformed(at: 2, .continuityShort), "Nearby Info needs 2")
        #expect(error(hx("0F 01 90")) == .malformed(at: 2, .continuityShort), "Nearby Action needs 2")
    }

    @Test func everyTruncationOfARealFrameIsTyped() {
        let v = hx("0C 0E 08 3412 AB 00112233445566778899  10 05 1B 1C 7A8D2E")
        // Every cut except the one between the two messages (byte 16) leaves a broken TLV.
        for n in 0..<v.count where n != 16 {
            #expect(error(Array(v[..<n])) != nil, "cut at \(n)")
        }
    }
}

@Suite struct AdvertisementContentTests {
    private func content(_ bytes: [UInt8]) throws -> (AdvertisementContent.Kind, Int, String?, UInt16?) {
        try bytes.withUnsafeBytes { raw in
            let c = try AdvertisementContent.decode(raw)
            return (c.kind, c.structures, c.localName.map { String(decoding: $0, as: UTF8.self) }, c.companyID)
        }
    }

    @Test func aBeaconIsClassifiedAsBeacon() throws {
        let r = try content(hx(beaconVector1))
        #expect(r.0 == .beacon && r.1 == 2 && r.3 == 0xFFFF)
    }

    @Test func appleDataIsContinuity() throws {
        let r = try content(hx("020106 0CFF 4C00 1005 1B1C7A8D2E 0C00"))
        #expect(r.0 == .continuity && r.3 == 0x004C)
    }

    @Test func anOrdinaryAdvertIsOther() throws {
        let r = try content(hx("020106 0809 4B69746368656E 020A F4"))
        #expect(r.0 == .other && r.2 == "Kitchen")
    }

    @Test func aBrokenBeaconOrContinuityNamesTheAdvertOffset() {
        #expect(throws: WireError.malformed(at: 7, .continuityOverlong)) {
            try content(hx("020106 07FF 4C00 1009 1B1C"))
        }
        var beacon = hx(beaconVector1)
        beacon[26] = 0x01 // PSM high byte: 0x0180
        #expect(throws: WireError.malformed(at: 25, .beaconBadPSM)) { try content(beacon) }
    }
}
