// BeaconVerifier: what a gateway holding the beacon key does with each beacon it hears
// (docs/security.md §4.4), device identities (§3.1), and the cost a user sees in the stats
// topic's `security.resolutions`. Every beacon is built from §8's vectors (the secret of §8.1,
// group hash 0x7CEC7226), decoded the way the gateway decodes it (AdvertisementContent) and
// checked over the bytes as received.
import BatonTestSupport
import Testing
@testable import BatonKeys
import BatonWire

private let beaconKey = vectorKeys.beaconKey
/// §8.2.
private let keyedGroup: UInt32 = 0x7CEC_7226
private let otherKeys = try! GroupKeys.derive(secret: GroupSecret(bytes: hx("ffeeddccbbaa99887766554433221100")))

/// A rotating id made with IK_n as the IRK (§3.1).
private func identityID(_ n: UInt16, prand: UInt32 = 0x5A_1234) throws -> UInt64 {
    try DeviceIDResolver(irk: beaconKey.identityKey(number: n)).deviceID(prand: prand)
}

/// A group-wide rotating id, made with the beacon key (§3).
private func groupWideID(prand: UInt32 = 0x5A_1234) throws -> UInt64 {
    try DeviceIDResolver(key: beaconKey).deviceID(prand: prand)
}

/// docs/protocol.md §2.5 vector 1's fields as a device of the keyed group sends them.
private func beacon(id: UInt64, sequence: UInt16 = 258, flags: BeaconFlags = [.supportsStreams, .hasWebURL],
                    group: UInt32 = keyedGroup) -> ActivityBeacon {
    var b = protocolVector1
    b.deviceID = id
    b.sequence = sequence
    b.flags = flags
    b.groupHash = group
    return b
}

/// The 31-byte advertisement, tagged with `key` (the keyed group's beacon key unless said).
private func tagged(_ b: ActivityBeacon, key: BeaconKey = beaconKey) throws -> [UInt8] {
    try advertisement(b, BeaconTagger(key: key))
}

/// The gateway's path: decode the advertisement, then check the beacon in it. Returns the
/// verdict and the device id the beacon is published under.
private func hear(_ advert: [UInt8], by verifier: BeaconVerifier) throws -> (verdict: BeaconVerdict, deviceID: UInt64) {
    try advert.withUnsafeBytes { raw in
        var beacon = try #require(try ActivityBeacon.find(inAdvertisingData: raw, companyID: verifier.companyID))
        let verdict = verifier.check(&beacon, advertisingData: raw)
        return (verdict, beacon.deviceID)
    }
}

/// What became of one advertisement, as a name: a decode error's reason, "no beacon", or the
/// verdict (a drop by its counted name).
private func outcome(_ advert: [UInt8], by verifier: BeaconVerifier) -> String {
    advert.withUnsafeBytes { raw in
        let content: AdvertisementContent
        do throws(WireError) {
            content = try AdvertisementContent.decode(raw, beaconCompanyID: verifier.companyID)
        } catch {
            return "undecodable: \(error.reason)"
        }
        guard var beacon = content.beacon else { return "no beacon" }
        switch verifier.check(&beacon, advertisingData: raw) {
        case .verified(let n): return "verified \(n.map(String.init) ?? "group-wide")"
        case .unverified: return "unverified"
        case .dropped(let reason): return reason.description
        }
    }
}

private func drops(_ verifier: BeaconVerifier) -> [String: Int] {
    Dictionary(uniqueKeysWithValues: verifier.drops.sorted.map { ($0.reason, $0.count) })
}

@Suite struct BeaconVerifierTests {
    /// A reviewer's forgery: a recorded, tagged beacon followed by a second beacon record in the
    /// same (extended) advertisement, untagged, with a far newer sequence. The decoder keeps the
    /// last record; its tag must be the one checked, or the forgery verifies and then locks the
    /// real device out as a replay.
    @Test func aSecondBeaconRecordCannotBorrowTheFirstOnesTag() throws {
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .ignore)
        let id = try identityID(3)
        let genuine = try tagged(beacon(id: id, sequence: 100))
        var forgedBeacon = beacon(id: id, sequence: 30_100)
        forgedBeacon.activityTypeHash = 0xDEAD_BEEF
        let forged = try advertisement(forgedBeacon, OpenGroup())
        for (advert, expected) in [(genuine + forged[3...], BeaconVerdict.dropped(BeaconVerifier.badTag)),
                                   (forged + genuine[3...], .verified(identity: 3))] {
            try advert.withUnsafeBytes { raw in
                let content = try AdvertisementContent.decode(raw, beaconCompanyID: verifier.companyID)
                var b = try #require(content.beacon)
                let value = try #require(content.beaconValue)
                #expect(verifier.check(&b, beaconValue: value) == expected)
                // The advertisement-wide check finds the same record the decoder does.
                var again = try #require(content.beacon)
                #expect(verifier.check(&again, advertisingData: raw) == expected)
            }
        }
        // The real device's next save still goes through.
        #expect(try hear(tagged(beacon(id: try identityID(3, prand: 0x4B_CDEF), sequence: 101)), by: verifier).verdict
                == .verified(identity: 3))
    }

    // MARK: Identities (§3.1)

    @Test func aBeaconOfAnIdentityIsPublishedUnderTheIdentityID() throws {
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .ignore)
        #expect(verifier.groupHash == keyedGroup)
        let heard = try hear(tagged(beacon(id: identityID(3))), by: verifier)
        #expect(heard.verdict == .verified(identity: 3))
        #expect(heard.deviceID == DeviceIdentity.id(groupHash: keyedGroup, number: 3))
        #expect(ActivityBeacon.deviceIDText(heard.deviceID) == "7cec72260003")
        // A new id: one AES block for the group-wide key, then IK_0 … IK_3 until IK_3 matches
        // (§4.4 "Cost").
        #expect(verifier.resolutions == 1 + 4)
    }

    @Test func eachIdentityIsItsOwn() throws {
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .ignore)
        for n in UInt16(0)..<4 {
            let heard = try hear(tagged(beacon(id: identityID(n, prand: 0x40_0100 + UInt32(n)))), by: verifier)
            #expect(heard.verdict == .verified(identity: n))
            #expect(heard.deviceID == UInt64(keyedGroup) << 16 | UInt64(n))
        }
    }

    @Test func aRotatedIDResolvesToTheSameIdentityAndInterleavingCostsNothing() throws {
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .ignore)
        let old = try tagged(beacon(id: identityID(3, prand: 0x5A_1234)))
        let new = try tagged(beacon(id: identityID(3, prand: 0x4B_CDEF)))
        #expect(try hear(old, by: verifier) == (.verified(identity: 3), 0x7CEC_7226_0003))
        #expect(try hear(new, by: verifier) == (.verified(identity: 3), 0x7CEC_7226_0003))
        let afterRotation = verifier.resolutions
        #expect(afterRotation == 2 * (1 + 4), "each new id costs one search")
        // At a rotation a device's controller still sends the old id now and then (§3.1:
        // the last two ids per identity are remembered).
        for _ in 0..<50 {
            #expect(try hear(old, by: verifier).verdict == .verified(identity: 3))
            #expect(try hear(new, by: verifier).verdict == .verified(identity: 3))
        }
        #expect(verifier.resolutions == afterRotation)
        #expect(verifier.verified == 102)
    }

    @Test func onlyTheLastTwoIDsAreRemembered() throws {
        // A third id pushes the first out: hearing the first again costs a search, and still
        // resolves to the same identity.
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .ignore)
        let ids = try [0x5A_1234, 0x4B_CDEF, 0x61_0203].map { try identityID(3, prand: $0) }
        for id in ids { #expect(try hear(tagged(beacon(id: id)), by: verifier).verdict == .verified(identity: 3)) }
        let spent = verifier.resolutions
        #expect(try hear(tagged(beacon(id: ids[2])), by: verifier).verdict == .verified(identity: 3))
        #expect(try hear(tagged(beacon(id: ids[1])), by: verifier).verdict == .verified(identity: 3))
        #expect(verifier.resolutions == spent)
        #expect(try hear(tagged(beacon(id: ids[0])), by: verifier).verdict == .verified(identity: 3))
        #expect(verifier.resolutions == spent + 1 + 4)
    }

    @Test func aGroupWideIDKeepsItsOwnID() throws {
        // §3: resolved with the beacon key, "a device of this group": published under its
        // rotating id, one AES block per beacon (§4.4 "Cost"), nothing remembered.
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .ignore)
        let id = try groupWideID()
        #expect(id == 0x5A12_34E5_DCBB)  // §8.3
        for i in 1...3 {
            #expect(try hear(tagged(beacon(id: id)), by: verifier) == (.verified(identity: nil), id))
            #expect(verifier.resolutions == i)
        }
    }

    @Test func aGroupWideIDsSequenceIsLeftToTheTable() throws {
        // §4.4: only identities have their sequence checked by the verifier; an older sequence of
        // a group-wide id is the activity table's `stale-sequence` while its entry lives.
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .ignore)
        let id = try groupWideID()
        #expect(try hear(tagged(beacon(id: id, sequence: 10)), by: verifier).verdict == .verified(identity: nil))
        #expect(try hear(tagged(beacon(id: id, sequence: 9)), by: verifier).verdict == .verified(identity: nil))
    }

    // MARK: Forgeries (§4.3)

    @Test func everyBitFlippedFromTheCompanyIDThroughTheTagIsRefused() throws {
        // All 208 single-bit flips of advertisement offsets 5..<31 (company id through tag) of
        // device 3's beacon, policy ignore: none is verified or published unverified. Each is
        // refused by the decoder (a flipped company id is not our beacon any more; a version
        // other than 1 is unsupported; a PSM above 0x00FF is malformed) or dropped by the
        // verifier: the tag covers everything else, and a flipped group hash is another group.
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .ignore)
        let advert = try tagged(beacon(id: identityID(3)))
        #expect(outcome(advert, by: verifier) == "verified 3")
        let fields: [(name: String, offsets: Range<Int>)] = [
            ("company id", 5..<7), ("version", 7..<8), ("flags", 8..<9), ("sequence", 9..<11),
            ("activity type", 11..<15), ("group hash", 15..<19), ("device id", 19..<25),
            ("PSM low byte", 25..<26), ("PSM high byte", 26..<27), ("tag", 27..<31),
        ]
        var byReason: [String: Int] = [:]
        var byField: [String: Set<String>] = [:]
        for field in fields {
            for offset in field.offsets {
                for bit in 0..<8 {
                    var forged = advert
                    forged[offset] ^= 1 << bit
                    let result = outcome(forged, by: verifier)
                    byReason[result, default: 0] += 1
                    byField[field.name, default: []].insert(result)
                }
            }
        }
        #expect(byReason.values.reduce(0, +) == 208)
        #expect(byReason == [
            "no beacon": 16,
            "undecodable: unsupported": 8,
            "undecodable: beacon-bad-psm": 8,
            "beacon-unkeyed-group": 32,
            "beacon-bad-tag": 144,
        ])
        #expect(byField == [
            "company id": ["no beacon"],
            "version": ["undecodable: unsupported"],
            "flags": ["beacon-bad-tag"],
            "sequence": ["beacon-bad-tag"],
            "activity type": ["beacon-bad-tag"],
            "group hash": ["beacon-unkeyed-group"],
            "device id": ["beacon-bad-tag"],
            "PSM low byte": ["beacon-bad-tag"],
            "PSM high byte": ["undecodable: beacon-bad-psm"],
            "tag": ["beacon-bad-tag"],
        ])
        // The verifier saw the original and the 176 flips the decoder let through.
        #expect(verifier.checked == 1 + 176)
        #expect(verifier.verified == 1 && verifier.unverified == 0)
        #expect(drops(verifier) == ["beacon-bad-tag": 144, "beacon-unkeyed-group": 32])
    }

    @Test func aGroupWideIDWithAFlippedGroupHashIsAnImpersonationWhenOthersArePublished() throws {
        // Policy publish: a flipped group hash makes the beacon another group's, but its id
        // still resolves under the beacon key, so it may not take that id's topic (§4.4).
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .publish)
        let advert = try tagged(beacon(id: groupWideID()))
        for offset in 15..<19 {
            for bit in 0..<8 {
                var forged = advert
                forged[offset] ^= 1 << bit
                #expect(outcome(forged, by: verifier) == "beacon-impersonation", "offset \(offset) bit \(bit)")
            }
        }
        #expect(drops(verifier) == ["beacon-impersonation": 32])
    }

    @Test func aTagUnderAnotherKeyIsBad() throws {
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .publish)
        let forged = try tagged(beacon(id: identityID(3)), key: otherKeys.beaconKey)
        #expect(try hear(forged, by: verifier).verdict == .dropped(BeaconVerifier.badTag))
        let open = try advertisement(beacon(id: identityID(3)), OpenGroup())
        #expect(try hear(open, by: verifier).verdict == .dropped(BeaconVerifier.badTag))
        #expect(verifier.resolutions == 0, "the tag is checked before any id is resolved (§4.4)")
    }

    // MARK: Replays (§3.1 "Sequence", §4.4)

    @Test func anOlderSequenceOfAnIdentityIsAReplay() throws {
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .ignore)
        let id = try identityID(3)
        #expect(try hear(tagged(beacon(id: id, sequence: 10)), by: verifier).verdict == .verified(identity: 3))
        #expect(try hear(tagged(beacon(id: id, sequence: 9)), by: verifier).verdict == .dropped(BeaconVerifier.replayed))
        #expect(try hear(tagged(beacon(id: id, sequence: 10)), by: verifier).verdict == .verified(identity: 3),
                "the same beacon again is the device re-advertising")
        #expect(try hear(tagged(beacon(id: id, sequence: 11)), by: verifier).verdict == .verified(identity: 3))
        #expect(try hear(tagged(beacon(id: id, sequence: 10)), by: verifier).verdict == .dropped(BeaconVerifier.replayed))
    }

    @Test func theSameSequenceWithoutTheInvalidatedFlagAfterItIsAReplay() throws {
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .ignore)
        let id = try identityID(3)
        let ended = try tagged(beacon(id: id, sequence: 10, flags: [.invalidated]))
        let live = try tagged(beacon(id: id, sequence: 10, flags: []))
        #expect(try hear(live, by: verifier).verdict == .verified(identity: 3))
        #expect(try hear(ended, by: verifier).verdict == .verified(identity: 3), "invalidating keeps the sequence")
        #expect(try hear(ended, by: verifier).verdict == .verified(identity: 3), "and is re-advertised")
        #expect(try hear(live, by: verifier).verdict == .dropped(BeaconVerifier.replayed))
        #expect(try hear(tagged(beacon(id: id, sequence: 11)), by: verifier).verdict == .verified(identity: 3),
                "a new activity after the invalidation")
    }

    @Test func sequencesWrapInSerialNumberOrder() throws {
        // RFC 1982 over 16 bits (protocol.md §2.3): 0 is newer than 65535. At a distance of
        // exactly 2¹⁵ the order is undefined; SerialOrder calls it older, so it is refused.
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .ignore)
        let id = try identityID(3)
        #expect(try hear(tagged(beacon(id: id, sequence: 65535)), by: verifier).verdict == .verified(identity: 3))
        #expect(try hear(tagged(beacon(id: id, sequence: 0)), by: verifier).verdict == .verified(identity: 3))
        #expect(try hear(tagged(beacon(id: id, sequence: 65535)), by: verifier).verdict == .dropped(BeaconVerifier.replayed))
        #expect(try hear(tagged(beacon(id: id, sequence: 0x7FFF)), by: verifier).verdict == .verified(identity: 3))
        #expect(try hear(tagged(beacon(id: id, sequence: 0)), by: verifier).verdict == .dropped(BeaconVerifier.replayed))
        #expect(try hear(tagged(beacon(id: id, sequence: 0xFFFF)), by: verifier).verdict == .dropped(BeaconVerifier.replayed),
                "0x7FFF + 2¹⁵")
    }

    @Test func aReplayUnderAnIDFromBeforeARotationIsDropped() throws {
        // An attacker recorded the beacon before the device rotated its id; the sequence is
        // the identity's, not the id's.
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .ignore)
        let recorded = try tagged(beacon(id: identityID(3, prand: 0x5A_1234), sequence: 10))
        #expect(try hear(recorded, by: verifier).verdict == .verified(identity: 3))
        #expect(try hear(tagged(beacon(id: identityID(3, prand: 0x4B_CDEF), sequence: 11)), by: verifier).verdict
                == .verified(identity: 3))
        #expect(try hear(recorded, by: verifier).verdict == .dropped(BeaconVerifier.replayed))
        // Two rotations later the recorded id is no longer remembered: it is resolved again,
        // and still dropped.
        #expect(try hear(tagged(beacon(id: identityID(3, prand: 0x61_0203), sequence: 12)), by: verifier).verdict
                == .verified(identity: 3))
        let spent = verifier.resolutions
        #expect(try hear(recorded, by: verifier).verdict == .dropped(BeaconVerifier.replayed))
        #expect(verifier.resolutions == spent + 1 + 4)
    }

    @Test func identitiesKeepTheirOwnSequences() throws {
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .ignore)
        #expect(try hear(tagged(beacon(id: identityID(3), sequence: 1000)), by: verifier).verdict == .verified(identity: 3))
        #expect(try hear(tagged(beacon(id: identityID(2), sequence: 5)), by: verifier).verdict == .verified(identity: 2))
    }

    // MARK: Ids that resolve under no key (§4.4)

    @Test func aDeviceNumberTheGatewayDoesNotTryIsUnresolved() throws {
        // security.identities 4: IK_0 … IK_3. Device 7's id resolves under none of them.
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .ignore)
        let heard = try hear(tagged(beacon(id: identityID(7))), by: verifier)
        #expect(heard.verdict == .dropped(BeaconVerifier.unresolvedID))
        #expect(heard.deviceID == (try identityID(7)), "a dropped beacon keeps its id")
        #expect(verifier.resolutions == 1 + 4, "the beacon key, then every identity key")
        let wider = try BeaconVerifier(key: beaconKey, identities: 8, policy: .ignore)
        #expect(try hear(tagged(beacon(id: identityID(7))), by: wider).verdict == .verified(identity: 7))
    }

    @Test func anIDThatIsNotRPAShapedIsUnresolved() throws {
        // Core 5.4, Vol 6, Part B, §1.3.2.2: prand's top bits are 0b01. A hash that matches
        // IK_3 under another shape is still not an id (§3).
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .ignore)
        let ik3 = try DeviceIDResolver(irk: beaconKey.identityKey(number: 3))
        let bk = try DeviceIDResolver(key: beaconKey)
        for top: UInt32 in [0b00, 0b10, 0b11] {
            let prand = top << 22 | 0x1A_1234
            for resolver in [ik3, bk] {
                let id = UInt64(prand) << 24 | UInt64(resolver.hash(prand: prand))
                #expect(try hear(tagged(beacon(id: id)), by: verifier).verdict == .dropped(BeaconVerifier.unresolvedID),
                        "prand \(String(prand, radix: 16))")
            }
        }
    }

    @Test func theZeroIDIsUnresolved() throws {
        // Device id 0 has prand 0 (top bits 0b00): not an id at all (§3), even before any
        // identity has been heard.
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .ignore)
        let before = try hear(tagged(beacon(id: 0)), by: verifier)
        #expect(before.verdict == .dropped(BeaconVerifier.unresolvedID), "got \(before)")
        #expect(try hear(tagged(beacon(id: identityID(0))), by: verifier).verdict == .verified(identity: 0))
        let after = try hear(tagged(beacon(id: 0)), by: verifier)
        #expect(after.verdict == .dropped(BeaconVerifier.unresolvedID), "got \(after)")
    }

    // MARK: Other groups (§4.4, config.md "security.unkeyed")

    @Test func anotherGroupIsDroppedWhenIgnored() throws {
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .ignore)
        let other = try advertisement(beacon(id: 0x5A12_3456_789A, group: 0xA1B2_C3D4), OpenGroup())
        #expect(try hear(other, by: verifier).verdict == .dropped(BeaconVerifier.unkeyedGroup))
        let otherKeyed = try tagged(beacon(id: 0x5A12_3456_789A, group: otherKeys.groupHash), key: otherKeys.beaconKey)
        #expect(try hear(otherKeyed, by: verifier).verdict == .dropped(BeaconVerifier.unkeyedGroup))
        #expect(verifier.resolutions == 0)
    }

    @Test func anotherGroupIsPublishedUnverifiedUnderItsOwnID() throws {
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .publish)
        let other = try advertisement(beacon(id: 0x5A12_3456_789A, group: 0xA1B2_C3D4), OpenGroup())
        #expect(try hear(other, by: verifier) == (.unverified, 0x5A12_3456_789A))
    }

    @Test func anotherGroupMayNotUseAnIdentityIDOfTheKeyedGroup() throws {
        // An identity id copied into another group's beacon would land on the identity's
        // topic (§4.4, the last-but-one rule).
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .publish)
        // Numbers beyond this gateway's 4 too: another gateway of the building may follow more.
        for n: UInt16 in [0, 1, 2, 3, 4, 1023, 65535] {
            let id = DeviceIdentity.id(groupHash: keyedGroup, number: n)
            let forged = try advertisement(beacon(id: id, group: 0xA1B2_C3D4), OpenGroup())
            #expect(try hear(forged, by: verifier).verdict == .dropped(BeaconVerifier.impersonation), "identity \(n)")
        }
    }

    @Test func anotherGroupMayNotUseAGroupWideIDOfTheKeyedGroup() throws {
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .publish)
        let forged = try advertisement(beacon(id: groupWideID(), group: 0xA1B2_C3D4), OpenGroup())
        #expect(try hear(forged, by: verifier).verdict == .dropped(BeaconVerifier.impersonation))
        #expect(verifier.resolutions == 1)
    }

    // MARK: Counters (the stats topic's drops and security object)

    @Test func theCountersAddUp() throws {
        let verifier = try BeaconVerifier(key: beaconKey, identities: 4, policy: .publish)
        let heard: [[UInt8]] = [
            try tagged(beacon(id: identityID(3), sequence: 10)),                                    // verified
            try tagged(beacon(id: identityID(3), sequence: 9)),                                     // replayed
            try tagged(beacon(id: identityID(3), sequence: 11)),                                    // verified
            try tagged(beacon(id: groupWideID())),                                                  // verified
            try tagged(beacon(id: identityID(3), sequence: 12), key: otherKeys.beaconKey),          // bad tag
            try tagged(beacon(id: identityID(7))),                                                  // unresolved
            try advertisement(beacon(id: 0x5A12_3456_789A, group: 0xA1B2_C3D4), OpenGroup()),      // unverified
            try advertisement(beacon(id: 0x5A12_3456_789B, group: 0xA1B2_C3D4), OpenGroup()),      // unverified
            try advertisement(beacon(id: 0x7CEC_7226_0001, group: 0xA1B2_C3D4), OpenGroup()),      // impersonation
        ]
        for advert in heard { _ = try hear(advert, by: verifier) }
        #expect(verifier.checked == 9)
        #expect(verifier.verified == 3)
        #expect(verifier.unverified == 2)
        #expect(drops(verifier) == [
            "beacon-replayed": 1, "beacon-bad-tag": 1, "beacon-unresolved-id": 1, "beacon-impersonation": 1,
        ])
        #expect(verifier.checked == verifier.verified + verifier.unverified + verifier.drops.total)
        #expect(verifier.drops.overflow == 0)
    }

    // MARK: Capacity (security.identities, config.md "security")

    @Test func noIdentitiesLeavesGroupWideIDsOnly() throws {
        let verifier = try BeaconVerifier(key: beaconKey, identities: 0, policy: .ignore)
        #expect(verifier.identities == 0)
        #expect(try hear(tagged(beacon(id: groupWideID())), by: verifier).verdict == .verified(identity: nil))
        #expect(try hear(tagged(beacon(id: identityID(0))), by: verifier).verdict == .dropped(BeaconVerifier.unresolvedID))
        #expect(verifier.resolutions == 2)
    }

    @Test func theMostIdentitiesAGatewayTries() throws {
        let n = DeviceIdentity.maxNumbers
        let verifier = try BeaconVerifier(key: beaconKey, identities: n, policy: .ignore)
        #expect(verifier.identities == n)
        let last = UInt16(n - 1)
        #expect(try hear(tagged(beacon(id: identityID(last))), by: verifier) == (.verified(identity: last),
                                                                                 DeviceIdentity.id(groupHash: keyedGroup, number: last)))
        #expect(verifier.resolutions == 1 + n, "a new id of the last number tries every identity key")
        #expect(try hear(tagged(beacon(id: identityID(UInt16(n)))), by: verifier).verdict == .dropped(BeaconVerifier.unresolvedID),
                "device number maxNumbers is one past the table")
    }

    @Test func moreIdentitiesThanTheMostIsOurBug() async {
        // The config loader refuses security.identities above DeviceIdentity.maxNumbers (and below
        // 0); a verifier asked for more is a broken invariant, not a bad beacon.
        await #expect(processExitsWith: .failure) {
            _ = try BeaconVerifier(key: vectorKeys.beaconKey, identities: DeviceIdentity.maxNumbers + 1, policy: .ignore)
        }
        await #expect(processExitsWith: .failure) {
            _ = try BeaconVerifier(key: vectorKeys.beaconKey, identities: -1, policy: .ignore)
        }
    }
}
