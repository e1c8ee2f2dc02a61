// Active connections of Home Assistant's Bluetooth proxy (docs/esphome.md §11): Home Assistant
// asks the gateway's ESPHome server to connect to a device, and the gateway is the device's
// GATT client over the ATT fixed channel the kernel opens (`DeviceLink.connectAttributes`),
// as an ESP32 proxy is over its own stack. This part owns those connections: a fixed number of
// slots, each a `LinkChannel` and the GATT client's state for it.
//
// One request at a time on a connection (Core 5.4, Vol 3, Part F, §3.3.2: a client sends its
// next request only after the response to the last); what a client asks meanwhile waits in the
// connection's queue, in order. A request unanswered for 30 s ends the connection (§3.3.3: the
// transaction timed out, and no more may be sent on that bearer).
//
// What a client asks comes from the ESPHome server (`ask`), what it must hear goes to a
// `GATTListener` (the server): the part knows nothing of ESPHome's messages.
import BatonLibc
import BatonWire
import CLibc

public struct GATTCounters: Sendable, Equatable {
    public var connects = 0
    public var connected = 0
    /// Connects refused: every slot taken.
    public var refusedFull = 0
    public var failed = 0
    /// Connections ended by a request unanswered for 30 s, or a PDU that is not ATT.
    public var timedOut = 0
    public var malformed = 0
    /// Requests refused: the connection's queue full, or no such connection.
    public var refused = 0
    public var notifications = 0
    public init() {}
}

/// The connections. A `LoopPart`: each connection's descriptor, and its deadline.
public struct GATTConnections: ~Copyable, LoopPart {
    public let limit: Int
    let link: AnyDeviceLink
    var pool: LinkPool<GATTSlot>
    public private(set) var counters = GATTCounters()
    /// One receive buffer for every connection: a PDU is handled before the next is read.
    let receive: UnsafeMutableRawBufferPointer
    /// The addresses connected, for the listener (kept with its capacity).
    var allocated: [UInt64]
    var slotsChanged = true

    /// The most a client may have waiting on one connection.
    public static let queueLimit = 8
    /// The longest value a request carries or a read gathers (Vol 3, Part F, §3.2.9).
    public static let valueLimit = 512
    /// Discovery's bounds per device: services, and characteristics and descriptors per service.
    public static let servicesPerDevice = 64, characteristicsPerService = 64, descriptorsPerService = 128
    /// How long a connect may take before the client hears it failed (an ESP32 gives 20 s).
    public static let connectTimeout: Duration = .seconds(20)
    /// §3.3.3: a request unanswered for 30 s ends the connection.
    public static let transactionTimeout: Duration = .seconds(30)
    /// The ATT MTU this side asks for (what BlueZ's own client asks, 517).
    public static let receiveMTU: UInt16 = 517

    public init(limit: Int, link: AnyDeviceLink) {
        self.limit = limit
        self.link = link
        pool = LinkPool(capacity: limit) { _ in GATTSlot() }
        receive = .allocate(byteCount: Int(Self.receiveMTU), alignment: 8)
        allocated = []
        allocated.reserveCapacity(limit)
    }

    deinit { receive.deallocate() }

    /// What memory a slot holds from the start (docs/esphome.md §11).
    public static var bytesPerSlot: Int { GATTSlot.bytes }

    public var count: Int { pool.count }

    // MARK: LoopPart

    public var descriptorLimit: Int { limit }

    public mutating func pollDescriptors(into fds: inout [pollfd]) {
        pool.pollDescriptors(into: &fds) { $0.unsent > 0 || $0.replyUnsent > 0 }
    }

    public var nextDeadline: Instant? {
        var next: Instant? = nil
        for slot in pool.indices {
            guard let s = pool[slot], let d = s.deadline else { continue }
            if next.map({ d < $0 }) ?? true { next = d }
        }
        return next
    }

    // MARK: What clients ask

    /// A client's request; `data` the value of a write. Answers that need no device (a refusal,
    /// `notify`) are told at once.
    public mutating func ask<Listener: GATTListener & ~Copyable>(
        _ ask: GATTAsk, client: GATTClient, address: UInt64, data: UnsafeRawBufferPointer, now: Instant,
        to listener: inout Listener
    ) {
        let slot = pool.first { $0.address == address }
        if case .connect(let addressType, let withCache) = ask {
            connect(client: client, address: address, addressType: addressType, withCache: withCache, existing: slot, now: now,
                    to: &listener)
            return
        }
        guard let slot, let s = pool[slot], s.client == client else {
            // Nothing of this client's at that address.
            counters.refused &+= 1
            listener.gatt(ask.notConnected, client: client, address: address, value: UnsafeRawBufferPointer(start: nil, count: 0),
                          service: nil)
            return
        }
        switch ask {
        case .connect:
            return
        case .disconnect:
            // As an ESP32 tells it: the link's end, by this side (HCI reason 0x16).
            end(slot, error: GATTConnectionError.localHost, to: &listener)
        case .notify(let handle, let enable):
            s.setNotifying(handle, enable)
            tell(slot, .notifying(handle: handle), to: &listener)
        case .write(let handle, false):
            // A Write Command goes at once, in order with what is queued: queued like the rest,
            // and nothing comes back (§3.4.5.3).
            if data.count > Int(s.mtu) - 3 {
                tell(slot, .error(handle: handle, code: Int32(ATTErrorCode.invalidAttributeValueLength)), to: &listener)
                return
            }
            enqueue(slot, ask, data: data, to: &listener)
        default:
            enqueue(slot, ask, data: data, to: &listener)
        }
        advance(slot, now: now, to: &listener)
    }

    mutating func connect<Listener: GATTListener & ~Copyable>(
        client: GATTClient, address: UInt64, addressType: UInt8, withCache: Bool, existing: Int?, now: Instant,
        to listener: inout Listener
    ) {
        let nothing = UnsafeRawBufferPointer(start: nil, count: 0)
        counters.connects &+= 1
        if let existing, let s = pool[existing] {
            // Asked again: the same client hears where its connection is; another is refused
            // (one device, one central here).
            if s.client == client, s.phase == .ready || (s.toldEarly && s.phase == .exchangingMTU) {
                listener.gatt(.connection(connected: true, mtu: s.mtu, error: 0), client: client, address: address, value: nothing, service: nil)
            } else if s.client != client {
                counters.refused &+= 1
                listener.gatt(.connection(connected: false, mtu: 0, error: GATTConnectionError.failedToEstablish),
                              client: client, address: address, value: nothing, service: nil)
            }
            return
        }
        guard !pool.isFull else {
            counters.refusedFull &+= 1
            listener.gatt(.connection(connected: false, mtu: 0, error: GATTConnectionError.none),
                          client: client, address: address, value: nothing, service: nil)
            return
        }
        let channel: LinkChannel
        do throws(LinkError) {
            channel = try link.connectAttributes(to: LinkAddress(address: address, addressType: addressType, psm: 0))
        } catch {
            counters.failed &+= 1
            listener.gatt(.connection(connected: false, mtu: 0, error: GATTConnectionError.failedToEstablish),
                          client: client, address: address, value: nothing, service: nil)
            return
        }
        let (slot, s) = pool.add(channel)
        s.reset(client: client, address: address, deadline: now + Self.connectTimeout)
        s.toldEarly = withCache
        slotsChanged = true
        // A channel open at once (the simulator's, a test's) starts its MTU exchange now; a
        // connecting one when poll says so.
        if case .open = pool[channel: slot].state { serveChannel(slot, now: now, to: &listener) }
    }

    // MARK: The loop's turn

    /// What poll said of the connections, then what is due, then the slots if they changed.
    public mutating func serve<Listener: GATTListener & ~Copyable>(_ ready: ArraySlice<pollfd>, now: Instant,
                                                                    to listener: inout Listener) {
        for (k, fd) in ready.enumerated() {
            guard let slot = pool.ready(k, fd) else { continue }
            let r = LinkReadiness(fd)
            pool[channel: slot].ready(readable: r.readable, writable: r.writable, buffer: receive)
            if r.writable, let s = pool[slot], s.unsent > 0 || s.replyUnsent > 0 {
                flushUnsent(slot, to: &listener)
                // A Write Command that waited for room is answered by nothing: what is queued
                // behind it goes now.
                advance(slot, now: now, to: &listener)
            }
            guard pool[slot] != nil else { continue }
            serveChannel(slot, now: now, to: &listener)
        }
        for slot in pool.indices {
            guard let s = pool[slot] else { continue }
            if !listener.isPresent(s.client) {
                // Its client left: the connection goes with it, unheard.
                pool.close(slot)
                slotsChanged = true
                continue
            }
            if let d = s.deadline, d <= now {
                if s.phase == .connecting {
                    counters.failed &+= 1
                    end(slot, error: GATTConnectionError.failedToEstablish, to: &listener)
                } else {
                    counters.timedOut &+= 1
                    end(slot, error: GATTConnectionError.timeout, to: &listener)
                }
            }
        }
        if slotsChanged {
            slotsChanged = false
            allocated.removeAll(keepingCapacity: true)
            for slot in pool.indices { if let s = pool[slot] { allocated.append(s.address) } }
            listener.connectionSlots(free: limit - pool.count, limit: limit, allocated: allocated[...])
        }
    }

    /// Ends every connection (the gateway stops), telling each client.
    public mutating func stop<Listener: GATTListener & ~Copyable>(to listener: inout Listener) {
        for slot in pool.indices where pool[slot] != nil { end(slot, error: GATTConnectionError.localHost, to: &listener) }
    }

    mutating func serveChannel<Listener: GATTListener & ~Copyable>(_ slot: Int, now: Instant, to listener: inout Listener) {
        guard let s = pool[slot] else { return }
        switch pool[channel: slot].state {
        case .connecting:
            return
        case .closed(let error):
            let code: Int32
            if s.phase == .connecting {
                counters.failed &+= 1
                code = GATTConnectionError.failedToEstablish
            } else if case .unreachable = error {
                code = GATTConnectionError.timeout
            } else {
                code = GATTConnectionError.peerTerminated
            }
            end(slot, error: code, to: &listener)
            return
        case .open:
            break
        }
        if s.phase == .connecting {
            // Open: the MTU first (§3.4.2), before anything the client asks (what it asks
            // meanwhile waits in the queue). A client with a cache hears of the link now.
            s.phase = .exchangingMTU
            s.deadline = nil
            if s.toldEarly {
                counters.connected &+= 1
                tell(slot, .connection(connected: true, mtu: s.mtu, error: 0), to: &listener)
            }
            send(slot, .exchangeMTU(clientRxMTU: Self.receiveMTU), awaiting: .mtu, now: now, to: &listener)
        }
        while pool[slot] != nil, let pdu = pool[channel: slot].next(into: receive) {
            received(slot, pdu, now: now, to: &listener)
        }
        if pool[slot] != nil, case .closed = pool[channel: slot].state { serveChannel(slot, now: now, to: &listener) }
    }

    // MARK: PDUs from the device

    mutating func received<Listener: GATTListener & ~Copyable>(_ slot: Int, _ pdu: UnsafeRawBufferPointer, now: Instant,
                                                                to listener: inout Listener) {
        guard let s = pool[slot] else { return }
        let decoded: ATTServerPDU
        do throws(WireError) { decoded = try ATTServerPDU.decode(pdu) } catch {
            counters.malformed &+= 1
            end(slot, error: GATTConnectionError.gattError, to: &listener)
            return
        }
        switch decoded {
        case .notification(let handle, let value), .indication(let handle, let value):
            if case .indication = decoded { send(slot, .confirmation, awaiting: nil, now: now, to: &listener) }
            guard pool[slot] != nil, s.isNotifying(handle) else { return }
            counters.notifications &+= 1
            listener.gatt(.notification(handle: handle), client: s.client, address: s.address,
                          value: UnsafeRawBufferPointer(rebasing: pdu[value]), service: nil)
            return
        case .request(let opcode):
            // The device asks as a client (for our database): we have none to offer (§3.4.1.1).
            send(slot, .error(request: opcode, handle: 0, code: ATTErrorCode.requestNotSupported), awaiting: nil, now: now, to: &listener)
            return
        case .command:
            return
        default:
            break
        }
        guard let awaiting = s.awaiting else {
            // A response to nothing asked: the device broke the protocol.
            counters.malformed &+= 1
            end(slot, error: GATTConnectionError.gattError, to: &listener)
            return
        }
        s.awaiting = nil
        s.deadline = nil
        answered(slot, awaiting, decoded, pdu, now: now, to: &listener)
        if pool[slot] != nil { advance(slot, now: now, to: &listener) }
    }

    mutating func answered<Listener: GATTListener & ~Copyable>(
        _ slot: Int, _ awaiting: GATTSlot.Awaiting, _ pdu: ATTServerPDU, _ bytes: UnsafeRawBufferPointer, now: Instant,
        to listener: inout Listener
    ) {
        guard let s = pool[slot] else { return }
        switch awaiting {
        case .mtu:
            if case .exchangeMTU(let server) = pdu { s.mtu = ATTMTU.agreed(client: Self.receiveMTU, server: server) }
            // An error: the device keeps the least MTU (§3.4.2.2).
            s.phase = .ready
            if !s.toldEarly {
                counters.connected &+= 1
                tell(slot, .connection(connected: true, mtu: s.mtu, error: 0), to: &listener)
            }
        case .services(let next):
            discoverServices(slot, pdu, bytes, after: next, now: now, to: &listener)
        case .characteristics(let service, let next):
            discoverCharacteristics(slot, service: service, pdu, bytes, after: next, now: now, to: &listener)
        case .descriptors(let service, let characteristic, let start, let end):
            discoverDescriptors(slot, service: service, characteristic: characteristic, start: start, end: end, pdu, bytes, now: now,
                                to: &listener)
        case .read(let handle, let offset):
            switch pdu {
            case .read(let value), .readBlob(let value):
                let got = min(value.count, Self.valueLimit - offset)
                UnsafeMutableRawBufferPointer(rebasing: s.value[offset ..< offset + got])
                    .copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[value.lowerBound ..< value.lowerBound + got]))
                let total = offset + got
                // A value that filled the PDU may go on (§3.4.4.5, Read Blob); 512 is the most there is.
                if value.count == Int(s.mtu) - 1, total < Self.valueLimit {
                    send(slot, .readBlob(handle: handle, offset: UInt16(total)), awaiting: .read(handle: handle, offset: total),
                         now: now, to: &listener)
                    s.holdQueue = true
                    return
                }
                s.holdQueue = false
                tell(slot, .read(handle: handle), value: UnsafeRawBufferPointer(rebasing: s.value[..<total]), to: &listener)
            case .error(_, _, let code) where offset > 0 && code == ATTErrorCode.attributeNotLong:
                s.holdQueue = false
                tell(slot, .read(handle: handle), value: UnsafeRawBufferPointer(rebasing: s.value[..<offset]), to: &listener)
            case .error(_, _, let code):
                s.holdQueue = false
                tell(slot, .error(handle: handle, code: Int32(code)), to: &listener)
            default:
                s.holdQueue = false
                protocolBroken(slot, to: &listener)
            }
        case .write(let handle):
            switch pdu {
            case .written: tell(slot, .wrote(handle: handle), to: &listener)
            case .error(_, _, let code): tell(slot, .error(handle: handle, code: Int32(code)), to: &listener)
            default: protocolBroken(slot, to: &listener)
            }
        }
    }

    mutating func protocolBroken<Listener: GATTListener & ~Copyable>(_ slot: Int, to listener: inout Listener) {
        counters.malformed &+= 1
        end(slot, error: GATTConnectionError.gattError, to: &listener)
    }

    // MARK: Discovery (Vol 3, Part G, §4.4.1, §4.6.1, §4.7.1)

    mutating func discoverServices<Listener: GATTListener & ~Copyable>(
        _ slot: Int, _ pdu: ATTServerPDU, _ bytes: UnsafeRawBufferPointer, after start: UInt16, now: Instant, to listener: inout Listener
    ) {
        guard let s = pool[slot] else { return }
        switch pdu {
        case .byGroupType(let list):
            var last = start
            for i in 0 ..< list.count {
                let range = list.entry(i)
                guard let service = try? GATTService.decode(UnsafeRawBufferPointer(rebasing: bytes[range]), at: range.lowerBound),
                      service.start >= start, service.end >= service.start else {
                    protocolBroken(slot, to: &listener)
                    return
                }
                guard s.services.count < Self.servicesPerDevice else {
                    discoveryFailed(slot, code: Int32(ATTErrorCode.insufficientResources), to: &listener)
                    return
                }
                s.services.append(service)
                last = service.end
            }
            if last < 0xFFFF {
                send(slot, .readByGroupType(start: last + 1, end: 0xFFFF, type: GATTType.primaryService),
                     awaiting: .services(next: last + 1), now: now, to: &listener)
                return
            }
        default:
            guard phaseEnded(slot, pdu, to: &listener) else { return }
        }
        nextService(slot, 0, now: now, to: &listener)
    }

    /// Starts the characteristics of service `index`, or ends discovery after the last.
    mutating func nextService<Listener: GATTListener & ~Copyable>(_ slot: Int, _ index: Int, now: Instant, to listener: inout Listener) {
        guard let s = pool[slot] else { return }
        s.characteristics.removeAll(keepingCapacity: true)
        s.descriptors.removeAll(keepingCapacity: true)
        guard index < s.services.count else {
            s.holdQueue = false
            tell(slot, .servicesDone, to: &listener)
            return
        }
        let service = s.services[index]
        send(slot, .readByType(start: service.start, end: service.end, type: GATTType.characteristic),
             awaiting: .characteristics(service: index, next: service.start), now: now, to: &listener)
    }

    mutating func discoverCharacteristics<Listener: GATTListener & ~Copyable>(
        _ slot: Int, service index: Int, _ pdu: ATTServerPDU, _ bytes: UnsafeRawBufferPointer, after start: UInt16, now: Instant,
        to listener: inout Listener
    ) {
        guard let s = pool[slot] else { return }
        let service = s.services[index]
        switch pdu {
        case .byType(let list):
            var last = start
            for i in 0 ..< list.count {
                let range = list.entry(i)
                guard let c = try? GATTCharacteristic.decode(UnsafeRawBufferPointer(rebasing: bytes[range]), at: range.lowerBound),
                      c.declaration >= start, c.declaration <= service.end else {
                    protocolBroken(slot, to: &listener)
                    return
                }
                guard s.characteristics.count < Self.characteristicsPerService else {
                    discoveryFailed(slot, code: Int32(ATTErrorCode.insufficientResources), to: &listener)
                    return
                }
                s.characteristics.append(c)
                last = c.declaration
            }
            if last < service.end {
                send(slot, .readByType(start: last + 1, end: service.end, type: GATTType.characteristic),
                     awaiting: .characteristics(service: index, next: last + 1), now: now, to: &listener)
                return
            }
        default:
            guard phaseEnded(slot, pdu, to: &listener) else { return }
        }
        nextDescriptors(slot, service: index, from: 0, now: now, to: &listener)
    }

    /// The descriptors of the first characteristic from `first` that has room for any: the
    /// handles after its value up to the next declaration or the service's end.
    mutating func nextDescriptors<Listener: GATTListener & ~Copyable>(_ slot: Int, service index: Int, from first: Int, now: Instant,
                                                                       to listener: inout Listener) {
        guard let s = pool[slot] else { return }
        let service = s.services[index]
        var c = first
        while c < s.characteristics.count {
            let start = s.characteristics[c].valueHandle &+ 1
            let end = c + 1 < s.characteristics.count ? s.characteristics[c + 1].declaration &- 1 : service.end
            if s.characteristics[c].valueHandle < end {
                send(slot, .findInformation(start: start, end: end), awaiting: .descriptors(service: index, characteristic: c, start: start, end: end),
                     now: now, to: &listener)
                return
            }
            c += 1
        }
        // The service is whole: told, then the next.
        let view = GATTServiceView(service: service, characteristics: s.characteristics[...], descriptors: s.descriptors[...])
        listener.gatt(.service, client: s.client, address: s.address, value: UnsafeRawBufferPointer(start: nil, count: 0), service: view)
        nextService(slot, index + 1, now: now, to: &listener)
    }

    mutating func discoverDescriptors<Listener: GATTListener & ~Copyable>(
        _ slot: Int, service index: Int, characteristic c: Int, start: UInt16, end: UInt16, _ pdu: ATTServerPDU,
        _ bytes: UnsafeRawBufferPointer,
        now: Instant, to listener: inout Listener
    ) {
        guard let s = pool[slot] else { return }
        switch pdu {
        case .information(let list):
            var last: UInt16 = 0
            for i in 0 ..< list.count {
                let range = list.entry(i)
                guard let d = try? GATTDescriptor.decode(UnsafeRawBufferPointer(rebasing: bytes[range]), at: range.lowerBound),
                      d.handle >= start, d.handle <= end else {
                    // Outside what was asked (an earlier handle would ask the same range again, for ever).
                    protocolBroken(slot, to: &listener)
                    return
                }
                guard s.descriptors.count < Self.descriptorsPerService else {
                    discoveryFailed(slot, code: Int32(ATTErrorCode.insufficientResources), to: &listener)
                    return
                }
                s.descriptors.append(GATTDiscoveredDescriptor(characteristic: c, descriptor: d))
                last = d.handle
            }
            if last < end {
                send(slot, .findInformation(start: last + 1, end: end), awaiting: .descriptors(service: index, characteristic: c, start: last + 1, end: end),
                     now: now, to: &listener)
                return
            }
        default:
            guard phaseEnded(slot, pdu, to: &listener) else { return }
        }
        nextDescriptors(slot, service: index, from: c + 1, now: now, to: &listener)
    }

    /// A discovery response that is not its list: Attribute Not Found ends the phase (true: go
    /// on, §4.4.1); another error fails discovery and anything else breaks the protocol (false:
    /// told, stop).
    mutating func phaseEnded<Listener: GATTListener & ~Copyable>(_ slot: Int, _ pdu: ATTServerPDU, to listener: inout Listener) -> Bool {
        switch pdu {
        case .error(_, _, ATTErrorCode.attributeNotFound):
            return true
        case .error(_, _, let code):
            discoveryFailed(slot, code: Int32(code), to: &listener)
        default:
            protocolBroken(slot, to: &listener)
        }
        return false
    }

    mutating func discoveryFailed<Listener: GATTListener & ~Copyable>(_ slot: Int, code: Int32, to listener: inout Listener) {
        guard let s = pool[slot] else { return }
        s.holdQueue = false
        tell(slot, .error(handle: 0, code: code), to: &listener)
    }

    // MARK: The queue

    mutating func enqueue<Listener: GATTListener & ~Copyable>(_ slot: Int, _ ask: GATTAsk, data: UnsafeRawBufferPointer,
                                                               to listener: inout Listener) {
        guard let s = pool[slot] else { return }
        let handle = ask.handle
        guard data.count <= Self.valueLimit else {
            tell(slot, .error(handle: handle, code: Int32(ATTErrorCode.invalidAttributeValueLength)), to: &listener)
            return
        }
        guard s.push(ask, data: data) else {
            counters.refused &+= 1
            tell(slot, .error(handle: handle, code: Int32(ATTErrorCode.insufficientResources)), to: &listener)
            return
        }
    }

    /// Sends the next queued request when none is in flight.
    mutating func advance<Listener: GATTListener & ~Copyable>(_ slot: Int, now: Instant, to listener: inout Listener) {
        while let s = pool[slot], s.phase == .ready, s.awaiting == nil, !s.holdQueue, s.unsent == 0, let (ask, data) = s.pop() {
            switch ask {
            case .services:
                s.services.removeAll(keepingCapacity: true)
                s.holdQueue = true
                send(slot, .readByGroupType(start: 1, end: 0xFFFF, type: GATTType.primaryService), awaiting: .services(next: 1),
                     now: now, to: &listener)
            case .read(let handle), .readDescriptor(let handle):
                send(slot, .read(handle: handle), awaiting: .read(handle: handle, offset: 0), now: now, to: &listener)
            case .write(let handle, true), .writeDescriptor(let handle):
                if data.count > Int(s.mtu) - 3 {
                    tell(slot, .error(handle: handle, code: Int32(ATTErrorCode.invalidAttributeValueLength)), to: &listener)
                    continue
                }
                send(slot, .write(handle: handle, value: data), awaiting: .write(handle: handle), now: now, to: &listener)
            case .write(let handle, false):
                send(slot, .writeCommand(handle: handle, value: data), awaiting: nil, now: now, to: &listener)
            case .connect, .disconnect, .notify:
                continue
            }
        }
    }

    /// Sends `request`, waiting for `awaiting` (nil: nothing comes back). A socket without room
    /// keeps it until POLLOUT (nothing else is sent meanwhile).
    mutating func send<Listener: GATTListener & ~Copyable>(_ slot: Int, _ request: ATTRequest, awaiting: GATTSlot.Awaiting?,
                                                            now: Instant, to listener: inout Listener) {
        guard let s = pool[slot] else { return }
        // The answers to the device's own PDUs (a confirmation, a refusal) have a buffer of their
        // own: they may be due while a Write Command still waits for room in `outgoing`.
        let reply: Bool = switch request {
        case .confirmation, .error: true
        default: false
        }
        var w = ByteWriter(reply ? s.reply : s.outgoing)
        do throws(WireError) { try request.encode(into: &w) } catch {
            // Proof: every request the queue holds fits 517 bytes (values are bounded by the MTU),
            // and a reply is at most 5.
            preconditionFailure("an ATT request over \(s.outgoing.count) bytes")
        }
        if reply {
            // A device that sends a second before the first left: the older one is replaced
            // (the socket had no room for either).
            s.replyUnsent = w.count
        } else {
            s.unsent = w.count
        }
        if let awaiting {
            s.awaiting = awaiting
            s.deadline = now + Self.transactionTimeout
        }
        flushUnsent(slot, to: &listener)
    }

    mutating func flushUnsent<Listener: GATTListener & ~Copyable>(_ slot: Int, to listener: inout Listener) {
        guard let s = pool[slot], s.unsent > 0 || s.replyUnsent > 0 else { return }
        do throws(LinkError) {
            if s.replyUnsent > 0, try pool[channel: slot].send(UnsafeRawBufferPointer(rebasing: s.reply[..<s.replyUnsent])) {
                s.replyUnsent = 0
            }
            if s.unsent > 0, try pool[channel: slot].send(UnsafeRawBufferPointer(rebasing: s.outgoing[..<s.unsent])) { s.unsent = 0 }
        } catch {
            end(slot, error: GATTConnectionError.peerTerminated, to: &listener)
        }
    }

    // MARK: Telling the client

    mutating func tell<Listener: GATTListener & ~Copyable>(_ slot: Int, _ event: GATTEvent,
                                                            value: UnsafeRawBufferPointer = UnsafeRawBufferPointer(start: nil, count: 0),
                                                            to listener: inout Listener) {
        guard let s = pool[slot] else { return }
        listener.gatt(event, client: s.client, address: s.address, value: value, service: nil)
    }

    /// Closes the connection and tells its client it is gone, with why.
    mutating func end<Listener: GATTListener & ~Copyable>(_ slot: Int, error: Int32, to listener: inout Listener) {
        guard let s = pool[slot] else { return }
        let client = s.client, address = s.address
        pool.close(slot)
        slotsChanged = true
        listener.gatt(.connection(connected: false, mtu: 0, error: error), client: client, address: address,
                      value: UnsafeRawBufferPointer(start: nil, count: 0), service: nil)
    }

    public func writeStats(into w: inout JSONWriter) throws(WireError) {
        try w.beginObject()
        try w.key("slots"); try w.int(Int64(limit))
        try w.key("connected_now"); try w.int(Int64(pool.count))
        try w.key("connects"); try w.int(Int64(counters.connects))
        try w.key("connected"); try w.int(Int64(counters.connected))
        try w.key("refused_full"); try w.int(Int64(counters.refusedFull))
        try w.key("failed"); try w.int(Int64(counters.failed))
        try w.key("timed_out"); try w.int(Int64(counters.timedOut))
        try w.key("malformed"); try w.int(Int64(counters.malformed))
        try w.key("refused"); try w.int(Int64(counters.refused))
        try w.key("notifications"); try w.int(Int64(counters.notifications))
        try w.endObject()
    }
}

/// One connection's GATT client state, made once per slot at start and reset for each
/// connection the slot holds: its buffers are fixed, so a connection allocates nothing.
final class GATTSlot {
    enum Phase { case connecting, exchangingMTU, ready }
    enum Awaiting: Equatable {
        case mtu
        case services(next: UInt16)
        case characteristics(service: Int, next: UInt16)
        case descriptors(service: Int, characteristic: Int, start: UInt16, end: UInt16)
        case read(handle: UInt16, offset: Int)
        case write(handle: UInt16)
    }

    var client = GATTClient(slot: -1, serial: 0)
    var address: UInt64 = 0
    var phase = Phase.connecting
    /// Told connected when the link came up (a client with a cache), not after the MTU.
    var toldEarly = false
    var mtu = ATTMTU.minimum
    /// The connect's end, or the request in flight's (§3.3.3).
    var deadline: Instant?
    var awaiting: Awaiting?
    /// A request of several PDUs (discovery, a long read) is under way: the queue waits.
    var holdQueue = false
    /// The request being sent: `unsent` bytes of `outgoing` the socket has not taken yet.
    let outgoing: UnsafeMutableRawBufferPointer
    var unsent = 0
    /// A confirmation or refusal for the device, not yet taken by the socket.
    let reply: UnsafeMutableRawBufferPointer
    var replyUnsent = 0
    /// A long read's value as it gathers.
    let value: UnsafeMutableRawBufferPointer
    var services: [GATTService] = []
    var characteristics: [GATTCharacteristic] = []
    var descriptors: [GATTDiscoveredDescriptor] = []
    /// Value handles whose notifications the client asked for.
    var notifying: [UInt16] = []
    /// The queue: asks in order, each with its data at a fixed place in `queued`.
    var asks: [(GATTAsk, Int)] = []
    var queueHead = 0
    let queued: UnsafeMutableRawBufferPointer

    static let notifyLimit = 32
    static var bytes: Int {
        Int(GATTConnections.receiveMTU) + 8 + GATTConnections.valueLimit * (1 + GATTConnections.queueLimit)
            + GATTConnections.servicesPerDevice * MemoryLayout<GATTService>.stride
            + GATTConnections.characteristicsPerService * MemoryLayout<GATTCharacteristic>.stride
            + GATTConnections.descriptorsPerService * MemoryLayout<GATTDiscoveredDescriptor>.stride
            + notifyLimit * 2 + GATTConnections.queueLimit * MemoryLayout<(GATTAsk, Int)>.stride
    }

    init() {
        outgoing = .allocate(byteCount: Int(GATTConnections.receiveMTU), alignment: 8)
        reply = .allocate(byteCount: 8, alignment: 8)
        value = .allocate(byteCount: GATTConnections.valueLimit, alignment: 8)
        queued = .allocate(byteCount: GATTConnections.valueLimit * GATTConnections.queueLimit, alignment: 8)
        services.reserveCapacity(GATTConnections.servicesPerDevice)
        characteristics.reserveCapacity(GATTConnections.characteristicsPerService)
        descriptors.reserveCapacity(GATTConnections.descriptorsPerService)
        notifying.reserveCapacity(Self.notifyLimit)
        asks.reserveCapacity(GATTConnections.queueLimit)
    }

    deinit {
        outgoing.deallocate()
        reply.deallocate()
        value.deallocate()
        queued.deallocate()
    }

    func reset(client: GATTClient, address: UInt64, deadline: Instant) {
        self.client = client
        self.address = address
        self.deadline = deadline
        phase = .connecting
        mtu = ATTMTU.minimum
        awaiting = nil
        holdQueue = false
        unsent = 0
        replyUnsent = 0
        services.removeAll(keepingCapacity: true)
        characteristics.removeAll(keepingCapacity: true)
        descriptors.removeAll(keepingCapacity: true)
        notifying.removeAll(keepingCapacity: true)
        asks.removeAll(keepingCapacity: true)
        queueHead = 0
    }

    func isNotifying(_ handle: UInt16) -> Bool { notifying.contains(handle) }

    func setNotifying(_ handle: UInt16, _ on: Bool) {
        if on {
            if !notifying.contains(handle), notifying.count < Self.notifyLimit { notifying.append(handle) }
        } else if let i = notifying.firstIndex(of: handle) {
            notifying.remove(at: i)
        }
    }

    /// Queues `ask` with a copy of `data`. False: the queue is full.
    func push(_ ask: GATTAsk, data: UnsafeRawBufferPointer) -> Bool {
        if queueHead == asks.count {
            asks.removeAll(keepingCapacity: true)
            queueHead = 0
        }
        guard asks.count - queueHead < GATTConnections.queueLimit else { return false }
        // The place of a queued ask's data: the first of the queue's places no waiting ask holds.
        var place = 0
        while asks[queueHead...].contains(where: { ($0.1 & 0xFFFF) / GATTConnections.valueLimit == place }) { place += 1 }
        if asks.count == GATTConnections.queueLimit {
            // Keep the array within its capacity: drop what was taken already.
            asks.removeFirst(queueHead)
            queueHead = 0
        }
        let at = place * GATTConnections.valueLimit
        if data.count > 0 { UnsafeMutableRawBufferPointer(rebasing: queued[at ..< at + data.count]).copyMemory(from: data) }
        asks.append((ask, at | data.count << 16))
        return true
    }

    /// The next ask and its data (valid until the next push).
    func pop() -> (GATTAsk, UnsafeRawBufferPointer)? {
        guard queueHead < asks.count else { return nil }
        let (ask, packed) = asks[queueHead]
        queueHead += 1
        let at = packed & 0xFFFF, count = packed >> 16
        return (ask, UnsafeRawBufferPointer(rebasing: queued[at ..< at + count]))
    }
}
