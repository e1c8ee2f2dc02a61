// The ESPHome native API server of a gateway: Home Assistant's Bluetooth proxy protocol, passive
// scanning with raw advertisements (docs/esphome.md). One part of the gateway's loop
// (`LoopPart`): a listening TCP socket and a fixed number of client slots, non-blocking.
//
// Memory: every buffer is allocated once at start: per slot a receive buffer and a send buffer,
// and one batch of up to 16 encoded advertisements that every subscribed client is sent.
// `heard` appends to the batch and `flush` frames it into each subscriber's send buffer
// (encrypting in place for Noise) and writes what the sockets take: no allocation per
// advertisement or per batch. The handshake allocates; it happens once per connection.
//
// Bad clients are disconnected with a log line and counted on the stats topic: a wrong key
// (Noise "Handshake MAC failure"), frames that do not decode, a client that stops reading
// (its send buffer full for `stallTimeout`), one that goes quiet for `idleTimeout`, one that
// does not finish the handshake within `handshakeTimeout`. The rest of the loop never waits
// for any of them.
import BatonLibc
import BatonWire
import CLibc

/// Counters for the stats topic (`writeStats`).
public struct ProxyCounters: Sendable, Equatable {
    public var accepted = 0
    /// Connections closed at once because every slot was taken.
    public var refusedFull = 0
    /// Noise handshakes with the wrong key.
    public var wrongKey = 0
    /// Clients disconnected for bytes that do not decode (frames, protobuf, handshake).
    public var badFrames = 0
    /// Clients disconnected for not reading (send buffer full for `stallTimeout`).
    public var stalled = 0
    /// Clients disconnected for silence or an unfinished handshake.
    public var timedOut = 0
    /// Advertisements and batches sent (per client), and advertisements a full send buffer cost.
    public var advertisementsSent = 0
    public var batchesSent = 0
    public var advertisementsDropped = 0
    /// Advertisements with more than 62 bytes of data (extended advertising): ESPHome's message
    /// has no room for them.
    public var tooLong = 0
    /// Baton's own activity beacons, not passed on (docs/esphome.md §3.7), while a client was subscribed.
    public var batonBeaconsWithheld = 0
    /// GATT requests answered at once with an error: the queue to the connections was full.
    public var gattAsksRefused = 0
}

public struct ProxyServer: ~Copyable, LoopPart {
    public let settings: ProxySettings
    public let info: DeviceInfo
    /// Active connections (docs/esphome.md §11): what clients asked this turn, for the
    /// gateway to hand to `GATTConnections` (`nextGATTAsk`), each with its data in `askData`.
    var gattAsks: [(client: GATTClient, address: UInt64, ask: GATTAsk, data: Int)]
    var gattAskTaken = 0
    let askData: UnsafeMutableRawBufferPointer
    /// The connection slots as the connections last said (81 `BluetoothConnectionsFreeResponse`).
    var connectionsFree: Int
    var connectionsAllocated: [UInt64]
    var lastClientSerial: UInt64 = 0
    /// The most asks a turn queues; one more is refused at once (`gattAsksRefused`).
    public static let gattAskLimit = 16
    /// The port bound (settings.port, or the kernel's choice for port 0).
    public private(set) var port: UInt16 = 0
    public internal(set) var counters = ProxyCounters()
    public var log: Logger
    /// What a scanner-state message reports: the gateway sets it from its radio.
    public private(set) var scannerState: UInt32 = ScannerState.running
    /// The mode the radio scans in (`ScannerMode`), as the gateway last set it from the radio.
    public private(set) var scannerMode: UInt32 = ScannerMode.passive
    /// Scan responses waiting to be sent with their advertisement (active scanning only).
    public var scanResponses = ScanResponses()
    /// How long a client has to finish the Noise handshake and say hello.
    public var handshakeTimeout: Duration = .seconds(10)
    /// Our Noise ephemeral private key for every handshake, for the byte vectors of tests and
    /// the allocation bench only; nil (always, in the gateway): a fresh one each time.
    public var fixedEphemeralKey: [UInt8]? = nil

    let listenFD: Int32
    var slots: [ClientSlot]
    /// The one allocation: every slot's receive and send buffers, then the batch.
    let memory: UnsafeMutableRawBufferPointer
    let batch: UnsafeMutableRawBufferPointer
    var batchCount = 0
    var batchEntries = 0
    var subscribers = 0
    let serverHello: [UInt8]
    let helloResponse: HelloResponse

    /// Binds and listens. Throws `Errno` when the address is taken or not this machine's.
    public init(settings: ProxySettings, info: DeviceInfo, compactMAC: String,
                log: Logger = .off) throws(ProxyStartError) {
        precondition(settings.clients >= 1 && settings.receiveBuffer >= 256 && settings.sendBuffer >= 2048)
        self.settings = settings
        var info = info
        // Connectable only with connections (Home Assistant reads flag 2 as "connectable").
        if settings.connections > 0 { info.featureFlags |= ProxyFeature.activeConnections | ProxyFeature.remoteCaching }
        self.info = info
        self.log = log
        gattAsks = []
        gattAsks.reserveCapacity(Self.gattAskLimit)
        askData = .allocate(byteCount: Self.gattAskLimit * Self.askDataLimit, alignment: 8)
        connectionsFree = settings.connections
        connectionsAllocated = []
        connectionsAllocated.reserveCapacity(settings.connections)
        let fd = try Self.listen(address: settings.address, port: settings.port)
        listenFD = fd
        port = Self.boundPort(fd)
        let perSlot = settings.receiveBuffer + settings.sendBuffer
        let batchSize = RawAdvertisement.batchLimit * RawAdvertisement.maxEntrySize
        memory = .allocate(byteCount: perSlot * settings.clients + batchSize, alignment: 16)
        memory.initializeMemory(as: UInt8.self, repeating: 0)
        slots = []
        slots.reserveCapacity(settings.clients)
        for i in 0..<settings.clients {
            let base = i * perSlot
            slots.append(ClientSlot(
                receive: UnsafeMutableRawBufferPointer(rebasing: memory[base..<base + settings.receiveBuffer]),
                send: UnsafeMutableRawBufferPointer(rebasing: memory[base + settings.receiveBuffer..<base + perSlot])))
        }
        let b = perSlot * settings.clients
        batch = UnsafeMutableRawBufferPointer(rebasing: memory[b..<b + batchSize])
        // The Noise server hello (aioesphomeapi noise.py `_handle_hello`): the chosen protocol
        // (1), the node name and NUL, the MAC as compact hex and NUL (ESPHome 2025.4+).
        serverHello = [1] + info.name + [0] + Array(compactMAC.utf8) + [0]
        helloResponse = HelloResponse(serverInfo: Array("Baton (ESPHome native API)".utf8), name: info.name)
        log.notice("esphome: listening on \(settings.address):\(port) (\(isEncrypted ? "Noise" : "plaintext, esphome.encryption: none"))")
    }

    /// The server for a gateway: `identity` from its settings, id and room.
    public init(settings: ProxySettings, identity: ProxyIdentity,
                log: Logger = .off) throws(ProxyStartError) {
        try self.init(settings: settings, info: identity.info, compactMAC: identity.compactMAC, log: log)
    }

    deinit {
        for s in slots where s.fd >= 0 { Syscall.close(s.fd) }
        Syscall.close(listenFD)
        memory.deallocate()
        askData.deallocate()
    }

    public var subscriberCount: Int { subscribers }

    public var clientCount: Int {
        var n = 0
        for s in slots where s.fd >= 0 { n += 1 }
        return n
    }

    public var isEncrypted: Bool {
        if case .noise = settings.encryption { return true }
        return false
    }

    /// The scanner's state and mode as the gateway sees its radio (`ScannerState`,
    /// `ScannerMode`); subscribed clients are told when either changes.
    public mutating func setScannerState(_ state: UInt32, mode: UInt32 = ScannerMode.passive) {
        guard state != scannerState || mode != scannerMode else { return }
        if mode != scannerMode, mode == ScannerMode.passive { scanResponses.clear() }
        scannerState = state
        scannerMode = mode
        for i in slots.indices where slots[i].phase == .ready && slots[i].subscribed { sendScannerState(i) }
    }

    /// The mode the radio should scan in (docs/esphome.md "Active scanning"): what
    /// `esphome.scan-mode` pins, else active while a connected client has asked for it and not
    /// asked for passive since, else passive. The gateway applies it every turn.
    public var wantedScanMode: UInt32 {
        switch settings.scanMode {
        case .passive: return ScannerMode.passive
        case .active: return ScannerMode.active
        case .onRequest:
            for s in slots where s.fd >= 0 && s.wantsActive { return ScannerMode.active }
            return ScannerMode.passive
        }
    }

    /// `configured_mode` (api.proto `BluetoothScannerStateResponse`): the mode the scanner
    /// keeps when nobody asks: the pinned one, or passive.
    public var configuredScanMode: UInt32 {
        settings.scanMode == .active ? ScannerMode.active : ScannerMode.passive
    }

    // MARK: The loop

    /// The listening socket, then one descriptor per slot (negative for a free slot, which
    /// poll(2) skips): always 1 + clients, so the loop is sized once.
    public var descriptorLimit: Int { 1 + settings.clients }

    public mutating func pollDescriptors(into fds: inout [pollfd]) {
        fds.append(pollfd(fd: listenFD, events: Int16(POLLIN), revents: 0))
        for s in slots {
            var events = Int16(POLLIN)
            if s.pending > 0 { events |= Int16(POLLOUT) }
            fds.append(pollfd(fd: s.fd, events: events, revents: 0))
        }
    }

    public var nextDeadline: Instant? {
        var next: Instant? = nil
        for s in slots where s.fd >= 0 {
            var d = s.phase == .ready
                ? s.lastReceived + (s.pinged ? settings.idleTimeout : settings.pingAfter)
                : s.connectedAt + handshakeTimeout
            if let since = s.stalledSince, since + settings.stallTimeout < d { d = since + settings.stallTimeout }
            if next == nil || d < next! { next = d }
        }
        return next
    }

    /// The loop's one verb for the server (docs/architecture.md §2), at the end of a turn:
    /// the clients' requests when there are any, then this turn's advertisements and what
    /// every socket takes.
    public mutating func serve(_ ready: ArraySlice<pollfd>, now: Instant) {
        // Asks of the last turn nobody took (no connections part to take them) are refused,
        // so the queue never fills for good.
        refuseUntakenAsks()
        let due = nextDeadline.map { $0 <= now } ?? false
        if due || ready.contains(where: { $0.revents != 0 }) { handle(ready: ready, now: now) }
        flush(now: now)
    }

    /// Does this turn's work: accepts, reads and answers, writes, and ends the clients whose
    /// time is up. `ready` is what poll(2) said of `pollDescriptors`' descriptors, in order.
    public mutating func handle(ready: ArraySlice<pollfd>, now: Instant) {
        var it = ready.makeIterator()
        if let l = it.next(), l.revents != 0 { acceptAll(now: now) }
        for i in slots.indices {
            guard let p = it.next() else { break }
            guard slots[i].fd >= 0, p.fd == slots[i].fd, p.revents != 0 else { continue }
            if p.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0 { receive(i, now: now) }
            if slots[i].fd >= 0, slots[i].pending > 0 { write(i, now: now) }
        }
        expire(now: now)
    }

    /// Called by the gateway's hot path for every advertising report: appends it to the batch
    /// if any client is subscribed. `address` is the 48-bit address as a number, AA:BB:… being
    /// 0xAABB… (`AdvertisingReport.address` as it is), `addressType` HCI's (0 public, 1 random,
    /// 2 and 3 identity; 0xFF anonymous is skipped), `data` the report's data as received (at
    /// most 62 bytes; longer is counted as `too_long` and skipped).
    ///
    /// `eventType` is the report's (§7.7.65.13 bits, legacy ones mapped: `AdvertisingReport.eventType`).
    /// While scanning actively a scannable advertisement is remembered, and its scan response
    /// is sent with it: the advertisement's data, then the scan response's, as an ESP32 sends
    /// them (`ScanResponses`).
    public mutating func heard(address: UInt64, addressType: UInt8, rssi: Int8, data: UnsafeRawBufferPointer,
                               eventType: UInt16 = RawAdvertisement.nonConnectable) {
        // 0xFF: an anonymous extended advertisement, no address to report.
        guard subscribers > 0, addressType != 0xFF else { return }
        guard data.count <= RawAdvertisement.dataLimit else {
            counters.tooLong &+= 1
            return
        }
        if scannerMode == ScannerMode.active {
            if eventType & RawAdvertisement.scanResponseBit != 0 {
                let whole = scanResponses.answered(address: address, addressType: addressType, data: data)
                return append(address: address, addressType: addressType, rssi: rssi, data: whole)
            }
            if eventType & RawAdvertisement.scannableBit != 0 {
                scanResponses.advertised(address: address, addressType: addressType, data: data)
            }
        }
        append(address: address, addressType: addressType, rssi: rssi, data: data)
    }

    /// One of Baton's own beacons was heard: not for Home Assistant (docs/esphome.md §3.7), counted.
    public mutating func withholdBatonBeacon() {
        if subscribers > 0 { counters.batonBeaconsWithheld &+= 1 }
    }

    mutating func append(address: UInt64, addressType: UInt8, rssi: Int8, data: UnsafeRawBufferPointer) {
        guard data.count <= RawAdvertisement.dataLimit else {
            counters.tooLong &+= 1
            return
        }
        var w = ByteWriter(UnsafeMutableRawBufferPointer(rebasing: batch[batchCount...]))
        // Proof: the batch holds batchLimit entries of maxEntrySize, and it is sent when full.
        try! RawAdvertisement.append(address: address, addressType: addressType, rssi: rssi, data: data, to: &w)
        batchCount &+= w.count
        batchEntries &+= 1
        if batchEntries == RawAdvertisement.batchLimit { sendBatch() }
    }

    /// End of a loop turn: sends the batch so far, then writes what every socket takes. Called
    /// every turn, so an advertisement waits at most one turn.
    public mutating func flush(now: Instant) {
        if batchEntries > 0 { sendBatch() }
        for i in slots.indices where slots[i].fd >= 0 && slots[i].pending > 0 { write(i, now: now) }
    }

    // MARK: Accepting

    mutating func acceptAll(now: Instant) {
        while true {
            var peer = sockaddr_storage()
            var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let got: Int?
            do throws(Errno) {
                got = try Syscall.call("accept") {
                    Int(withUnsafeMutablePointer(to: &peer) {
                        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { CLibc.accept(listenFD, $0, &length) }
                    })
                }
            } catch {
                // ECONNABORTED: the client left before we took it; EMFILE/ENFILE: out of
                // descriptors, which the next turn retries.
                if error.code != ECONNABORTED { log.warning("esphome: accept failed: \(error)") }
                return
            }
            guard let got else { return }
            let fd = Int32(got)
            let name = Self.describe(peer)
            guard let i = slots.firstIndex(where: { $0.fd < 0 }) else {
                counters.refusedFull &+= 1
                log.warning("esphome: refused \(name): all \(settings.clients) client slots are taken (raise esphome.clients)")
                Syscall.close(fd)
                continue
            }
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            // TCP_NODELAY (tcp(7); 1 on Linux, <netinet/tcp.h> is not in our map): a batch is
            // written once per turn and should leave at once, not wait for the last one's ACK.
            var one: Int32 = 1
            _ = setsockopt(fd, Int32(IPPROTO_TCP), 1, &one, socklen_t(MemoryLayout<Int32>.size))
            counters.accepted &+= 1
            lastClientSerial &+= 1
            slots[i].serial = lastClientSerial
            slots[i].open(fd: fd, peer: name, now: now, phase: isEncrypted ? .noiseHello : .ready)
            log.info("esphome: \(name) connected (\(isEncrypted ? "Noise" : "plaintext"))")
        }
    }

    // MARK: Receiving

    /// Reads and answers what the client sent: at most 16 buffers' worth a turn, so a client
    /// that floods cannot keep the loop from its other work (the rest waits for the next turn).
    mutating func receive(_ i: Int, now: Instant) {
        var reads = 0
        while slots[i].fd >= 0, reads < 16 {
            reads += 1
            let room = slots[i].receive.count - slots[i].received
            guard room > 0 else {
                // A whole buffer and no frame in it: the decoders refuse lengths over the
                // buffer, so this cannot hold; close rather than spin.
                return drop(i, reason: "sent a frame larger than the receive buffer", counter: .badFrame)
            }
            let got: Int?
            do throws(Errno) {
                got = try Syscall.read(slots[i].fd, into: UnsafeMutableRawBufferPointer(rebasing: slots[i].receive[slots[i].received...]))
            } catch {
                return close(i, "connection error: \(error)")
            }
            guard let got else { return }
            if got == 0 { return close(i, "disconnected") }
            slots[i].received += got
            slots[i].lastReceived = now
            process(i, now: now)
        }
    }

    /// Decodes and answers every whole frame in the slot's receive buffer, then moves what is
    /// left (part of a frame) to the front.
    mutating func process(_ i: Int, now: Instant) {
        var start = 0
        while slots[i].fd >= 0, !slots[i].closing {
            let buffer = UnsafeMutableRawBufferPointer(rebasing: slots[i].receive[start..<slots[i].received])
            let result: FrameResult
            do throws(WireError) {
                result = isEncrypted
                    ? try NoiseFrame.decode(UnsafeRawBufferPointer(buffer), maxBody: slots[i].receive.count - NoiseFrame.headerSize)
                    : try PlaintextFrame.decode(UnsafeRawBufferPointer(buffer), maxBody: slots[i].receive.count - 21)
            } catch {
                return badFrame(i, indicator: buffer.first ?? 0, error)
            }
            guard case .frame(let type, let payload, let length) = result else { break }
            let body = UnsafeMutableRawBufferPointer(rebasing: buffer[payload])
            if isEncrypted { noiseFrame(i, body, now: now) } else { message(i, type: type, body: UnsafeRawBufferPointer(body)) }
            start += length
        }
        guard slots[i].fd >= 0 else { return }
        let left = slots[i].received - start
        if start > 0, left > 0, let base = slots[i].receive.baseAddress {
            (base).copyMemory(from: base + start, byteCount: left)
        }
        slots[i].received = left
    }

    mutating func badFrame(_ i: Int, indicator: UInt8, _ error: WireError) {
        if isEncrypted, indicator == PlaintextFrame.indicator {
            // A plaintext client (no key in Home Assistant): a Noise frame tells aioesphomeapi
            // "requires encryption" (plain_text.py `_error_on_incorrect_preamble`).
            enqueueRaw(i, NoiseFrame.indicator, Array("\u{1}Bad indicator byte".utf8))
            return drop(i, reason: "speaks plaintext, but esphome.encryption-key is set: give Home Assistant the key", counter: .badFrame)
        }
        if !isEncrypted, indicator == NoiseFrame.indicator {
            // A client with a key: a plaintext frame tells aioesphomeapi the device is plaintext.
            enqueueBytes(i, [0, 0, 0])
            return drop(i, reason: "speaks Noise, but esphome.encryption is none: remove the key in Home Assistant or set one here", counter: .badFrame)
        }
        drop(i, reason: "sent a bad frame: \(error)", counter: .badFrame)
    }

    mutating func noiseFrame(_ i: Int, _ body: UnsafeMutableRawBufferPointer, now: Instant) {
        switch slots[i].phase {
        case .noiseHello:
            // The client's hello frame carries nothing we need (aioesphomeapi sends it empty).
            enqueueRaw(i, NoiseFrame.indicator, serverHello)
            slots[i].phase = .noiseHandshake
        case .noiseHandshake:
            guard case .noise(let key) = settings.encryption else { return }
            guard body.count >= 1, body[0] == 0 else {
                return drop(i, reason: "sent a handshake frame that does not start with 0", counter: .badFrame)
            }
            do throws(NoiseError) {
                var hs = try NoiseHandshake(psk: key)
                let (response, transport) = try hs.respond(to: UnsafeRawBufferPointer(rebasing: body[1...]), ephemeralPrivateKey: fixedEphemeralKey)
                enqueueRaw(i, NoiseFrame.indicator, [0] + response)
                slots[i].transport = transport
                slots[i].phase = .ready
                slots[i].lastReceived = now
            } catch {
                switch error {
                case .wrongKey:
                    // ESPHome's words, which aioesphomeapi turns into "Invalid encryption key".
                    enqueueRaw(i, NoiseFrame.indicator, Array("\u{1}Handshake MAC failure".utf8))
                    drop(i, reason: "has the wrong encryption key (Noise handshake MAC failure): give Home Assistant esphome.encryption-key", counter: .wrongKey)
                case .crypto(let e):
                    drop(i, reason: "could not be answered: \(e)", counter: nil)
                default:
                    enqueueRaw(i, NoiseFrame.indicator, Array("\u{1}Handshake error".utf8))
                    drop(i, reason: "\(error)", counter: .badFrame)
                }
            }
        case .ready:
            guard let transport = slots[i].transport else { return }
            guard body.count >= NoiseFrame.tagSize + NoiseFrame.innerHeaderSize, transport.open(body) else {
                return drop(i, reason: "sent an encrypted frame that does not authenticate", counter: .badFrame)
            }
            let plaintext = UnsafeRawBufferPointer(rebasing: body[..<(body.count - NoiseFrame.tagSize)])
            do throws(WireError) {
                let (type, range) = try NoiseFrame.decodeMessage(plaintext)
                message(i, type: type, body: UnsafeRawBufferPointer(rebasing: plaintext[range]))
            } catch {
                drop(i, reason: "sent a bad message: \(error)", counter: .badFrame)
            }
        }
    }

    /// Answers one message (docs/esphome.md §5, the exchange).
    mutating func message(_ i: Int, type: UInt32, body: UnsafeRawBufferPointer) {
        // ConnectRequest (3): the password step of API clients before 1.12 (aioesphomeapi 23,
        // Home Assistant 2024.3), sent with the hello and awaited with it. There is no password:
        // an empty ConnectResponse (4) says `invalid_password: false`, as ESPHome answers.
        if type == MessageType.connectRequest {
            enqueue(i, type: MessageType.connectResponse, EmptyMessage())
            return
        }
        let m: ClientMessage
        let g: GATTMessage?
        do throws(WireError) {
            g = try GATTMessage.decode(type: type, body: body)
            m = g == nil ? try ClientMessage.decode(type: type, body: body) : .other(type: type)
        } catch {
            return drop(i, reason: "sent a message \(type) that is not protobuf: \(error)", counter: .badFrame)
        }
        if let g { return gatt(i, g, body: body) }
        switch m {
        case .hello(let clientInfo, let major, let minor):
            let name = String(decoding: UnsafeRawBufferPointer(rebasing: body[clientInfo]).prefix(64), as: UTF8.self)
            slots[i].helloed = true
            log.info("esphome: \(slots[i].peer) is \(printable(name)) (API \(major).\(minor))")
            enqueue(i, type: MessageType.helloResponse, helloResponse)
        case .deviceInfoRequest:
            enqueue(i, type: MessageType.deviceInfoResponse, DeviceInfoResponse(info))
        case .listEntitiesRequest:
            // A proxy has no entities: the list is empty.
            enqueue(i, type: MessageType.listEntitiesDoneResponse, EmptyMessage())
        case .subscribeStatesRequest, .pingResponse, .other:
            break
        case .pingRequest:
            enqueue(i, type: MessageType.pingResponse, EmptyMessage())
        case .disconnectRequest:
            enqueue(i, type: MessageType.disconnectResponse, EmptyMessage())
            slots[i].closing = true
            log.info("esphome: \(slots[i].peer) said goodbye")
        case .disconnectResponse:
            close(i, "disconnected")
        case .subscribeAdvertisements(let flags):
            guard flags & SubscriptionFlag.rawAdvertisements != 0 else {
                log.notice("esphome: \(slots[i].peer) asked for parsed advertisements; Baton sends raw ones only (feature flag 32)")
                return
            }
            if !slots[i].subscribed {
                slots[i].subscribed = true
                subscribers += 1
            }
            sendScannerState(i)
        case .unsubscribeAdvertisements:
            unsubscribe(i)
        case .setScannerMode(let mode):
            // api.proto: 0 passive, 1 active; anything else is not a mode and changes nothing.
            guard mode == ScannerMode.passive || mode == ScannerMode.active else {
                log.notice("esphome: \(slots[i].peer) asked for scanner mode \(mode), which is neither passive (0) nor active (1)")
                return sendScannerState(i)
            }
            let active = mode == ScannerMode.active
            if active != slots[i].wantsActive {
                slots[i].wantsActive = active
                switch settings.scanMode {
                case .onRequest:
                    log.info("esphome: \(slots[i].peer) asked for \(active ? "active" : "passive") scanning")
                case .passive, .active:
                    log.info("esphome: \(slots[i].peer) asked for \(active ? "active" : "passive") scanning; esphome.scan-mode keeps it \(settings.scanMode == .active ? "active" : "passive")")
                }
            }
            // The state follows once the radio has changed (`setScannerState`); this answer says
            // where it is now.
            sendScannerState(i)
        }
    }

    mutating func sendScannerState(_ i: Int) {
        enqueue(i, type: MessageType.bluetoothScannerStateResponse,
                ScannerStateResponse(state: scannerState, mode: scannerMode, configuredMode: configuredScanMode))
    }

    mutating func unsubscribe(_ i: Int) {
        if slots[i].subscribed {
            slots[i].subscribed = false
            subscribers -= 1
        }
    }

    // MARK: Sending

    /// Frames one message into the slot's send buffer (encrypted for Noise). False when it does
    /// not fit: the caller decides (a response: the client is not reading; a batch: dropped).
    @discardableResult
    mutating func enqueue<M: ServerMessage>(_ i: Int, type: UInt32, _ message: M) -> Bool {
        let size = message.bodySize
        let need = isEncrypted
            ? NoiseFrame.headerSize + NoiseFrame.innerHeaderSize + size + NoiseFrame.tagSize
            : PlaintextFrame.headerSize(type: type, bodySize: size) + size
        guard let room = slots[i].room(for: need) else { return false }
        var w = ByteWriter(room)
        if let transport = slots[i].transport {
            // Proof: `room` has `need` bytes, which is what follows.
            try! w.reserve(need)
            let inner = NoiseFrame.innerHeaderSize + size + NoiseFrame.tagSize
            w.write(NoiseFrame.indicator)
            w.writeU16BE(UInt16(inner))
            w.writeU16BE(UInt16(type))
            w.writeU16BE(UInt16(size))
            message.writeBody(&w)
            for _ in 0..<NoiseFrame.tagSize { w.write(0) }
            guard transport.seal(UnsafeMutableRawBufferPointer(rebasing: room[NoiseFrame.headerSize..<need])) else {
                log.error("esphome: libcrypto could not encrypt for \(slots[i].peer)")
                slots[i].closing = true
                return false
            }
        } else {
            try! PlaintextFrame.write(type: type, message, to: &w)
        }
        slots[i].sendEnd += need
        return true
    }

    /// A handshake frame: the indicator, the length, these bytes (before encryption starts).
    mutating func enqueueRaw(_ i: Int, _ indicator: UInt8, _ bytes: [UInt8]) {
        enqueueBytes(i, [indicator, UInt8(bytes.count >> 8), UInt8(truncatingIfNeeded: bytes.count)] + bytes)
    }

    mutating func enqueueBytes(_ i: Int, _ bytes: [UInt8]) {
        guard let room = slots[i].room(for: bytes.count) else { return }
        bytes.withUnsafeBytes { room.copyMemory(from: $0) }
        slots[i].sendEnd += bytes.count
    }

    /// Frames the batch for every subscriber, then starts a new one.
    mutating func sendBatch() {
        let body = RawBody(bytes: UnsafeRawBufferPointer(rebasing: batch[..<batchCount]))
        for i in slots.indices where slots[i].fd >= 0 && slots[i].subscribed && !slots[i].closing {
            if enqueue(i, type: MessageType.bluetoothLERawAdvertisementsResponse, body) {
                counters.batchesSent &+= 1
                counters.advertisementsSent &+= batchEntries
            } else {
                counters.advertisementsDropped &+= batchEntries
            }
        }
        batchCount = 0
        batchEntries = 0
    }

    /// Writes what the socket takes; a client that takes nothing for `stallTimeout` while its
    /// buffer holds bytes is dropped by `expire`.
    mutating func write(_ i: Int, now: Instant) {
        while slots[i].pending > 0 {
            let pending = UnsafeRawBufferPointer(rebasing: slots[i].send[slots[i].sendStart..<slots[i].sendEnd])
            let sent: Int?
            do throws(Errno) { sent = try Syscall.send(slots[i].fd, pending) } catch {
                return close(i, "connection error: \(error)")
            }
            guard let sent, sent > 0 else {
                if slots[i].stalledSince == nil { slots[i].stalledSince = now }
                return
            }
            slots[i].sendStart += sent
            slots[i].stalledSince = nil
        }
        slots[i].sendStart = 0
        slots[i].sendEnd = 0
        if slots[i].closing { close(i, "disconnected") }
    }

    mutating func expire(now: Instant) {
        for i in slots.indices where slots[i].fd >= 0 {
            if let since = slots[i].stalledSince, now - since >= settings.stallTimeout {
                drop(i, reason: "stopped reading: its \(settings.sendBuffer)-byte send buffer stayed full for \(settings.stallTimeout.components.seconds) s", counter: .stalled)
            } else if slots[i].phase != .ready, now - slots[i].connectedAt >= handshakeTimeout {
                drop(i, reason: "did not finish the handshake within \(handshakeTimeout.components.seconds) s", counter: .timedOut)
            } else if slots[i].phase == .ready, now - slots[i].lastReceived >= settings.idleTimeout {
                drop(i, reason: "sent nothing for \(settings.idleTimeout.components.seconds) s, not even the answer to a ping", counter: .timedOut)
            } else if slots[i].phase == .ready, !slots[i].pinged, now - slots[i].lastReceived >= settings.pingAfter {
                // Quiet is not gone: a subscriber receiving advertisements has nothing to say.
                slots[i].pinged = true
                enqueue(i, type: MessageType.pingRequest, EmptyMessage())
            }
        }
    }

    enum Counter { case badFrame, wrongKey, stalled, timedOut }

    /// A client that broke a rule: a warning, a counter, and the socket closed after what is
    /// already queued for it (an error frame) is written once, without waiting.
    mutating func drop(_ i: Int, reason: String, counter: Counter?) {
        switch counter {
        case .badFrame: counters.badFrames &+= 1
        case .wrongKey: counters.wrongKey &+= 1
        case .stalled: counters.stalled &+= 1
        case .timedOut: counters.timedOut &+= 1
        case nil: break
        }
        log.warning("esphome: \(slots[i].peer) \(reason); disconnected")
        if slots[i].pending > 0, counter != .stalled {
            let pending = UnsafeRawBufferPointer(rebasing: slots[i].send[slots[i].sendStart..<slots[i].sendEnd])
            _ = try? Syscall.send(slots[i].fd, pending)
        }
        close(i, nil)
    }

    mutating func close(_ i: Int, _ why: String?) {
        if let why { log.info("esphome: \(slots[i].peer) \(why)") }
        unsubscribe(i)
        Syscall.close(slots[i].fd)
        slots[i].reset()
    }

    // MARK: Stats

    /// The `esphome` section of the stats topic (docs/mqtt.md).
    public func writeStats(into w: inout JSONWriter) throws(WireError) {
        try w.beginObject()
        try w.key("port"); try w.int(Int64(port))
        try w.key("encryption"); try w.string(isEncrypted ? "noise" : "none")
        try w.key("clients"); try w.int(Int64(clientCount))
        try w.key("slots"); try w.int(Int64(settings.clients))
        try w.key("subscribed"); try w.int(Int64(subscribers))
        try w.key("accepted"); try w.int(Int64(counters.accepted))
        try w.key("refused_full"); try w.int(Int64(counters.refusedFull))
        try w.key("wrong_key"); try w.int(Int64(counters.wrongKey))
        try w.key("bad_frames"); try w.int(Int64(counters.badFrames))
        try w.key("stalled"); try w.int(Int64(counters.stalled))
        try w.key("timed_out"); try w.int(Int64(counters.timedOut))
        try w.key("advertisements"); try w.int(Int64(counters.advertisementsSent))
        try w.key("batches"); try w.int(Int64(counters.batchesSent))
        try w.key("dropped"); try w.int(Int64(counters.advertisementsDropped))
        try w.key("too_long"); try w.int(Int64(counters.tooLong))
        try w.key("scan_mode"); try w.string(scannerMode == ScannerMode.active ? "active" : "passive")
        try w.key("scan_responses_merged"); try w.int(Int64(scanResponses.merged))
        try w.key("scan_responses_alone"); try w.int(Int64(scanResponses.alone))
        try w.key("baton_beacons_withheld"); try w.int(Int64(counters.batonBeaconsWithheld))
        try w.key("gatt_asks_refused"); try w.int(Int64(counters.gattAsksRefused))
        try w.endObject()
    }

    // MARK: Sockets

    static func listen(address: String, port: UInt16) throws(ProxyStartError) -> Int32 {
        var v4 = sockaddr_in()
        var v6 = sockaddr_in6()
        let isV6: Bool
        if address.withCString({ inet_pton(AF_INET, $0, &v4.sin_addr) }) == 1 {
            isV6 = false
            v4.sin_family = sa_family_t(AF_INET)
            v4.sin_port = port.bigEndian
        } else if address.withCString({ inet_pton(AF_INET6, $0, &v6.sin6_addr) }) == 1 {
            isV6 = true
            v6.sin6_family = sa_family_t(AF_INET6)
            v6.sin6_port = port.bigEndian
        } else {
            throw .address(address)
        }
        let type = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        let fd = socket(isV6 ? AF_INET6 : AF_INET, type, 0)
        guard fd >= 0 else { throw .os(Errno(errno, call: "socket(AF_INET, SOCK_STREAM)")) }
        // A restarted gateway binds again at once, past the old connections' TIME_WAIT.
        var one: Int32 = 1
        _ = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        let bound = isV6
            ? withUnsafePointer(to: &v6) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in6>.size)) } }
            : withUnsafePointer(to: &v4) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        if bound < 0 {
            let e = errno
            Syscall.close(fd)
            throw .os(Errno(e, call: "bind"))
        }
        if CLibc.listen(fd, 8) < 0 {
            let e = errno
            Syscall.close(fd)
            throw .os(Errno(e, call: "listen"))
        }
        return fd
    }

    static func boundPort(_ fd: Int32) -> UInt16 {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        let family = storage.ss_family
        return withUnsafePointer(to: &storage) { p in
            if family == sa_family_t(AF_INET6) {
                return p.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin6_port) }
            }
            return p.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin_port) }
        }
    }

    /// "192.0.2.7:51234" for the log.
    static func describe(_ peer: sockaddr_storage) -> String {
        var peer = peer
        var text = [CChar](repeating: 0, count: 64)
        var port: UInt16 = 0
        let family = peer.ss_family
        withUnsafePointer(to: &peer) { p in
            if family == sa_family_t(AF_INET6) {
                p.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { a in
                    var addr = a.pointee.sin6_addr
                    _ = inet_ntop(AF_INET6, &addr, &text, socklen_t(text.count))
                    port = UInt16(bigEndian: a.pointee.sin6_port)
                }
            } else {
                p.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { a in
                    var addr = a.pointee.sin_addr
                    _ = inet_ntop(AF_INET, &addr, &text, socklen_t(text.count))
                    port = UInt16(bigEndian: a.pointee.sin_port)
                }
            }
        }
        let host = String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return "client \(host):\(port)"
    }

    /// A peer's text for the log: printable ASCII only, so it cannot forge log lines.
    func printable(_ s: String) -> String {
        var out = "\""
        for c in s.utf8 { out.append(c >= 0x20 && c < 0x7F ? Character(Unicode.Scalar(c)) : "?") }
        return out + "\""
    }
}

/// Why the server could not start.
public enum ProxyStartError: Error, Equatable, CustomStringConvertible {
    case address(String)
    case os(Errno)
    public var description: String {
        switch self {
        case .address(let a): "esphome.address \"\(a)\" is not an IPv4 or IPv6 address"
        case .os(let e): "the ESPHome API server cannot listen: \(e)"
        }
    }
}

/// A batch's encoded entries as a message body.
struct RawBody: ServerMessage {
    let bytes: UnsafeRawBufferPointer
    var bodySize: Int { bytes.count }
    func writeBody(_ w: inout ByteWriter) { w.write(bytes) }
}

enum ClientPhase: Equatable { case noiseHello, noiseHandshake, ready }

struct ClientSlot {
    var fd: Int32 = -1
    var phase = ClientPhase.ready
    var peer = ""
    let receive: UnsafeMutableRawBufferPointer
    var received = 0
    let send: UnsafeMutableRawBufferPointer
    var sendStart = 0
    var sendEnd = 0
    var transport: NoiseTransport? = nil
    var subscribed = false
    /// Which client this is: a later one in the slot has another serial (`GATTClient`).
    var serial: UInt64 = 0
    /// It asked to hear the connection slots (80).
    var hearsConnectionSlots = false
    /// It asked for active scanning (`BluetoothScannerSetModeRequest`) and not since for passive.
    var wantsActive = false
    var helloed = false
    /// Close once the send buffer is written (after a DisconnectResponse).
    var closing = false
    var lastReceived = Instant(nanoseconds: 0) {
        didSet { pinged = false }
    }
    /// A PingRequest went out since `lastReceived`.
    var pinged = false
    /// When it connected: the handshake's deadline counts from here, however slowly it trickles.
    var connectedAt = Instant(nanoseconds: 0)
    var stalledSince: Instant? = nil

    init(receive: UnsafeMutableRawBufferPointer, send: UnsafeMutableRawBufferPointer) {
        self.receive = receive
        self.send = send
    }

    var pending: Int { sendEnd - sendStart }

    mutating func open(fd: Int32, peer: String, now: Instant, phase: ClientPhase) {
        self.fd = fd
        self.peer = peer
        self.phase = phase
        lastReceived = now
        connectedAt = now
    }

    mutating func reset() {
        fd = -1
        phase = .ready
        received = 0
        sendStart = 0
        sendEnd = 0
        transport = nil
        subscribed = false
        hearsConnectionSlots = false
        serial = 0
        wantsActive = false
        helloed = false
        closing = false
        stalledSince = nil
    }

    /// `need` bytes of room at the end of the send buffer, moving what is pending to the front
    /// if that makes room; nil when it cannot.
    mutating func room(for need: Int) -> UnsafeMutableRawBufferPointer? {
        if send.count - sendEnd < need, sendStart > 0 {
            let count = pending
            if count > 0 { send.baseAddress!.copyMemory(from: send.baseAddress! + sendStart, byteCount: count) }
            sendStart = 0
            sendEnd = count
        }
        guard send.count - sendEnd >= need else { return nil }
        return UnsafeMutableRawBufferPointer(rebasing: send[sendEnd..<sendEnd + need])
    }
}
