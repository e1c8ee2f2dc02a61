// The messages of active connections (docs/esphome.md §11.2), in bytes. Every vector is what
// aioesphomeapi 46.23.0's api_pb2 serialises for the same values (or, for a request, what it
// sends), so Home Assistant's own decoder reads these exact bytes.
import BatonTestSupport
import BatonWire
import Testing
@testable import BatonProxy

/// The thermometer's address: C0:FF:EE:00:00:01, as the 48-bit integer (varint 81 80 80 f0 fe 9f 30).
private let thermometer: UInt64 = 0xC0FF_EE00_0001

func body<M: ServerMessage>(_ m: M) -> [UInt8] {
    var out = [UInt8](repeating: 0, count: m.bodySize)
    out.withUnsafeMutableBytes { buf in
        var w = ByteWriter(buf)
        try! w.reserve(buf.count)  // Proof: the buffer is bodySize long.
        m.writeBody(&w)
        precondition(w.count == buf.count, "bodySize \(buf.count), wrote \(w.count)")
    }
    return out
}

func gattMessage(_ type: UInt32, _ bytes: [UInt8]) throws -> GATTMessage? {
    try bytes.withUnsafeBytes { try GATTMessage.decode(type: type, body: $0) }
}

@Suite struct GATTMessageTests {
    @Test func aConnectWithCacheAndItsAddressType() throws {
        // BluetoothDeviceRequest 68: address, request_type 4 (CONNECT_V3_WITH_CACHE), has_address_type, 1 random.
        #expect(try gattMessage(68, hx("08 8180 80f0 fe9f 30  10 04  18 01  20 01"))
                == .ask(address: thermometer, .connect(addressType: 1, withCache: true), data: 0 ..< 0))
        // 5, without cache, and no address type: taken as public.
        #expect(try gattMessage(68, hx("08 8180 80f0 fe9f 30  10 05"))
                == .ask(address: thermometer, .connect(addressType: 0, withCache: false), data: 0 ..< 0))
        #expect(try gattMessage(68, hx("08 8180 80f0 fe9f 30  10 01")) == .ask(address: thermometer, .disconnect, data: 0 ..< 0))
        // Pairing (2): not offered, answered with its failure.
        #expect(try gattMessage(68, hx("08 8180 80f0 fe9f 30  10 02")) == .unsupported(address: thermometer, requestType: 2))
    }

    @Test func writesCarryTheirDataWhereItLiesInTheBody() throws {
        // BluetoothGATTWriteRequest 75: handle 7, response true, data (field 4) 01 02 03 at 14..<17.
        #expect(try gattMessage(75, hx("08 8180 80f0 fe9f 30  10 07  18 01  22 03 010203"))
                == .ask(address: thermometer, .write(handle: 7, response: true), data: 14 ..< 17))
        // BluetoothGATTWriteDescriptorRequest 77: handle 10, data (field 3) 01 00.
        #expect(try gattMessage(77, hx("08 8180 80f0 fe9f 30  10 0a  1a 02 0100"))
                == .ask(address: thermometer, .writeDescriptor(handle: 10), data: 12 ..< 14))
        // BluetoothGATTNotifyRequest 78: handle 9, enable.
        #expect(try gattMessage(78, hx("08 8180 80f0 fe9f 30  10 09  18 01"))
                == .ask(address: thermometer, .notify(handle: 9, enable: true), data: 0 ..< 0))
        #expect(try gattMessage(80, []) == .subscribeConnectionsFree)
        #expect(try gattMessage(66, hx("08 01")) == nil, "not a connection's message")
    }

    @Test func whatTheClientIsTold() {
        // 69 connected, MTU 247 (error 0 is not written).
        #expect(body(GATTVarintMessage.connection(address: thermometer, connected: true, mtu: 247, error: 0))
                == hx("08 8180 80f0 fe9f 30  10 01  18 f701"))
        // 69 disconnected, 0x16.
        #expect(body(GATTVarintMessage.connection(address: thermometer, connected: false, mtu: 0, error: 0x16))
                == hx("08 8180 80f0 fe9f 30  20 16"))
        // 82 error −1 (not connected): an int32 below zero is ten bytes.
        #expect(body(GATTVarintMessage.error(address: thermometer, handle: 3, code: -1))
                == hx("08 8180 80f0 fe9f 30  10 03  18 ffff ffff ffff ffff ff01"))
        // 85 pairing: not paired, error 6 (not supported).
        #expect(body(GATTVarintMessage.refused(address: thermometer)) == hx("08 8180 80f0 fe9f 30  18 06"))
        // 81: 2 free of 3, the thermometer's address allocated (packed).
        #expect(body(ConnectionsFreeMessage(free: 2, limit: 3, allocated: [thermometer][...]))
                == hx("08 02  10 03  1a 07 8180 80f0 fe9f 30"))
        // 74: handle 3 reads 87 %.
        #expect([UInt8(0x57)].withUnsafeBytes { body(GATTDataMessage(address: thermometer, handle: 3, data: $0)) }
                == hx("08 8180 80f0 fe9f 30  10 03  1a 01 57"))
    }

    @Test func oneServiceAMessageWithItsCharacteristicsAndDescriptors() {
        // 71: the Battery service (0x180F, handle 1), its level (0x2A19, value handle 3, read |
        // notify), and the level's CCCD (0x2902, handle 4); UUIDs as [high, low] packed.
        let view = GATTServiceView(
            service: GATTService(start: 1, end: 4, uuid: GATTUUID(short: 0x180F)),
            characteristics: [GATTCharacteristic(declaration: 2, properties: 0x12, valueHandle: 3, uuid: GATTUUID(short: 0x2A19))][...],
            descriptors: [GATTDiscoveredDescriptor(characteristic: 0, descriptor: GATTDescriptor(handle: 4, uuid: GATTUUID(short: 0x2902)))][...])
        #expect(body(GATTServicesMessage(address: thermometer, view: view)) == hx("""
            08 8180 80f0 fe9f 30
            12 45
              0a 11 80a0 8080 f081 06  fbe9 ecfc 8590 8080 8001
              10 01
              1a 2e
                0a 11 80a0 8080 90c3 0a  fbe9 ecfc 8590 8080 8001
                10 03
                18 12
                22 15
                  0a 11 80a0 8080 a0a0 0a  fbe9 ecfc 8590 8080 8001
                  10 04
            """))
    }
}
