// Device identities: one stable name for a device whose beacon id rotates (docs/security.md §3.1).
//
// Resolving a rotating id with the group-wide beacon key says "a device of this group", not
// which one (§3). A device that wants to be followed across rotation is given a number n when
// it is provisioned, and makes its ids with its own identity key IK_n instead of the beacon key:
//
//   IK_n = HKDF-SHA256(IKM = beacon key, salt = "", info = "baton v1 device identity" ‖ n (2, LE), L = 16)
//
// This is BLE privacy's scheme (Core 5.4, Vol 3, Part C, §10.8.2.3): one IRK per device, and a
// resolver that tries the IRKs it knows. A gateway holds the beacon key, so it derives every IK_n
// for n below `security.identities` and tries them on an id it has not seen yet; ids it has seen
// are remembered, so the AES work happens once per rotation, not once per beacon.
//
// The identity's id, used in topics and by Home Assistant, is `group hash ‖ n` (48 bits): the
// same at every gateway of the building, and readable ("a1b2c3d40003" is device 3 of group
// a1b2c3d4). It never goes on air.
import BatonWire

extension BeaconKey {
    /// IK_n: the key device `number` of the group makes its rotating ids with (§3.1).
    public func identityKey(number: UInt16) throws(CryptoError) -> [UInt8] {
        var info = Array("baton v1 device identity".utf8)
        info.append(UInt8(truncatingIfNeeded: number))
        info.append(UInt8(truncatingIfNeeded: number >> 8))
        return try hkdfSHA256(key: bytes, salt: [], info: info, count: 16)
    }
}

public enum DeviceIdentity {
    /// The most device numbers a gateway tries (`security.identities`): resolving a new id costs
    /// one AES block per number, once per rotation.
    public static let maxNumbers = 1024

    /// The identity's 48-bit id: the group hash in bits 16–47, the device number in bits 0–15.
    public static func id(groupHash: UInt32, number: UInt16) -> UInt64 {
        UInt64(groupHash) << 16 | UInt64(number)
    }
}

/// What a gateway does with beacons of groups it has no key for (docs/security.md §4.4).
public enum UnkeyedGroupPolicy: Sendable, Equatable {
    /// Published, marked `"verified": false`.
    case publish
    /// Dropped and counted as `beacon-unkeyed-group`.
    case ignore
}

/// The verdict on one beacon.
public enum BeaconVerdict: Equatable, Sendable {
    /// The tag verified under the group's key. `identity` is the device number when the id
    /// resolved to one (the beacon's device id has been replaced by the identity's id).
    case verified(identity: UInt16?)
    /// A group without a key, published as unverified by policy.
    case unverified
    /// Dropped; the reason is the name counted in the gateway's `drops`.
    case dropped(StaticString)

    public static func == (a: BeaconVerdict, b: BeaconVerdict) -> Bool {
        switch (a, b) {
        case (.verified(let x), .verified(let y)): x == y
        case (.unverified, .unverified): true
        case (.dropped(let x), .dropped(let y)): x.description == y.description
        default: false
        }
    }
}

/// Checks every beacon a gateway hears against one group's beacon key (docs/security.md §4.4):
/// the tag, the rotating id, and, for devices with an identity, the sequence against the
/// highest the gateway has seen from that identity. Every table is allocated at init; checking a
/// beacon allocates nothing (one CCM MIC, and one AES block per number tried on a new id).
public final class BeaconVerifier {
    public static let badTag: StaticString = "beacon-bad-tag"
    public static let unresolvedID: StaticString = "beacon-unresolved-id"
    public static let replayed: StaticString = "beacon-replayed"
    public static let unkeyedGroup: StaticString = "beacon-unkeyed-group"
    public static let impersonation: StaticString = "beacon-impersonation"

    public let groupHash: UInt32
    public let policy: UnkeyedGroupPolicy
    public let companyID: UInt16
    private let tagger: BeaconTagger
    private let groupResolver: DeviceIDResolver
    /// Every identity key IK_n, as IRKs: it remembers each identity's last two ids (so the old
    /// and new id interleaving at a rotation costs no second search) and the latest ids that
    /// resolve under none, as it does for phones' addresses (§10).
    private let identityResolver: AddressResolver
    /// Per identity: the highest sequence heard, whether any was, and whether that sequence
    /// was invalidated.
    private var highest: [UInt16]
    private var heard: [Bool]
    private var ended: [Bool]

    /// AES blocks spent resolving new ids (stats `security.resolutions`).
    public var resolutions: Int { groupResolutions + identityResolver.resolutions }
    private var groupResolutions = 0
    /// Beacons checked, verified, published unverified; and the drops by reason (stats `drops`).
    public private(set) var checked = 0
    public private(set) var verified = 0
    public private(set) var unverified = 0
    public private(set) var drops = DropCounts()

    public let identities: Int

    public init(key: BeaconKey, identities: Int, policy: UnkeyedGroupPolicy,
                companyID: UInt16 = ActivityBeacon.defaultCompanyID) throws(CryptoError) {
        precondition((0...DeviceIdentity.maxNumbers).contains(identities), "the config loader checks security.identities")
        groupHash = try key.groupHash()
        self.policy = policy
        self.companyID = companyID
        tagger = try BeaconTagger(key: key)
        groupResolver = try DeviceIDResolver(key: key)
        var keys: [[UInt8]] = []
        keys.reserveCapacity(identities)
        for n in 0..<identities { keys.append(try key.identityKey(number: UInt16(n))) }
        identityResolver = try AddressResolver(keys: keys)
        self.identities = identities
        highest = Array(repeating: 0, count: identities)
        heard = Array(repeating: false, count: identities)
        ended = Array(repeating: false, count: identities)
    }

    /// Checks `beacon`, decoded from `advertisingData` (the report's bytes as received). On
    /// `.verified(identity: n)` the beacon's device id has been replaced by the identity's id.
    public func check(_ beacon: inout ActivityBeacon, advertisingData: UnsafeRawBufferPointer) -> BeaconVerdict {
        // The record the decoder takes, found the decoder's way (AdvertisementContent).
        let value = (try? AdvertisementContent.decode(advertisingData, beaconCompanyID: companyID))?.beaconValue
        return check(&beacon, beaconValue: value ?? UnsafeRawBufferPointer(start: nil, count: 0))
    }

    /// Checks `beacon`, decoded from `beaconValue` (`AdvertisementContent.beaconValue`: the
    /// 24 bytes after the company id, inside the advertisement as received). The tag is checked
    /// over exactly those bytes and the company id before them (§4): an advertisement with two
    /// beacon records cannot have one's tag vouch for the other.
    public func check(_ beacon: inout ActivityBeacon, beaconValue: UnsafeRawBufferPointer) -> BeaconVerdict {
        checked &+= 1
        let verdict = verdict(&beacon, value: beaconValue)
        switch verdict {
        case .verified: verified &+= 1
        case .unverified: unverified &+= 1
        case .dropped(let reason): drops.count(reason)
        }
        return verdict
    }

    private func verdict(_ beacon: inout ActivityBeacon, value: UnsafeRawBufferPointer) -> BeaconVerdict {
        guard beacon.groupHash == groupHash else { return checkUnkeyed(beacon) }
        // The tag first: it is one MIC, and nothing about a forgery is worth more work (§4.3).
        // Proof of the pointer arithmetic: a beacon value always follows its 2-byte company id
        // in the same manufacturer AD (AdvertisementContent.decode).
        guard value.count == ActivityBeacon.valueLength, let base = value.baseAddress,
              tagger.verify(signed: UnsafeRawBufferPointer(start: base - 2, count: ActivityBeacon.signedLength),
                            tag: UnsafeRawBufferPointer(rebasing: value[20..<24]))
        else { return .dropped(Self.badTag) }
        let air = beacon.deviceID & 0xFFFF_FFFF_FFFF
        // Cheapest first: an id already resolved (a scan), a group-wide id (one AES block, §3),
        // and only then every identity key (once per rotation of an identity's id).
        var identity = identityResolver.remembered(air)
        if identity == nil {
            if Self.isResolvableShape(air) { groupResolutions &+= 1 }
            // A group-wide id: the table's own sequence check covers it while it is current.
            if groupResolver.resolves(air) { return .verified(identity: nil) }
            // An id is shaped as a random resolvable address (Core 5.4, Vol 3, Part C, §10.8.2.3).
            identity = identityResolver.resolve(address: air, addressType: 1)
        }
        guard let n = identity else { return .dropped(Self.unresolvedID) }
        guard acceptSequence(beacon, identity: n) else { return .dropped(Self.replayed) }
        beacon.deviceID = DeviceIdentity.id(groupHash: groupHash, number: UInt16(n))
        return .verified(identity: UInt16(n))
    }

    /// A beacon of another group. Published only by policy, and never under an id that stands
    /// for one of this group's devices: otherwise anyone could overwrite a verified activity's
    /// topic by copying its id into a beacon of a group the gateway has no key for.
    private func checkUnkeyed(_ beacon: ActivityBeacon) -> BeaconVerdict {
        guard policy == .publish else { return .dropped(Self.unkeyedGroup) }
        let air = beacon.deviceID & 0xFFFF_FFFF_FFFF
        // Every identity id of the group, not only those below this gateway's
        // `security.identities`: another gateway of the building may be set to more.
        if air >> 16 == UInt64(groupHash) { return .dropped(Self.impersonation) }
        if Self.isResolvableShape(air) { groupResolutions &+= 1 }
        if groupResolver.resolves(air) { return .dropped(Self.impersonation) }
        return .unverified
    }

    /// prand's top bits are 0b01: only then does resolving cost an AES block (§3).
    private static func isResolvableShape(_ air: UInt64) -> Bool { air & 0xC000_0000_0000 == 0x4000_0000_0000 }

    /// An identity's sequence never goes back (§3.1): an older one, or the same one without
    /// the invalidated flag after it was invalidated, is a replay. Remembered for the gateway's
    /// lifetime, so a replay is dropped even after the activity has left the table.
    private func acceptSequence(_ beacon: ActivityBeacon, identity n: Int) -> Bool {
        let ends = beacon.flags.contains(.invalidated)
        guard heard[n] else {
            heard[n] = true; highest[n] = beacon.sequence; ended[n] = ends
            return true
        }
        switch SerialOrder(beacon.sequence, comparedTo: highest[n]) {
        case .older:
            return false
        case .same:
            if ended[n] && !ends { return false }
            ended[n] = ended[n] || ends
            return true
        case .newer:
            highest[n] = beacon.sequence; ended[n] = ends
            return true
        }
    }
}
