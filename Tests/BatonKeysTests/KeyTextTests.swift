// The text form of keys: docs/security.md §1.
import Foundation
import Testing
@testable import BatonKeys

private let good = "BATON-GROUP-V1:AAAQEAYEAUDAOCAJBIFQYDIOB4QL"
private let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")

@Suite struct KeyTextTests {
    @Test func crc10IsTheCatalogueCRC10ATM() {
        // Greg Cook's CRC catalogue, CRC-10/ATM: check = 0x199 over "123456789".
        #expect(KeyText.crc10(Array("123456789".utf8)) == 0x199)
    }

    @Test func generatedSecretsRoundTripThroughText() throws {
        for _ in 0..<50 {
            let s = try GroupSecret.generate()
            #expect(try GroupSecret(text: s.text).withUnsafeBytes { Array($0) } == s.withUnsafeBytes { Array($0) })
        }
    }

    @Test func caseAndSurroundingWhitespaceDoNotMatter() throws {
        #expect(try GroupSecret(text: "  " + good.lowercased() + "\r\n").text == good)
    }

    @Test func everySingleMistypedCharacterIsCaught() {
        // CRC-10 detects every burst of ≤ 10 bits; one base32 character is 5 bits.
        let chars = Array(good)
        let start = "BATON-GROUP-V1:".count
        var tried = 0
        for i in start..<chars.count {
            for c in alphabet where c != chars[i] {
                var typo = chars
                typo[i] = c
                #expect(throws: KeyTextError.checksumMismatch) { try GroupSecret(text: String(typo)) }
                tried += 1
            }
        }
        #expect(tried == 28 * 31)
    }

    @Test func everySwapOfNeighbouringCharactersIsCaught() {
        let chars = Array(good)
        for i in "BATON-GROUP-V1:".count..<(chars.count - 1) where chars[i] != chars[i + 1] {
            var swapped = chars
            swapped.swapAt(i, i + 1)
            #expect(throws: KeyTextError.checksumMismatch) { try GroupSecret(text: String(swapped)) }
        }
    }

    @Test func aMissingOrExtraCharacterIsALengthError() {
        #expect(throws: KeyTextError.wrongLength(expected: 28, found: 27)) { try GroupSecret(text: String(good.dropLast())) }
        #expect(throws: KeyTextError.wrongLength(expected: 28, found: 29)) { try GroupSecret(text: good + "A") }
    }

    @Test func charactersOutsideBase32AreNamedWithTheirPosition() {
        // 0, 1, 8, 9 are not base32: a user who reads O as 0 is told where.
        var chars = Array(good)
        chars[15 + 2] = "0"
        #expect(throws: KeyTextError.notBase32(character: "0", position: 3)) { try GroupSecret(text: String(chars)) }
    }

    @Test func aBeaconKeyIsNotAGroupSecret() {
        let beaconText = vectorKeys.beaconKey.text
        #expect(throws: KeyTextError.wrongKind(expected: "group secret", found: "beacon key")) {
            try GroupSecret(text: beaconText)
        }
        #expect(throws: KeyTextError.wrongKind(expected: "beacon key", found: "group secret")) { try BeaconKey(text: good) }
        #expect(throws: KeyTextError.missingPrefix(expected: "BATON-GROUP-V1:")) { try GroupSecret(text: "AAAQEAYEAUDAOCAJBIFQYDIOB4QL") }
    }

    @Test func errorsSayWhatToFix() {
        #expect(KeyTextError.checksumMismatch.description.contains("mistyped"))
        #expect(KeyTextError.notBase32(character: "1", position: 4).description.contains("character 4"))
        #expect(KeyTextError.wrongKind(expected: "group secret", found: "beacon key").description.contains("BATON-BEACON-V1:"))
    }

    @Test func secretsNeverPrint() {
        #expect("\(vectorSecret)" == "GroupSecret(redacted)")
        #expect("\(vectorKeys.beaconKey)" == "BeaconKey(redacted)")
        #expect("\(vectorKeys.payloadKey)" == "PayloadKey(redacted)")
    }

    @Test func loadsTheFirstLineOfAFile() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("baton-keys-\(getpid())-\(UInt32.random(in: 0...UInt32.max))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let file = dir.appendingPathComponent("group.key").path
        try (good + "\n# provisioned 2026-11-23\n").write(toFile: file, atomically: true, encoding: .utf8)
        #expect(try GroupSecret.load(path: file).text == good)

        let empty = dir.appendingPathComponent("empty.key").path
        try "\n".write(toFile: empty, atomically: true, encoding: .utf8)
        #expect(throws: KeyTextError.emptyFile(path: empty)) { try GroupSecret.load(path: empty) }
        try "".write(toFile: empty, atomically: true, encoding: .utf8)
        #expect(throws: KeyTextError.emptyFile(path: empty)) { try GroupSecret.load(path: empty) }

        let missing = dir.appendingPathComponent("missing.key").path
        #expect(throws: KeyTextError.unreadableFile(path: missing, errno: ENOENT)) { try GroupSecret.load(path: missing) }

        let beaconFile = dir.appendingPathComponent("beacon.key").path
        try vectorKeys.beaconKey.text.write(toFile: beaconFile, atomically: true, encoding: .utf8)
        #expect(try BeaconKey.load(path: beaconFile).text == vectorKeys.beaconKey.text)
    }
}
