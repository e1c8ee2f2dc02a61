// Apple devices as their Continuity frames show them (docs/protocol.md §4): "has a current
// Handoff activity, changed N s ago", under a pseudonymous id. The rules are written for users
// in docs/table.md "Apple devices".
//
// Apple devices rotate their random address about every 15 minutes and may send the same
// Handoff frame from two addresses at once. An entry is found by address first (the latest
// and the one before it), else by its Handoff fingerprint (sequence, auth tag and a hash of
// the ciphertext, which stay the same across a rotation until the activity changes), so a
// rotation moves the entry to the new address instead of leaving a stale one behind.
// Storage is fixed at init like the activity table's; `hear` and `expire` allocate nothing.
import BatonLibc
public import BatonWire

public enum AppleTracking: String, Sendable, Equatable, CaseIterable {
    /// No Apple entries at all (still counted on the status topic).
    case off
    /// Devices that send Handoff (0x0C): "has a current Handoff activity, changed N s ago".
    case handoff
    /// Every device sending Handoff, Nearby Info or Nearby Action.
    case all
}

public struct AppleDeviceTableConfig: Sendable, Equatable {
    public var tracking: AppleTracking
    public var capacity: Int
    public var expiry: Duration
    /// Keys the pseudonymous entry ids, so an id says nothing about the MAC address it came
    /// from. Random per run by default.
    public var idKey: UInt64
    public init(tracking: AppleTracking = .handoff, capacity: Int = 64, expiry: Duration = .seconds(60), idKey: UInt64 = 0) {
        self.tracking = tracking
        self.capacity = capacity
        self.expiry = expiry
        self.idKey = idKey
    }
}

public struct AppleFrameKinds: OptionSet, Sendable, Equatable {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }
    public static let handoff = AppleFrameKinds(rawValue: 1)
    public static let nearbyInfo = AppleFrameKinds(rawValue: 2)
    public static let nearbyAction = AppleFrameKinds(rawValue: 4)
}

/// An Apple device as Continuity frames show it, under a pseudonymous id that survives
/// address rotation where the frames allow it (docs/mqtt.md "Apple devices").
public struct AppleDevice: Sendable, Equatable {
    /// Stable pseudonym for the topic (`<prefix>/apple/<id as 8 hex digits>`).
    public var id: UInt32
    /// The latest advertiser address (published only when the config asks).
    public var address: UInt64
    public var addressType: UInt8
    public var kinds: AppleFrameKinds
    /// The Handoff sequence number (docs/protocol.md §4.2), if the device sent Handoff.
    public var handoffSequence: UInt16?
    /// When the Handoff sequence last changed (or was first heard).
    public var handoffChanged: Instant?
    public var rssi: Int8
    /// The smoothed RSSI and the address count at the last change: what the published
    /// message said, so a republish after a reconnect repeats it exactly (docs/mqtt.md §5).
    public var rssiAtChange: Int8 = 127
    public var addressesAtChange: UInt32 = 1
    public var firstSeen: Instant
    public var lastSeen: Instant
    /// Distinct addresses this entry was heard from (rotation, two radios at once).
    public var addresses: UInt32
    /// How often it advertises as this room hears it, in ms (`SilenceFade`); 0 until a second frame.
    public var interval: UInt16 = 0
    /// For a device whose IRK the user gave (`apple.irks`): its index in that list. Its entry
    /// is found by that, whatever address it sends from (docs/table.md "Apple devices").
    public var identity: Int? = nil

    /// The id rooms know a named device by (sightings, ownership: docs/rooms.md): its 32-bit id
    /// under `ffff`, the same at every gateway given the same IRK.
    public static func roomsID(_ id: UInt32) -> UInt64 { 0xFFFF_0000_0000 | UInt64(id) }
}

/// A device the gateway resolved with a configured IRK: which one, and the id it is
/// published under (the same at every gateway: docs/security.md §10).
public struct AppleIdentity: Sendable, Equatable {
    public var index: Int
    public var id: UInt32
    public init(index: Int, id: UInt32) { self.index = index; self.id = id }
}

public enum AppleChangeKind: Sendable, Equatable {
    case appeared, handoffChanged, kindsChanged, expired, evicted
}

public struct AppleChange: Sendable, Equatable {
    public var kind: AppleChangeKind
    public var device: AppleDevice
}

public struct AppleDeviceCounters: Sendable, Equatable {
    public var framesHeard = 0
    public var appeared = 0
    public var handoffChanged = 0
    public var expired = 0
    public var evicted = 0
    /// Frames matched to an existing entry from another address (rotation or a second radio).
    public var mergedAddresses = 0
    public init() {}
}

public struct AppleDeviceTable: ~Copyable {
    public let config: AppleDeviceTableConfig
    public private(set) var counters = AppleDeviceCounters()

    // Internal, not private: see ActivityTable.Entry.
    struct Entry {
        var device: AppleDevice
        var smoothed: SmoothedRSSI
        /// The address heard before the latest, as an index key; still finds this entry.
        var previousAddress: UInt64?
        /// The latest Handoff fingerprint, and whether `byFingerprint` points here (the first
        /// entry to claim a fingerprint keeps it).
        var fingerprint: UInt64
        var holdsFingerprint: Bool
        /// A named device's index key (`identityKey`), instead of address keys.
        var identityKey: UInt64? = nil
    }

    /// The one list of `entries`, in order of last heard.
    private static let list = 0

    private var entries: SlotPool<Entry>
    /// Up to two addresses per entry: the latest and the one before it.
    private var byAddress: SlotIndex
    private var byFingerprint: SlotIndex
    private var clock = MonotonicClamp()

    /// Allocates storage for `config.capacity` devices, once, whatever the tracking (about
    /// 100 bytes a device plus its index buckets). The capacity rule is the activity table's.
    public init(config: AppleDeviceTableConfig) {
        self.config = config
        entries = SlotPool(capacity: config.capacity)
        byAddress = SlotIndex(maxKeys: 2 * config.capacity)
        byFingerprint = SlotIndex(maxKeys: config.capacity)
    }

    public var count: Int { entries.count }
    public var capacity: Int { entries.capacity }

    /// Takes the Continuity messages of one advertisement (already validated by the decoder).
    /// Calls `onChange` at most once for a known device, or `.evicted` then `.appeared` for a
    /// new one in a full table. Allocates nothing. `onChange` records; it must not re-enter.
    /// `identity`: the address resolved under a configured IRK. Such a device is tracked
    /// from any advertisement (with or without Continuity frames) unless tracking is off.
    public mutating func hear(_ messages: ContinuityIterator, rssi: Int8, address: UInt64, addressType: UInt8,
                              identity: AppleIdentity? = nil, now: Instant, _ onChange: (AppleChange) -> Void) {
        counters.framesHeard &+= 1
        guard config.tracking != .off else { return }
        let now = clock.clamp(now)
        let heard = HeardFrame(messages)
        if let identity {
            let key = Self.identityKey(identity.index)
            if let slot = byAddress.find(key) {
                let heardKey = Self.addressKey(address, addressType)
                let latest = Self.addressKey(entries[slot].device.address, entries[slot].device.addressType)
                if heardKey != latest {
                    // `previousAddress` remembers the address before the latest, as for any
                    // entry, but is not in the index: a named entry is found by its IRK alone.
                    if entries[slot].previousAddress != heardKey {
                        // Its next resolvable private address: the same device, one more address.
                        // Proof: saturating, as below.
                        if entries[slot].device.addresses < .max { entries[slot].device.addresses &+= 1 }
                        counters.mergedAddresses &+= 1
                    }
                    // Back and forth between two (a rotation's overlap) counts them once.
                    entries[slot].previousAddress = latest
                    entries[slot].device.address = address & 0xFFFF_FFFF_FFFF
                    entries[slot].device.addressType = addressType
                }
                update(slot, heard, rssi: rssi, now: now, onChange)
            } else {
                insert(heard, key: key, identity: identity, rssi: rssi, address: address, addressType: addressType,
                       now: now, onChange)
            }
            return
        }
        let key = Self.addressKey(address, addressType)
        if let slot = byAddress.find(key) {
            if entries[slot].previousAddress == key {
                // Back to the address before the latest (two addresses at once, or the overlap
                // of a rotation): the same entry, no new address to count.
                entries[slot].previousAddress = Self.addressKey(entries[slot].device.address, entries[slot].device.addressType)
                entries[slot].device.address = address & 0xFFFF_FFFF_FFFF
                entries[slot].device.addressType = addressType
            }
            update(slot, heard, rssi: rssi, now: now, onChange)
        } else if heard.kinds.contains(.handoff), let slot = byFingerprint.find(heard.fingerprint),
                  entries[slot].identityKey == nil {
            // Never into a named entry: its addresses are the ones its IRK resolves, and a
            // copy of its frame from any other address is someone else (a replay).
            // The Handoff frame another address of this entry sent: a rotation, or a second radio.
            if let before = entries[slot].previousAddress { byAddress.remove(before) }
            entries[slot].previousAddress = Self.addressKey(entries[slot].device.address, entries[slot].device.addressType)
            entries[slot].device.address = address & 0xFFFF_FFFF_FFFF
            entries[slot].device.addressType = addressType
            byAddress.insert(key, slot: slot)
            // Proof: saturating; a rotation every 15 minutes needs 100,000 years to reach 2³².
            if entries[slot].device.addresses < .max { entries[slot].device.addresses &+= 1 }
            counters.mergedAddresses &+= 1
            update(slot, heard, rssi: rssi, now: now, onChange)
        } else if heard.kinds.contains(.handoff) || (config.tracking == .all && !heard.kinds.isEmpty) {
            insert(heard, key: key, identity: nil, rssi: rssi, address: address, addressType: addressType, now: now, onChange)
        }
    }

    /// What one advertisement's Continuity messages say, read in one pass without allocating.
    private struct HeardFrame {
        var kinds: AppleFrameKinds = []
        var handoffSequence: UInt16 = 0
        var fingerprint: UInt64 = 0

        init(_ messages: ContinuityIterator) {
            var it = messages
            while let m = it.next() {
                // The decoder decoded every message before handing them over; one that does not
                // decode here was not validated, and is skipped rather than trusted.
                switch try? m.decode() {
                case .handoff(let h)?:
                    // The first Handoff of the advertisement counts; Apple sends one.
                    guard !kinds.contains(.handoff) else { continue }
                    kinds.insert(.handoff)
                    handoffSequence = h.sequence
                    fingerprint = Self.fingerprint(h)
                case .nearbyInfo?: kinds.insert(.nearbyInfo)
                case .nearbyAction?: kinds.insert(.nearbyAction)
                case .iBeacon?, .other?, nil: continue
                }
            }
        }

        /// FNV-1a 64 (draft-eastlake-fnv) over the Handoff sequence (LE), auth tag and
        /// ciphertext, protocol.md §4.2. Equal for the same frame sent from any address; the
        /// clipboard byte is left out, it says nothing about which activity this is.
        static func fingerprint(_ h: Handoff) -> UInt64 {
            var f = FNV1a64()
            f.add(UInt8(truncatingIfNeeded: h.sequence))
            f.add(UInt8(truncatingIfNeeded: h.sequence >> 8))
            f.add(h.authTag)
            f.add(h.encrypted)
            return f.value
        }
    }

    private mutating func update(_ slot: Int32, _ heard: HeardFrame, rssi: Int8, now: Instant,
                                 _ onChange: (AppleChange) -> Void) {
        entries[slot].smoothed.add(rssi, after: now.nanoseconds &- entries[slot].device.lastSeen.nanoseconds)
        entries[slot].device.lastSeen = now
        entries[slot].device.rssi = entries[slot].smoothed.dBm
        entries[slot].device.interval = entries[slot].smoothed.interval
        entries.moveToTail(slot, list: Self.list)

        var kind: AppleChangeKind?
        let kinds = entries[slot].device.kinds.union(heard.kinds)
        if kinds != entries[slot].device.kinds {
            entries[slot].device.kinds = kinds
            kind = .kindsChanged
        }
        if heard.kinds.contains(.handoff) {
            if let before = entries[slot].device.handoffSequence {
                if before != heard.handoffSequence {
                    // One change per advertisement: the device's snapshot carries the kinds too.
                    kind = .handoffChanged
                    counters.handoffChanged &+= 1
                    entries[slot].device.handoffChanged = now
                }
            } else {
                // The first Handoff of a device known from Nearby frames: the kinds grew.
                entries[slot].device.handoffChanged = now
            }
            entries[slot].device.handoffSequence = heard.handoffSequence
            if entries[slot].identityKey == nil { claimFingerprint(slot, heard.fingerprint) }
        }
        guard let kind else { return }
        entries[slot].device.rssiAtChange = entries[slot].device.rssi
        entries[slot].device.addressesAtChange = entries[slot].device.addresses
        onChange(AppleChange(kind: kind, device: entries[slot].device))
    }

    private mutating func claimFingerprint(_ slot: Int32, _ fingerprint: UInt64) {
        if entries[slot].holdsFingerprint {
            guard entries[slot].fingerprint != fingerprint else { return }
            byFingerprint.remove(entries[slot].fingerprint)
        }
        entries[slot].fingerprint = fingerprint
        entries[slot].holdsFingerprint = byFingerprint.find(fingerprint) == nil
        if entries[slot].holdsFingerprint { byFingerprint.insert(fingerprint, slot: slot) }
    }

    private mutating func insert(_ heard: HeardFrame, key: UInt64, identity: AppleIdentity?, rssi: Int8, address: UInt64,
                                 addressType: UInt8, now: Instant, _ onChange: (AppleChange) -> Void) {
        if entries.isFull, let victim = entries.head(Self.list) {
            // docs/table.md "Apple devices", Changes: the least recently heard device makes room.
            let last = remove(victim)
            counters.evicted &+= 1
            onChange(AppleChange(kind: .evicted, device: last))
        }
        var smoothed = SmoothedRSSI()
        smoothed.add(rssi)
        let handoff = heard.kinds.contains(.handoff)
        let device = AppleDevice(id: identity?.id ?? pseudonym(key), address: address & 0xFFFF_FFFF_FFFF,
                                 addressType: addressType,
                                 kinds: heard.kinds, handoffSequence: handoff ? heard.handoffSequence : nil,
                                 handoffChanged: handoff ? now : nil, rssi: smoothed.dBm,
                                 rssiAtChange: smoothed.dBm, addressesAtChange: 1,
                                 firstSeen: now, lastSeen: now, addresses: 1, identity: identity?.index)
        let slot = entries.append(Entry(device: device, smoothed: smoothed, previousAddress: nil,
                                        fingerprint: 0, holdsFingerprint: false,
                                        identityKey: identity == nil ? nil : key), to: Self.list)
        byAddress.insert(key, slot: slot)
        if handoff && identity == nil { claimFingerprint(slot, heard.fingerprint) }
        counters.appeared &+= 1
        onChange(AppleChange(kind: .appeared, device: device))
    }

    private mutating func remove(_ slot: Int32) -> AppleDevice {
        let gone = entries.remove(slot)
        if let key = gone.identityKey {
            byAddress.remove(key)
        } else {
            byAddress.remove(Self.addressKey(gone.device.address, gone.device.addressType))
        }
        // A named entry's addresses were never in the index (only its identity key was).
        if gone.identityKey == nil, let before = gone.previousAddress { byAddress.remove(before) }
        if gone.holdsFingerprint { byFingerprint.remove(gone.fingerprint) }
        return gone.device
    }

    /// The pseudonym of a new entry: a keyed mix of its first address, 32 bits, never 0, and
    /// not the id of a live entry (the next free value then). It hides the address from a
    /// reader of the broker who does not know `idKey`; it is not a cryptographic MAC, and does
    /// not resist someone who also hears the radio (docs/table.md "Apple devices").
    private func pseudonym(_ key: UInt64) -> UInt32 {
        let h = mix64(mix64(key ^ config.idKey) ^ (config.idKey << 32 | config.idKey >> 32))
        var id = UInt32(truncatingIfNeeded: h ^ (h >> 32))
        // Proof: wrapping is harmless (0 is skipped), and at most `capacity` values are taken,
        // so the search ends.
        while id == 0 || isTaken(id) { id &+= 1 }
        return id
    }

    /// A scan, run only when a device appears: cheaper than a third index for a 1-in-2³²
    /// event.
    private func isTaken(_ id: UInt32) -> Bool {
        var taken = false
        entries.forEach(list: Self.list) { if $0.device.id == id { taken = true } }
        return taken
    }

    /// The index key of an address: 48 bits of address, the address type above them
    /// (a public and a random address with the same bits are different devices).
    private static func addressKey(_ address: UInt64, _ type: UInt8) -> UInt64 {
        address & 0xFFFF_FFFF_FFFF | UInt64(type) << 48
    }

    /// The index key of a named device: above every address key (48 bits and a type byte).
    private static func identityKey(_ index: Int) -> UInt64 { 1 << 60 | UInt64(index) }

    /// Removes devices silent for `expiry`, calling `onChange` with `.expired` for each.
    public mutating func expire(now: Instant, _ onChange: (AppleChange) -> Void) {
        while let slot = entries.head(Self.list), entries[slot].device.lastSeen + config.expiry <= now {
            let last = remove(slot)
            counters.expired &+= 1
            onChange(AppleChange(kind: .expired, device: last))
        }
    }

    /// The earliest instant at which `expire` has something to do; nil when empty.
    public var nextExpiry: Instant? {
        guard let slot = entries.head(Self.list) else { return nil }
        return entries[slot].device.lastSeen + config.expiry
    }

    /// The named device (`identity` set) with this id, if the table holds it. A scan: it runs
    /// when a room's ownership changes, not per advertisement.
    public func namedDevice(id: UInt32) -> AppleDevice? {
        var found: AppleDevice?
        entries.forEach(list: Self.list) { if $0.device.identity != nil && $0.device.id == id { found = $0.device } }
        return found
    }

    /// Every device, least recently heard first.
    public func forEach(_ body: (AppleDevice) -> Void) {
        entries.forEach(list: Self.list) { body($0.device) }
    }
}
