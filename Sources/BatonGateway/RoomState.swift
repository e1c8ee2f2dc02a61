// This room's state, the one value the gateway's handlers of advertisements and of the
// building's messages work on (docs/architecture.md §2 "The room"): what the room hears (the
// activity and Apple tables), what it has published (the retained state's keeper, `Publisher`),
// who owns each device (the rooms rule and its evidence, `GatewayRooms`), and the keys that say
// which beacons are its group's. Every method takes the broker connection it publishes on as
// its one other argument; what the other parts must hear comes back as a value for
// `Gateway.turn` to route.
import BatonLibc
import BatonCore
import BatonHCI
import BatonKeys
import BatonMQTT
import BatonRelay
import BatonWire

struct RoomState: ~Copyable {
    var table: ActivityTable
    var apple: AppleDeviceTable
    var publisher: Publisher
    var rooms: GatewayRooms
    let keys: Keys
    let log: Logger
    /// `room`, `gateway.id`, `rooms.gateways`, `rooms.sighting-batches` and
    /// `rooms.sighting-interval`: what the handlers read of the config.
    let name: String
    let gatewayID: String
    let gatewayLimit: Int
    let sightingBatches: Bool
    let sightingInterval: Duration

    /// The room's view of `GatewayKeys`, read on the hot path without copying arrays.
    struct Keys {
        let verifier: BeaconVerifier?
        let addresses: AddressResolver?
        let appleIDs: [UInt32]
    }

    init(config: GatewayConfig, keys: GatewayKeys, publisher: consuming Publisher, log: Logger, unixMicroseconds: Int64,
         now: Instant) {
        self.table = ActivityTable(config: config.table)
        self.apple = AppleDeviceTable(config: config.apple)
        self.publisher = publisher
        self.rooms = GatewayRooms(config: config, unixMicroseconds: unixMicroseconds, now: now)
        self.keys = Keys(verifier: keys.verifier, addresses: keys.addresses, appleIDs: keys.appleIDs)
        self.log = log
        self.name = config.room
        self.gatewayID = config.gatewayID
        self.gatewayLimit = config.rooms.gateways
        self.sightingBatches = config.sightingBatches
        self.sightingInterval = config.rooms.sightingInterval
    }

    /// The room's one method for a heard advertisement (the hot path's end, docs/architecture.md
    /// §3a): a beacon into the activity table, a Continuity frame or a named Apple device's
    /// advertisement into the Apple table, and what that changed to the publisher, owned or
    /// not. Allocates nothing unless something changed.
    @inline(__always)
    mutating func heard(_ heard: HeardAdvertisement, now: Instant, mqtt: inout MQTTClient) {
        let r = heard.report
        if var beacon = heard.content.beacon {
            // A relayed copy is for phones, not rooms (docs/table.md): before verification,
            // so it is counted as what it is.
            guard !beacon.flags.contains(.relayed) else { return table.ignoreRelayed() }
            if let verifier = keys.verifier {
                // docs/security.md §4.4: the tag, the id, an identity's sequence. A device
                // with an identity goes into the table under its identity's id. The verifier
                // counts what it drops.
                let value = heard.content.beaconValue ?? UnsafeRawBufferPointer(start: nil, count: 0)
                if case .dropped = verifier.check(&beacon, beaconValue: value) { return }
            }
            // A full table keeps what this room owns (docs/table.md "A full table").
            table.hear(beacon, rssi: r.rssi, address: r.address, addressType: r.addressType, now: now,
                       owned: { rooms.ownership.owns($0) }) { change in
                // Held back after the broker gave this gateway up (docs/rooms.md §7 rule 4).
                let id = change.activity.deviceID
                publisher.activityChanged(&mqtt, change, owned: rooms.ownership.owns(id) && !rooms.ownership.holdsBack(id, now: now))
            }
        } else {
            // A device the user named by its IRK is followed from any advertisement it
            // sends (docs/security.md §10); any other only from Continuity frames.
            let index = keys.addresses?.resolve(address: r.address, addressType: r.addressType)
            guard heard.content.apple != nil || index != nil else { return }
            apple.hear(heard.content.continuityMessages, rssi: r.rssi, address: r.address, addressType: r.addressType,
                       identity: index.map { AppleIdentity(index: $0, id: keys.appleIDs[$0]) }, now: now) { change in
                publisher.appleChanged(&mqtt, change, owned: Self.owns(change.device, rooms.ownership))
            }
        }
    }

    /// The broker connected (again): the rooms are rejoined, and what this room holds is
    /// published (docs/rooms.md §7, docs/mqtt.md §4).
    mutating func connected(now: Instant, mqtt: inout MQTTClient) {
        // What this gateway knew of the building's sightings is from before the outage.
        rooms.ownership.rejoin(now: now)
        // The session is clean: no neighbour is subscribed any more (docs/rooms.md §8.3).
        rooms.neighbourhood?.reset()
        // The broker may have restarted empty: who published what is read again from its
        // retained scan (and a device's discovery configs are owed by its owner until an
        // activity of it is seen retained, docs/mqtt.md §4).
        rooms.publishers.removeAll()
        rooms.standInsDue = now + sightingInterval
        publisher.connected(&mqtt, table: table, apple: apple, ownership: rooms.ownership, now: now)
    }

    /// The first sightings of a connection: all of them, at once (docs/rooms.md §7).
    mutating func sendAllSightings(now: Instant, mqtt: inout MQTTClient) {
        rooms.sightings.reset()
        sendSightings(now: now, mqtt: &mqtt)
    }

    /// A table's expiry (`GatewayTimer.tableExpiry`, `.appleExpiry`): what left is published as
    /// gone by the room that owns it.
    mutating func expire(now: Instant, mqtt: inout MQTTClient) {
        table.expire(now: now) {
            let id = $0.activity.deviceID
            publisher.activityChanged(&mqtt, $0, owned: rooms.ownership.owns(id) && !rooms.ownership.holdsBack(id, now: now))
        }
    }

    mutating func expireApple(now: Instant, mqtt: inout MQTTClient) {
        apple.expire(now: now) { publisher.appleChanged(&mqtt, $0, owned: Self.owns($0.device, rooms.ownership)) }
    }

    mutating func clearOrphans(now: Instant, mqtt: inout MQTTClient) {
        publisher.clearOrphans(&mqtt, table: table, apple: apple, ownership: rooms.ownership, publishers: rooms.publishers,
                               now: now)
    }

    /// A retained activity message (docs/mqtt.md §2): who speaks for the device, what the
    /// retained state's keeper reads of it, and, after the broker gave this gateway up,
    /// whether it may publish again what it owned (docs/rooms.md §7 rule 4).
    mutating func activityReceived(_ message: MQTTMessage, device: UInt64, now: Instant, mqtt: inout MQTTClient) {
        // Who speaks for the device, for the relay's answerer (docs/relay.md §4): an empty
        // message clears it.
        let by = message.payload.isEmpty ? nil
            : message.payload.withUnsafeBytes { RetainedEntry.gateway($0) }.flatMap { rooms.ownership.slot(of: Substring($0)) }
        rooms.publishers.published(device, by: by)
        if let by, rooms.ownership.announced(device, by: by, now: now, { rooms.changes.append($0) }) {
            handleOwnershipChanges(now: now, mqtt: &mqtt)
        }
    }

    /// After the relays read the same message: the keeper of the retained state reads it.
    mutating func retainedReceived(_ message: MQTTMessage, on topic: OwnedTopic, now: Instant,
                                   mqtt: inout MQTTClient) {
        publisher.received(&mqtt, message, on: topic, table: table, apple: apple, ownership: rooms.ownership, now: now)
        if case .activity(let device) = topic {
            publisher.observed(message, device: device, now: now)
            publisher.observedActivity(message, device: device, table: table, ownership: rooms.ownership)
        }
    }
}

extension RoomState {
    // What the relays ask the room before they take a fetch or a stream (docs/relay.md §4).

    /// The one admission check of fetches and streams (docs/relay.md §4 "Admission"), from
    /// what this gateway knows of the device: the rooms rule and the activity table.
    func admit(_ kind: RequestKind, device: UInt64?, bodyError: WireError? = nil) -> Result<FetchTarget, Refusal> {
        var activity: AdmittedActivity?
        if let device, let a = table.activity(deviceID: device), a.state == .current {
            activity = AdmittedActivity(address: a.address, addressType: a.addressType, psm: a.beacon.psm,
                                        sequence: a.beacon.sequence, supportsStreams: a.beacon.flags.contains(.supportsStreams))
        }
        return Admission.check(kind, device: device, bodyError: bodyError,
                               owns: device.map { rooms.ownership.owns($0) } ?? false,
                               follows: device.map { rooms.ownership.follows($0) } ?? false, activity: activity)
    }

    /// The one gateway that answers a request about `device` (docs/relay.md §4): its owner
    /// while online, else the online gateway whose id sorts first. With neighbourhoods the
    /// rule here follows only the devices around this room (docs/rooms.md §8.3): a device it
    /// has no online owner for may have one at the far end of the building, the gateway its
    /// activity topic names, and then that one answers, not the first.
    func answers(for device: UInt64?) -> Bool {
        var answerer = rooms.ownership.firstOnline
        if let device {
            if let owner = rooms.ownership.owner(of: device), rooms.ownership.isOnline(owner) {
                answerer = owner
            } else if let publisher = rooms.publishers.publisher(of: device), rooms.ownership.isOnline(publisher) {
                answerer = publisher
            }
        }
        return answerer == rooms.ownership.selfSlot
    }
}

/// What `RoomState.statusReceived` tells the relays of a gateway gone offline.
struct GatewayWentOffline {
    let id: Substring
    /// Whether this gateway, now the first online, tells its streams' endpoints (docs/relay.md §7.3).
    let tellStreams: Bool
}
