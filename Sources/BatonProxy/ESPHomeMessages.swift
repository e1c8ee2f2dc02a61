// The ESPHome native API messages a passive Bluetooth proxy exchanges (docs/esphome.md §3).
// Numbers and field types are aioesphomeapi 46.23.0's api.proto (its compiled api_pb2), the
// protocol Home Assistant speaks: every message id is the `(id)` option of its message.
//
// Client → server messages are decoded by `ClientMessage.decode(type:body:)`, total over
// borrowed bytes: an unknown field is skipped, an unknown message type is `.other` (answered
// with nothing, as ESPHome does for a message it was built without), and bytes that are not
// protobuf throw `WireError`. Server → client messages compute their size, then write.
import BatonWire

/// Message type ids (api.proto, option `(id)`).
public enum MessageType {
    public static let helloRequest: UInt32 = 1
    public static let helloResponse: UInt32 = 2
    public static let connectRequest: UInt32 = 3
    public static let connectResponse: UInt32 = 4
    public static let disconnectRequest: UInt32 = 5
    public static let disconnectResponse: UInt32 = 6
    public static let pingRequest: UInt32 = 7
    public static let pingResponse: UInt32 = 8
    public static let deviceInfoRequest: UInt32 = 9
    public static let deviceInfoResponse: UInt32 = 10
    public static let listEntitiesRequest: UInt32 = 11
    public static let listEntitiesDoneResponse: UInt32 = 19
    public static let subscribeStatesRequest: UInt32 = 20
    public static let subscribeBluetoothLEAdvertisementsRequest: UInt32 = 66
    public static let unsubscribeBluetoothLEAdvertisementsRequest: UInt32 = 87
    public static let bluetoothLERawAdvertisementsResponse: UInt32 = 93
    public static let bluetoothScannerStateResponse: UInt32 = 126
    public static let bluetoothScannerSetModeRequest: UInt32 = 127
}

/// `BluetoothProxyFeature` bits of `DeviceInfoResponse.bluetooth_proxy_feature_flags`
/// (aioesphomeapi model.py): what this proxy does.
public enum ProxyFeature {
    public static let passiveScan: UInt32 = 1
    public static let rawAdvertisements: UInt32 = 32
    public static let stateAndMode: UInt32 = 64
    /// What Baton offers: passive scanning, raw advertisements, scanner state and mode. No
    /// active connections (GATT), no active scanning, no remote caching.
    public static let baton: UInt32 = passiveScan | rawAdvertisements | stateAndMode
}

/// `SubscribeBluetoothLEAdvertisementsRequest.flags` (aioesphomeapi
/// BluetoothProxySubscriptionFlag): bit 0 asks for raw advertisements.
public enum SubscriptionFlag {
    public static let rawAdvertisements: UInt32 = 1
}

/// `BluetoothScannerState` and `BluetoothScannerMode` (api.proto).
public enum ScannerState {
    public static let idle: UInt32 = 0
    public static let starting: UInt32 = 1
    public static let running: UInt32 = 2
    public static let failed: UInt32 = 3
    public static let stopping: UInt32 = 4
    public static let stopped: UInt32 = 5
}
public enum ScannerMode {
    public static let passive: UInt32 = 0
    public static let active: UInt32 = 1
}

/// A message from Home Assistant, decoded from its body.
public enum ClientMessage: Equatable {
    /// `HelloRequest` 1: client_info (string, 1), api_version_major (uint32, 2), minor (uint32, 3).
    /// `clientInfo` is where the text sits in the body.
    case hello(clientInfo: Range<Int>, major: UInt32, minor: UInt32)
    case disconnectRequest
    case disconnectResponse
    case pingRequest
    case pingResponse
    case deviceInfoRequest
    case listEntitiesRequest
    case subscribeStatesRequest
    /// `SubscribeBluetoothLEAdvertisementsRequest` 66: flags (uint32, 1).
    case subscribeAdvertisements(flags: UInt32)
    case unsubscribeAdvertisements
    /// `BluetoothScannerSetModeRequest` 127: mode (enum, 1).
    case setScannerMode(UInt32)
    /// Any other message: a valid protobuf body that a passive proxy has nothing to do with.
    case other(type: UInt32)

    /// Decodes a message's body. Every body is walked to its end, so a body that is not
    /// protobuf throws even when the type carries no fields.
    public static func decode(type: UInt32, body: UnsafeRawBufferPointer) throws(WireError) -> ClientMessage {
        var fields = ProtoFieldReader(body)
        switch type {
        case MessageType.helloRequest:
            var info = 0..<0
            var major: UInt32 = 0, minor: UInt32 = 0
            while let f = try fields.next() {
                switch (f.number, f.wireType) {
                case (1, Protobuf.lengthDelimited):
                    // Proof: f.bytes lies inside body (ProtoFieldReader reads only from it).
                    let start = f.bytes.baseAddress.map { $0 - body.baseAddress! } ?? 0
                    info = start..<start &+ f.bytes.count
                case (2, Protobuf.varint): major = UInt32(truncatingIfNeeded: f.value)
                case (3, Protobuf.varint): minor = UInt32(truncatingIfNeeded: f.value)
                default: break
                }
            }
            return .hello(clientInfo: info, major: major, minor: minor)
        case MessageType.subscribeBluetoothLEAdvertisementsRequest:
            var flags: UInt32 = 0
            while let f = try fields.next() {
                if f.number == 1, f.wireType == Protobuf.varint { flags = UInt32(truncatingIfNeeded: f.value) }
            }
            return .subscribeAdvertisements(flags: flags)
        case MessageType.bluetoothScannerSetModeRequest:
            var mode: UInt32 = 0
            while let f = try fields.next() {
                if f.number == 1, f.wireType == Protobuf.varint { mode = UInt32(truncatingIfNeeded: f.value) }
            }
            return .setScannerMode(mode)
        default:
            while try fields.next() != nil {}
            switch type {
            case MessageType.disconnectRequest: return .disconnectRequest
            case MessageType.disconnectResponse: return .disconnectResponse
            case MessageType.pingRequest: return .pingRequest
            case MessageType.pingResponse: return .pingResponse
            case MessageType.deviceInfoRequest: return .deviceInfoRequest
            case MessageType.listEntitiesRequest: return .listEntitiesRequest
            case MessageType.subscribeStatesRequest: return .subscribeStatesRequest
            case MessageType.unsubscribeBluetoothLEAdvertisementsRequest: return .unsubscribeAdvertisements
            default: return .other(type: type)
            }
        }
    }
}

/// A server → client message: its body's size, and how to write the body. The frame writer
/// takes the message type beside it.
public protocol ServerMessage {
    var bodySize: Int { get }
    /// Writes exactly `bodySize` bytes (the caller reserved them).
    func writeBody(_ w: inout ByteWriter)
}

/// A message with no fields: PingRequest/Response, DisconnectRequest/Response,
/// ListEntitiesDoneResponse.
public struct EmptyMessage: ServerMessage {
    public init() {}
    public var bodySize: Int { 0 }
    public func writeBody(_ w: inout ByteWriter) {}
}

/// `HelloResponse` 2: api_version_major (1), api_version_minor (2), server_info (3), name (4).
public struct HelloResponse: ServerMessage {
    /// The API version Baton speaks: 1.10, what ESPHome 2024.x answered; aioesphomeapi refuses
    /// only a major above 2, and Home Assistant's Bluetooth checks the feature flags instead.
    public static let apiMajor: UInt32 = 1
    public static let apiMinor: UInt32 = 10
    public let serverInfo: [UInt8]
    public let name: [UInt8]

    public init(serverInfo: [UInt8], name: [UInt8]) {
        self.serverInfo = serverInfo
        self.name = name
    }

    public var bodySize: Int {
        Protobuf.varintFieldSize(1, UInt64(Self.apiMajor)) &+ Protobuf.varintFieldSize(2, UInt64(Self.apiMinor))
            &+ Protobuf.bytesFieldSize(3, serverInfo.count) &+ Protobuf.bytesFieldSize(4, name.count)
    }

    public func writeBody(_ w: inout ByteWriter) {
        Protobuf.writeVarintField(1, UInt64(Self.apiMajor), &w)
        Protobuf.writeVarintField(2, UInt64(Self.apiMinor), &w)
        serverInfo.withUnsafeBytes { Protobuf.writeBytesField(3, $0, &w) }
        name.withUnsafeBytes { Protobuf.writeBytesField(4, $0, &w) }
    }
}

/// What `DeviceInfoResponse` says of the gateway; text as UTF-8 bytes, made once at start.
public struct DeviceInfo: Sendable, Equatable {
    /// `name` (2): the node name Home Assistant keys the device by (ESPHome: ≤ 31 bytes).
    public var name: [UInt8]
    /// `mac_address` (3): "AA:BB:CC:DD:EE:FF", as ESPHome writes it (upper case).
    public var macAddress: [UInt8]
    /// `esphome_version` (4): the ESPHome release whose API this follows.
    public var esphomeVersion: [UInt8]
    /// `model` (6), `manufacturer` (12), `friendly_name` (13).
    public var model: [UInt8]
    /// `project_name` (8), "author.project", and `project_version` (9). Home Assistant takes
    /// the device's manufacturer and model from the name's two parts, shows the version as
    /// "0.4.0 (ESPHome 2025.5.0)", and leaves a named project's firmware to the project: no
    /// "outdated ESPHome firmware" repair for `esphome_version` (homeassistant/components/
    /// esphome/manager.py `_async_check_firmware_version`, 2025.4.4). Empty: not sent.
    public var projectName: [UInt8]
    public var projectVersion: [UInt8]
    public var manufacturer: [UInt8]
    public var friendlyName: [UInt8]
    /// `bluetooth_mac_address` (18): the Bluetooth controller's address, same format.
    public var bluetoothMacAddress: [UInt8]
    /// `bluetooth_proxy_feature_flags` (15).
    public var featureFlags: UInt32
    /// `api_encryption_supported` (19): true when the server speaks Noise.
    public var encryptionSupported: Bool

    public init(name: String, macAddress: String, esphomeVersion: String, model: String, manufacturer: String,
                friendlyName: String, bluetoothMacAddress: String, featureFlags: UInt32 = ProxyFeature.baton,
                encryptionSupported: Bool, projectName: String = "", projectVersion: String = "") {
        self.name = Array(name.utf8)
        self.macAddress = Array(macAddress.utf8)
        self.esphomeVersion = Array(esphomeVersion.utf8)
        self.model = Array(model.utf8)
        self.projectName = Array(projectName.utf8)
        self.projectVersion = Array(projectVersion.utf8)
        self.manufacturer = Array(manufacturer.utf8)
        self.friendlyName = Array(friendlyName.utf8)
        self.bluetoothMacAddress = Array(bluetoothMacAddress.utf8)
        self.featureFlags = featureFlags
        self.encryptionSupported = encryptionSupported
    }
}

/// `DeviceInfoResponse` 10, the fields above in field-number order.
public struct DeviceInfoResponse: ServerMessage {
    public let info: DeviceInfo
    public init(_ info: DeviceInfo) { self.info = info }

    public var bodySize: Int {
        Protobuf.bytesFieldSize(2, info.name.count) &+ Protobuf.bytesFieldSize(3, info.macAddress.count)
            &+ Protobuf.bytesFieldSize(4, info.esphomeVersion.count) &+ Protobuf.bytesFieldSize(6, info.model.count)
            &+ Protobuf.bytesFieldSize(8, info.projectName.count) &+ Protobuf.bytesFieldSize(9, info.projectVersion.count)
            &+ Protobuf.bytesFieldSize(12, info.manufacturer.count) &+ Protobuf.bytesFieldSize(13, info.friendlyName.count)
            &+ Protobuf.varintFieldSize(15, UInt64(info.featureFlags))
            &+ Protobuf.bytesFieldSize(18, info.bluetoothMacAddress.count)
            &+ Protobuf.varintFieldSize(19, info.encryptionSupported ? 1 : 0)
    }

    public func writeBody(_ w: inout ByteWriter) {
        info.name.withUnsafeBytes { Protobuf.writeBytesField(2, $0, &w) }
        info.macAddress.withUnsafeBytes { Protobuf.writeBytesField(3, $0, &w) }
        info.esphomeVersion.withUnsafeBytes { Protobuf.writeBytesField(4, $0, &w) }
        info.model.withUnsafeBytes { Protobuf.writeBytesField(6, $0, &w) }
        info.projectName.withUnsafeBytes { Protobuf.writeBytesField(8, $0, &w) }
        info.projectVersion.withUnsafeBytes { Protobuf.writeBytesField(9, $0, &w) }
        info.manufacturer.withUnsafeBytes { Protobuf.writeBytesField(12, $0, &w) }
        info.friendlyName.withUnsafeBytes { Protobuf.writeBytesField(13, $0, &w) }
        Protobuf.writeVarintField(15, UInt64(info.featureFlags), &w)
        info.bluetoothMacAddress.withUnsafeBytes { Protobuf.writeBytesField(18, $0, &w) }
        Protobuf.writeVarintField(19, info.encryptionSupported ? 1 : 0, &w)
    }
}

/// `BluetoothScannerStateResponse` 126: state (1), mode (2), configured_mode (3).
public struct ScannerStateResponse: ServerMessage {
    public let state: UInt32, mode: UInt32, configuredMode: UInt32
    public init(state: UInt32, mode: UInt32, configuredMode: UInt32) {
        self.state = state
        self.mode = mode
        self.configuredMode = configuredMode
    }
    public var bodySize: Int {
        Protobuf.varintFieldSize(1, UInt64(state)) &+ Protobuf.varintFieldSize(2, UInt64(mode))
            &+ Protobuf.varintFieldSize(3, UInt64(configuredMode))
    }
    public func writeBody(_ w: inout ByteWriter) {
        Protobuf.writeVarintField(1, UInt64(state), &w)
        Protobuf.writeVarintField(2, UInt64(mode), &w)
        Protobuf.writeVarintField(3, UInt64(configuredMode), &w)
    }
}

/// One `BluetoothLERawAdvertisement`, written as field 1 of a
/// `BluetoothLERawAdvertisementsResponse` 93: address (uint64, 1: the 48-bit address as an
/// integer, most significant byte first as written), rssi (sint32, 2), address_type (uint32, 3),
/// data (bytes, 4: at most 62, ESPHome's `fixed_array_size`).
public enum RawAdvertisement {
    /// `AdvertisingReport.eventType` bits (Core 5.4, Vol 4, Part E, §7.7.65.13 Event_Type):
    /// bit 1 scannable, bit 3 scan response; 0x10 a legacy ADV_NONCONN_IND.
    public static let scannableBit: UInt16 = 1 << 1
    public static let scanResponseBit: UInt16 = 1 << 3
    public static let nonConnectable: UInt16 = 0x10
    /// ESPHome's batch: `BLUETOOTH_PROXY_ADVERTISEMENT_BATCH_SIZE`, 16.
    public static let batchLimit = 16
    /// ESPHome's `data` array: 31 bytes of advertising data + 31 of scan response.
    public static let dataLimit = 62
    /// The most one entry takes: tag, length, then address (1 + 7), rssi (1 + 2), type (1 + 1),
    /// data (1 + 1 + 62).
    public static let maxEntrySize = 2 + 8 + 3 + 2 + 64

    public static func innerSize(address: UInt64, addressType: UInt8, rssi: Int8, dataCount: Int) -> Int {
        Protobuf.varintFieldSize(1, address)
            &+ Protobuf.varintFieldSize(2, UInt64(Protobuf.zigzag(Int32(rssi))))
            &+ Protobuf.varintFieldSize(3, UInt64(addressType))
            &+ Protobuf.bytesFieldSize(4, dataCount)
    }

    /// Appends one entry (field 1 of the response) to `w`. `data` longer than 62 bytes is the
    /// caller's bug.
    public static func append(address: UInt64, addressType: UInt8, rssi: Int8, data: UnsafeRawBufferPointer,
                              to w: inout ByteWriter) throws(WireError) {
        precondition(data.count <= dataLimit, "advertising data over 62 bytes")
        let inner = innerSize(address: address, addressType: addressType, rssi: rssi, dataCount: data.count)
        try w.reserve(Protobuf.tagSize(1) &+ Protobuf.varintSize(UInt64(inner)) &+ inner)
        Protobuf.writeTag(1, Protobuf.lengthDelimited, &w)
        Protobuf.writeVarint(UInt64(inner), &w)
        Protobuf.writeVarintField(1, address, &w)
        Protobuf.writeVarintField(2, UInt64(Protobuf.zigzag(Int32(rssi))), &w)
        Protobuf.writeVarintField(3, UInt64(addressType), &w)
        Protobuf.writeBytesField(4, data, &w)
    }
}
