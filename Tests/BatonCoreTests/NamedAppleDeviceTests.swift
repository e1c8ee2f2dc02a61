// Apple devices the user named by their IRK (docs/table.md "Apple devices", docs/security.md
// §10): the gateway resolves the advertiser address and hands the table an `AppleIdentity`;
// the table keeps one entry per identity, whatever address the device sends from and whether
// or not the advertisement carries Continuity frames. Frames are whole advertisements in hex
// (docs/protocol.md §4), decoded as the gateway decodes them.
import BatonLibc
import BatonTestSupport
import Testing
import BatonWire
import BatonCore

private let t0 = Instant.now
private func at(_ seconds: Int) -> Instant { t0 + .seconds(seconds) }

/// An iPhone with a current activity: Handoff (§4.2: sequence 0x1234, tag 0xAB) and Nearby Info.
private let phoneReading = """
    02 01 1A
    1A FF 4C 00
    0C 0E 00 34 12 AB 00 11 22 33 44 55 66 77 88 99
    10 05 1B 1C 7A 8D 2E
    """
// `macHandoff` and `padNearbyInfo` are AppleDeviceTableTests' adverts.

/// The user's phone: `apple.irks[0]`, published under this id (IdentityResolvingKey.stableID).
private let phone = AppleIdentity(index: 0, id: 0xF76D_FA55)
/// The user's watch: `apple.irks[1]`.
private let watch = AppleIdentity(index: 1, id: 0x5E13_B289)

/// Resolvable private addresses (top bits 0b01, Core 5.4, Vol 6, Part B, §1.3.2.2), one per
/// rotation of the phone.
private let rotations: [UInt64] = [0x7081_940D_FBAA, 0x4A11_2233_4455, 0x5B66_7788_99AA, 0x6C12_3456_789A, 0x4000_0000_0001]
private let macAddress: UInt64 = 0x5F00_1122_3344

/// What one advertisement does to the table. `advert` nil: an advertisement with no Apple
/// data at all (the gateway passes `ContinuityIterator.empty`), as a phone's other adverts.
@discardableResult
private func hear(_ table: inout AppleDeviceTable, _ advert: String?, from address: UInt64,
                  identity: AppleIdentity? = nil, rssi: Int8 = -60, at t: Instant) throws -> [AppleChange] {
    var changes: [AppleChange] = []
    guard let advert else {
        table.hear(.empty, rssi: rssi, address: address, addressType: 1, identity: identity, now: t) { changes.append($0) }
        return changes
    }
    try hx(advert).withUnsafeBytes { raw in
        let content = try AdvertisementContent.decode(raw)
        #expect(content.kind == .continuity)
        table.hear(content.continuityMessages, rssi: rssi, address: address, addressType: 1, identity: identity, now: t) {
            changes.append($0)
        }
    }
    return changes
}

// `devices(_:)` and `expire(_:at:)` are AppleDeviceTableTests' helpers.

@Suite("Named Apple devices (docs/security.md §10)")
struct NamedAppleDeviceTableTests {
    @Test func fiveRotatingAddressesAreOneNamedEntry() throws {
        var table = AppleDeviceTable(config: .init(tracking: .handoff, idKey: 7))
        var changes = try hear(&table, phoneReading, from: rotations[0], identity: phone, at: at(0))
        // Every 15 minutes a new address; between Continuity frames, adverts with none.
        for (n, address) in rotations.enumerated().dropFirst() {
            changes += try hear(&table, n.isMultiple(of: 2) ? phoneReading : nil, from: address, identity: phone, at: at(900 * n))
            changes += try hear(&table, phoneReading, from: address, identity: phone, at: at(900 * n + 1))
        }
        #expect(changes.map(\.kind) == [.appeared])
        let d = try #require(changes.first?.device)
        #expect(d.id == phone.id && d.identity == phone.index, "published under the IRK's id, not a pseudonym")
        let all = devices(table)
        #expect(all.count == 1 && table.count == 1)
        let now = try #require(all.first)
        #expect(now.id == phone.id && now.identity == 0)
        #expect(now.addresses == 5, "five distinct addresses")
        #expect(now.address == rotations[4] && now.addressType == 1, "the latest address")
        #expect(now.firstSeen == at(0) && now.lastSeen == at(3_601))
        #expect(now.kinds == [.handoff, .nearbyInfo] && now.handoffSequence == 0x1234)
        #expect(table.counters.appeared == 1 && table.counters.mergedAddresses == 4)
    }

    @Test func aNamedDeviceIsTrackedWithoutContinuityFrames() throws {
        // Tracking `handoff` ignores an unnamed device without Handoff; a named one is followed
        // from any advertisement it sends.
        var table = AppleDeviceTable(config: .init(tracking: .handoff))
        let changes = try hear(&table, nil, from: rotations[0], identity: phone, rssi: -70, at: at(0))
        #expect(changes.map(\.kind) == [.appeared])
        let d = try #require(changes.first?.device)
        #expect(d.id == phone.id && d.identity == 0 && d.kinds == [] && d.handoffSequence == nil && d.rssi == -70)
        #expect(try hear(&table, nil, from: rotations[1], identity: phone, at: at(1)).isEmpty)
        #expect(try hear(&table, padNearbyInfo, from: rotations[1], identity: phone, at: at(2)).map(\.kind) == [.kindsChanged])
        #expect(try hear(&table, nil, from: rotations[2], identity: phone, at: at(3)).isEmpty)
        // The same advertisements unnamed: nothing.
        #expect(try hear(&table, nil, from: macAddress, at: at(4)).isEmpty)
        #expect(try hear(&table, padNearbyInfo, from: macAddress, at: at(4)).isEmpty)
        #expect(table.count == 1 && devices(table).first?.addresses == 3)
    }

    @Test func trackingOffTracksNamedDevicesNeither() throws {
        var table = AppleDeviceTable(config: .init(tracking: .off))
        #expect(try hear(&table, phoneReading, from: rotations[0], identity: phone, at: at(0)).isEmpty)
        #expect(try hear(&table, nil, from: rotations[1], identity: phone, at: at(1)).isEmpty)
        #expect(table.count == 0 && table.nextExpiry == nil && table.namedDevice(id: phone.id) == nil)
        #expect(table.counters.framesHeard == 2 && table.counters.appeared == 0)
    }

    @Test func anUnnamedDeviceKeepsItsOwnEntryBesideANamedOne() throws {
        var table = AppleDeviceTable(config: .init(tracking: .handoff, idKey: 7))
        let mac = try #require(try hear(&table, macHandoff, from: macAddress, at: at(0)).first?.device)
        try hear(&table, phoneReading, from: rotations[0], identity: phone, at: at(1))
        try hear(&table, phoneReading, from: rotations[1], identity: phone, at: at(2))
        #expect(try hear(&table, macHandoff, from: macAddress, at: at(3)).isEmpty)
        let all = devices(table)
        #expect(all.count == 2)
        let unnamed = try #require(all.first { $0.identity == nil })
        #expect(unnamed.id == mac.id && unnamed.id != phone.id && unnamed.address == macAddress && unnamed.addresses == 1)
        let named = try #require(all.first { $0.identity != nil })
        #expect(named.id == phone.id && named.addresses == 2)
        // Two named devices: two entries, each under its own id.
        try hear(&table, nil, from: rotations[2], identity: watch, at: at(4))
        #expect(Set(devices(table).map(\.id)) == [mac.id, phone.id, watch.id])
        #expect(table.namedDevice(id: watch.id)?.identity == 1)
    }

    @Test func namedDeviceFindsOnlyNamedDevices() throws {
        var table = AppleDeviceTable(config: .init(tracking: .handoff, idKey: 7))
        let mac = try #require(try hear(&table, macHandoff, from: macAddress, at: at(0)).first?.device)
        try hear(&table, nil, from: rotations[0], identity: phone, rssi: -52, at: at(1))
        try hear(&table, nil, from: rotations[1], identity: phone, rssi: -52, at: at(2))
        let named = table.namedDevice(id: phone.id)
        let found = try #require(named)
        #expect(found.identity == 0 && found.address == rotations[1] && found.rssi == -52 && found.lastSeen == at(2))
        #expect(table.namedDevice(id: mac.id) == nil, "an unnamed device's pseudonym is not a name")
        #expect(table.namedDevice(id: watch.id) == nil, "not heard")
        #expect(AppleDevice.roomsID(phone.id) == 0xFFFF_F76D_FA55, "rooms know it under ffff")
    }

    @Test func expiryRemovesANamedDeviceAndItComesBack() throws {
        var table = AppleDeviceTable(config: .init(tracking: .handoff, expiry: .seconds(60)))
        try hear(&table, phoneReading, from: rotations[0], identity: phone, at: at(0))
        try hear(&table, nil, from: rotations[1], identity: phone, at: at(10))
        #expect(table.nextExpiry == at(70))
        #expect(expire(&table, at: at(69)).isEmpty)
        let gone = expire(&table, at: at(70))
        #expect(gone.map(\.kind) == [.expired])
        #expect(gone.first?.device.id == phone.id && gone.first?.device.identity == 0)
        #expect(table.count == 0 && table.namedDevice(id: phone.id) == nil && table.nextExpiry == nil)
        // Heard again, from the address it had: a new appearance, under the same id.
        let back = try hear(&table, nil, from: rotations[1], identity: phone, at: at(80))
        #expect(back.map(\.kind) == [.appeared])
        #expect(back.first?.device.id == phone.id && back.first?.device.addresses == 1 && back.first?.device.firstSeen == at(80))
        #expect(table.count == 1 && table.counters.appeared == 2 && table.counters.expired == 1)
    }

    @Test func capacityPlusOneEvictsANamedDeviceThatCanComeBack() throws {
        var table = AppleDeviceTable(config: .init(tracking: .handoff, capacity: 2, idKey: 7))
        try hear(&table, nil, from: rotations[0], identity: phone, at: at(0))
        let mac = try #require(try hear(&table, macHandoff, from: macAddress, at: at(1)).first?.device)
        // A third device: the least recently heard, the phone, makes room.
        let third = try hear(&table, phoneReading, from: 0x4ABC_DEF0_1234, at: at(2))
        #expect(third.map(\.kind) == [.evicted, .appeared])
        #expect(third.first?.device.id == phone.id && third.first?.device.identity == 0)
        #expect(table.count == 2 && table.capacity == 2 && table.counters.evicted == 1)
        #expect(table.namedDevice(id: phone.id) == nil)
        // The phone again, from a new address: back under its id; the Mac is now the oldest.
        let back = try hear(&table, nil, from: rotations[1], identity: phone, at: at(3))
        #expect(back.map(\.kind) == [.evicted, .appeared])
        #expect(back.map(\.device.id) == [mac.id, phone.id])
        #expect(table.namedDevice(id: phone.id)?.address == rotations[1])
        #expect(table.count == 2 && table.counters.evicted == 2)
        // Nothing of its old entry was left behind: its next advert changes nothing.
        #expect(try hear(&table, nil, from: rotations[1], identity: phone, at: at(4)).isEmpty)
        #expect(table.count == 2 && devices(table).filter { $0.identity != nil }.count == 1)
    }

    @Test func twoAddressesAtOnceCountAsTwo() throws {
        // As for an unnamed device (AppleDeviceTableTests.theSameHandoffFromTwoAddressesIsOneDevice):
        // `addresses` counts distinct addresses, however often a device alternates between
        // two of them (the overlap of a rotation, two radios at once).
        var table = AppleDeviceTable(config: .init(tracking: .handoff))
        for s in 0...20 {
            try hear(&table, phoneReading, from: s.isMultiple(of: 2) ? rotations[0] : rotations[1], identity: phone, at: at(s))
        }
        let named = table.namedDevice(id: phone.id)
        let d = try #require(named)
        #expect(d.addresses == 2)
        #expect(table.counters.mergedAddresses == 1)
    }

    @Test func aNamedDevicesHandoffFrameFromAnotherAddressLeavesNothingBehind() async {
        // Anyone can re-send a named phone's Handoff frame from an address that resolves under
        // no IRK (a replay, or a device reporting another address type): the gateway hears it
        // unnamed. After the named entry expires, a frame from that address must find nothing.
        // An exit test: before the fix, the last frame trapped (Index out of bounds).
        await #expect(processExitsWith: .success) {
            var table = AppleDeviceTable(config: .init(tracking: .all, expiry: .seconds(60)))
            _ = try hear(&table, phoneReading, from: rotations[0], identity: phone, at: at(0))
            // The copy from another address is a device of its own, not merged into the phone.
            let copy = try hear(&table, phoneReading, from: macAddress, at: at(1))
            #expect(copy.map(\.kind) == [.appeared] && copy.first?.device.identity == nil)
            _ = try hear(&table, phoneReading, from: rotations[1], identity: phone, at: at(2))
            _ = expire(&table, at: at(100))
            let changes = try hear(&table, padNearbyInfo, from: macAddress, at: at(101))
            #expect(changes.map(\.kind) == [.appeared])
        }
    }
}
