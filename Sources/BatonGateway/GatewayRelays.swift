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

        guard let device else {
            relay.dropped("fetch-topic")
            return relay.answer(.badRequest, device: nil, detail: "the topic's last level must be a device id: 12 lowercase hex digits",
                                route: route, mqtt: &broker.mqtt)
        }
        if let bodyError {
            relay.dropped(bodyError.reasonName)
            return relay.answer(.badRequest, device: device, detail: "the request body: \(bodyError)", route: route,
                                mqtt: &broker.mqtt)
        }
        guard rooms.ownership.owns(device) else {
            if rooms.ownership.follows(device) {
                return relay.answer(.notOwner, device: device,
                                    detail: "no gateway owns this device at the moment (it just arrived, or its gateway went offline); ask again in a second",
                                    route: route, mqtt: &broker.mqtt)
            }
            return relay.answer(.unknownDevice, device: device, detail: "no gateway of this building hears this device",
                                route: route, mqtt: &broker.mqtt)
        }
        guard let a = table.activity(deviceID: device), a.state == .current else {
            return relay.answer(.unknownDevice, device: device, detail: "the device has no current activity",
                                route: route, mqtt: &broker.mqtt)
        }
        guard a.beacon.psm != 0 else {
            return relay.answer(.unreachable, device: device, detail: "the device offers no link (PSM 0 in its beacon)",
                                route: route, mqtt: &broker.mqtt)
        }
        let target = FetchTarget(device: device, sequence: a.beacon.sequence,
                                 link: LinkAddress(address: a.address, addressType: a.addressType, psm: a.beacon.psm))
        relay.fetch(target, route: route, now: now, mqtt: &broker.mqtt)
        logLinkFailures()
    }

    // MARK: titles (docs/relay.md §4.1)

    /// Starts the owed fetches whose time has come, as many as the own slots allow; a device
    /// that is no longer owned, current or reachable owes nothing.
    mutating func fetchTitles(now: Instant) {
        for id in publisher.names.due(now: now) {
            guard rooms.ownership.owns(id), let a = table.activity(deviceID: id), a.state == .current, a.beacon.psm != 0 else {
                publisher.names.dropOwed(id)
                continue
            }
            let target = FetchTarget(device: id, sequence: a.beacon.sequence,
                                     link: LinkAddress(address: a.address, addressType: a.addressType, psm: a.beacon.psm))
            if relay.fetchOwn(target, now: now, mqtt: &broker.mqtt) {
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
            guard publisher.names.answered(answer, now: now), rooms.ownership.owns(answer.device),
                  let a = table.activity(deviceID: answer.device) else { continue }
            log.debug("device \(device): \(answer.described?.title ?? "(no title)") (\(answer.described?.type ?? "?"))")
            publisher.described(&broker.mqtt, a)
        }
        relay.clearOwnAnswers()
    }

    /// The one gateway that answers a request about `device` (docs/relay.md §4): its owner
    /// while online, else the online gateway whose id sorts first.
    func answers(for device: UInt64?) -> Bool {
        var answerer = rooms.ownership.firstOnline
        if let device, let owner = rooms.ownership.owner(of: device), rooms.ownership.isOnline(owner) { answerer = owner }
        return answerer == rooms.ownership.selfSlot
    }

    /// An endpoint opens a stream (docs/relay.md §7.2); refusals go back as error frames.
    mutating func streamOpenRequested(_ message: MQTTMessage, device: UInt64?, id: String, now: Instant) {
        // A retained open would reopen the stream at every reconnect.
        guard !message.retained else { return streams.dropped("stream-retained-open") }
        guard answers(for: device) else { return }
        var target: LinkAddress?
        var refusal: String?
        if let device {
            if !rooms.ownership.owns(device) {
                refusal = rooms.ownership.follows(device)
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
                     refusal: refusal, now: now, mqtt: &broker.mqtt)
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
