// The ESPHome server's half of active connections (docs/esphome.md §11): a client's GATT
// messages become `GATTAsk`s queued for the gateway to hand to the connections, and what the
// connections tell (`GATTListener`) becomes messages to the client that asked.
import BatonLibc
import BatonWire

extension ProxyServer {
    /// The most data one ask carries: a value (Core 5.4, Vol 3, Part F, §3.2.9).
    public static var askDataLimit: Int { 512 }

    /// The next ask of this turn and its data (valid until the next turn's `serve`); nil when
    /// all are taken.
    public mutating func nextGATTAsk() -> (client: GATTClient, address: UInt64, ask: GATTAsk, data: UnsafeRawBufferPointer)? {
        guard gattAskTaken < gattAsks.count else {
            gattAsks.removeAll(keepingCapacity: true)
            gattAskTaken = 0
            return nil
        }
        let a = gattAsks[gattAskTaken]
        let at = gattAskTaken * Self.askDataLimit
        gattAskTaken += 1
        return (a.client, a.address, a.ask, UnsafeRawBufferPointer(rebasing: askData[at ..< at + a.data]))
    }

    /// What is left of the last turn's asks, refused (counted `gattAsksRefused`), and the queue
    /// emptied.
    mutating func refuseUntakenAsks() {
        while gattAskTaken < gattAsks.count {
            let a = gattAsks[gattAskTaken]
            gattAskTaken += 1
            counters.gattAsksRefused &+= 1
            refuse(a.ask, client: a.client, address: a.address)
        }
        gattAsks.removeAll(keepingCapacity: true)
        gattAskTaken = 0
    }

    mutating func gatt(_ i: Int, _ message: GATTMessage, body: UnsafeRawBufferPointer) {
        switch message {
        case .subscribeConnectionsFree:
            slots[i].hearsConnectionSlots = true
            sendConnectionSlots(i)
        case .unsupported(let address, let type):
            // Pairing (8) and cache clearing (16) are not offered; a client that asks anyway
            // hears its request failed, as from an ESP32 built without them.
            let answer: UInt32 = switch type {
            case DeviceRequestType.pair: MessageType.bluetoothDevicePairingResponse
            case DeviceRequestType.unpair: MessageType.bluetoothDeviceUnpairingResponse
            case DeviceRequestType.clearCache: MessageType.bluetoothDeviceClearCacheResponse
            default: 0
            }
            if answer == 0 {
                log.notice("esphome: \(slots[i].peer) sent a device request of type \(type), which api.proto does not define")
            } else {
                enqueue(i, type: answer, GATTVarintMessage.refused(address: address))
            }
        case .ask(let address, let ask, let data):
            let client = GATTClient(slot: i, serial: slots[i].serial)
            guard settings.connections > 0 else {
                // Connections are off (`esphome.connections: 0`, or no device link).
                return refuse(ask, client: client, address: address)
            }
            guard gattAsks.count < Self.gattAskLimit, data.count <= Self.askDataLimit else {
                counters.gattAsksRefused &+= 1
                return refuse(ask, client: client, address: address)
            }
            let at = gattAsks.count * Self.askDataLimit
            if !data.isEmpty {
                UnsafeMutableRawBufferPointer(rebasing: askData[at ..< at + data.count])
                    .copyMemory(from: UnsafeRawBufferPointer(rebasing: body[data]))
            }
            gattAsks.append((client, address, ask, data.count))
        }
    }

    /// An ask answered here: no connection, or no room.
    mutating func refuse(_ ask: GATTAsk, client: GATTClient, address: UInt64) {
        gatt(ask.notConnected, client: client, address: address, value: UnsafeRawBufferPointer(start: nil, count: 0), service: nil)
    }

    mutating func sendConnectionSlots(_ i: Int) {
        enqueue(i, type: MessageType.bluetoothConnectionsFreeResponse,
                ConnectionsFreeMessage(free: connectionsFree, limit: settings.connections, allocated: connectionsAllocated[...]))
    }
}

extension ProxyServer: GATTListener {
    public func isPresent(_ client: GATTClient) -> Bool {
        client.slot >= 0 && client.slot < slots.count && slots[client.slot].fd >= 0 && slots[client.slot].serial == client.serial
    }

    public mutating func gatt(_ event: GATTEvent, client: GATTClient, address: UInt64, value: UnsafeRawBufferPointer,
                              service: GATTServiceView?) {
        guard isPresent(client) else { return }
        let i = client.slot
        switch event {
        case .connection(let connected, let mtu, let error):
            enqueue(i, type: MessageType.bluetoothDeviceConnectionResponse,
                    GATTVarintMessage.connection(address: address, connected: connected, mtu: mtu, error: error))
        case .service:
            guard let service else { return }
            enqueue(i, type: MessageType.bluetoothGATTGetServicesResponse, GATTServicesMessage(address: address, view: service))
        case .servicesDone:
            enqueue(i, type: MessageType.bluetoothGATTGetServicesDoneResponse, GATTVarintMessage(address: address))
        case .read(let handle):
            enqueue(i, type: MessageType.bluetoothGATTReadResponse, GATTDataMessage(address: address, handle: handle, data: value))
        case .wrote(let handle):
            enqueue(i, type: MessageType.bluetoothGATTWriteResponse, GATTVarintMessage.handle(address: address, handle))
        case .notifying(let handle):
            enqueue(i, type: MessageType.bluetoothGATTNotifyResponse, GATTVarintMessage.handle(address: address, handle))
        case .notification(let handle):
            enqueue(i, type: MessageType.bluetoothGATTNotifyDataResponse, GATTDataMessage(address: address, handle: handle, data: value))
        case .error(let handle, let code):
            enqueue(i, type: MessageType.bluetoothGATTErrorResponse, GATTVarintMessage.error(address: address, handle: handle, code: code))
        }
    }

    public mutating func connectionSlots(free: Int, limit: Int, allocated: ArraySlice<UInt64>) {
        connectionsFree = free
        connectionsAllocated.removeAll(keepingCapacity: true)
        connectionsAllocated.append(contentsOf: allocated.prefix(settings.connections))
        for i in slots.indices where slots[i].fd >= 0 && slots[i].hearsConnectionSlots { sendConnectionSlots(i) }
    }
}
