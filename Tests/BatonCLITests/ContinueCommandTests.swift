// `baton continue` (docs/relay.md §10): the continuing device's side. Without Bluetooth (these
// machines) the command checks its options and says that the kernel has no Bluetooth; which
// beacon it takes is checked here on advertisements built byte for byte; the scan, the L2CAP
// channel, the fetch and the stream themselves run in the VM test (Tests/VM/bluez-test.sh,
// docs/vm.md), against `baton device` and against a re-advertising gateway.
@testable import baton
import BatonHCI
import BatonKeys
import BatonTestSupport
import BatonWire
import Foundation
import Glibc
import Testing

@Suite struct ContinueCommandTests {
    // MARK: the command line

    @Test(arguments: [
        (["5a12345678"], "DEVICE must be 12 hex digits like 5a123456789a, got \"5a12345678\""),
        (["5a123456789g"], "DEVICE must be 12 hex digits"),
        (["5a:12:34:56:78:9a:bc"], "DEVICE must be 12 hex digits"),
        (["5a123456789a", "--timeout", "0"], "--timeout must be 0–3600 seconds"),
        (["5a123456789a", "--timeout=-1"], "--timeout must be 0–3600 seconds"),
        (["5a123456789a", "--timeout", "3601"], "--timeout must be 0–3600 seconds"),
        (["5a123456789a", "--stream", "--cbor"], "--cbor is for a fetch's payload"),
        (["5a123456789a", "--company-id", "0x12345"], "--company-id must be 1 to 4 hex digits"),
        (["5a123456789a", "--company-id", "xyz"], "--company-id must be 1 to 4 hex digits"),
        (["5a123456789a", "--company-id", "0x004c"], "--company-id 0x004C is Apple's"),
        (["5a123456789a", "--key", "/nonexistent/group.key"], "--key /nonexistent/group.key"),
    ])
    func badOptionsAreRefusedBeforeTheAdapterIsTouched(_ arguments: [String], _ message: String) throws {
        // An adapter that exists nowhere: had the options passed, the error would name it.
        let r = try run(binaries.appendingPathComponent("baton"), ["continue"] + arguments + ["--adapter", "hci99"])
        #expect(r.status == 64, "stderr: \(r.stderr)")
        #expect(r.stderr.contains(message), "stderr: \(r.stderr)")
        #expect(!r.stderr.contains("hci99"), "stderr: \(r.stderr)")
        #expect(r.stdout.isEmpty)
    }

    @Test func aKeyFileThatIsNotAGroupSecretIsRefused() throws {
        // The beacon key (docs/security.md §8.2) is what gateways hold; a phone needs the secret.
        let file = try temporaryFile("beacon.key", Array("BATON-BEACON-V1:FSV4W7CI5E4NINBSOUTTXMN5IIVO\n".utf8))
        let r = try run(binaries.appendingPathComponent("baton"), ["continue", "7cec72260001", "--key", file, "--adapter", "hci99"])
        #expect(r.status == 64)
        #expect(r.stderr.contains("--key \(file)"), "stderr: \(r.stderr)")
    }

    @Test func onThisKernelItSaysWhatIsMissing() throws {
        let probe = socket(AF_BLUETOOTH, Int32(SOCK_RAW.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 1)  // BTPROTO_HCI
        let available = probe >= 0
        if available { close(probe) }
        // The VM has hci0 (it would scan until the timeout there): it is asked for one it lacks.
        let adapter = available ? "hci99" : "hci0"
        let r = try run(binaries.appendingPathComponent("baton"), ["continue", "5a123456789a", "--adapter", adapter, "--timeout", "5"])
        #expect(r.status == 1)
        #expect(r.stdout.isEmpty)
        if available {
            #expect(r.stderr.contains("no Bluetooth adapter named hci99"), "stderr: \(r.stderr)")
        } else {
            #expect(r.stderr == "baton continue: this kernel has no Bluetooth support (AF_BLUETOOTH unavailable): run on a machine with BlueZ and a Bluetooth LE adapter\n")
        }
        // A stream asks the same of the kernel first.
        let s = try run(binaries.appendingPathComponent("baton"), ["continue", "5a123456789a", "--stream", "--adapter", adapter, "--timeout", "5"])
        #expect(s.status == 1)
        #expect(s.stderr == r.stderr)
    }

    @Test func theHelpNamesEveryOption() throws {
        let r = try run(binaries.appendingPathComponent("baton"), ["continue", "--help"])
        #expect(r.status == 0)
        for option in ["--adapter", "--key", "--relayed", "--stream", "--timeout", "--cbor", "--company-id"] {
            #expect(r.stdout.contains(option), "\(option) missing from: \(r.stdout)")
        }
    }

    // MARK: which beacon it takes

    /// docs/security.md §8.1's secret: group 7cec7226, device 1's identity id 7cec72260001.
    static let secret = "BATON-GROUP-V1:AAAQEAYEAUDAOCAJBIFQYDIOB4QL"
    static let identityOne: UInt64 = 0x7cec_7226_0001

    /// The 31-byte advertisement of `beacon` (protocol.md §2.1), tagged by `tagger` or open.
    func advertisement(_ beacon: ActivityBeacon, tagger: BeaconTagger? = nil) throws -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: ActivityBeacon.advertisementLength)
        try bytes.withUnsafeMutableBytes { raw in
            var w = ByteWriter(raw)
            if let tagger { try beacon.encodeAdvertisement(authenticator: tagger, into: &w) } else {
                try beacon.encodeAdvertisement(authenticator: OpenGroup(), into: &w)
            }
        }
        return bytes
    }

    /// What `match` makes of `bytes` heard from `address` (public), as the scan hands it over.
    func consider(_ match: BeaconMatch, _ bytes: [UInt8], address: UInt64 = 0x00AA_0101_0001,
                  addressType: UInt8 = 0, seen: inout BeaconMatch.Seen) -> FoundBeacon? {
        var decoder = AdvertisementDecoder()
        var found: FoundBeacon?
        bytes.withUnsafeBytes { data in
            let report = AdvertisingReport(eventType: 0x13, legacyEventType: 0x00, addressType: addressType, address: address,
                                           rssi: -60, data: data, isExtended: false)
            decoder.decode(report: report, timestamp: 0) { heard in found = match.consider(heard, seen: &seen) }
        }
        return found
    }

    func beacon(_ id: UInt64, flags: BeaconFlags = [.supportsStreams], sequence: UInt16 = 12, group: UInt32 = 0xA1B2C3D4,
                psm: UInt16 = 0x0081) -> ActivityBeacon {
        ActivityBeacon(flags: flags, sequence: sequence, activityTypeHash: 0xBE9B4BB7, groupHash: group, deviceID: id, psm: psm)
    }

    @Test func anOpenGroupsBeaconIsTakenByItsIDAndAddress() throws {
        let match = try BeaconMatch(device: 0x5a12_3456_789a, relayedOnly: false, keys: nil)
        var seen = BeaconMatch.Seen()
        #expect(consider(match, try advertisement(beacon(0x5a12_3456_789b)), seen: &seen) == nil)
        let found = try #require(consider(match, try advertisement(beacon(0x5a12_3456_789a)), address: 0x00AA_0101_0001,
                                          addressType: 1, seen: &seen))
        // The link goes to the advertiser's address and type and the beacon's PSM (protocol.md §5).
        #expect(found.address.address == 0x00AA_0101_0001 && found.address.addressType == 1 && found.address.psm == 0x0081)
        #expect(found.beacon.sequence == 12)
        #expect("\(found.address)" == "00:AA:01:01:00:01 (random) psm 0x0081")
        #expect(seen.beacons == 2)
    }

    @Test func relayedAsksForTheRelayedFlag() throws {
        let match = try BeaconMatch(device: 0x5a12_3456_789a, relayedOnly: true, keys: nil)
        var seen = BeaconMatch.Seen()
        #expect(consider(match, try advertisement(beacon(0x5a12_3456_789a)), seen: &seen) == nil)
        #expect(seen.notRelayed == 1)
        #expect(seen.explanation(keyed: false) == " (heard: 1 of its own, not relayed)")
        let found = consider(match, try advertisement(beacon(0x5a12_3456_789a, flags: [.supportsStreams, .relayed])), seen: &seen)
        #expect(found?.beacon.flags.contains(.relayed) == true)
        // Without --relayed, a gateway's re-advertisement is as good as the device's own beacon.
        let any = try BeaconMatch(device: 0x5a12_3456_789a, relayedOnly: false, keys: nil)
        #expect(consider(any, try advertisement(beacon(0x5a12_3456_789a, flags: [.relayed])), seen: &seen) != nil)
    }

    @Test func anEndedActivityOrOneWithoutALinkIsPassedOver() throws {
        let match = try BeaconMatch(device: 0x5a12_3456_789a, relayedOnly: false, keys: nil)
        var seen = BeaconMatch.Seen()
        #expect(consider(match, try advertisement(beacon(0x5a12_3456_789a, flags: [.invalidated])), seen: &seen) == nil)
        #expect(consider(match, try advertisement(beacon(0x5a12_3456_789a, psm: 0)), seen: &seen) == nil)
        // Anonymous advertising (address type 0xFF) has no address to connect to.
        #expect(consider(match, try advertisement(beacon(0x5a12_3456_789a)), addressType: 0xFF, seen: &seen) == nil)
        #expect(seen.ended == 1 && seen.noLink == 2)
        #expect(seen.explanation(keyed: false) == " (heard: 1 saying the activity ended; 2 offering no link (PSM 0))")
    }

    @Test func nothingHeardSaysSo() {
        #expect(BeaconMatch.Seen().explanation(keyed: false).contains("no activity beacon at all"))
        var other = BeaconMatch.Seen()
        other.beacons = 3
        #expect(other.explanation(keyed: false).contains("give --key"))
        #expect(other.explanation(keyed: true) == " (3 beacons of other devices)")
    }

    /// docs/security.md §3.1: a device with an identity rotates ids made with IK_n; with the
    /// key the phone resolves them to the identity id, and only a tag that verifies is taken.
    @Test func withTheKeyARotatingIDResolvesToItsIdentity() throws {
        let keys = try GroupKeys.derive(secret: try GroupSecret(text: Self.secret))
        #expect(keys.groupHash == 0x7cec_7226)
        let tagger = try BeaconTagger(key: keys.beaconKey)
        let rotating = try DeviceIDResolver(irk: try keys.beaconKey.identityKey(number: 1)).newDeviceID()
        let own = try advertisement(beacon(rotating, group: keys.groupHash), tagger: tagger)

        var seen = BeaconMatch.Seen()
        let keyed = try BeaconMatch(device: Self.identityOne, relayedOnly: false, keys: keys)
        let found = try #require(consider(keyed, own, seen: &seen))
        // The link and the sealing speak of the identity id, not the id on air (security.md §5).
        #expect(found.beacon.deviceID == Self.identityOne)
        // Device 2's ids are not device 1's.
        let two = try DeviceIDResolver(irk: try keys.beaconKey.identityKey(number: 2)).newDeviceID()
        #expect(consider(keyed, try advertisement(beacon(two, group: keys.groupHash), tagger: tagger), seen: &seen) == nil)
        // Without the key the rotating id is just another device's.
        let open = try BeaconMatch(device: Self.identityOne, relayedOnly: false, keys: nil)
        #expect(consider(open, own, seen: &seen) == nil)
    }

    @Test func withTheKeyABeaconWhoseTagDoesNotVerifyIsPassedOver() throws {
        let keys = try GroupKeys.derive(secret: try GroupSecret(text: Self.secret))
        let tagger = try BeaconTagger(key: keys.beaconKey)
        // A gateway's re-advertisement names the identity id itself (relay.md §9).
        let relayed = beacon(Self.identityOne, flags: [.supportsStreams, .relayed], group: keys.groupHash)
        var good = try advertisement(relayed, tagger: tagger)
        let match = try BeaconMatch(device: Self.identityOne, relayedOnly: true, keys: keys)
        var seen = BeaconMatch.Seen()
        #expect(consider(match, good, seen: &seen)?.beacon.deviceID == Self.identityOne)
        // Any signed byte changed (here the PSM), or the tag itself: not taken, and counted.
        good[25] ^= 0x01
        #expect(consider(match, good, seen: &seen) == nil)
        var forged = try advertisement(relayed, tagger: tagger)
        forged[30] ^= 0x80
        #expect(consider(match, forged, seen: &seen) == nil)
        // Untagged (tag 0, as an open group sends it) under the keyed group's hash: a forgery.
        #expect(consider(match, try advertisement(relayed), seen: &seen) == nil)
        #expect(seen.badTag == 3)
        #expect(seen.explanation(keyed: true).contains("3 whose tag did not verify under this key"))
        // Another group's beacon with the same id is not even looked at under this key.
        let other = try GroupKeys.derive(secret: GroupSecret(bytes: Array(repeating: 7, count: 16)))
        let theirs = try advertisement(beacon(Self.identityOne, flags: [.relayed], group: other.groupHash),
                                       tagger: try BeaconTagger(key: other.beaconKey))
        #expect(consider(match, theirs, seen: &seen) == nil)
        #expect(seen.badTag == 3)
    }
}
