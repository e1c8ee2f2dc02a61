// What a GATT proxy's two halves say to each other (docs/esphome.md §11): the ESPHome server
// (BatonProxy) turns Home Assistant's requests into `GATTAsk`s, and the connections
// (BatonRelay's `GATTConnections`, over ATT) answer through a `GATTListener` with
// `GATTEvent`s. Neither knows the other's protocol; the gateway routes between them.

/// Who asked: an ESPHome client's slot and its serial (a later client in the same slot is
/// another client, and hears nothing of its predecessor's connections).
public struct GATTClient: Equatable, Sendable {
    public var slot: Int
    public var serial: UInt64
    public init(slot: Int, serial: UInt64) { self.slot = slot; self.serial = serial }
}

/// What a client asks of a device (ESPHome messages 68, 70, 73, 75–78, docs/esphome.md §11).
public enum GATTAsk: Equatable, Sendable {
    /// Connect at the advertised address type (0 public, 1 random). `withCache`: the client
    /// holds the device's services and MTU from before, and is told it is connected as soon as
    /// the link is up (as an ESP32 tells `CONNECT_V3_WITH_CACHE`); otherwise once the MTU is
    /// agreed.
    case connect(addressType: UInt8, withCache: Bool = false)
    case disconnect
    /// The device's services, characteristics and descriptors.
    case services
    case read(handle: UInt16)
    case readDescriptor(handle: UInt16)
    /// `data` alongside; `response`: a Write Request (answered) or a Write Command (§3.4.5).
    case write(handle: UInt16, response: Bool)
    case writeDescriptor(handle: UInt16)
    /// Pass on (or stop passing on) the characteristic's notifications and indications. The
    /// client writes the descriptor that turns them on itself, as with an ESP32 (bleak-esphome
    /// does for a proxy with remote caching).
    case notify(handle: UInt16, enable: Bool)
}

extension GATTAsk {
    /// The attribute it names; 0 for connect, disconnect and the services.
    public var handle: UInt16 {
        switch self {
        case .read(let h), .readDescriptor(let h), .write(let h, _), .writeDescriptor(let h), .notify(let h, _): h
        case .connect, .disconnect, .services: 0
        }
    }

    /// Its answer when there is no connection to ask: a connect or disconnect is told "not
    /// connected" (a disconnect of nothing is done, as an ESP32 says), anything else an error
    /// (−1, as an ESP32 answers).
    public var notConnected: GATTEvent {
        switch self {
        case .connect, .disconnect: .connection(connected: false, mtu: 0, error: GATTConnectionError.none)
        default: .error(handle: handle, code: GATTConnectionError.notConnected)
        }
    }
}

/// What a connection tells its client.
public enum GATTEvent: Equatable, Sendable {
    /// Connected (with the agreed ATT MTU) or not (with why: `GATTConnectionError`).
    case connection(connected: Bool, mtu: UInt16, error: Int32)
    /// One service, whole: in `GATTListener.gatt`'s `service`.
    case service
    case servicesDone
    /// A value read: in `value`.
    case read(handle: UInt16)
    case wrote(handle: UInt16)
    case notifying(handle: UInt16)
    /// A notification or indication: in `value`.
    case notification(handle: UInt16)
    /// A request that failed: an ATT error code (Vol 3, Part F, §3.4.1.1), or
    /// `GATTConnectionError.notConnected`.
    case error(handle: UInt16, code: Int32)
}

/// The codes Home Assistant's clients read (aioesphomeapi ble_defs.py `BLEConnectionError`:
/// ESP-IDF's names for HCI disconnect reasons, Core 5.4, Vol 1, Part F).
public enum GATTConnectionError {
    public static let none: Int32 = 0
    /// 0x08 Connection Timeout: the device went out of range (or never answered a request).
    public static let timeout: Int32 = 0x08
    /// 0x13 Remote User Terminated Connection: the device hung up.
    public static let peerTerminated: Int32 = 0x13
    /// 0x16 Connection Terminated By Local Host: the gateway ended it.
    public static let localHost: Int32 = 0x16
    /// 0x3E Connection Failed to be Established: the device did not answer the connect.
    public static let failedToEstablish: Int32 = 0x3E
    /// ESP_GATT_ERROR: the device broke the Attribute Protocol.
    public static let gattError: Int32 = 0x85
    /// A GATT request on an address with no connection (an ESP32 answers −1).
    public static let notConnected: Int32 = -1
}

/// One service as discovery found it, borrowed for the listener's call.
public struct GATTServiceView {
    public let service: GATTService
    public let characteristics: ArraySlice<GATTCharacteristic>
    /// Each descriptor with the index (in `characteristics`) of the characteristic it belongs to.
    public let descriptors: ArraySlice<GATTDiscoveredDescriptor>
    public init(service: GATTService, characteristics: ArraySlice<GATTCharacteristic>, descriptors: ArraySlice<GATTDiscoveredDescriptor>) {
        self.service = service; self.characteristics = characteristics; self.descriptors = descriptors
    }
}

public struct GATTDiscoveredDescriptor: Equatable, Sendable {
    public var characteristic: Int
    public var descriptor: GATTDescriptor
    public init(characteristic: Int, descriptor: GATTDescriptor) { self.characteristic = characteristic; self.descriptor = descriptor }
}

/// Who hears the connections: the ESPHome server.
public protocol GATTListener: ~Copyable {
    /// Whether the client is still connected: one that left takes its connections with it.
    func isPresent(_ client: GATTClient) -> Bool
    /// `value`: the bytes of `.read` and `.notification`; `service`: `.service`'s.
    mutating func gatt(_ event: GATTEvent, client: GATTClient, address: UInt64, value: UnsafeRawBufferPointer,
                       service: GATTServiceView?)
    /// The slots changed: how many are free, of how many, and the addresses connected.
    mutating func connectionSlots(free: Int, limit: Int, allocated: ArraySlice<UInt64>)
}
