// The ESPHome messages of active connections (docs/esphome.md §11): what Home Assistant asks
// of a device through the proxy (68, 70, 73, 75–78, 80) and what it is told (69, 71, 72, 74,
// 79, 81–86, 88). Numbers and fields are aioesphomeapi 46.23.0's api.proto, as the passive
// messages' (ESPHomeMessages.swift). Addresses are the 48-bit address as an integer, most
// significant byte first as written (`BluetoothLERawAdvertisement.address`, the same value).
import BatonWire

extension MessageType {
    public static let bluetoothDeviceRequest: UInt32 = 68
    public static let bluetoothDeviceConnectionResponse: UInt32 = 69
    public static let bluetoothGATTGetServicesRequest: UInt32 = 70
    public static let bluetoothGATTGetServicesResponse: UInt32 = 71
    public static let bluetoothGATTGetServicesDoneResponse: UInt32 = 72
    public static let bluetoothGATTReadRequest: UInt32 = 73
    public static let bluetoothGATTReadResponse: UInt32 = 74
    public static let bluetoothGATTWriteRequest: UInt32 = 75
    public static let bluetoothGATTReadDescriptorRequest: UInt32 = 76
    public static let bluetoothGATTWriteDescriptorRequest: UInt32 = 77
    public static let bluetoothGATTNotifyRequest: UInt32 = 78
    public static let bluetoothGATTNotifyDataResponse: UInt32 = 79
    public static let subscribeBluetoothConnectionsFreeRequest: UInt32 = 80
    public static let bluetoothConnectionsFreeResponse: UInt32 = 81
    public static let bluetoothGATTErrorResponse: UInt32 = 82
    public static let bluetoothGATTWriteResponse: UInt32 = 83
    public static let bluetoothGATTNotifyResponse: UInt32 = 84
    public static let bluetoothDevicePairingResponse: UInt32 = 85
    public static let bluetoothDeviceUnpairingResponse: UInt32 = 86
    public static let bluetoothDeviceClearCacheResponse: UInt32 = 88
}

extension ProxyFeature {
    /// 2: the proxy connects to devices, so Home Assistant marks its scanner connectable.
    public static let activeConnections: UInt32 = 2
    /// 4: the client keeps the services it read (aioesphomeapi connects only with it).
    public static let remoteCaching: UInt32 = 4
    /// With connections: 1 | 2 | 4 | 32 | 64 = 103, the least Home Assistant connects through.
    public static let batonConnecting: UInt32 = baton | activeConnections | remoteCaching
}

/// `BluetoothDeviceRequest.request_type` (aioesphomeapi `BluetoothDeviceRequestType`).
public enum DeviceRequestType {
    public static let connect: UInt32 = 0
    public static let disconnect: UInt32 = 1
    public static let pair: UInt32 = 2
    public static let unpair: UInt32 = 3
    public static let connectWithCache: UInt32 = 4
    public static let connectWithoutCache: UInt32 = 5
    public static let clearCache: UInt32 = 6
}

/// What a client asks of a device, decoded: the address and the ask, and where a write's data
/// lies in the body. Pairing and cache clearing are `unsupported` (feature flags 8 and 16 are not
/// offered): each is answered with its response's failure.
public enum GATTMessage: Equatable {
    case ask(address: UInt64, GATTAsk, data: Range<Int>)
    case unsupported(address: UInt64, requestType: UInt32)
    case subscribeConnectionsFree

    /// nil: not one of these messages. Every body is walked to its end.
    public static func decode(type: UInt32, body: UnsafeRawBufferPointer) throws(WireError) -> GATTMessage? {
        var address: UInt64 = 0, handle: UInt32 = 0, flag = false, number: UInt32 = 0
        var hasAddressType = false, addressType: UInt32 = 0
        var data = 0 ..< 0
        switch type {
        case MessageType.bluetoothDeviceRequest, MessageType.bluetoothGATTGetServicesRequest,
             MessageType.bluetoothGATTReadRequest, MessageType.bluetoothGATTWriteRequest,
             MessageType.bluetoothGATTReadDescriptorRequest, MessageType.bluetoothGATTWriteDescriptorRequest,
             MessageType.bluetoothGATTNotifyRequest, MessageType.subscribeBluetoothConnectionsFreeRequest:
            break
        default:
            return nil
        }
        var fields = ProtoFieldReader(body)
        while let f = try fields.next() {
            switch (f.number, f.wireType) {
            case (1, Protobuf.varint):
                address = f.value
            case (2, Protobuf.varint):
                // Device request: request_type; the GATT requests: handle.
                number = UInt32(truncatingIfNeeded: f.value)
                handle = number
            case (3, Protobuf.varint):
                // Device request: has_address_type; write: response; notify: enable.
                flag = f.value != 0
                hasAddressType = flag
            case (4, Protobuf.varint):
                addressType = UInt32(truncatingIfNeeded: f.value)
            case (3, Protobuf.lengthDelimited), (4, Protobuf.lengthDelimited):
                // Write descriptor: data (3); write: data (4). Proof: f.bytes lies inside body.
                let start = f.bytes.baseAddress.map { $0 - body.baseAddress! } ?? 0
                data = start ..< start &+ f.bytes.count
            default:
                break
            }
        }
        let h = UInt16(truncatingIfNeeded: handle)
        switch type {
        case MessageType.subscribeBluetoothConnectionsFreeRequest:
            return .subscribeConnectionsFree
        case MessageType.bluetoothDeviceRequest:
            switch number {
            case DeviceRequestType.connect, DeviceRequestType.connectWithCache, DeviceRequestType.connectWithoutCache:
                // Without an address type (clients before aioesphomeapi 30 sent none) the
                // address is taken as public.
                return .ask(address: address, .connect(addressType: hasAddressType ? UInt8(truncatingIfNeeded: addressType) : 0,
                                                       withCache: number == DeviceRequestType.connectWithCache), data: data)
            case DeviceRequestType.disconnect:
                return .ask(address: address, .disconnect, data: data)
            default:
                return .unsupported(address: address, requestType: number)
            }
        case MessageType.bluetoothGATTGetServicesRequest: return .ask(address: address, .services, data: 0 ..< 0)
        case MessageType.bluetoothGATTReadRequest: return .ask(address: address, .read(handle: h), data: 0 ..< 0)
        case MessageType.bluetoothGATTReadDescriptorRequest: return .ask(address: address, .readDescriptor(handle: h), data: 0 ..< 0)
        case MessageType.bluetoothGATTWriteRequest:
            return .ask(address: address, .write(handle: h, response: flag), data: data)
        case MessageType.bluetoothGATTWriteDescriptorRequest:
            return .ask(address: address, .writeDescriptor(handle: h), data: data)
        default:
            return .ask(address: address, .notify(handle: h, enable: flag), data: 0 ..< 0)
        }
    }
}

/// An int32 field: negative values as ten-byte varints (proto3 `int32`).
@inline(__always) func int32Bits(_ v: Int32) -> UInt64 { UInt64(bitPattern: Int64(v)) }

/// 69 `BluetoothDeviceConnectionResponse`: address (1), connected (2), mtu (3), error (int32, 4).
/// 83 `BluetoothGATTWriteResponse` and 84 `BluetoothGATTNotifyResponse`: address (1), handle (2).
/// 82 `BluetoothGATTErrorResponse`: address (1), handle (2), error (int32, 3).
/// 72 `BluetoothGATTGetServicesDoneResponse`: address (1).
/// 85, 86, 88 pairing, unpairing, cache clearing: address (1), success (2), error (int32, 3).
/// All varints after the address, fields 2, 3, 4 in order as each message has them: one shape,
/// held by value (nothing allocated per message).
public struct GATTVarintMessage: ServerMessage {
    public let address: UInt64
    let values: (UInt64, UInt64, UInt64)
    let count: Int
    public init(address: UInt64, _ v2: UInt64? = nil, _ v3: UInt64? = nil, _ v4: UInt64? = nil) {
        self.address = address
        values = (v2 ?? 0, v3 ?? 0, v4 ?? 0)
        count = v4 != nil ? 3 : v3 != nil ? 2 : v2 != nil ? 1 : 0
    }
    func value(_ k: Int) -> UInt64 { k == 0 ? values.0 : k == 1 ? values.1 : values.2 }
    public var bodySize: Int {
        var n = Protobuf.varintFieldSize(1, address)
        for k in 0 ..< count { n &+= Protobuf.varintFieldSize(UInt32(2 + k), value(k)) }
        return n
    }
    public func writeBody(_ w: inout ByteWriter) {
        Protobuf.writeVarintField(1, address, &w)
        for k in 0 ..< count { Protobuf.writeVarintField(UInt32(2 + k), value(k), &w) }
    }

    public static func connection(address: UInt64, connected: Bool, mtu: UInt16, error: Int32) -> GATTVarintMessage {
        GATTVarintMessage(address: address, connected ? 1 : 0, UInt64(mtu), int32Bits(error))
    }
    public static func handle(address: UInt64, _ handle: UInt16) -> GATTVarintMessage {
        GATTVarintMessage(address: address, UInt64(handle))
    }
    public static func error(address: UInt64, handle: UInt16, code: Int32) -> GATTVarintMessage {
        GATTVarintMessage(address: address, UInt64(handle), int32Bits(code))
    }
    /// The refusal of a request Baton does not do: not done, with ESP-IDF's "not supported".
    public static func refused(address: UInt64) -> GATTVarintMessage {
        GATTVarintMessage(address: address, 0, int32Bits(Self.notSupported))
    }
    /// ESP_GATT_REQ_NOT_SUPPORTED.
    public static let notSupported: Int32 = 0x06
}

/// 74 `BluetoothGATTReadResponse` and 79 `BluetoothGATTNotifyDataResponse`: address (1),
/// handle (2), data (3).
public struct GATTDataMessage: ServerMessage {
    public let address: UInt64, handle: UInt16
    public let data: UnsafeRawBufferPointer
    public init(address: UInt64, handle: UInt16, data: UnsafeRawBufferPointer) {
        self.address = address; self.handle = handle; self.data = data
    }
    public var bodySize: Int {
        Protobuf.varintFieldSize(1, address) &+ Protobuf.varintFieldSize(2, UInt64(handle)) &+ Protobuf.bytesFieldSize(3, data.count)
    }
    public func writeBody(_ w: inout ByteWriter) {
        Protobuf.writeVarintField(1, address, &w)
        Protobuf.writeVarintField(2, UInt64(handle), &w)
        Protobuf.writeBytesField(3, data, &w)
    }
}

/// 81 `BluetoothConnectionsFreeResponse`: free (1), limit (2), allocated (repeated uint64, 3,
/// packed).
public struct ConnectionsFreeMessage: ServerMessage {
    public let free: Int, limit: Int
    public let allocated: ArraySlice<UInt64>
    public init(free: Int, limit: Int, allocated: ArraySlice<UInt64>) { self.free = free; self.limit = limit; self.allocated = allocated }
    var packedSize: Int { allocated.reduce(0) { $0 &+ Protobuf.varintSize($1) } }
    public var bodySize: Int {
        Protobuf.varintFieldSize(1, UInt64(free)) &+ Protobuf.varintFieldSize(2, UInt64(limit)) &+ packedFieldSize(3, packedSize)
    }
    public func writeBody(_ w: inout ByteWriter) {
        Protobuf.writeVarintField(1, UInt64(free), &w)
        Protobuf.writeVarintField(2, UInt64(limit), &w)
        writePacked(3, allocated, size: packedSize, &w)
    }
}

func packedFieldSize(_ field: UInt32, _ size: Int) -> Int {
    size == 0 ? 0 : Protobuf.tagSize(field) &+ Protobuf.varintSize(UInt64(size)) &+ size
}

func writePacked(_ field: UInt32, _ values: ArraySlice<UInt64>, size: Int, _ w: inout ByteWriter) {
    guard size > 0 else { return }
    Protobuf.writeTag(field, Protobuf.lengthDelimited, &w)
    Protobuf.writeVarint(UInt64(size), &w)
    for v in values { Protobuf.writeVarint(v, &w) }
}

/// 71 `BluetoothGATTGetServicesResponse`: address (1) and one service (2), as an ESP32 sends
/// them, one a message. A service (`BluetoothGATTService`): uuid (packed [high, low], 1),
/// handle (2), characteristics (3); a characteristic: uuid (1), handle (2: its value's, as
/// ESP-IDF reports it, the handle reads, writes and notifications name), properties (3),
/// descriptors (4); a descriptor: uuid (1), handle (2). The `short_uuid` fields are for API
/// 1.12 clients and later; Baton says 1.10.
public struct GATTServicesMessage: ServerMessage {
    public let address: UInt64
    public let view: GATTServiceView
    public init(address: UInt64, view: GATTServiceView) { self.address = address; self.view = view }

    static func uuidSize(_ u: GATTUUID) -> Int { Protobuf.varintSize(u.high) &+ Protobuf.varintSize(u.low) }
    static func uuidFieldSize(_ u: GATTUUID) -> Int { packedFieldSize(1, uuidSize(u)) }
    static func writeUUID(_ u: GATTUUID, _ w: inout ByteWriter) {
        Protobuf.writeTag(1, Protobuf.lengthDelimited, &w)
        Protobuf.writeVarint(UInt64(uuidSize(u)), &w)
        Protobuf.writeVarint(u.high, &w)
        Protobuf.writeVarint(u.low, &w)
    }

    func descriptorSize(_ d: GATTDescriptor) -> Int {
        Self.uuidFieldSize(d.uuid) &+ Protobuf.varintFieldSize(2, UInt64(d.handle))
    }
    func characteristicSize(_ i: Int) -> Int {
        let c = view.characteristics[view.characteristics.startIndex + i]
        var n = Self.uuidFieldSize(c.uuid) &+ Protobuf.varintFieldSize(2, UInt64(c.valueHandle))
            &+ Protobuf.varintFieldSize(3, UInt64(c.properties))
        for d in view.descriptors where d.characteristic == i { n &+= Protobuf.bytesFieldSize(4, descriptorSize(d.descriptor)) }
        return n
    }
    var serviceSize: Int {
        var n = Self.uuidFieldSize(view.service.uuid) &+ Protobuf.varintFieldSize(2, UInt64(view.service.start))
        for i in 0 ..< view.characteristics.count { n &+= Protobuf.bytesFieldSize(3, characteristicSize(i)) }
        return n
    }
    public var bodySize: Int { Protobuf.varintFieldSize(1, address) &+ Protobuf.bytesFieldSize(2, serviceSize) }

    public func writeBody(_ w: inout ByteWriter) {
        Protobuf.writeVarintField(1, address, &w)
        Protobuf.writeTag(2, Protobuf.lengthDelimited, &w)
        Protobuf.writeVarint(UInt64(serviceSize), &w)
        Self.writeUUID(view.service.uuid, &w)
        Protobuf.writeVarintField(2, UInt64(view.service.start), &w)
        for (i, c) in view.characteristics.enumerated() {
            Protobuf.writeTag(3, Protobuf.lengthDelimited, &w)
            Protobuf.writeVarint(UInt64(characteristicSize(i)), &w)
            Self.writeUUID(c.uuid, &w)
            Protobuf.writeVarintField(2, UInt64(c.valueHandle), &w)
            Protobuf.writeVarintField(3, UInt64(c.properties), &w)
            for d in view.descriptors where d.characteristic == i {
                Protobuf.writeTag(4, Protobuf.lengthDelimited, &w)
                Protobuf.writeVarint(UInt64(descriptorSize(d.descriptor)), &w)
                Self.writeUUID(d.descriptor.uuid, &w)
                Protobuf.writeVarintField(2, UInt64(d.descriptor.handle), &w)
            }
        }
    }
}
