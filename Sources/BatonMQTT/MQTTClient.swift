// The broker connection: a libmosquitto client driven by the caller's poll() loop
// (architecture.md §5.6, §5.7). docs/broker.md is the user's side of it:
// URL forms, TLS, credentials, v5 and the v3.1.1 fallback, keepalive, will, reconnect.
//
// No libmosquitto thread. The library is used through its "Network loop (for use in other
// event loops)" functions (include/mosquitto.h): the caller polls `socket` for POLLIN, plus
// POLLOUT while `wantsWrite`, with a timeout up to `nextDeadline`, and calls `poll` when the
// socket is ready or the deadline passed. `poll` calls mosquitto_loop_read / _write / _misc,
// then turns what the callbacks recorded (Inbox.swift) into `MQTTEvent`s, then starts the
// next connection attempt when its backoff has run out.

internal import CMosquitto
public import BatonLibc
public import CLibc

/// Which MQTT version to speak (`broker.protocol`).
public enum MQTTProtocol: String, Sendable, Equatable {
    /// MQTT v5 first; MQTT v3.1.1 when the broker refuses v5 (a CONNACK "unsupported protocol
    /// version", or the connection closed before any CONNACK), and from then on.
    case automatic = "auto"
    case v5 = "5"
    case v311 = "3.1.1"
}

/// TLS to the broker. Without `caFile` the broker's certificate must chain to the system's
/// CA store (/etc/ssl/certs). `certFile` and `keyFile` go together (client certificate login);
/// an encrypted key is refused rather than prompted for. `psk` replaces certificates with a
/// pre-shared key (RFC 4279; mosquitto's `psk_file`), for brokers and boards without a CA.
public struct MQTTTLS: Sendable, Equatable {
    public var caFile: String?
    public var certFile: String?
    public var keyFile: String?
    /// Skip the broker's host name check (never the chain check).
    public var insecure: Bool
    public var psk: MQTTPSK?
    public init(caFile: String? = nil, certFile: String? = nil, keyFile: String? = nil, insecure: Bool = false,
                psk: MQTTPSK? = nil) {
        self.caFile = caFile; self.certFile = certFile; self.keyFile = keyFile; self.insecure = insecure; self.psk = psk
    }
}

/// TLS-PSK: an identity and its key, as hex digits (mosquitto_tls_psk_set). The broker's
/// `use_identity_as_username` makes the identity the ACL's user.
public struct MQTTPSK: Sendable, Equatable, CustomStringConvertible {
    public var identity: String
    public var hexKey: String
    public init(identity: String, hexKey: String) { self.identity = identity; self.hexKey = hexKey }
    public var description: String { "MQTTPSK(identity: \(identity), key: redacted)" }
}

/// The last will: the broker publishes it when the connection ends without a DISCONNECT
/// (a crash, a power cut, a lost network; MQTT 5.0 §3.1.2.5). Set before connecting.
public struct MQTTWill: Sendable, Equatable {
    public var topic: String
    public var payload: [UInt8]
    public var qos: Int32
    public var retain: Bool
    public init(topic: String, payload: [UInt8], qos: Int32 = 1, retain: Bool = true) {
        self.topic = topic; self.payload = payload; self.qos = qos; self.retain = retain
    }
}

/// One node of the broker: a host and its port. A broker of several nodes (a cluster whose
/// nodes hold the same retained messages and sessions) is a list of them: `MQTTConfig.nodes`.
public struct MQTTNode: Sendable, Equatable {
    public var host: String
    public var port: Int
    public init(host: String, port: Int) { self.host = host; self.port = port }
}

/// Everything the client connects with. `MQTTClient.init` checks it and says what is wrong.
public struct MQTTConfig: Sendable, Equatable {
    /// The broker's nodes, tried in this order (docs/broker.md "Several nodes"): the first at
    /// start, the next after a failed attempt or a lost connection, wrapping round. Not empty;
    /// at most `maxNodes`. Every node speaks the same TLS (or none) with the same credentials.
    public var nodes: [MQTTNode]
    /// The first node's host (a broker of one node: the broker's).
    public var host: String {
        get { nodes[0].host }
        set { nodes[0].host = newValue }
    }
    public var port: Int {
        get { nodes[0].port }
        set { nodes[0].port = newValue }
    }
    /// The most nodes a client takes: a building's cluster has three or five.
    public static let maxNodes = 16

    /// The nodes as log lines name them: `host:port`, in list order, comma-separated.
    public var nodeList: String {
        var text = ""
        for n in nodes {
            if !text.isEmpty { text += ", " }
            text += n.host.contains(":") ? "[\(n.host)]:\(n.port)" : "\(n.host):\(n.port)"
        }
        return text
    }
    /// nil: plain TCP. `mqtts://` URLs set an empty `MQTTTLS()` (system CA store).
    public var tls: MQTTTLS?
    /// Unique per gateway: the broker disconnects the older of two clients with the same id.
    public var clientID: String
    public var username: String?
    public var password: String?
    /// Seconds: 0 (off) or 5…65535 (libmosquitto's range). Also bounds how long an attempt
    /// may wait for its CONNACK.
    public var keepalive: Int
    public var will: MQTTWill?
    public var protocolVersion: MQTTProtocol
    /// Reconnect backoff: doubles from `reconnectMin` to `reconnectMax`, with full jitter.
    public var reconnectMin: Duration
    public var reconnectMax: Duration
    /// The highest QoS this client publishes, subscribes and sets its will at: a publish or
    /// subscription asked at more goes at this. 1 (the default) changes nothing Baton asks;
    /// 0 is for a broker whose QoS 1 waits on a replicated store (a NATS cluster, whose
    /// QoS 1 messages and subscriptions are JetStream requests that stall while a dead node's
    /// leaderships are elected anew: docs/broker.md "A broker that can die").
    public var maxQoS: Int32 = 1

    public init(host: String = "127.0.0.1", port: Int = 1883, tls: MQTTTLS? = nil, clientID: String,
                username: String? = nil, password: String? = nil, keepalive: Int = 30, will: MQTTWill? = nil,
                protocolVersion: MQTTProtocol = .automatic,
                reconnectMin: Duration = .milliseconds(250), reconnectMax: Duration = .seconds(30),
                otherNodes: [MQTTNode] = []) {
        self.nodes = [MQTTNode(host: host, port: port)] + otherNodes
        self.tls = tls; self.clientID = clientID
        self.username = username; self.password = password; self.keepalive = keepalive; self.will = will
        self.protocolVersion = protocolVersion; self.reconnectMin = reconnectMin; self.reconnectMax = reconnectMax
    }
}

/// MQTT v5 properties of a message (MQTT 5.0 §3.3.2.3). On an MQTT v3.1.1 connection there is
/// nowhere to put them: `publish` drops them silently and received messages have none.
public struct MQTTProperties: Sendable, Equatable {
    public var messageExpiry: UInt32?
    public var contentType: String?
    public var responseTopic: String?
    public var correlationData: [UInt8]?
    public var userProperties: [MQTTUserProperty]
    public init(messageExpiry: UInt32? = nil, contentType: String? = nil, responseTopic: String? = nil,
                correlationData: [UInt8]? = nil, userProperties: [MQTTUserProperty] = []) {
        self.messageExpiry = messageExpiry; self.contentType = contentType; self.responseTopic = responseTopic
        self.correlationData = correlationData; self.userProperties = userProperties
    }
}

public struct MQTTUserProperty: Sendable, Equatable {
    public var name: String
    public var value: String
    public init(_ name: String, _ value: String) { self.name = name; self.value = value }
}

/// A received PUBLISH, copied out of the library (incoming messages are not the hot path).
public struct MQTTMessage: Sendable, Equatable {
    public var topic: String
    public var payload: [UInt8]
    public var qos: Int32
    /// The broker sent it from its retained store (it was retained before we subscribed), or,
    /// on a subscription made with `retainAsPublished` over MQTT v5, it was published retained.
    public var retained: Bool
    public var properties: MQTTProperties

    public init(topic: String, payload: [UInt8], qos: Int32 = 0, retained: Bool = false,
                properties: MQTTProperties = MQTTProperties()) {
        self.topic = topic; self.payload = payload; self.qos = qos; self.retained = retained
        self.properties = properties
    }
}

/// What `poll` reports. The texts are written for the log (docs/broker.md shows them).
public enum MQTTEvent: Sendable, Equatable {
    /// CONNACK accepted; publish birth and owned state now.
    case connected(protocolVersion: MQTTProtocol, sessionPresent: Bool)
    /// CONNACK refused (bad credentials, not authorised…): the text says why; retried with backoff.
    case refused(reason: String)
    /// The connection ended; `reason` says why; retried with backoff.
    case disconnected(reason: String)
    case message(MQTTMessage)
}

/// Why a call failed. The description is what the user reads.
public enum MQTTError: Error, Sendable, Equatable, CustomStringConvertible {
    /// A MOSQ_ERR_* code from libmosquitto, with its text (mosquitto_strerror) and what we were doing.
    case library(code: Int32, operation: String, text: String)
    /// `publish`/`subscribe` while no connection is up (MOSQ_ERR_NO_CONN maps here too).
    case notConnected
    /// A broker URL that does not parse; the text quotes it and says what to write.
    case invalidURL(String)
    /// A setting (or publish argument) MQTT or libmosquitto would reject; the text names it.
    case invalidConfiguration(String)

    public var description: String {
        switch self {
        case .library(let code, let operation, let text):
            "\(operation) failed: \(text) (libmosquitto error \(code))"
        case .notConnected:
            "not connected to the MQTT broker"
        case .invalidURL(let why):
            "invalid broker URL: \(why)"
        case .invalidConfiguration(let why):
            why
        }
    }
}

/// One count per event `poll` delivered, plus publishes the library accepted.
public struct MQTTCounters: Sendable, Equatable {
    public var connects = 0
    public var refusals = 0
    public var disconnects = 0
    public var published = 0
    public var received = 0
    public init() {}
}

/// mosquitto_lib_init once per process, before the first client (it seeds the library's
/// random source and initialises OpenSSL). A global `let` is initialised exactly once, on
/// first use, even with several threads. Never cleaned up: the process owns it to the end.
private let libraryInitResult: Int32 = mosquitto_lib_init()

/// A libmosquitto client driven by the caller's poll() loop: no libmosquitto thread.
///
/// The single owner of the `mosquitto *` (architecture.md §5.6): `~Copyable`, destroyed in
/// `deinit`. Dropping a client without `disconnect()` closes its socket without DISCONNECT,
/// so the broker publishes the will, as it would after a crash.
public struct MQTTClient: ~Copyable {
    private enum Phase: Equatable {
        /// Created, `start` not called yet.
        case idle
        /// A socket exists and CONNECT is sent or queued; no CONNACK yet.
        case connecting
        /// CONNACK accepted.
        case connected
        /// The last attempt failed or the connection ended; the next attempt is due `until`.
        case waiting(until: Instant)
        /// `disconnect()` was called; `start` connects again.
        case stopped
    }

    private let handle: OpaquePointer
    private let inbox: MQTTInbox
    private let config: MQTTConfig
    /// The node (an index into `config.nodes`) the current or next attempt goes to.
    private var node = 0
    /// Attempts failed (or connections lost) since the last CONNACK that accepted us, counted
    /// up to the number of nodes: the backoff's ceiling doubles once every node has failed, not
    /// at each node, so a dead node costs the next one no longer wait (docs/broker.md "Several
    /// nodes").
    private var failuresInRound = 0
    private var phase = Phase.idle
    /// The version the current or next attempt speaks: `.v5` or `.v311`, never `.automatic`.
    /// With `.automatic` it starts at `.v5`; see `versionSettled` and `absorb` for when it moves.
    private var attemptVersion: MQTTProtocol
    /// The broker has answered a CONNECT of `attemptVersion` with a CONNACK (any CONNACK), or
    /// the version was forced: no more switching. Until then, with `.automatic`, a connection
    /// closed before its CONNACK switches the next attempt to the other version.
    private var versionSettled: Bool
    private var backoff: Backoff
    /// The node whose host, port and keepalive mosquitto_connect_async has stored: attempts to
    /// it use mosquitto_reconnect_async; an attempt to another node stores that one instead.
    private var storedNode: Int?
    /// poll() has reported the socket of this attempt writable: its TCP connect finished.
    private var connectWritable = false
    /// `disconnect()` sent DISCONNECT: the close that follows is ours, reported once.
    private var cleanCloseExpected = false
    private var nextMisc: Instant
    private var lastNow: Instant
    private var stats = MQTTCounters()

    /// How often mosquitto_loop_misc runs while a socket is open: it sends PINGREQ when the
    /// keepalive is due and abandons a connection (or an attempt) silent for a keepalive
    /// (lib/util_mosq.c, mosquitto__check_keepalive). include/mosquitto.h: "around once per
    /// second is sufficient".
    private static let miscInterval = Duration.seconds(1)
    /// Where Debian and Raspberry Pi OS keep the system CA store (OpenSSL's default cert dir
    /// links here), for `mqtts://` without a CA file.
    static let systemCAPath = "/etc/ssl/certs"

    /// Checks `config`, creates the libmosquitto client and sets will, credentials and TLS.
    /// Does not connect: `start` does.
    public init(config: MQTTConfig) throws(MQTTError) {
        try Self.check(config)
        if libraryInitResult != MOSQ_ERR_SUCCESS.rawValue {
            throw MQTTError.mosquitto(libraryInitResult, "mosquitto_lib_init", errno: 0)
        }
        let inbox = MQTTInbox()
        let userdata = Unmanaged.passUnretained(inbox).toOpaque()
        // Clean session: the gateway's state lives in retained messages it republishes on
        // every connect, not in a broker session.
        guard let handle = config.clientID.withCString({ mosquitto_new($0, true, userdata) }) else {
            let e = errno
            throw e == EINVAL
                ? .invalidConfiguration("the client id \"\(config.clientID)\" is not valid UTF-8 for MQTT")
                : MQTTError.mosquitto(MOSQ_ERR_ERRNO.rawValue, "mosquitto_new", errno: e)
        }
        do {
            try Self.configure(handle, config)
        } catch {
            mosquitto_destroy(handle)
            throw error
        }
        self.handle = handle
        self.inbox = inbox
        self.config = config
        self.attemptVersion = config.protocolVersion == .v311 ? .v311 : .v5
        self.versionSettled = config.protocolVersion != .automatic
        self.backoff = Backoff(min: config.reconnectMin, max: config.reconnectMax)
        self.nextMisc = .now
        self.lastNow = .now
    }

    /// Callbacks, will, credentials and TLS: everything set once, before the first CONNECT.
    private static func configure(_ handle: OpaquePointer, _ config: MQTTConfig) throws(MQTTError) {
        mosquitto_connect_v5_callback_set(handle, onConnectRecord)
        mosquitto_disconnect_v5_callback_set(handle, onDisconnectRecord)
        mosquitto_message_v5_callback_set(handle, onMessageRecord)
        // Small publishes on change: do not let Nagle hold the second of two back to back.
        _ = mosquitto_int_option(handle, MOSQ_OPT_TCP_NODELAY, 1)

        if let will = config.will {
            let rc = will.topic.withCString { topic in
                will.payload.withUnsafeBytes { payload in
                    mosquitto_will_set_v5(handle, topic, Int32(payload.count), payload.baseAddress, Swift.min(will.qos, config.maxQoS),
                                          will.retain, nil)
                }
            }
            try require(rc, "setting the will on \(will.topic)")
        }
        if let username = config.username {
            let rc = username.withCString { user in
                withOptionalCString(config.password) { mosquitto_username_pw_set(handle, user, $0) }
            }
            try require(rc, "setting the broker username")
        }
        if let tls = config.tls, let psk = tls.psk {
            // libmosquitto: PSK instead of certificates; the ciphers are OpenSSL's PSK defaults.
            let rc = psk.hexKey.withCString { key in
                psk.identity.withCString { identity in mosquitto_tls_psk_set(handle, key, identity, nil) }
            }
            try require(rc, "setting up TLS-PSK")
        } else if let tls = config.tls {
            let rc = withOptionalCString(tls.caFile) { caFile in
                withOptionalCString(tls.caFile == nil ? systemCAPath : nil) { caPath in
                    withOptionalCString(tls.certFile) { certFile in
                        withOptionalCString(tls.keyFile) { keyFile in
                            mosquitto_tls_set(handle, caFile, caPath, certFile, keyFile, noKeyPassword)
                        }
                    }
                }
            }
            try require(rc, "setting up TLS")
            if tls.insecure {
                try require(mosquitto_tls_insecure_set(handle, true), "turning off the TLS host name check")
            }
        }
    }

    deinit {
        // Closes the socket without DISCONNECT (the broker sends the will) and frees every
        // queued packet. The inbox outlives the handle: it is released after this.
        mosquitto_destroy(handle)
    }

    /// The socket to poll, or -1 while not connected (re-read every turn: a reconnect changes it).
    public var socket: Int32 { mosquitto_socket(handle) }

    /// Ask poll() for POLLOUT too. Recomputed after every call into the library (architecture.md §5.7).
    public var wantsWrite: Bool {
        guard mosquitto_socket(handle) >= 0 else { return false }
        // Until this attempt's TCP connect has completed, POLLOUT is how poll() says so.
        // libmosquitto 2.0.11 does not ask for it while a TLS handshake has not started yet.
        return mosquitto_want_write(handle) || (phase == .connecting && !connectWritable)
    }

    /// A CONNACK accepted this connection and it has not ended since.
    public var isConnected: Bool { phase == .connected }

    /// The node the current connection (or the next attempt) goes to, as
    /// `mqtt://host:port`: what the log lines name.
    public var brokerName: String {
        let n = config.nodes[node]
        return "\(config.tls == nil ? "mqtt" : "mqtts")://\(n.host.contains(":") ? "[\(n.host)]" : n.host):\(n.port)"
    }

    /// The version the current connection speaks; nil while not connected.
    public var protocolVersion: MQTTProtocol? { phase == .connected ? attemptVersion : nil }

    /// When `poll` must run even if the socket stays quiet: records waiting to be delivered
    /// (now), the next connection attempt, or the next keepalive check (about once a second
    /// while a socket is open). nil when idle or stopped.
    public var nextDeadline: Instant? {
        if !inbox.records.isEmpty { return lastNow }
        switch phase {
        case .idle, .stopped:
            return mosquitto_socket(handle) >= 0 ? nextMisc : nil
        case .connecting, .connected:
            return nextMisc
        case .waiting(let until):
            return until
        }
    }

    public var counters: MQTTCounters { stats }

    /// Begins connecting (non-blocking); events arrive through `poll`. After `disconnect()` it
    /// connects again, with a fresh backoff; while waiting out a backoff it tries at once.
    /// Does nothing while already connecting or connected.
    ///
    /// A host name is resolved here with getaddrinfo, which blocks until the resolver answers;
    /// an IP address does not block.
    public mutating func start(now: Instant) {
        lastNow = now
        switch phase {
        case .idle, .stopped:
            backoff.reset()
            attempt(now: now)
        case .waiting:
            attempt(now: now)
        case .connecting, .connected:
            break
        }
    }

    /// Reads, writes, keepalive, reconnect when due; delivers what the callbacks recorded.
    ///
    /// `readable`: poll() reported POLLIN, POLLERR or POLLHUP for `socket`; `writable`: POLLOUT.
    /// Both false when only the deadline passed.
    public mutating func poll(now: Instant, readable: Bool, writable: Bool, _ onEvent: (MQTTEvent) -> Void) {
        lastNow = now
        if mosquitto_socket(handle) >= 0 {
            if writable { connectWritable = true }
            // libmosquitto 2.0.11 advances a TLS handshake only in mosquitto_loop_read
            // (lib/loop.c, want_connect); while connecting, a writable socket may be the
            // handshake's turn. On a plain socket this read finds nothing and returns.
            if readable || (writable && phase == .connecting && config.tls != nil) {
                call { mosquitto_loop_read($0, 1) }
            }
            if writable, mosquitto_socket(handle) >= 0 {
                call { mosquitto_loop_write($0, 1) }
            }
            if now >= nextMisc, mosquitto_socket(handle) >= 0 {
                call { mosquitto_loop_misc($0) }
                nextMisc = now + Self.miscInterval
            }
        }
        deliver(now: now, onEvent)
        if case .waiting(let until) = phase, now >= until {
            attempt(now: now)
            deliver(now: now, onEvent)
        }
    }

    /// Publishes now (libmosquitto writes it to the socket within this call when the socket
    /// takes it; the rest goes out as `wantsWrite` asks for POLLOUT). On an MQTT v3.1.1
    /// connection `properties` are dropped: v3.1.1 has no place for them.
    public mutating func publish(topic: String, payload: UnsafeRawBufferPointer, qos: Int32 = 0, retain: Bool = false,
                                 properties: MQTTProperties? = nil) throws(MQTTError) {
        guard phase == .connected else { throw .notConnected }
        try rejectNUL(topic, "the topic \"\(topic)\"")
        // MQTT's Remaining Length tops out at 268,435,455 (MQTT 5.0 §1.5.5); libmosquitto
        // checks the same bound, but its length parameter is an Int32 we must not trap on.
        guard payload.count <= 268_435_455 else {
            throw MQTTError.mosquitto(MOSQ_ERR_PAYLOAD_SIZE.rawValue, "publishing to \(topic)", errno: 0)
        }
        var list: OpaquePointer?
        defer { mosquitto_property_free_all(&list) }
        if attemptVersion == .v5, let properties {
            try properties.add(to: &list)
        }
        let closesBefore = inbox.closes
        let rc = topic.withCString { t in
            mosquitto_publish_v5(handle, nil, t, Int32(payload.count), payload.baseAddress, Swift.min(qos, config.maxQoS), retain, list)
        }
        let saved = errno
        guard rc == MOSQ_ERR_SUCCESS.rawValue else {
            noteClose(rc, saved, closesBefore)
            throw MQTTError.mosquitto(rc, "publishing to \(topic)", errno: saved)
        }
        stats.published += 1
    }

    /// Subscribes on the current connection. The session is clean, so subscriptions end with
    /// the connection: subscribe again on every `.connected`.
    /// `retainAsPublished`: on MQTT v5, messages to this subscription keep the retain flag
    /// they were published with (MQTT 5.0 §3.8.3.1), so `MQTTMessage.retained` says whether a
    /// live message was retained. MQTT 3.1.1 has no such option: there the broker clears the
    /// flag on every message but the retained ones it sends at subscribe (§3.3.1.3), and
    /// libmosquitto would write the option into the QoS byte's reserved bits, so it is not sent.
    /// `sendRetained: false` (MQTT 5 only, Retain Handling 2, §3.8.3.1): the broker sends no
    /// retained messages for this subscription, so a filter subscribed to again (at another QoS)
    /// is not flooded with everything retained under it once more. Under 3.1.1 it is ignored.
    public mutating func subscribe(_ pattern: String, qos: Int32 = 0, retainAsPublished: Bool = false,
                                   sendRetained: Bool = true) throws(MQTTError) {
        guard phase == .connected else { throw .notConnected }
        try rejectNUL(pattern, "the topic filter \"\(pattern)\"")
        let closesBefore = inbox.closes
        var options: Int32 = retainAsPublished && attemptVersion == .v5 ? Int32(MQTT_SUB_OPT_RETAIN_AS_PUBLISHED.rawValue) : 0
        if !sendRetained && attemptVersion == .v5 { options |= Int32(MQTT_SUB_OPT_SEND_RETAIN_NEVER.rawValue) }
        let rc = pattern.withCString { mosquitto_subscribe_v5(handle, nil, $0, Swift.min(qos, config.maxQoS), options, nil) }
        let saved = errno
        guard rc == MOSQ_ERR_SUCCESS.rawValue else {
            noteClose(rc, saved, closesBefore)
            throw MQTTError.mosquitto(rc, "subscribing to \(pattern)", errno: saved)
        }
    }

    public mutating func unsubscribe(_ pattern: String) throws(MQTTError) {
        guard phase == .connected else { throw .notConnected }
        try rejectNUL(pattern, "the topic filter \"\(pattern)\"")
        let closesBefore = inbox.closes
        let rc = pattern.withCString { mosquitto_unsubscribe(handle, nil, $0) }
        let saved = errno
        guard rc == MOSQ_ERR_SUCCESS.rawValue else {
            noteClose(rc, saved, closesBefore)
            throw MQTTError.mosquitto(rc, "unsubscribing from \(pattern)", errno: saved)
        }
    }

    /// A clean DISCONNECT (the broker does not send the will), then flushes what it can.
    ///
    /// This is shutdown, so it may wait: up to one second for the socket to take what is queued
    /// (publishes made just before, then the DISCONNECT). What is still queued after that is
    /// dropped with the socket when the client is destroyed. No reconnect follows; `start`
    /// connects again. The next `poll` reports `.disconnected`.
    public mutating func disconnect() {
        phase = .stopped
        let fd = mosquitto_socket(handle)
        guard fd >= 0 else { return }
        cleanCloseExpected = true
        // Queues DISCONNECT and, in the library's unthreaded mode, writes it at once when it
        // can (lib/packet_mosq.c, packet__queue); writing it closes the socket
        // (do_client_disconnect), which records the close.
        call { mosquitto_disconnect($0) }
        let deadline = Instant.now + .seconds(1)
        while mosquitto_socket(handle) >= 0, mosquitto_want_write(handle) {
            let left = deadline - Instant.now
            guard left > .zero else { break }
            var p = pollfd(fd: mosquitto_socket(handle), events: Int16(POLLOUT), revents: 0)
            let n = CLibc.poll(&p, 1, left.pollMilliseconds())
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            call { mosquitto_loop_write($0, 1) }
        }
    }

    // MARK: - Internals

    /// Calls into the library and makes sure a connection it closed is recorded: libmosquitto
    /// 2.0.11 closes the socket of a failed TLS handshake without calling the disconnect
    /// callback (fixed in later versions, which then call it; either way it is recorded once).
    private func call(_ body: (OpaquePointer) -> Int32) {
        let closesBefore = inbox.closes
        let rc = body(handle)
        noteClose(rc, errno, closesBefore)
    }

    private func noteClose(_ rc: Int32, _ savedErrno: Int32, _ closesBefore: Int) {
        if rc != MOSQ_ERR_SUCCESS.rawValue, inbox.closes == closesBefore, mosquitto_socket(handle) < 0 {
            inbox.closes += 1
            inbox.records.append(.closed(code: rc, errno: savedErrno, attempt: inbox.attempt))
        }
    }

    /// Starts one connection attempt with `attemptVersion`.
    private mutating func attempt(now: Instant) {
        _ = mosquitto_int_option(handle, MOSQ_OPT_PROTOCOL_VERSION, attemptVersion == .v5 ? MQTT_PROTOCOL_V5 : MQTT_PROTOCOL_V311)
        inbox.attempt += 1
        inbox.lastLibraryError = nil
        mosquitto_log_callback_set(handle, onLogRecord)
        connectWritable = false
        let rc: Int32
        if storedNode == node {
            rc = mosquitto_reconnect_async(handle)
        } else {
            let target = config.nodes[node]
            rc = target.host.withCString { mosquitto_connect_async(handle, $0, Int32(target.port), Int32(config.keepalive)) }
        }
        let saved = errno
        // mosquitto_connect_async stores host, port and keepalive before it opens the socket
        // (lib/connect.c, mosquitto__connect_init); only argument errors stop it earlier, and
        // init checked those.
        storedNode = node
        nextMisc = now + Self.miscInterval
        if rc == MOSQ_ERR_SUCCESS.rawValue {
            phase = .connecting
        } else {
            // Said with the node that failed, before the wait moves on to the next one.
            inbox.records.append(.attemptFailed(code: rc, errno: saved, text: attemptFailure(code: rc, errno: saved)))
            phase = .waiting(until: now + nextWait(fatal: MQTTError.isFatal(code: rc, errno: saved),
                                                   absent: MQTTError.isBrokerAbsent(code: rc, errno: saved)))
        }
    }

    /// Turns the recorded facts into state and events, in the order they happened.
    private mutating func deliver(now: Instant, _ onEvent: (MQTTEvent) -> Void) {
        var i = 0
        while i < inbox.records.count {
            let record = inbox.records[i]
            i += 1
            if let event = absorb(record, now: now) {
                switch event {
                case .connected: stats.connects += 1
                case .refused: stats.refusals += 1
                case .disconnected: stats.disconnects += 1
                case .message: stats.received += 1
                }
                onEvent(event)
            }
        }
        inbox.records.removeAll(keepingCapacity: true)
    }

    private mutating func absorb(_ record: MQTTRecord, now: Instant) -> MQTTEvent? {
        switch record {
        case .message(let message):
            return .message(message)

        case .connack(let code, let flags, let attempt):
            guard phase == .connecting, attempt == inbox.attempt else { return nil }
            // MQTT 5.0 §3.2.2.2: 0x84 Unsupported Protocol Version. libmosquitto reports a
            // v3.1.1-style CONNACK 0x01 "unacceptable protocol version" answering our v5
            // CONNECT (what a v3.1.1 broker sends, MQTT 3.1.1 §3.1.2.2) as 0x84 too
            // (lib/handle_connack.c). Unambiguous: switch now, for good, and retry at once.
            if code == 0x84, config.protocolVersion == .automatic, attemptVersion == .v5 {
                attemptVersion = .v311
                versionSettled = true
                phase = .waiting(until: now)
                return .disconnected(reason: "\(brokerName) does not accept MQTT v5 (it answered \"unsupported protocol version\"); using MQTT v3.1.1 from now on")
            }
            versionSettled = true
            if code == 0 {
                phase = .connected
                backoff.reset()
                failuresInRound = 0
                mosquitto_log_callback_set(handle, nil)
                // Connect Acknowledge Flags bit 0: Session Present (MQTT 5.0 §3.2.2.1.1).
                return .connected(protocolVersion: attemptVersion, sessionPresent: flags & 1 != 0)
            }
            let reason = refusalReason(code: code, version: attemptVersion)
            phase = .waiting(until: now + nextWait())
            return .refused(reason: reason)

        case .closed(let code, let savedErrno, let attempt):
            if attempt != inbox.attempt || phase == .stopped {
                // The end of an earlier connection: only ours, after `disconnect()`, is news.
                guard cleanCloseExpected else { return nil }
                cleanCloseExpected = false
                return .disconnected(reason: "disconnected from \(brokerName) (clean DISCONNECT: no will)")
            }
            switch phase {
            case .connected:
                let reason = "lost the connection to \(brokerName): "
                    + connectionReason(code: code, errno: savedErrno, keepalive: config.keepalive, clientID: config.clientID)
                phase = .waiting(until: now + nextWait(fatal: code < 0x80 && MQTTError.isFatal(code: code, errno: savedErrno),
                                                       absent: MQTTError.isBrokerAbsent(code: code, errno: savedErrno)))
                return .disconnected(reason: reason + nextNodeNote)
            case .connecting:
                var note = ""
                // The broker took the connection and closed it without a CONNACK: what some
                // v3.1.1-only brokers do with a v5 CONNECT (MQTT 3.1.1 §3.1.2.2 lets them), but
                // also what a broker does that refuses us at the TLS level or is going down.
                // So it is only a guess, and not made when libmosquitto logged an error on the
                // way (OpenSSL's "alert certificate required", say): the next attempt (after the
                // usual backoff) tries the other version, and the first CONNACK settles it.
                if code == MOSQ_ERR_CONN_LOST.rawValue, !versionSettled, inbox.lastLibraryError == nil {
                    attemptVersion = attemptVersion == .v5 ? .v311 : .v5
                    note = attemptVersion == .v311
                        ? " before answering the MQTT v5 CONNECT; the next attempt tries MQTT v3.1.1"
                        : " before answering the MQTT v3.1.1 CONNECT either; the next attempt goes back to MQTT v5"
                }
                let reason = attemptFailure(code: code, errno: savedErrno, note: note)
                phase = .waiting(until: now + nextWait(fatal: code < 0x80 && MQTTError.isFatal(code: code, errno: savedErrno),
                                                       absent: MQTTError.isBrokerAbsent(code: code, errno: savedErrno)))
                return .disconnected(reason: reason + nextNodeNote)
            case .idle, .waiting, .stopped:
                // Already accounted for: the close that follows a refused CONNACK.
                return nil
            }

        case .attemptFailed(_, _, let text):
            return .disconnected(reason: text + nextNodeNote)
        }
    }

    /// The wait before the next attempt, which goes to the next node when there are several
    /// (in list order, wrapping round). The ceiling doubles only once every node has failed
    /// since the last accepted connection: a node that dies costs the gateway one
    /// `reconnectMin` before it tries the next, however long the list.
    private mutating func nextWait(fatal: Bool = false, absent: Bool = false) -> Duration {
        failuresInRound += 1
        let grow = failuresInRound >= config.nodes.count
        if grow { failuresInRound = 0 }
        node = (node + 1) % config.nodes.count
        return backoff.next(fatal: fatal, absent: absent, grow: grow)
    }

    /// Said after a failure when there is another node to try: where the next attempt goes.
    private var nextNodeNote: String {
        config.nodes.count > 1 ? "; next: \(brokerName)" : ""
    }

    private func attemptFailure(code: Int32, errno savedErrno: Int32, note: String = "") -> String {
        var text = "could not connect to \(brokerName): "
            + connectionReason(code: code, errno: savedErrno, keepalive: config.keepalive, clientID: config.clientID)
        if code == MOSQ_ERR_KEEPALIVE.rawValue { text += " (no CONNACK)" }
        text += note
        if let detail = inbox.lastLibraryError { text += " [libmosquitto: \(detail)]" }
        return text
    }

    private static func require(_ rc: Int32, _ operation: String) throws(MQTTError) {
        if rc != MOSQ_ERR_SUCCESS.rawValue { throw MQTTError.mosquitto(rc, operation, errno: errno) }
    }

    /// Says what is wrong before libmosquitto would answer only "Invalid function arguments".
    private static func check(_ c: MQTTConfig) throws(MQTTError) {
        func bad(_ why: String) -> MQTTError { .invalidConfiguration("broker configuration: \(why)") }
        if c.nodes.isEmpty { throw bad("no broker node") }
        if c.nodes.count > MQTTConfig.maxNodes {
            throw bad("\(c.nodes.count) broker nodes; at most \(MQTTConfig.maxNodes)")
        }
        for n in c.nodes {
            if n.host.isEmpty { throw bad("no broker host") }
            if !(1...65535).contains(n.port) { throw bad("port \(n.port) is not from 1 to 65535") }
            try rejectNUL(n.host, "the broker host")
        }
        if c.clientID.isEmpty { throw bad("the client id is empty") }
        // MQTT strings are at most 65535 bytes (MQTT 5.0 §1.5.4).
        if c.clientID.utf8.count > 65535 { throw bad("the client id is longer than 65535 bytes") }
        try rejectNUL(c.clientID, "the client id")
        if c.keepalive != 0 && !(5...65535).contains(c.keepalive) {
            throw bad("keepalive \(c.keepalive) s: use 0 (off) or 5 to 65535 seconds")
        }
        if !(0...2).contains(c.maxQoS) { throw bad("maxQoS \(c.maxQoS) is not 0, 1 or 2") }
        if c.reconnectMin <= .zero { throw bad("reconnectMin must be more than zero, got \(c.reconnectMin.secondsDescription)") }
        if c.reconnectMax < c.reconnectMin {
            throw bad("reconnectMax (\(c.reconnectMax.secondsDescription)) is less than reconnectMin (\(c.reconnectMin.secondsDescription))")
        }
        if c.reconnectMax > .seconds(86_400) { throw bad("reconnectMax is more than a day (\(c.reconnectMax.secondsDescription))") }
        if c.password != nil && c.username == nil { throw bad("a password without a username; set broker.username too") }
        if let u = c.username { try rejectNUL(u, "the username") }
        if let p = c.password { try rejectNUL(p, "the password") }
        if let w = c.will {
            if w.topic.isEmpty || w.topic.contains("+") || w.topic.contains("#") {
                throw bad("the will topic \"\(w.topic)\" must be a plain topic (no wildcards, not empty)")
            }
            try rejectNUL(w.topic, "the will topic")
            if !(0...2).contains(w.qos) { throw bad("will QoS \(w.qos) is not 0, 1 or 2") }
            if w.payload.count > 268_435_455 { throw bad("the will payload is larger than MQTT allows") }
        }
        if let tls = c.tls, let psk = tls.psk {
            if tls.caFile != nil || tls.certFile != nil || tls.keyFile != nil {
                throw bad("TLS-PSK and certificates do not go together: give a pre-shared key or certificate files")
            }
            if psk.identity.isEmpty { throw bad("a TLS-PSK identity must not be empty") }
            try rejectNUL(psk.identity, "the TLS-PSK identity")
            if !Self.isPSKHex(psk.hexKey) { throw bad("a TLS-PSK key is 2 to 128 hex digits, an even number of them") }
        }
        if let tls = c.tls {
            if (tls.certFile == nil) != (tls.keyFile == nil) {
                throw bad("a TLS client certificate needs both the certificate file and its key file")
            }
            for (what, path) in [("CA file", tls.caFile), ("client certificate", tls.certFile), ("client key", tls.keyFile)] {
                guard let path else { continue }
                if access(path, R_OK) != 0 {
                    let e = errno
                    throw bad("TLS \(what) \(path): \(String(cString: strerror(e)))")
                }
            }
        }
    }
}

extension MQTTClient {
    /// 1 to 64 bytes as hex digits: what mosquitto_tls_psk_set takes (and `psk_file` holds).
    public static func isPSKHex(_ s: String) -> Bool {
        (2...128).contains(s.utf8.count) && s.utf8.count % 2 == 0 && s.utf8.allSatisfy {
            (0x30...0x39).contains($0) || (0x41...0x46).contains($0) || (0x61...0x66).contains($0)
        }
    }
}

/// Runs `body` with a C string for `s`, or with NULL when `s` is nil.
private func withOptionalCString<R>(_ s: String?, _ body: (UnsafePointer<CChar>?) -> R) -> R {
    if let s { s.withCString { body($0) } } else { body(nil) }
}

/// A part of a poll loop (BatonLibc's `PollLoop`, docs/architecture.md "The loop"): its socket,
/// with POLLOUT only while libmosquitto has something to write, and its next deadline. The
/// loop calls `poll(now:readable:writable:_:)` every turn, ready or not, so keepalives and
/// reconnects run on time.
extension MQTTClient: LoopPart {
    public mutating func pollDescriptors(into fds: inout [pollfd]) {
        fds.append(pollfd(fd: socket, events: Int16(POLLIN) | (wantsWrite ? Int16(POLLOUT) : 0), revents: 0))
    }
    /// The broker's socket (negative while not connected, which poll(2) skips).
    public var descriptorLimit: Int { 1 }

    /// Reads and writes what `ready` (this client's descriptor, after poll()) says is ready.
    public mutating func poll(now: Instant, ready: ArraySlice<pollfd>, _ onEvent: (MQTTEvent) -> Void) {
        let revents = ready.first?.revents ?? 0
        poll(now: now, readable: revents & Int16(POLLIN | POLLHUP | POLLERR) != 0,
             writable: revents & Int16(POLLOUT) != 0, onEvent)
    }
}
