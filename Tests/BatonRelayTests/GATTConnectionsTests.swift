// Active connections (docs/esphome.md §11): the gateway as a device's GATT client over the ATT
// channel, against a device's server (`TestGATTDevice`) at the far end of a SOCK_SEQPACKET pair,
// as the kernel's ATT socket behaves. Requests in bytes (Core 5.4, Vol 3, Part F, §3.4).
import BatonLibc
import BatonRelay
import BatonTestSupport
import BatonWire
import CBlueZ  // its shim includes <sys/socket.h>: SOCK_SEQPACKET has one owner
import Glibc
import Testing

/// What the client side heard.
struct Heard: GATTListener {
    var present = true
    var events: [(GATTEvent, UInt64, [UInt8])] = []
    var services: [(GATTService, [GATTCharacteristic], [GATTDiscoveredDescriptor])] = []
    var slots: [(free: Int, limit: Int, allocated: [UInt64])] = []

    func isPresent(_ client: GATTClient) -> Bool { present }
    mutating func gatt(_ event: GATTEvent, client: GATTClient, address: UInt64, value: UnsafeRawBufferPointer,
                       service: GATTServiceView?) {
        events.append((event, address, Array(value)))
        if let service { services.append((service.service, Array(service.characteristics), Array(service.descriptors))) }
    }
    mutating func connectionSlots(free: Int, limit: Int, allocated: ArraySlice<UInt64>) {
        slots.append((free, limit, Array(allocated)))
    }
    func last(_ address: UInt64) -> GATTEvent? { events.last { $0.1 == address }?.0 }
}

let thermometer: UInt64 = 0xC0FF_EE00_0001
let client = GATTClient(slot: 0, serial: 1)

struct GATTHarness: ~Copyable {
    let box = GATTTestDevices()
    var connections: GATTConnections
    var heard = Heard()
    var now = Instant.now

    init(slots: Int = 3, mtu: UInt16 = 247) {
        box.mtu = mtu
        connections = GATTConnections(limit: slots, link: AnyDeviceLink(GATTTestLink(box: box)))
    }

    var device: TestGATTDevice { box.devices[thermometer]! }

    mutating func ask(_ a: GATTAsk, _ address: UInt64 = thermometer, data: [UInt8] = []) {
        data.withUnsafeBytes { connections.ask(a, client: client, address: address, data: $0, now: now, to: &heard) }
        pump()
    }

    /// Turns until nothing moves: the devices answer, the connections read and send.
    mutating func pump(turns: Int = 12) {
        for _ in 0 ..< turns {
            for d in box.devices.values { d.serve() }
            gatewayTurn()
        }
    }

    /// One turn of the connections alone (the devices read nothing meanwhile).
    mutating func gatewayTurn() {
        var fds: [pollfd] = []
        connections.pollDescriptors(into: &fds)
        _ = poll(&fds, nfds_t(fds.count), 0)
        connections.serve(fds[...], now: now, to: &heard)
    }

    mutating func connect(_ address: UInt64 = thermometer) {
        ask(.connect(addressType: 1), address)
    }
}

@Suite struct GATTConnectionsTests {
    @Test func aConnectionExchangesTheMTUFirstAndIsConnectedWithTheAgreedOne() {
        var h = GATTHarness(mtu: 247)
        h.connect()
        // Exchange MTU Request (§3.4.2.1): opcode 02, Client Rx MTU 517 (05 02).
        #expect(h.device.received.first == [0x02, 0x05, 0x02])
        #expect(h.heard.last(thermometer) == .connection(connected: true, mtu: 247, error: 0))
        // One slot taken of three, and the address told.
        #expect(h.heard.slots.last?.free == 2 && h.heard.slots.last?.allocated == [thermometer])
    }

    @Test func aClientWithACacheIsToldAtOnceAndItsRequestsWaitForTheMTU() {
        var h = GATTHarness(mtu: 247)
        h.box.silentAtFirst = true
        h.ask(.connect(addressType: 1, withCache: true))
        // CONNECT_V3_WITH_CACHE: connected as the link is up, the MTU still the least (23).
        #expect(h.heard.last(thermometer) == .connection(connected: true, mtu: 23, error: 0))
        h.ask(.read(handle: 3))
        #expect(h.device.received == [[0x02, 0x05, 0x02]], "the read waits behind the MTU exchange")
        h.device.silent = false
        h.device.send([0x03, 0xF7, 0x00])
        h.pump()
        #expect(h.heard.events.filter { if case .connection = $0.0 { true } else { false } }.count == 1, "told once")
        #expect(h.heard.last(thermometer) == .read(handle: 3) && h.heard.events.last?.2 == [87])
        #expect(h.connections.counters.connected == 1)
    }

    @Test func theServicesAreDiscoveredAndToldOneServiceAtATime() throws {
        var h = GATTHarness()
        h.connect()
        h.ask(.services)
        #expect(h.heard.last(thermometer) == .servicesDone)
        try #require(h.heard.services.count == 2)
        let (battery, batteryCharacteristics, batteryDescriptors) = h.heard.services[0]
        #expect(battery == GATTService(start: 1, end: 4, uuid: GATTUUID(short: 0x180F)))
        #expect(batteryCharacteristics == [GATTCharacteristic(declaration: 2, properties: 0x12, valueHandle: 3, uuid: GATTUUID(short: 0x2A19))])
        #expect(batteryDescriptors == [GATTDiscoveredDescriptor(characteristic: 0, descriptor: GATTDescriptor(handle: 4, uuid: GATTUUID(short: 0x2902)))])
        let (custom, characteristics, descriptors) = h.heard.services[1]
        #expect(custom.start == 5 && custom.end == 10)
        #expect(characteristics.map(\.valueHandle) == [7, 9])
        #expect(characteristics.map(\.properties) == [0x0E, 0x30])
        // The long value's characteristic has no descriptor; the temperature has its CCCD.
        #expect(descriptors.map(\.descriptor.handle) == [10] && descriptors.map(\.characteristic) == [1])
        // Read By Group Type of primary services from 0001 to FFFF (§3.4.4.9), then on after the last group.
        #expect(h.device.received[1] == [0x10, 0x01, 0x00, 0xFF, 0xFF, 0x00, 0x28])
    }

    @Test func aDiscoveryTheDeviceRefusesIsAnErrorAndTheConnectionStays() {
        var h = GATTHarness()
        h.connect()
        h.device.silent = true
        h.ask(.services)
        // Error Response to Read By Group Type (10), handle 0001: 0E Unlikely Error.
        h.device.send([0x01, 0x10, 0x01, 0x00, 0x0E])
        h.pump()
        #expect(h.heard.last(thermometer) == .error(handle: 0, code: 0x0E))
        #expect(h.connections.count == 1, "a failed discovery leaves the connection up")
        // And the queue goes on: the next request is sent and answered.
        h.device.silent = false
        h.ask(.read(handle: 3))
        #expect(h.heard.last(thermometer) == .read(handle: 3))
    }

    @Test func aDeviceThatAnswersDescriptorsBeforeTheRangeAskedEndsTheConnection() {
        var h = GATTHarness()
        h.connect()
        // Battery 1–6: the level's value at 3, then three descriptors 4, 5, 6.
        h.device.model.attributes = [
            .init(handle: 1, type: [0x00, 0x28], value: [0x0F, 0x18]),
            .init(handle: 2, type: [0x03, 0x28], value: [0x12, 0x03, 0x00, 0x19, 0x2A]),
            .init(handle: 3, type: [0x19, 0x2A], value: [87]),
            .init(handle: 4, type: [0x02, 0x29], value: [0, 0]),
            .init(handle: 5, type: [0x01, 0x29], value: []),
            .init(handle: 6, type: [0x04, 0x29], value: []),
        ]
        // Find Information is answered with handle 4 only, whatever the range: asked again from
        // 5, the device names 4 again (Find Information Response, format 1, 0004 → 2902).
        h.device.intercept = { $0.first == 0x04 ? [0x05, 0x01, 0x04, 0x00, 0x02, 0x29] : nil }
        h.ask(.services)
        #expect(h.device.received.filter { $0.first == 0x04 }.count == 2, "asked from 4, then from 5")
        #expect(h.heard.last(thermometer) == .connection(connected: false, mtu: 0, error: 0x85))
        #expect(h.connections.counters.malformed == 1)
    }

    @Test func aValueLongerThanOnePDUIsReadOnWithReadBlob() {
        var h = GATTHarness(mtu: 23)
        h.connect()
        h.ask(.read(handle: 7))
        #expect(h.heard.events.last?.0 == .read(handle: 7))
        #expect(h.heard.events.last?.2 == TestGATTDevice.longValue)
        // Read (0A 0700) gets 22 bytes, MTU − 1; Read Blob (0C 0700 1600) the rest.
        #expect(h.device.received.suffix(2) == [[0x0A, 0x07, 0x00], [0x0C, 0x07, 0x00, 0x16, 0x00]])
    }

    @Test func writesWithAndWithoutResponseAndToADescriptor() {
        var h = GATTHarness()
        h.connect()
        h.ask(.write(handle: 7, response: true), data: [1, 2, 3])
        #expect(h.heard.last(thermometer) == .wrote(handle: 7))
        #expect(h.device.received.last == [0x12, 0x07, 0x00, 1, 2, 3])
        h.ask(.write(handle: 7, response: false), data: [9])
        #expect(h.device.received.last == [0x52, 0x07, 0x00, 9])
        #expect(h.heard.last(thermometer) == .wrote(handle: 7), "a Write Command is not answered")
        h.ask(.writeDescriptor(handle: 10), data: [0x01, 0x00])
        #expect(h.device.value(10) == [0x01, 0x00])
        #expect(h.heard.last(thermometer) == .wrote(handle: 10))
    }

    @Test func notificationsReachTheClientOnceAskedForAndIndicationsAreConfirmed() {
        var h = GATTHarness()
        h.connect()
        h.device.notify(9, [0x35, 0x08])
        h.pump()
        #expect(!h.heard.events.contains { $0.0 == .notification(handle: 9) }, "not asked for: not passed on")
        h.ask(.notify(handle: 9, enable: true))
        #expect(h.heard.last(thermometer) == .notifying(handle: 9))
        h.device.notify(9, [0x36, 0x08])
        h.device.notify(9, [0x37, 0x08], indicate: true)
        h.pump()
        let values = h.heard.events.filter { $0.0 == .notification(handle: 9) }.map(\.2)
        #expect(values == [[0x36, 0x08], [0x37, 0x08]])
        #expect(h.device.confirmations == 1)
    }

    @Test func errorsOfTheDeviceReachTheClientWithTheirATTCode() {
        var h = GATTHarness()
        h.connect()
        h.ask(.read(handle: 0x0042))
        // 01 Invalid Handle (§3.4.1.1).
        #expect(h.heard.last(thermometer) == .error(handle: 0x0042, code: 0x01))
    }

    @Test func moreConnectsThanSlotsAreRefusedAndADisconnectGivesTheSlotBack() {
        var h = GATTHarness(slots: 1)
        h.connect()
        let other: UInt64 = 0xC0FF_EE00_0002
        h.connect(other)
        #expect(h.heard.last(other) == .connection(connected: false, mtu: 0, error: 0))
        #expect(h.connections.counters.refusedFull == 1)
        h.ask(.disconnect)
        #expect(h.heard.last(thermometer) == .connection(connected: false, mtu: 0, error: 0x16))
        #expect(h.heard.slots.last?.free == 1 && h.heard.slots.last?.allocated == [])
        h.connect(other)
        #expect(h.heard.last(other) == .connection(connected: true, mtu: 247, error: 0))
    }

    @Test func aRequestToNoConnectionIsAnsweredNotConnected() {
        var h = GATTHarness()
        h.ask(.read(handle: 3))
        #expect(h.heard.last(thermometer) == .error(handle: 3, code: -1))
        h.ask(.disconnect)
        #expect(h.heard.last(thermometer) == .connection(connected: false, mtu: 0, error: 0))
    }

    @Test func aDeviceThatNeverAnswersEndsTheConnectionAfterThirtySeconds() {
        var h = GATTHarness()
        h.connect()
        h.device.silent = true
        h.ask(.read(handle: 3))
        h.now = h.now + .seconds(29)
        h.pump(turns: 1)
        #expect(h.heard.last(thermometer) == .connection(connected: true, mtu: 247, error: 0))
        h.now = h.now + .seconds(2)
        h.pump(turns: 1)
        // §3.3.3: a transaction not completed in 30 s has timed out; 0x08 Connection Timeout.
        #expect(h.heard.last(thermometer) == .connection(connected: false, mtu: 0, error: 0x08))
        #expect(h.connections.count == 0 && h.connections.counters.timedOut == 1)
    }

    @Test func aDeviceThatHangsUpMidReadIsGoneAndItsSlotFree() {
        var h = GATTHarness()
        h.connect()
        h.device.silent = true
        h.ask(.read(handle: 3))
        h.device.hangUp()
        h.pump()
        #expect(h.heard.last(thermometer) == .connection(connected: false, mtu: 0, error: 0x13))
        #expect(h.connections.count == 0 && h.heard.slots.last?.free == 3)
    }

    @Test func aDeviceThatCannotBeReachedFailsToConnect() {
        var h = GATTHarness()
        h.box.unreachable.insert(thermometer)
        h.connect()
        #expect(h.heard.last(thermometer) == .connection(connected: false, mtu: 0, error: 0x3E))
        #expect(h.connections.count == 0 && h.connections.counters.failed == 1)
    }

    @Test func aConnectThatNeverCompletesFailsAfterTwentySeconds() {
        var h = GATTHarness()
        h.box.neverAnswer.insert(thermometer)
        h.connect()
        #expect(h.heard.last(thermometer) == nil, "still connecting")
        h.now = h.now + .seconds(19)
        h.pump(turns: 1)
        #expect(h.heard.last(thermometer) == nil)
        h.now = h.now + .seconds(2)
        h.pump(turns: 1)
        // Before the client's own 30 s: 0x3E Connection Failed to be Established, the slot free.
        #expect(h.heard.last(thermometer) == .connection(connected: false, mtu: 0, error: 0x3E))
        #expect(h.connections.count == 0 && h.connections.counters.failed == 1 && h.heard.slots.last?.free == 3)
    }

    @Test func aClientThatLeavesTakesItsConnectionsWithIt() {
        var h = GATTHarness()
        h.connect()
        h.heard.present = false
        let told = h.heard.events.count
        h.pump(turns: 1)
        #expect(h.connections.count == 0 && h.heard.slots.last?.free == 3)
        #expect(h.heard.events.count == told, "nobody is there to tell")
    }

    @Test func aPDUThatIsNotATTEndsTheConnectionAndIsCounted() {
        var h = GATTHarness()
        h.connect()
        // An Error Response cut short (§3.4.1.1 needs 5 bytes).
        h.device.send([0x01, 0x0A])
        h.pump()
        #expect(h.heard.last(thermometer) == .connection(connected: false, mtu: 0, error: 0x85))
        #expect(h.connections.counters.malformed == 1)
    }

    @Test func writeCommandsAndAConfirmationThatFindTheSocketFullGoOnceThereIsRoomInOrder() {
        var h = GATTHarness()
        h.connect()
        // The device reads nothing meanwhile: the socket fills, then the queue, then refusals.
        for i in 0 ..< 2_000 {
            [UInt8(truncatingIfNeeded: i), UInt8(truncatingIfNeeded: i >> 8)].withUnsafeBytes {
                h.connections.ask(.write(handle: 7, response: false), client: client, address: thermometer, data: $0,
                                  now: h.now, to: &h.heard)
            }
        }
        let refused = h.heard.events.filter { $0.0 == .error(handle: 7, code: 0x11) }.count
        #expect(refused > 0, "2,000 commands should outrun a socket's buffer and a queue of 8")
        // An indication meanwhile: its confirmation waits for room too, beside the command.
        h.device.send([0x1D, 0x09, 0x00, 0x35, 0x08])
        h.gatewayTurn()
        h.pump(turns: 40)
        #expect(h.device.confirmations == 1)
        let commands = h.device.received.filter { $0.first == 0x52 }
        // Every command not refused reached the device, in the order asked.
        #expect(commands.count == 2_000 - refused)
        let sequence = commands.map { Int($0[3]) | Int($0[4]) << 8 }
        #expect(sequence == sequence.sorted() && sequence.first == 0)
    }

    @Test func aQueueOfAsksIsAnsweredInOrderAndAFullOneRefused() {
        var h = GATTHarness()
        h.connect()
        h.device.silent = true
        for handle: UInt16 in 1 ... 10 {
            [UInt8]().withUnsafeBytes {
                h.connections.ask(.read(handle: handle), client: client, address: thermometer, data: $0, now: h.now, to: &h.heard)
            }
        }
        // One in flight, eight waiting: the tenth has no room (11 Insufficient Resources).
        #expect(h.heard.last(thermometer) == .error(handle: 10, code: 0x11))
        h.device.silent = false
        // The device answers the first it got, late; the rest follow in order.
        h.device.send([0x0B, 87])
        h.pump()
        let reads = h.heard.events.compactMap { if case .read(let handle) = $0.0 { handle } else { nil } }
        #expect(reads == [1, 2, 3, 4, 5, 6, 7, 8, 9])
    }
}
