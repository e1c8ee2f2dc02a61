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
            return relay.dropped(error?.reasonName ?? "fetch-no-response-topic")
        case .request(let r, let e):
            route = r
            bodyError = e
        }
        relay.supersede(route, mqtt: &broker.mqtt)
        guard answers(for: device) else { return }
        // Counted as drops too: a malformed request is the requester's bug (docs/mqtt.md §1).
        if device == nil { relay.dropped("fetch-topic") } else if let bodyError { relay.dropped(bodyError.reasonName) }
        switch admit(.fetch, device: device, bodyError: bodyError) {
        case .success(let target):
            relay.fetch(target, route: route, now: now, mqtt: &broker.mqtt)
            logLinkFailures()
        case .failure(let refusal):
            relay.refuse(refusal, device: device, route: route, mqtt: &broker.mqtt)
        }
    }

    /// The one admission check of fetches and streams (docs/relay.md §4 "Admission"), from
    /// what this gateway knows of the device: the rooms rule and the activity table.
    func admit(_ kind: RequestKind, device: UInt64?, bodyError: WireError? = nil) -> Result<FetchTarget, Refusal> {
        var activity: AdmittedActivity?
        if let device, let a = room.table.activity(deviceID: device), a.state == .current {
            activity = AdmittedActivity(address: a.address, addressType: a.addressType, psm: a.beacon.psm,
                                        sequence: a.beacon.sequence, supportsStreams: a.beacon.flags.contains(.supportsStreams))
        }
        return Admission.check(kind, device: device, bodyError: bodyError,
                               owns: device.map { room.rooms.ownership.owns($0) } ?? false,
                               follows: device.map { room.rooms.ownership.follows($0) } ?? false, activity: activity)
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
            if relay.fetchOwn(target, now: now, mqtt: &broker.mqtt) {
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
        for i in relay.ownAnswers.indices {
            let answer = relay.ownAnswers[i]
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
        relay.clearOwnAnswers()
    }

    /// The one gateway that answers a request about `device` (docs/relay.md §4): its owner
    /// while online, else the online gateway whose id sorts first. With neighbourhoods the
    /// rule here follows only the devices around this room (docs/rooms.md §8.3): a device it
    /// has no online owner for may have one at the far end of the building, the gateway its
    /// activity topic names, and then that one answers, not the first.
    func answers(for device: UInt64?) -> Bool {
        var answerer = room.rooms.ownership.firstOnline
        if let device {
            if let owner = room.rooms.ownership.owner(of: device), room.rooms.ownership.isOnline(owner) {
                answerer = owner
            } else if let publisher = room.rooms.publishers.publisher(of: device), room.rooms.ownership.isOnline(publisher) {
                answerer = publisher
            }
        }
        return answerer == room.rooms.ownership.selfSlot
    }

    /// An endpoint opens a stream (docs/relay.md §7.2); refusals go back as error frames.
    mutating func streamOpenRequested(_ message: MQTTMessage, device: UInt64?, id: String, now: Instant) {
        // A retained open would reopen the stream at every reconnect.
        guard !message.retained else { return streams.dropped("stream-retained-open") }
        guard answers(for: device) else { return }
        streams.open(id: id, topics: room.publisher.topics.stream(id), frame: message.payload,
                     admitted: admit(.stream, device: device).map { $0.link }, now: now, mqtt: &broker.mqtt)
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
}
