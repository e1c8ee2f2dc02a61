// Identity Resolving Keys of a user's own Apple devices (docs/security.md §10): the text forms
// users paste, the id a named device is published under, and the resolver that follows a
// device across address rotation.
//
// The sample is Core 5.4, Vol 3, Part H, Appendix D.7 (the `ah` random address hash):
//   IRK   ec0234a3 57c8ad05 341010a6 0a397d9b
//   prand 708194
//   e(IRK, 00…00 708194) = 159d5fb7 2ebe2311 a48c1bdc c40dfbaa, ah = 0dfbaa
// so the resolvable private address 70:81:94:0D:FB:AA belongs to the device with that IRK.
// Python's `cryptography` gives the same block (`independentAESAndHKDFAgree` recomputes it).
import Foundation
import BatonTestSupport
import Testing
@testable import BatonKeys

/// Core 5.4, Vol 3, Part H, Appendix D.7, most significant byte first as printed there.
private let sampleIRK = hx("ec0234a3 57c8ad05 341010a6 0a397d9b")
private let samplePrand: UInt32 = 0x70_8194
private let sampleHash: UInt32 = 0x0D_FBAA
/// 70:81:94:0D:FB:AA: prand in the top 24 bits, the hash below (Vol 6, Part B, §1.3.2.2).
private let sampleAddress: UInt64 = 0x7081_940D_FBAA
/// The sample IRK as macOS Keychain stores it (least significant byte first) and as a user
/// copies it from there: base64 of the reversed bytes. Made with Python's base64 module.
private let sampleKeychainText = "m305CqYQEDQFrchXozQC7A=="

/// HCI LE Advertising Report address types (Core 5.4, Vol 4, Part E, §7.7.65.2).
private let publicAddress: UInt8 = 0
private let randomAddress: UInt8 = 1

/// Two more IRKs, so the sample is one device among several.
private let otherIRKs = [hx("000102030405060708090a0b0c0d0e0f"), hx("ffeeddccbbaa99887766554433221100")]

private func base64(_ bytes: [UInt8]) -> String { Data(bytes).base64EncodedString() }

/// An RPA-shaped address (top bits 0b01) that resolves under none of `irks`.
private func stranger(_ n: Int, irks: [[UInt8]]) throws -> UInt64 {
    // prand 0x40_0000 + n; the hash is one of the device's own hashes with a bit flipped, so it
    // is a hash no key gave (checked below, not assumed).
    let prand = 0x40_0000 | UInt32(n & 0x3F_FFFF)
    let address = UInt64(prand) << 24 | UInt64(try DeviceIDResolver(irk: irks[0]).hash(prand: prand) ^ 1)
    for k in irks {
        let resolves = try DeviceIDResolver(irk: k).resolves(address)
        try #require(!resolves)
    }
    return address
}

@Suite("Identity Resolving Keys (docs/security.md §10)")
struct IdentityResolvingKeyTests {
    // MARK: - ah, as the resolver computes it

    @Test func ahOfTheCoreSampleIsItsHash() throws {
        // Core 5.4, Vol 3, Part H, Appendix D.7.
        let r = try DeviceIDResolver(irk: sampleIRK)
        #expect(r.hash(prand: samplePrand) == sampleHash)
        #expect(r.deviceID(prand: samplePrand) == sampleAddress)
        #expect(r.resolves(sampleAddress))
        #expect(!r.resolves(sampleAddress ^ 1), "one bit off in the hash")
    }

    // MARK: - Text forms

    @Test func hexInEitherCaseWithOrWithoutThePrefix() throws {
        let hex = hexString(sampleIRK)
        for text in [hex, hex.uppercased(), "irk:" + hex, "irk:" + hex.uppercased(), "  irk:\(hex)\n", "\t\(hex) \r\n"] {
            #expect(try IdentityResolvingKey(text: text).bytes == sampleIRK, "\(text.debugDescription)")
        }
    }

    @Test func keychainBase64IsTheKeyReversed() throws {
        // Home Assistant's Private BLE Device reads a text ending in "=" as base64 of the key
        // least significant byte first (macOS Keychain), and reverses it.
        #expect(base64(sampleIRK.reversed()) == sampleKeychainText, "the literal above is the reversed sample")
        let fromKeychain = try IdentityResolvingKey(text: sampleKeychainText)
        #expect(fromKeychain.bytes == sampleIRK)
        #expect(fromKeychain == (try IdentityResolvingKey(text: hexString(sampleIRK))), "both forms give one key")
        #expect(try IdentityResolvingKey(text: "irk:" + sampleKeychainText) == fromKeychain)
        #expect(try IdentityResolvingKey(text: " \(sampleKeychainText)\n") == fromKeychain)
        // Base64 of the key in printed order is a different key: the reversal is not optional.
        #expect(try IdentityResolvingKey(text: base64(sampleIRK)).bytes == sampleIRK.reversed())
    }

    @Test func hexOfTheWrongLengthSaysHowLong() {
        let hex = hexString(sampleIRK)
        #expect(throws: IRKTextError.wrongLength(15)) { try IdentityResolvingKey(text: String(hex.dropLast(2))) }
        #expect(throws: IRKTextError.wrongLength(17)) { try IdentityResolvingKey(text: hex + "00") }
    }

    @Test func base64OfTheWrongLengthSaysHowLong() {
        // Padded base64, so it ends in "=" and is read as base64.
        #expect(throws: IRKTextError.wrongLength(17)) { try IdentityResolvingKey(text: base64(sampleIRK + [0])) }
        #expect(throws: IRKTextError.wrongLength(14)) { try IdentityResolvingKey(text: base64(Array(sampleIRK.prefix(14)))) }
        // Base64 of 15 bytes is 20 characters without padding: with no "=" it is not read as
        // base64 (Home Assistant's rule too), and it is not hex either.
        let fifteen = base64(Array(sampleIRK.prefix(15)))
        #expect(!fifteen.hasSuffix("="))
        #expect(throws: IRKTextError.notHexOrBase64) { try IdentityResolvingKey(text: fifteen) }
    }

    @Test func garbageIsNeitherHexNorBase64() {
        let hex = hexString(sampleIRK)
        for text in ["not an irk", String(repeating: "zz", count: 16), String(hex.dropLast()),  // 31 digits
                     "0x" + hex, String(hex.dropLast(2)) + "g0", "m305CqYQ#DQFrchXozQC7A=="] {
            #expect(throws: IRKTextError.notHexOrBase64, "\(text.debugDescription)") { try IdentityResolvingKey(text: text) }
        }
    }

    @Test func errorsSayWhatAnIRKLooksLike() {
        #expect(IRKTextError.wrongLength(15).description.contains("16 bytes"))
        #expect(IRKTextError.wrongLength(15).description.contains("15"))
        #expect(IRKTextError.notHexOrBase64.description.contains("32 hex digits"))
        #expect(IRKTextError.notHexOrBase64.description.contains("base64"))
    }

    @Test func theKeyIsNeverPrinted() throws {
        let irk = try IdentityResolvingKey(text: sampleKeychainText)
        let hex = hexString(sampleIRK)
        for shown in ["\(irk)", String(reflecting: irk), "\([irk])", "\(Optional(irk) as Any)"] {
            #expect(!shown.lowercased().contains(hex), "\(shown)")
            #expect(!shown.lowercased().contains(hexString(Array(sampleIRK.prefix(4)))), "\(shown)")
            #expect(!shown.contains(sampleKeychainText) && !shown.contains(base64(sampleIRK)), "\(shown)")
        }
    }

    // MARK: - The published id

    @Test func stableIDIsTheSameEverywhereAndPerKey() throws {
        let a = try IdentityResolvingKey(text: hexString(sampleIRK))
        let b = try IdentityResolvingKey(text: sampleKeychainText)
        let id = try a.stableID()
        // HKDF-SHA256 (RFC 5869), empty salt, info "baton v1 apple id", 4 bytes read little
        // endian: 55 fa 6d f7, from Python's `cryptography` (recomputed below).
        #expect(id == 0xF76D_FA55)
        #expect(try a.stableID() == id && (try b.stableID()) == id, "the same from either text, call after call")
        let others = try otherIRKs.map { try IdentityResolvingKey(bytes: $0).stableID() }
        #expect(Set(others + [id]).count == 3, "another key, another id")
    }

    @Test func independentAESAndHKDFAgree() throws {
        // Python's `cryptography` (Debian's python3-cryptography) computes ah and the id for
        // the sample and for keys and prands drawn here; ours must give the same. Exit 3: missing.
        var rng = SplitMix(state: 10)
        var cases: [([UInt8], UInt32)] = [(sampleIRK, samplePrand)]
        for _ in 0..<20 {
            let key = (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) }
            cases.append((key, 0x40_0000 | UInt32.random(in: 0...0x3F_FFFF, using: &rng)))
        }
        let script = """
            import sys
            try:
                from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
                from cryptography.hazmat.primitives.kdf.hkdf import HKDF
                from cryptography.hazmat.primitives import hashes
            except ImportError:
                sys.exit(3)
            for arg in sys.argv[1:]:
                key, prand = arg.split(":")
                k = bytes.fromhex(key)
                e = Cipher(algorithms.AES(k), modes.ECB()).encryptor()
                block = e.update(bytes(13) + bytes.fromhex(prand)) + e.finalize()
                h = HKDF(algorithm=hashes.SHA256(), length=4, salt=None, info=b"baton v1 apple id").derive(k)
                print(block[13:].hex(), h[::-1].hex())
            """
        let (status, text) = try runPython("/usr/bin/python3",
                                           ["-c", script] + cases.map { hexString($0.0) + ":" + String(format: "%06x", $0.1) })
        try #require(status == 0, "python3: \(text) (apt install python3-cryptography if it is missing)")
        var ours: [String] = []
        for (key, prand) in cases {
            let hash = try DeviceIDResolver(irk: key).hash(prand: prand)
            let id = try IdentityResolvingKey(bytes: key).stableID()
            ours.append(String(format: "%06x %08x", hash, id))
        }
        #expect(text.split(separator: "\n").map(String.init) == ours)
        #expect(ours.first == "0dfbaa f76dfa55", "Appendix D.7's hash")
    }

    // MARK: - AddressResolver

    @Test func theSampleAddressResolvesToItsKeyAmongSeveral() throws {
        let irks = [otherIRKs[0], sampleIRK, otherIRKs[1]].map(IdentityResolvingKey.init(bytes:))
        let resolver = try AddressResolver(irks: irks)
        #expect(resolver.count == 3)
        #expect(resolver.resolve(address: sampleAddress, addressType: randomAddress) == 1)
        #expect(resolver.resolutions == 2, "the first key failed, the second matched")
        for _ in 0..<100 { #expect(resolver.resolve(address: sampleAddress, addressType: randomAddress) == 1) }
        #expect(resolver.resolutions == 2, "a known address costs no AES: ten adverts a second stay free")
    }

    @Test func onlyRandomResolvablePrivateAddressesAreTried() throws {
        let resolver = try AddressResolver(irks: [IdentityResolvingKey(bytes: sampleIRK)])
        // The sample's 48 bits as a public address: a different device (Vol 6, Part B, §1.3).
        #expect(resolver.resolve(address: sampleAddress, addressType: publicAddress) == nil)
        // Static random (top bits 0b11) and non-resolvable private (0b00) addresses with the
        // sample's lower bits.
        #expect(resolver.resolve(address: sampleAddress | 0xC000_0000_0000, addressType: randomAddress) == nil)
        #expect(resolver.resolve(address: sampleAddress & 0x3FFF_FFFF_FFFF, addressType: randomAddress) == nil)
        // Identity address types (2, 3: resolved by the controller) are not RPAs either.
        #expect(resolver.resolve(address: sampleAddress, addressType: 2) == nil)
        #expect(resolver.resolutions == 0, "none of them cost an AES block")
        #expect(resolver.resolve(address: sampleAddress, addressType: randomAddress) == 0)
    }

    @Test func aStrangerCostsOnceUntil128OthersPushItOut() throws {
        // capacity + 1 for the stranger ring (AddressResolver.strangerMemory).
        let keys = [sampleIRK] + otherIRKs
        let resolver = try AddressResolver(irks: keys.map(IdentityResolvingKey.init(bytes:)))
        let memory = AddressResolver.strangerMemory
        #expect(memory == 128)
        let phone = try stranger(0, irks: keys)
        #expect(resolver.resolve(address: phone, addressType: randomAddress) == nil)
        #expect(resolver.resolutions == 3, "tried under every key")
        #expect(resolver.resolve(address: phone, addressType: randomAddress) == nil)
        #expect(resolver.resolutions == 3, "asked again: remembered, no AES")
        // memory − 1 other strangers: still remembered.
        for n in 1..<memory { #expect(resolver.resolve(address: try stranger(n, irks: keys), addressType: randomAddress) == nil) }
        #expect(resolver.resolutions == 3 * memory)
        #expect(resolver.resolve(address: phone, addressType: randomAddress) == nil)
        #expect(resolver.resolutions == 3 * memory, "127 others later, still free")
        // One more: the ring has turned and the first stranger is forgotten.
        #expect(resolver.resolve(address: try stranger(memory, irks: keys), addressType: randomAddress) == nil)
        #expect(resolver.resolve(address: phone, addressType: randomAddress) == nil)
        #expect(resolver.resolutions == 3 * (memory + 2), "forgotten: it costs every key again")
        // A named device still resolves while strangers churn.
        #expect(resolver.resolve(address: sampleAddress, addressType: randomAddress) == 0)
    }

    @Test func aRotationResolvesToTheSameDevice() throws {
        let keys = otherIRKs + [sampleIRK]
        let resolver = try AddressResolver(irks: keys.map(IdentityResolvingKey.init(bytes:)))
        let device = try DeviceIDResolver(irk: sampleIRK)
        // Three rotations, about 15 minutes apart on a real phone.
        let addresses = [sampleAddress, device.deviceID(prand: 0x6A_BCDE), device.deviceID(prand: 0x41_2345)]
        for a in addresses { #expect(resolver.resolve(address: a, addressType: randomAddress) == 2) }
        #expect(resolver.resolutions == 9, "each new address tried once under each key")
        // The last two are remembered (old and new interleave at a rotation)…
        #expect(resolver.resolve(address: addresses[1], addressType: randomAddress) == 2)
        #expect(resolver.resolve(address: addresses[2], addressType: randomAddress) == 2)
        #expect(resolver.resolutions == 9)
        // …the one before them costs again, and still resolves.
        #expect(resolver.resolve(address: addresses[0], addressType: randomAddress) == 2)
        #expect(resolver.resolutions == 12)
        // Another device's rotations resolve to its own index.
        let other = try DeviceIDResolver(irk: otherIRKs[0]).deviceID(prand: 0x6A_BCDE)
        #expect(resolver.resolve(address: other, addressType: randomAddress) == 0)
    }

    @Test func withNoKeysNothingResolvesAndNothingIsSpent() throws {
        let resolver = try AddressResolver(irks: [])
        #expect(resolver.count == 0)
        for a in [sampleAddress, sampleAddress | 0xC000_0000_0000, 0x4000_0000_0001] {
            for type in [publicAddress, randomAddress] { #expect(resolver.resolve(address: a, addressType: type) == nil) }
        }
        #expect(resolver.resolutions == 0)
    }
}
