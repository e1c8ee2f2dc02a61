// The service (DESIGN.md "Data flow"): one thread, one poll() loop over the radio, the
// broker socket, the stop pipe and a timer computed from the nearest deadline.
//
//   radio --HCI events--> AdvertisementDecoder --beacons--> ActivityTable --changes--> Publisher
//                                              --Continuity--> AppleDeviceTable --changes--/
//
// The loop scans continuously (no scan-then-sleep duty cycle) and watches its own radio:
// no advertising report for `radio.silence` while scanning means the controller went
// quiet, and it is re-initialised, counted and reported on the stats topic (docs/mqtt.md §1).
import BatonLibc
import BatonCore
public import BatonHCI
public import BatonMQTT
import BatonRelay
import BatonKeys
import BatonWire
import CLibc

public enum BatonVersion {
    public static let current = "0.4.0"
}

public struct GatewayCounters: Sendable, Equatable {
    /// Controller re-initialisations after `radio.silence` without a report.
    public var radioRestarts = 0
    /// Errors the radio source threw (each followed by a retry).
    public var radioErrors = 0
    public var lastRadioError: String?
    public var loopTurns = 0
    public init() {}
}

/// Why the loop ended.
public enum GatewayExit: Sendable, Equatable {
    /// SIGTERM/SIGINT: said offline and disconnected.
    case stopped
    /// A radio error no retry can fix (no Bluetooth in the kernel, a bad setting, a missing
    /// capability): the text says what to do.
    case radioFailed(String)
}

public struct Gateway<Radio: RadioSource & ~Copyable>: ~Copyable {
    public let config: GatewayConfig
    var radio: Radio
    /// Opens the source again: a controller unplugged and plugged back, a simulator
    /// restarted. Used when the source says it is gone (closed, adapter down or not found).
    let reopen: (() throws(RadioError) -> Radio)?
    var needsReopen = false
    var decoder: AdvertisementDecoder
    /// Checks every beacon of the keyed group (docs/security.md §4.4); nil without a key.
    let verifier: BeaconVerifier?
    /// Resolves the addresses of the user's own devices (`apple.irks`, docs/security.md §10).
    let addresses: AddressResolver?
    let appleIDs: [UInt32]
    var table: ActivityTable
    var apple: AppleDeviceTable
    var publisher: Publisher
    /// Which gateway of the building owns each device (docs/rooms.md), and when this one
    /// sends its own sightings.
    var ownership: RoomOwnership
    var sightings: SightingSchedule
    /// This run's start (unix ms) and sighting counter: the `since` and `n` of its sightings.
    let since: Int64
    var sightingCounter: UInt64 = 0
    /// When the table is next walked for due sightings. A fixed cadence, not the schedule's
    /// exact deadline: that deadline moves with every report's RSSI, and finding it walks the
    /// whole table, which every loop turn would pay (docs/rooms.md §2).
    var nextSightingCheck: Instant
    let sightingCheckInterval: Duration
    /// Ownership changes of one call, handled after it (the handler reads the rule's state).
    /// Reserved for every device at once: a gateway going offline hands over all of them.
    var ownershipChanges: [OwnershipChange]
    /// Sightings dropped, by reason (stats `drops`).
    var sightingDrops = DropCounts()
    var sightingsReceived = 0
    var linkFailuresLogged = 0
    /// Payload fetches this gateway answers, and streams it carries (docs/relay.md).
    var relay: FetchRelay
    var streams: StreamRelay
    /// Other rooms' activities on this room's air, and the phones' links to them (docs/relay.md
    /// §9); nil without `relay.readvertise`.
    var readvertiser: Readvertiser?
    let readvertiseRadio: (any AdvertisingController)?
    let tagger: BeaconTagger?
    var continuing: ContinuingLinks
    /// The kernel refused an advertisement, or accepting a phone's link failed (stats
    /// `relay.readvertise.errors`).
    var readvertiseErrors = 0
    /// The radio, the broker and the stop pipe, then the relay's links: reserved once.
    var pollFDs: [pollfd]
    var notifier: SystemdNotifier
    var log: Logger
    public private(set) var counters = GatewayCounters()
    let startedAt: Instant
    let clock: WallClock
    /// The last advertising report (stats `silent_s`).
    var lastReportAt: Instant
    /// The last report or when scanning (re)started, whichever is later: the watchdog's reference.
    var watchdogFrom: Instant
    var radioRetryAt: Instant?
    var nextStats: Instant
    var mqttEvents: [MQTTEvent]
    /// When the rejoin window of the last connect closes: the devices this gateway stands in
    /// for, left out of the connect's republish, go out then if it still owns them.
    var standInsDue: Instant?
    /// The last broker failure logged as a warning, when, and how many like it since (debug).
    var lastBrokerFailure: String?
    var brokerFailureSaid: Instant?
    var brokerFailuresUnsaid = 0
    var announcedFinish = false
    let statsScratch: UnsafeMutableRawBufferPointer
    /// How long after a radio error the source is started again.
    public static var radioRetry: Duration { .seconds(5) }

    /// `keys` are `GatewayKeys.make(config)`: required when the config has keys
    /// (`GatewayLauncher` makes them, where a libcrypto failure can be reported).
    public init(config: GatewayConfig, radio: consuming Radio, reopen: (() throws(RadioError) -> Radio)? = nil,
                mqtt: consuming MQTTClient, keys: GatewayKeys = .none, readvertising: (any AdvertisingController)? = nil,
                log: Logger, environment: [String: String], now: Instant, unixMicroseconds: Int64) {
        precondition(keys.matches(config), "the gateway's keys are GatewayKeys.make(config)")
        self.config = config
        self.verifier = keys.verifier
        self.addresses = keys.addresses
        self.appleIDs = keys.appleIDs
        self.radio = radio
        self.reopen = reopen
        self.decoder = AdvertisementDecoder(beaconCompanyID: config.companyID, reassembly: config.radioReassembly)
        self.table = ActivityTable(config: config.table)
        self.apple = AppleDeviceTable(config: config.apple)
        self.clock = WallClock(unixMicrosecondsAtStart: unixMicroseconds, instantAtStart: now)
        let topics = Topics(prefix: config.prefix, discoveryPrefix: config.discoveryPrefix, gatewayID: config.gatewayID)
        self.publisher = Publisher(
            mqtt: mqtt,
            topics: topics,
            origin: .init(room: config.room, gatewayID: config.gatewayID), clock: clock, version: BatonVersion.current,
            discovery: config.discovery, appleAddresses: config.appleAddresses, orphanGrace: config.table.expiry,
            ownedCapacity: config.table.capacity + config.apple.capacity, log: log)
        self.publisher.keyedGroup = keys.verifier?.groupHash
        self.publisher.appleNames = config.appleIRKs.map({ $0.name })
        var rooms = config.rooms
        rooms.forgetAfter = config.table.expiry
        self.since = unixMicroseconds / 1000
        self.ownership = RoomOwnership(config: rooms, selfID: config.gatewayID, selfSince: unixMicroseconds / 1000)
        // The named Apple devices are sighted too, so one room owns each (docs/security.md §10).
        self.sightings = SightingSchedule(config: rooms, capacity: config.table.capacity + config.appleIRKs.count)
        self.ownershipChanges = []
        self.ownershipChanges.reserveCapacity(rooms.capacity)
        self.sightingCheckInterval = min(rooms.sightingMinInterval, .milliseconds(250))
        self.nextSightingCheck = now
        let link = Self.deviceLink(config)
        self.relay = FetchRelay(config: config.relay, link: link, gatewayID: config.gatewayID, room: config.room,
                                topics: topics)
        self.streams = StreamRelay(config: config.relay, link: link, gatewayID: config.gatewayID)
        // Titles are fetched over the same links, so only with one (docs/relay.md §4.1).
        self.publisher.names = ActivityNames(types: config.activityTypes, fetchTitles: config.fetchTitles && link != nil,
                                             capacity: config.table.capacity, fetches: config.relay.fetches)
        self.readvertiseRadio = readvertising
        self.tagger = keys.tagger
        if let readvertising, let group = keys.verifier?.groupHash, keys.tagger != nil {
            self.readvertiser = Readvertiser(groupHash: group, selfID: config.gatewayID, psms: readvertising.psms)
        } else {
            self.readvertiser = nil
        }
        self.continuing = ContinuingLinks(config: config.relay, topics: topics, room: config.room)
        self.pollFDs = []
        // Radio, broker, stop pipe; fetch and continuing links; streams; re-advertising's
        // listeners and its management socket: reserved once, so the loop never grows it.
        self.pollFDs.reserveCapacity(3 + 2 * config.relay.links + config.relay.streams
                                     + (config.readvertise > 0 ? config.readvertise + 1 : 0))
        self.notifier = SystemdNotifier(environment: environment)
        self.log = log
        self.startedAt = now
        self.lastReportAt = now
        self.watchdogFrom = now
        self.nextStats = now + config.statusInterval
        self.mqttEvents = []
        self.mqttEvents.reserveCapacity(64)
        self.statsScratch = .allocate(byteCount: 8192, alignment: 8)
    }

    deinit { statsScratch.deallocate() }

    /// How this gateway reaches devices (`relay.link`, docs/relay.md §5).
    static func deviceLink(_ config: GatewayConfig) -> AnyDeviceLink? {
        switch config.resolvedRelayLink {
        case .auto, .none: nil
        // The receive MTU holds the largest payload message (docs/protocol.md §5.1).
        case .bluez(let adapter): AnyDeviceLink(L2CAPLink(adapter: adapter, receiveMTU: config.relay.payloadMax + 3))
        case .simulator(let path): AnyDeviceLink(SimulatedLink(path: path))
        }
    }

    public var activityCount: Int { table.count }
    public var tally: AdvertisementTally { decoder.tally }

    // MARK: the loop

    /// Runs until SIGTERM/SIGINT or an unrecoverable radio error.
    public mutating func run() -> GatewayExit {
        let stop = StopSignals()
        let now = Instant.now
        publisher.mqtt.start(now: now)
        startRadio(now: now)
        notifier.send("READY=1\nSTATUS=scanning on \(config.radio), broker \(config.broker.host):\(config.broker.port)")
        while true {
            if let failure = fatalRadioError {
                shutdown()
                return .radioFailed(failure)
            }
            if turn(stopFD: stop.fd) { if stop.drain() { break } }
        }
        notifier.send("STOPPING=1")
        log.info("stopping: saying offline and disconnecting")
        shutdown()
        return .stopped
    }

    var fatalRadioError: String?

    /// One turn: wait for the nearest deadline or a ready descriptor, then do what is due.
    /// Returns true when `stopFD` became readable.
    public mutating func turn(stopFD: Int32 = -1) -> Bool {
        var now = Instant.now
        let timeout = pollTimeout(now: now)
        // A source that failed is not polled until its retry: a closed or vanished descriptor
        // reports POLLHUP/POLLERR at once, every turn, and would spin the loop.
        let radioFD = radioRetryAt == nil && radio.state != .stopped && radio.state != .finished ? radio.fd : -1
        pollFDs.removeAll(keepingCapacity: true)
        pollFDs.append(pollfd(fd: radioFD, events: Int16(POLLIN), revents: 0))
        pollFDs.append(pollfd(fd: publisher.mqtt.socket, events: Int16(POLLIN), revents: 0))
        pollFDs.append(pollfd(fd: stopFD, events: Int16(POLLIN), revents: 0))
        if radioFD >= 0, radio.wantsWrite { pollFDs[0].events |= Int16(POLLOUT) }
        if publisher.mqtt.wantsWrite { pollFDs[1].events |= Int16(POLLOUT) }
        relay.pollDescriptors(into: &pollFDs)
        let streamFDs = pollFDs.count
        streams.pollDescriptors(into: &pollFDs)
        let listenerFDs = pollFDs.count
        if let readvertiseRadio {
            for fd in readvertiseRadio.listenerFDs { pollFDs.append(pollfd(fd: fd, events: Int16(POLLIN), revents: 0)) }
            pollFDs.append(pollfd(fd: readvertiseRadio.eventFD, events: Int16(POLLIN), revents: 0))
        }
        let continuingFDs = pollFDs.count
        continuing.pollDescriptors(into: &pollFDs)
        // EINTR (a signal) is just an early turn; the stop pipe says whether to stop.
        _ = pollFDs.withUnsafeMutableBufferPointer { CLibc.poll($0.baseAddress, nfds_t($0.count), timeout) }
        let fds = (pollFDs[0], pollFDs[1], pollFDs[2])
        now = Instant.now
        counters.loopTurns &+= 1

        // The radio: ready descriptor, or a due deadline (capture replay has no descriptor).
        if radio.state != .finished, radioRetryAt == nil {
            let due = radio.nextDeadline.map { $0 <= now } ?? false
            if fds.0.revents != 0 || due || radio.fd < 0 && radio.state != .stopped {
                pollRadio(now: now)
            }
        }
        if let retry = radioRetryAt, retry <= now {
            radioRetryAt = nil
            startRadio(now: now)
        }
        watchRadio(now: now)

        // The broker.
        let readable = fds.1.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0
        let writable = fds.1.revents & Int16(POLLOUT) != 0
        Self.pollBroker(&publisher.mqtt, &mqttEvents, now: now, readable: readable, writable: writable)
        if !mqttEvents.isEmpty { handleBrokerEvents(now: now) }

        // Device links, then fetch deadlines.
        if streamFDs > 3 { relay.poll(fds: pollFDs[3..<streamFDs], now: now, mqtt: &publisher.mqtt) }
        if let due = relay.nextDeadline, due <= now { relay.tick(now: now, mqtt: &publisher.mqtt) }
        if listenerFDs > streamFDs { streams.poll(fds: pollFDs[streamFDs..<listenerFDs], now: now, mqtt: &publisher.mqtt) }
        if continuingFDs > listenerFDs {
            acceptPhones(pollFDs[listenerFDs..<continuingFDs - 1], now: now)
            // The kernel's answers to re-advertising requests, read when they are there and
            // failed at their deadline: nothing in the loop waits for the kernel.
            let answersDue = readvertiseRadio?.answerDeadline.map { $0 <= now } ?? false
            if pollFDs[continuingFDs - 1].revents != 0 || answersDue || readvertiseRadio?.removalsPending == true {
                readvertiseAnswers(now: now)
                readvertiseRemoved()
            }
        }
        if pollFDs.count > continuingFDs {
            continuing.poll(fds: pollFDs[continuingFDs...], now: now, mqtt: &publisher.mqtt, streams: &streams)
        }
        if publisher.names.owed > 0, publisher.mqtt.isConnected { fetchTitles(now: now) }
        if !relay.ownAnswers.isEmpty { takeTitles(now: now) }
        if let due = continuing.nextDeadline, due <= now { continuing.tick(now: now) }
        if let due = streams.nextDeadline, due <= now { streams.tick(now: now, mqtt: &publisher.mqtt) }
        logLinkFailures()

        // Timers.
        if let due = table.nextExpiry, due <= now {
            Self.expire(&table, &publisher, ownership, now: now)
        }
        if let due = apple.nextExpiry, due <= now {
            Self.expire(&apple, &publisher, ownership, now: now)
        }
        if publisher.mqtt.isConnected, let due = publisher.retainedScanEnds, due <= now {
            publisher.endRetainedScan()
            var ended: [Readvertiser.Change] = []
            readvertiser?.retainedScanEnded { ended.append($0) }
            for change in ended { readvertiseChanged(change) }
        }
        if publisher.mqtt.isConnected, let due = publisher.nextOrphanDeadline, due <= now {
            publisher.clearOrphans(table: table, apple: apple, ownership: ownership, now: now)
        }
        if publisher.mqtt.isConnected, let due = standInsDue, due <= now {
            republishStandIns()
        }
        if publisher.mqtt.isConnected, let due = publisher.nextCorrection, due <= now {
            Self.correct(&publisher, table, &ownership, &ownershipChanges, now: now)
            handleOwnershipChanges(now: now)
        }
        if let due = ownership.nextDeadline, due <= now {
            ownership.tick(now: now) { ownershipChanges.append($0) }
            handleOwnershipChanges(now: now)
        }
        if publisher.mqtt.isConnected, nextSightingCheck <= now {
            sendSightings(now: now)
        }
        if nextStats <= now {
            publishStats(now: now)
            nextStats = now + config.statusInterval
        }
        notifier.pingIfDue(now: now)
        return fds.2.revents != 0
    }

    /// Milliseconds to the nearest deadline, at most one second (loop_misc wants that often).
    func pollTimeout(now: Instant) -> Int32 {
        var next = now + .seconds(1)
        func consider(_ d: Instant?) { if let d, d < next { next = d } }
        if radio.state != .finished, radioRetryAt == nil { consider(radio.nextDeadline) }
        consider(radioRetryAt)
        consider(watchdogDeadline)
        consider(publisher.mqtt.nextDeadline)
        consider(table.nextExpiry)
        consider(apple.nextExpiry)
        consider(ownership.nextDeadline)
        consider(relay.nextDeadline)
        consider(streams.nextDeadline)
        consider(continuing.nextDeadline)
        consider(readvertiseRadio?.answerDeadline)
        // Orphans are cleared only while connected; a past deadline must not spin the loop
        // while the broker is away.
        if publisher.mqtt.isConnected {
            consider(publisher.nextOrphanDeadline)
            consider(publisher.nextCorrection)
            consider(publisher.names.nextDeadline)
            consider(standInsDue)
            consider(publisher.retainedScanEnds)
            consider(nextSightingCheck)
        }
        consider(nextStats)
        consider(notifier.nextDeadline)
        guard next > now else { return 0 }
        let (s, atto) = (next - now).components
        // Round up: waking a hair early would spin a turn for nothing.
        return Int32(s * 1000 + (atto + 999_999_999_999_999) / 1_000_000_000_000_000)
    }

    // MARK: radio

    mutating func startRadio(now: Instant) {
        do throws(RadioError) {
            if needsReopen, let reopen {
                radio = try reopen()
                needsReopen = false
                log.info("radio \(config.radio): opened again")
            }
            try radio.start(now: now)
            watchdogFrom = now
            announcedFinish = false
        } catch {
            radioFailed(error, now: now)
        }
    }

    mutating func pollRadio(now: Instant) {
        let reportsBefore = decoder.tally.reports
        do throws(RadioError) {
            _ = try Self.pollRadio(&radio, &decoder, Keys(verifier: verifier, addresses: addresses, appleIDs: appleIDs),
                                   &table, &apple, &publisher, ownership, now: now, clock: clock)
        } catch {
            radioFailed(error, now: now)
        }
        if decoder.tally.reports != reportsBefore {
            lastReportAt = now
            watchdogFrom = now
        }
        if radio.state == .finished, !announcedFinish {
            announcedFinish = true
            if let damage = radio.damage {
                // Counted with the other drops: the records before the damage were replayed.
                decoder.tally.drops.count(damage)
                log.warning("capture \(config.radio): stopped being readable: \(damage); everything before it was replayed")
            }
            log.info("capture replayed: \(decoder.tally.reports) reports, \(decoder.tally.beacons) beacons; holding the activities until they expire")
        }
    }

    /// The hot path: event → reports → beacon or Continuity → table → change. Allocates
    /// nothing unless something changed (scripts/bench counts it). Static with each piece as
    /// its own inout, so the closures borrow disjoint state.
    /// The loop's view of `GatewayKeys`, passed down the hot path without copying arrays.
    struct Keys {
        let verifier: BeaconVerifier?
        let addresses: AddressResolver?
        let appleIDs: [UInt32]
    }

    static func pollRadio(_ radio: inout Radio, _ decoder: inout AdvertisementDecoder, _ keys: Keys,
                          _ table: inout ActivityTable, _ apple: inout AppleDeviceTable, _ publisher: inout Publisher,
                          _ ownership: borrowing RoomOwnership,
                          now: Instant, clock: WallClock) throws(RadioError) -> Int {
        let timestamp = clock.unixMicroseconds(now)
        return try radio.poll(now: now) { event in
            route(event: event, timestamp: timestamp, now: now, &decoder, keys, &table, &apple, &publisher, ownership)
        }
    }

    @inline(__always)
    static func route(event: UnsafeRawBufferPointer, timestamp: Int64, now: Instant,
                      _ decoder: inout AdvertisementDecoder, _ keys: Keys, _ table: inout ActivityTable,
                      _ apple: inout AppleDeviceTable, _ publisher: inout Publisher,
                      _ ownership: borrowing RoomOwnership) {
        decoder.decode(event: event, timestamp: timestamp) { heard in
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
                table.hear(beacon, rssi: r.rssi, address: r.address, addressType: r.addressType, now: now) { change in
                    publisher.activityChanged(change, owned: ownership.owns(change.activity.deviceID))
                }
            } else {
                // A device the user named by its IRK is followed from any advertisement it
                // sends (docs/security.md §10); any other only from Continuity frames.
                let index = keys.addresses?.resolve(address: r.address, addressType: r.addressType)
                guard heard.content.apple != nil || index != nil else { return }
                apple.hear(heard.content.continuityMessages, rssi: r.rssi, address: r.address, addressType: r.addressType,
                           identity: index.map { AppleIdentity(index: $0, id: keys.appleIDs[$0]) }, now: now) { change in
                    publisher.appleChanged(change, owned: Self.owns(change.device, ownership))
                }
            }
        }
    }

    mutating func radioFailed(_ error: RadioError, now: Instant) {
        counters.radioErrors &+= 1
        counters.lastRadioError = error.description
        switch error {
        case .noBluetoothSupport, .invalidConfiguration, .permissionDenied:
            log.critical("radio \(config.radio): \(error)")
            fatalRadioError = error.description
        case .closed, .adapterDown, .adapterNotFound, .os:
            // The descriptor is dead: the retry opens the source again.
            needsReopen = reopen != nil
            log.error("radio \(config.radio): \(error); opening it again in \(Self.radioRetry)")
            radioRetryAt = now + Self.radioRetry
        default:
            log.error("radio \(config.radio): \(error); starting it again in \(Self.radioRetry)")
            radioRetryAt = now + Self.radioRetry
        }
        publishStats(now: now)
    }

    /// When the watchdog fires if no report arrives first. Only sources with a controller
    /// behind a descriptor have one to re-initialise; a capture replay's gaps are the capture's.
    var watchdogDeadline: Instant? {
        radio.fd >= 0 && radio.state == .scanning && radioRetryAt == nil ? watchdogFrom + config.radioSilence : nil
    }

    /// Scanning, yet silent for `radio.silence`: the controller stopped delivering (a stuck
    /// firmware, a USB hiccup, another process that disabled scanning). Start it over.
    mutating func watchRadio(now: Instant) {
        guard let due = watchdogDeadline, due <= now else { return }
        counters.radioRestarts &+= 1
        log.warning("radio \(config.radio): no advertising report for \(config.radioSilence) while scanning; re-initialising the controller (restart \(counters.radioRestarts))")
        startRadio(now: now)
        publishStats(now: now)
    }

    // MARK: broker

    static func pollBroker(_ mqtt: inout MQTTClient, _ events: inout [MQTTEvent], now: Instant,
                           readable: Bool, writable: Bool) {
        mqtt.poll(now: now, readable: readable, writable: writable) { events.append($0) }
    }

    mutating func handleBrokerEvents(now: Instant) {
        for event in mqttEvents {
            switch event {
            case .connected(let version, _):
                if brokerFailuresUnsaid > 0 { log.info("\(brokerFailuresUnsaid) more failed attempts before this connect") }
                lastBrokerFailure = nil
                brokerFailureSaid = nil
                brokerFailuresUnsaid = 0
                log.info("connected to the broker \(config.broker.host):\(config.broker.port) (MQTT \(version.rawValue)); publishing status and \(table.count) activities")
                // What this gateway knew of the building's sightings is from before the
                // outage (docs/rooms.md §7).
                ownership.rejoin(now: now)
                standInsDue = now + config.rooms.sightingInterval
                publisher.connected(table: table, apple: apple, ownership: ownership, now: now)
                publishStats(now: now)
                sightings.reset()
                sendSightings(now: now)
                streams.reconnected(now: now, mqtt: &publisher.mqtt)
                if readvertiser != nil {
                    readvertiser?.reconnected()
                    // The owners' answers to the phones' fetches (docs/relay.md §9).
                    do throws(MQTTError) { try publisher.mqtt.subscribe(continuing.answerPattern, qos: 1) } catch {
                        log.warning("subscribing to the answers for phones failed: \(error)")
                    }
                }
            case .refused(let reason):
                log.error("\(reason)")
            case .disconnected(let reason):
                // While the broker refuses connections the gateway retries every second
                // (docs/broker.md "Reconnect"): the same failure is said once a minute, not
                // once an attempt, with the count of those not said.
                if reason == lastBrokerFailure, let said = brokerFailureSaid, now - said < .seconds(60) {
                    brokerFailuresUnsaid &+= 1
                    log.debug("broker connection lost: \(reason)")
                } else {
                    let unsaid = brokerFailuresUnsaid > 0 ? " (and \(brokerFailuresUnsaid) attempts since the last line)" : ""
                    log.warning("broker connection lost: \(reason); reconnecting with backoff\(unsaid)")
                    lastBrokerFailure = reason
                    brokerFailureSaid = now
                    brokerFailuresUnsaid = 0
                }
            case .message(let message):
                received(message, now: now)
            }
        }
        mqttEvents.removeAll(keepingCapacity: true)
    }

    // MARK: receiving

    /// Every message the broker sends, by what its topic says it is (`Topics.classify`).
    mutating func received(_ message: MQTTMessage, now: Instant) {
        switch publisher.topics.classify(message.topic) {
        case .status(let gateway):
            statusReceived(message, gateway: gateway, now: now)
        case .sighting(let gateway, let device):
            sightingReceived(message, gateway: gateway, device: device, now: now)
        case .malformedSighting:
            // Under the sightings but not `<gateway>/<12 hex digits>`.
            sightingDrops.count("sighting-topic")
        case .fetch(let device):
            fetchRequested(message, device: device, now: now)
        case .streamOpen(let device, let id):
            streamOpenRequested(message, device: device, id: id, now: now)
        case .streamUp(let id):
            if !streams.fromBroker(id: id, leaf: "up", message.payload, now: now, mqtt: &publisher.mqtt) {
                streams.dropped("stream-unknown")
            }
        case .streamDown(let id):
            // The carrier's frames of a stream this gateway bridges for a phone (§7.5).
            if !streams.fromBroker(id: id, leaf: "down", message.payload, now: now, mqtt: &publisher.mqtt) {
                streams.dropped("stream-unknown")
            }
        case .streamCarrier(let id):
            // MQTT 3.1.1 clears the retain flag of live messages: there it says nothing (§7.3).
            let retained = publisher.mqtt.protocolVersion == .v5 ? message.retained : nil
            if let full = streams.carried(stream: id, payload: message.payload, retained: retained,
                                          isOnline: { ownership.isOnline(gateway: $0) }, now: now) {
                log.warning("\(full)")
            }
        case .malformedStream:
            // Under the stream topics, but no stream id of docs/relay.md §7.1.
            streams.dropped("stream-topic")
        case .answer(let link):
            // Subscribed to only while re-advertising (docs/relay.md §9).
            guard readvertiser != nil else { return }
            answeredForPhone(message, link: link, now: now)
        case .activity(let device):
            if readvertiser != nil,
               let change = readvertiser?.activity(device: device, payload: message.payload,
                                                   isOnline: { ownership.isOnline(gateway: Substring($0)) }) {
                readvertiseChanged(change)
            }
            publisher.received(message, on: .activity(device), table: table, apple: apple, ownership: ownership, now: now)
            publisher.observed(message, device: device, now: now)
            publisher.observedActivity(message, device: device, table: table, ownership: ownership)
        case .apple(let id):
            publisher.received(message, on: .apple(id), table: table, apple: apple, ownership: ownership, now: now)
        case .continued, .unknown:
            // Not subscribed to, or not ours to read.
            break
        }
    }

    // MARK: rooms (docs/rooms.md)

    /// A gateway's status: online, or its will.
    mutating func statusReceived(_ message: MQTTMessage, gateway id: Substring, now: Instant) {
        let topics = publisher.topics
        let online = message.payload.elementsEqual("online".utf8)
        // A gateway coming online subscribed to the sightings before it said so, but missed
        // the ones sent before: send ours again now, within its `rooms.settle`, rather than
        // at the next heartbeat, after it (two gateways starting together would each settle
        // on itself first, docs/rooms.md §3). Also when it was online already as far as
        // this gateway knows: after a broker restart nobody's will was sent, and a live
        // `online` is its reconnect (a retained one is old news, sent at our own subscribe,
        // and our own connect sent everything anyway). Its rejoin window waits for exactly
        // these (docs/rooms.md §7).
        if online, id != config.gatewayID, !message.retained || !ownership.isOnline(gateway: id) { sightings.reset() }
        let wasFirst = ownership.firstOnline == ownership.selfSlot
        defer {
            if !wasFirst, ownership.firstOnline == ownership.selfSlot, id != config.gatewayID {
                publisher.becameFirstOnline(now: now)
            }
        }
        if !ownership.status(gateway: id, online: online, now: now, { ownershipChanges.append($0) }) {
            sightingDrops.count(SightingDrop.gatewaysFull.name)
            log.warning("gateway \(id): more gateways than rooms.gateways (\(config.rooms.gateways)); its devices are not followed")
        }
        handleOwnershipChanges(now: now)
        // Its activities are nobody's to continue now (docs/relay.md §9).
        if !online, readvertiser != nil {
            var gone: [Readvertiser.Change] = []
            readvertiser?.ownerOffline(id) { gone.append($0) }
            for change in gone { readvertiseChanged(change) }
        }
        // Its streams' endpoints are told by the first online gateway (docs/relay.md §7.3).
        if !online, id != config.gatewayID, ownership.firstOnline == ownership.selfSlot {
            streams.gatewayWentOffline(id, downTopic: { topics.stream($0).down }, gatewayTopic: { topics.stream($0).gateway },
                                       mqtt: &publisher.mqtt)
        }
    }

    /// Another gateway's sighting of a device (docs/rooms.md §2), or our own coming back.
    mutating func sightingReceived(_ message: MQTTMessage, gateway: Substring, device: UInt64, now: Instant) {
        sightingsReceived &+= 1
        // Array.withUnsafeBytes rethrows untyped: the decode result travels out as a value.
        let decoded: Result<Sighting, WireError> = message.payload.withUnsafeBytes { bytes in
            do throws(WireError) { return .success(try Sighting.decode(bytes)) } catch { return .failure(error) }
        }
        let sighting: Sighting
        switch decoded {
        case .success(let s): sighting = s
        case .failure(let error): return sightingDrops.count(error)
        }
        if let drop = ownership.sighting(sighting, gateway: gateway, device: device, now: now,
                                         { ownershipChanges.append($0) }) {
            sightingDrops.count(drop.name)
        }
        handleOwnershipChanges(now: now)
    }

    // MARK: fetches (docs/relay.md §4)

    /// Every gateway sees every request; exactly one answers it: the device's owner while it
    /// is online, else the online gateway whose id sorts first (for unknown devices, devices
    /// nobody owns this moment, and bad requests).
    mutating func fetchRequested(_ message: MQTTMessage, device: UInt64?, now: Instant) {
        let route: FetchRoute
        let bodyError: WireError?
        switch FetchIntake(message) {
        case .unanswerable(let error):
            // Nowhere to answer: counted by every gateway, answered by none.
            return relay.dropped(error?.reasonName ?? "fetch-no-response-topic")
        case .request(let r, let e):
            route = r
            bodyError = e
        }
        relay.supersede(route, mqtt: &publisher.mqtt)
        guard answers(for: device) else { return }

        guard let device else {
            relay.dropped("fetch-topic")
            return relay.answer(.badRequest, device: nil, detail: "the topic's last level must be a device id: 12 lowercase hex digits",
                                route: route, mqtt: &publisher.mqtt)
        }
        if let bodyError {
            relay.dropped(bodyError.reasonName)
            return relay.answer(.badRequest, device: device, detail: "the request body: \(bodyError)", route: route,
                                mqtt: &publisher.mqtt)
        }
        guard ownership.owns(device) else {
            if ownership.follows(device) {
                return relay.answer(.notOwner, device: device,
                                    detail: "no gateway owns this device at the moment (it just arrived, or its gateway went offline); ask again in a second",
                                    route: route, mqtt: &publisher.mqtt)
            }
            return relay.answer(.unknownDevice, device: device, detail: "no gateway of this building hears this device",
                                route: route, mqtt: &publisher.mqtt)
        }
        guard let a = table.activity(deviceID: device), a.state == .current else {
            return relay.answer(.unknownDevice, device: device, detail: "the device has no current activity",
                                route: route, mqtt: &publisher.mqtt)
        }
        guard a.beacon.psm != 0 else {
            return relay.answer(.unreachable, device: device, detail: "the device offers no link (PSM 0 in its beacon)",
                                route: route, mqtt: &publisher.mqtt)
        }
        let target = FetchTarget(device: device, sequence: a.beacon.sequence,
                                 link: LinkAddress(address: a.address, addressType: a.addressType, psm: a.beacon.psm))
        relay.fetch(target, route: route, now: now, mqtt: &publisher.mqtt)
        logLinkFailures()
    }

    // MARK: titles (docs/relay.md §4.1)

    /// Starts the owed fetches whose time has come, as many as the own slots allow; a device
    /// that is no longer owned, current or reachable owes nothing.
    mutating func fetchTitles(now: Instant) {
        for id in publisher.names.due(now: now) {
            guard ownership.owns(id), let a = table.activity(deviceID: id), a.state == .current, a.beacon.psm != 0 else {
                publisher.names.dropOwed(id)
                continue
            }
            let target = FetchTarget(device: id, sequence: a.beacon.sequence,
                                     link: LinkAddress(address: a.address, addressType: a.addressType, psm: a.beacon.psm))
            if relay.fetchOwn(target, now: now, mqtt: &publisher.mqtt) {
                publisher.names.started(id, now: now)
            } else {
                publisher.names.couldNotStart(id, now: now)
            }
        }
        logLinkFailures()
    }

    /// The answers to the own fetches: a payload that names more than the message says goes
    /// out at once; a failure leaves the message as it is (counted, backed off).
    mutating func takeTitles(now: Instant) {
        for i in relay.ownAnswers.indices {
            let answer = relay.ownAnswers[i]
            let device = Topics.deviceText(answer.device)
            if answer.status != .ok {
                log.debug("device \(device): no title (\(answer.status.name)); the message stays as it is")
            } else if answer.described == nil {
                log.debug("device \(device): its payload is not one this gateway can read (sealed?); not asked again for this type")
            }
            guard publisher.names.answered(answer, now: now), ownership.owns(answer.device),
                  let a = table.activity(deviceID: answer.device) else { continue }
            log.debug("device \(device): \(answer.described?.title ?? "(no title)") (\(answer.described?.type ?? "?"))")
            publisher.described(a)
        }
        relay.clearOwnAnswers()
    }

    /// The one gateway that answers a request about `device` (docs/relay.md §4): its owner
    /// while online, else the online gateway whose id sorts first.
    func answers(for device: UInt64?) -> Bool {
        var answerer = ownership.firstOnline
        if let device, let owner = ownership.owner(of: device), ownership.isOnline(owner) { answerer = owner }
        return answerer == ownership.selfSlot
    }

    /// An endpoint opens a stream (docs/relay.md §7.2); refusals go back as error frames.
    mutating func streamOpenRequested(_ message: MQTTMessage, device: UInt64?, id: String, now: Instant) {
        // A retained open would reopen the stream at every reconnect.
        guard !message.retained else { return streams.dropped("stream-retained-open") }
        guard answers(for: device) else { return }
        var target: LinkAddress?
        var refusal: String?
        if let device {
            if !ownership.owns(device) {
                refusal = ownership.follows(device)
                    ? "no gateway owns this device at the moment (it just arrived, or its gateway went offline); open again in a second"
                    : "no gateway of this building hears this device"
            } else if let a = table.activity(deviceID: device), a.state == .current {
                if !a.beacon.flags.contains(.supportsStreams) {
                    refusal = "the activity does not offer continuation streams"
                } else if a.beacon.psm == 0 {
                    refusal = "the device offers no link (PSM 0 in its beacon)"
                } else {
                    target = LinkAddress(address: a.address, addressType: a.addressType, psm: a.beacon.psm)
                }
            } else {
                refusal = "the device has no current activity"
            }
        } else {
            refusal = "the topic's device level must be 12 lowercase hex digits"
        }
        streams.open(id: id, topics: publisher.topics.stream(id), frame: message.payload, target: target,
                     refusal: refusal, now: now, mqtt: &publisher.mqtt)
    }

    /// One line per link failure, with the last one's reason (a device walking away is news to
    /// whoever debugs a fetch, but not an error of this gateway).
    mutating func logLinkFailures() {
        guard relay.counters.linkFailures != linkFailuresLogged, let error = relay.lastLinkError else { return }
        linkFailuresLogged = relay.counters.linkFailures
        log.info("device link: \(error)")
    }

    /// Acts on what the rule decided: the new owner publishes what it holds; the old one
    /// falls silent without clearing (the topic is the new owner's now); a forgotten device's
    /// activity is cleared by its owner, or by the first online gateway if its owner is gone.
    mutating func handleOwnershipChanges(now: Instant) {
        guard !ownershipChanges.isEmpty else { return }
        let me = ownership.selfSlot
        for change in ownershipChanges {
            let device = Topics.deviceText(change.device)
            if change.to == me {
                // A first owner is every new device's arrival: debug; a move is news.
                let level: Logger.Level = change.reason == .settled ? .debug : .info
                let from = change.from.map { " from \(ownership.id(of: $0))" } ?? ""
                if let a = table.activity(deviceID: change.device) {
                    log.log(level: level, "device \(device): now in \(config.room) (\(change.reason))\(from)")
                    publisher.tookOver(a)
                } else if let d = namedApple(change.device) {
                    log.log(level: level, "\(publisher.appleName(d) ?? device): now in \(config.room) (\(change.reason))\(from)")
                    publisher.tookOver(d)
                }
            } else if change.from == me, let to = change.to {
                publisher.stoppedOwning(change.device)
                log.info("device \(device): moved to \(ownership.id(of: to)) (\(change.reason))")
            } else if change.reason == .forgotten {
                // The rooms id of a named Apple device (`ffff‖id`), unless an activity holds that id.
                let named = change.device >> 32 == 0xFFFF && table.activity(deviceID: change.device) == nil
                    ? UInt32(truncatingIfNeeded: change.device) : nil
                if change.from == me {
                    if table.activity(deviceID: change.device)?.state == .current {
                        publisher.clearActivity(change.device, forOthers: false)
                    } else if let named, apple.namedDevice(id: named) != nil {
                        publisher.clearApple(named, forOthers: false)
                    }
                } else if change.from.map({ !ownership.isOnline($0) }) ?? true, ownership.firstOnline == me {
                    if let named {
                        log.info("device \(device): nobody hears it and its gateway is offline; clearing its Apple entry")
                        publisher.clearApple(named, forOthers: true)
                    } else {
                        log.info("device \(device): nobody hears it and its gateway is offline; clearing its activity")
                        publisher.clearActivity(change.device, forOthers: true)
                    }
                }
            }
        }
        ownershipChanges.removeAll(keepingCapacity: true)
    }

    /// Disagreements about devices this gateway owns (docs/rooms.md §7 rule 3): another
    /// gateway's claim is settled by rank, the same way at both; anything else is published over.
    static func correct(_ publisher: inout Publisher, _ table: borrowing ActivityTable, _ ownership: inout RoomOwnership,
                        _ changes: inout [OwnershipChange], now: Instant) {
        for (device, claimant) in publisher.correct(table: table, ownership: ownership, now: now) {
            let gaveWay = ownership.yield(device, to: Substring(claimant), now: now) { changes.append($0) }
            if !gaveWay { publisher.republish(device, table: table) }
        }
    }

    /// The rejoin window closed: what this gateway still stands in for is its to publish
    /// (docs/rooms.md §7); a room that came back in the window has taken its devices back.
    mutating func republishStandIns() {
        standInsDue = nil
        table.forEach { a in
            guard ownership.owns(a.deviceID), ownership.standsIn(for: a.deviceID) else { return }
            publisher.tookOver(a)
        }
        apple.forEach { d in
            guard d.identity != nil, ownership.owns(AppleDevice.roomsID(d.id)), ownership.standsIn(for: AppleDevice.roomsID(d.id))
            else { return }
            publisher.tookOver(d)
        }
    }

    /// The named Apple device that rooms know as `roomsID`, if this gateway holds it.
    func namedApple(_ roomsID: UInt64) -> AppleDevice? {
        guard roomsID >> 32 == 0xFFFF else { return nil }
        return apple.namedDevice(id: UInt32(truncatingIfNeeded: roomsID))
    }

    /// This gateway's sightings that are due (docs/rooms.md §2).
    mutating func sendSightings(now: Instant) {
        nextSightingCheck = now + sightingCheckInterval
        Self.sendSightings(&sightings, table, apple, &publisher, &sightingCounter, since: since, now: now)
    }

    static func sendSightings(_ schedule: inout SightingSchedule, _ table: borrowing ActivityTable,
                              _ apple: borrowing AppleDeviceTable,
                              _ publisher: inout Publisher, _ counter: inout UInt64, since: Int64,
                              now: Instant) {
        schedule.due(table: table, apple: apple, now: now) { due in
            counter &+= 1  // 64 bits at a million a second: half a million years
            publisher.publishSighting(device: due.device, Sighting(rssi: due.rssi, since: since, n: counter))
        }
    }

    static func expire(_ table: inout ActivityTable, _ publisher: inout Publisher, _ ownership: borrowing RoomOwnership,
                       now: Instant) {
        table.expire(now: now) { publisher.activityChanged($0, owned: ownership.owns($0.activity.deviceID)) }
    }

    static func expire(_ apple: inout AppleDeviceTable, _ publisher: inout Publisher, _ ownership: borrowing RoomOwnership,
                       now: Instant) {
        apple.expire(now: now) { publisher.appleChanged($0, owned: owns($0.device, ownership)) }
    }

    /// Whether this gateway publishes an Apple entry: a named device only in the room that
    /// owns it (docs/security.md §10), any other where it is heard (docs/table.md).
    static func owns(_ d: AppleDevice, _ ownership: borrowing RoomOwnership) -> Bool {
        d.identity == nil || ownership.owns(AppleDevice.roomsID(d.id))
    }

    /// Status `offline` from us (a clean stop sends no will), then a clean DISCONNECT, which
    /// waits up to a second for the bytes to leave.
    mutating func shutdown() {
        // Nothing of this gateway's stays on the air, connected or not (docs/relay.md §9), and
        // every link hears `gone` (the broker side is lost when the broker is away).
        continuing.stop()
        readvertiseRadio?.withdrawAll()
        // Every fetch taken gets its one answer, even now (docs/relay.md §4).
        relay.stop(mqtt: &publisher.mqtt)
        streams.stop(mqtt: &publisher.mqtt)
        guard publisher.mqtt.isConnected else { return }

        publisher.stopListening()
        publisher.publish(publisher.topics.status, text: "offline")
        // Read what the broker still sends (the acks, our own `offline` coming back) until
        // it has been quiet for 50 ms, at most 500 ms: a socket closed with unread bytes
        // sends a reset instead of a FIN, and the reset can destroy the DISCONNECT on its
        // way, so the broker would see an unclean close.
        let end = Instant.now + .milliseconds(500)
        while Instant.now < end, publisher.mqtt.isConnected {
            let wantsWrite = publisher.mqtt.wantsWrite
            var p = pollfd(fd: publisher.mqtt.socket, events: Int16(POLLIN) | (wantsWrite ? Int16(POLLOUT) : 0),
                           revents: 0)
            let n = CLibc.poll(&p, 1, 50)
            if n < 0, errno == EINTR { continue }
            if n <= 0 { if wantsWrite { continue } else { break } }
            publisher.mqtt.poll(now: Instant.now, readable: p.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0,
                                writable: p.revents & Int16(POLLOUT) != 0) { _ in }
        }
        publisher.mqtt.disconnect()
    }

    // MARK: re-advertising (docs/relay.md §9)

    /// Puts a slot on the air or takes it off. The kernel's refusal is logged and counted; the
    /// slot is tried again at the activity's next change.
    mutating func readvertiseChanged(_ change: Readvertiser.Change) {
        guard let readvertiseRadio, let readvertiser, let tagger else { return }
        do throws(ManagementError) {
            switch change {
            case .advertise(let k):
                let data = readvertiser.advertisement(k, companyID: config.companyID, tagger: tagger)
                guard !data.isEmpty else { return }  // the slot left the air meanwhile
                try readvertiseRadio.advertise(k, data)
                if let a = readvertiser.slots[k] {
                    log.info("re-advertising \(Topics.deviceText(a.device)) seq \(a.sequence) from gateway \(a.owner) on PSM 0x\(Topics.hex(UInt64(readvertiser.psms[k]), digits: 4))")
                }
            case .withdraw(let k):
                try readvertiseRadio.withdraw(k)
                log.debug("re-advertising slot \(k) ends")
            }
        } catch {
            readvertiseErrors &+= 1
            log.warning("re-advertising on \(readvertiseRadio.adapter): \(error)")
            // Not on the air: the slot is free again, and the activity's next message tries again.
            // The remove that goes first may have failed too: make sure the old one is gone.
            if case .advertise(let k) = change {
                do throws(ManagementError) { try readvertiseRadio.withdraw(k) } catch {}
                self.readvertiser?.forget(k)
            }
        }
    }

    /// The kernel refused a request, or did not answer it by its deadline: counted and logged
    /// as a refusal inside `readvertiseChanged` was; an advertisement that did not go on the
    /// air frees its slot, and the activity's next message tries again.
    mutating func readvertiseAnswers(now: Instant) {
        guard let readvertiseRadio else { return }
        var failed: [(slot: Int, advertise: Bool, error: ManagementError)] = []
        readvertiseRadio.answers(now: now) { failed.append((slot: $0, advertise: $1, error: $2)) }
        for f in failed {
            readvertiseErrors &+= 1
            log.warning("re-advertising on \(readvertiseRadio.adapter): \(f.error.description)")
            guard f.advertise, readvertiser?.slots[f.slot] != nil else { continue }
            do throws(ManagementError) { try readvertiseRadio.withdraw(f.slot) } catch {}
            readvertiser?.forget(f.slot)
        }
    }

    /// Someone else removed slots' advertisements (bluetoothd resets every instance when it
    /// starts or the adapter comes back): they go on the air again.
    mutating func readvertiseRemoved() {
        guard let readvertiseRadio else { return }
        var removed: [Int] = []
        readvertiseRadio.removedSlots { removed.append($0) }
        for k in removed where self.readvertiser?.slots[k] != nil {
            log.info("re-advertising slot \(k) was removed by another program (bluetoothd?): putting it back")
            readvertiseChanged(.advertise(k))
        }
    }

    /// Phones connecting to the slots' PSMs (`fds`: one per listener, in slot order).
    mutating func acceptPhones(_ fds: ArraySlice<pollfd>, now: Instant) {
        guard let readvertiseRadio else { return }
        for (k, fd) in zip(readvertiseRadio.psms.indices, fds) where fd.revents != 0 {
            let accepted: (fd: Int32, peer: LinkAddress)?
            do throws(LinkError) { accepted = try readvertiseRadio.accept(k) } catch {
                readvertiseErrors &+= 1
                log.warning("accepting a phone's link on \(readvertiseRadio.adapter): \(error)")
                continue
            }
            guard let accepted else { continue }
            let channel = LinkChannel(accepted: accepted.fd, peer: accepted.peer, l2cap: readvertiseRadio.acceptsL2CAP)
            guard let device = readvertiser?.slots[k]?.device else {
                // The activity left the air between the phone's scan and its connect.
                var c = channel
                c.close()
                continuing.refusedGone()
                continue
            }
            log.debug("phone \(accepted.peer) continues \(Topics.deviceText(device))")
            continuing.adopt(channel, device: device, now: now)
        }
    }

    /// An owner's answer to a fetch asked for a phone.
    mutating func answeredForPhone(_ message: MQTTMessage, link: UInt64?, now: Instant) {
        let a = AnswerForPhone(message)
        continuing.answered(link: link, correlation: a.correlation, status: a.status, sequence: a.sequence,
                            payload: a.payload, now: now)
    }

    // MARK: stats

    mutating func publishStats(now: Instant) {
        var w = JSONWriter(statsScratch)
        do throws(WireError) {
            try writeStats(now: now, into: &w)
        } catch {
            return log.error("stats JSON did not fit 8 KiB (our bug): \(error)")
        }
        publisher.publishStats(w.written)
    }

    func writeStats(now: Instant, into w: inout JSONWriter) throws(WireError) {
        let t = decoder.tally
        try w.beginObject()
        try w.key("gateway"); try w.string(config.gatewayID)
        try w.key("room"); try w.string(config.room)
        try w.key("version"); try w.string(BatonVersion.current)
        try w.key("uptime_s"); try w.int((now - startedAt).components.seconds)
        try w.key("radio"); try w.beginObject()
        try w.key("source"); try w.string(config.radio.description)
        try w.key("state"); try w.string(Self.name(radio.state, retrying: radioRetryAt != nil))
        try w.key("restarts"); try w.int(Int64(counters.radioRestarts))
        try w.key("errors"); try w.int(Int64(counters.radioErrors))
        try w.key("last_error")
        if let e = counters.lastRadioError { try w.string(e) } else { try w.null() }
        try w.key("silent_s"); try w.int((now - lastReportAt).components.seconds)
        try w.endObject()
        try w.key("reports"); try w.int(Int64(t.reports))
        // Advertisements put together from fragments, and the pool's low-water mark (docs/radio.md).
        try w.key("assembled"); try w.int(Int64(t.assembled))
        try w.key("reassembly_free_min"); try w.int(Int64(decoder.reassembly.lowWater))
        try w.key("beacons"); try w.int(Int64(t.beacons))
        try w.key("continuity"); try w.int(Int64(t.continuityReports))
        try w.key("changes_published"); try w.int(Int64(publisher.counters.changesPublished))
        try w.key("drops"); try w.beginObject()
        for d in t.drops.sorted { try w.key(d.reason); try w.int(Int64(d.count)) }
        if let verifier { for d in verifier.drops.sorted { try w.key(d.reason); try w.int(Int64(d.count)) } }
        let tc = table.counters
        if tc.staleSequence > 0 { try w.key("stale-sequence"); try w.int(Int64(tc.staleSequence)) }
        if tc.relayed > 0 { try w.key("beacon-relayed"); try w.int(Int64(tc.relayed)) }
        try w.endObject()
        if let verifier {
            // docs/security.md §4.4; never the key itself (§6).
            try w.key("security"); try w.beginObject()
            try w.key("group"); try w.string(Topics.hex(UInt64(verifier.groupHash), digits: 8))
            try w.key("identities"); try w.int(Int64(verifier.identities))
            try w.key("unkeyed"); try w.string(verifier.policy == .publish ? "publish" : "ignore")
            try w.key("verified"); try w.int(Int64(verifier.verified))
            try w.key("unverified"); try w.int(Int64(verifier.unverified))
            try w.key("resolutions"); try w.int(Int64(verifier.resolutions))
            try w.endObject()
        }
        try w.key("table"); try w.beginObject()
        try w.key("fill"); try w.int(Int64(table.count))
        try w.key("capacity"); try w.int(Int64(table.capacity))
        try w.key("evicted"); try w.int(Int64(tc.evicted))
        try w.key("expired"); try w.int(Int64(tc.expired))
        try w.endObject()
        let ac = apple.counters
        try w.key("apple"); try w.beginObject()
        try w.key("fill"); try w.int(Int64(apple.count))
        try w.key("capacity"); try w.int(Int64(apple.capacity))
        try w.key("evicted"); try w.int(Int64(ac.evicted))
        try w.key("expired"); try w.int(Int64(ac.expired))
        try w.endObject()
        let pc = publisher.counters
        let oc = ownership.counters
        var owned = 0
        table.forEach { if ownership.owns($0.deviceID) { owned += 1 } }
        try w.key("rooms"); try w.beginObject()
        try w.key("devices"); try w.int(Int64(ownership.count))
        try w.key("capacity"); try w.int(Int64(ownership.capacity))
        try w.key("owned"); try w.int(Int64(owned))
        try w.key("ownership_changes"); try w.int(Int64(oc.changes))
        try w.key("takeovers"); try w.int(Int64(oc.takeovers))
        try w.key("forgotten"); try w.int(Int64(oc.forgotten))
        try w.key("sightings_sent"); try w.int(Int64(pc.sightingsSent))
        try w.key("sightings_received"); try w.int(Int64(sightingsReceived))
        try w.key("cleared_for_others"); try w.int(Int64(pc.clearedForOthers))
        try w.key("corrections"); try w.int(Int64(pc.corrections))
        // Apart from the radio's drops: a sighting's `truncated` is not an advert's.
        try w.key("drops"); try w.beginObject()
        for d in sightingDrops.sorted { try w.key(d.reason); try w.int(Int64(d.count)) }
        try w.endObject()
        try w.endObject()
        let rc = relay.counters
        try w.key("relay"); try w.beginObject()
        try w.key("link"); try w.string(relay.link?.description ?? "none")
        try w.key("pending"); try w.int(Int64(relay.pendingCount))
        try w.key("links_open"); try w.int(Int64(relay.openLinks))
        try w.key("link_opens"); try w.int(Int64(rc.linkOpens))
        try w.key("link_failures"); try w.int(Int64(rc.linkFailures))
        try w.key("cache_hits"); try w.int(Int64(rc.cacheHits))
        try w.key("answers"); try w.beginObject()
        for status in FetchStatus.allCases { try w.key(status.name); try w.int(Int64(rc.answers[status.rawValue])) }
        try w.endObject()
        try w.key("answers_lost"); try w.int(Int64(rc.answersLost))
        try w.key("continued"); try w.int(Int64(rc.continued))
        try w.key("continued_told"); try w.int(Int64(rc.continuedTold))
        try w.key("drops"); try w.beginObject()
        for d in relay.drops.sorted { try w.key(d.reason); try w.int(Int64(d.count)) }
        try w.endObject()
        let sc = streams.counters
        try w.key("streams"); try w.beginObject()
        try w.key("open"); try w.int(Int64(streams.openCount))
        try w.key("capacity"); try w.int(Int64(config.relay.streams))
        try w.key("opened"); try w.int(Int64(sc.opened))
        try w.key("refused"); try w.int(Int64(sc.refused.reduce(0, +)))
        try w.key("finished"); try w.int(Int64(sc.finished))
        try w.key("aborted"); try w.int(Int64(sc.aborted))
        try w.key("frames_up"); try w.int(Int64(sc.framesUp))
        try w.key("frames_down"); try w.int(Int64(sc.framesDown))
        try w.key("frames_queued"); try w.int(Int64(sc.framesQueued))
        try w.key("resent"); try w.int(Int64(sc.resent))
        try w.key("gone_for_others"); try w.int(Int64(sc.goneForOthers))
        try w.key("bridged"); try w.int(Int64(sc.bridged))
        try w.key("unanswered"); try w.int(Int64(sc.unanswered))
        try w.key("drops"); try w.beginObject()
        for d in streams.drops.sorted { try w.key(d.reason); try w.int(Int64(d.count)) }
        try w.endObject()
        try w.endObject()
        if let readvertiser {
            // docs/relay.md §9.
            try w.key("readvertise"); try w.beginObject()
            try w.key("capacity"); try w.int(Int64(readvertiser.slots.count))
            try w.key("on_air"); try w.beginArray()
            for a in readvertiser.slots {
                guard let a else { continue }
                try w.string(Topics.deviceText(a.device))
            }
            try w.endArray()
            try w.key("errors"); try w.int(Int64(readvertiseErrors))
            let cc = continuing.counters
            try w.key("phone_links"); try w.int(Int64(cc.links))
            try w.key("phone_links_open"); try w.int(Int64(continuing.openLinks))
            try w.key("phone_links_refused"); try w.int(Int64(cc.refused))
            try w.key("phone_fetches"); try w.int(Int64(cc.fetches))
            try w.key("phone_payloads"); try w.int(Int64(cc.payloads))
            try w.key("phone_refusals"); try w.int(Int64(cc.refusals))
            try w.key("phone_streams"); try w.int(Int64(cc.streams))
            try w.key("drops"); try w.beginObject()
            for d in readvertiser.drops.sorted { try w.key(d.reason); try w.int(Int64(d.count)) }
            for d in continuing.drops.sorted { try w.key(d.reason); try w.int(Int64(d.count)) }
            try w.endObject()
            try w.endObject()
        }
        try w.endObject()
        let nc = publisher.names.counters
        try w.key("titles"); try w.beginObject()
        try w.key("fetching"); try w.bool(publisher.names.fetchTitles)
        try w.key("types_known"); try w.int(Int64(config.activityTypes.count))
        try w.key("in_flight"); try w.int(Int64(publisher.names.inFlight))
        try w.key("capacity"); try w.int(Int64(publisher.names.inFlightCapacity))
        try w.key("owed"); try w.int(Int64(publisher.names.owed))
        try w.key("fetches"); try w.int(Int64(nc.fetches))
        try w.key("described"); try w.int(Int64(nc.described))
        try w.key("unreadable"); try w.int(Int64(nc.unreadable))
        try w.key("failed"); try w.int(Int64(nc.failed))
        try w.key("waited"); try w.int(Int64(nc.waited))
        try w.key("carried"); try w.int(Int64(nc.carried))
        try w.endObject()
        try w.key("broker"); try w.beginObject()
        try w.key("connects"); try w.int(Int64(pc.connects))
        try w.key("changes_while_away"); try w.int(Int64(pc.changesWhileAway))
        try w.key("orphans_cleared"); try w.int(Int64(pc.orphansCleared))
        try w.key("orphan_rescans"); try w.int(Int64(pc.orphanRescans))
        try w.key("publish_errors"); try w.int(Int64(pc.publishErrors))
        try w.endObject()
        try w.endObject()
    }

    static func name(_ state: RadioState, retrying: Bool) -> StaticString {
        if retrying { return "retrying" }
        switch state {
        case .stopped: return "stopped"
        case .initialising: return "initialising"
        case .scanning: return "scanning"
        case .finished: return "finished"
        }
    }
}
