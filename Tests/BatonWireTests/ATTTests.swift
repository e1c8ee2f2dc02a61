// The Attribute Protocol in bytes (Core 5.4, Vol 3, Part F, §3.4), as a GATT client discovers a
// thermometer: Generic Access (0x1800) at handles 1–5, Battery (0x180F) at 6–9, its level
// (0x2A19) readable and notifying, with its Client Characteristic Configuration at 9.
import BatonTestSupport
import BatonWire
import Testing

private func encoded(_ request: ATTRequest, capacity: Int = 64) throws -> [UInt8] {
    var out = [UInt8](repeating: 0, count: capacity)
    let n = try out.withUnsafeMutableBytes { buffer throws(WireError) -> Int in
        var w = ByteWriter(buffer)
        try request.encode(into: &w)
        return w.count
    }
    return Array(out[..<n])
}

private func decoded(_ hex: String) throws -> ATTServerPDU {
    try hx(hex).withUnsafeBytes { bytes in try ATTServerPDU.decode(bytes) }
}

private func entries<T>(_ hex: String, _ decode: (UnsafeRawBufferPointer, Int) throws(WireError) -> T) throws -> [T] {
    let pdu = hx(hex)
    let list: ATTList
    switch try pdu.withUnsafeBytes({ bytes in try ATTServerPDU.decode(bytes) }) {
    case .byGroupType(let l), .byType(let l), .information(let l): list = l
    default: Issue.record("not a list: \(hex)"); return []
    }
    return try pdu.withUnsafeBytes { bytes in
        try (0..<list.count).map { i throws(WireError) in
            let r = list.entry(i)
            return try decode(UnsafeRawBufferPointer(rebasing: bytes[r]), r.lowerBound)
        }
    }
}

@Suite struct ATTTests {
    @Test func requestsSection3_4() throws {
        #expect(try encoded(.exchangeMTU(clientRxMTU: 517)) == hx("02 0502"))
        #expect(try encoded(.readByGroupType(start: 1, end: 0xFFFF, type: GATTType.primaryService)) == hx("10 0100 ffff 0028"))
        #expect(try encoded(.readByType(start: 6, end: 9, type: GATTType.characteristic)) == hx("08 0600 0900 0328"))
        #expect(try encoded(.findInformation(start: 9, end: 9)) == hx("04 0900 0900"))
        #expect(try encoded(.read(handle: 8)) == hx("0a 0800"))
        #expect(try encoded(.readBlob(handle: 3, offset: 22)) == hx("0c 0300 1600"))
        try hx("0100").withUnsafeBytes { v throws in
            #expect(try encoded(.write(handle: 9, value: v)) == hx("12 0900 0100"))
            #expect(try encoded(.writeCommand(handle: 9, value: v)) == hx("52 0900 0100"))
        }
        #expect(try encoded(.confirmation) == hx("1e"))
        #expect(try encoded(.error(request: ATTOpcode.readRequest, handle: 3, code: ATTErrorCode.requestNotSupported)) == hx("01 0a 0300 06"))
        #expect(throws: WireError.noRoom(need: 7, have: 6)) { _ = try encoded(.readByType(start: 1, end: 2, type: 0x2803), capacity: 6) }
    }

    @Test func theMTUIsTheSmallerUnlessEitherIsBelow23() {
        #expect(ATTMTU.agreed(client: 517, server: 247) == 247)
        #expect(ATTMTU.agreed(client: 517, server: 22) == 23)
    }

    @Test func responsesSection3_4() throws {
        #expect(try decoded("03 f700") == .exchangeMTU(serverRxMTU: 247))
        // Attribute Not Found: the end of a discovery (§4.4.1 of Part G).
        #expect(try decoded("01 10 0a00 0a") == .error(request: 0x10, handle: 10, code: ATTErrorCode.attributeNotFound))
        #expect(try decoded("0b 64") == .read(value: 1 ..< 2))
        #expect(try decoded("0d") == .readBlob(value: 1 ..< 1))
        #expect(try decoded("13") == .written)
        #expect(try decoded("1b 0800 63") == .notification(handle: 8, value: 3 ..< 4))
        #expect(try decoded("1d 0800") == .indication(handle: 8, value: 3 ..< 3))
        // The peer as a client: a request is refused, a command ignored.
        #expect(try decoded("0a 0300") == .request(opcode: 0x0A))
        #expect(try decoded("52 0300 01") == .command(opcode: 0x52))
    }

    @Test func servicesCharacteristicsAndDescriptorsDecodeFromTheirLists() throws {
        let services = try entries("11 06  0100 0500 0018  0600 0900 0f18", GATTService.decode)
        #expect(services == [GATTService(start: 1, end: 5, uuid: GATTUUID(short: 0x1800)),
                             GATTService(start: 6, end: 9, uuid: GATTUUID(short: 0x180F))])
        // A 128-bit service: 6E400001-B5A3-F393-E0A9-E50E24DCCA9E (Nordic UART), little-endian.
        let uart = try entries("11 14  0a00 ffff  9ecadc240ee5a9e093f3a3b5010040 6e", GATTService.decode)
        #expect(uart == [GATTService(start: 10, end: 0xFFFF, uuid: GATTUUID(high: 0x6E40_0001_B5A3_F393, low: 0xE0A9_E50E_24DC_CA9E))])
        #expect(uart[0].uuid.short == nil && GATTUUID(short: 0x180F).short == 0x180F)
        // Battery Level: declaration 7, read | notify, value at 8.
        let characteristics = try entries("09 07  0700 12 0800 192a", GATTCharacteristic.decode)
        #expect(characteristics == [GATTCharacteristic(declaration: 7, properties: GATTCharacteristic.read | GATTCharacteristic.notify,
                                                       valueHandle: 8, uuid: GATTUUID(short: 0x2A19))])
        let descriptors = try entries("05 01  0900 0229", GATTDescriptor.decode)
        #expect(descriptors == [GATTDescriptor(handle: 9, uuid: GATTUUID(short: GATTType.clientConfiguration))])
    }

    @Test func badResponsesNameTheirByte() {
        #expect(throws: WireError.truncated(at: 0, need: 1)) { _ = try decoded("") }
        #expect(throws: WireError.truncated(at: 1, need: 1)) { _ = try decoded("03 f7") }
        #expect(throws: WireError.malformed(at: 3, .attLength)) { _ = try decoded("03 f700 00") }
        #expect(throws: WireError.malformed(at: 5, .attLength)) { _ = try decoded("01 10 0a00 0a ff") }
        #expect(throws: WireError.malformed(at: 1, .attLength)) { _ = try decoded("13 00") }
        #expect(throws: WireError.truncated(at: 1, need: 1)) { _ = try decoded("1b 08") }
        // Lists: no entry, a partial entry, an entry length below its fixed part, a bad format.
        #expect(throws: WireError.malformed(at: 2, .attList)) { _ = try decoded("11 06") }
        #expect(throws: WireError.malformed(at: 8, .attList)) { _ = try decoded("11 06 0100 0500 0018 06") }
        #expect(throws: WireError.malformed(at: 1, .attList)) { _ = try decoded("09 01 07") }
        #expect(throws: WireError.malformed(at: 1, .attList)) { _ = try decoded("11 03 070008") }
        #expect(throws: WireError.malformed(at: 1, .attFormat)) { _ = try decoded("05 03 0900 0229") }
        // A declaration whose UUID is neither 2 nor 16 bytes.
        #expect(throws: WireError.malformed(at: 4, .gattDeclaration)) {
            _ = try hx("0100 0500 00").withUnsafeBytes { b in try GATTService.decode(b) }
        }
    }
}
