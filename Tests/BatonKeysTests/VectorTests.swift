// The test vectors of docs/security.md §8, byte for byte. The same hex is in
// Interop/vectors.py, which recomputes every vector with Python's `cryptography` (and
// pycryptodome when present); `independentImplementationsAgree` runs it.
import Foundation
import BatonTestSupport
import Testing
@testable import BatonKeys
import BatonWire

/// §8.1: the group secret of every vector.
let vectorSecret = GroupSecret(bytes: hx("00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f"))
let vectorKeys = try! GroupKeys.derive(secret: vectorSecret)

/// docs/protocol.md §2.5 vector 1 (streams + web URL, sequence 258, group 0xA1B2C3D4,
/// device id 5A:12:34:56:78:9A, PSM 0x80), before its tag.
let protocolVector1 = ActivityBeacon(flags: [.supportsStreams, .hasWebURL], sequence: 258,
                                     activityTypeHash: activityTypeHash("com.example.reader.article".utf8),
                                     groupHash: 0xA1B2_C3D4, deviceID: 0x5A12_3456_789A, psm: 0x0080)

/// docs/payload.md §5: the 116-byte activity payload, the plaintext of §8.5.
let payloadVector = hx("""
    a6 00 01 01 78 1a 636f6d2e6578616d706c652e7265616465722e61727469636c65
    02 69 436861707465722033
    03 d8 20 78 1b 68747470733a2f2f6578616d706c652e636f6d2f626f6f6b732f33
    04 81 68 706f736974696f6e
    05 a3 65 6e69676874 f5 65 7363616c65 f9 3e00 68 706f736974696f6e 19 04d2
    """)

func bytes(_ key: BeaconKey) -> [UInt8] { key.withUnsafeBytes { Array($0) } }
func bytes(_ key: PayloadKey) -> [UInt8] { key.withUnsafeBytes { Array($0) } }

func advertisement(_ beacon: ActivityBeacon, _ auth: some BeaconAuthenticator) throws -> [UInt8] {
    var out = [UInt8](repeating: 0, count: ActivityBeacon.advertisementLength)
    try out.withUnsafeMutableBytes { raw in
        var w = ByteWriter(raw)
        try beacon.encodeAdvertisement(authenticator: auth, into: &w)
    }
    return out
}

@Suite struct VectorTests {
    @Test func textFormOfTheVectorSecret() throws {
        // §8.1
        #expect(vectorSecret.text == "BATON-GROUP-V1:AAAQEAYEAUDAOCAJBIFQYDIOB4QL")
        let parsed = try GroupSecret(text: "BATON-GROUP-V1:AAAQEAYEAUDAOCAJBIFQYDIOB4QL")
        #expect(parsed.withUnsafeBytes { Array($0) } == hx("000102030405060708090a0b0c0d0e0f"))
    }

    @Test func secretDerivesBothKeysAndTheGroupHash() {
        // §8.2: HKDF-SHA256, empty salt, info "baton v1 beacon key" / "baton v1 payload key";
        // group hash from the beacon key, info "baton v1 group hash", LE.
        #expect(bytes(vectorKeys.beaconKey) == hx("2cabcb7c48e938d4343275273bb1bd42"))
        #expect(bytes(vectorKeys.payloadKey) == hx("6216f930ddbd11d714c6bbff8deb51d2"))
        #expect(vectorKeys.groupHash == 0x7CEC_7226)
        #expect(vectorKeys.beaconKey.text == "BATON-BEACON-V1:FSV4W7CI5E4NINBSOUTTXMN5IIVO")
    }

    @Test func aGatewayGetsTheGroupHashFromTheBeaconKeyAlone() throws {
        let key = try BeaconKey(text: "BATON-BEACON-V1:FSV4W7CI5E4NINBSOUTTXMN5IIVO")
        #expect(try key.groupHash() == 0x7CEC_7226)
    }

    @Test func ahMatchesTheCoreSpecSampleData() throws {
        // Core 5.4, Vol 3, Part H, §D.7: IRK ec0234a3…397d9b, prand 0x708194 → hash 0x0dfbaa.
        // The IRK and r' are AES inputs most significant byte first (Part H §2.2.1); the hash
        // is the last three bytes of the output block.
        let r = try DeviceIDResolver(irk: hx("ec0234a357c8ad05341010a60a397d9b"))
        #expect(r.hash(prand: 0x70_8194) == 0x0D_FBAA)
        #expect(r.deviceID(prand: 0x70_8194) == 0x7081_940D_FBAA)
        #expect(r.resolves(0x7081_940D_FBAA))
    }

    @Test func deviceIDUnderTheVectorBeaconKey() throws {
        // §8.3: prand 0x5A1234 → 5A:12:34:E5:DC:BB; on air BB DC E5 34 12 5A.
        let r = try DeviceIDResolver(key: vectorKeys.beaconKey)
        #expect(r.deviceID(prand: 0x5A_1234) == 0x5A12_34E5_DCBB)
        #expect(r.resolves(0x5A12_34E5_DCBB))
    }

    @Test func protocolVector1WithItsTag() throws {
        // §8.4, first vector: docs/protocol.md §2.5 vector 1's fields, tag under the vector
        // beacon key. Nonce 9A 78 56 34 12 5A | FF FF | 03 | 02 01 00 00.
        let tagger = try BeaconTagger(key: vectorKeys.beaconKey)
        let advert = try advertisement(protocolVector1, tagger)
        #expect(advert == hx("""
            02 01 06
            1B FF FF FF
            01 03 02 01 B7 4B 9B BE D4 C3 B2 A1 9A 78 56 34 12 5A 80 00 67 02 F2 32
            """))
        #expect(advert.withUnsafeBytes { tagger.verify(advertisingData: $0) })
    }

    @Test func aBeaconAGatewayAcceptsWhole() throws {
        // §8.4, second vector: vector 1 with the derived group hash and a resolvable device id.
        let tagger = try BeaconTagger(key: vectorKeys.beaconKey)
        var beacon = protocolVector1
        beacon.groupHash = vectorKeys.groupHash
        beacon.deviceID = try DeviceIDResolver(key: vectorKeys.beaconKey).deviceID(prand: 0x5A_1234)
        let advert = try advertisement(beacon, tagger)
        #expect(advert == hx("""
            02 01 06
            1B FF FF FF
            01 03 02 01 B7 4B 9B BE 26 72 EC 7C BB DC E5 34 12 5A 80 00 60 D4 91 3B
            """))
        let decoded = try #require(try advert.withUnsafeBytes { try ActivityBeacon.find(inAdvertisingData: $0) })
        #expect(try DeviceIDResolver(key: vectorKeys.beaconKey).resolves(decoded.deviceID))
        #expect(decoded.groupHash == vectorKeys.groupHash)
        #expect(decoded.verify(authenticator: tagger))
    }

    @Test func identityKeysAndIdentityIDs() throws {
        // §8.6 (§3.1): IK_n = HKDF-SHA256(IKM = beacon key, salt = "", info = "baton v1 device
        // identity" ‖ n (2 bytes, LE), L = 16). The identity id is group hash ‖ n (48 bits).
        let key = vectorKeys.beaconKey
        #expect(try key.identityKey(number: 0) == hx("a2 7b 4a ff 4e 6e d9 7d 23 63 25 d0 98 22 63 d4"))
        #expect(try key.identityKey(number: 3) == hx("31 d7 12 ae d3 3e c9 5d f5 93 bc 51 68 a8 27 f9"))
        #expect(DeviceIdentity.id(groupHash: vectorKeys.groupHash, number: 0) == 0x7CEC_7226_0000)
        #expect(DeviceIdentity.id(groupHash: vectorKeys.groupHash, number: 3) == 0x7CEC_7226_0003)
        #expect(ActivityBeacon.deviceIDText(DeviceIdentity.id(groupHash: vectorKeys.groupHash, number: 3)) == "7cec72260003")
    }

    @Test func aBeaconOfDevice3() throws {
        // §8.6: device 3 makes its id with IK_3 as the IRK (prand 0x5A1234 → 5A:12:34:E9:3C:45,
        // on air 45 3C E9 34 12 5A) and sends §8.4's beacon under it, tagged with the beacon
        // key. Nonce 45 3C E9 34 12 5A | FF FF | 03 | 02 01 00 00.
        let device3 = try DeviceIDResolver(irk: vectorKeys.beaconKey.identityKey(number: 3))
        let id = device3.deviceID(prand: 0x5A_1234)
        #expect(id == 0x5A12_34E9_3C45)
        #expect(try !DeviceIDResolver(key: vectorKeys.beaconKey).resolves(id), "the beacon key alone does not resolve it")
        var beacon = protocolVector1
        beacon.groupHash = vectorKeys.groupHash
        beacon.deviceID = id
        let advert = try advertisement(beacon, BeaconTagger(key: vectorKeys.beaconKey))
        #expect(advert == hx("""
            02 01 06
            1B FF FF FF
            01 03 02 01 B7 4B 9B BE 26 72 EC 7C 45 3C E9 34 12 5A 80 00 47 FE 9C A8
            """))
        // A gateway with security.identities 4 verifies the tag, resolves the id with IK_3
        // and publishes it under 7cec72260003 (§4.4).
        let verifier = try BeaconVerifier(key: vectorKeys.beaconKey, identities: 4, policy: .ignore)
        var heard = try #require(try advert.withUnsafeBytes { try ActivityBeacon.find(inAdvertisingData: $0) })
        #expect(advert.withUnsafeBytes { verifier.check(&heard, advertisingData: $0) } == .verified(identity: 3))
        #expect(heard.deviceID == 0x7CEC_7226_0003)
    }

    @Test func sealedPayloadVector() throws {
        // §8.5: payload.md §5's payload, sealed for device 5A:12:34:56:78:9A sequence 258 with
        // nonce a0…ab. Context 01 9A 78 56 34 12 5A 02 01; GCM associated data 01 ‖ context.
        let sealer = try SealedEnvelope(key: vectorKeys.payloadKey)
        let context = PayloadContext(deviceID: 0x5A12_3456_789A, sequence: 258)
        let nonce = hx("a0a1a2a3a4a5a6a7a8a9aaab")
        var out = [UInt8](repeating: 0, count: 200)
        let n = try payloadVector.withUnsafeBytes { p in
            try nonce.withUnsafeBytes { nb in
                try out.withUnsafeMutableBytes { o in try sealer.sealPayload(p, for: context, into: o, nonce: nb) }
            }
        }
        let expected = hx("""
            01
            a0 a1 a2 a3 a4 a5 a6 a7 a8 a9 aa ab
            eb bf 60 74 45 34 3d fc b0 77 b2 0e ff f7 d9 ce 4e ba f6 69
            15 0d 38 7d 94 01 98 11 45 d7 0f 4f 05 61 46 2e 87 d6 5f 6b
            2e 08 3f 5f 85 f5 3e 1c cd 39 3d 9b da e8 40 84 a8 ad 61 f9
            69 49 a2 69 24 3e 9b fc 3f 43 b0 eb b9 e7 7d 5d 2f ff 53 a6
            32 57 f7 93 7e 1c 8d 11 1f 00 55 ab 77 ba 07 99 0e 9a 18 83
            c9 b7 66 e1 c9 98 4b fe 92 9c 14 ea f1 1a d7 93
            c7 99 e3 4b f9 45 72 d9 d5 2a 7d 9a 9c 72 3c 7d
            """)
        #expect(n == 116 + 29)
        #expect(Array(out[..<n]) == expected)
        var plain = [UInt8](repeating: 0, count: 116)
        let m = try expected.withUnsafeBytes { e in
            try plain.withUnsafeMutableBytes { o in try sealer.openPayload(e, for: context, into: o) }
        }
        #expect(m == 116 && plain == payloadVector)
    }

    @Test func independentImplementationsAgree() throws {
        // Interop/vectors.py recomputes §8 with Python's cryptography (Debian's
        // python3-cryptography) and compares with the same hex; exit 3 means it is missing.
        let python = "/usr/bin/python3"
        let here = #filePath
        let script = here[..<here.lastIndex(of: "/")!] + "/Interop/vectors.py"
        let (status, text) = try runPython(python, [String(script)])
        #expect(status == 0, "vectors.py: \(text) (apt install python3-cryptography if it is missing)")
    }
}

/// Runs a Python interpreter with `arguments`: its exit status and everything it printed.
func runPython(_ python: String, _ arguments: [String]) throws -> (status: Int32, text: String) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: python)
    p.arguments = arguments
    let out = Pipe()
    p.standardOutput = out
    p.standardError = out
    try p.run()
    let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    p.waitUntilExit()
    return (p.terminationStatus, text)
}
