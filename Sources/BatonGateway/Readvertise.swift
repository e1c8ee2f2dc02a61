// Re-advertising (docs/relay.md §9): the keyed group's activities that are current in other
// rooms go on the air again here, flagged relayed, so a phone in this room sees them and
// continues one through this gateway as if the originating device were beside it.
//
//   <prefix>/activities/+ (another gateway's) --> Readvertiser --beacon--> mgmt Add Advertising
//   phone --L2CAP on the slot's PSM--> ContinuingLinks --fetch / stream over MQTT--> the owner
//
// What goes on the air is rebuilt from the owner's retained JSON (docs/mqtt.md §2): the beacon
// of protocol.md §2 with the owner's sequence, type and flags, the activity's topic id as its
// device id, this gateway's listener as its PSM, and a tag under the group's beacon key.
// The advertising instances themselves are BatonHCI's (`ManagementAdvertiser`, Advertising.swift);
// what goes in them, and the listeners beside them, are the gateway's.
public import BatonHCI
import BatonLibc
import BatonKeys
public import BatonMQTT
public import BatonRelay
public import BatonWire

/// An activity another room owns, as this gateway re-advertises it.
public struct RelayedActivity: Equatable, Sendable {
    /// The activity's topic id (the identity id `group ‖ n` for a device with an identity).
    public var device: UInt64
    public var sequence: UInt16
    public var typeHash: UInt32
    /// The beacon's own flags (streams, web URL); `relayed` is added on the air.
    public var flags: BeaconFlags
    /// The gateway that owns it (docs/rooms.md): whom a phone's fetch is really for.
    public var owner: String
    /// The broker connection it was last seen on (see `Readvertiser.reconnected`).
    public var generation: UInt64
}

/// Which activities this gateway re-advertises, one per slot. Slot k goes out as advertising
/// instance k of `ReadvertiseRadio` and is continued on its listener's PSM `psms[k]`.
public struct Readvertiser {
    public let groupHash: UInt32
    public let selfID: String
    public let psms: [UInt16]
    public private(set) var slots: [RelayedActivity?]
    /// Bumped on every broker connect: the retained activities come again, and a slot not
    /// seen again by the end of the retained scan was cleared while this gateway was away.
    var generation: UInt64 = 0
    /// When each slot was last freed, on a counter (0: never taken): a new activity takes the
    /// free slot freed longest ago (see `activity`).
    var freedAt: [UInt64]
    var frees: UInt64 = 0
    /// Activities not re-advertised, by reason (stats `relay.readvertise.drops`).
    public private(set) var drops = DropCounts()

    public enum Change: Equatable, Sendable {
        /// Put slot k on the air (again: its beacon changed).
        case advertise(Int)
        /// Take slot k off the air.
        case withdraw(Int)
    }

    public init(groupHash: UInt32, selfID: String, psms: [UInt16]) {
        self.groupHash = groupHash
        self.selfID = selfID
        self.psms = psms
        slots = Array(repeating: nil, count: psms.count)
        freedAt = Array(repeating: 0, count: psms.count)
    }

    /// Frees slot k (it leaves the air).
    mutating func free(_ k: Int) {
        slots[k] = nil
        frees &+= 1  // Proof: 2⁶⁴ activities never leave the air.
        freedAt[k] = frees
    }

    public var count: Int { slots.count { $0 != nil } }

    /// A message on `<prefix>/activities/<device>`, retained or live (empty: cleared).
    /// `isOnline`: whether a gateway's status is `online` (docs/rooms.md): an activity whose
    /// owner is not is nobody's to continue, and a message naming a gateway nobody has heard of
    /// is not a gateway's.
    public mutating func activity(device: UInt64, payload: [UInt8], isOnline: (String) -> Bool = { _ in true }) -> Change? {
        let held = slots.firstIndex { $0?.device == device }
        guard let relayed = eligible(device: device, payload: payload), isOnline(relayed.owner) else {
            guard let held else { return nil }
            free(held)
            return .withdraw(held)
        }
        if let held {
            let changed = slots[held].map { $0.sequence != relayed.sequence || $0.flags != relayed.flags || $0.typeHash != relayed.typeHash } ?? true
            slots[held] = relayed
            return changed ? .advertise(held) : nil
        }
        // The free slot freed longest ago: a slot just freed is taken last, so a phone that
        // scanned its old beacon does not reach another activity on it.
        var taken: Int?
        for k in slots.indices where slots[k] == nil && freedAt[k] < (taken.map { freedAt[$0] } ?? .max) { taken = k }
        guard let free = taken else {
            // Counted; the activity is tried again at its next change (its owner republishes).
            drops.count("readvertise-full")
            return nil
        }
        slots[free] = relayed
        return .advertise(free)
    }

    /// The slot did not go on the air (the kernel refused it): free, so the activity's next
    /// message tries again.
    public mutating func forget(_ k: Int) { free(k) }

    /// A gateway's status turned offline: its activities are nobody's to continue now (its
    /// retained messages stay until a gateway clears them, docs/rooms.md §4), so they leave the air.
    public mutating func ownerOffline(_ gateway: Substring, _ change: (Change) -> Void) {
        for k in slots.indices where slots[k].map({ $0.owner == gateway }) ?? false {
            free(k)
            change(.withdraw(k))
        }
    }

    /// The activity to re-advertise from an owner's JSON, or nil: not the keyed group's, not
    /// verified, owned here (the device is in this room), offering no link, a relayed copy, or
    /// not an activity message at all.
    func eligible(device: UInt64, payload: [UInt8]) -> RelayedActivity? {
        guard !payload.isEmpty,
              let o = payload.withUnsafeBytes({ RetainedEntry.fields($0) }),
              o["state"]?.string == "current",
              o["verified"]?.bool == true,
              o["relayed"]?.bool != true,
              let owner = o["gateway"]?.string, owner != selfID,
              let group = o["group"]?.string.flatMap({ UInt32($0, radix: 16) }), group == groupHash,
              let seq = o["seq"]?.integer, let sequence = UInt16(exactly: seq),
              let typeHash = o["type_hash"]?.string.flatMap({ UInt32($0, radix: 16) }),
              let psm = o["psm"]?.integer, psm != 0
        else { return nil }
        var flags: BeaconFlags = []
        if o["supports_streams"]?.bool == true { flags.insert(.supportsStreams) }
        if o["has_web_url"]?.bool == true { flags.insert(.hasWebURL) }
        return RelayedActivity(device: device, sequence: sequence, typeHash: typeHash, flags: flags, owner: owner,
                               generation: generation)
    }

    /// A broker (re)connect: every slot must be seen again in the retained scan.
    public mutating func reconnected() { generation &+= 1 }  // Proof: 2⁶⁴ connects never happen.

    /// The retained scan ended: slots not seen again were cleared while this gateway was away.
    public mutating func retainedScanEnded(_ change: (Change) -> Void) {
        for k in slots.indices {
            guard let s = slots[k], s.generation != generation else { continue }
            free(k)
            change(.withdraw(k))
        }
    }

    /// The slot continued on `psm`, if one is on the air.
    public func slot(psm: UInt16) -> Int? {
        guard let k = psms.firstIndex(of: psm), slots[k] != nil else { return nil }
        return k
    }

    /// Slot k's advertisement (protocol.md §2.1): 31 bytes, flagged relayed, tagged.
    public func advertisement(_ k: Int, companyID: UInt16, tagger: some BeaconAuthenticator) -> [UInt8] {
        guard let s = slots[k] else { return [] }
        let beacon = ActivityBeacon(flags: s.flags.union(.relayed), sequence: s.sequence, activityTypeHash: s.typeHash,
                                    groupHash: groupHash, deviceID: s.device, psm: psms[k])
        var bytes = [UInt8](repeating: 0, count: ActivityBeacon.advertisementLength)
        bytes.withUnsafeMutableBytes { raw in
            var w = ByteWriter(raw)
            do throws(WireError) { try beacon.encodeAdvertisement(companyID: companyID, authenticator: tagger, into: &w) } catch {
                preconditionFailure("a beacon advertisement is 31 bytes")
            }
        }
        return bytes
    }
}

/// What re-advertising needs of a controller (docs/relay.md §9): an advertisement per slot
/// (BatonHCI's `Advertiser`: put on the air, taken off, word when someone else removes one),
/// and a listener per slot for the phones. `ReadvertiseRadio` is BlueZ's; tests give the
/// gateway their own.
public protocol AdvertisingController: Advertiser {
    /// Slot k's PSM: what its beacon names and its listener accepts on.
    var psms: [UInt16] { get }
    /// Slot k's listener: readable when a phone is waiting. Read every loop turn: a stored
    /// array, not one made on each read (the loop allocates nothing, docs/performance.md).
    var listenerFDs: [Int32] { get }
    /// Whether accepted links are L2CAP channels (their MTU is the kernel's to say).
    var acceptsL2CAP: Bool { get }
    /// A phone waiting on slot k's listener: its descriptor and address; nil when none is.
    func accept(_ k: Int) throws(LinkError) -> (fd: Int32, peer: LinkAddress)?
}

/// The controller side of re-advertising on the gateway's own adapter (docs/relay.md §9):
/// BatonHCI's `ManagementAdvertiser` for the mgmt advertising instances, and one L2CAP
/// listener per slot. A class, so the gateway holds the non-copyable listeners in one optional.
public final class ReadvertiseRadio: AdvertisingController {
    let advertiser: ManagementAdvertiser
    final class Listener {
        let listener: L2CAPListener
        init(_ l: consuming L2CAPListener) { listener = l }
    }
    let listeners: [Listener]

    /// Takes `count` advertising instances and opens `count` listeners on kernel-chosen PSMs.
    /// Waits for the kernel's answers (bounded): it runs before the loop does.
    public convenience init(adapter: String, count: Int, receiveMTU: Int) throws(ReadvertiseError) {
        let mgmt: ManagementSocket
        do throws(ManagementError) { mgmt = try ManagementSocket(adapter: adapter) } catch {
            throw ReadvertiseError("\(adapter): \(error)")
        }
        var listeners: [Listener] = []
        for _ in 0..<count {
            do throws(LinkError) {
                // PSM 0: the kernel picks a free one from the LE dynamic range (Core 5.4,
                // Vol 3, Part A, §4.22), which the beacon then names.
                listeners.append(Listener(try L2CAPListener(adapter: adapter, psm: 0, receiveMTU: receiveMTU)))
            } catch {
                throw ReadvertiseError("listening for phones on \(adapter): \(error)")
            }
        }
        try self.init(mgmt: mgmt, count: count, listeners: listeners, psms: listeners.map { $0.listener.psm },
                      listenerFDs: listeners.map { $0.listener.fd })
    }

    /// Over any mgmt socket (a test's socketpair playing the kernel), with listeners given:
    /// a test passes none, and descriptors of -1, which poll() ignores.
    init(mgmt: consuming ManagementSocket, count: Int, listeners: [Listener], psms: [UInt16], listenerFDs: [Int32]) throws(ReadvertiseError) {
        let adapter = mgmt.adapter
        do throws(AdvertiserError) { advertiser = try ManagementAdvertiser(mgmt: mgmt, count: count) } catch {
            switch error {
            case .features(let e):
                throw ReadvertiseError("\(adapter): \(e)")
            case .tooFewInstances(let available, let asked):
                throw ReadvertiseError("\(adapter) has \(available) advertising instances and relay.readvertise asks for \(asked): lower it (`btmgmt -i \(adapter) advinfo` lists them)")
            case .takingBack(let n, let e):
                throw ReadvertiseError("\(adapter): taking back advertising instance \(n): \(e)")
            }
        }
        self.listeners = listeners
        self.psms = psms
        self.listenerFDs = listenerFDs
    }

    /// Instances in use at start that the gateway removed: a killed run's, or another program's
    /// (the launcher logs them).
    public var takenBack: [UInt8] { advertiser.takenBack }

    public let psms: [UInt16]
    public let listenerFDs: [Int32]
    public var acceptsL2CAP: Bool { true }

    public func accept(_ k: Int) throws(LinkError) -> (fd: Int32, peer: LinkAddress)? { try listeners[k].listener.accept() }

    // Advertising: the mgmt instances' (BatonHCI).
    public var adapter: String { advertiser.adapter }
    public var eventFD: Int32 { advertiser.eventFD }
    public func advertise(_ k: Int, _ data: [UInt8]) throws(ManagementError) { try advertiser.advertise(k, data) }
    public func withdraw(_ k: Int) throws(ManagementError) { try advertiser.withdraw(k) }
    public func withdrawAll() { advertiser.withdrawAll() }
    public func removedSlots(_ body: (Int) -> Void) { advertiser.removedSlots(body) }
    public var removalsPending: Bool { advertiser.removalsPending }
    public var answerDeadline: Instant? { advertiser.answerDeadline }
    public func answers(now: Instant, _ failed: (_ slot: Int, _ advertise: Bool, _ error: ManagementError) -> Void) {
        advertiser.answers(now: now, failed)
    }
}

public struct ReadvertiseError: Error, CustomStringConvertible {
    public let description: String
    init(_ text: String) { description = text }
}

/// An owner's answer to a fetch this gateway asked for a phone (docs/relay.md §3): from the v5
/// properties, or from the v3.1.1 envelope when the broker connection is v3.1.1.
public struct AnswerForPhone {
    public var status = "bad-answer"
    public var correlation: [UInt8] = []
    public var sequence: UInt16?
    /// The payload's bytes for `ok`.
    public var payload: [UInt8] = []

    public init(_ message: MQTTMessage) {
        let p = message.properties
        if let status = p.userProperties.first(where: { $0.name == "status" })?.value {
            self.status = status
            correlation = p.correlationData ?? []
            sequence = p.userProperties.first { $0.name == "seq" }.flatMap { UInt16($0.value) }
            if status == "ok" { payload = message.payload }
            return
        }
        guard let o = message.payload.withUnsafeBytes({ RetainedEntry.fields($0) }),
              let status = o["status"]?.string, let hex = o["correlation"]?.string else { return }
        self.status = status
        var i = hex.startIndex
        while let j = hex.index(i, offsetBy: 2, limitedBy: hex.endIndex), j > i, let b = UInt8(hex[i..<j], radix: 16) {
            correlation.append(b)
            i = j
        }
        sequence = o["seq"]?.integer.flatMap { UInt16(exactly: $0) }
        if status == "ok" { payload = o["cbor"]?.string.flatMap { Base64.decode($0) } ?? [] }
    }
}
