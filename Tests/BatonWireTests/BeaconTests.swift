// Activity beacon v1: docs/protocol.md §2. Vectors are the bytes on air, in hex.
import BatonTestSupport
import Testing
@testable import BatonWire


/// protocol.md §2.5, vector 1: streams + web URL, sequence 258, type "com.example.reader.article",
/// group hash 0xA1B2C3D4, device id 5A:12:34:56:78:9A, PSM 0x0080, open group (tag 0).
let beaconVector1 = """
    02 01 06
    1B FF FF FF
    01 03 02 01 B7 4B 9B BE D4 C3 B2 A1 9A 78 56 34 12 5A 80 00 00 00 00 00
    """

let beacon1 = ActivityBeacon(flags: [.supportsStreams, .hasWebURL], sequence: 258,
                             activityTypeHash: activityTypeHash("com.example.reader.article".utf8),
                             groupHash: 0xA1B2_C3D4, deviceID: 0x5A12_3456_789A, psm: 0x0080)

private func decodeAdvert(_ bytes: [UInt8], companyID: UInt16 = ActivityBeacon.defaultCompanyID) throws -> ActivityBeacon? {
    try bytes.withUnsafeBytes { raw in try ActivityBeacon.find(inAdvertisingData: raw, companyID: companyID) }
}

private func decodeValue(_ bytes: [UInt8]) throws -> ActivityBeacon {
    try bytes.withUnsafeBytes { raw in try ActivityBeacon.decode(value: raw) }
}

private func encode(_ beacon: ActivityBeacon, companyID: UInt16 = ActivityBeacon.defaultCompanyID,
                    authenticator: some BeaconAuthenticator = OpenGroup(), capacity: Int = 31) throws -> [UInt8] {
    var out = [UInt8](repeating: 0xEE, count: capacity)
    let n = try out.withUnsafeMutableBytes { raw in
        var w = ByteWriter(raw)
        try beacon.encodeAdvertisement(companyID: companyID, authenticator: authenticator, into: &w)
        return w.count
    }
    return Array(out[..<n])
}

@Suite struct BeaconTests {
    @Test func typeHashIsFNV1a32() {
        // FNV-1a 32 published test vectors (draft-eastlake-fnv, §A): "" , "a", "foobar".
        #expect(activityTypeHash("".utf8) == 0x811C_9DC5)
        #expect(activityTypeHash("a".utf8) == 0xE40C_292C)
        #expect(activityTypeHash("foobar".utf8) == 0xBF9C_F968)
    }

    @Test func vector1EncodesToTheSpecBytes() throws {
        let bytes = try encode(beacon1)
        #expect(bytes == hx(beaconVector1))
        #expect(bytes.count == 31, "one legacy advertisement")
    }

    @Test func vector1DecodesToItsFields() throws {
        let b = try #require(try decodeAdvert(hx(beaconVector1)))
        #expect(b == beacon1)
        #expect(b.flags.contains(.supportsStreams) && b.flags.contains(.hasWebURL))
        #expect(!b.flags.contains(.invalidated) && !b.flags.contains(.relayed))
        #expect(b.sequence == 258)
        #expect(b.deviceID == 0x5A12_3456_789A)
        #expect(b.psm == 0x80)
    }

    @Test func everyFlagRoundTrips() throws {
        for raw in UInt8(0)...0x0F {
            var b = beacon1
            b.flags = BeaconFlags(rawValue: raw)
            #expect(try decodeAdvert(encode(b)) == b)
        }
    }

    @Test func reservedFlagBitsAreIgnoredOnReceipt() throws {
        // §2.2: b4–b7 are written 0 and ignored, so a v1 decoder reads a future v1 sender.
        var bytes = hx(beaconVector1)
        bytes[8] = 0xF3
        #expect(try decodeAdvert(bytes)?.flags == [.supportsStreams, .hasWebURL])
    }

    @Test func aConfiguredCompanyIDIsTheOnlyOneMatched() throws {
        let bytes = try encode(beacon1, companyID: 0x0A0B)
        #expect(Array(bytes[5...6]) == [0x0B, 0x0A])
        #expect(try decodeAdvert(bytes, companyID: 0x0A0B) == beacon1)
        #expect(try decodeAdvert(bytes) == nil, "0xFFFF is not in this advert")
    }

    @Test func theTagCoversCompanyIDThroughPSM() throws {
        struct Recorder: BeaconAuthenticator {
            func tag(signed: UnsafeRawBufferPointer) -> UInt32 {
                // A stand-in keyed function: sums the signed bytes, so any change shows.
                #expect(signed.count == 22)
                return signed.reduce(UInt32(0x1000_0000)) { $0 &+ UInt32($1) }
            }
        }
        let bytes = try encode(beacon1, authenticator: Recorder())
        let expected = hx(beaconVector1)[5..<27].reduce(UInt32(0x1000_0000)) { $0 &+ UInt32($1) }
        let b = try #require(try decodeAdvert(bytes))
        #expect(b.tag == expected)
        #expect(b.verify(authenticator: Recorder()))
        var forged = b
        forged.sequence &+= 1
        #expect(!forged.verify(authenticator: Recorder()), "a changed sequence no longer verifies")
    }

    @Test func anEncoderNeeds31Bytes() {
        #expect(throws: WireError.noRoom(need: 31, have: 30)) { try encode(beacon1, capacity: 30) }
    }

    // Decoder edge cases: empty, truncated at every byte, overlong, bad version, bad PSM.

    @Test func emptyValueIsTruncated() {
        #expect(throws: WireError.truncated(at: 0, need: 1)) { try decodeValue([]) }
    }

    @Test func everyTruncationIsATypedError() {
        let value = Array(hx(beaconVector1)[7...])
        for n in 1..<value.count {
            #expect(throws: WireError.truncated(at: n, need: 24 - n)) { try decodeValue(Array(value[..<n])) }
        }
    }

    @Test func oneBytePastTheValueIsTrailing() {
        let value = Array(hx(beaconVector1)[7...]) + [0x00]
        #expect(throws: WireError.trailing(at: 24, count: 1)) { try decodeValue(value) }
    }

    @Test func otherVersionsAreUnsupported() {
        var value = Array(hx(beaconVector1)[7...])
        for v: UInt8 in [0x00, 0x02, 0xFF] {
            value[0] = v
            #expect(throws: WireError.unsupported(at: 0, value: UInt64(v))) { try decodeValue(value) }
        }
    }

    @Test func psmAboveTheLERangeIsMalformed() throws {
        // Core 5.4, Vol 3, Part A, §4.22: LE PSMs are 0x0001–0x00FF.
        var value = Array(hx(beaconVector1)[7...])
        value[18] = 0x00; value[19] = 0x01
        #expect(throws: WireError.malformed(at: 18, .beaconBadPSM)) { try decodeValue(value) }
        value[18] = 0xFF; value[19] = 0x00
        #expect(try decodeValue(value).psm == 0xFF)
    }

    @Test func errorsInsideAnAdvertNameTheAdvertOffset() {
        var bytes = hx(beaconVector1)
        bytes[7] = 0x09 // version
        #expect(throws: WireError.unsupported(at: 7, value: 9)) { try decodeAdvert(bytes) }
    }
}
