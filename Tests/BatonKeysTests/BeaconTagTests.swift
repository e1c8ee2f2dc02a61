// Beacon tags (docs/security.md §4) and rotating device ids (§3).
import BatonTestSupport
import Testing
@testable import BatonKeys
import BatonWire

private let otherKeys = try! GroupKeys.derive(secret: GroupSecret(bytes: hx("ffeeddccbbaa99887766554433221100")))

private func tagged(_ beacon: ActivityBeacon = protocolVector1, keys: GroupKeys = vectorKeys) throws -> [UInt8] {
    try advertisement(beacon, BeaconTagger(key: keys.beaconKey))
}

@Suite struct BeaconTagTests {
    @Test func aTagFromAnotherGroupsKeyDoesNotVerify() throws {
        let advert = try tagged(keys: otherKeys)
        let tagger = try BeaconTagger(key: vectorKeys.beaconKey)
        #expect(!advert.withUnsafeBytes { tagger.verify(advertisingData: $0) })
        #expect(try advert.withUnsafeBytes { try BeaconTagger(key: otherKeys.beaconKey).verify(advertisingData: $0) })
    }

    @Test func theOpenGroupsZeroTagDoesNotVerify() throws {
        let advert = try advertisement(protocolVector1, OpenGroup())
        #expect(try !advert.withUnsafeBytes { try BeaconTagger(key: vectorKeys.beaconKey).verify(advertisingData: $0) })
    }

    @Test func aFlippedBitAnywhereInTheBeaconFailsVerification() throws {
        // Bytes 3–30: the manufacturer AD header (a flip breaks the framing or hides the
        // beacon), the company id, the value and the tag (a flip changes what the tag covers,
        // or the tag). Reserved flag bits (byte 8, bits 4–7) included: the tag is checked over
        // the bytes as received, not over a re-encoding that would drop them.
        let advert = try tagged()
        let tagger = try BeaconTagger(key: vectorKeys.beaconKey)
        #expect(advert.withUnsafeBytes { tagger.verify(advertisingData: $0) })
        for byte in 3..<31 {
            for bit in 0..<8 {
                var forged = advert
                forged[byte] ^= 1 << bit
                #expect(!forged.withUnsafeBytes { tagger.verify(advertisingData: $0) }, "byte \(byte) bit \(bit)")
            }
        }
    }

    @Test func theFlagsADIsOutsideTheTag() throws {
        // protocol.md §2.4: the tag covers the company id through the PSM. The Flags AD
        // (bytes 0–2) carries no beacon field; changing its value leaves the beacon valid.
        var advert = try tagged()
        advert[2] = 0x1A
        #expect(try advert.withUnsafeBytes { try BeaconTagger(key: vectorKeys.beaconKey).verify(advertisingData: $0) })
    }

    @Test func verifyChecksTheTagBytesInConstantTimeOverRawBytes() throws {
        let advert = try tagged()
        let tagger = try BeaconTagger(key: vectorKeys.beaconKey)
        let ok = advert.withUnsafeBytes { raw in
            tagger.verify(signed: UnsafeRawBufferPointer(rebasing: raw[5..<27]), tag: UnsafeRawBufferPointer(rebasing: raw[27..<31]))
        }
        #expect(ok)
        let short = advert.withUnsafeBytes { raw in
            tagger.verify(signed: UnsafeRawBufferPointer(rebasing: raw[5..<26]), tag: UnsafeRawBufferPointer(rebasing: raw[27..<31]))
        }
        #expect(!short, "21 signed bytes are not a beacon")
    }

    @Test func noBeaconOrAMalformedOneDoesNotVerify() throws {
        let tagger = try BeaconTagger(key: vectorKeys.beaconKey)
        let advert = try tagged()
        #expect(!advert.withUnsafeBytes { tagger.verify(advertisingData: $0, companyID: 0x004C) })
        #expect(![UInt8]().withUnsafeBytes { tagger.verify(advertisingData: $0) })
        #expect(!Array(advert[..<30]).withUnsafeBytes { tagger.verify(advertisingData: $0) }, "cut: AD overlong")
    }

    @Test func eachSequenceAndFlagsGiveADifferentTag() throws {
        // The nonce carries device id, company id, flags and sequence (§4.1): every save
        // (sequence bump) and every flag change is a new nonce and, here, a new tag.
        let tagger = try BeaconTagger(key: vectorKeys.beaconKey)
        var seen = Set<UInt32>()
        for seq in UInt16(0)..<64 {
            for flags in UInt8(0)...0x0F {
                var b = protocolVector1
                b.sequence = seq
                b.flags = BeaconFlags(rawValue: flags)
                let advert = try advertisement(b, tagger)
                seen.insert(UInt32(advert[27]) | UInt32(advert[28]) << 8 | UInt32(advert[29]) << 16 | UInt32(advert[30]) << 24)
            }
        }
        #expect(seen.count == 64 * 16)
    }
}

@Suite struct DeviceIDTests {
    @Test func newIDsAreRPAShapedAndResolveUnderTheirKeyOnly() throws {
        let mine = try DeviceIDResolver(key: vectorKeys.beaconKey)
        let theirs = try DeviceIDResolver(key: otherKeys.beaconKey)
        var ids = Set<UInt64>()
        for _ in 0..<200 {
            let id = try mine.newDeviceID()
            #expect(id >> 46 == 0b01, "prand's top bits are 0b01 (Core Vol 6 Part B §1.3.2.2)")
            let random = id >> 24 & 0x3F_FFFF
            #expect(random != 0 && random != 0x3F_FFFF)
            #expect(mine.resolves(id))
            #expect(!theirs.resolves(id))
            ids.insert(id)
        }
        #expect(ids.count > 190, "22 random bits: 200 draws almost never collide")
    }

    @Test func aFlippedBitInTheIDDoesNotResolve() throws {
        let r = try DeviceIDResolver(key: vectorKeys.beaconKey)
        let id = r.deviceID(prand: 0x5A_1234)
        for bit in 0..<48 {
            #expect(!r.resolves(id ^ 1 << UInt64(bit)), "bit \(bit)")
        }
    }

    @Test func anIDThatIsNotRPAShapedNeverResolves() throws {
        // A static (0b11) or non-resolvable (0b00) shaped prand is not ours, whatever its hash.
        let r = try DeviceIDResolver(key: vectorKeys.beaconKey)
        for top: UInt32 in [0b00, 0b10, 0b11] {
            let prand = top << 22 | 0x1234
            #expect(!r.resolves(UInt64(prand) << 24 | UInt64(r.hash(prand: prand))))
        }
    }
}
