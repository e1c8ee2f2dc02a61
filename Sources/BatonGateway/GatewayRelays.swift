// The loop's relay parts, as the gateway drives them (docs/relay.md): payload fetches asked
// over the broker and answered from the device's link (§4), the titles the gateway fetches
// for itself (§4.1), and continuation streams (§7). The relays themselves are BatonRelay's
// FetchRelay and StreamRelay; what is here is what needs the tables and the rooms.
import BatonLibc
import BatonCore
import BatonHCI
import BatonKeys
import BatonMQTT
import BatonRelay
import BatonWire

/// The relays as the gateway holds them (docs/relay.md): fetches (§4), streams (§7), and, with
/// `relay.readvertise`, other rooms' activities on this room's air and the phones' links to
/// them (§9).
struct GatewayRelays: ~Copyable {
    var fetches: FetchRelay
    var streams: StreamRelay
    var continuing: ContinuingLinks
    /// nil without `relay.readvertise`.
    var readvertising: GatewayReadvertising?
    /// Link failures said in the log so far (one line per failure, not per turn).
    var linkFailuresLogged = 0

    init(fetches: consuming FetchRelay, streams: consuming StreamRelay, continuing: consuming ContinuingLinks,
         readvertising: GatewayReadvertising?) {
        self.fetches = fetches
        self.streams = streams
        self.continuing = continuing
        self.readvertising = readvertising
    }

    /// The last link failure, once: one log line per failure, not per turn.
    mutating func newLinkFailure() -> String? {
        guard fetches.counters.linkFailures != linkFailuresLogged, let error = fetches.lastLinkError else { return nil }
        linkFailuresLogged = fetches.counters.linkFailures
        return error
    }
}

extension Gateway where Radio: ~Copyable {

    /// Every gateway sees every request; exactly one answers it: the device's owner while it
    /// is online, else the online gateway whose id sorts first (for unknown devices, devices
    /// nobody owns this moment, and bad requests).
    mutating func fetchRequested(_ message: MQTTMessage, device: UInt64?, now: Instant) {
        let route: FetchRoute
        let bodyError: WireError?
        switch FetchIntake(message) {
        case .unanswerable(let error):
            // Nowhere to answer: counted by every gateway, answered by none.
            return relays.fetches.dropped(error?.reasonName ?? "fetch-no-response-topic")
        case .request(let r, let e):
            route = r
            bodyError = e
        }
        relays.fetches.supersede(route, mqtt: &broker.mqtt)
        guard room.answers(for: device) else { return }
        // Counted as drops too: a malformed request is the requester's bug (docs/mqtt.md §1).
        if device == nil { relays.fetches.dropped("fetch-topic") } else if let bodyError { relays.fetches.dropped(bodyError.reasonName) }
        switch room.admit(.fetch, device: device, bodyError: bodyError) {
        case .success(let target):
            relays.fetches.fetch(target, route: route, now: now, mqtt: &broker.mqtt)
            logLinkFailures()
        case .failure(let refusal):
            relays.fetches.refuse(refusal, device: device, route: route, mqtt: &broker.mqtt)
        }
    }

    // MARK: titles (docs/relay.md §4.1)

    /// Starts the owed fetches whose time has come, as many as the own slots allow; a device
    /// that is no longer owned, current or reachable owes nothing.
    mutating func fetchTitles(now: Instant) {
        for id in room.publisher.names.due(now: now) {
            guard room.rooms.ownership.owns(id), let a = room.table.activity(deviceID: id), a.state == .current, a.beacon.psm != 0 else {
                room.publisher.names.dropOwed(id)
                continue
            }
            let target = FetchTarget(device: id, sequence: a.beacon.sequence,
                                     link: LinkAddress(address: a.address, addressType: a.addressType, psm: a.beacon.psm))
            if relays.fetches.fetchOwn(target, now: now, mqtt: &broker.mqtt) {
                room.publisher.names.started(id, now: now)
            } else {
                room.publisher.names.couldNotStart(id, now: now)
            }
        }
        logLinkFailures()
    }

    /// The answers to the own fetches: a payload that names more than the message says goes
    /// out at once; a failure leaves the message as it is (counted, backed off).
    mutating func takeTitles(now: Instant) {
        for i in relays.fetches.ownAnswers.indices {
            let answer = relays.fetches.ownAnswers[i]
            let device = Topics.deviceText(answer.device)
            if answer.status != .ok {
                log.debug("device \(device): no title (\(answer.status.name)); the message stays as it is")
            } else if answer.described == nil {
                log.debug("device \(device): its payload is not one this gateway can read (sealed?); not asked again for this type")
            }
            guard room.publisher.names.answered(answer, now: now), room.rooms.ownership.owns(answer.device),
                  let a = room.table.activity(deviceID: answer.device) else { continue }
            log.debug("device \(device): \(answer.described?.title ?? "(no title)") (\(answer.described?.type ?? "?"))")
            room.publisher.described(&broker.mqtt, a)
        }
        relays.fetches.clearOwnAnswers()
    }

    /// An endpoint opens a stream (docs/relay.md §7.2); refusals go back as error frames.
    mutating func streamOpenRequested(_ message: MQTTMessage, device: UInt64?, id: String, now: Instant) {
        // A retained open would reopen the stream at every reconnect.
        guard !message.retained else { return relays.streams.dropped("stream-retained-open") }
        guard room.answers(for: device) else { return }
        relays.streams.open(id: id, topics: room.publisher.topics.stream(id), frame: message.payload,
                            admitted: room.admit(.stream, device: device).map { $0.link }, now: now, mqtt: &broker.mqtt)
    }

    /// One line per link failure, with the last one's reason (a device walking away is news to
    /// whoever debugs a fetch, but not an error of this gateway).
    mutating func logLinkFailures() {
        if let error = relays.newLinkFailure() { log.info("device link: \(error)") }
    }
}
