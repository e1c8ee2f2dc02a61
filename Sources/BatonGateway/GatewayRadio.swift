// The loop's radio part (docs/architecture.md "The loop"): the source of HCI events, the
// decoder, and what keeps them alive: the watchdog that re-initialises a controller gone
// silent, and the retry after an error (docs/radio.md "Recovery").
//
//   radio --HCI events--> AdvertisementDecoder --heard--> ProxyServer (Home Assistant)
//                                                      \-> RoomState.heard: tables --changes--> Publisher
import BatonLibc
import BatonCore
import BatonHCI
import BatonMQTT
import BatonKeys
import BatonProxy
import BatonWire
import CLibc

public struct GatewayCounters: Sendable, Equatable {
    /// Controller re-initialisations after `radio.silence` without a report.
    public var radioRestarts = 0
    /// Errors the radio source threw (each followed by a retry).
    public var radioErrors = 0
    public var lastRadioError: String?
    public var loopTurns = 0
    public init() {}
}

struct GatewayRadio<Radio: RadioSource & ~Copyable>: ~Copyable {
    var source: Radio
    /// Opens the source again: a controller unplugged and plugged back, a simulator
    /// restarted. Used when the source says it is gone (closed, adapter down or not found).
    let reopen: (() throws(RadioError) -> Radio)?
    var needsReopen = false
    var decoder: AdvertisementDecoder
    let name: String
    let silence: Duration
    /// The reports' timestamps (Unix microseconds) from the loop's clock.
    let clock: WallClock
    var counters = GatewayCounters()
    var log: Logger
    /// When the last advertising report arrived (stats `silent_s`), and when the watchdog's
    /// silence started counting (a restart counts from its own start).
    var lastReportAt: Instant
    var watchdogFrom: Instant
    var retryAt: Instant?
    /// When the source was last read: the loop holds its descriptor back until `radio.gather`
    /// after that (docs/architecture.md §2 "Gathering").
    var lastRead: Instant?
    /// Whether the last read of the descriptor found two reports or more waiting: the radio is
    /// busy and the next read is held back for `radio.gather`. A read that finds one report
    /// (a quiet room: nothing came meanwhile) ends it, and the next report is read as it
    /// arrives; a read that finds two starts it again (docs/architecture.md §2 "Gathering").
    var gathering = false
    /// Advertising reports the last read found.
    var lastReadReports = 0
    var announcedFinish = false
    /// The scan type asked of the source (the ESPHome server's, docs/esphome.md "Active
    /// scanning"); a source opened again is asked again.
    var scanType: ScanType = .passive
    /// An error no retry can fix: the loop ends with it.
    var fatalError: String?
    /// Something the stats topic should say at once (an error, a restart).
    var statsOwed = false

    /// How long after a radio error the source is started again.
    static var retry: Duration { .seconds(5) }

    init(source: consuming Radio, reopen: (() throws(RadioError) -> Radio)?, config: GatewayConfig, clock: WallClock, log: Logger,
         now: Instant) {
        self.source = source
        self.reopen = reopen
        self.decoder = AdvertisementDecoder(beaconCompanyID: config.companyID, reassembly: config.radioReassembly)
        self.name = config.radio.description
        self.silence = config.radioSilence
        self.clock = clock
        self.log = log
        self.lastReportAt = now
        self.watchdogFrom = now
    }

    /// A source that failed is not polled until its retry: a closed or vanished descriptor
    /// reports POLLHUP/POLLERR at once, every turn, and would spin the loop.
    var polled: Bool { retryAt == nil && source.state != .stopped && source.state != .finished }

    /// When the watchdog fires if no report arrives first. Only sources with a controller
    /// behind a descriptor have one to re-initialise; a capture replay's gaps are the capture's.
    var watchdogDeadline: Instant? {
        source.fd >= 0 && source.state == .scanning && retryAt == nil ? watchdogFrom + silence : nil
    }

    mutating func start(now: Instant) {
        do throws(RadioError) {
            if needsReopen, let reopen {
                source = try reopen()
                needsReopen = false
                log.info("radio \(name): opened again")
            }
            // A source opened again, or one not started yet, is asked for what was asked last.
            if scanType != .passive { try source.setScanType(scanType, now: now) }
            try source.start(now: now)
            watchdogFrom = now
            announcedFinish = false
        } catch {
            failed(error, now: now)
        }
    }

    /// The part's work: events when the descriptor is ready or the source's deadline is due (a
    /// capture replay has no descriptor), the retry, the watchdog. Each advertisement decoded
    /// goes to `heard`, the hot path's consumers (docs/architecture.md §3a).
    mutating func serve(ready: Bool, now: Instant, _ heard: (HeardAdvertisement) -> Void) {
        if source.state != .finished, retryAt == nil {
            let due = source.nextDeadline.map { $0 <= now } ?? false
            if ready || due || source.fd < 0 && source.state != .stopped {
                if ready { lastRead = now }
                poll(now: now, heard)
                if ready { gathering = lastReadReports >= 2 }
            }
        }
        if let retry = retryAt, retry <= now {
            retryAt = nil
            start(now: now)
        }
        // Scanning, yet silent for `radio.silence`: the controller stopped delivering (a stuck
        // firmware, a USB hiccup, another process that disabled scanning). Start it over.
        if let due = watchdogDeadline, due <= now {
            counters.radioRestarts &+= 1
            log.warning("radio \(name): no advertising report for \(silence.secondsDescription) while scanning; re-initialising the controller (restart \(counters.radioRestarts))")
            start(now: now)
            statsOwed = true
        }
    }

    /// The hot path: event → reports → `heard`. Allocates nothing (scripts/bench counts it).
    mutating func poll(now: Instant, _ heard: (HeardAdvertisement) -> Void) {
        let reportsBefore = decoder.tally.reports
        let timestamp = clock.unixMicroseconds(now)
        do throws(RadioError) {
            _ = try source.poll(now: now) { event in decoder.decode(event: event, timestamp: timestamp, heard) }
        } catch {
            failed(error, now: now)
        }
        lastReadReports = decoder.tally.reports &- reportsBefore
        if decoder.tally.reports != reportsBefore {
            lastReportAt = now
            watchdogFrom = now
        }
        if source.state == .finished, !announcedFinish {
            announcedFinish = true
            if let damage = source.damage {
                // Counted with the other drops: the records before the damage were replayed.
                decoder.tally.drops.count(damage)
                log.warning("capture \(name): stopped being readable: \(damage); everything before it was replayed")
            }
            log.info("capture replayed: \(decoder.tally.reports) reports, \(decoder.tally.beacons) beacons; holding the activities until they expire")
        }
    }

    /// Asks the source for `type` when it is not what was asked last. A source waiting for its
    /// retry takes it at its next start.
    mutating func ask(_ type: ScanType, now: Instant) {
        guard type != scanType else { return }
        scanType = type
        log.info("radio \(name): \(type == .active ? "active" : "passive") scanning, for Home Assistant")
        do throws(RadioError) {
            try source.setScanType(type, now: now)
        } catch {
            failed(error, now: now)
        }
    }

    mutating func failed(_ error: RadioError, now: Instant) {
        counters.radioErrors &+= 1
        counters.lastRadioError = error.description
        switch error {
        case .noBluetoothSupport, .invalidConfiguration, .permissionDenied:
            log.critical("radio \(name): \(error)")
            fatalError = error.description
        case .closed, .adapterDown, .adapterNotFound, .os:
            // The descriptor is dead: the retry opens the source again.
            needsReopen = reopen != nil
            log.error("radio \(name): \(error); opening it again in \(Self.retry.secondsDescription)")
            retryAt = now + Self.retry
        default:
            log.error("radio \(name): \(error); starting it again in \(Self.retry.secondsDescription)")
            retryAt = now + Self.retry
        }
        statsOwed = true
    }

    /// The radio's part of the stats topic (docs/mqtt.md §1): `radio`, and what the decoder heard.
    func writeStats(now: Instant, into w: inout JSONWriter) throws(WireError) {
        let t = decoder.tally
        try w.key("radio"); try w.beginObject()
        try w.key("source"); try w.string(name)
        try w.key("state"); try w.string(Self.stateName(source.state, retrying: retryAt != nil))
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
    }

    /// The advertisements' drops (stats `drops`).
    func writeDrops(into w: inout JSONWriter) throws(WireError) {
        for d in decoder.tally.drops.sorted { try w.key(d.reason); try w.int(Int64(d.count)) }
    }

    /// The radio as ESPHome's scanner states say it (docs/esphome.md §3.5): a source waiting
    /// for its retry has failed; a replayed capture that ended has stopped.
    /// The mode ESPHome's scanner state says (§3.5): active once the controller accepted
    /// active parameters; a capture replay is passive.
    var scannerMode: UInt32 { source.scanType == .active ? ScannerMode.active : ScannerMode.passive }

    var scannerState: UInt32 {
        if retryAt != nil || fatalError != nil { return ScannerState.failed }
        switch source.state {
        case .stopped: return ScannerState.idle
        case .initialising: return ScannerState.starting
        case .scanning: return ScannerState.running
        case .finished: return ScannerState.stopped
        }
    }

    static func stateName(_ state: RadioState, retrying: Bool) -> StaticString {
        if retrying { return "retrying" }
        switch state {
        case .stopped: return "stopped"
        case .initialising: return "initialising"
        case .scanning: return "scanning"
        case .finished: return "finished"
        }
    }
}

extension GatewayRadio: LoopPart where Radio: ~Copyable {
    mutating func pollDescriptors(into fds: inout [pollfd]) {
        let fd = polled ? source.fd : -1
        let events = Int16(POLLIN) | (fd >= 0 && source.wantsWrite ? Int16(POLLOUT) : 0)
        fds.append(pollfd(fd: fd, events: events, revents: 0))
    }
    /// The source's descriptor, negative while held back, stopped or a capture.
    var descriptorLimit: Int { 1 }

    var nextDeadline: Instant? {
        let own = source.state != .finished && retryAt == nil ? source.nextDeadline : nil
        return Instant.earliest(Instant.earliest(own, retryAt), watchdogDeadline)
    }
}

extension ProxyServer {
    /// Home Assistant hears every advertisement, as an ESPHome proxy passes them on
    /// (docs/esphome.md): batched until the end of the turn, nothing allocated. Baton's own
    /// beacons are withheld: the gateway publishes what they say, no integration of Home
    /// Assistant reads them, and Kegtron's matches their test company id (§3.7).
    @inline(__always)
    mutating func heard(_ heard: HeardAdvertisement) {
        guard heard.content.beacon == nil else { return withholdBatonBeacon() }
        let r = heard.report
        self.heard(address: r.address, addressType: r.addressType, rssi: r.rssi, data: r.data, eventType: r.eventType)
    }
}
