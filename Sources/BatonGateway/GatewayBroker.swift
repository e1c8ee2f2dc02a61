// The loop's broker part: the one MQTT connection of the gateway (docs/broker.md). The
// gateway owns it; the retained-state keeper (Publisher) and the relays are handed it when
// they publish. Every message the broker sends is dispatched here by what its topic is
// (`Topics.classify`, docs/mqtt.md).
import BatonLibc
import BatonCore
import BatonHCI
import BatonMQTT
import BatonRelay
import BatonWire
import CLibc

struct GatewayBroker: ~Copyable {
    var mqtt: MQTTClient
    /// What one poll delivered, handled after it (the handlers publish on `mqtt`).
    var events: [MQTTEvent]
    /// While the broker refuses connections the gateway retries every second (docs/broker.md
    /// "Reconnect"): the same failure is said once a minute, with the count of those not said.
    /// A broker of several nodes is tried round its list, and each reason names its node, so
    /// the failures said are remembered one per node at most (`MQTTConfig.maxNodes`).
    var failuresSaid: [(reason: String, at: Instant)]
    var failuresUnsaid = 0
    /// Messages the broker delivered to this gateway (stats `broker.messages_received`): what
    /// the building's layout costs each gateway (docs/rooms.md §8).
    var messagesReceived = 0
    /// How long the broker waits for a packet before it gives a client up: 1.5 × keepalive
    /// (MQTT 5.0 §3.1.2.10, mosquitto the same); nil with keepalive 0 (off).
    let givesUpAfter: Duration?
    /// When the loop last woke: while connected it wakes about once a second (libmosquitto's
    /// keepalive check), so a longer gap is a loop that stood still.
    var lastWake: Instant?
    /// Two clients with one client id take the connection from each other: the broker closes
    /// the older at every connect of the newer (MQTT 5.0 §3.1.4 step 2), and mosquitto 2.0.11
    /// says so with no reason code (no 0x8E, Session taken over). So connections the broker
    /// closes within `shortConnection` of their CONNACK are counted, one that lasts resets
    /// the count, and from `collisionAfter` on the gateway says what is most likely wrong,
    /// naming the id and the fix, once a minute (docs/broker.md "Two gateways, one id").
    var connectedAt: Instant?
    var shortConnections = 0
    var collisionSaidAt: Instant?
    let clientID: String
    let gatewayID: String
    static let shortConnection: Duration = .seconds(5)
    static let collisionAfter = 3

    init(mqtt: consuming MQTTClient, config: GatewayConfig) {
        self.mqtt = mqtt
        self.events = []
        self.events.reserveCapacity(64)
        self.failuresSaid = []
        self.failuresSaid.reserveCapacity(MQTTConfig.maxNodes)
        self.givesUpAfter = config.broker.keepalive > 0 ? .milliseconds(config.broker.keepalive * 1500) : nil
        self.clientID = config.broker.clientID
        self.gatewayID = config.gatewayID
    }

    /// The gap since the loop last woke, if the connection was up and the gap is as long as
    /// the broker waits before it gives a silent client up: it has then closed the connection
    /// and sent this gateway's will, whatever the socket still holds (a frozen or starved
    /// machine, SIGSTOP, a suspended VM).
    mutating func stoodStill(now: Instant) -> Duration? {
        defer { lastWake = now }
        guard let last = lastWake, let limit = givesUpAfter, mqtt.isConnected, now - last >= limit else { return nil }
        return now - last
    }

    /// Reads and writes what is ready, and keeps libmosquitto's timers.
    mutating func serve(ready: ArraySlice<pollfd>, now: Instant) {
        mqtt.poll(now: now, ready: ready) { events.append($0) }
    }

    mutating func connected(now: Instant, log: Logger) {
        if failuresUnsaid > 0 { log.info("\(failuresUnsaid) more failed attempts before this connect") }
        failuresSaid.removeAll(keepingCapacity: true)
        failuresUnsaid = 0
        connectedAt = now
    }

    mutating func lost(_ reason: String, now: Instant, log: Logger) {
        if let since = connectedAt {
            shortConnections = now - since < Self.shortConnection ? shortConnections &+ 1 : 0
            connectedAt = nil
        }
        if shortConnections >= Self.collisionAfter, collisionSaidAt.map({ now - $0 >= .seconds(60) }) ?? true {
            collisionSaidAt = now
            log.error("the broker closed the connection \(shortConnections) times in a row within \(Self.shortConnection.components.seconds) s of connecting: most likely another client uses the client id \(clientID) (two gateways with gateway.id \(gatewayID), the host name by default?). Give each gateway its own gateway.id (or broker.client-id) in /etc/baton/baton.yaml or with --id (docs/broker.md)")
        }
        let known = failuresSaid.firstIndex { $0.reason == reason }
        if let i = known, now - failuresSaid[i].at < .seconds(60) {
            failuresUnsaid &+= 1
            log.debug("broker connection lost: \(reason)")
            return
        }
        let unsaid = failuresUnsaid > 0 ? " (and \(failuresUnsaid) attempts since the last line)" : ""
        log.warning("broker connection lost: \(reason); reconnecting with backoff\(unsaid)")
        failuresUnsaid = 0
        if let i = known {
            failuresSaid[i].at = now
        } else if failuresSaid.count < MQTTConfig.maxNodes {
            failuresSaid.append((reason, now))
        } else if let oldest = failuresSaid.indices.min(by: { failuresSaid[$0].at < failuresSaid[$1].at }) {
            failuresSaid[oldest] = (reason, now)
        }
    }

    /// Status `offline` has been published: read what the broker still sends (the acks, our
    /// own `offline` coming back) until it has been quiet for 50 ms, at most 500 ms, then a
    /// clean DISCONNECT. A socket closed with unread bytes sends a reset instead of a FIN, and
    /// the reset can destroy the DISCONNECT on its way, so the broker would see an unclean close.
    mutating func drainAndDisconnect() {
        let end = Instant.now + .milliseconds(500)
        while Instant.now < end, mqtt.isConnected {
            let wantsWrite = mqtt.wantsWrite
            var p = pollfd(fd: mqtt.socket, events: Int16(POLLIN) | (wantsWrite ? Int16(POLLOUT) : 0), revents: 0)
            let n = CLibc.poll(&p, 1, 50)
            if n < 0, errno == EINTR { continue }
            if n <= 0 { if wantsWrite { continue } else { break } }
            mqtt.poll(now: Instant.now, readable: p.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0,
                      writable: p.revents & Int16(POLLOUT) != 0) { _ in }
        }
        mqtt.disconnect()
    }
}

extension GatewayBroker: LoopPart {
    mutating func pollDescriptors(into fds: inout [pollfd]) { mqtt.pollDescriptors(into: &fds) }
    var descriptorLimit: Int { mqtt.descriptorLimit }

    var nextDeadline: Instant? { mqtt.nextDeadline }
}

extension Gateway where Radio: ~Copyable {
    /// The loop stood still past the broker's patience (`GatewayBroker.stoodStill`): the broker
    /// has given this gateway up, and the building has moved its devices to the rooms standing
    /// in for it (docs/rooms.md §7 rule 4). It leaves the rooms before it reads anything the
    /// stall left queued (old sightings and reports, all stamped now) and connects again at
    /// once with a new client: the old one is dropped unread and without a DISCONNECT, so the
    /// broker sends the will now if it had not yet, and nothing of the old session is resent
    /// (libmosquitto resends the QoS 1 publishes the broker had not acknowledged after the
    /// next CONNACK, even on a clean session: a gateway frozen just after its start resent the
    /// first activities of its room over the rooms standing in for it). At the rejoin it holds
    /// back what it owned until the broker's retained activities say who holds it.
    mutating func brokerGaveUp(after gap: Duration, now: Instant) {
        log.warning("this gateway stood still for \(gap.components.seconds) s, past the broker's keepalive (1.5 × \(config.broker.keepalive) s): the broker has given it up and sent its will; connecting again")
        room.rooms.ownership.dropped(now: now)
        do throws(MQTTError) {
            var fresh = try MQTTClient(config: GatewayLauncher.mqttConfig(config))
            fresh.start(now: now)
            broker.mqtt = fresh
        } catch {
            // The config made a client at start; should it fail now, the old one goes on and
            // finds the dead connection itself.
            log.error("a new broker client could not be made (\(error)); the old connection is left to fail")
        }
    }

    mutating func handleBrokerEvents(now: Instant) {
        for event in broker.events {
            switch event {
            case .connected(let version, _):
                broker.connected(now: now, log: log)
                log.info("connected to the broker \(broker.mqtt.brokerName) (MQTT \(version.rawValue)); publishing status and \(room.table.count) activities")
                room.connected(now: now, mqtt: &broker.mqtt)
                upkeep.statusCheck.connected(now: now)
                publishStats(now: now)
                room.sendAllSightings(now: now, mqtt: &broker.mqtt)
                relays.streams.reconnected(now: now, mqtt: &broker.mqtt)
                relays.readvertising?.readvertiser?.reconnected()
            case .refused(let reason):
                log.error("\(reason)")
            case .disconnected(let reason):
                broker.lost(reason, now: now, log: log)
                upkeep.statusCheck.disconnected()
                // Until the next connect nothing arrives, this gateway's own sightings
                // included: their going stale is the outage's, not the devices' (docs/rooms.md §7).
                room.rooms.ownership.leave(now: now)
            case .message(let message):
                broker.messagesReceived &+= 1
                received(message, now: now)
            }
        }
        broker.events.removeAll(keepingCapacity: true)
    }

    /// What the status check says to do: ask the broker for the own retained status, stop
    /// asking, or say `online` again (docs/broker.md "A status the broker did not keep").
    mutating func statusChecked(_ step: StatusCheck.Step) {
        do throws(MQTTError) {
            switch step {
            case .ask: try room.publisher.subscriptions.ownStatus(asking: true, &broker.mqtt)
            case .kept, .republish: try room.publisher.subscriptions.ownStatus(asking: false, &broker.mqtt)
            }
        } catch {
            // The connection is going: the next connect starts the check over.
            log.debug("the status check's (un)subscribe failed: \(error)")
            return
        }
        guard case .republish(let kept) = step else { return }
        let what = kept.map { "'\($0)'" } ?? "nothing"
        if upkeep.statusCheck.republishedThisConnection == 1 {
            log.warning("the broker did not keep this gateway's status (it holds \(what) at \(room.publisher.topics.status), not 'online'): saying 'online' again (until a broker keeps it, a Home Assistant or gateway that starts reads this gateway as unavailable)")
        } else {
            log.debug("the broker still does not keep this gateway's status (\(what)): saying 'online' again")
        }
        room.publisher.republishBirth(&broker.mqtt)
    }

    /// Every message the broker sends, by what its topic says it is (`Topics.classify`).
    mutating func received(_ message: MQTTMessage, now: Instant) {
        switch room.publisher.topics.classify(message.topic) {
        case .status(let gateway):
            // Our own, retained: the broker's answer to the status check (docs/broker.md).
            if gateway == config.gatewayID, message.retained, let step = upkeep.statusCheck.retained(message.payload, now: now) {
                statusChecked(step)
            }
            if let gone = room.statusReceived(message, gateway: gateway, now: now, mqtt: &broker.mqtt) {
                // Its activities are nobody's to continue now (docs/relay.md §9).
                relays.readvertising?.ownerOffline(gone.id)
                if gone.tellStreams { relays.streams.gatewayWentOffline(gone.id, topics: room.publisher.topics, mqtt: &broker.mqtt) }
            }
        case .sighting(let gateway, let device):
            room.sightingReceived(message, gateway: gateway, device: device, now: now, mqtt: &broker.mqtt)
        case .malformedSighting:
            // Under the sightings but not `<gateway>/<12 hex digits>`.
            room.rooms.drops.count("sighting-topic")
        case .fetch(let device):
            fetchRequested(message, device: device, now: now)
        case .streamOpen(let device, let id):
            streamOpenRequested(message, device: device, id: id, now: now)
        case .streamUp(let id):
            if !relays.streams.fromBroker(id: id, .up, message.payload, now: now, mqtt: &broker.mqtt) {
                relays.streams.dropped("stream-unknown")
            }
        case .streamDown(let id):
            // The carrier's frames of a stream this gateway bridges for a phone (§7.5).
            if !relays.streams.fromBroker(id: id, .down, message.payload, now: now, mqtt: &broker.mqtt) {
                relays.streams.dropped("stream-unknown")
            }
        case .streamCarrier(let id):
            // MQTT 3.1.1 clears the retain flag of live messages: there it says nothing (§7.3).
            let retained = broker.mqtt.protocolVersion == .v5 ? message.retained : nil
            if let full = relays.streams.carried(stream: id, payload: message.payload, retained: retained,
                                                 isOnline: { room.rooms.ownership.isOnline(gateway: $0) }, now: now) {
                log.warning("\(full)")
            }
        case .malformedStream:
            // Under the stream topics, but no stream id of docs/relay.md §7.1.
            relays.streams.dropped("stream-topic")
        case .answer(let link):
            // Subscribed to only while re-advertising (docs/relay.md §9).
            guard relays.readvertising?.readvertiser != nil else { return }
            relays.continuing.answered(message, link: link, now: now)
        case .activity(let device):
            room.activityReceived(message, device: device, now: now, mqtt: &broker.mqtt)
            relays.readvertising?.activity(device: device, payload: message.payload,
                                           isOnline: { room.rooms.ownership.isOnline(gateway: Substring($0)) })
            room.retainedReceived(message, on: .activity(device), now: now, mqtt: &broker.mqtt)
        case .apple(let id):
            room.retainedReceived(message, on: .apple(id), now: now, mqtt: &broker.mqtt)
        case .batch(let topic):
            room.batchReceived(message, topic: topic, now: now, mqtt: &broker.mqtt)
        case .continued, .unknown:
            // Not subscribed to, or not ours to read.
            break
        }
    }
}
