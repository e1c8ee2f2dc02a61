// The service (docs/architecture.md §2 "The loop"): one thread, one
// poll() loop, driven by `PollLoop`, over the gateway's parts. Each part has the same shape
// (descriptors to poll, a next deadline, work when one is ready or due), is its own type, and
// lives in its own file:
//
//   radio       GatewayRadio.swift        HCI events → decoder → each advertisement heard
//   room        RoomState.swift, GatewayRooms.swift   the tables, Publisher, the rooms rule
//   broker      GatewayBroker.swift       the one MQTT connection; inbound messages by topic
//   stop        the stop pipe (Signals.swift)
//   fetches     FetchRelay, in GatewayRelays (GatewayRelays.swift)   (docs/relay.md §4)
//   streams     StreamRelay, in GatewayRelays                        (docs/relay.md §7)
//   phones      GatewayReadvertising.swift                           (docs/relay.md §9)
//   continuing  ContinuingLinks, in GatewayRelays                    (docs/relay.md §9)
//   proxy       ProxyServer (BatonProxy)  Home Assistant's ESPHome clients
//   connections GATTConnections (BatonRelay)  the devices Home Assistant connects to through it
//   timers      GatewayTimers.swift: the room's, the stats, the status check, the watchdog
//
// `Gateway` holds the parts and routes between them; what a part does is its own type's.
// The loop scans continuously (no scan-then-sleep duty cycle) and watches its own radio
// (docs/radio.md "Recovery").
import BatonLibc
import BatonCore
public import BatonHCI
public import BatonMQTT
import BatonRelay
import BatonKeys
public import BatonProxy
import BatonWire
import CLibc

public enum BatonVersion {
    public static let current = "0.4.0"
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
    // The parts.
    var radio: GatewayRadio<Radio>
    /// This room's state: the tables, the retained state's keeper, the rooms rule, the keys.
    var room: RoomState
    var broker: GatewayBroker
    /// Payload fetches, streams, re-advertising and the phones' links (docs/relay.md).
    var relays: GatewayRelays
    /// The ESPHome API server, Home Assistant's Bluetooth proxy (`esphome:`, docs/esphome.md);
    /// nil when the config has none.
    var proxy: ProxyServer?
    /// The devices Home Assistant is connected to through the proxy (`esphome.connections`,
    /// docs/esphome.md §11); nil without the proxy, connections or a device link.
    var connections: GATTConnections?
    // The loop itself.
    var loop: PollLoop
    var log: Logger
    var upkeep: GatewayUpkeep

    /// How long after a radio error the source is started again.
    public static var radioRetry: Duration { GatewayRadio<Radio>.retry }

    /// `keys` are `GatewayKeys.make(config)`: required when the config has keys
    /// (`GatewayLauncher` makes them, where a libcrypto failure can be reported).
    public init(config: GatewayConfig, radio: consuming Radio, reopen: (() throws(RadioError) -> Radio)? = nil,
                mqtt: consuming MQTTClient, keys: GatewayKeys = .none, readvertising: (any AdvertisingController)? = nil,
                proxy: consuming ProxyServer? = nil, log: Logger, environment: [String: String], now: Instant, unixMicroseconds: Int64) {
        precondition(keys.matches(config), "the gateway's keys are GatewayKeys.make(config)")
        self.config = config
        let clock = WallClock(unixMicrosecondsAtStart: unixMicroseconds, instantAtStart: now)
        self.radio = GatewayRadio(source: radio, reopen: reopen, config: config, clock: clock, log: log, now: now)
        self.broker = GatewayBroker(mqtt: mqtt, config: config)
        let topics = Topics(prefix: config.prefix, discoveryPrefix: config.discoveryPrefix, gatewayID: config.gatewayID)
        var publisher = Publisher(
            topics: topics,
            origin: .init(room: config.room, gatewayID: config.gatewayID), clock: clock, version: BatonVersion.current,
            discovery: config.discovery, appleAddresses: config.appleAddresses, orphanGrace: config.table.expiry,
            ownedCapacity: config.table.capacity + config.apple.capacity, log: log)
        publisher.keyedGroup = keys.verifier?.groupHash
        publisher.subscriptions.neighbourhoods = config.neighbourhoods && config.sightingBatches
        publisher.appleNames = config.appleIRKs.map({ $0.name })
        let link = Self.deviceLink(config)
        // Titles are fetched over the same links, so only with one (docs/relay.md §4.1).
        publisher.names = ActivityNames(types: config.activityTypes, fetchTitles: config.fetchTitles && link != nil,
                                        capacity: config.table.capacity, fetches: config.relay.fetches)
        var readvertiser: Readvertiser?
        if let readvertising, let group = keys.verifier?.groupHash, keys.tagger != nil {
            readvertiser = Readvertiser(groupHash: group, selfID: config.gatewayID, psms: readvertising.psms)
            // The owners' answers to the phones' fetches (docs/relay.md §9).
            publisher.subscriptions.answers = topics.answerPattern
        }
        self.room = RoomState(config: config, keys: keys, publisher: publisher, log: log, unixMicroseconds: unixMicroseconds,
                              now: now)
        self.relays = GatewayRelays(
            fetches: FetchRelay(config: config.relay, link: link, gatewayID: config.gatewayID, room: config.room, topics: topics),
            streams: StreamRelay(config: config.relay, link: link, gatewayID: config.gatewayID),
            continuing: ContinuingLinks(config: config.relay, topics: topics, room: config.room),
            readvertising: readvertising.map {
                GatewayReadvertising(radio: $0, readvertiser: readvertiser, tagger: keys.tagger, companyID: config.companyID, log: log)
            })
        if let link, let slots = proxy?.settings.connections, slots > 0 {
            self.connections = GATTConnections(limit: slots, link: link)
        } else {
            self.connections = nil
        }
        let proxyDescriptors = (proxy?.descriptorLimit ?? 0) + (self.connections?.descriptorLimit ?? 0)
        self.proxy = proxy
        self.loop = PollLoop(parts: Self.loopParts, descriptors: config.polledDescriptors(proxy: proxyDescriptors), now: now)
        self.log = log
        self.upkeep = GatewayUpkeep(config: config, environment: environment, now: now)
        // `esphome.scan-mode: active` scans actively from the first scan: asked now, the
        // type goes into the init's scan parameters (a stopped radio takes it at its start),
        // not into a change on the loop's first turn after a passive init.
        if self.proxy?.wantedScanMode == ScannerMode.active { self.radio.ask(.active, now: now) }
    }


    /// How this gateway reaches devices (`relay.link`, docs/relay.md §5).
    static func deviceLink(_ config: GatewayConfig) -> AnyDeviceLink? {
        switch config.resolvedRelayLink {
        case .auto, .none: nil
        // The receive MTU holds the largest payload message (docs/protocol.md §5.1).
        case .bluez(let adapter): AnyDeviceLink(L2CAPLink(adapter: adapter, receiveMTU: config.relay.payloadMax + 3))
        case .simulator(let path): AnyDeviceLink(SimulatedLink(path: path))
        }
    }

    public var activityCount: Int { room.table.count }
    public var tally: AdvertisementTally { radio.decoder.tally }
    /// What is on this room's air for other rooms, and the kernel's refusals (docs/relay.md §9).
    var readvertiser: Readvertiser? { relays.readvertising?.readvertiser }
    var readvertiseErrors: Int { relays.readvertising?.errors ?? 0 }
    public var counters: GatewayCounters {
        var c = radio.counters
        c.loopTurns = loop.turns
        return c
    }

    // MARK: the loop

    /// Runs until SIGTERM/SIGINT or an unrecoverable radio error.
    public mutating func run() -> GatewayExit {
        let stop = StopSignals()
        let now = Instant.now
        broker.mqtt.start(now: now)
        radio.start(now: now)
        upkeep.notifier.send("READY=1\nSTATUS=scanning on \(config.radio), broker \(config.broker.nodeList)")
        while true {
            if let failure = radio.fatalError {
                shutdown()
                return .radioFailed(failure)
            }
            if turn(stopFD: stop.fd) { if stop.drain() { break } }
        }
        upkeep.notifier.send("STOPPING=1")
        log.info("stopping: saying offline and disconnecting")
        shutdown()
        return .stopped
    }

    /// The parts `turn` adds to the loop: radio, broker, stop pipe, fetches, streams,
    /// re-advertising, continuing links, ESPHome server, its connections, and three deadlines
    /// (timers, title fetches, systemd's watchdog).
    static var loopParts: Int { 12 }

    /// What the parts say they poll at most (`LoopPart.descriptorLimit`): what
    /// `GatewayConfig.polledDescriptors` sized the loop and the open-file limit with, from the
    /// configuration alone, before the parts existed (the re-advertising and ESPHome gateway tests
    /// hold them equal).
    var partsDescriptorLimit: Int {
        mutating get {
            radio.descriptorLimit + broker.descriptorLimit + 1 + relays.fetches.descriptorLimit + relays.streams.descriptorLimit
                + (relays.readvertising?.descriptorLimit ?? 0) + relays.continuing.descriptorLimit + (proxy?.descriptorLimit ?? 0)
                + (connections?.descriptorLimit ?? 0)
        }
    }

    /// One turn: every part says what it polls and when it is next due; the driver waits for
    /// the first of them; then each part does what is ready or due, in this order.
    /// Returns true when `stopFD` became readable.
    public mutating func turn(stopFD: Int32 = -1) -> Bool {
        let oversizedBefore = loop.oversizedTurns
        loop.begin(now: .now)
        let radioPart = loop.add(&radio)
        let brokerPart = loop.add(&broker)
        let stop = loop.add(fd: stopFD)
        let fetches = loop.add(&relays.fetches)
        let streamsPart = loop.add(&relays.streams)
        let phones = relays.readvertising == nil ? nil : loop.add(&relays.readvertising!)
        let continuingPart = loop.add(&relays.continuing)
        let proxyPart = proxy == nil ? nil : loop.add(&proxy!)
        let connectionsPart = connections == nil ? nil : loop.add(&connections!)
        loop.add(deadline: timersDeadline)
        // Owed title fetches are started in the turn (below); this is when the next one may.
        loop.add(deadline: broker.mqtt.isConnected ? room.publisher.names.nextDeadline : nil)
        loop.add(deadline: upkeep.notifier.nextDeadline)
        // A busy radio's reports are gathered for `radio.gather`, and read together: one
        // wake-up each was most of a busy room's cost; a quiet room's are read as they come
        // (docs/architecture.md §2 "Gathering").
        let heldUntil = radio.gathering ? radio.lastRead.map { $0 + config.radioGather } : nil
        let held = heldUntil.map { loop.holdBack(radioPart, until: $0) } ?? false
        if oversizedBefore == 0 && loop.oversizedTurns == 1 {
            log.error("the loop was sized for \(loop.partLimit) parts and \(loop.descriptorLimit) descriptors and this turn had \(loop.parts) and \(loop.fds.count), or a part polled more than it said: our bug (the loop allocates while it grows); please report it")
        }
        let failedBefore = loop.failedWaits
        let now = loop.wait()
        if failedBefore == 0 && loop.failedWaits == 1 {
            log.error("poll: \(Errno(loop.lastFailure, call: "poll").message) with \(loop.fds.count) descriptors; the loop will wake for nothing until it is restarted (open-file limit \(OpenFileLimit.current()?.soft ?? -1))")
        }
        // Before anything the stall left queued is read (docs/rooms.md §7 rule 4).
        if let gap = broker.stoodStill(now: now) { brokerGaveUp(after: gap, now: now) }

        // A held-back descriptor is read when its hold ends, ready or not (EAGAIN costs one read).
        let gathered = held && heldUntil.map { $0 <= now } ?? false
        radio.serve(ready: loop.isReady(radioPart) || gathered, now: now) { heard in
            proxy?.heard(heard)
            room.heard(heard, now: now, mqtt: &broker.mqtt)
        }
        if radio.statsOwed {
            radio.statsOwed = false
            publishStats(now: now)
        }
        // Home Assistant shows the scanner's state (docs/esphome.md §3.5); told on a change only.
        if proxy != nil { proxy?.setScannerState(radio.scannerState, mode: radio.scannerMode) }

        broker.serve(ready: loop.ready(brokerPart), now: now)
        if !broker.events.isEmpty { handleBrokerEvents(now: now) }

        // Device links, each part's readiness and then its deadlines.
        relays.fetches.serve(loop.ready(fetches), now: now, mqtt: &broker.mqtt)
        relays.streams.serve(loop.ready(streamsPart), now: now, mqtt: &broker.mqtt)
        if let phones { relays.readvertising?.serve(loop.ready(phones), due: loop.isDue(phones), now: now, continuing: &relays.continuing) }
        relays.continuing.serve(loop.ready(continuingPart), now: now, mqtt: &broker.mqtt, streams: &relays.streams)
        if room.publisher.names.owed > 0, broker.mqtt.isConnected { fetchTitles(now: now) }
        if !relays.fetches.ownAnswers.isEmpty { takeTitles(now: now) }
        logLinkFailures()

        // Home Assistant's clients: requests, then this turn's advertisements as they arrived
        // (a batch goes out every turn, not every N seconds).
        if let proxyPart { proxy!.serve(loop.ready(proxyPart), now: now) }
        // What the clients asked of devices goes to the connections, and what the devices say
        // back to the client that asked (docs/esphome.md §11).
        if let connectionsPart {
            while let a = proxy!.nextGATTAsk() {
                connections!.ask(a.ask, client: a.client, address: a.address, data: a.data, now: now, to: &proxy!)
            }
            connections!.serve(loop.ready(connectionsPart), now: now, to: &proxy!)
        }
        // Active scanning while Home Assistant asks for it (docs/esphome.md "Active scanning").
        if let wanted = proxy?.wantedScanMode { radio.ask(wanted == ScannerMode.active ? .active : .passive, now: now) }

        runTimers(now: now)
        upkeep.notifier.pingIfDue(now: now)
        return loop.isReady(stop)
    }

    /// Status `offline` from us (a clean stop sends no will), then a clean DISCONNECT.
    mutating func shutdown() {
        // Nothing of this gateway's stays on the air, connected or not (docs/relay.md §9), and
        // every link hears `gone` (the broker side is lost when the broker is away).
        relays.continuing.stop()
        relays.readvertising?.radio.withdrawAll()
        // Every fetch taken gets its one answer, even now (docs/relay.md §4).
        relays.fetches.stop(mqtt: &broker.mqtt)
        relays.streams.stop(mqtt: &broker.mqtt)
        if connections != nil { connections!.stop(to: &proxy!) }
        guard broker.mqtt.isConnected else { return }
        room.publisher.stopListening(&broker.mqtt)
        room.publisher.publish(&broker.mqtt, room.publisher.topics.status, text: "offline")
        broker.drainAndDisconnect()
    }
}

extension GatewayConfig {
    /// The loop's poll(2) entries, reserved once so no turn grows them: radio, broker, stop
    /// pipe; fetch and continuing links; streams; re-advertising's listeners and its management
    /// socket; the ESPHome server's listener, clients and connections to devices (`proxy`). Idle entries count too:
    /// poll(2) refuses more entries than the open-file limit (`OpenFileLimit`, raised at start).
    public func polledDescriptors(proxy: Int) -> Int {
        3 + 2 * relay.links + relay.streams + (readvertise > 0 ? readvertise + 1 : 0) + proxy
    }
}
