// `baton device` as a user runs it (docs/radio.md "baton device"). Without Bluetooth (these machines) the
// command checks its options, prints what it would send (--print-payload), and says that the
// kernel has no Bluetooth; the advertising and the links themselves run in the VM test
// (Tests/VM/bluez-test.sh, docs/vm.md).
import BatonKeys
import BatonTestSupport
import BatonWire
import Foundation
import Glibc
import Testing

@Suite struct DeviceCommandTests {
    /// The two lines --print-payload writes, as bytes.
    func printed(_ arguments: [String]) throws -> (payload: [UInt8], advertisement: [UInt8]) {
        let r = try run(binaries.appendingPathComponent("baton"), ["device"] + arguments + ["--print-payload"])
        try #require(r.status == 0, "baton device failed: \(r.stderr)")
        let lines = r.stdout.split(separator: "\n")
        try #require(lines.count == 2 && lines[0].hasPrefix("payload ") && lines[1].hasPrefix("advertisement "), "\(r.stdout)")
        return (hx(lines[0].split(separator: " ")[1]), hx(lines[1].split(separator: " ")[1]))
    }

    @Test func theAdvertisementIsProtocolVectorOne() throws {
        // docs/protocol.md §2.5 vector 1: streams + web URL, sequence 258, the reader type,
        // group A1B2C3D4, id 5A:12:34:56:78:9A, PSM 0x0080, open group (tag 0).
        let p = try printed(["--type", "com.example.reader.article", "--url", "https://example.com/a", "--id", "5a:12:34:56:78:9a",
                             "--group", "a1b2c3d4", "--psm", "0x80", "--sequence", "258"])
        #expect(p.advertisement == hx("02 01 06 1B FF FF FF 01 03 02 01 B7 4B 9B BE D4 C3 B2 A1 9A 78 56 34 12 5A 80 00 00 00 00 00"))
        // Without a URL the has-web-URL bit is clear; --no-streams clears supports-streams;
        // another company id goes in front of the value.
        let q = try printed(["--type", "a.b", "--no-streams", "--company-id", "0x0590", "--id", "1", "--sequence", "1"])
        #expect(Array(q.advertisement[5...10]) == hx("90 05 01 00 01 00"))
    }

    @Test func userInfoFromJSONKeepsEveryKind() throws {
        // docs/radio.md "baton device", userInfo: objects, arrays, strings, whole numbers as integers, other
        // numbers as doubles, booleans (not 1/0), null. Keys sorted length-first (payload.md §1).
        let file = try temporaryFile("info.json", Array(#"{"pos": 42, "ratio": 0.5, "on": true, "tags": ["a", null], "n": {"k": -1}}"#.utf8))
        let p = try printed(["--type", "a.b", "--user-info", file])
        #expect(p.payload == hx("""
            A3 00 01 01 63 61 2E 62 05 A5
            61 6E A1 61 6B 20
            62 6F 6E F5
            63 70 6F 73 18 2A
            64 74 61 67 73 82 61 61 F6
            65 72 61 74 69 6F F9 38 00
            """))
        // And the gateway's own validator accepts it.
        _ = try p.payload.withUnsafeBytes { try ActivityPayload.validate($0) }
    }

    @Test func titleAndURLReachThePayload() throws {
        let p = try printed(["--type", "com.example.reader.article", "--title", "Chapter 3", "--url", "https://example.com/chapter-3"])
        // Python's cbor2 (canonical=True) encodes the same bytes for this payload in the VM test.
        let content = ActivityPayloadContent(activityType: "com.example.reader.article", title: "Chapter 3",
                                             webpageURL: "https://example.com/chapter-3")
        #expect(p.payload == (try content.encoded()))
    }

    @Test(arguments: [
        (["--type", "com"], "payload-activity-type at byte 8"),
        (["--type", "a.b", "--url", "ftp://x.example/"], "payload-url-scheme"),
        (["--type", "a.b", "--psm", "0x40"], "--psm must be 0 (any) or a dynamic LE PSM 0x80–0xFF"),
        (["--type", "a.b", "--psm", "256"], "--psm must be 0 (any) or a dynamic LE PSM 0x80–0xFF"),
        (["--type", "a.b", "--company-id", "0x004C"], "--company-id 0x004C is Apple's"),
        (["--type", "a.b", "--id", "1234567890abc"], "--id must be at most 12 hex digits"),
        (["--type", "a.b", "--group", "xyz"], "--group must be at most 8 hex digits"),
        (["--type", "a.b", "--sequence", "65536"], "--sequence must be 0–65535"),
        (["--type", "a.b", "--user-info", "/nonexistent/info.json"], "--user-info /nonexistent/info.json: cannot read the file: No such file or directory"),
        (["--type", "a.b", "--identity", "3"], "--identity and --rotate need --key"),
        (["--type", "a.b", "--key", "/nonexistent/group.key"], "--key /nonexistent/group.key"),
    ])
    func badOptionsAreRefusedBeforeAnythingGoesOnTheAir(_ arguments: [String], _ message: String) throws {
        let r = try run(binaries.appendingPathComponent("baton"), ["device"] + arguments + ["--print-payload"])
        #expect(r.status == 64)
        #expect(r.stderr.contains(message), "stderr: \(r.stderr)")
        #expect(r.stdout.isEmpty)
    }

    /// docs/security.md: with a group secret the beacon carries the group's hash and a tag that
    /// verifies, under an id of device 3's identity key, as a gateway with the beacon key checks it.
    @Test func aKeyedDeviceTagsItsBeaconAndResolvesToItsIdentity() throws {
        let secret = "BATON-GROUP-V1:AAAQEAYEAUDAOCAJBIFQYDIOB4QL"  // §8.1
        let file = try temporaryFile("group.key", Array("\(secret)\n".utf8))
        let keys = try GroupKeys.derive(secret: try GroupSecret(text: secret))
        let verifier = try BeaconVerifier(key: keys.beaconKey, identities: 4, policy: .ignore)
        var ids = Set<[UInt8]>()
        for _ in 0..<3 {
            let p = try printed(["--type", "a.b", "--key", file, "--identity", "3", "--sequence", "9"])
            var beacon = try p.advertisement.withUnsafeBytes { raw in
                try ActivityBeacon.decode(value: UnsafeRawBufferPointer(rebasing: raw[7...]))
            }
            let verdict = p.advertisement.withUnsafeBytes { verifier.check(&beacon, advertisingData: $0) }
            #expect(verdict == .verified(identity: 3), "\(verdict)")
            #expect(beacon.deviceID == DeviceIdentity.id(groupHash: keys.groupHash, number: 3))
            ids.insert(Array(p.advertisement[19..<25]))
        }
        #expect(ids.count == 3, "every start draws a new id")
        let r = try run(binaries.appendingPathComponent("baton"), ["device", "--type", "a.b", "--key", file, "--id", "1", "--print-payload"])
        #expect(r.status == 64 && r.stderr.contains("--id and --key do not go together"), "\(r.stderr)")
    }

    @Test func userInfoMustBeAJSONObject() throws {
        for (name, text, message) in [("array.json", "[1, 2]", "the file must hold a JSON object"),
                                      ("broken.json", "{\"a\": ", "not JSON")] {
            let file = try temporaryFile(name, Array(text.utf8))
            let r = try run(binaries.appendingPathComponent("baton"), ["device", "--type", "a.b", "--user-info", file, "--print-payload"])
            #expect(r.status == 64)
            #expect(r.stderr.contains(message), "stderr: \(r.stderr)")
        }
    }

    @Test func onThisKernelItSaysWhatIsMissing() throws {
        let probe = socket(AF_BLUETOOTH, Int32(SOCK_RAW.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 1)  // BTPROTO_HCI
        let available = probe >= 0
        if available { close(probe) }
        let r = try run(binaries.appendingPathComponent("baton"), ["device", "--adapter", "hci99", "--type", "a.b"])
        #expect(r.status == 1)
        #expect(r.stdout.isEmpty)
        if available {
            // The VM: the kernel answers Invalid Index for an adapter it does not have.
            #expect(r.stderr.contains("no Bluetooth adapter named hci99"), "stderr: \(r.stderr)")
        } else {
            #expect(r.stderr == "baton device: this kernel has no Bluetooth support, or a sandbox denies it (AF_BLUETOOTH unavailable; a systemd unit needs AF_BLUETOOTH in RestrictAddressFamilies=): run on a machine with BlueZ\n")
        }
    }
}
